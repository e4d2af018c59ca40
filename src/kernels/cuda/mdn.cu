// MDN (Momentum DeltaNet) core, chunked, fp32 (mdn.md §6.2 with the stable coefficients of §6.4, §6.5 for a
// shorter last chunk; backward §7.3), zero initial states. Mirrors src/kernels/cpu/mdn.cpp (mdn_chunk_fwd,
// mdn_chunk_bwd) step by step. Design (correctness first, as gdn.cu): one thread block (kMdnThreads threads)
// per (batch, head) walks the chunks in order; the two K x V states S (memory) and M (momentum) and the
// per-chunk [C, V] / [C, K] factors live in global scratch (per block), the C x C matrices (L_A, L_U, Γ, the
// key products, W, 𝒯 = (I + W)^{-1}, and the backward's dE, dW, dΓ, ...) in dynamic shared memory.
// The segment sums Σ_{u=r+1..i} log α_u and Σ_{u=j+1..r} log μ_u are formed directly in double (never as a
// difference of cumsums), so every exponent is <= 0, log μ = -inf gives exact zeros (μ = 0: GDN) and μ << α
// loses nothing to cancellation. Every output and scratch element is computed by one thread with a fixed
// summation order and block reductions use a fixed tree: deterministic, no atomics.
// The backward first recomputes the chunk-start states (S, M) by a forward scan into scratch
// ([chunks, 2, K, V] per block), then processes the chunks in reverse, carrying (dL/dS, dL/dM).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.cuh"

