// The Mamba-3 output side on the GPU (layers-ssm-attn.md §4.3.4, §4.5 step 1; semantics: src/kernels/cpu/
// mamba3_layer.cpp): per (token, head, rank) the optional RMSNorm_P of y with weight norm, the gate
// g = yn ∘ SiLU(z ∘ mimo_z) and the down-projection o = Σ_r mimo_o ∘ g (SISO: o = g), and their backward,
// including the MIMO up-projection's dx. Elementwise kernels (the gate and its backward four or eight channels per
// thread where the tensors allow vector loads: each_group); the parameter gradients are per-row terms summed by colsum
// (mamba3.cu). y and dy are fp32 or (bf16 products: Buffers y_h, dy_h) bf16, the kernels templates on their type Y;
// the activations z, out, dout, dz, x, dx fp32 or bf16 (ops.cuh mamba3_fwd<A>), the kernels templates on their type
// A (bf16 stores rounded to nearest even); the arithmetic is fp32 either way.
#include <type_traits>

#include "kernels/cuda/mamba3.cuh"

namespace llmt::cuda::m3 {
namespace {

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

// The output-side values of one (token e, head h, rank r, channel c) from its y, z and (with the norm) rs: yn
// (normalised, weighted y), n = y rs and zr = z ∘ mimo_z.
struct GateAt {
  float yn, n, zr;
};

__device__ __forceinline__ GateAt gate_of(const Mamba3Ptrs& p, const Sizes& s, float y, float z, float rs,
                                          int64_t h, int64_t r, int64_t c) {
  GateAt g;
  g.n = p.norm != nullptr ? y * rs : y;
  g.yn = p.norm != nullptr ? g.n * p.norm[h * s.P + c] : y;
  g.zr = p.mimo_z != nullptr ? z * p.mimo_z[(h * s.R + r) * s.P + c] : z;
  return g;
}

// y (fp32 or bf16 [E R P]) at (token e, rank r, channel c); z fp32 or bf16 (A).
template <typename Y, typename A>
__device__ GateAt gate_at(const Mamba3Ptrs& p, const Sizes& s, const Buffers& buf, const Y* y, const A* z,
                          int64_t e, int64_t r, int64_t c) {
  const float rs = p.norm != nullptr ? buf.rs[e * s.R + r] : 1.0f;
  return gate_of(p, s, to_f32(y[(e * s.R + r) * s.P + c]), to_f32(z[e * s.P + c]), rs, e % s.H, r, c);
}

// rs = 1 / sqrt(mean_P(y^2) + eps) per (token, head, rank), y fp32 or bf16.
template <typename Y>
__global__ void rs_kernel(Sizes s, double eps, const Y* y, Buffers buf) {
  const int64_t n = s.E * s.R;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n; idx += int64_t{gridDim.x} * blockDim.x) {
    const Y* yr = y + idx * s.P;
    double ss = 0.0;
    for (int64_t c = 0; c < s.P; ++c) {
      const double v = to_f32(yr[c]);
      ss += v * v;
    }
    buf.rs[idx] = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(s.P) + eps));
  }
}

