// Causal multi-head softmax attention in bf16 on the tensor cores (sm_80+ mma.sync, built for
// sm_90), FlashAttention-2 style. Semantics: src/kernels/cpu/attention.h and
// layers-ssm-attn.md section 3.3; algorithm: Dao 2023, "FlashAttention-2", Algorithms 1 and 2.
//   q, k, v, o, dout, dq, dk, dv: bf16 [batch, seq_len, heads, head_dim] row-major (D = head_dim);
//   lse: fp32 [batch, heads, seq_len]; scratch: Delta and lse * log2(e), fp32 [batch, heads, seq_len].
// The [T, T] score matrix never reaches device memory. Every sum runs in a fixed order and no
// kernel uses atomics, so all results are bit-identical from run to run.
//
// Tensor-core fragments (PTX ISA, "Matrix fragments for mma.m16n8k16" with .bf16 A/B and .f32
// C/D). In a warp, lane = 4 g + t (g = lane / 4 in 0..7, t = lane % 4 in 0..3):
//   A (16 x 16, row-major), 4 registers of 2 bf16 (lower column in the low half):
//     a0 = A[g][2t, 2t+1]   a1 = A[g+8][2t, 2t+1]   a2 = A[g][2t+8, 2t+9]   a3 = A[g+8][2t+8, 2t+9]
//   B (16 x 8, "col": k is the row), 2 registers:
//     b0 = B[2t, 2t+1][g]   b1 = B[2t+8, 2t+9][g]
//   C, D (16 x 8 fp32), 4 registers:
//     c0, c1 = C[g][2t, 2t+1]   c2, c3 = C[g+8][2t, 2t+1]
// Hence the C fragments of two adjacent n-tiles (16 columns) are, packed to bf16 pairs, exactly
// the A fragment of those 16 columns: a0 = (c0, c1) of tile 0, a1 = (c2, c3) of tile 0,
// a2 = (c0, c1) of tile 1, a3 = (c2, c3) of tile 1. P and dS go from the score accumulators into
// the next product without touching shared memory.
//
// ldmatrix.x4 loads four 8 x 8 bf16 matrices; lanes 8 i .. 8 i + 7 give the row addresses of
// matrix i and every lane receives, in register i, row g, columns 2t, 2t+1 of matrix i (of its
// transpose with .trans). With a row-major shared tile X (leading dimension ld = D + 8 elements):
//   A fragment of X[r0 .. r0+15][c0 .. c0+15]:          lane address X[r0 + lane % 16][c0 + 8 (lane / 16)]
//   B fragments of two n-tiles when B[k][n] = Y[n][k] (Y rows are the n index, e.g. K in Q K^T):
//     lane address Y[n0 + 8 (lane / 16) + lane % 8][c0 + 8 ((lane / 8) % 2)]
//     -> {b0, b1} of n-tile n0, {b0, b1} of n-tile n0 + 8
//   B fragments of two n-tiles when B[k][n] = Z[k][n] (Z rows are the k index, e.g. V in P V),
//     with .trans: lane address Z[k0 + lane % 16][n0 + 8 (lane / 16)]
//     -> {b0, b1} of n-tile n0, {b0, b1} of n-tile n0 + 8
// Shared tiles are [rows][D + 8] bf16: the 16-byte pad shifts consecutive rows by 4 banks, so
// the 8 row addresses of each 8 x 8 matrix hit 8 distinct 16-byte bank groups (no conflicts),
// and the 16-byte cp.async stores of 8 consecutive threads (consecutive chunks of a row) too.
//
// Kernels (all tiles double-buffered in shared memory with cp.async):
//   forward:  128 query rows per block, 4 warps of 32 rows (two m-tiles sharing every K and V
//             fragment), key/value tiles of 32 rows at D = 128 (registers: 128 output and 32 score
//             accumulators per thread) and 64 rows at D = 64; 2 blocks per SM.
//   dK, dV:   128 key rows per block, 8 warps of 16 rows, query/dO tiles of 64 rows (+ their lse2
//             and Delta).
//   dQ:       128 query rows per block, 4 warps of 32 rows (two m-tiles), key/value tiles of 32
//             rows; 2 blocks per SM.
// Causal block skipping: a block visits only the tiles that hold an unmasked pair; inside a tile,
// a warp skips the products when its rows see no unmasked pair, and applies the element mask
// only on tiles that straddle the diagonal. A warp's rows and the streamed tiles are aligned to
// 32 (16 in dK/dV), so every row of a warp that computes a forward tile has at least one
// unmasked key in it (its softmax max is finite).
#include "kernels/cuda/flash_attention.cuh"

#include <cmath>
#include <cstdint>
#include <limits>

#include "core/error.h"

