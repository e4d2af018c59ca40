// MDN (Momentum DeltaNet) core, CPU reference (mdn.md §5, §6.2, §6.4, §6.5, §7.2, §7.3).
// Each (batch, head) is copied into double buffers (rows t of q, k, v, the derived keys k̂ = η k and
// p = α k; the states S and M [K, V]), processed by direct loops, and written back.
#include "kernels/cpu/mdn.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/delta_common.h"
#include "kernels/cpu/delta_scan.h"

namespace llmt::cpu {
namespace {

using namespace delta;

// One (batch, head) slice: q, k [T, K], v [T, V], la (log α), beta, lm (log μ), eta [T]; s0, m0 [K, V]
// (zeros when absent); khat = η k and p = α k [T, K] (mdn.md §4.4).
struct Head {
  Vec q, k, v, la, beta, lm, eta, s0, m0, khat, p;
};

// Per-head gradients: the MdnGrads fields plus dkhat, dp [T, K] (gradients w.r.t. k̂ and p), which
// finish() folds into dk, deta and dla.
struct HeadGrads {
  Vec dq, dk, dv, dla, dbeta, dlm, deta, ds0, dm0, dkhat, dp;
};

template <typename T>
Head load(const MdnInputs<T>& in, const DeltaDims& d, int64_t b, int64_t h) {
  const int64_t K = d.key_dim, L = d.seq_len;
  Head hd{gather(in.q, d, b, h, K),
          gather(in.k, d, b, h, K),
          gather(in.v, d, b, h, d.value_dim),
          gather(in.log_alpha, d, b, h, 1),
          gather(in.beta, d, b, h, 1),
          gather(in.log_mu, d, b, h, 1),
          gather(in.eta, d, b, h, 1),
          load_state(in.initial_state, d, b, h),
          load_state(in.initial_momentum, d, b, h),
          Vec(L * K),
          Vec(L * K)};
  for (int64_t t = 0; t < L; ++t) {
    const double alpha = std::exp(hd.la[t]), eta = hd.eta[t];
    for (int64_t c = 0; c < K; ++c) {
      hd.khat[t * K + c] = eta * hd.k[t * K + c];
      hd.p[t * K + c] = alpha * hd.k[t * K + c];
    }
  }
  return hd;
}

HeadGrads zero_grads(const DeltaDims& d) {
  const int64_t L = d.seq_len, K = d.key_dim, V = d.value_dim;
  return {Vec(L * K, 0.0), Vec(L * K, 0.0), Vec(L * V, 0.0),  Vec(L, 0.0),     Vec(L, 0.0),    Vec(L, 0.0),
          Vec(L, 0.0),     Vec(K * V, 0.0), Vec(K * V, 0.0), Vec(L * K, 0.0), Vec(L * K, 0.0)};
}

// The two states of one head, S and M [K, V], as the chunked backward carries them.
struct States {
  Vec S, M;
};

// [S; M] [2K, V], the packed state of the token scans.
Vec pack(const Vec& S, const Vec& M) {
  Vec sm(S);
  sm.insert(sm.end(), M.begin(), M.end());
  return sm;
}

// The read key p = α k and the write key k̂ = η k (mdn.md §4.4, §7.2 last line):
// dk = η dk̂ + α dp;  dη = k·dk̂;  d log α += α k·dp.
void finish(const Head& hd, int64_t L, int64_t K, HeadGrads& g) {
  for (int64_t t = 0; t < L; ++t) {
    const double alpha = std::exp(hd.la[t]), eta = hd.eta[t];
    const double* k = &hd.k[t * K];
    const double* dkh = &g.dkhat[t * K];
    const double* dp = &g.dp[t * K];
    for (int64_t c = 0; c < K; ++c) g.dk[t * K + c] = eta * dkh[c] + alpha * dp[c];
    g.deta[t] = dot(k, dkh, K);
    g.dla[t] += alpha * dot(k, dp, K);
  }
}

template <typename T>
void store_grads(const HeadGrads& g, const DeltaDims& d, int64_t b, int64_t h, const MdnGrads<T>& out) {
  scatter(g.dq, d, b, h, d.key_dim, out.dq);
  scatter(g.dk, d, b, h, d.key_dim, out.dk);
  scatter(g.dv, d, b, h, d.value_dim, out.dv);
  scatter(g.dla, d, b, h, 1, out.dlog_alpha);
  scatter(g.dbeta, d, b, h, 1, out.dbeta);
  scatter(g.dlm, d, b, h, 1, out.dlog_mu);
  scatter(g.deta, d, b, h, 1, out.deta);
  store_state(g.ds0, d, b, h, out.d_initial_state);
  store_state(g.dm0, d, b, h, out.d_initial_momentum);
}

// One token of the recurrence, (S_{t-1}, M_{t-1}) -> (S_t, M_t) in place, ṽ_t written to vt [V]
// (mdn.md §5): ṽ = v_t - S^T p_t;  M = μ_t M - k̂_t ṽ^T;  S = α_t S - β_t M.
void step(const Head& hd, int64_t t, int64_t K, int64_t V, double* S, double* M, double* vt) {
  const double alpha = std::exp(hd.la[t]), mu = std::exp(hd.lm[t]), beta = hd.beta[t];
  const double* p = &hd.p[t * K];
  const double* kh = &hd.khat[t * K];
  for (int64_t j = 0; j < V; ++j) {
    double sp = 0.0;
    for (int64_t c = 0; c < K; ++c) sp += S[c * V + j] * p[c];
    vt[j] = hd.v[t * V + j] - sp;
  }
  for (int64_t c = 0; c < K; ++c)
    for (int64_t j = 0; j < V; ++j) {
      double& m = M[c * V + j];
      m = mu * m - kh[c] * vt[j];
      S[c * V + j] = alpha * S[c * V + j] - beta * m;
    }
}

// Chunk-local coefficients of mdn.md §6.1/§6.4 for tokens [c0, c0 + n) of one head (0-based rows; row -1
// is the chunk-start state, ᾱ_{-1} = 1, b_{-1} = 0).
struct Chunk {
  int64_t c0, n;
  Vec la, lu;      // [n, n] L_A[i, r] = exp(Σ_{u=r+1..i} log α_u) (r <= i), L_U[r, j] likewise with log μ (j <= r)
  Vec abar, mbar;  // [n] ᾱ_i = exp(Σ_{u<=i} log α_u), μ̄_i = exp(Σ_{u<=i} log μ_u)
  Vec gam;         // [n, n] Γ = L_A Diag(β) L_U (lower triangular incl. the diagonal)
  Vec b;           // [n] b = L_A (β ⊙ μ̄)
  Vec pk, qk;      // [n, n] p_i·k̂_j (j < i), q_i·k̂_j (j <= i)
};

// §6.4: segment sums (not differences of cumsums), so every exponent is a sum of log-gates <= 0 and a
// log μ of -inf gives exact zeros instead of -inf - (-inf).
Chunk make_chunk(const Head& hd, int64_t c0, int64_t n, int64_t K) {
  Chunk c{c0, n, Vec(n * n, 0.0), Vec(n * n, 0.0), Vec(n), Vec(n), Vec(n * n, 0.0), Vec(n, 0.0),
          Vec(n * n, 0.0), Vec(n * n, 0.0)};
  for (int64_t r = 0; r < n; ++r) {
    c.la[r * n + r] = c.lu[r * n + r] = 1.0;
    double sa = 0.0, su = 0.0;
    for (int64_t i = r + 1; i < n; ++i) {
      sa += hd.la[c0 + i];
      su += hd.lm[c0 + i];
      c.la[i * n + r] = std::exp(sa);
      c.lu[i * n + r] = std::exp(su);
    }
  }
  double sa = 0.0, su = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    sa += hd.la[c0 + i];
    su += hd.lm[c0 + i];
    c.abar[i] = std::exp(sa);
    c.mbar[i] = std::exp(su);
  }
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t r = 0; r <= i; ++r) {
      const double ab = c.la[i * n + r] * hd.beta[c0 + r];
      c.b[i] += ab * c.mbar[r];
      for (int64_t j = 0; j <= r; ++j) c.gam[i * n + j] += ab * c.lu[r * n + j];
    }
    for (int64_t j = 0; j <= i; ++j) {
      c.qk[i * n + j] = dot(&hd.q[(c0 + i) * K], &hd.khat[(c0 + j) * K], K);
      if (j < i) c.pk[i * n + j] = dot(&hd.p[(c0 + i) * K], &hd.khat[(c0 + j) * K], K);
    }
  }
  return c;
}

