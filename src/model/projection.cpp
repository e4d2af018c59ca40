#include "model/projection.h"

#include <vector>

#include "core/error.h"

namespace llmt {

Projection::Projection(ParamStore& store, const std::string& name, int64_t in, int64_t out, int64_t rank, bool bias,
                       double init_std)
    : store_(store), in_(in), out_(out), rank_(rank) {
  check(rank >= 0 && (rank > 0 || !bias), "projection {}: rank must be >= 0, and a bias needs rank > 0", name);
  const Init normal{Init::normal, init_std};
  if (rank == 0) {
    w0_ = store.add(name + ".weight", {out, in}, ParamKind::weight, normal);
    return;
  }
  w0_ = store.add(name + ".0.weight", {rank, in}, ParamKind::weight, normal);
  w1_ = store.add(name + ".1.weight", {out, rank}, ParamKind::weight, normal);
  if (bias) bias_ = store.add(name + ".1.bias", {out}, ParamKind::bias, Init{Init::zeros});
}

void Projection::plan(int64_t rows, ScratchCarver& saved) {
  Backend& be = store_.backend();
  const DType dt = store_.dtype(), ct = store_.compute_dtype();
  if (rank_ > 0) hidden_ = saved.take(ct, {rows, rank_});
  if (bias_ >= 0 && (ones_->data == nullptr || ones_->shape[0] != rows)) {  // a constant: own memory, set once
    OwnedTensor ones(be, dt, {rows, 1});
    if (dt == DType::f64)
      be.upload(std::vector<double>(static_cast<size_t>(rows), 1.0).data(), *ones);
    else
      be.upload(std::vector<float>(static_cast<size_t>(rows), 1.0f).data(), *ones);
    ones_ = OwnedTensor(be, ct, {rows, 1});
    be.convert(*ones, *ones_);
  }
}

void Projection::bind_scratch(ScratchCarver& scratch, int64_t rows) {
  const DType ct = store_.compute_dtype();
  if (rank_ > 0) dhidden_ = scratch.take(ct, {rows, rank_});
  if (ct != store_.dtype()) dy_c_ = scratch.take(ct, {rows, out_});
}

void Projection::forward(const Tensor& x, const Tensor& y) {
  Backend& be = store_.backend();
  if (rank_ == 0) {
    be.matmul(x, false, store_.param(w0_), true, y, false);
    return;
  }
  be.matmul(x, false, store_.param(w0_), true, hidden_, false);  // h = x W0^T
  be.matmul(hidden_, false, store_.param(w1_), true, y, false);  // y = h W1^T
  if (bias_ >= 0) be.matmul(*ones_, false, store_.param(bias_).reshape({1, out_}), false, y, true);  // y += 1 b^T
}

void Projection::backward(const Tensor& x, const Tensor& dy_in, const Tensor& dx, bool accumulate_dx) {
  Backend& be = store_.backend();
  const Tensor dy = converted(be, dy_in, dy_c_);
  if (rank_ == 0) {
    be.matmul(dy, true, x, false, store_.grad(w0_), true);                   // dW += dy^T x
    be.matmul(dy, false, store_.param(w0_), false, dx, accumulate_dx);      // dx (+)= dy W
    return;
  }
  if (bias_ >= 0) be.matmul(*ones_, true, dy, false, store_.grad(bias_).reshape({1, out_}), true);  // db += 1^T dy
  be.matmul(dy, true, hidden_, false, store_.grad(w1_), true);              // dW1 += dy^T h
  be.matmul(dy, false, store_.param(w1_), false, dhidden_, false);          // dh = dy W1
  be.matmul(dhidden_, true, x, false, store_.grad(w0_), true);              // dW0 += dh^T x
  be.matmul(dhidden_, false, store_.param(w0_), false, dx, accumulate_dx);  // dx (+)= dh W0
}

}  // namespace llmt
