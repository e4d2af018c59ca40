// KDA (Kimi Delta Attention) mixer (layers-delta.md section 4.3; FLA fla/layers/kda.py,
// KimiDeltaAttention): Gated DeltaNet's structure and core path (model/gdn.h) with
//   - the channel-wise decay g_{h,c} = -exp(A_log_h) softplus(f_{h,c} + dt_bias_{h,c}) (fp32 log space),
//     f = (x f_proj.0^T) f_proj.1^T, low rank d_v; dt_bias [H dk]; A_log = log U(1, 16) (section 3.3);
//   - the KDA core (per-channel decay, section 6.1 vector form; kernels kda_chunk_*);
//   - the low-rank output gate z = (x g_proj.0^T) g_proj.1^T + g_proj.1.bias, sigmoid-gated RMSNorm.
// Configured by model.kda (KdaConfig); the gate form is DeltaLayer::Gates::channelwise.
#pragma once
#include "model/gdn.h"

namespace llmt {

class KdaMixer final : public GdnMixer {
 public:
  /// Registers the KDA parameters of one layer under `prefix` (FLA names, delta_layer.h).
  KdaMixer(const ModelConfig& config, ParamStore& store, const std::string& prefix)
      : GdnMixer(config, config.kda, Gates::channelwise, store, prefix) {}
};

}  // namespace llmt
