// Gated DeltaNet core, chunked, fp32 (layers-delta.md §6.1 F1–F7, §6.5 B1–B9), zero initial
// state. Mirrors src/kernels/cpu/gdn.cpp step by step (same labels). Design (correctness first):
// one thread block (kGdnThreads threads) per (batch, head) walks the chunks in order; the
// K x V state and the per-chunk [C, K] / [C, V] factors live in global scratch (per block,
// so K, V up to 256 x 512 fit), the C x C matrices (A, 𝒯, P, ...) in dynamic shared memory.
// Every output element and every scratch element is computed by one thread with a fixed
// summation order, and block reductions use a fixed tree: deterministic, no atomics.
// The backward first recomputes the chunk-start states h[n] by a forward scan into scratch
// ([n_chunks, K, V] per block), then processes the chunks in reverse, carrying dS_C.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/delta_chunk.cuh"
#include "kernels/cuda/ops.cuh"

namespace llmt::cuda {
namespace {

using delta::dotf;
using delta::expd;

constexpr int kGdnThreads = 256;

using GdnArgs = delta::CoreArgs;

// Per-block view of one (batch, head): token-row pointers into the [B, T, H, *] tensors.
struct HeadView {
  const GdnArgs& a;
  int64_t b, h;
  __device__ int64_t tok(int64_t t) const { return (b * a.T + t) * a.H + h; }  // index into [B, T, H]
  __device__ const float* q(int64_t t) const { return a.q + tok(t) * a.K; }
  __device__ const float* k(int64_t t) const { return a.k + tok(t) * a.K; }
  __device__ const float* v(int64_t t) const { return a.v + tok(t) * a.V; }
  __device__ const float* dO(int64_t t) const { return a.d_o + tok(t) * a.V; }
};

// Chunk scalars: Γ_r, the inclusive cumsum of g inside the chunk (thread 0, in order), and β_r.
__device__ void chunk_scalars(const HeadView& hv, int64_t c0, int n, double* gam, float* beta) {
  if (threadIdx.x == 0) {
    double acc = 0.0;
    for (int r = 0; r < n; ++r) gam[r] = acc += hv.a.g[hv.tok(c0 + r)];
  }
  for (int r = threadIdx.x; r < n; r += blockDim.x) beta[r] = hv.a.beta[hv.tok(c0 + r)];
  __syncthreads();
}

// F1–F3 and F4 of §6.1 for tokens [c0, c0 + n): A (kept in sA), 𝒯 (sT), k_r·k_j (sKK when non-null),
// W [n, K], and D [n, V] = U - W S0 (Δ). S0 [K, V] is the state entering the chunk.
__device__ void chunk_factors(const HeadView& hv, int64_t c0, int n, const double* gam, const float* beta, float* sA,
                              float* sT, float* sKK, const float* S0, float* W, float* D) {
  const int64_t K = hv.a.K, V = hv.a.V;
  // F1: A_rj = β_r e^{Γ_r-Γ_j} k_r·k_j (j < r), else 0.
  for (int idx = threadIdx.x; idx < n * n; idx += blockDim.x) {
    const int r = idx / n, j = idx % n;
    float kk = 0.0f, A = 0.0f;
    if (j < r) {
      kk = dotf(hv.k(c0 + r), hv.k(c0 + j), K);
      A = beta[r] * expd(gam[r] - gam[j]) * kk;
    }
    if (sKK != nullptr) sKK[idx] = kk;
    sA[idx] = A;
    sT[idx] = r == j ? 1.0f : 0.0f;
  }
  __syncthreads();
  delta::tril_inverse(sA, sT, n);  // F2: (I + A) 𝒯 = I
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
    for (int i = 0; i <= r; ++i) s += sT[r * n + i] * beta[i] * expd(gam[i]) * hv.k(c0 + i)[m];
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

// F5: P_rj = e^{Γ_r-Γ_j} q_r·k_j for j <= r, else 0 (into sP).
__device__ void chunk_p(const HeadView& hv, int64_t c0, int n, const double* gam, float* sP) {
  for (int idx = threadIdx.x; idx < n * n; idx += blockDim.x) {
    const int r = idx / n, j = idx % n;
    sP[idx] = j <= r ? expd(gam[r] - gam[j]) * dotf(hv.q(c0 + r), hv.k(c0 + j), hv.a.K) : 0.0f;
  }
  __syncthreads();
}

// F7: S_out = e^{Γ_C} S_in + (K ⊙ e^{Γ_C-Γ})^T Δ (S_out may alias S_in: each element is owned by one thread).
__device__ void advance_state(const HeadView& hv, int64_t c0, int n, const double* gam, const float* D,
                              const float* S_in, float* S_out) {
  const int64_t K = hv.a.K, V = hv.a.V;
  const double gC = gam[n - 1];
  const float aC = expd(gC);
  for (int64_t idx = threadIdx.x; idx < K * V; idx += blockDim.x) {
    const int64_t m = idx / V, j = idx % V;
    float s = aC * S_in[idx];
    for (int r = 0; r < n; ++r) s += expd(gC - gam[r]) * hv.k(c0 + r)[m] * D[r * V + j];
    S_out[idx] = s;
  }
  __syncthreads();
}

// Forward: per chunk F1–F4 (chunk_factors), F5 P, F6 O = (Q ⊙ e^Γ) S_0 + P Δ, F7 state update.
// Scratch per block: S [K, V], D [C, V], W [C, K]. Shared: Γ, β [C]; A/P, 𝒯 [C, C].
__global__ void __launch_bounds__(kGdnThreads) gdn_chunk_fwd_kernel(GdnArgs a) {
  extern __shared__ double smem[];
  const int64_t C = a.C, K = a.K, V = a.V;
  double* gam = smem;
  float* beta = reinterpret_cast<float*>(gam + C);
  float* sA = beta + C;
  float* sT = sA + C * C;
  const int64_t bh = blockIdx.x;
  const HeadView hv{a, bh / a.H, bh % a.H};
  float* S = a.scratch + bh * (K * V + C * V + C * K);
  float* D = S + K * V;
  float* W = D + C * V;
  for (int64_t idx = threadIdx.x; idx < K * V; idx += blockDim.x) S[idx] = 0.0f;
  __syncthreads();
  for (int64_t c0 = 0; c0 < a.T; c0 += C) {
    const int n = static_cast<int>(a.T - c0 < C ? a.T - c0 : C);
    chunk_scalars(hv, c0, n, gam, beta);
    chunk_factors(hv, c0, n, gam, beta, sA, sT, nullptr, S, W, D);
    chunk_p(hv, c0, n, gam, sA);  // A is no longer needed: P takes its place
    // F6: o_r = e^{Γ_r} S_0^T q_r + Σ_{i<=r} P_ri Δ_i
    for (int idx = threadIdx.x; idx < n * V; idx += blockDim.x) {
      const int r = static_cast<int>(idx / V);
      const int64_t j = idx % V;
      const float* qr = hv.q(c0 + r);
      float s = 0.0f;
      for (int64_t m = 0; m < K; ++m) s += S[m * V + j] * qr[m];
      s *= expd(gam[r]);
      for (int i = 0; i <= r; ++i) s += sA[r * n + i] * D[i * V + j];
      a.o[hv.tok(c0 + r) * V + j] = s;
    }
    __syncthreads();
    advance_state(hv, c0, n, gam, D, S, S);
  }
}

__host__ __device__ size_t bwd_block_floats(int64_t K, int64_t V, int64_t C, int64_t chunks) {
  return static_cast<size_t>(chunks * K * V + 2 * K * V + 3 * C * V + 5 * C * K);
}

// Backward: a forward scan stores the chunk-start states h[n]; then B1–B9 per chunk in reverse.
// Scratch per block: h [chunks, K, V], dS and dS0 [K, V] (ping-pong), D (Δ), dD (dΔ), XU [C, V],
// W, dW, XW, QS, Z [C, K]. Shared: Γ, β, dΓ, kz [C]; A/d𝒯/dA, 𝒯, k·k, P, dP, M1 [C, C].
__global__ void __launch_bounds__(kGdnThreads) gdn_chunk_bwd_kernel(GdnArgs a) {
  extern __shared__ double smem[];
  const int64_t C = a.C, K = a.K, V = a.V;
  double* gam = smem;
  float* beta = reinterpret_cast<float*>(gam + C);
  float* dgam = beta + C;
  float* kz = dgam + C;
  float* sA = kz + C;
  float* sT = sA + C * C;
  float* sKK = sT + C * C;
  float* sP = sKK + C * C;
  float* sDP = sP + C * C;
  float* sM1 = sDP + C * C;
  const int64_t bh = blockIdx.x;
  const HeadView hv{a, bh / a.H, bh % a.H};
  float* hs = a.scratch + bh * bwd_block_floats(K, V, C, a.chunks);
  float* dS = hs + a.chunks * K * V;
  float* dS0 = dS + K * V;
  float* D = dS0 + K * V;
  float* dD = D + C * V;
  float* XU = dD + C * V;
  float* W = XU + C * V;
  float* dW = W + C * K;
  float* XW = dW + C * K;
  float* QS = XW + C * K;
  float* Z = QS + C * K;

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
    chunk_scalars(hv, c0, n, gam, beta);
    chunk_factors(hv, c0, n, gam, beta, sA, sT, nullptr, S0, W, D);
    advance_state(hv, c0, n, gam, D, S0, hs + (c + 1) * K * V);
  }

  for (int64_t c = a.chunks - 1; c >= 0; --c) {
    const int64_t c0 = c * C;
    const int n = static_cast<int>(a.T - c0 < C ? a.T - c0 : C);
    const float* S0 = hs + c * K * V;
    chunk_scalars(hv, c0, n, gam, beta);
    chunk_factors(hv, c0, n, gam, beta, sA, sT, sKK, S0, W, D);
    chunk_p(hv, c0, n, gam, sP);
    const double gC = gam[n - 1];
    const float aC = expd(gC);

    // B1: dΔ_r = Σ_{i>=r} P_ir dO_i + e^{Γ_C-Γ_r} dS_C^T k_r.   B3 (dP): dP_rj = dO_r·Δ_j (j <= r).
    for (int idx = threadIdx.x; idx < n * V; idx += blockDim.x) {
      const int r = static_cast<int>(idx / V);
      const int64_t j = idx % V;
      float s = 0.0f;
      for (int i = r; i < n; ++i) s += sP[i * n + r] * hv.dO(c0 + i)[j];
      const float* kr = hv.k(c0 + r);
      float t = 0.0f;
      for (int64_t m = 0; m < K; ++m) t += kr[m] * dS[m * V + j];
      dD[idx] = s + expd(gC - gam[r]) * t;
    }
    for (int idx = threadIdx.x; idx < n * n; idx += blockDim.x) {
      const int r = idx / n, j = idx % n;
      sDP[idx] = j <= r ? dotf(hv.dO(c0 + r), D + j * V, V) : 0.0f;
    }
    __syncthreads();

    // B2: dS_0 = e^{Γ_C} dS_C + (Q ⊙ e^Γ)^T dO - W^T dΔ.
    for (int64_t idx = threadIdx.x; idx < K * V; idx += blockDim.x) {
      const int64_t m = idx / V, j = idx % V;
      float s = aC * dS[idx];
      for (int r = 0; r < n; ++r)
        s += expd(gam[r]) * hv.q(c0 + r)[m] * hv.dO(c0 + r)[j] - W[r * K + m] * dD[r * V + j];
      dS0[idx] = s;
    }
    // B5 (dW): dW = -dΔ S_0^T.
    for (int idx = threadIdx.x; idx < n * K; idx += blockDim.x) {
      const int r = static_cast<int>(idx / K);
      const int64_t m = idx % K;
      dW[idx] = -dotf(dD + r * V, S0 + m * V, V);
    }
    __syncthreads();

    // B5: X_U = 𝒯^T dΔ, X_W = 𝒯^T dW; dv = diag(β) X_U.
    delta::wy_bwd_x(sT, dD, dW, beta, n, K, V, XU, XW, a.dv + hv.tok(c0) * V, a.H * V);
    // B6 (d𝒯, into sA: A is no longer needed): d𝒯_ir = β_r (dΔ_i·v_r + e^{Γ_r} dW_i·k_r) for r <= i.
    for (int idx = threadIdx.x; idx < n * n; idx += blockDim.x) {
      const int i = idx / n, r = idx % n;
      float s = 0.0f;
      if (r <= i) s = beta[r] * (dotf(dD + i * V, hv.v(c0 + r), V) + expd(gam[r]) * dotf(dW + i * K, hv.k(c0 + r), K));
      sA[idx] = s;
    }
    __syncthreads();
    delta::tril_inverse_bwd(sT, sA, sM1, n);  // B6: dA = -tril_{j<r}(𝒯^T d𝒯 𝒯^T), into sA

    // B3 and B8 (i), (ii) (dq): dq_r = e^{Γ_r} S_0 dO_r (kept as QS) + Σ_{j<=r} dP_rj e^{Γ_r-Γ_j} k_j.
    for (int idx = threadIdx.x; idx < n * K; idx += blockDim.x) {
      const int r = static_cast<int>(idx / K);
      const int64_t m = idx % K;
      const float qs = expd(gam[r]) * dotf(S0 + m * V, hv.dO(c0 + r), V);
      QS[idx] = qs;
      float s = qs;
      for (int j = 0; j <= r; ++j) s += sDP[r * n + j] * expd(gam[r] - gam[j]) * hv.k(c0 + j)[m];
      a.dq[hv.tok(c0 + r) * K + m] = s;
    }
    // dk_j = B4 intra Σ_{r>=j} dP_rj e^{Γ_r-Γ_j} q_r + B4 state z_j (z_j = e^{Γ_C-Γ_j} dS_C Δ_j, kept as Z)
    //      + B5 β_j e^{Γ_j} X_W,j + B7 β_j Σ_{i<j} dA_ji e^{Γ_j-Γ_i} k_i + Σ_{r>j} dA_rj β_r e^{Γ_r-Γ_j} k_r.
    for (int idx = threadIdx.x; idx < n * K; idx += blockDim.x) {
      const int j = static_cast<int>(idx / K);
      const int64_t m = idx % K;
      float s = 0.0f;
      for (int r = j; r < n; ++r) s += sDP[r * n + j] * expd(gam[r] - gam[j]) * hv.q(c0 + r)[m];
      const float z = expd(gC - gam[j]) * dotf(dS + m * V, D + j * V, V);
      Z[idx] = z;
      s += z;
      s += beta[j] * expd(gam[j]) * XW[idx];
      float t = 0.0f;
      for (int i = 0; i < j; ++i) t += sA[j * n + i] * expd(gam[j] - gam[i]) * hv.k(c0 + i)[m];
      s += beta[j] * t;
      for (int r = j + 1; r < n; ++r) s += sA[r * n + j] * beta[r] * expd(gam[r] - gam[j]) * hv.k(c0 + r)[m];
      a.dk[hv.tok(c0 + j) * K + m] = s;
    }
    __syncthreads();

    // B8 (iv): Σ S_0 ⊙ dS_C (fixed-order block reduction).
    float sd = 0.0f;
    for (int64_t idx = threadIdx.x; idx < K * V; idx += blockDim.x) sd += S0[idx] * dS[idx];
    sd = block_reduce(sd, SumOp{}, 0.0f);

    // Per row r: dβ_r (B5 + B7) and dΓ_r (B3/B8 (i)-(iii), (v), (vi)).
    for (int r = threadIdx.x; r < n; r += blockDim.x) {
      const float* qr = hv.q(c0 + r);
      const float* kr = hv.k(c0 + r);
      float d = dotf(qr, QS + r * K, K);  // B3: e^{Γ_r} q_r·(S_0 dO_r)
      for (int j = 0; j <= r; ++j) d += sDP[r * n + j] * sP[r * n + j];
      for (int i = r; i < n; ++i) d -= sDP[i * n + r] * sP[i * n + r];
      kz[r] = dotf(kr, Z + r * K, K);  // B8 (iii)
      d -= kz[r];
      const float xk = expd(gam[r]) * dotf(XW + r * K, kr, K);  // B5
      float db = dotf(XU + r * V, hv.v(c0 + r), V) + xk;
      d += beta[r] * xk;
      for (int j = 0; j < r; ++j) {  // B7, row r
        const float e = expd(gam[r] - gam[j]), kk = sKK[r * n + j], dA = sA[r * n + j];
        db += dA * e * kk;
        d += dA * beta[r] * e * kk;
      }
      for (int i = r + 1; i < n; ++i) {  // B7, column r
        const float e = expd(gam[i] - gam[r]);
        d -= sA[i * n + r] * beta[i] * e * sKK[i * n + r];
      }
      a.dbeta[hv.tok(c0 + r)] = db;
      dgam[r] = d;
    }
    __syncthreads();
    // B8 (iii), (iv) at Γ_C, then B9: dg_t = Σ_{r>=t in the chunk} dΓ_r.
    if (threadIdx.x == 0) {
      float zsum = 0.0f;
      for (int j = 0; j < n; ++j) zsum += kz[j];
      dgam[n - 1] += zsum + aC * sd;
      float acc = 0.0f;
      for (int r = n - 1; r >= 0; --r) a.dg[hv.tok(c0 + r)] = acc += dgam[r];
    }
    // dS <- dS_0 for the previous chunk.
    float* tmp = dS;
    dS = dS0;
    dS0 = tmp;
    __syncthreads();
  }
}

size_t fwd_smem_bytes(int64_t C) { return sizeof(double) * C + sizeof(float) * static_cast<size_t>(C + 2 * C * C); }
size_t bwd_smem_bytes(int64_t C) { return sizeof(double) * C + sizeof(float) * static_cast<size_t>(3 * C + 6 * C * C); }

void check_chunk(int64_t chunk_size) {
  check(chunk_size >= 1 && chunk_size <= kGdnMaxChunk, "gdn chunk (cuda): chunk_size must be in [1, {}], got {}",
        kGdnMaxChunk, chunk_size);
}

}  // namespace

size_t gdn_chunk_fwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim,
                                   int64_t value_dim, int64_t chunk_size) {
  (void)seq_len;
  return sizeof(float) *
         static_cast<size_t>(batch * heads * (key_dim * value_dim + chunk_size * (value_dim + key_dim)));
}

