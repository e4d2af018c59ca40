// The Mamba-3 layer op on the GPU (ops.cuh mamba3_fwd/bwd/decode; layers-ssm-attn.md §4.3–4.6): the scratch, the
// fixed-order column sums of the parameter gradients, and the order of the phases: prep (mamba3_prep.cu), the
// chunked core (mamba3_core.cu) or the decode recurrence (mamba3_decode.cu), the gate (mamba3_gate.cu); the
// backward recomputes the forward first.
#include <type_traits>

#include "kernels/cuda/mamba3.cuh"

namespace llmt::cuda {
namespace {

using m3::Buffers;
using m3::Sizes;

// Carves the scratch into buf (256-byte aligned arrays), or only sizes it when base is null.
size_t carve(const Sizes& s, bool backward, void* base, Buffers* out) {
  size_t off = 0;
  auto take = [&](auto*& p, int64_t n) {
    using T = std::remove_reference_t<decltype(*p)>;
    if (base != nullptr) p = reinterpret_cast<T*>(static_cast<char*>(base) + off);
    off += (static_cast<size_t>(n) * sizeof(T) + 255) / 256 * 256;
  };
  Buffers b{};
  const int64_t E = s.E, RGN = s.rows * s.R * s.G * s.N, states = s.B * s.H * s.nc * s.P * s.N;
  for (float** p : {&b.dt, &b.lam, &b.A, &b.clamped, &b.a, &b.gam, &b.eps, &b.sig}) take(*p, E);
  take(b.dtd, E);
  take(b.theta, s.rows * s.S);
  take(b.phi, E * s.S);
  take(b.nb, RGN);
  take(b.ncn, RGN);
  take(b.rb, s.rows * s.R * s.G);
  take(b.rc, s.rows * s.R * s.G);
  take(b.q, E * s.R * s.N);
  take(b.k, E * s.R * s.N);
  take(b.v, E * s.R * s.P);
  take(b.y, E * s.R * s.P);
  take(b.rs, E * s.R);
  take(b.G, s.B * s.H * s.nc * s.Lc);
  take(b.states, states);
  if (backward) {
    for (float** p : {&b.dy, &b.dv, &b.c1, &b.c2}) take(*p, E * s.R * s.P);
    take(b.dq, E * s.R * s.N);
    take(b.dk, E * s.R * s.N);
    for (float** p : {&b.da, &b.dgam, &b.dsig}) take(*p, E);
    take(b.dstates, states);
    take(b.dphi, E * s.S);
    take(b.c3, E * s.P);
    take(b.cbn, RGN);
    take(b.ccn, RGN);
    take(b.dnb, RGN);
    take(b.dnc, RGN);
    take(b.mb, 2 * s.rows * s.R * s.G);
    take(b.gmean, E * s.R);
    take(b.dDp, s.B * s.H * s.nc);
    const int64_t widest = std::max({s.H * s.R * s.N, s.H * s.R * s.P, s.N, s.H});
    take(b.partial, m3::kSplits * widest);
  }
  if (out != nullptr) *out = b;
  return off;
}

// The entry points' common start: s = the layer's sizes, checked against the kernels' limits, and the pointer set
// checked against the rank and options (throws naming the mismatch); then, when there is work (E > 0), the scratch
// carved into buf for the forward or the backward. Returns false when there is nothing to compute.
bool begin(const Mamba3Ptrs& p, const cpu::Mamba3LayerDims& dims, const Mamba3Options& opt, bool backward,
           void* scratch, Sizes& s, Buffers& buf) {
  s = m3::make_sizes(dims);
  check(s.G >= 1 && s.H % s.G == 0, "mamba3: n_groups ({}) must divide the number of heads ({})", s.G, s.H);
  check(s.S >= 0 && 2 * s.S <= s.N && (s.R == 1 || s.N % 2 == 0), "mamba3: {} rotation angles do not fit d_state {}",
        s.S, s.N);
  m3::core_check(s, opt.bf16_products);
  const bool mimo = p.mimo_x != nullptr && p.mimo_z != nullptr && p.mimo_o != nullptr;
  const bool siso = p.mimo_x == nullptr && p.mimo_z == nullptr && p.mimo_o == nullptr;
  check(s.R == 1 ? siso : mimo, "mamba3: mimo_x, mimo_z, mimo_o must be given exactly when rank > 1 (rank {})", s.R);
  check((p.norm != nullptr) == opt.outproj_norm,
        "mamba3: the output-norm weight must be given exactly with outproj_norm");
  if (s.E == 0) return false;
  carve(s, backward, scratch, &buf);
  return true;
}

// partial[sp cols + c] = Σ_{row in range sp} in[row ld + c].   (grid (column blocks, splits))
__global__ void colsum_partial_kernel(const float* in, int64_t rows, int64_t cols, int64_t ld, int64_t splits,
                                      double* partial) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x, sp = blockIdx.y;
  if (c >= cols) return;
  double acc = 0.0;
  for (int64_t r = rows * sp / splits; r < rows * (sp + 1) / splits; ++r) acc += in[r * ld + c];
  partial[sp * cols + c] = acc;
}

// out[c] += Σ_sp partial[sp cols + c] in order.
__global__ void colsum_final_kernel(const double* partial, int64_t cols, int64_t splits, float* out) {
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < cols; c += int64_t{gridDim.x} * blockDim.x) {
    double acc = 0.0;
    for (int64_t sp = 0; sp < splits; ++sp) acc += partial[sp * cols + c];
    out[c] = static_cast<float>(out[c] + acc);
  }
}

}  // namespace

