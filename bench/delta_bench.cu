// GPU time of the chunked delta-rule cores (src/kernels/cuda/ops.cuh: gdn_chunk_*, comba_chunk_*, kda_chunk_*,
// mdn_chunk_*) at the shapes of ../shared/perf-anchors.md: (a) B=4, T=4096, H=16, K=V=128 and (c) the ~1.3B heads,
// B=4, T=4096, H=6, K=256, V=512 (KDA: shape (a) only, g per key channel); chunk 64, fp32 inputs. GDN and Comba
// twice: fp32 products (the fp32 models' core) and bf16 operands on the tensor cores (the bf16 models'); KDA
// twice: fp32 products and bf16 compute (its forward and the backward's scans on tile::Mma, kda.cu "Precision"). MDN gates:
// log α in [-0.1, -0.001], log μ in [-3, -0.5], η in [0.5, 1.5), β in [0.1, 0.9). MDN runs twice: with
// save_residuals (the forward keeps Ṽ [B, T, H, V] fp32 for the backward, column "saved Ṽ") and recomputing Ṽ in
// the backward, each with fp32 products and with bf16 operands on the mma.sync tiles (tile::Mma). Forward and
// forward + backward, timed with CUDA events over
// repeated launches (mean after 3 warm-ups). The anchor rows to compare with are FLA's "GPU ms".
// With --phases instead: a bf16 core's forward and backward at shapes (a) and (c) kernel by kernel (print_phases):
// `--phases` or `--phases gdn` the GDN core (gdn_phases), `--phases mdn` the MDN core with save_residuals
// (mdn_phases), `--phases all` both.
// Usage: delta_bench [iterations] [--phases [gdn|mdn|all]]   (default 10 iterations)
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
// into a buffer of its own that the backward reads (else the backward recomputes Ṽ; MDN only). P: the products'
// operand type (float: exact fp32; __nv_bfloat16: bf16 operands on the tensor cores) of every core.
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
      llmt::cuda::kda_chunk_fwd<P>(q, k, v, g, beta, s.B, s.T, s.H, s.K, s.V, C, o, scratch, nullptr);
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
      llmt::cuda::kda_chunk_bwd<P>(q, k, v, g, beta, d_o, s.B, s.T, s.H, s.K, s.V, C, dq, dk, dv, dg, db, scratch,
                                   nullptr);
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
  const char* products = std::is_same_v<P, float> ? "fp32 chunk-parallel" : "bf16 tensor cores";
  const double mib = 1 << 20, saved_bytes = save_residuals ? static_cast<double>(sizeof(float) * nv) : 0.0;
  std::printf("| %s (ours, %s) | %s B=%ld T=%ld H=%ld K=%ld V=%ld | %.3f | %.3f | %.0f MiB | %.0f MiB |\n", name,
              products, s.name, static_cast<long>(s.B), static_cast<long>(s.T), static_cast<long>(s.H),
              static_cast<long>(s.K), static_cast<long>(s.V), f, fb, static_cast<double>(bytes) / mib,
              saved_bytes / mib);
  for (float* x : {q, k, v, g, beta, d_o, o, dq, dk, dv, dg, db, p, dp, lm, eta, dlm, deta}) BENCH_CHECK(cudaFree(x));
  if (residuals != nullptr) BENCH_CHECK(cudaFree(residuals));
  BENCH_CHECK(cudaFree(scratch));
}

// ---- --phases: a bf16 core kernel by kernel ----

// H200 ceilings for the floors (spec sheet): HBM3e bandwidth, dense bf16 tensor-core throughput and fp32 CUDA-core
// throughput (the MDN table's CUDA-core work; its double sums are counted at this rate too).
constexpr double kHbmBytesPerS = 4.8e12, kBf16FlopPerS = 990e12, kFp32FlopPerS = 67e12;

