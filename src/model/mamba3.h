// The Mamba-3 mixer (layers-ssm-attn.md section 4), mamba_ssm parameter names:
//   [z | x | B | C | dd_dt | dd_A | trap | angles] = u W_in^T   in_proj.weight [2 Di + 2 G N R + 3 H + S, D]
//   Δ, A, λ, θ, φ, BCNorm + B_bias/C_bias, rotation (section 4.3.1)   dt_bias, D [H]; B_bias, C_bias [H, R, N];
//                                                                     B_norm.weight, C_norm.weight [N]
//   SISO: y = core(q, k, x) + D x; o = y ∘ silu(z)                     (sections 4.3.2, 4.4)
//   MIMO: v_r = x ∘ mimo_x[r]; o = Σ_r mimo_o[r] ∘ (y_r ∘ silu(z ∘ mimo_z[r]))   mimo_x, mimo_z, mimo_o [H, R, P]
//   optional output norm before the gate (model.mamba3.outproj_norm)  norm.weight [Di]
//   out = o W_out^T                                                     out_proj.weight [D, Di] (no bias)
// With model.mamba3.save_states the layer keeps what the backend's forward saves for its backward
// (Backend::mamba3_saved_numel; CUDA: the core's G, chunk-entering states and y, BCNorm's normalised B and C, the
// phases φ and the rotated q, k), so the backward does not recompute the core's forward, BCNorm, φ or q, k.
// Initialisation (section 4.2, 4.8): dt_bias from log-uniform dt, B_bias = C_bias = bc_bias_init (1), norms 1,
// D = 1, mimo_x = mimo_o = 1/R, mimo_z = 1; in_proj and out_proj U(±1/sqrt(fan_in)) (init_style "mamba_ssm")
// or N(0, std^2) ("fla"); with model.init.residual_rescale "kaiming_div_sqrt", out_proj is
// U(±1/sqrt(Di)) / sqrt(residual_rescale_n).
#pragma once
#include "model/mixer.h"

namespace llmt {

class Mamba3Mixer : public Mixer {
 public:
  /// Registers the parameters under `prefix`; config.mamba3 gives the sizes (validated by the config parser).
  Mamba3Mixer(const ModelConfig& config, ParamStore& store, const std::string& prefix);
  void plan(int64_t batch, int64_t seq_len, ScratchCarver& saved) override;
  void bind_scratch(ScratchCarver& scratch) override;
  void forward(const Tensor& x, const Tensor& y) override;
  void backward(const Tensor& x, const Tensor& dy, const Tensor& dx) override;
  /// State (layers-ssm-attn.md §4.6; Backend::Mamba3Carry): the SSM state [batch, H, P, N], the last token's
  /// k [batch, H, R, N] and up-projected x [batch, H, R, P], the rotary phase [batch, H, S]; master dtype.
  MixerState decode_state(int64_t batch, int64_t max_len) const override;
  void decode(const Tensor& x, MixerState& state, int64_t position, const Tensor& y) override;

 private:
  /// forward (state null) or decode (state: decode_state's); only the layer op differs.
  void mix(const Tensor& x, const Tensor& y, const MixerState* state);
  /// Rows [r0, r0 + n) of the in_proj weight (or its gradient): the z, x, B|C or scalar part.
  Tensor in_rows(const Tensor& w, int64_t r0, int64_t n) const;
  Tensor seq3(const Tensor& t) const { return t.reshape({batch_, seq_len_, t.shape[1]}); }
  /// The layer op's parameters (master values) or their gradients; absent ones default-constructed.
  Backend::Mamba3Params params(bool grads) const;
  /// opt_ for the store's compute dtype: bf16 products in the CUDA core for bf16 (Mamba3Options::bf16_products).
  Mamba3Options layer_options() const;
  /// The dtype of the layer op's activations x, z, out and dout, dx, dz: the compute dtype where the backend takes
  /// them so (Backend::mamba3_bf16_activations: CUDA with bf16 compute; in_proj then writes z, x in it and out_proj
  /// reads out as it is), else the master dtype.
  DType act_dtype() const;

  ParamStore& store_;
  const Mamba3Config c_;
  const Mamba3Options opt_;
  const int64_t d_model_, inner_, heads_, bc_dim_, raw_dim_;
  int w_in_, dt_bias_, B_bias_, C_bias_, B_norm_, C_norm_, D_, mimo_x_ = -1, mimo_z_ = -1, mimo_o_ = -1, norm_ = -1,
      w_out_;
  int64_t batch_ = 0, seq_len_ = 0;
  Tensor z_, xs_, bc_, raw_, o_;  // in_proj parts and the layer op's output (saved, carved by plan; z_, xs_, o_ in
                                  // act_dtype, bc_, raw_ in the master dtype)
  Tensor kept_;                   // the layer op's saved forward intermediates (save_states; else none)
  Tensor o_c_;                    // o_ in the compute dtype (only when act_dtype differs from it)
  Tensor cvt_;                         // scratch for gradients rounded to the compute dtype (when the master differs)
  Tensor do_, dz_, dxs_, dbc_, draw_;  // backward temporaries (shared scratch; do_, dz_, dxs_ in act_dtype)
};

}  // namespace llmt
