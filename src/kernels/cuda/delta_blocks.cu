// The small blocks of the delta-rule layers (layers-delta.md §2.1-2.3, §4.1 steps 2-3, §5):
// short convolution + SiLU (also Mamba2's conv with its per-channel bias, layers-ssm-attn.md §1.4),
// L2 norm, gated RMSNorm, the decay gates (GDN/Comba per head, KDA per key channel, §4.3 steps 2-3)
// and the Comba gates (§4.2 steps 2-3), forward and backward. Semantics: src/kernels/cpu/{short_conv,
// l2norm,gated_rmsnorm,delta_gates,comba_gates}.h; arithmetic in double like the CPU reference. Parameter
// gradients (dw, dbias, dA_log, ddt_bias, ddecay, dD) are reduced deterministically: fixed-order partial
// sums, never atomics.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.cuh"

namespace llmt::cuda {
namespace {

__device__ double sigmoid_d(double x) { return 1.0 / (1.0 + exp(-x)); }

// Partial sums over fixed row ranges ("chunks"), as rmsnorm.cu: a block covers 32 columns
// (threadIdx.x, coalesced) and one chunk of rows, threadIdx.y strides the rows, and the 8
// row sums are added in y order; a final kernel adds the chunks in chunk order.
constexpr int kCols = 32, kRowThreads = 8, kMaxChunks = 256, kMinRowsPerChunk = 32;

int64_t row_chunks(int64_t rows) { return std::clamp<int64_t>(ceil_div(rows, kMinRowsPerChunk), 1, kMaxChunks); }

unsigned row_blocks(int64_t rows) { return static_cast<unsigned>(std::clamp<int64_t>(rows, 1, 65536)); }

// out[c] += Σ_k partial[k, c] over k = 0..chunks-1 (chunk order)
__global__ void add_partials_kernel(const double* partial, int64_t chunks, int64_t n, float* out) {
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < n; c += int64_t{gridDim.x} * blockDim.x) {
    double s = 0.0;
    for (int64_t k = 0; k < chunks; ++k) s += partial[k * n + c];
    out[c] = static_cast<float>(out[c] + s);
  }
}

// ---- short convolution + SiLU (§2.1) ----

// pre_t[c] = bias[c] + Σ_{i=0}^{W-1} w[c,i] x_{t-W+1+i}[c] (x_τ = 0 for τ < 0; no bias term when bias is
// null);  y_t = pre_t σ(pre_t)   (one thread per element)
__global__ void short_conv_fwd_kernel(const float* x, const float* w, const float* bias, int64_t batch,
                                      int64_t seq_len, int64_t channels, int64_t width, float* pre, float* y) {
  const int64_t n = batch * seq_len * channels;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n; idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = idx % channels, t = (idx / channels) % seq_len;
    const int64_t i0 = width - 1 - t > 0 ? width - 1 - t : 0;
    double acc = bias != nullptr ? static_cast<double>(bias[c]) : 0.0;
    for (int64_t i = i0; i < width; ++i)
      acc += static_cast<double>(w[c * width + i]) * x[idx + (i - width + 1) * channels];
    pre[idx] = static_cast<float>(acc);
    y[idx] = static_cast<float>(acc * sigmoid_d(acc));
  }
}

// ȳ = dy ∘ silu'(pre), silu'(z) = σ(z)(1 + z(1 - σ(z)))
__device__ double conv_ybar(const float* dy, const float* pre, int64_t j) {
  const double z = pre[j], sig = sigmoid_d(z);
  return static_cast<double>(dy[j]) * sig * (1.0 + z * (1.0 - sig));
}

// dx_τ[c] = Σ_i w[c,i] ȳ_{τ+W-1-i}[c] (terms past the end dropped)   (one thread per element)
__global__ void short_conv_bwd_dx_kernel(const float* dy, const float* w, const float* pre, int64_t batch,
                                         int64_t seq_len, int64_t channels, int64_t width, float* dx) {
  const int64_t n = batch * seq_len * channels;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n; idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = idx % channels, t = (idx / channels) % seq_len;
    const int64_t i_out = t + width - seq_len > 0 ? t + width - seq_len : 0;
    double acc = 0.0;
    for (int64_t i = i_out; i < width; ++i)
      acc += static_cast<double>(w[c * width + i]) * conv_ybar(dy, pre, idx + (width - 1 - i) * channels);
    dx[idx] = static_cast<float>(acc);
  }
}

