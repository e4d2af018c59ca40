// GPU time of the CUDA Mamba2 SSD step (src/kernels/cuda/mamba2.cu) with both compute dtypes (fp32: exact fp32
// products; bf16: bf16 operands on the tensor cores, mamba2.cu "Precision") at the perf-anchor shapes of
// /work/shared/perf-anchors.md: (a) B=4, T=4096, H=16, P=N=128; (b) B=1, T=16384, H=16, P=N=128;
// (c) B=4, T=4096, the ~1.3B model's heads, H=64, P=64, N=128; one group each. Forward (mamba2_ssd_fwd)
// and forward + backward (mamba2_ssd_fwd then mamba2_ssd_bwd), timed with CUDA events over repeated
// launches after warm-up; the conv and the projections are not included. As the layer runs them: the forward keeps
// its chunk states in a saved set (ops.cuh mamba2_ssd_saved_bytes) that the backward reads. Each compute dtype on fp32
// xbc and dy, then the bf16 op once more on bf16 xbc and dy (the "inputs" column: how FLA's kernels are fed, and how
// the Mamba2 layer feeds the CUDA op with compute bf16, Backend::mamba2_bf16_inputs), which then writes y and dxbc in
// bf16 too (as FLA's kernels write o and dq / dk / dv, and as the layer keeps them).
// With --phases instead: the bf16 op at shapes (a) and (c) kernel by kernel (mamba2_phases: bench/phases.h's table
// with the cost model mamba2_bf16_cost), the forward, then the backward (reading the forward's saved states); on fp32
// xbc, dy, or with --bf16-inputs on bf16 xbc, dy.
// Usage: mamba2_bench [iterations] [--phases [--bf16-inputs]]   (default 20 iterations)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>

#include "bench_util.cuh"
#include "phases.h"
#include "kernels/cuda/ops.cuh"