namespace llmt::cuda {
namespace {

/// Σ_i x[i] y[i] in index order (fp32 fma).
__device__ inline float dotf(const float* x, const float* y, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s = fmaf(x[i], y[i], s);
  return s;
}

/// (I + W) 𝒯 = I by forward substitution, row by row: 𝒯_r,m = -Σ_{m<=j<r} W_rj 𝒯_jm (m < r).
/// sW [n, n] strictly lower; sT [n, n] must hold the identity on entry. Reached by all threads (barriers).
__device__ inline void tril_inverse(const float* sW, float* sT, int n) {
  for (int r = 1; r < n; ++r) {
    for (int m = threadIdx.x; m < r; m += blockDim.x) {
      float s = 0.0f;
      for (int j = m; j < r; ++j) s -= sW[r * n + j] * sT[j * n + m];
      sT[r * n + m] = s;
    }
    __syncthreads();
  }
}

/// Launches kernel<<<B * H blocks, threads, smem>>>(args) after allowing `smem` bytes of dynamic shared memory.
template <typename Kernel, typename Args>
void launch_per_head(Kernel kernel, const Args& args, int threads, size_t smem, cudaStream_t stream) {
  LLMT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<static_cast<unsigned>(args.B * args.H), threads, smem, stream>>>(args);
  LLMT_CUDA_CHECK_LAUNCH();
}

constexpr int kMdnThreads = 256;

// Arguments of the MDN kernels: q, k [B, T, H, K]; v, o, d_o [B, T, H, V]; la (log α), beta, lm (log μ),
// eta [B, T, H]; gradients shaped as their inputs; chunks = ceil(T / C); per-block scratch. The forward leaves
// d_o and the gradients null, the backward o.
struct MdnArgs {
  const float *q, *k, *v, *la, *beta, *lm, *eta, *d_o;
  int64_t B, T, H, K, V, C, chunks;
  float *o, *dq, *dk, *dv, *dla, *dbeta, *dlm, *deta;
  float* scratch;
};

// Per-block view of one (batch, head): token-row pointers into the [B, T, H, *] tensors.
struct HeadView {
  const MdnArgs& a;
  int64_t b, h;
  __device__ int64_t tok(int64_t t) const { return (b * a.T + t) * a.H + h; }  // index into [B, T, H]
  __device__ const float* q(int64_t t) const { return a.q + tok(t) * a.K; }
  __device__ const float* k(int64_t t) const { return a.k + tok(t) * a.K; }
  __device__ const float* v(int64_t t) const { return a.v + tok(t) * a.V; }
  __device__ const float* dO(int64_t t) const { return a.d_o + tok(t) * a.V; }
};

// The chunk-local coefficients in shared memory (mdn.md §6.1, §6.4; 0-based rows, row -1 is the chunk-start
// state). Vectors [C]: la, lm, beta, eta as loaded; alpha = e^{la}; abar_i = e^{Σ_{u<=i} la_u},
// mbar_i = e^{Σ_{u<=i} lm_u}; bb = L_A (β ⊙ μ̄). Matrices [n, n] (row stride n): LA[i,r] = e^{Σ_{u=r+1..i} la_u}
// (r <= i), LU[r,j] likewise with lm (j <= r), G = Γ = L_A Diag(β) L_U, QK[i,j] = q_i·k̂_j (j <= i),
// PK[i,j] = p_i·k̂_j (j < i) with p = α k, k̂ = η k; W = (P K̂^T) ⊙ Γ⁻ (Γ shifted down one row) and
// T = (I + W)^{-1}.
struct ChunkSmem {
  float *la, *lm, *beta, *eta, *alpha, *abar, *mbar, *bb;
  float *LA, *LU, *G, *QK, *PK, *W, *T;
};
constexpr int kChunkVectors = 8, kChunkMatrices = 7;

// Carves a ChunkSmem from `s` (kChunkVectors * C + kChunkMatrices * C * C floats); returns the first float after it.
__device__ float* carve_chunk(float* s, int64_t C, ChunkSmem& cs) {
  float** vectors[kChunkVectors] = {&cs.la, &cs.lm, &cs.beta, &cs.eta, &cs.alpha, &cs.abar, &cs.mbar, &cs.bb};
  float** matrices[kChunkMatrices] = {&cs.LA, &cs.LU, &cs.G, &cs.QK, &cs.PK, &cs.W, &cs.T};
  for (float** v : vectors) {
    *v = s;
    s += C;
  }
  for (float** m : matrices) {
    *m = s;
    s += C * C;
  }
  return s;
}

// §6.4 for tokens [c0, c0 + n): the ChunkSmem coefficients, then 𝒯 = (I + W)^{-1} (tril_inverse).
__device__ void chunk_coeffs(const HeadView& hv, int64_t c0, int n, const ChunkSmem& cs) {
  const int64_t K = hv.a.K;
  for (int r = threadIdx.x; r < n; r += blockDim.x) {
    const int64_t t = hv.tok(c0 + r);
    cs.la[r] = hv.a.la[t];
    cs.lm[r] = hv.a.lm[t];
    cs.beta[r] = hv.a.beta[t];
    cs.eta[r] = hv.a.eta[t];
    cs.alpha[r] = expf(cs.la[r]);
  }
  __syncthreads();
  // Segment sums in double, summed u = r+1..i in order (as the CPU), exponentiated in fp32.
  for (int idx = threadIdx.x; idx < n * n; idx += blockDim.x) {
    const int i = idx / n, r = idx % n;
    float fa = 0.0f, fu = 0.0f;
    if (r <= i) {
      double sa = 0.0, su = 0.0;
      for (int u = r + 1; u <= i; ++u) {
        sa += cs.la[u];
        su += cs.lm[u];
      }
      fa = r == i ? 1.0f : expf(static_cast<float>(sa));
      fu = r == i ? 1.0f : expf(static_cast<float>(su));
    }
    cs.LA[idx] = fa;
    cs.LU[idx] = fu;
  }
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    double sa = 0.0, su = 0.0;
    for (int u = 0; u <= i; ++u) {
      sa += cs.la[u];
      su += cs.lm[u];
    }
    cs.abar[i] = expf(static_cast<float>(sa));
    cs.mbar[i] = expf(static_cast<float>(su));
  }
  __syncthreads();
  // Γ_ij = Σ_{r=j..i} L_A[i,r] β_r L_U[r,j];  b_i = Σ_{r<=i} L_A[i,r] β_r μ̄_r;  the key products.
  for (int idx = threadIdx.x; idx < n * n; idx += blockDim.x) {
    const int i = idx / n, j = idx % n;
    float g = 0.0f, qk = 0.0f, pk = 0.0f;
    if (j <= i) {
      for (int r = j; r <= i; ++r) g += cs.LA[i * n + r] * cs.beta[r] * cs.LU[r * n + j];
      qk = cs.eta[j] * dotf(hv.q(c0 + i), hv.k(c0 + j), K);
      if (j < i) pk = cs.alpha[i] * cs.eta[j] * dotf(hv.k(c0 + i), hv.k(c0 + j), K);
    }
    cs.G[idx] = g;
    cs.QK[idx] = qk;
    cs.PK[idx] = pk;
  }
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    float s = 0.0f;
    for (int r = 0; r <= i; ++r) s += cs.LA[i * n + r] * cs.beta[r] * cs.mbar[r];
    cs.bb[i] = s;
  }
  __syncthreads();
  // W_ij = Γ_{i-1,j} p_i·k̂_j (j < i); 𝒯 starts as the identity.
  for (int idx = threadIdx.x; idx < n * n; idx += blockDim.x) {
    const int i = idx / n, j = idx % n;
    cs.W[idx] = j < i ? cs.G[(i - 1) * n + j] * cs.PK[idx] : 0.0f;
    cs.T[idx] = i == j ? 1.0f : 0.0f;
  }
  __syncthreads();
  tril_inverse(cs.W, cs.T, n);
}

