// Causal multi-head softmax attention on CUDA, flash-attention-2 style (fp32, CUDA-core FMA).
// Semantics: src/kernels/cpu/attention.h (the reference) and layers-ssm-attn.md section 3.3.
//   q, k, v, o, dout, dq, dk, dv: [batch, seq_len, heads, head_dim] row-major;
//   lse, Delta (scratch): [batch, heads, seq_len].
// The [T, T] score matrix is never written to device memory: 64x64 tiles of S, P and dS live
// in registers and shared memory only. Every sum runs in a fixed order (no atomics), so the
// results are bit-identical from run to run.
//
// Block layout shared by every tiled kernel: 128 threads own a 64x64 tile of scores as a
// 16 x 8 grid; thread (ty = tid / 8, tx = tid % 8) owns rows ty + 16 i (i < 4) and columns
// tx + 8 j (j < 8). A 64 x D output tile (O, dQ, dK, dV) is owned with the same rows and the
// columns 32 c + 4 tx + e (c < D / 32, e < 4). The 8 threads sharing a row are 8 consecutive
// lanes of one warp, so row reductions are __shfl_xor_sync over lane masks 1, 2, 4.
// Shared-memory tiles are row-major with padded leading dimensions (D + 4 for the [64, D]
// tiles, 72 for the [64, 64] P / dS tiles) so the float4 reads of the inner loops are free
// of bank conflicts.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "core/error.h"
#include "kernels/cuda/ops.cuh"

namespace llmt::cuda {
namespace {

constexpr int kTile = 64;      // rows of a query tile = rows of a key tile
constexpr int kThreads = 128;  // threads of every tiled kernel
constexpr int kLdP = kTile + 8;  // leading dimension of the [64, 64] P / dS tiles in shared memory

__device__ __forceinline__ float component(const float4& v, int e) {
  return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w;
}

// Loads rows row0 .. row0 + 63 of one (batch, head) slice into dst[64][D + 4]; rows >= T are
// zero-filled. src points at element [b, 0, h, 0]; consecutive rows are row_stride apart.
// Consecutive threads read consecutive float4 of a row (coalesced).
template <int D>
__device__ __forceinline__ void load_tile(float* dst, const float* __restrict__ src, int64_t row_stride, int row0,
                                          int T, int tid) {
  constexpr int kC4 = D / 4;  // float4 per row
  constexpr int kLd = D + 4;
#pragma unroll
  for (int it = 0; it < kTile * kC4 / kThreads; ++it) {
    const int idx = it * kThreads + tid;
    const int r = idx / kC4;
    const int c = idx % kC4;
    const int t = row0 + r;
    float4 val = make_float4(0.f, 0.f, 0.f, 0.f);
    if (t < T) val = *reinterpret_cast<const float4*>(src + static_cast<int64_t>(t) * row_stride + 4 * c);
    *reinterpret_cast<float4*>(dst + r * kLd + 4 * c) = val;
  }
}

// acc[i][j] += sum_{k < K} A[ty + 16 i][k] * B[tx + 8 j][k]    (A [64][LDA], B [64][LDB] in
// shared memory, both with the summed index contiguous: S = Q K^T-style products).
template <int K, int LDA, int LDB>
__device__ __forceinline__ void mma_nt(const float* A, const float* B, int ty, int tx, float (&acc)[4][8]) {
#pragma unroll 1
  for (int k = 0; k < K; k += 4) {
    float4 a[4], b[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = *reinterpret_cast<const float4*>(A + (ty + 16 * i) * LDA + k);
#pragma unroll
    for (int j = 0; j < 8; ++j) b[j] = *reinterpret_cast<const float4*>(B + (tx + 8 * j) * LDB + k);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        float s = acc[i][j];
        s = fmaf(a[i].x, b[j].x, s);
        s = fmaf(a[i].y, b[j].y, s);
        s = fmaf(a[i].z, b[j].z, s);
        s = fmaf(a[i].w, b[j].w, s);
        acc[i][j] = s;
      }
    }
  }
}

// acc[i][4 c + e] += sum_{k < 64} A[ty + 16 i][k] * B[k][32 c + 4 tx + e]   (A [64][LDA] with
// the summed index contiguous, B [64][LDB] with the summed index as its row: O += P V-style).
template <int D, int LDA, int LDB>
__device__ __forceinline__ void mma_nn(const float* A, const float* B, int ty, int tx, float (&acc)[4][D / 8]) {
#pragma unroll 1
  for (int k = 0; k < kTile; k += 4) {
    float4 a[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = *reinterpret_cast<const float4*>(A + (ty + 16 * i) * LDA + k);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
      for (int c = 0; c < D / 32; ++c) {
        const float4 b = *reinterpret_cast<const float4*>(B + (k + kk) * LDB + 32 * c + 4 * tx);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float ai = component(a[i], kk);
          acc[i][4 * c + 0] = fmaf(ai, b.x, acc[i][4 * c + 0]);
          acc[i][4 * c + 1] = fmaf(ai, b.y, acc[i][4 * c + 1]);
          acc[i][4 * c + 2] = fmaf(ai, b.z, acc[i][4 * c + 2]);
          acc[i][4 * c + 3] = fmaf(ai, b.w, acc[i][4 * c + 3]);
        }
      }
    }
  }
}

