// Mamba-3 per-token scalars and vectors on the GPU (layers-ssm-attn.md §4.3.1, backward §4.5 steps 3–6;
// semantics: src/kernels/cpu/mamba3_prep.h). Elementwise kernels over (token, head) pairs, except the phase
// φ_t = (φ_{t-1} + Δ_t θ_t) mod 2π and its reverse cumsum dψ_t = Σ_{s>=t} dφ_s, which run one thread per
// (batch, head, angle) along the sequence. Δ, θ, φ and every per-row sum in double; q, k stored in fp32.
#include "kernels/cuda/mamba3.cuh"

namespace llmt::cuda::m3 {
namespace {

constexpr double kPi = 3.14159265358979323846;

__device__ double softplus_d(double x) { return x > 20.0 ? x : log1p(exp(x)); }
__device__ double softplus_grad_d(double x) { return x > 20.0 ? 1.0 : 1.0 / (1.0 + exp(-x)); }
__device__ double sigmoid_d(double x) { return 1.0 / (1.0 + exp(-x)); }

// Δ = softplus(dd_dt + dt_bias) of head h in raw row rw.
__device__ double delta(const float* rw, int64_t h, const float* dt_bias) {
  return softplus_d(static_cast<double>(rw[h]) + dt_bias[h]);
}

// ε = (1 - λ) Δ of head h in raw row rw (H heads).
__device__ double eps_of(const float* rw, int64_t H, int64_t h, const float* dt_bias) {
  return (1.0 - sigmoid_d(static_cast<double>(rw[2 * H + h]))) * delta(rw, h, dt_bias);
}

// The rotated pair of state channel n (§4.3.1): SISO (2i, 2i + 1), MIMO (i, i + N/2), for angles i < S. Returns
// the partner channel and sets i and whether n is the pair's first; -1 for an unrotated channel.
__device__ int64_t partner(int64_t n, const Sizes& s, int64_t& i, bool& first) {
  if (s.R == 1) {
    i = n / 2;
    first = n % 2 == 0;
    return i < s.S ? (first ? n + 1 : n - 1) : -1;
  }
  const int64_t half = s.N / 2;
  first = n < half;
  i = first ? n : n - half;
  return i < s.S ? (first ? n + half : n - half) : -1;
}

// Per (token, head): Δ, λ, A, the clamp mask, a = A Δ, γ = λ Δ, ε = (1 - λ) Δ and σ = γ + ε_{t+1}.
__global__ void token_kernel(const float* raw, const float* dt_bias, Sizes s, Mamba3Options opt, Buffers buf) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < s.E; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = e / s.H, h = e % s.H, t = row % s.T;
    const float* rw = raw + row * s.W;
    const double dt = delta(rw, h, dt_bias), x = rw[s.H + h];
    const double f = opt.heavy_tail ? (x >= 0 ? 1.0 + x : 1.0 / (1.0 - x)) : softplus_d(x);
    const double lam = sigmoid_d(static_cast<double>(rw[2 * s.H + h]));
    const bool clamped = -f > -opt.A_floor;
    const double A = clamped ? -opt.A_floor : -f;
    buf.dt[e] = static_cast<float>(dt);
    buf.dtd[e] = dt;
    buf.lam[e] = static_cast<float>(lam);
    buf.A[e] = static_cast<float>(A);
    buf.clamped[e] = clamped ? 1.0f : 0.0f;
    buf.a[e] = static_cast<float>(A * dt);
    buf.gam[e] = static_cast<float>(lam * dt);
    buf.eps[e] = static_cast<float>((1.0 - lam) * dt);
    buf.sig[e] = static_cast<float>(lam * dt + (t + 1 < s.T ? eps_of(rw + s.W, s.H, h, dt_bias) : 0.0));
  }
}

// θ[row, i] = π tanh(angles).   (one thread per (row, i))
__global__ void theta_kernel(const float* raw, Sizes s, double* theta) {
  const int64_t n = s.rows * s.S;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n; idx += int64_t{gridDim.x} * blockDim.x)
    theta[idx] = kPi * tanh(static_cast<double>(raw[(idx / s.S) * s.W + 3 * s.H + idx % s.S]));
}