// kW consecutive values at p (float or bf16) as floats, loaded or stored together (p aligned to the pieces): kW = 4
// one 16-byte float4 or one 8-byte piece of 4 bf16; kW = 8 two float4 or one 16-byte piece of 8 bf16; bf16 stores
// round to nearest even.
template <int kW>
struct Floats {
  float v[kW];
};
template <int kW, typename T>
__device__ __forceinline__ Floats<kW> load_w(const T* p) {
  Floats<kW> f;
  if constexpr ((kW == 4 || kW == 8) && std::is_same_v<T, float>) {
#pragma unroll
    for (int q = 0; q < kW / 4; ++q) {
      const float4 x = reinterpret_cast<const float4*>(p)[q];
      f.v[4 * q] = x.x, f.v[4 * q + 1] = x.y, f.v[4 * q + 2] = x.z, f.v[4 * q + 3] = x.w;
    }
  } else if constexpr (kW == 4 || kW == 8) {
    using Piece = std::conditional_t<kW == 4, uint2, uint4>;
    const Piece x = *reinterpret_cast<const Piece*>(p);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&x);
#pragma unroll
    for (int q = 0; q < kW / 2; ++q) {
      const float2 t = __bfloat1622float2(h[q]);
      f.v[2 * q] = t.x, f.v[2 * q + 1] = t.y;
    }
  } else {
#pragma unroll
    for (int w = 0; w < kW; ++w) f.v[w] = to_f32(p[w]);
  }
  return f;
}
template <int kW, typename T>
__device__ __forceinline__ void store_w(T* p, const Floats<kW>& f) {
  if constexpr ((kW == 4 || kW == 8) && std::is_same_v<T, float>) {
#pragma unroll
    for (int q = 0; q < kW / 4; ++q)
      reinterpret_cast<float4*>(p)[q] = make_float4(f.v[4 * q], f.v[4 * q + 1], f.v[4 * q + 2], f.v[4 * q + 3]);
  } else if constexpr (kW == 4 || kW == 8) {
    using Piece = std::conditional_t<kW == 4, uint2, uint4>;
    Piece x;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&x);
#pragma unroll
    for (int q = 0; q < kW / 2; ++q) h[q] = __floats2bfloat162_rn(f.v[2 * q], f.v[2 * q + 1]);
    *reinterpret_cast<Piece*>(p) = x;
  } else {
#pragma unroll
    for (int w = 0; w < kW; ++w) p[w] = from_f32<T>(f.v[w]);
  }
}