size_t gdn_chunk_bwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim,
                                   int64_t value_dim, int64_t chunk_size) {
  const int64_t chunks = ceil_div(seq_len, chunk_size);
  return sizeof(float) * static_cast<size_t>(batch * heads) *
         bwd_block_floats(key_dim, value_dim, chunk_size, chunks);
}

void gdn_chunk_fwd(const float* q, const float* k, const float* v, const float* g, const float* beta, int64_t batch,
                   int64_t seq_len, int64_t heads, int64_t key_dim, int64_t value_dim, int64_t chunk_size, float* o,
                   void* scratch, cudaStream_t stream) {
  check_chunk(chunk_size);
  if (batch * heads == 0 || seq_len == 0 || value_dim == 0) return;
  GdnArgs args = delta::core_args(q, k, v, g, beta, batch, seq_len, heads, key_dim, value_dim, chunk_size, scratch);
  args.o = o;
  delta::launch_per_head(gdn_chunk_fwd_kernel, args, kGdnThreads, fwd_smem_bytes(chunk_size), stream);
}

void gdn_chunk_bwd(const float* q, const float* k, const float* v, const float* g, const float* beta,
                   const float* d_o, int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim,
                   int64_t value_dim, int64_t chunk_size, float* dq, float* dk, float* dv, float* dg, float* dbeta,
                   void* scratch, cudaStream_t stream) {
  check_chunk(chunk_size);
  if (batch * heads == 0 || seq_len == 0) return;
  GdnArgs args = delta::core_args(q, k, v, g, beta, batch, seq_len, heads, key_dim, value_dim, chunk_size, scratch);
  args.d_o = d_o;
  args.dq = dq, args.dk = dk, args.dv = dv, args.dg = dg, args.dbeta = dbeta;
  delta::launch_per_head(gdn_chunk_bwd_kernel, args, kGdnThreads, bwd_smem_bytes(chunk_size), stream);
}

}  // namespace llmt::cuda