namespace m3 {

void colsum(const float* in, int64_t rows, int64_t cols, int64_t ld, const Buffers& buf, float* out,
            cudaStream_t stream) {
  const int64_t splits = std::clamp<int64_t>(rows / 256, 1, kSplits);
  const dim3 grid(static_cast<unsigned>(ceil_div(cols, kThreads)), static_cast<unsigned>(splits));
  colsum_partial_kernel<<<grid, kThreads, 0, stream>>>(in, rows, cols, ld, splits, buf.partial);
  LLMT_CUDA_CHECK_LAUNCH();
  colsum_final_kernel<<<grid_for(cols), kThreads, 0, stream>>>(buf.partial, cols, splits, out);
  LLMT_CUDA_CHECK_LAUNCH();
}

}  // namespace m3

size_t mamba3_fwd_scratch_bytes(const cpu::Mamba3LayerDims& dims, const Mamba3Options&) {
  return carve(m3::make_sizes(dims), false, nullptr, nullptr);
}

size_t mamba3_bwd_scratch_bytes(const cpu::Mamba3LayerDims& dims, const Mamba3Options&) {
  return carve(m3::make_sizes(dims), true, nullptr, nullptr);
}

void mamba3_fwd(const float* x, const float* z, const float* bc, const float* raw, const Mamba3Ptrs& params,
                const cpu::Mamba3LayerDims& dims, const Mamba3Options& opt, float* out, void* scratch,
                cudaStream_t stream) {
  Sizes s;
  Buffers buf;
  if (!begin(params, dims, opt, false, scratch, s, buf)) return;
  const Mamba3Ptrs& p = params;
  m3::prep_fwd(x, bc, raw, p, s, opt, buf, stream);
  m3::core_fwd(p.D, s, buf, opt.bf16_products, stream);
  m3::gate_fwd(z, p, s, opt, buf, out, stream);
}

void mamba3_decode(const float* x, const float* z, const float* bc, const float* raw, const Mamba3Ptrs& params,
                   const cpu::Mamba3LayerDims& dims, const Mamba3Options& opt, const Mamba3CarryPtrs& carry, float* out,
                   void* scratch, cudaStream_t stream) {
  Sizes s;
  Buffers buf;
  if (!begin(params, dims, opt, false, scratch, s, buf)) return;
  const Mamba3Ptrs& p = params;
  m3::prep_fwd(x, bc, raw, p, s, opt, buf, stream, carry.phase);
  m3::step_fwd(p.D, s, buf, carry.state, carry.k_prev, carry.v_prev, carry.phase, stream);
  m3::gate_fwd(z, p, s, opt, buf, out, stream);
}

void mamba3_bwd(const float* dout, const float* x, const float* z, const float* bc, const float* raw,
                const Mamba3Ptrs& params, const cpu::Mamba3LayerDims& dims, const Mamba3Options& opt, float* dx,
                float* dz, float* dbc, float* draw, const Mamba3GradPtrs& grads, void* scratch,
                cudaStream_t stream) {
  Sizes s;
  Buffers buf;
  if (!begin(params, dims, opt, true, scratch, s, buf)) return;
  const Mamba3Ptrs& p = params;
  m3::prep_fwd(x, bc, raw, p, s, opt, buf, stream);
  m3::core_fwd(p.D, s, buf, opt.bf16_products, stream);
  m3::gate_bwd(dout, z, p, s, opt, buf, dz, grads, stream);
  m3::core_bwd(p.D, s, buf, opt.bf16_products, stream);
  m3::up_bwd(x, p, s, buf, dx, grads, stream);
  m3::prep_bwd(raw, p, s, opt, buf, dbc, draw, grads, stream);
}

}  // namespace llmt::cuda