namespace llmt::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kBig = 128;   // rows of the block-owned tile (query rows; key rows in dK/dV)
constexpr int kSmall = 64;  // rows of the streamed tile (backward; forward: q_key_rows)
// Forward and dQ: 4 warps of 32 query rows (two m-tiles of 16 sharing every K and V fragment).
constexpr int kQMT = 2;
constexpr int kQThreads = 32 * kBig / (16 * kQMT);
// dK/dV: 8 warps of 16 key rows (the dK and dV accumulators leave no registers for a second m-tile).
constexpr int kKVThreads = 32 * kBig / 16;

template <int D>
constexpr int ld() {
  return D + 8;  // leading dimension (elements) of every shared tile
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy; with valid == false nothing is read and the 16 bytes are zeroed.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += A B for one m16n8k16 tile (bf16 inputs, fp32 accumulators).
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
  return *reinterpret_cast<const uint32_t*>(&v);
}

// 2^x (ex2.approx: relative error 2^-22; 2^-inf = 0).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Lane offsets (elements) of the ldmatrix row addresses inside a shared tile, see the header.
template <int D>
__device__ __forceinline__ int a_lane_offset(int lane) {  // A fragments and .trans B fragments
  return (lane & 15) * ld<D>() + ((lane >> 4) << 3);
}
template <int D>
__device__ __forceinline__ int bt_lane_offset(int lane) {  // B fragments with B[k][n] = Y[n][k]
  return (((lane >> 4) << 3) + (lane & 7)) * ld<D>() + (((lane >> 3) & 1) << 3);
}

// Issues cp.async copies of rows row0 .. row0 + R - 1 of one (batch, head) slice into dst [R][D + 8]
// by the NT threads of a block; rows >= T are zero-filled. src points at element [b, 0, h, 0]; rows
// are row_stride apart. Consecutive threads copy consecutive 16-byte chunks of a row (coalesced).
template <int R, int D, int NT>
__device__ __forceinline__ void load_tile(bf16* dst, const bf16* __restrict__ src, int64_t row_stride, int row0,
                                          int T, int tid) {
  constexpr int kChunks = D / 8;
  static_assert(R * kChunks % NT == 0, "tile chunks must divide evenly among the threads");
#pragma unroll
  for (int it = 0; it < R * kChunks / NT; ++it) {
    const int idx = it * NT + tid;
    const int r = idx / kChunks;
    const int c = idx % kChunks;
    const int t = row0 + r;
    const bool valid = t < T;
    const bf16* g = src + (valid ? static_cast<int64_t>(t) * row_stride : 0) + 8 * c;
    cp_async16(smem_addr(dst + r * ld<D>() + 8 * c), g, valid);
  }
}

// acc[m][j] = X[16 m .. 16 m + 15][0 .. D) Y[8 j .. 8 j + 7][0 .. D)^T (m < MT, j < NJ): a warp's
// scores of 16 MT rows against 8 NJ streamed rows. x: the warp's first row in a shared tile; y: the
// streamed shared tile. Each B fragment pair loaded serves all MT m-tiles.
template <int D, int MT, int NJ>
__device__ __forceinline__ void warp_scores(const bf16* x, const bf16* y, int lane, float (&acc)[MT][NJ][4]) {
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[m][j][e] = 0.f;
  const uint32_t xa = smem_addr(x + a_lane_offset<D>(lane));
  const uint32_t ya = smem_addr(y + bt_lane_offset<D>(lane));
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[MT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) ldsm_x4(xa + (m * 16 * ld<D>() + kk * 16) * 2, a[m]);
#pragma unroll
    for (int np = 0; np < NJ / 2; ++np) {
      uint32_t b[4];
      ldsm_x4(ya + (np * 16 * ld<D>() + kk * 16) * 2, b);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        mma16816(acc[m][2 * np], a[m], b[0], b[1]);
        mma16816(acc[m][2 * np + 1], a[m], b[2], b[3]);
      }
    }
  }
}

// acc[m] += P[m] Z[0 .. 8 NJ)[0 .. D) for each m-tile m < MT: p holds P (16 MT rows x 8 NJ) as
// score accumulators (fp32, rounded to bf16 here); z is a shared tile whose rows are the summed index.
template <int D, int MT, int NJ>
__device__ __forceinline__ void warp_pz(const float (&p)[MT][NJ][4], const bf16* z, int lane,
                                        float (&acc)[MT][D / 8][4]) {
  const uint32_t za = smem_addr(z + a_lane_offset<D>(lane));
#pragma unroll
  for (int kk = 0; kk < NJ / 2; ++kk) {
    uint32_t a[MT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      a[m][0] = pack_bf16(p[m][2 * kk][0], p[m][2 * kk][1]);
      a[m][1] = pack_bf16(p[m][2 * kk][2], p[m][2 * kk][3]);
      a[m][2] = pack_bf16(p[m][2 * kk + 1][0], p[m][2 * kk + 1][1]);
      a[m][3] = pack_bf16(p[m][2 * kk + 1][2], p[m][2 * kk + 1][3]);
    }
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t b[4];
      ldsm_x4_trans(za + (kk * 16 * ld<D>() + dp * 16) * 2, b);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        mma16816(acc[m][2 * dp], a[m], b[0], b[1]);
        mma16816(acc[m][2 * dp + 1], a[m], b[2], b[3]);
      }
    }
  }
}

