// Chunked GDN / Comba core of one head, CPU reference (layers-delta.md §6.1, §6.2, §6.5). Rows r, j index
// the chunk; a_r is the vector that meets k_j in A and forms W: k_r for GDN, p_r for Comba, with the row
// exponent ga_r = Γ_r (GDN) or γ^ex_r = Γ_r - g_r (Comba); Γ is the chunk-local inclusive cumsum of g.
#include "kernels/cpu/delta_scalar_chunk.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/delta_scan.h"
#include "kernels/cpu/delta_wy.h"

namespace llmt::cpu::delta {
namespace {

// Chunk-local quantities for tokens [c0, c0 + n) of one head.
struct Chunk {
  int64_t c0, n;
  Vec gam;   // [n] Γ_r: inclusive cumsum of g inside the chunk
  Vec ga;    // [n] row exponent of A and W: Γ_r (GDN) or γ^ex_r (Comba)
  Vec ak;    // [n, n] a_r·k_j for j < r
  Vec tinv;  // [n, n] 𝒯 = (I + A)^{-1}, unit lower triangular
  Vec u, w;  // [n, V] U = 𝒯 diag(β) V;  [n, K] W = 𝒯 diag(β e^{ga}) A-rows a
};

const Vec& a_rows(const ScalarHead& hd) { return hd.comba() ? hd.p : hd.k; }

// F1 / F1', F2, F3 / F3' of §6.1–6.2.
Chunk make_chunk(const ScalarHead& hd, int64_t c0, int64_t n, int64_t K, int64_t V) {
  const Vec& a = a_rows(hd);
  Chunk c{c0, n, Vec(n), Vec(n), Vec(n * n, 0.0), {}, Vec(n * V, 0.0), Vec(n * K, 0.0)};
  double acc = 0.0;
  for (int64_t r = 0; r < n; ++r) {
    c.ga[r] = acc;
    c.gam[r] = acc += hd.g[c0 + r];
  }
  if (!hd.comba()) c.ga = c.gam;
  // F1: A_rj = β_r e^{ga_r-Γ_j} a_r·k_j (j < r); the exponent is never positive (§7.1).
  Vec A(n * n, 0.0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < r; ++j) {
      c.ak[r * n + j] = dot(&a[(c0 + r) * K], &hd.k[(c0 + j) * K], K);
      A[r * n + j] = hd.beta[c0 + r] * std::exp(c.ga[r] - c.gam[j]) * c.ak[r * n + j];
    }
  c.tinv = unit_lower_inverse(A, n);
  // F3: U = 𝒯 diag(β) V, W = 𝒯 diag(β e^{ga}) a.
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i <= r; ++i) {
      const double tb = c.tinv[r * n + i] * hd.beta[c0 + i], te = tb * std::exp(c.ga[i]);
      for (int64_t j = 0; j < V; ++j) c.u[r * V + j] += tb * hd.v[(c0 + i) * V + j];
      for (int64_t m = 0; m < K; ++m) c.w[r * K + m] += te * a[(c0 + i) * K + m];
    }
  return c;
}

// F5: P_rj = e^{Γ_r-Γ_j} q_r·k_j for j <= r, else 0; [n, n].
Vec chunk_p(const ScalarHead& hd, const Chunk& c, int64_t K) {
  Vec P(c.n * c.n, 0.0);
  for (int64_t r = 0; r < c.n; ++r)
    for (int64_t j = 0; j <= r; ++j)
      P[r * c.n + j] = std::exp(c.gam[r] - c.gam[j]) * dot(&hd.q[(c.c0 + r) * K], &hd.k[(c.c0 + j) * K], K);
  return P;
}

// F7: S <- e^{Γ_C} S + (K ⊙ e^{Γ_C-Γ})^T Δ, the state leaving the chunk.
void advance_state(const ScalarHead& hd, const Chunk& c, const Vec& delta, int64_t K, int64_t V, Vec& S) {
  const double gC = c.gam[c.n - 1], aC = std::exp(gC);
  for (double& s : S) s *= aC;
  for (int64_t r = 0; r < c.n; ++r) {
    const double f = std::exp(gC - c.gam[r]);
    for (int64_t m = 0; m < K; ++m)
      for (int64_t j = 0; j < V; ++j) S[m * V + j] += f * hd.k[(c.c0 + r) * K + m] * delta[r * V + j];
  }
}

// §6.5 B1–B9 (with the Comba changes of §6.2) for one chunk. dO: the head's [T, V] output gradient; S0: the
// state entering the chunk; dS: on entry dS_C (gradient w.r.t. the state leaving the chunk), on return dS_0
// of this chunk. Writes the chunk's rows of g.dq, g.dk, g.dp, g.dv, g.dbeta, g.dg.
void chunk_bwd(const ScalarHead& hd, const Vec& dO, const Chunk& c, const Vec& S0, int64_t K, int64_t V, Vec& dS,
               ScalarGrads& g) {
  const int64_t n = c.n, c0 = c.c0;
  const double gC = c.gam[n - 1];
  const Vec delta = chunk_delta(c.u, c.w, S0, n, K, V);
  const Vec P = chunk_p(hd, c, K);
  const Vec& a_all = a_rows(hd);
  Vec& da_all = hd.comba() ? g.dp : g.dk;
  auto q = [&](int64_t r) { return &hd.q[(c0 + r) * K]; };
  auto k = [&](int64_t r) { return &hd.k[(c0 + r) * K]; };
  auto v = [&](int64_t r) { return &hd.v[(c0 + r) * V]; };
  auto a = [&](int64_t r) { return &a_all[(c0 + r) * K]; };
  auto dOr = [&](int64_t r) { return &dO[(c0 + r) * V]; };
  auto dq = [&](int64_t r) { return &g.dq[(c0 + r) * K]; };
  auto dk = [&](int64_t r) { return &g.dk[(c0 + r) * K]; };
  auto da = [&](int64_t r) { return &da_all[(c0 + r) * K]; };
  // dgam: gradient w.r.t. the inclusive Γ_r; dga: w.r.t. the row exponent ga_r (the same array for GDN).
  Vec dgam(n, 0.0), dgex(n, 0.0), tmp(std::max(K, V));
  double* dga = hd.comba() ? dgex.data() : dgam.data();

  // B1: dΔ = P^T dO + (K ⊙ e^{Γ_C-Γ}) dS_C.
  Vec ddelta(n * V, 0.0);
  add_p_transpose(P, dOr(0), n, V, ddelta);
  for (int64_t r = 0; r < n; ++r) {
    const double f = std::exp(gC - c.gam[r]);
    for (int64_t m = 0; m < K; ++m)
      for (int64_t j = 0; j < V; ++j) ddelta[r * V + j] += f * k(r)[m] * dS[m * V + j];
  }
  // B2: dS_0 = e^{Γ_C} dS_C + (Q ⊙ e^Γ)^T dO - W^T dΔ.
  Vec dS0(K * V);
  for (int64_t i = 0; i < K * V; ++i) dS0[i] = std::exp(gC) * dS[i];
  for (int64_t r = 0; r < n; ++r) {
    const double e = std::exp(c.gam[r]);
    for (int64_t m = 0; m < K; ++m)
      for (int64_t j = 0; j < V; ++j)
        dS0[m * V + j] += e * q(r)[m] * dOr(r)[j] - c.w[r * K + m] * ddelta[r * V + j];
  }
  // B3 and B8 (i), (ii): dq_r = e^{Γ_r} S_0 dO_r + Σ_{j<=r} dP_rj e^{Γ_r-Γ_j} k_j with dP_rj = dO_r·Δ_j;
  // B4 (intra part): dk_j += Σ_{r>=j} dP_rj e^{Γ_r-Γ_j} q_r.
  for (int64_t r = 0; r < n; ++r) {
    const double e = std::exp(c.gam[r]);
    for (int64_t m = 0; m < K; ++m) {
      tmp[m] = dot(&S0[m * V], dOr(r), V);
      dq(r)[m] = e * tmp[m];
    }
    dgam[r] += e * dot(q(r), tmp.data(), K);
    for (int64_t j = 0; j <= r; ++j) {
      const double dP = dot(dOr(r), &delta[j * V], V), E = std::exp(c.gam[r] - c.gam[j]);
      const double y = dP * P[r * n + j];
      dgam[r] += y;
      dgam[j] -= y;
      for (int64_t m = 0; m < K; ++m) {
        dq(r)[m] += dP * E * k(j)[m];
        dk(j)[m] += dP * E * q(r)[m];
      }
    }
  }
  // B4 (state part) and B8 (iii): with z_j = e^{Γ_C-Γ_j} (dS_C Δ_j): dk_j += z_j; dΓ_j -= k_j·z_j; dΓ_C += Σ k_j·z_j.
  for (int64_t j = 0; j < n; ++j) {
    const double f = std::exp(gC - c.gam[j]);
    for (int64_t m = 0; m < K; ++m) tmp[m] = f * dot(&dS[m * V], &delta[j * V], V);
    for (int64_t m = 0; m < K; ++m) dk(j)[m] += tmp[m];
    const double z = dot(k(j), tmp.data(), K);
    dgam[j] -= z;
    dgam[n - 1] += z;
  }
  // B8 (iv): dΓ_C += e^{Γ_C} Σ S_0 ⊙ dS_C.
  dgam[n - 1] += std::exp(gC) * dot(S0.data(), dS.data(), K * V);
  // B5 with a^d_r = e^{ga_r} a_r: dU = dΔ, dW = -dΔ S_0^T; X_U = 𝒯^T dU, X_W = 𝒯^T dW; dv = diag(β) X_U;
  // dβ_r += X_U,r·v_r + X_W,r·a^d_r; da_r += β_r e^{ga_r} X_W,r; B8 (v): dga_r += β_r X_W,r·a^d_r.
  const WyGrads x = wy_grads(c.tinv, ddelta, S0, n, K, V);
  for (int64_t r = 0; r < n; ++r) {
    const double beta = hd.beta[c0 + r], e = std::exp(c.ga[r]);
    for (int64_t j = 0; j < V; ++j) g.dv[(c0 + r) * V + j] = beta * x.XU[r * V + j];
    const double xa = e * dot(&x.XW[r * K], a(r), K);
    g.dbeta[c0 + r] = dot(&x.XU[r * V], v(r), V) + xa;
    for (int64_t m = 0; m < K; ++m) da(r)[m] += beta * e * x.XW[r * K + m];
    dga[r] += beta * xa;
  }
  // B6: d𝒯 = dU (diag(β) V)^T + dW (diag(β) a^d)^T (lower part; 𝒯 is lower triangular);
  // dA = -tril_{j<r}(𝒯^T d𝒯 𝒯^T).
  Vec dT(n * n, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t r = 0; r <= i; ++r)
      dT[i * n + r] =
          hd.beta[c0 + r] * (dot(&ddelta[i * V], v(r), V) + std::exp(c.ga[r]) * dot(&x.dW[i * K], a(r), K));
  const Vec M1 = inverse_grad(c.tinv, dT, n);
  // B7 and B8 (vi), with dA_rj and e = e^{ga_r-Γ_j}: dβ_r += Σ_j dA_rj e a_r·k_j; da_r += β_r Σ_j dA_rj e k_j;
  // dk_j += Σ_r dA_rj β_r e a_r; Y^A = dA β e a_r·k_j: +dga_r, -dΓ_j.
  for (int64_t r = 0; r < n; ++r) {
    const double beta = hd.beta[c0 + r];
    for (int64_t j = 0; j < r; ++j) {
      const double dA = inverse_grad_at(M1, c.tinv, n, r, j);
      const double e = std::exp(c.ga[r] - c.gam[j]), ak = c.ak[r * n + j];
      g.dbeta[c0 + r] += dA * e * ak;
      for (int64_t m = 0; m < K; ++m) {
        da(r)[m] += beta * dA * e * k(j)[m];
        dk(j)[m] += dA * beta * e * a(r)[m];
      }
      const double y = dA * beta * e * ak;
      dga[r] += y;
      dgam[j] -= y;
    }
  }
  // B9: dg_t = Σ_{r>=t} dΓ_r + Σ_{r>t} dγ^ex_r (inside the chunk; dgex is zero for GDN).
  double acc = 0.0;
  for (int64_t r = n - 1; r >= 0; --r) {
    acc += dgam[r];
    g.dg[c0 + r] = acc;
    acc += dgex[r];
  }
  dS.swap(dS0);
}

}  // namespace