namespace {

struct Shape {
  const char* name;
  int64_t B, T, H, P, N, G;
};

/// One shape's tensors and scratch on the GPU with compute dtype P (float or __nv_bfloat16) and xbc, dy and the outputs
/// y, dxbc of type E (float, or __nv_bfloat16 with P = __nv_bfloat16), filled as the model's: x, B, C ~ U(-1, 1); Δ = softplus(dt_raw +
/// dt_bias) around 0.02; -A = exp(A_log) in [1, 16). fwd / bwd launch mamba2_ssd_fwd / mamba2_ssd_bwd on a stream with
/// the saved set `saved` (the forward writes the chunk states there, the backward reads them; the backward
/// accumulates into dparams = ddt_bias | dA_log | dD).
template <typename P, typename E>
struct Op {
  Shape s;
  E *xbc, *dy, *y, *dxbc;
  float *dt_raw, *dt_bias, *A_log, *D, *ddt_raw, *dparams;
  void *scratch, *saved;
  size_t scratch_bytes, saved_bytes;
  explicit Op(const Shape& shape) : s(shape) {
    using namespace llmt::cuda;
    const int64_t XD = s.H * s.P, W = XD + 2 * s.G * s.N, rows = s.B * s.T;
    BENCH_CHECK(cudaMalloc(&xbc, rows * W * sizeof(E)));
    BENCH_CHECK(cudaMalloc(&dxbc, rows * W * sizeof(E)));
    BENCH_CHECK(cudaMalloc(&dt_raw, rows * s.H * sizeof(float)));
    BENCH_CHECK(cudaMalloc(&ddt_raw, rows * s.H * sizeof(float)));
    BENCH_CHECK(cudaMalloc(&y, rows * XD * sizeof(E)));
    BENCH_CHECK(cudaMalloc(&dy, rows * XD * sizeof(E)));
    for (float** p : {&dt_bias, &A_log, &D}) BENCH_CHECK(cudaMalloc(p, s.H * sizeof(float)));
    BENCH_CHECK(cudaMalloc(&dparams, 3 * s.H * sizeof(float)));
    scratch_bytes = std::max(mamba2_ssd_fwd_scratch_bytes<P>(s.B, s.T, s.H, s.P, s.N, true),
                             mamba2_ssd_bwd_scratch_bytes<P>(s.B, s.T, s.H, s.P, s.N, true));
    saved_bytes = mamba2_ssd_saved_bytes<P>(s.B, s.T, s.H, s.P, s.N);
    BENCH_CHECK(cudaMalloc(&scratch, scratch_bytes));
    BENCH_CHECK(cudaMalloc(&saved, saved_bytes));
    bench::fill_uniform(xbc, rows * W, 1, -1.f, 1.f);
    bench::fill_uniform(dy, rows * XD, 2, -1.f, 1.f);
    bench::fill_uniform(dt_raw, rows * s.H, 3, -1.f, 1.f);
    bench::fill_uniform(dt_bias, s.H, 4, -5.f, -3.f);
    bench::fill_uniform(A_log, s.H, 5, 0.f, 2.772f);
    bench::fill_uniform(D, s.H, 6, -1.f, 1.f);
    BENCH_CHECK(cudaMemset(dparams, 0, 3 * s.H * sizeof(float)));
    BENCH_CHECK(cudaGetLastError());
    BENCH_CHECK(cudaDeviceSynchronize());
  }
  ~Op() {
    for (E* p : {xbc, dy, y, dxbc}) BENCH_CHECK(cudaFree(p));
    for (float* p : {dt_raw, dt_bias, A_log, D, ddt_raw, dparams}) BENCH_CHECK(cudaFree(p));
    BENCH_CHECK(cudaFree(scratch));
    BENCH_CHECK(cudaFree(saved));
  }
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;
  void fwd(cudaStream_t stream) const {
    llmt::cuda::mamba2_ssd_fwd<P>(xbc, dt_raw, dt_bias, A_log, D, s.B, s.T, s.H, s.P, s.N, s.G, y, saved, scratch,
                                  stream);
  }
  void bwd(cudaStream_t stream) const {
    llmt::cuda::mamba2_ssd_bwd<P>(dy, xbc, dt_raw, dt_bias, A_log, D, s.B, s.T, s.H, s.P, s.N, s.G, saved, dxbc,
                                  ddt_raw, dparams, dparams + s.H, dparams + 2 * s.H, scratch, stream);
  }
};

// Times one shape with compute dtype P (float or __nv_bfloat16) and inputs E (Op) and prints its table row.
template <typename P, typename E>
void bench_shape(const Shape& s, int iters) {
  const Op<P, E> op(s);
  const float ms_fwd = bench::time_ms(iters, [&] { op.fwd(nullptr); });
  const float ms_fb = bench::time_ms(iters, [&] {
    op.fwd(nullptr);
    op.bwd(nullptr);
  });
  BENCH_CHECK(cudaGetLastError());
  std::printf("| %-3s | %-4s | %-4s | B=%lld T=%lld H=%lld P=%lld N=%lld G=%lld | %8.3f | %8.3f | %6.0f | %6.0f |\n",
              s.name, sizeof(P) == 2 ? "bf16" : "fp32", sizeof(E) == 2 ? "bf16" : "fp32", static_cast<long long>(s.B),
              static_cast<long long>(s.T), static_cast<long long>(s.H), static_cast<long long>(s.P),
              static_cast<long long>(s.N), static_cast<long long>(s.G), ms_fwd, ms_fb,
              static_cast<double>(op.scratch_bytes) / (1 << 20), static_cast<double>(op.saved_bytes) / (1 << 20));
}

// ---- --phases: the bf16 op kernel by kernel ----

using bench::Cost;
using bench::PhaseKernel;

/// The Cost (bench/phases.h: bytes unique and issued, tensor-core FLOPs) of phase `phase` of the Mamba2 SSD op's
/// forward or (backward) backward call with bf16 compute (src/kernels/cuda/mamba2.cu, P = __nv_bfloat16; the phase
/// names of kMamba2Kernels) at shape s, counted from the kernels for xbc, dy and the outputs y, dxbc of kXb bytes an
/// element (4: fp32, 2: bf16: the op writes its outputs in its inputs' dtype; every other tensor fp32), T a multiple of 64 and P, N multiples of 64 (every chunk and tile full); zeros for
/// another name. Notation: E = B T H (token, head) pairs, nc = T / 64 chunks, PT = P / 64 and
/// NT = N / 64 tiles, St = E P N / 64 elements of one set of chunk states [B, H, nc, P, N] (bf16), BC = B T G N
/// elements of xbc's B (or C) columns. Scratch: Δ fp32, G double, dBh / dCh [B, H, T, N] bf16, the chunk partials
/// double; the entering states are the saved set's (written by the forward, read by the backward). The tile
/// products count 2 M N depth each (the masked halves of the intra-chunk products included: the kernels compute
/// them); the elementwise kernels' arithmetic is not counted.
template <int kXb>
Cost mamba2_bf16_cost(const char* phase, const Shape& s, bool backward) {
  const double B = static_cast<double>(s.B), T = static_cast<double>(s.T), H = static_cast<double>(s.H);
  const double P = static_cast<double>(s.P), N = static_cast<double>(s.N), G = static_cast<double>(s.G);
  const double E = B * T * H, nc = T / 64, PT = P / 64, NT = N / 64, St = E * P * N / 64, BC = B * T * G * N;
  const double f = (nc - 1) / nc;  // the state scans read every chunk but the last
  constexpr double Xb = kXb;       // bytes of an xbc, dy, y or dxbc element
  const auto is = [&](const char* name) { return std::strcmp(phase, name) == 0; };
  if (is("prep"))  // blocks over (b, chunk, 16 heads): dt_raw (the chunk's rows, coalesced), dt_bias and A_log
                   // (once per (b, chunk, head)); Δ (fp32) and G (double) written
    return {16 * E, 16 * E + 8 * E / 64, 0};
  if (is("states")) {
    // ssd_state_scan_kernel<true>, grid (B H, PT, NT): the forward's scan (u = x, v = B, chunks in order) or the
    // backward's adjoints' (u = dy, v = C, reversed; the states are the forward's saved set: not recomputed).
    // Per scan and chunk but the last, u [64, 64] by the NT blocks of a P tile, v [64, 64] by the PT blocks of an N
    // tile and by every head of the group; G_i, Γ (double) and Δ_i (by threads < 64); the nc states (or adjoints)
    // written, bf16. R += (w u)^T v: 64 x 64 x 64 per chunk and tile pair. (The L2 prefetches are not counted.)
    return {Xb * f * E * P + Xb * f * BC + 12 * f * E + 2 * St,
            NT * Xb * f * E * P + PT * Xb * f * E * N + PT * NT * (12 * f * E + 8 * f * E / 64) + 2 * St,
            2 * f * E * P * N};
  }
  if (is("y")) {  // ssd_fwd_out_kernel<bf16, hb>, grid (nc, H / hb, B PT), hb = 4 or 2 heads of a group a block
                  // where they divide its heads, else 1: per block C and B [64, N] (every N tile; N <= 128:
                  // all copied by cp.async at the start), per head S_in [64, N] (its P tile, bf16, cp.async), x
                  // [64, 64] (N <= 128: copied once for the M x operand and D x; else loaded twice), G (double),
                  // Δ; y [64, 64] written (Xb: bf16 inputs write bf16 y, 16-byte pieces). Per head C S_in^T
                  // (64 x 64 x N) and M x (64 x 64 x 64), per block C B^T (64 x 64 x N: again for every P tile)
    const int64_t hpg = s.H / s.G;
    const double hb = hpg % 4 == 0 ? 4 : hpg % 2 == 0 ? 2 : 1;
    return {2 * Xb * BC + Xb * E * P + 2 * St + 12 * E + Xb * E * P,
            PT * E * 2 * Xb * N / hb + 2 * St + (N <= 128 ? 1 : 2) * Xb * E * P + PT * 12 * E + Xb * E * P,
            2 * E * P * (N + N / hb + 64)};
  }
  if (is("dchunk")) {
    // ssd_bwd_chunk_kernel<bf16>, grid (nc, H, B), one block per chunk with every P and N tile. Per block (per
    // token below): G (double), Δ, dt_raw; CB: C, B over N; DX: dy, x over P; dC: dy per (N, P) tile pair,
    // S_in, then C, B per N tile, dCh written; dB: x per (N, P) tile pair, dS, then C per N tile, dBh written;
    // v̄ / dx: B per (P, N) tile pair, dS, then x, dy per P tile and dy again for D dy (bf16 inputs: D dy from dy's
    // tile), dx written (Xb: bf16 inputs write bf16 dx, 16-byte pieces); <dS, S_in> reads
    // both states again (S_in issued twice, dS three times in all); ddt_raw and the partials written. With kept
    // operands (P, N <= 128): dy's tiles not reloaded in dC or v̄ (kept from DX), nor C, B of dC's first N tile
    // (kept from CB) and C of dB's first (kept from dC); x once before dB (not in v̄), B once before v̄. Products:
    // C B^T, dy x^T (64 x 64 x N, P); dy S_in, x dS, B dS^T (64 x P x N each); dcb B, dcb^T C (64 x 64 x N),
    // (CB ∘ E)^T dy (64 x 64 x P).
    const bool kept = PT <= 2 && NT <= 2;
    const double dyd = kXb == 2 ? 0 : 4;  // D dy's read of dy (fp32 inputs)
    const double issued_per_token =
        16 + 2 * Xb * N + 2 * Xb * P + ((kept ? 0 : Xb * P * NT) + 2 * Xb * (kept ? N - 64 : N) + 2 * N) +
        (Xb * P * (kept ? 1 : NT) + Xb * (kept ? N - 64 : N) + 2 * N) +
        (Xb * N * (kept ? 1 : PT) + (kept ? 0 : 2 * Xb) * P + dyd * P + Xb * P) + 4 + 24.0 / 64;
    return {2 * Xb * E * P + 2 * Xb * BC + 4 * St + 16 * E + Xb * E * P + 4 * E * N + 4 * E + 24 * E / 64,
            E * issued_per_token + 5 * 2 * St, 2 * E * (3 * 64 * N + 2 * 64 * P + 3 * P * N)};
  }
  if (is("dBC"))  // dBh, dCh (bf16) summed over a group's heads; dxbc's B, C columns written (Xb: bf16 with bf16 inputs)
    return {4 * E * N + 2 * Xb * BC, 4 * E * N + 2 * Xb * BC, 0};
  if (is("dparams"))  // the chunk partials (double x 3) summed per head; ddt_bias, dA_log, dD read and written
    return {24 * E / 64 + 28 * H, 24 * E / 64 + 28 * H, 0};
  return {0, 0, 0};
}

// The phase of each kernel of the bf16 op, by the kernel's name ("states": the backward's launch scans the adjoints).
constexpr PhaseKernel kMamba2Kernels[] = {{"ssd_prep_kernel", "prep"},
                                          {"ssd_state_scan_kernel", "states"},
                                          {"ssd_fwd_out_kernel", "y"},
                                          {"ssd_bwd_chunk_kernel", "dchunk"},
                                          {"ssd_group_sum_kernel", "dBC"},
                                          {"ssd_params_kernel", "dparams"}};

// The tables of the bf16 op on fp32 and on bf16 xbc, dy (E: their element type).
template <typename E>
constexpr bench::PhaseTable<Shape> kMamba2Table{
    sizeof(E) == 2 ? "Mamba2 SSD bf16 op, bf16 xbc, dy" : "Mamba2 SSD bf16 op", std::begin(kMamba2Kernels),
    std::end(kMamba2Kernels), mamba2_bf16_cost<sizeof(E)>, false};

/// The bf16 op's forward and backward at shape s on xbc, dy of type E (float or __nv_bfloat16), kernel by kernel
/// (bench::print_phases), on bench_shape's inputs.
/// Exits unless s is what mamba2_bf16_cost counts.
template <typename E>
void mamba2_phases(const Shape& s, int iters) {
  if (s.T % 64 != 0 || s.P % 64 != 0 || s.N % 64 != 0) {
    std::fprintf(stderr, "mamba2_bench --phases: the cost model needs T, P and N multiples of 64\n");
    std::exit(1);
  }
  const Op<__nv_bfloat16, E> op(s);
  char shape[160];
  std::snprintf(shape, sizeof shape, "shape %s B=%lld T=%lld H=%lld P=%lld N=%lld G=%lld", s.name,
                static_cast<long long>(s.B), static_cast<long long>(s.T), static_cast<long long>(s.H),
                static_cast<long long>(s.P), static_cast<long long>(s.N), static_cast<long long>(s.G));
  bench::print_phases(s, shape, iters, false, kMamba2Table<E>, [&](cudaStream_t st) { op.fwd(st); }, "mamba2_bench");
  bench::print_phases(s, shape, iters, true, kMamba2Table<E>, [&](cudaStream_t st) { op.bwd(st); }, "mamba2_bench");
}

}  // namespace

