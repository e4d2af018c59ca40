// AdamW (Loshchilov & Hutter 2019, PyTorch torch.optim.AdamW semantics; runs.md §1),
// elementwise, arithmetic in double exactly as the CPU reference (src/kernels/cpu/adamw.cpp).
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.cuh"

namespace llmt::cuda {
namespace {

// g = grad_scale grad;  p *= 1 - lr wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
// p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// working (when given) = bf16(p), the mixed-precision working copy
__global__ void adamw_kernel(float* params, const float* grads, float* m, float* v, int64_t n, double beta1,
                             double beta2, double eps, double grad_scale, double step_size, double sqrt_bc2,
                             double decay, __nv_bfloat16* working) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const double g = grad_scale * static_cast<double>(grads[i]);
    const double mi = beta1 * static_cast<double>(m[i]) + (1.0 - beta1) * g;
    const double vi = beta2 * static_cast<double>(v[i]) + (1.0 - beta2) * g * g;
    const double p = static_cast<double>(params[i]) * decay;
    const float updated = static_cast<float>(p - step_size * mi / (sqrt(vi) / sqrt_bc2 + eps));
    params[i] = updated;
    if (working) working[i] = __float2bfloat16_rn(updated);
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
  }
}

}  // namespace

void adamw_step(float* params, const float* grads, float* m, float* v, int64_t n, double lr, double beta1,
                double beta2, double eps, double weight_decay, double grad_scale, int64_t step,
                __nv_bfloat16* working, cudaStream_t stream) {
  check(step >= 1, "adamw_step: step is 1-based, got {}", step);
  if (n == 0) return;
  const double t = static_cast<double>(step);
  const double step_size = lr / (1.0 - std::pow(beta1, t));
  const double sqrt_bc2 = std::sqrt(1.0 - std::pow(beta2, t));
  const double decay = 1.0 - lr * weight_decay;
  adamw_kernel<<<grid_for(n), kThreads, 0, stream>>>(params, grads, m, v, n, beta1, beta2, eps, grad_scale,
                                                     step_size, sqrt_bc2, decay, working);
  LLMT_CUDA_CHECK_LAUNCH();
}

}  // namespace llmt::cuda
