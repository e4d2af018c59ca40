// GPU time of the delta-rule layers' glue kernels (src/kernels/cuda/delta_blocks.cu, elementwise.cu's convert)
// at the GDN 400M training shape (configs/mdn-paper/400m/gdn.json with micro-batch 4: B=4, T=4096, H=6, d_k=128,
// d_v=256; q/k conv width 768, v 1536; conv width 4): the short conv + SiLU forward and backward (dx in f32 and in
// bf16), the L2 norm forward and backward (B T H rows of 128), the gated RMSNorm forward and backward (B T H rows
// of 256; y / dz in f32 and in bf16) and the f32 -> bf16 convert. Each op: mean milliseconds over `iterations`
// launches after 3 warm-ups (CUDA events; every array is larger than the 50 MiB L2), the bytes it must move at
// least (its compulsory DRAM traffic: every input read once, every output written once, the dw partials
// ignored) and the resulting GB/s. The per-step cost of an op is its row times its launches per step (21 layers:
// conv 3 a layer each way, L2 norm 2, gated norm 1, convert: see the report).
// Usage: blocks_bench [iterations]   (default 20)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "bench_util.cuh"
#include "kernels/cuda/ops.cuh"

namespace {

constexpr int64_t kB = 4, kT = 4096, kH = 6, kDk = 128, kDv = 256, kW = 4, kRows = kB * kT;

template <typename T>
T* device(int64_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  T* p = nullptr;
  BENCH_CHECK(cudaMalloc(&p, sizeof(T) * static_cast<size_t>(n)));
  bench::fill_uniform(p, n, seed, lo, hi);
  return p;
}

void* scratch(size_t bytes) {
  void* p = nullptr;
  BENCH_CHECK(cudaMalloc(&p, bytes));
  return p;
}

void row(const char* name, float ms, double bytes) {
  std::printf("%-44s %9.4f ms %10.1f MB %8.0f GB/s\n", name, ms, bytes / 1e6, bytes / (ms * 1e-3) / 1e9);
}

// The short conv at `channels`: forward, backward with dx in f32 and in bf16.
void conv(int iters, int64_t channels, const char* tag) {
  const int64_t n = kRows * channels;
  float *x = device<float>(n, 1), *w = device<float>(channels * kW, 2, -0.5f, 0.5f), *dy = device<float>(n, 3);
  float *pre = device<float>(n, 4), *y = device<float>(n, 5), *dx = device<float>(n, 6);
  float* dw = device<float>(channels * kW, 7);
  auto* dxh = device<__nv_bfloat16>(n, 8);
  void* s = scratch(llmt::cuda::short_conv_silu_bwd_scratch_bytes(kB, kT, channels, kW));
  char name[96];
  std::snprintf(name, sizeof name, "short conv fwd %s", tag);
  row(name, bench::time_ms(iters, [&] {
        llmt::cuda::short_conv_silu_fwd(x, w, nullptr, kB, kT, channels, kW, pre, y, nullptr);
      }), 12.0 * n);
  std::snprintf(name, sizeof name, "short conv bwd %s, dx f32", tag);
  row(name, bench::time_ms(iters, [&] {
        llmt::cuda::short_conv_silu_bwd(dy, x, w, pre, kB, kT, channels, kW, dx, dw, nullptr, s, nullptr);
      }), 16.0 * n);
  std::snprintf(name, sizeof name, "short conv bwd %s, dx bf16", tag);
  row(name, bench::time_ms(iters, [&] {
        llmt::cuda::short_conv_silu_bwd(dy, x, w, pre, kB, kT, channels, kW, dxh, dw, nullptr, s, nullptr);
      }), 14.0 * n);
  for (void* p : {static_cast<void*>(x), static_cast<void*>(w), static_cast<void*>(dy), static_cast<void*>(pre),
                  static_cast<void*>(y), static_cast<void*>(dx), static_cast<void*>(dw), static_cast<void*>(dxh), s})
    BENCH_CHECK(cudaFree(p));
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 20;
  std::printf("GDN 400M shape: B=%ld T=%ld H=%ld d_k=%ld d_v=%ld, conv width %ld; %d iterations\n", kB, kT, kH, kDk,
              kDv, kW, iters);
  conv(iters, kH * kDk, "q/k (768 ch)");
  conv(iters, kH * kDv, "v (1536 ch)");

  {  // L2 norm: B T H rows of d_k
    const int64_t rows = kRows * kH, n = rows * kDk;
    float *x = device<float>(n, 11), *y = device<float>(n, 12), *dy = device<float>(n, 13), *dx = device<float>(n, 14);
    float* rinv = device<float>(rows, 15);
    row("l2norm fwd (rows of 128)", bench::time_ms(iters, [&] {
          llmt::cuda::l2norm_fwd(x, rows, kDk, 1e-6, 0.088, y, rinv, nullptr);
        }), 8.0 * n);
    row("l2norm bwd (rows of 128)", bench::time_ms(iters, [&] {
          llmt::cuda::l2norm_bwd(dy, y, rinv, rows, kDk, 0.088, dx, nullptr);
        }), 12.0 * n);
    for (float* p : {x, y, dy, dx, rinv}) BENCH_CHECK(cudaFree(p));
  }

  {  // gated RMSNorm: B T H rows of d_v, SiLU gate
    const int64_t rows = kRows * kH, n = rows * kDv;
    float *o = device<float>(n, 21), *z = device<float>(n, 22, -4.f, 4.f), *w = device<float>(kDv, 23);
    float *y = device<float>(n, 24), *dy = device<float>(n, 25), *d_o = device<float>(n, 26), *dz = device<float>(n, 27);
    float *rstd = device<float>(rows, 28), *dw = device<float>(kDv, 29);
    auto *yh = device<__nv_bfloat16>(n, 30), *dzh = device<__nv_bfloat16>(n, 31);
    void* s = scratch(llmt::cuda::gated_rmsnorm_bwd_scratch_bytes(rows, kDv));
    row("gated rmsnorm fwd (rows of 256), y f32", bench::time_ms(iters, [&] {
          llmt::cuda::gated_rmsnorm_fwd(o, z, w, rows, kDv, 1e-6, false, y, rstd, nullptr);
        }), 12.0 * n);
    row("gated rmsnorm fwd (rows of 256), y bf16", bench::time_ms(iters, [&] {
          llmt::cuda::gated_rmsnorm_fwd(o, z, w, rows, kDv, 1e-6, false, yh, rstd, nullptr);
        }), 10.0 * n);
    row("gated rmsnorm bwd (rows of 256), dz f32", bench::time_ms(iters, [&] {
          llmt::cuda::gated_rmsnorm_bwd(dy, o, z, w, rstd, rows, kDv, false, d_o, dz, dw, s, nullptr);
        }), 20.0 * n);
    row("gated rmsnorm bwd (rows of 256), dz bf16", bench::time_ms(iters, [&] {
          llmt::cuda::gated_rmsnorm_bwd(dy, o, z, w, rstd, rows, kDv, false, d_o, dzh, dw, s, nullptr);
        }), 18.0 * n);
    for (void* p : {static_cast<void*>(o), static_cast<void*>(z), static_cast<void*>(w), static_cast<void*>(y),
                    static_cast<void*>(dy), static_cast<void*>(d_o), static_cast<void*>(dz), static_cast<void*>(rstd),
                    static_cast<void*>(dw), static_cast<void*>(yh), static_cast<void*>(dzh), s})
      BENCH_CHECK(cudaFree(p));
  }

  {  // convert f32 -> bf16 of a [B T, d_model] residual gradient and a [B T, H d_v] activation
    for (const int64_t width : {int64_t{1024}, kH * kDv}) {
      const int64_t n = kRows * width;
      float* src = device<float>(n, 41);
      auto* dst = device<__nv_bfloat16>(n, 42);
      char name[96];
      std::snprintf(name, sizeof name, "convert f32 -> bf16 [%ld, %ld]", kRows, width);
      row(name, bench::time_ms(iters, [&] { llmt::cuda::convert(src, n, dst, nullptr); }), 6.0 * n);
      BENCH_CHECK(cudaFree(src));
      BENCH_CHECK(cudaFree(dst));
    }
  }
  BENCH_CHECK(cudaDeviceSynchronize());
  BENCH_CHECK(cudaGetLastError());
  return 0;
}
