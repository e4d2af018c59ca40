// The MDN gates and output correction, forward and backward (mdn.md §4.2, §4.4, §7.4). Semantics:
// src/kernels/cpu/mdn_gates.h; fp32 storage, arithmetic in double like the CPU reference. Parameter
// gradients (dA_log, ddt_bias, dMu_log, dmu_bias, dlog_factor, dD_log) are reduced deterministically: a block per
// (fixed range of rows, head) sums its range by a fixed-tree block reduction into a partial (double), then
// add_partials adds a head's partials in a fixed order; never atomics. (A block per head, as before, left a
// 65536-row MQAR batch's correction backward on 2 SMs: 18.6 ms a layer.)
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.cuh"

namespace llmt::cuda {
namespace {

__device__ double sigmoid_d(double x) { return 1.0 / (1.0 + exp(-x)); }

// softplus(x) = max(x, 0) + log1p(e^{-|x|}): never overflows.
__device__ double softplus_d(double x) { return fmax(x, 0.0) + log1p(exp(-fabs(x))); }

// η and dη/dz_η for one token (mdn.md §4.4; the 2σ form is the Table 4 ablation).
struct Eta {
  double value, slope;
};
__device__ Eta eta_of(double z, const MdnGateOptions& opt) {
  const double u = z / opt.tau;
  if (opt.eta_two_sigmoid) {
    const double s = sigmoid_d(u);
    return {2.0 * s, 2.0 * s * (1.0 - s) / opt.tau};
  }
  const double t = tanh(u);
  return {1.0 + t, (1.0 - t * t) / opt.tau};
}

// The gate inputs shared by the kernels (pointers as in ops.cuh; the momentum ones null without momentum).
struct GateArgs {
  const float *z_alpha, *z_beta, *z_mu, *z_eta, *A_log, *dt_bias, *Mu_log, *mu_bias, *log_factor;
  int64_t rows, heads;
  MdnGateOptions opt;
};

// x = s η, α_max = 1/(1 + x²), β_max = x²/(1 + x²):  log α = -e^{A_log} softplus(z_α + dt_bias) - log(1 + x²)
// (no - log(1 + x²) without alpha_max);
// β = σ(z_β) β_max (σ(z_β) without beta_max);  log μ = max(-e^{Mu_log} softplus(z_μ + mu_bias), floor)
// (-inf without momentum).  (one thread per element of [rows, heads])
__global__ void mdn_gates_fwd_kernel(GateArgs g, float* log_alpha, float* beta, float* log_mu, float* eta) {
  const int64_t n = g.rows * g.heads;
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < n; j += int64_t{gridDim.x} * blockDim.x) {
    const int64_t h = j % g.heads;
    const double e = g.opt.momentum ? eta_of(g.z_eta[j], g.opt).value : 1.0;
    const double x = exp(static_cast<double>(g.log_factor[h])) * e, q = 1.0 + x * x;
    const double decay =
        -exp(static_cast<double>(g.A_log[h])) * softplus_d(static_cast<double>(g.z_alpha[j]) + g.dt_bias[h]);
    log_alpha[j] = static_cast<float>(g.opt.alpha_max ? decay - log1p(x * x) : decay);
    beta[j] = static_cast<float>(sigmoid_d(g.z_beta[j]) * (g.opt.beta_max ? x * x / q : 1.0));
    if (g.opt.momentum) {
      const double m =
          -exp(static_cast<double>(g.Mu_log[h])) * softplus_d(static_cast<double>(g.z_mu[j]) + g.mu_bias[h]);
      log_mu[j] = static_cast<float>(fmax(m, g.opt.min_log_mu));
    } else {
      log_mu[j] = -INFINITY;
    }
    eta[j] = static_cast<float>(e);
  }
}

// The per-head parameter gradients mdn_gates_bwd_kernel sums, in its partials' order: dA_log, ddt_bias, dMu_log,
// dmu_bias, dlog_factor.
constexpr int kGateGrads = 5;

// Rows of one mdn_gates_bwd_kernel block (one per thread) and of one mdn_correction_bwd_kernel block.
constexpr int64_t kGateRows = kThreads, kCorrectionRows = 32;

// Block (x, h): rows r = kGateRows x + thread of head h: dz_α, dz_β, dz_μ, dz_η per row (mdn.md §7.4, x = s η,
// q = 1 + x²: ∂log α/∂x = -2x/q (0 without alpha_max), ∂β/∂x = σ(z_β) 2x/q², ∂x/∂log_factor = x, ∂x/∂η = s;
// no μ gradient where the floor clamps), and the rows' sums of the head's parameter gradients by a fixed-tree block
// reduction: partial [kGateGrads][gridDim.x][heads] (kGateGrads' order), summed over x by add_partials.
__global__ void mdn_gates_bwd_kernel(GateArgs g, const float* d_log_alpha, const float* d_beta,
                                     const float* d_log_mu, const float* d_eta, float* dz_alpha, float* dz_beta,
                                     float* dz_mu, float* dz_eta, double* partial) {
  const int64_t h = blockIdx.y;
  const MdnGateOptions& opt = g.opt;
  const double s = exp(static_cast<double>(g.log_factor[h])), A = exp(static_cast<double>(g.A_log[h]));
  const double Am = opt.momentum ? exp(static_cast<double>(g.Mu_log[h])) : 0.0;
  double dA = 0.0, ddt = 0.0, dMu = 0.0, dmub = 0.0, dlf = 0.0;  // this thread's row's terms
  const int64_t r = int64_t{blockIdx.x} * kGateRows + threadIdx.x;
  if (r < g.rows) {
    const int64_t j = r * g.heads + h;
    const Eta e = opt.momentum ? eta_of(g.z_eta[j], opt) : Eta{1.0, 0.0};
    const double x = s * e.value, q = 1.0 + x * x;
    const double dla = d_log_alpha[j], db = d_beta[j], sb = sigmoid_d(g.z_beta[j]);
    const double u = static_cast<double>(g.z_alpha[j]) + g.dt_bias[h];
    const double dza = dla * (-A * sigmoid_d(u));
    dz_alpha[j] = static_cast<float>(dza);
    ddt = dza;
    dA = dla * (-A * softplus_d(u));
    const double bmax = opt.beta_max ? x * x / q : 1.0;
    dz_beta[j] = static_cast<float>(db * bmax * sb * (1.0 - sb));
    double dx = 0.0;
    if (opt.alpha_max) dx += dla * (-2.0 * x / q);
    if (opt.beta_max) dx += db * sb * 2.0 * x / (q * q);
    dlf = x * dx;
    if (opt.momentum) {
      dz_eta[j] = static_cast<float>((static_cast<double>(d_eta[j]) + s * dx) * e.slope);
      const double um = static_cast<double>(g.z_mu[j]) + g.mu_bias[h], sp = softplus_d(um);
      if (-Am * sp < opt.min_log_mu) {
        dz_mu[j] = 0.0f;
      } else {
        const double dlm = d_log_mu[j], dzm = dlm * (-Am * sigmoid_d(um));
        dz_mu[j] = static_cast<float>(dzm);
        dmub = dzm;
        dMu = dlm * (-Am * sp);
      }
    }
  }
  const double sums[kGateGrads] = {block_reduce(dA, SumOp{}, 0.0), block_reduce(ddt, SumOp{}, 0.0),
                                   block_reduce(dMu, SumOp{}, 0.0), block_reduce(dmub, SumOp{}, 0.0),
                                   block_reduce(dlf, SumOp{}, 0.0)};
  if (threadIdx.x == 0)
    for (int q = 0; q < kGateGrads; ++q) partial[(q * int64_t{gridDim.x} + blockIdx.x) * g.heads + h] = sums[q];
}

// q_out = q - e^{D_log_h} k   (one thread per element of [rows, heads * dim])
__global__ void mdn_correction_fwd_kernel(const float* q, const float* k, const float* D_log, int64_t rows,
                                          int64_t heads, int64_t dim, float* q_out) {
  const int64_t n = rows * heads * dim;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n; idx += int64_t{gridDim.x} * blockDim.x) {
    const double d = exp(static_cast<double>(D_log[(idx / dim) % heads]));
    q_out[idx] = static_cast<float>(static_cast<double>(q[idx]) - d * static_cast<double>(k[idx]));
  }
}

