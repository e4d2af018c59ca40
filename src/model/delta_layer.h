// The structure shared by the delta-rule layers (layers-delta.md sections 2 and 4; GDN, Comba,
// and later KDA and MDN), FLA parameter names:
//   q = silu(conv_q(x Wq^T)), k = silu(conv_k(x Wk^T)), v = silu(conv_v(x Wv^T))   (section 2.1)
//   beta = sigmoid(x Wb^T), g = -exp(A_log) softplus(x Wa^T + dt_bias)             (4.1 steps 2-3)
//   o = core(q, k, v, g, beta)            <- the subclass: L2 norms, corrections, chunked core
//   y = o_proj( rmsnorm_per_head(o) * w * phi(x Wg^T) ), phi = silu or sigmoid     (2.3)
// Shared parameters: q_proj, k_proj [H dk, D]; v_proj, g_proj [H dv, D]; a_proj, b_proj [H, D];
// A_log, dt_bias [H]; {q,k,v}_conv1d.weight [channels, 1, conv_size]; o_norm.weight [dv];
// o_proj [D, H dv]; initialised as section 3.3.
#pragma once
#include <cmath>

#include "kernels/backend.h"
#include "model/mixer.h"

namespace llmt {

class DeltaLayer : public Mixer {
 public:
  void plan(int64_t batch, int64_t seq_len) final;
  void bind_scratch(ScratchCarver& scratch) final;
  void forward(const Tensor& x, const Tensor& y) final;
  void backward(const Tensor& x, const Tensor& dy, const Tensor& dx) final;

 protected:
  /// Registers the shared parameters under `prefix`; `c` is the layer's block of the config.
  DeltaLayer(const ModelConfig& config, const GdnConfig& c, ParamStore& store, const std::string& prefix);

  /// Allocates the core's own saved tensors for `rows` = batch * seq_len tokens.
  virtual void plan_core(int64_t rows) = 0;
  /// Takes the core's own backward temporaries from the shared scratch.
  virtual void bind_core_scratch(ScratchCarver& scratch, int64_t rows) = 0;
  /// From qc_, kc_, vc_, g_, beta_ (conv outputs and gates), writes o_ [rows, H dv].
  virtual void core_forward() = 0;
  /// From do_, writes dqc_, dkc_, dvc_, dg_, dbeta_ (overwritten) and accumulates the core's
  /// own parameter gradients.
  virtual void core_backward() = 0;

  /// q, k [B, T, H, dk]-shaped and v [B, T, H, dv]-shaped views of a [rows, channels] tensor.
  Tensor heads_k(const Tensor& t) const { return t.reshape({batch_, seq_len_, c_.num_heads, c_.head_dim}); }
  Tensor heads_v(const Tensor& t) const { return t.reshape({batch_, seq_len_, c_.num_heads, c_.value_dim()}); }
  Tensor per_token(const Tensor& t) const { return t.reshape({batch_, seq_len_, c_.num_heads}); }
  /// The query scale d_k^-1/2 applied after the L2 norm (section 2.2).
  double q_scale() const { return 1.0 / std::sqrt(static_cast<double>(c_.head_dim)); }

  ParamStore& store_;
  const GdnConfig c_;
  const int64_t key_dim_, value_dim_;
  int64_t batch_ = 0, seq_len_ = 0;
  OwnedTensor qc_, kc_, vc_;  // conv + silu outputs [rows, channels] (vc is the core's v)
  OwnedTensor g_, beta_;      // gates [rows, H]
  OwnedTensor o_;             // core output [rows, H dv]
  Tensor do_, dqc_, dkc_, dvc_, dg_, dbeta_;  // gradients at the core's boundary (shared scratch)

 private:
  double norm_eps_;
  int64_t d_model_;
  int wq_, wk_, wv_, wa_, wb_, A_log_, dt_bias_, conv_q_, conv_k_, conv_v_, wg_, o_norm_, wo_;
  OwnedTensor qp_, kp_, vp_;           // projections (inputs of the convolutions)
  OwnedTensor q_pre_, k_pre_, v_pre_;  // convolution pre-activations
  OwnedTensor a_, b_;                  // gate pre-activations [rows, H]
  OwnedTensor z_, rstd_, yn_;          // output gate, norm rstd [rows * H], gated-norm output
  OwnedTensor yn_c_;                   // yn_ in the compute dtype (only when that differs)
  Tensor cvt_;                         // shared scratch for gradients rounded to the compute dtype

  /// The [rows, channels] tensor t in the compute dtype: t itself when it has it, else t rounded
  /// into dst (or into cvt_ when dst is empty; valid until the next call).
  Tensor in_compute_dtype(const Tensor& t, const Tensor& dst = Tensor()) const;
  Tensor dyn_, dz_, da_, db_, dqp_, dkp_, dvp_;  // backward temporaries (shared scratch)
};

}  // namespace llmt
