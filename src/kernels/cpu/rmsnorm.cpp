// RMSNorm forward and backward (layers-ssm-attn.md §1.1), statistics in double.
#include "kernels/cpu/rmsnorm.h"

#include <cmath>
#include <vector>

namespace llmt::cpu {

namespace {

// One row: r = 1 / sqrt(mean_j(x_j^2) + eps);  y = x r ∘ w   (layers-ssm-attn.md §1.1)
template <typename T>
void rmsnorm_row(const T* xr, const T* w, int64_t dim, double eps, T* yr, T* rstd) {
  double ss = 0.0;
  for (int64_t j = 0; j < dim; ++j) ss += static_cast<double>(xr[j]) * xr[j];
  const double rs = 1.0 / std::sqrt(ss / static_cast<double>(dim) + eps);
  for (int64_t j = 0; j < dim; ++j) yr[j] = static_cast<T>(static_cast<double>(xr[j]) * rs * w[j]);
  *rstd = static_cast<T>(rs);
}

}  // namespace

template <typename T>
void rmsnorm_fwd(const T* x, const T* w, int64_t rows, int64_t dim, double eps, T* y, T* rstd) {
  for (int64_t r = 0; r < rows; ++r) rmsnorm_row(x + r * dim, w, dim, eps, y + r * dim, rstd + r);
}

// h = x + branch;  y = rmsnorm(h) ∘ w, row by row
template <typename T>
void add_rmsnorm_fwd(const T* x, const T* branch, const T* w, int64_t rows, int64_t dim, double eps, T* h, T* y,
                     T* rstd) {
  for (int64_t r = 0; r < rows; ++r) {
    T* hr = h + r * dim;
    for (int64_t j = 0; j < dim; ++j) hr[j] = x[r * dim + j] + branch[r * dim + j];
    rmsnorm_row(hr, w, dim, eps, y + r * dim, rstd + r);
  }
}

// g = dy ∘ w;  dx += r g - (r^3 / d) (Σ_j g_j x_j) x;  dw += Σ_rows dy ∘ x r   (layers-ssm-attn.md §1.1)
template <typename T>
void rmsnorm_bwd(const T* dy, const T* x, const T* w, const T* rstd, int64_t rows, int64_t dim, T* dx, T* dw) {
  std::vector<double> dw_acc(static_cast<size_t>(dim), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const T* dyr = dy + r * dim;
    const T* xr = x + r * dim;
    T* dxr = dx + r * dim;
    const double rs = rstd[r];
    double gx = 0.0;
    for (int64_t j = 0; j < dim; ++j) gx += static_cast<double>(dyr[j]) * w[j] * xr[j];
    const double coef = rs * rs * rs / static_cast<double>(dim) * gx;
    for (int64_t j = 0; j < dim; ++j) {
      const double g = static_cast<double>(dyr[j]) * w[j];
      dxr[j] = static_cast<T>(dxr[j] + (rs * g - coef * xr[j]));
      dw_acc[j] += static_cast<double>(dyr[j]) * xr[j] * rs;
    }
  }
  for (int64_t j = 0; j < dim; ++j) dw[j] = static_cast<T>(dw[j] + dw_acc[j]);
}

template void rmsnorm_fwd<float>(const float*, const float*, int64_t, int64_t, double, float*, float*);
template void rmsnorm_fwd<double>(const double*, const double*, int64_t, int64_t, double, double*, double*);
template void add_rmsnorm_fwd<float>(const float*, const float*, const float*, int64_t, int64_t, double, float*,
                                     float*, float*);
template void add_rmsnorm_fwd<double>(const double*, const double*, const double*, int64_t, int64_t, double, double*,
                                      double*, double*);
template void rmsnorm_bwd<float>(const float*, const float*, const float*, const float*, int64_t, int64_t, float*,
                                 float*);
template void rmsnorm_bwd<double>(const double*, const double*, const double*, const double*, int64_t, int64_t,
                                  double*, double*);

}  // namespace llmt::cpu