// Block (x, h): rows [kCorrectionRows x, + kCorrectionRows) of head h: dk += -δ dq_out (elementwise) and the
// rows' -δ Σ dq_out ⊙ k (fixed thread stride, fixed-tree block reduction) into partial[x, h], δ = e^{D_log_h};
// add_partials then adds them to dD_log.
__global__ void mdn_correction_bwd_kernel(const float* dq_out, const float* k, const float* D_log, int64_t rows,
                                          int64_t heads, int64_t dim, float* dk, double* partial) {
  const int64_t h = blockIdx.y, r0 = int64_t{blockIdx.x} * kCorrectionRows;
  const int64_t n = (rows - r0 < kCorrectionRows ? rows - r0 : kCorrectionRows) * dim;
  const double d = exp(static_cast<double>(D_log[h]));
  double dot = 0.0;
  for (int64_t e = threadIdx.x; e < n; e += blockDim.x) {
    const int64_t j = ((r0 + e / dim) * heads + h) * dim + e % dim;
    const double g = dq_out[j];
    dot += g * static_cast<double>(k[j]);
    dk[j] = static_cast<float>(static_cast<double>(dk[j]) - d * g);
  }
  dot = block_reduce(dot, SumOp{}, 0.0);
  if (threadIdx.x == 0) partial[blockIdx.x * heads + h] = -d * dot;
}

}  // namespace

