// AdamW step over a contiguous range of the flat parameter buffer (PyTorch semantics,
// decoupled weight decay: Loshchilov & Hutter 2019; runs.md section 1).
#pragma once
#include <cstdint>

namespace llmt::cpu {

/// For i < n, with g = grad_scale * grads[i] (grad_scale carries the clipping factor):
///   p *= 1 - lr * weight_decay
///   m = beta1 m + (1 - beta1) g;   v = beta2 v + (1 - beta2) g^2
///   p -= (lr / (1 - beta1^step)) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
/// step is the 1-based count of optimizer steps taken (skipped steps excluded).
/// Arithmetic in double; params, m, v updated in place.
template <typename T>
void adamw_step(T* params, const T* grads, T* m, T* v, int64_t n, double lr, double beta1, double beta2,
                double eps, double weight_decay, double grad_scale, int64_t step);

/// Sum of squares of x[0..n) accumulated in double (for the global gradient norm).
template <typename T>
double sum_squares(const T* x, int64_t n);

}  // namespace llmt::cpu
