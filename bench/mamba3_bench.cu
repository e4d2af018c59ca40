// GPU time of the CUDA Mamba-3 layer op (src/kernels/cuda/mamba3*.cu: prep, chunked core, gate) at the
// 1.5B heads of configs/mamba3-paper/1.5b (64 heads x 64, d_state 128, 32 angles, one group), B = 4, T = 4096,
// SISO and MIMO (R = 4), without the output norm (as the configs); each with the core's products in fp32 and on
// the tensor cores (Mamba3Options::bf16_products), the latter with fp32 and with bf16 activations x, z, out, dout,
// dx, dz (ops.cuh mamba3_fwd<__nv_bfloat16>: what bf16 models run, Backend::mamba3_bf16_activations; bc, raw and
// their gradients fp32 either way). Forward (mamba3_fwd) and forward + backward
// (mamba3_fwd then mamba3_bwd) in both modes of model.mamba3.save_states: "recompute" (no saved set: the backward
// recomputes the core's forward) and "saved" (the forward writes G, the chunk-entering states, y, BCNorm's outputs,
// φ and q, k into the saved set, the backward reads them), timed with CUDA events over repeated launches after
// warm-up; the projections are not included. Last, SISO with bf16 products and activations at perf-anchors.md's shapes
// (a) B = 4, T = 4096 and (b) B = 1, T = 16384 with 16 heads of 128, d_state 128 (32 angles, as at 1.5B).
// With --phases instead: the SISO op with bf16 products and bf16 activations kernel by kernel (mamba3_phases:
// bench/phases.h's table with the cost model mamba3_siso_cost): the forward writing the saved set, the backward
// reading it, and the backward without it (recomputing the core's forward).
// Usage: mamba3_bench [iterations] [--phases]   (default 10 iterations)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <vector>

#include "bench_util.cuh"
#include "phases.h"
#include "kernels/cuda/ops.cuh"

namespace {

struct Shape {
  const char* name;
  int64_t B, T, H, P, N, G, R, S;
  bool bf16;  // Mamba3Options::bf16_products
  bool acts;  // bf16 activations x, z, out, dout, dx, dz (with bf16 only)
};

float* alloc(int64_t n) {
  float* p = nullptr;
  BENCH_CHECK(cudaMalloc(&p, static_cast<size_t>(n) * sizeof(float)));
  return p;
}

/// The device buffers of one Mamba-3 op call at shape s (x, z, dout and their gradients and out in the activation
/// type: fp32, or bf16 with s.acts; B|C, raw scalars and their gradients fp32; the parameters and their gradients;
/// the scratch of the larger of the forward and the backward without a saved set; the saved set) with bench_shape's
/// inputs, and the op's forward and backward on a given stream, with or without the saved set. Frees them on
/// destruction.
struct Op {
  std::vector<float*> owned;
  bool acts = false;
  void *x, *z, *out, *dout, *dx, *dz;  // float or __nv_bfloat16 (acts)
  float *bc, *raw, *dbc, *draw;
  llmt::cuda::Mamba3Ptrs p{};
  llmt::cuda::Mamba3GradPtrs g{};
  llmt::cpu::Mamba3LayerDims d{};
  llmt::Mamba3Options opt;
  size_t scratch_bytes = 0, saved_bytes = 0;
  void* scratch = nullptr;
  float* saved = nullptr;

