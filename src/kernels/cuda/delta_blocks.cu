// The small blocks of the delta-rule layers (layers-delta.md §2.1-2.3, §4.1 steps 2-3, §5):
// short convolution + SiLU (also Mamba2's conv with its per-channel bias, layers-ssm-attn.md §1.4),
// L2 norm, gated RMSNorm, the decay gates (GDN/Comba per head, KDA per key channel, §4.3 steps 2-3)
// and the Comba gates (§4.2 steps 2-3), forward and backward. Semantics: src/kernels/cpu/{short_conv,
// l2norm,gated_rmsnorm,delta_gates,comba_gates}.h; arithmetic in double like the CPU reference. Parameter
// gradients (dw, dbias, dA_log, ddt_bias, ddecay, dD) are reduced deterministically: fixed-order partial
// sums, never atomics.
#include <type_traits>

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


// out[c] += Σ_k partial[k, c] over k = 0..chunks-1 (chunk order)
__global__ void add_partials_kernel(const double* partial, int64_t chunks, int64_t n, float* out) {
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < n; c += int64_t{gridDim.x} * blockDim.x) {
    double s = 0.0;
    for (int64_t k = 0; k < chunks; ++k) s += partial[k * n + c];
    out[c] = static_cast<float>(out[c] + s);
  }
}

// ---- short convolution + SiLU (§2.1) ----
// A thread walks one channel c through a run of kConvRun tokens of one sequence (grid x: (batch, run), grid y:
// blocks of kThreads channels), so the element index needs no division and a warp's loads of a token row are
// coalesced; the last W - 1 inputs (forward) or the next W - 1 values of ȳ (backward) stay in registers, so every
// x, dy, pre element is read once and silu' is evaluated once per element (plus W - 1 per run in the backward).
constexpr int64_t kConvRun = 32;

// Runs of kConvRun tokens per sequence, and the grid of the conv kernels.
int64_t conv_runs(int64_t seq_len) { return ceil_div(seq_len, kConvRun); }
dim3 conv_grid(int64_t batch, int64_t seq_len, int64_t channels) {
  return dim3(static_cast<unsigned>(batch * conv_runs(seq_len)), static_cast<unsigned>(ceil_div(channels, kThreads)));
}

// The thread's channel c, and its run [t0, t1) of sequence b: x_t[c] at seq[t * channels].
struct ConvRun {
  int64_t c, t0, t1, seq;
  __device__ ConvRun(int64_t seq_len, int64_t channels) {
    const int64_t runs = (seq_len + kConvRun - 1) / kConvRun, b = blockIdx.x / runs;
    c = int64_t{blockIdx.y} * blockDim.x + threadIdx.x;
    t0 = (blockIdx.x - b * runs) * kConvRun;
    t1 = t0 + kConvRun < seq_len ? t0 + kConvRun : seq_len;
    seq = b * seq_len * channels + c;
  }
};

// w[c, 0..W-1] into registers: wr[i] = w[c, i], or reversed, wr[j] = w[c, W-1-j].
template <int W>
__device__ void conv_taps(const float* __restrict__ w, int64_t c, bool reversed, double (&wr)[W]) {
#pragma unroll
  for (int i = 0; i < W; ++i) wr[i] = static_cast<double>(w[c * W + (reversed ? W - 1 - i : i)]);
}

// The ring of inputs before the run: xr[k] = x_{t0-1-k}[c] for k < W - 1 (0 before the sequence), so that after
// the shift at token t0, xr[j] = x_{t0-j}.
template <int W>
__device__ void conv_inputs_before(const float* __restrict__ x, const ConvRun& run, int64_t channels,
                                   double (&xr)[W]) {
#pragma unroll
  for (int k = 0; k < W; ++k)
    xr[k] = k < W - 1 && run.t0 - 1 - k >= 0 ? x[run.seq + (run.t0 - 1 - k) * channels] : 0.0;
}

