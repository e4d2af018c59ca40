#include "model/gdn.h"

namespace llmt {

void GdnMixer::plan_core(int64_t rows, ScratchCarver& saved) {
  for (Tensor* t : {&qhat_, &khat_}) *t = saved.take(core_input_dtype(), {rows, key_dim_});
  for (Tensor* t : {&rq_, &rk_}) *t = saved.take(store_.dtype(), {rows, c_.num_heads});
  const Backend& be = store_.backend();
  const auto numel = gates_ == Gates::scalar ? &Backend::gdn_saved_numel : &Backend::kda_saved_numel;
  const int64_t kept = (be.*numel)(batch_, seq_len_, c_.num_heads, c_.head_dim, c_.value_dim(), c_.chunk_size,
                                   store_.compute_dtype(), c_.save_states);
  kept_ = kept > 0 ? saved.take(store_.dtype(), {kept}) : Tensor();
}

void GdnMixer::bind_core_scratch(ScratchCarver& s, int64_t rows) {
  for (Tensor* t : {&dqhat_, &dkhat_}) *t = s.take(store_.dtype(), {rows, key_dim_});
}

void GdnMixer::core_forward(const MixerState* state) {
  Backend& be = store_.backend();
  be.l2norm_fwd(qc_, c_.head_dim, 1e-6, q_scale(), qhat_, rq_);  // section 2.2
  be.l2norm_fwd(kc_, c_.head_dim, 1e-6, 1.0, khat_, rk_);
  // GDN core (6.1, scalar decay) or KDA core (per-channel decay): the same arguments, g of decay_view's shape.
  const bool scalar = gates_ == Gates::scalar;
  if (state != nullptr) {
    const auto decode = scalar ? &Backend::gdn_decode : &Backend::kda_decode;
    return (be.*decode)(heads_k(qhat_), heads_k(khat_), heads_v(vc_), decay_view(g_), per_token(beta_),
                        c_.chunk_size, (*state)[kCoreState], heads_v(o_));
  }
  // The core's products in the compute dtype (bf16 operands on the tensor cores, or fp32).
  if (scalar)
    return be.gdn_chunk_fwd(heads_k(qhat_), heads_k(khat_), heads_v(vc_), decay_view(g_), per_token(beta_),
                            c_.chunk_size, store_.compute_dtype(), heads_v(o_), kept_);
  be.kda_chunk_fwd(heads_k(qhat_), heads_k(khat_), heads_v(vc_), decay_view(g_), per_token(beta_), c_.chunk_size,
                   store_.compute_dtype(), heads_v(o_), kept_);
}

void GdnMixer::core_backward() {
  Backend& be = store_.backend();
  if (gates_ == Gates::scalar)
    be.gdn_chunk_bwd(heads_k(qhat_), heads_k(khat_), heads_v(vc_), decay_view(g_), per_token(beta_), heads_v(do_),
                     kept_, c_.chunk_size, store_.compute_dtype(), heads_k(dqhat_), heads_k(dkhat_), heads_v(dvc_),
                     decay_view(dg_), per_token(dbeta_));
  else
    be.kda_chunk_bwd(heads_k(qhat_), heads_k(khat_), heads_v(vc_), decay_view(g_), per_token(beta_), heads_v(do_),
                     kept_, c_.chunk_size, store_.compute_dtype(), heads_k(dqhat_), heads_k(dkhat_), heads_v(dvc_),
                     decay_view(dg_), per_token(dbeta_));
  be.l2norm_bwd(dqhat_, qc_, rq_, c_.head_dim, q_scale(), dqc_);  // from the fp32 q, k (q^, k^ may be bf16)
  be.l2norm_bwd(dkhat_, kc_, rk_, c_.head_dim, 1.0, dkc_);
}

}  // namespace llmt