  explicit Op(const Shape& s) {
    using namespace llmt::cuda;
    const int64_t rows = s.B * s.T, HP = s.H * s.P, BC = 2 * s.R * s.G * s.N, W = 3 * s.H + s.S;
    const int64_t RN = s.H * s.R * s.N, RP = s.H * s.R * s.P;
    auto take = [&](int64_t n) { return owned.emplace_back(alloc(n)); };
    acts = s.acts;
    const int64_t act_floats = acts ? (rows * HP + 1) / 2 : rows * HP;  // (bf16: half the bytes)
    x = take(act_floats), z = take(act_floats), bc = take(rows * BC), raw = take(rows * W);
    out = take(act_floats), dout = take(act_floats), dx = take(act_floats), dz = take(act_floats);
    dbc = take(rows * BC), draw = take(rows * W);
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
    p = Mamba3Ptrs{prm[0], prm[1], prm[2], prm[3], prm[4], prm[5],
                   mimo ? prm[6] : nullptr, mimo ? prm[7] : nullptr, mimo ? prm[8] : nullptr, nullptr};
    g = Mamba3GradPtrs{grd[0], grd[1], grd[2], grd[3], grd[4], grd[5],
                       mimo ? grd[6] : nullptr, mimo ? grd[7] : nullptr, mimo ? grd[8] : nullptr, nullptr};
    // x, z, B, C, dout ~ U(-1, 1); dd_dt in [-1, 1) with dt_bias in [-5, -3) (Δ around 0.02); dd_A, trap, angles
    // in [-1, 1).
    with_acts([&](auto zero) {
      using A = decltype(zero);
      bench::fill_uniform(static_cast<A*>(x), rows * HP, 1, -1.f, 1.f);
      bench::fill_uniform(static_cast<A*>(z), rows * HP, 2, -1.f, 1.f);
      bench::fill_uniform(static_cast<A*>(dout), rows * HP, 5, -1.f, 1.f);
    });
    bench::fill_uniform(bc, rows * BC, 3, -1.f, 1.f);
    bench::fill_uniform(raw, rows * W, 4, -1.f, 1.f);
    bench::fill_uniform(prm[0], s.H, 6, -5.f, -3.f);
    BENCH_CHECK(cudaDeviceSynchronize());

    d = llmt::cpu::Mamba3LayerDims{s.B, s.T, s.H, s.P, s.N, s.G, s.R, s.S};
    opt.head_dim = s.P;
    opt.n_groups = s.G;
    opt.rank = s.R;
    opt.chunk_size = 64 / s.R;
    opt.bf16_products = s.bf16;
    scratch_bytes = std::max(mamba3_fwd_scratch_bytes(d, opt, false), mamba3_bwd_scratch_bytes(d, opt, false));
    BENCH_CHECK(cudaMalloc(&scratch, scratch_bytes));
    saved_bytes = mamba3_saved_bytes(d, opt);
    BENCH_CHECK(cudaMalloc(&saved, saved_bytes));
  }
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;
  ~Op() {
    for (float* q : owned) BENCH_CHECK(cudaFree(q));
    BENCH_CHECK(cudaFree(scratch));
    BENCH_CHECK(cudaFree(saved));
  }
  /// f(A{}) with A the activations' type: float, or __nv_bfloat16 (acts).
  template <typename F>
  void with_acts(F f) const {
    if (acts)
      f(__nv_bfloat16{});
    else
      f(float{});
  }
  /// mamba3_fwd on stream; with save, writing the saved set.
  void fwd(cudaStream_t stream, bool save) {
    with_acts([&](auto zero) {
      using A = decltype(zero);
      llmt::cuda::mamba3_fwd<A>(static_cast<const A*>(x), static_cast<const A*>(z), bc, raw, p, d, opt,
                                static_cast<A*>(out), save ? saved : nullptr, scratch, stream);
    });
  }
  /// mamba3_bwd on stream: with from_saved reading the saved set of the last fwd(save = true), else recomputing
  /// the core's forward.
  void bwd(cudaStream_t stream, bool from_saved) {
    with_acts([&](auto zero) {
      using A = decltype(zero);
      llmt::cuda::mamba3_bwd<A>(static_cast<const A*>(dout), static_cast<const A*>(x), static_cast<const A*>(z), bc,
                                raw, from_saved ? saved : nullptr, p, d, opt, static_cast<A*>(dx),
                                static_cast<A*>(dz), dbc, draw, g, scratch, stream);
    });
  }
};

// Times one shape and prints its table row.
void bench_shape(const Shape& s, int iters) {
  Op op(s);
  auto fwd = [&] { op.fwd(nullptr, false); };
  auto fwd_bwd = [&](bool kept) {
    return [&op, kept] {
      op.fwd(nullptr, kept);
      op.bwd(nullptr, kept);
    };
  };
  const float ms_fwd = bench::time_ms(iters, fwd), ms_recompute = bench::time_ms(iters, fwd_bwd(false)),
              ms_saved = bench::time_ms(iters, fwd_bwd(true));
  BENCH_CHECK(cudaGetLastError());
  std::printf("| %-4s | %s | %s | B=%lld T=%lld H=%lld P=%lld N=%lld G=%lld R=%lld S=%lld | %8.3f | %8.3f | %8.3f "
              "| %6.0f | %6.0f |\n",
              s.name, s.bf16 ? "bf16" : "fp32", s.acts ? "bf16" : "fp32", static_cast<long long>(s.B),
              static_cast<long long>(s.T), static_cast<long long>(s.H), static_cast<long long>(s.P),
              static_cast<long long>(s.N), static_cast<long long>(s.G), static_cast<long long>(s.R),
              static_cast<long long>(s.S), ms_fwd,
              ms_recompute, ms_saved, static_cast<double>(op.scratch_bytes) / (1 << 20),
              static_cast<double>(op.saved_bytes) / (1 << 20));
}

// ---- --phases: the bf16 SISO op kernel by kernel ----

using bench::Cost;
using bench::PhaseKernel;

/// The Cost (bench/phases.h: bytes unique and issued, tensor-core FLOPs) of phase `phase` of the Mamba-3 SISO op
/// with bf16 products (src/kernels/cuda/mamba3{,_prep,_gate,_core}.cu; the phase names of kMamba3Kernels) at shape
/// s, counted from the kernels for bf16 activations (x = v, z, out, dout, dx = dv, dz: 2 bytes an element; bc, raw
/// and their gradients fp32), R = 1, G = 1, no output norm, S > 0 angles, T a multiple of 64 and
/// P, N multiples of 64 (every chunk and tile full); zeros for another name. Notation: E = B T H (token, head)
/// pairs, rows = B T, St = E P N / 64 elements of one set of chunk states [B, H, T/64, P, N]. Scratch scalars fp32
/// except Δ (dtd), θ, G and dDp (double); q, k, the chunk-entering states, their adjoints, the core output y and
/// its gradient dy bf16 (bf16 products: m3::Buffers). An array read and written in place counts twice. The
/// tile products (state_scan_mma, fwd_out_mma, bwd_chunk_mma) count 2 M N depth each; the elementwise kernels'
/// arithmetic is not counted (they are bound by memory or by their serial chains, not FLOPs).
Cost mamba3_siso_cost(const char* phase, const Shape& s, bool) {
  const double E = static_cast<double>(s.B * s.T * s.H), rows = static_cast<double>(s.B * s.T);
  const double H = static_cast<double>(s.H), P = static_cast<double>(s.P), N = static_cast<double>(s.N);
  const double S = static_cast<double>(s.S), St = E * P * N / 64, nP = P / 64, nN = N / 64;
  const double splits = std::clamp<double>(std::floor(rows / 256), 1, 128);  // mamba3.cu colsum's row ranges
  const auto is = [&](const char* name) { return std::strcmp(phase, name) == 0; };
  const auto both = [](double b) { return Cost{b, b, 0}; };
  // prep (mamba3_prep.cu prep_fwd), in the forward and again in the backward (phase, bcnorm, qk only without the
  // saved set)
  if (is("token"))  // raw's dd_dt, dd_A, trap (dd_dt, trap issued again for the token after each run of 8); Δ, λ,
                    // A, clamp, a, γ, ε, σ written (fp32) and Δ (double)
    return {12 * E + 40 * E, 13 * E + 40 * E, 0};
  if (is("theta")) return both(4 * rows * S + 8 * rows * S);  // raw's angles; θ (double)
  if (is("phase"))  // per (b, h, i), T in 16 segments walked three times (the totals; both representatives, every
                    // segment but the first; φ written): Δ (double, issued per angle), θ (double, issued per head)
    return {8 * E + 8 * rows * S + 4 * E * S, (1 + 15.0 / 16 + 1) * 16 * E * S + 4 * E * S, 0};
  if (is("bcnorm")) return both(8 * rows * N + 8 * rows * N + 8 * rows);  // B|C; n̂_B, n̂_C; their 1 / RMS
  if (is("qk")) {  // per rotation pair: φ; n̂_B, n̂_C staged per block (rows of qk_rows, kQkThreads kQkPairs = 512
                   // pairs of the row's H N / 2): issued once per column block; weights and biases per row block;
                   // k, q written (bf16)
    const double qk_rows = std::clamp<double>(std::floor(8192 / (2 * N)), 1, 32), cols = std::ceil(H * N / 2 / 512);
    return {4 * E * S + 8 * rows * N + 8 * H * N + 8 * N + 4 * E * N,
            4 * E * S + cols * 8 * rows * N + std::ceil(rows / qk_rows) * 16 * H * N + 4 * E * N, 0};
  }
  // core (mamba3_core.cu core_fwd), in the forward and again in the backward
  if (is("cumsum")) return both(4 * E + 8 * E);  // a; G (double)
  if (is("states") || is("dstates")) {
    // state_scan_mma_kernel, grid (B H, P / 64, N / 64): u (v = x, or dy; bf16) per N tile, w (k, or q; bf16)
    // per P tile; per token G_i and Γ (double) and (forward) σ per (P, N) tile; the states or their adjoints (bf16)
    // written
    const bool fwd = is("states");
    const double u = 2 * E * P, sig = fwd ? 4 * E : 0, out = 2 * St;
    return {u + 2 * E * N + 8 * E + sig + out, nN * u + nP * 2 * E * N + nP * nN * (16 * E + sig) + out,
            2 * E * P * N};
  }
  if (is("y"))  // fwd_out_mma_kernel per chunk: q, k (bf16), v (bf16; v again for D v), S_in (bf16); G (double), σ,
                // γ; y written (bf16). Q K^T (64 x 64 x N), Q S_in^T (64 x P x N), Sc V (64 x 64 x P)
    return {4 * E * N + 4 * E * P + 2 * St + 16 * E, 4 * E * N + 6 * E * P + 2 * St + 16 * E,
            2 * E * (64 * N + P * N + 64 * P)};
  if (is("gate")) return both(6 * E * P);  // out_kernel: y, z (bf16); out (bf16)
  // backward (gate_bwd, core_bwd, up_bwd, prep_bwd)
  if (is("dy_dz")) return both(10 * E * P);  // dout, z, y (bf16); dy, dz (bf16)
  if (is("dchunk"))  // bwd_chunk_mma_kernel per chunk: q, k, v, dy, S_in, dS (bf16); G (double), σ, γ;
                     // dq, dk, dv (bf16), da, dγ, dσ, dDp (double). Issued: dy 3 times (tile, inter, dv with v·dy),
                     // v twice (tile, Z with v·dy). Products: Q K^T, dY V^T (64 x 64 x N, P); dq: dY S_in, Adq K;
                     // inter Q S_in^T; dk: V dS, Adq^T Q; dv: K dS^T, Bdv^T dY
    return {12 * E * N + 6 * E * P + 4 * St + 28 * E + E / 8, 12 * E * N + 12 * E * P + 4 * St + 28 * E + E / 8,
            2 * E * (192 * N + 128 * P + 4 * P * N)};
  if (is("rot_bcnorm_bwd"))  // per (row, head, channel pair): dk, dq read; where rotated, φ read (k, q recomputed
                             // from n̂, issued per 4-head slice and pair, the weights and the biases), dφ written;
                             // per (row, pair): dn̂ and dn̂ ∘ n̂ written (n̂ read); the dB_bias, dC_bias range
                             // sums (double)
    return {8 * E * N + 8 * E * S + 24 * rows * N + 16 * splits * H * N + 8 * H * N + 8 * N,
            8 * E * N + 8 * E * S + 4 * E * S + 24 * rows * N + 16 * splits * H * N + 8 * H * N, 0};
  if (is("phase_bwd"))  // dφ read twice (the segment totals, the segment cumsums) and written in place
    return {8 * E * S, 12 * E * S, 0};
  if (is("angle_bwd"))  // per (row, angle): Δ (double, issued per angle), dψ; raw's angle; draw's angle
    return {8 * E + 4 * E * S + 8 * rows * S, 8 * E * S + 4 * E * S + 8 * rows * S, 0};
  if (is("scalar_bwd"))  // per (token, head): θ (double, issued per head), dψ; raw's dd_dt, dd_A, trap; Δ (double);
                         // dγ, dσ, da, A, clamp; draw's 3 columns
    return {8 * rows * S + 4 * E * S + 12 * E + 8 * E + 20 * E + 12 * E,
            8 * E * S + 4 * E * S + 12 * E + 8 * E + 20 * E + 12 * E, 0};
  if (is("bcnorm_dx"))  // dn̂, n̂, 1 / RMS (the weight issued per row twice: the means, dB|C); dB|C
    return {24 * rows * N + 8 * rows, 40 * rows * N + 8 * rows, 0};
  // colsums (mamba3.cu), one call for dB_bias, dC_bias (their range sums from rot_bcnorm_bwd), dB_norm, dC_norm
  // (dn̂ ∘ n̂ [rows, N]) and ddt_bias (draw's dd_dt columns): partial: rows x cols read, splits x cols doubles
  // written; final: every sum's partials read, out += sum; and dD: dDp (double, per chunk), dD read and written
  const double cols = 2 * N + H, all = 2 * H * N + cols;
  if (is("sums")) return both(4 * rows * cols + 8 * splits * cols);
  if (is("sums final")) return both(8 * splits * all + 8 * all + 8 * E / 64 + 8 * H);
  return {0, 0, 0};
}

// The phase of each kernel of the SISO bf16 op, by the kernel's name (and launch number within the op where a
// kernel runs more than once with different roles; the last match wins).
constexpr PhaseKernel kMamba3Kernels[] = {
    {"token_kernel", "token"},
    {"theta_kernel", "theta"},
    {"phase_kernel", "phase"},
    {"bcnorm_kernel", "bcnorm"},
    {"qk_kernel", "qk"},
    {"cumsum_kernel", "cumsum"},
    {"state_scan_mma_kernel", "states", 0},
    {"state_scan_mma_kernel", "dstates", 1},
    {"fwd_out_mma_kernel", "y"},
    {"out_kernel", "gate"},
    {"dy_dz_kernel", "dy_dz"},
    {"bwd_chunk_mma_kernel", "dchunk"},
    {"rot_bcnorm_bwd_kernel", "rot_bcnorm_bwd"},
    {"phase_bwd_kernel", "phase_bwd"},
    {"angle_bwd_kernel", "angle_bwd"},
    {"scalar_bwd_kernel", "scalar_bwd"},
    {"bcnorm_dx_kernel", "bcnorm_dx"},
    {"colsum_partial_kernel", "sums"},
    {"colsum_final_kernel", "sums final"}};

constexpr bench::PhaseTable<Shape> kMamba3Table{"Mamba-3 SISO bf16 op", std::begin(kMamba3Kernels),
                                                std::end(kMamba3Kernels), mamba3_siso_cost, false};

/// The SISO bf16 op's forward (mamba3_fwd writing the saved set), its backward reading the saved set and its
/// backward recomputing the core's forward (mamba3_bwd) at shape s, kernel by kernel (bench::print_phases), on
/// bench_shape's inputs. Exits unless s is what mamba3_siso_cost counts.
void mamba3_phases(const Shape& s, int iters) {
  if (s.R != 1 || s.G != 1 || !s.bf16 || !s.acts || s.S <= 0 || s.T % 64 != 0 || s.P % 64 != 0 || s.N % 64 != 0) {
    std::fprintf(stderr, "mamba3_bench --phases: the cost model counts SISO, one group, bf16 products and "
                         "activations, S > 0, T a multiple of 64 and P, N multiples of 64\n");
    std::exit(1);
  }
  Op op(s);
  char shape[160];
  std::snprintf(shape, sizeof shape, "B=%lld T=%lld H=%lld P=%lld N=%lld S=%lld", static_cast<long long>(s.B),
                static_cast<long long>(s.T), static_cast<long long>(s.H), static_cast<long long>(s.P),
                static_cast<long long>(s.N), static_cast<long long>(s.S));
  // The forward's timed launches leave the saved set written for the backward that reads it.
  bench::print_phases(s, shape, iters, false, kMamba3Table, [&](cudaStream_t st) { op.fwd(st, true); },
                      "mamba3_bench");
  // Reading the saved set, the backward's only state_scan_mma_kernel launch is the dstates scan (the last match wins).
  std::vector<PhaseKernel> kept(std::begin(kMamba3Kernels), std::end(kMamba3Kernels));
  kept.push_back({"state_scan_mma_kernel", "dstates"});
  const bench::PhaseTable<Shape> kept_table{"Mamba-3 SISO bf16 op (reading the saved set)", kept.data(),
                                            kept.data() + kept.size(), mamba3_siso_cost, false};
  bench::print_phases(s, shape, iters, true, kept_table, [&](cudaStream_t st) { op.bwd(st, true); }, "mamba3_bench");
  bench::PhaseTable<Shape> recompute_table = kMamba3Table;
  recompute_table.name = "Mamba-3 SISO bf16 op (recomputing the core's forward)";
  bench::print_phases(s, shape, iters, true, recompute_table, [&](cudaStream_t st) { op.bwd(st, false); },
                      "mamba3_bench");
}

}  // namespace