// Ṽ [n, V] = 𝒯 R with R_i = v_i - ᾱ_{i-1} S_0^T p_i + b_{i-1} M_0^T p_i (§6.2; ᾱ_{-1} = 1, b_{-1} = 0).
// R [n, V] is scratch. S0, M0 [K, V]: the states entering the chunk.
__device__ void residuals(const HeadView& hv, int64_t c0, int n, const ChunkSmem& cs, const float* S0,
                          const float* M0, float* R, float* VT) {
  const int64_t K = hv.a.K, V = hv.a.V;
  for (int64_t idx = threadIdx.x; idx < n * V; idx += blockDim.x) {
    const int i = static_cast<int>(idx / V);
    const int64_t j = idx % V;
    const float* ki = hv.k(c0 + i);
    float sp = 0.0f, mp = 0.0f;
    for (int64_t m = 0; m < K; ++m) {
      sp += S0[m * V + j] * ki[m];
      mp += M0[m * V + j] * ki[m];
    }
    const float am = i > 0 ? cs.abar[i - 1] : 1.0f, bm = i > 0 ? cs.bb[i - 1] : 0.0f;
    R[idx] = hv.v(c0 + i)[j] - cs.alpha[i] * (am * sp - bm * mp);
  }
  __syncthreads();
  for (int64_t idx = threadIdx.x; idx < n * V; idx += blockDim.x) {
    const int i = static_cast<int>(idx / V);
    const int64_t j = idx % V;
    float s = 0.0f;
    for (int r = 0; r <= i; ++r) s += cs.T[i * n + r] * R[r * V + j];
    VT[idx] = s;
  }
  __syncthreads();
}

// (S, M) <- (ᾱ_n S_0 - b_n M_0 + K̂^T Diag(Γ_{n,:}) Ṽ,  μ̄_n M_0 - K̂^T Diag(L_U[n,:]) Ṽ) from the pre-chunk
// states (§6.2). S_out, M_out may alias S_in, M_in: each element is read and written by one thread.
__device__ void advance_states(const HeadView& hv, int64_t c0, int n, const ChunkSmem& cs, const float* VT,
                               const float* S_in, const float* M_in, float* S_out, float* M_out) {
  const int64_t K = hv.a.K, V = hv.a.V;
  const int last = n - 1;
  const float aC = cs.abar[last], bC = cs.bb[last], mC = cs.mbar[last];
  for (int64_t idx = threadIdx.x; idx < K * V; idx += blockDim.x) {
    const int64_t m = idx / V, j = idx % V;
    const float s0 = S_in[idx], m0 = M_in[idx];
    float s = aC * s0 - bC * m0, mm = mC * m0;
    for (int r = 0; r < n; ++r) {
      const float x = cs.eta[r] * hv.k(c0 + r)[m] * VT[r * V + j];
      s += cs.G[last * n + r] * x;
      mm -= cs.LU[last * n + r] * x;
    }
    S_out[idx] = s;
    M_out[idx] = mm;
  }
  __syncthreads();
}

