#include "model/mdn.h"

#include <cmath>

namespace llmt {

MdnMixer::MdnMixer(const ModelConfig& config, ParamStore& store, const std::string& prefix)
    : DeltaLayer(config, config.mdn, Gates::scalar, store, prefix), mc_(config.mdn) {
  const int64_t H = mc_.num_heads, D = config.d_model;
  opt_.tau = std::sqrt(static_cast<double>(D) / mc_.tau_factor);
  opt_.min_log_mu = mc_.min_log_mu;
  opt_.alpha_max = mc_.alpha_max;
  opt_.beta_max = mc_.beta_max;
  opt_.eta_two_sigmoid = mc_.eta == "two_sigmoid";
  opt_.momentum = mc_.momentum;
  const Init normal{Init::normal, config.init_std};
  if (mc_.momentum) {
    wm_ = store.add(prefix + "m_proj.weight", {H, D}, ParamKind::weight, normal);
    we_ = store.add(prefix + "e_proj.weight", {H, D}, ParamKind::weight, normal);
    Init mu_log{Init::log_uniform};
    mu_log.lo = mc_.mu_A_min;
    mu_log.hi = mc_.mu_A_max;
    Mu_log_ = store.add(prefix + "Mu_log", {H}, ParamKind::ssm_param, mu_log);
    Init mu_bias{Init::dt_bias};
    mu_bias.lo = mc_.dt_min;
    mu_bias.hi = mc_.dt_max;
    mu_bias.floor = mc_.dt_floor;
    if (mc_.mu_bias_init == "copy_dt_bias") mu_bias.stream = dt_bias_;  // the same draw: equal values (§3)
    mu_bias_ = store.add(prefix + "mu_bias", {H}, ParamKind::ssm_param, mu_bias);
  }
  Init log_factor{mc_.log_factor_init == "zero" ? Init::zeros : Init::log_uniform};
  log_factor.hi = 4.0;  // s = exp(log_factor) ~ U(0, 4)
  log_factor_ = store.add(prefix + "log_factor", {H}, ParamKind::ssm_param, log_factor);
  if (mc_.output_correction) {
    Init D_log{mc_.D_log_init == "zero" ? Init::zeros : Init::log_uniform};
    D_log.hi = 1.0;  // δ = exp(D_log) ~ U(0, 1)
    D_log_ = store.add(prefix + "D_log", {H}, ParamKind::ssm_param, D_log);
  }
}

Backend::MdnGateParams MdnMixer::gate_params() const {
  const auto opt = [&](int i) { return i >= 0 ? store_.master(i) : Tensor(); };
  return {store_.master(A_log_), store_.master(dt_bias_), opt(Mu_log_), opt(mu_bias_), store_.master(log_factor_)};
}

Backend::MdnGateParams MdnMixer::gate_grads() const {
  const auto opt = [&](int i) { return i >= 0 ? store_.grad(i) : Tensor(); };
  return {store_.grad(A_log_), store_.grad(dt_bias_), opt(Mu_log_), opt(mu_bias_), store_.grad(log_factor_)};
}

void MdnMixer::plan_core(int64_t rows, ScratchCarver& saved) {
  const DType dt = store_.dtype();
  const int64_t H = c_.num_heads;
  for (Tensor* t : {&log_mu_, &eta_, &rq_, &rk_}) *t = saved.take(dt, {rows, H});
  if (mc_.momentum)
    for (Tensor* t : {&zm_, &ze_}) *t = saved.take(dt, {rows, H});
  for (Tensor* t : {&qhat_, &khat_}) *t = saved.take(dt, {rows, key_dim_});
  if (mc_.output_correction) qcor_ = saved.take(dt, {rows, key_dim_});
  if (mc_.save_residuals) vt_ = saved.take(dt, {rows, value_dim_});
}

void MdnMixer::bind_core_scratch(ScratchCarver& s, int64_t rows) {
  const DType dt = store_.dtype();
  for (Tensor* t : {&dqhat_, &dkhat_}) *t = s.take(dt, {rows, key_dim_});
  for (Tensor* t : {&dlog_mu_, &deta_, &dzm_, &dze_}) *t = s.take(dt, {rows, c_.num_heads});
}

void MdnMixer::gates_forward(const Tensor& x) {
  Backend& be = store_.backend();
  if (mc_.momentum) {  // z_μ = x W_μ^T, z_η = x W_η^T (§4.4)
    be.matmul(x, false, store_.param(wm_), true, zm_, false);
    be.matmul(x, false, store_.param(we_), true, ze_, false);
  }
  be.mdn_gates_fwd(a_, b_, mc_.momentum ? zm_ : Tensor(), mc_.momentum ? ze_ : Tensor(), gate_params(), opt_, g_,
                   beta_, log_mu_, eta_);
}

void MdnMixer::gates_backward(const Tensor& x, const Tensor& dx) {
  Backend& be = store_.backend();
  be.mdn_gates_bwd(dg_, dbeta_, dlog_mu_, deta_, a_, b_, mc_.momentum ? zm_ : Tensor(),
                   mc_.momentum ? ze_ : Tensor(), gate_params(), opt_, da_, db_, mc_.momentum ? dzm_ : Tensor(),
                   mc_.momentum ? dze_ : Tensor(), gate_grads());
  if (!mc_.momentum) return;
  for (auto [dz, w] : {std::pair<const Tensor*, int>{&dzm_, wm_}, {&dze_, we_}}) {
    const Tensor d = converted(be, *dz, cvt_);
    be.matmul(d, true, x, false, store_.grad(w), true);     // dW += dz^T x
    be.matmul(d, false, store_.param(w), false, dx, true);  // dx += dz W
  }
}

void MdnMixer::core_forward(const MixerState* state) {
  Backend& be = store_.backend();
  // Output correction q' = q - δ k before the L2 norm (§4.2); the L2 norms and the query scale (§4.3).
  if (mc_.output_correction) be.mdn_correction_fwd(qc_, kc_, store_.master(D_log_), qcor_);
  be.l2norm_fwd(mc_.output_correction ? qcor_ : qc_, c_.head_dim, 1e-6, q_scale(), qhat_, rq_);
  be.l2norm_fwd(kc_, c_.head_dim, 1e-6, 1.0, khat_, rk_);
  // The MDN core (§6, chunked), from zero or continuing the carried S and M.
  if (state != nullptr)
    return be.mdn_decode(heads_k(qhat_), heads_k(khat_), heads_v(vc_), per_token(g_), per_token(beta_),
                         per_token(log_mu_), per_token(eta_), c_.chunk_size, (*state)[kCoreState],
                         (*state)[kCoreState + 1], heads_v(o_));
  // The core's products in the compute dtype (bf16 operands on the tensor cores, or fp32).
  be.mdn_chunk_fwd(heads_k(qhat_), heads_k(khat_), heads_v(vc_), per_token(g_), per_token(beta_),
                   per_token(log_mu_), per_token(eta_), c_.chunk_size, store_.compute_dtype(), heads_v(o_),
                   residuals());
}

void MdnMixer::core_backward() {
  Backend& be = store_.backend();
  be.mdn_chunk_bwd(heads_k(qhat_), heads_k(khat_), heads_v(vc_), per_token(g_), per_token(beta_),
                   per_token(log_mu_), per_token(eta_), heads_v(do_), residuals(), c_.chunk_size,
                   store_.compute_dtype(), heads_k(dqhat_), heads_k(dkhat_), heads_v(dvc_), per_token(dg_),
                   per_token(dbeta_), per_token(dlog_mu_), per_token(deta_));
  // L2 norms (from their inputs q', k): dq' (= dq: the correction passes dq' through to q) and dk.
  be.l2norm_bwd(dqhat_, mc_.output_correction ? qcor_ : qc_, rq_, c_.head_dim, q_scale(), dqc_);
  be.l2norm_bwd(dkhat_, kc_, rk_, c_.head_dim, 1.0, dkc_);
  // Output correction (§7.4): dk += -δ dq', dD_log += -δ Σ dq' ⊙ k.
  if (mc_.output_correction) be.mdn_correction_bwd(dqc_, kc_, store_.master(D_log_), dkc_, store_.grad(D_log_));
}

}  // namespace llmt