// dw partials: partial[(i, chunk), c] = Σ_{rows (b,t) of the chunk, t-W+1+i >= 0} ȳ_t[c] x_{t-W+1+i}[c]
// (blockIdx.z = tap i; the rows are the B*T flattened (b, t)). blockIdx.z = W (launched only with a bias)
// gives the dbias partials bias_partial[chunk, c] = Σ_{rows of the chunk} ȳ_t[c].
__global__ void short_conv_bwd_dw_partial_kernel(const float* dy, const float* x, const float* pre, int64_t rows,
                                                 int64_t seq_len, int64_t channels, int64_t width,
                                                 int64_t rows_per_chunk, double* partial, double* bias_partial) {
  __shared__ double sums[kRowThreads][kCols];
  const int64_t c = int64_t{blockIdx.x} * kCols + threadIdx.x;
  const int64_t i = blockIdx.z;
  const bool bias_tap = i == width;
  const int64_t begin = blockIdx.y * rows_per_chunk;
  const int64_t end = begin + rows_per_chunk < rows ? begin + rows_per_chunk : rows;
  const int64_t shift = bias_tap ? 0 : width - 1 - i;  // input token = t - shift
  double s = 0.0;
  if (c < channels)
    for (int64_t r = begin + threadIdx.y; r < end; r += kRowThreads) {
      if (r % seq_len < shift) continue;
      const int64_t j = r * channels + c;
      s += conv_ybar(dy, pre, j) * (bias_tap ? 1.0 : static_cast<double>(x[j - shift * channels]));
    }
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < channels) {
    for (int k = 1; k < kRowThreads; ++k) s += sums[k][threadIdx.x];
    // layout [chunk, c * W + i] so that the final kernel adds into dw[c * W + i]
    if (bias_tap)
      bias_partial[blockIdx.y * channels + c] = s;
    else
      partial[blockIdx.y * channels * width + c * width + i] = s;
  }
}

// ---- L2 norm (§2.2) ----

// r = (Σ_c x_c^2 + eps)^(-1/2);  y = s x r   (one block per row)
__global__ void l2norm_fwd_kernel(const float* x, int64_t rows, int64_t dim, double eps, double scale, float* y,
                                  float* rinv) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * dim;
    double ss = 0.0;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) ss += static_cast<double>(xr[j]) * xr[j];
    ss = block_reduce(ss, SumOp{}, 0.0);
    const double ri = 1.0 / sqrt(ss + eps);
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x)
      y[r * dim + j] = static_cast<float>(scale * static_cast<double>(xr[j]) * ri);
    if (threadIdx.x == 0) rinv[r] = static_cast<float>(ri);
  }
}

// x̃ = y / s;  dx = r (s dy - (dy · y) x̃)   (one block per row)
__global__ void l2norm_bwd_kernel(const float* dy, const float* y, const float* rinv, int64_t rows, int64_t dim,
                                  double scale, float* dx) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* dyr = dy + r * dim;
    const float* yr = y + r * dim;
    double proj = 0.0;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) proj += static_cast<double>(dyr[j]) * yr[j];
    proj = block_reduce(proj, SumOp{}, 0.0);
    const double ri = rinv[r];
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
      const double xt = static_cast<double>(yr[j]) / scale;
      dx[r * dim + j] = static_cast<float>(ri * (scale * static_cast<double>(dyr[j]) - proj * xt));
    }
  }
}

// ---- gated RMSNorm (§2.3) ----

struct Gate {
  double phi, dphi;
};
// sigmoid: phi = σ(z), phi' = σ(1 - σ);  silu: phi = z σ(z), phi' = σ(1 + z(1 - σ))
__device__ Gate gate(double z, bool sigmoid_gate) {
  const double sig = sigmoid_d(z);
  if (sigmoid_gate) return {sig, sig * (1.0 - sig)};
  return {z * sig, sig * (1.0 + z * (1.0 - sig))};
}