void mdn_gates_fwd(const float* z_alpha, const float* z_beta, const float* z_mu, const float* z_eta,
                   const float* A_log, const float* dt_bias, const float* Mu_log, const float* mu_bias,
                   const float* log_factor, int64_t rows, int64_t heads, const MdnGateOptions& opt, float* log_alpha,
                   float* beta, float* log_mu, float* eta, cudaStream_t stream) {
  const int64_t n = rows * heads;
  if (n == 0) return;
  const GateArgs g{z_alpha, z_beta, z_mu, z_eta, A_log, dt_bias, Mu_log, mu_bias, log_factor, rows, heads, opt};
  mdn_gates_fwd_kernel<<<grid_for(n), kThreads, 0, stream>>>(g, log_alpha, beta, log_mu, eta);
  LLMT_CUDA_CHECK_LAUNCH();
}

void mdn_gates_bwd(const float* d_log_alpha, const float* d_beta, const float* d_log_mu, const float* d_eta,
                   const float* z_alpha, const float* z_beta, const float* z_mu, const float* z_eta,
                   const float* A_log, const float* dt_bias, const float* Mu_log, const float* mu_bias,
                   const float* log_factor, int64_t rows, int64_t heads, const MdnGateOptions& opt, float* dz_alpha,
                   float* dz_beta, float* dz_mu, float* dz_eta, float* dA_log, float* ddt_bias, float* dMu_log,
                   float* dmu_bias, float* dlog_factor, void* scratch, cudaStream_t stream) {
  if (rows == 0 || heads == 0) return;
  const GateArgs g{z_alpha, z_beta, z_mu, z_eta, A_log, dt_bias, Mu_log, mu_bias, log_factor, rows, heads, opt};
  const int64_t blocks = ceil_div(rows, kGateRows);
  auto* partial = static_cast<double*>(scratch);
  mdn_gates_bwd_kernel<<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(heads)), kThreads, 0, stream>>>(
      g, d_log_alpha, d_beta, d_log_mu, d_eta, dz_alpha, dz_beta, dz_mu, dz_eta, partial);
  LLMT_CUDA_CHECK_LAUNCH();
  float* const grads[kGateGrads] = {dA_log, ddt_bias, dMu_log, dmu_bias, dlog_factor};  // the kernel's order
  for (int q = 0; q < kGateGrads; ++q)
    if (opt.momentum || (q != 2 && q != 3)) add_partials(partial + q * blocks * heads, blocks, heads, grads[q], stream);
}

size_t mdn_gates_bwd_scratch_bytes(int64_t rows, int64_t heads) {
  return sizeof(double) * static_cast<size_t>(kGateGrads * ceil_div(rows, kGateRows) * heads);
}

void mdn_correction_fwd(const float* q, const float* k, const float* D_log, int64_t rows, int64_t heads,
                        int64_t dim, float* q_out, cudaStream_t stream) {
  const int64_t n = rows * heads * dim;
  if (n == 0) return;
  mdn_correction_fwd_kernel<<<grid_for(n), kThreads, 0, stream>>>(q, k, D_log, rows, heads, dim, q_out);
  LLMT_CUDA_CHECK_LAUNCH();
}

void mdn_correction_bwd(const float* dq_out, const float* k, const float* D_log, int64_t rows, int64_t heads,
                        int64_t dim, float* dk, float* dD_log, void* scratch, cudaStream_t stream) {
  if (rows == 0 || heads == 0) return;
  const int64_t blocks = ceil_div(rows, kCorrectionRows);
  auto* partial = static_cast<double*>(scratch);
  mdn_correction_bwd_kernel<<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(heads)), kThreads, 0,
                              stream>>>(dq_out, k, D_log, rows, heads, dim, dk, partial);
  LLMT_CUDA_CHECK_LAUNCH();
  add_partials(partial, blocks, heads, dD_log, stream);
}

size_t mdn_correction_bwd_scratch_bytes(int64_t rows, int64_t heads) {
  return sizeof(double) * static_cast<size_t>(ceil_div(rows, kCorrectionRows) * heads);
}

}  // namespace llmt::cuda
