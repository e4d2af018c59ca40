// Gated DeltaNet gates forward and backward (layers-delta.md §4.1 steps 2-3, §5), arithmetic in double.
#include "kernels/cpu/delta_gates.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace llmt::cpu {

namespace {

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// softplus(x) = log(1 + e^x) = max(x, 0) + log1p(e^{-|x|}): never overflows, and for x > 0 it is
// x + log1p(e^{-x}) (PyTorch's threshold-20 identity differs from it by < 3e-9 there).
double softplus(double x) { return std::max(x, 0.0) + std::log1p(std::exp(-std::abs(x))); }

}  // namespace

// beta = σ(b);  u = a + dt_bias;  g = -e^{A_log} softplus(u)   (layers-delta.md §4.1 steps 2-3)
template <typename T>
void gdn_gates_fwd(const T* a, const T* b, const T* A_log, const T* dt_bias, int64_t rows, int64_t heads, T* g,
                   T* beta) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t j = r * heads + h;
      const double u = static_cast<double>(a[j]) + dt_bias[h];
      g[j] = static_cast<T>(-std::exp(static_cast<double>(A_log[h])) * softplus(u));
      beta[j] = static_cast<T>(sigmoid(b[j]));
    }
  }
}

// db = dβ β(1 - β);  ∂g/∂A_log = g, ∂g/∂u = -e^{A_log} σ(u):
// da = dg (-e^{A_log} σ(u));  dA_log += Σ_rows dg g;  ddt_bias += Σ_rows da   (layers-delta.md §5)
template <typename T>
void gdn_gates_bwd(const T* dg, const T* dbeta, const T* a, const T* b, const T* A_log, const T* dt_bias,
                   int64_t rows, int64_t heads, T* da, T* db, T* dA_log, T* ddt_bias) {
  std::vector<double> dA_acc(static_cast<size_t>(heads), 0.0), ddt_acc(static_cast<size_t>(heads), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t j = r * heads + h;
      const double u = static_cast<double>(a[j]) + dt_bias[h];
      const double A = std::exp(static_cast<double>(A_log[h]));
      const double g = -A * softplus(u);
      const double dau = static_cast<double>(dg[j]) * (-A * sigmoid(u));
      da[j] = static_cast<T>(dau);
      dA_acc[static_cast<size_t>(h)] += static_cast<double>(dg[j]) * g;
      ddt_acc[static_cast<size_t>(h)] += dau;
      const double be = sigmoid(b[j]);
      db[j] = static_cast<T>(static_cast<double>(dbeta[j]) * be * (1.0 - be));
    }
  }
  for (int64_t h = 0; h < heads; ++h) {
    dA_log[h] = static_cast<T>(dA_log[h] + dA_acc[static_cast<size_t>(h)]);
    ddt_bias[h] = static_cast<T>(ddt_bias[h] + ddt_acc[static_cast<size_t>(h)]);
  }
}

template void gdn_gates_fwd<float>(const float*, const float*, const float*, const float*, int64_t, int64_t, float*,
                                   float*);
template void gdn_gates_fwd<double>(const double*, const double*, const double*, const double*, int64_t, int64_t,
                                    double*, double*);
template void gdn_gates_bwd<float>(const float*, const float*, const float*, const float*, const float*,
                                   const float*, int64_t, int64_t, float*, float*, float*, float*);
template void gdn_gates_bwd<double>(const double*, const double*, const double*, const double*, const double*,
                                    const double*, int64_t, int64_t, double*, double*, double*, double*);

}  // namespace llmt::cpu