// W_ij = Γ_{i-1, j} p_i·k̂_j for j < i (Γ⁻ of §6.2: Γ shifted down one row).
inline double w_entry(const Chunk& c, int64_t i, int64_t j) { return c.gam[(i - 1) * c.n + j] * c.pk[i * c.n + j]; }

// Ṽ [n, V] solving (I + W) Ṽ = R, R_i = v_i - ᾱ_{i-1} S_0^T p_i + b_{i-1} M_0^T p_i, by forward
// substitution (§6.2: Ṽ = Uv - Y S_0 + Z M_0 without forming T = (I + W)^{-1}).
Vec residuals(const Head& hd, const Chunk& c, const Vec& S0, const Vec& M0, int64_t K, int64_t V) {
  const int64_t n = c.n;
  Vec vt(n * V);
  for (int64_t i = 0; i < n; ++i) {
    const double a = i > 0 ? c.abar[i - 1] : 1.0, bb = i > 0 ? c.b[i - 1] : 0.0;
    const double* p = &hd.p[(c.c0 + i) * K];
    double* row = &vt[i * V];
    for (int64_t j = 0; j < V; ++j) {
      double sp = 0.0, mp = 0.0;
      for (int64_t m = 0; m < K; ++m) {
        sp += S0[m * V + j] * p[m];
        mp += M0[m * V + j] * p[m];
      }
      row[j] = hd.v[(c.c0 + i) * V + j] - a * sp + bb * mp;
    }
    for (int64_t jj = 0; jj < i; ++jj) {
      const double w = w_entry(c, i, jj);
      for (int64_t j = 0; j < V; ++j) row[j] -= w * vt[jj * V + j];
    }
  }
  return vt;
}

