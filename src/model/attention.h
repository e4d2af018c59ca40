// LLaMA-style multi-head causal softmax attention with RoPE (layers-ssm-attn.md section 3.3):
// q = x Wq^T, k = x Wk^T, v = x Wv^T (no biases), rotary on q and k, causal softmax with
// scale 1/sqrt(head_dim), y = o Wo^T. Parameters (FLA names): q_proj, k_proj, v_proj
// [H*Dh, D], o_proj [D, H*Dh], all N(0, init_std^2) (section 3.4).
#pragma once
#include <cmath>

#include "kernels/backend.h"
#include "model/mixer.h"

namespace llmt {

class AttentionMixer final : public Mixer {
 public:
  AttentionMixer(const ModelConfig& config, ParamStore& store, const std::string& prefix);
  void plan(int64_t batch, int64_t seq_len, ScratchCarver& saved) override;
  void bind_scratch(ScratchCarver& scratch) override;
  void forward(const Tensor& x, const Tensor& y) override;
  void backward(const Tensor& x, const Tensor& dy, const Tensor& dx) override;
  /// State: the KV cache, k (rotated) and v [batch, max_len, H, Dh] in the compute dtype.
  MixerState decode_state(int64_t batch, int64_t max_len) const override;
  void decode(const Tensor& x, MixerState& state, int64_t position, const Tensor& y) override;

 private:
  /// q_, k_, v_ = x Wq^T, x Wk^T, x Wv^T (before the rotary embedding).
  void project(const Tensor& x);
  /// y = o_ Wo^T.
  void output(const Tensor& y);
  double scale() const { return 1.0 / std::sqrt(static_cast<double>(head_dim_)); }

  ParamStore& store_;
  int64_t d_model_, heads_, head_dim_;
  double theta_;
  int wq_, wk_, wv_, wo_;
  int64_t batch_ = 0, seq_len_ = 0;
  Tensor q_, k_, v_, o_, lse_;         // saved: [B, T, H, Dh] (q, k after rotary), lse [B, H, T]
  Tensor dq_, dk_, dv_, do_;           // backward temporaries (shared scratch)
};

}  // namespace llmt
