// GPU time of the CUDA Mamba2 SSD step (src/kernels/cuda/mamba2.cu) with both compute dtypes (fp32: exact fp32
// products; bf16: bf16 operands on the tensor cores, mamba2.cu "Precision") at the perf-anchor shapes of
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

#include "bench_util.cuh"
#include "kernels/cuda/ops.cuh"

namespace {

struct Shape {
  const char* name;
  int64_t B, T, H, P, N, G;
};

// Times one shape with compute dtype P (float or __nv_bfloat16) and prints its table row.
template <typename P>
void bench_shape(const Shape& s, int iters) {
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
  const size_t scratch_bytes = std::max(mamba2_ssd_fwd_scratch_bytes<P>(s.B, s.T, s.H, s.P, s.N),
                                        mamba2_ssd_bwd_scratch_bytes<P>(s.B, s.T, s.H, s.P, s.N));
  void* scratch;
  BENCH_CHECK(cudaMalloc(&scratch, scratch_bytes));
  // x, B, C ~ U(-1, 1); Δ = softplus(dt_raw + dt_bias) around 0.02; -A = exp(A_log) in [1, 16).
  bench::fill_uniform(xbc, rows * W, 1, -1.f, 1.f);
  bench::fill_uniform(dy, rows * XD, 2, -1.f, 1.f);
  bench::fill_uniform(dt_raw, rows * s.H, 3, -1.f, 1.f);
  bench::fill_uniform(dt_bias, s.H, 4, -5.f, -3.f);
  bench::fill_uniform(A_log, s.H, 5, 0.f, 2.772f);
  bench::fill_uniform(D, s.H, 6, -1.f, 1.f);
  BENCH_CHECK(cudaMemset(dparams, 0, 3 * s.H * sizeof(float)));
  BENCH_CHECK(cudaGetLastError());
  BENCH_CHECK(cudaDeviceSynchronize());

  auto fwd = [&] { mamba2_ssd_fwd<P>(xbc, dt_raw, dt_bias, A_log, D, s.B, s.T, s.H, s.P, s.N, s.G, y, scratch, 0); };
  auto fwd_bwd = [&] {
    fwd();
    mamba2_ssd_bwd<P>(dy, xbc, dt_raw, dt_bias, A_log, D, s.B, s.T, s.H, s.P, s.N, s.G, dxbc, ddt_raw, dparams,
                      dparams + s.H, dparams + 2 * s.H, scratch, 0);
  };
  const float ms_fwd = bench::time_ms(iters, fwd), ms_fb = bench::time_ms(iters, fwd_bwd);
  BENCH_CHECK(cudaGetLastError());
  std::printf("| %-3s | %-4s | B=%lld T=%lld H=%lld P=%lld N=%lld G=%lld | %8.3f | %8.3f | %6.0f |\n", s.name,
              sizeof(P) == 2 ? "bf16" : "fp32", static_cast<long long>(s.B), static_cast<long long>(s.T),
              static_cast<long long>(s.H), static_cast<long long>(s.P), static_cast<long long>(s.N),
              static_cast<long long>(s.G), ms_fwd, ms_fb,
              static_cast<double>(scratch_bytes) / (1 << 20));
  for (float* p : {xbc, dt_raw, dt_bias, A_log, D, y, dy, dxbc, ddt_raw, dparams}) BENCH_CHECK(cudaFree(p));
  BENCH_CHECK(cudaFree(scratch));
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 20;
  cudaDeviceProp prop;
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("Mamba2 SSD (src/kernels/cuda/mamba2.cu) on %s, mean of %d runs\n\n", prop.name, iters);
  std::printf("| shape | compute | sizes | GPU ms fwd | GPU ms f+b | scratch MiB |\n|---|---|---|---|---|---|\n");
  const Shape shapes[] = {{"a", 4, 4096, 16, 128, 128, 1}, {"b", 1, 16384, 16, 128, 128, 1},
                          {"c", 4, 4096, 64, 64, 128, 1}};
  for (const Shape& s : shapes) {
    bench_shape<float>(s, iters);
    bench_shape<__nv_bfloat16>(s, iters);
  }
  return 0;
}
