// One token of the decayed delta rule shared by GDN (scalar decay, layers-delta.md §4.1) and KDA
// (per-key-channel decay, §4.3), forward and exact backward (§6.4). The decay of key channel c is
// α_c = e^{g[c * g_stride]}: g_stride = 0 for GDN's scalar g_t, 1 for KDA's g_t [K]. Internal to src/kernels/cpu.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/cpu/delta_common.h"

namespace llmt::cpu::delta {

/// S_{t-1} -> S_t in place, S [K, V]: S̄ = Diag(α) S;  δ = β (v - S̄^T k);  S = S̄ + k δ^T.
/// k [K], v [V]; delta [V] receives δ_t.
inline void decayed_step(const double* g, int64_t g_stride, double beta, const double* k, const double* v, int64_t K,
                         int64_t V, double* S, double* delta) {
  for (int64_t c = 0; c < K; ++c) {
    const double alpha = std::exp(g[c * g_stride]);
    for (int64_t j = 0; j < V; ++j) S[c * V + j] *= alpha;
  }
  for (int64_t j = 0; j < V; ++j) {
    double sk = 0.0;
    for (int64_t c = 0; c < K; ++c) sk += S[c * V + j] * k[c];
    delta[j] = beta * (v[j] - sk);
  }
  for (int64_t c = 0; c < K; ++c)
    for (int64_t j = 0; j < V; ++j) S[c * V + j] += k[c] * delta[j];
}

/// Rows of one token's gradients: dq, dk [K], dv [V], dbeta [1], dg [1] (g_stride 0) or [K] (g_stride 1).
struct TokenGrads {
  double *dq, *dk, *dv, *dbeta, *dg;
};

/// Work buffers of decayed_step_bwd: sbar [K, V], e, r [V].
struct TokenScratch {
  Vec sbar, e, r;
};

/// Backward of decayed_step and of o_t = S_t^T q_t (§6.4), given S_{t-1} (Sprev) and S_t (St), both [K, V]:
/// dS += q do^T; dq = S_t do; e = dS^T k; dβ = e·r with r = v - S̄^T k; dv = β e; dk = dS δ - β S̄ e;
/// dS̄ = dS - β k e^T; dg_c = Σ_v S̄[c, v] dS̄[c, v] (summed over c for g_stride 0); dS = Diag(α) dS̄.
/// dS [K, V] holds dL/dS_t on entry and dL/dS_{t-1} on return.
inline void decayed_step_bwd(const double* g, int64_t g_stride, double beta, const double* q, const double* k,
                             const double* v, const double* dout, const double* Sprev, const double* St, int64_t K,
                             int64_t V, double* dS, TokenScratch& w, const TokenGrads& out) {
  for (int64_t m = 0; m < K; ++m) {
    for (int64_t j = 0; j < V; ++j) dS[m * V + j] += q[m] * dout[j];
    out.dq[m] = dot(&St[m * V], dout, V);
  }
  for (int64_t m = 0; m < K; ++m) {
    const double alpha = std::exp(g[m * g_stride]);
    for (int64_t j = 0; j < V; ++j) w.sbar[m * V + j] = alpha * Sprev[m * V + j];
  }
  for (int64_t j = 0; j < V; ++j) {
    double sk = 0.0, ek = 0.0;
    for (int64_t m = 0; m < K; ++m) {
      sk += w.sbar[m * V + j] * k[m];
      ek += dS[m * V + j] * k[m];
    }
    w.r[j] = v[j] - sk;
    w.e[j] = ek;
  }
  *out.dbeta = dot(w.e.data(), w.r.data(), V);
  for (int64_t j = 0; j < V; ++j) out.dv[j] = beta * w.e[j];
  for (int64_t m = 0; m < K; ++m)
    out.dk[m] = beta * (dot(&dS[m * V], w.r.data(), V) - dot(&w.sbar[m * V], w.e.data(), V));
  double dg = 0.0;
  for (int64_t m = 0; m < K; ++m) {
    const double alpha = std::exp(g[m * g_stride]);
    for (int64_t j = 0; j < V; ++j) {
      const double dsbar = dS[m * V + j] - beta * k[m] * w.e[j];
      dg += w.sbar[m * V + j] * dsbar;
      dS[m * V + j] = alpha * dsbar;
    }
    if (g_stride != 0) {
      out.dg[m] = dg;
      dg = 0.0;
    }
  }
  if (g_stride == 0) *out.dg = dg;
}

}  // namespace llmt::cpu::delta