// Writes a [64, D] register tile (owned as in mma_nn) times `mul` to rows row0 + ty + 16 i < T.
template <int D>
__device__ __forceinline__ void store_tile(float* __restrict__ dst, int64_t row_stride, int row0, int T, int ty,
                                           int tx, const float (&acc)[4][D / 8], float mul) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int t = row0 + ty + 16 * i;
    if (t >= T) continue;
    float* row = dst + static_cast<int64_t>(t) * row_stride;
#pragma unroll
    for (int c = 0; c < D / 32; ++c) {
      *reinterpret_cast<float4*>(row + 32 * c + 4 * tx) =
          make_float4(acc[i][4 * c + 0] * mul, acc[i][4 * c + 1] * mul, acc[i][4 * c + 2] * mul,
                      acc[i][4 * c + 3] * mul);
    }
  }
}

// Shared-memory floats of each kernel (byte counts: times 4).
template <int D>
constexpr int fwd_smem_floats() {
  // Q tile, K tile (reused for P after S is computed), V tile.
  return kTile * (D + 4) + (kTile * (D + 4) > kTile * kLdP ? kTile * (D + 4) : kTile * kLdP) + kTile * (D + 4);
}
template <int D>
constexpr int bwd_dkdv_smem_floats() {
  return 4 * kTile * (D + 4) + 2 * kTile * kLdP + 2 * kTile;  // K, V, Q, dO; P, dS; lse, Delta
}
template <int D>
constexpr int bwd_dq_smem_floats() {
  return 4 * kTile * (D + 4) + kTile * kLdP;  // Q, dO, K, V; P / dS
}