// The elementwise gate kernels' element groups: kW consecutive channels c .. c + kW - 1 of one (token, head) e
// (P % kW == 0), as many loads in flight per thread (gate_width): 8 for SISO without the norm (is_plain) where the
// activations and y, dy are bf16 (so that a thread's loads are 16 bytes each, as fp32's at 4: half the bytes in
// flight otherwise, and the kernels wait on latency), P % 8 == 0 and every tensor they touch is 16-byte aligned;
// else 4 where P % 4 == 0 and they are 16-byte aligned; else 1.
template <int kW, typename F>
__device__ __forceinline__ void each_group(const Sizes& s, F f) {
  const int64_t n = s.E * s.P / kW;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t idx = i * kW, c = idx % s.P, e = idx / s.P;
    f(idx, e, e % s.H, c);
  }
}
bool aligned16(std::initializer_list<const void*> ps) {
  for (const void* p : ps)
    if (p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}
// SISO without the output norm (every shipped config): Mamba3Ptrs and Sizes with the norm and the MIMO projections
// absent and R = 1 as compile-time facts where kPlain, so that the gate kernels' branches for them compile away.
template <bool kPlain>
__device__ __forceinline__ void make_plain(Mamba3Ptrs& p, Sizes& s) {
  if constexpr (kPlain) {
    p.norm = nullptr;
    p.mimo_z = nullptr;
    p.mimo_o = nullptr;
    s.R = 1;
  }
}
bool is_plain(const Mamba3Ptrs& p, const Sizes& s) {
  return p.norm == nullptr && p.mimo_z == nullptr && p.mimo_o == nullptr && s.R == 1;
}

// wide: SISO without the norm with bf16 activations and y, dy (is_plain and all_bf16).
int gate_width(const Sizes& s, bool wide, std::initializer_list<const void*> ps) {
  if (!aligned16(ps)) return 1;
  return wide && s.P % 8 == 0 ? 8 : s.P % 4 == 0 ? 4 : 1;
}
template <typename Y, typename A>
constexpr bool all_bf16 = std::is_same_v<Y, __nv_bfloat16> && std::is_same_v<A, __nv_bfloat16>;

// out[e, p] = Σ_r mimo_o[h, r, p] yn SiLU(zr), y fp32 or bf16 (Y), z, out fp32 or bf16 (A). kPlain: SISO without
// the norm (is_plain; make_plain).   (kW channels per thread: each_group)
template <int kW, bool kPlain, typename Y, typename A>
__global__ void out_kernel(const A* z, Mamba3Ptrs p, Sizes s, Buffers buf, const Y* y, A* out) {
  make_plain<kPlain>(p, s);
  each_group<kW>(s, [&](int64_t idx, int64_t e, int64_t h, int64_t c) {
    const Floats<kW> zv = load_w<kW>(z + idx);
    Floats<kW> acc = {};
    for (int64_t r = 0; r < s.R; ++r) {
      const Floats<kW> yv = load_w<kW>(y + (e * s.R + r) * s.P + c);
      const float rs = p.norm != nullptr ? buf.rs[e * s.R + r] : 1.0f;
#pragma unroll
      for (int w = 0; w < kW; ++w) {
        const GateAt g = gate_of(p, s, yv.v[w], zv.v[w], rs, h, r, c + w);
        const float mo = p.mimo_o != nullptr ? p.mimo_o[(h * s.R + r) * s.P + c + w] : 1.0f;
        acc.v[w] = fmaf(mo * g.yn, g.zr * sigmoidf_(g.zr), acc.v[w]);
      }
    }
    store_w<kW>(out + idx, acc);
  });
}

// dL/dyn = dout mimo_o SiLU(zr) at (head h, rank r, channel c) from its dout.
__device__ __forceinline__ float dyn_of(float dop, const Mamba3Ptrs& p, const Sizes& s, int64_t h, int64_t r,
                                        int64_t c, const GateAt& g) {
  const float mo = p.mimo_o != nullptr ? p.mimo_o[(h * s.R + r) * s.P + c] : 1.0f;
  return dop * mo * g.zr * sigmoidf_(g.zr);
}

// With the output norm: mean_P(u ∘ n), u = dyn ∘ w, per (token, head, rank) into buf.gmean (y fp32 or bf16; dout,
// z fp32 or bf16: A).
template <typename Y, typename A>
__global__ void dy_mean_kernel(const A* dout, const A* z, const Mamba3Ptrs p, Sizes s, Buffers buf, const Y* y) {
  const int64_t n = s.E * s.R;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n; idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = idx % s.R, e = idx / s.R, h = e % s.H;
    double m = 0.0;
    for (int64_t c = 0; c < s.P; ++c) {
      const GateAt g = gate_at(p, s, buf, y, z, e, r, c);
      m += static_cast<double>(dyn_of(to_f32(dout[e * s.P + c]), p, s, h, r, c, g)) * p.norm[h * s.P + c] * g.n;
    }
    buf.gmean[idx] = static_cast<float>(m / static_cast<double>(s.P));
  }
}