// fmod(x, 2π), bit for bit, without the library call for |x| < 4π (the phase steps): fmod is exact, and so is
// sign(x) (|x| - 2π) for 2π <= |x| < 4π (Sterbenz's lemma; a zero keeps x's sign, as fmod's); other x (and
// NaN) go to fmod.
__device__ __forceinline__ double mod_2pi(double x) {
  constexpr double k2Pi = 2.0 * kPi;
  const double ax = fabs(x);
  if (ax < k2Pi) return x;
  if (ax < 2.0 * k2Pi) return copysign(ax - k2Pi, x);
  return fmod(x, k2Pi);
}

// Steps loaded ahead by the sequential scans along T (phase_kernel, phase_bwd_kernel), so that their loads
// overlap instead of each step waiting for its own.
constexpr int kAhead = 16;

// φ_t[h, i] = (φ_{t-1} + Δ_t θ_t[i]) mod 2π from φ_{-1} = phase0[b, h, i] (0 when phase0 is null).
// (one thread per (b, h, i))
__global__ void phase_kernel(const double* dtd, const double* theta, const float* phase0, Sizes s, float* phi) {
  const int64_t n = s.B * s.H * s.S;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n; idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = idx % s.S, h = (idx / s.S) % s.H, b = idx / (s.S * s.H);
    double acc = phase0 != nullptr ? static_cast<double>(phase0[idx]) : 0.0;
    for (int64_t t0 = 0; t0 < s.T; t0 += kAhead) {
      double step[kAhead];
#pragma unroll
      for (int u = 0; u < kAhead; ++u) {
        const int64_t row = b * s.T + t0 + u;
        step[u] = t0 + u < s.T ? dtd[row * s.H + h] * theta[row * s.S + i] : 0.0;
      }
#pragma unroll
      for (int u = 0; u < kAhead; ++u) {
        if (t0 + u >= s.T) break;
        acc = mod_2pi(acc + step[u]);
        phi[((b * s.T + t0 + u) * s.H + h) * s.S + i] = static_cast<float>(acc);
      }
    }
  }
}

// RMSNorm_N without weight of each B and C vector: n = x r, r = 1 / sqrt(mean(x^2) + eps).
// (one thread per (row, which, r G + g))
__global__ void bcnorm_kernel(const float* bc, Sizes s, double eps, Buffers buf) {
  const int64_t RG = s.R * s.G, n = s.rows * 2 * RG;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n; idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t rg = idx % RG, which = (idx / RG) % 2, row = idx / (2 * RG);
    const float* x = bc + (row * 2 + which) * RG * s.N + rg * s.N;
    double ss = 0.0;
    for (int64_t j = 0; j < s.N; ++j) ss += static_cast<double>(x[j]) * x[j];
    const double r = 1.0 / sqrt(ss / static_cast<double>(s.N) + eps);
    float* out = (which == 0 ? buf.nb : buf.ncn) + (row * RG + rg) * s.N;
    for (int64_t j = 0; j < s.N; ++j) out[j] = static_cast<float>(x[j] * r);
    (which == 0 ? buf.rb : buf.rc)[row * RG + rg] = static_cast<float>(r);
  }
}

// k = Rot(φ) (n̂_B ∘ w_B + B_bias[h, r]), q likewise with C.   (one thread per (token, head, r, n))
__global__ void qk_kernel(const Mamba3Ptrs p, Sizes s, Buffers buf) {
  const int64_t n_all = s.E * s.R * s.N;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n_all;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t n = idx % s.N, r = (idx / s.N) % s.R, e = idx / (s.N * s.R);
    const int64_t row = e / s.H, h = e % s.H, g = h / (s.H / s.G);
    const int64_t src = (row * s.R * s.G + r * s.G + g) * s.N, bias = (h * s.R + r) * s.N;
    int64_t i = 0;
    bool first = true;
    const int64_t m = partner(n, s, i, first);
    float sn = 0.0f, cs = 1.0f;  // the rotation of the pair, shared by k and q
    if (m >= 0) sincosf(buf.phi[e * s.S + i], &sn, &cs);
    for (int which = 0; which < 2; ++which) {
      const float* nrm = which == 0 ? buf.nb : buf.ncn;
      const float* w = which == 0 ? p.B_norm : p.C_norm;
      const float* bb = which == 0 ? p.B_bias : p.C_bias;
      const float u = fmaf(nrm[src + n], w[n], bb[bias + n]);
      float out = u;
      if (m >= 0) {
        const float um = fmaf(nrm[src + m], w[m], bb[bias + m]);
        out = first ? u * cs - um * sn : um * sn + u * cs;
      }
      (which == 0 ? buf.k : buf.q)[idx] = out;
    }
  }
}