// rho = (mean_c(o_c^2) + eps)^(-1/2);  y = o rho ∘ w ∘ phi(z)   (one block per row)
__global__ void gated_rmsnorm_fwd_kernel(const float* o, const float* z, const float* w, int64_t rows, int64_t dim,
                                         double eps, bool sigmoid_gate, float* y, float* rstd) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* orow = o + r * dim;
    double ss = 0.0;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) ss += static_cast<double>(orow[j]) * orow[j];
    ss = block_reduce(ss, SumOp{}, 0.0);
    const double rho = 1.0 / sqrt(ss / static_cast<double>(dim) + eps);
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x)
      y[r * dim + j] =
          static_cast<float>(static_cast<double>(orow[j]) * rho * w[j] * gate(z[r * dim + j], sigmoid_gate).phi);
    if (threadIdx.x == 0) rstd[r] = static_cast<float>(rho);
  }
}

// dz = dy ô w phi'(z);  dô = dy w phi(z);  do = rho (dô - ô (1/d) Σ_c dô_c ô_c)   (one block per row)
__global__ void gated_rmsnorm_bwd_kernel(const float* dy, const float* o, const float* z, const float* w,
                                         const float* rstd, int64_t rows, int64_t dim, bool sigmoid_gate, float* d_o,
                                         float* dz) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const double rho = rstd[r];
    double proj = 0.0;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
      const int64_t e = r * dim + j;
      const double ohat = static_cast<double>(o[e]) * rho;
      const Gate gt = gate(z[e], sigmoid_gate);
      const double d = dy[e];
      dz[e] = static_cast<float>(d * ohat * w[j] * gt.dphi);
      proj += d * w[j] * gt.phi * ohat;
    }
    proj = block_reduce(proj, SumOp{}, 0.0);
    const double mean_proj = proj / static_cast<double>(dim);
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
      const int64_t e = r * dim + j;
      const double dohat = static_cast<double>(dy[e]) * w[j] * gate(z[e], sigmoid_gate).phi;
      d_o[e] = static_cast<float>(rho * (dohat - static_cast<double>(o[e]) * rho * mean_proj));
    }
  }
}

// dw partials: partial[chunk, c] = Σ_{rows of the chunk} dy ô phi(z)
__global__ void gated_rmsnorm_dw_partial_kernel(const float* dy, const float* o, const float* z, const float* rstd,
                                                int64_t rows, int64_t dim, bool sigmoid_gate, int64_t rows_per_chunk,
                                                double* partial) {
  __shared__ double sums[kRowThreads][kCols];
  const int64_t c = int64_t{blockIdx.x} * kCols + threadIdx.x;
  const int64_t begin = blockIdx.y * rows_per_chunk;
  const int64_t end = begin + rows_per_chunk < rows ? begin + rows_per_chunk : rows;
  double s = 0.0;
  if (c < dim)
    for (int64_t r = begin + threadIdx.y; r < end; r += kRowThreads) {
      const int64_t e = r * dim + c;
      s += static_cast<double>(dy[e]) * (static_cast<double>(o[e]) * rstd[r]) * gate(z[e], sigmoid_gate).phi;
    }
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < dim) {
    for (int k = 1; k < kRowThreads; ++k) s += sums[k][threadIdx.x];
    partial[blockIdx.y * dim + c] = s;
  }
}

// ---- Decay gates: GDN / Comba (dim 1, §4.1 steps 2-3) and KDA (dim d_k, §4.3 steps 2-3); §5 ----

// softplus(x) = max(x, 0) + log1p(e^{-|x|})
__device__ double softplus_d(double x) { return fmax(x, 0.0) + log1p(exp(-fabs(x))); }

// g = -e^{A_log_h} softplus(a + dt_bias) per element of a [rows, heads * dim] (channel (h, c) uses A_log[h] and
// dt_bias[h * dim + c]); beta = σ(b) per element of b [rows, heads], written by the thread of channel c = 0.
// (one thread per element of a)
__global__ void decay_gates_fwd_kernel(const float* a, const float* b, const float* A_log, const float* dt_bias,
                                       int64_t rows, int64_t heads, int64_t dim, float* g, float* beta) {
  const int64_t n = rows * heads * dim;
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < n; j += int64_t{gridDim.x} * blockDim.x) {
    const int64_t hc = j % (heads * dim), hr = j / dim;  // channel in the row; index of (row, head)
    const double u = static_cast<double>(a[j]) + dt_bias[hc];
    g[j] = static_cast<float>(-exp(static_cast<double>(A_log[hc / dim])) * softplus_d(u));
    if (j % dim == 0) beta[hr] = static_cast<float>(sigmoid_d(b[hr]));
  }
}

