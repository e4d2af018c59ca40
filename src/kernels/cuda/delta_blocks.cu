// The small blocks of the delta-rule layers (layers-delta.md §2.1-2.3, §4.1 steps 2-3, §5):
// short convolution + SiLU (also Mamba2's conv with its per-channel bias, layers-ssm-attn.md §1.4),
// L2 norm, gated RMSNorm (also Mamba2's with the gate first, layers-ssm-attn.md §1.2), the decay gates
// (GDN/Comba per head, KDA per key channel, §4.3 steps 2-3) and the Comba gates (§4.2 steps 2-3), forward and
// backward. Semantics: src/kernels/cpu/{short_conv,l2norm,gated_rmsnorm,delta_gates,comba_gates}.h. Arithmetic
// in double like the CPU reference, except the short conv backward and the gated RMSNorm, whose per-element
// arithmetic is fp32 (their row sums and the parameter gradients' sums beyond a thread's run stay double).
// Parameter gradients (dw, dbias, dA_log, ddt_bias, ddecay, dD) are reduced deterministically: fixed-order partial
// sums, never atomics.
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.cuh"

namespace llmt::cuda {
namespace {

#ifdef LLMT_CUDA_EMU
LLMT_CUDA_EMU_DYNAMIC_SMEM(smem);  // what the kernels' `extern __shared__ ... smem[]` name (tests/emu/cuda_emu.h)
#endif

__device__ double sigmoid_d(double x) { return 1.0 / (1.0 + exp(-x)); }
// σ(x) in fp32, the quotient by __fdividef: within 2 ulp, and 0 once e^{-x} passes 2^126 (where σ < 2^-126)
__device__ float sigmoid_f(float x) { return __fdividef(1.0f, 1.0f + expf(-x)); }

// ---- short convolution + SiLU forward (§2.1): arithmetic in double ----
// A thread walks one channel c through a run of kConvRun tokens of one sequence (grid x: (batch, run), grid y:
// blocks of kThreads channels), so the element index needs no division and a warp's loads of a token row are
// coalesced; the last W - 1 inputs stay in registers, so every x element is read once.
constexpr int64_t kConvRun = 32;

// Runs of kConvRun tokens per sequence, and the grid of the forward kernel.
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

// w[c, 0..W-1] into registers, reversed: wr[j] = w[c, W-1-j].
template <int W>
__device__ void conv_taps(const float* __restrict__ w, int64_t c, double (&wr)[W]) {
#pragma unroll
  for (int j = 0; j < W; ++j) wr[j] = static_cast<double>(w[c * W + W - 1 - j]);
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
template <int W, typename TY>
__global__ void short_conv_fwd_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                      const float* __restrict__ bias, int64_t seq_len, int64_t channels,
                                      float* __restrict__ pre, TY* __restrict__ y) {
  const ConvRun run(seq_len, channels);
  if (run.c >= channels) return;
  double wr[W], xr[W];
  conv_taps<W>(w, run.c, wr);
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
    y[e] = from_f32<TY>(static_cast<float>(acc * sigmoid_d(acc)));
  }
}

// ---- short convolution + SiLU backward (§2.1): fp32 arithmetic ----
// Block x covers kConvWarps consecutive runs of the flattened (sequence, run) index, one per warp, and block y
// 32 groups of V consecutive channels, one per lane: a warp's loads of a token row are 32 V contiguous floats
// (float4 when V = 4). Every dy, pre, x element is read once (plus W - 1 tokens of dy, pre past the run) and silu'
// is evaluated once per element, in fp32 like everything per element; each thread's dw (dbias) sums over its run
// of kConvRun tokens are fp32, the block adds its warps' sums in warp order in double, and add_partials_kernel
// adds the blocks' sums in its fixed order.
constexpr int kConvWarps = kThreads / 32;

// V consecutive floats at p (16-byte aligned when V = 4: one float4), or V bf16 as floats (8-byte aligned when
// V = 4: one 8-byte load).
template <int V>
__device__ void load_vec(const float* __restrict__ p, float (&v)[V]) {
  if constexpr (V == 4) {
    const float4 q = *reinterpret_cast<const float4*>(p);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] = p[i];
  }
}
template <int V>
__device__ void load_vec(const __nv_bfloat16* __restrict__ p, float (&v)[V]) {
  if constexpr (V == 4) {
    const uint2 q = *reinterpret_cast<const uint2*>(p);
    const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&q.x));
    const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&q.y));
    v[0] = lo.x, v[1] = lo.y, v[2] = hi.x, v[3] = hi.y;
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] = __bfloat162float(p[i]);
  }
}
// v rounded to T at p (16-byte aligned float, 8-byte aligned bf16 when V = 4: one store).
template <int V, typename T>
__device__ void store_vec(T* __restrict__ p, const float (&v)[V]) {
  if constexpr (V == 4 && std::is_same_v<T, float>) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  } else if constexpr (V == 4) {
    struct alignas(8) Four {
      T e[4];
    } q;
#pragma unroll
    for (int i = 0; i < 4; ++i) q.e[i] = from_f32<T>(v[i]);
    *reinterpret_cast<Four*>(p) = q;
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) p[i] = from_f32<T>(v[i]);
  }
}