int main(int argc, char** argv) {
  const bench::IterArgs args = bench::parse_iter_args(argc, argv, 10);
  const int iters = args.iters;
  const bool by_phase = args.phases;
  cudaDeviceProp prop;
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("Mamba-3 layer op (src/kernels/cuda/mamba3*.cu; bc, raw fp32) on %s, mean of %d runs\n\n", prop.name,
              iters);
  // bf16 products with bf16 activations: what bf16 models run (the layer's Backend::mamba3_bf16_activations).
  const Shape shapes[] = {{"siso", 4, 4096, 64, 64, 128, 1, 1, 32, false, false},
                          {"siso", 4, 4096, 64, 64, 128, 1, 1, 32, true, false},
                          {"siso", 4, 4096, 64, 64, 128, 1, 1, 32, true, true},
                          {"mimo", 4, 4096, 64, 64, 128, 1, 4, 32, false, false},
                          {"mimo", 4, 4096, 64, 64, 128, 1, 4, 32, true, false},
                          {"mimo", 4, 4096, 64, 64, 128, 1, 4, 32, true, true},
                          {"siso", 4, 4096, 16, 128, 128, 1, 1, 32, true, true},
                          {"siso", 1, 16384, 16, 128, 128, 1, 1, 32, true, true}};
  if (by_phase) {
    mamba3_phases(shapes[2], iters);
    return 0;
  }
  std::printf("| mode | products | activations | sizes | GPU ms fwd | GPU ms f+b recompute | GPU ms f+b saved | "
              "scratch MiB | saved MiB |\n|---|---|---|---|---|---|---|---|---|\n");
  for (const Shape& s : shapes) bench_shape(s, iters);
  return 0;
}