// Forward: per chunk the coefficients, Ṽ, O = Diag(ᾱ) Q S_0 - Diag(b) Q M_0 + ((Q K̂^T) ⊙ Γ) Ṽ, then both
// states. Scratch per block: S, M [K, V], R, Ṽ [C, V]. Shared: one ChunkSmem.
__global__ void __launch_bounds__(kMdnThreads) mdn_chunk_fwd_kernel(MdnArgs a) {
  extern __shared__ float smem[];
  const int64_t C = a.C, K = a.K, V = a.V;
  ChunkSmem cs;
  carve_chunk(smem, C, cs);
  const int64_t bh = blockIdx.x;
  const HeadView hv{a, bh / a.H, bh % a.H};
  float* S = a.scratch + bh * (2 * K * V + 2 * C * V);
  float* M = S + K * V;
  float* R = M + K * V;
  float* VT = R + C * V;
  for (int64_t idx = threadIdx.x; idx < 2 * K * V; idx += blockDim.x) S[idx] = 0.0f;
  __syncthreads();
  for (int64_t c0 = 0; c0 < a.T; c0 += C) {
    const int n = static_cast<int>(a.T - c0 < C ? a.T - c0 : C);
    chunk_coeffs(hv, c0, n, cs);
    residuals(hv, c0, n, cs, S, M, R, VT);
    for (int64_t idx = threadIdx.x; idx < n * V; idx += blockDim.x) {
      const int i = static_cast<int>(idx / V);
      const int64_t j = idx % V;
      const float* qi = hv.q(c0 + i);
      float sq = 0.0f, mq = 0.0f;
      for (int64_t m = 0; m < K; ++m) {
        sq += S[m * V + j] * qi[m];
        mq += M[m * V + j] * qi[m];
      }
      float s = cs.abar[i] * sq - cs.bb[i] * mq;
      for (int r = 0; r <= i; ++r) s += cs.G[i * n + r] * cs.QK[i * n + r] * VT[r * V + j];
      a.o[hv.tok(c0 + i) * V + j] = s;
    }
    __syncthreads();
    advance_states(hv, c0, n, cs, VT, S, M, S, M);
  }
}

// The backward's extra shared memory after the ChunkSmem: vectors [C] dabar (dL/dᾱ), db (dL/db), dmbar
// (dL/dμ̄), dlul (dL/dL_U of the last row, from M_next), kdp (k_i·dp_i); matrices [n, n] dE, dG (dΓ),
// Y (then the segment prefix of L_A), dLU (then the segment prefix of L_U). dW reuses ChunkSmem::W.
constexpr int kBwdVectors = 5, kBwdMatrices = 4;

__host__ __device__ size_t bwd_block_floats(int64_t K, int64_t V, int64_t C, int64_t chunks) {
  return static_cast<size_t>(chunks * 2 * K * V + 4 * K * V + 4 * C * V + 8 * C * K);
}

