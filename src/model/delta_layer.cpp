#include "model/delta_layer.h"

#include <cmath>
#include <tuple>

namespace llmt {

DeltaLayer::DeltaLayer(const ModelConfig& config, const GdnConfig& c, Gates gates, ParamStore& store,
                       const std::string& prefix)
    : store_(store),
      c_(c),
      gates_(gates),
      key_dim_(c.num_heads * c.head_dim),
      value_dim_(c.num_heads * c.value_dim()),
      norm_eps_(config.norm_eps),
      d_model_(config.d_model) {
  const int64_t H = c_.num_heads, D = d_model_, W = c_.conv_size;
  // The low-rank projections of KDA have rank d_v (FLA head_v_dim, layers-delta.md 4.3); 0 = full rank.
  const int64_t rank = gates_ == Gates::scalar ? 0 : c_.value_dim();
  const Init normal{Init::normal, config.init_std};
  wq_ = store.add(prefix + "q_proj.weight", {key_dim_, D}, ParamKind::weight, normal);
  wk_ = store.add(prefix + "k_proj.weight", {key_dim_, D}, ParamKind::weight, normal);
  wv_ = store.add(prefix + "v_proj.weight", {value_dim_, D}, ParamKind::weight, normal);
  decay_proj_.emplace(store, prefix + (gates_ == Gates::scalar ? "a_proj" : "f_proj"), D, decay_width(), rank, false,
                      config.init_std);
  wb_ = store.add(prefix + "b_proj.weight", {H, D}, ParamKind::weight, normal);
  Init a_log{Init::log_uniform};
  a_log.lo = c_.A_min;
  a_log.hi = c_.A_max;
  A_log_ = store.add(prefix + "A_log", {H}, ParamKind::ssm_param, a_log);
  Init dt{Init::dt_bias};
  dt.lo = c_.dt_min;
  dt.hi = c_.dt_max;
  dt.floor = c_.dt_floor;
  dt_bias_ = store.add(prefix + "dt_bias", {decay_width()}, ParamKind::ssm_param, dt);
  conv_q_ = store.add(prefix + "q_conv1d.weight", {key_dim_, 1, W}, ParamKind::weight, normal);
  conv_k_ = store.add(prefix + "k_conv1d.weight", {key_dim_, 1, W}, ParamKind::weight, normal);
  conv_v_ = store.add(prefix + "v_conv1d.weight", {value_dim_, 1, W}, ParamKind::weight, normal);
  gate_proj_.emplace(store, prefix + "g_proj", D, value_dim_, rank, rank > 0, config.init_std);
  o_norm_ = store.add(prefix + "o_norm.weight", {c_.value_dim()}, ParamKind::norm, Init{Init::ones});
  wo_ = store.add(prefix + "o_proj.weight", {D, value_dim_}, ParamKind::weight, normal);
}

void DeltaLayer::plan(int64_t batch, int64_t seq_len, ScratchCarver& saved) {
  batch_ = batch;
  seq_len_ = seq_len;
  const int64_t rows = batch * seq_len, H = c_.num_heads;
  const DType dt = store_.dtype(), ct = store_.compute_dtype();
  for (Tensor* t : {&qp_, &kp_, &q_pre_, &k_pre_, &qc_, &kc_}) *t = saved.take(dt, {rows, key_dim_});
  for (Tensor* t : {&vp_, &v_pre_, &o_, &z_}) *t = saved.take(dt, {rows, value_dim_});
  vc_ = saved.take(core_input_dtype(), {rows, value_dim_});
  for (Tensor* t : {&a_, &g_}) *t = saved.take(dt, {rows, decay_width()});
  for (Tensor* t : {&b_, &beta_, &rstd_}) *t = saved.take(dt, {rows, H});
  decay_proj_->plan(rows, saved);
  gate_proj_->plan(rows, saved);
  // With a compute dtype (bf16) the layer's own activations stay in the master dtype (its
  // kernels are fp32); what meets a matrix product is in the compute dtype: the gated-norm
  // output (written so by the norm, saved for dW_o), and in the backward the projections'
  // gradients (the convolutions' dx and the norm's dz written so; the gates' through cvt_). The core's inputs v
  // (here) and q̂, k̂ (plan_core) are bf16 where the core takes them so (core_input_dtype: the conv and the L2 norm
  // write them rounded; their gradients stay in the master dtype).
  yn_ = saved.take(ct, {rows, value_dim_});
  plan_core(rows, saved);
}

DType DeltaLayer::core_input_dtype() const {
  const bool bf16 = bf16_input_core() && store_.backend().delta_core_bf16_inputs(store_.compute_dtype());
  return bf16 ? DType::bf16 : store_.dtype();
}

void DeltaLayer::bind_scratch(ScratchCarver& s) {
  const int64_t rows = batch_ * seq_len_, H = c_.num_heads;
  const DType dt = store_.dtype(), ct = store_.compute_dtype();
  for (Tensor* t : {&dyn_, &do_, &dvc_}) *t = s.take(dt, {rows, value_dim_});
  for (Tensor* t : {&dz_, &dvp_}) *t = s.take(ct, {rows, value_dim_});
  for (Tensor* t : {&dqc_, &dkc_}) *t = s.take(dt, {rows, key_dim_});
  for (Tensor* t : {&dqp_, &dkp_}) *t = s.take(ct, {rows, key_dim_});
  for (Tensor* t : {&dg_, &da_}) *t = s.take(dt, {rows, decay_width()});
  for (Tensor* t : {&dbeta_, &db_}) *t = s.take(dt, {rows, H});
  if (ct != dt) cvt_ = s.take(ct, {rows, H});
  decay_proj_->bind_scratch(s, rows);
  gate_proj_->bind_scratch(s, rows);
  bind_core_scratch(s, rows);
}

void DeltaLayer::forward(const Tensor& x, const Tensor& y) { mix(x, y, nullptr); }

void DeltaLayer::decode(const Tensor& x, MixerState& state, int64_t, const Tensor& y) { mix(x, y, &state); }

MixerState DeltaLayer::decode_state(int64_t batch, int64_t) const {
  MixerState s;
  Backend& be = store_.backend();
  const DType dt = store_.dtype();
  const int64_t hist = c_.conv_size - 1;
  for (int64_t width : {key_dim_, key_dim_, value_dim_}) s.add(be, dt, {batch, hist, width});
  for (int i = 0; i < core_states(); ++i) s.add(be, dt, {batch, c_.num_heads, c_.head_dim, c_.value_dim()});
  return s;
}

void DeltaLayer::mix(const Tensor& x, const Tensor& y, const MixerState* state) {
  Backend& be = store_.backend();
  const auto seq3 = [&](const Tensor& t, int64_t c) { return t.reshape({batch_, seq_len_, c}); };
  // Projections and short convolutions (section 2.1).
  be.matmul(x, false, store_.param(wq_), true, qp_, false);
  be.matmul(x, false, store_.param(wk_), true, kp_, false);
  be.matmul(x, false, store_.param(wv_), true, vp_, false);
  const std::tuple<const Tensor*, int, const Tensor*, const Tensor*, int64_t> convs[] = {
      {&qp_, conv_q_, &q_pre_, &qc_, key_dim_}, {&kp_, conv_k_, &k_pre_, &kc_, key_dim_},
      {&vp_, conv_v_, &v_pre_, &vc_, value_dim_}};
  for (size_t i = 0; i < 3; ++i) {
    const auto& [in, w, pre, out, width] = convs[i];
    if (state != nullptr)
      be.short_conv_silu_decode(seq3(*in, width), store_.master(w), Tensor(), (*state)[i], seq3(*out, width));
    else
      be.short_conv_silu_fwd(seq3(*in, width), store_.master(w), seq3(*pre, width), seq3(*out, width));
  }
  // Gates (4.1 steps 2-3; 4.3 steps 2-3).
  decay_proj_->forward(x, a_);
  be.matmul(x, false, store_.param(wb_), true, b_, false);
  gates_forward(x);
  core_forward(state);
  // Output gate, per-head gated RMSNorm (2.3), output projection.
  gate_proj_->forward(x, z_);
  be.gated_rmsnorm_fwd(o_, z_, store_.master(o_norm_), norm_eps_, c_.output_gate == "sigmoid", yn_, rstd_);
  be.matmul(yn_, false, store_.param(wo_), true, y, false);
}

void DeltaLayer::gates_forward(const Tensor&) {
  Backend& be = store_.backend();
  if (gates_ == Gates::scalar)
    be.gdn_gates_fwd(a_, b_, store_.master(A_log_), store_.master(dt_bias_), g_, beta_);
  else
    be.kda_gates_fwd(a_, b_, store_.master(A_log_), store_.master(dt_bias_), g_, beta_);
}

void DeltaLayer::gates_backward(const Tensor&, const Tensor&) {
  Backend& be = store_.backend();
  if (gates_ == Gates::scalar)
    be.gdn_gates_bwd(dg_, dbeta_, a_, b_, store_.master(A_log_), store_.master(dt_bias_), da_, db_,
                     store_.grad(A_log_), store_.grad(dt_bias_));
  else
    be.kda_gates_bwd(dg_, dbeta_, a_, b_, store_.master(A_log_), store_.master(dt_bias_), da_, db_,
                     store_.grad(A_log_), store_.grad(dt_bias_));
}

void DeltaLayer::backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  Backend& be = store_.backend();
  const auto seq3 = [&](const Tensor& t, int64_t c) { return t.reshape({batch_, seq_len_, c}); };
  // Output projection and gated norm.
  be.matmul(dy, false, store_.param(wo_), false, dyn_, false);        // dyn = dy Wo
  be.matmul(dy, true, yn_, false, store_.grad(wo_), true);             // dWo += dy^T yn
  be.gated_rmsnorm_bwd(dyn_, o_, z_, store_.master(o_norm_), rstd_, c_.output_gate == "sigmoid", do_, dz_,
                       store_.grad(o_norm_));
  gate_proj_->backward(x, dz_, dx, false);                            // dx = dz Wg_eff (first term)
  core_backward();
  // Gates.
  gates_backward(x, dx);
  decay_proj_->backward(x, da_, dx, true);
  const Tensor db = converted(be, db_, cvt_);
  be.matmul(db, true, x, false, store_.grad(wb_), true);
  be.matmul(db, false, store_.param(wb_), false, dx, true);
  // Convolutions and projections.
  be.short_conv_silu_bwd(seq3(dqc_, key_dim_), seq3(qp_, key_dim_), store_.master(conv_q_), seq3(q_pre_, key_dim_),
                         seq3(dqp_, key_dim_), store_.grad(conv_q_));
  be.short_conv_silu_bwd(seq3(dkc_, key_dim_), seq3(kp_, key_dim_), store_.master(conv_k_), seq3(k_pre_, key_dim_),
                         seq3(dkp_, key_dim_), store_.grad(conv_k_));
  be.short_conv_silu_bwd(seq3(dvc_, value_dim_), seq3(vp_, value_dim_), store_.master(conv_v_),
                         seq3(v_pre_, value_dim_), seq3(dvp_, value_dim_), store_.grad(conv_v_));
  for (auto [dproj, w] : {std::pair<const Tensor*, int>{&dqp_, wq_}, {&dkp_, wk_}, {&dvp_, wv_}}) {
    be.matmul(*dproj, true, x, false, store_.grad(w), true);          // dW += dproj^T x
    be.matmul(*dproj, false, store_.param(w), false, dx, true);       // dx += dproj W
  }
}

}  // namespace llmt