// Writes the rows row_lo + 16 m + g + 8 r (those < T) of a warp's [16 MT, D] accumulator tile,
// times mul[m][r], as bf16. dst points at element [b, 0, h, 0].
template <int D, int MT>
__device__ __forceinline__ void store_rows(bf16* __restrict__ dst, int64_t row_stride, int row_lo, int T, int lane,
                                           const float (&acc)[MT][D / 8][4], const float (&mul)[MT][2]) {
  const int g = lane >> 2;
  const int t = lane & 3;
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row_lo + 16 * m + g + 8 * r;
      if (row >= T) continue;
      bf16* out = dst + static_cast<int64_t>(row) * row_stride + 2 * t;
#pragma unroll
      for (int n = 0; n < D / 8; ++n)
        *reinterpret_cast<uint32_t*>(out + 8 * n) =
            pack_bf16(acc[m][n][2 * r] * mul[m][r], acc[m][n][2 * r + 1] * mul[m][r]);
    }
}

// Key rows per streamed tile of the forward and dQ kernels: 32 at D = 128 keeps the two m-tiles'
// score and output accumulators within the 255 registers of a thread.
template <int D>
constexpr int q_key_rows() {
  return D == 128 ? 32 : 64;
}
template <int D>
constexpr int fwd_smem_bytes() {
  return (kBig + 4 * q_key_rows<D>()) * ld<D>() * 2;  // Q; K and V, two stages each
}
// Key rows per streamed tile of the dQ kernel: 32 keeps its score, dP and dQ accumulators within
// the 255 registers of a thread at both head dims.
constexpr int kDqKeyRows = 32;
template <int D>
constexpr int dq_smem_bytes() {
  // Q, dO (128 rows each); K and V (two stages each); lse2 and Delta of the 128 query rows.
  return (2 * kBig + 4 * kDqKeyRows) * ld<D>() * 2 + 2 * kBig * 4;
}
template <int D>
constexpr int dkdv_smem_bytes() {
  // K, V (128 rows each); Q and dO (two stages of 64 rows each); lse2 and Delta (two stages).
  return (2 * kBig + 4 * kSmall) * ld<D>() * 2 + 4 * kSmall * 4;
}