// pre_t[c] = bias[c] + Σ_{i=0}^{W-1} w[c,i] x_{t-W+1+i}[c] (terms with t-W+1+i < 0 skipped; no bias term when bias
// is null; i ascending, in double);  y_t = pre_t σ(pre_t).  xr[j] = x_{t-j}, so tap i = W-1-j (j descending); the
// next token's x is loaded before this one's arithmetic.
template <int W>
__global__ void short_conv_fwd_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                      const float* __restrict__ bias, int64_t seq_len, int64_t channels,
                                      float* __restrict__ pre, float* __restrict__ y) {
  const ConvRun run(seq_len, channels);
  if (run.c >= channels) return;
  double wr[W], xr[W];
  conv_taps<W>(w, run.c, true, wr);
  conv_inputs_before<W>(x, run, channels, xr);
  const double b0 = bias != nullptr ? static_cast<double>(bias[run.c]) : 0.0;
  float next = x[run.seq + run.t0 * channels];
  for (int64_t t = run.t0; t < run.t1; ++t) {
#pragma unroll
    for (int j = W - 1; j > 0; --j) xr[j] = xr[j - 1];
    const int64_t e = run.seq + t * channels;
    xr[0] = next;
    if (t + 1 < run.t1) next = x[e + channels];
    double acc = b0;
#pragma unroll
    for (int j = W - 1; j >= 0; --j)
      if (t - j >= 0) acc += wr[j] * xr[j];
    pre[e] = static_cast<float>(acc);
    y[e] = static_cast<float>(acc * sigmoid_d(acc));
  }
}

// ȳ = dy ∘ silu'(pre), silu'(z) = σ(z)(1 + z(1 - σ(z)))
__device__ double conv_ybar(double dy, double z) {
  const double sig = sigmoid_d(z);
  return dy * sig * (1.0 + z * (1.0 - sig));
}

// The backward for the thread's run: dx_τ[c] = Σ_i w[c,i] ȳ_{τ+W-1-i}[c] (i ascending, terms past the sequence's
// end dropped) for τ in the run, and the dw (dbias) partials of the run:
// partial[run, c * W + i] = Σ_{t in the run, t-W+1+i >= 0} ȳ_t[c] x_{t-W+1+i}[c] (t ascending), bias_partial[run, c]
// = Σ_t ȳ_t[c] when bias_partial is given. As t walks [t0, t1 + W - 1): yr[k] = ȳ_{t-k} (0 past the sequence's
// end), so dx_τ is complete at t = τ + W - 1 (yr[i] = ȳ_{τ+W-1-i}); xr[j] = x_{t-j} and dwr[j] the partial of tap
// W-1-j, for t < t1. The next token's dy, pre and x are loaded before this one's arithmetic.
template <int W>
__global__ void short_conv_bwd_kernel(const float* __restrict__ dy, const float* __restrict__ x,
                                      const float* __restrict__ w, const float* __restrict__ pre, int64_t seq_len,
                                      int64_t channels, float* __restrict__ dx, double* __restrict__ partial,
                                      double* __restrict__ bias_partial) {
  const ConvRun run(seq_len, channels);
  if (run.c >= channels) return;
  double wr[W], xr[W], yr[W], dwr[W];
  conv_taps<W>(w, run.c, false, wr);
  conv_inputs_before<W>(x, run, channels, xr);
#pragma unroll
  for (int k = 0; k < W; ++k) yr[k] = dwr[k] = 0.0;
  double db = 0.0;
  const int64_t t_end = run.t1 + W - 1 < seq_len ? run.t1 + W - 1 : seq_len;  // ȳ is needed up to here
  const auto fetch = [&](int64_t t, float& d, float& z, float& xv) {
    const int64_t e = run.seq + t * channels;
    if (t < t_end) d = dy[e], z = pre[e];
    if (t < run.t1) xv = x[e];
  };
  float nd = 0.0f, nz = 0.0f, nx = 0.0f;  // the next token's dy, pre, x
  fetch(run.t0, nd, nz, nx);
  for (int64_t t = run.t0; t < run.t1 + W - 1; ++t) {
    const float dt = nd, zt = nz, xt = nx;
    fetch(t + 1, nd, nz, nx);
#pragma unroll
    for (int k = W - 1; k > 0; --k) yr[k] = yr[k - 1];
    yr[0] = t < t_end ? conv_ybar(dt, zt) : 0.0;
    if (t < run.t1) {
#pragma unroll
      for (int j = W - 1; j > 0; --j) xr[j] = xr[j - 1];
      xr[0] = xt;
      db += yr[0];
#pragma unroll
      for (int j = 0; j < W; ++j)
        if (t - j >= 0) dwr[j] += yr[0] * xr[j];
    }
    const int64_t tau = t - W + 1;
    if (tau >= run.t0) {
      double acc = 0.0;
#pragma unroll
      for (int i = 0; i < W; ++i)
        if (t - i < seq_len) acc += wr[i] * yr[i];
      dx[run.seq + tau * channels] = static_cast<float>(acc);
    }
  }
  double* p = partial + int64_t{blockIdx.x} * channels * W + run.c * W;
#pragma unroll
  for (int j = 0; j < W; ++j) p[W - 1 - j] = dwr[j];
  if (bias_partial != nullptr) bias_partial[int64_t{blockIdx.x} * channels + run.c] = db;
}

