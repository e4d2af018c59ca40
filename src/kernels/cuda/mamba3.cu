// The Mamba-3 layer op on the GPU (ops.cuh mamba3_fwd/bwd/decode; layers-ssm-attn.md §4.3–4.6): the scratch, the
// fixed-order column sums of the parameter gradients, and the order of the phases: prep (mamba3_prep.cu), the
// chunked core (mamba3_core.cu) or the decode recurrence (mamba3_decode.cu), the gate (mamba3_gate.cu). The
// backward recomputes the prep, and the core's forward, unless the forward saved its G, chunk-entering states and y,
// BCNorm's n̂_B, n̂_C, 1 / RMS, φ and q, k (`saved`, model.mamba3.save_states): then the same kernels' values are
// read instead of computed twice (the per-token scalars, θ and MIMO's v are still recomputed).
#include <type_traits>

#include "kernels/cuda/mamba3.cuh"

namespace llmt::cuda {
namespace {

using m3::Buffers;
using m3::Sizes;

// Hands out 256-byte aligned arrays from base (or only counts their bytes when base is null).
struct Carver {
  char* base;
  size_t off = 0;
  template <typename T>
  void take(T*& p, int64_t n) {
    if (base != nullptr) p = reinterpret_cast<T*>(base + off);
    off += (static_cast<size_t>(n) * sizeof(T) + 255) / 256 * 256;
  }
};

// The forward values the backward can read instead of recomputing them (the saved set): G, the states entering
// each chunk, y; BCNorm's n̂_B, n̂_C and their 1 / RMS; φ; q, k. half (the chunked core with bf16 products): the
// states, y, q and k in bf16 (states_h, y_h, qh, kh, places of bf16 size; their fp32 pointers null), the types the
// core's kernels read and write; else all fp32.
void take_saved(const Sizes& s, bool half, Carver& c, Buffers& b) {
  const int64_t RG = s.rows * s.R * s.G, RN = s.E * s.R * s.N, states = s.B * s.H * s.nc * s.P * s.N;
  c.take(b.G, s.B * s.H * s.nc * s.Lc);
  if (half) {
    c.take(b.states_h, states);
    c.take(b.y_h, s.E * s.R * s.P);
  } else {
    c.take(b.states, states);
    c.take(b.y, s.E * s.R * s.P);
  }
  c.take(b.nb, RG * s.N);
  c.take(b.ncn, RG * s.N);
  c.take(b.rb, RG);
  c.take(b.rc, RG);
  c.take(b.phi, s.E * s.S);
  if (half) {
    c.take(b.qh, RN);
    c.take(b.kh, RN);
  } else {
    c.take(b.q, RN);
    c.take(b.k, RN);
  }
}

// Carves the scratch into buf, or only sizes it when base is null. With saved, the saved set lies in
// saved_base (mamba3_saved_bytes; sizing: may be null) instead of the scratch. half (the chunked core with bf16
// products): take_saved's arrays, dy and the adjoint states in bf16 (dy_h, dstates_h; places of bf16 size); else
// fp32 (decoding: its fp32 y, q, k fit a scratch sized with half false). SISO has no v, dv in the scratch (they are
// x, dx: begin).
size_t carve(const Sizes& s, bool backward, bool saved, bool half, void* saved_base, void* base, Buffers* out) {
  Carver c{static_cast<char*>(base)};
  Buffers b{};
  const int64_t E = s.E, RGN = s.rows * s.R * s.G * s.N, states = s.B * s.H * s.nc * s.P * s.N;
  for (float** p : {&b.dt, &b.lam, &b.A, &b.clamped, &b.a, &b.gam, &b.eps, &b.sig}) c.take(*p, E);
  c.take(b.dtd, E);
  c.take(b.theta, s.rows * s.S);
  if (s.R > 1) c.take(b.v, E * s.R * s.P);
  c.take(b.rs, E * s.R);
  Carver kept{static_cast<char*>(saved_base)};
  take_saved(s, half, saved ? kept : c, b);
  if (backward) {
    if (s.R > 1) c.take(b.dv, E * s.R * s.P);
    if (half)
      c.take(b.dy_h, E * s.R * s.P);
    else
      c.take(b.dy, E * s.R * s.P);
    for (float** p : {&b.c1, &b.c2}) c.take(*p, E * s.R * s.P);
    c.take(b.dq, E * s.R * s.N);
    c.take(b.dk, E * s.R * s.N);
    for (float** p : {&b.da, &b.dgam, &b.dsig}) c.take(*p, E);
    if (half)
      c.take(b.dstates_h, states);
    else
      c.take(b.dstates, states);
    c.take(b.dphi, E * s.S);
    c.take(b.c3, E * s.P);
    c.take(b.cbn, RGN);
    c.take(b.ccn, RGN);
    c.take(b.dnb, RGN);
    c.take(b.dnc, RGN);
    c.take(b.gmean, E * s.R);
    c.take(b.dDp, s.B * s.H * s.nc);
    // The columns of the widest colsums call: prep_bwd's (dB_bias, dC_bias, dB_norm, dC_norm, ddt_bias), or one
    // of the gate's.
    const int64_t widest = std::max({2 * s.H * s.R * s.N + 2 * s.N + s.H, s.H * s.R * s.P});
    c.take(b.partial, m3::kSplits * widest);
  }
  if (out != nullptr) *out = b;
  return c.off;
}

// The entry points' common start: s = the layer's sizes, checked against the kernels' limits, and the pointer set
// checked against the rank and options (throws naming the mismatch; bf16 activations A in the chunked op only with
// bf16 products: the fp32 core reads fp32 v); then, when there is work (E > 0), the scratch carved into buf for the
// forward or the backward (the saved set in `saved` when given), and for SISO v = x and (backward) dv = dx (buf.v,
// buf.dv; bf16 A: buf.vh, buf.dvh): the core reads x and writes dx itself; with bf16 products (chunked: not
// decoding) the states, y, q, k, the gradient dy and the adjoint states in bf16 (carve). Returns false when there
// is nothing to compute.
template <typename A>
bool begin(const Mamba3Ptrs& p, const cpu::Mamba3LayerDims& dims, const Mamba3Options& opt, const A* x, A* dx,
           const float* saved, void* scratch, bool chunked, const char* op, Sizes& s, Buffers& buf) {
  constexpr bool kBf16 = std::is_same_v<A, __nv_bfloat16>;
  check(!kBf16 || !chunked || opt.bf16_products,
        "{} (cuda): bf16 activations (x, z, out, dout, dx, dz) need bf16 products (Mamba3Options::bf16_products)", op);
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
  // The saved set and x are written by no kernel of the backward (Buffers has no const pointers).
  const bool half = chunked && opt.bf16_products;
  carve(s, dx != nullptr, saved != nullptr, half, const_cast<float*>(saved), scratch, &buf);
  if (s.R == 1) {
    if constexpr (kBf16) {
      buf.vh = const_cast<__nv_bfloat16*>(x);
      buf.dvh = dx;
    } else {
      buf.v = const_cast<float*>(x);
      buf.dv = dx;
    }
  }
  return true;
}

// The column sums of one colsums call, with where each one's blocks, flat columns and partials start.
struct SumSet {
  m3::ColSum sum[m3::kMaxSums];
  int64_t splits[m3::kMaxSums];      // its row ranges
  int64_t part[m3::kMaxSums];        // the offset of its partials [splits, cols] in buf.partial
  int64_t block0[m3::kMaxSums + 1];  // its first column block (colsum_partial_kernel)
  int64_t col0[m3::kMaxSums + 1];    // its first flat column (colsum_final_kernel)
  int n;
  const double* dDp;  // with dD: the dD sum's per-chunk terms [B, H, nc], or null
  float* dD;
  int64_t B, H, nc;
};

// The sum j holding flat index i of the starts first[0 .. n] (first[j] <= i < first[j + 1]).
__device__ __forceinline__ int sum_of(const int64_t* first, int n, int64_t i) {
  int j = 0;
  while (j + 1 < n && i >= first[j + 1]) ++j;
  return j;
}

// partial[sp cols + c] = Σ_{row in range sp} in[row ld + c] of each column sum with an input.   (grid (column
// blocks of those sums, the largest split count))
__global__ void colsum_partial_kernel(SumSet set, double* partial) {
  const int j = sum_of(set.block0, set.n, blockIdx.x);
  const m3::ColSum q = set.sum[j];
  const int64_t c = (blockIdx.x - set.block0[j]) * int64_t{blockDim.x} + threadIdx.x, sp = blockIdx.y,
                splits = set.splits[j];
  if (c >= q.cols || sp >= splits) return;
  double acc = 0.0;
  for (int64_t r = q.rows * sp / splits; r < q.rows * (sp + 1) / splits; ++r) acc += q.in[r * q.ld + c];
  partial[set.part[j] + sp * q.cols + c] = acc;
}

// colsum_final_kernel's threads per block, and the terms each of its threads loads at once.
constexpr int kFinalThreads = 64, kFinalAhead = 32;

// With dD, blocks [0, H) first: dD[h] += Σ_{b, chunk} dDp in order, head blockIdx.x (the block loads kFinalThreads
// kFinalAhead terms at a time into shared memory, consecutive threads taking consecutive chunks; thread 0 adds them
// in order). The other blocks (grid-stride): out[c] += Σ_sp partial[sp cols + c] in order, one thread per column of
// every sum, kFinalAhead ranges' partials loaded at once.
__global__ void __launch_bounds__(kFinalThreads) colsum_final_kernel(SumSet set, const double* partial) {
  const int x = static_cast<int>(threadIdx.x);
  const int64_t heads = set.dD != nullptr ? set.H : 0;
  if (blockIdx.x < heads) {
    constexpr int kBatch = kFinalThreads * kFinalAhead;
    __shared__ double terms[kBatch];
    const int64_t h = blockIdx.x, m = set.B * set.nc;
    double acc = 0.0;
    for (int64_t k0 = 0; k0 < m; k0 += kBatch) {
      double v[kFinalAhead];
#pragma unroll
      for (int u = 0; u < kFinalAhead; ++u) {
        const int64_t k = k0 + u * kFinalThreads + x;
        v[u] = k < m ? set.dDp[((k / set.nc) * set.H + h) * set.nc + k % set.nc] : 0.0;
      }
#pragma unroll
      for (int u = 0; u < kFinalAhead; ++u) terms[u * kFinalThreads + x] = v[u];
      __syncthreads();
      if (x == 0) {
        const int cnt = static_cast<int>(std::min<int64_t>(kBatch, m - k0));
        for (int j = 0; j < cnt; ++j) acc += terms[j];
      }
      __syncthreads();  // (before the next batch's writes)
    }
    if (x == 0) set.dD[h] = static_cast<float>(set.dD[h] + acc);
    return;
  }
  const int64_t cols = set.col0[set.n];
  for (int64_t i = (blockIdx.x - heads) * int64_t{kFinalThreads} + x; i < cols;
       i += (gridDim.x - heads) * int64_t{kFinalThreads}) {
    const int j = sum_of(set.col0, set.n, i);
    const int64_t c = i - set.col0[j], n = set.sum[j].cols, splits = set.splits[j];
    const double* p = partial + set.part[j] + c;
    double acc = 0.0;
    for (int64_t sp0 = 0; sp0 < splits; sp0 += kFinalAhead) {
      double v[kFinalAhead];
#pragma unroll
      for (int u = 0; u < kFinalAhead; ++u) v[u] = sp0 + u < splits ? p[(sp0 + u) * n] : 0.0;
#pragma unroll
      for (int u = 0; u < kFinalAhead; ++u)
        if (sp0 + u < splits) acc += v[u];
    }
    float* out = set.sum[j].out;
    out[c] = static_cast<float>(out[c] + acc);
  }
}

}  // namespace

namespace m3 {

void colsums(const ColSum* sums, int n, const Buffers& buf, cudaStream_t stream, const Sizes* s, const double* dDp,
             float* dD) {
  check(n >= 1 && n <= kMaxSums, "mamba3: {} column sums in one call (at most {})", n, kMaxSums);
  SumSet set{};
  set.n = n;
  int64_t most = 1, part = 0;
  for (int j = 0; j < n; ++j) {
    set.sum[j] = sums[j];
    set.splits[j] = sums[j].splits > 0 ? sums[j].splits : colsum_ranges(sums[j].rows);
    check(set.splits[j] <= kSplits, "mamba3: a column sum in {} row ranges (at most {})", set.splits[j], kSplits);
    set.part[j] = part;
    part += set.splits[j] * sums[j].cols;
    set.block0[j + 1] = set.block0[j] + (sums[j].in != nullptr ? ceil_div(sums[j].cols, kThreads) : 0);
    set.col0[j + 1] = set.col0[j] + sums[j].cols;
    most = std::max(most, set.splits[j]);
  }
  if (dD != nullptr) {
    set.dDp = dDp;
    set.dD = dD;
    set.B = s->B;
    set.H = s->H;
    set.nc = s->nc;
  }
  if (set.block0[n] > 0) {
    const dim3 grid(static_cast<unsigned>(set.block0[n]), static_cast<unsigned>(most));
    colsum_partial_kernel<<<grid, kThreads, 0, stream>>>(set, buf.partial);
    LLMT_CUDA_CHECK_LAUNCH();
  }
  const unsigned grid = static_cast<unsigned>(set.H) + grid_for(set.col0[n], kFinalThreads);
  colsum_final_kernel<<<grid, kFinalThreads, 0, stream>>>(set, buf.partial);
  LLMT_CUDA_CHECK_LAUNCH();
}

void colsum(const float* in, int64_t rows, int64_t cols, int64_t ld, const Buffers& buf, float* out,
            cudaStream_t stream) {
  const ColSum sum{in, rows, cols, ld, out};
  colsums(&sum, 1, buf, stream);
}

}  // namespace m3

size_t mamba3_saved_bytes(const cpu::Mamba3LayerDims& dims, const Mamba3Options& opt) {
  Buffers b{};
  Carver c{nullptr};
  take_saved(m3::make_sizes(dims), opt.bf16_products, c, b);
  return c.off;
}

// Sized with fp32 places whatever the products: mamba3_decode takes this scratch and writes fp32 y, q, k (the chunked
// forward with bf16 products carves bf16 ones, which fit).
size_t mamba3_fwd_scratch_bytes(const cpu::Mamba3LayerDims& dims, const Mamba3Options&, bool saved) {
  return carve(m3::make_sizes(dims), false, saved, false, nullptr, nullptr, nullptr);
}

size_t mamba3_bwd_scratch_bytes(const cpu::Mamba3LayerDims& dims, const Mamba3Options& opt, bool saved) {
  return carve(m3::make_sizes(dims), true, saved, opt.bf16_products, nullptr, nullptr, nullptr);
}

template <typename A>
void mamba3_fwd(const A* x, const A* z, const float* bc, const float* raw, const Mamba3Ptrs& params,
                const cpu::Mamba3LayerDims& dims, const Mamba3Options& opt, A* out, float* saved, void* scratch,
                cudaStream_t stream) {
  Sizes s;
  Buffers buf;
  if (!begin<A>(params, dims, opt, x, nullptr, saved, scratch, true, "mamba3_fwd", s, buf)) return;
  const Mamba3Ptrs& p = params;
  m3::prep_fwd(x, bc, raw, p, s, opt, buf, stream);
  m3::core_fwd(p.D, s, buf, opt.bf16_products, stream);
  m3::gate_fwd(z, p, s, opt, buf, out, stream);
}

template <typename A>
void mamba3_decode(const A* x, const A* z, const float* bc, const float* raw, const Mamba3Ptrs& params,
                   const cpu::Mamba3LayerDims& dims, const Mamba3Options& opt, const Mamba3CarryPtrs& carry, A* out,
                   void* scratch, cudaStream_t stream) {
  Sizes s;
  Buffers buf;
  if (!begin<A>(params, dims, opt, x, nullptr, nullptr, scratch, false, "mamba3_decode", s, buf)) return;
  const Mamba3Ptrs& p = params;
  m3::prep_fwd(x, bc, raw, p, s, opt, buf, stream, carry.phase);
  m3::step_fwd(p.D, s, buf, carry.state, carry.k_prev, carry.v_prev, carry.phase, stream);
  m3::gate_fwd(z, p, s, opt, buf, out, stream);
}

template <typename A>
void mamba3_bwd(const A* dout, const A* x, const A* z, const float* bc, const float* raw, const float* saved,
                const Mamba3Ptrs& params, const cpu::Mamba3LayerDims& dims, const Mamba3Options& opt, A* dx, A* dz,
                float* dbc, float* draw, const Mamba3GradPtrs& grads, void* scratch, cudaStream_t stream) {
  Sizes s;
  Buffers buf;
  if (!begin<A>(params, dims, opt, x, dx, saved, scratch, true, "mamba3_bwd", s, buf)) return;
  const Mamba3Ptrs& p = params;
  m3::prep_fwd(x, bc, raw, p, s, opt, buf, stream, nullptr, saved != nullptr);
  if (saved == nullptr) m3::core_fwd(p.D, s, buf, opt.bf16_products, stream);
  m3::gate_bwd(dout, z, p, s, opt, buf, dz, grads, stream);
  m3::core_bwd(p.D, s, buf, opt.bf16_products, stream);
  m3::up_bwd(x, p, s, buf, dx, grads, stream);
  m3::prep_bwd(raw, p, s, opt, buf, dbc, draw, grads, stream);
}

#define LLMT_MAMBA3_INSTANTIATE(A)                                                                                  \
  template void mamba3_fwd<A>(const A*, const A*, const float*, const float*, const Mamba3Ptrs&,                    \
                              const cpu::Mamba3LayerDims&, const Mamba3Options&, A*, float*, void*, cudaStream_t);  \
  template void mamba3_decode<A>(const A*, const A*, const float*, const float*, const Mamba3Ptrs&,                 \
                                 const cpu::Mamba3LayerDims&, const Mamba3Options&, const Mamba3CarryPtrs&, A*,     \
                                 void*, cudaStream_t);                                                              \
  template void mamba3_bwd<A>(const A*, const A*, const A*, const float*, const float*, const float*,               \
                              const Mamba3Ptrs&, const cpu::Mamba3LayerDims&, const Mamba3Options&, A*, A*, float*, \
                              float*, const Mamba3GradPtrs&, void*, cudaStream_t);
LLMT_MAMBA3_INSTANTIATE(float)
LLMT_MAMBA3_INSTANTIATE(__nv_bfloat16)
#undef LLMT_MAMBA3_INSTANTIATE

}  // namespace llmt::cuda
