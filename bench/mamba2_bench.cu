// GPU time of the CUDA Mamba2 SSD step (src/kernels/cuda/mamba2.cu, fp32) at the perf-anchor shapes of
// /work/shared/perf-anchors.md: (a) B=4, T=4096, H=16, P=N=128; (b) B=1, T=16384, H=16, P=N=128;
// (c) B=4, T=4096, the ~1.3B model's heads, H=64, P=64, N=128; one group each. Forward (mamba2_ssd_fwd)
// and forward + backward (mamba2_ssd_fwd then mamba2_ssd_bwd), timed with CUDA events over repeated
// launches after warm-up; the conv and the projections are not included.
// Usage: mamba2_bench [iterations]   (default 20)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/ops.cuh"

namespace {

#define BENCH_CHECK(expr)                                                                        \
  do {                                                                                           \
    const cudaError_t err_ = (expr);                                                             \
    if (err_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s failed: %s\n", #expr, cudaGetErrorString(err_));                  \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

// x[i] = offset + a deterministic pseudo-random value in [-amp, amp) (a hash of i and seed).
__global__ void fill_kernel(float* x, int64_t n, uint32_t seed, float amp, float offset) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    x[i] = offset + amp * (static_cast<float>(h) * (2.f / 4294967296.f) - 1.f);
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

struct Shape {
  const char* name;
  int64_t B, T, H, P, N, G;
};

// Times one shape and prints its table row.
void bench(const Shape& s, int iters) {
  using namespace llmt::cuda;
  const int64_t XD = s.H * s.P, W = XD + 2 * s.G * s.N, rows = s.B * s.T;
  float *xbc, *dt_raw, *dt_bias, *A_log, *D, *y, *dy, *dxbc, *ddt_raw, *dparams;
  BENCH_CHECK(cudaMalloc(&xbc, rows * W * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&dxbc, rows * W * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&dt_raw, rows * s.H * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&ddt_raw, rows * s.H * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&y, rows * XD * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&dy, rows * XD * sizeof(float)));
  for (float** p : {&dt_bias, &A_log, &D}) BENCH_CHECK(cudaMalloc(p, s.H * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&dparams, 3 * s.H * sizeof(float)));
  const size_t scratch_bytes = std::max(mamba2_ssd_fwd_scratch_bytes(s.B, s.T, s.H, s.P, s.N),
                                        mamba2_ssd_bwd_scratch_bytes(s.B, s.T, s.H, s.P, s.N));
  void* scratch;
  BENCH_CHECK(cudaMalloc(&scratch, scratch_bytes));
  // x, B, C ~ U(-1, 1); Δ = softplus(dt_raw + dt_bias) around 0.02; -A = exp(A_log) in [1, 16).
  fill_kernel<<<1024, 256>>>(xbc, rows * W, 1, 1.f, 0.f);
  fill_kernel<<<1024, 256>>>(dy, rows * XD, 2, 1.f, 0.f);
  fill_kernel<<<1024, 256>>>(dt_raw, rows * s.H, 3, 1.f, 0.f);
  fill_kernel<<<1, 256>>>(dt_bias, s.H, 4, 1.f, -4.f);
  fill_kernel<<<1, 256>>>(A_log, s.H, 5, 1.386f, 1.386f);
  fill_kernel<<<1, 256>>>(D, s.H, 6, 1.f, 0.f);
  BENCH_CHECK(cudaMemset(dparams, 0, 3 * s.H * sizeof(float)));
  BENCH_CHECK(cudaGetLastError());
  BENCH_CHECK(cudaDeviceSynchronize());

  auto fwd = [&] { mamba2_ssd_fwd(xbc, dt_raw, dt_bias, A_log, D, s.B, s.T, s.H, s.P, s.N, s.G, y, scratch, 0); };
  auto fwd_bwd = [&] {
    fwd();
    mamba2_ssd_bwd(dy, xbc, dt_raw, dt_bias, A_log, D, s.B, s.T, s.H, s.P, s.N, s.G, dxbc, ddt_raw, dparams,
                   dparams + s.H, dparams + 2 * s.H, scratch, 0);
  };
  const float ms_fwd = time_ms(iters, fwd), ms_fb = time_ms(iters, fwd_bwd);
  BENCH_CHECK(cudaGetLastError());
  std::printf("| %-3s | B=%lld T=%lld H=%lld P=%lld N=%lld G=%lld | %8.3f | %8.3f | %6.0f |\n", s.name,
              static_cast<long long>(s.B), static_cast<long long>(s.T), static_cast<long long>(s.H),
              static_cast<long long>(s.P), static_cast<long long>(s.N), static_cast<long long>(s.G), ms_fwd, ms_fb,
              static_cast<double>(scratch_bytes) / (1 << 20));
  for (float* p : {xbc, dt_raw, dt_bias, A_log, D, y, dy, dxbc, ddt_raw, dparams}) BENCH_CHECK(cudaFree(p));
  BENCH_CHECK(cudaFree(scratch));
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 20;
  cudaDeviceProp prop;
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("Mamba2 SSD (fp32, src/kernels/cuda/mamba2.cu) on %s, mean of %d runs\n\n", prop.name, iters);
  std::printf("| shape | sizes | GPU ms fwd | GPU ms f+b | scratch MiB |\n|---|---|---|---|---|\n");
  const Shape shapes[] = {{"a", 4, 4096, 16, 128, 128, 1}, {"b", 1, 16384, 16, 128, 128, 1},
                          {"c", 4, 4096, 64, 64, 128, 1}};
  for (const Shape& s : shapes) bench(s, iters);
  return 0;
}
