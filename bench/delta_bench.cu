// GPU time of the chunked delta-rule cores (src/kernels/cuda/ops.cuh: gdn_chunk_*, comba_chunk_*, kda_chunk_*,
// mdn_chunk_*) at the shapes of ../shared/perf-anchors.md: (a) B=4, T=4096, H=16, K=V=128 and (c) the ~1.3B heads,
// B=4, T=4096, H=6, K=256, V=512 (KDA: shape (a) only, g per key channel); chunk 64, fp32 inputs. GDN and Comba
// three times: fp32 products (the fp32 models' core) and bf16 operands on the tensor cores (the bf16 models'), the
// latter on the previous WMMA tiles (tile::Tc) and on the mma.sync tiles (tile::Mma, the default). MDN gates:
// log α in [-0.1, -0.001], log μ in [-3, -0.5], η in [0.5, 1.5), β in [0.1, 0.9). MDN runs twice: with
// save_residuals (the forward keeps Ṽ [B, T, H, V] fp32 for the backward, column "saved Ṽ") and recomputing Ṽ in
// the backward, each with fp32 products and with bf16 operands on the mma.sync tiles (tile::Mma). Forward and forward + backward, timed with CUDA events over
// repeated launches (mean after 3 warm-ups). The anchor rows to compare with are FLA's "GPU ms".
// Usage: delta_bench [iterations]   (default 10)
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <type_traits>

#include "bench_util.cuh"
#include "kernels/cuda/ops.cuh"