// Bytes and tile-product FLOPs of one phase of the bf16 GDN core (gdn_comba.cu's *_mma_kernel, and the Tc scans,
// which move the same data), counted from the kernels for fp32 inputs, chunk 64, T a multiple of 64 and K, V
// multiples of 64 (every tile full). unique: every tensor element the phase reads or writes, once (what HBM must
// move at least); issued: the global loads and stores as the kernel issues them (re-reads per value or key tile
// included, L2 prefetches not); flops: 2 M N depth per tile product (the CUDA-core work is not counted). backward:
// wu keeps 𝒯. core: FLOPs on the CUDA cores (MDN's coefficients and backward chunk; 0 where not counted).
struct Cost {
  double unique, issued, flops, core = 0;
};

/// The Cost of phase `phase` (wu, scan, out, dv_local, bwd_scan, dqk, wy) of the bf16 GDN core at shape s; zeros
/// for another name.
Cost gdn_bf16_cost(const char* phase, const Shape& s, bool backward) {
  const double N = static_cast<double>(s.B * s.T * s.H), K = static_cast<double>(s.K), V = static_cast<double>(s.V);
  const double nkt = K / 64, nvt = V / 64, S = N / 64 * K * V;  // N (token, head) rows; S elements of h (or dh)
  const double gates = 8 * N;                                     // g, β (fp32)
  if (std::strcmp(phase, "wu") == 0) {  // k (issued twice: X K^T, then W), v; W, U (bf16); 𝒯 (fp32, 64 x 64 a chunk)
    const double tm = backward ? 4 * 64 * N : 0;
    return {gates + 4 * N * K + 4 * N * V + 2 * N * K + 2 * N * V + tm,
            gates + 8 * N * K + 4 * N * V + 2 * N * K + 2 * N * V + tm, 2 * 64 * N * (2 * K + V)};
  }
  if (std::strcmp(phase, "scan") == 0)  // per value tile: gates, W (bf16), k; U read and Δ written (bf16); h (bf16)
    return {gates + 6 * N * K + 4 * N * V + 2 * S, nvt * (gates + 6 * N * K) + 4 * N * V + 2 * S, 4 * N * K * V};
  if (std::strcmp(phase, "out") == 0) {  // q, k; h, Δ (bf16); o
    const double b = gates + 8 * N * K + 2 * S + 2 * N * V + 4 * N * V;
    return {b, b, 2 * N * (64 * K + K * V + 64 * V)};
  }
  if (std::strcmp(phase, "dv_local") == 0) {  // q, k, dO; dΔ (fp32)
    const double b = gates + 8 * N * K + 8 * N * V;
    return {b, b, 128 * N * (K + V)};
  }
  if (std::strcmp(phase, "bwd_scan") == 0)  // per value tile: gates, k, q, W (bf16); dO; dΔ read and written; dh (bf16)
    return {gates + 10 * N * K + 12 * N * V + 2 * S, nvt * (gates + 10 * N * K) + 12 * N * V + 2 * S, 6 * N * K * V};
  if (std::strcmp(phase, "dqk") == 0)  // q, k (issued again in fp32 per key tile); dO, Δ (bf16; issued once more
                                       // per key tile); h, dh (bf16); dΔ (per key tile); dq, dk; dW (bf16); dΓ
    return {gates + 8 * N * K + 10 * N * V + 4 * S + 10 * N * K + 4 * N,
            gates + 16 * N * K + (1 + nkt) * 6 * N * V + 4 * S + nkt * 4 * N * V + 10 * N * K + 4 * N,
            64 * N * (6 * K + 2 * V) + 6 * N * K * V};
  if (std::strcmp(phase, "wy") == 0)  // 𝒯; k (issued 5 times), v (twice), dΔ, dW (bf16), dΓ; dk read and written
                                      // (issued twice each); dv, dβ, dg
    return {gates + 256 * N + 4 * N * K + 8 * N * V + 2 * N * K + 4 * N + 8 * N * K + 4 * N * V + 8 * N,
            gates + 256 * N + 20 * N * K + 12 * N * V + 2 * N * K + 4 * N + 16 * N * K + 4 * N * V + 8 * N,
            64 * N * (10 * K + 4 * V + 256)};
  return {0, 0, 0};
}

