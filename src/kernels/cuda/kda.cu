// KDA core, chunked, fp32 (layers-delta.md §6.1 F1–F7 in the per-channel form, §6.5 B1–B9), zero initial
// state. Mirrors src/kernels/cpu/kda.cpp step by step (same labels) and cuda/gdn.cu's structure: one thread
// block (kKdaThreads threads) per (batch, head) walks the chunks in order; the K x V state, the per-chunk
// [C, K] / [C, V] factors and the per-channel cumulative log-decay Γ [C, K] (double) live in global scratch
// (per block), the C x C matrices (A, 𝒯, P, ...) in dynamic shared memory. Every output and scratch element
// is computed by one thread with a fixed summation order: deterministic, no atomics.
// Numerics (§7.3): E_rj,c = exp(Γ_r,c - Γ_j,c) is formed element-wise from the double difference, only for
// j <= r (exponent <= 0), never factored into e^{Γ_r} e^{-Γ_j}, so strong decays underflow to 0 harmlessly
// instead of overflowing. (FLA's 16-token sub-chunk reference point serves tensor-core GEMMs, which this
// correctness-first kernel does not use.)
// The backward first recomputes the chunk-start states h[n] by a forward scan into scratch
// ([n_chunks, K, V] per block), then processes the chunks in reverse, carrying dS_C.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/delta_chunk.cuh"
#include "kernels/cuda/ops.cuh"

