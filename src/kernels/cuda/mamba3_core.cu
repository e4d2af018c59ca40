// The chunked Mamba-3 core on the GPU (layers-ssm-attn.md §4.4, §4.5 step 2 and the σ split of step 4;
// semantics: src/kernels/cpu/mamba3.h mamba3_chunk_fwd/bwd). A chunk holds Lc tokens x R ranks = up to
// kRows = 64 rows ρ = (i, r). With the chunk-local inclusive cumsum G of a, σ_j = γ_j + ε_{j+1},
// E_ij = e^{min(G_i - G_j, 0)}, f_j = e^{Γ - G_j} (Γ = the chunk's last G):
//   y_ρ = e^{G_i} S_in q_ρ + Σ_{ρ', j<i} E_ij σ_j (q_ρ·k_ρ') v_ρ' + γ_i Σ_{r'} (q_ρ·k_(i,r')) v_(i,r') + D v_ρ
//   S_out = e^Γ S_in + Σ_{ρ'} f_j σ_j v_ρ' k_ρ'^T
// Phases: G per (b, h, chunk) (one thread each); each chunk's state contribution (forward: Σ f σ v k^T;
// backward: Σ e^{G_i} dy q^T, the chunk's part of dS_in); a scan over the chunks to the entering states
// (forward) or the adjoints of the leaving states (backward), one thread per state element; then one block
// per chunk for y (forward) or every gradient (backward). Products in fp32, G and the scalar sums in
// double. No atomics: the same inputs give the same bits.
// Precision (Mamba3Options::bf16_products, set for bf16 models): the chunk contributions and the scan in one
// pass (state_scan_mma_kernel, the running state in fp32 registers), y (fwd_out_mma_kernel) and the chunk
// gradients (bwd_chunk_mma_kernel) run on the tensor cores (tile::Mma: q, k, v, dy, the states, their adjoints
// and the masked score / coefficient tiles rounded to bf16 once into shared bf16 tiles, fp32 accumulation in
// registers; the per-token sums in double from the fp32 accumulators); G is the fp32 path's. There q, k and the
// chunk-entering states are stored in bf16 (Buffers; the same bits as rounding fp32 ones on loading: they have no
// other readers in the core), and so are the adjoint states (the backward's <dS, S_in> then reads the bf16 values
// its products use) and y and dy (Buffers y_h, dy_h): the gate reads the rounded y, and the backward's fp32 uses of
// dy (inter, v·dy, D dy) and the dS_in scan (which rounds e^{G_i} dy once more) read the rounded dy. Otherwise
// every product is exact fp32.
// SISO's v and dv are the layer's x and dx: fp32, or with bf16 activations (Buffers vh, dvh; bf16 products only)
// bf16, the tensor-core kernels templates on their type VT (v's bf16 rows copied into the operand tiles as they are,
// the gathers reading the same values; dv rounded once on its store).
#include <type_traits>

#include "kernels/cuda/delta_chunk.cuh"
#include "kernels/cuda/delta_tile.cuh"
#include "kernels/cuda/mamba3.cuh"

namespace llmt::cuda::m3 {
namespace {

#ifdef LLMT_CUDA_EMU
LLMT_CUDA_EMU_DYNAMIC_SMEM_OF(float, smem);  // the kernels' `extern __shared__ float smem[]` (tests/emu/cuda_emu.h)
#endif

constexpr int kCoreThreads = 256;  // one team: a 16 x 16 grid of threads, each owning 4 x 4 entries of a 64 x 64 tile
constexpr int kBwdThreads = 2 * kCoreThreads;  // the backward block: two teams on different tiles
constexpr int kSq = kRows + 1;  // row stride of the [kRows][kRows] score tiles
constexpr int kGroups = kBwdThreads / kRows;  // bwd_chunk_kernel's threads per token in its per-token sums
constexpr int kTokenSums = 6;                 // ... and how many sums per token

// cumsum_kernel's threads per block and tokens per staged store piece.
constexpr int kCumThreads = 64, kCumPiece = 16;

// Chunk-local inclusive cumsum of a [B, T, H] (fp32) into G [B, H, nc, Lc] (double, flat past T): one thread per
// (b, chunk, head), heads fastest (a warp's loads of a token: consecutive heads, coalesced), summing its chunk's
// tokens in order. It loads its chunk's a at once (Lc <= kRows); the sums go to G through shared memory a piece of
// kCumPiece tokens at a time, each thread then storing kCumPiece consecutive G of some thread's chunk (coalesced).
__global__ void __launch_bounds__(kCumThreads) cumsum_kernel(const float* a, Sizes s, double* G) {
  __shared__ double st[kCumThreads][kCumPiece + 1];  // [thread][token in piece] (rows padded)
  __shared__ int64_t g0[kCumThreads];                // each thread's chunk's start in G
  const int x = static_cast<int>(threadIdx.x), Lc = static_cast<int>(s.Lc);
  const int64_t n = s.B * s.nc * s.H;
  for (int64_t t0 = blockIdx.x * int64_t{kCumThreads}; t0 < n; t0 += int64_t{gridDim.x} * kCumThreads) {
    const int64_t idx = t0 + x, h = idx % s.H, c = (idx / s.H) % s.nc, b = idx / (s.H * s.nc);
    const int len = idx < n ? static_cast<int>(std::min(s.Lc, s.T - c * s.Lc)) : 0;  // the chunk's tokens
    const float* ac = a + (b * s.T + c * s.Lc) * s.H + h;
    float v[kRows];
#pragma unroll
    for (int i = 0; i < kRows; ++i) v[i] = i < len ? ac[i * s.H] : 0.0f;
    g0[x] = ((b * s.H + h) * s.nc + c) * s.Lc;
    double acc = 0.0;
#pragma unroll
    for (int i0 = 0; i0 < kRows; i0 += kCumPiece) {
      if (i0 >= Lc) break;
#pragma unroll
      for (int u = 0; u < kCumPiece; ++u) {
        if (i0 + u < len) acc += v[i0 + u];
        st[x][u] = acc;
      }
      __syncthreads();
#pragma unroll
      for (int k = 0; k < kCumPiece; ++k) {
        const int f = k * kCumThreads + x, row = f / kCumPiece, col = f % kCumPiece;
        if (i0 + col < Lc && t0 + row < n) G[g0[row] + i0 + col] = st[row][col];
      }
      __syncthreads();  // (before the next piece's, or tile's, writes of st and g0)
    }
  }
}

// A (b, h, chunk) (this_chunk: this block's, grid (nc, H, B)) and its first token, token count n and row count n R.
struct Chunk {
  int64_t b, h, c, bh, t0;
  int n, nr;
};

__device__ Chunk make_chunk(const Sizes& s, int64_t b, int64_t h, int64_t c) {
  Chunk k;
  k.c = c;
  k.h = h;
  k.b = b;
  k.bh = k.b * s.H + k.h;
  k.t0 = k.c * s.Lc;
  k.n = static_cast<int>(s.T - k.t0 < s.Lc ? s.T - k.t0 : s.Lc);
  k.nr = k.n * static_cast<int>(s.R);
  return k;
}
__device__ Chunk this_chunk(const Sizes& s) { return make_chunk(s, blockIdx.z, blockIdx.y, blockIdx.x); }

// buf[ρ][0:width) (row stride ld) = src's row ρ = (i, r) of the chunk, src [B, T, H, R, width], times
// scale[i] when given; for ρ < nr. Each thread issues kBatch loads before its shared stores, so that they
// overlap (these blocks run few warps per SM); 32-bit indices within the chunk. Reached by the whole block.
__device__ void load_rows(float* buf, int ld, const float* src, int64_t width, const Sizes& s, const Chunk& k,
                          const float* scale = nullptr) {
  constexpr int kBatch = 8;
  const int w = static_cast<int>(width), R = static_cast<int>(s.R), total = k.nr * w;
  const int64_t token_stride = s.H * s.R * width;
  const float* base = src + ((k.b * s.T + k.t0) * s.H + k.h) * s.R * width;
  for (int e0 = threadIdx.x; e0 < total; e0 += kBatch * blockDim.x) {
    float v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int e = e0 + u * static_cast<int>(blockDim.x), rho = e / w, i = rho / R;
      v[u] = e < total ? base[i * token_stride + (rho - i * R) * width + (e - rho * w)] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int e = e0 + u * static_cast<int>(blockDim.x), rho = e / w;
      if (e < total) buf[rho * ld + e - rho * w] = scale != nullptr ? v[u] * scale[rho / R] : v[u];
    }
  }
}

// Token i's G, σ, γ of chunk k (i < Lc; past n: G = Γ, σ = γ = 0).
struct TokenScalars {
  double G;
  float sg, gm;
  __device__ void put(int i, double* Gs, float* sg_, float* gm_) const {  // into shared arrays at token i
    Gs[i] = G;
    sg_[i] = sg;
    gm_[i] = gm;
  }
};
__device__ __forceinline__ TokenScalars token_scalars(const double* G, const float* sig, const float* gam,
                                                      const Sizes& s, const Chunk& k, int i) {
  const bool in = i < k.n;
  const int64_t e = (k.b * s.T + k.t0 + i) * s.H + k.h;
  return {G[(k.bh * s.nc + k.c) * s.Lc + i], in ? sig[e] : 0.0f, in ? gam[e] : 0.0f};
}

// The per-token G, σ, γ of the chunk (token_scalars) into shared arrays.
__device__ void load_scalars(const double* G, const float* sig, const float* gam, const Sizes& s, const Chunk& k,
                             double* Gs, float* sg, float* gm) {
  for (int i = threadIdx.x; i < s.Lc; i += blockDim.x) token_scalars(G, sig, gam, s, k, i).put(i, Gs, sg, gm);
}

// e^{min(gi - gj, 0)}; a NaN difference stays NaN, as std::min in the CPU reference.
__device__ __forceinline__ float decay(double gi, double gj) {
  const double d = gi - gj;
  return expf(static_cast<float>(0.0 < d ? 0.0 : d));
}

// acc[q][c] += Σ_{kk<K} A[m a_row + kk a_k] B[kk b_k + n b_col] with m = m0 + ty + 16 q, n = n0 + tx + 16 c (ty, tx:
// the thread's place in its team's 16 x 16 grid; a team of kCoreThreads covers a 64 x 64 tile); fixed kk order. Rows
// m >= M and columns n >= Nn read row M - 1 and column Nn - 1 instead (in bounds; their entries are not used).
__device__ __forceinline__ void mma_tile(int m0, int n0, int M, int Nn, int K, const float* A, int a_row, int a_k,
                                         const float* B, int b_k, int b_col, float (&acc)[4][4]) {
  const int ty = threadIdx.x % kCoreThreads / 16, tx = threadIdx.x % 16;
  const float* a[4];
  const float* b[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    a[q] = A + min(m0 + ty + 16 * q, M - 1) * a_row;
    b[q] = B + min(n0 + tx + 16 * q, Nn - 1) * b_col;
  }
  for (int kk = 0; kk < K; ++kk) {
    float av[4], bv[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      av[q] = a[q][kk * a_k];
      bv[q] = b[q][kk * b_k];
    }
#pragma unroll
    for (int q = 0; q < 4; ++q)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[q][c] = fmaf(av[q], bv[c], acc[q][c]);
  }
}

// Calls f(m, n, acc[q][c]) for the thread's entries of the tile at (m0, n0) with m < M, n < Nn.
template <class F>
__device__ __forceinline__ void tile_each(int m0, int n0, int M, int Nn, float (&acc)[4][4], F f) {
  const int ty = threadIdx.x % kCoreThreads / 16, tx = threadIdx.x % 16;
#pragma unroll
  for (int q = 0; q < 4; ++q)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int m = m0 + ty + 16 * q, n = n0 + tx + 16 * c;
      if (m < M && n < Nn) f(m, n, acc[q][c]);
    }
}

// The weight of token i in a chunk's state contribution (outer_kernel, state_scan_mma_kernel) from its G_i, the
// chunk's Γ and σ_i: f_i σ_i = e^{Γ - G_i} σ_i (to_end, forward) or e^{G_i} (backward; σ_i unused).
__device__ __forceinline__ float outer_weight(double Gi, double gam, float sg, bool to_end) {
  return to_end ? expf(static_cast<float>(gam - Gi)) * sg : expf(static_cast<float>(Gi));
}