// The phase of each GDN kernel (gdn_comba.cu), by the kernel's name.
struct PhaseKernel {
  const char *kernel, *phase;
};
constexpr PhaseKernel kPhaseKernels[] = {
    {"gdn_wu_mma_kernel", "wu"},           {"gdn_scan_mma_kernel", "scan"},
    {"gdn_scan_kernel", "scan"},           {"gdn_out_mma_kernel", "out"},
    {"gdn_dv_local_mma_kernel", "dv_local"}, {"gdn_bwd_scan_mma_kernel", "bwd_scan"},
    {"gdn_bwd_scan_kernel", "bwd_scan"},   {"gdn_bwd_dqk_mma_kernel", "dqk"},
    {"gdn_bwd_wy_mma_kernel", "wy"}};

/// The Cost of kernel `phase` (coef, scan, out, bscan, brow, bchunk) of the bf16 MDN core (mdn.cu, L = tile::Mma)
/// with save_residuals at shape s, counted as gdn_bf16_cost counts (fp32 inputs, chunk 64, full tiles); zeros for
/// another name. The fp32 global scratch: the coefficient image of a chunk (8 vectors, 7 matrices of 64 x 64;
/// vectors, Γ_{n,:} and L_U[n,:] are what a scan reads of it), brow's rowk rows (kRowkSlots = 9 of [64, K] a
/// chunk, written by brow, read by bchunk) and dew (dO Ṽ^T, dR Ṽ^T); the chunk-start state pairs (S_0, M_0) and
/// their gradients are bf16 (the operand type: 4 K V bytes a chunk each). backward: the scan is the states-only
/// one (it reads the saved Ṽ, no 𝒯, no S_0^T k products). core: fp32 / double operations of the CUDA-core loops
/// (segment sums, Γ, the triangular inverse; bchunk's reductions, row dots and O(n^3) sums), 2 per fused
/// multiply-add.
Cost mdn_bf16_cost(const char* phase, const Shape& s, bool backward) {
  const double N = static_cast<double>(s.B * s.T * s.H), K = static_cast<double>(s.K), V = static_cast<double>(s.V);
  const double nch = N / 64, nkt = K / 64, nvt = V / 64, c3 = 64.0 * 64 * 64;
  const double vec = 4 * 8 * 64, mat = 4 * 64 * 64, image = vec + 7 * mat, last_rows = 2 * 4 * 64;
  const double st = nch * 4 * K * V;  // one [NC, 2, K, V] bf16 state (or state-gradient) scratch
  if (std::strcmp(phase, "coef") == 0)  // gates, q, k; the image written whole
    return {16 * N + 8 * N * K + nch * image, 16 * N + 8 * N * K + nch * image, 256 * N * K, nch * 7 * c3 / 6};
  if (std::strcmp(phase, "scan") == 0 && !backward)  // per value tile: vectors, last rows, 𝒯, k (twice); v; Ṽ, states
    return {nch * (vec + last_rows + mat) + 4 * N * K + 8 * N * V + st,
            nvt * (nch * (vec + last_rows + mat) + 8 * N * K) + 8 * N * V + st, N * V * (8 * K + 128)};
  if (std::strcmp(phase, "scan") == 0)  // per value tile: vectors, last rows, k; saved Ṽ; states
    return {nch * (vec + last_rows) + 4 * N * K + 4 * N * V + st,
            nvt * (nch * (vec + last_rows) + 4 * N * K) + 4 * N * V + st, N * V * 4 * K};
  if (std::strcmp(phase, "out") == 0)  // vectors, Γ, Q K̂^T; states; q (per value tile); Ṽ; o
    return {nch * (vec + 2 * mat) + st + 4 * N * K + 8 * N * V,
            nch * (vec + 2 * mat) + st + nvt * 4 * N * K + 8 * N * V, N * V * (4 * K + 128)};
  if (std::strcmp(phase, "bscan") == 0)  // per value tile: vectors, last rows, 𝒯, Γ, Q K̂^T, k (twice), q; dO
                                         // (issued 3 times); dstates; dv
    return {nch * (vec + last_rows + 3 * mat) + 8 * N * K + 8 * N * V + st,
            nvt * (nch * (vec + last_rows + 3 * mat) + 12 * N * K) + 16 * N * V + st, N * V * (12 * K + 256)};
  if (std::strcmp(phase, "brow") == 0)  // vectors, Γ; dO, dR, Ṽ (issued 4 + 6 per key tile); states, dstates
                                        // (S_0, M_0 issued twice); q, k (k twice per key tile); dew, 9 rowk slots
    return {nch * (vec + mat) + 12 * N * V + 2 * st + 8 * N * K + nch * 2 * mat + 36 * N * K,
            nch * (vec + mat) + (4 + 6 * nkt) * 4 * N * V + 3 * st + 12 * N * K + nch * 2 * mat + 36 * N * K,
            N * (256 * V + 12 * K * V + 512 * K)};
  if (std::strcmp(phase, "bchunk") == 0) {  // of the image the vectors, L_A, L_U, Q K̂^T, P K̂^T and Γ's last row;
                                            // states, dstates; dew; rowk (9 slots read); q, k; dq, dk and the 4
                                            // gate gradients. Issued: each slot, q and k once (dk̂ and dp stay in
                                            // shared memory), L_A twice more (dL_U's sums, dβ's).
    const double img = vec + 4 * mat + 4 * 64;
    return {nch * img + 2 * st + nch * 2 * mat + 36 * N * K + 8 * N * K + 8 * N * K + 16 * N,
            nch * (img + 2 * mat) + 2 * st + nch * 2 * mat + 36 * N * K + 8 * N * K + 8 * N * K + 16 * N, 0,
            nch * (6 * K * V + 2 * K * 64 * 8 + 24 * 64 * K + 4 * c3 / 6 + 4 * 64 * 64)};
  }
  return {0, 0, 0};
}