// ---------------------------------------------------------------------------------------------
// Forward (FlashAttention-2, Algorithm 1). Block (128-row query tile, bh), heaviest tiles first.
// For each key tile j (kN keys) up to the diagonal, per warp (32 query rows):
//   S = Q K_j^T (raw scores); masked entries (key > query) = -inf
//   m_new = max(m, rowmax S);  alpha = 2^((m - m_new) c);  P = 2^(S c - m_new c), c = scale log2(e)
//   l = alpha l + rowsum P;    O = alpha O + P V_j           (P rounded to bf16 for the product)
// and at the end O /= l, lse = m scale + ln l. Each thread keeps partial row sums of l over its
// columns and reduces them across the 4 lanes of a row once at the end (alpha is row-uniform).
// A thread's rows are row_lo + 16 m + g + 8 r (m-tile m < 2, half r < 2): statistics [m][r].
// ---------------------------------------------------------------------------------------------
template <int D>
__global__ void __launch_bounds__(kQThreads, 2)
    fa_fwd_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v, int T, int H,
                  float scale, float scale_log2, bf16* __restrict__ o, float* __restrict__ lse) {
  constexpr int MT = kQMT;
  constexpr int NT = kQThreads;
  constexpr int kN = q_key_rows<D>();
  constexpr int NJ = kN / 8;
  extern __shared__ __align__(16) unsigned char fa_smem[];
  bf16* q_s = reinterpret_cast<bf16*>(fa_smem);  // [128][ld]
  bf16* k_s = q_s + kBig * ld<D>();               // [2][kN][ld]
  bf16* v_s = k_s + 2 * kN * ld<D>();             // [2][kN][ld]

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int bh = blockIdx.y;
  const int b = bh / H;
  const int h = bh % H;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kBig;
  const int row_lo = q0 + 16 * MT * warp;  // the warp's first query row
  const int64_t row_stride = static_cast<int64_t>(H) * D;
  const int64_t base = (static_cast<int64_t>(b) * T * H + h) * D;  // element [b, 0, h, 0]
  const int n_kt = (min(q0 + kBig, T) - 1) / kN + 1;               // key tiles with an unmasked pair

  load_tile<kBig, D, NT>(q_s, q + base, row_stride, q0, T, tid);
  load_tile<kN, D, NT>(k_s, k + base, row_stride, 0, T, tid);
  load_tile<kN, D, NT>(v_s, v + base, row_stride, 0, T, tid);
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();

  float acc[MT][D / 8][4];
  float m_raw[MT][2];  // raw (unscaled) running row maxima
  float l[MT][2];      // this thread's partial row sums
#pragma unroll
  for (int m = 0; m < MT; ++m) {
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[m][n][e] = 0.f;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      m_raw[m][r] = -INFINITY;
      l[m][r] = 0.f;
    }
  }

  for (int kt = 0; kt < n_kt; ++kt) {
    const int stage = kt & 1;
    if (kt + 1 < n_kt) {  // prefetch the next tile into the other stage (last read in kt - 1)
      load_tile<kN, D, NT>(k_s + (stage ^ 1) * kN * ld<D>(), k + base, row_stride, (kt + 1) * kN, T, tid);
      load_tile<kN, D, NT>(v_s + (stage ^ 1) * kN * ld<D>(), v + base, row_stride, (kt + 1) * kN, T, tid);
    }
    cp_async_commit();
    const int k0 = kt * kN;
    if (k0 <= row_lo + 16 * MT - 1) {  // the warp's rows see at least one key of this tile
      float s[MT][NJ][4];
      warp_scores<D, MT, NJ>(q_s + (row_lo - q0) * ld<D>(), k_s + stage * kN * ld<D>(), lane, s);
      if (k0 + kN - 1 > row_lo) {  // the tile straddles the diagonal of the warp's rows
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
          for (int j = 0; j < NJ; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int row = row_lo + 16 * m + g + 8 * (e >> 1);
              const int col = k0 + 8 * j + 2 * t + (e & 1);
              if (col > row) s[m][j][e] = -INFINITY;
            }
      }
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float mx = m_raw[m][r];
#pragma unroll
          for (int j = 0; j < NJ; ++j) mx = fmaxf(mx, fmaxf(s[m][j][2 * r], s[m][j][2 * r + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          // A row with no unmasked key so far keeps max -inf: use 0 so that no (-inf) - (-inf)
          // appears; its P and alpha are then 0.
          const float m_scaled = mx == -INFINITY ? 0.f : mx * scale_log2;
          const float alpha = exp2_approx(m_raw[m][r] * scale_log2 - m_scaled);
          m_raw[m][r] = mx;
          float rowsum = 0.f;
#pragma unroll
          for (int j = 0; j < NJ; ++j) {
            s[m][j][2 * r] = exp2_approx(fmaf(s[m][j][2 * r], scale_log2, -m_scaled));
            s[m][j][2 * r + 1] = exp2_approx(fmaf(s[m][j][2 * r + 1], scale_log2, -m_scaled));
            rowsum += s[m][j][2 * r] + s[m][j][2 * r + 1];
          }
          l[m][r] = l[m][r] * alpha + rowsum;
#pragma unroll
          for (int n = 0; n < D / 8; ++n) {
            acc[m][n][2 * r] *= alpha;
            acc[m][n][2 * r + 1] *= alpha;
          }
        }
      warp_pz<D, MT, NJ>(s, v_s + stage * kN * ld<D>(), lane, acc);
    }
    cp_async_wait_all();
    __syncthreads();  // the next tile has landed; everyone is done with this stage
  }

  float inv[MT][2];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = l[m][r];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      inv[m][r] = sum > 0.f ? 1.f / sum : 0.f;
      const int row = row_lo + 16 * m + g + 8 * r;
      if (t == 0 && row < T) lse[static_cast<int64_t>(bh) * T + row] = m_raw[m][r] * scale + logf(sum);
    }
  store_rows<D, MT>(o + base, row_stride, row_lo, T, lane, acc, inv);
}

// ---------------------------------------------------------------------------------------------
// Backward preprocess (FlashAttention-2, Algorithm 2 line 4): per row (b, t, h)
//   Delta = sum_d dO[d] O[d]   and   lse2 = lse log2(e)      both stored [batch, heads, seq_len]
// One warp per row; a fixed shuffle tree reduces the lanes' partial sums (fp32).
// ---------------------------------------------------------------------------------------------
template <int D>
__global__ void fa_bwd_preprocess_kernel(const bf16* __restrict__ o, const bf16* __restrict__ dout,
                                         const float* __restrict__ lse, int64_t rows, int T, int H,
                                         float* __restrict__ delta, float* __restrict__ lse2) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;  // whole warps exit together
  const __nv_bfloat162* o_row = reinterpret_cast<const __nv_bfloat162*>(o + row * D);
  const __nv_bfloat162* do_row = reinterpret_cast<const __nv_bfloat162*>(dout + row * D);
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < D / 64; ++i) {
    const float2 a = __bfloat1622float2(o_row[lane + 32 * i]);
    const float2 d = __bfloat1622float2(do_row[lane + 32 * i]);
    sum = fmaf(a.x, d.x, sum);
    sum = fmaf(a.y, d.y, sum);
  }
