// AdamW (Loshchilov & Hutter 2019, PyTorch torch.optim.AdamW semantics; runs.md §1).
#include "kernels/cpu/adamw.h"

#include <cmath>

#include "core/error.h"

namespace llmt::cpu {

// g = grad_scale grad;  p *= 1 - lr wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
// p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)   (adamw.h, PyTorch AdamW)
template <typename T>
void adamw_step(T* params, const T* grads, T* m, T* v, int64_t n, double lr, double beta1, double beta2,
                double eps, double weight_decay, double grad_scale, int64_t step) {
  check(step >= 1, "adamw_step: step is 1-based, got {}", step);
  const double t = static_cast<double>(step);
  const double step_size = lr / (1.0 - std::pow(beta1, t));
  const double sqrt_bc2 = std::sqrt(1.0 - std::pow(beta2, t));
  const double decay = 1.0 - lr * weight_decay;
  for (int64_t i = 0; i < n; ++i) {
    const double g = grad_scale * static_cast<double>(grads[i]);
    const double mi = beta1 * static_cast<double>(m[i]) + (1.0 - beta1) * g;
    const double vi = beta2 * static_cast<double>(v[i]) + (1.0 - beta2) * g * g;
    const double p = static_cast<double>(params[i]) * decay;
    params[i] = static_cast<T>(p - step_size * mi / (std::sqrt(vi) / sqrt_bc2 + eps));
    m[i] = static_cast<T>(mi);
    v[i] = static_cast<T>(vi);
  }
}

// Σ_i x_i^2 in double (the squared global gradient norm for clipping, runs.md §1)
template <typename T>
double sum_squares(const T* x, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

template void adamw_step<float>(float*, const float*, float*, float*, int64_t, double, double, double, double,
                                double, double, int64_t);
template void adamw_step<double>(double*, const double*, double*, double*, int64_t, double, double, double,
                                 double, double, double, int64_t);
template double sum_squares<float>(const float*, int64_t);
template double sum_squares<double>(const double*, int64_t);

}  // namespace llmt::cpu