// ȳ = dy ∘ silu'(pre), silu'(z) = σ(z)(1 + z(1 - σ(z)))   (fp32)
__device__ float conv_ybar(float dy, float z) {
  const float sig = sigmoid_f(z);
  return dy * sig * (1.0f + z * (1.0f - sig));
}

// Floats of a short_conv_bwd_kernel block's dynamic shared memory: each thread's run sums of dw (W taps) and
// dbias per channel.
constexpr int conv_bwd_smem_floats(int W, int V) { return kThreads * V * (W + 1); }

// The thread's run: warp w of block x takes run r = kConvWarps x + w of the flattened (sequence, run) index, tokens
// [t0, t1) of sequence b; lane l of block y channels c0 .. c0 + V - 1, c0 = V (32 y + l); x_t[c0] at seq[t *
// channels]. `active` is false past the last run or channel (the thread then only adds zeros to the block's sums).
struct ConvBwdRun {
  int64_t c0, t0 = 0, t1 = 0, seq = 0;
  bool active;
  __device__ ConvBwdRun(int64_t batch, int64_t seq_len, int64_t channels, int V) {
    const int64_t runs = (seq_len + kConvRun - 1) / kConvRun;
    const int64_t r = int64_t{blockIdx.x} * kConvWarps + threadIdx.x / 32;
    c0 = (int64_t{blockIdx.y} * 32 + threadIdx.x % 32) * V;
    active = r < batch * runs && c0 < channels;
    if (!active) return;
    const int64_t b = r / runs;
    t0 = (r - b * runs) * kConvRun;
    t1 = t0 + kConvRun < seq_len ? t0 + kConvRun : seq_len;
    seq = b * seq_len * channels + c0;
  }
};