#pragma unroll
  for (int mask = 16; mask > 0; mask >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, mask);
  if (lane == 0) {
    const int64_t h = row % H;
    const int64_t t = (row / H) % T;
    const int64_t b = row / (static_cast<int64_t>(H) * T);
    const int64_t at = (b * H + h) * T + t;
    delta[at] = sum;
    lse2[at] = lse[at] * kLog2e;
  }
}

// ---------------------------------------------------------------------------------------------
// Backward, dK and dV (FlashAttention-2, Algorithm 2, the loop over query tiles i for a fixed key
// tile j). Block (128-row key tile, bh); each warp owns 16 key rows and works on transposed
// scores (keys are the M dimension), so P^T and dS^T are A operands straight from registers:
//   S^T  = K_j Q_i^T;   P^T = 2^(S^T c - lse2_i), 0 where key > query (c = scale log2(e))
//   dV_j += P^T dO_i
//   dP^T = V_j dO_i^T;  dS^T = P^T o (dP^T - Delta_i)
//   dK_j += dS^T Q_i    (times scale once at the end)
// Query rows >= T have zero Q and dO (zero-filled), lse2 = +inf and Delta = 0, so P = 0 there.
// ---------------------------------------------------------------------------------------------
template <int D>
__global__ void __launch_bounds__(kKVThreads, 1)
    fa_bwd_dkdv_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                       const bf16* __restrict__ dout, const float* __restrict__ lse2,
                       const float* __restrict__ delta, int T, int H, float scale, float scale_log2,
                       bf16* __restrict__ dk, bf16* __restrict__ dv) {
  extern __shared__ __align__(16) unsigned char fa_smem[];
  bf16* k_s = reinterpret_cast<bf16*>(fa_smem);  // [128][ld]
  bf16* v_s = k_s + kBig * ld<D>();               // [128][ld]
  bf16* q_s = v_s + kBig * ld<D>();               // [2][64][ld]
  bf16* do_s = q_s + 2 * kSmall * ld<D>();        // [2][64][ld]
  float* lse2_s = reinterpret_cast<float*>(do_s + 2 * kSmall * ld<D>());  // [2][64]
  float* delta_s = lse2_s + 2 * kSmall;                                   // [2][64]

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int bh = blockIdx.y;
  const int b = bh / H;
  const int h = bh % H;
  const int k0 = blockIdx.x * kBig;   // low key tiles see the most query tiles: launched first
  const int key_lo = k0 + 16 * warp;  // the warp's first key row
  const int64_t row_stride = static_cast<int64_t>(H) * D;
  const int64_t base = (static_cast<int64_t>(b) * T * H + h) * D;
  const float* lse2_bh = lse2 + static_cast<int64_t>(bh) * T;
  const float* delta_bh = delta + static_cast<int64_t>(bh) * T;
  const int qt0 = k0 / kSmall;  // first query tile with a query >= k0
  const int n_qt = (T + kSmall - 1) / kSmall;

  // Issues the copies of query tile qt (Q, dO, lse2, Delta) into `stage`.
  auto load_query_tile = [&](int qt, int stage) {
    const int q0 = qt * kSmall;
    load_tile<kSmall, D, kKVThreads>(q_s + stage * kSmall * ld<D>(), q + base, row_stride, q0, T, tid);
    load_tile<kSmall, D, kKVThreads>(do_s + stage * kSmall * ld<D>(), dout + base, row_stride, q0, T, tid);
    if (tid < 2 * kSmall) {
      const int i = tid % kSmall;
      const bool is_lse = tid < kSmall;
      float* dst = (is_lse ? lse2_s : delta_s) + stage * kSmall + i;
      if (q0 + i < T) {
        cp_async4(smem_addr(dst), (is_lse ? lse2_bh : delta_bh) + q0 + i);
      } else {
        *dst = is_lse ? INFINITY : 0.f;
      }
    }
  };

  load_tile<kBig, D, kKVThreads>(k_s, k + base, row_stride, k0, T, tid);
  load_tile<kBig, D, kKVThreads>(v_s, v + base, row_stride, k0, T, tid);
  load_query_tile(qt0, 0);
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();

  float dk_acc[1][D / 8][4], dv_acc[1][D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      dk_acc[0][n][e] = 0.f;
      dv_acc[0][n][e] = 0.f;
    }

  for (int qt = qt0; qt < n_qt; ++qt) {
    const int stage = (qt - qt0) & 1;
    if (qt + 1 < n_qt) load_query_tile(qt + 1, stage ^ 1);  // that stage was last read in qt - 1
    cp_async_commit();
    const int q0 = qt * kSmall;
    if (q0 + kSmall - 1 >= key_lo) {  // some query of the tile is at or after the warp's first key
      const bf16* q_st = q_s + stage * kSmall * ld<D>();
      const bf16* do_st = do_s + stage * kSmall * ld<D>();
      const float* lse2_st = lse2_s + stage * kSmall;
      const float* delta_st = delta_s + stage * kSmall;
      const bool straddles = key_lo + 15 > q0;  // some key of the warp is after some query

      float p[1][8][4];  // S^T, then P^T
      warp_scores<D, 1, 8>(k_s + 16 * warp * ld<D>(), q_st, lane, p);
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int qc = 8 * j + 2 * t + (e & 1);  // query column within the tile
          const float pe = exp2_approx(fmaf(p[0][j][e], scale_log2, -lse2_st[qc]));
          p[0][j][e] = (straddles && key_lo + g + 8 * (e >> 1) > q0 + qc) ? 0.f : pe;
        }
      float ds[1][8][4];  // dP^T, then dS^T
      warp_scores<D, 1, 8>(v_s + 16 * warp * ld<D>(), do_st, lane, ds);
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) ds[0][j][e] = p[0][j][e] * (ds[0][j][e] - delta_st[8 * j + 2 * t + (e & 1)]);
      warp_pz<D, 1, 8>(p, do_st, lane, dv_acc);
      warp_pz<D, 1, 8>(ds, q_st, lane, dk_acc);
    }
    cp_async_wait_all();
    __syncthreads();
  }

  const float one[1][2] = {{1.f, 1.f}};
  const float scaled[1][2] = {{scale, scale}};
  store_rows<D, 1>(dv + base, row_stride, key_lo, T, lane, dv_acc, one);
  store_rows<D, 1>(dk + base, row_stride, key_lo, T, lane, dk_acc, scaled);
}

