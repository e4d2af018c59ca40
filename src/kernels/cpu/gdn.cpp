// Gated DeltaNet core, CPU reference (layers-delta.md §4.1, §6.1, §6.3–6.5).
// Each (batch, head) is copied into double buffers (rows t of q, k, v; the state S [K, V]),
// processed by direct loops, and written back.
#include "kernels/cpu/gdn.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/delta_common.h"

namespace llmt::cpu {
namespace {

using namespace delta;

// One (batch, head) slice: q, k [T, K], v [T, V], g, beta [T], s0 [K, V] (zeros when absent).
struct Head {
  Vec q, k, v, g, beta, s0;
};

// Per-head gradients, same shapes as Head.
struct HeadGrads {
  Vec dq, dk, dv, dg, dbeta, ds0;
};



template <typename T>
Head load(const GdnInputs<T>& in, const DeltaDims& d, int64_t b, int64_t h) {
  Head hd{gather(in.q, d, b, h, d.key_dim), gather(in.k, d, b, h, d.key_dim), gather(in.v, d, b, h, d.value_dim),
          gather(in.g, d, b, h, 1),         gather(in.beta, d, b, h, 1),     Vec(d.key_dim * d.value_dim, 0.0)};
  if (in.initial_state != nullptr) {
    const T* s = in.initial_state + (b * d.heads + h) * d.key_dim * d.value_dim;
    std::copy(s, s + d.key_dim * d.value_dim, hd.s0.begin());
  }
  return hd;
}


template <typename T>
void store_grads(const HeadGrads& g, const DeltaDims& d, int64_t b, int64_t h, const GdnGrads<T>& out) {
  scatter(g.dq, d, b, h, d.key_dim, out.dq);
  scatter(g.dk, d, b, h, d.key_dim, out.dk);
  scatter(g.dv, d, b, h, d.value_dim, out.dv);
  scatter(g.dg, d, b, h, 1, out.dg);
  scatter(g.dbeta, d, b, h, 1, out.dbeta);
  store_state(g.ds0, d, b, h, out.d_initial_state);
}


// One token of the recurrence, S_{t-1} -> S_t in place (layers-delta.md §4.1):
// S̄ = alpha_t S;  delta = beta_t (v_t - S̄^T k_t);  S = S̄ + k_t delta^T.
void step(const Head& hd, int64_t t, int64_t K, int64_t V, double* S, Vec& delta) {
  const double alpha = std::exp(hd.g[t]), beta = hd.beta[t];
  const double* k = &hd.k[t * K];
  for (int64_t i = 0; i < K * V; ++i) S[i] *= alpha;
  for (int64_t j = 0; j < V; ++j) {
    double sk = 0.0;
    for (int64_t c = 0; c < K; ++c) sk += S[c * V + j] * k[c];
    delta[j] = beta * (hd.v[t * V + j] - sk);
  }
  for (int64_t c = 0; c < K; ++c)
    for (int64_t j = 0; j < V; ++j) S[c * V + j] += k[c] * delta[j];
}


// Chunk-local quantities of §6.1 for tokens [c0, c0 + n) of one head; rows r, j index the chunk.
struct Chunk {
  int64_t c0, n;
  Vec gam;   // [n] Γ_r: inclusive cumsum of g inside the chunk
  Vec kk;    // [n, n] k_r·k_j for j < r
  Vec tinv;  // [n, n] 𝒯 = (I + A)^{-1}, unit lower triangular
  Vec u, w;  // [n, V] U = 𝒯 diag(β) V;  [n, K] W = 𝒯 diag(β) (K ⊙ e^Γ)
};

// F1–F3 of §6.1.
Chunk make_chunk(const Head& hd, int64_t c0, int64_t n, int64_t K, int64_t V) {
  Chunk c{c0, n, Vec(n), Vec(n * n, 0.0), Vec(n * n, 0.0), Vec(n * V, 0.0), Vec(n * K, 0.0)};
  double acc = 0.0;
  for (int64_t r = 0; r < n; ++r) c.gam[r] = acc += hd.g[c0 + r];
  // F1: A_rj = β_r e^{Γ_r-Γ_j} k_r·k_j (j < r); the exponent is never positive (§7.1).
  Vec A(n * n, 0.0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < r; ++j) {
      c.kk[r * n + j] = dot(&hd.k[(c0 + r) * K], &hd.k[(c0 + j) * K], K);
      A[r * n + j] = hd.beta[c0 + r] * std::exp(c.gam[r] - c.gam[j]) * c.kk[r * n + j];
    }
  // F2: (I + A) 𝒯 = I by forward substitution, row by row: 𝒯_r = e_r - Σ_{j<r} A_rj 𝒯_j.
  for (int64_t r = 0; r < n; ++r) {
    c.tinv[r * n + r] = 1.0;
    for (int64_t j = 0; j < r; ++j)
      for (int64_t m = 0; m <= j; ++m) c.tinv[r * n + m] -= A[r * n + j] * c.tinv[j * n + m];
  }
  // F3: U = 𝒯 diag(β) V, W = 𝒯 diag(β) (K ⊙ e^Γ).
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i <= r; ++i) {
      const double tb = c.tinv[r * n + i] * hd.beta[c0 + i], te = tb * std::exp(c.gam[i]);
      for (int64_t j = 0; j < V; ++j) c.u[r * V + j] += tb * hd.v[(c0 + i) * V + j];
      for (int64_t m = 0; m < K; ++m) c.w[r * K + m] += te * hd.k[(c0 + i) * K + m];
    }
  return c;
}

// F4: Δ = U - W S_0, [n, V]; row r is δ_r of the recurrence.
Vec chunk_delta(const Chunk& c, const Vec& S0, int64_t K, int64_t V) {
  Vec delta(c.u);
  for (int64_t r = 0; r < c.n; ++r)
    for (int64_t m = 0; m < K; ++m)
      for (int64_t j = 0; j < V; ++j) delta[r * V + j] -= c.w[r * K + m] * S0[m * V + j];
  return delta;
}

// F5: P_rj = e^{Γ_r-Γ_j} q_r·k_j for j <= r, else 0; [n, n].
Vec chunk_p(const Head& hd, const Chunk& c, int64_t K) {
  Vec P(c.n * c.n, 0.0);
  for (int64_t r = 0; r < c.n; ++r)
    for (int64_t j = 0; j <= r; ++j)
      P[r * c.n + j] = std::exp(c.gam[r] - c.gam[j]) * dot(&hd.q[(c.c0 + r) * K], &hd.k[(c.c0 + j) * K], K);
  return P;
}

// F7: S <- e^{Γ_C} S + (K ⊙ e^{Γ_C-Γ})^T Δ, the state leaving the chunk.
void advance_state(const Head& hd, const Chunk& c, const Vec& delta, int64_t K, int64_t V, Vec& S) {
  const double gC = c.gam[c.n - 1], aC = std::exp(gC);
  for (double& s : S) s *= aC;
  for (int64_t r = 0; r < c.n; ++r) {
    const double f = std::exp(gC - c.gam[r]);
    for (int64_t m = 0; m < K; ++m)
      for (int64_t j = 0; j < V; ++j) S[m * V + j] += f * hd.k[(c.c0 + r) * K + m] * delta[r * V + j];
  }
}

void check_chunk_size(int64_t chunk_size) {
  check(chunk_size >= 1, "gdn chunk: chunk_size must be >= 1, got {}", chunk_size);
}

// §6.5 B1–B9 for one chunk. dO: the head's [T, V] output gradient; S0: the state entering the chunk;
// dS: on entry dS_C (gradient w.r.t. the state leaving the chunk), on return dS_0 of this chunk.
// Writes the chunk's rows of g.dq, g.dk, g.dv, g.dbeta, g.dg.
void chunk_bwd(const Head& hd, const Vec& dO, const Chunk& c, const Vec& S0, int64_t K, int64_t V, Vec& dS,
               HeadGrads& g) {
  const int64_t n = c.n, c0 = c.c0;
  const double gC = c.gam[n - 1];
  const Vec delta = chunk_delta(c, S0, K, V);
  const Vec P = chunk_p(hd, c, K);
  auto q = [&](int64_t r) { return &hd.q[(c0 + r) * K]; };
  auto k = [&](int64_t r) { return &hd.k[(c0 + r) * K]; };
  auto v = [&](int64_t r) { return &hd.v[(c0 + r) * V]; };
  auto dOr = [&](int64_t r) { return &dO[(c0 + r) * V]; };
  auto dq = [&](int64_t r) { return &g.dq[(c0 + r) * K]; };
  auto dk = [&](int64_t r) { return &g.dk[(c0 + r) * K]; };
  Vec dgam(n, 0.0), tmp(std::max(K, V));

  // B1: dΔ = P^T dO + (K ⊙ e^{Γ_C-Γ}) dS_C.
  Vec ddelta(n * V, 0.0);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t i = r; i < n; ++i)
      for (int64_t j = 0; j < V; ++j) ddelta[r * V + j] += P[i * n + r] * dOr(i)[j];
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
  // B5: dU = dΔ, dW = -dΔ S_0^T; X_U = 𝒯^T dU, X_W = 𝒯^T dW; dv = diag(β) X_U;
  // dβ_r += X_U,r·v_r + X_W,r·K^d_r; dk_r += β_r e^{Γ_r} X_W,r; B8 (v): dΓ_r += β_r X_W,r·K^d_r.
  Vec dW(n * K, 0.0), XU(n * V, 0.0), XW(n * K, 0.0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t m = 0; m < K; ++m) dW[r * K + m] = -dot(&ddelta[r * V], &S0[m * V], V);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = r; i < n; ++i) {
      const double t = c.tinv[i * n + r];
      for (int64_t j = 0; j < V; ++j) XU[r * V + j] += t * ddelta[i * V + j];
      for (int64_t m = 0; m < K; ++m) XW[r * K + m] += t * dW[i * K + m];
    }
  for (int64_t r = 0; r < n; ++r) {
    const double beta = hd.beta[c0 + r], e = std::exp(c.gam[r]);
    for (int64_t j = 0; j < V; ++j) g.dv[(c0 + r) * V + j] = beta * XU[r * V + j];
    const double xk = e * dot(&XW[r * K], k(r), K);
    g.dbeta[c0 + r] = dot(&XU[r * V], v(r), V) + xk;
    for (int64_t m = 0; m < K; ++m) dk(r)[m] += beta * e * XW[r * K + m];
    dgam[r] += beta * xk;
  }
  // B6: d𝒯 = dU (diag(β) V)^T + dW (diag(β) K^d)^T (lower part; 𝒯 is lower triangular);
  // dA = -tril_{j<r}(𝒯^T d𝒯 𝒯^T).
  Vec dT(n * n, 0.0), M1(n * n, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t r = 0; r <= i; ++r)
      dT[i * n + r] = hd.beta[c0 + r] * (dot(&ddelta[i * V], v(r), V) + std::exp(c.gam[r]) * dot(&dW[i * K], k(r), K));
  for (int64_t a = 0; a < n; ++a)  // M1 = 𝒯^T d𝒯: both factors vanish unless i >= a and i >= b.
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = std::max(a, b); i < n; ++i) M1[a * n + b] += c.tinv[i * n + a] * dT[i * n + b];
  // B7 and B8 (vi), with dA_rj = -(M1 𝒯^T)_rj and e = e^{Γ_r-Γ_j}:
  // dβ_r += Σ_j dA_rj e k_r·k_j; dk_r += β_r Σ_j dA_rj e k_j; dk_j += Σ_r dA_rj β_r e k_r; Y^A = dA β e k_r·k_j.
  for (int64_t r = 0; r < n; ++r) {
    const double beta = hd.beta[c0 + r];
    for (int64_t j = 0; j < r; ++j) {
      double dA = 0.0;
      for (int64_t m = 0; m <= j; ++m) dA -= M1[r * n + m] * c.tinv[j * n + m];
      const double e = std::exp(c.gam[r] - c.gam[j]), kk = c.kk[r * n + j];
      g.dbeta[c0 + r] += dA * e * kk;
      for (int64_t m = 0; m < K; ++m) {
        dk(r)[m] += beta * dA * e * k(j)[m];
        dk(j)[m] += dA * beta * e * k(r)[m];
      }
      const double y = dA * beta * e * kk;
      dgam[r] += y;
      dgam[j] -= y;
    }
  }
  // B9: dg_t = Σ_{r>=t in the chunk} dΓ_r.
  double acc = 0.0;
  for (int64_t r = n - 1; r >= 0; --r) g.dg[c0 + r] = acc += dgam[r];
  dS.swap(dS0);
}

}  // namespace