int main(int argc, char** argv) {
  // --bf16-inputs (the phases on bf16 xbc, dy) taken out; the rest as every bench's.
  bool bf16_inputs = false;
  int n = 0;
  for (int i = 0; i < argc; ++i) {
    if (i > 0 && std::strcmp(argv[i], "--bf16-inputs") == 0)
      bf16_inputs = true;
    else
      argv[n++] = argv[i];
  }
  const bench::IterArgs args = bench::parse_iter_args(n, argv, 20);
  const int iters = args.iters;
  const bool by_phase = args.phases;
  cudaDeviceProp prop;
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("Mamba2 SSD (src/kernels/cuda/mamba2.cu) on %s, mean of %d runs\n", prop.name, iters);
  const Shape shapes[] = {{"a", 4, 4096, 16, 128, 128, 1}, {"b", 1, 16384, 16, 128, 128, 1},
                          {"c", 4, 4096, 64, 64, 128, 1}};
  if (by_phase) {
    for (const Shape& s : {shapes[0], shapes[2]}) {
      if (bf16_inputs)
        mamba2_phases<__nv_bfloat16>(s, iters);
      else
        mamba2_phases<float>(s, iters);
    }
    return 0;
  }
  std::printf("\n| shape | compute | inputs | sizes | GPU ms fwd | GPU ms f+b | scratch MiB | saved MiB |\n"
              "|---|---|---|---|---|---|---|---|\n");
  for (const Shape& s : shapes) {
    bench_shape<float, float>(s, iters);
    bench_shape<__nv_bfloat16, float>(s, iters);
    bench_shape<__nv_bfloat16, __nv_bfloat16>(s, iters);
  }
  return 0;
}