// The backward for the thread's run and channels c (fp32): dx_τ[c] = Σ_i w[c,i] ȳ_{τ+W-1-i}[c] (i ascending, terms
// past the sequence's end are zeros; stored as TX: float, or bf16 rounded from the fp32 sum) for τ in the run,
// and the run's sums S[c, i] = Σ_{t in the run} ȳ_t[c] x_{t-W+1+i}[c] (t ascending, x before the sequence zero)
// and Σ_t ȳ_t[c]. As t walks [t0, t1 + W - 1): yr[k] = ȳ_{t-k} (0 past the sequence's end), so dx_τ is complete
// at t = τ + W - 1 (yr[i] = ȳ_{τ+W-1-i}); xr[j] = x_{t-j} and dwr[j] the sum of tap W-1-j, for t < t1. Token t + 2's dy, pre and x are loaded before token t's
// arithmetic (a two-token ring in registers). Then the block's sums over its warps (runs), in warp order in
// double, go to partial[x, c * W + i] and (bias_partial given) bias_partial[x, c]: the threads' run sums wait in
// shared memory, red[thread][v * (W + 1) + i] (i = W: dbias), across the one barrier. dy of type TD: float, or bf16
// (Mamba2's dxbc from its SSD with bf16 inputs; read as fp32).
template <int W, int V, typename TD, typename TX>
__global__ void __launch_bounds__(kThreads, 2) short_conv_bwd_kernel(
    const TD* __restrict__ dy, const float* __restrict__ x, const float* __restrict__ w,
    const float* __restrict__ pre, int64_t batch, int64_t seq_len, int64_t channels, TX* __restrict__ dx,
    double* __restrict__ partial, double* __restrict__ bias_partial) {
  extern __shared__ __align__(16) char smem[];
  float* red = reinterpret_cast<float*>(smem);
  const ConvBwdRun run(batch, seq_len, channels, V);
  float dwr[V][W] = {}, db[V] = {};
  if (run.active) {
    float wr[V][W], xr[V][W] = {}, yr[V][W] = {};
#pragma unroll
    for (int v = 0; v < V; ++v)
#pragma unroll
      for (int i = 0; i < W; ++i) wr[v][i] = w[(run.c0 + v) * W + i];
    // xr[v][k] = x_{t0-1-k} for k < W - 1 (0 before the sequence), so that after the shift at t0, xr[v][j] = x_{t0-j}
#pragma unroll
    for (int k = 0; k < W - 1; ++k)
      if (run.t0 - 1 - k >= 0) {
        float xv[V];
        load_vec<V>(x + run.seq + (run.t0 - 1 - k) * channels, xv);
#pragma unroll
        for (int v = 0; v < V; ++v) xr[v][k] = xv[v];
      }
    // Token t0 + u at offset u * channels of the run's pointers; ȳ is needed for u < u_end, x for u < n.
    const int n = static_cast<int>(run.t1 - run.t0), step = static_cast<int>(channels);
    const int u_end = static_cast<int>((run.t1 + W - 1 < seq_len ? run.t1 + W - 1 : seq_len) - run.t0);
    const int64_t first = run.seq + run.t0 * channels;
    const TD* pdy = dy + first;
    const float *ppre = pre + first, *px = x + first;
    TX* pdx = dx + first;
    // Token u's dy, pre, x in slot u % 2 of a two-token ring, loaded two tokens ahead of its arithmetic.
    float rd[2][V] = {}, rz[2][V] = {}, rx[2][V] = {};
    const auto fetch = [&](int u, float (&d)[V], float (&z)[V], float (&xv)[V]) {
      if (u < u_end) load_vec<V>(pdy + u * step, d), load_vec<V>(ppre + u * step, z);
      if (u < n) load_vec<V>(px + u * step, xv);
    };
    const auto token = [&](int u, float (&d)[V], float (&z)[V], float (&xv)[V]) {
      float dt[V], zt[V], xt[V], dxv[V];
#pragma unroll
      for (int v = 0; v < V; ++v) dt[v] = d[v], zt[v] = z[v], xt[v] = xv[v];
      fetch(u + 2, d, z, xv);
#pragma unroll
      for (int v = 0; v < V; ++v) {
#pragma unroll
        for (int k = W - 1; k > 0; --k) yr[v][k] = yr[v][k - 1];
        yr[v][0] = u < u_end ? conv_ybar(dt[v], zt[v]) : 0.0f;
        if (u < n) {
#pragma unroll
          for (int j = W - 1; j > 0; --j) xr[v][j] = xr[v][j - 1];
          xr[v][0] = xt[v];
          db[v] += yr[v][0];
#pragma unroll
          for (int j = 0; j < W; ++j) dwr[v][j] += yr[v][0] * xr[v][j];
        }
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < W; ++i) acc += wr[v][i] * yr[v][i];
        dxv[v] = acc;
      }
      if (u >= W - 1) store_vec<V, TX>(pdx + (u - W + 1) * step, dxv);
    };
    fetch(0, rd[0], rz[0], rx[0]);
    fetch(1, rd[1], rz[1], rx[1]);
    for (int u = 0; u < n + W - 1; u += 2) {
      token(u, rd[0], rz[0], rx[0]);
      if (u + 1 < n + W - 1) token(u + 1, rd[1], rz[1], rx[1]);
    }
  }
  float* mine = red + threadIdx.x * V * (W + 1);
#pragma unroll
  for (int v = 0; v < V; ++v) {
#pragma unroll
    for (int j = 0; j < W; ++j) mine[v * (W + 1) + W - 1 - j] = dwr[v][j];
    mine[v * (W + 1) + W] = db[v];
  }
  __syncthreads();
  // Item q of the block's 32 V (W + 1) sums: block channel cl = q / (W + 1) (lane cl / V, its channel cl % V), tap
  // i = q % (W + 1) (W: dbias).
  const int64_t cbase = int64_t{blockIdx.y} * 32 * V;
  for (int q = threadIdx.x; q < 32 * V * (W + 1); q += kThreads) {
    const int cl = q / (W + 1), i = q % (W + 1);
    const int64_t c = cbase + cl;
    if (c >= channels || (i == W && bias_partial == nullptr)) continue;
    double s = 0.0;
    for (int wp = 0; wp < kConvWarps; ++wp) s += red[((wp * 32 + cl / V) * V + cl % V) * (W + 1) + i];
    if (i < W)
      partial[int64_t{blockIdx.x} * channels * W + c * W + i] = s;
    else
      bias_partial[int64_t{blockIdx.x} * channels + c] = s;
  }
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