// scale[i] = outer_weight of token i < k.n of chunk k. The caller synchronises before reading.
__device__ void outer_weights(const double* G, const float* sig, const Sizes& s, const Chunk& k, bool to_end,
                              float* scale) {
  const int64_t g0 = (k.bh * s.nc + k.c) * s.Lc;
  for (int i = threadIdx.x; i < k.n; i += blockDim.x)
    scale[i] = outer_weight(G[g0 + i], G[g0 + s.Lc - 1], to_end ? sig[(k.b * s.T + k.t0 + i) * s.H + k.h] : 0.0f,
                            to_end);
}

// A chunk's state contribution out[p][n] = Σ_ρ w_i u_ρ[p] w_ρ[n] (u [.., P], w [.., N] in the core layout) into
// out [B, H, nc, P, N]. to_end: weights f_i σ_i (forward: u = v, w = k); else e^{G_i} (backward: u = dy, w = q).
// Grid (nc, H, B); dynamic shared memory kRows (P + 1 + N + 1) floats (49 KiB at P = 64, N = 128: 4 blocks per
// SM, which the register bound keeps possible).
__global__ void __launch_bounds__(kCoreThreads, 4) outer_kernel(const float* u, const float* w, const double* G,
                                                             const float* sig, Sizes s, bool to_end, float* out) {
  extern __shared__ float smem[];
  const int P1 = static_cast<int>(s.P) + 1, N1 = static_cast<int>(s.N) + 1;
  float* U = smem;
  float* Wt = smem + kRows * P1;
  __shared__ float scale[kRows];
  const Chunk k = this_chunk(s);
  outer_weights(G, sig, s, k, to_end, scale);
  __syncthreads();
  load_rows(U, P1, u, s.P, s, k, scale);
  load_rows(Wt, N1, w, s.N, s, k);
  __syncthreads();
  float* o = out + (k.bh * s.nc + k.c) * s.P * s.N;
  const int P = static_cast<int>(s.P), N = static_cast<int>(s.N);
  for (int p0 = 0; p0 < P; p0 += kRows)
    for (int n0 = 0; n0 < N; n0 += kRows) {
      float acc[4][4] = {};
      mma_tile(p0, n0, P, N, k.nr, U, 1, P1, Wt, N1, 1, acc);
      tile_each(p0, n0, P, N, acc, [&](int p, int n, float v) { o[p * s.N + n] = v; });
    }
}

// Contributions -> in place the states entering each chunk (forward: S_in_0 = 0, S_in_{c+1} = e^{Γ_c} S_in_c
// + U_c) or the adjoints of the states leaving each chunk (reverse: dS_out_{nc-1} = 0, dS_out_{c-1} =
// e^{Γ_c} dS_out_c + V_c).   (one thread per (b, h, p, n))
__global__ void scan_kernel(float* st, const double* G, Sizes s, bool reverse) {
  const int64_t PN = s.P * s.N, n = s.B * s.H * PN;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n; idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t bh = idx / PN, e = idx % PN;
    constexpr int kAhead = 8;  // contributions and decays loaded ahead, so that the loads overlap
    float carry = 0.0f;
    for (int64_t q0 = 0; q0 < s.nc; q0 += kAhead) {
      float contrib[kAhead], decay_c[kAhead];
#pragma unroll
      for (int u = 0; u < kAhead; ++u) {
        const int64_t q = q0 + u, c = reverse ? s.nc - 1 - q : q;
        contrib[u] = q < s.nc ? st[(bh * s.nc + c) * PN + e] : 0.0f;
        decay_c[u] = q < s.nc ? expf(static_cast<float>(G[(bh * s.nc + c) * s.Lc + s.Lc - 1])) : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kAhead; ++u) {
        const int64_t q = q0 + u, c = reverse ? s.nc - 1 - q : q;
        if (q >= s.nc) break;
        st[(bh * s.nc + c) * PN + e] = carry;
        carry = decay_c[u] * carry + contrib[u];
      }
    }
  }
}

// y of one chunk (the formula at the top). Grid (nc, H, B); dynamic shared memory
// kRows (2 (N + 1) + (P + 1) + kSq) floats.
__global__ void __launch_bounds__(kCoreThreads) fwd_out_kernel(const float* q, const float* kk, const float* v,
                                                               const float* D, const double* G, const float* sig,
                                                               const float* gam, const float* states, Sizes s,
                                                               float* y) {
  extern __shared__ float smem[];
  const int N1 = static_cast<int>(s.N) + 1, P1 = static_cast<int>(s.P) + 1, R = static_cast<int>(s.R);
  float* Q = smem;
  float* K = Q + kRows * N1;
  float* V = K + kRows * N1;
  float* Sc = V + kRows * P1;
  __shared__ double Gs[kRows];
  __shared__ float sg[kRows], gm[kRows];
  const Chunk k = this_chunk(s);
  load_scalars(G, sig, gam, s, k, Gs, sg, gm);
  load_rows(Q, N1, q, s.N, s, k);
  load_rows(K, N1, kk, s.N, s, k);
  load_rows(V, P1, v, s.P, s, k);
  __syncthreads();
  // Sc[ρ][ρ'] = E_ij σ_j (q_ρ·k_ρ') for j < i, γ_i (q_ρ·k_ρ') for j = i, 0 for j > i.
  const int N = static_cast<int>(s.N), P = static_cast<int>(s.P);
  {
    float acc[4][4] = {};
    mma_tile(0, 0, k.nr, k.nr, N, Q, N1, 1, K, 1, N1, acc);
    tile_each(0, 0, k.nr, k.nr, acc, [&](int rho, int rp, float d) {
      const int i = rho / R, j = rp / R;
      Sc[rho * kSq + rp] = j < i ? decay(Gs[i], Gs[j]) * sg[j] * d : j == i ? gm[i] * d : 0.0f;
    });
  }
  __syncthreads();
  // y^T[p][ρ] = e^{G_i} Σ_n S_in[p][n] q_ρ[n] + Σ_ρ' v_ρ'[p] Sc[ρ][ρ'] + D v_ρ[p].
  const float* sin = states + (k.bh * s.nc + k.c) * s.P * s.N;
  const float Dh = D[k.h];
  for (int p0 = 0; p0 < P; p0 += kRows) {
    float acc[4][4] = {};
    mma_tile(p0, 0, P, k.nr, N, sin, N, 1, Q, 1, N1, acc);
    const int tx = threadIdx.x % 16;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int rho = tx + 16 * c;
      const float ei = rho < k.nr ? expf(static_cast<float>(Gs[rho / R])) : 0.0f;
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[q][c] *= ei;
    }
    mma_tile(p0, 0, P, k.nr, k.nr, V, 1, P1, Sc, 1, kSq, acc);
    tile_each(p0, 0, P, k.nr, acc, [&](int p, int rho, float v) {
      y[(((k.b * s.T + k.t0 + rho / R) * s.H + k.h) * s.R + rho % R) * s.P + p] = fmaf(Dh, V[rho * P1 + p], v);
    });
  }
}