// The kernel of each MDN phase (mdn.cu), by the kernel's name.
constexpr PhaseKernel kMdnKernels[] = {{"mdn_coef_kernel", "coef"},   {"mdn_scan_kernel", "scan"},
                                       {"mdn_out_kernel", "out"},     {"mdn_bscan_kernel", "bscan"},
                                       {"mdn_brow_kernel", "brow"},   {"mdn_bchunk_kernel", "bchunk"}};

/// What print_phases needs of a core: its name in the titles, its kernels' phases, their Cost, and whether the
/// Cost counts CUDA-core work (a "core GFLOP" column and kFp32FlopPerS in the floor).
struct PhaseTable {
  const char* name;
  const PhaseKernel *kernels, *kernels_end;
  Cost (*cost)(const char* phase, const Shape& s, bool backward);
  bool core;
};
constexpr PhaseTable kGdnTable{"GDN bf16", std::begin(kPhaseKernels), std::end(kPhaseKernels), gdn_bf16_cost, false};
constexpr PhaseTable kMdnTable{"MDN bf16 save_residuals", std::begin(kMdnKernels), std::end(kMdnKernels),
                               mdn_bf16_cost, true};

/// The dependencies of a graph node.
std::vector<cudaGraphNode_t> dependencies(cudaGraphNode_t node) {
  size_t n = 0;
#if CUDART_VERSION >= 13000
  BENCH_CHECK(cudaGraphNodeGetDependencies(node, nullptr, nullptr, &n));
  std::vector<cudaGraphNode_t> d(n);
  if (n > 0) BENCH_CHECK(cudaGraphNodeGetDependencies(node, d.data(), nullptr, &n));
#else
  BENCH_CHECK(cudaGraphNodeGetDependencies(node, nullptr, &n));
  std::vector<cudaGraphNode_t> d(n);
  if (n > 0) BENCH_CHECK(cudaGraphNodeGetDependencies(node, d.data(), &n));
#endif
  return d;
}