namespace {



float* random_buffer(int64_t n, uint32_t seed, float lo, float hi) {
  float* p = nullptr;
  BENCH_CHECK(cudaMalloc(&p, sizeof(float) * n));
  bench::fill_uniform(p, n, seed, lo, hi);
  return p;
}


struct Shape {
  const char* name;
  int64_t B, T, H, K, V;
};

enum class Core { kGdn, kComba, kKda, kMdn };

// kComba: the Comba core with p = k scaled by 0.9 (Comba's inner decay s = 0.9). kKda: g and dg per key channel
// [B, T, H, K]. kMdn: g is log α; log μ, η and their gradients are added; save_residuals: the forward writes Ṽ
// into a buffer of its own that the backward reads (else the backward recomputes Ṽ; MDN only). P: the GDN, Comba
// and MDN products' operand type (float: exact fp32; __nv_bfloat16: the tensor cores); KDA is fp32 only
// (P = float).
template <typename P>
void bench_core(const Shape& s, int iters, Core core, bool save_residuals = false) {
  const bool comba = core == Core::kComba, kda = core == Core::kKda, mdn = core == Core::kMdn;
  const int64_t nk = s.B * s.T * s.H * s.K, nv = s.B * s.T * s.H * s.V, nb = s.B * s.T * s.H, C = 64;
  const int64_t ng = kda ? nk : nb;
  const float amp = 1.7320508f / std::sqrt(static_cast<float>(s.K));  // rows of norm about 1
  float *q = random_buffer(nk, 1, -amp, amp), *k = random_buffer(nk, 2, -amp, amp);
  float *v = random_buffer(nv, 3, -1.f, 1.f), *g = random_buffer(ng, 4, -0.1f, -0.001f);
  float *beta = random_buffer(nb, 5, 0.1f, 0.9f), *d_o = random_buffer(nv, 6, -1.f, 1.f);
  float *o = random_buffer(nv, 7, 0.f, 0.f), *dq = random_buffer(nk, 8, 0.f, 0.f), *dk = random_buffer(nk, 9, 0.f, 0.f);
  float *dv = random_buffer(nv, 10, 0.f, 0.f), *dg = random_buffer(ng, 11, 0.f, 0.f), *db = random_buffer(nb, 12, 0.f, 0.f);
  float *p = random_buffer(nk, 2, -0.9f * amp, 0.9f * amp), *dp = random_buffer(nk, 13, 0.f, 0.f);
  float *lm = random_buffer(nb, 14, -3.f, -0.5f), *eta = random_buffer(nb, 15, 0.5f, 1.5f);
  float *dlm = random_buffer(nb, 16, 0.f, 0.f), *deta = random_buffer(nb, 17, 0.f, 0.f);
  float* residuals = save_residuals ? random_buffer(nv, 18, 0.f, 0.f) : nullptr;
  void* scratch = nullptr;
  const size_t bytes = kda   ? std::max(llmt::cuda::kda_chunk_fwd_scratch_bytes(s.B, s.T, s.H, s.K, s.V, C),
                                        llmt::cuda::kda_chunk_bwd_scratch_bytes(s.B, s.T, s.H, s.K, s.V, C))
                       : mdn ? std::max(llmt::cuda::mdn_chunk_fwd_scratch_bytes(s.B, s.T, s.H, s.K, s.V, C,
                                                                                save_residuals),
                                        llmt::cuda::mdn_chunk_bwd_scratch_bytes(s.B, s.T, s.H, s.K, s.V, C,
                                                                                save_residuals))
                             : std::max(llmt::cuda::gdn_chunk_fwd_scratch_bytes<P>(s.B, s.T, s.H, s.K, s.V, C),
                                        llmt::cuda::gdn_chunk_bwd_scratch_bytes<P>(s.B, s.T, s.H, s.K, s.V, C));
  BENCH_CHECK(cudaMalloc(&scratch, bytes));
  const auto fwd = [&] {
    if (comba)
      llmt::cuda::comba_chunk_fwd<P>(q, k, v, p, g, beta, s.B, s.T, s.H, s.K, s.V, C, o, scratch, nullptr);
    else if (kda)
      llmt::cuda::kda_chunk_fwd(q, k, v, g, beta, s.B, s.T, s.H, s.K, s.V, C, o, scratch, nullptr);
    else if (mdn)
      llmt::cuda::mdn_chunk_fwd<P>(q, k, v, g, beta, lm, eta, s.B, s.T, s.H, s.K, s.V, C, o, residuals, scratch,
                                   nullptr);
    else
      llmt::cuda::gdn_chunk_fwd<P>(q, k, v, g, beta, s.B, s.T, s.H, s.K, s.V, C, o, scratch, nullptr);
  };
  const auto bwd = [&] {
    if (comba)
      llmt::cuda::comba_chunk_bwd<P>(q, k, v, p, g, beta, d_o, s.B, s.T, s.H, s.K, s.V, C, dq, dk, dv, dp, dg, db,
                                     scratch, nullptr);
    else if (kda)
      llmt::cuda::kda_chunk_bwd(q, k, v, g, beta, d_o, s.B, s.T, s.H, s.K, s.V, C, dq, dk, dv, dg, db, scratch, nullptr);
    else if (mdn)
      llmt::cuda::mdn_chunk_bwd<P>(q, k, v, g, beta, lm, eta, d_o, residuals, s.B, s.T, s.H, s.K, s.V, C, dq, dk,
                                   dv, dg, db, dlm, deta, scratch, nullptr);
    else
      llmt::cuda::gdn_chunk_bwd<P>(q, k, v, g, beta, d_o, s.B, s.T, s.H, s.K, s.V, C, dq, dk, dv, dg, db, scratch,
                                   nullptr);
  };
  const float f = bench::time_ms(iters, fwd);
  const float fb = bench::time_ms(iters, [&] { fwd(); bwd(); });
  const char* mdn_name = save_residuals ? "MDN save_residuals" : "MDN recompute";
  const char* name = comba ? "Comba" : kda ? "KDA" : mdn ? mdn_name : "GDN";
  const char* products = std::is_same_v<P, float> ? "fp32 chunk-parallel"
                          : mdn || llmt::cuda::gdn_bf16_tiles() == llmt::cuda::GdnBf16Tiles::kMma
                              ? "bf16 mma.sync tiles"
                              : "bf16 WMMA tiles (previous)";
  const double mib = 1 << 20, saved_bytes = save_residuals ? static_cast<double>(sizeof(float) * nv) : 0.0;
  std::printf("| %s (ours, %s) | %s B=%ld T=%ld H=%ld K=%ld V=%ld | %.3f | %.3f | %.0f MiB | %.0f MiB |\n", name,
              products, s.name, static_cast<long>(s.B), static_cast<long>(s.T), static_cast<long>(s.H),
              static_cast<long>(s.K), static_cast<long>(s.V), f, fb, static_cast<double>(bytes) / mib,
              saved_bytes / mib);
  for (float* x : {q, k, v, g, beta, d_o, o, dq, dk, dv, dg, db, p, dp, lm, eta, dlm, deta}) BENCH_CHECK(cudaFree(x));
  if (residuals != nullptr) BENCH_CHECK(cudaFree(residuals));
  BENCH_CHECK(cudaFree(scratch));
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 10;
  std::printf("| core | shape | GPU ms fwd | GPU ms f+b | scratch | saved Ṽ |\n|---|---|---|---|---|---|\n");
  const Shape a{"a", 4, 4096, 16, 128, 128}, c{"c", 4, 4096, 6, 256, 512};
  for (const Shape& s : {a, c})
    for (const Core core : {Core::kGdn, Core::kComba}) {
      bench_core<float>(s, iters, core);
      for (const auto tiles : {llmt::cuda::GdnBf16Tiles::kWmma, llmt::cuda::GdnBf16Tiles::kMma}) {
        llmt::cuda::set_gdn_bf16_tiles(tiles);
        bench_core<__nv_bfloat16>(s, iters, core);
      }
    }
  bench_core<float>(a, iters, Core::kKda);
  for (const Shape& s : {a, c})
    for (const bool save_residuals : {true, false}) {
      bench_core<float>(s, iters, Core::kMdn, save_residuals);
      bench_core<__nv_bfloat16>(s, iters, Core::kMdn, save_residuals);
    }
  return 0;
}
