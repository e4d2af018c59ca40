// KDA core, CPU reference (layers-delta.md §4.3, §6.1, §6.3–6.5, §7).
// Each (batch, head) is copied into double buffers (rows t of q, k, g, v; the state S [K, V]),
// processed by direct loops, and written back. Same structure as gdn.cpp with the scalar decay
// replaced by the per-key-channel decay (rows of S decay independently).
#include "kernels/cpu/kda.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/delta_common.h"
#include "kernels/cpu/delta_recurrence.h"
#include "kernels/cpu/delta_scan.h"
#include "kernels/cpu/delta_wy.h"

namespace llmt::cpu {
namespace {

using namespace delta;

// One (batch, head) slice: q, k, g [T, K], v [T, V], beta [T], s0 [K, V] (zeros when absent).
struct Head {
  Vec q, k, v, g, beta, s0;
};

// Per-head gradients, same shapes as Head.
struct HeadGrads {
  Vec dq, dk, dv, dg, dbeta, ds0;
};

template <typename T>
Head load(const KdaInputs<T>& in, const DeltaDims& d, int64_t b, int64_t h) {
  return {gather(in.q, d, b, h, d.key_dim), gather(in.k, d, b, h, d.key_dim), gather(in.v, d, b, h, d.value_dim),
          gather(in.g, d, b, h, d.key_dim), gather(in.beta, d, b, h, 1),     load_state(in.initial_state, d, b, h)};
}

// Zeroed gradients of one head, with ds0 = dL/dS_T (zeros when d_final_state is null).
template <typename T>
HeadGrads zero_grads(const T* d_final_state, const DeltaDims& d, int64_t b, int64_t h) {
  const int64_t L = d.seq_len, K = d.key_dim, V = d.value_dim;
  return {Vec(L * K, 0.0), Vec(L * K, 0.0), Vec(L * V, 0.0), Vec(L * K, 0.0), Vec(L, 0.0),
          load_state(d_final_state, d, b, h)};
}

template <typename T>
void store_grads(const HeadGrads& g, const DeltaDims& d, int64_t b, int64_t h, const KdaGrads<T>& out) {
  scatter(g.dq, d, b, h, d.key_dim, out.dq);
  scatter(g.dk, d, b, h, d.key_dim, out.dk);
  scatter(g.dv, d, b, h, d.value_dim, out.dv);
  scatter(g.dg, d, b, h, d.key_dim, out.dg);
  scatter(g.dbeta, d, b, h, 1, out.dbeta);
  store_state(g.ds0, d, b, h, out.d_initial_state);
}

// One token of the recurrence, S_{t-1} -> S_t in place (layers-delta.md §4.3), per-channel decay.
void step(const Head& hd, int64_t t, int64_t K, int64_t V, double* S, Vec& delta) {
  decayed_step(&hd.g[t * K], 1, hd.beta[t], &hd.k[t * K], &hd.v[t * V], K, V, S, delta.data());
}

// Chunk-local quantities of §6.1 (vector form) for tokens [c0, c0 + n) of one head; rows r, j index the chunk.
// E_rj,c = exp(Γ_r,c - Γ_j,c) is evaluated directly, element-wise, and only for j <= r (exponent <= 0 for
// g <= 0): exact in double and free of the overflow that e^{Γ_r} e^{-Γ_j} would risk (§7.3). FLA's 16-token
// sub-chunk reference point is an fp32/tensor-core device and is not reproduced here.
struct Chunk {
  int64_t c0, n, K;
  Vec gam;   // [n, K] Γ_r: inclusive cumsum of g inside the chunk, per channel
  Vec kke;   // [n, n] Σ_c k_rc k_jc E_rj,c for j < r
  Vec tinv;  // [n, n] 𝒯 = (I + A)^{-1}, unit lower triangular
  Vec u, w;  // [n, V] U = 𝒯 diag(β) V;  [n, K] W = 𝒯 diag(β) (K ⊙ e^Γ)
  double E(int64_t r, int64_t j, int64_t c) const { return std::exp(gam[r * K + c] - gam[j * K + c]); }
};

// F1–F3 of §6.1.
Chunk make_chunk(const Head& hd, int64_t c0, int64_t n, int64_t K, int64_t V) {
  Chunk c{c0, n, K, Vec(n * K), Vec(n * n, 0.0), {}, Vec(n * V, 0.0), Vec(n * K, 0.0)};
  for (int64_t m = 0; m < K; ++m) {
    double acc = 0.0;
    for (int64_t r = 0; r < n; ++r) c.gam[r * K + m] = acc += hd.g[(c0 + r) * K + m];
  }
  // F1: A_rj = β_r Σ_c k_rc k_jc E_rj,c (j < r).
  Vec A(n * n, 0.0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < r; ++j) {
      double s = 0.0;
      for (int64_t m = 0; m < K; ++m) s += hd.k[(c0 + r) * K + m] * hd.k[(c0 + j) * K + m] * c.E(r, j, m);
      c.kke[r * n + j] = s;
      A[r * n + j] = hd.beta[c0 + r] * s;
    }
  c.tinv = unit_lower_inverse(A, n);
  // F3: U = 𝒯 diag(β) V, W = 𝒯 diag(β) (K ⊙ e^Γ).
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i <= r; ++i) {
      const double tb = c.tinv[r * n + i] * hd.beta[c0 + i];
      for (int64_t j = 0; j < V; ++j) c.u[r * V + j] += tb * hd.v[(c0 + i) * V + j];
      for (int64_t m = 0; m < K; ++m) c.w[r * K + m] += tb * std::exp(c.gam[i * K + m]) * hd.k[(c0 + i) * K + m];
    }
  return c;
}

// F5: P_rj = Σ_c q_rc k_jc E_rj,c for j <= r, else 0; [n, n].
Vec chunk_p(const Head& hd, const Chunk& c, int64_t K) {
  Vec P(c.n * c.n, 0.0);
  for (int64_t r = 0; r < c.n; ++r)
    for (int64_t j = 0; j <= r; ++j) {
      double s = 0.0;
      for (int64_t m = 0; m < K; ++m) s += hd.q[(c.c0 + r) * K + m] * hd.k[(c.c0 + j) * K + m] * c.E(r, j, m);
      P[r * c.n + j] = s;
    }
  return P;
}

// F7: S <- Diag(e^{Γ_C}) S + (K ⊙ e^{Γ_C-Γ})^T Δ, the state leaving the chunk.
void advance_state(const Head& hd, const Chunk& c, const Vec& delta, int64_t K, int64_t V, Vec& S) {
  const double* gC = &c.gam[(c.n - 1) * K];
  for (int64_t m = 0; m < K; ++m) {
    const double aC = std::exp(gC[m]);
    for (int64_t j = 0; j < V; ++j) S[m * V + j] *= aC;
  }
  for (int64_t r = 0; r < c.n; ++r)
    for (int64_t m = 0; m < K; ++m) {
      const double f = std::exp(gC[m] - c.gam[r * K + m]) * hd.k[(c.c0 + r) * K + m];
      for (int64_t j = 0; j < V; ++j) S[m * V + j] += f * delta[r * V + j];
    }
}

// §6.5 B1–B9 (per-channel form) for one chunk. dO: the head's [T, V] output gradient; S0: the state entering
// the chunk; dS: on entry dS_C (gradient w.r.t. the state leaving the chunk), on return dS_0 of this chunk.
// Writes the chunk's rows of g.dq, g.dk, g.dv, g.dbeta, g.dg (dq, dk must be zero on entry).
void chunk_bwd(const Head& hd, const Vec& dO, const Chunk& c, const Vec& S0, int64_t K, int64_t V, Vec& dS,
               HeadGrads& g) {
  const int64_t n = c.n, c0 = c.c0;
  const double* gC = &c.gam[(n - 1) * K];
  const Vec delta = chunk_delta(c.u, c.w, S0, n, K, V);
  const Vec P = chunk_p(hd, c, K);
  auto q = [&](int64_t r) { return &hd.q[(c0 + r) * K]; };
  auto k = [&](int64_t r) { return &hd.k[(c0 + r) * K]; };
  auto v = [&](int64_t r) { return &hd.v[(c0 + r) * V]; };
  auto dOr = [&](int64_t r) { return &dO[(c0 + r) * V]; };
  auto dq = [&](int64_t r) { return &g.dq[(c0 + r) * K]; };
  auto dk = [&](int64_t r) { return &g.dk[(c0 + r) * K]; };
  auto gam = [&](int64_t r, int64_t m) { return c.gam[r * K + m]; };
  Vec dgam(n * K, 0.0);
  auto dG = [&](int64_t r) { return &dgam[r * K]; };

  // B1: dΔ = P^T dO + (K ⊙ e^{Γ_C-Γ}) dS_C.
  Vec ddelta(n * V, 0.0);
  add_p_transpose(P, dOr(0), n, V, ddelta);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t m = 0; m < K; ++m) {
      const double f = std::exp(gC[m] - gam(r, m)) * k(r)[m];
      for (int64_t j = 0; j < V; ++j) ddelta[r * V + j] += f * dS[m * V + j];
    }
  }
  // B2: dS_0 = Diag(e^{Γ_C}) dS_C + (Q ⊙ e^Γ)^T dO - W^T dΔ.
  Vec dS0(K * V);
  for (int64_t m = 0; m < K; ++m)
    for (int64_t j = 0; j < V; ++j) dS0[m * V + j] = std::exp(gC[m]) * dS[m * V + j];
  for (int64_t r = 0; r < n; ++r)
    for (int64_t m = 0; m < K; ++m) {
      const double qe = std::exp(gam(r, m)) * q(r)[m], w = c.w[r * K + m];
      for (int64_t j = 0; j < V; ++j) dS0[m * V + j] += qe * dOr(r)[j] - w * ddelta[r * V + j];
    }
  // B3 and B8 (i), (ii): dq_rc = e^{Γ_rc} (S_0 dO_r)_c + Σ_{j<=r} dP_rj k_jc E_rj,c with dP_rj = dO_r·Δ_j;
  // B4 (intra part): dk_jc += Σ_{r>=j} dP_rj q_rc E_rj,c; Y^P_rjc = dP_rj q_rc k_jc E_rj,c: +Y at row r, -Y at row j.
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t m = 0; m < K; ++m) {
      const double y = std::exp(gam(r, m)) * dot(&S0[m * V], dOr(r), V);
      dq(r)[m] = y;
      dG(r)[m] += q(r)[m] * y;
    }
    for (int64_t j = 0; j <= r; ++j) {
      const double dP = dot(dOr(r), &delta[j * V], V);
      for (int64_t m = 0; m < K; ++m) {
        const double e = dP * c.E(r, j, m);
        dq(r)[m] += e * k(j)[m];
        dk(j)[m] += e * q(r)[m];
        const double y = e * q(r)[m] * k(j)[m];
        dG(r)[m] += y;
        dG(j)[m] -= y;
      }
    }
  }
  // B4 (state part) and B8 (iii): z_jc = e^{Γ_C,c-Γ_jc} (dS_C Δ_j)_c: dk_jc += z_jc; dΓ_jc -= k_jc z_jc;
  // dΓ_C,c += Σ_j k_jc z_jc. B8 (iv): dΓ_C,c += e^{Γ_C,c} Σ_v S_0[c, v] dS_C[c, v].
  for (int64_t j = 0; j < n; ++j)
    for (int64_t m = 0; m < K; ++m) {
      const double z = std::exp(gC[m] - gam(j, m)) * dot(&dS[m * V], &delta[j * V], V);
      dk(j)[m] += z;
      dG(j)[m] -= k(j)[m] * z;
      dG(n - 1)[m] += k(j)[m] * z;
    }
  for (int64_t m = 0; m < K; ++m) dG(n - 1)[m] += std::exp(gC[m]) * dot(&S0[m * V], &dS[m * V], V);
  // B5: dU = dΔ, dW = -dΔ S_0^T; X_U = 𝒯^T dU, X_W = 𝒯^T dW; dv = diag(β) X_U;
  // dβ_r += X_U,r·v_r + X_W,r·K^d_r; dk_rc += β_r e^{Γ_rc} X_W,rc; B8 (v): dΓ_rc += β_r X_W,rc K^d_rc.
  const WyGrads x = wy_grads(c.tinv, ddelta, S0, n, K, V);
  const Vec &dW = x.dW, &XU = x.XU, &XW = x.XW;
  Vec Kd(n * K);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t m = 0; m < K; ++m) Kd[r * K + m] = std::exp(gam(r, m)) * k(r)[m];
  for (int64_t r = 0; r < n; ++r) {
    const double beta = hd.beta[c0 + r];
    for (int64_t j = 0; j < V; ++j) g.dv[(c0 + r) * V + j] = beta * XU[r * V + j];
    g.dbeta[c0 + r] = dot(&XU[r * V], v(r), V) + dot(&XW[r * K], &Kd[r * K], K);
    for (int64_t m = 0; m < K; ++m) {
      const double x = beta * XW[r * K + m];
      dk(r)[m] += x * std::exp(gam(r, m));
      dG(r)[m] += x * Kd[r * K + m];
    }
  }
  // B6: d𝒯 = dU (diag(β) V)^T + dW (diag(β) K^d)^T (lower part; 𝒯 is lower triangular);
  // dA = -tril_{j<r}(𝒯^T d𝒯 𝒯^T).
  Vec dT(n * n, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t r = 0; r <= i; ++r)
      dT[i * n + r] = hd.beta[c0 + r] * (dot(&ddelta[i * V], v(r), V) + dot(&dW[i * K], &Kd[r * K], K));
  const Vec M1 = inverse_grad(c.tinv, dT, n);
  // B7 and B8 (vi), with dA_rj = -(M1 𝒯^T)_rj: dβ_r += Σ_j dA_rj Σ_c k_rc k_jc E_rj,c;
  // dk_rc += β_r Σ_j dA_rj k_jc E_rj,c; dk_jc += Σ_r dA_rj β_r k_rc E_rj,c;
  // Y^A_rjc = dA_rj β_r k_rc k_jc E_rj,c: +Y at row r, -Y at row j.
  for (int64_t r = 0; r < n; ++r) {
    const double beta = hd.beta[c0 + r];
    for (int64_t j = 0; j < r; ++j) {
      const double dA = inverse_grad_at(M1, c.tinv, n, r, j);
      g.dbeta[c0 + r] += dA * c.kke[r * n + j];
      for (int64_t m = 0; m < K; ++m) {
        const double e = dA * beta * c.E(r, j, m);
        dk(r)[m] += e * k(j)[m];
        dk(j)[m] += e * k(r)[m];
        const double y = e * k(r)[m] * k(j)[m];
        dG(r)[m] += y;
        dG(j)[m] -= y;
      }
    }
  }
  // B9: dg_t,c = Σ_{r>=t in the chunk} dΓ_r,c.
  for (int64_t m = 0; m < K; ++m) {
    double acc = 0.0;
    for (int64_t r = n - 1; r >= 0; --r) g.dg[(c0 + r) * K + m] = acc += dG(r)[m];
  }
  dS.swap(dS0);
}

}  // namespace

