// The Mamba-3 output side on the GPU (layers-ssm-attn.md §4.3.4, §4.5 step 1; semantics: src/kernels/cpu/
// mamba3_layer.cpp): per (token, head, rank) the optional RMSNorm_P of y with weight norm, the gate
// g = yn ∘ SiLU(z ∘ mimo_z) and the down-projection o = Σ_r mimo_o ∘ g (SISO: o = g), and their backward,
// including the MIMO up-projection's dx. Elementwise kernels; the parameter gradients are per-row terms
// summed by colsum (mamba3.cu).
#include "kernels/cuda/mamba3.cuh"

namespace llmt::cuda::m3 {
namespace {

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

// The output-side values of one (token e, head h, rank r, channel p): yn (normalised, weighted y), n = y rs and
// zr = z ∘ mimo_z.
struct GateAt {
  float yn, n, zr;
};

__device__ GateAt gate_at(const Mamba3Ptrs& p, const Sizes& s, const Buffers& buf, const float* z, int64_t e,
                          int64_t r, int64_t c) {
  const int64_t h = e % s.H, hr = (h * s.R + r) * s.P + c;
  const float y = buf.y[(e * s.R + r) * s.P + c];
  GateAt g;
  g.n = p.norm != nullptr ? y * buf.rs[e * s.R + r] : y;
  g.yn = p.norm != nullptr ? g.n * p.norm[h * s.P + c] : y;
  g.zr = p.mimo_z != nullptr ? z[e * s.P + c] * p.mimo_z[hr] : z[e * s.P + c];
  return g;
}

// rs = 1 / sqrt(mean_P(y^2) + eps) per (token, head, rank).
__global__ void rs_kernel(Sizes s, double eps, Buffers buf) {
  const int64_t n = s.E * s.R;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n; idx += int64_t{gridDim.x} * blockDim.x) {
    const float* y = buf.y + idx * s.P;
    double ss = 0.0;
    for (int64_t c = 0; c < s.P; ++c) ss += static_cast<double>(y[c]) * y[c];
    buf.rs[idx] = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(s.P) + eps));
  }
}

// out[e, p] = Σ_r mimo_o[h, r, p] yn SiLU(zr).   (one thread per (token, head, p))
__global__ void out_kernel(const float* z, const Mamba3Ptrs p, Sizes s, Buffers buf, float* out) {
  const int64_t n = s.E * s.P;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n; idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = idx % s.P, e = idx / s.P, h = e % s.H;
    float acc = 0.0f;
    for (int64_t r = 0; r < s.R; ++r) {
      const GateAt g = gate_at(p, s, buf, z, e, r, c);
      const float mo = p.mimo_o != nullptr ? p.mimo_o[(h * s.R + r) * s.P + c] : 1.0f;
      acc = fmaf(mo * g.yn, g.zr * sigmoidf_(g.zr), acc);
    }
    out[idx] = acc;
  }
}

// dL/dyn = dout mimo_o SiLU(zr) at (token e, head h, rank r, channel c).
__device__ float dyn_at(const float* dout, const Mamba3Ptrs& p, const Sizes& s, int64_t e, int64_t r, int64_t c,
                        const GateAt& g) {
  const float mo = p.mimo_o != nullptr ? p.mimo_o[((e % s.H) * s.R + r) * s.P + c] : 1.0f;
  return dout[e * s.P + c] * mo * g.zr * sigmoidf_(g.zr);
}

// With the output norm: mean_P(u ∘ n), u = dyn ∘ w, per (token, head, rank) into buf.gmean.
__global__ void dy_mean_kernel(const float* dout, const float* z, const Mamba3Ptrs p, Sizes s, Buffers buf) {
  const int64_t n = s.E * s.R;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n; idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = idx % s.R, e = idx / s.R, h = e % s.H;
    double m = 0.0;
    for (int64_t c = 0; c < s.P; ++c) {
      const GateAt g = gate_at(p, s, buf, z, e, r, c);
      m += static_cast<double>(dyn_at(dout, p, s, e, r, c, g)) * p.norm[h * s.P + c] * g.n;
    }
    buf.gmean[idx] = static_cast<float>(m / static_cast<double>(s.P));
  }
}