// S̄_t = α_t S_{t-1}; δ_t = β_t (v_t - S̄_t^T k_t); S_t = S̄_t + k_t δ_t^T; o_t = S_t^T q_t   (layers-delta.md §4.1)
template <typename T>
void gdn_recurrent_fwd(const GdnInputs<T>& in, const DeltaDims& d, T* o, T* final_state) {
  const int64_t K = d.key_dim, V = d.value_dim;
  Vec delta(V);
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h) {
      const Head hd = load(in, d, b, h);
      Vec S = hd.s0, out(d.seq_len * V);
      for (int64_t t = 0; t < d.seq_len; ++t) {
        step(hd, t, K, V, S.data(), delta);
        read_out(S, &hd.q[t * K], K, V, &out[t * V]);
      }
      scatter(out, d, b, h, V, o);
      store_state(S, d, b, h, final_state);
    }
}

// Reverse-time backward (layers-delta.md §6.4), per token t = T..1:
// dS += q_t do_t^T; dq_t = S_t do_t; e = dS^T k_t; dβ_t = e·r_t; dv_t = β_t e; dk_t = dS δ_t - β_t S̄_t e;
// dS̄ = dS - β_t k_t e^T; dg_t = Σ S̄_t ⊙ dS̄; dS = α_t dS̄.
template <typename T>
void gdn_recurrent_bwd(const GdnInputs<T>& in, const T* d_o, const T* d_final_state, const DeltaDims& d,
                       const GdnGrads<T>& grads) {
  const int64_t K = d.key_dim, V = d.value_dim, L = d.seq_len, KV = K * V;
  constexpr int64_t kSegment = 64;  // checkpoint spacing of the recomputed states
  const int64_t segments = (L + kSegment - 1) / kSegment;
  Vec delta(V), e(V), r(V), sbar(KV), states((kSegment + 1) * KV), checkpoints(segments * KV);
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h) {
      const Head hd = load(in, d, b, h);
      const Vec dO = gather(d_o, d, b, h, V);
      HeadGrads g{Vec(L * K), Vec(L * K), Vec(L * V), Vec(L), Vec(L), Vec(KV, 0.0)};
      Vec S = hd.s0;
      for (int64_t t = 0; t < L; ++t) {
        if (t % kSegment == 0) std::copy(S.begin(), S.end(), checkpoints.begin() + (t / kSegment) * KV);
        step(hd, t, K, V, S.data(), delta);
      }
      Vec& dS = g.ds0;
      if (d_final_state != nullptr) {
        const T* src = d_final_state + (b * d.heads + h) * KV;
        std::copy(src, src + KV, dS.begin());
      }
      for (int64_t seg = segments - 1; seg >= 0; --seg) {
        const int64_t t0 = seg * kSegment, t1 = std::min(L, t0 + kSegment);
        // states[i] = S_{t0+i} (the state after token t0+i-1), i = 0..t1-t0.
        std::copy(checkpoints.begin() + seg * KV, checkpoints.begin() + (seg + 1) * KV, states.begin());
        for (int64_t t = t0; t < t1; ++t) {
          double* next = &states[(t - t0 + 1) * KV];
          std::copy(next - KV, next, next);
          step(hd, t, K, V, next, delta);
        }
        for (int64_t t = t1 - 1; t >= t0; --t) {
          const double* Sprev = &states[(t - t0) * KV];
          const double* St = &states[(t - t0 + 1) * KV];
          const double* q = &hd.q[t * K];
          const double* k = &hd.k[t * K];
          const double* dout = &dO[t * V];
          const double alpha = std::exp(hd.g[t]), beta = hd.beta[t];
          for (int64_t m = 0; m < K; ++m) {
            for (int64_t j = 0; j < V; ++j) dS[m * V + j] += q[m] * dout[j];
            g.dq[t * K + m] = dot(&St[m * V], dout, V);
          }
          for (int64_t i = 0; i < KV; ++i) sbar[i] = alpha * Sprev[i];
          for (int64_t j = 0; j < V; ++j) {
            double sk = 0.0, ek = 0.0;
            for (int64_t m = 0; m < K; ++m) {
              sk += sbar[m * V + j] * k[m];
              ek += dS[m * V + j] * k[m];
            }
            r[j] = hd.v[t * V + j] - sk;
            e[j] = ek;
          }
          g.dbeta[t] = dot(e.data(), r.data(), V);
          for (int64_t j = 0; j < V; ++j) g.dv[t * V + j] = beta * e[j];
          for (int64_t m = 0; m < K; ++m)
            g.dk[t * K + m] = beta * (dot(&dS[m * V], r.data(), V) - dot(&sbar[m * V], e.data(), V));
          double dg = 0.0;
          for (int64_t m = 0; m < K; ++m)
            for (int64_t j = 0; j < V; ++j) {
              const double dsbar = dS[m * V + j] - beta * k[m] * e[j];
              dg += sbar[m * V + j] * dsbar;
              dS[m * V + j] = alpha * dsbar;
            }
          g.dg[t] = dg;
        }
      }
      store_grads(g, d, b, h, grads);
    }
}

