// Elementwise ops: add, dtype conversion and SwiGLU forward/backward (grid-stride loops,
// fp32 math; activations stored as float or bf16).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.cuh"

namespace llmt::cuda {
namespace {

// out = a + b
__global__ void add_kernel(const float* a, const float* b, int64_t n, float* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    out[i] = a[i] + b[i];
}

// dst = src rounded to D
template <typename S, typename D>
__global__ void convert_kernel(const S* src, int64_t n, D* dst) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    dst[i] = from_f32<D>(to_f32(src[i]));
}

__device__ float sigmoid(float a) { return 1.0f / (1.0f + expf(-a)); }

// h = SiLU(a) b, SiLU(a) = a sigma(a)   (layers-ssm-attn.md §1.3)
template <typename T>
__global__ void swiglu_fwd_kernel(const T* gate, const T* up, int64_t n, T* h) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float a = to_f32(gate[i]);
    h[i] = from_f32<T>(a * sigmoid(a) * to_f32(up[i]));
  }
}

// da = dh b sigma(a) (1 + a (1 - sigma(a)));  db = dh SiLU(a)   (layers-ssm-attn.md §1.3)
template <typename T>
__global__ void swiglu_bwd_kernel(const T* gate, const T* up, const T* dh, int64_t n, T* dgate, T* dup) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float a = to_f32(gate[i]), sig = sigmoid(a), g = to_f32(dh[i]);
    dgate[i] = from_f32<T>(g * to_f32(up[i]) * sig * (1.0f + a * (1.0f - sig)));
    dup[i] = from_f32<T>(g * a * sig);
  }
}

}  // namespace

void add(const float* a, const float* b, int64_t n, float* out, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<<<grid_for(n), kThreads, 0, stream>>>(a, b, n, out);
  LLMT_CUDA_CHECK_LAUNCH();
}

template <typename S, typename D>
void convert(const S* src, int64_t n, D* dst, cudaStream_t stream) {
  if (n == 0) return;
  convert_kernel<<<grid_for(n), kThreads, 0, stream>>>(src, n, dst);
  LLMT_CUDA_CHECK_LAUNCH();
}
template void convert(const float*, int64_t, __nv_bfloat16*, cudaStream_t);
template void convert(const __nv_bfloat16*, int64_t, float*, cudaStream_t);

template <typename T>
void swiglu_fwd(const T* gate, const T* up, int64_t n, T* h, cudaStream_t stream) {
  if (n == 0) return;
  swiglu_fwd_kernel<<<grid_for(n), kThreads, 0, stream>>>(gate, up, n, h);
  LLMT_CUDA_CHECK_LAUNCH();
}

template <typename T>
void swiglu_bwd(const T* gate, const T* up, const T* dh, int64_t n, T* dgate, T* dup, cudaStream_t stream) {
  if (n == 0) return;
  swiglu_bwd_kernel<<<grid_for(n), kThreads, 0, stream>>>(gate, up, dh, n, dgate, dup);
  LLMT_CUDA_CHECK_LAUNCH();
}

#define LLMT_INSTANTIATE_SWIGLU(T)                                                                   \
  template void swiglu_fwd(const T*, const T*, int64_t, T*, cudaStream_t);                           \
  template void swiglu_bwd(const T*, const T*, const T*, int64_t, T*, T*, cudaStream_t);
LLMT_INSTANTIATE_SWIGLU(float)
LLMT_INSTANTIATE_SWIGLU(__nv_bfloat16)

}  // namespace llmt::cuda
