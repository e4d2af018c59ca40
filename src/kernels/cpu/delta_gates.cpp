// Decay and beta gates forward and backward (layers-delta.md §4.1 steps 2-3, §4.3 steps 2-3, §5),
// arithmetic in double.
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

// beta = σ(b);  u = a + dt_bias;  g = -e^{A_log} softplus(u)   (layers-delta.md §4.1 steps 2-3, §4.3 step 2)
template <typename T>
void delta_gates_fwd(const T* a, const T* b, const T* A_log, const T* dt_bias, int64_t rows, int64_t heads,
                     int64_t dim, T* g, T* beta) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      const double A = std::exp(static_cast<double>(A_log[h]));
      for (int64_t c = 0; c < dim; ++c) {
        const int64_t j = (r * heads + h) * dim + c;
        g[j] = static_cast<T>(-A * softplus(static_cast<double>(a[j]) + dt_bias[h * dim + c]));
      }
      beta[r * heads + h] = static_cast<T>(sigmoid(b[r * heads + h]));
    }
  }
}

// db = dβ β(1 - β);  ∂g/∂A_log = g, ∂g/∂u = -e^{A_log} σ(u):
// da = dg (-e^{A_log} σ(u));  dA_log += Σ dg g;  ddt_bias += Σ_rows da   (layers-delta.md §5)
template <typename T>
void delta_gates_bwd(const T* dg, const T* dbeta, const T* a, const T* b, const T* A_log, const T* dt_bias,
                     int64_t rows, int64_t heads, int64_t dim, T* da, T* db, T* dA_log, T* ddt_bias) {
  std::vector<double> dA_acc(static_cast<size_t>(heads), 0.0), ddt_acc(static_cast<size_t>(heads * dim), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      const double A = std::exp(static_cast<double>(A_log[h]));
      for (int64_t c = 0; c < dim; ++c) {
        const int64_t j = (r * heads + h) * dim + c;
        const double u = static_cast<double>(a[j]) + dt_bias[h * dim + c];
        const double dau = static_cast<double>(dg[j]) * (-A * sigmoid(u));
        da[j] = static_cast<T>(dau);
        dA_acc[static_cast<size_t>(h)] += static_cast<double>(dg[j]) * (-A * softplus(u));
        ddt_acc[static_cast<size_t>(h * dim + c)] += dau;
      }
      const double be = sigmoid(b[r * heads + h]);
      db[r * heads + h] = static_cast<T>(static_cast<double>(dbeta[r * heads + h]) * be * (1.0 - be));
    }
  }
  for (int64_t h = 0; h < heads; ++h) dA_log[h] = static_cast<T>(dA_log[h] + dA_acc[static_cast<size_t>(h)]);
  for (int64_t i = 0; i < heads * dim; ++i)
    ddt_bias[i] = static_cast<T>(ddt_bias[i] + ddt_acc[static_cast<size_t>(i)]);
}

template void delta_gates_fwd<float>(const float*, const float*, const float*, const float*, int64_t, int64_t,
                                     int64_t, float*, float*);
template void delta_gates_fwd<double>(const double*, const double*, const double*, const double*, int64_t, int64_t,
                                      int64_t, double*, double*);
template void delta_gates_bwd<float>(const float*, const float*, const float*, const float*, const float*,
                                     const float*, int64_t, int64_t, int64_t, float*, float*, float*, float*);
template void delta_gates_bwd<double>(const double*, const double*, const double*, const double*, const double*,
                                      const double*, int64_t, int64_t, int64_t, double*, double*, double*, double*);

}  // namespace llmt::cpu