// (S, M) <- (ᾱ_n S_0 - b_n M_0 + K̂^T Diag(Γ_{n,:}) Ṽ,  μ̄_n M_0 - K̂^T Diag(L_U[n,:]) Ṽ), both from the
// pre-chunk states (§6.2).
void advance_states(const Head& hd, const Chunk& c, const Vec& vt, int64_t K, int64_t V, Vec& S, Vec& M) {
  const int64_t n = c.n, last = n - 1;
  const double aC = c.abar[last], bC = c.b[last], mC = c.mbar[last];
  for (int64_t i = 0; i < K * V; ++i) {
    const double s = S[i], m = M[i];
    S[i] = aC * s - bC * m;
    M[i] = mC * m;
  }
  for (int64_t j = 0; j < n; ++j) {
    const double gs = c.gam[last * n + j], gm = c.lu[last * n + j];
    const double* kh = &hd.khat[(c.c0 + j) * K];
    for (int64_t m = 0; m < K; ++m)
      for (int64_t jj = 0; jj < V; ++jj) {
        const double x = kh[m] * vt[j * V + jj];
        S[m * V + jj] += gs * x;
        M[m * V + jj] -= gm * x;
      }
  }
}

// d log-gate of the segment-sum matrix L (L[i, r] = exp(Σ_{u=r+1..i} x_u), r <= i) given dL:
// dx_u = Σ_{i >= u} Σ_{r < u} dL[i, r] L[i, r], summed term by term (no cancellation), added to dx [n].
void segment_grad(const Vec& L, const Vec& dL, int64_t n, double* dx) {
  Vec F(n * n, 0.0);  // F[i, u] = Σ_{r < u} dL[i, r] L[i, r]  (u <= i)
  for (int64_t i = 0; i < n; ++i) {
    double run = 0.0;
    for (int64_t u = 0; u <= i; ++u) {
      F[i * n + u] = run;
      run += dL[i * n + u] * L[i * n + u];
    }
  }
  for (int64_t u = 0; u < n; ++u) {
    double acc = 0.0;
    for (int64_t i = u; i < n; ++i) acc += F[i * n + u];
    dx[u] += acc;
  }
}

