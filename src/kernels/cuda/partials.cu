// Fixed-order sums of per-block partials: the last step of the kernels' deterministic parameter-gradient
// reductions (common.cuh add_partials). No atomics: the same partials give the same bits.
#include "kernels/cuda/common.cuh"

namespace llmt::cuda {
namespace {

// A block covers kCols columns (its lanes, coalesced), its kRowThreads warps interleaved chunks.
constexpr int kCols = 32, kRowThreads = 8;
static_assert(kCols * kRowThreads == kThreads, "add_partials_kernel: a block is kRowThreads warps");

// out[c] += Σ_k partial[k, c] over k = 0..chunks-1: block x takes columns c = 32 x + lane, warp s the chunks
// k ≡ s (mod 8) in ascending order, then lane's warp 0 adds the 8 warps' sums in warp order (all in double).
__global__ void add_partials_kernel(const double* partial, int64_t chunks, int64_t n, float* out) {
  __shared__ double sums[kRowThreads][kCols];
  const int lane = static_cast<int>(threadIdx.x % kCols), s = static_cast<int>(threadIdx.x / kCols);
  const int64_t c = int64_t{blockIdx.x} * kCols + lane;
  double v = 0.0;
  if (c < n)
#pragma unroll 4
    for (int64_t k = s; k < chunks; k += kRowThreads) v += partial[k * n + c];
  sums[s][lane] = v;
  __syncthreads();
  if (s > 0 || c >= n) return;
  for (int k = 1; k < kRowThreads; ++k) v += sums[k][lane];
  out[c] = static_cast<float>(out[c] + v);
}

}  // namespace

void add_partials(const double* partial, int64_t chunks, int64_t n, float* out, cudaStream_t stream) {
  if (n == 0) return;
  add_partials_kernel<<<static_cast<unsigned>(ceil_div(n, kCols)), kThreads, 0, stream>>>(partial, chunks, n, out);
  LLMT_CUDA_CHECK_LAUNCH();
}

}  // namespace llmt::cuda
