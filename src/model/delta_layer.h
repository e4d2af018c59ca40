// The structure shared by the delta-rule layers (layers-delta.md sections 2 and 4; GDN, Comba, KDA,
// and MDN, whose four gates replace the default ones through gates_forward/backward), FLA parameter names:
//   q = silu(conv_q(x Wq^T)), k = silu(conv_k(x Wk^T)), v = silu(conv_v(x Wv^T))   (section 2.1)
//   beta = sigmoid(x Wb^T), g = -exp(A_log) softplus(a + dt_bias)                  (4.1 steps 2-3, 4.3 steps 2-3)
//   o = core(q, k, v, g, beta)            <- the subclass: L2 norms, corrections, chunked core
//   y = o_proj( rmsnorm_per_head(o) * w * phi(z) ), phi = silu or sigmoid           (2.3)
// The decay input a and the output gate z come in two forms (DeltaLayer::Gates):
//   scalar (GDN, Comba, 4.1):     a = x Wa^T [H] (a_proj [H, D]); dt_bias [H]; z = x Wg^T (g_proj [H dv, D])
//   channelwise (KDA, 4.3):       a = (x Wf0^T) Wf1^T [H dk] (f_proj.0 [dv, D], f_proj.1 [H dk, dv]);
//                                 dt_bias [H dk]; z = (x Wg0^T) Wg1^T + b (g_proj.0 [dv, D], g_proj.1 [H dv, dv]
//                                 with bias g_proj.1.bias [H dv])
// Other shared parameters: q_proj, k_proj [H dk, D]; v_proj [H dv, D]; b_proj [H, D]; A_log [H];
// {q,k,v}_conv1d.weight [channels, 1, conv_size]; o_norm.weight [dv]; o_proj [D, H dv]; initialised as
// section 3.3 (A_log = log U(init.A_range), dt_bias = softplus^-1 of a log-uniform dt).
#pragma once
#include <cmath>
#include <optional>

#include "kernels/backend.h"
#include "model/mixer.h"
#include "model/projection.h"

namespace llmt {

class DeltaLayer : public Mixer {
 public:
  /// The form of the decay gate and of the output gate (see the file comment).
  enum class Gates { scalar, channelwise };

  void plan(int64_t batch, int64_t seq_len, ScratchCarver& saved) final;
  void bind_scratch(ScratchCarver& scratch) final;
  void forward(const Tensor& x, const Tensor& y) final;
  void backward(const Tensor& x, const Tensor& dy, const Tensor& dx) final;
  /// State: the windows of the q, k, v convolutions [batch, conv_size - 1, channels], then the core's
  /// core_states() states [batch, H, dk, dv] (S; MDN: S and the momentum M), all in the master dtype.
  MixerState decode_state(int64_t batch, int64_t max_len) const final;
  void decode(const Tensor& x, MixerState& state, int64_t position, const Tensor& y) final;

 protected:
  /// Registers the shared parameters under `prefix`; `c` is the layer's block of the config.
  DeltaLayer(const ModelConfig& config, const GdnConfig& c, Gates gates, ParamStore& store,
             const std::string& prefix);

  /// Whether the subclass's core is one that may take bf16 q̂, k̂, v (Backend::delta_core_bf16_inputs: GDN with
  /// scalar gates, Comba); default false (KDA, MDN).
  virtual bool bf16_input_core() const { return false; }
  /// The dtype of the core's inputs q̂, k̂, v (vc_, and the subclass's L2-norm outputs): bf16 where the core takes
  /// them so (bf16_input_core and Backend::delta_core_bf16_inputs at the compute dtype), else the master dtype.
  DType core_input_dtype() const;
  /// Takes the core's own saved tensors for `rows` = batch * seq_len tokens from `saved`.
  virtual void plan_core(int64_t rows, ScratchCarver& saved) = 0;
  /// Takes the core's own backward temporaries from the shared scratch.
  virtual void bind_core_scratch(ScratchCarver& scratch, int64_t rows) = 0;
  /// From qc_, kc_, vc_, g_, beta_ (conv outputs and gates), writes o_ [rows, H dv]: the chunked core from zero
  /// when `state` is null, else continuing from (and updating) the core states state[kCoreState ...].
  virtual void core_forward(const MixerState* state) = 0;
  /// Number of [B, H, dk, dv] states the core carries while decoding (decode_state).
  virtual int core_states() const { return 1; }
  /// Index of the first core state in a DeltaLayer's MixerState (after the three convolution windows).
  static constexpr size_t kCoreState = 3;
  /// From do_, writes dqc_, dkc_, dvc_, dg_, dbeta_ (overwritten) and accumulates the core's
  /// own parameter gradients.
  virtual void core_backward() = 0;

