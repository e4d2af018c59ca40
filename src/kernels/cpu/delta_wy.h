// The WY / UT pieces of the chunked delta rule that do not depend on the decay (layers-delta.md §6.1 F2,
// F4, F6 and §6.5 B1, B5, B6), shared by the GDN, Comba and KDA cores. One chunk of n tokens; matrices are
// dense row-major double: 𝒯, A, P, M1 [n, n]; U, Δ, dO rows [n, V]; W [n, K]; S_0 [K, V]. Internal to
// src/kernels/cpu.
#pragma once
#include <algorithm>
#include <cstdint>

#include "kernels/cpu/delta_common.h"

namespace llmt::cpu::delta {

/// F2: 𝒯 = (I + A)^{-1} for strictly lower triangular A [n, n], by forward substitution row by row:
/// 𝒯_r = e_r - Σ_{j<r} A_rj 𝒯_j. Returns 𝒯 [n, n], unit lower triangular.
inline Vec unit_lower_inverse(const Vec& A, int64_t n) {
  Vec tinv(n * n, 0.0);
  for (int64_t r = 0; r < n; ++r) {
    tinv[r * n + r] = 1.0;
    for (int64_t j = 0; j < r; ++j)
      for (int64_t m = 0; m <= j; ++m) tinv[r * n + m] -= A[r * n + j] * tinv[j * n + m];
  }
  return tinv;
}

/// F4: Δ = U - W S_0, [n, V]; row r is δ_r of the recurrence. u [n, V], w [n, K], S0 [K, V].
inline Vec chunk_delta(const Vec& u, const Vec& w, const Vec& S0, int64_t n, int64_t K, int64_t V) {
  Vec delta(u);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t m = 0; m < K; ++m)
      for (int64_t j = 0; j < V; ++j) delta[r * V + j] -= w[r * K + m] * S0[m * V + j];
  return delta;
}

/// F6 (intra-chunk part): out_r += Σ_{i<=r} P_ri Δ_i for the n rows of out [n, V] (row stride V).
inline void add_intra(const Vec& P, const Vec& delta, int64_t n, int64_t V, double* out) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i <= r; ++i)
      for (int64_t j = 0; j < V; ++j) out[r * V + j] += P[r * n + i] * delta[i * V + j];
}

/// B1 (output part): dΔ_r += Σ_{i>=r} P_ir dO_i. dO points at the chunk's first row of the [T, V] gradient.
inline void add_p_transpose(const Vec& P, const double* dO, int64_t n, int64_t V, Vec& ddelta) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = r; i < n; ++i)
      for (int64_t j = 0; j < V; ++j) ddelta[r * V + j] += P[i * n + r] * dO[i * V + j];
}

/// B5 (shared part): dW = -dΔ S_0^T [n, K], X_U = 𝒯^T dΔ [n, V], X_W = 𝒯^T dW [n, K].
struct WyGrads {
  Vec dW, XU, XW;
};

inline WyGrads wy_grads(const Vec& tinv, const Vec& ddelta, const Vec& S0, int64_t n, int64_t K, int64_t V) {
  WyGrads x{Vec(n * K, 0.0), Vec(n * V, 0.0), Vec(n * K, 0.0)};
  for (int64_t r = 0; r < n; ++r)
    for (int64_t m = 0; m < K; ++m) x.dW[r * K + m] = -dot(&ddelta[r * V], &S0[m * V], V);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = r; i < n; ++i) {
      const double t = tinv[i * n + r];
      for (int64_t j = 0; j < V; ++j) x.XU[r * V + j] += t * ddelta[i * V + j];
      for (int64_t m = 0; m < K; ++m) x.XW[r * K + m] += t * x.dW[i * K + m];
    }
  return x;
}

/// B6: given d𝒯 [n, n] (lower part), returns M1 = 𝒯^T d𝒯 [n, n]; dA_rj = -(M1 𝒯^T)_rj is inverse_grad_at.
inline Vec inverse_grad(const Vec& tinv, const Vec& dT, int64_t n) {
  Vec M1(n * n, 0.0);
  for (int64_t a = 0; a < n; ++a)  // both factors vanish unless i >= a and i >= b
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = std::max(a, b); i < n; ++i) M1[a * n + b] += tinv[i * n + a] * dT[i * n + b];
  return M1;
}

/// B6: dA_rj = -(M1 𝒯^T)_rj for j < r (𝒯 unit lower triangular, so the sum stops at m = j).
inline double inverse_grad_at(const Vec& M1, const Vec& tinv, int64_t n, int64_t r, int64_t j) {
  double dA = 0.0;
  for (int64_t m = 0; m <= j; ++m) dA -= M1[r * n + m] * tinv[j * n + m];
  return dA;
}

}  // namespace llmt::cpu::delta