// r = (Σ_c x_c^2 + eps)^(-1/2);  y = s x r (stored as TY: float, or bf16 rounded from the float)
template <typename TY>
__global__ void l2norm_fwd_kernel(const float* __restrict__ x, int64_t rows, int64_t dim, double eps, double scale,
                                  TY* __restrict__ y, float* __restrict__ rinv) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  for (int64_t r = first_row(); r < rows; r += row_stride()) {
    const float* xr = x + r * dim;
    double ss = 0.0;
#pragma unroll 4
    for (int64_t j = lane; j < dim; j += 32) ss += static_cast<double>(xr[j]) * xr[j];
    ss = warp_sum(ss);
    const double ri = 1.0 / sqrt(ss + eps);
#pragma unroll 4
    for (int64_t j = lane; j < dim; j += 32)
      y[r * dim + j] = from_f32<TY>(static_cast<float>(scale * static_cast<double>(xr[j]) * ri));
    if (lane == 0) rinv[r] = static_cast<float>(ri);
  }
}

// x̃ = x r;  dx = r s (dy - (dy · x̃) x̃)
__global__ void l2norm_bwd_kernel(const float* __restrict__ dy, const float* __restrict__ x,
                                  const float* __restrict__ rinv, int64_t rows, int64_t dim, double scale,
                                  float* __restrict__ dx) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  for (int64_t r = first_row(); r < rows; r += row_stride()) {
    const float* dyr = dy + r * dim;
    const float* xr = x + r * dim;
    const double ri = rinv[r];
    double proj = 0.0;
#pragma unroll 4
    for (int64_t j = lane; j < dim; j += 32) proj += static_cast<double>(dyr[j]) * (static_cast<double>(xr[j]) * ri);
    proj = warp_sum(proj);
#pragma unroll 4
    for (int64_t j = lane; j < dim; j += 32) {
      const double xt = static_cast<double>(xr[j]) * ri;
      dx[r * dim + j] = static_cast<float>(ri * scale * (static_cast<double>(dyr[j]) - proj * xt));
    }
  }
}

// ---- gated RMSNorm: the gate after the norm (§2.3; kGateFirst false) or before it (Mamba2's, kGateFirst true,
// layers-ssm-attn.md §1.2, phi = silu): fp32 per element, the row sums in double ----

struct Gate {
  float phi, dphi;
};
// sigmoid: phi = σ(z), phi' = σ(1 - σ);  silu: phi = z σ(z), phi' = σ(1 + z(1 - σ))
__device__ Gate gate(float z, bool sigmoid_gate) {
  const float sig = sigmoid_f(z);
  if (sigmoid_gate) return {sig, sig * (1.0f - sig)};
  return {z * sig, sig * (1.0f + z * (1.0f - sig))};
}

// Gate after: rho = (mean_c(o_c^2) + eps)^(-1/2) (in double);  y = o rho ∘ w ∘ phi(z).
// Gate first: u = o ∘ silu(z) (recomputed in each pass);  rho = (mean_c(u_c^2) + eps)^(-1/2);  y = u rho ∘ w.
// o of type TI (float; with the gate first also bf16: Mamba2's SSD output y with bf16 inputs, read as fp32); y stored
// as TY: float or bf16.
template <bool kGateFirst, typename TI, typename TY>
__global__ void gated_rmsnorm_fwd_kernel(const TI* __restrict__ o, const float* __restrict__ z,
                                         const float* __restrict__ w, int64_t rows, int64_t dim, double eps,
                                         bool sigmoid_gate, TY* __restrict__ y, float* __restrict__ rstd) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  for (int64_t r = first_row(); r < rows; r += row_stride()) {
    const TI* orow = o + r * dim;
    const float* zrow = z + r * dim;
    double ss = 0.0;
#pragma unroll 4
    for (int64_t j = lane; j < dim; j += 32) {
      const float x = kGateFirst ? to_f32(orow[j]) * gate(zrow[j], false).phi : to_f32(orow[j]);
      ss += static_cast<double>(x) * x;
    }
    ss = warp_sum(ss);
    const float rho = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(dim) + eps));