  /// From the gate pre-activations a_ (decay input) and b_ (beta input) writes g_ and beta_ (the
  /// subclass may read more inputs from x [rows, D]); default: the GDN (scalar) or KDA (channel-wise) gates.
  virtual void gates_forward(const Tensor& x);
  /// From dg_ and dbeta_ writes da_ and db_ (overwritten) and accumulates the gate parameters' gradients;
  /// a subclass with more gate inputs adds their gradient to dx [rows, D]. Default: GDN / KDA gates.
  virtual void gates_backward(const Tensor& x, const Tensor& dx);

  /// q, k [B, T, H, dk]-shaped and v [B, T, H, dv]-shaped views of a [rows, channels] tensor.
  Tensor heads_k(const Tensor& t) const { return t.reshape({batch_, seq_len_, c_.num_heads, c_.head_dim}); }
  Tensor heads_v(const Tensor& t) const { return t.reshape({batch_, seq_len_, c_.num_heads, c_.value_dim()}); }
  Tensor per_token(const Tensor& t) const { return t.reshape({batch_, seq_len_, c_.num_heads}); }
  /// The core's view of the log-decay g_ (or dg_): [B, T, H] (scalar gates) or [B, T, H, dk] (channelwise).
  Tensor decay_view(const Tensor& t) const { return gates_ == Gates::scalar ? per_token(t) : heads_k(t); }
  /// The query scale d_k^-1/2 applied after the L2 norm (section 2.2).
  double q_scale() const { return 1.0 / std::sqrt(static_cast<double>(c_.head_dim)); }

  ParamStore& store_;
  const GdnConfig c_;
  const Gates gates_;
  const int64_t key_dim_, value_dim_;
  int64_t batch_ = 0, seq_len_ = 0;
  Tensor qc_, kc_, vc_;  // conv + silu outputs [rows, channels] (vc is the core's v, in core_input_dtype())
  Tensor g_, beta_;      // gates: g [rows, H] or [rows, H dk] (decay_view), beta [rows, H]
  Tensor o_;             // core output [rows, H dv]
  Tensor do_, dqc_, dkc_, dvc_, dg_, dbeta_;  // gradients at the core's boundary (shared scratch)
  int A_log_, dt_bias_;                // decay-gate parameters [H] / [H dk] (registration indices)
  Tensor a_, b_;                  // gate pre-activations [rows, decay_width], [rows, H]
  Tensor da_, db_;                     // their gradients (shared scratch)
  Tensor cvt_;  // shared scratch [rows, H] for the gates' gradients rounded to the compute dtype (when it differs)

 private:
  /// forward (state null) or decode (state: decode_state's): the same path, with the convolutions and the
  /// core starting from zero or continuing from `state`.
  void mix(const Tensor& x, const Tensor& y, const MixerState* state);
  /// Width of the decay input a, of g and of dt_bias: H (scalar) or H dk (channelwise).
  int64_t decay_width() const { return gates_ == Gates::scalar ? c_.num_heads : key_dim_; }

  double norm_eps_;
  int64_t d_model_;
  int wq_, wk_, wv_, wb_, conv_q_, conv_k_, conv_v_, o_norm_, wo_;
  std::optional<Projection> decay_proj_, gate_proj_;  // a_proj / f_proj; g_proj (registered in FLA order)
  Tensor qp_, kp_, vp_;           // projections (inputs of the convolutions)
  Tensor q_pre_, k_pre_, v_pre_;  // convolution pre-activations
  Tensor z_, rstd_;               // output gate, norm rstd [rows * H]
  Tensor yn_;                     // gated-norm output, in the compute dtype (the output projection's operand)
  Tensor dyn_, dz_, dqp_, dkp_, dvp_;  // backward temporaries (shared scratch); dz, dq/dk/dv_p in the compute dtype
};

}  // namespace llmt