// mdn.md §7.3 for one chunk. dO: the head's [T, V] output gradient; S0, M0: the states entering the chunk;
// dS, dM: on entry dL/dS_next, dL/dM_next (G, H of §7.3), on return dL/dS_0, dL/dM_0 of this chunk.
// Writes the chunk's rows of g.dq, g.dkhat, g.dp, g.dv, g.dla (decay part), g.dbeta, g.dlm.
void chunk_bwd(const Head& hd, const Vec& dO, const Chunk& c, const Vec& S0, const Vec& M0, int64_t K, int64_t V,
               Vec& dS, Vec& dM, HeadGrads& g) {
  const int64_t n = c.n, c0 = c.c0, last = n - 1, KV = K * V;
  const Vec vt = residuals(hd, c, S0, M0, K, V);
  auto q = [&](int64_t r) { return &hd.q[(c0 + r) * K]; };
  auto kh = [&](int64_t r) { return &hd.khat[(c0 + r) * K]; };
  auto p = [&](int64_t r) { return &hd.p[(c0 + r) * K]; };
  auto dOr = [&](int64_t r) { return &dO[(c0 + r) * V]; };

  // dṼ_j = Σ_{i>=j} E_ij dO_i + Γ_{n,j} G^T k̂_j - L_U[n, j] H^T k̂_j, with E = (Q K̂^T) ⊙ Γ.
  Vec dvt(n * V, 0.0);
  for (int64_t j = 0; j < n; ++j) {
    double* row = &dvt[j * V];
    for (int64_t i = j; i < n; ++i) {
      const double e = c.gam[i * n + j] * c.qk[i * n + j];
      for (int64_t jj = 0; jj < V; ++jj) row[jj] += e * dOr(i)[jj];
    }
    const double gs = c.gam[last * n + j], gm = c.lu[last * n + j];
    for (int64_t m = 0; m < K; ++m) {
      const double a = gs * kh(j)[m], b = gm * kh(j)[m];
      for (int64_t jj = 0; jj < V; ++jj) row[jj] += a * dS[m * V + jj] - b * dM[m * V + jj];
    }
  }
  // dR = (I + W)^{-T} dṼ by back substitution: dR_j = dṼ_j - Σ_{i>j} W_ij dR_i; dV = dR.
  Vec dR(dvt);
  for (int64_t j = n - 1; j >= 0; --j)
    for (int64_t i = j + 1; i < n; ++i) {
      const double w = w_entry(c, i, j);
      for (int64_t jj = 0; jj < V; ++jj) dR[j * V + jj] -= w * dR[i * V + jj];
    }
  for (int64_t r = 0; r < n; ++r)
    for (int64_t jj = 0; jj < V; ++jj) g.dv[(c0 + r) * V + jj] = dR[r * V + jj];
  // dW_ij = -dR_i·Ṽ_j (j < i); dE_ij = dO_i·Ṽ_j (j <= i).
  Vec dW(n * n, 0.0), dE(n * n, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j <= i; ++j) {
      dE[i * n + j] = dot(dOr(i), &vt[j * V], V);
      if (j < i) dW[i * n + j] = -dot(&dR[i * V], &vt[j * V], V);
    }
  // dS_0 = ᾱ_n G + Σ_i ᾱ_i q_i dO_i^T - Σ_i ᾱ_{i-1} p_i dR_i^T;
  // dM_0 = -b_n G + μ̄_n H - Σ_i b_i q_i dO_i^T + Σ_i b_{i-1} p_i dR_i^T.
  Vec dS0(KV), dM0(KV);
  for (int64_t x = 0; x < KV; ++x) {
    dS0[x] = c.abar[last] * dS[x];
    dM0[x] = -c.b[last] * dS[x] + c.mbar[last] * dM[x];
  }
  for (int64_t i = 0; i < n; ++i) {
    const double a = c.abar[i], bi = c.b[i], am = i > 0 ? c.abar[i - 1] : 1.0, bm = i > 0 ? c.b[i - 1] : 0.0;
    for (int64_t m = 0; m < K; ++m)
      for (int64_t jj = 0; jj < V; ++jj) {
        const double qo = q(i)[m] * dOr(i)[jj], pr = p(i)[m] * dR[i * V + jj];
        dS0[m * V + jj] += a * qo - am * pr;
        dM0[m * V + jj] += -bi * qo + bm * pr;
      }
  }
  // Coefficient gradients (§7.3): dΓ, dᾱ, db, dL_U (last row, from M_next), dμ̄.
  Vec dgam(n * n, 0.0), dabar(n, 0.0), db(n, 0.0), dlu(n * n, 0.0), dmbar(n, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j <= i; ++j)
      dgam[i * n + j] = dE[i * n + j] * c.qk[i * n + j] + (i + 1 < n ? dW[(i + 1) * n + j] * c.pk[(i + 1) * n + j] : 0.0);
  // dq_i = ᾱ_i S_0 dO_i - b_i M_0 dO_i + Σ_{j<=i} dE_ij Γ_ij k̂_j;
  // dp_i = Σ_{j<i} dW_ij Γ_{i-1,j} k̂_j - ᾱ_{i-1} S_0 dR_i + b_{i-1} M_0 dR_i;
  // dk̂_j = Σ_{i>=j} dE_ij Γ_ij q_i + Σ_{i>j} dW_ij Γ_{i-1,j} p_i + Γ_{n,j} G Ṽ_j - L_U[n,j] H Ṽ_j;
  // dᾱ_i += (S_0^T q_i)·dO_i, db_i -= (M_0^T q_i)·dO_i, dᾱ_{i-1} -= (S_0^T p_i)·dR_i, db_{i-1} += (M_0^T p_i)·dR_i.
  Vec sdo(K), mdo(K), sdr(K), mdr(K);
  for (int64_t i = 0; i < n; ++i) {
    double* dq = &g.dq[(c0 + i) * K];
    double* dp = &g.dp[(c0 + i) * K];
    for (int64_t m = 0; m < K; ++m) {
      sdo[m] = dot(&S0[m * V], dOr(i), V);
      mdo[m] = dot(&M0[m * V], dOr(i), V);
      sdr[m] = dot(&S0[m * V], &dR[i * V], V);
      mdr[m] = dot(&M0[m * V], &dR[i * V], V);
    }
    const double am = i > 0 ? c.abar[i - 1] : 1.0, bm = i > 0 ? c.b[i - 1] : 0.0;
    for (int64_t m = 0; m < K; ++m) {
      dq[m] = c.abar[i] * sdo[m] - c.b[i] * mdo[m];
      dp[m] = -am * sdr[m] + bm * mdr[m];
    }
    dabar[i] += dot(q(i), sdo.data(), K);
    db[i] -= dot(q(i), mdo.data(), K);
    if (i > 0) {
      dabar[i - 1] -= dot(p(i), sdr.data(), K);
      db[i - 1] += dot(p(i), mdr.data(), K);
    }
    for (int64_t j = 0; j <= i; ++j) {
      const double f = dE[i * n + j] * c.gam[i * n + j];
      double* dkh = &g.dkhat[(c0 + j) * K];
      for (int64_t m = 0; m < K; ++m) {
        dq[m] += f * kh(j)[m];
        dkh[m] += f * q(i)[m];
      }
      if (j < i) {
        const double fw = dW[i * n + j] * c.gam[(i - 1) * n + j];
        for (int64_t m = 0; m < K; ++m) {
          dp[m] += fw * kh(j)[m];
          dkh[m] += fw * p(i)[m];
        }
      }
    }
  }
  // State terms: with gv_j = G Ṽ_j, hv_j = H Ṽ_j [K]: dk̂_j += Γ_{n,j} gv_j - L_U[n,j] hv_j;
  // dΓ_{n,j} += k̂_j·gv_j; dL_U[n,j] -= k̂_j·hv_j.
  Vec gv(K), hv(K);
  for (int64_t j = 0; j < n; ++j) {
    double* dkh = &g.dkhat[(c0 + j) * K];
    for (int64_t m = 0; m < K; ++m) {
      gv[m] = dot(&dS[m * V], &vt[j * V], V);
      hv[m] = dot(&dM[m * V], &vt[j * V], V);
      dkh[m] += c.gam[last * n + j] * gv[m] - c.lu[last * n + j] * hv[m];
    }
    dgam[last * n + j] += dot(kh(j), gv.data(), K);
    dlu[last * n + j] -= dot(kh(j), hv.data(), K);
  }
  dabar[last] += dot(S0.data(), dS.data(), KV);
  db[last] -= dot(M0.data(), dS.data(), KV);
  dmbar[last] += dot(M0.data(), dM.data(), KV);
  // Through Γ = L_A Diag(β) L_U and b = L_A (β ⊙ μ̄): with y_ir = Σ_{j<=r} dΓ_ij L_U[r,j] + db_i μ̄_r,
  // dL_A[i,r] = β_r y_ir, dβ_r = Σ_{i>=r} L_A[i,r] y_ir, dL_U[r,j] += β_r Σ_{i>=r} L_A[i,r] dΓ_ij,
  // dμ̄_r += β_r Σ_{i>=r} L_A[i,r] db_i.
  Vec dla(n * n, 0.0);
  for (int64_t r = 0; r < n; ++r) {
    const double beta = hd.beta[c0 + r];
    double dbeta = 0.0, dmb = 0.0;
    for (int64_t i = r; i < n; ++i) {
      double y = db[i] * c.mbar[r];
      for (int64_t j = 0; j <= r; ++j) y += dgam[i * n + j] * c.lu[r * n + j];
      dla[i * n + r] = beta * y;
      dbeta += c.la[i * n + r] * y;
      dmb += c.la[i * n + r] * db[i];
    }
    g.dbeta[c0 + r] = dbeta;
    dmbar[r] += beta * dmb;
    for (int64_t j = 0; j <= r; ++j) {
      double s = 0.0;
      for (int64_t i = r; i < n; ++i) s += c.la[i * n + r] * dgam[i * n + j];
      dlu[r * n + j] += beta * s;
    }
  }
  // To the per-token log gates: segment sums of L_A, L_U, plus the prefix products ᾱ, μ̄
  // (d log α_u += Σ_{i>=u} ᾱ_i dᾱ_i, d log μ_u += Σ_{i>=u} μ̄_i dμ̄_i).
  segment_grad(c.la, dla, n, &g.dla[c0]);
  segment_grad(c.lu, dlu, n, &g.dlm[c0]);
  double acc_a = 0.0, acc_m = 0.0;
  for (int64_t u = n - 1; u >= 0; --u) {
    acc_a += c.abar[u] * dabar[u];
    acc_m += c.mbar[u] * dmbar[u];
    g.dla[c0 + u] += acc_a;
    g.dlm[c0 + u] += acc_m;
  }
  dS.swap(dS0);
  dM.swap(dM0);
}

}  // namespace

