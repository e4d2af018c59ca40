// Per-chunk indexing, accumulator I/O and launching shared by the chunk-parallel delta-rule cores
// (gdn_comba.cu, kda.cu; layers-delta.md §6) on the 64 x 64 tiles of delta_tile.cuh. A core's argument
// struct A provides B, T, H, K, V, C (chunk size <= 64) and NC = ceil(T / C); its token tensors are
// [B, T, H, dim], its per-chunk scratch [B H, T', dim] with T' = NC C, its states [B H, NC, K, V].
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/delta_tile.cuh"

namespace llmt::cuda::tile {

/// One chunk of one (batch, head): token rows t0 .. t0 + n - 1 (n <= 64; rows >= n of a tile are padding).
struct Chunk {
  int64_t b, h, bh, chunk, t0;
  int n;
  template <typename A>
  __device__ Chunk(const A& a, int64_t chunk_, int64_t bh_) : b(bh_ / a.H), h(bh_ % a.H), bh(bh_), chunk(chunk_) {
    t0 = chunk * a.C;
    n = static_cast<int>(a.T - t0 < a.C ? a.T - t0 : a.C);
  }
  /// Index of token row r of the chunk in a [B, T, H] tensor.
  template <typename A>
  __device__ int64_t gate(const A& a, int r) const { return (b * a.T + t0 + r) * a.H + h; }
  /// Element (row 0, column c0) of the chunk in a [B, T, H, dim] tensor (rows H * dim apart).
  template <typename A, typename P>
  __device__ P* in(const A& a, P* p, int64_t dim, int64_t c0) const { return p + gate(a, 0) * dim + c0; }
  /// Element (row 0, column c0) of the chunk in a [B H, T', dim] scratch tensor (rows dim apart).
  template <typename A, typename P>
  __device__ P* rows(const A& a, P* p, int64_t dim, int64_t c0) const {
    return p + (bh * a.NC * a.C + t0) * dim + c0;
  }
  /// Element (k0, v0) of this chunk's state in a [B H, chunks, K, V] scratch tensor (rows V apart).
  template <typename A, typename P>
  __device__ P* state(const A& a, P* p, int64_t k0, int64_t v0) const {
    return p + ((bh * a.NC + chunk) * a.K + k0) * a.V + v0;
  }
  /// This chunk's 64 x 64 matrix in a [B H, chunks, 64, 64] scratch tensor.
  template <typename A>
  __device__ float* square(const A& a, float* p) const { return p + (bh * a.NC + chunk) * kN * kN; }
};

/// out.v[i][j] = src[r * stride + c] for the thread's elements (r, c) = (L::row(i), L::col(j)) with r < rows,
/// c < cols, else 0; src float or bf16. The 16 loads are independent (issued together).
template <typename L, typename E>
__device__ __forceinline__ void load_acc(Acc& out, const E* src, int64_t stride, int rows, int cols) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = L::row(i), c = L::col(j);
      out.v[i][j] = r < rows && c < cols ? to_f32(src[r * stride + c]) : 0.0f;
    }
}

/// dst[r * stride + c] = f(r, c, acc) for the thread's elements with r < rows, c < cols; dst float or bf16
/// (rounded to nearest even).
template <typename L, typename E, typename F>
__device__ __forceinline__ void store_acc(const Acc& acc, E* dst, int64_t stride, int rows, int cols, F f) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = L::row(i), c = L::col(j);
      if (r < rows && c < cols) dst[r * stride + c] = from_f32<E>(f(r, c, acc.v[i][j]));
    }
}

/// Identity element function for store_acc.
struct Same {
  __device__ float operator()(int, int, float x) const { return x; }
};

/// Zeroes nkt bf16 tiles (kLdH) at hS, by a block of kT threads: the bf16 copy of an Mma scan's running state
/// before its first chunk.
template <int kT = kThreads>
__device__ __forceinline__ void clear_h(__nv_bfloat16* hS, int nkt) {
  for (int idx = static_cast<int>(threadIdx.x); idx < kTileHalves * nkt; idx += kT)
    hS[idx] = __float2bfloat16_rn(0.0f);
}