// ---------------------------------------------------------------------------------------------
// Forward. One block per (query tile of 64 rows, batch * head). Flash-attention-2 online
// softmax (Dao 2023, "FlashAttention-2", Algorithm 1), over key tiles j = 0 .. (own tile):
//   S_j   = scale * Q K_j^T, with S = -inf where key > query        (layers-ssm-attn.md 3.3)
//   m_new = max(m, rowmax S_j);   alpha = exp(m - m_new)
//   P_j   = exp(S_j - m_new);     l = alpha l + rowsum P_j;   O = alpha O + P_j V_j
// and finally O /= l, lse = m + log l (natural log; the statistic the backward recomputes P
// from, src/kernels/cpu/attention.h). Each thread keeps partial row sums of l over its 8
// columns and reduces them once at the end (alpha is uniform along a row).
// Blocks are launched heaviest (last query tile) first to shorten the causal tail.
// ---------------------------------------------------------------------------------------------
template <int D>
__global__ void __launch_bounds__(kThreads)
    attn_fwd_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v, int T,
                    int H, float scale, float* __restrict__ o, float* __restrict__ lse) {
  constexpr int kLd = D + 4;
  extern __shared__ float4 attn_smem[];
  float* q_s = reinterpret_cast<float*>(attn_smem);
  float* k_s = q_s + kTile * kLd;  // K tile, then P [64][kLdP]
  float* v_s = k_s + (kTile * kLd > kTile * kLdP ? kTile * kLd : kTile * kLdP);

  const int tid = threadIdx.x;
  const int ty = tid >> 3;
  const int tx = tid & 7;
  const int bh = blockIdx.x;  // b * H + h
  const int b = bh / H;
  const int h = bh % H;
  const int qt = gridDim.y - 1 - blockIdx.y;
  const int q0 = qt * kTile;
  const int64_t row_stride = static_cast<int64_t>(H) * D;
  const int64_t base = (static_cast<int64_t>(b) * T * H + h) * D;  // element [b, 0, h, 0]

  load_tile<D>(q_s, q + base, row_stride, q0, T, tid);

  float m[4], l[4], acc[4][D / 8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
#pragma unroll
    for (int c = 0; c < D / 8; ++c) acc[i][c] = 0.f;
  }

  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();  // the previous tile's P V product is done with k_s (P) and v_s
    load_tile<D>(k_s, k + base, row_stride, k0, T, tid);
    load_tile<D>(v_s, v + base, row_stride, k0, T, tid);
    __syncthreads();

    float s[4][8];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) s[i][j] = 0.f;
    mma_nt<D, kLd, kLd>(q_s, k_s, ty, tx, s);

    // Scale, causal mask (only the diagonal tile has keys after a query; keys >= T of the last
    // tile are after every query < T), online softmax.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int qi = q0 + ty + 16 * i;
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int kj = k0 + tx + 8 * j;
        s[i][j] = kj <= qi ? s[i][j] * scale : -INFINITY;
        mx = fmaxf(mx, s[i][j]);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      const float m_new = fmaxf(m[i], mx);
      // Every row has key k0 <= query unmasked in every tile it visits, so m_new is finite;
      // the guard only keeps exp(-inf - -inf) = NaN out should that ever change.
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      const float alpha = expf(m[i] - m_use);
      float rowsum = 0.f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        s[i][j] = expf(s[i][j] - m_use);
        rowsum += s[i][j];
      }
      l[i] = l[i] * alpha + rowsum;
      m[i] = m_new;
#pragma unroll
      for (int c = 0; c < D / 8; ++c) acc[i][c] *= alpha;
    }

    __syncthreads();  // every thread is done reading k_s; it now holds P
    float* p_s = k_s;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) p_s[(ty + 16 * i) * kLdP + tx + 8 * j] = s[i][j];
    __syncthreads();
    mma_nn<D, kLdP, kLd>(p_s, v_s, ty, tx, acc);
  }

#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float li = l[i];
    li += __shfl_xor_sync(0xffffffffu, li, 1);
    li += __shfl_xor_sync(0xffffffffu, li, 2);
    li += __shfl_xor_sync(0xffffffffu, li, 4);
    l[i] = li;
    const int qi = q0 + ty + 16 * i;
    if (tx == 0 && qi < T) lse[static_cast<int64_t>(bh) * T + qi] = m[i] + logf(li);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float inv = 1.f / l[i];
#pragma unroll
    for (int c = 0; c < D / 8; ++c) acc[i][c] *= inv;
  }
  store_tile<D>(o + base, row_stride, q0, T, ty, tx, acc, 1.f);
}

// ---------------------------------------------------------------------------------------------
// Backward preprocess (FlashAttention-2, Algorithm 2 line 4; layers-ssm-attn.md 3.3):
//   Delta_i = sum_d dO_id O_id         stored [batch, heads, seq_len]
// One warp per row (b, t, h); a fixed shuffle tree reduces the lanes' partial sums.
// ---------------------------------------------------------------------------------------------
__global__ void attn_bwd_delta_kernel(const float* __restrict__ o, const float* __restrict__ dout, int64_t rows,
                                      int T, int H, int D, float* __restrict__ delta) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;  // whole warps exit together
  const float* o_row = o + row * D;
  const float* do_row = dout + row * D;
  float sum = 0.f;
  for (int d = lane; d < D; d += 32) sum = fmaf(o_row[d], do_row[d], sum);
