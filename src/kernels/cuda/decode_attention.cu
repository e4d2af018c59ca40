// Causal attention through a KV cache (ops.cuh attention_decode; semantics: cpu::attention_decode,
// layers-ssm-attn.md §3.3): the new keys and values are stored into the cache, then one block per query
// (b, t, h) runs an online softmax over cache positions 0 .. position + t in tiles of the block's width.
// Storage float or bf16; arithmetic fp32; fixed reduction order (deterministic).
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.cuh"

namespace llmt::cuda {
namespace {

constexpr int kAttnThreads = 128;

// cache[b, position + t, h, :] = new[b, t, h, :] for k and v.   (grid-stride over the new elements)
template <typename T>
__global__ void cache_store_kernel(const T* k, const T* v, int64_t batch, int64_t seq_len, int64_t heads,
                                   int64_t head_dim, int64_t capacity, int64_t position, T* k_cache, T* v_cache) {
  const int64_t n = batch * seq_len * heads * head_dim;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n; idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t d = idx % head_dim, h = (idx / head_dim) % heads, bt = idx / (head_dim * heads);
    const int64_t t = bt % seq_len, b = bt / seq_len;
    const int64_t slot = ((b * capacity + position + t) * heads + h) * head_dim + d;
    k_cache[slot] = k[idx];
    v_cache[slot] = v[idx];
  }
}

// Per tile of cache positions: thread i scores position s0 + i; m' = max(m, tile max); p = exp(score - m');
// l = l e^{m - m'} + Σ p; acc[d] = acc[d] e^{m - m'} + Σ_s p_s v_s[d] (thread d of the block); o = acc / l.
template <typename T>
__global__ void attention_decode_kernel(const T* q, const T* k_cache, const T* v_cache, int64_t seq_len,
                                        int64_t heads, int64_t head_dim, int64_t capacity, int64_t position,
                                        float scale, T* o) {
  extern __shared__ float smem[];
  float *qs = smem, *acc = qs + head_dim, *ps = acc + head_dim;
  const int64_t h = blockIdx.x, t = blockIdx.y, b = blockIdx.z, row = ((b * seq_len + t) * heads + h) * head_dim;
  const int tid = threadIdx.x;
  for (int64_t d = tid; d < head_dim; d += blockDim.x) {
    qs[d] = to_f32(q[row + d]);
    acc[d] = 0.0f;
  }
  __syncthreads();
  const int64_t len = position + t + 1;
  const auto at = [&](const T* cache, int64_t s) { return cache + ((b * capacity + s) * heads + h) * head_dim; };
  float m = -INFINITY, l = 0.0f;
  for (int64_t s0 = 0; s0 < len; s0 += blockDim.x) {
    const int64_t s = s0 + tid;
    float score = -INFINITY;
    if (s < len) {
      const T* ks = at(k_cache, s);
      float dot = 0.0f;
      for (int64_t d = 0; d < head_dim; ++d) dot += qs[d] * to_f32(ks[d]);
      score = scale * dot;
    }
    const float m_new = fmaxf(m, block_reduce(score, MaxOp{}, -INFINITY));
    const float p = s < len ? expf(score - m_new) : 0.0f, corr = expf(m - m_new);
    ps[tid] = p;
    l = l * corr + block_reduce(p, SumOp{}, 0.0f);  // its barriers publish ps
    const int64_t n = std::min<int64_t>(blockDim.x, len - s0);
    for (int64_t d = tid; d < head_dim; d += blockDim.x) {
      float a = acc[d] * corr;
      for (int64_t j = 0; j < n; ++j) a += ps[j] * to_f32(at(v_cache, s0 + j)[d]);
      acc[d] = a;
    }
    m = m_new;
    __syncthreads();  // ps is read before the next tile rewrites it
  }
  for (int64_t d = tid; d < head_dim; d += blockDim.x) o[row + d] = from_f32<T>(acc[d] / l);
}

}  // namespace

template <typename T>
void attention_decode(const T* q, const T* k, const T* v, int64_t batch, int64_t seq_len, int64_t heads,
                      int64_t head_dim, int64_t capacity, int64_t position, double scale, T* k_cache, T* v_cache,
                      T* o, cudaStream_t stream) {
  check(position >= 0 && position + seq_len <= capacity, "attention_decode: positions {} .. {} outside the cache of {}",
        position, position + seq_len - 1, capacity);
  const int64_t n = batch * seq_len * heads * head_dim;
  if (n == 0) return;
  const size_t smem = sizeof(float) * static_cast<size_t>(2 * head_dim + kAttnThreads);
  check(smem <= 48 * 1024, "attention_decode: head_dim {} needs {} bytes of shared memory", head_dim, smem);
  cache_store_kernel<<<grid_for(n), kThreads, 0, stream>>>(k, v, batch, seq_len, heads, head_dim, capacity, position,
                                                           k_cache, v_cache);
  LLMT_CUDA_CHECK_LAUNCH();
  const dim3 grid(static_cast<unsigned>(heads), static_cast<unsigned>(seq_len), static_cast<unsigned>(batch));
  attention_decode_kernel<<<grid, kAttnThreads, smem, stream>>>(q, k_cache, v_cache, seq_len, heads, head_dim,
                                                                capacity, position, static_cast<float>(scale), o);
  LLMT_CUDA_CHECK_LAUNCH();
}

#define LLMT_INSTANTIATE_ATTENTION_DECODE(T)                                                                   \
  template void attention_decode(const T*, const T*, const T*, int64_t, int64_t, int64_t, int64_t, int64_t, \
                                 int64_t, double, T*, T*, T*, cudaStream_t);
LLMT_INSTANTIATE_ATTENTION_DECODE(float)
LLMT_INSTANTIATE_ATTENTION_DECODE(__nv_bfloat16)

}  // namespace llmt::cuda
