// The recurrent decode ops (ops.cuh "decode.cu"; semantics: the CPU backend's *_decode ops, kernels/backend.h):
// the short convolution continuing its window, the delta-rule cores (GDN, KDA, Comba, MDN) and the Mamba2 SSD
// continuing a carried state, token by token. T > 1 (a prompt's prefill) runs the same one-token update T times
// inside one launch: the recurrence is exact (the CPU ops' chunked forms equal it up to rounding), the state
// stays on chip between tokens, and the blocks over (batch, head, value tile) run in parallel. fp32 throughout
// (GDN's and Comba's q, k, v, p and the short conv's output may be stored in bf16: read / rounded at the edges).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.cuh"

namespace llmt::cuda {
namespace {

// ---- short convolution + SiLU (cpu::short_conv_silu_step) ----

// u = [window; x] per (b, c): y_t = silu(bias + Σ_i w_i u_{t+i}); the window becomes u's last W - 1 entries.
// (one thread per (b, c); the window is rewritten in increasing order, each entry read from further ahead; y stored
// as TY: float, or bf16 rounded from the float)
template <typename TY>
__global__ void short_conv_decode_kernel(const float* x, const float* w, const float* bias, int64_t batch,
                                         int64_t seq_len, int64_t channels, int64_t width, float* window, TY* y) {
  const int64_t hist = width - 1, n = batch * channels;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n; idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t b = idx / channels, c = idx % channels;
    float* win = window + b * hist * channels;
    const float* xb = x + b * seq_len * channels;
    const auto u = [&](int64_t i) { return i < hist ? win[i * channels + c] : xb[(i - hist) * channels + c]; };
    for (int64_t t = 0; t < seq_len; ++t) {
      float acc = bias != nullptr ? bias[c] : 0.0f;
      for (int64_t i = 0; i < width; ++i) acc += w[c * width + i] * u(t + i);
      y[(b * seq_len + t) * channels + c] = from_f32<TY>(acc / (1.0f + expf(-acc)));
    }
    for (int64_t i = 0; i < hist; ++i) win[i * channels + c] = u(seq_len + i);
  }
}

// ---- delta-rule cores ----

enum class Delta { gdn, kda, comba, mdn };

// Value columns per block and row groups (the block is kCols x kRowGroups threads).
constexpr int kCols = 16, kRowGroups = 16;

// E: the element type of q, k, v, p (float; GDN and Comba also __nv_bfloat16, read as fp32).
template <typename E>
struct DeltaArgs {
  const E *q, *k, *v, *p;                                // p: Comba only
  const float *g, *beta, *log_mu, *eta;                  // log_mu, eta: MDN only
  float *state, *momentum, *o;                           // momentum: MDN only
  int64_t B, T, H, K, V;
};

// Σ over the block's rows of each column's partial sums, in a fixed order; every thread of the column gets it.
// Reached by all threads; ends with a barrier, so the caller may then overwrite what fed `partial`.
__device__ float column_sum(float partial, float* part, float* colv) {
  part[threadIdx.y * kCols + threadIdx.x] = partial;
  __syncthreads();
  if (threadIdx.y == 0) {
    float s = 0.0f;
    for (int r = 0; r < kRowGroups; ++r) s += part[r * kCols + threadIdx.x];
    colv[threadIdx.x] = s;
  }
  __syncthreads();
  return colv[threadIdx.x];
}

// One block per (value tile, head, batch); thread (x, y) owns column j = tile kCols + x and the key rows
// c ≡ y (mod kRowGroups) of S (and M) in shared memory. Per token (S̄ the decayed state; layers-delta.md §4, mdn.md §5):
//   GDN / KDA:  S̄ = α S (KDA: per key channel);  S = S̄ + k (β (v - S̄^T k))^T
//   Comba:      r = v - S^T p;                    S = α S + β k r^T
//   MDN:        ṽ = v - S^T (α k);  M = μ M - (η k) ṽ^T;  S = α S - β M
// then o = S^T q.
template <Delta kind, typename E>
__global__ void delta_decode_kernel(DeltaArgs<E> a) {
  extern __shared__ float smem[];
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * kCols + tx;
  const int64_t K = a.K, V = a.V, h = blockIdx.y, b = blockIdx.z, j = int64_t{blockIdx.x} * kCols + tx;
  const bool col = j < V;
  constexpr bool kMom = kind == Delta::mdn;
  float* S = smem;                               // [K, kCols]
  float* M = S + K * kCols;                      // [K, kCols] (MDN)
  float* vec = M + (kMom ? K * kCols : 0);       // q, k, and p (Comba) or g (KDA): [3, K]
  float* part = vec + 3 * K;                     // [kRowGroups, kCols]
  float* colv = part + kRowGroups * kCols;       // [kCols]
  const int64_t carry = (b * a.H + h) * K * V;
  for (int64_t c = ty; c < K; c += kRowGroups) {
    S[c * kCols + tx] = col ? a.state[carry + c * V + j] : 0.0f;
    if (kMom) M[c * kCols + tx] = col ? a.momentum[carry + c * V + j] : 0.0f;
  }
  const float *q = vec, *k = vec + K, *x2 = vec + 2 * K;
  for (int64_t t = 0; t < a.T; ++t) {
    const int64_t tok = (b * a.T + t) * a.H + h;
    for (int64_t i = tid; i < K; i += kCols * kRowGroups) {
      vec[i] = to_f32(a.q[tok * K + i]);
      vec[K + i] = to_f32(a.k[tok * K + i]);
      if (kind == Delta::comba) vec[2 * K + i] = to_f32(a.p[tok * K + i]);
      if (kind == Delta::kda) vec[2 * K + i] = a.g[tok * K + i];
    }
    __syncthreads();
    const float beta = a.beta[tok];
    const float alpha = kind == Delta::kda ? 1.0f : expf(a.g[tok]);
    if (kind == Delta::gdn || kind == Delta::kda)
      for (int64_t c = ty; c < K; c += kRowGroups) S[c * kCols + tx] *= kind == Delta::kda ? expf(x2[c]) : alpha;
    // The prediction S^T (read key): k (GDN, KDA), p (Comba), α k (MDN).
    float acc = 0.0f;
    for (int64_t c = ty; c < K; c += kRowGroups) acc += S[c * kCols + tx] * (kind == Delta::comba ? x2[c] : k[c]);
    if (kMom) acc *= alpha;
    const float err = (col ? to_f32(a.v[tok * V + j]) : 0.0f) - column_sum(acc, part, colv);
    if (kind == Delta::gdn || kind == Delta::kda) {
      const float d = beta * err;
      for (int64_t c = ty; c < K; c += kRowGroups) S[c * kCols + tx] += k[c] * d;
    } else if (kind == Delta::comba) {
      for (int64_t c = ty; c < K; c += kRowGroups) S[c * kCols + tx] = alpha * S[c * kCols + tx] + beta * k[c] * err;
    } else {
      const float mu = expf(a.log_mu[tok]), eta = a.eta[tok];
      for (int64_t c = ty; c < K; c += kRowGroups) {
        const float m = mu * M[c * kCols + tx] - eta * k[c] * err;
        M[c * kCols + tx] = m;
        S[c * kCols + tx] = alpha * S[c * kCols + tx] - beta * m;
      }
    }
    acc = 0.0f;
    for (int64_t c = ty; c < K; c += kRowGroups) acc += S[c * kCols + tx] * q[c];
    const float out = column_sum(acc, part, colv);
    if (ty == 0 && col) a.o[tok * V + j] = out;
  }
  for (int64_t c = ty; c < K; c += kRowGroups)
    if (col) {
      a.state[carry + c * V + j] = S[c * kCols + tx];
      if (kMom) a.momentum[carry + c * V + j] = M[c * kCols + tx];
    }
}

template <Delta kind, typename E>
void delta_decode(const DeltaArgs<E>& a, cudaStream_t stream) {
  const size_t smem = sizeof(float) * static_cast<size_t>(a.K * kCols * (kind == Delta::mdn ? 2 : 1) + 3 * a.K +
                                                          kRowGroups * kCols + kCols);
  check(smem <= 48 * 1024, "delta-rule decode: key dim {} needs {} bytes of shared memory (at most 49152)", a.K,
        smem);
  if (a.B * a.H * a.V == 0) return;
  const dim3 grid(static_cast<unsigned>(ceil_div(a.V, kCols)), static_cast<unsigned>(a.H), static_cast<unsigned>(a.B));
  delta_decode_kernel<kind, E><<<grid, dim3(kCols, kRowGroups), smem, stream>>>(a);
  LLMT_CUDA_CHECK_LAUNCH();
}

// ---- Mamba2 SSD (cpu::mamba2_ssd_fwd with a state; layers-ssm-attn.md §2.2, §2.8) ----

// One block per (b, h); the state [P, N] in global memory, element (p, n) owned by one thread. Per token:
// Δ = softplus(dt_raw + dt_bias), α = exp(Δ A), A = -exp(A_log); S = α S + Δ x B^T; y = S C + D x. xbc and y fp32 or
// bf16 (E; xbc read as fp32, y rounded once from the fp32 sum; the state fp32).
template <typename E>
__global__ void mamba2_decode_kernel(const E* xbc, const float* dt_raw, const float* dt_bias, const float* A_log,
                                     const float* D, int64_t T, int64_t H, int64_t P, int64_t N, int64_t G,
                                     float* state, E* y) {
  extern __shared__ float smem[];
  float *xs = smem, *bs = xs + P, *cs = bs + N;
  const int64_t h = blockIdx.x, b = blockIdx.y, g = h / (H / G), XD = H * P, width = XD + 2 * G * N;
  float* S = state + (b * H + h) * P * N;
  const float A = -expf(A_log[h]), Dh = D[h];
  for (int64_t t = 0; t < T; ++t) {
    const int64_t row = b * T + t;
    const E* u = xbc + row * width;
    for (int64_t i = threadIdx.x; i < P; i += blockDim.x) xs[i] = to_f32(u[h * P + i]);
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
      bs[i] = to_f32(u[XD + g * N + i]);
      cs[i] = to_f32(u[XD + G * N + g * N + i]);
    }
    const float v = dt_raw[row * H + h] + dt_bias[h];
    const float dt = v > 20.0f ? v : log1pf(expf(v)), alpha = expf(dt * A);
    __syncthreads();
    for (int64_t i = threadIdx.x; i < P * N; i += blockDim.x) S[i] = alpha * S[i] + dt * xs[i / N] * bs[i % N];
    __syncthreads();
    for (int64_t p = threadIdx.x; p < P; p += blockDim.x) {
      float acc = Dh * xs[p];
      for (int64_t n = 0; n < N; ++n) acc += S[p * N + n] * cs[n];
      y[row * XD + h * P + p] = from_f32<E>(acc);
    }
    __syncthreads();
  }
}

}  // namespace

