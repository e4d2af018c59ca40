// Elementwise ops: add, dtype conversion and SwiGLU forward/backward (grid-stride loops,
// fp32 math; activations stored as float or bf16; the conversion eight elements a thread where
// the pointers are 16-byte aligned).
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

// Eight consecutive elements, 16-byte aligned: one (bf16) or two (float) 16-byte loads / stores.
template <typename T>
struct alignas(16) Pack8 {
  T v[8];
};

// dst = src rounded to D, eight elements a thread and step: groups g < n8 of 16-byte aligned src and dst (the same
// rounding per element as convert_kernel, in fewer and wider memory instructions).
template <typename S, typename D>
__global__ void convert8_kernel(const Pack8<S>* __restrict__ src, int64_t n8, Pack8<D>* __restrict__ dst) {
  for (int64_t g = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; g < n8; g += int64_t{gridDim.x} * blockDim.x) {
    const Pack8<S> s = src[g];
    Pack8<D> d;
#pragma unroll
    for (int k = 0; k < 8; ++k) d.v[k] = from_f32<D>(to_f32(s.v[k]));
    dst[g] = d;
  }
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

// Both pointers 16-byte aligned: the groups of eight by convert8_kernel, the last n % 8 elements by convert_kernel;
// else all by convert_kernel.
template <typename S, typename D>
void convert(const S* src, int64_t n, D* dst, cudaStream_t stream) {
  if (n == 0) return;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const int64_t n8 = aligned(src) && aligned(dst) ? n / 8 : 0;
  if (n8 > 0) {
    convert8_kernel<<<grid_for(n8), kThreads, 0, stream>>>(reinterpret_cast<const Pack8<S>*>(src), n8,
                                                           reinterpret_cast<Pack8<D>*>(dst));
    LLMT_CUDA_CHECK_LAUNCH();
  }
  if (n == 8 * n8) return;
  convert_kernel<<<grid_for(n - 8 * n8), kThreads, 0, stream>>>(src + 8 * n8, n - 8 * n8, dst + 8 * n8);
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