/// Zeroes the running state of an Mma scan before its first chunk: the fp32 slab of nkt key tiles, thread-major
/// (the thread's 16 elements of each key tile kThreads apart from S[threadIdx.x]), and its bf16 copy (nkt tiles).
__device__ __forceinline__ void clear_state(float* S, __nv_bfloat16* hS, int nkt) {
  const int tid = static_cast<int>(threadIdx.x);
  for (int e = 0; e < 16 * nkt; ++e) S[e * kThreads + tid] = 0.0f;
  clear_h(hS, nkt);
}

/// An Mma scan's Δ = U - W S (kAdd = false) or dΔ = P^T dO + K^g dS (kAdd = true) at the thread's elements (map
/// of M, an MmaCols): d (loaded from dst) minus or plus the product acc in the first rows × cols, 0 outside;
/// stored back to dst (rows stride apart) and, as the next products' operand, to the bf16 tile h.
template <bool kAdd, typename M = Mma, typename E>
__device__ __forceinline__ void delta_out(Acc& d, const Acc& acc, E* dst, int64_t stride, int rows, int cols,
                                          __nv_bfloat16* h) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = M::row(i), c = M::col(j);
      d.v[i][j] = r < rows && c < cols ? (kAdd ? d.v[i][j] + acc.v[i][j] : d.v[i][j] - acc.v[i][j]) : 0.0f;
    }
  store_acc<M>(d, dst, stride, rows, cols, Same{});
  store_acc_h<M>(d, h, Same{});
}

/// Asks the L2 cache for `rows` rows of `row_bytes` bytes each, `stride_bytes` apart, starting at p
/// (prefetch.global.L2, one 128-byte line per thread and step of a block of kT threads; no effect on any
/// result). The scans call it for the next chunk's operands so that their loads wait for the L2, not for memory.
template <int kT = kThreads>
__device__ __forceinline__ void prefetch_l2(const void* p, int64_t stride_bytes, int rows, int64_t row_bytes) {
#ifdef __CUDA_ARCH__
  const int64_t per_row = (row_bytes + 127) / 128;
  for (int64_t i = threadIdx.x; i < rows * per_row; i += kT) {
    const char* line = static_cast<const char*>(p) + i / per_row * stride_bytes + i % per_row * 128;
    asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
  }
#endif
}

/// Columns of the `width`-wide tile (64 unless given) starting at column c0 of a dim-wide matrix.
__device__ __forceinline__ int tile_cols(int64_t dim, int64_t c0, int width = kN) {
  return static_cast<int>(dim - c0 < width ? dim - c0 : width);
}

/// kernel<<<grid, threads, smem, stream>>>(args...) after allowing `smem` bytes of dynamic shared memory;
/// refuses (llmt::Error naming `what` and key_dim) when they and the kernel's static shared memory (e.g. the
/// tensor-core scratch of tile::Tc) exceed the 227 KiB a block may have.
template <typename Kernel, typename... Args>
void launch_n(const char* what, int64_t key_dim, Kernel kernel, dim3 grid, int threads, size_t smem,
              cudaStream_t stream, const Args&... args) {
  cudaFuncAttributes attr{};
  LLMT_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  const size_t total = smem + attr.sharedSizeBytes;
  check(total <= 227 * 1024, "{} (cuda): key_dim {} needs {} bytes of shared memory per block (limit 227 KiB)", what,
        key_dim, total);
  LLMT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<grid, threads, smem, stream>>>(args...);
  LLMT_CUDA_CHECK_LAUNCH();
}

/// launch_n with kThreads threads (every tile kernel but the scans' narrow value tiles).
template <typename Kernel, typename... Args>
void launch(const char* what, int64_t key_dim, Kernel kernel, dim3 grid, size_t smem, cudaStream_t stream,
            const Args&... args) {
  launch_n(what, key_dim, kernel, grid, kThreads, smem, stream, args...);
}

}  // namespace llmt::cuda::tile