template <typename TY>
void short_conv_silu_decode(const float* x, const float* w, const float* bias, int64_t batch, int64_t seq_len,
                            int64_t channels, int64_t width, float* window, TY* y, cudaStream_t stream) {
  check(width >= 1, "short_conv: width must be >= 1, got {}", width);
  const int64_t n = batch * channels;
  if (n == 0) return;
  short_conv_decode_kernel<TY><<<grid_for(n), kThreads, 0, stream>>>(x, w, bias, batch, seq_len, channels, width,
                                                                     window, y);
  LLMT_CUDA_CHECK_LAUNCH();
}
template void short_conv_silu_decode(const float*, const float*, const float*, int64_t, int64_t, int64_t, int64_t,
                                     float*, float*, cudaStream_t);
template void short_conv_silu_decode(const float*, const float*, const float*, int64_t, int64_t, int64_t, int64_t,
                                     float*, __nv_bfloat16*, cudaStream_t);

template <typename E>
void gdn_decode(const E* q, const E* k, const E* v, const float* g, const float* beta, int64_t batch, int64_t seq_len,
                int64_t heads, int64_t key_dim, int64_t value_dim, float* state, float* o, cudaStream_t stream) {
  delta_decode<Delta::gdn, E>({q, k, v, nullptr, g, beta, nullptr, nullptr, state, nullptr, o, batch, seq_len, heads,
                               key_dim, value_dim},
                              stream);
}
template void gdn_decode(const float*, const float*, const float*, const float*, const float*, int64_t, int64_t,
                         int64_t, int64_t, int64_t, float*, float*, cudaStream_t);
