// Comba inner decay and output correction, forward and backward (layers-delta.md §4.2 steps 2-3, §5).
#include "kernels/cpu/comba_gates.h"

#include <cmath>
#include <vector>

namespace llmt::cpu {

namespace {
double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
}  // namespace

// s = σ(decay) (1 without inner decay);  p = s k;  q' = q - D s k (q without output correction).
template <typename T>
void comba_gates_fwd(const T* q, const T* k, const T* decay, const T* D, int64_t rows, int64_t heads, int64_t dim,
                     T* q_out, T* p) {
  for (int64_t h = 0; h < heads; ++h) {
    const double s = decay != nullptr ? sigmoid(static_cast<double>(decay[h])) : 1.0;
    const double c = D != nullptr ? static_cast<double>(D[h]) * s : 0.0;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t base = (r * heads + h) * dim;
      for (int64_t i = 0; i < dim; ++i) {
        const double kv = k[base + i];
        p[base + i] = static_cast<T>(s * kv);
        q_out[base + i] = static_cast<T>(static_cast<double>(q[base + i]) - c * kv);
      }
    }
  }
}

// dq = dq';  dk += s dp - D s dq';  dD += -s Σ k·dq';  ddecay += s(1-s) Σ (k·dp - D k·dq')   (§5)
template <typename T>
void comba_gates_bwd(const T* dq_out, const T* dp, const T* k, const T* decay, const T* D, int64_t rows,
                     int64_t heads, int64_t dim, T* dk, T* ddecay, T* dD) {
  for (int64_t h = 0; h < heads; ++h) {
    const double s = decay != nullptr ? sigmoid(static_cast<double>(decay[h])) : 1.0;
    const double Dh = D != nullptr ? static_cast<double>(D[h]) : 0.0;
    double k_dp = 0, k_dq = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t base = (r * heads + h) * dim;
      for (int64_t i = 0; i < dim; ++i) {
        const double kv = k[base + i], dpv = dp[base + i], dqv = dq_out[base + i];
        k_dp += kv * dpv;
        k_dq += kv * dqv;
        dk[base + i] = static_cast<T>(static_cast<double>(dk[base + i]) + s * dpv - Dh * s * dqv);
      }
    }
    if (decay != nullptr) ddecay[h] = static_cast<T>(static_cast<double>(ddecay[h]) + s * (1.0 - s) * (k_dp - Dh * k_dq));
    if (D != nullptr) dD[h] = static_cast<T>(static_cast<double>(dD[h]) - s * k_dq);
  }
}

template void comba_gates_fwd<float>(const float*, const float*, const float*, const float*, int64_t, int64_t,
                                     int64_t, float*, float*);
template void comba_gates_fwd<double>(const double*, const double*, const double*, const double*, int64_t, int64_t,
                                      int64_t, double*, double*);
template void comba_gates_bwd<float>(const float*, const float*, const float*, const float*, const float*, int64_t,
                                     int64_t, int64_t, float*, float*, float*);
template void comba_gates_bwd<double>(const double*, const double*, const double*, const double*, const double*,
                                      int64_t, int64_t, int64_t, double*, double*, double*);

}  // namespace llmt::cpu