// Every gradient of one chunk (§4.5 step 2, cpu/mamba3.cpp chunk_bwd and the σ split), given the entering state
// S_in and the adjoint dS of the leaving state. With Sqk = q_ρ·k_ρ', Sdv = dy_ρ·v_ρ' and, for j < i, the
// coefficients Adq = Sdv E σ_j, Bdv = σ_j Sqk E (for j = i: γ_i Sdv, γ_i Sqk):
//   dq_ρ = e^{G_i} S_in^T dy_ρ + Σ_ρ' Adq_ρρ' k_ρ'
//   dk_ρ = Σ_ρ2 Adq_ρ2ρ q_ρ2 + σ_j f_j dS^T v_ρ                 (σ split included)
//   dv_ρ = Σ_ρ2 Bdv_ρ2ρ dy_ρ2 + f_j σ_j dS k_ρ + D dy_ρ
//   dγ_i = Σ_{r,r'} Sdv Sqk (diagonal block) + dσ_i;  dσ_j = Σ_{ρ: i>j} Sdv E Sqk + Z_j,  Z_j = f_j Σ_r v·(dS k)
//   da_k = Σ_{i>=k>j} σ_j Sdv E Sqk + Σ_{i>=k} inter_i + Σ_{j<k} σ_j Z_j + e^Γ <dS, S_in>,
//   inter_i = e^{G_i} Σ_r dy_ρ·(S_in q_ρ)   (the pairs of Σ_{i>=k} dG_i that cancel are left out, as mamba2.cu)
// Writes dq, dk, dv, da, dgam, dsig (dσ, for ε_{t+1}) and dDp (Σ v·dy). Grid (nc, H, B) of kBwdThreads (the two teams
// take different tiles); dynamic shared memory
// kRows (2 (N + 1) + 4 (P + 1) + 3 kSq) floats.
__global__ void __launch_bounds__(kBwdThreads) bwd_chunk_kernel(
    const float* q, const float* kk, const float* v, const float* dy, const float* D, const double* G,
    const float* sig, const float* gam, const float* states, const float* dstates, Sizes s, float* dq, float* dk,
    float* dv, float* da, float* dgam, float* dsig, double* dDp) {
  extern __shared__ float smem[];
  const int N1 = static_cast<int>(s.N) + 1, P1 = static_cast<int>(s.P) + 1, R = static_cast<int>(s.R);
  float* Q = smem;
  float* K = Q + kRows * N1;
  float* V = K + kRows * N1;
  float* DY = V + kRows * P1;
  float* S1 = DY + kRows * P1;  // e^{G_i} dy_ρ[p] (S_in q_ρ)[p]
  float* S2 = S1 + kRows * P1;  // f_j v_ρ[p] (dS k_ρ)[p]
  float* Bdv = S2 + kRows * P1;
  float* Adq = Bdv + kRows * kSq;
  float* Yb = Adq + kRows * kSq;  // Sdv E Sqk (j < i), Sdv Sqk (j = i)
  __shared__ double Gs[kRows], inter[kRows], zs[kRows], dgd[kRows], dsi[kRows], cross[kRows], vdy[kRows];
  __shared__ float sg[kRows], gm[kRows];
  const Chunk k = this_chunk(s);
  load_scalars(G, sig, gam, s, k, Gs, sg, gm);
  load_rows(Q, N1, q, s.N, s, k);
  load_rows(K, N1, kk, s.N, s, k);
  load_rows(V, P1, v, s.P, s, k);
  load_rows(DY, P1, dy, s.P, s, k);
  __syncthreads();
  const int N = static_cast<int>(s.N), P = static_cast<int>(s.P);
  // Team 1: Sdv into Adq's place; team 0: Sqk, then the coefficients from both.
  const int team = threadIdx.x / kCoreThreads;
  float sqk[4][4] = {};
  if (team == 1) {
    float sdv[4][4] = {};
    mma_tile(0, 0, k.nr, k.nr, P, DY, P1, 1, V, 1, P1, sdv);
    tile_each(0, 0, k.nr, k.nr, sdv, [&](int rho, int rp, float v) { Adq[rho * kSq + rp] = v; });
  } else {
    mma_tile(0, 0, k.nr, k.nr, N, Q, N1, 1, K, 1, N1, sqk);
  }
  __syncthreads();
  if (team == 0)
    tile_each(0, 0, k.nr, k.nr, sqk, [&](int rho, int rp, float qk) {
      const int i = rho / R, j = rp / R;
      const float dv_ = Adq[rho * kSq + rp];
      float a = 0.0f, b = 0.0f, y = 0.0f;
      if (j < i) {
        const float E = decay(Gs[i], Gs[j]);
        y = dv_ * E * qk;
        a = dv_ * E * sg[j];
        b = sg[j] * qk * E;
      } else if (j == i) {
        y = dv_ * qk;
        a = gm[i] * dv_;
        b = gm[i] * qk;
      }
      Adq[rho * kSq + rp] = a;
      Bdv[rho * kSq + rp] = b;
      Yb[rho * kSq + rp] = y;
    });
  __syncthreads();
  const int64_t base = k.bh * s.nc + k.c;
  const float* sin = states + base * s.P * s.N;
  const float* dS = dstates + base * s.P * s.N;
  const double gam_end = Gs[s.Lc - 1];
  auto at = [&](int rho, int64_t width) {  // offset of row ρ in the core layout
    return (((k.b * s.T + k.t0 + rho / R) * s.H + k.h) * s.R + rho % R) * width;
  };
  auto scale_rows = [&](float(&acc)[4][4], auto&& f) {  // acc row ρ *= f(ρ) (0 past nr)
    const int ty = threadIdx.x % kCoreThreads / 16;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int rho = ty + 16 * q;
      const float v = rho < k.nr ? f(rho) : 0.0f;
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[q][c] *= v;
    }
  };
  // dq (team 0), dk (team 1) per N tile (rows ρ, columns n).
  for (int n0 = 0; n0 < N; n0 += kRows) {
    float acc[4][4] = {};
    if (team == 0) {
      mma_tile(0, n0, k.nr, N, P, DY, P1, 1, sin, N, 1, acc);
      scale_rows(acc, [&](int rho) { return expf(static_cast<float>(Gs[rho / R])); });
      mma_tile(0, n0, k.nr, N, k.nr, Adq, kSq, 1, K, N1, 1, acc);
      tile_each(0, n0, k.nr, N, acc, [&](int rho, int n, float v) { dq[at(rho, s.N) + n] = v; });
    } else {
      mma_tile(0, n0, k.nr, N, P, V, P1, 1, dS, N, 1, acc);
      scale_rows(acc, [&](int rho) {
        const int i = rho / R;
        return sg[i] * expf(static_cast<float>(gam_end - Gs[i]));
      });
      mma_tile(0, n0, k.nr, N, k.nr, Adq, 1, kSq, Q, N1, 1, acc);
      tile_each(0, n0, k.nr, N, acc, [&](int rho, int n, float v) { dk[at(rho, s.N) + n] = v; });
    }
  }
  // Per P tile, transposed (rows p, columns ρ): team 0 the row term S1; team 1 S2 and dv.
  const float Dh = D[k.h];
  for (int p0 = 0; p0 < P; p0 += kRows) {
    float acc[4][4] = {};
    if (team == 0) {
      mma_tile(p0, 0, P, k.nr, N, sin, N, 1, Q, 1, N1, acc);
      tile_each(p0, 0, P, k.nr, acc, [&](int p, int rho, float u) {
        S1[rho * P1 + p] = expf(static_cast<float>(Gs[rho / R])) * DY[rho * P1 + p] * u;
      });
      continue;
    }
    mma_tile(p0, 0, P, k.nr, N, dS, N, 1, K, 1, N1, acc);
    const int ty = threadIdx.x % kCoreThreads / 16, tx = threadIdx.x % 16;
#pragma unroll
    for (int q = 0; q < 4; ++q)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int p = p0 + ty + 16 * q, rho = tx + 16 * c, i = rho / R;
        const float w = acc[q][c];
        acc[q][c] = 0.0f;
        if (p >= P || rho >= k.nr) continue;
        const float f = expf(static_cast<float>(gam_end - Gs[i]));
        S2[rho * P1 + p] = f * V[rho * P1 + p] * w;
        acc[q][c] = f * sg[i] * w;
      }
    mma_tile(p0, 0, P, k.nr, k.nr, DY, 1, P1, Bdv, kSq, 1, acc);
    tile_each(p0, 0, P, k.nr, acc,
              [&](int p, int rho, float v) { dv[at(rho, s.P) + p] = fmaf(Dh, DY[rho * P1 + p], v); });
  }
  // e^Γ <dS, S_in> (the state passing S_out += e^Γ S_in).
  double sd = 0.0;
  for (int64_t e = threadIdx.x; e < s.P * s.N; e += blockDim.x) sd += static_cast<double>(dS[e]) * sin[e];
  sd = block_reduce(sd, SumOp{}, 0.0);  // synchronises the block
  // Per-token sums in double. Thread (g, t) = (threadIdx.x / kRows, threadIdx.x % kRows) adds the terms of token t
  // whose channel p (inter, z, v·dy) or row ρ (dσ, cross) is g mod kGroups; then thread t adds the kGroups partials
  // in group order (a fixed order: the same bits every run).
  // The group partials go where Bdv and Adq were (free since block_reduce's barrier; 8-byte aligned).
  static_assert(kTokenSums * kGroups * kRows * sizeof(double) <= 2 * kRows * kSq * sizeof(float), "partials");
  double* part = reinterpret_cast<double*>(Bdv);
  {
    const int g = threadIdx.x / kRows, t = threadIdx.x % kRows;
    double in = 0.0, z = 0.0, d = 0.0, si = 0.0, cr = 0.0, vd = 0.0;
    if (t < k.n) {
      for (int r = 0; r < R; ++r) {
        const int rho = t * R + r;
        for (int p = g; p < P; p += kGroups) {
          in += S1[rho * P1 + p];
          z += S2[rho * P1 + p];
          vd += static_cast<double>(V[rho * P1 + p]) * DY[rho * P1 + p];
        }
        if (g == 0)
          for (int r2 = 0; r2 < R; ++r2) d += Yb[rho * kSq + t * R + r2];
      }
      for (int rho = (t + 1) * R + g; rho < k.nr; rho += kGroups)
        for (int r2 = 0; r2 < R; ++r2) si += Yb[rho * kSq + t * R + r2];
      for (int rho = t * R + g; rho < k.nr; rho += kGroups)
        for (int j = 0; j < t; ++j) {
          const double sj = sg[j];
          for (int r2 = 0; r2 < R; ++r2) cr += sj * Yb[rho * kSq + j * R + r2];
        }
    }
    const double mine[kTokenSums] = {in, z, d, si, cr, vd};
    for (int q = 0; q < kTokenSums; ++q) part[(q * kGroups + g) * kRows + t] = mine[q];
  }
  __syncthreads();
  if (threadIdx.x < k.n) {
    const int t = threadIdx.x;
    double* out[kTokenSums] = {inter, zs, dgd, dsi, cross, vdy};
    for (int q = 0; q < kTokenSums; ++q) {
      double acc = 0.0;
      for (int g = 0; g < kGroups; ++g) acc += part[(q * kGroups + g) * kRows + t];
      out[q][t] = acc;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const double state = exp(gam_end) * sd;
    double suffix = 0.0, prefix = 0.0, dD = 0.0;
    for (int t = k.n - 1; t >= 0; --t) {
      suffix += inter[t];
      cross[t] += suffix;  // now Σ_{i>=t} inter_i + the cross term
    }
    for (int t = 0; t < k.n; ++t) {
      const int64_t e = (k.b * s.T + k.t0 + t) * s.H + k.h;
      da[e] = static_cast<float>(cross[t] + prefix + state);
      prefix += static_cast<double>(sg[t]) * zs[t];
      const double ds = dsi[t] + zs[t];
      dsig[e] = static_cast<float>(ds);
      dgam[e] = static_cast<float>(dgd[t] + ds);
      dD += vdy[t];
    }
    dDp[base] = dD;
  }
}

// tile::Mma's bf16 tiles of a matrix of 64 nrt rows x 64 nct columns: element (r, c) is entry
// (r % 64) kLdH + c % 64 of tile (r / 64) nct + c / 64.
__device__ __forceinline__ int h_at(int r, int c, int nct) {
  return ((r >> 6) * nct + (c >> 6)) * tile::kTileHalves + (r & 63) * tile::kLdH + (c & 63);
}

// load_tiles_h with kW-wide loads (4: one 16-byte float4, or one 8-byte load of 4 bf16; every row aligned to it and
// cols % 4 == 0; 1: scalar). Thread x takes columns kW (x % (64 / kW)) .. + kW - 1 of every 64-column tile and rows
// x / (64 / kW) + kStep j of every 64-row tile; the tiles t = rt nct + ct (stored at t kTileHalves) are walked
// kTiles at a time, and each thread issues its kBatch loads in each of them (kTiles kBatch: 8 vector loads) before
// their stores.
template <int kW, typename Row, typename Scale>
__device__ __forceinline__ void load_tiles_w(__nv_bfloat16* dst, int nrt, int nct, int rows, int cols, Row row,
                                             Scale scale) {
  using E = std::remove_cv_t<std::remove_pointer_t<decltype(row(0))>>;  // float or __nv_bfloat16
  constexpr int kPerRow = 64 / kW, kStep = tile::kThreads / kPerRow, kBatch = kW == 4 ? 4 : 8;
  constexpr int kTiles = kW == 4 ? 2 : 1;
  static_assert(64 % (kStep * kBatch) == 0, "whole batches per tile");
  const int x = static_cast<int>(threadIdx.x), c_in = kW * (x % kPerRow), r_in = x / kPerRow, nt = nrt * nct;
#pragma unroll 1
  for (int t0 = 0; t0 < nt; t0 += kTiles)
#pragma unroll 1
    for (int j0 = 0; j0 < 64 / kStep; j0 += kBatch) {
      float v[kTiles][kBatch][kW];
      int r0[kTiles];  // the tile's first row of this thread (rows past nrt tiles when t >= nt: nothing loaded)
#pragma unroll
      for (int g = 0; g < kTiles; ++g) {
        const int t = t0 + g, rt = t / nct, c = 64 * (t - rt * nct) + c_in;
        r0[g] = 64 * rt + r_in + kStep * j0;
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int r = r0[g] + kStep * u;
          const bool in = t < nt && r < rows && c < cols;
          if constexpr (kW == 4 && std::is_same_v<E, float>) {
            const float4 f = in ? *reinterpret_cast<const float4*>(row(r) + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            v[g][u][0] = f.x, v[g][u][1] = f.y, v[g][u][2] = f.z, v[g][u][3] = f.w;
          } else if constexpr (kW == 4) {
            const uint2 h = in ? *reinterpret_cast<const uint2*>(row(r) + c) : make_uint2(0u, 0u);
            const __nv_bfloat162* hp = reinterpret_cast<const __nv_bfloat162*>(&h);
            const float2 lo = __bfloat1622float2(hp[0]), hi = __bfloat1622float2(hp[1]);
            v[g][u][0] = lo.x, v[g][u][1] = lo.y, v[g][u][2] = hi.x, v[g][u][3] = hi.y;
          } else {
            v[g][u][0] = in ? to_f32(row(r)[c]) : 0.0f;
          }
        }
      }
#pragma unroll
      for (int g = 0; g < kTiles; ++g) {
        if (t0 + g >= nt) break;
        __nv_bfloat16* d = dst + (t0 + g) * tile::kTileHalves + r_in * tile::kLdH + c_in;
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int r = r0[g] + kStep * u;
          const float f = r < rows ? scale(r) : 0.0f;
          __nv_bfloat16* o = d + kStep * (j0 + u) * tile::kLdH;
          if constexpr (kW == 4) {
            reinterpret_cast<__nv_bfloat162*>(o)[0] = __floats2bfloat162_rn(f * v[g][u][0], f * v[g][u][1]);
            reinterpret_cast<__nv_bfloat162*>(o)[1] = __floats2bfloat162_rn(f * v[g][u][2], f * v[g][u][3]);
          } else {
            *o = __float2bfloat16_rn(f * v[g][u][0]);
          }
        }
      }
    }
}

// dst (nrt x nct bf16 tiles, h_at) = bf16(scale(r) row(r)[c]) for r < rows, c < cols, else 0; row(r) is a float or
// bf16 pointer with row(r) - row(0) a multiple of 4 elements where cols is (rows cols, or P with cols = P - p0,
// apart), so that every row is aligned as row(0) is: then 4-element vector loads (load_tiles_w), else scalar ones.
// Reached by the whole block of tile::kThreads.
template <typename Row, typename Scale>
__device__ void load_tiles_h(__nv_bfloat16* dst, int nrt, int nct, int rows, int cols, Row row, Scale scale) {
  using E = std::remove_cv_t<std::remove_pointer_t<decltype(row(0))>>;
  if (cols % 4 == 0 && reinterpret_cast<uintptr_t>(row(0)) % (4 * sizeof(E)) == 0)
    load_tiles_w<4>(dst, nrt, nct, rows, cols, row, scale);
  else
    load_tiles_w<1>(dst, nrt, nct, rows, cols, row, scale);
}