// da = dg (-e^{A_log} σ(u));  ddt_bias[hc] += Σ_rows da;  partial_A[hc] = Σ_rows dg g (reduced per head by
// decay_gates_dA_kernel);  db = dβ β(1 - β) by the blocks of channel c = 0.
// (one block per channel hc; thread t takes rows t, t + blockDim, ... in order, then a fixed block reduction)
__global__ void decay_gates_bwd_kernel(const float* dg, const float* dbeta, const float* a, const float* b,
                                       const float* A_log, const float* dt_bias, int64_t rows, int64_t heads,
                                       int64_t dim, float* da, float* db, double* partial_A, float* ddt_bias) {
  const int64_t hc = blockIdx.x, h = hc / dim, width = heads * dim;
  const double A = exp(static_cast<double>(A_log[h]));
  double sA = 0.0, sdt = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const int64_t j = r * width + hc;
    const double u = static_cast<double>(a[j]) + dt_bias[hc];
    const double dau = static_cast<double>(dg[j]) * (-A * sigmoid_d(u));
    da[j] = static_cast<float>(dau);
    sA += static_cast<double>(dg[j]) * (-A * softplus_d(u));
    sdt += dau;
    if (hc % dim == 0) {
      const double be = sigmoid_d(b[r * heads + h]);
      db[r * heads + h] = static_cast<float>(static_cast<double>(dbeta[r * heads + h]) * be * (1.0 - be));
    }
  }
  sA = block_reduce(sA, SumOp{}, 0.0);
  sdt = block_reduce(sdt, SumOp{}, 0.0);
  if (threadIdx.x == 0) {
    partial_A[hc] = sA;
    ddt_bias[hc] = static_cast<float>(ddt_bias[hc] + sdt);
  }
}

// dA_log[h] += Σ_c partial_A[h * dim + c] in channel order   (one thread per head)
__global__ void decay_gates_dA_kernel(const double* partial_A, int64_t heads, int64_t dim, float* dA_log) {
  for (int64_t h = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; h < heads; h += int64_t{gridDim.x} * blockDim.x) {
    double s = 0.0;
    for (int64_t c = 0; c < dim; ++c) s += partial_A[h * dim + c];
    dA_log[h] = static_cast<float>(dA_log[h] + s);
  }
}

// ---- Comba gates (§4.2 steps 2-3, §5) ----

// s = σ(decay_h) (1 without inner decay);  p = s k;  q' = q - D_h s k (q without output correction).
// (one thread per element of [rows, heads * dim])
__global__ void comba_gates_fwd_kernel(const float* q, const float* k, const float* decay, const float* D,
                                       int64_t rows, int64_t heads, int64_t dim, float* q_out, float* p) {
  const int64_t n = rows * heads * dim;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n; idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t h = (idx / dim) % heads;
    const double s = decay != nullptr ? sigmoid_d(static_cast<double>(decay[h])) : 1.0;
    const double c = D != nullptr ? static_cast<double>(D[h]) * s : 0.0;
    const double kv = k[idx];
    p[idx] = static_cast<float>(s * kv);
    q_out[idx] = static_cast<float>(static_cast<double>(q[idx]) - c * kv);
  }
}

// One block per head h: dk += s dp - D s dq' (elementwise); Σ k·dp and Σ k·dq' over the head's rows and
// dim by a fixed thread stride and a fixed-tree block reduction; then ddecay += s(1-s)(Σ k·dp - D Σ k·dq'),
// dD += -s Σ k·dq' (thread 0).
__global__ void comba_gates_bwd_kernel(const float* dq_out, const float* dp, const float* k, const float* decay,
                                       const float* D, int64_t rows, int64_t heads, int64_t dim, float* dk,
                                       float* ddecay, float* dD) {
  const int64_t h = blockIdx.x;
  const double s = decay != nullptr ? sigmoid_d(static_cast<double>(decay[h])) : 1.0;
  const double Dh = D != nullptr ? static_cast<double>(D[h]) : 0.0;
  double k_dp = 0.0, k_dq = 0.0;
  for (int64_t e = threadIdx.x; e < rows * dim; e += blockDim.x) {
    const int64_t r = e / dim, i = e % dim, j = (r * heads + h) * dim + i;
    const double kv = k[j], dpv = dp[j], dqv = dq_out[j];
    k_dp += kv * dpv;
    k_dq += kv * dqv;
    dk[j] = static_cast<float>(static_cast<double>(dk[j]) + s * dpv - Dh * s * dqv);
  }
  k_dp = block_reduce(k_dp, SumOp{}, 0.0);
  k_dq = block_reduce(k_dq, SumOp{}, 0.0);
  if (threadIdx.x == 0) {
    if (ddecay != nullptr)
      ddecay[h] = static_cast<float>(static_cast<double>(ddecay[h]) + s * (1.0 - s) * (k_dp - Dh * k_dq));
    if (dD != nullptr) dD[h] = static_cast<float>(static_cast<double>(dD[h]) - s * k_dq);
  }
}

}  // namespace

