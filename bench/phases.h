// The kernel-by-kernel breakdown of one op call (`--phases` of bench/delta_bench.cu and bench/mamba3_bench.cu):
// the op's launches captured into a CUDA graph (nothing runs during capture), then each kernel node launched and
// timed on its own with CUDA events, and printed as a markdown table with its grid, dynamic shared memory,
// registers, resident blocks per SM, waves, mean GPU ms, share of the sum, bytes (unique, issued), tensor-core
// GFLOP and the floor of a cost model the benchmark counts from the kernels' code. Benchmarks only.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bench_util.cuh"

namespace bench {

// H200 ceilings for the floors (spec sheet): HBM3e bandwidth, dense bf16 tensor-core throughput and fp32 CUDA-core
// throughput (the MDN table's CUDA-core work; its double sums are counted at this rate too).
constexpr double kHbmBytesPerS = 4.8e12, kBf16FlopPerS = 990e12, kFp32FlopPerS = 67e12;

// Bytes and FLOPs of one kernel launch (a "phase"), counted from the kernel's code by the benchmark. unique: every
// tensor element the phase reads or writes, once (what HBM must move at least; an element read and written in
// place counts twice); issued: the global loads and stores as the kernel issues them (re-reads included, L2
// prefetches not); flops: tensor-core tile products, 2 M N depth each; core: FLOPs on the CUDA cores (0 where not
// counted).
struct Cost {
  double unique, issued, flops, core = 0;
};

// The phase of a kernel, by (a substring of) the kernel's name; nth >= 0: only the nth launch (from 0) of that
// kernel in the op (kernels launched several times with different sizes, e.g. a column sum per parameter), -1 every
// launch.
struct PhaseKernel {
  const char *kernel, *phase;
  int nth = -1;
};

/// What print_phases needs of an op: its name in the titles, its kernels' phases, their Cost at a shape of type
/// Shape (bytes and FLOPs of phase `phase`, forward or backward call), and whether the Cost counts CUDA-core work
/// (a "core GFLOP" column and kFp32FlopPerS in the floor).
template <typename Shape>
struct PhaseTable {
  const char* name;
  const PhaseKernel *kernels, *kernels_end;
  Cost (*cost)(const char* phase, const Shape& s, bool backward);
  bool core;
};

/// The dependencies of a graph node.
inline std::vector<cudaGraphNode_t> dependencies(cudaGraphNode_t node) {
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
/// the graph: keep it until the launches are done with. Exits on a node that is not a kernel (`who` names the
/// op in the message).
template <typename F>
std::vector<cudaKernelNodeParams> capture_launches(cudaStream_t stream, F f, cudaGraph_t& graph, const char* who) {
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
      std::fprintf(stderr, "%s --phases: the op made a graph node of type %d, not a kernel\n", who,
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
inline std::vector<double> time_launches(const std::vector<cudaKernelNodeParams>& launches, cudaStream_t stream,
                                         int iters) {
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

/// Prints one table: each launch of f (the forward of table's op, or its backward when `backward`; f(stream)
/// launches the op on stream) with its kernel, grid, dynamic shared memory, registers, resident blocks per SM,
/// waves, mean GPU ms, share of the sum, bytes (unique, issued), GFLOP (with table.core also the CUDA-core GFLOP),
/// floor (max of unique bytes at kHbmBytesPerS, FLOPs at kBf16FlopPerS and CUDA-core FLOPs at kFp32FlopPerS) and
/// time / floor; then the sum and the op timed as one call on the default stream. `shape` describes s in the
/// title (e.g. "shape a B=4 T=4096 H=16 K=128 V=128"); `who` names the benchmark in error messages.
template <typename Shape, typename F>
void print_phases(const Shape& s, const char* shape, int iters, bool backward, const PhaseTable<Shape>& table, F f,
                  const char* who) {
  cudaStream_t stream = nullptr;
  BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  const std::vector<cudaKernelNodeParams> launches = capture_launches(stream, f, graph, who);
  const std::vector<double> ms = time_launches(launches, stream, iters);
  int device = 0, sms = 0;
  BENCH_CHECK(cudaGetDevice(&device));
  BENCH_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  double total = 0, unique = 0, issued = 0, flops = 0, core = 0, floor_ms = 0;
  for (double x : ms) total += x;
  std::printf("\n%s %s, %s (floors at %.1f TB/s, %.0f TFLOP/s", table.name, backward ? "backward" : "forward", shape,
              kHbmBytesPerS / 1e12, kBf16FlopPerS / 1e12);
  if (table.core) std::printf(", CUDA cores %.0f TFLOP/s", kFp32FlopPerS / 1e12);
  std::printf(")\n\n| phase | kernel | grid | smem KiB | regs | blocks/SM | waves | GPU ms | share | MB unique "
              "| MB issued | GFLOP |%s floor ms | x floor |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|%s---|---|\n",
              table.core ? " core GFLOP |" : "", table.core ? "---|" : "");
  std::vector<const void*> seen;  // the kernel of each launch so far (for PhaseKernel::nth)
  for (size_t i = 0; i < launches.size(); ++i) {
    const cudaKernelNodeParams& p = launches[i];
    const int nth = static_cast<int>(std::count(seen.begin(), seen.end(), p.func));
    seen.push_back(p.func);
    const char* name = nullptr;
    if (cudaFuncGetName(&name, p.func) != cudaSuccess || name == nullptr) {
      name = "?";
      (void)cudaGetLastError();
    }
    const PhaseKernel* pk = nullptr;
    for (const PhaseKernel* x = table.kernels; x != table.kernels_end; ++x)
      if (std::strstr(name, x->kernel) != nullptr && (x->nth < 0 || x->nth == nth)) pk = x;
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
  const float one_call = time_ms(iters, [&] { f(nullptr); });
  std::printf("\nthe op as one call (default stream): %.3f ms\n", one_call);
  BENCH_CHECK(cudaGraphDestroy(graph));
  BENCH_CHECK(cudaStreamDestroy(stream));
}

}  // namespace bench