// copy_tiles_h with kW-element pieces (8: 16 bytes; 1: one element): thread x takes pieces e = x + kThreads m of
// the tiles in row-major order (64 nrt rows of 64 nct / kW pieces), kBatch loads issued before their stores.
template <int kW, int kBatch, typename Row>
__device__ __forceinline__ void copy_tiles_w(__nv_bfloat16* dst, int nrt, int nct, int rows, int cols, Row row) {
  using Piece = std::conditional_t<kW == 8, uint4, __nv_bfloat16>;
  const int pr = 64 * nct / kW, total = 64 * nrt * pr;
#pragma unroll 1
  for (int e0 = threadIdx.x; e0 < total; e0 += kBatch * tile::kThreads) {
    Piece v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int e = e0 + u * tile::kThreads, r = e / pr, c = kW * (e - r * pr);
      v[u] = e < total && r < rows && c < cols ? *reinterpret_cast<const Piece*>(row(r) + c) : Piece{};
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int e = e0 + u * tile::kThreads, r = e / pr, c = kW * (e - r * pr);
      if (e < total) *reinterpret_cast<Piece*>(dst + h_at(r, c, nct)) = v[u];
    }
  }
}

// Whether copy_tiles_h of a bf16 tensor with rows ld elements apart, cols wide, first row at p, takes 16-byte pieces
// (then copy_tiles_async gives the same tiles).
__host__ __device__ __forceinline__ bool copy_async_ok(const void* p, int ld, int cols) {
  return ld % 8 == 0 && cols % 8 == 0 && reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// dst (nrt x nct bf16 tiles, h_at) = row(r)[c] for r < rows, c < cols, else 0: load_tiles_h of a bf16 source with
// scale 1 (the bits copied); row(r) a bf16 pointer with row(r) - row(0) a multiple of ld elements: 16-byte pieces
// where ld and cols are multiples of 8 and row(0) is 16-byte aligned, else single elements; kBatch 16-byte loads
// in flight per thread (the caller's registers permitting). Reached by the whole block of tile::kThreads.
template <int kBatch, typename Row>
__device__ void copy_tiles_h(__nv_bfloat16* dst, int nrt, int nct, int rows, int cols, int ld, Row row) {
  if (copy_async_ok(row(0), ld, cols))
    copy_tiles_w<8, kBatch>(dst, nrt, nct, rows, cols, row);
  else
    copy_tiles_w<1, 8>(dst, nrt, nct, rows, cols, row);
}

// Thread x's elements e = x + kThreads m of a row-major matrix of wc columns as (r, c), walked with one division
// per thread (next: c + dc < 2 wc, at most one carry into r). kCol: wc divides kThreads (dc = 0), so that c stays
// and next() only steps r (the short form of the walk; the same elements).
template <bool kCol>
struct RowWalk {
  int r, c, dr, dc, wc;
  __device__ explicit RowWalk(int wc_)
      : r(static_cast<int>(threadIdx.x) / wc_), c(static_cast<int>(threadIdx.x) - r * wc_),
        dr(tile::kThreads / wc_), dc(tile::kThreads - dr * wc_), wc(wc_) {}
  __device__ __forceinline__ void next() {
    r += dr;
    if (kCol) return;
    c += dc;
    if (c >= wc) c -= wc, ++r;
  }
};

// copy_tiles_h by cp.async, where it takes 16-byte pieces (copy_async_ok): thread x issues the pieces of
// copy_tiles_w<8> (e = x + kThreads m, row-major, walked by RowWalk: one division per thread), those outside
// rows x cols zero-filled (row(0) their unread source), all in flight together; they land at the thread's
// cp_async_wait of the group the caller commits, and other threads read them after a barrier. Reached by the whole
// block of tile::kThreads.
template <typename Row>
__device__ void copy_tiles_async(__nv_bfloat16* dst, int nrt, int nct, int rows, int cols, Row row) {
  const int pr = 8 * nct, total = 64 * nrt * pr;
  RowWalk<false> w(pr);  // (row, piece)
  for (int e = threadIdx.x; e < total; e += tile::kThreads, w.next()) {
    const int r = w.r, c = 8 * w.c;
    const bool in = r < rows && c < cols;
    tile::cp_async16(dst + h_at(r, c, nct), in ? row(r) + c : row(0), in ? 16 : 0);
  }
}

// Chunk k's rows in the core layout [B, T, H, R, width], R = kR when it is a compile-time constant (1: SISO) or
// s.R at run time (kR = 0): row ρ = (i, r) = (ρ / R, ρ % R) starts offset(ρ) = (i H R + r) width floats after the
// chunk's first row, which starts row0 width floats into the tensor (the 64-bit product once per chunk; the
// offsets within the chunk in 32 bits, which core_check guarantees).
template <int kR>
struct ChunkRows {
  int64_t row0;
  int R, HR;
  __device__ ChunkRows(const Sizes& s, const Chunk& k)
      : row0(((k.b * s.T + k.t0) * s.H + k.h) * s.R),
        R(kR > 0 ? kR : static_cast<int>(s.R)),
        HR(static_cast<int>(s.H) * (kR > 0 ? kR : static_cast<int>(s.R))) {}
  __device__ __forceinline__ int rank() const { return kR > 0 ? kR : R; }
  __device__ __forceinline__ int token(int rho) const { return rho / rank(); }
  __device__ __forceinline__ int offset(int rho) const {  // in rows of width floats
    const int i = token(rho);
    return i * HR + (rho - i * rank());
  }
  template <typename T>
  __device__ __forceinline__ T* base(T* src, int width) const {  // the chunk's first row
    return src + row0 * width;
  }
  // Row ρ from column c0 on, as a function of ρ (load_tiles_h, copy_tiles_h, stage_async, stage_h_async).
  template <typename T>
  __device__ __forceinline__ auto rows(const T* src, int width, int c0) const {
    const T* b = base(src, width) + c0;
    const ChunkRows cr = *this;
    return [=](int rho) { return b + cr.offset(rho) * width; };
  }
};

// The rows ρ = Mma::row(a) = (i, r) of a thread's accumulators in chunk rows cr: offset off(a) (ChunkRows, the
// divisions by R once per thread), token tok(a) = i and whether in(a) (ρ < nr).
template <int kR>
struct MmaRows {
  ChunkRows<kR> cr;
  int off_[4], nr;
  __device__ MmaRows(const ChunkRows<kR>& cr_, int nr_) : cr(cr_), nr(nr_) {
#pragma unroll
    for (int a = 0; a < 4; ++a) off_[a] = cr.offset(tile::Mma::row(a));
  }
  __device__ __forceinline__ int off(int a) const { return off_[a]; }
  __device__ __forceinline__ int tok(int a) const { return cr.token(tile::Mma::row(a)); }
  __device__ __forceinline__ bool in(int a) const { return tile::Mma::row(a) < nr; }
  // x[a][c] = rows[off(a) width + c0 + Mma::col(c)] (rows: the chunk's first row, ChunkRows::base; fp32 or bf16)
  // where in(a) and the column < width, else 0: the values under the thread's accumulator entries of one column
  // tile as fp32, all loads issued together (ahead of the products whose results they meet): the column pairs
  // (Mma::col(c), + 1) of an even c as one load (8 bytes fp32, 4 bytes bf16) where pairs (pairs_ok of rows'
  // tensor), else one element at a time.
  template <typename T>
  __device__ __forceinline__ void gather(float (&x)[4][4], const T* rows, int width, int c0, bool pairs) const {
    if (pairs) {
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int c = 0; c < 4; c += 2) {
          const int col = c0 + tile::Mma::col(c);
          const bool ok = in(a) && col < width;
          const int o = off(a) * width + col;
          float2 f;
          if constexpr (std::is_same_v<T, float>)
            f = ok ? *reinterpret_cast<const float2*>(rows + o) : make_float2(0.0f, 0.0f);
          else
            f = ok ? __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(rows + o)) : make_float2(0.0f, 0.0f);
          x[a][c] = f.x, x[a][c + 1] = f.y;
        }
      return;
    }
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int col = c0 + tile::Mma::col(c);
        x[a][c] = in(a) && col < width ? to_f32(rows[off(a) * width + col]) : 0.0f;
      }
  }
  // rows[off(a) width + c0 + Mma::col(c)] = x(a, c) where in(a) and the column < width (rows as in gather; fp32, or
  // bf16 rounded to nearest even): the column pairs (Mma::col(c), + 1) of an even c as one store (8 bytes fp32, 4
  // bytes bf16) where pairs (pairs_ok: width even, rows aligned to a pair, so every pair is), else one element at a
  // time. (One row address per a, the columns as offsets from it.)
  template <typename T, class F>
  __device__ __forceinline__ void store(T* rows, int width, int c0, bool pairs, F x) const {
    const int cb = c0 + tile::Mma::col(0);
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      if (!in(a)) continue;
      T* o = rows + (off(a) * width + cb);
#pragma unroll
      for (int c = 0; c < 4; c += 2) {
        const int col = cb + 8 * (c >> 1);
        if (col >= width) continue;
        T* d = o + 8 * (c >> 1);
        if (pairs) {
          if constexpr (std::is_same_v<T, float>)
            *reinterpret_cast<float2*>(d) = make_float2(x(a, c), x(a, c + 1));
          else
            *reinterpret_cast<__nv_bfloat162*>(d) = __floats2bfloat162_rn(x(a, c), x(a, c + 1));
        } else {
          d[0] = from_f32<T>(x(a, c));
          if (col + 1 < width) d[1] = from_f32<T>(x(a, c + 1));
        }
      }
    }
  }
};

// Whether MmaRows::gather and store may take pairs of a tensor of T (float or bf16), rows width elements apart,
// starting at p.
template <typename T>
__host__ __device__ __forceinline__ bool pairs_ok(const T* p, int64_t width) {
  return width % 2 == 0 && reinterpret_cast<uintptr_t>(p) % (2 * sizeof(T)) == 0;
}

// A chunk's q, k rows (bf16, width N) and its state tiles (P x N at st, bf16) into the bf16 tiles Q, K (1 x nN
// each) and S (nP x nN): issue() issues them by cp.async (one committed group) where every piece is 16 bytes
// (copy_async_ok), so that they are in flight with the caller's other loads; finish<kBatch>() then waits for the
// thread's own pieces (the caller's barrier publishes them), or, where they were not issued, copies them
// (copy_tiles_h, kBatch 16-byte loads in flight). Both reached by the whole block of tile::kThreads.
template <int kR>
struct ChunkOperands {
  __nv_bfloat16 *Q, *K, *S;
  const __nv_bfloat16 *q, *kk, *st;
  ChunkRows<kR> cr;
  int nr, P, N;
  bool async = false;
  __device__ int nP() const { return (P + 63) / 64; }
  __device__ int nN() const { return (N + 63) / 64; }
  __device__ auto state_rows() const {
    const __nv_bfloat16* b = st;
    const int n = N;
    return [=](int p) { return b + p * n; };
  }
  __device__ void issue() {
    async = copy_async_ok(cr.rows(q, N, 0)(0), N, N) && copy_async_ok(cr.rows(kk, N, 0)(0), N, N) &&
            copy_async_ok(st, N, N);
    if (!async) return;
    copy_tiles_async(Q, 1, nN(), nr, N, cr.rows(q, N, 0));
    copy_tiles_async(K, 1, nN(), nr, N, cr.rows(kk, N, 0));
    copy_tiles_async(S, nP(), nN(), P, N, state_rows());
    tile::cp_async_commit();
  }
  template <int kBatch>
  __device__ void finish() const {
    if (async) {
      tile::cp_async_wait<0>();
      return;
    }
#pragma unroll 1
    for (int o = 0; o < 2; ++o)  // q, k rows into Q, K (one copy of the copy code)
      copy_tiles_h<kBatch>(o == 0 ? Q : K, 1, nN(), nr, N, N, cr.rows(o == 0 ? q : kk, N, 0));
    copy_tiles_h<kBatch>(S, nP(), nN(), P, N, N, state_rows());
  }
};

