#include "model/comba.h"

namespace llmt {

CombaMixer::CombaMixer(const ModelConfig& config, ParamStore& store, const std::string& prefix)
    : DeltaLayer(config, config.comba, Gates::scalar, store, prefix) {
  const CombaConfig& cc = config.comba;
  const int64_t H = cc.num_heads;
  if (cc.inner_decay) {
    Init init{Init::constant};
    init.value = cc.decay_init;
    decay_ = store.add(prefix + "decay", {H}, ParamKind::ssm_param, init);
  }
  if (cc.output_correction) {
    Init init{Init::constant};
    init.value = cc.correction_factor;
    D_ = store.add(prefix + "D", {H}, ParamKind::ssm_param, init);
  }
}

void CombaMixer::plan_core(int64_t rows, ScratchCarver& saved) {
  const DType dt = store_.dtype();
  for (Tensor* t : {&qhat_, &khat_, &phat_}) *t = saved.take(core_input_dtype(), {rows, key_dim_});
  if (has_gates())
    for (Tensor* t : {&qcor_, &p_}) *t = saved.take(dt, {rows, key_dim_});
  for (Tensor* t : {&rq_, &rk_, &rp_}) *t = saved.take(dt, {rows, c_.num_heads});
  const int64_t kept = store_.backend().gdn_saved_numel(batch_, seq_len_, c_.num_heads, c_.head_dim, c_.value_dim(),
                                                        c_.chunk_size, store_.compute_dtype(), c_.save_states);
  kept_ = kept > 0 ? saved.take(dt, {kept}) : Tensor();
}

void CombaMixer::bind_core_scratch(ScratchCarver& s, int64_t rows) {
  for (Tensor* t : {&dqhat_, &dkhat_, &dphat_, &dp_}) *t = s.take(store_.dtype(), {rows, key_dim_});
}

void CombaMixer::core_forward(const MixerState* state) {
  Backend& be = store_.backend();
  // Inner decay p = sigma(decay) k and output correction q' = q - D p, before the L2 norm (4.2 steps 2-3).
  if (has_gates()) be.comba_gates_fwd(qc_, kc_, param_or_none(decay_), param_or_none(D_), qcor_, p_);
  // The in-kernel L2 norms of q', k, p with the query scale (4.2 step 5, 2.2).
  be.l2norm_fwd(q_in(), c_.head_dim, 1e-6, q_scale(), qhat_, rq_);
  be.l2norm_fwd(kc_, c_.head_dim, 1e-6, 1.0, khat_, rk_);
  be.l2norm_fwd(p_in(), c_.head_dim, 1e-6, 1.0, phat_, rp_);
  // The Comba core (section 6.2, chunked), from zero or continuing the carried state.
  if (state != nullptr)
    return be.comba_decode(heads_k(qhat_), heads_k(khat_), heads_v(vc_), heads_k(phat_), per_token(g_),
                           per_token(beta_), c_.chunk_size, (*state)[kCoreState], heads_v(o_));
  be.comba_chunk_fwd(heads_k(qhat_), heads_k(khat_), heads_v(vc_), heads_k(phat_), per_token(g_),
                     per_token(beta_), c_.chunk_size, store_.compute_dtype(), heads_v(o_), kept_);
}

void CombaMixer::core_backward() {
  Backend& be = store_.backend();
  be.comba_chunk_bwd(heads_k(qhat_), heads_k(khat_), heads_v(vc_), heads_k(phat_), per_token(g_),
                     per_token(beta_), heads_v(do_), kept_, c_.chunk_size, store_.compute_dtype(), heads_k(dqhat_),
                     heads_k(dkhat_), heads_v(dvc_), heads_k(dphat_), per_token(dg_), per_token(dbeta_));
  // L2 norms (from their fp32 inputs: q^, k^, p^ may be bf16): dq' (= dq, the correction is q' = q - ...), dk, dp.
  be.l2norm_bwd(dqhat_, q_in(), rq_, c_.head_dim, q_scale(), dqc_);
  be.l2norm_bwd(dkhat_, kc_, rk_, c_.head_dim, 1.0, dkc_);
  be.l2norm_bwd(dphat_, p_in(), rp_, c_.head_dim, 1.0, dp_);
  // Inner decay and output correction (section 5): dk += s dp - D s dq'; ddecay, dD accumulated.
  if (has_gates())
    be.comba_gates_bwd(dqc_, dp_, kc_, param_or_none(decay_), param_or_none(D_), dkc_, grad_or_none(decay_),
                       grad_or_none(D_));
  else
    be.add(dkc_, dp_, dkc_);  // p = k
}

}  // namespace llmt
