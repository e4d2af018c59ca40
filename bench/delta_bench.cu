// GPU time of the chunked delta-rule cores (src/kernels/cuda/ops.cuh: gdn_chunk_*, comba_chunk_*, kda_chunk_*,
// mdn_chunk_*) at the shapes of ../shared/perf-anchors.md: (a) B=4, T=4096, H=16, K=V=128 and (c) the ~1.3B heads,
// B=4, T=4096, H=6, K=256, V=512 (KDA: shape (a) only, g per key channel); chunk 64, fp32 inputs but for the bf16
// GDN and Comba rows' q, k, v, p (bf16, as FLA's kernels take them). GDN and Comba twice: fp32 products (the fp32
// models' core) and bf16 operands on the tensor cores (the bf16 models'), GDN a third time with bf16 products on fp32
// q, k, v (labelled "fp32 q, k, v": what bf16 inputs save), their forward keeping 𝒯, h, Δ and W for the backward as
// the layers do (tinv, gdn_saved_floats; column "saved"); KDA
// twice: fp32 products and bf16 compute (its forward and the backward's scans on tile::Mma, kda.cu "Precision"), its
// forward keeping P, 𝒯, Δ and h for the backward (kda_saved_floats; column "saved"). The bf16 GDN and Comba (bf16
// q, k, v) and KDA rows once more with save_states false (labelled "states recomputed": the forward keeps 𝒯, KDA P
// and 𝒯, and the backward runs the forward scan again for h and Δ, GDN and Comba their wu for W and U). MDN gates:
// log α in [-0.1, -0.001], log μ in [-3, -0.5], η in [0.5, 1.5), β in [0.1, 0.9). MDN runs twice: with
// save_residuals (the forward keeps Ṽ [B, T, H, V] fp32 for the backward, column "saved") and recomputing Ṽ in
// the backward, each with fp32 products and with bf16 operands on the mma.sync tiles (tile::Mma). Forward and
// forward + backward, timed with CUDA events over
// repeated launches (mean after 3 warm-ups), and forward + backward as the anchors were timed (median of 30 runs,
// the L2 flushed before each: bench::median_ms_flushed). The anchor rows to compare with are FLA's "GPU ms".
// With --phases instead: a bf16 core's forward and backward at shapes (a) and (c) kernel by kernel (print_phases):
// `--phases` or `--phases gdn` the GDN core on bf16 q, k, v with its saved set (gdn_phases), `--phases mdn` the MDN
// core with save_residuals (mdn_phases), `--phases all` both.
// Usage: delta_bench [iterations] [--phases [gdn|mdn|all] [--shape a|c]]   (default 10 iterations)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <type_traits>
#include <vector>

#include "bench_util.cuh"
#include "phases.h"
#include "kernels/cuda/ops.cuh"