#pragma unroll 4
    for (int64_t j = lane; j < dim; j += 32) {
      const float v = kGateFirst ? to_f32(orow[j]) * gate(zrow[j], false).phi * rho * w[j]
                                 : to_f32(orow[j]) * rho * w[j] * gate(zrow[j], sigmoid_gate).phi;
      y[r * dim + j] = from_f32<TY>(v);
    }
    if (lane == 0) rstd[r] = rho;
  }
}

// Rows of one gated_rmsnorm_bwd_kernel warp (a run of its fp32 dw sums) and block.
constexpr int kNormRun = 32, kNormBlockRows = kNormRun * kWarpRows;
constexpr int64_t kMaxNormSmem = 227 * 1024;  // the most dynamic shared memory a block takes (sm_90)

// Floats of a gated_rmsnorm_bwd_kernel block's dynamic shared memory: each warp's run sums of dw.
int64_t gated_rmsnorm_bwd_smem_floats(int64_t dim) { return kWarpRows * dim; }

// Gate after: dz = dy ô w phi'(z) (pass 1);  dô = dy w phi(z);  do = rho (dô - ô (1/d) Σ_c dô_c ô_c) (pass 2);
// the dw partial sums of dy ô phi(z).
// Gate first (dy: the output's gradient, d_o: the gradient of the norm's input o, i.e. of Mamba2's SSD output y):
// û = o silu(z) rho, dû = dy w;  du = rho (dû - û (1/d) Σ_c dû_c û_c);  d_o = du silu(z), dz = du o silu'(z) (pass
// 2); the dw partial sums of dy û.
// Block x takes rows [kNormBlockRows x, + kNormBlockRows), warp w the run of kNormRun rows from kNormBlockRows x +
// kNormRun w, its lanes columns j = lane + 32 k. A row: the lane's part of Σ dô ô (double) with the warp's
// dw run sums acc[w][j] (fp32, shared memory owned by lane j % 32: no barrier); the butterfly sum; then
// dy, o, z again (the warp's own row: L1) and do (dz too with the gate first). Then the block adds its warps' run
// sums in warp order in double: partial[x, j]. d_o stored as TO, dz as TZ: float or bf16 (TO bf16: the gate first
// only, Mamba2's SSD dy); o read as TI (float; bf16 with the gate first only, Mamba2's SSD output y).
template <bool kGateFirst, typename TI, typename TO, typename TZ>
__global__ void gated_rmsnorm_bwd_kernel(const float* __restrict__ dy, const TI* __restrict__ o,
                                         const float* __restrict__ z, const float* __restrict__ w,
                                         const float* __restrict__ rstd, int64_t rows, int64_t dim, bool sigmoid_gate,
                                         TO* __restrict__ d_o, TZ* __restrict__ dz,
                                         double* __restrict__ partial) {
  extern __shared__ __align__(16) char smem[];
  float* acc = reinterpret_cast<float*>(smem);
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x / 32);
  float* mine = acc + warp * dim;
  for (int64_t j = lane; j < dim; j += 32) mine[j] = 0.0f;
  const int64_t r0 = int64_t{blockIdx.x} * kNormBlockRows + warp * kNormRun;
  const int64_t r1 = r0 + kNormRun < rows ? r0 + kNormRun : rows;
  for (int64_t r = r0; r < r1; ++r) {
    const float rho = rstd[r];
    double proj = 0.0;
#pragma unroll 4
    for (int64_t j = lane; j < dim; j += 32) {
      const int64_t e = r * dim + j;
      const float d = dy[e];
      if constexpr (kGateFirst) {
        const float uhat = to_f32(o[e]) * gate(z[e], false).phi * rho;
        proj += static_cast<double>(d * w[j]) * uhat;
        mine[j] += d * uhat;
      } else {
        const float ohat = to_f32(o[e]) * rho;
        const Gate gt = gate(z[e], sigmoid_gate);
        dz[e] = from_f32<TZ>(d * ohat * w[j] * gt.dphi);
        proj += static_cast<double>(d * w[j] * gt.phi) * ohat;
        mine[j] += d * ohat * gt.phi;
      }
    }
    const float mean_proj = static_cast<float>(warp_sum(proj) / static_cast<double>(dim));
#pragma unroll 4
    for (int64_t j = lane; j < dim; j += 32) {
      const int64_t e = r * dim + j;
      const Gate gt = gate(z[e], kGateFirst ? false : sigmoid_gate);
      if constexpr (kGateFirst) {
        const float oe = to_f32(o[e]);
        const float du = rho * (dy[e] * w[j] - oe * gt.phi * rho * mean_proj);
        d_o[e] = from_f32<TO>(du * gt.phi);
        dz[e] = from_f32<TZ>(du * oe * gt.dphi);
      } else {
        const float dohat = dy[e] * w[j] * gt.phi;
        d_o[e] = from_f32<TO>(rho * (dohat - to_f32(o[e]) * rho * mean_proj));
      }
    }
  }
  __syncthreads();
  for (int64_t j = threadIdx.x; j < dim; j += kThreads) {
    double s = 0.0;
    for (int k = 0; k < kWarpRows; ++k) s += acc[k * dim + j];
    partial[int64_t{blockIdx.x} * dim + j] = s;
  }
}