// Backward (§7.3): a forward scan stores the chunk-start states; then per chunk in reverse
// dṼ, dR = 𝒯^T dṼ (= dv), dE, dW, the carried state gradients, dq, dp, dk̂, the coefficient gradients, and
// through Γ = L_A Diag(β) L_U, b = L_A (β ⊙ μ̄) to dβ, d log α, d log μ (segment sums of dL ⊙ L).
// Scratch per block: states [chunks, 2, K, V] (S then M per chunk), dS, dM, dS0, dM0 [K, V] (ping-pong),
// R, Ṽ, dṼ, dR [C, V], S_0 dO_i, M_0 dO_i, S_0 dR_i, M_0 dR_i, dS Ṽ_j, dM Ṽ_j, dk̂, dp [C, K].
__global__ void __launch_bounds__(kMdnThreads) mdn_chunk_bwd_kernel(MdnArgs a) {
  extern __shared__ float smem[];
  const int64_t C = a.C, K = a.K, V = a.V, KV = K * V;
  ChunkSmem cs;
  float* s = carve_chunk(smem, C, cs);
  float* dabar = s;
  float* db = dabar + C;
  float* dmbar = db + C;
  float* dlul = dmbar + C;
  float* kdp = dlul + C;
  float* dE = kdp + C;
  float* dG = dE + C * C;
  float* Y = dG + C * C;
  float* dLU = Y + C * C;
  float* dW = cs.W;
  const int64_t bh = blockIdx.x;
  const HeadView hv{a, bh / a.H, bh % a.H};
  float* hs = a.scratch + bh * bwd_block_floats(K, V, C, a.chunks);
  float* dS = hs + a.chunks * 2 * KV;
  float* dM = dS + KV;
  float* dS0 = dM + KV;
  float* dM0 = dS0 + KV;
  float* R = dM0 + KV;
  float* VT = R + C * V;
  float* dVT = VT + C * V;
  float* dR = dVT + C * V;
  float* SdO = dR + C * V;
  float* MdO = SdO + C * K;
  float* SdR = MdO + C * K;
  float* MdR = SdR + C * K;
  float* GV = MdR + C * K;
  float* HV = GV + C * K;
  float* dKH = HV + C * K;
  float* dP = dKH + C * K;

  // Forward scan: state[0] = 0, state[c+1] = advance(state[c]); no gradient into the final states.
  for (int64_t idx = threadIdx.x; idx < 2 * KV; idx += blockDim.x) {
    hs[idx] = 0.0f;
    dS[idx] = 0.0f;  // dS and dM (adjacent)
  }
  __syncthreads();
  for (int64_t c = 0; c + 1 < a.chunks; ++c) {
    const int64_t c0 = c * C;
    const int n = static_cast<int>(C);  // every chunk but the last is full
    const float* S0 = hs + c * 2 * KV;
    const float* M0 = S0 + KV;
    float* S1 = hs + (c + 1) * 2 * KV;
    chunk_coeffs(hv, c0, n, cs);
    residuals(hv, c0, n, cs, S0, M0, R, VT);
    advance_states(hv, c0, n, cs, VT, S0, M0, S1, S1 + KV);
  }

  for (int64_t c = a.chunks - 1; c >= 0; --c) {
    const int64_t c0 = c * C;
    const int n = static_cast<int>(a.T - c0 < C ? a.T - c0 : C), last = n - 1;
    const float* S0 = hs + c * 2 * KV;
    const float* M0 = S0 + KV;
    chunk_coeffs(hv, c0, n, cs);
    residuals(hv, c0, n, cs, S0, M0, R, VT);
    // ⟨S_0, dS⟩, ⟨M_0, dS⟩, ⟨M_0, dM⟩ (fixed-order block reductions).
    double s_ds = 0.0, m_ds = 0.0, m_dm = 0.0;
    for (int64_t idx = threadIdx.x; idx < KV; idx += blockDim.x) {
      s_ds += static_cast<double>(S0[idx]) * dS[idx];
      m_ds += static_cast<double>(M0[idx]) * dS[idx];
      m_dm += static_cast<double>(M0[idx]) * dM[idx];
    }
    s_ds = block_reduce(s_ds, SumOp{}, 0.0);
    m_ds = block_reduce(m_ds, SumOp{}, 0.0);
    m_dm = block_reduce(m_dm, SumOp{}, 0.0);

    // dṼ_r = Σ_{i>=r} Γ_ir (q_i·k̂_r) dO_i + Γ_{n,r} dS^T k̂_r - L_U[n,r] dM^T k̂_r.
    for (int64_t idx = threadIdx.x; idx < n * V; idx += blockDim.x) {
      const int r = static_cast<int>(idx / V);
      const int64_t j = idx % V;
      float e = 0.0f;
      for (int i = r; i < n; ++i) e += cs.G[i * n + r] * cs.QK[i * n + r] * hv.dO(c0 + i)[j];
      const float* kr = hv.k(c0 + r);
      float ts = 0.0f, tm = 0.0f;
      for (int64_t m = 0; m < K; ++m) {
        ts += kr[m] * dS[m * V + j];
        tm += kr[m] * dM[m * V + j];
      }
      dVT[idx] = e + cs.eta[r] * (cs.G[last * n + r] * ts - cs.LU[last * n + r] * tm);
    }
    __syncthreads();
    // dR = 𝒯^T dṼ (back substitution with (I + W)^T); dv = dR.
    for (int64_t idx = threadIdx.x; idx < n * V; idx += blockDim.x) {
      const int r = static_cast<int>(idx / V);
      const int64_t j = idx % V;
      float t = 0.0f;
      for (int i = r; i < n; ++i) t += cs.T[i * n + r] * dVT[i * V + j];
      dR[idx] = t;
      a.dv[hv.tok(c0 + r) * V + j] = t;
    }
    __syncthreads();
    // dE_ij = dO_i·Ṽ_j (j <= i); dW_ij = -dR_i·Ṽ_j (j < i) (into W: 𝒯 is formed).
    for (int idx = threadIdx.x; idx < n * n; idx += blockDim.x) {
      const int i = idx / n, j = idx % n;
      dE[idx] = j <= i ? dotf(hv.dO(c0 + i), VT + j * V, V) : 0.0f;
      dW[idx] = j < i ? -dotf(dR + i * V, VT + j * V, V) : 0.0f;
    }
    // Per row i and key channel m: S_0 dO_i, M_0 dO_i, S_0 dR_i, M_0 dR_i, dS Ṽ_i, dM Ṽ_i.
    for (int64_t idx = threadIdx.x; idx < n * K; idx += blockDim.x) {
      const int i = static_cast<int>(idx / K);
      const int64_t m = idx % K;
      const float* dOi = hv.dO(c0 + i);
      SdO[idx] = dotf(S0 + m * V, dOi, V);
      MdO[idx] = dotf(M0 + m * V, dOi, V);
      SdR[idx] = dotf(S0 + m * V, dR + i * V, V);
      MdR[idx] = dotf(M0 + m * V, dR + i * V, V);
      GV[idx] = dotf(dS + m * V, VT + i * V, V);
      HV[idx] = dotf(dM + m * V, VT + i * V, V);
    }
    // dS_0 = ᾱ_n dS + Σ_i ᾱ_i q_i dO_i^T - ᾱ_{i-1} p_i dR_i^T;
    // dM_0 = -b_n dS + μ̄_n dM + Σ_i -b_i q_i dO_i^T + b_{i-1} p_i dR_i^T.
    for (int64_t idx = threadIdx.x; idx < KV; idx += blockDim.x) {
      const int64_t m = idx / V, j = idx % V;
      float ss = cs.abar[last] * dS[idx], sm = -cs.bb[last] * dS[idx] + cs.mbar[last] * dM[idx];
      for (int i = 0; i < n; ++i) {
        const float am = i > 0 ? cs.abar[i - 1] : 1.0f, bm = i > 0 ? cs.bb[i - 1] : 0.0f;
        const float qo = hv.q(c0 + i)[m] * hv.dO(c0 + i)[j];
        const float pr = cs.alpha[i] * hv.k(c0 + i)[m] * dR[i * V + j];
        ss += cs.abar[i] * qo - am * pr;
        sm += -cs.bb[i] * qo + bm * pr;
      }
      dS0[idx] = ss;
      dM0[idx] = sm;
    }
    __syncthreads();

    // dΓ_ij = dE_ij (q_i·k̂_j) + dW_{i+1,j} (p_{i+1}·k̂_j) (j <= i) + [i = n-1] k̂_j·(dS Ṽ_j).
    for (int idx = threadIdx.x; idx < n * n; idx += blockDim.x) {
      const int i = idx / n, j = idx % n;
      float d = 0.0f;
      if (j <= i) {
        d = dE[idx] * cs.QK[idx];
        if (i + 1 < n) d += dW[(i + 1) * n + j] * cs.PK[(i + 1) * n + j];
        if (i == last) d += cs.eta[j] * dotf(hv.k(c0 + j), GV + j * K, K);
      }
      dG[idx] = d;
    }
    // Per row i: dᾱ_i, db_i, dμ̄_i (state terms at the last row), dL_U[n, i] from M_next.
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const float* qi = hv.q(c0 + i);
      float da = dotf(qi, SdO + i * K, K), dbi = -dotf(qi, MdO + i * K, K), dmb = 0.0f;
      if (i + 1 < n) {
        const float* kn = hv.k(c0 + i + 1);
        da -= cs.alpha[i + 1] * dotf(kn, SdR + (i + 1) * K, K);
        dbi += cs.alpha[i + 1] * dotf(kn, MdR + (i + 1) * K, K);
      }
      if (i == last) {
        da += static_cast<float>(s_ds);
        dbi -= static_cast<float>(m_ds);
        dmb = static_cast<float>(m_dm);
      }
      dabar[i] = da;
      db[i] = dbi;
      dmbar[i] = dmb;
      dlul[i] = -cs.eta[i] * dotf(hv.k(c0 + i), HV + i * K, K);
    }
    // dq_i = ᾱ_i S_0 dO_i - b_i M_0 dO_i + Σ_{j<=i} dE_ij Γ_ij k̂_j;
    // dp_i = -ᾱ_{i-1} S_0 dR_i + b_{i-1} M_0 dR_i + Σ_{j<i} dW_ij Γ_{i-1,j} k̂_j;
    // dk̂_i = Σ_{r>=i} dE_ri Γ_ri q_r + Σ_{r>i} dW_ri Γ_{r-1,i} p_r + Γ_{n,i} dS Ṽ_i - L_U[n,i] dM Ṽ_i.
    for (int64_t idx = threadIdx.x; idx < n * K; idx += blockDim.x) {
      const int i = static_cast<int>(idx / K);
      const int64_t m = idx % K;
      const float am = i > 0 ? cs.abar[i - 1] : 1.0f, bm = i > 0 ? cs.bb[i - 1] : 0.0f;
      float dq = cs.abar[i] * SdO[idx] - cs.bb[i] * MdO[idx];
      float dp = -am * SdR[idx] + bm * MdR[idx];
      for (int j = 0; j <= i; ++j) {
        const float kj = cs.eta[j] * hv.k(c0 + j)[m];
        dq += dE[i * n + j] * cs.G[i * n + j] * kj;
        if (j < i) dp += dW[i * n + j] * cs.G[(i - 1) * n + j] * kj;
      }
      float dkh = cs.G[last * n + i] * GV[idx] - cs.LU[last * n + i] * HV[idx];
      for (int r = i; r < n; ++r) {
        dkh += dE[r * n + i] * cs.G[r * n + i] * hv.q(c0 + r)[m];
        if (r > i) dkh += dW[r * n + i] * cs.G[(r - 1) * n + i] * cs.alpha[r] * hv.k(c0 + r)[m];
      }
      a.dq[hv.tok(c0 + i) * K + m] = dq;
      dP[idx] = dp;
      dKH[idx] = dkh;
    }
    __syncthreads();

    // dk = η dk̂ + α dp (p = α k, k̂ = η k); dη = k·dk̂; k·dp (for d log α).
    for (int64_t idx = threadIdx.x; idx < n * K; idx += blockDim.x) {
      const int i = static_cast<int>(idx / K);
      a.dk[hv.tok(c0 + i) * K + idx % K] = cs.eta[i] * dKH[idx] + cs.alpha[i] * dP[idx];
    }
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const float* ki = hv.k(c0 + i);
      a.deta[hv.tok(c0 + i)] = dotf(ki, dKH + i * K, K);
      kdp[i] = dotf(ki, dP + i * K, K);
    }
    // Y_ir = db_i μ̄_r + Σ_{j<=r} dΓ_ij L_U[r,j] (r <= i), so that dL_A[i,r] = β_r Y_ir.
    for (int idx = threadIdx.x; idx < n * n; idx += blockDim.x) {
      const int i = idx / n, r = idx % n;
      float y = 0.0f;
      if (r <= i) {
        y = db[i] * cs.mbar[r];
        for (int j = 0; j <= r; ++j) y += dG[i * n + j] * cs.LU[r * n + j];
      }
      Y[idx] = y;
    }
    // dL_U[r,j] = β_r Σ_{i>=r} L_A[i,r] dΓ_ij + [r = n-1] dlul_j (j <= r).
    for (int idx = threadIdx.x; idx < n * n; idx += blockDim.x) {
      const int r = idx / n, j = idx % n;
      float du = 0.0f;
      if (j <= r) {
        float t = 0.0f;
        for (int i = r; i < n; ++i) t += cs.LA[i * n + r] * dG[i * n + j];
        du = cs.beta[r] * t + (r == last ? dlul[j] : 0.0f);
      }
      dLU[idx] = du;
    }
    __syncthreads();
    // dβ_r = Σ_{i>=r} L_A[i,r] Y_ir;  dμ̄_r += β_r Σ_{i>=r} L_A[i,r] db_i.
    for (int r = threadIdx.x; r < n; r += blockDim.x) {
      float dbeta = 0.0f, dmb = 0.0f;
      for (int i = r; i < n; ++i) {
        dbeta += cs.LA[i * n + r] * Y[i * n + r];
        dmb += cs.LA[i * n + r] * db[i];
      }
      a.dbeta[hv.tok(c0 + r)] = dbeta;
      dmbar[r] += cs.beta[r] * dmb;
    }
    __syncthreads();
    // Segment prefixes, in place per row: F_A[i,u] = Σ_{r<u} dL_A[i,r] L_A[i,r], F_U[r,u] = Σ_{j<u} dL_U[r,j] L_U[r,j]
    // (u <= row).
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      float run_a = 0.0f, run_u = 0.0f;
      for (int u = 0; u <= i; ++u) {
        const float za = cs.beta[u] * Y[i * n + u] * cs.LA[i * n + u], zu = dLU[i * n + u] * cs.LU[i * n + u];
        Y[i * n + u] = run_a;
        dLU[i * n + u] = run_u;
        run_a += za;
        run_u += zu;
      }
    }
    __syncthreads();
    // d log α_u = Σ_{i>=u} (F_A[i,u] + ᾱ_i dᾱ_i) + α_u k_u·dp_u;  d log μ_u = Σ_{i>=u} (F_U[i,u] + μ̄_i dμ̄_i).
    for (int u = threadIdx.x; u < n; u += blockDim.x) {
      double ga = 0.0, gu = 0.0;
      for (int i = u; i < n; ++i) {
        ga += static_cast<double>(Y[i * n + u]) + static_cast<double>(cs.abar[i]) * dabar[i];
        gu += static_cast<double>(dLU[i * n + u]) + static_cast<double>(cs.mbar[i]) * dmbar[i];
      }
      a.dla[hv.tok(c0 + u)] = static_cast<float>(ga + static_cast<double>(cs.alpha[u]) * kdp[u]);
      a.dlm[hv.tok(c0 + u)] = static_cast<float>(gu);
    }
    // (dS, dM) <- (dS_0, dM_0) for the previous chunk.
    float* t = dS;
    dS = dS0;
    dS0 = t;
    t = dM;
    dM = dM0;
    dM0 = t;
    __syncthreads();
  }
}