// state_scan_mma_kernel's staging of a chunk's w rows, and of its u rows where u is bf16 (dy): a bf16 tile (64 rows
// kLdH apart) that stage_h_async fills by cp.async with rows row(r) (a bf16 pointer to the tile's first column) for
// r < rows, columns < cols (a multiple of 8; every row 16-byte aligned), zeros elsewhere: thread t copies the 16-byte
// pieces idx = t + it kThreads (it < 2), row idx / 8, columns 8 (idx % 8) ..; put_staged_h copies exactly these
// pieces into a bf16 tile, as they are or scaled (so the thread's own cp_async_wait suffices; no barrier between).
// row is called for r < rows and for r = 0 (the unread source of the zero-filled pieces).
constexpr int kStagePieces = 64 * 8 / tile::kThreads;
template <typename Row>
__device__ __forceinline__ void stage_h_async(__nv_bfloat16* g, Row row, int rows, int cols) {
#pragma unroll
  for (int it = 0; it < kStagePieces; ++it) {
    const int idx = static_cast<int>(threadIdx.x) + it * tile::kThreads, r = idx >> 3, c = 8 * (idx & 7);
    const int bytes = r < rows && c < cols ? 16 : 0;
    tile::cp_async16(g + r * tile::kLdH + c, bytes > 0 ? row(r) + c : row(0), bytes);
  }
}
__device__ __forceinline__ void put_staged_h(__nv_bfloat16* s, const __nv_bfloat16* g) {
#pragma unroll
  for (int it = 0; it < kStagePieces; ++it) {
    const int idx = static_cast<int>(threadIdx.x) + it * tile::kThreads, o = (idx >> 3) * tile::kLdH + 8 * (idx & 7);
    *reinterpret_cast<uint4*>(s + o) = *reinterpret_cast<const uint4*>(g + o);
  }
}
// put_staged_h with row r's pieces times f = scale(r) for r < rows, else 0: s = bf16(f x) (the rounding of
// load_tiles_h).
template <typename Scale>
__device__ __forceinline__ void put_staged_h(__nv_bfloat16* s, const __nv_bfloat16* g, int rows, Scale scale) {
#pragma unroll
  for (int it = 0; it < kStagePieces; ++it) {
    const int idx = static_cast<int>(threadIdx.x) + it * tile::kThreads, r = idx >> 3;
    const int o = r * tile::kLdH + 8 * (idx & 7);
    const float f = r < rows ? scale(r) : 0.0f;
    *reinterpret_cast<uint4*>(s + o) = tile::scale8_h(*reinterpret_cast<const uint4*>(g + o), f);
  }
}

// Bytes of state_scan_mma_kernel's staging tile of a chunk's u rows (UT: fp32, tile::stage_async's 64 x 64 floats;
// bf16, stage_h_async's bf16 tile).
template <typename UT>
constexpr size_t kStageU = std::is_same_v<UT, float> ? sizeof(float) * tile::kStageFloats
                                                     : sizeof(__nv_bfloat16) * tile::kTileHalves;

// Dynamic shared memory of state_scan_mma_kernel with u of type UT: the bf16 operand tiles U, W and (staged) the
// staging tiles of a chunk's u rows and w rows (43 KiB with fp32 u, 36 KiB with bf16 u: 4 blocks per SM).
template <typename UT>
constexpr size_t state_scan_smem(bool staged) {
  return sizeof(__nv_bfloat16) * 2 * tile::kTileHalves +
         (staged ? kStageU<UT> + sizeof(__nv_bfloat16) * tile::kTileHalves : 0);
}

// Whether state_scan_mma_kernel can stage u (fp32 or bf16, width P) and w (bf16, width N) by cp.async: every row
// and piece 16-byte aligned.
template <typename UT>
bool state_scan_staged(const UT* u, const __nv_bfloat16* w, const Sizes& s) {
  const bool u_ok = std::is_same_v<UT, float> ? tile::async_ok_f(u, s.P) : tile::async_ok_h(u, s.P);
  return u_ok && reinterpret_cast<uintptr_t>(w) % 16 == 0 && s.N % 8 == 0;
}

// outer_kernel and scan_kernel in one pass on the tensor cores (bf16 models): the block of one (b, h, P tile,
// N tile) walks the chunks (backward: from the last) with the running state S (64 x 64 fp32, in registers):
// out[b, h, c] = S, then S = e^{Γ_c} S + Σ_ρ bf16(w_i u_ρ) w_ρ^T (tile::Mma; the weights of outer_weight; w is
// bf16 already). to_end (u = v, fp32 or, SISO with bf16 activations, bf16; w = k): out = the states entering the
// chunks (O = bf16: rounded once); else
// (u = dy, bf16, w = q): the adjoints of the states leaving them (O = float). The next chunk's rows are copied into
// staging tiles by cp.async (u fp32: tile::stage_async, or bf16: stage_h_async; w bf16), and its G_i, Γ, σ_i
// loaded into registers (thread i), during the current chunk's product; each chunk then puts its staged rows into
// the bf16 tiles (the thread's own pieces: tile::put_h_staged or put_staged_h scaled, put_staged_h). Where u or w is
// not 16-byte aligned row by row (state_scan_staged) the rows are loaded synchronously (load_tiles_h, copy_tiles_h)
// instead; the same bf16 tiles either way. Grid (B H, P tiles, N tiles) of tile::kThreads; state_scan_smem<UT>
// (kStaged) of dynamic shared memory; two barriers per chunk.
template <bool kStaged, typename UT, typename O>
__global__ void __launch_bounds__(tile::kThreads, 4) state_scan_mma_kernel(const UT* u, const __nv_bfloat16* w,
                                                                          const double* G, const float* sig,
                                                                          Sizes s, bool to_end, O* out) {
  extern __shared__ float smem[];  // (the dynamic shared memory starts 16-byte aligned)
  __nv_bfloat16* U = reinterpret_cast<__nv_bfloat16*>(smem);  // rows ρ, columns p
  __nv_bfloat16* W = U + tile::kTileHalves;                    // rows ρ, columns n
  UT* gU = reinterpret_cast<UT*>(W + tile::kTileHalves);       // (kStaged) staged u: rows ρ, columns p0 ..
  __nv_bfloat16* gW =
      reinterpret_cast<__nv_bfloat16*>(reinterpret_cast<char*>(gU) + kStageU<UT>);  // (kStaged) staged w: columns n0 ..
  __shared__ float scale[kRows];
  __shared__ float decay_c;
  const int H = static_cast<int>(s.H), b = static_cast<int>(blockIdx.x) / H, h = static_cast<int>(blockIdx.x) % H;
  const int P = static_cast<int>(s.P), N = static_cast<int>(s.N), R = static_cast<int>(s.R);
  const int p0 = 64 * static_cast<int>(blockIdx.y), n0 = 64 * static_cast<int>(blockIdx.z);
  const auto chunk = [&](int64_t q) { return make_chunk(s, b, h, to_end ? q : s.nc - 1 - q); };
  double Gi = 0.0, gam = 0.0;  // chunk q's G_i, Γ and (to_end) σ_i, thread i < n (loaded during chunk q - 1)
  float sg = 0.0f;
  const auto fetch = [&](const Chunk& k) {
    if (kStaged) {
      const ChunkRows<0> cr(s, k);
      if constexpr (std::is_same_v<UT, float>)
        tile::stage_async(gU, cr.rows(u, P, p0), k.nr, P - p0);
      else
        stage_h_async(gU, cr.rows(u, P, p0), k.nr, P - p0);
      stage_h_async(gW, cr.rows(w, N, n0), k.nr, N - n0);
      tile::cp_async_commit();
    }
    const int i = static_cast<int>(threadIdx.x);
    if (i < k.n) {
      const int64_t g0 = (k.bh * s.nc + k.c) * s.Lc;
      Gi = G[g0 + i];
      gam = G[g0 + s.Lc - 1];
      if (to_end) sg = sig[(k.b * s.T + k.t0 + i) * s.H + k.h];
    }
  };
  if (s.nc > 1) fetch(chunk(0));
  tile::Acc S;
  S.zero();
  const bool pairs = N % 2 == 0;  // (n, n + 1) of an even n: one aligned pair store
  for (int64_t q = 0; q < s.nc; ++q) {
    const Chunk k = chunk(q);
    O* o = out + (k.bh * s.nc + k.c) * s.P * s.N;
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
      for (int j = 0; j < 4; j += 2) {  // columns n = col(j) (even) and n + 1
        const int p = p0 + tile::Mma::row(a), n = n0 + tile::Mma::col(j);
        if (p >= P || n >= N) continue;
        O* d = o + p * s.N + n;
        if (pairs) {
          if constexpr (std::is_same_v<O, float>)
            *reinterpret_cast<float2*>(d) = make_float2(S.v[a][j], S.v[a][j + 1]);
          else
            *reinterpret_cast<__nv_bfloat162*>(d) = __floats2bfloat162_rn(S.v[a][j], S.v[a][j + 1]);
        } else {
          d[0] = from_f32<O>(S.v[a][j]);
          if (n + 1 < N) d[1] = from_f32<O>(S.v[a][j + 1]);
        }
      }
    if (q == s.nc - 1) break;  // the state past the last chunk is not needed
    if (threadIdx.x < k.n) scale[threadIdx.x] = outer_weight(Gi, gam, sg, to_end);
    if (threadIdx.x == 0) decay_c = expf(static_cast<float>(gam));
    if (kStaged) tile::cp_async_wait<0>();  // this chunk's staged rows (the thread's own pieces)
    __syncthreads();  // scale, decay_c written; the previous chunk's product (reading U, W) is done
    const auto row_scale = [&](int r) { return scale[r / R]; };
    if (kStaged) {
      if constexpr (std::is_same_v<UT, float>)
        tile::put_h_staged(U, gU, k.nr, row_scale);
      else
        put_staged_h(U, gU, k.nr, row_scale);
      put_staged_h(W, gW);
    } else {
      const ChunkRows<0> cr(s, k);
      load_tiles_h(U, 1, 1, k.nr, P - p0, cr.rows(u, P, p0), row_scale);
      copy_tiles_h<2>(W, 1, 1, k.nr, N - n0, N, cr.rows(w, N, n0));
    }
    const float e = decay_c;
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
      for (int j = 0; j < 4; ++j) S.v[a][j] *= e;
    __syncthreads();  // U, W complete; every read of the staging tiles done
    if (q + 1 < s.nc - 1) fetch(chunk(q + 1));
    tile::Mma::mma<true, false>(U, W, S);  // S[p][n] += Σ_ρ (w_i u_ρ[p]) w_ρ[n]
  }
}