// S̄_t = Diag(e^{g_t}) S_{t-1}; δ_t = β_t (v_t - S̄_t^T k_t); S_t = S̄_t + k_t δ_t^T; o_t = S_t^T q_t
// (layers-delta.md §4.3)
template <typename T>
void kda_recurrent_fwd(const KdaInputs<T>& in, const DeltaDims& d, T* o, T* final_state) {
  const int64_t K = d.key_dim, V = d.value_dim;
  Vec delta(V);
  recurrent_forward(
      d, [&](int64_t b, int64_t h) { return load(in, d, b, h); },
      [&](const Head& hd, int64_t t, double* St) { step(hd, t, K, V, St, delta); }, o, final_state);
}

// Reverse-time backward (layers-delta.md §6.4, KDA), per token t = T..1: decayed_step_bwd with the
// per-channel decay.
template <typename T>
void kda_recurrent_bwd(const KdaInputs<T>& in, const T* d_o, const T* d_final_state, const DeltaDims& d,
                       const KdaGrads<T>& grads) {
  const int64_t K = d.key_dim, V = d.value_dim;
  Vec delta(V);
  TokenScratch w{Vec(K * V), Vec(V), Vec(V)};
  for_each_head(d, [&](int64_t b, int64_t h) {
    const Head hd = load(in, d, b, h);
    const Vec dO = gather(d_o, d, b, h, V);
    HeadGrads g = zero_grads(d_final_state, d, b, h);
    recurrent_reverse(
        hd.s0, d.seq_len, K * V, [&](int64_t t, double* S) { step(hd, t, K, V, S, delta); },
        [&](int64_t t, const double* Sprev, const double* St) {
          decayed_step_bwd(&hd.g[t * K], 1, hd.beta[t], &hd.q[t * K], &hd.k[t * K], &hd.v[t * V], &dO[t * V], Sprev,
                           St, K, V, g.ds0.data(), w,
                           {&g.dq[t * K], &g.dk[t * K], &g.dv[t * V], &g.dbeta[t], &g.dg[t * K]});
        });
    store_grads(g, d, b, h, grads);
  });
}