// The launches of gated_rmsnorm_{fwd,bwd}_kernel: the gate after the norm (gated_rmsnorm_*) or first (gate_rmsnorm_*).
template <bool kGateFirst, typename TI, typename TY>
void norm_fwd(const TI* o, const float* z, const float* w, int64_t rows, int64_t dim, double eps,
              bool sigmoid_gate, TY* y, float* rstd, cudaStream_t stream) {
  if (rows == 0) return;
  gated_rmsnorm_fwd_kernel<kGateFirst, TI, TY><<<warp_row_blocks(rows), kThreads, 0, stream>>>(o, z, w, rows, dim, eps,
                                                                                          sigmoid_gate, y, rstd);
  LLMT_CUDA_CHECK_LAUNCH();
}

template <bool kGateFirst, typename TI, typename TO, typename TZ>
void norm_bwd(const float* dy, const TI* o, const float* z, const float* w, const float* rstd, int64_t rows,
              int64_t dim, bool sigmoid_gate, TO* d_o, TZ* dz, float* dw, void* scratch, cudaStream_t stream) {
  if (rows == 0 || dim == 0) return;
  const int64_t blocks = ceil_div(rows, kNormBlockRows), smem = sizeof(float) * gated_rmsnorm_bwd_smem_floats(dim);
  check(smem <= kMaxNormSmem, "{} (cuda): dim {} exceeds the kernel's limit of {}",
        kGateFirst ? "gate_rmsnorm_bwd" : "gated_rmsnorm_bwd", dim, kMaxNormSmem / (sizeof(float) * kWarpRows));
  const auto kernel = gated_rmsnorm_bwd_kernel<kGateFirst, TI, TO, TZ>;
  if (smem > 48 * 1024)
    LLMT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  auto* partial = static_cast<double*>(scratch);
  kernel<<<static_cast<unsigned>(blocks), kThreads, static_cast<size_t>(smem), stream>>>(
      dy, o, z, w, rstd, rows, dim, sigmoid_gate, d_o, dz, partial);
  LLMT_CUDA_CHECK_LAUNCH();
  add_partials(partial, blocks, dim, dw, stream);
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

template <typename TY>
void short_conv_silu_fwd(const float* x, const float* w, const float* bias, int64_t batch, int64_t seq_len,
                         int64_t channels, int64_t width, float* pre, TY* y, cudaStream_t stream) {
  check(width >= 1 && width <= kConvMaxWidth, "short_conv (cuda): width (conv_size) must be in [1, {}], got {}",
        kConvMaxWidth, width);
  if (batch * seq_len * channels == 0) return;
  with_width(width, [&](auto W) {
    short_conv_fwd_kernel<decltype(W)::value, TY><<<conv_grid(batch, seq_len, channels), kThreads, 0, stream>>>(
        x, w, bias, seq_len, channels, pre, y);
  });
  LLMT_CUDA_CHECK_LAUNCH();
}
template void short_conv_silu_fwd(const float*, const float*, const float*, int64_t, int64_t, int64_t, int64_t, float*,
                                  float*, cudaStream_t);
template void short_conv_silu_fwd(const float*, const float*, const float*, int64_t, int64_t, int64_t, int64_t, float*,
                                  __nv_bfloat16*, cudaStream_t);

// Blocks of kConvWarps runs (grid x of short_conv_bwd_kernel): the chunks of its dw partial sums.
int64_t conv_bwd_blocks(int64_t batch, int64_t seq_len) { return ceil_div(batch * conv_runs(seq_len), kConvWarps); }

size_t short_conv_silu_bwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t channels, int64_t width) {
  return sizeof(double) * static_cast<size_t>(conv_bwd_blocks(batch, seq_len) * channels * (width + 1));
}