// v[e, r, p] = x[e, p] mimo_x[h, r, p] (x for SISO).   (one thread per (token, head, r, p))
__global__ void up_kernel(const float* x, const float* mimo_x, Sizes s, float* v) {
  const int64_t n = s.E * s.R * s.P;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n; idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t p = idx % s.P, r = (idx / s.P) % s.R, e = idx / (s.P * s.R);
    const float xv = x[e * s.P + p];
    v[idx] = mimo_x != nullptr ? xv * mimo_x[((e % s.H) * s.R + r) * s.P + p] : xv;
  }
}

// Rotation backward (§4.5 step 3) per (token, head, angle i): dφ_i = Σ_{q,k} Σ_r (du_i0 (-u_i1) + du_i1 u_i0) on
// the rotated u; then the pair (i0, i1) of dq, dk un-rotated in place (dū = Rot(φ)^T du).
__global__ void rot_bwd_kernel(Sizes s, Buffers buf) {
  const int64_t n = s.E * s.S;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n; idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = idx % s.S, e = idx / s.S;
    const int64_t i0 = s.R == 1 ? 2 * i : i, i1 = s.R == 1 ? 2 * i + 1 : i + s.N / 2;
    float sn, cs;
    sincosf(buf.phi[idx], &sn, &cs);
    double acc = 0.0;
    for (int which = 0; which < 2; ++which)
      for (int64_t r = 0; r < s.R; ++r) {
        const int64_t o = (e * s.R + r) * s.N;
        const float* rot = (which == 0 ? buf.k : buf.q) + o;
        float* grad = (which == 0 ? buf.dk : buf.dq) + o;
        const float g0 = grad[i0], g1 = grad[i1];
        acc += static_cast<double>(g0) * -rot[i1] + static_cast<double>(g1) * rot[i0];
        grad[i0] = g0 * cs + g1 * sn;
        grad[i1] = g1 * cs - g0 * sn;
      }
    buf.dphi[idx] = static_cast<float>(acc);
  }
}

// dψ_t = Σ_{s>=t} dφ_s in place.   (one thread per (b, h, i))
__global__ void phase_bwd_kernel(Sizes s, float* dphi) {
  const int64_t n = s.B * s.H * s.S;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n; idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = idx % s.S, h = (idx / s.S) % s.H, b = idx / (s.S * s.H);
    double acc = 0.0;
    for (int64_t q0 = 0; q0 < s.T; q0 += kAhead) {  // q: steps from the end, t = T - 1 - q
      float d[kAhead];
#pragma unroll
      for (int u = 0; u < kAhead; ++u)
        d[u] = q0 + u < s.T ? dphi[((b * s.T + s.T - 1 - q0 - u) * s.H + h) * s.S + i] : 0.0f;
#pragma unroll
      for (int u = 0; u < kAhead; ++u) {
        if (q0 + u >= s.T) break;
        acc += d[u];
        dphi[((b * s.T + s.T - 1 - q0 - u) * s.H + h) * s.S + i] = static_cast<float>(acc);
      }
    }
  }
}

// Scalars backward (§4.5 steps 4–6) per (token, head): dΔ = Σ_i θ_i dψ_i + λ dγ + (1 - λ) dε + A da with dε_t =
// dσ_{t-1}; draw's dd_dt, dd_A (0 where clamped) and trap columns.
__global__ void scalar_bwd_kernel(const float* raw, const float* dt_bias, Sizes s, Mamba3Options opt, Buffers buf,
                                  float* draw) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < s.E; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = e / s.H, h = e % s.H, t = row % s.T;
    const float* rw = raw + row * s.W;
    double ddt = 0.0;
    for (int64_t i = 0; i < s.S; ++i) ddt += buf.theta[row * s.S + i] * buf.dphi[e * s.S + i];
    const double lam = sigmoid_d(static_cast<double>(rw[2 * s.H + h])), dt = buf.dtd[e];
    const double dgam = buf.dgam[e], deps = t > 0 ? static_cast<double>(buf.dsig[e - s.H]) : 0.0;
    const double da = buf.da[e];
    ddt += lam * dgam + (1.0 - lam) * deps + static_cast<double>(buf.A[e]) * da;
    float* drw = draw + row * s.W;
    drw[2 * s.H + h] = static_cast<float>(dt * (dgam - deps) * lam * (1.0 - lam));
    const double x = rw[s.H + h];
    const double fgrad = opt.heavy_tail ? (x >= 0 ? 1.0 : 1.0 / ((1.0 - x) * (1.0 - x))) : softplus_grad_d(x);
    drw[s.H + h] = static_cast<float>(buf.clamped[e] != 0.0f ? 0.0 : -dt * da * fgrad);
    drw[h] = static_cast<float>(ddt * softplus_grad_d(static_cast<double>(rw[h]) + dt_bias[h]));
  }
}