// Reads dout, z, y (with the norm also rs, gmean) once for both outputs: dy [E R P] = dyn, or with the norm
// dy = rs (u - n mean(u ∘ n)); dz [E P] = Σ_r dzr mimo_z; the per-row terms of dmimo_o (c1), dmimo_z (c2) [E R P]
// (MIMO) and dnorm (c3) [E P] (with the norm).   (one thread per (token, head, p))
__global__ void dy_dz_kernel(const float* dout, const float* z, const Mamba3Ptrs p, Sizes s, Buffers buf,
                             float* dz) {
  const int64_t n = s.E * s.P;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n; idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = idx % s.P, e = idx / s.P, h = e % s.H;
    const float dop = dout[idx];
    float dzh = 0.0f, dnorm = 0.0f;
    for (int64_t r = 0; r < s.R; ++r) {
      const int64_t hr = (h * s.R + r) * s.P + c, er = (e * s.R + r) * s.P + c, ern = e * s.R + r;
      const GateAt g = gate_at(p, s, buf, z, e, r, c);
      const float d = dyn_at(dout, p, s, e, r, c, g);
      buf.dy[er] = p.norm == nullptr ? d : buf.rs[ern] * (d * p.norm[h * s.P + c] - g.n * buf.gmean[ern]);
      const float sg = sigmoidf_(g.zr), silu = g.zr * sg;
      const float dg = p.mimo_o != nullptr ? dop * p.mimo_o[hr] : dop;
      const float dzr = dg * g.yn * sg * (1.0f + g.zr * (1.0f - sg));
      dzh += p.mimo_z != nullptr ? dzr * p.mimo_z[hr] : dzr;
      if (p.mimo_o != nullptr) {
        buf.c1[er] = dop * g.yn * silu;
        buf.c2[er] = dzr * z[idx];
      }
      dnorm = fmaf(dg * silu, g.n, dnorm);
    }
    dz[idx] = dzh;
    if (p.norm != nullptr) buf.c3[idx] = dnorm;
  }
}

// MIMO: dx = Σ_r dv mimo_x and the per-row term of dmimo_x, dv x, into c1.   (one thread per (e, p); SISO's core
// writes dx itself)
__global__ void dx_kernel(const float* x, const float* mimo_x, Sizes s, Buffers buf, float* dx) {
  const int64_t n = s.E * s.P;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n; idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = idx % s.P, e = idx / s.P, h = e % s.H;
    float acc = 0.0f;
    for (int64_t r = 0; r < s.R; ++r) {
      const int64_t er = (e * s.R + r) * s.P + c;
      const float dv = buf.dv[er];
      acc = fmaf(dv, mimo_x[(h * s.R + r) * s.P + c], acc);
      buf.c1[er] = dv * x[idx];
    }
    dx[idx] = acc;
  }
}

}  // namespace

void gate_fwd(const float* z, const Mamba3Ptrs& p, const Sizes& s, const Mamba3Options& opt, const Buffers& buf,
              float* out, cudaStream_t stream) {
  if (p.norm != nullptr) {
    rs_kernel<<<grid_for(s.E * s.R), kThreads, 0, stream>>>(s, opt.eps, buf);
    LLMT_CUDA_CHECK_LAUNCH();
  }
  out_kernel<<<grid_for(s.E * s.P), kThreads, 0, stream>>>(z, p, s, buf, out);
  LLMT_CUDA_CHECK_LAUNCH();
}

void gate_bwd(const float* dout, const float* z, const Mamba3Ptrs& p, const Sizes& s, const Mamba3Options& opt,
              const Buffers& buf, float* dz, const Mamba3GradPtrs& g, cudaStream_t stream) {
  if (p.norm != nullptr) {
    rs_kernel<<<grid_for(s.E * s.R), kThreads, 0, stream>>>(s, opt.eps, buf);
    LLMT_CUDA_CHECK_LAUNCH();
  }
  if (p.norm != nullptr) {
    dy_mean_kernel<<<grid_for(s.E * s.R), kThreads, 0, stream>>>(dout, z, p, s, buf);
    LLMT_CUDA_CHECK_LAUNCH();
  }
  dy_dz_kernel<<<grid_for(s.E * s.P), kThreads, 0, stream>>>(dout, z, p, s, buf, dz);
  LLMT_CUDA_CHECK_LAUNCH();
  const int64_t RP = s.H * s.R * s.P;
  if (p.mimo_o != nullptr) {
    colsum(buf.c1, s.rows, RP, RP, buf, g.mimo_o, stream);
    colsum(buf.c2, s.rows, RP, RP, buf, g.mimo_z, stream);
  }
  if (p.norm != nullptr) colsum(buf.c3, s.rows, s.H * s.P, s.H * s.P, buf, g.norm, stream);
}

void up_bwd(const float* x, const Mamba3Ptrs& p, const Sizes& s, const Buffers& buf, float* dx,
            const Mamba3GradPtrs& g, cudaStream_t stream) {
  if (p.mimo_x == nullptr) return;  // SISO: the core wrote dx (dv)
  dx_kernel<<<grid_for(s.E * s.P), kThreads, 0, stream>>>(x, p.mimo_x, s, buf, dx);
  LLMT_CUDA_CHECK_LAUNCH();
  colsum(buf.c1, s.rows, s.H * s.R * s.P, s.H * s.R * s.P, buf, g.mimo_x, stream);
}

}  // namespace llmt::cuda::m3
