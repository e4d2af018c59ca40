// Elementwise ops: add and SwiGLU forward/backward (grid-stride loops, fp32 math).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.cuh"

namespace llmt::cuda {
namespace {

// out = a + b
__global__ void add_kernel(const float* a, const float* b, int64_t n, float* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    out[i] = a[i] + b[i];
}

__device__ float sigmoid(float a) { return 1.0f / (1.0f + expf(-a)); }

// h = SiLU(a) b, SiLU(a) = a sigma(a)   (layers-ssm-attn.md §1.3)
__global__ void swiglu_fwd_kernel(const float* gate, const float* up, int64_t n, float* h) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float a = gate[i];
    h[i] = a * sigmoid(a) * up[i];
  }
}

// da = dh b sigma(a) (1 + a (1 - sigma(a)));  db = dh SiLU(a)   (layers-ssm-attn.md §1.3)
__global__ void swiglu_bwd_kernel(const float* gate, const float* up, const float* dh, int64_t n, float* dgate,
                                  float* dup) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float a = gate[i], sig = sigmoid(a), g = dh[i];
    dgate[i] = g * up[i] * sig * (1.0f + a * (1.0f - sig));
    dup[i] = g * a * sig;
  }
}

}  // namespace

void add(const float* a, const float* b, int64_t n, float* out, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<<<grid_for(n), kThreads, 0, stream>>>(a, b, n, out);
  LLMT_CUDA_CHECK_LAUNCH();
}

void swiglu_fwd(const float* gate, const float* up, int64_t n, float* h, cudaStream_t stream) {
  if (n == 0) return;
  swiglu_fwd_kernel<<<grid_for(n), kThreads, 0, stream>>>(gate, up, n, h);
  LLMT_CUDA_CHECK_LAUNCH();
}

void swiglu_bwd(const float* gate, const float* up, const float* dh, int64_t n, float* dgate, float* dup,
                cudaStream_t stream) {
  if (n == 0) return;
  swiglu_bwd_kernel<<<grid_for(n), kThreads, 0, stream>>>(gate, up, dh, n, dgate, dup);
  LLMT_CUDA_CHECK_LAUNCH();
}

}  // namespace llmt::cuda