// Chunked forward, per chunk: F1–F3 (make_chunk), F4 Δ = U - W S_0, F5/F6 O = (Q ⊙ e^Γ) S_0 + P Δ,
// F7 state update   (layers-delta.md §6.1, §6.3 KDA)
template <typename T>
void kda_chunk_fwd(const KdaInputs<T>& in, const DeltaDims& d, T* o, T* final_state, int64_t chunk_size) {
  check_chunk_size("kda", chunk_size);
  const int64_t K = d.key_dim, V = d.value_dim;
  Vec qe(K);
  for_each_head(d, [&](int64_t b, int64_t h) {
    const Head hd = load(in, d, b, h);
    Vec S = hd.s0, out(d.seq_len * V, 0.0);
    for (int64_t c0 = 0; c0 < d.seq_len; c0 += chunk_size) {
      const Chunk c = make_chunk(hd, c0, std::min(chunk_size, d.seq_len - c0), K, V);
      const Vec delta = chunk_delta(c.u, c.w, S, c.n, K, V);
      for (int64_t r = 0; r < c.n; ++r) {
        for (int64_t m = 0; m < K; ++m) qe[m] = std::exp(c.gam[r * K + m]) * hd.q[(c0 + r) * K + m];
        read_out(S, qe.data(), K, V, &out[(c0 + r) * V]);
      }
      add_intra(chunk_p(hd, c, K), delta, c.n, V, &out[c0 * V]);
      advance_state(hd, c, delta, K, V, S);
    }
    scatter(out, d, b, h, V, o);
    store_state(S, d, b, h, final_state);
  });
}