// ṽ_t = v_t - S_{t-1}^T p_t; M_t = μ_t M_{t-1} - k̂_t ṽ_t^T; S_t = α_t S_{t-1} - β_t M_t; o_t = S_t^T q_t  (mdn.md §5)
// The scans carry the two states packed as SM = [S; M] [2K, V].
template <typename T>
void mdn_recurrent_fwd(const MdnInputs<T>& in, const DeltaDims& d, T* o, T* final_state, T* final_momentum) {
  const int64_t K = d.key_dim, V = d.value_dim, KV = K * V;
  Vec vt(V);
  for_each_head(d, [&](int64_t b, int64_t h) {
    const Head hd = load(in, d, b, h);
    Vec SM = pack(hd.s0, hd.m0), out(d.seq_len * V);
    recurrent_scan(
        hd.q, d.seq_len, K, V, [&](int64_t t, double* x) { step(hd, t, K, V, x, x + KV, vt.data()); }, SM, out);
    scatter(out, d, b, h, V, o);
    store_state(Vec(SM.begin(), SM.begin() + KV), d, b, h, final_state);
    store_state(Vec(SM.begin() + KV, SM.end()), d, b, h, final_momentum);
  });
}

// Reverse-time backward (mdn.md §7.2), per token t = T..1 with G = dL/dS_t, H = dL/dM_t:
// G += q_t do_t^T; dq_t = S_t do_t; H -= β_t G; dβ_t = -⟨M_t, G⟩; dṽ = -H^T k̂_t; dk̂_t = -H ṽ_t; dv_t = dṽ;
// dp_t = -S_{t-1} dṽ; d log α_t = α_t ⟨S_{t-1}, G⟩; d log μ_t = μ_t ⟨M_{t-1}, H⟩; G <- α_t G - p_t dṽ^T; H <- μ_t H.
template <typename T>
void mdn_recurrent_bwd(const MdnInputs<T>& in, const T* d_o, const T* d_final_state, const T* d_final_momentum,
                       const DeltaDims& d, const MdnGrads<T>& grads) {
  const int64_t K = d.key_dim, V = d.value_dim, L = d.seq_len, KV = K * V;
  Vec vt(V), dvt(V);
  for_each_head(d, [&](int64_t b, int64_t h) {
    const Head hd = load(in, d, b, h);
    const Vec dO = gather(d_o, d, b, h, V);
    HeadGrads g = zero_grads(d);
    Vec& dS = g.ds0;
    Vec& dM = g.dm0;
    dS = load_state(d_final_state, d, b, h);
    dM = load_state(d_final_momentum, d, b, h);
    auto token_bwd = [&](int64_t t, const double* SMprev, const double* SMt) {
      const double* Sprev = SMprev;
      const double* St = SMt;
      const double* Mprev = SMprev + KV;
      const double* Mt = SMt + KV;
      const double* q = &hd.q[t * K];
      const double* kh = &hd.khat[t * K];
      const double* p = &hd.p[t * K];
      const double* dout = &dO[t * V];
      const double alpha = std::exp(hd.la[t]), mu = std::exp(hd.lm[t]), beta = hd.beta[t];
      for (int64_t j = 0; j < V; ++j) {  // ṽ_t from S_{t-1}
        double sp = 0.0;
        for (int64_t m = 0; m < K; ++m) sp += Sprev[m * V + j] * p[m];
        vt[j] = hd.v[t * V + j] - sp;
      }
      for (int64_t m = 0; m < K; ++m) {
        for (int64_t j = 0; j < V; ++j) dS[m * V + j] += q[m] * dout[j];
        g.dq[t * K + m] = dot(&St[m * V], dout, V);
      }
      for (int64_t x = 0; x < KV; ++x) dM[x] -= beta * dS[x];
      g.dbeta[t] = -dot(Mt, dS.data(), KV);
      for (int64_t j = 0; j < V; ++j) {
        double s = 0.0;
        for (int64_t m = 0; m < K; ++m) s += dM[m * V + j] * kh[m];
        dvt[j] = -s;
        g.dv[t * V + j] = -s;
      }
      for (int64_t m = 0; m < K; ++m) {
        g.dkhat[t * K + m] = -dot(&dM[m * V], vt.data(), V);
        g.dp[t * K + m] = -dot(&Sprev[m * V], dvt.data(), V);
      }
      g.dla[t] = alpha * dot(Sprev, dS.data(), KV);
      g.dlm[t] = mu * dot(Mprev, dM.data(), KV);
      for (int64_t m = 0; m < K; ++m)
        for (int64_t j = 0; j < V; ++j) {
          dS[m * V + j] = alpha * dS[m * V + j] - p[m] * dvt[j];
          dM[m * V + j] *= mu;
        }
    };
    recurrent_reverse(
        pack(hd.s0, hd.m0), L, 2 * KV, [&](int64_t t, double* x) { step(hd, t, K, V, x, x + KV, vt.data()); },
        token_bwd);
    finish(hd, L, K, g);
    store_grads(g, d, b, h, grads);
  });
}

