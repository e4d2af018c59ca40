// Gated DeltaNet mixer (layers-delta.md section 4.1): the shared delta-layer structure
// (model/delta_layer.h) around the GDN core:
//   q^ = l2norm(q) / sqrt(d_k), k^ = l2norm(k)              (section 2.2)
//   o = GDN core (chunked, section 6) of (q^, k^, v, g, beta)
//       (the layer keeps what the backend's core saves for its backward, Backend::gdn_saved_numel; CUDA: the
//       chunks' 𝒯 = (I + A)^{-1} and with model.gdn.save_states the states h entering them, v_new Δ and W,
//       section 6.3; KDA: Backend::kda_saved_numel, CUDA: P, 𝒯 and with model.kda.save_states Δ and h)
// Output gate silu ("swish") by default. No parameters beyond the shared ones.
// q^, k^ and v reach the GDN core in bf16 where the backend's core takes them so (DeltaLayer::core_input_dtype:
// CUDA with compute bf16; the L2 norm and the short conv write them rounded, their backward reads the fp32 q, k);
// KDA's core takes the master dtype only.
// The same core path serves KDA (model/kda.h), whose core differs only by the per-channel decay
// (section 4.3): with Gates::channelwise the core is kda_chunk_* on g [B, T, H, dk].
#pragma once
#include "model/delta_layer.h"

namespace llmt {

class GdnMixer : public DeltaLayer {
 public:
  GdnMixer(const ModelConfig& config, ParamStore& store, const std::string& prefix)
      : GdnMixer(config, config.gdn, Gates::scalar, store, prefix) {}

 protected:
  /// The GDN-style layer over block `c` with the given gate form (Gates::channelwise: KDA).
  GdnMixer(const ModelConfig& config, const GdnConfig& c, Gates gates, ParamStore& store, const std::string& prefix)
      : DeltaLayer(config, c, gates, store, prefix) {}

 private:
  bool bf16_input_core() const override { return gates_ == Gates::scalar; }
  void plan_core(int64_t rows, ScratchCarver& saved) override;
  void bind_core_scratch(ScratchCarver& scratch, int64_t rows) override;
  void core_forward(const MixerState* state) override;
  void core_backward() override;

  Tensor qhat_, khat_, rq_, rk_;  // L2-normalised q (scaled), k (in core_input_dtype()); their 1/norm [rows * H]
  Tensor kept_;                   // the GDN / KDA core's saved forward intermediates (none where the backend
                                  // keeps nothing)
  Tensor dqhat_, dkhat_;          // backward temporaries (shared scratch)
};

}  // namespace llmt