template <typename TD, typename TX>
void short_conv_silu_bwd(const TD* dy, const float* x, const float* w, const float* pre, int64_t batch,
                         int64_t seq_len, int64_t channels, int64_t width, TX* dx, float* dw, float* dbias,
                         void* scratch, cudaStream_t stream) {
  check(width >= 1 && width <= kConvMaxWidth, "short_conv (cuda): width (conv_size) must be in [1, {}], got {}",
        kConvMaxWidth, width);
  if (batch * seq_len * channels == 0) return;
  const int64_t blocks = conv_bwd_blocks(batch, seq_len);
  auto* partial = static_cast<double*>(scratch);
  double* bias_partial = dbias != nullptr ? partial + blocks * channels * width : nullptr;
  // Four channels a thread (float4; 8-byte pieces of bf16) where the rows allow it and the taps fit the registers.
  const auto aligned = [](const auto* p) { return reinterpret_cast<uintptr_t>(p) % (4 * sizeof(*p)) == 0; };
  const bool vec4 = width <= 4 && channels % 4 == 0 && aligned(dy) && aligned(x) && aligned(pre) && aligned(dx);
  with_width(width, [&](auto Wc) {
    constexpr int W = decltype(Wc)::value;
    const auto launch = [&](auto kernel, int V) {
      const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(ceil_div(channels, 32 * V)));
      kernel<<<grid, kThreads, sizeof(float) * conv_bwd_smem_floats(W, V), stream>>>(
          dy, x, w, pre, batch, seq_len, channels, dx, partial, bias_partial);
    };
    if constexpr (W <= 4)
      if (vec4) return launch(&short_conv_bwd_kernel<W, 4, TD, TX>, 4);
    launch(&short_conv_bwd_kernel<W, 1, TD, TX>, 1);
  });
  LLMT_CUDA_CHECK_LAUNCH();
  add_partials(partial, blocks, channels * width, dw, stream);
  if (dbias != nullptr) add_partials(bias_partial, blocks, channels, dbias, stream);
}
#define LLMT_INSTANTIATE_SHORT_CONV_BWD(TD, TX)                                                                   \
  template void short_conv_silu_bwd(const TD*, const float*, const float*, const float*, int64_t, int64_t, int64_t, \
                                    int64_t, TX*, float*, float*, void*, cudaStream_t);
LLMT_INSTANTIATE_SHORT_CONV_BWD(float, float)
LLMT_INSTANTIATE_SHORT_CONV_BWD(float, __nv_bfloat16)
LLMT_INSTANTIATE_SHORT_CONV_BWD(__nv_bfloat16, float)
LLMT_INSTANTIATE_SHORT_CONV_BWD(__nv_bfloat16, __nv_bfloat16)

template <typename TY>
void l2norm_fwd(const float* x, int64_t rows, int64_t dim, double eps, double scale, TY* y, float* rinv,
                cudaStream_t stream) {
  if (rows == 0) return;
  l2norm_fwd_kernel<TY><<<warp_row_blocks(rows), kThreads, 0, stream>>>(x, rows, dim, eps, scale, y, rinv);
  LLMT_CUDA_CHECK_LAUNCH();
}
template void l2norm_fwd(const float*, int64_t, int64_t, double, double, float*, float*, cudaStream_t);
template void l2norm_fwd(const float*, int64_t, int64_t, double, double, __nv_bfloat16*, float*, cudaStream_t);

void l2norm_bwd(const float* dy, const float* x, const float* rinv, int64_t rows, int64_t dim, double scale,
                float* dx, cudaStream_t stream) {
  if (rows == 0) return;
  l2norm_bwd_kernel<<<warp_row_blocks(rows), kThreads, 0, stream>>>(dy, x, rinv, rows, dim, scale, dx);
  LLMT_CUDA_CHECK_LAUNCH();
}

