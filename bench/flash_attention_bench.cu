// Throughput of the bf16 flash attention (src/kernels/cuda/flash_attention.cuh) on the current
// GPU: forward and forward + backward at T = 4096, H = 16, Dh = 128, B = 1..4, timed with CUDA
// events over repeated launches. FLOPs count the causal half only: forward 4 B H T^2 Dh / 2
// (two matrix products), backward 2.5 times that (five products), as FlashAttention-2 reports.
// Usage: flash_attention_bench [iterations]   (default 20)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>

#include "kernels/cuda/flash_attention.cuh"

namespace {

#define BENCH_CHECK(expr)                                                                        \
  do {                                                                                           \
    const cudaError_t err_ = (expr);                                                             \
    if (err_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s failed: %s\n", #expr, cudaGetErrorString(err_));                  \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

// x[i] = a deterministic pseudo-random value in [-amp, amp) (a hash of i and seed).
__global__ void fill_kernel(__nv_bfloat16* x, int64_t n, uint32_t seed, float amp) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    x[i] = __float2bfloat16(amp * (static_cast<float>(h) * (2.f / 4294967296.f) - 1.f));
  }
}

// Mean milliseconds of `iters` runs of f after 3 warm-up runs.
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

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 20;
  constexpr int64_t kMaxB = 4, T = 4096, H = 16, D = 128;
  const int64_t n = kMaxB * T * H * D;
  const float scale = 1.f / std::sqrt(static_cast<float>(D));

  __nv_bfloat16 *q, *k, *v, *o, *dout, *dq, *dk, *dv;
  float* lse;
  void* scratch;
  for (__nv_bfloat16** p : {&q, &k, &v, &o, &dout, &dq, &dk, &dv})
    BENCH_CHECK(cudaMalloc(p, n * sizeof(__nv_bfloat16)));
  BENCH_CHECK(cudaMalloc(&lse, kMaxB * H * T * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&scratch, llmt::cuda::flash_attention_bwd_scratch_bytes(kMaxB, T, H, D)));
  uint32_t seed = 1;
  for (__nv_bfloat16* p : {q, k, v, dout}) fill_kernel<<<1024, 256>>>(p, n, seed++, 2.f);
  BENCH_CHECK(cudaGetLastError());
  BENCH_CHECK(cudaDeviceSynchronize());

  cudaDeviceProp prop;
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("bf16 causal flash attention on %s, T %lld, H %lld, Dh %lld, %d iterations\n", prop.name,
              static_cast<long long>(T), static_cast<long long>(H), static_cast<long long>(D), iters);
  std::printf("%2s %12s %12s %16s %12s %12s\n", "B", "fwd ms", "fwd TFLOP/s", "fwd+bwd ms", "bwd TFLOP/s",
              "all TFLOP/s");
  for (int64_t B = 1; B <= kMaxB; ++B) {
    const double fwd_flops = 4.0 * B * H * T * T * D / 2.0;
    const float fwd_ms = time_ms(iters, [&] {
      llmt::cuda::flash_attention_fwd(q, k, v, B, T, H, D, scale, o, lse, nullptr);
    });
    const float all_ms = time_ms(iters, [&] {
      llmt::cuda::flash_attention_fwd(q, k, v, B, T, H, D, scale, o, lse, nullptr);
      llmt::cuda::flash_attention_bwd(q, k, v, o, lse, dout, B, T, H, D, scale, dq, dk, dv, scratch, nullptr);
    });
    const double bwd_ms = all_ms - fwd_ms;
    std::printf("%2lld %12.3f %12.1f %16.3f %12.1f %12.1f\n", static_cast<long long>(B), fwd_ms,
                fwd_flops / (fwd_ms * 1e9), all_ms, 2.5 * fwd_flops / (bwd_ms * 1e9),
                3.5 * fwd_flops / (all_ms * 1e9));
  }
  BENCH_CHECK(cudaDeviceSynchronize());
  for (void* p : {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(o),
                  static_cast<void*>(dout), static_cast<void*>(dq), static_cast<void*>(dk), static_cast<void*>(dv),
                  static_cast<void*>(lse), scratch})
    BENCH_CHECK(cudaFree(p));
  return 0;
}