#pragma unroll
  for (int mask = 16; mask > 0; mask >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, mask);
  if (lane == 0) {
    const int64_t h = row % H;
    const int64_t t = (row / H) % T;
    const int64_t b = row / (static_cast<int64_t>(H) * T);
    delta[(b * H + h) * T + t] = sum;
  }
}

// ---------------------------------------------------------------------------------------------
// Backward, dK and dV. One block per (key tile j, batch * head); dK_j and dV_j accumulate in
// registers over the query tiles i = j .. last (FlashAttention-2, Algorithm 2, the loop over
// i for a fixed j; equations from layers-ssm-attn.md 3.3), working on transposed scores so
// that the key index is the row a thread owns:
//   S^T  = K_j Q_i^T;   P^T = exp(scale S^T - lse_i), 0 where key > query or query >= T
//   dV_j += P^T dO_i
//   dP^T = V_j dO_i^T;  dS^T = P^T o (dP^T - Delta_i)
//   dK_j += dS^T Q_i    (times scale once at the end: dK = scale dS^T Q)
// ---------------------------------------------------------------------------------------------
template <int D>
__global__ void __launch_bounds__(kThreads)
    attn_bwd_dkdv_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                         const float* __restrict__ dout, const float* __restrict__ lse,
                         const float* __restrict__ delta, int T, int H, float scale, float* __restrict__ dk,
                         float* __restrict__ dv) {
  constexpr int kLd = D + 4;
  extern __shared__ float4 attn_smem[];
  float* k_s = reinterpret_cast<float*>(attn_smem);
  float* v_s = k_s + kTile * kLd;
  float* q_s = v_s + kTile * kLd;
  float* do_s = q_s + kTile * kLd;
  float* p_s = do_s + kTile * kLd;  // P^T  [key][query], leading dimension kLdP
  float* ds_s = p_s + kTile * kLdP;  // dS^T [key][query]
  float* lse_s = ds_s + kTile * kLdP;
  float* delta_s = lse_s + kTile;

  const int tid = threadIdx.x;
  const int ty = tid >> 3;
  const int tx = tid & 7;
  const int bh = blockIdx.x;
  const int b = bh / H;
  const int h = bh % H;
  const int kt = blockIdx.y;  // low key tiles see the most query tiles: launched first
  const int k0 = kt * kTile;
  const int n_tiles = gridDim.y;
  const int64_t row_stride = static_cast<int64_t>(H) * D;
  const int64_t base = (static_cast<int64_t>(b) * T * H + h) * D;
  const float* lse_bh = lse + static_cast<int64_t>(bh) * T;
  const float* delta_bh = delta + static_cast<int64_t>(bh) * T;

  load_tile<D>(k_s, k + base, row_stride, k0, T, tid);
  load_tile<D>(v_s, v + base, row_stride, k0, T, tid);

  float dk_acc[4][D / 8], dv_acc[4][D / 8];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int c = 0; c < D / 8; ++c) {
      dk_acc[i][c] = 0.f;
      dv_acc[i][c] = 0.f;
    }

  for (int qt = kt; qt < n_tiles; ++qt) {
    const int q0 = qt * kTile;
    __syncthreads();  // the previous tile's products are done with q_s, do_s, p_s, ds_s, lse_s, delta_s
    load_tile<D>(q_s, q + base, row_stride, q0, T, tid);
    load_tile<D>(do_s, dout + base, row_stride, q0, T, tid);
    if (tid < kTile) {
      const int t = q0 + tid;
      lse_s[tid] = t < T ? lse_bh[t] : 0.f;
      delta_s[tid] = t < T ? delta_bh[t] : 0.f;
    }
    __syncthreads();

    float st[4][8];  // S^T, then P^T
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) st[i][j] = 0.f;
    mma_nt<D, kLd, kLd>(k_s, q_s, ty, tx, st);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int ki = k0 + ty + 16 * i;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int qj = q0 + tx + 8 * j;
        const float p = (ki <= qj && qj < T) ? expf(st[i][j] * scale - lse_s[tx + 8 * j]) : 0.f;
        p_s[(ty + 16 * i) * kLdP + tx + 8 * j] = p;
      }
    }

    float dpt[4][8];  // dP^T
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) dpt[i][j] = 0.f;
    mma_nt<D, kLd, kLd>(v_s, do_s, ty, tx, dpt);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int at = (ty + 16 * i) * kLdP + tx + 8 * j;  // written by this thread above
        ds_s[at] = p_s[at] * (dpt[i][j] - delta_s[tx + 8 * j]);
      }
    __syncthreads();

    mma_nn<D, kLdP, kLd>(p_s, do_s, ty, tx, dv_acc);
    mma_nn<D, kLdP, kLd>(ds_s, q_s, ty, tx, dk_acc);
  }

  store_tile<D>(dv + base, row_stride, k0, T, ty, tx, dv_acc, 1.f);
  store_tile<D>(dk + base, row_stride, k0, T, ty, tx, dk_acc, scale);
}