/// The kernel launches that f(stream) makes, in order, with their arguments: f runs under stream capture (so
/// nothing executes) into `graph`, whose kernel nodes are read back in dependency order. The arguments live in
/// the graph: keep it until the launches are done with. Exits on a node that is not a kernel.
template <typename F>
std::vector<cudaKernelNodeParams> capture_launches(cudaStream_t stream, F f, cudaGraph_t& graph) {
  BENCH_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  f(stream);
  BENCH_CHECK(cudaStreamEndCapture(stream, &graph));
  size_t n = 0;
  BENCH_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n), order;
  BENCH_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  std::vector<std::vector<cudaGraphNode_t>> deps;
  for (cudaGraphNode_t x : nodes) deps.push_back(dependencies(x));
  std::vector<bool> placed(n, false);
  while (order.size() < n)
    for (size_t i = 0; i < n; ++i)  // a node whose dependencies are all placed
      if (!placed[i] && std::all_of(deps[i].begin(), deps[i].end(), [&](cudaGraphNode_t d) {
            return std::find(order.begin(), order.end(), d) != order.end();
          })) {
        placed[i] = true;
        order.push_back(nodes[i]);
      }
  std::vector<cudaKernelNodeParams> launches;
  for (cudaGraphNode_t x : order) {
    cudaGraphNodeType type{};
    BENCH_CHECK(cudaGraphNodeGetType(x, &type));
    if (type != cudaGraphNodeTypeKernel) {
      std::fprintf(stderr, "delta_bench --phases: the op made a graph node of type %d, not a kernel\n",
                   static_cast<int>(type));
      std::exit(1);
    }
    cudaKernelNodeParams p{};
    BENCH_CHECK(cudaGraphKernelNodeGetParams(x, &p));
    launches.push_back(p);
  }
  return launches;
}

/// Mean GPU milliseconds of each launch: the launches in order on `stream` with an event before each and after
/// the last (so each sees the caches its predecessors left), `iters` times after 3 warm-ups.
std::vector<double> time_launches(const std::vector<cudaKernelNodeParams>& launches, cudaStream_t stream, int iters) {
  const size_t n = launches.size();
  std::vector<cudaEvent_t> ev(n + 1);
  for (cudaEvent_t& e : ev) BENCH_CHECK(cudaEventCreate(&e));
  std::vector<double> ms(n, 0.0);
  for (int it = -3; it < iters; ++it) {
    for (size_t i = 0; i < n; ++i) {
      const cudaKernelNodeParams& p = launches[i];
      BENCH_CHECK(cudaEventRecord(ev[i], stream));
      BENCH_CHECK(cudaLaunchKernel(p.func, p.gridDim, p.blockDim, p.kernelParams, p.sharedMemBytes, stream));
    }
    BENCH_CHECK(cudaEventRecord(ev[n], stream));
    BENCH_CHECK(cudaEventSynchronize(ev[n]));
    for (size_t i = 0; it >= 0 && i < n; ++i) {
      float x = 0.f;
      BENCH_CHECK(cudaEventElapsedTime(&x, ev[i], ev[i + 1]));
      ms[i] += x / iters;
    }
  }
  for (cudaEvent_t& e : ev) BENCH_CHECK(cudaEventDestroy(e));
  return ms;
}

