// Gated DeltaNet mixer (layers-delta.md section 4.1), FLA parameter names:
//   q = silu(conv_q(x Wq^T)), k = silu(conv_k(x Wk^T)), v = silu(conv_v(x Wv^T))   (section 2.1)
//   beta = sigmoid(x Wb^T), g = -exp(A_log) softplus(x Wa^T + dt_bias)             (4.1 steps 2-3)
//   q^ = l2norm(q) / sqrt(d_k), k^ = l2norm(k)                                     (2.2)
//   o = GDN core (chunked, section 6) of (q^, k^, v, g, beta)
//   y = o_proj( rmsnorm_per_head(o) * w * phi(x Wg^T) ), phi = silu ("swish")      (2.3)
// Parameters: q_proj, k_proj [H dk, D]; v_proj, g_proj [H dv, D]; a_proj, b_proj [H, D];
// A_log, dt_bias [H]; {q,k,v}_conv1d.weight [channels, 1, conv_size]; o_norm.weight [dv];
// o_proj [D, H dv]. Init as section 3.3.
#pragma once
#include "kernels/backend.h"
#include "model/mixer.h"

namespace llmt {

class GdnMixer final : public Mixer {
 public:
  GdnMixer(const ModelConfig& config, ParamStore& store, const std::string& prefix);
  void plan(int64_t batch, int64_t seq_len) override;
  void bind_scratch(ScratchCarver& scratch) override;
  void forward(const Tensor& x, const Tensor& y) override;
  void backward(const Tensor& x, const Tensor& dy, const Tensor& dx) override;

 private:
  ParamStore& store_;
  GdnConfig c_;
  double norm_eps_;
  int64_t d_model_, key_dim_, value_dim_;
  int wq_, wk_, wv_, wa_, wb_, A_log_, dt_bias_, conv_q_, conv_k_, conv_v_, wg_, o_norm_, wo_;
  int64_t batch_ = 0, seq_len_ = 0;
  // Saved for the backward ([rows, channels] unless noted; rows = batch * seq_len).
  OwnedTensor qp_, kp_, vp_;            // projections (inputs of the convolutions)
  OwnedTensor q_pre_, k_pre_, v_pre_;   // convolution pre-activations
  OwnedTensor qc_, kc_, vc_;            // conv + silu outputs (vc is the core's v)
  OwnedTensor qhat_, khat_, rq_, rk_;   // L2-normalised q (scaled), k; their 1/norm [rows * H]
  OwnedTensor a_, b_, g_, beta_;        // gate pre-activations and gates [rows, H]
  OwnedTensor o_, z_, rstd_, yn_;       // core output, output gate, norm rstd [rows * H], gated-norm output
  // Backward temporaries (shared scratch).
  Tensor dyn_, do_, dz_, dqhat_, dkhat_, dvc_, dg_, dbeta_, da_, db_, dqc_, dkc_, dqp_, dkp_, dvp_;
};

}  // namespace llmt