// ---------------------------------------------------------------------------------------------
// Backward, dQ. One block per (query tile i, batch * head); P is recomputed for each key tile
// j = 0 .. i and dQ_i accumulates in registers, so no atomics and no partial buffers
// (layers-ssm-attn.md 3.3; FlashAttention-2 Algorithm 2 computes the same dQ_i):
//   P  = exp(scale Q_i K_j^T - lse_i), 0 where key > query
//   dP = dO_i V_j^T;   dS = P o (dP - Delta_i)
//   dQ_i += dS K_j     (times scale once at the end: dQ = scale dS K)
// ---------------------------------------------------------------------------------------------
template <int D>
__global__ void __launch_bounds__(kThreads)
    attn_bwd_dq_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                       const float* __restrict__ dout, const float* __restrict__ lse,
                       const float* __restrict__ delta, int T, int H, float scale, float* __restrict__ dq) {
  constexpr int kLd = D + 4;
  extern __shared__ float4 attn_smem[];
  float* q_s = reinterpret_cast<float*>(attn_smem);
  float* do_s = q_s + kTile * kLd;
  float* k_s = do_s + kTile * kLd;
  float* v_s = k_s + kTile * kLd;
  float* ds_s = v_s + kTile * kLd;  // P, then dS [query][key], leading dimension kLdP

  const int tid = threadIdx.x;
  const int ty = tid >> 3;
  const int tx = tid & 7;
  const int bh = blockIdx.x;
  const int b = bh / H;
  const int h = bh % H;
  const int qt = gridDim.y - 1 - blockIdx.y;  // heaviest first
  const int q0 = qt * kTile;
  const int64_t row_stride = static_cast<int64_t>(H) * D;
  const int64_t base = (static_cast<int64_t>(b) * T * H + h) * D;

  load_tile<D>(q_s, q + base, row_stride, q0, T, tid);
  load_tile<D>(do_s, dout + base, row_stride, q0, T, tid);
  float lse_r[4], delta_r[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int t = q0 + ty + 16 * i;
    lse_r[i] = t < T ? lse[static_cast<int64_t>(bh) * T + t] : 0.f;
    delta_r[i] = t < T ? delta[static_cast<int64_t>(bh) * T + t] : 0.f;
  }

  float acc[4][D / 8];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int c = 0; c < D / 8; ++c) acc[i][c] = 0.f;

  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();  // the previous tile's dS K product is done with k_s and ds_s
    load_tile<D>(k_s, k + base, row_stride, k0, T, tid);
    load_tile<D>(v_s, v + base, row_stride, k0, T, tid);
    __syncthreads();

    float s[4][8];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) s[i][j] = 0.f;
    mma_nt<D, kLd, kLd>(q_s, k_s, ty, tx, s);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int qi = q0 + ty + 16 * i;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int kj = k0 + tx + 8 * j;
        const float p = (kj <= qi && qi < T) ? expf(s[i][j] * scale - lse_r[i]) : 0.f;
        ds_s[(ty + 16 * i) * kLdP + tx + 8 * j] = p;  // parked here to free registers
      }
    }

    float dp[4][8];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) dp[i][j] = 0.f;
    mma_nt<D, kLd, kLd>(do_s, v_s, ty, tx, dp);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int at = (ty + 16 * i) * kLdP + tx + 8 * j;  // written by this thread above
        ds_s[at] = ds_s[at] * (dp[i][j] - delta_r[i]);
      }
    __syncthreads();

    mma_nn<D, kLdP, kLd>(ds_s, k_s, ty, tx, acc);
  }

  store_tile<D>(dq + base, row_stride, q0, T, ty, tx, acc, scale);
}