// Reads dout, z, y (with the norm also rs, gmean) once for both outputs: dy [E R P] = dyn, or with the norm
// dy = rs (u - n mean(u ∘ n)); dz [E P] = Σ_r dzr mimo_z; the per-row terms of dmimo_o (c1), dmimo_z (c2) [E R P]
// (MIMO) and dnorm (c3) [E P] (with the norm). y, dy fp32 or bf16 (Y; dy rounded on its store); dout, z, dz fp32 or
// bf16 (A; dz rounded on its store). kPlain: SISO without the norm (is_plain; make_plain). (kW channels per thread:
// each_group; at most 64 registers, 4 blocks per SM, their loads in flight together)
template <int kW, bool kPlain, typename Y, typename A>
__global__ void __launch_bounds__(kThreads, 4)
    dy_dz_kernel(const A* dout, const A* z, Mamba3Ptrs p, Sizes s, Buffers buf, const Y* y, Y* dy_out, A* dz) {
  make_plain<kPlain>(p, s);
  each_group<kW>(s, [&](int64_t idx, int64_t e, int64_t h, int64_t c) {
    const Floats<kW> dov = load_w<kW>(dout + idx), zv = load_w<kW>(z + idx);
    Floats<kW> dzh = {}, dnorm = {};
    for (int64_t r = 0; r < s.R; ++r) {
      const int64_t er = (e * s.R + r) * s.P + c, ern = e * s.R + r;
      const Floats<kW> yv = load_w<kW>(y + er);
      const float rs = p.norm != nullptr ? buf.rs[ern] : 1.0f;
      Floats<kW> dy, c1, c2;
#pragma unroll
      for (int w = 0; w < kW; ++w) {
        const int64_t hr = (h * s.R + r) * s.P + c + w;
        const float dop = dov.v[w];
        const GateAt g = gate_of(p, s, yv.v[w], zv.v[w], rs, h, r, c + w);
        const float d = dyn_of(dop, p, s, h, r, c + w, g);
        dy.v[w] = p.norm == nullptr ? d : rs * (d * p.norm[h * s.P + c + w] - g.n * buf.gmean[ern]);
        const float sg = sigmoidf_(g.zr), silu = g.zr * sg;
        const float dg = p.mimo_o != nullptr ? dop * p.mimo_o[hr] : dop;
        const float dzr = dg * g.yn * sg * (1.0f + g.zr * (1.0f - sg));
        dzh.v[w] += p.mimo_z != nullptr ? dzr * p.mimo_z[hr] : dzr;
        c1.v[w] = dop * g.yn * silu;
        c2.v[w] = dzr * zv.v[w];
        dnorm.v[w] = fmaf(dg * silu, g.n, dnorm.v[w]);
      }
      store_w<kW>(dy_out + er, dy);
      if (p.mimo_o != nullptr) {
        store_w<kW>(buf.c1 + er, c1);
        store_w<kW>(buf.c2 + er, c2);
      }
    }
    store_w<kW>(dz + idx, dzh);
    if (p.norm != nullptr) store_w<kW>(buf.c3 + idx, dnorm);
  });
}

// MIMO: dx = Σ_r dv mimo_x and the per-row term of dmimo_x, dv x, into c1; x, dx fp32 or bf16 (A; dx rounded on its
// store).   (one thread per (e, p); SISO's core writes dx itself)
template <typename A>
__global__ void dx_kernel(const A* x, const float* mimo_x, Sizes s, Buffers buf, A* dx) {
  const int64_t n = s.E * s.P;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n; idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = idx % s.P, e = idx / s.P, h = e % s.H;
    const float xv = to_f32(x[idx]);
    float acc = 0.0f;
    for (int64_t r = 0; r < s.R; ++r) {
      const int64_t er = (e * s.R + r) * s.P + c;
      const float dv = buf.dv[er];
      acc = fmaf(dv, mimo_x[(h * s.R + r) * s.P + c], acc);
      buf.c1[er] = dv * xv;
    }
    dx[idx] = from_f32<A>(acc);
  }
}

// f(y, dy) with buf's core output and its gradient: bf16 (y_h, dy_h) where y_h is set, else fp32 (y, dy).
template <class F>
void with_y(const Buffers& buf, F f) {
  if (buf.y_h != nullptr)
    f(buf.y_h, buf.dy_h);
  else
    f(buf.y, buf.dy);
}

}  // namespace

template <typename A>
void gate_fwd(const A* z, const Mamba3Ptrs& p, const Sizes& s, const Mamba3Options& opt, const Buffers& buf, A* out,
              cudaStream_t stream) {
  with_y(buf, [&](auto* y, auto*) {
    using Y = std::remove_pointer_t<decltype(y)>;
    if (p.norm != nullptr) {
      rs_kernel<Y><<<grid_for(s.E * s.R), kThreads, 0, stream>>>(s, opt.eps, y, buf);
      LLMT_CUDA_CHECK_LAUNCH();
    }
    const bool plain = is_plain(p, s);
    const int w = gate_width(s, plain && all_bf16<Y, A>, {z, y, out});
    auto kernel = w == 4 ? (plain ? out_kernel<4, true, Y, A> : out_kernel<4, false, Y, A>)
                         : (plain ? out_kernel<1, true, Y, A> : out_kernel<1, false, Y, A>);
    if constexpr (all_bf16<Y, A>)
      if (w == 8) kernel = out_kernel<8, true, Y, A>;
    kernel<<<grid_for(s.E * s.P), kThreads, 0, stream>>>(z, p, s, buf, y, out);
    LLMT_CUDA_CHECK_LAUNCH();
  });
}