// fwd_out_kernel on the tensor cores (bf16 models): y_ρ[p] = e^{G_i} Σ_n q_ρ[n] S_in[p][n] + Σ_ρ' Sc[ρ][ρ'] v_ρ'[p]
// + D v_ρ[p] with bf16 q, k, S_in (stored so), v and Sc (the masked, scaled scores of fwd_out_kernel, rounded
// once), fp32 sums; D v in fp32 (v of type VT: fp32, or bf16 with bf16 activations); y stored in bf16 (rounded once,
// as column pairs where they are aligned). Every
// operand load is in flight before anything waits (the token scalars into registers, q, k, S_in by cp.async:
// ChunkOperands, the v rows). kR: R as a compile-time constant (1: SISO), or 0: s.R (ChunkRows). Grid (nc, H, B) of
// tile::kThreads; dynamic shared memory fwd_out_mma_smem (72 KiB at P = 64, N = 128: three blocks per SM, which
// __launch_bounds__ states, so that ptxas does not trade spills for a register count the shared memory rules out).
template <int kR, typename VT>
__global__ void __launch_bounds__(tile::kThreads, 3) fwd_out_mma_kernel(const __nv_bfloat16* q,
                                                                     const __nv_bfloat16* kk, const VT* v,
                                                                     const float* D, const double* G,
                                                                     const float* sig, const float* gam,
                                                                     const __nv_bfloat16* states, Sizes s,
                                                                     __nv_bfloat16* y) {
  extern __shared__ float smem[];  // (the dynamic shared memory starts 16-byte aligned)
  const int P = static_cast<int>(s.P), N = static_cast<int>(s.N), nP = (P + 63) / 64, nN = (N + 63) / 64;
  constexpr int kT = tile::kTileHalves;
  tile::Carve cv{reinterpret_cast<char*>(smem)};
  __nv_bfloat16* Q = cv.take<__nv_bfloat16>(nN * kT);        // rows ρ, columns n
  __nv_bfloat16* K = cv.take<__nv_bfloat16>(nN * kT);        // rows ρ, columns n
  __nv_bfloat16* V = cv.take<__nv_bfloat16>(nP * kT);        // rows ρ, columns p
  __nv_bfloat16* Sin = cv.take<__nv_bfloat16>(nP * nN * kT);  // rows p, columns n
  __nv_bfloat16* Sc = cv.take<__nv_bfloat16>(kT);            // rows ρ, columns ρ'
  __shared__ double Gs[kRows];
  __shared__ float sg[kRows], gm[kRows];
  const Chunk k = this_chunk(s);
  const ChunkRows<kR> cr(s, k);
  // Every operand load in flight at once: token threadIdx.x's scalars (Lc <= kRows threads) into registers, q, k,
  // S_in by cp.async (ChunkOperands), the v rows.
  const int ti = static_cast<int>(threadIdx.x);
  TokenScalars ts{0.0, 0.0f, 0.0f};
  if (ti < s.Lc) ts = token_scalars(G, sig, gam, s, k, ti);
  ChunkOperands<kR> ops{Q, K, Sin, q, kk, states + (k.bh * s.nc + k.c) * s.P * s.N, cr, k.nr, P, N};
  ops.issue();
  load_tiles_h(V, 1, nP, k.nr, P, cr.rows(v, P, 0), [](int) { return 1.0f; });
  if (ti < s.Lc) ts.put(ti, Gs, sg, gm);
  ops.template finish<4>();
  const MmaRows<kR> my(cr, k.nr);
  __syncthreads();
  {
    tile::Acc acc;
    acc.zero();
    for (int nt = 0; nt < nN; ++nt) tile::Mma::mma<false, true>(Q + nt * kT, K + nt * kT, acc);
    tile::store_acc_h(acc, Sc, [&](int rho, int rp, float d) {
      if (rho >= k.nr || rp >= k.nr) return 0.0f;
      const int i = cr.token(rho), j = cr.token(rp);
      return j < i ? decay(Gs[i], Gs[j]) * sg[j] * d : j == i ? gm[i] * d : 0.0f;
    });
  }
  __syncthreads();
  const float Dh = D[k.h];
  float ei[4];  // e^{G_i} of the thread's rows (0 past nr)
#pragma unroll
  for (int a = 0; a < 4; ++a) ei[a] = my.in(a) ? expf(static_cast<float>(Gs[my.tok(a)])) : 0.0f;
  const VT* vc = cr.base(v, P);
  __nv_bfloat16* yc = cr.base(y, P);
  const bool pairs = pairs_ok(y, P), vpairs = pairs_ok(v, P);
  for (int pt = 0; pt < nP; ++pt) {
    tile::Acc acc;
    acc.zero();
    for (int nt = 0; nt < nN; ++nt) tile::Mma::mma<false, true>(Q + nt * kT, Sin + (pt * nN + nt) * kT, acc);
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc.v[a][j] *= ei[a];
    float vo[4][4];  // D v's v: loaded during the last product, before the first y store (no load moves past it)
    my.gather(vo, vc, P, 64 * pt, vpairs);
    tile::Mma::mma<false, false>(Sc, V + pt * kT, acc);
    my.store(yc, P, 64 * pt, pairs, [&](int a, int j) { return fmaf(Dh, vo[a][j], acc.v[a][j]); });
  }
}

// The 16 threads of the Mma map that share a row: lanes l, l ^ 1, l ^ 2, l ^ 3 add their part[i] (a fixed
// butterfly: all four get the same bits), then lane l % 4 == 0 stores the warp's sum for row Mma::row(i) at
// red[(w % 4) kRows + row] (red [4][kRows]: one entry per warp w % 4 holding columns of the row). No barrier.
__device__ __forceinline__ void put_row_parts(const double (&part)[4], double* red) {
  const int lane = tile::Mma::lane(), warp = tile::Mma::warp();
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    double v = part[i];
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    if ((lane & 3) == 0) red[(warp & 3) * kRows + tile::Mma::row(i)] = v;
  }
}

// As put_row_parts for columns: lanes l ^ 4, 8, 16 share column Mma::col(j); the warp's sum goes to
// red[(w / 4) kRows + col] (red [2][kRows]).
__device__ __forceinline__ void put_col_parts(const double (&part)[4], double* red) {
  const int lane = tile::Mma::lane(), warp = tile::Mma::warp();
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    double v = part[j];
    v += __shfl_xor_sync(0xffffffffu, v, 4);
    v += __shfl_xor_sync(0xffffffffu, v, 8);
    v += __shfl_xor_sync(0xffffffffu, v, 16);
    if ((lane >> 2) == 0) red[(warp >> 2) * kRows + tile::Mma::col(j)] = v;
  }
}

// Warp-collective: the sum of x over the warp (a butterfly: every lane gets the same bits).
__device__ __forceinline__ double warp_sum(double x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Warp-collective, lane l holding the values x0, x1 of tokens 2l, 2l + 1: ex0, ex1 = their exclusive prefix
// sums in token order (a Hillis-Steele scan of the pair sums; fixed order).
__device__ __forceinline__ void warp_excl_scan2(double x0, double x1, double& ex0, double& ex1) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  double inc = x0 + x1;
  for (int o = 1; o < 32; o <<= 1) {
    const double up = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += up;
  }
  const double before = __shfl_up_sync(0xffffffffu, inc, 1);
  ex0 = lane > 0 ? before : 0.0;
  ex1 = ex0 + x0;
}

// swap_tiles_dot's pieces: 4 consecutive columns 4 c .. 4 c + 3 of a row r of the nrt x nct tiles (16 nct pieces
// a row), numbered row-major; thread x takes pieces e = x + kThreads m, walked by RowWalk (r, c). kVec (cols % 4
// == 0 and src 8-byte aligned: every piece wholly inside or outside cols, its 4 bf16 one 8-byte load), else 4
// scalar loads a piece.
// Thread x's pieces from piece number e and its place w on: v[u] = src's piece e + u kThreads (row stride cols;
// zeros outside rows x cols or past total) for u < n, issued together, as floats.
template <bool kVec, int n, bool kCol>
__device__ __forceinline__ void piece_load(float4 (&v)[n], int e, RowWalk<kCol> w, int total, int rows, int cols,
                                           const __nv_bfloat16* src) {
#pragma unroll
  for (int u = 0; u < n; ++u, w.next()) {
    const int c = 4 * w.c;
    const bool in = e + u * tile::kThreads < total && w.r < rows;
    const __nv_bfloat16* p = src + (w.r * cols + c);
    if constexpr (kVec) {
      const uint2 h = in && c < cols ? *reinterpret_cast<const uint2*>(p) : make_uint2(0u, 0u);
      const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&h.x));
      const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&h.y));
      v[u] = make_float4(lo.x, lo.y, hi.x, hi.y);
    } else {
      v[u].x = in && c < cols ? to_f32(p[0]) : 0.0f;
      v[u].y = in && c + 1 < cols ? to_f32(p[1]) : 0.0f;
      v[u].z = in && c + 2 < cols ? to_f32(p[2]) : 0.0f;
      v[u].w = in && c + 3 < cols ? to_f32(p[3]) : 0.0f;
    }
  }
}

// The swap of piece_load's n pieces (same e, w; w is advanced past them, or left where the pieces end): dot +=
// v[u] X there in element order, then X = bf16(v[u]) (dst nct tiles wide, h_at; a piece's 4 bf16 one 8-byte load
// and store).
template <int n, bool kCol>
__device__ __forceinline__ void piece_swap(const float4 (&v)[n], int e, RowWalk<kCol>& w, int total, int nct,
                                           __nv_bfloat16* dst, double& dot) {
#pragma unroll
  for (int u = 0; u < n; ++u, w.next()) {
    if (e + u * tile::kThreads >= total) break;  // (and every later one)
    uint2* x = reinterpret_cast<uint2*>(dst + h_at(w.r, 4 * w.c, nct));
    uint2 h = *x;
    __nv_bfloat162* hp = reinterpret_cast<__nv_bfloat162*>(&h);
    const float2 lo = __bfloat1622float2(hp[0]), hi = __bfloat1622float2(hp[1]);
    dot += static_cast<double>(v[u].x) * lo.x;
    dot += static_cast<double>(v[u].y) * lo.y;
    dot += static_cast<double>(v[u].z) * hi.x;
    dot += static_cast<double>(v[u].w) * hi.y;
    hp[0] = __floats2bfloat162_rn(v[u].x, v[u].y);
    hp[1] = __floats2bfloat162_rn(v[u].z, v[u].w);
    *x = h;
  }
}

// Calls f(kCol, kVec) (std::bool_constant) for swap_tiles_dot's walk of nct tiles wide over src [.][cols]: kCol,
// RowWalk's short form where the 16 nct pieces of a row divide kThreads; kVec as at piece_load.
template <class F>
__device__ __forceinline__ auto swap_form(int nct, int cols, const __nv_bfloat16* src, F f) {
  const bool col = tile::kThreads % (16 * nct) == 0;
  const bool vec = cols % 4 == 0 && reinterpret_cast<uintptr_t>(src) % 8 == 0;
  if (col) return vec ? f(std::true_type{}, std::true_type{}) : f(std::true_type{}, std::false_type{});
  return vec ? f(std::false_type{}, std::true_type{}) : f(std::false_type{}, std::false_type{});
}

// The first kAhead of the thread's pieces of swap_tiles_dot (same arguments), issued together ahead of the swap
// (8: all of them at P = 64, N = 128).
template <int kAhead>
__device__ __forceinline__ void swap_ahead(float4 (&v)[kAhead], int nrt, int nct, int rows, int cols,
                                           const __nv_bfloat16* src) {
  const int total = 64 * nrt * 16 * nct;
  swap_form(nct, cols, src, [&](auto col, auto vec) {
    piece_load<decltype(vec)::value>(v, static_cast<int>(threadIdx.x), RowWalk<decltype(col)::value>(16 * nct),
                                     total, rows, cols, src);
  });
}

// dst (nrt x nct bf16 tiles, h_at) holds bf16 matrix X on entry; becomes src [rows][cols] (bf16; row stride cols; 0
// outside), the thread's first kAhead pieces taken from ahead (swap_ahead), the rest loaded
// here, kBatch at a time. Returns this thread's Σ src X over the elements it replaced, in element order (its
// pieces in order, each piece's columns in order; each thread reads X only where it then writes, so no barrier is
// needed before). Reached by the whole block of tile::kThreads.
template <int kAhead>
__device__ double swap_tiles_dot(__nv_bfloat16* dst, int nrt, int nct, int rows, int cols, const __nv_bfloat16* src,
                                 const float4 (&ahead)[kAhead]) {
  return swap_form(nct, cols, src, [&](auto col, auto vec) {
    constexpr int kBatch = 4;
    const int total = 64 * nrt * 16 * nct;
    double dot = 0.0;
    RowWalk<decltype(col)::value> w(16 * nct);
    piece_swap(ahead, static_cast<int>(threadIdx.x), w, total, nct, dst, dot);
    for (int e0 = threadIdx.x + kAhead * tile::kThreads; e0 < total; e0 += kBatch * tile::kThreads) {
      float4 v[kBatch];
      piece_load<decltype(vec)::value>(v, e0, w, total, rows, cols, src);
      piece_swap(v, e0, w, total, nct, dst, dot);
    }
    return dot;
  });
}