void short_conv_silu_fwd(const float* x, const float* w, const float* bias, int64_t batch, int64_t seq_len,
                         int64_t channels, int64_t width, float* pre, float* y, cudaStream_t stream) {
  const int64_t n = batch * seq_len * channels;
  if (n == 0) return;
  short_conv_fwd_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, w, bias, batch, seq_len, channels, width, pre, y);
  LLMT_CUDA_CHECK_LAUNCH();
}

size_t short_conv_silu_bwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t channels, int64_t width) {
  return sizeof(double) * static_cast<size_t>(row_chunks(batch * seq_len) * channels * (width + 1));
}

void short_conv_silu_bwd(const float* dy, const float* x, const float* w, const float* pre, int64_t batch,
                         int64_t seq_len, int64_t channels, int64_t width, float* dx, float* dw, float* dbias,
                         void* scratch, cudaStream_t stream) {
  const int64_t rows = batch * seq_len, n = rows * channels;
  if (n == 0) return;
  short_conv_bwd_dx_kernel<<<grid_for(n), kThreads, 0, stream>>>(dy, w, pre, batch, seq_len, channels, width, dx);
  LLMT_CUDA_CHECK_LAUNCH();
  const int64_t chunks = row_chunks(rows), rows_per_chunk = ceil_div(rows, chunks);
  auto* partial = static_cast<double*>(scratch);
  double* bias_partial = partial + chunks * channels * width;
  const dim3 grid(static_cast<unsigned>(ceil_div(channels, kCols)), static_cast<unsigned>(chunks),
                  static_cast<unsigned>(width + (dbias != nullptr ? 1 : 0)));
  short_conv_bwd_dw_partial_kernel<<<grid, dim3(kCols, kRowThreads), 0, stream>>>(
      dy, x, pre, rows, seq_len, channels, width, rows_per_chunk, partial, bias_partial);
  LLMT_CUDA_CHECK_LAUNCH();
  add_partials_kernel<<<grid_for(channels * width), kThreads, 0, stream>>>(partial, chunks, channels * width, dw);
  LLMT_CUDA_CHECK_LAUNCH();
  if (dbias == nullptr) return;
  add_partials_kernel<<<grid_for(channels), kThreads, 0, stream>>>(bias_partial, chunks, channels, dbias);
  LLMT_CUDA_CHECK_LAUNCH();
}

void l2norm_fwd(const float* x, int64_t rows, int64_t dim, double eps, double scale, float* y, float* rinv,
                cudaStream_t stream) {
  if (rows == 0) return;
  l2norm_fwd_kernel<<<row_blocks(rows), kThreads, 0, stream>>>(x, rows, dim, eps, scale, y, rinv);
  LLMT_CUDA_CHECK_LAUNCH();
}

void l2norm_bwd(const float* dy, const float* y, const float* rinv, int64_t rows, int64_t dim, double scale,
                float* dx, cudaStream_t stream) {
  if (rows == 0) return;
  l2norm_bwd_kernel<<<row_blocks(rows), kThreads, 0, stream>>>(dy, y, rinv, rows, dim, scale, dx);
  LLMT_CUDA_CHECK_LAUNCH();
}

void gated_rmsnorm_fwd(const float* o, const float* z, const float* w, int64_t rows, int64_t dim, double eps,
                       bool sigmoid_gate, float* y, float* rstd, cudaStream_t stream) {
  if (rows == 0) return;
  gated_rmsnorm_fwd_kernel<<<row_blocks(rows), kThreads, 0, stream>>>(o, z, w, rows, dim, eps, sigmoid_gate, y,
                                                                      rstd);
  LLMT_CUDA_CHECK_LAUNCH();
}

