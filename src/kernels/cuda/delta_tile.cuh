// 64 x 64 shared-memory tiles for the chunk-parallel delta-rule kernels (layers-delta.md §6): a chunk of
// at most 64 tokens is one tile's rows; key and value channels are cut into 64-wide column tiles.
// 256 threads per block, arranged 16 x 16; thread (ty, tx) owns the 4 x 4 micro-tile of rows ty + 16 i and
// columns tx + 16 j. Every product sums its depth in index order with fp32 fma (fixed order: deterministic).
// Shared tiles are stored row-major with a padded leading dimension (65) so that both a tile and its
// transpose are read without bank conflicts. All functions must be reached by every thread of the block.
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace llmt::cuda::tile {

constexpr int kN = 64;                // tile edge
constexpr int kLd = kN + 1;           // padded leading dimension of a shared tile
constexpr int kTileFloats = kN * kLd;
constexpr int kThreads = 256;         // 16 x 16 threads, 4 x 4 outputs each

__device__ __forceinline__ int tx() { return static_cast<int>(threadIdx.x & 15); }
__device__ __forceinline__ int ty() { return static_cast<int>(threadIdx.x >> 4); }
/// Row of the thread's i-th micro-tile row, column of its j-th micro-tile column.
__device__ __forceinline__ int row_of(int i) { return ty() + 16 * i; }
__device__ __forceinline__ int col_of(int j) { return tx() + 16 * j; }

/// A thread's 4 x 4 accumulator: v[i][j] is element (row_of(i), col_of(j)) of a 64 x 64 tile.
struct Acc {
  float v[4][4];
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) v[i][j] = 0.0f;
  }
};

/// acc += op(A) op(B) over depth [0, depth): op(A)[r][d] = TA ? A[d][r] : A[r][d], op(B)[d][c] = TB ? B[c][d] :
/// B[d][c]; A, B shared tiles (leading dimension kLd).
template <bool TA, bool TB>
__device__ __forceinline__ void mma(const float* A, const float* B, Acc& acc, int depth = kN) {
  const int x = tx(), y = ty();
  for (int d = 0; d < depth; ++d) {
    float a[4], b[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = TA ? A[d * kLd + y + 16 * i] : A[(y + 16 * i) * kLd + d];
#pragma unroll
    for (int j = 0; j < 4; ++j) b[j] = TB ? B[(x + 16 * j) * kLd + d] : B[d * kLd + x + 16 * j];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc.v[i][j] = fmaf(a[i], b[j], acc.v[i][j]);
  }
}

/// s[r][c] = scale(r) * src[r * stride + c] for r < rows, c < cols, else 0 (coalesced along c).
template <typename Scale>
__device__ __forceinline__ void load(float* s, const float* src, int64_t stride, int rows, int cols, Scale scale) {
  for (int idx = threadIdx.x; idx < kN * kN; idx += kThreads) {
    const int r = idx >> 6, c = idx & 63;
    s[r * kLd + c] = r < rows && c < cols ? scale(r) * src[r * stride + c] : 0.0f;
  }
}
__device__ __forceinline__ void load(float* s, const float* src, int64_t stride, int rows, int cols) {
  load(s, src, stride, rows, cols, [](int) { return 1.0f; });
}

/// dst[r * stride + c] = s[r][c] for r < rows, c < cols.
__device__ __forceinline__ void store(const float* s, float* dst, int64_t stride, int rows, int cols) {
  for (int idx = threadIdx.x; idx < kN * kN; idx += kThreads) {
    const int r = idx >> 6, c = idx & 63;
    if (r < rows && c < cols) dst[r * stride + c] = s[r * kLd + c];
  }
}

/// s[r][c] = 0 for the whole tile.
__device__ __forceinline__ void clear(float* s) {
  for (int idx = threadIdx.x; idx < kN * kLd; idx += kThreads) s[idx] = 0.0f;
}

/// out[t] = sum_j rows[t][j] + sum_i cols[i][t] for t < 64, where each thread contributes its micro-tile row
/// partials row_part[i] (to row row_of(i)) and column partials col_part[j] (to column col_of(j)); the 16
/// partials of a row (column) are added in thread order. red: 2 * 64 * 16 floats of shared scratch.
/// out may be read after the call (ends with a barrier).
__device__ __forceinline__ void reduce_rows_cols(const float row_part[4], const float col_part[4], float* red,
                                                 float* out) {
#pragma unroll
  for (int i = 0; i < 4; ++i) red[row_of(i) * 16 + tx()] = row_part[i];
#pragma unroll
  for (int j = 0; j < 4; ++j) red[kN * 16 + col_of(j) * 16 + ty()] = col_part[j];
  __syncthreads();
  if (threadIdx.x < kN) {
    float s = 0.0f;
    for (int p = 0; p < 16; ++p) s += red[threadIdx.x * 16 + p];
    for (int p = 0; p < 16; ++p) s += red[kN * 16 + threadIdx.x * 16 + p];
    out[threadIdx.x] = s;
  }
  __syncthreads();
}

/// (I + A) 𝒯 = I by forward substitution over rows 1..n-1 (layers-delta.md §6.1 F2): A strictly lower, 𝒯 must
/// hold the identity on entry; rows >= n stay identity. Both shared tiles.
__device__ __forceinline__ void tril_inverse(const float* A, float* Tm, int n) {
  for (int r = 1; r < n; ++r) {
    for (int m = threadIdx.x; m < r; m += kThreads) {
      float s = 0.0f;
      for (int j = m; j < r; ++j) s -= A[r * kLd + j] * Tm[j * kLd + m];
      Tm[r * kLd + m] = s;
    }
    __syncthreads();
  }
}

/// Carves consecutive shared-memory regions out of the dynamic shared buffer (16-byte aligned).
struct Carve {
  char* p;
  template <typename T>
  __device__ T* take(int64_t n) {
    T* r = reinterpret_cast<T*>(p);
    p += (static_cast<int64_t>(sizeof(T)) * n + 15) / 16 * 16;
    return r;
  }
  __device__ float* tile() { return take<float>(kTileFloats); }
};

/// Bytes that `tiles` tiles plus `extra` bytes of small arrays need (to size the dynamic shared memory).
constexpr size_t smem_bytes(int tiles, size_t extra) {
  return static_cast<size_t>(tiles) * ((sizeof(float) * kTileFloats + 15) / 16 * 16) + extra;
}

}  // namespace llmt::cuda::tile
