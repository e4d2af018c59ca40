#include "model/mamba3.h"

#include <algorithm>
#include <cmath>

namespace llmt {
namespace {

Mamba3Options options(const ModelConfig& config) {
  const Mamba3Config& c = config.mamba3;
  Mamba3Options o;
  o.head_dim = c.head_dim;
  o.n_groups = c.n_groups;
  o.rank = c.mimo_rank;
  o.chunk_size = c.chunk_size;
  o.A_floor = c.A_floor;
  o.heavy_tail = c.A_act == "heavy_tail";
  o.outproj_norm = c.outproj_norm;
  return o;
}

Init torch_uniform(int64_t fan_in) {  // PyTorch's default Linear init U(±1/sqrt(fan_in)) (section 4.8)
  Init u{Init::uniform};
  u.hi = 1.0 / std::sqrt(static_cast<double>(fan_in));
  u.lo = -u.hi;
  return u;
}

Init constant(double value) {
  Init c{Init::constant};
  c.value = value;
  return c;
}

}  // namespace

Mamba3Mixer::Mamba3Mixer(const ModelConfig& config, ParamStore& store, const std::string& prefix)
    : store_(store),
      c_(config.mamba3),
      opt_(options(config)),
      d_model_(config.d_model),
      inner_(config.mamba3.inner_dim(config.d_model)),
      heads_(config.mamba3.num_heads(config.d_model)),
      bc_dim_(2 * c_.mimo_rank * c_.n_groups * c_.d_state),
      raw_dim_(3 * heads_ + c_.num_angles()) {
  const int64_t D = d_model_, H = heads_, R = c_.mimo_rank, N = c_.d_state, P = c_.head_dim;
  const bool torch = c_.init_style == "mamba_ssm";
  const Init normal{Init::normal, config.init_std};
  w_in_ = store.add(prefix + "in_proj.weight", {c_.in_proj_dim(D), D}, ParamKind::weight,
                    torch ? torch_uniform(D) : normal);
  Init dt{Init::dt_bias};
  dt.lo = c_.dt_min;
  dt.hi = c_.dt_max;
  dt.floor = c_.dt_floor;
  dt_bias_ = store.add(prefix + "dt_bias", {H}, ParamKind::ssm_param, dt);
  B_bias_ = store.add(prefix + "B_bias", {H, R, N}, ParamKind::ssm_param, constant(c_.bc_bias_init));
  C_bias_ = store.add(prefix + "C_bias", {H, R, N}, ParamKind::ssm_param, constant(c_.bc_bias_init));
  B_norm_ = store.add(prefix + "B_norm.weight", {N}, ParamKind::norm, Init{Init::ones});
  C_norm_ = store.add(prefix + "C_norm.weight", {N}, ParamKind::norm, Init{Init::ones});
  D_ = store.add(prefix + "D", {H}, ParamKind::ssm_param, Init{Init::ones});
  if (R > 1) {
    mimo_x_ = store.add(prefix + "mimo_x", {H, R, P}, ParamKind::ssm_param, constant(1.0 / static_cast<double>(R)));
    mimo_z_ = store.add(prefix + "mimo_z", {H, R, P}, ParamKind::ssm_param, Init{Init::ones});
    mimo_o_ = store.add(prefix + "mimo_o", {H, R, P}, ParamKind::ssm_param, constant(1.0 / static_cast<double>(R)));
  }
  if (c_.outproj_norm) norm_ = store.add(prefix + "norm.weight", {inner_}, ParamKind::norm, Init{Init::ones});
  Init out = torch ? torch_uniform(inner_) : normal;
  if (config.residual_rescale == "kaiming_div_sqrt") {  // section 4.8: kaiming-uniform(a=√5) / √n
    out = torch_uniform(inner_);
    out.hi /= std::sqrt(static_cast<double>(config.residual_rescale_n));
    out.lo = -out.hi;
  }
  w_out_ = store.add(prefix + "out_proj.weight", {D, inner_}, ParamKind::weight, out);
}

Tensor Mamba3Mixer::in_rows(const Tensor& w, int64_t r0, int64_t n) const {
  return Tensor(static_cast<char*>(w.data) + r0 * d_model_ * dtype_size(w.dtype), w.dtype, {n, d_model_});
}

Backend::Mamba3Params Mamba3Mixer::params(bool grads) const {
  const auto get = [&](int i) { return i < 0 ? Tensor() : grads ? store_.grad(i) : store_.master(i); };
  return {get(dt_bias_), get(B_bias_), get(C_bias_), get(B_norm_), get(C_norm_),
          get(D_),       get(mimo_x_), get(mimo_z_), get(mimo_o_), get(norm_)};
}

void Mamba3Mixer::plan(int64_t batch, int64_t seq_len, ScratchCarver& saved) {
  batch_ = batch;
  seq_len_ = seq_len;
  const int64_t rows = batch * seq_len;
  const DType dt = store_.dtype(), act = act_dtype();
  for (Tensor* t : {&z_, &xs_, &o_}) *t = saved.take(act, {rows, inner_});
  bc_ = saved.take(dt, {rows, bc_dim_});
  raw_ = saved.take(dt, {rows, raw_dim_});
  // bc_, raw_ in the master dtype; z_, xs_, o_ in the compute dtype where the backend's op takes them so (in_proj
  // writes them, out_proj reads o_ directly), else in the master dtype with o_ also in the compute dtype for out_proj.
  o_c_ = store_.compute_dtype() != act ? saved.take(store_.compute_dtype(), {rows, inner_}) : Tensor();
  const int64_t kept =
      c_.save_states
          ? store_.backend().mamba3_saved_numel(batch, seq_len, heads_, c_.d_state, c_.num_angles(), layer_options())
          : 0;
  kept_ = kept > 0 ? saved.take(dt, {kept}) : Tensor();
}

void Mamba3Mixer::bind_scratch(ScratchCarver& s) {
  const int64_t rows = batch_ * seq_len_;
  const DType dt = store_.dtype(), act = act_dtype(), compute = store_.compute_dtype();
  for (Tensor* t : {&do_, &dz_, &dxs_}) *t = s.take(act, {rows, inner_});
  dbc_ = s.take(dt, {rows, bc_dim_});
  draw_ = s.take(dt, {rows, raw_dim_});
  // The gradients rounded to the compute dtype for in_proj's backward: dbc_, draw_, and dz_, dxs_ unless the op wrote
  // them in it.
  if (compute != dt)
    cvt_ = s.take(compute, {rows * std::max({act != compute ? inner_ : int64_t{0}, bc_dim_, raw_dim_})});
}

void Mamba3Mixer::forward(const Tensor& x, const Tensor& y) { mix(x, y, nullptr); }

void Mamba3Mixer::decode(const Tensor& x, MixerState& state, int64_t, const Tensor& y) { mix(x, y, &state); }

MixerState Mamba3Mixer::decode_state(int64_t batch, int64_t) const {
  MixerState s;
  const int64_t R = c_.mimo_rank;
  for (auto dims : {std::initializer_list<int64_t>{batch, heads_, c_.head_dim, c_.d_state},
                    {batch, heads_, R, c_.d_state}, {batch, heads_, R, c_.head_dim}, {batch, heads_, c_.num_angles()}})
    s.add(store_.backend(), store_.dtype(), dims);
  return s;
}

DType Mamba3Mixer::act_dtype() const {
  return store_.backend().mamba3_bf16_activations(store_.compute_dtype()) ? store_.compute_dtype() : store_.dtype();
}

Mamba3Options Mamba3Mixer::layer_options() const {
  Mamba3Options o = opt_;
  o.bf16_products = store_.compute_dtype() == DType::bf16;
  return o;
}

void Mamba3Mixer::mix(const Tensor& x, const Tensor& y, const MixerState* state) {
  Backend& be = store_.backend();
  const Tensor w_in = store_.param(w_in_);
  // in_proj, split into z, x, B|C and the per-head/per-angle scalars (section 4.2).
  be.matmul(x, false, in_rows(w_in, 0, inner_), true, z_, false);
  be.matmul(x, false, in_rows(w_in, inner_, inner_), true, xs_, false);
  be.matmul(x, false, in_rows(w_in, 2 * inner_, bc_dim_), true, bc_, false);
  be.matmul(x, false, in_rows(w_in, 2 * inner_ + bc_dim_, raw_dim_), true, raw_, false);
  // Sections 4.3.1-4.3.4: scalars, rotation, chunked core, output norm, gate, MIMO down-projection.
  if (state != nullptr)
    be.mamba3_decode(seq3(xs_), seq3(z_), seq3(bc_), seq3(raw_), params(false), layer_options(),
                     {(*state)[0], (*state)[1], (*state)[2], (*state)[3]}, seq3(o_));
  else
    be.mamba3_fwd(seq3(xs_), seq3(z_), seq3(bc_), seq3(raw_), params(false), layer_options(), seq3(o_), kept_);
  be.matmul(o_c_.data ? converted(be, o_, o_c_) : o_, false, store_.param(w_out_), true, y, false);
}

void Mamba3Mixer::backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  Backend& be = store_.backend();
  be.matmul(dy, false, store_.param(w_out_), false, do_, false);                        // do = dy W_out
  be.matmul(dy, true, o_c_.data ? o_c_ : o_, false, store_.grad(w_out_), true);     // dW_out += dy^T o
  be.mamba3_bwd(seq3(do_), seq3(xs_), seq3(z_), seq3(bc_), seq3(raw_), kept_, params(false), layer_options(),
                seq3(dxs_), seq3(dz_), seq3(dbc_), seq3(draw_), params(true));
  // in_proj: dx = [dz | dx | dB|dC | dscalars] W_in, dW_in += [...]^T x, part by part.
  const Tensor w_in = store_.param(w_in_), g_in = store_.grad(w_in_);
  const std::pair<const Tensor*, int64_t> parts[] = {
      {&dz_, 0}, {&dxs_, inner_}, {&dbc_, 2 * inner_}, {&draw_, 2 * inner_ + bc_dim_}};
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