// f(std::integral_constant<int, W>{}) for the runtime width (1 <= width <= kConvMaxWidth; checked by the callers).
template <typename F>
void with_width(int64_t width, F f) {
  switch (width) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 7: return f(std::integral_constant<int, 7>{});
    default: return f(std::integral_constant<int, 8>{});
  }
}
static_assert(kConvMaxWidth == 8, "with_width covers widths 1 .. 8");

// ---- L2 norm (§2.2) and gated RMSNorm (§2.3): one warp per row ----

// Rows of the row-wise norms: warp w of block x takes rows x * kWarpRows + w, then strides by the grid; its lanes
// stride the row's elements and sum them by a fixed shuffle butterfly (every lane gets the same sum).
constexpr int kWarpRows = kThreads / 32;

unsigned warp_row_blocks(int64_t rows) { return static_cast<unsigned>(std::clamp<int64_t>(ceil_div(rows, kWarpRows), 1, 65536)); }

__device__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The rows of the calling warp: for (int64_t r = first_row(); r < rows; r += row_stride()).
__device__ int64_t first_row() { return int64_t{blockIdx.x} * kWarpRows + threadIdx.x / 32; }
__device__ int64_t row_stride() { return int64_t{gridDim.x} * kWarpRows; }

// r = (Σ_c x_c^2 + eps)^(-1/2);  y = s x r
__global__ void l2norm_fwd_kernel(const float* x, int64_t rows, int64_t dim, double eps, double scale, float* y,
                                  float* rinv) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  for (int64_t r = first_row(); r < rows; r += row_stride()) {
    const float* xr = x + r * dim;
    double ss = 0.0;
    for (int64_t j = lane; j < dim; j += 32) ss += static_cast<double>(xr[j]) * xr[j];
    ss = warp_sum(ss);
    const double ri = 1.0 / sqrt(ss + eps);
    for (int64_t j = lane; j < dim; j += 32) y[r * dim + j] = static_cast<float>(scale * static_cast<double>(xr[j]) * ri);
    if (lane == 0) rinv[r] = static_cast<float>(ri);
  }
}