// ---------------------------------------------------------------------------------------------
// Host side.
// ---------------------------------------------------------------------------------------------

void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  check(err == cudaSuccess, "{}: CUDA kernel launch failed: {} ({})", what, cudaGetErrorString(err),
        static_cast<int>(err));
}

void check_cuda(cudaError_t err, const char* what) {
  check(err == cudaSuccess, "{}: {} ({})", what, cudaGetErrorString(err), static_cast<int>(err));
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Validates the shape; returns false when there is nothing to compute.
bool check_shape(const char* op, int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim) {
  check(head_dim == 32 || head_dim == 64 || head_dim == 128,
        "{}: head_dim {} is not supported by the CUDA attention kernels (supported: 32, 64, 128)", op, head_dim);
  check(batch >= 0 && seq_len >= 0 && heads >= 0, "{}: negative shape batch {} seq_len {} heads {}", op, batch,
        seq_len, heads);
  if (batch == 0 || seq_len == 0 || heads == 0) return false;
  const int64_t n_tiles = (seq_len + kTile - 1) / kTile;
  check(n_tiles <= 65535, "{}: seq_len {} exceeds the CUDA attention limit of {} (grid y dimension)", op, seq_len,
        int64_t{65535} * kTile);
  check(batch * heads <= std::numeric_limits<int>::max(), "{}: batch * heads = {} is too large", op,
        batch * heads);
  return true;
}

template <typename Kernel>
void set_smem(Kernel kernel, int bytes, const char* op) {
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), op);
}

template <int D>
void launch_fwd(const float* q, const float* k, const float* v, int64_t batch, int64_t seq_len, int64_t heads,
                float scale, float* o, float* lse, cudaStream_t stream) {
  const int T = static_cast<int>(seq_len);
  const int H = static_cast<int>(heads);
  const dim3 grid(static_cast<unsigned>(batch * heads), static_cast<unsigned>((seq_len + kTile - 1) / kTile));
  const int smem = fwd_smem_floats<D>() * static_cast<int>(sizeof(float));
  set_smem(attn_fwd_kernel<D>, smem, "attention_fwd: cudaFuncSetAttribute(max dynamic shared memory)");
  attn_fwd_kernel<D><<<grid, kThreads, smem, stream>>>(q, k, v, T, H, scale, o, lse);
  check_launch("attention_fwd");
}