/// Prints one table: each launch of f (the forward of table's core, or its backward when `backward`) with its
/// kernel, grid, dynamic shared memory, registers, resident blocks per SM, waves, mean GPU ms, share of the sum,
/// bytes (unique, issued), GFLOP (with table.core also the CUDA-core GFLOP), floor (max of unique bytes at
/// kHbmBytesPerS, FLOPs at kBf16FlopPerS and CUDA-core FLOPs at kFp32FlopPerS) and time / floor; then the sum and
/// the op timed as one call.
template <typename F>
void print_phases(const Shape& s, int iters, bool backward, const PhaseTable& table, F f) {
  cudaStream_t stream = nullptr;
  BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  const std::vector<cudaKernelNodeParams> launches = capture_launches(stream, f, graph);
  const std::vector<double> ms = time_launches(launches, stream, iters);
  int device = 0, sms = 0;
  BENCH_CHECK(cudaGetDevice(&device));
  BENCH_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  double total = 0, unique = 0, issued = 0, flops = 0, core = 0, floor_ms = 0;
  for (double x : ms) total += x;
  std::printf("\n%s %s, shape %s B=%ld T=%ld H=%ld K=%ld V=%ld (floors at %.1f TB/s, %.0f TFLOP/s", table.name,
              backward ? "backward" : "forward", s.name, static_cast<long>(s.B), static_cast<long>(s.T),
              static_cast<long>(s.H), static_cast<long>(s.K), static_cast<long>(s.V), kHbmBytesPerS / 1e12,
              kBf16FlopPerS / 1e12);
  if (table.core) std::printf(", CUDA cores %.0f TFLOP/s", kFp32FlopPerS / 1e12);
  std::printf(")\n\n| phase | kernel | grid | smem KiB | regs | blocks/SM | waves | GPU ms | share | MB unique "
              "| MB issued | GFLOP |%s floor ms | x floor |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|%s---|---|\n",
              table.core ? " core GFLOP |" : "", table.core ? "---|" : "");
  for (size_t i = 0; i < launches.size(); ++i) {
    const cudaKernelNodeParams& p = launches[i];
    const char* name = nullptr;
    if (cudaFuncGetName(&name, p.func) != cudaSuccess || name == nullptr) {
      name = "?";
      (void)cudaGetLastError();
    }
    const PhaseKernel* pk = nullptr;
    for (const PhaseKernel* x = table.kernels; x != table.kernels_end; ++x)
      if (std::strstr(name, x->kernel) != nullptr) pk = x;
    cudaFuncAttributes attr{};
    BENCH_CHECK(cudaFuncGetAttributes(&attr, p.func));
    int per_sm = 0;
    BENCH_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, p.func,
                                                              static_cast<int>(p.blockDim.x * p.blockDim.y),
                                                              p.sharedMemBytes));
    const long blocks = static_cast<long>(p.gridDim.x) * p.gridDim.y * p.gridDim.z;
    const double waves = per_sm > 0 ? static_cast<double>(blocks) / (static_cast<double>(per_sm) * sms) : 0.0;
    const Cost cost = pk ? table.cost(pk->phase, s, backward) : Cost{0, 0, 0};
    const double fl = 1e3 * std::max({cost.unique / kHbmBytesPerS, cost.flops / kBf16FlopPerS,
                                      cost.core / kFp32FlopPerS});
    unique += cost.unique, issued += cost.issued, flops += cost.flops, core += cost.core, floor_ms += fl;
    char core_col[32] = "";
    if (table.core) std::snprintf(core_col, sizeof core_col, " %.2f |", cost.core / 1e9);
    std::printf("| %s | %s | %ux%u | %.1f | %d | %d | %.2f | %.3f | %.0f%% | %.0f | %.0f | %.1f |%s %.3f | %.1f |\n",
                pk ? pk->phase : "?", pk ? pk->kernel : name, p.gridDim.x, p.gridDim.y,
                static_cast<double>(p.sharedMemBytes) / 1024, attr.numRegs, per_sm, waves, ms[i],
                100 * ms[i] / total, cost.unique / 1e6, cost.issued / 1e6, cost.flops / 1e9, core_col, fl,
                fl > 0 ? ms[i] / fl : 0.0);
  }
  char core_sum[32] = "";
  if (table.core) std::snprintf(core_sum, sizeof core_sum, " %.2f |", core / 1e9);
  std::printf("| sum | | | | | | | %.3f | 100%% | %.0f | %.0f | %.1f |%s %.3f | %.1f |\n", total, unique / 1e6,
              issued / 1e6, flops / 1e9, core_sum, floor_ms, total / floor_ms);
  const float one_call = bench::time_ms(iters, [&] { f(nullptr); });
  std::printf("\nthe op as one call (default stream): %.3f ms\n", one_call);
  BENCH_CHECK(cudaGraphDestroy(graph));
  BENCH_CHECK(cudaStreamDestroy(stream));
}

/// Exits unless shape s has the full tiles the cost models count (T a multiple of 64, K and V of 64).
void check_full_tiles(const Shape& s) {
  if (s.T % 64 != 0 || s.K % 64 != 0 || s.V % 64 != 0) {
    std::fprintf(stderr, "delta_bench --phases: the cost model needs T a multiple of 64 and full 64-wide tiles\n");
    std::exit(1);
  }
}