namespace llmt::cuda {
namespace {

using delta::dotf;
using delta::expd;

constexpr int kKdaThreads = 256;

using KdaArgs = delta::CoreArgs;

// Per-block view of one (batch, head): token-row pointers into the [B, T, H, *] tensors.
struct HeadView {
  const KdaArgs& a;
  int64_t b, h;
  __device__ int64_t tok(int64_t t) const { return (b * a.T + t) * a.H + h; }  // index into [B, T, H]
  __device__ const float* q(int64_t t) const { return a.q + tok(t) * a.K; }
  __device__ const float* k(int64_t t) const { return a.k + tok(t) * a.K; }
  __device__ const float* g(int64_t t) const { return a.g + tok(t) * a.K; }
  __device__ const float* v(int64_t t) const { return a.v + tok(t) * a.V; }
  __device__ const float* dO(int64_t t) const { return a.d_o + tok(t) * a.V; }
};

// The chunk's log-decays: Γ_r,c [n, K], the inclusive cumsum of g inside the chunk per channel (one thread per
// channel, in order), and β_r.
__device__ void chunk_gates(const HeadView& hv, int64_t c0, int n, double* gam, float* beta) {
  const int64_t K = hv.a.K;
  for (int64_t m = threadIdx.x; m < K; m += blockDim.x) {
    double acc = 0.0;
    for (int r = 0; r < n; ++r) gam[r * K + m] = acc += hv.g(c0 + r)[m];
  }
  for (int r = threadIdx.x; r < n; r += blockDim.x) beta[r] = hv.a.beta[hv.tok(c0 + r)];
  __syncthreads();
}

// Σ_c x_c y_c E_rj,c with E_rj,c = e^{Γ_r,c - Γ_j,c} (j <= r).
__device__ float dot_decayed(const float* x, const float* y, const double* gam, int r, int j, int64_t K) {
  float s = 0.0f;
  for (int64_t m = 0; m < K; ++m) s = fmaf(x[m] * y[m], expd(gam[r * K + m] - gam[j * K + m]), s);
  return s;
}

// F1–F3 and F4 of §6.1 for tokens [c0, c0 + n): A (kept in sA), 𝒯 (sT), Σ_c k_rc k_jc E_rj,c (sKK when
// non-null), W [n, K], and D [n, V] = U - W S0 (Δ). S0 [K, V] is the state entering the chunk.
__device__ void chunk_factors(const HeadView& hv, int64_t c0, int n, const double* gam, const float* beta, float* sA,
                              float* sT, float* sKK, const float* S0, float* W, float* D) {
  const int64_t K = hv.a.K, V = hv.a.V;
  // F1: A_rj = β_r Σ_c k_rc k_jc E_rj,c (j < r), else 0.
  for (int idx = threadIdx.x; idx < n * n; idx += blockDim.x) {
    const int r = idx / n, j = idx % n;
    const float kk = j < r ? dot_decayed(hv.k(c0 + r), hv.k(c0 + j), gam, r, j, K) : 0.0f;
    if (sKK != nullptr) sKK[idx] = kk;
    sA[idx] = beta[r] * kk;
    sT[idx] = r == j ? 1.0f : 0.0f;
  }
  __syncthreads();
  delta::tril_inverse(sA, sT, n);  // F2
  // F3: U = 𝒯 diag(β) V (into D), W = 𝒯 diag(β) (K ⊙ e^Γ).
  for (int idx = threadIdx.x; idx < n * V; idx += blockDim.x) {
    const int r = static_cast<int>(idx / V);
    const int64_t j = idx % V;
    float s = 0.0f;
    for (int i = 0; i <= r; ++i) s += sT[r * n + i] * beta[i] * hv.v(c0 + i)[j];
    D[idx] = s;
  }
  for (int idx = threadIdx.x; idx < n * K; idx += blockDim.x) {
    const int r = static_cast<int>(idx / K);
    const int64_t m = idx % K;
    float s = 0.0f;
    for (int i = 0; i <= r; ++i) s += sT[r * n + i] * beta[i] * expd(gam[i * K + m]) * hv.k(c0 + i)[m];
    W[idx] = s;
  }
  __syncthreads();
  // F4: Δ = U - W S_0, in place (element (r, j) is read and written by one thread).
  for (int idx = threadIdx.x; idx < n * V; idx += blockDim.x) {
    const int r = static_cast<int>(idx / V);
    const int64_t j = idx % V;
    float s = D[idx];
    for (int64_t m = 0; m < K; ++m) s -= W[r * K + m] * S0[m * V + j];
    D[idx] = s;
  }
  __syncthreads();
}

// F5: P_rj = Σ_c q_rc k_jc E_rj,c for j <= r, else 0 (into sP).
__device__ void chunk_p(const HeadView& hv, int64_t c0, int n, const double* gam, float* sP) {
  for (int idx = threadIdx.x; idx < n * n; idx += blockDim.x) {
    const int r = idx / n, j = idx % n;
    sP[idx] = j <= r ? dot_decayed(hv.q(c0 + r), hv.k(c0 + j), gam, r, j, hv.a.K) : 0.0f;
  }
  __syncthreads();
}

// F7: S_out = Diag(e^{Γ_C}) S_in + (K ⊙ e^{Γ_C-Γ})^T Δ (S_out may alias S_in: each element is owned by one thread).
__device__ void advance_state(const HeadView& hv, int64_t c0, int n, const double* gam, const float* D,
                              const float* S_in, float* S_out) {
  const int64_t K = hv.a.K, V = hv.a.V;
  const double* gC = gam + (n - 1) * K;
  for (int64_t idx = threadIdx.x; idx < K * V; idx += blockDim.x) {
    const int64_t m = idx / V, j = idx % V;
    float s = expd(gC[m]) * S_in[idx];
    for (int r = 0; r < n; ++r) s += expd(gC[m] - gam[r * K + m]) * hv.k(c0 + r)[m] * D[r * V + j];
    S_out[idx] = s;
  }
  __syncthreads();
}

// Floats of scratch per block, rounded up to even so that every block's Γ (doubles, at the block's start)
// stays 8-byte aligned.
__host__ __device__ size_t even(size_t floats) { return (floats + 1) / 2 * 2; }

__host__ __device__ size_t fwd_block_floats(int64_t K, int64_t V, int64_t C) {
  return even(static_cast<size_t>(2 * C * K + K * V + C * V + C * K));  // Γ (C * K doubles), S, D, W
}

// Forward: per chunk F1–F4 (chunk_factors), F5 P, F6 O = (Q ⊙ e^Γ) S_0 + P Δ, F7 state update.
// Scratch per block: Γ [C, K] (double), S [K, V], D [C, V], W [C, K]. Shared: β [C]; A/P, 𝒯 [C, C].
__global__ void __launch_bounds__(kKdaThreads) kda_chunk_fwd_kernel(KdaArgs a) {
  extern __shared__ float smem[];
  const int64_t C = a.C, K = a.K, V = a.V;
  float* beta = smem;
  float* sA = beta + C;
  float* sT = sA + C * C;
  const int64_t bh = blockIdx.x;
  const HeadView hv{a, bh / a.H, bh % a.H};
  double* gam = reinterpret_cast<double*>(a.scratch + bh * fwd_block_floats(K, V, C));
  float* S = reinterpret_cast<float*>(gam + C * K);
  float* D = S + K * V;
  float* W = D + C * V;
  for (int64_t idx = threadIdx.x; idx < K * V; idx += blockDim.x) S[idx] = 0.0f;
  __syncthreads();
  for (int64_t c0 = 0; c0 < a.T; c0 += C) {
    const int n = static_cast<int>(a.T - c0 < C ? a.T - c0 : C);
    chunk_gates(hv, c0, n, gam, beta);
    chunk_factors(hv, c0, n, gam, beta, sA, sT, nullptr, S, W, D);
    chunk_p(hv, c0, n, gam, sA);  // A is no longer needed: P takes its place
    // F6: o_r = S_0^T (q_r ⊙ e^{Γ_r}) + Σ_{i<=r} P_ri Δ_i
    for (int idx = threadIdx.x; idx < n * V; idx += blockDim.x) {
      const int r = static_cast<int>(idx / V);
      const int64_t j = idx % V;
      const float* qr = hv.q(c0 + r);
      float s = 0.0f;
      for (int64_t m = 0; m < K; ++m) s += S[m * V + j] * qr[m] * expd(gam[r * K + m]);
      for (int i = 0; i <= r; ++i) s += sA[r * n + i] * D[i * V + j];
      a.o[hv.tok(c0 + r) * V + j] = s;
    }
    __syncthreads();
    advance_state(hv, c0, n, gam, D, S, S);
  }
}

__host__ __device__ size_t bwd_block_floats(int64_t K, int64_t V, int64_t C, int64_t chunks) {
  // Γ (C * K doubles); h, dS, dS0; D, dD, XU; W, dW, XW, Z, dΓ
  return even(static_cast<size_t>(2 * C * K + chunks * K * V + 2 * K * V + 3 * C * V + 5 * C * K));
}

// Backward: a forward scan stores the chunk-start states h[n]; then B1–B9 per chunk in reverse.
// Scratch per block: Γ [C, K] (double), h [chunks, K, V], dS and dS0 [K, V] (ping-pong), D (Δ), dD (dΔ),
// XU [C, V], W, dW, XW, Z, dΓ [C, K]. Shared: β [C]; A/d𝒯/dA, 𝒯, KKE, P, dP, M1 [C, C].
__global__ void __launch_bounds__(kKdaThreads) kda_chunk_bwd_kernel(KdaArgs a) {
  extern __shared__ float smem[];
  const int64_t C = a.C, K = a.K, V = a.V;
  float* beta = smem;
  float* sA = beta + C;
  float* sT = sA + C * C;
  float* sKK = sT + C * C;
  float* sP = sKK + C * C;
  float* sDP = sP + C * C;
  float* sM1 = sDP + C * C;
  const int64_t bh = blockIdx.x;
  const HeadView hv{a, bh / a.H, bh % a.H};
  double* gam = reinterpret_cast<double*>(a.scratch + bh * bwd_block_floats(K, V, C, a.chunks));
  float* hs = reinterpret_cast<float*>(gam + C * K);
  float* dS = hs + a.chunks * K * V;
  float* dS0 = dS + K * V;
  float* D = dS0 + K * V;
  float* dD = D + C * V;
  float* XU = dD + C * V;
  float* W = XU + C * V;
  float* dW = W + C * K;
  float* XW = dW + C * K;
  float* Z = XW + C * K;
  float* dgam = Z + C * K;

  // Forward scan (FLA fwd_h): h[0] = 0, h[n+1] = F7(h[n]).
  for (int64_t idx = threadIdx.x; idx < K * V; idx += blockDim.x) {
    hs[idx] = 0.0f;
    dS[idx] = 0.0f;  // dS_C of the last chunk: no final-state gradient
  }
  __syncthreads();
  for (int64_t c = 0; c + 1 < a.chunks; ++c) {
    const int64_t c0 = c * C;
    const int n = static_cast<int>(C);  // every chunk but the last is full
    const float* S0 = hs + c * K * V;
    chunk_gates(hv, c0, n, gam, beta);
    chunk_factors(hv, c0, n, gam, beta, sA, sT, nullptr, S0, W, D);
    advance_state(hv, c0, n, gam, D, S0, hs + (c + 1) * K * V);
  }

  for (int64_t c = a.chunks - 1; c >= 0; --c) {
    const int64_t c0 = c * C;
    const int n = static_cast<int>(a.T - c0 < C ? a.T - c0 : C);
    const float* S0 = hs + c * K * V;
    chunk_gates(hv, c0, n, gam, beta);
    chunk_factors(hv, c0, n, gam, beta, sA, sT, sKK, S0, W, D);
    chunk_p(hv, c0, n, gam, sP);
    const double* gC = gam + (n - 1) * K;

    // B1: dΔ_r = Σ_{i>=r} P_ir dO_i + (k_r ⊙ e^{Γ_C-Γ_r})^T dS_C.   B3 (dP): dP_rj = dO_r·Δ_j (j <= r).
    for (int idx = threadIdx.x; idx < n * V; idx += blockDim.x) {
      const int r = static_cast<int>(idx / V);
      const int64_t j = idx % V;
      float s = 0.0f;
      for (int i = r; i < n; ++i) s += sP[i * n + r] * hv.dO(c0 + i)[j];
      const float* kr = hv.k(c0 + r);
      for (int64_t m = 0; m < K; ++m) s += expd(gC[m] - gam[r * K + m]) * kr[m] * dS[m * V + j];
      dD[idx] = s;
    }
    for (int idx = threadIdx.x; idx < n * n; idx += blockDim.x) {
      const int r = idx / n, j = idx % n;
      sDP[idx] = j <= r ? dotf(hv.dO(c0 + r), D + j * V, V) : 0.0f;
    }
    __syncthreads();

    // B2: dS_0 = Diag(e^{Γ_C}) dS_C + (Q ⊙ e^Γ)^T dO - W^T dΔ.
    for (int64_t idx = threadIdx.x; idx < K * V; idx += blockDim.x) {
      const int64_t m = idx / V, j = idx % V;
      float s = expd(gC[m]) * dS[idx];
      for (int r = 0; r < n; ++r)
        s += expd(gam[r * K + m]) * hv.q(c0 + r)[m] * hv.dO(c0 + r)[j] - W[r * K + m] * dD[r * V + j];
      dS0[idx] = s;
    }
    // B5 (dW): dW = -dΔ S_0^T.   B4 (state part): z_jc = e^{Γ_C,c-Γ_jc} (dS_C Δ_j)_c (kept as Z).
    for (int idx = threadIdx.x; idx < n * K; idx += blockDim.x) {
      const int r = static_cast<int>(idx / K);
      const int64_t m = idx % K;
      dW[idx] = -dotf(dD + r * V, S0 + m * V, V);
      Z[idx] = expd(gC[m] - gam[r * K + m]) * dotf(dS + m * V, D + r * V, V);
    }
    __syncthreads();

    // B5: X_U = 𝒯^T dΔ, X_W = 𝒯^T dW; dv = diag(β) X_U.
    delta::wy_bwd_x(sT, dD, dW, beta, n, K, V, XU, XW, a.dv + hv.tok(c0) * V, a.H * V);
    // B6 (d𝒯, into sA: A is no longer needed): d𝒯_ir = β_r (dΔ_i·v_r + dW_i·(k_r ⊙ e^{Γ_r})) for r <= i.
    for (int idx = threadIdx.x; idx < n * n; idx += blockDim.x) {
      const int i = idx / n, r = idx % n;
      float s = 0.0f;
      if (r <= i) {
        const float* kr = hv.k(c0 + r);
        float t = 0.0f;
        for (int64_t m = 0; m < K; ++m) t += dW[i * K + m] * expd(gam[r * K + m]) * kr[m];
        s = beta[r] * (dotf(dD + i * V, hv.v(c0 + r), V) + t);
      }
      sA[idx] = s;
    }
    __syncthreads();
    delta::tril_inverse_bwd(sT, sA, sM1, n);  // B6: dA = -tril_{j<r}(𝒯^T d𝒯 𝒯^T), into sA

    // Per element (r, c): dq (B3), dk (B4, B5, B7) and dΓ (B8 (i), (ii), (iii) row part, (v), (vi)):
    //   a1 = Σ_{j<=r} dP_rj k_jc E_rj,c       dq = QS + a1 with QS = e^{Γ_rc} (S_0 dO_r)_c;  dΓ += q_rc (QS + a1)
    //   a2 = Σ_{i>=r} dP_ir q_ic E_ir,c       dk += a2;  dΓ -= k_rc a2
    //   z_rc (B4 state part)                  dk += z;   dΓ -= k_rc z
    //   xw = β_r e^{Γ_rc} X_W,rc              dk += xw;  dΓ += k_rc xw
    //   a3 = β_r Σ_{j<r} dA_rj k_jc E_rj,c    dk += a3;  dΓ += k_rc a3
    //   a4 = Σ_{i>r} dA_ir β_i k_ic E_ir,c    dk += a4;  dΓ -= k_rc a4
    for (int idx = threadIdx.x; idx < n * K; idx += blockDim.x) {
      const int r = static_cast<int>(idx / K);
      const int64_t m = idx % K;
      const float qrm = hv.q(c0 + r)[m], krm = hv.k(c0 + r)[m];
      const double gr = gam[r * K + m];
      const float qs = expd(gr) * dotf(S0 + m * V, hv.dO(c0 + r), V);
      float a1 = 0.0f, a3 = 0.0f;
      for (int j = 0; j <= r; ++j) {
        const float ek = expd(gr - gam[j * K + m]) * hv.k(c0 + j)[m];
        a1 += sDP[r * n + j] * ek;
        if (j < r) a3 += sA[r * n + j] * ek;
      }
      a3 *= beta[r];
      float a2 = 0.0f, a4 = 0.0f;
      for (int i = r; i < n; ++i) {
        const float e = expd(gam[i * K + m] - gr);
        a2 += sDP[i * n + r] * hv.q(c0 + i)[m] * e;
        if (i > r) a4 += sA[i * n + r] * beta[i] * hv.k(c0 + i)[m] * e;
      }
      const float z = Z[idx], xw = beta[r] * expd(gr) * XW[idx];
      a.dq[hv.tok(c0 + r) * K + m] = qs + a1;
      a.dk[hv.tok(c0 + r) * K + m] = a2 + z + xw + a3 + a4;
      dgam[idx] = qrm * (qs + a1) + krm * (xw + a3 - a2 - z - a4);
    }
    // dβ_r = X_U,r·v_r + X_W,r·(k_r ⊙ e^{Γ_r}) (B5) + Σ_{j<r} dA_rj Σ_c k_rc k_jc E_rj,c (B7).
    for (int r = threadIdx.x; r < n; r += blockDim.x) {
      const float* kr = hv.k(c0 + r);
      float db = dotf(XU + r * V, hv.v(c0 + r), V);
      for (int64_t m = 0; m < K; ++m) db += XW[r * K + m] * expd(gam[r * K + m]) * kr[m];
      for (int j = 0; j < r; ++j) db += sA[r * n + j] * sKK[r * n + j];
      a.dbeta[hv.tok(c0 + r)] = db;
    }
    __syncthreads();
    // B8 (iii), (iv) at row C: dΓ_C,c += Σ_j k_jc z_jc + e^{Γ_C,c} Σ_v S_0[c, v] dS_C[c, v];
    // then B9: dg_t,c = Σ_{r>=t in the chunk} dΓ_r,c (one thread per channel, in order).
    for (int64_t m = threadIdx.x; m < K; m += blockDim.x) {
      float extra = expd(gC[m]) * dotf(S0 + m * V, dS + m * V, V);
      for (int j = 0; j < n; ++j) extra += hv.k(c0 + j)[m] * Z[j * K + m];
      float acc = extra;
      for (int r = n - 1; r >= 0; --r) a.dg[hv.tok(c0 + r) * K + m] = acc += dgam[r * K + m];
    }
    // dS <- dS_0 for the previous chunk.
    float* tmp = dS;
    dS = dS0;
    dS0 = tmp;
    __syncthreads();
  }
}

size_t fwd_smem_bytes(int64_t C) { return sizeof(float) * static_cast<size_t>(C + 2 * C * C); }
size_t bwd_smem_bytes(int64_t C) { return sizeof(float) * static_cast<size_t>(C + 6 * C * C); }

void check_chunk(int64_t chunk_size) {
  check(chunk_size >= 1 && chunk_size <= kKdaMaxChunk, "kda chunk (cuda): chunk_size must be in [1, {}], got {}",
        kKdaMaxChunk, chunk_size);
}

}  // namespace

size_t kda_chunk_fwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim,
                                   int64_t value_dim, int64_t chunk_size) {
  (void)seq_len;
  return sizeof(float) * static_cast<size_t>(batch * heads) * fwd_block_floats(key_dim, value_dim, chunk_size);
}

