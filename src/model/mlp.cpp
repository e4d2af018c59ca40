#include "model/mlp.h"

#include <cmath>

namespace llmt {

SwiGluMlp::SwiGluMlp(const ModelConfig& config, ParamStore& store, const std::string& prefix)
    : store_(store), d_model_(config.d_model), hidden_(config.mlp.intermediate_size) {
  const Init init{Init::normal, config.init_std};
  w_gate_ = store.add(prefix + "gate_proj.weight", {hidden_, d_model_}, ParamKind::weight, init);
  w_up_ = store.add(prefix + "up_proj.weight", {hidden_, d_model_}, ParamKind::weight, init);
  Init down = init;
  if (config.residual_rescale == "kaiming_div_sqrt") {  // mamba_ssm fc2 (layers-ssm-attn.md 4.8): U(±1/sqrt(F)) / sqrt(n)
    down = Init{Init::uniform};
    down.hi = 1.0 / std::sqrt(static_cast<double>(hidden_) * static_cast<double>(config.residual_rescale_n));
    down.lo = -down.hi;
  }
  w_down_ = store.add(prefix + "down_proj.weight", {d_model_, hidden_}, ParamKind::weight, down);
}

void SwiGluMlp::plan(int64_t rows, ScratchCarver& saved) {
  rows_ = rows;
  for (Tensor* t : {&gate_, &up_, &h_}) *t = saved.take(store_.compute_dtype(), {rows, hidden_});
}

void SwiGluMlp::bind_scratch(ScratchCarver& scratch) {
  for (Tensor* t : {&dh_, &dgate_, &dup_}) *t = scratch.take(store_.compute_dtype(), {rows_, hidden_});
}

void SwiGluMlp::forward(const Tensor& x, const Tensor& y) {
  Backend& be = store_.backend();
  be.matmul(x, false, store_.param(w_gate_), true, gate_, false);
  be.matmul(x, false, store_.param(w_up_), true, up_, false);
  be.swiglu_fwd(gate_, up_, h_);
  be.matmul(h_, false, store_.param(w_down_), true, y, false);
}

void SwiGluMlp::backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  Backend& be = store_.backend();
  be.matmul(dy, false, store_.param(w_down_), false, dh_, false);    // dh = dy Wdown
  be.matmul(dy, true, h_, false, store_.grad(w_down_), true);        // dWdown += dy^T h
  be.swiglu_bwd(gate_, up_, dh_, dgate_, dup_);
  be.matmul(dgate_, true, x, false, store_.grad(w_gate_), true);     // dWgate += dgate^T x
  be.matmul(dup_, true, x, false, store_.grad(w_up_), true);
  be.matmul(dgate_, false, store_.param(w_gate_), false, dx, false);  // dx = dgate Wgate + dup Wup
  be.matmul(dup_, false, store_.param(w_up_), false, dx, true);
}

}  // namespace llmt
