#include "model/attention.h"

#include <cmath>

namespace llmt {

AttentionMixer::AttentionMixer(const ModelConfig& config, ParamStore& store, const std::string& prefix)
    : store_(store),
      d_model_(config.d_model),
      heads_(config.attn.num_heads),
      head_dim_(config.attn.head_dim),
      theta_(config.attn.rope_theta) {
  const int64_t inner = heads_ * head_dim_;
  const Init init{Init::normal, config.init_std};
  wq_ = store.add(prefix + "q_proj.weight", {inner, d_model_}, ParamKind::weight, init);
  wk_ = store.add(prefix + "k_proj.weight", {inner, d_model_}, ParamKind::weight, init);
  wv_ = store.add(prefix + "v_proj.weight", {inner, d_model_}, ParamKind::weight, init);
  wo_ = store.add(prefix + "o_proj.weight", {d_model_, inner}, ParamKind::weight, init);
}

void AttentionMixer::plan(int64_t batch, int64_t seq_len, ScratchCarver& saved) {
  batch_ = batch;
  seq_len_ = seq_len;
  const DType ct = store_.compute_dtype();
  for (Tensor* t : {&q_, &k_, &v_, &o_}) *t = saved.take(ct, {batch, seq_len, heads_, head_dim_});
  lse_ = saved.take(store_.dtype(), {batch, heads_, seq_len});
}

void AttentionMixer::bind_scratch(ScratchCarver& scratch) {
  for (Tensor* t : {&dq_, &dk_, &dv_, &do_})
    *t = scratch.take(store_.compute_dtype(), {batch_, seq_len_, heads_, head_dim_});
}

void AttentionMixer::project(const Tensor& x) {
  Backend& be = store_.backend();
  const int64_t rows = batch_ * seq_len_, inner = heads_ * head_dim_;
  be.matmul(x, false, store_.param(wq_), true, q_.reshape({rows, inner}), false);
  be.matmul(x, false, store_.param(wk_), true, k_.reshape({rows, inner}), false);
  be.matmul(x, false, store_.param(wv_), true, v_.reshape({rows, inner}), false);
}

void AttentionMixer::output(const Tensor& y) {
  const int64_t rows = batch_ * seq_len_, inner = heads_ * head_dim_;
  store_.backend().matmul(o_.reshape({rows, inner}), false, store_.param(wo_), true, y, false);
}

void AttentionMixer::forward(const Tensor& x, const Tensor& y) {
  Backend& be = store_.backend();
  project(x);
  be.rope_fwd(q_, theta_);
  be.rope_fwd(k_, theta_);
  be.attention_fwd(q_, k_, v_, scale(), o_, lse_);
  output(y);
}

MixerState AttentionMixer::decode_state(int64_t batch, int64_t max_len) const {
  MixerState s;
  for (int i = 0; i < 2; ++i) s.add(store_.backend(), store_.compute_dtype(), {batch, max_len, heads_, head_dim_});
  return s;
}

// The rotary embedding at the token's absolute position; k, v appended to the cache; one query over it.
void AttentionMixer::decode(const Tensor& x, MixerState& state, int64_t position, const Tensor& y) {
  Backend& be = store_.backend();
  project(x);
  be.rope_fwd_at(q_, theta_, position);
  be.rope_fwd_at(k_, theta_, position);
  be.attention_decode(q_, k_, v_, state[0], state[1], position, scale(), o_);
  output(y);
}

void AttentionMixer::backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  Backend& be = store_.backend();
  const int64_t rows = batch_ * seq_len_, inner = heads_ * head_dim_;
  const Tensor o2 = o_.reshape({rows, inner}), do2 = do_.reshape({rows, inner});
  const Tensor dq2 = dq_.reshape({rows, inner}), dk2 = dk_.reshape({rows, inner}), dv2 = dv_.reshape({rows, inner});
  be.matmul(dy, false, store_.param(wo_), false, do2, false);        // dO = dy Wo
  be.matmul(dy, true, o2, false, store_.grad(wo_), true);            // dWo += dy^T O
  be.attention_bwd(q_, k_, v_, o_, lse_, do_, scale(), dq_, dk_, dv_);
  be.rope_bwd(dq_, theta_);
  be.rope_bwd(dk_, theta_);
  be.matmul(dq2, true, x, false, store_.grad(wq_), true);            // dWq += dq^T x
  be.matmul(dk2, true, x, false, store_.grad(wk_), true);
  be.matmul(dv2, true, x, false, store_.grad(wv_), true);
  be.matmul(dq2, false, store_.param(wq_), false, dx, false);        // dx = dq Wq + dk Wk + dv Wv
  be.matmul(dk2, false, store_.param(wk_), false, dx, true);
  be.matmul(dv2, false, store_.param(wv_), false, dx, true);
}

}  // namespace llmt