size_t kda_chunk_bwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim,
                                   int64_t value_dim, int64_t chunk_size) {
  const int64_t chunks = ceil_div(seq_len, chunk_size);
  return sizeof(float) * static_cast<size_t>(batch * heads) *
         bwd_block_floats(key_dim, value_dim, chunk_size, chunks);
}

void kda_chunk_fwd(const float* q, const float* k, const float* v, const float* g, const float* beta, int64_t batch,
                   int64_t seq_len, int64_t heads, int64_t key_dim, int64_t value_dim, int64_t chunk_size, float* o,
                   void* scratch, cudaStream_t stream) {
  check_chunk(chunk_size);
  if (batch * heads == 0 || seq_len == 0 || value_dim == 0) return;
  KdaArgs args = delta::core_args(q, k, v, g, beta, batch, seq_len, heads, key_dim, value_dim, chunk_size, scratch);
  args.o = o;
  delta::launch_per_head(kda_chunk_fwd_kernel, args, kKdaThreads, fwd_smem_bytes(chunk_size), stream);
}

void kda_chunk_bwd(const float* q, const float* k, const float* v, const float* g, const float* beta,
                   const float* d_o, int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim,
                   int64_t value_dim, int64_t chunk_size, float* dq, float* dk, float* dv, float* dg, float* dbeta,
                   void* scratch, cudaStream_t stream) {
  check_chunk(chunk_size);
  if (batch * heads == 0 || seq_len == 0) return;
  KdaArgs args = delta::core_args(q, k, v, g, beta, batch, seq_len, heads, key_dim, value_dim, chunk_size, scratch);
  args.d_o = d_o;
  args.dq = dq, args.dk = dk, args.dv = dv, args.dg = dg, args.dbeta = dbeta;
  delta::launch_per_head(kda_chunk_bwd_kernel, args, kKdaThreads, bwd_smem_bytes(chunk_size), stream);
}

}  // namespace llmt::cuda