/// The bf16 GDN core's forward and backward at shape s, phase by phase (print_phases), on bench_core's inputs.
void gdn_phases(const Shape& s, int iters) {
  const int64_t nk = s.B * s.T * s.H * s.K, nv = s.B * s.T * s.H * s.V, nb = s.B * s.T * s.H, C = 64;
  check_full_tiles(s);
  const float amp = 1.7320508f / std::sqrt(static_cast<float>(s.K));
  float *q = random_buffer(nk, 1, -amp, amp), *k = random_buffer(nk, 2, -amp, amp);
  float *v = random_buffer(nv, 3, -1.f, 1.f), *g = random_buffer(nb, 4, -0.1f, -0.001f);
  float *beta = random_buffer(nb, 5, 0.1f, 0.9f), *d_o = random_buffer(nv, 6, -1.f, 1.f);
  float *o = random_buffer(nv, 7, 0.f, 0.f), *dq = random_buffer(nk, 8, 0.f, 0.f), *dk = random_buffer(nk, 9, 0.f, 0.f);
  float *dv = random_buffer(nv, 10, 0.f, 0.f), *dg = random_buffer(nb, 11, 0.f, 0.f), *db = random_buffer(nb, 12, 0.f, 0.f);
  using P = __nv_bfloat16;
  void* scratch = nullptr;
  BENCH_CHECK(cudaMalloc(&scratch, std::max(llmt::cuda::gdn_chunk_fwd_scratch_bytes<P>(s.B, s.T, s.H, s.K, s.V, C),
                                            llmt::cuda::gdn_chunk_bwd_scratch_bytes<P>(s.B, s.T, s.H, s.K, s.V, C))));
  BENCH_CHECK(cudaDeviceSynchronize());
  print_phases(s, iters, false, kGdnTable, [&](cudaStream_t st) {
    llmt::cuda::gdn_chunk_fwd<P>(q, k, v, g, beta, s.B, s.T, s.H, s.K, s.V, C, o, scratch, st);
  });
  print_phases(s, iters, true, kGdnTable, [&](cudaStream_t st) {
    llmt::cuda::gdn_chunk_bwd<P>(q, k, v, g, beta, d_o, s.B, s.T, s.H, s.K, s.V, C, dq, dk, dv, dg, db, scratch, st);
  });
  for (float* x : {q, k, v, g, beta, d_o, o, dq, dk, dv, dg, db}) BENCH_CHECK(cudaFree(x));
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
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--phases") == 0) {
      by_phase = true;
      const char* which = i + 1 < argc ? argv[i + 1] : "";
      if (std::strcmp(which, "gdn") == 0 || std::strcmp(which, "mdn") == 0 || std::strcmp(which, "all") == 0) {
        gdn = std::strcmp(which, "mdn") != 0, mdn = std::strcmp(which, "gdn") != 0;
        ++i;
      }
    } else {
      iters = std::atoi(argv[i]);
    }
  }
  const Shape a{"a", 4, 4096, 16, 128, 128}, c{"c", 4, 4096, 6, 256, 512};
  if (by_phase) {
    for (const Shape& s : {a, c}) {
      if (gdn) gdn_phases(s, iters);
      if (mdn) mdn_phases(s, iters);
    }
    return 0;
  }
  std::printf("| core | shape | GPU ms fwd | GPU ms f+b | scratch | saved Ṽ |\n|---|---|---|---|---|---|\n");
  for (const Shape& s : {a, c})
    for (const Core core : {Core::kGdn, Core::kComba}) {
      bench_core<float>(s, iters, core);
      bench_core<__nv_bfloat16>(s, iters, core);
    }
  bench_core<float>(a, iters, Core::kKda);
  bench_core<__nv_bfloat16>(a, iters, Core::kKda);
  for (const Shape& s : {a, c})
    for (const bool save_residuals : {true, false}) {
      bench_core<float>(s, iters, Core::kMdn, save_residuals);
      bench_core<__nv_bfloat16>(s, iters, Core::kMdn, save_residuals);
    }
  return 0;
}
