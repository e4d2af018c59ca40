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

#include "bench_util.cuh"
#include "kernels/cuda/flash_attention.cuh"

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
  for (__nv_bfloat16* p : {q, k, v, dout}) bench::fill_uniform(p, n, seed++, -2.f, 2.f);
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
    const float fwd_ms = bench::time_ms(iters, [&] {
      llmt::cuda::flash_attention_fwd(q, k, v, B, T, H, D, scale, o, lse, nullptr);
    });
    const float all_ms = bench::time_ms(iters, [&] {
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