// Angles backward: draw[3 H + i] = π (1 - tanh^2) Σ_h Δ_h dψ_h,i.   (one thread per (row, i))
__global__ void angle_bwd_kernel(const float* raw, const double* dtd, Sizes s, const float* dpsi, float* draw) {
  const int64_t n = s.rows * s.S;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n; idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = idx % s.S, row = idx / s.S;
    double acc = 0.0;
    for (int64_t h = 0; h < s.H; ++h) acc += dtd[row * s.H + h] * dpsi[(row * s.H + h) * s.S + i];
    const double th = tanh(static_cast<double>(raw[row * s.W + 3 * s.H + i]));
    draw[row * s.W + 3 * s.H + i] = static_cast<float>(acc * kPi * (1.0 - th * th));
  }
}

// BCNorm backward (§1.1), step 1 per (row, which, r G + g, n): dn̂ = Σ_{h of group g} dū[h, r] into dnb / dnc and
// the weight's per-row term dn̂ ∘ n into cbn / ccn.
__global__ void bcnorm_dn_kernel(Sizes s, Buffers buf) {
  const int64_t RGN = s.R * s.G * s.N, n_all = s.rows * 2 * RGN, hpg = s.H / s.G;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n_all;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = idx % RGN, which = (idx / RGN) % 2, row = idx / (2 * RGN);
    const int64_t n = j % s.N, g = (j / s.N) % s.G, r = j / (s.N * s.G), o = row * RGN + j;
    const float* du = which == 0 ? buf.dk : buf.dq;
    double acc = 0.0;
    for (int64_t h = g * hpg; h < (g + 1) * hpg; ++h) acc += du[((row * s.H + h) * s.R + r) * s.N + n];
    (which == 0 ? buf.dnb : buf.dnc)[o] = static_cast<float>(acc);
    (which == 0 ? buf.cbn : buf.ccn)[o] = static_cast<float>(acc * (which == 0 ? buf.nb : buf.ncn)[o]);
  }
}

// Step 2 per (row, which, r G + g): mean(u ∘ n) with u = dn̂ ∘ w, into mb.
__global__ void bcnorm_mean_kernel(const Mamba3Ptrs p, Sizes s, Buffers buf) {
  const int64_t RG = s.R * s.G, n_all = s.rows * 2 * RG;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n_all;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t rg = idx % RG, which = (idx / RG) % 2, row = idx / (2 * RG), o = (row * RG + rg) * s.N;
    const float* dn = (which == 0 ? buf.dnb : buf.dnc) + o;
    const float* nrm = (which == 0 ? buf.nb : buf.ncn) + o;
    const float* w = which == 0 ? p.B_norm : p.C_norm;
    double m = 0.0;
    for (int64_t j = 0; j < s.N; ++j) m += static_cast<double>(dn[j]) * w[j] * nrm[j];
    buf.mb[idx] = static_cast<float>(m / static_cast<double>(s.N));
  }
}

// Step 3 per (row, which, r G + g, n): dbc = r (u - n mean(u ∘ n)).
__global__ void bcnorm_dx_kernel(const Mamba3Ptrs p, Sizes s, Buffers buf, float* dbc) {
  const int64_t RGN = s.R * s.G * s.N, n_all = s.rows * 2 * RGN;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n_all;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = idx % RGN, which = (idx / RGN) % 2, row = idx / (2 * RGN), n = j % s.N, rg = j / s.N;
    const int64_t o = row * RGN + j, orow = row * s.R * s.G + rg;
    const float dn = (which == 0 ? buf.dnb : buf.dnc)[o], nrm = (which == 0 ? buf.nb : buf.ncn)[o];
    const float rs = (which == 0 ? buf.rb : buf.rc)[orow], w = (which == 0 ? p.B_norm : p.C_norm)[n];
    dbc[idx] = rs * (dn * w - nrm * buf.mb[(row * 2 + which) * s.R * s.G + rg]);
  }
}