size_t fwd_smem_bytes(int64_t C) {
  return sizeof(float) * static_cast<size_t>(kChunkVectors * C + kChunkMatrices * C * C);
}
size_t bwd_smem_bytes(int64_t C) {
  return fwd_smem_bytes(C) + sizeof(float) * static_cast<size_t>(kBwdVectors * C + kBwdMatrices * C * C);
}

void check_chunk(int64_t chunk_size) {
  check(chunk_size >= 1 && chunk_size <= kMdnMaxChunk, "mdn chunk (cuda): chunk_size must be in [1, {}], got {}",
        kMdnMaxChunk, chunk_size);
}

MdnArgs mdn_args(const float* q, const float* k, const float* v, const float* log_alpha, const float* beta,
                 const float* log_mu, const float* eta, int64_t batch, int64_t seq_len, int64_t heads,
                 int64_t key_dim, int64_t value_dim, int64_t chunk_size, void* scratch) {
  MdnArgs args{};
  args.q = q, args.k = k, args.v = v, args.la = log_alpha, args.beta = beta, args.lm = log_mu, args.eta = eta;
  args.B = batch, args.T = seq_len, args.H = heads, args.K = key_dim, args.V = value_dim;
  args.C = chunk_size, args.chunks = ceil_div(seq_len, chunk_size);
  args.scratch = static_cast<float*>(scratch);
  return args;
}

}  // namespace