// Chunked forward, per chunk: F1–F3 (make_chunk), F4 Δ = U - W S_0, F5/F6 O = (Q ⊙ e^Γ) S_0 + P Δ,
// F7 state update   (layers-delta.md §6.1, §6.3)
template <typename T>
void gdn_chunk_fwd(const GdnInputs<T>& in, const DeltaDims& d, T* o, T* final_state, int64_t chunk_size) {
  check_chunk_size(chunk_size);
  const int64_t K = d.key_dim, V = d.value_dim;
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h) {
      const Head hd = load(in, d, b, h);
      Vec S = hd.s0, out(d.seq_len * V, 0.0);
      for (int64_t c0 = 0; c0 < d.seq_len; c0 += chunk_size) {
        const Chunk c = make_chunk(hd, c0, std::min(chunk_size, d.seq_len - c0), K, V);
        const Vec delta = chunk_delta(c, S, K, V);
        const Vec P = chunk_p(hd, c, K);
        for (int64_t r = 0; r < c.n; ++r) {
          double* orow = &out[(c0 + r) * V];
          read_out(S, &hd.q[(c0 + r) * K], K, V, orow);
          const double e = std::exp(c.gam[r]);
          for (int64_t j = 0; j < V; ++j) orow[j] *= e;
          for (int64_t i = 0; i <= r; ++i)
            for (int64_t j = 0; j < V; ++j) orow[j] += P[r * c.n + i] * delta[i * V + j];
        }
        advance_state(hd, c, delta, K, V, S);
      }
      scatter(out, d, b, h, V, o);
      store_state(S, d, b, h, final_state);
    }
}