// ---------------------------------------------------------------------------------------------
// Backward, dQ. Block (128-row query tile, bh), heaviest first; P is recomputed for each key tile
// j up to the diagonal and dQ_i accumulates in registers (no atomics, no partial buffers):
//   P  = 2^(Q_i K_j^T c - lse2_i), 0 where key > query
//   dP = dO_i V_j^T;   dS = P o (dP - Delta_i)
//   dQ_i += dS K_j     (times scale once at the end)
// ---------------------------------------------------------------------------------------------
template <int D>
__global__ void __launch_bounds__(kQThreads, 2)
    fa_bwd_dq_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                     const bf16* __restrict__ dout, const float* __restrict__ lse2, const float* __restrict__ delta,
                     int T, int H, float scale, float scale_log2, bf16* __restrict__ dq) {
  constexpr int MT = kQMT;
  constexpr int NT = kQThreads;
  constexpr int kN = kDqKeyRows;
  constexpr int NJ = kN / 8;
  extern __shared__ __align__(16) unsigned char fa_smem[];
  bf16* q_s = reinterpret_cast<bf16*>(fa_smem);  // [128][ld]
  bf16* do_s = q_s + kBig * ld<D>();              // [128][ld]
  bf16* k_s = do_s + kBig * ld<D>();              // [2][kN][ld]
  bf16* v_s = k_s + 2 * kN * ld<D>();             // [2][kN][ld]
  float* lse2_s = reinterpret_cast<float*>(v_s + 2 * kN * ld<D>());  // [128]
  float* delta_s = lse2_s + kBig;                                     // [128]

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int bh = blockIdx.y;
  const int b = bh / H;
  const int h = bh % H;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kBig;
  const int row_lo = q0 + 16 * MT * warp;  // the warp's first query row
  const int64_t row_stride = static_cast<int64_t>(H) * D;
  const int64_t base = (static_cast<int64_t>(b) * T * H + h) * D;
  const int n_kt = (min(q0 + kBig, T) - 1) / kN + 1;

  for (int i = tid; i < kBig; i += NT) {  // rows >= T get lse2 = +inf (so P = 0) and Delta = 0
    lse2_s[i] = q0 + i < T ? lse2[static_cast<int64_t>(bh) * T + q0 + i] : INFINITY;
    delta_s[i] = q0 + i < T ? delta[static_cast<int64_t>(bh) * T + q0 + i] : 0.f;
  }

  load_tile<kBig, D, NT>(q_s, q + base, row_stride, q0, T, tid);
  load_tile<kBig, D, NT>(do_s, dout + base, row_stride, q0, T, tid);
  load_tile<kN, D, NT>(k_s, k + base, row_stride, 0, T, tid);
  load_tile<kN, D, NT>(v_s, v + base, row_stride, 0, T, tid);
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();

  float acc[MT][D / 8][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[m][n][e] = 0.f;

  for (int kt = 0; kt < n_kt; ++kt) {
    const int stage = kt & 1;
    if (kt + 1 < n_kt) {
      load_tile<kN, D, NT>(k_s + (stage ^ 1) * kN * ld<D>(), k + base, row_stride, (kt + 1) * kN, T, tid);
      load_tile<kN, D, NT>(v_s + (stage ^ 1) * kN * ld<D>(), v + base, row_stride, (kt + 1) * kN, T, tid);
    }
    cp_async_commit();
    const int k0 = kt * kN;
    if (k0 <= row_lo + 16 * MT - 1) {
      const bf16* k_st = k_s + stage * kN * ld<D>();
      const bool straddles = k0 + kN - 1 > row_lo;
      float p[MT][NJ][4];  // S, then P
      warp_scores<D, MT, NJ>(q_s + (row_lo - q0) * ld<D>(), k_st, lane, p);
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = e >> 1;
            const float pe = exp2_approx(fmaf(p[m][j][e], scale_log2, -lse2_s[row_lo - q0 + 16 * m + g + 8 * r]));
            const bool masked = k0 + 8 * j + 2 * t + (e & 1) > row_lo + 16 * m + g + 8 * r;
            p[m][j][e] = (straddles && masked) ? 0.f : pe;
          }
      float ds[MT][NJ][4];  // dP, then dS
      warp_scores<D, MT, NJ>(do_s + (row_lo - q0) * ld<D>(), v_s + stage * kN * ld<D>(), lane, ds);
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            ds[m][j][e] = p[m][j][e] * (ds[m][j][e] - delta_s[row_lo - q0 + 16 * m + g + 8 * (e >> 1)]);
      warp_pz<D, MT, NJ>(ds, k_st, lane, acc);
    }
    cp_async_wait_all();
    __syncthreads();
  }

  float scaled[MT][2];
#pragma unroll
  for (int m = 0; m < MT; ++m) scaled[m][0] = scaled[m][1] = scale;
  store_rows<D, MT>(dq + base, row_stride, row_lo, T, lane, acc, scaled);
}