// Chunked backward: recompute the chunk-start states h[n] (FLA fwd_h), then B1–B9 chunk by chunk in
// reverse, carrying dS_C   (layers-delta.md §6.5)
template <typename T>
void kda_chunk_bwd(const KdaInputs<T>& in, const T* d_o, const T* d_final_state, const DeltaDims& d,
                   const KdaGrads<T>& grads, int64_t chunk_size) {
  check_chunk_size("kda", chunk_size);
  const int64_t K = d.key_dim, V = d.value_dim;
  for_each_head(d, [&](int64_t b, int64_t h) {
    const Head hd = load(in, d, b, h);
    const Vec dO = gather(d_o, d, b, h, V);
    HeadGrads g = zero_grads(d_final_state, d, b, h);
    chunk_reverse(
        hd.s0, d.seq_len, chunk_size, [&](int64_t c0, int64_t n) { return make_chunk(hd, c0, n, K, V); },
        [&](const Chunk& c, Vec& S) { advance_state(hd, c, chunk_delta(c.u, c.w, S, c.n, K, V), K, V, S); },
        [&](const Chunk& c, const Vec& S0) { chunk_bwd(hd, dO, c, S0, K, V, g.ds0, g); });
    store_grads(g, d, b, h, grads);
  });
}

template void kda_recurrent_fwd<float>(const KdaInputs<float>&, const DeltaDims&, float*, float*);
template void kda_recurrent_fwd<double>(const KdaInputs<double>&, const DeltaDims&, double*, double*);
template void kda_recurrent_bwd<float>(const KdaInputs<float>&, const float*, const float*, const DeltaDims&,
                                       const KdaGrads<float>&);
template void kda_recurrent_bwd<double>(const KdaInputs<double>&, const double*, const double*, const DeltaDims&,
                                        const KdaGrads<double>&);
template void kda_chunk_fwd<float>(const KdaInputs<float>&, const DeltaDims&, float*, float*, int64_t);
template void kda_chunk_fwd<double>(const KdaInputs<double>&, const DeltaDims&, double*, double*, int64_t);
template void kda_chunk_bwd<float>(const KdaInputs<float>&, const float*, const float*, const DeltaDims&,
                                   const KdaGrads<float>&, int64_t);
template void kda_chunk_bwd<double>(const KdaInputs<double>&, const double*, const double*, const DeltaDims&,
                                    const KdaGrads<double>&, int64_t);

}  // namespace llmt::cpu
