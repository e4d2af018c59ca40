// Comba mixer (layers-delta.md section 4.2), FLA parameter names (fla/layers/comba.py):
//   q = silu(conv_q(x Wq^T)), k = silu(conv_k(x Wk^T)), v = silu(conv_v(x Wv^T))   (section 2.1)
//   s = sigmoid(decay) (inner decay; 1 when off), p = s k                         (4.2 step 2)
//   q' = q - D s k (output correction; q' = q when off)                           (4.2 step 3)
//   beta = sigmoid(x Wb^T), g = -exp(A_log) softplus(x Wa^T + dt_bias)             (4.2 step 4, as GDN)
//   q^ = l2norm(q') / sqrt(d_k), k^ = l2norm(k), p^ = l2norm(p)                    (4.2 step 5, 2.2)
//   o = Comba core (chunked, section 6.2) of (q^, k^, v, p^, g, beta)
//   y = o_proj( rmsnorm_per_head(o) * w * phi(x Wg^T) ), phi = sigmoid by default  (2.3)
// p is normalised separately from k (bit-faithful to FLA; p^ = k^ up to the 1e-6 eps), so decay
// reaches the loss essentially only through the output correction (section 4.2, 10.1).
// Parameters: q_proj, k_proj [H dk, D]; v_proj, g_proj [H dv, D]; a_proj, b_proj [H, D];
// A_log, dt_bias [H]; decay [H] (inner_decay), D [H] (output_correction);
// {q,k,v}_conv1d.weight [channels, 1, conv_size]; o_norm.weight [dv]; o_proj [D, H dv]. Init as section 3.3
// (decay = model.comba.init.decay, 1.0; D = correction_factor, 1.0).
#pragma once
#include "kernels/backend.h"
#include "model/mixer.h"

namespace llmt {

class CombaMixer final : public Mixer {
 public:
  CombaMixer(const ModelConfig& config, ParamStore& store, const std::string& prefix);
  void plan(int64_t batch, int64_t seq_len) override;
  void bind_scratch(ScratchCarver& scratch) override;
  void forward(const Tensor& x, const Tensor& y) override;
  void backward(const Tensor& x, const Tensor& dy, const Tensor& dx) override;

 private:
  bool has_gates() const { return decay_ >= 0 || D_ >= 0; }
  Tensor param_or_none(int i) const { return i >= 0 ? store_.param(i) : Tensor(); }
  Tensor grad_or_none(int i) const { return i >= 0 ? store_.grad(i) : Tensor(); }

  ParamStore& store_;
  CombaConfig c_;
  double norm_eps_;
  int64_t d_model_, key_dim_, value_dim_;
  int wq_, wk_, wv_, wa_, wb_, A_log_, dt_bias_, decay_ = -1, D_ = -1, conv_q_, conv_k_, conv_v_, wg_, o_norm_, wo_;
  int64_t batch_ = 0, seq_len_ = 0;
  // Saved for the backward ([rows, channels] unless noted; rows = batch * seq_len).
  OwnedTensor qp_, kp_, vp_;            // projections (inputs of the convolutions)
  OwnedTensor q_pre_, k_pre_, v_pre_;   // convolution pre-activations
  OwnedTensor qc_, kc_, vc_;            // conv + silu outputs (vc is the core's v)
  OwnedTensor qcor_, p_;                // q' (output-corrected) and p (inner-decayed k), before the L2 norm
  OwnedTensor qhat_, khat_, phat_, rq_, rk_, rp_;  // L2-normalised q' (scaled), k, p; their 1/norm [rows * H]
  OwnedTensor a_, b_, g_, beta_;        // gate pre-activations and gates [rows, H]
  OwnedTensor o_, z_, rstd_, yn_;       // core output, output gate, norm rstd [rows * H], gated-norm output
  // Backward temporaries (shared scratch).
  Tensor dyn_, do_, dz_, dqhat_, dkhat_, dphat_, dvc_, dg_, dbeta_, da_, db_, dqc_, dkc_, dp_, dqp_, dkp_, dvp_;
};

}  // namespace llmt