template <int D>
void launch_bwd(const float* q, const float* k, const float* v, const float* dout, const float* lse,
                const float* delta, int64_t batch, int64_t seq_len, int64_t heads, float scale, float* dq, float* dk,
                float* dv, cudaStream_t stream) {
  const int T = static_cast<int>(seq_len);
  const int H = static_cast<int>(heads);
  const dim3 grid(static_cast<unsigned>(batch * heads), static_cast<unsigned>((seq_len + kTile - 1) / kTile));

  const int smem_dkdv = bwd_dkdv_smem_floats<D>() * static_cast<int>(sizeof(float));
  set_smem(attn_bwd_dkdv_kernel<D>, smem_dkdv, "attention_bwd: cudaFuncSetAttribute(max dynamic shared memory)");
  attn_bwd_dkdv_kernel<D><<<grid, kThreads, smem_dkdv, stream>>>(q, k, v, dout, lse, delta, T, H, scale, dk, dv);
  check_launch("attention_bwd (dK, dV kernel)");

  const int smem_dq = bwd_dq_smem_floats<D>() * static_cast<int>(sizeof(float));
  set_smem(attn_bwd_dq_kernel<D>, smem_dq, "attention_bwd: cudaFuncSetAttribute(max dynamic shared memory)");
  attn_bwd_dq_kernel<D><<<grid, kThreads, smem_dq, stream>>>(q, k, v, dout, lse, delta, T, H, scale, dq);
  check_launch("attention_bwd (dQ kernel)");
}

}  // namespace

void attention_fwd(const float* q, const float* k, const float* v, int64_t batch, int64_t seq_len, int64_t heads,
                   int64_t head_dim, double scale, float* o, float* lse, cudaStream_t stream) {
  if (!check_shape("attention_fwd", batch, seq_len, heads, head_dim)) return;
  check(aligned16(q) && aligned16(k) && aligned16(v) && aligned16(o),
        "attention_fwd: q, k, v and o must be 16-byte aligned device pointers");
  const float s = static_cast<float>(scale);
  switch (head_dim) {
    case 32: launch_fwd<32>(q, k, v, batch, seq_len, heads, s, o, lse, stream); break;
    case 64: launch_fwd<64>(q, k, v, batch, seq_len, heads, s, o, lse, stream); break;
    default: launch_fwd<128>(q, k, v, batch, seq_len, heads, s, o, lse, stream); break;
  }
}

size_t attention_bwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim) {
  (void)head_dim;
  if (batch <= 0 || seq_len <= 0 || heads <= 0) return 0;
  return static_cast<size_t>(batch * heads * seq_len) * sizeof(float);  // Delta [batch, heads, seq_len]
}

void attention_bwd(const float* q, const float* k, const float* v, const float* o, const float* lse,
                   const float* dout, int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim, double scale,
                   float* dq, float* dk, float* dv, void* scratch, cudaStream_t stream) {
  if (!check_shape("attention_bwd", batch, seq_len, heads, head_dim)) return;
  check(aligned16(q) && aligned16(k) && aligned16(v) && aligned16(dout) && aligned16(dq) && aligned16(dk) &&
            aligned16(dv),
        "attention_bwd: q, k, v, dout, dq, dk and dv must be 16-byte aligned device pointers");
  check(scratch != nullptr && reinterpret_cast<uintptr_t>(scratch) % alignof(float) == 0,
        "attention_bwd: scratch must be a float-aligned buffer of attention_bwd_scratch_bytes() = {} bytes",
        attention_bwd_scratch_bytes(batch, seq_len, heads, head_dim));
  float* delta = static_cast<float*>(scratch);

  const int64_t rows = batch * seq_len * heads;
  constexpr int kDeltaThreads = 256;
  constexpr int kRowsPerBlock = kDeltaThreads / 32;
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  check(blocks <= std::numeric_limits<int>::max(), "attention_bwd: {} rows are too many", rows);
  attn_bwd_delta_kernel<<<static_cast<unsigned>(blocks), kDeltaThreads, 0, stream>>>(
      o, dout, rows, static_cast<int>(seq_len), static_cast<int>(heads), static_cast<int>(head_dim), delta);
  check_launch("attention_bwd (Delta kernel)");

  const float s = static_cast<float>(scale);
  switch (head_dim) {
    case 32: launch_bwd<32>(q, k, v, dout, lse, delta, batch, seq_len, heads, s, dq, dk, dv, stream); break;
    case 64: launch_bwd<64>(q, k, v, dout, lse, delta, batch, seq_len, heads, s, dq, dk, dv, stream); break;
    default: launch_bwd<128>(q, k, v, dout, lse, delta, batch, seq_len, heads, s, dq, dk, dv, stream); break;
  }
}

}  // namespace llmt::cuda