// bwd_chunk_kernel on the tensor cores (bf16 models): the same gradients (formulas there) with q, k, S_in, dy
// (stored in bf16), v, dS and the coefficient tiles Adq, Bdv rounded to bf16 once into shared bf16 tiles, every
// product on tile::Mma (fp32 sums in registers). The per-token sums come from the fp32 accumulators (inter, Z and
// v·dy with fp32 v and the bf16 dy's values) as per-row / per-column double partials in a fixed order, so no fp32
// S1, S2, Yb tiles: with
// W_ρρ' = σ_j Yb_ρρ' (j < i), the quadrant Σ_{i>=t, j<t} W is the exclusive token prefix of
// σ_t colY_t - rowW_t (colY_t = Σ_{i>t} Yb over token t's columns = dσ_t - Z_t, rowW_t = Σ_{j<t} W over
// token t's rows), so da_t = e^Γ <dS, S_in> + Σ_i inter_i + Σ_{u<t} (σ_u dσ_u - rowW_u - inter_u), one warp
// scan in double. <dS, S_in> from dS and the bf16 S_in. S_in and dS share one set of tiles (S_in for inter
// and dq, then dS for dk, dv). In flight at the start, before anything waits: the token scalars (registers),
// q, k, S_in and dy by cp.async (copy_tiles_async; where a row is not 16-byte pieces, copy_tiles_h after the rest),
// an L2 prefetch of dS and the v rows (load_tiles_h); dS's own loads are issued before dq's products, the last
// ones on S_in (swap_ahead; 16-byte loads of 4-column pieces, swapped 8 bytes at a time), v and dy under the
// thread's accumulator entries as fp32 (MmaRows::gather; pairs of 8 and 4 bytes in the SISO kernel) ahead of
// the products whose results they meet, the first P tile's across a barrier: dy for inter (and D) before the
// barrier that ends the coefficient tiles, v and dy once for Z, v·dy and D dy before the one that publishes dS
// (v·dy beside Z: no loads of its own). <dS, S_in>: per-warp sums that warp 0 adds at the end in block_reduce's
// order (no block-wide reduction in between). Five barriers. Grid (nc, H, B) of tile::kThreads,
// two blocks per SM at P = 64, N = 128; dynamic shared memory bwd_mma_smem. kR: R as a compile-time constant (1:
// SISO), or 0: s.R (ChunkRows). VT: the type of v and dv (fp32, or bf16 with bf16 activations: dv rounded once on its
// store).
template <int kR, typename VT>
__global__ void __launch_bounds__(tile::kThreads, 2) bwd_chunk_mma_kernel(
    const __nv_bfloat16* q, const __nv_bfloat16* kk, const VT* v, const __nv_bfloat16* dy, const float* D,
    const double* G, const float* sig, const float* gam, const __nv_bfloat16* states, const __nv_bfloat16* dstates,
    Sizes s,
    float* dq, float* dk, VT* dv, float* da, float* dgam, float* dsig, double* dDp) {
  extern __shared__ float smem[];  // (the dynamic shared memory starts 16-byte aligned)
  const int P = static_cast<int>(s.P), N = static_cast<int>(s.N), nP = (P + 63) / 64, nN = (N + 63) / 64;
  constexpr int kT = tile::kTileHalves;
  using tile::Mma;
  tile::Carve cv{reinterpret_cast<char*>(smem)};
  __nv_bfloat16* Q = cv.take<__nv_bfloat16>(nN * kT);       // rows ρ, columns n
  __nv_bfloat16* K = cv.take<__nv_bfloat16>(nN * kT);       // rows ρ, columns n
  __nv_bfloat16* V = cv.take<__nv_bfloat16>(nP * kT);       // rows ρ, columns p
  __nv_bfloat16* DY = cv.take<__nv_bfloat16>(nP * kT);      // rows ρ, columns p
  __nv_bfloat16* S = cv.take<__nv_bfloat16>(nP * nN * kT);  // rows p, columns n: S_in, then dS
  __nv_bfloat16* Adq = cv.take<__nv_bfloat16>(kT);          // rows ρ, columns ρ'
  __nv_bfloat16* Bdv = cv.take<__nv_bfloat16>(kT);          // rows ρ, columns ρ'
  // Per-row double partials (put_row_parts / put_col_parts): the diagonal-block Yb, rowW, colY (columns),
  // inter / e^{G_i}, Z / f_j, v·dy.
  enum { kDiag, kRowW, kColY, kInter, kZ, kVdy, kParts };
  __shared__ double red[kParts][4 * kRows];
  __shared__ double Gs[kRows], sdw[tile::kThreads / 32];  // sdw: the warps' parts of <dS, S_in>
  __shared__ float sg[kRows], gm[kRows], eg[kRows], fe[kRows];  // σ, γ, e^{G_i}, f_i = e^{Γ - G_i}
  const Chunk k = this_chunk(s);
  const ChunkRows<kR> cr(s, k);
  const int64_t base = k.bh * s.nc + k.c;
  const __nv_bfloat16* sin = states + base * s.P * s.N;
  const __nv_bfloat16* dS = dstates + base * s.P * s.N;
  // Every load of the operands in flight at once: token threadIdx.x's scalars (Lc <= kRows threads) into
  // registers; q, k, S_in and dy by cp.async (ChunkOperands, then dy's own group; where they do not come in 16-byte
  // pieces, copied after the rest); dS asked into the L2 (loaded after inter, ahead of dq's products); v rounded on
  // its way into V.
  const int ti = static_cast<int>(threadIdx.x);
  TokenScalars ts{0.0, 0.0f, 0.0f};
  double gl = 0.0;  // Γ
  if (ti < s.Lc) {
    ts = token_scalars(G, sig, gam, s, k, ti);
    gl = G[base * s.Lc + s.Lc - 1];
  }
  ChunkOperands<kR> ops{Q, K, S, q, kk, sin, cr, k.nr, P, N};
  ops.issue();
  const bool dy_async = copy_async_ok(cr.rows(dy, P, 0)(0), P, P);
  if (dy_async) {
    copy_tiles_async(DY, 1, nP, k.nr, P, cr.rows(dy, P, 0));
    tile::cp_async_commit();
  }
  tile::prefetch_l2(dS, 2 * s.N, P, 2 * s.N);
  load_tiles_h(V, 1, nP, k.nr, P, cr.rows(v, P, 0), [](int) { return 1.0f; });
  if (ti < s.Lc) {
    ts.put(ti, Gs, sg, gm);
    eg[ti] = expf(static_cast<float>(ts.G));
    fe[ti] = expf(static_cast<float>(gl - ts.G));
  }
  ops.template finish<8>();
  if (dy_async)
    tile::cp_async_wait<0>();
  else
    copy_tiles_h<8>(DY, 1, nP, k.nr, P, P, cr.rows(dy, P, 0));
  const MmaRows<kR> my(cr, k.nr);
  __syncthreads();
  // Sqk, Sdv -> the coefficient tiles (in the accumulators' places) and the Yb partials.
  {
    tile::Acc sqk, sdv;
    sqk.zero();
    sdv.zero();
    for (int nt = 0; nt < nN; ++nt) Mma::mma<false, true>(Q + nt * kT, K + nt * kT, sqk);
    for (int pt = 0; pt < nP; ++pt) Mma::mma<false, true>(DY + pt * kT, V + pt * kT, sdv);
    double diag[4] = {}, roww[4] = {}, coly[4] = {};
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int rp = Mma::col(c), i = my.tok(a), j = cr.token(rp);
        const float qk = sqk.v[a][c], dv_ = sdv.v[a][c];
        float adq = 0.0f, bdv = 0.0f;
        if (my.in(a) && rp < k.nr && j < i) {
          const float E = decay(Gs[i], Gs[j]), y = dv_ * E * qk;
          adq = dv_ * E * sg[j];
          bdv = sg[j] * qk * E;
          coly[c] += y;
          roww[a] += static_cast<double>(sg[j]) * y;
        } else if (my.in(a) && j == i) {
          adq = gm[i] * dv_;
          bdv = gm[i] * qk;
          diag[a] += dv_ * qk;
        }
        sdv.v[a][c] = adq;
        sqk.v[a][c] = bdv;
      }
    const auto same = [](int, int, float x) { return x; };
    tile::store_acc_h(sdv, Adq, same);
    tile::store_acc_h(sqk, Bdv, same);
    put_row_parts(diag, red[kDiag]);
    put_row_parts(roww, red[kRowW]);
    put_col_parts(coly, red[kColY]);
  }
  // v (VT) and dy (bf16) as fp32 under the thread's accumulator entries of P tile pt (MmaRows::gather; the
  // chunk's rows at vc, dyc): dy for inter, then v and dy for Z, v·dy and D dy, each gathered ahead of the products
  // whose results it meets (inter's first tile before this barrier; D, for D dy, too).
  const VT* vc = cr.base(v, P);
  const __nv_bfloat16* dyc = cr.base(dy, P);
  float vo[4][4], dyo[4][4];
  const bool pairs = pairs_ok(dq, N) && pairs_ok(dk, N) && pairs_ok(dv, P);  // (all or none: one flag)
  // v, dy as pairs (both or neither; SISO only: in the MIMO kernel the pair loads' registers cost spills)
  const bool vpairs = kR == 1 && pairs_ok(v, P) && pairs_ok(dy, P);
  my.gather(dyo, dyc, P, 0, vpairs);
  const float Dh = D[k.h];
  __syncthreads();
  auto scale_rows = [&](tile::Acc& acc, const float* w) {  // acc row ρ *= w[i] (0 past nr)
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      const float x = my.in(a) ? w[my.tok(a)] : 0.0f;
#pragma unroll
      for (int c = 0; c < 4; ++c) acc.v[a][c] *= x;
    }
  };
  auto store_rows = [&](const tile::Acc& acc, int c0, int width, float* out) {  // out row ρ, columns c0 + col
    my.store(cr.base(out, width), width, c0, pairs, [&](int a, int c) { return acc.v[a][c]; });
  };
  // The inter partials Σ_p dy_ρ[p] (S_in q_ρ)[p] per P tile.
  {
    double inter[4] = {};
    for (int pt = 0; pt < nP; ++pt) {
      if (pt > 0) my.gather(dyo, dyc, P, 64 * pt, vpairs);
      tile::Acc acc;
      acc.zero();
      for (int nt = 0; nt < nN; ++nt) Mma::mma<false, true>(Q + nt * kT, S + (pt * nN + nt) * kT, acc);
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int p = 64 * pt + Mma::col(c);
          if (my.in(a) && p < P) inter[a] += dyo[a][c] * acc.v[a][c];
        }
    }
    put_row_parts(inter, red[kInter]);
  }
  // dS's first pieces of the swap (4 floats each), loaded ahead of dq's products (4 in the MIMO kernel: its
  // run-time rank's registers leave no room for 8).
  {
    float4 dS_ahead[kR == 1 ? 8 : 4];
    swap_ahead(dS_ahead, nP, nN, P, N, dS);
    // dq per N tile.
    for (int nt = 0; nt < nN; ++nt) {
      tile::Acc acc;
      acc.zero();
      for (int pt = 0; pt < nP; ++pt) Mma::mma<false, false>(DY + pt * kT, S + (pt * nN + nt) * kT, acc);
      scale_rows(acc, eg);
      Mma::mma<false, false>(Adq, K + nt * kT, acc);
      store_rows(acc, 64 * nt, N, dq);
    }
    __syncthreads();  // S_in's readers are done
    // <dS, S_in>: each warp's sum into sdw (warp_sum); warp 0 adds them at the end in block_reduce's order.
    const double sd = warp_sum(swap_tiles_dot(S, nP, nN, P, N, dS, dS_ahead));
    if (Mma::lane() == 0) sdw[Mma::warp()] = sd;
  }
  my.gather(vo, vc, P, 0, vpairs);  // (ahead of dk's products)
  my.gather(dyo, dyc, P, 0, vpairs);
  __syncthreads();  // dS in S
  // dk per N tile.
  for (int nt = 0; nt < nN; ++nt) {
    tile::Acc acc;
    acc.zero();
    for (int pt = 0; pt < nP; ++pt) Mma::mma<false, false>(V + pt * kT, S + (pt * nN + nt) * kT, acc);
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      const float x = my.in(a) ? sg[my.tok(a)] * fe[my.tok(a)] : 0.0f;
#pragma unroll
      for (int c = 0; c < 4; ++c) acc.v[a][c] *= x;
    }
    Mma::mma<true, false>(Adq, Q + nt * kT, acc);
    store_rows(acc, 64 * nt, N, dk);
  }
  // dv per P tile, with the Z partials Σ_p v_ρ[p] (dS k_ρ)[p] and v·dy.
  {
    VT* dvc = cr.base(dv, P);
    double z[4] = {}, vdy[4] = {};
    for (int pt = 0; pt < nP; ++pt) {
      if (pt > 0) {
        my.gather(vo, vc, P, 64 * pt, vpairs);
        my.gather(dyo, dyc, P, 64 * pt, vpairs);
      }
      tile::Acc acc;
      acc.zero();
      for (int nt = 0; nt < nN; ++nt) Mma::mma<false, true>(K + nt * kT, S + (pt * nN + nt) * kT, acc);
#pragma unroll
      for (int a = 0; a < 4; ++a) {
        const float x = my.in(a) ? sg[my.tok(a)] * fe[my.tok(a)] : 0.0f;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int p = 64 * pt + Mma::col(c);
          if (my.in(a) && p < P) {
            z[a] += vo[a][c] * acc.v[a][c];
            vdy[a] += static_cast<double>(vo[a][c]) * dyo[a][c];
          }
          acc.v[a][c] *= x;
        }
      }
      Mma::mma<true, false>(Bdv, DY + pt * kT, acc);
      my.store(dvc, P, 64 * pt, pairs, [&](int a, int c) { return fmaf(Dh, dyo[a][c], acc.v[a][c]); });
    }
    put_row_parts(z, red[kZ]);
    put_row_parts(vdy, red[kVdy]);
  }
  __syncthreads();
  if (threadIdx.x >= 32) return;
  // Warp 0: the per-token sums (lane l: tokens 2l, 2l + 1), then da by one scan.
  const int lane = static_cast<int>(threadIdx.x), R = cr.rank();
  // Σ over token t's rows of part q (4 warp entries per row; 2 for kColY): fixed loop bounds (R = 1 in the SISO
  // kernel), the rank loop not unrolled (small R otherwise).
  auto row_sum = [&](int q, int t) {
    double acc = 0.0;
#pragma unroll 1
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int w = 0; w < (q == kColY ? 2 : 4); ++w) acc += red[q][w * kRows + t * R + r];
    return acc;
  };
  double dsg[2], dgm[2], step[2], inter[2], vd[2];
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const int t = 2 * lane + u;
    dsg[u] = dgm[u] = step[u] = inter[u] = vd[u] = 0.0;
    if (t >= k.n) continue;
    inter[u] = eg[t] * row_sum(kInter, t);
    dsg[u] = row_sum(kColY, t) + fe[t] * row_sum(kZ, t);
    dgm[u] = row_sum(kDiag, t) + dsg[u];
    step[u] = sg[t] * dsg[u] - row_sum(kRowW, t) - inter[u];
    vd[u] = row_sum(kVdy, t);
  }
  double ex[2];
  warp_excl_scan2(step[0], step[1], ex[0], ex[1]);
  const double dD = warp_sum(vd[0] + vd[1]);
  const double sd = warp_sum(lane < tile::kThreads / 32 ? sdw[lane] : 0.0);  // <dS, S_in>
  const double state = exp(Gs[s.Lc - 1]) * sd + warp_sum(inter[0] + inter[1]);
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const int t = 2 * lane + u;
    if (t >= k.n) continue;
    const int64_t e = (k.b * s.T + k.t0 + t) * s.H + k.h;
    da[e] = static_cast<float>(state + ex[u]);
    dsig[e] = static_cast<float>(dsg[u]);
    dgam[e] = static_cast<float>(dgm[u]);
  }
  if (lane == 0) dDp[base] = dD;
}