template <typename A>
void gate_bwd(const A* dout, const A* z, const Mamba3Ptrs& p, const Sizes& s, const Mamba3Options& opt,
              const Buffers& buf, A* dz, const Mamba3GradPtrs& g, cudaStream_t stream) {
  with_y(buf, [&](auto* y, auto* dy) {
    using Y = std::remove_pointer_t<decltype(y)>;
    if (p.norm != nullptr) {
      rs_kernel<Y><<<grid_for(s.E * s.R), kThreads, 0, stream>>>(s, opt.eps, y, buf);
      LLMT_CUDA_CHECK_LAUNCH();
      dy_mean_kernel<Y, A><<<grid_for(s.E * s.R), kThreads, 0, stream>>>(dout, z, p, s, buf, y);
      LLMT_CUDA_CHECK_LAUNCH();
    }
    const bool plain = is_plain(p, s);
    const int w = gate_width(s, plain && all_bf16<Y, A>, {dout, z, y, dy, dz, buf.c1, buf.c2, buf.c3});
    auto kernel = w == 4 ? (plain ? dy_dz_kernel<4, true, Y, A> : dy_dz_kernel<4, false, Y, A>)
                         : (plain ? dy_dz_kernel<1, true, Y, A> : dy_dz_kernel<1, false, Y, A>);
    if constexpr (all_bf16<Y, A>)
      if (w == 8) kernel = dy_dz_kernel<8, true, Y, A>;
    kernel<<<grid_for(s.E * s.P), kThreads, 0, stream>>>(dout, z, p, s, buf, y, dy, dz);
    LLMT_CUDA_CHECK_LAUNCH();
  });
  const int64_t RP = s.H * s.R * s.P;
  if (p.mimo_o != nullptr) {
    colsum(buf.c1, s.rows, RP, RP, buf, g.mimo_o, stream);
    colsum(buf.c2, s.rows, RP, RP, buf, g.mimo_z, stream);
  }
  if (p.norm != nullptr) colsum(buf.c3, s.rows, s.H * s.P, s.H * s.P, buf, g.norm, stream);
}

template <typename A>
void up_bwd(const A* x, const Mamba3Ptrs& p, const Sizes& s, const Buffers& buf, A* dx, const Mamba3GradPtrs& g,
            cudaStream_t stream) {
  if (p.mimo_x == nullptr) return;  // SISO: the core wrote dx (dv)
  dx_kernel<A><<<grid_for(s.E * s.P), kThreads, 0, stream>>>(x, p.mimo_x, s, buf, dx);
  LLMT_CUDA_CHECK_LAUNCH();
  colsum(buf.c1, s.rows, s.H * s.R * s.P, s.H * s.R * s.P, buf, g.mimo_x, stream);
}

#define LLMT_MAMBA3_GATE_INSTANTIATE(A)                                                                              \
  template void gate_fwd<A>(const A*, const Mamba3Ptrs&, const Sizes&, const Mamba3Options&, const Buffers&, A*,    \
                            cudaStream_t);                                                                          \
  template void gate_bwd<A>(const A*, const A*, const Mamba3Ptrs&, const Sizes&, const Mamba3Options&,              \
                            const Buffers&, A*, const Mamba3GradPtrs&, cudaStream_t);                               \
  template void up_bwd<A>(const A*, const Mamba3Ptrs&, const Sizes&, const Buffers&, A*, const Mamba3GradPtrs&,     \
                          cudaStream_t);
LLMT_MAMBA3_GATE_INSTANTIATE(float)
LLMT_MAMBA3_GATE_INSTANTIATE(__nv_bfloat16)
#undef LLMT_MAMBA3_GATE_INSTANTIATE

}  // namespace llmt::cuda::m3
