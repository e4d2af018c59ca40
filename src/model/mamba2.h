// The Mamba2 mixer (layers-ssm-attn.md section 2.2), fla parameter names:
//   [z | xBC | dt_raw] = x W_in^T                       in_proj.weight [2 Di + 2 G N + H, D] (no bias)
//   xBC_c = silu(conv1d(xBC) + bias)                     conv1d.weight [Di + 2 G N, 1, K], conv1d.bias [Di + 2 G N]
//   [x | B | C] = xBC_c; Δ = softplus(dt_raw + dt_bias); A = -exp(A_log)   dt_bias, A_log, D [H]
//   y = SSD(x, Δ, A, B, C) + D x                         (chunked core, section 2.5)
//   out = (RMSNorm_Di(y ∘ silu(z)) ∘ w_norm) W_out^T     norm.weight [Di]; out_proj.weight [D, Di] (no bias)
// Initialisation (model.mamba2.init_style, section 2.3): fla_mdn (2.3.1) in_proj, conv weight N(0, std^2),
// conv bias 0, dt_bias from log-uniform dt, A_log = log(1..H), D = 1, norm 1, out_proj N(0, std^2);
// mamba_ssm (2.3.3) PyTorch-default U(±1/sqrt(fan_in)) for in_proj, out_proj, conv weight and bias and
// A_log = log U(1, 16); zeros_like_skipped (2.3.2) fla_mdn with A_log = dt_bias = 0. With
// model.init.residual_rescale "kaiming_div_sqrt", out_proj is U(±1/sqrt(Di)) / sqrt(residual_rescale_n).
// The gated norm is one op, gate_rmsnorm_fwd / bwd (u = y ∘ silu(z) is not stored; the backward recomputes it).
// Saved per token: z (Di), xBC and its conv pre-activation (Di + 2 G N each), dt_raw (H) and the norm's rstd (1) in
// the master dtype, the conv output xBC_c (Di + 2 G N) and the SSD's output y (Di) in the SSD's input dtype and the
// normed output (Di) in the compute dtype. The SSD's input dtype: bf16 where the backend's SSD takes bf16 xbc and dy
// (Backend::mamba2_bf16_inputs; CUDA with bf16 compute: the official kernels' inputs and outputs), else the master
// dtype; the conv then writes xBC_c rounded to bf16, the SSD y and its gradient dxBC_c (the conv backward's dy) in
// bf16, and the gated norm's backward the SSD's dy (its only reader); every other gradient stays in the master
// dtype.
// The layer also keeps what the backend's SSD forward saves for its backward (Backend::mamba2_saved_numel; CUDA: the
// states entering each 64-token chunk, in the compute dtype: 128 MiB per layer with bf16 compute at micro_batch 4,
// seq_len 4096 for configs/mdn-paper/400m/mamba2.json; none on the CPU).
#pragma once
#include "model/mixer.h"

namespace llmt {

class Mamba2Mixer : public Mixer {
 public:
  /// Registers the parameters under `prefix`; config.mamba2 gives the sizes (validated by the config parser).
  Mamba2Mixer(const ModelConfig& config, ParamStore& store, const std::string& prefix);
  void plan(int64_t batch, int64_t seq_len, ScratchCarver& saved) override;
  void bind_scratch(ScratchCarver& scratch) override;
  void forward(const Tensor& x, const Tensor& y) override;
  void backward(const Tensor& x, const Tensor& dy, const Tensor& dx) override;
  /// State (layers-ssm-attn.md §2.8): the conv window [batch, conv_size - 1, Di + 2 G N] and the SSM state
  /// [batch, H, P, N], in the master dtype.
  MixerState decode_state(int64_t batch, int64_t max_len) const override;
  void decode(const Tensor& x, MixerState& state, int64_t position, const Tensor& y) override;

 private:
  /// forward (state null) or decode (state: decode_state's); the conv and the SSD differ.
  void mix(const Tensor& x, const Tensor& y, const MixerState* state);
  /// The dtype of the SSD's inputs xbc_c_ and dy_ssd_ and of its outputs y_ and dxbc_c_: bf16 where the backend's SSD
  /// takes them so at the compute dtype (Backend::mamba2_bf16_inputs; the conv and the gated norm's backward write the
  /// inputs rounded, the SSD its outputs), else the master dtype.
  DType ssd_input_dtype() const;
  /// Rows [r0, r0 + n) of the in_proj weight (or its gradient): the z, xBC or dt_raw part.
  Tensor in_rows(const Tensor& w, int64_t r0, int64_t n) const;
  Tensor seq3(const Tensor& t) const { return t.reshape({batch_, seq_len_, t.shape[1]}); }

  ParamStore& store_;
  const Mamba2Config c_;
  const int64_t d_model_, inner_, heads_, conv_dim_;
  const double norm_eps_;
  int w_in_, conv_w_, conv_b_ = -1, dt_bias_, A_log_, D_, norm_, w_out_;
  int64_t batch_ = 0, seq_len_ = 0;
  Tensor z_, xbc_, dtr_, pre_, xbc_c_;  // in_proj parts, conv pre-activation and output (xbc_c_: ssd_input_dtype())
  Tensor y_, rstd_;  // SSD output (ssd_input_dtype()), gated-norm rstd [rows]
  Tensor yn_;        // gated-norm output (out_proj's operand), in the compute dtype
  Tensor cvt_;       // scratch for gradients rounded to the compute dtype (only when that differs from the master's)
  Tensor kept_;      // the SSD core's saved forward intermediates (none where the backend keeps nothing)
  // backward temporaries (shared scratch; dz_ in the compute dtype, dy_ssd_ and dxbc_c_ in ssd_input_dtype())
  Tensor dyn_, dz_, dy_ssd_, dxbc_c_, dxbc_, ddtr_;
};

}  // namespace llmt