// ---------------------------------------------------------------------------------------------
// Host side.
// ---------------------------------------------------------------------------------------------

void check_cuda(cudaError_t err, const char* what) {
  check(err == cudaSuccess, "{}: {} ({})", what, cudaGetErrorString(err), static_cast<int>(err));
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Validates the shape and scale; returns false when there is nothing to compute.
bool check_shape(const char* op, int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim, float scale) {
  check(head_dim == 64 || head_dim == 128,
        "{}: head_dim {} is not supported by the bf16 flash-attention kernels (supported: 64, 128)", op, head_dim);
  check(batch >= 0 && seq_len >= 0 && heads >= 0, "{}: negative shape batch {} seq_len {} heads {}", op, batch,
        seq_len, heads);
  check(std::isfinite(scale) && scale > 0.f, "{}: scale must be finite and positive, got {}", op, scale);
  if (batch == 0 || seq_len == 0 || heads == 0) return false;
  check(seq_len <= std::numeric_limits<int>::max() - kBig, "{}: seq_len {} is too large", op, seq_len);
  check(batch * heads <= 65535, "{}: batch * heads = {} exceeds the limit of 65535 (grid y dimension)", op,
        batch * heads);
  return true;
}

template <typename Kernel>
void set_smem(Kernel kernel, int bytes, const char* op) {
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), op);
}

// x: the 128-row tiles of one head, y: batch * heads. Blocks launch in x-major order, so the blocks
// resident at a time cover few heads and their K/V (or Q/dO) reads hit L2.
dim3 grid_for(int64_t batch, int64_t heads, int64_t seq_len) {
  return dim3(static_cast<unsigned>((seq_len + kBig - 1) / kBig), static_cast<unsigned>(batch * heads));
}

template <int D>
void launch_fwd(const bf16* q, const bf16* k, const bf16* v, int64_t batch, int64_t seq_len, int64_t heads,
                float scale, bf16* o, float* lse, cudaStream_t stream) {
  constexpr int smem = fwd_smem_bytes<D>();
  set_smem(fa_fwd_kernel<D>, smem, "flash_attention_fwd: cudaFuncSetAttribute(max dynamic shared memory)");
  fa_fwd_kernel<D><<<grid_for(batch, heads, seq_len), kQThreads, smem, stream>>>(
      q, k, v, static_cast<int>(seq_len), static_cast<int>(heads), scale, scale * kLog2e, o, lse);
  check_cuda(cudaGetLastError(), "flash_attention_fwd: kernel launch");
}