// x̃ = y / s;  dx = r (s dy - (dy · y) x̃)
__global__ void l2norm_bwd_kernel(const float* dy, const float* y, const float* rinv, int64_t rows, int64_t dim,
                                  double scale, float* dx) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  for (int64_t r = first_row(); r < rows; r += row_stride()) {
    const float* dyr = dy + r * dim;
    const float* yr = y + r * dim;
    double proj = 0.0;
    for (int64_t j = lane; j < dim; j += 32) proj += static_cast<double>(dyr[j]) * yr[j];
    proj = warp_sum(proj);
    const double ri = rinv[r];
    for (int64_t j = lane; j < dim; j += 32) {
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

// rho = (mean_c(o_c^2) + eps)^(-1/2);  y = o rho ∘ w ∘ phi(z)
__global__ void gated_rmsnorm_fwd_kernel(const float* o, const float* z, const float* w, int64_t rows, int64_t dim,
                                         double eps, bool sigmoid_gate, float* y, float* rstd) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  for (int64_t r = first_row(); r < rows; r += row_stride()) {
    const float* orow = o + r * dim;
    double ss = 0.0;
    for (int64_t j = lane; j < dim; j += 32) ss += static_cast<double>(orow[j]) * orow[j];
    ss = warp_sum(ss);
    const double rho = 1.0 / sqrt(ss / static_cast<double>(dim) + eps);
    for (int64_t j = lane; j < dim; j += 32)
      y[r * dim + j] =
          static_cast<float>(static_cast<double>(orow[j]) * rho * w[j] * gate(z[r * dim + j], sigmoid_gate).phi);
    if (lane == 0) rstd[r] = static_cast<float>(rho);
  }
}

// dz = dy ô w phi'(z);  dô = dy w phi(z);  do = rho (dô - ô (1/d) Σ_c dô_c ô_c)
__global__ void gated_rmsnorm_bwd_kernel(const float* dy, const float* o, const float* z, const float* w,
                                         const float* rstd, int64_t rows, int64_t dim, bool sigmoid_gate, float* d_o,
                                         float* dz) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  for (int64_t r = first_row(); r < rows; r += row_stride()) {
    const double rho = rstd[r];
    double proj = 0.0;
    for (int64_t j = lane; j < dim; j += 32) {
      const int64_t e = r * dim + j;
      const double ohat = static_cast<double>(o[e]) * rho;
      const Gate gt = gate(z[e], sigmoid_gate);
      const double d = dy[e];
      dz[e] = static_cast<float>(d * ohat * w[j] * gt.dphi);
      proj += d * w[j] * gt.phi * ohat;
    }
    proj = warp_sum(proj);
    const double mean_proj = proj / static_cast<double>(dim);
    for (int64_t j = lane; j < dim; j += 32) {
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

// Rows of one decay_gates_bwd_kernel block.
constexpr int64_t kGateRows = 64;

// Block x: rows [64 x, 64 x + 64), thread t channels hc = t, t + blockDim, ... (coalesced across the threads):
// da = dg (-e^{A_log} σ(u)) and, over the block's rows in order, the partial sums part[(x * width + hc) * 2] =
// Σ dg g (for dA_log) and part[... + 1] = Σ da (for ddt_bias); db = dβ β(1 - β) by the threads of channel c = 0.
__global__ void decay_gates_bwd_kernel(const float* dg, const float* dbeta, const float* a, const float* b,
                                       const float* A_log, const float* dt_bias, int64_t rows, int64_t heads,
                                       int64_t dim, float* da, float* db, double* part) {
  const int64_t width = heads * dim, r0 = int64_t{blockIdx.x} * kGateRows;
  const int64_t r1 = r0 + kGateRows < rows ? r0 + kGateRows : rows;
  for (int64_t hc = threadIdx.x; hc < width; hc += blockDim.x) {
    const int64_t h = hc / dim;
    const double A = exp(static_cast<double>(A_log[h]));
    double sA = 0.0, sdt = 0.0;
    for (int64_t r = r0; r < r1; ++r) {
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
    part[(blockIdx.x * width + hc) * 2] = sA;
    part[(blockIdx.x * width + hc) * 2 + 1] = sdt;
  }
}

// Channel hc (grid stride): the row blocks' partial sums added in block order: partial_A[hc] = Σ dg g,
// ddt_bias[hc] += Σ da.
__global__ void decay_gates_sum_kernel(const double* part, int64_t blocks, int64_t width, double* partial_A,
                                       float* ddt_bias) {
  for (int64_t hc = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; hc < width; hc += int64_t{gridDim.x} * blockDim.x) {
    double sA = 0.0, sdt = 0.0;
    for (int64_t x = 0; x < blocks; ++x) sA += part[(x * width + hc) * 2], sdt += part[(x * width + hc) * 2 + 1];
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

// Rows of one comba_gates_bwd_kernel block (of one head).
constexpr int64_t kCombaGateRows = 64;

// Block (chunk x, head y): rows [64 x, 64 x + 64) of head h: dk += s dp - D s dq' (elementwise); the chunk's
// Σ k·dp and Σ k·dq' over its rows and dim by a fixed thread stride and a fixed-tree block reduction, into
// partial[(h * chunks + x) * 2 + {0, 1}].
__global__ void comba_gates_bwd_kernel(const float* dq_out, const float* dp, const float* k, const float* decay,
                                       const float* D, int64_t rows, int64_t heads, int64_t dim, float* dk,
                                       double* partial) {
  const int64_t h = blockIdx.y, r0 = int64_t{blockIdx.x} * kCombaGateRows;
  const int n = static_cast<int>((rows - r0 < kCombaGateRows ? rows - r0 : kCombaGateRows) * dim);
  const double s = decay != nullptr ? sigmoid_d(static_cast<double>(decay[h])) : 1.0;
  const double Dh = D != nullptr ? static_cast<double>(D[h]) : 0.0;
  const int d = static_cast<int>(dim);
  double k_dp = 0.0, k_dq = 0.0;
  for (int e = static_cast<int>(threadIdx.x); e < n; e += static_cast<int>(blockDim.x)) {
    const int64_t j = ((r0 + e / d) * heads + h) * dim + e % d;
    const double kv = k[j], dpv = dp[j], dqv = dq_out[j];
    k_dp += kv * dpv;
    k_dq += kv * dqv;
    dk[j] = static_cast<float>(static_cast<double>(dk[j]) + s * dpv - Dh * s * dqv);
  }
  k_dp = block_reduce(k_dp, SumOp{}, 0.0);
  k_dq = block_reduce(k_dq, SumOp{}, 0.0);
  if (threadIdx.x == 0) {
    double* out = partial + (h * gridDim.x + blockIdx.x) * 2;
    out[0] = k_dp;
    out[1] = k_dq;
  }
}

// One thread per head h: the chunks' Σ k·dp, Σ k·dq' added in chunk order, then ddecay += s(1-s)(Σ k·dp - D Σ k·dq'),
// dD += -s Σ k·dq'.
__global__ void comba_gates_finish_kernel(const double* partial, int64_t heads, int64_t chunks, const float* decay,
                                          const float* D, float* ddecay, float* dD) {
  for (int64_t h = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; h < heads; h += int64_t{gridDim.x} * blockDim.x) {
    double k_dp = 0.0, k_dq = 0.0;
    for (int64_t c = 0; c < chunks; ++c) k_dp += partial[(h * chunks + c) * 2], k_dq += partial[(h * chunks + c) * 2 + 1];
    const double s = decay != nullptr ? sigmoid_d(static_cast<double>(decay[h])) : 1.0;
    const double Dh = D != nullptr ? static_cast<double>(D[h]) : 0.0;
    if (ddecay != nullptr)
      ddecay[h] = static_cast<float>(static_cast<double>(ddecay[h]) + s * (1.0 - s) * (k_dp - Dh * k_dq));
    if (dD != nullptr) dD[h] = static_cast<float>(static_cast<double>(dD[h]) - s * k_dq);
  }
}

}  // namespace

void short_conv_silu_fwd(const float* x, const float* w, const float* bias, int64_t batch, int64_t seq_len,
                         int64_t channels, int64_t width, float* pre, float* y, cudaStream_t stream) {
  check(width >= 1 && width <= kConvMaxWidth, "short_conv (cuda): width (conv_size) must be in [1, {}], got {}",
        kConvMaxWidth, width);
  if (batch * seq_len * channels == 0) return;
  with_width(width, [&](auto W) {
    short_conv_fwd_kernel<decltype(W)::value><<<conv_grid(batch, seq_len, channels), kThreads, 0, stream>>>(x, w, bias, seq_len,
                                                                                        channels, pre, y);
  });
  LLMT_CUDA_CHECK_LAUNCH();
}

size_t short_conv_silu_bwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t channels, int64_t width) {
  return sizeof(double) * static_cast<size_t>(batch * conv_runs(seq_len) * channels * (width + 1));
}

void short_conv_silu_bwd(const float* dy, const float* x, const float* w, const float* pre, int64_t batch,
                         int64_t seq_len, int64_t channels, int64_t width, float* dx, float* dw, float* dbias,
                         void* scratch, cudaStream_t stream) {
  check(width >= 1 && width <= kConvMaxWidth, "short_conv (cuda): width (conv_size) must be in [1, {}], got {}",
        kConvMaxWidth, width);
  if (batch * seq_len * channels == 0) return;
  const int64_t runs = batch * conv_runs(seq_len);
  auto* partial = static_cast<double*>(scratch);
  double* bias_partial = dbias != nullptr ? partial + runs * channels * width : nullptr;
  with_width(width, [&](auto W) {
    short_conv_bwd_kernel<decltype(W)::value><<<conv_grid(batch, seq_len, channels), kThreads, 0, stream>>>(
        dy, x, w, pre, seq_len, channels, dx, partial, bias_partial);
  });
  LLMT_CUDA_CHECK_LAUNCH();
  add_partials_kernel<<<grid_for(channels * width), kThreads, 0, stream>>>(partial, runs, channels * width, dw);
  LLMT_CUDA_CHECK_LAUNCH();
  if (dbias == nullptr) return;
  add_partials_kernel<<<grid_for(channels), kThreads, 0, stream>>>(bias_partial, runs, channels, dbias);
  LLMT_CUDA_CHECK_LAUNCH();
}

void l2norm_fwd(const float* x, int64_t rows, int64_t dim, double eps, double scale, float* y, float* rinv,
                cudaStream_t stream) {
  if (rows == 0) return;
  l2norm_fwd_kernel<<<warp_row_blocks(rows), kThreads, 0, stream>>>(x, rows, dim, eps, scale, y, rinv);
  LLMT_CUDA_CHECK_LAUNCH();
}

void l2norm_bwd(const float* dy, const float* y, const float* rinv, int64_t rows, int64_t dim, double scale,
                float* dx, cudaStream_t stream) {
  if (rows == 0) return;
  l2norm_bwd_kernel<<<warp_row_blocks(rows), kThreads, 0, stream>>>(dy, y, rinv, rows, dim, scale, dx);
  LLMT_CUDA_CHECK_LAUNCH();
}

void gated_rmsnorm_fwd(const float* o, const float* z, const float* w, int64_t rows, int64_t dim, double eps,
                       bool sigmoid_gate, float* y, float* rstd, cudaStream_t stream) {
  if (rows == 0) return;
  gated_rmsnorm_fwd_kernel<<<warp_row_blocks(rows), kThreads, 0, stream>>>(o, z, w, rows, dim, eps, sigmoid_gate, y,
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
  gated_rmsnorm_bwd_kernel<<<warp_row_blocks(rows), kThreads, 0, stream>>>(dy, o, z, w, rstd, rows, dim, sigmoid_gate,
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

size_t decay_gates_bwd_scratch_bytes(int64_t rows, int64_t heads, int64_t dim) {
  return sizeof(double) * static_cast<size_t>(heads * dim * (1 + 2 * std::max<int64_t>(1, ceil_div(rows, kGateRows))));
}

void decay_gates_bwd(const float* dg, const float* dbeta, const float* a, const float* b, const float* A_log,
                     const float* dt_bias, int64_t rows, int64_t heads, int64_t dim, float* da, float* db,
                     float* dA_log, float* ddt_bias, void* scratch, cudaStream_t stream) {
  if (heads * dim == 0 || rows == 0) return;
  const int64_t width = heads * dim, blocks = ceil_div(rows, kGateRows);
  double* partial_A = static_cast<double*>(scratch);
  double* part = partial_A + width;
  decay_gates_bwd_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(dg, dbeta, a, b, A_log, dt_bias,
                                                                                 rows, heads, dim, da, db, part);
  LLMT_CUDA_CHECK_LAUNCH();
  decay_gates_sum_kernel<<<grid_for(width), kThreads, 0, stream>>>(part, blocks, width, partial_A, ddt_bias);
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

size_t comba_gates_bwd_scratch_bytes(int64_t rows, int64_t heads) {
  return sizeof(double) * static_cast<size_t>(2 * heads * std::max<int64_t>(1, ceil_div(rows, kCombaGateRows)));
}

void comba_gates_bwd(const float* dq_out, const float* dp, const float* k, const float* decay, const float* D,
                     int64_t rows, int64_t heads, int64_t dim, float* dk, float* ddecay, float* dD, void* scratch,
                     cudaStream_t stream) {
  if (heads == 0 || rows == 0) return;
  const int64_t chunks = ceil_div(rows, kCombaGateRows);
  auto* partial = static_cast<double*>(scratch);
  comba_gates_bwd_kernel<<<dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(heads)), kThreads, 0, stream>>>(
      dq_out, dp, k, decay, D, rows, heads, dim, dk, partial);
  LLMT_CUDA_CHECK_LAUNCH();
  comba_gates_finish_kernel<<<grid_for(heads), kThreads, 0, stream>>>(partial, heads, chunks, decay, D, ddecay, dD);
  LLMT_CUDA_CHECK_LAUNCH();
}

}  // namespace llmt::cuda