size_t out_smem(const Sizes& s) { return sizeof(float) * kRows * (2 * (s.N + 1) + (s.P + 1) + kSq); }
size_t bwd_smem(const Sizes& s) { return sizeof(float) * kRows * (2 * (s.N + 1) + 4 * (s.P + 1) + 3 * kSq); }
size_t outer_smem(const Sizes& s) { return sizeof(float) * kRows * (s.P + 1 + s.N + 1); }
int64_t tiles64(int64_t n) { return ceil_div(n, 64); }
size_t fwd_out_mma_smem(const Sizes& s) {
  const int64_t nP = tiles64(s.P), nN = tiles64(s.N);
  return 2 * tile::kTileHalves * static_cast<size_t>(2 * nN + nP + nP * nN + 1);
}
size_t bwd_mma_smem(const Sizes& s) {
  const int64_t nP = tiles64(s.P), nN = tiles64(s.N);
  return 2 * tile::kTileHalves * static_cast<size_t>(2 * nN + 2 * nP + nP * nN + 2);
}

template <typename K>
size_t smem_for(K kernel, size_t bytes) {
  LLMT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  return bytes;
}

dim3 chunk_grid(const Sizes& s) {
  return dim3(static_cast<unsigned>(s.nc), static_cast<unsigned>(s.H), static_cast<unsigned>(s.B));
}

// The chunk states: to_end (u = v, w = k) the states entering each chunk (into buf.states), else (u = dy, w = q)
// the adjoints of the states leaving each chunk (into buf.dstates). fp32: each chunk's contribution (outer_kernel),
// then scan_kernel (u: buf.v or buf.dy; w: buf.k or buf.q); bf16 products: both in state_scan_mma_kernel (u: buf.v,
// or buf.vh with bf16 activations, or buf.dy_h; w: buf.kh or buf.qh; into buf.states_h or buf.dstates_h).
void chunk_states(bool to_end, const Sizes& s, const Buffers& buf, bool bf16, cudaStream_t stream) {
  if (bf16) {
    const __nv_bfloat16* w = to_end ? buf.kh : buf.qh;
    const dim3 grid(static_cast<unsigned>(s.B * s.H), static_cast<unsigned>(tiles64(s.P)),
                    static_cast<unsigned>(tiles64(s.N)));
    const auto launch = [&](const auto* u, auto* o) {
      using UT = std::remove_cv_t<std::remove_pointer_t<decltype(u)>>;
      using O = std::remove_pointer_t<decltype(o)>;
      const bool staged = state_scan_staged(u, w, s);
      const auto kernel = staged ? state_scan_mma_kernel<true, UT, O> : state_scan_mma_kernel<false, UT, O>;
      kernel<<<grid, tile::kThreads, smem_for(kernel, state_scan_smem<UT>(staged)), stream>>>(u, w, buf.G, buf.sig,
                                                                                             s, to_end, o);
      LLMT_CUDA_CHECK_LAUNCH();
    };
    if (to_end && buf.vh != nullptr)
      launch(static_cast<const __nv_bfloat16*>(buf.vh), buf.states_h);
    else if (to_end)
      launch(static_cast<const float*>(buf.v), buf.states_h);
    else
      launch(static_cast<const __nv_bfloat16*>(buf.dy_h), buf.dstates_h);
    return;
  }
  const float* u = to_end ? buf.v : buf.dy;
  float* out = to_end ? buf.states : buf.dstates;
  const float* w = to_end ? buf.k : buf.q;
  outer_kernel<<<chunk_grid(s), kCoreThreads, smem_for(outer_kernel, outer_smem(s)), stream>>>(u, w, buf.G, buf.sig, s,
                                                                                               to_end, out);
  LLMT_CUDA_CHECK_LAUNCH();
  scan_kernel<<<grid_for(s.B * s.H * s.P * s.N), kThreads, 0, stream>>>(out, buf.G, s, !to_end);
  LLMT_CUDA_CHECK_LAUNCH();
}

// G and the states entering each chunk.
void forward_states(const Sizes& s, const Buffers& buf, bool bf16, cudaStream_t stream) {
  cumsum_kernel<<<grid_for(s.B * s.H * s.nc, kCumThreads), kCumThreads, 0, stream>>>(buf.a, s, buf.G);
  LLMT_CUDA_CHECK_LAUNCH();
  chunk_states(true, s, buf, bf16, stream);
}

}  // namespace

void core_check(const Sizes& s, bool bf16) {
  int dev = 0, optin = 0;
  LLMT_CUDA_CHECK(cudaGetDevice(&dev));
  LLMT_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  // The static arrays of bwd_chunk_kernel (and block_reduce's) take 7 64 doubles, 2 64 floats and 32 doubles;
  // fwd_out_mma_kernel's 64 doubles and 2 64 floats; bwd_chunk_mma_kernel's 25 64 + 8 doubles and 4 64 floats.
  const size_t need = bf16 ? std::max(fwd_out_mma_smem(s) + 8 * kRows + 4 * 2 * kRows,
                                      bwd_mma_smem(s) + 8 * (25 * kRows + 8) + 4 * 4 * kRows)
                           : bwd_smem(s) + 8 * (7 * kRows + 32) + 4 * 2 * kRows;
  check(need <= static_cast<size_t>(optin),
        "mamba3 (cuda): the core needs {} bytes of shared memory per block for head_dim {} and d_state {}, the "
        "device has {}",
        need, s.P, s.N, optin);
  check(s.R <= kRows, "mamba3 (cuda): mimo_rank {} exceeds {}", s.R, kRows);
  // ChunkRows' 32-bit offsets: a chunk's rows span Lc H R rows of up to max(P, N) floats.
  check(s.Lc * s.H * s.R * std::max(s.P, s.N) <= 2147483647LL,
        "mamba3 (cuda): a chunk spans more than 2^31 elements (heads {} rank {} head_dim {} d_state {})", s.H, s.R,
        s.P, s.N);
  check(s.H <= 65535 && s.B <= 65535 && s.nc <= 2147483647LL && s.B * s.H <= 2147483647LL,
        "mamba3 (cuda): grid too large (B {} H {} T {})", s.B, s.H, s.T);
}

void core_fwd(const float* D, const Sizes& s, const Buffers& buf, bool bf16, cudaStream_t stream) {
  forward_states(s, buf, bf16, stream);
  if (bf16) {
    const auto launch = [&](const auto* v) {  // v fp32 (buf.v) or bf16 (buf.vh: SISO with bf16 activations)
      using V = std::remove_cv_t<std::remove_pointer_t<decltype(v)>>;
      const auto kernel = s.R == 1 ? fwd_out_mma_kernel<1, V> : fwd_out_mma_kernel<0, V>;
      kernel<<<chunk_grid(s), tile::kThreads, smem_for(kernel, fwd_out_mma_smem(s)), stream>>>(
          buf.qh, buf.kh, v, D, buf.G, buf.sig, buf.gam, buf.states_h, s, buf.y_h);
    };
    if (buf.vh != nullptr)
      launch(static_cast<const __nv_bfloat16*>(buf.vh));
    else
      launch(static_cast<const float*>(buf.v));
  } else {
    fwd_out_kernel<<<chunk_grid(s), kCoreThreads, smem_for(fwd_out_kernel, out_smem(s)), stream>>>(
        buf.q, buf.k, buf.v, D, buf.G, buf.sig, buf.gam, buf.states, s, buf.y);
  }
  LLMT_CUDA_CHECK_LAUNCH();
}

void core_bwd(const float* D, const Sizes& s, const Buffers& buf, bool bf16, cudaStream_t stream) {
  // Each chunk's dS_out from the dS_in contributions Σ_i e^{G_i} dy_ρ q_ρ^T.
  chunk_states(false, s, buf, bf16, stream);
  if (bf16) {
    const auto launch = [&](const auto* v, auto* dv) {  // v, dv fp32 (buf.v, dv) or bf16 (buf.vh, dvh)
      using V = std::remove_pointer_t<decltype(dv)>;
      const auto kernel = s.R == 1 ? bwd_chunk_mma_kernel<1, V> : bwd_chunk_mma_kernel<0, V>;
      kernel<<<chunk_grid(s), tile::kThreads, smem_for(kernel, bwd_mma_smem(s)), stream>>>(
          buf.qh, buf.kh, v, buf.dy_h, D, buf.G, buf.sig, buf.gam, buf.states_h, buf.dstates_h, s, buf.dq, buf.dk, dv,
          buf.da, buf.dgam, buf.dsig, buf.dDp);
    };
    if (buf.vh != nullptr)
      launch(static_cast<const __nv_bfloat16*>(buf.vh), buf.dvh);
    else
      launch(static_cast<const float*>(buf.v), buf.dv);
  } else {
    bwd_chunk_kernel<<<chunk_grid(s), kBwdThreads, smem_for(bwd_chunk_kernel, bwd_smem(s)), stream>>>(
        buf.q, buf.k, buf.v, buf.dy, D, buf.G, buf.sig, buf.gam, buf.states, buf.dstates, s, buf.dq, buf.dk, buf.dv,
        buf.da, buf.dgam, buf.dsig, buf.dDp);
  }
  LLMT_CUDA_CHECK_LAUNCH();
}

}  // namespace llmt::cuda::m3