template <typename TY>
void gated_rmsnorm_fwd(const float* o, const float* z, const float* w, int64_t rows, int64_t dim, double eps,
                       bool sigmoid_gate, TY* y, float* rstd, cudaStream_t stream) {
  norm_fwd<false>(o, z, w, rows, dim, eps, sigmoid_gate, y, rstd, stream);
}
template void gated_rmsnorm_fwd(const float*, const float*, const float*, int64_t, int64_t, double, bool, float*,
                                float*, cudaStream_t);
template void gated_rmsnorm_fwd(const float*, const float*, const float*, int64_t, int64_t, double, bool,
                                __nv_bfloat16*, float*, cudaStream_t);

size_t gated_rmsnorm_bwd_scratch_bytes(int64_t rows, int64_t dim) {
  return sizeof(double) * static_cast<size_t>(ceil_div(rows, kNormBlockRows) * dim);
}

template <typename TZ>
void gated_rmsnorm_bwd(const float* dy, const float* o, const float* z, const float* w, const float* rstd,
                       int64_t rows, int64_t dim, bool sigmoid_gate, float* d_o, TZ* dz, float* dw, void* scratch,
                       cudaStream_t stream) {
  norm_bwd<false>(dy, o, z, w, rstd, rows, dim, sigmoid_gate, d_o, dz, dw, scratch, stream);
}
template void gated_rmsnorm_bwd(const float*, const float*, const float*, const float*, const float*, int64_t, int64_t,
                                bool, float*, float*, float*, void*, cudaStream_t);
template void gated_rmsnorm_bwd(const float*, const float*, const float*, const float*, const float*, int64_t, int64_t,
                                bool, float*, __nv_bfloat16*, float*, void*, cudaStream_t);

template <typename TI, typename TY>
void gate_rmsnorm_fwd(const TI* y, const float* z, const float* w, int64_t rows, int64_t dim, double eps, TY* out,
                      float* rstd, cudaStream_t stream) {
  norm_fwd<true>(y, z, w, rows, dim, eps, false, out, rstd, stream);
}
#define LLMT_INSTANTIATE_GATE_RMSNORM_FWD(TI, TY)                                                                  \
  template void gate_rmsnorm_fwd(const TI*, const float*, const float*, int64_t, int64_t, double, TY*, float*,     \
                                 cudaStream_t);
LLMT_INSTANTIATE_GATE_RMSNORM_FWD(float, float)
LLMT_INSTANTIATE_GATE_RMSNORM_FWD(float, __nv_bfloat16)
LLMT_INSTANTIATE_GATE_RMSNORM_FWD(__nv_bfloat16, float)
LLMT_INSTANTIATE_GATE_RMSNORM_FWD(__nv_bfloat16, __nv_bfloat16)

template <typename TI, typename TD, typename TZ>
void gate_rmsnorm_bwd(const float* dout, const TI* y, const float* z, const float* w, const float* rstd,
                      int64_t rows, int64_t dim, TD* dy, TZ* dz, float* dw, void* scratch, cudaStream_t stream) {
  norm_bwd<true>(dout, y, z, w, rstd, rows, dim, false, dy, dz, dw, scratch, stream);
}
#define LLMT_INSTANTIATE_GATE_RMSNORM_BWD(TI, TD, TZ)                                                              \
  template void gate_rmsnorm_bwd(const float*, const TI*, const float*, const float*, const float*, int64_t,      \
                                 int64_t, TD*, TZ*, float*, void*, cudaStream_t);
LLMT_INSTANTIATE_GATE_RMSNORM_BWD(float, float, float)
LLMT_INSTANTIATE_GATE_RMSNORM_BWD(float, float, __nv_bfloat16)
LLMT_INSTANTIATE_GATE_RMSNORM_BWD(float, __nv_bfloat16, float)
LLMT_INSTANTIATE_GATE_RMSNORM_BWD(float, __nv_bfloat16, __nv_bfloat16)
LLMT_INSTANTIATE_GATE_RMSNORM_BWD(__nv_bfloat16, float, float)
LLMT_INSTANTIATE_GATE_RMSNORM_BWD(__nv_bfloat16, float, __nv_bfloat16)
LLMT_INSTANTIATE_GATE_RMSNORM_BWD(__nv_bfloat16, __nv_bfloat16, float)
LLMT_INSTANTIATE_GATE_RMSNORM_BWD(__nv_bfloat16, __nv_bfloat16, __nv_bfloat16)

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