size_t gated_rmsnorm_bwd_scratch_bytes(int64_t rows, int64_t dim) {
  return sizeof(double) * static_cast<size_t>(row_chunks(rows) * dim);
}

void gated_rmsnorm_bwd(const float* dy, const float* o, const float* z, const float* w, const float* rstd,
                       int64_t rows, int64_t dim, bool sigmoid_gate, float* d_o, float* dz, float* dw, void* scratch,
                       cudaStream_t stream) {
  if (rows == 0 || dim == 0) return;
  gated_rmsnorm_bwd_kernel<<<row_blocks(rows), kThreads, 0, stream>>>(dy, o, z, w, rstd, rows, dim, sigmoid_gate,
                                                                      d_o, dz);
  LLMT_CUDA_CHECK_LAUNCH();
  const int64_t chunks = row_chunks(rows), rows_per_chunk = ceil_div(rows, chunks);
  auto* partial = static_cast<double*>(scratch);
  const dim3 grid(static_cast<unsigned>(ceil_div(dim, kCols)), static_cast<unsigned>(chunks));
  gated_rmsnorm_dw_partial_kernel<<<grid, dim3(kCols, kRowThreads), 0, stream>>>(dy, o, z, rstd, rows, dim,
                                                                                 sigmoid_gate, rows_per_chunk, partial);
  LLMT_CUDA_CHECK_LAUNCH();
  add_partials_kernel<<<grid_for(dim), kThreads, 0, stream>>>(partial, chunks, dim, dw);
  LLMT_CUDA_CHECK_LAUNCH();
}

void decay_gates_fwd(const float* a, const float* b, const float* A_log, const float* dt_bias, int64_t rows,
                     int64_t heads, int64_t dim, float* g, float* beta, cudaStream_t stream) {
  const int64_t n = rows * heads * dim;
  if (n == 0) return;
  decay_gates_fwd_kernel<<<grid_for(n), kThreads, 0, stream>>>(a, b, A_log, dt_bias, rows, heads, dim, g, beta);
  LLMT_CUDA_CHECK_LAUNCH();
}

size_t decay_gates_bwd_scratch_bytes(int64_t heads, int64_t dim) {
  return sizeof(double) * static_cast<size_t>(heads * dim);
}

void decay_gates_bwd(const float* dg, const float* dbeta, const float* a, const float* b, const float* A_log,
                     const float* dt_bias, int64_t rows, int64_t heads, int64_t dim, float* da, float* db,
                     float* dA_log, float* ddt_bias, void* scratch, cudaStream_t stream) {
  if (heads * dim == 0) return;
  double* partial_A = static_cast<double*>(scratch);
  decay_gates_bwd_kernel<<<static_cast<unsigned>(heads * dim), kThreads, 0, stream>>>(
      dg, dbeta, a, b, A_log, dt_bias, rows, heads, dim, da, db, partial_A, ddt_bias);
  LLMT_CUDA_CHECK_LAUNCH();
  decay_gates_dA_kernel<<<grid_for(heads), kThreads, 0, stream>>>(partial_A, heads, dim, dA_log);
  LLMT_CUDA_CHECK_LAUNCH();
}

void comba_gates_fwd(const float* q, const float* k, const float* decay, const float* D, int64_t rows,
                     int64_t heads, int64_t dim, float* q_out, float* p, cudaStream_t stream) {
  const int64_t n = rows * heads * dim;
  if (n == 0) return;
  comba_gates_fwd_kernel<<<grid_for(n), kThreads, 0, stream>>>(q, k, decay, D, rows, heads, dim, q_out, p);
  LLMT_CUDA_CHECK_LAUNCH();
}

void comba_gates_bwd(const float* dq_out, const float* dp, const float* k, const float* decay, const float* D,
                     int64_t rows, int64_t heads, int64_t dim, float* dk, float* ddecay, float* dD,
                     cudaStream_t stream) {
  if (heads == 0) return;
  comba_gates_bwd_kernel<<<static_cast<unsigned>(heads), kThreads, 0, stream>>>(dq_out, dp, k, decay, D, rows, heads,
                                                                                dim, dk, ddecay, dD);
  LLMT_CUDA_CHECK_LAUNCH();
}

}  // namespace llmt::cuda