namespace {



/// n elements (float or bf16: the same draws, rounded) uniform in [lo, hi).
template <typename T = float>
T* random_buffer(int64_t n, uint32_t seed, float lo, float hi) {
  T* p = nullptr;
  BENCH_CHECK(cudaMalloc(&p, sizeof(T) * n));
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
// into a buffer of its own that the backward reads (else the backward recomputes Ṽ; MDN only). GDN and Comba: the
// forward writes 𝒯, and with `states` h, Δ and W, into a buffer of its own (tinv) that the backward reads; KDA: P, 𝒯
// and with `states` Δ and h (the same buffer). P: the products' operand type (float:
// exact fp32; __nv_bfloat16: bf16 operands on the tensor cores) of every core. E: the element type of q, k, v, p
// (__nv_bfloat16: GDN and Comba with P = __nv_bfloat16 only).
template <typename P, typename E = float>
void bench_core(const Shape& s, int iters, Core core, bool save_residuals = false, bool states = true) {
  constexpr bool kF32In = std::is_same_v<E, float>;
  const bool comba = core == Core::kComba, kda = core == Core::kKda, mdn = core == Core::kMdn;
  if (!kF32In && (kda || mdn)) std::abort();  // (bf16 inputs: GDN and Comba only)
  const int64_t nk = s.B * s.T * s.H * s.K, nv = s.B * s.T * s.H * s.V, nb = s.B * s.T * s.H, C = 64;
  const int64_t ng = kda ? nk : nb;
  const float amp = 1.7320508f / std::sqrt(static_cast<float>(s.K));  // rows of norm about 1
  E *q = random_buffer<E>(nk, 1, -amp, amp), *k = random_buffer<E>(nk, 2, -amp, amp);
  E* v = random_buffer<E>(nv, 3, -1.f, 1.f);
  float* g = random_buffer(ng, 4, -0.1f, -0.001f);
  float *beta = random_buffer(nb, 5, 0.1f, 0.9f), *d_o = random_buffer(nv, 6, -1.f, 1.f);
  float *o = random_buffer(nv, 7, 0.f, 0.f), *dq = random_buffer(nk, 8, 0.f, 0.f), *dk = random_buffer(nk, 9, 0.f, 0.f);
  float *dv = random_buffer(nv, 10, 0.f, 0.f), *dg = random_buffer(ng, 11, 0.f, 0.f), *db = random_buffer(nb, 12, 0.f, 0.f);
  E* p = random_buffer<E>(nk, 2, -0.9f * amp, 0.9f * amp);
  float* dp = random_buffer(nk, 13, 0.f, 0.f);
  float *lm = random_buffer(nb, 14, -3.f, -0.5f), *eta = random_buffer(nb, 15, 0.5f, 1.5f);
  float *dlm = random_buffer(nb, 16, 0.f, 0.f), *deta = random_buffer(nb, 17, 0.f, 0.f);
  float* residuals = save_residuals ? random_buffer(nv, 18, 0.f, 0.f) : nullptr;
  const int64_t ntinv = mdn   ? 0
                        : kda ? llmt::cuda::kda_saved_floats(s.B, s.T, s.H, s.K, s.V, C, states)
                              : llmt::cuda::gdn_saved_floats<P>(s.B, s.T, s.H, s.K, s.V, C, states);
  float* tinv = ntinv > 0 ? random_buffer(ntinv, 19, 0.f, 0.f) : nullptr;
  void* scratch = nullptr;
  const size_t bytes = kda   ? std::max(llmt::cuda::kda_chunk_fwd_scratch_bytes(s.B, s.T, s.H, s.K, s.V, C, true,
                                                                                 states),
                                        llmt::cuda::kda_chunk_bwd_scratch_bytes(s.B, s.T, s.H, s.K, s.V, C, true,
                                                                                 states))
                       : mdn ? std::max(llmt::cuda::mdn_chunk_fwd_scratch_bytes(s.B, s.T, s.H, s.K, s.V, C,
                                                                                save_residuals),
                                        llmt::cuda::mdn_chunk_bwd_scratch_bytes(s.B, s.T, s.H, s.K, s.V, C,
                                                                                save_residuals))
                             : std::max(llmt::cuda::gdn_chunk_fwd_scratch_bytes<P>(s.B, s.T, s.H, s.K, s.V, C, true,
                                                                                   states),
                                        llmt::cuda::gdn_chunk_bwd_scratch_bytes<P>(s.B, s.T, s.H, s.K, s.V, C, true,
                                                                                   states));
  BENCH_CHECK(cudaMalloc(&scratch, bytes));
  const auto fwd = [&] {
    if (comba)
      llmt::cuda::comba_chunk_fwd<P>(q, k, v, p, g, beta, s.B, s.T, s.H, s.K, s.V, C, o, tinv, states, scratch,
                                     nullptr);
    else if (kda || mdn) {
      if constexpr (kF32In) {
        if (kda)
          llmt::cuda::kda_chunk_fwd<P>(q, k, v, g, beta, s.B, s.T, s.H, s.K, s.V, C, o, tinv, states, scratch,
                                       nullptr);
        else
          llmt::cuda::mdn_chunk_fwd<P>(q, k, v, g, beta, lm, eta, s.B, s.T, s.H, s.K, s.V, C, o, residuals, scratch,
                                       nullptr);
      }
    } else
      llmt::cuda::gdn_chunk_fwd<P>(q, k, v, g, beta, s.B, s.T, s.H, s.K, s.V, C, o, tinv, states, scratch, nullptr);
  };
  const auto bwd = [&] {
    if (comba)
      llmt::cuda::comba_chunk_bwd<P>(q, k, v, p, g, beta, d_o, tinv, states, s.B, s.T, s.H, s.K, s.V, C, dq, dk, dv,
                                     dp, dg, db, scratch, nullptr);
    else if (kda || mdn) {
      if constexpr (kF32In) {
        if (kda)
          llmt::cuda::kda_chunk_bwd<P>(q, k, v, g, beta, d_o, tinv, states, s.B, s.T, s.H, s.K, s.V, C, dq, dk, dv,
                                       dg, db, scratch, nullptr);
        else
          llmt::cuda::mdn_chunk_bwd<P>(q, k, v, g, beta, lm, eta, d_o, residuals, s.B, s.T, s.H, s.K, s.V, C, dq, dk,
                                       dv, dg, db, dlm, deta, scratch, nullptr);
      }
    } else
      llmt::cuda::gdn_chunk_bwd<P>(q, k, v, g, beta, d_o, tinv, states, s.B, s.T, s.H, s.K, s.V, C, dq, dk, dv, dg,
                                   db, scratch, nullptr);
  };
  const float f = bench::time_ms(iters, fwd);
  const float fb = bench::time_ms(iters, [&] { fwd(); bwd(); });
  const float fb_cold = bench::median_ms_flushed(30, [&] { fwd(); bwd(); });
  const char* mdn_name = save_residuals ? "MDN save_residuals" : "MDN recompute";
  const char* name = comba ? (states ? "Comba" : "Comba states recomputed")
                     : kda ? (states ? "KDA" : "KDA states recomputed")
                     : mdn ? mdn_name
                           : (states ? "GDN" : "GDN states recomputed");
  const char* products = std::is_same_v<P, float> ? "fp32 chunk-parallel"
                         : kF32In                  ? "bf16 tensor cores, fp32 q, k, v"
                                                   : "bf16 tensor cores";
  const double mib = 1 << 20, saved_bytes = sizeof(float) * static_cast<double>(save_residuals ? nv : ntinv);
  std::printf("| %s (ours, %s) | %s B=%ld T=%ld H=%ld K=%ld V=%ld | %.3f | %.3f | %.3f | %.0f MiB | %.0f MiB |\n",
              name, products, s.name, static_cast<long>(s.B), static_cast<long>(s.T), static_cast<long>(s.H),
              static_cast<long>(s.K), static_cast<long>(s.V), f, fb, fb_cold, static_cast<double>(bytes) / mib,
              saved_bytes / mib);
  for (E* x : {q, k, v, p}) BENCH_CHECK(cudaFree(x));
  for (float* x : {g, beta, d_o, o, dq, dk, dv, dg, db, dp, lm, eta, dlm, deta}) BENCH_CHECK(cudaFree(x));
  for (float* x : {residuals, tinv})
    if (x != nullptr) BENCH_CHECK(cudaFree(x));
  BENCH_CHECK(cudaFree(scratch));
}

// ---- --phases: a bf16 core kernel by kernel ----

// The floors' ceilings, Cost, PhaseKernel, PhaseTable and the capture / timing / printing: bench/phases.h. The
// costs below are counted for chunk 64, T a multiple of 64 and K, V multiples of 64 (every tile full); GDN's for
// bf16 q, k, v (gdn_phases' inputs), MDN's for fp32 inputs.
using bench::Cost;
using bench::PhaseKernel;
using PhaseTable = bench::PhaseTable<Shape>;

// Bytes and tile-product FLOPs of one phase of the bf16 GDN core (gdn_comba.cu's *_mma_kernel, and the Tc scans,
// which move the same data), as bench::Cost counts them: issued includes the re-reads per value or key tile; flops
// counts the tile products only (the CUDA-core work is not counted). The forward's wu stores 𝒯 and W and its scan h
// and Δ; the backward runs neither wu nor the forward scan (wu and scan are forward phases).

/// The Cost of phase `phase` (wu, scan, out, dv_local, bwd_scan, dqk, wy) of the bf16 GDN core at shape s (the same
/// in the forward and the backward call: each phase runs in one of them); zeros for another name.
Cost gdn_bf16_cost(const char* phase, const Shape& s, bool) {
  const double N = static_cast<double>(s.B * s.T * s.H), K = static_cast<double>(s.K), V = static_cast<double>(s.V);
  const double nkt = K / 64, nvt = V / 64, S = N / 64 * K * V;  // N (token, head) rows; S elements of h (or dh)
  const double gates = 8 * N;                                     // g, β (fp32)
  const double e = 2;                                             // bytes of a q, k, v element (bf16)
  if (std::strcmp(phase, "wu") == 0) {  // k (issued twice, X K^T, then W, beyond 4 key tiles; up to 4 X K^T reads
                                        // F3's k tiles by cp.async), v; W, U (bf16); 𝒯 (fp32, 64 x 64 a chunk)
                                        // written
    const double wu = gates + e * N * K + e * N * V + 2 * N * K + 2 * N * V + 4 * 64 * N;
    return {wu, wu + (nkt > 4 ? e * N * K : 0.0), 2 * 64 * N * (2 * K + V)};
  }
  if (std::strcmp(phase, "scan") == 0)  // per value tile: gates, W (bf16), k; U read and Δ written (bf16); h (bf16)
    return {gates + (2 + e) * N * K + 4 * N * V + 2 * S, nvt * (gates + (2 + e) * N * K) + 4 * N * V + 2 * S,
            4 * N * K * V};
  if (std::strcmp(phase, "out") == 0) {  // q, k; h, Δ (bf16); o
    const double b = gates + 2 * e * N * K + 2 * S + 2 * N * V + 4 * N * V;
    return {b, b, 2 * N * (64 * K + K * V + 64 * V)};
  }
  if (std::strcmp(phase, "dv_local") == 0) {  // q, k, dO; dΔ (fp32)
    const double b = gates + 2 * e * N * K + 8 * N * V;
    return {b, b, 128 * N * (K + V)};
  }
  if (std::strcmp(phase, "bwd_scan") == 0)  // per value tile: gates, k, q, W (bf16); dO; dΔ read and written; dh (bf16)
    return {gates + (2 * e + 2) * N * K + 12 * N * V + 2 * S,
            nvt * (gates + (2 * e + 2) * N * K) + 12 * N * V + 2 * S, 6 * N * K * V};
  if (std::strcmp(phase, "dqk") == 0)  // q, k (issued again per key tile); dO, Δ (bf16; issued once more per key
                                       // tile); h, dh (bf16); dΔ (per key tile); dq, dk; dW (bf16); dΓ
    return {gates + 2 * e * N * K + 10 * N * V + 4 * S + 10 * N * K + 4 * N,
            gates + 4 * e * N * K + (1 + nkt) * 6 * N * V + 4 * S + nkt * 4 * N * V + 10 * N * K + 4 * N,
            64 * N * (6 * K + 2 * V) + 6 * N * K * V};
  if (std::strcmp(phase, "wy") == 0)  // 𝒯; k (issued 5 times), v (twice), dΔ, dW (bf16), dΓ; dk read and written
                                      // (issued twice each); dv, dβ, dg
    return {gates + 256 * N + e * N * K + (e + 4) * N * V + 2 * N * K + 4 * N + 8 * N * K + 4 * N * V + 8 * N,
            gates + 256 * N + 5 * e * N * K + (2 * e + 4) * N * V + 2 * N * K + 4 * N + 16 * N * K + 4 * N * V +
                8 * N,
            64 * N * (10 * K + 4 * V + 256)};
  return {0, 0, 0};
}

// The phase of each GDN kernel (gdn_comba.cu), by the kernel's name.
constexpr PhaseKernel kPhaseKernels[] = {
    {"gdn_wu_mma_kernel", "wu"},           {"gdn_scan_mma_kernel", "scan"},
    {"gdn_scan_kernel", "scan"},           {"gdn_out_mma_kernel", "out"},
    {"gdn_dv_local_mma_kernel", "dv_local"}, {"gdn_bwd_scan_mma_kernel", "bwd_scan"},
    {"gdn_bwd_scan_kernel", "bwd_scan"},   {"gdn_bwd_dqk_mma_kernel", "dqk"},
    {"gdn_bwd_wy_mma_kernel", "wy"}};

/// The Cost of kernel `phase` (coef, scan, state_scan, out, bscan, brow, bchunk) of the bf16 MDN core (mdn.cu,
/// L = tile::Mma) with save_residuals at shape s, counted as gdn_bf16_cost counts (fp32 inputs, chunk 64, full
/// tiles); zeros for another name. The fp32 global scratch: the coefficient image of a chunk (8 vectors, 6
/// matrices of 64 x 64, and E = Γ ⊙ Q K̂^T as a bf16 64 x 64 tile; vectors, Γ_{n,:} and L_U[n,:] are what a scan
/// reads of it), brow's rowk rows (kRowkSlots = 9 of [64, K] a chunk, written by brow, read by bchunk) and dew
/// (dO Ṽ^T, dR Ṽ^T); the chunk-start state pairs (S_0, M_0) and their gradients are bf16 (the operand type: 4 K V
/// bytes a chunk each). The forward's scan solves for Ṽ; the backward's state_scan (one block per value tile and
/// key tile) reads the saved Ṽ (no 𝒯, no S_0^T k products). core: fp32 / double operations of the CUDA-core
/// loops (coef: the O(n^2) segment sums, Γ's 3 operations a term, the triangular inverse; bchunk's reductions, row
/// dots and O(n^3) sums), 2 per fused multiply-add.
Cost mdn_bf16_cost(const char* phase, const Shape& s, bool backward) {
  const double N = static_cast<double>(s.B * s.T * s.H), K = static_cast<double>(s.K), V = static_cast<double>(s.V);
  const double nch = N / 64, nkt = K / 64, nvt = V / 64, c3 = 64.0 * 64 * 64;
  const double vec = 4 * 8 * 64, mat = 4 * 64 * 64, e_tile = 2 * 64 * 64, image = vec + 6 * mat + e_tile,
               last_rows = 2 * 4 * 64;
  const double st = nch * 4 * K * V;  // one [NC, 2, K, V] bf16 state (or state-gradient) scratch
  if (std::strcmp(phase, "coef") == 0)  // gates, q, k; the image written whole
    return {16 * N + 8 * N * K + nch * image, 16 * N + 8 * N * K + nch * image, 256 * N * K,
            nch * (5 * c3 / 6 + 64 * 64)};
  if (std::strcmp(phase, "scan") == 0)  // per value tile: vectors, last rows, 𝒯, k (twice); v; Ṽ, states
    return {nch * (vec + last_rows + mat) + 4 * N * K + 8 * N * V + st,
            nvt * (nch * (vec + last_rows + mat) + 8 * N * K) + 8 * N * V + st, N * V * (8 * K + 128)};
  if (std::strcmp(phase, "state_scan") == 0)  // per (value tile, key tile): η, the 3 last-row scalars, last rows,
                                              // its k columns, its Ṽ columns; states
    return {nch * (4 * 64 + 12 + last_rows) + 4 * N * K + 4 * N * V + st,
            nvt * nkt * nch * (4 * 64 + 12 + last_rows) + nvt * 4 * N * K + nkt * 4 * N * V + st, N * V * 4 * K};
  if (std::strcmp(phase, "out") == 0) {  // vectors, Γ, Q K̂^T; states; q (once per chunk); Ṽ; o
    const double b = nch * (vec + 2 * mat) + st + 4 * N * K + 8 * N * V;
    return {b, b, N * V * (4 * K + 128)};
  }
  if (std::strcmp(phase, "bscan") == 0)  // per value tile: vectors, last rows, 𝒯, E, k (twice), q; dO (once: kept
                                         // in registers for its scaled copies); dstates; dv
    return {nch * (vec + last_rows + mat + e_tile) + 8 * N * K + 8 * N * V + st,
            nvt * (nch * (vec + last_rows + mat + e_tile) + 12 * N * K) + 8 * N * V + st, N * V * (12 * K + 256)};
  if (std::strcmp(phase, "brow") == 0)  // η, α, Γ; dO, dR, Ṽ (issued 3 + 3 per key tile); states, dstates
                                        // (S_0, M_0 issued twice); q, k (once per key tile); dew, 9 rowk slots
    return {nch * (2 * 4 * 64 + mat) + 12 * N * V + 2 * st + 8 * N * K + nch * 2 * mat + 36 * N * K,
            nch * (2 * 4 * 64 + mat) + (3 + 3 * nkt) * 4 * N * V + 3 * st + 8 * N * K + nch * 2 * mat + 36 * N * K,
            N * (256 * V + 12 * K * V + 512 * K)};
  if (std::strcmp(phase, "bchunk") == 0) {  // of the image the vectors, L_A, L_U, Q K̂^T, P K̂^T and Γ's last row;
                                            // states, dstates; dew; rowk (9 slots read); q, k; dq, dk and the 4
                                            // gate gradients. Issued: each once (dk̂ and dp stay in shared
                                            // memory, L_A and L_U are copied to it).
    const double img = vec + 4 * mat + 4 * 64;
    const double b = nch * img + 2 * st + nch * 2 * mat + 36 * N * K + 8 * N * K + 8 * N * K + 16 * N;
    return {b, b, 0, nch * (6 * K * V + 2 * K * 64 * 8 + 24 * 64 * K + 4 * c3 / 6 + 4 * 64 * 64)};
  }
  return {0, 0, 0};
}

// The kernel of each MDN phase (mdn.cu), by the kernel's name.
constexpr PhaseKernel kMdnKernels[] = {{"mdn_coef_kernel", "coef"},   {"mdn_scan_kernel", "scan"},
                                       {"mdn_state_scan_kernel", "state_scan"},
                                       {"mdn_out_kernel", "out"},     {"mdn_bscan_kernel", "bscan"},
                                       {"mdn_brow_kernel", "brow"},   {"mdn_bchunk_kernel", "bchunk"}};

constexpr PhaseTable kGdnTable{"GDN bf16", std::begin(kPhaseKernels), std::end(kPhaseKernels), gdn_bf16_cost, false};
constexpr PhaseTable kMdnTable{"MDN bf16 save_residuals", std::begin(kMdnKernels), std::end(kMdnKernels),
                               mdn_bf16_cost, true};

/// Prints one table of bench::print_phases for f (the forward of table's core, or its backward when `backward`)
/// at shape s, titled "shape <name> B=.. T=.. H=.. K=.. V=..".
template <typename F>
void print_phases(const Shape& s, int iters, bool backward, const PhaseTable& table, F f) {
  char shape[128];
  std::snprintf(shape, sizeof shape, "shape %s B=%ld T=%ld H=%ld K=%ld V=%ld", s.name, static_cast<long>(s.B),
                static_cast<long>(s.T), static_cast<long>(s.H), static_cast<long>(s.K), static_cast<long>(s.V));
  bench::print_phases(s, shape, iters, backward, table, f, "delta_bench");
}

/// Exits unless shape s has the full tiles the cost models count (T a multiple of 64, K and V of 64).
void check_full_tiles(const Shape& s) {
  if (s.T % 64 != 0 || s.K % 64 != 0 || s.V % 64 != 0) {
    std::fprintf(stderr, "delta_bench --phases: the cost model needs T a multiple of 64 and full 64-wide tiles\n");
    std::exit(1);
  }
}

/// The bf16 GDN core's forward and backward at shape s, phase by phase (print_phases), on bench_core's inputs (bf16
/// q, k, v); the backward reads the 𝒯, W, h and Δ its forward saved.
void gdn_phases(const Shape& s, int iters) {
  const int64_t nk = s.B * s.T * s.H * s.K, nv = s.B * s.T * s.H * s.V, nb = s.B * s.T * s.H, C = 64;
  check_full_tiles(s);
  using P = __nv_bfloat16;
  const float amp = 1.7320508f / std::sqrt(static_cast<float>(s.K));
  P *q = random_buffer<P>(nk, 1, -amp, amp), *k = random_buffer<P>(nk, 2, -amp, amp);
  P* v = random_buffer<P>(nv, 3, -1.f, 1.f);
  float* g = random_buffer(nb, 4, -0.1f, -0.001f);
  float *beta = random_buffer(nb, 5, 0.1f, 0.9f), *d_o = random_buffer(nv, 6, -1.f, 1.f);
  float *o = random_buffer(nv, 7, 0.f, 0.f), *dq = random_buffer(nk, 8, 0.f, 0.f), *dk = random_buffer(nk, 9, 0.f, 0.f);
  float *dv = random_buffer(nv, 10, 0.f, 0.f), *dg = random_buffer(nb, 11, 0.f, 0.f), *db = random_buffer(nb, 12, 0.f, 0.f);
  float* tinv = random_buffer(llmt::cuda::gdn_saved_floats<P>(s.B, s.T, s.H, s.K, s.V, C, true), 19, 0.f, 0.f);
  void* scratch = nullptr;
  BENCH_CHECK(cudaMalloc(&scratch, std::max(llmt::cuda::gdn_chunk_fwd_scratch_bytes<P>(s.B, s.T, s.H, s.K, s.V, C,
                                                                                       true, true),
                                            llmt::cuda::gdn_chunk_bwd_scratch_bytes<P>(s.B, s.T, s.H, s.K, s.V, C,
                                                                                       true, true))));
  BENCH_CHECK(cudaDeviceSynchronize());
  print_phases(s, iters, false, kGdnTable, [&](cudaStream_t st) {
    llmt::cuda::gdn_chunk_fwd<P>(q, k, v, g, beta, s.B, s.T, s.H, s.K, s.V, C, o, tinv, true, scratch, st);
  });
  print_phases(s, iters, true, kGdnTable, [&](cudaStream_t st) {
    llmt::cuda::gdn_chunk_bwd<P>(q, k, v, g, beta, d_o, tinv, true, s.B, s.T, s.H, s.K, s.V, C, dq, dk, dv, dg, db,
                                 scratch, st);
  });
  for (P* x : {q, k, v}) BENCH_CHECK(cudaFree(x));
  for (float* x : {g, beta, d_o, o, dq, dk, dv, dg, db, tinv}) BENCH_CHECK(cudaFree(x));
  BENCH_CHECK(cudaFree(scratch));
}

/// The bf16 MDN core's forward and backward with save_residuals (the layer's default) at shape s, phase by phase
/// (print_phases), on bench_core's MDN inputs; the backward reads the Ṽ its forward saved.
void mdn_phases(const Shape& s, int iters) {
  const int64_t nk = s.B * s.T * s.H * s.K, nv = s.B * s.T * s.H * s.V, nb = s.B * s.T * s.H, C = 64;
  check_full_tiles(s);
  const float amp = 1.7320508f / std::sqrt(static_cast<float>(s.K));
  float *q = random_buffer(nk, 1, -amp, amp), *k = random_buffer(nk, 2, -amp, amp);
  float *v = random_buffer(nv, 3, -1.f, 1.f), *la = random_buffer(nb, 4, -0.1f, -0.001f);
  float *beta = random_buffer(nb, 5, 0.1f, 0.9f), *d_o = random_buffer(nv, 6, -1.f, 1.f);
  float *lm = random_buffer(nb, 14, -3.f, -0.5f), *eta = random_buffer(nb, 15, 0.5f, 1.5f);
  float *o = random_buffer(nv, 7, 0.f, 0.f), *res = random_buffer(nv, 18, 0.f, 0.f);
  float *dq = random_buffer(nk, 8, 0.f, 0.f), *dk = random_buffer(nk, 9, 0.f, 0.f);
  float* dv = random_buffer(nv, 10, 0.f, 0.f);
  float *dla = random_buffer(nb, 11, 0.f, 0.f), *db = random_buffer(nb, 12, 0.f, 0.f);
  float *dlm = random_buffer(nb, 16, 0.f, 0.f), *deta = random_buffer(nb, 17, 0.f, 0.f);
  using P = __nv_bfloat16;
  void* scratch = nullptr;
  const size_t bytes = std::max(llmt::cuda::mdn_chunk_fwd_scratch_bytes(s.B, s.T, s.H, s.K, s.V, C, true),
                                llmt::cuda::mdn_chunk_bwd_scratch_bytes(s.B, s.T, s.H, s.K, s.V, C, true));
  BENCH_CHECK(cudaMalloc(&scratch, bytes));
  BENCH_CHECK(cudaDeviceSynchronize());
  print_phases(s, iters, false, kMdnTable, [&](cudaStream_t st) {
    llmt::cuda::mdn_chunk_fwd<P>(q, k, v, la, beta, lm, eta, s.B, s.T, s.H, s.K, s.V, C, o, res, scratch, st);
  });
  print_phases(s, iters, true, kMdnTable, [&](cudaStream_t st) {
    llmt::cuda::mdn_chunk_bwd<P>(q, k, v, la, beta, lm, eta, d_o, res, s.B, s.T, s.H, s.K, s.V, C, dq, dk, dv, dla,
                                 db, dlm, deta, scratch, st);
  });
  for (float* x : {q, k, v, la, beta, d_o, lm, eta, o, res, dq, dk, dv, dla, db, dlm, deta}) BENCH_CHECK(cudaFree(x));
  BENCH_CHECK(cudaFree(scratch));
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 10;
  bool by_phase = false, gdn = true, mdn = false;  // which cores --phases prints
  const char* only = nullptr;                      // --shape: the one shape --phases prints
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--phases") == 0) {
      by_phase = true;
      const char* which = i + 1 < argc ? argv[i + 1] : "";
      if (std::strcmp(which, "gdn") == 0 || std::strcmp(which, "mdn") == 0 || std::strcmp(which, "all") == 0) {
        gdn = std::strcmp(which, "mdn") != 0, mdn = std::strcmp(which, "gdn") != 0;
        ++i;
      }
    } else if (std::strcmp(argv[i], "--shape") == 0 && i + 1 < argc) {
      only = argv[++i];
    } else {
      iters = std::atoi(argv[i]);
    }
  }
  const Shape a{"a", 4, 4096, 16, 128, 128}, c{"c", 4, 4096, 6, 256, 512};
  if (by_phase) {
    for (const Shape& s : {a, c}) {
      if (only != nullptr && std::strcmp(only, s.name) != 0) continue;
      if (gdn) gdn_phases(s, iters);
      if (mdn) mdn_phases(s, iters);
    }
    return 0;
  }
  std::printf("| core | shape | GPU ms fwd | GPU ms f+b | f+b, L2 flushed, median of 30 | scratch | saved |\n"
              "|---|---|---|---|---|---|---|\n");
  for (const Shape& s : {a, c})
    for (const Core core : {Core::kGdn, Core::kComba}) {
      bench_core<float>(s, iters, core);
      if (core == Core::kGdn) bench_core<__nv_bfloat16>(s, iters, core);  // fp32 q, k, v
      bench_core<__nv_bfloat16, __nv_bfloat16>(s, iters, core);
      bench_core<__nv_bfloat16, __nv_bfloat16>(s, iters, core, false, false);  // states recomputed
    }
  bench_core<float>(a, iters, Core::kKda);
  bench_core<__nv_bfloat16>(a, iters, Core::kKda);
  bench_core<__nv_bfloat16>(a, iters, Core::kKda, false, false);  // states recomputed
  for (const Shape& s : {a, c})
    for (const bool save_residuals : {true, false}) {
      bench_core<float>(s, iters, Core::kMdn, save_residuals);
      bench_core<__nv_bfloat16>(s, iters, Core::kMdn, save_residuals);
    }
  return 0;
}
