// Sum and sum of squares (the loss sum; the squared global gradient norm, runs.md §1), deterministic two-pass
// reduction in double: pass 1 gives one partial per block over a fixed grid-stride
// partition, pass 2 sums the partials in one block. No atomics, so the bits are the same on
// every run.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.cuh"

namespace llmt::cuda {
namespace {

constexpr int kMaxPartials = 1024;

// Per-block partials of pass 1. Module-global device memory: launches of one device that
// overlap on different streams would share it; the backend issues sum_squares on its one
// stream.
__device__ double g_partials[kMaxPartials];

// partial_b = Σ_{i in block b's grid-stride share} x_i^2 (or x_i when !squares)
__global__ void sum_partial_kernel(const float* x, int64_t n, bool squares) {
  double s = 0.0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const double v = x[i];
    s += squares ? v * v : v;
  }
  s = block_reduce(s, SumOp{}, 0.0);
  if (threadIdx.x == 0) g_partials[blockIdx.x] = s;
}

// result = Σ_b partial_b
__global__ void sum_partials_kernel(int num_partials, double* result) {
  double s = 0.0;
  for (int i = threadIdx.x; i < num_partials; i += blockDim.x) s += g_partials[i];
  s = block_reduce(s, SumOp{}, 0.0);
  if (threadIdx.x == 0) *result = s;
}

void sum_reduce(const float* x, int64_t n, bool squares, double* result_device, cudaStream_t stream) {
  const int blocks = static_cast<int>(std::clamp<int64_t>(ceil_div(n, kThreads), 1, kMaxPartials));
  sum_partial_kernel<<<blocks, kThreads, 0, stream>>>(x, n, squares);
  LLMT_CUDA_CHECK_LAUNCH();
  sum_partials_kernel<<<1, kMaxPartials, 0, stream>>>(blocks, result_device);
  LLMT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void sum_squares(const float* x, int64_t n, double* result_device, cudaStream_t stream) {
  sum_reduce(x, n, true, result_device, stream);
}

void sum(const float* x, int64_t n, double* result_device, cudaStream_t stream) {
  sum_reduce(x, n, false, result_device, stream);
}

}  // namespace llmt::cuda