template void gdn_decode(const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, const float*, const float*,
                         int64_t, int64_t, int64_t, int64_t, int64_t, float*, float*, cudaStream_t);

void kda_decode(const float* q, const float* k, const float* v, const float* g, const float* beta, int64_t batch,
                int64_t seq_len, int64_t heads, int64_t key_dim, int64_t value_dim, float* state, float* o,
                cudaStream_t stream) {
  delta_decode<Delta::kda, float>({q, k, v, nullptr, g, beta, nullptr, nullptr, state, nullptr, o, batch, seq_len,
                                   heads, key_dim, value_dim},
                                  stream);
}

template <typename E>
void comba_decode(const E* q, const E* k, const E* v, const E* p, const float* g, const float* beta, int64_t batch,
                  int64_t seq_len, int64_t heads, int64_t key_dim, int64_t value_dim, float* state, float* o,
                  cudaStream_t stream) {
  delta_decode<Delta::comba, E>({q, k, v, p, g, beta, nullptr, nullptr, state, nullptr, o, batch, seq_len, heads,
                                 key_dim, value_dim},
                                stream);
}
template void comba_decode(const float*, const float*, const float*, const float*, const float*, const float*, int64_t,
                           int64_t, int64_t, int64_t, int64_t, float*, float*, cudaStream_t);
