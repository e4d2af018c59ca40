// L2 norm with query scale, forward and backward (layers-delta.md §2.2), statistics in double.
#include "kernels/cpu/l2norm.h"

#include <cmath>

namespace llmt::cpu {

// r = (Σ_c x_c^2 + eps)^(-1/2);  x̃ = x r;  y = s x̃   (layers-delta.md §2.2)
template <typename T>
void l2norm_fwd(const T* x, int64_t rows, int64_t dim, double eps, double scale, T* y, T* rinv) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    T* yr = y + r * dim;
    double ss = 0.0;
    for (int64_t j = 0; j < dim; ++j) ss += static_cast<double>(xr[j]) * xr[j];
    const double ri = 1.0 / std::sqrt(ss + eps);
    for (int64_t j = 0; j < dim; ++j) yr[j] = static_cast<T>(scale * static_cast<double>(xr[j]) * ri);
    rinv[r] = static_cast<T>(ri);
  }
}

// x̃ = x r, dx̃ = s dy;  dx = r (dx̃ - (dx̃ · x̃) x̃) = r s (dy - (dy · x̃) x̃)   (layers-delta.md §2.2; exact with
// eps, since ∂x̃/∂x = r I - r^3 x x^T = r (I - x̃ x̃^T))
template <typename T>
void l2norm_bwd(const T* dy, const T* x, const T* rinv, int64_t rows, int64_t dim, double scale, T* dx) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* dyr = dy + r * dim;
    const T* xr = x + r * dim;
    T* dxr = dx + r * dim;
    const double ri = rinv[r];
    double proj = 0.0;  // dy · x̃
    for (int64_t j = 0; j < dim; ++j) proj += static_cast<double>(dyr[j]) * (static_cast<double>(xr[j]) * ri);
    for (int64_t j = 0; j < dim; ++j) {
      const double xt = static_cast<double>(xr[j]) * ri;
      dxr[j] = static_cast<T>(ri * scale * (static_cast<double>(dyr[j]) - proj * xt));
    }
  }
}

template void l2norm_fwd<float>(const float*, int64_t, int64_t, double, double, float*, float*);
template void l2norm_fwd<double>(const double*, int64_t, int64_t, double, double, double*, double*);
template void l2norm_bwd<float>(const float*, const float*, const float*, int64_t, int64_t, double, float*);
template void l2norm_bwd<double>(const double*, const double*, const double*, int64_t, int64_t, double, double*);

}  // namespace llmt::cpu