// Chunked backward: recompute the chunk-start states h[n] (FLA fwd_h), then B1–B9 chunk by chunk in
// reverse, carrying dS_C   (layers-delta.md §6.5)
template <typename T>
void gdn_chunk_bwd(const GdnInputs<T>& in, const T* d_o, const T* d_final_state, const DeltaDims& d,
                   const GdnGrads<T>& grads, int64_t chunk_size) {
  check_chunk_size(chunk_size);
  const int64_t K = d.key_dim, V = d.value_dim, L = d.seq_len, KV = K * V;
  const int64_t chunks = (L + chunk_size - 1) / chunk_size;
  Vec starts(chunks * KV);
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h) {
      const Head hd = load(in, d, b, h);
      const Vec dO = gather(d_o, d, b, h, V);
      HeadGrads g{Vec(L * K, 0.0), Vec(L * K, 0.0), Vec(L * V, 0.0), Vec(L, 0.0), Vec(L, 0.0), Vec(KV, 0.0)};
      Vec S = hd.s0;
      for (int64_t n = 0; n < chunks; ++n) {
        std::copy(S.begin(), S.end(), starts.begin() + n * KV);
        const Chunk c = make_chunk(hd, n * chunk_size, std::min(chunk_size, L - n * chunk_size), K, V);
        advance_state(hd, c, chunk_delta(c, S, K, V), K, V, S);
      }
      Vec& dS = g.ds0;
      if (d_final_state != nullptr) {
        const T* src = d_final_state + (b * d.heads + h) * KV;
        std::copy(src, src + KV, dS.begin());
      }
      for (int64_t n = chunks - 1; n >= 0; --n) {
        const Chunk c = make_chunk(hd, n * chunk_size, std::min(chunk_size, L - n * chunk_size), K, V);
        const Vec S0(starts.begin() + n * KV, starts.begin() + (n + 1) * KV);
        chunk_bwd(hd, dO, c, S0, K, V, dS, g);
      }
      store_grads(g, d, b, h, grads);
    }
}

template void gdn_recurrent_fwd<float>(const GdnInputs<float>&, const DeltaDims&, float*, float*);
template void gdn_recurrent_fwd<double>(const GdnInputs<double>&, const DeltaDims&, double*, double*);
template void gdn_recurrent_bwd<float>(const GdnInputs<float>&, const float*, const float*, const DeltaDims&,
                                       const GdnGrads<float>&);
template void gdn_recurrent_bwd<double>(const GdnInputs<double>&, const double*, const double*, const DeltaDims&,
                                        const GdnGrads<double>&);
template void gdn_chunk_fwd<float>(const GdnInputs<float>&, const DeltaDims&, float*, float*, int64_t);
template void gdn_chunk_fwd<double>(const GdnInputs<double>&, const DeltaDims&, double*, double*, int64_t);
template void gdn_chunk_bwd<float>(const GdnInputs<float>&, const float*, const float*, const DeltaDims&,
                                   const GdnGrads<float>&, int64_t);
template void gdn_chunk_bwd<double>(const GdnInputs<double>&, const double*, const double*, const DeltaDims&,
                                    const GdnGrads<double>&, int64_t);

}  // namespace llmt::cpu
