// Rotary position embedding, GPT-NeoX rotate-half convention (layers-ssm-attn.md §3.3),
// in place on [batch, seq_len, heads, head_dim]. Angles and the rotation in double, like
// the CPU reference; one thread per (row, position, frequency) applies it to every head.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.cuh"

namespace llmt::cuda {
namespace {

// phi = (position0 + t) theta^(-2i/Dh);  x0' = x0 cos(phi) - sign x1 sin(phi),  x1' = sign x0 sin(phi) + x1 cos(phi)
// (sign = +1 forward, -1 its transpose, the backward)
template <typename T>
__global__ void rope_kernel(T* x, int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim,
                            double theta, double sign, int64_t position0) {
  const int64_t half = head_dim / 2, total = batch * seq_len * half;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = idx % half, bt = idx / half, pos = position0 + bt % seq_len;
    const double phi = static_cast<double>(pos) * pow(theta, -2.0 * static_cast<double>(i) / head_dim);
    double s, c;
    sincos(phi, &s, &c);
    s *= sign;
    for (int64_t h = 0; h < heads; ++h) {
      T* xh = x + (bt * heads + h) * head_dim;
      const double x0 = to_f32(xh[i]), x1 = to_f32(xh[half + i]);
      xh[i] = from_f32<T>(static_cast<float>(x0 * c - x1 * s));
      xh[half + i] = from_f32<T>(static_cast<float>(x0 * s + x1 * c));
    }
  }
}

template <typename T>
void rope(T* x, int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim, double theta, double sign,
          int64_t position0, cudaStream_t stream) {
  check(head_dim > 0 && head_dim % 2 == 0, "rope: head_dim must be even and positive, got {}", head_dim);
  const int64_t total = batch * seq_len * (head_dim / 2);
  if (total == 0 || heads == 0) return;
  rope_kernel<<<grid_for(total), kThreads, 0, stream>>>(x, batch, seq_len, heads, head_dim, theta, sign,
                                                          position0);
  LLMT_CUDA_CHECK_LAUNCH();
}

}  // namespace

template <typename T>
void rope_fwd(T* x, int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim, double theta,
              cudaStream_t stream) {
  rope(x, batch, seq_len, heads, head_dim, theta, 1.0, 0, stream);
}

template <typename T>
void rope_fwd_at(T* x, int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim, double theta,
                 int64_t position, cudaStream_t stream) {
  rope(x, batch, seq_len, heads, head_dim, theta, 1.0, position, stream);
}

template <typename T>
void rope_bwd(T* dx, int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim, double theta,
              cudaStream_t stream) {
  rope(dx, batch, seq_len, heads, head_dim, theta, -1.0, 0, stream);
}

#define LLMT_INSTANTIATE_ROPE(T)                                                              \
  template void rope_fwd(T*, int64_t, int64_t, int64_t, int64_t, double, cudaStream_t);      \
  template void rope_bwd(T*, int64_t, int64_t, int64_t, int64_t, double, cudaStream_t);      \
  template void rope_fwd_at(T*, int64_t, int64_t, int64_t, int64_t, double, int64_t, cudaStream_t);
LLMT_INSTANTIATE_ROPE(float)
LLMT_INSTANTIATE_ROPE(__nv_bfloat16)

}  // namespace llmt::cuda
