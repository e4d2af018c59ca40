#include "model/block.h"

namespace llmt {

Block::Block(const std::string& mixer_type, const ModelConfig& config, ParamStore& store, const std::string& prefix)
    : store_(store), eps_(config.norm_eps) {
  // Registration order = flat-buffer order: attn_norm, attn.*, mlp_norm, mlp.*
  attn_norm_ = store.add(prefix + "attn_norm.weight", {config.d_model}, ParamKind::norm, Init{Init::ones, 0});
  mixer_ = make_mixer(mixer_type, config, store, prefix + "attn.");
  if (!config.has_mlp) return;
  mlp_norm_ = store.add(prefix + "mlp_norm.weight", {config.d_model}, ParamKind::norm, Init{Init::ones, 0});
  mlp_ = std::make_unique<SwiGluMlp>(config, store, prefix + "mlp.");
}

void Block::plan(int64_t batch, int64_t seq_len, ScratchCarver& saved) {
  const int64_t rows = batch * seq_len, d = store_.master(attn_norm_).numel();
  rows_ = rows;
  d_model_ = d;
  // The residual stream (h) and the norm statistics in the master dtype; the normed inputs of
  // the sublayers in the compute dtype (they feed matrix products).
  const DType dt = store_.dtype(), ct = store_.compute_dtype();
  xn1_ = saved.take(ct, {rows, d});
  rstd1_ = saved.take(dt, {rows});
  mixer_->plan(batch, seq_len, saved);
  if (!mlp_) return;
  xn2_ = saved.take(ct, {rows, d});
  h_ = saved.take(dt, {rows, d});
  rstd2_ = saved.take(dt, {rows});
  mlp_->plan(rows, saved);
}

void Block::bind_scratch(ScratchCarver& scratch) {
  for (Tensor* t : {&branch_, &dxn_}) *t = scratch.take(store_.dtype(), {rows_, d_model_});
  if (store_.compute_dtype() != store_.dtype()) dy_ = scratch.take(store_.compute_dtype(), {rows_, d_model_});
  mixer_->bind_scratch(scratch);
  if (mlp_) mlp_->bind_scratch(scratch);
}

void Block::forward(const Tensor& x_in, const Tensor& x_out) {
  run(x_in, x_out, [&](const Tensor& xn, const Tensor& y) { mixer_->forward(xn, y); });
}

void Block::decode(const Tensor& x_in, MixerState& state, int64_t position, const Tensor& x_out) {
  run(x_in, x_out, [&](const Tensor& xn, const Tensor& y) { mixer_->decode(xn, state, position, y); });
}

void Block::run(const Tensor& x_in, const Tensor& x_out,
                const std::function<void(const Tensor&, const Tensor&)>& mix) {
  Backend& be = store_.backend();
  be.rmsnorm_fwd(x_in, store_.master(attn_norm_), eps_, xn1_, rstd1_);
  mix(xn1_, branch_);
  if (!mlp_) return be.add(x_in, branch_, x_out);
  be.add_rmsnorm_fwd(x_in, branch_, store_.master(mlp_norm_), eps_, h_, xn2_, rstd2_);  // h = x + branch; norm
  mlp_->forward(xn2_, branch_);
  be.add(h_, branch_, x_out);
}

// The residual adds pass the gradient unchanged to both of their inputs, so dx is the residual
// gradient throughout: each norm's backward accumulates into it in place (dx' -> dh -> dx).
void Block::backward(const Tensor& x_in, const Tensor& dx) {
  Backend& be = store_.backend();
  if (mlp_) {
    mlp_->backward(xn2_, converted(be, dx, dy_), dxn_);
    be.rmsnorm_bwd(dxn_, h_, store_.master(mlp_norm_), rstd2_, dx, store_.grad(mlp_norm_));  // dx = dh
  }
  mixer_->backward(xn1_, converted(be, dx, dy_), dxn_);
  be.rmsnorm_bwd(dxn_, x_in, store_.master(attn_norm_), rstd1_, dx, store_.grad(attn_norm_));
}

}  // namespace llmt