// Chunked forward (mdn.md §6.2 with §6.4's coefficients, §6.5 for the last chunk): per chunk make_chunk,
// Ṽ by forward substitution, O = Diag(ᾱ) Q S_0 - Diag(b) Q M_0 + E Ṽ, then both carried states.
template <typename T>
void mdn_chunk_fwd(const MdnInputs<T>& in, const DeltaDims& d, T* o, T* final_state, T* final_momentum,
                   int64_t chunk_size) {
  check_chunk_size("mdn", chunk_size);
  const int64_t K = d.key_dim, V = d.value_dim;
  Vec sq(V), mq(V);
  for_each_head(d, [&](int64_t b, int64_t h) {
    const Head hd = load(in, d, b, h);
    Vec S = hd.s0, M = hd.m0, out(d.seq_len * V, 0.0);
    for (int64_t c0 = 0; c0 < d.seq_len; c0 += chunk_size) {
      const Chunk c = make_chunk(hd, c0, std::min(chunk_size, d.seq_len - c0), K);
      const Vec vt = residuals(hd, c, S, M, K, V);
      for (int64_t i = 0; i < c.n; ++i) {
        double* orow = &out[(c0 + i) * V];
        read_out(S, &hd.q[(c0 + i) * K], K, V, sq.data());
        read_out(M, &hd.q[(c0 + i) * K], K, V, mq.data());
        for (int64_t j = 0; j < V; ++j) orow[j] = c.abar[i] * sq[j] - c.b[i] * mq[j];
        for (int64_t jj = 0; jj <= i; ++jj) {
          const double e = c.gam[i * c.n + jj] * c.qk[i * c.n + jj];
          for (int64_t j = 0; j < V; ++j) orow[j] += e * vt[jj * V + j];
        }
      }
      advance_states(hd, c, vt, K, V, S, M);
    }
    scatter(out, d, b, h, V, o);
    store_state(S, d, b, h, final_state);
    store_state(M, d, b, h, final_momentum);
  });
}