void scalar_chunk_fwd(const ScalarHead& hd, int64_t K, int64_t V, int64_t chunk_size, Vec& out, Vec& S) {
  const int64_t T = static_cast<int64_t>(hd.g.size());
  for (int64_t c0 = 0; c0 < T; c0 += chunk_size) {
    const Chunk c = make_chunk(hd, c0, std::min(chunk_size, T - c0), K, V);
    const Vec delta = chunk_delta(c.u, c.w, S, c.n, K, V);
    // F6: O = (Q ⊙ e^Γ) S_0 + P Δ.
    for (int64_t r = 0; r < c.n; ++r) {
      double* orow = &out[(c0 + r) * V];
      read_out(S, &hd.q[(c0 + r) * K], K, V, orow);
      const double e = std::exp(c.gam[r]);
      for (int64_t j = 0; j < V; ++j) orow[j] *= e;
    }
    add_intra(chunk_p(hd, c, K), delta, c.n, V, &out[c0 * V]);
    advance_state(hd, c, delta, K, V, S);
  }
}

void scalar_chunk_bwd(const ScalarHead& hd, const Vec& dO, int64_t K, int64_t V, int64_t chunk_size,
                      ScalarGrads& g) {
  chunk_reverse(
      hd.s0, static_cast<int64_t>(hd.g.size()), chunk_size,
      [&](int64_t c0, int64_t n) { return make_chunk(hd, c0, n, K, V); },
      [&](const Chunk& c, Vec& S) { advance_state(hd, c, chunk_delta(c.u, c.w, S, c.n, K, V), K, V, S); },
      [&](const Chunk& c, const Vec& S0) { chunk_bwd(hd, dO, c, S0, K, V, g.ds0, g); });
}

}  // namespace llmt::cpu::delta