template void comba_decode(const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                           const float*, const float*, int64_t, int64_t, int64_t, int64_t, int64_t, float*, float*,
                           cudaStream_t);

void mdn_decode(const float* q, const float* k, const float* v, const float* log_alpha, const float* beta,
                const float* log_mu, const float* eta, int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim,
                int64_t value_dim, float* state, float* momentum, float* o, cudaStream_t stream) {
  delta_decode<Delta::mdn, float>({q, k, v, nullptr, log_alpha, beta, log_mu, eta, state, momentum, o, batch,
                                   seq_len, heads, key_dim, value_dim},
                                  stream);
}

template <typename E>
void mamba2_ssd_decode(const E* xbc, const float* dt_raw, const float* dt_bias, const float* A_log, const float* D,
                       int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim, int64_t state_dim,
                       int64_t groups, float* state, E* y, cudaStream_t stream) {
  check(groups >= 1 && heads % groups == 0, "mamba2: n_groups ({}) must divide the number of heads ({})", groups,
        heads);
  if (batch * heads == 0) return;
  const size_t smem = sizeof(float) * static_cast<size_t>(head_dim + 2 * state_dim);
  check(smem <= 48 * 1024, "mamba2_ssd_decode: head_dim {} and d_state {} need {} bytes of shared memory", head_dim,
        state_dim, smem);
  mamba2_decode_kernel<E><<<dim3(static_cast<unsigned>(heads), static_cast<unsigned>(batch)), kThreads, smem,
                             stream>>>(xbc, dt_raw, dt_bias, A_log, D, seq_len, heads, head_dim, state_dim, groups,
                                       state, y);
  LLMT_CUDA_CHECK_LAUNCH();
}
template void mamba2_ssd_decode(const float*, const float*, const float*, const float*, const float*, int64_t,
                                int64_t, int64_t, int64_t, int64_t, int64_t, float*, float*, cudaStream_t);
template void mamba2_ssd_decode(const __nv_bfloat16*, const float*, const float*, const float*, const float*,
                                int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float*, __nv_bfloat16*,
                                cudaStream_t);

}  // namespace llmt::cuda