// dD[h] += Σ_{b, chunk} dDp in order.   (one thread per head)
__global__ void dD_kernel(const double* dDp, Sizes s, float* dD) {
  const int64_t h = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (h >= s.H) return;
  double acc = 0.0;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t c = 0; c < s.nc; ++c) acc += dDp[(b * s.H + h) * s.nc + c];
  dD[h] = static_cast<float>(dD[h] + acc);
}

}  // namespace

void prep_fwd(const float* x, const float* bc, const float* raw, const Mamba3Ptrs& p, const Sizes& s,
              const Mamba3Options& opt, const Buffers& buf, cudaStream_t stream, const float* phase0) {
  token_kernel<<<grid_for(s.E), kThreads, 0, stream>>>(raw, p.dt_bias, s, opt, buf);
  LLMT_CUDA_CHECK_LAUNCH();
  if (s.S > 0) {
    theta_kernel<<<grid_for(s.rows * s.S), kThreads, 0, stream>>>(raw, s, buf.theta);
    LLMT_CUDA_CHECK_LAUNCH();
    phase_kernel<<<grid_for(s.B * s.H * s.S, 64), 64, 0, stream>>>(buf.dtd, buf.theta, phase0, s, buf.phi);
    LLMT_CUDA_CHECK_LAUNCH();
  }
  bcnorm_kernel<<<grid_for(s.rows * 2 * s.R * s.G), kThreads, 0, stream>>>(bc, s, opt.eps, buf);
  LLMT_CUDA_CHECK_LAUNCH();
  qk_kernel<<<grid_for(s.E * s.R * s.N), kThreads, 0, stream>>>(p, s, buf);
  LLMT_CUDA_CHECK_LAUNCH();
  up_kernel<<<grid_for(s.E * s.R * s.P), kThreads, 0, stream>>>(x, p.mimo_x, s, buf.v);
  LLMT_CUDA_CHECK_LAUNCH();
}

void prep_bwd(const float* raw, const Mamba3Ptrs& p, const Sizes& s, const Mamba3Options& opt, const Buffers& buf,
              float* dbc, float* draw, const Mamba3GradPtrs& g, cudaStream_t stream) {
  if (s.S > 0) {
    rot_bwd_kernel<<<grid_for(s.E * s.S), kThreads, 0, stream>>>(s, buf);
    LLMT_CUDA_CHECK_LAUNCH();
    phase_bwd_kernel<<<grid_for(s.B * s.H * s.S, 64), 64, 0, stream>>>(s, buf.dphi);
    LLMT_CUDA_CHECK_LAUNCH();
    angle_bwd_kernel<<<grid_for(s.rows * s.S), kThreads, 0, stream>>>(raw, buf.dtd, s, buf.dphi, draw);
    LLMT_CUDA_CHECK_LAUNCH();
  }
  scalar_bwd_kernel<<<grid_for(s.E), kThreads, 0, stream>>>(raw, p.dt_bias, s, opt, buf, draw);
  LLMT_CUDA_CHECK_LAUNCH();
  const int64_t bc_all = s.rows * 2 * s.R * s.G;
  bcnorm_dn_kernel<<<grid_for(bc_all * s.N), kThreads, 0, stream>>>(s, buf);
  LLMT_CUDA_CHECK_LAUNCH();
  bcnorm_mean_kernel<<<grid_for(bc_all), kThreads, 0, stream>>>(p, s, buf);
  LLMT_CUDA_CHECK_LAUNCH();
  bcnorm_dx_kernel<<<grid_for(bc_all * s.N), kThreads, 0, stream>>>(p, s, buf, dbc);
  LLMT_CUDA_CHECK_LAUNCH();
  const int64_t RN = s.H * s.R * s.N;
  colsum(buf.dk, s.rows, RN, RN, buf, g.B_bias, stream);
  colsum(buf.dq, s.rows, RN, RN, buf, g.C_bias, stream);
  colsum(buf.cbn, s.rows * s.R * s.G, s.N, s.N, buf, g.B_norm, stream);
  colsum(buf.ccn, s.rows * s.R * s.G, s.N, s.N, buf, g.C_norm, stream);
  colsum(draw, s.rows, s.H, s.W, buf, g.dt_bias, stream);
  dD_kernel<<<static_cast<unsigned>(ceil_div(s.H, kThreads)), kThreads, 0, stream>>>(buf.dDp, s, g.D);
  LLMT_CUDA_CHECK_LAUNCH();
}

}  // namespace llmt::cuda::m3