size_t mdn_chunk_fwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim,
                                   int64_t value_dim, int64_t chunk_size) {
  (void)seq_len;
  return sizeof(float) *
         static_cast<size_t>(batch * heads * (2 * key_dim * value_dim + 2 * chunk_size * value_dim));
}

size_t mdn_chunk_bwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim,
                                   int64_t value_dim, int64_t chunk_size) {
  const int64_t chunks = ceil_div(seq_len, chunk_size);
  return sizeof(float) * static_cast<size_t>(batch * heads) *
         bwd_block_floats(key_dim, value_dim, chunk_size, chunks);
}

void mdn_chunk_fwd(const float* q, const float* k, const float* v, const float* log_alpha, const float* beta,
                   const float* log_mu, const float* eta, int64_t batch, int64_t seq_len, int64_t heads,
                   int64_t key_dim, int64_t value_dim, int64_t chunk_size, float* o, void* scratch,
                   cudaStream_t stream) {
  check_chunk(chunk_size);
  if (batch * heads == 0 || seq_len == 0 || value_dim == 0) return;
  MdnArgs args = mdn_args(q, k, v, log_alpha, beta, log_mu, eta, batch, seq_len, heads, key_dim, value_dim,
                          chunk_size, scratch);
  args.o = o;
  launch_per_head(mdn_chunk_fwd_kernel, args, kMdnThreads, fwd_smem_bytes(chunk_size), stream);
}

void mdn_chunk_bwd(const float* q, const float* k, const float* v, const float* log_alpha, const float* beta,
                   const float* log_mu, const float* eta, const float* d_o, int64_t batch, int64_t seq_len,
                   int64_t heads, int64_t key_dim, int64_t value_dim, int64_t chunk_size, float* dq, float* dk,
                   float* dv, float* dlog_alpha, float* dbeta, float* dlog_mu, float* deta, void* scratch,
                   cudaStream_t stream) {
  check_chunk(chunk_size);
  if (batch * heads == 0 || seq_len == 0) return;
  MdnArgs args = mdn_args(q, k, v, log_alpha, beta, log_mu, eta, batch, seq_len, heads, key_dim, value_dim,
                          chunk_size, scratch);
  args.d_o = d_o;
  args.dq = dq, args.dk = dk, args.dv = dv, args.dla = dlog_alpha, args.dbeta = dbeta, args.dlm = dlog_mu,
  args.deta = deta;
  launch_per_head(mdn_chunk_bwd_kernel, args, kMdnThreads, bwd_smem_bytes(chunk_size), stream);
}

}  // namespace llmt::cuda