template <int D>
void launch_bwd(const bf16* q, const bf16* k, const bf16* v, const bf16* o, const float* lse, const bf16* dout,
                int64_t batch, int64_t seq_len, int64_t heads, float scale, bf16* dq, bf16* dk, bf16* dv,
                float* delta, float* lse2, cudaStream_t stream) {
  const int T = static_cast<int>(seq_len);
  const int H = static_cast<int>(heads);
  const int64_t rows = batch * seq_len * heads;
  constexpr int kRowsPerBlock = kKVThreads / 32;
  check((rows + kRowsPerBlock - 1) / kRowsPerBlock <= std::numeric_limits<int>::max(),
        "flash_attention_bwd: {} rows are too many", rows);
  fa_bwd_preprocess_kernel<D><<<static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock), kKVThreads, 0,
                                stream>>>(o, dout, lse, rows, T, H, delta, lse2);
  check_cuda(cudaGetLastError(), "flash_attention_bwd: preprocess kernel launch");

  const dim3 grid = grid_for(batch, heads, seq_len);
  const float scale_log2 = scale * kLog2e;
  constexpr int smem_dkdv = dkdv_smem_bytes<D>();
  set_smem(fa_bwd_dkdv_kernel<D>, smem_dkdv, "flash_attention_bwd: cudaFuncSetAttribute(max dynamic shared memory)");
  fa_bwd_dkdv_kernel<D><<<grid, kKVThreads, smem_dkdv, stream>>>(q, k, v, dout, lse2, delta, T, H, scale, scale_log2,
                                                                  dk, dv);
  check_cuda(cudaGetLastError(), "flash_attention_bwd: dK/dV kernel launch");

  constexpr int smem_dq = dq_smem_bytes<D>();
  set_smem(fa_bwd_dq_kernel<D>, smem_dq, "flash_attention_bwd: cudaFuncSetAttribute(max dynamic shared memory)");
  fa_bwd_dq_kernel<D><<<grid, kQThreads, smem_dq, stream>>>(q, k, v, dout, lse2, delta, T, H, scale, scale_log2, dq);
  check_cuda(cudaGetLastError(), "flash_attention_bwd: dQ kernel launch");
}

}  // namespace

void flash_attention_fwd(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, int64_t batch,
                         int64_t seq_len, int64_t heads, int64_t head_dim, float scale, __nv_bfloat16* o, float* lse,
                         cudaStream_t stream) {
  if (!check_shape("flash_attention_fwd", batch, seq_len, heads, head_dim, scale)) return;
  check(aligned16(q) && aligned16(k) && aligned16(v) && aligned16(o) && lse != nullptr &&
            reinterpret_cast<uintptr_t>(lse) % alignof(float) == 0,
        "flash_attention_fwd: q, k, v and o must be 16-byte aligned and lse float-aligned device pointers");
  if (head_dim == 64) {
    launch_fwd<64>(q, k, v, batch, seq_len, heads, scale, o, lse, stream);
  } else {
    launch_fwd<128>(q, k, v, batch, seq_len, heads, scale, o, lse, stream);
  }
}

size_t flash_attention_bwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim) {
  (void)head_dim;
  if (batch <= 0 || seq_len <= 0 || heads <= 0) return 0;
  return 2 * static_cast<size_t>(batch * heads * seq_len) * sizeof(float);  // Delta, lse2
}

void flash_attention_bwd(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                         const __nv_bfloat16* o, const float* lse, const __nv_bfloat16* dout, int64_t batch,
                         int64_t seq_len, int64_t heads, int64_t head_dim, float scale, __nv_bfloat16* dq,
                         __nv_bfloat16* dk, __nv_bfloat16* dv, void* scratch, cudaStream_t stream) {
  if (!check_shape("flash_attention_bwd", batch, seq_len, heads, head_dim, scale)) return;
  check(aligned16(q) && aligned16(k) && aligned16(v) && aligned16(o) && aligned16(dout) && aligned16(dq) &&
            aligned16(dk) && aligned16(dv),
        "flash_attention_bwd: q, k, v, o, dout, dq, dk and dv must be 16-byte aligned device pointers");
  check(lse != nullptr && reinterpret_cast<uintptr_t>(lse) % alignof(float) == 0,
        "flash_attention_bwd: lse must be a float-aligned device pointer");
  check(scratch != nullptr && reinterpret_cast<uintptr_t>(scratch) % alignof(float) == 0,
        "flash_attention_bwd: scratch must be a float-aligned buffer of flash_attention_bwd_scratch_bytes() = {} "
        "bytes",
        flash_attention_bwd_scratch_bytes(batch, seq_len, heads, head_dim));
  float* delta = static_cast<float*>(scratch);
  float* lse2 = delta + batch * heads * seq_len;
  if (head_dim == 64) {
    launch_bwd<64>(q, k, v, o, lse, dout, batch, seq_len, heads, scale, dq, dk, dv, delta, lse2, stream);
  } else {
    launch_bwd<128>(q, k, v, o, lse, dout, batch, seq_len, heads, scale, dq, dk, dv, delta, lse2, stream);
  }
}

}  // namespace llmt::cuda
