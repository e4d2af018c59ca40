// Shared pieces of the CUDA kernel benchmarks (bench/*_bench.cu): an error check that exits, the
// `[iterations] [--phases]` command line, a deterministic pseudo-random fill, and CUDA-event timing. Benchmarks only: not part of the library.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

/// Exits with the failed call and CUDA's message.
#define BENCH_CHECK(expr)                                                         \
  do {                                                                            \
    const cudaError_t bench_err_ = (expr);                                        \
    if (bench_err_ != cudaSuccess) {                                              \
      std::fprintf(stderr, "%s failed: %s\n", #expr, cudaGetErrorString(bench_err_)); \
      std::exit(1);                                                               \
    }                                                                             \
  } while (0)

namespace bench {

/// The command line `[iterations] [--phases]` (either order) of mamba2_bench and mamba3_bench.
struct IterArgs {
  int iters;
  bool phases = false;
};
inline IterArgs parse_iter_args(int argc, char** argv, int default_iters) {
  IterArgs a{default_iters};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--phases") == 0)
      a.phases = true;
    else
      a.iters = std::atoi(argv[i]);
  }
  return a;
}

inline __device__ float to_elem(float x, float*) { return x; }
inline __device__ __nv_bfloat16 to_elem(float x, __nv_bfloat16*) { return __float2bfloat16_rn(x); }

/// x[i] = lo + (hi - lo) u_i, u_i in [0, 1) a hash of i and seed (the same values on every run).
template <typename T>
__global__ void fill_uniform_kernel(T* x, int64_t n, uint32_t seed, float lo, float hi) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    x[i] = to_elem(lo + (hi - lo) * (static_cast<float>(h) * (1.f / 4294967296.f)), x);
  }
}

/// Fills x [n] (float or bf16) as fill_uniform_kernel does, on the default stream.
template <typename T>
void fill_uniform(T* x, int64_t n, uint32_t seed, float lo, float hi) {
  fill_uniform_kernel<<<1024, 256>>>(x, n, seed, lo, hi);
  BENCH_CHECK(cudaGetLastError());
}

/// Mean milliseconds of `iters` runs of f after 3 warm-up runs (CUDA events on the default stream).
template <typename F>
float time_ms(int iters, F f) {
  for (int i = 0; i < 3; ++i) f();
  cudaEvent_t start, stop;
  BENCH_CHECK(cudaEventCreate(&start));
  BENCH_CHECK(cudaEventCreate(&stop));
  BENCH_CHECK(cudaEventRecord(start));
  for (int i = 0; i < iters; ++i) f();
  BENCH_CHECK(cudaEventRecord(stop));
  BENCH_CHECK(cudaEventSynchronize(stop));
  float ms = 0.f;
  BENCH_CHECK(cudaEventElapsedTime(&ms, start, stop));
  BENCH_CHECK(cudaEventDestroy(start));
  BENCH_CHECK(cudaEventDestroy(stop));
  return ms / static_cast<float>(iters);
}

/// Median milliseconds of `reps` runs of f, each after 3 warm-up runs and each preceded by a write of 256 MiB (more
/// than the H200's 50 MiB L2, so every run starts with a cold L2), timed with CUDA events around f alone (the
/// default stream): the method of ../shared/perf-anchors.md (median of 30, L2 flushed before each).
template <typename F>
float median_ms_flushed(int reps, F f) {
  constexpr size_t kFlushBytes = size_t{256} << 20;
  void* flush = nullptr;
  BENCH_CHECK(cudaMalloc(&flush, kFlushBytes));
  for (int i = 0; i < 3; ++i) f();
  cudaEvent_t start, stop;
  BENCH_CHECK(cudaEventCreate(&start));
  BENCH_CHECK(cudaEventCreate(&stop));
  std::vector<float> ms(static_cast<size_t>(reps));
  for (float& m : ms) {
    BENCH_CHECK(cudaMemsetAsync(flush, 0, kFlushBytes));
    BENCH_CHECK(cudaEventRecord(start));
    f();
    BENCH_CHECK(cudaEventRecord(stop));
    BENCH_CHECK(cudaEventSynchronize(stop));
    BENCH_CHECK(cudaEventElapsedTime(&m, start, stop));
  }
  BENCH_CHECK(cudaEventDestroy(start));
  BENCH_CHECK(cudaEventDestroy(stop));
  BENCH_CHECK(cudaFree(flush));
  std::nth_element(ms.begin(), ms.begin() + reps / 2, ms.end());
  return ms[static_cast<size_t>(reps / 2)];
}

}  // namespace bench
