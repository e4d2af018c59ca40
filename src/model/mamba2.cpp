#include "model/mamba2.h"

#include <algorithm>
#include <cmath>

namespace llmt {

Mamba2Mixer::Mamba2Mixer(const ModelConfig& config, ParamStore& store, const std::string& prefix)
    : store_(store),
      c_(config.mamba2),
      d_model_(config.d_model),
      inner_(config.mamba2.inner_dim(config.d_model)),
      heads_(config.mamba2.num_heads(config.d_model)),
      conv_dim_(inner_ + 2 * c_.n_groups * c_.d_state),
      norm_eps_(config.norm_eps) {
  const int64_t D = d_model_, H = heads_;
  // Section 2.3: fla_mdn (2.3.1) draws Linear and conv weights N(0, std^2), conv bias 0, A = -1..-H;
  // mamba_ssm (2.3.3) uses PyTorch's defaults U(±1/sqrt(fan_in)) (conv fan_in = K) and A ~ U(1, 16);
  // zeros_like_skipped (2.3.2) is fla_mdn with A_log = dt_bias = 0.
  const bool torch = c_.init_style == "mamba_ssm", skipped = c_.init_style == "zeros_like_skipped";
  const auto torch_uniform = [](int64_t fan_in) {
    Init u{Init::uniform};
    u.hi = 1.0 / std::sqrt(static_cast<double>(fan_in));
    u.lo = -u.hi;
    return u;
  };
  const Init normal{Init::normal, config.init_std};
  w_in_ = store.add(prefix + "in_proj.weight", {inner_ + conv_dim_ + H, D}, ParamKind::weight,
                    torch ? torch_uniform(D) : normal);
  conv_w_ = store.add(prefix + "conv1d.weight", {conv_dim_, 1, c_.conv_size}, ParamKind::weight,
                      torch ? torch_uniform(c_.conv_size) : normal);
  if (c_.conv_bias)
    conv_b_ = store.add(prefix + "conv1d.bias", {conv_dim_}, ParamKind::bias,
                        torch ? torch_uniform(c_.conv_size) : Init{Init::zeros});
  Init dt{Init::dt_bias};
  dt.lo = c_.dt_min;
  dt.hi = c_.dt_max;
  dt.floor = c_.dt_floor;
  dt_bias_ = store.add(prefix + "dt_bias", {H}, ParamKind::ssm_param, skipped ? Init{Init::zeros} : dt);
  Init a_log{Init::log_index};
  if (torch) {
    a_log.kind = Init::log_uniform;
    a_log.lo = 1;
    a_log.hi = 16;
  }
  A_log_ = store.add(prefix + "A_log", {H}, ParamKind::ssm_param, skipped ? Init{Init::zeros} : a_log);
  D_ = store.add(prefix + "D", {H}, ParamKind::ssm_param, Init{Init::ones});
  norm_ = store.add(prefix + "norm.weight", {inner_}, ParamKind::norm, Init{Init::ones});
  Init out = torch ? torch_uniform(inner_) : normal;
  if (config.residual_rescale == "kaiming_div_sqrt") {  // section 2.3.1: kaiming-uniform(a=√5) / √n
    out = torch_uniform(inner_);
    out.hi /= std::sqrt(static_cast<double>(config.residual_rescale_n));
    out.lo = -out.hi;
  }
  w_out_ = store.add(prefix + "out_proj.weight", {D, inner_}, ParamKind::weight, out);
}

Tensor Mamba2Mixer::in_rows(const Tensor& w, int64_t r0, int64_t n) const {
  return Tensor(static_cast<char*>(w.data) + r0 * d_model_ * dtype_size(w.dtype), w.dtype, {n, d_model_});
}

void Mamba2Mixer::plan(int64_t batch, int64_t seq_len, ScratchCarver& saved) {
  batch_ = batch;
  seq_len_ = seq_len;
  const int64_t rows = batch * seq_len;
  const DType dt = store_.dtype();
  z_ = saved.take(dt, {rows, inner_});
  for (Tensor* t : {&xbc_, &pre_}) *t = saved.take(dt, {rows, conv_dim_});
  // The conv output feeds only the SSD (the conv's backward reads xbc_ and pre_): bf16 where the SSD takes it so. The
  // SSD then writes its output y_ (read by the gated norm's forward and backward only) in bf16 too.
  xbc_c_ = saved.take(ssd_input_dtype(), {rows, conv_dim_});
  y_ = saved.take(ssd_input_dtype(), {rows, inner_});
  dtr_ = saved.take(dt, {rows, heads_});
  rstd_ = saved.take(dt, {rows});
  // As DeltaLayer: the layer's activations stay in the master dtype; the normed output, which meets out_proj (and
  // dW_out in the backward), only in the compute dtype (the norm writes it so).
  yn_ = saved.take(store_.compute_dtype(), {rows, inner_});
  const int64_t kept = c_.save_states ? store_.backend().mamba2_saved_numel(batch, seq_len, heads_, c_.head_dim,
                                                                           c_.d_state, store_.compute_dtype())
                                      : 0;
  kept_ = kept > 0 ? saved.take(dt, {kept}) : Tensor();
}

DType Mamba2Mixer::ssd_input_dtype() const {
  return store_.backend().mamba2_bf16_inputs(store_.compute_dtype()) ? DType::bf16 : store_.dtype();
}

void Mamba2Mixer::bind_scratch(ScratchCarver& s) {
  const int64_t rows = batch_ * seq_len_;
  const DType dt = store_.dtype();
  dyn_ = s.take(dt, {rows, inner_});
  dy_ssd_ = s.take(ssd_input_dtype(), {rows, inner_});  // written so by the norm's backward: the SSD's dy
  dz_ = s.take(store_.compute_dtype(), {rows, inner_});  // written so by the norm's backward: in_proj's operand
  // the SSD's dxbc (read by the conv's backward only) in ssd_input_dtype(), as the SSD writes it
  dxbc_c_ = s.take(ssd_input_dtype(), {rows, conv_dim_});
  dxbc_ = s.take(dt, {rows, conv_dim_});
  ddtr_ = s.take(dt, {rows, heads_});
  if (store_.compute_dtype() != dt) cvt_ = s.take(store_.compute_dtype(), {rows * conv_dim_});
}

void Mamba2Mixer::forward(const Tensor& x, const Tensor& y) { mix(x, y, nullptr); }

void Mamba2Mixer::decode(const Tensor& x, MixerState& state, int64_t, const Tensor& y) { mix(x, y, &state); }

MixerState Mamba2Mixer::decode_state(int64_t batch, int64_t) const {
  MixerState s;
  s.add(store_.backend(), store_.dtype(), {batch, c_.conv_size - 1, conv_dim_});
  s.add(store_.backend(), store_.dtype(), {batch, heads_, c_.head_dim, c_.d_state});
  return s;
}

void Mamba2Mixer::mix(const Tensor& x, const Tensor& y, const MixerState* state) {
  Backend& be = store_.backend();
  const Tensor w_in = store_.param(w_in_);
  // in_proj, split into z, xBC, dt_raw (step 1).
  be.matmul(x, false, in_rows(w_in, 0, inner_), true, z_, false);
  be.matmul(x, false, in_rows(w_in, inner_, conv_dim_), true, xbc_, false);
  be.matmul(x, false, in_rows(w_in, inner_ + conv_dim_, heads_), true, dtr_, false);
  // Conv + SiLU on x, B, C (step 2; xbc_c_ written in the SSD's input dtype); discretisation and SSD with the D skip
  // (steps 3-5).
  const Tensor dt_bias = store_.master(dt_bias_), A_log = store_.master(A_log_), D = store_.master(D_);
  if (state != nullptr) {  // continuing the carried conv window and SSM state (section 2.8)
    be.short_conv_silu_decode(seq3(xbc_), store_.master(conv_w_), c_.conv_bias ? store_.master(conv_b_) : Tensor(),
                              (*state)[0], seq3(xbc_c_));
    be.mamba2_ssd_decode(seq3(xbc_c_), seq3(dtr_), dt_bias, A_log, D, c_.head_dim, c_.n_groups, c_.chunk_size,
                         (*state)[1], seq3(y_));
  } else {
    if (c_.conv_bias)
      be.conv_bias_silu_fwd(seq3(xbc_), store_.master(conv_w_), store_.master(conv_b_), seq3(pre_), seq3(xbc_c_));
    else
      be.short_conv_silu_fwd(seq3(xbc_), store_.master(conv_w_), seq3(pre_), seq3(xbc_c_));
    // the SSD core's products in the compute dtype (bf16 operands on the tensor cores, or fp32)
    be.mamba2_ssd_fwd(seq3(xbc_c_), seq3(dtr_), dt_bias, A_log, D, c_.head_dim, c_.n_groups, c_.chunk_size,
                      store_.compute_dtype(), seq3(y_), kept_);
  }
  // Gated RMSNorm, norm_before_gate = False: u = y ∘ silu(z), yn = rmsnorm(u) ∘ w in one op, u not stored
  // (step 6); out_proj (step 7).
  be.gate_rmsnorm_fwd(y_, z_, store_.master(norm_), norm_eps_, yn_, rstd_);
  be.matmul(yn_, false, store_.param(w_out_), true, y, false);
}

void Mamba2Mixer::backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  Backend& be = store_.backend();
  // out_proj and the gated norm (section 2.6.2 steps 1-2).
  be.matmul(dy, false, store_.param(w_out_), false, dyn_, false);  // dyn = dy W_out
  be.matmul(dy, true, yn_, false, store_.grad(w_out_), true);      // dW_out += dy^T yn
  // dy_ssd_ (the SSD's dy) written in the SSD's input dtype
  be.gate_rmsnorm_bwd(dyn_, y_, z_, store_.master(norm_), rstd_, dy_ssd_, dz_, store_.grad(norm_));
  // SSD, discretisation (steps 3-4) and the conv (step 5).
  be.mamba2_ssd_bwd(seq3(dy_ssd_), seq3(xbc_c_), seq3(dtr_), store_.master(dt_bias_), store_.master(A_log_),
                    store_.master(D_), kept_, c_.head_dim, c_.n_groups, c_.chunk_size, store_.compute_dtype(),
                    seq3(dxbc_c_), seq3(ddtr_), store_.grad(dt_bias_), store_.grad(A_log_), store_.grad(D_));
  if (c_.conv_bias)
    be.conv_bias_silu_bwd(seq3(dxbc_c_), seq3(xbc_), store_.master(conv_w_), seq3(pre_), seq3(dxbc_),
                          store_.grad(conv_w_), store_.grad(conv_b_));
  else
    be.short_conv_silu_bwd(seq3(dxbc_c_), seq3(xbc_), store_.master(conv_w_), seq3(pre_), seq3(dxbc_),
                           store_.grad(conv_w_));
  // in_proj (step 6): dx = [dz | dxBC | ddt_raw] W_in, dW_in += [...]^T x, part by part (dz already in the compute
  // dtype; the others rounded to it through cvt_).
  const Tensor w_in = store_.param(w_in_), g_in = store_.grad(w_in_);
  const std::pair<const Tensor*, int64_t> parts[] = {{&dz_, 0}, {&dxbc_, inner_}, {&ddtr_, inner_ + conv_dim_}};
  bool first = true;
  for (const auto& [dpart, r0] : parts) {
    const Tensor d = converted(be, *dpart, cvt_);
    const int64_t n = d.shape[1];
    be.matmul(d, true, x, false, in_rows(g_in, r0, n), true);
    be.matmul(d, false, in_rows(w_in, r0, n), false, dx, !first);
    first = false;
  }
}

}  // namespace llmt
