// GPU time of the CUDA Mamba-3 layer op (src/kernels/cuda/mamba3*.cu, fp32: prep, chunked core, gate) at the
// 1.5B heads of configs/mamba3-paper/1.5b (64 heads x 64, d_state 128, 32 angles, one group), B = 4, T = 4096,
// SISO and MIMO (R = 4), without the output norm (as the configs); each with the core's products in fp32 and on
// the tensor cores (Mamba3Options::bf16_products, the path of bf16 models). Forward (mamba3_fwd) and forward + backward
// (mamba3_fwd then mamba3_bwd, which recomputes the forward), timed with CUDA events over repeated launches
// after warm-up; the projections are not included.
// Usage: mamba3_bench [iterations]   (default 10)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench_util.cuh"
#include "kernels/cuda/ops.cuh"

namespace {

struct Shape {
  const char* name;
  int64_t B, T, H, P, N, G, R, S;
  bool bf16;  // Mamba3Options::bf16_products
};

float* alloc(int64_t n) {
  float* p = nullptr;
  BENCH_CHECK(cudaMalloc(&p, static_cast<size_t>(n) * sizeof(float)));
  return p;
}

// Times one shape and prints its table row.
void bench_shape(const Shape& s, int iters) {
  using namespace llmt::cuda;
  const int64_t rows = s.B * s.T, HP = s.H * s.P, BC = 2 * s.R * s.G * s.N, W = 3 * s.H + s.S;
  const int64_t RN = s.H * s.R * s.N, RP = s.H * s.R * s.P;
  std::vector<float*> owned;
  auto take = [&](int64_t n) { return owned.emplace_back(alloc(n)); };
  float *x = take(rows * HP), *z = take(rows * HP), *bc = take(rows * BC), *raw = take(rows * W);
  float *out = take(rows * HP), *dout = take(rows * HP), *dx = take(rows * HP), *dz = take(rows * HP);
  float *dbc = take(rows * BC), *draw = take(rows * W);
  const int64_t sizes[] = {s.H, RN, RN, s.N, s.N, s.H, RP, RP, RP};
  float* prm[9];
  float* grd[9];
  for (int i = 0; i < 9; ++i) {
    prm[i] = take(sizes[i]);
    grd[i] = take(sizes[i]);
    bench::fill_uniform(prm[i], sizes[i], 10 + i, 0.5f, 1.5f);
    BENCH_CHECK(cudaMemset(grd[i], 0, sizes[i] * sizeof(float)));
  }
  const bool mimo = s.R > 1;
  const Mamba3Ptrs p{prm[0], prm[1], prm[2], prm[3], prm[4], prm[5],
                     mimo ? prm[6] : nullptr, mimo ? prm[7] : nullptr, mimo ? prm[8] : nullptr, nullptr};
  const Mamba3GradPtrs g{grd[0], grd[1], grd[2], grd[3], grd[4], grd[5],
                         mimo ? grd[6] : nullptr, mimo ? grd[7] : nullptr, mimo ? grd[8] : nullptr, nullptr};
  // x, z, B, C, dout ~ U(-1, 1); dd_dt in [-1, 1) with dt_bias in [-5, -3) (Δ around 0.02); dd_A, trap, angles
  // in [-1, 1).
  bench::fill_uniform(x, rows * HP, 1, -1.f, 1.f);
  bench::fill_uniform(z, rows * HP, 2, -1.f, 1.f);
  bench::fill_uniform(bc, rows * BC, 3, -1.f, 1.f);
  bench::fill_uniform(raw, rows * W, 4, -1.f, 1.f);
  bench::fill_uniform(dout, rows * HP, 5, -1.f, 1.f);
  bench::fill_uniform(prm[0], s.H, 6, -5.f, -3.f);
  BENCH_CHECK(cudaDeviceSynchronize());

  const llmt::cpu::Mamba3LayerDims d{s.B, s.T, s.H, s.P, s.N, s.G, s.R, s.S};
  llmt::Mamba3Options opt;
  opt.head_dim = s.P;
  opt.n_groups = s.G;
  opt.rank = s.R;
  opt.chunk_size = 64 / s.R;
  opt.bf16_products = s.bf16;
  const size_t scratch_bytes = std::max(mamba3_fwd_scratch_bytes(d, opt), mamba3_bwd_scratch_bytes(d, opt));
  void* scratch;
  BENCH_CHECK(cudaMalloc(&scratch, scratch_bytes));

  auto fwd = [&] { mamba3_fwd(x, z, bc, raw, p, d, opt, out, scratch, 0); };
  auto fwd_bwd = [&] {
    fwd();
    mamba3_bwd(dout, x, z, bc, raw, p, d, opt, dx, dz, dbc, draw, g, scratch, 0);
  };
  const float ms_fwd = bench::time_ms(iters, fwd), ms_fb = bench::time_ms(iters, fwd_bwd);
  BENCH_CHECK(cudaGetLastError());
  std::printf("| %-4s | %s | B=%lld T=%lld H=%lld P=%lld N=%lld G=%lld R=%lld S=%lld | %8.3f | %8.3f | %6.0f |\n",
              s.name, s.bf16 ? "bf16" : "fp32", static_cast<long long>(s.B), static_cast<long long>(s.T),
              static_cast<long long>(s.H), static_cast<long long>(s.P), static_cast<long long>(s.N),
              static_cast<long long>(s.G), static_cast<long long>(s.R), static_cast<long long>(s.S), ms_fwd, ms_fb,
              static_cast<double>(scratch_bytes) / (1 << 20));
  for (float* q : owned) BENCH_CHECK(cudaFree(q));
  BENCH_CHECK(cudaFree(scratch));
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 10;
  cudaDeviceProp prop;
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("Mamba-3 layer op (fp32 tensors, src/kernels/cuda/mamba3*.cu) on %s, mean of %d runs\n\n", prop.name,
              iters);
  std::printf("| mode | products | sizes | GPU ms fwd | GPU ms f+b | scratch MiB |\n|---|---|---|---|---|---|\n");
  const Shape shapes[] = {{"siso", 4, 4096, 64, 64, 128, 1, 1, 32, false},
                          {"siso", 4, 4096, 64, 64, 128, 1, 1, 32, true},
                          {"mimo", 4, 4096, 64, 64, 128, 1, 4, 32, false},
                          {"mimo", 4, 4096, 64, 64, 128, 1, 4, 32, true}};
  for (const Shape& s : shapes) bench_shape(s, iters);
  return 0;
}