// Chunked backward (mdn.md §7.3): recompute the chunk-start states (S, M) by a forward scan, then
// chunk_bwd chunk by chunk in reverse, carrying (dL/dS, dL/dM).
template <typename T>
void mdn_chunk_bwd(const MdnInputs<T>& in, const T* d_o, const T* d_final_state, const T* d_final_momentum,
                   const DeltaDims& d, const MdnGrads<T>& grads, int64_t chunk_size) {
  check_chunk_size("mdn", chunk_size);
  const int64_t K = d.key_dim, V = d.value_dim;
  for_each_head(d, [&](int64_t b, int64_t h) {
    const Head hd = load(in, d, b, h);
    const Vec dO = gather(d_o, d, b, h, V);
    HeadGrads g = zero_grads(d);
    g.ds0 = load_state(d_final_state, d, b, h);
    g.dm0 = load_state(d_final_momentum, d, b, h);
    chunk_reverse(
        States{hd.s0, hd.m0}, d.seq_len, chunk_size, [&](int64_t c0, int64_t n) { return make_chunk(hd, c0, n, K); },
        [&](const Chunk& c, States& x) { advance_states(hd, c, residuals(hd, c, x.S, x.M, K, V), K, V, x.S, x.M); },
        [&](const Chunk& c, const States& x0) { chunk_bwd(hd, dO, c, x0.S, x0.M, K, V, g.ds0, g.dm0, g); });
    finish(hd, d.seq_len, K, g);
    store_grads(g, d, b, h, grads);
  });
}

template void mdn_recurrent_fwd<float>(const MdnInputs<float>&, const DeltaDims&, float*, float*, float*);
template void mdn_recurrent_fwd<double>(const MdnInputs<double>&, const DeltaDims&, double*, double*, double*);
template void mdn_recurrent_bwd<float>(const MdnInputs<float>&, const float*, const float*, const float*,
                                       const DeltaDims&, const MdnGrads<float>&);
template void mdn_recurrent_bwd<double>(const MdnInputs<double>&, const double*, const double*, const double*,
                                        const DeltaDims&, const MdnGrads<double>&);
template void mdn_chunk_fwd<float>(const MdnInputs<float>&, const DeltaDims&, float*, float*, float*, int64_t);
template void mdn_chunk_fwd<double>(const MdnInputs<double>&, const DeltaDims&, double*, double*, double*, int64_t);
template void mdn_chunk_bwd<float>(const MdnInputs<float>&, const float*, const float*, const float*,
                                   const DeltaDims&, const MdnGrads<float>&, int64_t);
template void mdn_chunk_bwd<double>(const MdnInputs<double>&, const double*, const double*, const double*,
                                    const DeltaDims&, const MdnGrads<double>&, int64_t);

}  // namespace llmt::cpu
