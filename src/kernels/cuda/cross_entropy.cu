// Softmax cross-entropy, forward and backward together (one block per row), the CPU
// reference's arithmetic up to rounding: exponentials in fp32 (summed in fp32 over one 16-byte piece of the row,
// then in double), the gradient scaled in fp32 and stored in the logits' type (float or bf16).
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.cuh"

namespace llmt::cuda {
namespace {

constexpr int kRowThreads = 512;

// Logits of type T in one 16-byte piece.
template <typename T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));

template <typename T>
__device__ __forceinline__ void unpack(const uint4& u, float (&v)[kVec<T>]) {
  if constexpr (std::is_same_v<T, float>) {
    const float* f = reinterpret_cast<const float*>(&u);
    for (int k = 0; k < 4; ++k) v[k] = f[k];
  } else {
    const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&u);
    for (int k = 0; k < 4; ++k) {
      const float2 f = __bfloat1622float2(p[k]);
      v[2 * k] = f.x, v[2 * k + 1] = f.y;
    }
  }
}

// v rounded to T (round to nearest even, as from_f32) in one 16-byte piece.
template <typename T>
__device__ __forceinline__ uint4 pack(const float (&v)[kVec<T>]) {
  uint4 u;
  if constexpr (std::is_same_v<T, float>) {
    float* f = reinterpret_cast<float*>(&u);
    for (int k = 0; k < 4; ++k) f[k] = v[k];
  } else {
    __nv_bfloat162* p = reinterpret_cast<__nv_bfloat162*>(&u);
    for (int k = 0; k < 4; ++k) p[k] = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
  }
  return u;
}

// Visits the n logits of row z once, split by address: the elements before the first 16-byte boundary and after
// the last whole piece one at a time (scalar(j, z_j); at most 2 (kVec - 1) of them), the whole pieces in between
// 16 bytes at a time (piece(j, u): z_j .. z_{j + kVec - 1}), four pieces of a thread loaded before any is used so
// that several loads are in flight. Thread t takes pieces t, t + blockDim.x, ...
template <typename T, typename S, typename V>
__device__ __forceinline__ void for_each_piece(const T* z, int64_t n, S scalar, V piece) {
  constexpr int64_t kv = kVec<T>;
  const int64_t mis = static_cast<int64_t>(reinterpret_cast<uintptr_t>(z) & 15) / static_cast<int64_t>(sizeof(T));
  const int64_t head = std::min<int64_t>(n, mis == 0 ? 0 : kv - mis), pieces = (n - head) / kv,
                body_end = head + pieces * kv;
  for (int64_t j = threadIdx.x; j < head; j += blockDim.x) scalar(j, to_f32(z[j]));
  for (int64_t j = body_end + threadIdx.x; j < n; j += blockDim.x) scalar(j, to_f32(z[j]));
  const uint4* zv = reinterpret_cast<const uint4*>(z + head);
  const int64_t step = blockDim.x;
  int64_t i = threadIdx.x;
  for (; i + 3 * step < pieces; i += 4 * step) {
    const uint4 a = zv[i], b = zv[i + step], c = zv[i + 2 * step], d = zv[i + 3 * step];
    piece(head + i * kv, a);
    piece(head + (i + step) * kv, b);
    piece(head + (i + 2 * step) * kv, c);
    piece(head + (i + 3 * step) * kv, d);
  }
  for (; i < pieces; i += step) piece(head + i * kv, zv[i]);
}

// loss_r = logsumexp(z_r) - z_r[t_r];  dz_r = grad_scale (softmax(z_r) - onehot(t_r));
// t_r < 0: loss 0, gradient 0; t_r >= vocab: loss and gradient NaN (a kernel cannot throw).
// correct (optional): 1 where z_r[t_r] is larger than every other logit of the row (a tie is wrong), else 0
// (0 without a label).
// Two passes over the row (for_each_piece; rows need only be aligned to sizeof(T)): the max and the sum of
// exponentials together (each thread keeps a running max m_t and Σ exp(z - m_t), rescaled when m_t grows, once per
// piece, then the block combines Σ_t exp(m_t - max) sum_t), then the gradient. A NaN logit makes the row's sum, so
// its loss and gradient, NaN.
template <typename T>
__global__ void __launch_bounds__(kRowThreads) cross_entropy_kernel(T* logits, const int32_t* targets, int64_t rows,
                                                                     int64_t vocab, int64_t ld, double grad_scale,
                                                                     float* losses, float* correct) {
  constexpr int kv = kVec<T>;
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
    for_each_piece(
        static_cast<const T*>(z), vocab,
        [&](int64_t j, float zj) {
          if (j != target) m_other = fmaxf(m_other, zj);
          if (zj == -INFINITY) return;  // adds exp(-inf) = 0; -inf - -inf would be NaN
          if (zj > m) {
            sum *= exp(static_cast<double>(m) - zj);
            m = zj;
          }
          sum += expf(zj - m);
        },
        [&](int64_t j0, const uint4& u) {
          float v[kv];
          unpack<T>(u, v);
          float lm = -INFINITY;
          for (int k = 0; k < kv; ++k) {
            lm = fmaxf(lm, v[k]);
            if (j0 + k != target) m_other = fmaxf(m_other, v[k]);
          }
          if (lm > m) {
            sum *= exp(static_cast<double>(m) - lm);
            m = lm;
          }
          float s = 0.0f;
          for (int k = 0; k < kv; ++k)
            if (v[k] != -INFINITY) s += expf(v[k] - m);
          sum += s;
        });
    const float mx = block_reduce(m, MaxOp{}, -INFINITY);
    const float mx_other = correct ? block_reduce(m_other, MaxOp{}, -INFINITY) : 0.0f;  // uniform branch
    sum = m == -INFINITY ? 0.0 : sum * exp(static_cast<double>(m) - mx);
    sum = block_reduce(sum, SumOp{}, 0.0);
    const float scale = static_cast<float>(grad_scale / sum), gs = static_cast<float>(grad_scale);
    for_each_piece(
        static_cast<const T*>(z), vocab,
        [&](int64_t j, float zj) {
          const float g = expf(zj - mx) * scale;
          z[j] = from_f32<T>(j == target ? g - gs : g);
        },
        [&](int64_t j0, const uint4& u) {
          float v[kv];
          unpack<T>(u, v);
          for (int k = 0; k < kv; ++k) {
            const float g = expf(v[k] - mx) * scale;
            v[k] = j0 + k == target ? g - gs : g;
          }
          *reinterpret_cast<uint4*>(z + j0) = pack<T>(v);
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
  cross_entropy_kernel<T><<<static_cast<unsigned>(std::min<int64_t>(rows, 65536)), kRowThreads, 0, stream>>>(
      logits, targets, rows, vocab, ld, grad_scale, losses, correct);
  LLMT_CUDA_CHECK_LAUNCH();
}
template void cross_entropy(float*, const int32_t*, int64_t, int64_t, int64_t, double, float*, float*, cudaStream_t);
template void cross_entropy(__nv_bfloat16*, const int32_t*, int64_t, int64_t, int64_t, double, float*, float*,
                            cudaStream_t);

}  // namespace llmt::cuda
