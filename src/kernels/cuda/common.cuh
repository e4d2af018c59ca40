// Shared pieces of the CUDA kernels: error checks that throw llmt::Error, launch sizes,
// and a deterministic block reduction (a fixed shuffle tree, so the same inputs and block
// size always give the same bits).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/error.h"

namespace llmt::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  throw Error(fmt::format("CUDA error {} ({}) in {} at {}:{}", cudaGetErrorName(err), cudaGetErrorString(err), expr,
                          file, line));
}

/// Throws llmt::Error naming the failed call, the file and the line.
#define LLMT_CUDA_CHECK(expr)                                                                  \
  do {                                                                                         \
    const cudaError_t llmt_cuda_err_ = (expr);                                                 \
    if (llmt_cuda_err_ != cudaSuccess) ::llmt::cuda::throw_cuda_error(llmt_cuda_err_, #expr, __FILE__, __LINE__); \
  } while (0)

/// Checks the kernel launch just made (configuration errors; faults surface at the next sync).
#define LLMT_CUDA_CHECK_LAUNCH() LLMT_CUDA_CHECK(cudaGetLastError())

constexpr int kThreads = 256;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// The last step of a deterministic parameter-gradient reduction (partials.cu): out[c] += Σ_k partial[k, c] for
/// c < n, over the `chunks` rows of partial [chunks, n] (double, each row one fixed range's sum) in a fixed order,
/// in double; out fp32 [n]. Nothing for n == 0.
void add_partials(const double* partial, int64_t chunks, int64_t n, float* out, cudaStream_t stream);

/// Blocks for a grid-stride loop over n elements: enough to fill the GPU, never more than n needs.
inline unsigned grid_for(int64_t n, int threads = kThreads) {
  return static_cast<unsigned>(std::clamp<int64_t>(ceil_div(n, threads), 1, 8192));
}

/// Storage <-> fp32 arithmetic for the element types of activations (float, bf16). Stores
/// round to nearest even.
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

/// Reduces v over the block (blockDim.x a multiple of 32, at most 1024) with op; every
/// thread receives the result. Fixed order: butterfly within warps, then warp 0 over the
/// warp results. Must be reached by all threads of the block.
template <typename T, typename Op>
__device__ T block_reduce(T v, Op op, T identity) {
  __shared__ T warp_vals[32];
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // an earlier call's readers of warp_vals[0] are done
  if (lane == 0) warp_vals[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x >> 5) ? warp_vals[lane] : identity;
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) warp_vals[0] = v;
  }
  __syncthreads();
  return warp_vals[0];
}

}  // namespace llmt::cuda
