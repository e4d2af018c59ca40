// Softmax cross-entropy, forward and backward together (one block per row), the CPU
// reference's arithmetic up to rounding: exponentials in fp32 summed in double, the gradient
// scaled in fp32 and stored in the logits' type (float or bf16).
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.cuh"

namespace llmt::cuda {
namespace {

constexpr int kRowThreads = 512;

// Calls f(j, z[j]) for this thread's j = threadIdx.x + k blockDim.x < n in increasing k,
// loading four values ahead so that several loads are in flight per thread.
template <typename T, typename F>
__device__ void for_each_strided(const T* z, int64_t n, F f) {
  const int64_t step = blockDim.x;
  int64_t j = threadIdx.x;
  for (; j + 3 * step < n; j += 4 * step) {
    const float a = to_f32(z[j]), b = to_f32(z[j + step]), c = to_f32(z[j + 2 * step]), d = to_f32(z[j + 3 * step]);
    f(j, a);
    f(j + step, b);
    f(j + 2 * step, c);
    f(j + 3 * step, d);
  }
  for (; j < n; j += step) f(j, to_f32(z[j]));
}

// loss_r = logsumexp(z_r) - z_r[t_r];  dz_r = grad_scale (softmax(z_r) - onehot(t_r));
// t_r < 0: loss 0, gradient 0; t_r >= vocab: loss and gradient NaN (a kernel cannot throw).
// correct (optional): 1 where z_r[t_r] is larger than every other logit of the row (a tie is wrong), else 0
// (0 without a label).
// Two passes over the row: the max and the sum of exponentials together (each thread keeps
// a running max m_t and Σ exp(z - m_t), rescaled when m_t grows, then the block combines
// Σ_t exp(m_t - max) sum_t), then the gradient.
template <typename T>
__global__ void cross_entropy_kernel(T* logits, const int32_t* targets, int64_t rows, int64_t vocab, int64_t ld,
                                     double grad_scale, float* losses, float* correct) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    T* z = logits + r * ld;
    const int32_t target = targets[r];
    if (target < 0 || target >= vocab) {
      const float fill = target < 0 ? 0.0f : NAN;
      for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) z[j] = from_f32<T>(fill);
      if (threadIdx.x == 0) {
        losses[r] = fill;
        if (correct) correct[r] = 0.0f;
      }
      continue;
    }
    const double z_target = to_f32(z[target]);
    float m = -INFINITY, m_other = -INFINITY;  // m_other: the largest logit but the target's
    double sum = 0.0;
    for_each_strided(z, vocab, [&](int64_t j, float zj) {
      if (j != target) m_other = fmaxf(m_other, zj);
      if (zj == -INFINITY) return;  // adds exp(-inf) = 0; -inf - -inf would be NaN
      if (zj > m) {
        sum *= exp(static_cast<double>(m) - zj);
        m = zj;
      }
      sum += expf(zj - m);
    });
    const float mx = block_reduce(m, MaxOp{}, -INFINITY);
    const float mx_other = correct ? block_reduce(m_other, MaxOp{}, -INFINITY) : 0.0f;  // uniform branch
    sum = m == -INFINITY ? 0.0 : sum * exp(static_cast<double>(m) - mx);
    sum = block_reduce(sum, SumOp{}, 0.0);
    const float scale = static_cast<float>(grad_scale / sum), gs = static_cast<float>(grad_scale);
    for_each_strided(z, vocab, [&](int64_t j, float zj) {
      const float g = expf(zj - mx) * scale;
      z[j] = from_f32<T>(j == target ? g - gs : g);
    });
    if (threadIdx.x == 0) {
      losses[r] = static_cast<float>(static_cast<double>(mx) + log(sum) - z_target);
      if (correct) correct[r] = static_cast<float>(z_target) > mx_other ? 1.0f : 0.0f;  // the same fp32 values
    }
  }
}

}  // namespace

template <typename T>
void cross_entropy(T* logits, const int32_t* targets, int64_t rows, int64_t vocab, int64_t ld, double grad_scale,
                   float* losses, float* correct, cudaStream_t stream) {
  if (rows == 0) return;
  cross_entropy_kernel<<<static_cast<unsigned>(std::min<int64_t>(rows, 65536)), kRowThreads, 0, stream>>>(
      logits, targets, rows, vocab, ld, grad_scale, losses, correct);
  LLMT_CUDA_CHECK_LAUNCH();
}
template void cross_entropy(float*, const int32_t*, int64_t, int64_t, int64_t, double, float*, float*, cudaStream_t);
template void cross_entropy(__nv_bfloat16*, const int32_t*, int64_t, int64_t, int64_t, double, float*, float*,
                            cudaStream_t);

}  // namespace llmt::cuda
