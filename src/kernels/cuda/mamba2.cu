// Mamba2's SSD step on the GPU (layers-ssm-attn.md §2.2 steps 3–5, chunked §2.5, backward §2.6.3), with
// the semantics of src/kernels/cpu/mamba2.h mamba2_ssd_fwd/bwd: Δ = softplus(dt_raw + dt_bias) (the
// identity above 20), A = -exp(A_log), S_t = e^{Δ_t A} S_{t-1} + Δ_t x_t B_t^T, y_t = S_t C_t + D x_t,
// zero initial state. Δ, the chunk-local cumsum G and the per-head parameter sums in double.
//
// The sequence is cut into chunks of kL = 64 tokens (the kernel's own length: the SSD result does not
// depend on the chunk length beyond rounding, so the layer's chunk_size only has to be valid). Phases:
//   prep:   Δ and G per (b, h, chunk)                                  (blocks over b, chunk, 16 heads)
//   states: the states entering (forward) or the adjoints of the states leaving (backward) each chunk,
//           fp32: outer  each chunk's contribution Σ_i w_i u_i v_i^T    (blocks over b, h, chunk, P/N tiles)
//                 scan   the running sum over the chunks                (one thread per state element)
//           bf16: state_scan  both at once, the state in registers     (blocks over b, h, P/N tiles; the
//                             backward's two scans in one launch; where those are few and T long, over
//                             segments of the chunks too, each from a zero state)
//                 segment_fix (segmented) each segment's entering state, its decayed part added to the
//                             segment's states                            (one thread per state elements)
//   fwd:    y from the intra-chunk mask and the entering state          (blocks over b, chunk, P tile, 1-4 heads)
//   bwd:    every gradient of one chunk from S_in and dS_out            (blocks over b, h, chunk)
// then fixed-order sums of dB, dC over a group's heads and of dA_log, ddt_bias, dD over (b, chunk).
// No atomics: the same inputs give the same bits.
// The backward recomputes the entering states (the forward's scan) unless given the forward's `saved` set: the
// forward then writes them there instead of into its scratch and the backward scans only the adjoints (the same
// kernels' values: the same bits).
//
// Precision: the launchers' P (the layer's compute dtype) picks the products' layout (delta_tile.cuh) and the
// element type of the stored states and state adjoints; the fwd and bwd kernels are shared.
// P = float (fp32 models): exact fp32 products on the CUDA cores (tile::Simt), fp32 states; the CPU's results
// up to fp32 rounding.
// P = __nv_bfloat16 (bf16 models; the precision of the official SSD kernels): every 64 x 64 x 64 tile product
// on the tensor cores (tile::Mma: bf16 operand tiles in shared memory, fp32 accumulators in registers), each
// operand rounded to bf16 once, when loaded or formed: x (times its fp32 weight e^{Γ-G_i} Δ_i in the state
// sums), B, C, dy (times e^{G_i} in the adjoint sums), the stored states S_in and adjoints dS (bf16, as
// the official kernels store them), and the intra-chunk masks M = (C B^T ∘ E) Δ, CB ∘ E and dcb. The running
// states of state_scan are fp32 registers (rounded only when stored). Apart from the products they feed, the
// rounded C, x and the stored S_in, dS enter the dot products of dΔ and dA (inter, z, x·v̄, <dS, S_in>). The
// per-head dB, dC of a chunk (dBh, dCh) are stored as bf16, each rounded once from its fp32 accumulator, and
// summed over a group's heads in fp32 (so dB, dC carry one bf16 rounding per head's term; P = float: fp32
// partials summed in double).
// Everything else is fp32 or double as for P = float: the decays e^{G}, every element-wise and reduction step,
// the D skip (read from xbc, dy) and dcb ∘ CB of the intra-chunk da.
// Inputs (E): xbc and dy fp32, or with P = bf16 also bf16 (the official kernels' inputs; E = __nv_bfloat16). bf16
// operand tiles are then copied by cp.async straight into the bf16 shared tiles, 16-byte pieces, no conversion, where
// every row is 16-byte aligned (P, N multiples of 8, xbc and dy 16-byte aligned; else the synchronous loads, as from
// fp32): the state scan's u, v (two tile pairs by turns; the weighted u rows w_i u_i scaled in place after the copy,
// tile::scale_h_async: the rounding of load_h's bf16(w_i u_i)), the output kernel's C, B (every N tile, kept for all
// its heads) and x, and the backward chunk kernel's kept operands (C, B, x, dy; its in-place loads stay
// synchronous). The D skip reads the bf16 x, dy (in the backward from dy's operand tile). Every tile and value is
// then that of fp32 inputs holding the same (bf16) values: the same bits. Outputs: with bf16 inputs the op writes y and
// dxbc in bf16 too (the official kernels' outputs), each element rounded once from the fp32 value fp32 inputs give:
// y (ssd_fwd_out_kernel) and dx (ssd_bwd_chunk_kernel) from the accumulators' column pairs by tile::store_acc_bf16x8
// (16-byte stores where the rows allow), dB, dC from ssd_group_sum_kernel's fp32 sums (16-byte stores where aligned);
// fp32 inputs: fp32 outputs, as before.
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/delta_chunk.cuh"
#include "kernels/cuda/delta_tile.cuh"
#include "kernels/cuda/ops.cuh"
#include "kernels/cuda/side_stream.cuh"

namespace llmt::cuda {
namespace {

#ifdef LLMT_CUDA_EMU
// What the kernels' `extern __shared__` arrays name (tests/emu/cuda_emu.h): ssd_chunk_outer_kernel's float smem, the
// others' char smem_raw.
LLMT_CUDA_EMU_DYNAMIC_SMEM_OF(float, smem);
LLMT_CUDA_EMU_DYNAMIC_SMEM(smem_raw);
#endif

using tile::Acc;
constexpr int kL = tile::kN;           // chunk length and tile edge (64)
constexpr int kPad = tile::kLd;        // fp32 shared row stride (65): conflict-free row and column reads
constexpr int kTile = kL * kPad;       // floats per fp32 shared tile
constexpr int kSsdThreads = tile::kThreads;  // 256, each owning a 4 x 4 piece (Acc) of a 64 x 64 tile

// The layout whose products read operands of type P (Precision), its tiles' leading dimension and size in
// elements: fp32 tiles (tile::Simt, kPad) or bf16 tiles (tile::Mma, tile::kLdH).
template <typename P>
using Layout = std::conditional_t<std::is_same_v<P, float>, tile::Simt, tile::Mma>;
template <typename P>
constexpr int kLdOf = std::is_same_v<P, float> ? kPad : tile::kLdH;
template <typename P>
constexpr int kTileOf = kL * kLdOf<P>;

// Sizes of one call. W = H P + 2 G N is xbc's row width, [x | B | C]; nc chunks of kL tokens;
// PT, NT the 64-wide tiles of P and N.
struct Sizes {
  int64_t B, T, H, P, N, G, nc, PT, NT, W, XD, GN;
};

Sizes make_sizes(int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim, int64_t state_dim, int64_t groups) {
  return {batch,
          seq_len,
          heads,
          head_dim,
          state_dim,
          groups,
          ceil_div(seq_len, kL),
          ceil_div(head_dim, kL),
          ceil_div(state_dim, kL),
          heads * head_dim + 2 * groups * state_dim,
          heads * head_dim,
          groups * state_dim};
}

// A bf16 scan's chunks (in scan order q: chunk k = q forward, nc - 1 - q reverse) cut into n segments of len chunks
// (the last one possibly shorter, none empty), scanned in parallel (two-level scan: ssd_state_scan_kernel, then
// ssd_segment_fix_kernel). n = 1: the whole sequence in one block's walk, no fix-up.
struct Segments {
  int64_t n, len;
};

// Blocks of ssd_state_scan_kernel an SM holds (staged) and the fewest chunks an automatic segment walks.
constexpr int64_t kScanBlocksPerSm = 4, kMinSegmentChunks = 8;

// The segments of a call's scans: fp32 compute (P = float) 1; bf16 `forced` (> 0: tests, benchmarks) or, by default
// (0), more than one only where one scan's blocks (B H PT NT) fit one block an SM (the walk's latency, not the
// SMs, bounds the scan): then as many as fill kScanBlocksPerSm blocks an SM, each at least kMinSegmentChunks
// chunks long (shape (b) on 132 SMs: 8 of 32 chunks). At most nc, lengths rounded up (so n may drop). The same for
// every scan of a call and for the forward and the backward: the backward's recomputed states are the forward's bits.
template <typename P>
Segments choose_segments(const Sizes& s, int forced) {
  int64_t n = 1;
  if constexpr (std::is_same_v<P, __nv_bfloat16>) {
    const int64_t blocks = s.B * s.H * s.PT * s.NT;
    if (forced > 0) {
      n = forced;
    } else if (blocks > 0) {
      const int64_t sms = sm_count();
      if (blocks <= sms) n = std::min(kScanBlocksPerSm * sms / blocks, s.nc / kMinSegmentChunks);
    }
  }
  n = std::max<int64_t>(1, std::min(n, s.nc));
  const int64_t len = std::max<int64_t>(1, ceil_div(s.nc, n));
  return {std::max<int64_t>(1, ceil_div(s.nc, len)), len};
}

// The scratch carved into its arrays (256-byte aligned), or only sized when base is null.
// dt [B, H, nc kL] (Δ, 0 past T); G [B, H, nc kL] (chunk-local inclusive cumsum of Δ A, flat past T);
// states [B, H, nc, P, N] of element type S (fp32: the chunk contributions, then the entering states; bf16:
// the entering states; not carved with `saved`: the caller's saved set holds them, states_bytes); backward only:
// dstates (the adjoints of the states leaving each chunk, same type), dBh, dCh [B, H, nc kL, N] (per-head dB,
// dC; same type: bf16 halves the bytes of the backward's largest writes and their reads by the group sum),
// partials [B, H, nc, 3] (ddt_bias, dA, dD); segmented scans (segs.n > 1, bf16), per scan job of the call (the
// backward's two without `saved`, else one): ends [B, H, segs.n - 1, P, N] (fp32) and gam [B, H, segs.n - 1]
// (ScanJob), the jobs' arrays one after the other.
template <typename S>
struct Scratch {
  float* dt = nullptr;
  double* G = nullptr;
  S* states = nullptr;
  S* dstates = nullptr;
  S* dBh = nullptr;
  S* dCh = nullptr;
  double* partials = nullptr;
  float* ends = nullptr;
  double* gam = nullptr;
};

template <typename S>
size_t states_bytes(const Sizes& s) {
  return static_cast<size_t>(s.B * s.H * s.nc * s.P * s.N) * sizeof(S);
}

template <typename S>
size_t carve(const Sizes& s, bool backward, bool saved, Segments segs, void* base, Scratch<S>* out) {
  size_t off = 0;
  auto take = [&](auto*& p, int64_t n) {
    using T = std::remove_reference_t<decltype(*p)>;
    if (base != nullptr) p = reinterpret_cast<T*>(static_cast<char*>(base) + off);
    off += (static_cast<size_t>(n) * sizeof(T) + 255) / 256 * 256;
  };
  Scratch<S> sc;
  const int64_t bh = s.B * s.H, rows = bh * s.nc * kL, states = bh * s.nc * s.P * s.N;
  take(sc.dt, rows);
  take(sc.G, rows);
  if (!saved) take(sc.states, states);
  if (backward) {
    take(sc.dstates, states);
    take(sc.dBh, rows * s.N);
    take(sc.dCh, rows * s.N);
    take(sc.partials, bh * s.nc * 3);
  }
  if (segs.n > 1) {
    const int64_t ends = (backward && !saved ? 2 : 1) * bh * (segs.n - 1);
    take(sc.ends, ends * s.P * s.N);
    take(sc.gam, ends);
  }
  if (out != nullptr) *out = sc;
  return off;
}

__device__ double softplus_d(double v) { return v > 20.0 ? v : log1p(exp(v)); }

__device__ __forceinline__ int imin(int64_t a, int64_t b) { return static_cast<int>(a < b ? a : b); }

// Δ and G for the kL tokens of one (b, chunk) and kPrepHeads heads h0 .. h0 + kPrepHeads - 1 (those < H); tokens
// past T get Δ = 0, so G stays at the chunk's last value Γ and the padded rows drop out of every product. Reads
// dt_raw [B, T, H] (the chunk's rows, a token's heads adjacent: coalesced), dt_bias, A_log; writes dt and G
// [B, H, nc kL] (kL contiguous elements per head). Three passes, barriers between: Δ per (token, head) into shared
// memory (kThreads elements at a time); the chunk-local cumsum G of Δ_i A by one thread per head, sequential over
// the chunk's tokens in order (a parallel scan would add in another order: other bits); the stores.
// Grid (nc, ceil(H / kPrepHeads), B).
constexpr int kPrepHeads = 16;
static_assert(kL * kPrepHeads % kThreads == 0 && kPrepHeads <= kThreads, "ssd_prep_kernel's passes");
__global__ void __launch_bounds__(kThreads) ssd_prep_kernel(const float* dt_raw, const float* dt_bias,
                                                             const float* A_log, Sizes s, float* dt, double* G) {
  constexpr int kPer = kL * kPrepHeads / kThreads;  // elements per thread and pass
  __shared__ double ds[kPrepHeads][kL + 1], gs[kPrepHeads][kL + 1];  // Δ, G of [head][token] (odd row stride)
  __shared__ float bias[kPrepHeads];
  const int64_t k = blockIdx.x, h0 = int64_t{blockIdx.y} * kPrepHeads, b = blockIdx.z, c0 = k * kL;
  const int nh = imin(kPrepHeads, s.H - h0), nv = imin(kL, s.T - c0);
  const int tid = threadIdx.x;
  if (tid < nh) bias[tid] = dt_bias[h0 + tid];
  float raw[kPer];  // element e = tid + m kThreads: token e / kPrepHeads, head h0 + e % kPrepHeads
#pragma unroll
  for (int m = 0; m < kPer; ++m) {
    const int e = tid + m * kThreads, i = e / kPrepHeads, hl = e % kPrepHeads;
    raw[m] = i < nv && hl < nh ? dt_raw[(b * s.T + c0 + i) * s.H + h0 + hl] : 0.0f;
  }
  __syncthreads();
#pragma unroll
  for (int m = 0; m < kPer; ++m) {
    const int e = tid + m * kThreads, i = e / kPrepHeads, hl = e % kPrepHeads;
    if (hl < nh) ds[hl][i] = i < nv ? softplus_d(static_cast<double>(raw[m]) + static_cast<double>(bias[hl])) : 0.0;
  }
  __syncthreads();
  if (tid < nh) {
    const double A = -exp(static_cast<double>(A_log[h0 + tid]));
    double acc = 0.0;
#pragma unroll 8
    for (int i = 0; i < kL; ++i) {
      acc += ds[tid][i] * A;
      gs[tid][i] = acc;
    }
  }
  __syncthreads();
#pragma unroll
  for (int m = 0; m < kPer; ++m) {
    const int e = tid + m * kThreads, hl = e / kL, i = e % kL;
    if (hl < nh) {
      const int64_t o = ((b * s.H + h0 + hl) * s.nc + k) * kL + i;
      dt[o] = static_cast<float>(ds[hl][i]);
      G[o] = gs[hl][i];
    }
  }
}

// t[r][c] = scale(r) src[r * stride + c] for r < rows, c < cols, 0 elsewhere in the 64 x 64 tile: an fp32 tile
// (exact products; one element per thread and step, which keeps the fp32 kernels' registers low) or a bf16 tile
// (the product rounded once; tile::load_h); src float or bf16. Reached by the whole block.
template <typename Scale>
__device__ __forceinline__ void load_tile(float* t, const float* src, int64_t stride, int rows, int cols, Scale scale) {
  for (int e = threadIdx.x; e < kL * kL; e += blockDim.x) {
    const int r = e / kL, c = e % kL;
    t[r * kPad + c] = r < rows && c < cols ? src[r * stride + c] * scale(r) : 0.0f;
  }
}
template <typename E, typename Scale>
__device__ __forceinline__ void load_tile(__nv_bfloat16* t, const E* src, int64_t stride, int rows, int cols,
                                          Scale scale) {
  tile::load_h(t, src, stride, rows, cols, scale);
}
template <typename T, typename E>
__device__ __forceinline__ void load_tile(T* t, const E* src, int64_t stride, int rows, int cols) {
  load_tile(t, src, stride, rows, cols, [](int) { return 1.0f; });
}

// e^{min(gi - gj, 0)}, the intra-chunk decay E_ij (j <= i); a NaN difference stays NaN, as std::min in the
// CPU reference.
__device__ __forceinline__ float decay(double gi, double gj) {
  const double d = gi - gj;
  return expf(static_cast<float>(0.0 < d ? 0.0 : d));
}

// The bf16 state operands (S_in, dS: [P, N] tiles of the stored states, rows s.N apart) of a kernel's sequence
// of tile products, step t's tile in slot t % kStateRing of a ring of bf16 tiles, copied by cp.async
// kStateRing - 1 steps ahead of the product that reads it (state_issue), so that its global latency overlaps
// the products and loads in between. Copies of bf16 are exact: the same tile as load_tile's.
constexpr int kStateRing = 3;

// (async) Copies step t's tile (src: its first element, rows x cols; null past the last step) into its ring
// slot, then closes a cp.async group (always: one group a step, so that state_take(t) knows how many groups are
// newer than step t's). The caller's barriers guarantee that the slot's previous reader (the product
// kStateRing steps before) is done.
template <typename P>
__device__ __forceinline__ void state_issue(bool async, P* ring, int t, const P* src, int64_t stride, int rows,
                                            int cols) {
  if constexpr (std::is_same_v<P, __nv_bfloat16>) {
    if (async) {
      if (src != nullptr) tile::load_h_async(ring + (t % kStateRing) * kTileOf<P>, src, stride, rows, cols);
      tile::cp_async_commit();
    }
  }
}

// The state operand of step t (src: its first element, rows x cols): (async) its ring slot once the thread's
// own copies of it have landed (kNewer: the groups issued after step t's by then; kStateRing - 1 where each step
// issues before it takes, kStateRing - 2 where it issues after), else the tile loaded into fallback (load_tile).
// Complete for the block after the caller's next barrier.
template <int kNewer = kStateRing - 1, typename P>
__device__ __forceinline__ const P* state_take(bool async, P* ring, P* fallback, int t, const P* src,
                                               int64_t stride, int rows, int cols) {
  if (async) {
    tile::cp_async_wait<kNewer>();
    return ring + (t % kStateRing) * kTileOf<P>;
  }
  load_tile(fallback, src, stride, rows, cols);
  return fallback;
}

// (fp32 models; bf16 models: ssd_state_scan_kernel) A chunk's state contribution out[p][n] = Σ_i w_i u_i[p] v_i[n]
// over its tokens i, written to out[b, h, chunk, P, N]. u (b, t, h, p) = u[(b T + t) u_row + h P + p];
// v (b, t, g, n) = v[(b T + t) W + g N + n].
// to_end: w_i = e^{Γ - G_i} Δ_i (forward: u = x, v = B, the state written by the chunk, §2.5 step 3);
// else w_i = e^{G_i} (backward: u = dy, v = C, the chunk's Σ_i e^{G_i} dy_i C_i^T of dS_in, §2.6.3 a).
// Grid (nc, H, B PT NT).
__global__ void __launch_bounds__(kSsdThreads) ssd_chunk_outer_kernel(const float* u, int64_t u_row, const float* v,
                                                                      const float* dt, const double* G, Sizes s,
                                                                      bool to_end, float* out) {
  extern __shared__ float smem[];
  float* bu = smem;
  float* bv = smem + kTile;
  __shared__ float w[kL];
  const int64_t k = blockIdx.x, h = blockIdx.y, nt = blockIdx.z % s.NT, pt = (blockIdx.z / s.NT) % s.PT;
  const int64_t b = blockIdx.z / (s.NT * s.PT), g = h / (s.H / s.G);
  const int64_t bhk = (b * s.H + h) * s.nc + k, c0 = k * kL, p0 = pt * kL, n0 = nt * kL;
  const int nv = imin(kL, s.T - c0), np = imin(kL, s.P - p0), nn = imin(kL, s.N - n0);
  if (threadIdx.x < kL) {
    const double Gi = G[bhk * kL + threadIdx.x], gam = G[bhk * kL + kL - 1];
    w[threadIdx.x] = to_end ? expf(static_cast<float>(gam - Gi)) * dt[bhk * kL + threadIdx.x]
                            : expf(static_cast<float>(Gi));
  }
  __syncthreads();
  load_tile(bu, u + (b * s.T + c0) * u_row + h * s.P + p0, u_row, nv, np, [&](int r) { return w[r]; });
  load_tile(bv, v + (b * s.T + c0) * s.W + g * s.N + n0, s.W, nv, nn);
  __syncthreads();
  Acc acc;
  acc.zero();
  tile::Simt::mma<true, false>(bu, bv, acc);  // acc[p][n] = Σ_i (w_i u_i[p]) v_i[n]
  float* o = out + bhk * s.P * s.N;
  for (int a = 0; a < 4; ++a)
    for (int c = 0; c < 4; ++c) {
      const int p = tile::Simt::row(a), n = tile::Simt::col(c);
      if (p < np && n < nn) o[(p0 + p) * s.N + n0 + n] = acc.v[a][c];
    }
}

// (fp32 models) The chunks' contributions -> in place the states entering each chunk (forward: S_in_0 = 0,
// S_in_{k+1} = e^{Γ_k} S_in_k + U_k) or the adjoints of the states leaving each chunk (reverse:
// dS_out_{nc-1} = 0, dS_out_{k-1} = e^{Γ_k} dS_out_k + V_k).   (one thread per (b, h, p, n))
__global__ void ssd_scan_kernel(float* st, const double* G, Sizes s, bool reverse) {
  const int64_t PN = s.P * s.N, n = s.B * s.H * PN;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n; idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t bh = idx / PN, e = idx % PN;
    float carry = 0.0f;
    for (int64_t q = 0; q < s.nc; ++q) {
      const int64_t k = reverse ? s.nc - 1 - q : q;
      float* p = st + (bh * s.nc + k) * PN + e;
      const float contrib = *p;
      *p = carry;
      carry = expf(static_cast<float>(G[(bh * s.nc + k) * kL + kL - 1])) * carry + contrib;
    }
  }
}

// Dynamic shared memory of ssd_state_scan_kernel with inputs of type E: the bf16 operand tiles and (staged) the fp32
// staging tiles of a chunk's u and v rows (50 KiB); bf16 inputs staged: two pairs of operand tiles (36 KiB).
template <typename E>
constexpr size_t state_scan_smem(bool staged) {
  if constexpr (std::is_same_v<E, __nv_bfloat16>)
    return sizeof(__nv_bfloat16) * (staged ? 4 : 2) * tile::kTileHalves;
  return sizeof(__nv_bfloat16) * 2 * tile::kTileHalves + (staged ? sizeof(float) * 2 * tile::kStageFloats : 0);
}

// One scan over the chunks (S: the element type of out; E: the inputs'): out[b, h, k] = the states entering the
// chunks (forward, reverse = false: u = x, v = B, u_row = W) or the adjoints of the states leaving them (reverse:
// u = dy, v = C, u_row = XD); u, v, u_row as in ssd_chunk_outer_kernel.
// Segmented (bf16, Segments::n > 1): ends [B, H, n - 1, P, N] and gam [B, H, n - 1], the end states and total
// log-decays of the job's segments but the last (ssd_state_scan_kernel, read by ssd_segment_fix_kernel).
template <typename S, typename E>
struct ScanJob {
  const E* u;
  int64_t u_row;
  const E* v;
  bool reverse;
  S* out;
  float* ends = nullptr;
  double* gam = nullptr;
};

// How far ssd_state_scan_kernel's L2 prefetch runs ahead: during chunk q's product the block copies chunk q + 1's
// tiles and prefetches chunk q + 1 + kScanAhead's rows.
constexpr int kScanAhead = 2;

// (bf16 models) ssd_chunk_outer_kernel and ssd_scan_kernel in one pass: the block of one (b, h, P tile, N tile)
// of a ScanJob walks the chunks in order (reverse: from the last) with the running state R (64 x 64 fp32, in
// registers): out[b, h, k] = R (bf16, column pairs: tile::store_acc_bf16), then R = e^{Γ_k} R + Σ_i w_i u_i v_i^T
// over chunk k's tokens i (u_i w_i and v_i rounded to bf16, tile::Mma); w_i = e^{Γ-G_i} Δ_i forward, e^{G_i}
// reverse. The next chunk's u, v tiles are copied into fp32 staging tiles by cp.async (kStaged: every row 16-byte
// aligned), and its G, Δ loaded into registers, during the current chunk's product, and the rows of the chunk
// kScanAhead after that (u, v, G, Δ) are prefetched into the L2 (tile::prefetch_l2), so that the copies wait for
// the L2, not for memory; each chunk then converts its staged tiles into the bf16 tiles (the thread's own pieces:
// tile::put_h_staged). bf16 inputs (E) staged: no staging tiles; the next chunk's u, v are copied by cp.async
// straight into the other of two pairs of operand tiles (tile::load_h_async), issued as soon as the product that
// read that pair (two chunks before) is done, and the copying thread scales its own pieces of u in place
// (tile::scale_h_async). Otherwise the tiles are loaded synchronously (tile::load_h); the same bf16 tiles every
// way. Segmented (segs.n > 1; Segments): the block walks only its segment's chunks, from R = 0: out gets the states
// of the segment alone, and each segment but the last stores its end state R (fp32, job.ends) and its total log-decay
// Σ Γ_k (double, job.gam, from the blocks of P, N tile 0) for ssd_segment_fix_kernel, which adds the entering state's
// part. Grid (jobs B H segs.n, PT, NT): x / segs.n < B H scan `first`, the others `second` (the backward's two scans in
// one launch: 512 blocks at shape (a), one wave at 4 blocks per SM), segment x % segs.n; state_scan_smem<E>(kStaged) of
// dynamic shared memory; two barriers per chunk.
template <bool kStaged, typename E>
__global__ void __launch_bounds__(kSsdThreads, kStaged ? 4 : 2)  // staged: 4 blocks per SM (<= 64 registers)
    ssd_state_scan_kernel(ScanJob<__nv_bfloat16, E> first, ScanJob<__nv_bfloat16, E> second, const float* dt,
                          const double* G, Sizes s, Segments segs) {
  using L = tile::Mma;
  constexpr bool kDirect = kStaged && std::is_same_v<E, __nv_bfloat16>;  // bf16 rows straight into the tiles
  extern __shared__ __align__(16) char smem_raw[];
  __nv_bfloat16* bu = reinterpret_cast<__nv_bfloat16*>(smem_raw);  // (kDirect: chunk q's pair at 2 (q % 2) tiles)
  __nv_bfloat16* bv = bu + tile::kTileHalves;
  float* gu = reinterpret_cast<float*>(bv + tile::kTileHalves);  // (kStaged, fp32) staged u, v of the next chunk
  float* gv = gu + tile::kStageFloats;
  const auto pair = [&](int64_t q) { return bu + 2 * (q & 1) * tile::kTileHalves; };  // (kDirect) u; v after it
  __shared__ float w[kL];
  __shared__ float gam;
  const int64_t BH = s.B * s.H, x = blockIdx.x / segs.n, seg = blockIdx.x % segs.n;
  const bool is_second = x >= BH;
  const ScanJob<__nv_bfloat16, E> job = is_second ? second : first;
  const bool reverse = job.reverse;
  const int64_t bh = is_second ? x - BH : x, pt = blockIdx.y, nt = blockIdx.z;
  // The segment's steps q0 .. q1 - 1; those before qr are read (the state past the last chunk is not needed).
  const int64_t q0 = seg * segs.len, q1 = q0 + segs.len < s.nc ? q0 + segs.len : s.nc, qr = q1 < s.nc ? q1 : s.nc - 1;
  const int64_t b = bh / s.H, h = bh % s.H, g = h / (s.H / s.G), p0 = pt * kL, n0 = nt * kL;
  const int np = imin(kL, s.P - p0), nn = imin(kL, s.N - n0);
  const auto chunk = [&](int64_t q) { return reverse ? s.nc - 1 - q : q; };
  // Chunk q's token count and the first rows of its u and v tiles.
  const auto tokens = [&](int64_t q) { return imin(kL, s.T - chunk(q) * kL); };
  const auto u_at = [&](int64_t q) { return job.u + (b * s.T + chunk(q) * kL) * job.u_row + h * s.P + p0; };
  const auto v_at = [&](int64_t q) { return job.v + (b * s.T + chunk(q) * kL) * s.W + g * s.N + n0; };
  double Gi = 0.0, last = 0.0;  // chunk q's G_i, Γ, Δ_i (threads < kL), loaded during chunk q - 1
  float di = 0.0f;
  const auto fetch = [&](int64_t q) {
    if constexpr (kDirect) {
      tile::load_h_async(pair(q), u_at(q), job.u_row, tokens(q), np);
      tile::load_h_async(pair(q) + tile::kTileHalves, v_at(q), s.W, tokens(q), nn);
      tile::cp_async_commit();
    } else if constexpr (kStaged) {
      tile::stage_async(gu, u_at(q), job.u_row, tokens(q), np);
      tile::stage_async(gv, v_at(q), s.W, tokens(q), nn);
      tile::cp_async_commit();
    }
    if (threadIdx.x < kL) {
      const int64_t bhk = bh * s.nc + chunk(q);
      Gi = G[bhk * kL + threadIdx.x];
      last = G[bhk * kL + kL - 1];
      di = dt[bhk * kL + threadIdx.x];
    }
  };
  const auto prefetch = [&](int64_t q) {
    const int64_t bhk = bh * s.nc + chunk(q);
    constexpr int kEs = sizeof(E);
    tile::prefetch_l2(u_at(q), kEs * job.u_row, tokens(q), kEs * np);
    tile::prefetch_l2(v_at(q), kEs * s.W, tokens(q), kEs * nn);
    tile::prefetch_l2(G + bhk * kL, 0, 1, sizeof(double) * kL);
    tile::prefetch_l2(dt + bhk * kL, 0, 1, sizeof(float) * kL);
  };
  if (q0 < qr) fetch(q0);
  for (int64_t q = q0 + 1; q <= q0 + kScanAhead && q < qr; ++q) prefetch(q);
  Acc R;
  R.zero();
  double gsum = 0.0;  // (thread 0) Σ Γ over the steps so far
  for (int64_t q = q0; q < q1; ++q) {
    tile::store_acc_bf16(R, job.out + (bh * s.nc + chunk(q)) * s.P * s.N + p0 * s.N + n0, s.N, np, nn);
    if (q == s.nc - 1) break;
    if (threadIdx.x < kL) {
      w[threadIdx.x] = reverse ? expf(static_cast<float>(Gi)) : expf(static_cast<float>(last - Gi)) * di;
      if (threadIdx.x == 0) gam = expf(static_cast<float>(last)), gsum += last;
    }
    if (kStaged) tile::cp_async_wait<0>();  // this chunk's staged tiles (the thread's own pieces)
    __syncthreads();  // w, gam written; the previous chunk's mma (reading bu, bv) is done
    const auto scale = [&](int r) { return w[r]; };
    if constexpr (kDirect) {
      if (q + 1 < qr) fetch(q + 1);  // into the other pair (its reader, chunk q - 1's product, is done)
      if (q + 1 + kScanAhead < qr) prefetch(q + 1 + kScanAhead);
      tile::scale_h_async(pair(q), tokens(q), scale);  // w_i u_i, the thread's own pieces (landed: the wait above)
    } else if (kStaged) {
      tile::put_h_staged(bu, gu, tokens(q), scale);
      tile::put_h_staged(bv, gv, tokens(q));
    } else {
      tile::load_h(bu, u_at(q), job.u_row, tokens(q), np, scale);
      tile::load_h(bv, v_at(q), s.W, tokens(q), nn);
    }
    const float e = gam;
    for (int a = 0; a < 4; ++a)
      for (int c = 0; c < 4; ++c) R.v[a][c] *= e;
    __syncthreads();  // bu, bv (kDirect: chunk q's pair) complete; every read of the staging tiles done
    if constexpr (!kDirect) {
      if (q + 1 < qr) fetch(q + 1);
      if (q + 1 + kScanAhead < qr) prefetch(q + 1 + kScanAhead);
    }
    if constexpr (kDirect)
      L::mma<true, false>(pair(q), pair(q) + tile::kTileHalves, R);  // R[p][n] += Σ_i (w_i u_i[p]) v_i[n]
    else
      L::mma<true, false>(bu, bv, R);
  }
  if (seg < segs.n - 1) {  // the segment's end state and log-decay
    const int64_t e = bh * (segs.n - 1) + seg;
    float* o = job.ends + e * s.P * s.N + p0 * s.N + n0;
    for (int a = 0; a < 4; ++a)
      for (int c = 0; c < 4; ++c) {
        const int p = L::row(a), n = L::col(c);
        if (p < np && n < nn) o[p * s.N + n] = R.v[a][c];
      }
    if (threadIdx.x == 0 && pt == 0 && nt == 0) job.gam[e] = gsum;
  }
}

// (defined with ssd_group_sum_kernel) The kV elements at p as float.
template <int kV, typename E>
__device__ __forceinline__ void load_part(const E* p, float (&v)[kV]);

// The kV floats v rounded to bf16 at p: one element, or (kV = 8, p 16-byte aligned) one 16-byte store.
template <int kV>
__device__ __forceinline__ void store_part_bf16(__nv_bfloat16* p, const float (&v)[kV]) {
  if constexpr (kV == 1) {
    *p = __float2bfloat16_rn(v[0]);
  } else {
    static_assert(kV == 8, "store_part_bf16: 1 or 8 elements");
    uint4 u;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
    for (int e = 0; e < 4; ++e) h[e] = __floats2bfloat162_rn(v[2 * e], v[2 * e + 1]);
    *reinterpret_cast<uint4*>(p) = u;
  }
}

// How many chunks ssd_segment_fix_kernel's threads load before they store any (loads in flight together).
constexpr int kFixAhead = 4;

// (bf16 models, segmented scans: Segments) The second level of ssd_state_scan_kernel's two-level scan: segment
// j >= 1 of a job enters with the true state R_j = e^{γ_{j-1}} R_{j-1} + E_{j-1} (R_0 = 0; E_i, γ_i segment i's end
// state from R = 0 and its total log-decay: job.ends, job.gam; fp32, each exponent rounded from double as in the
// scan), and each of its outputs (the segment's own states, bf16) becomes out[k] = bf16(out[k] + e^{c_k} R_j), c_k
// the sum (double) of Γ over the segment's steps before chunk k's (scan order q: reverse jobs mirrored as in the
// scan). So out holds the states of the whole sequence, their part from within the segment rounded to bf16 twice
// (by the scan, then with the sum here), the first chunk's (out = 0 + R_j) and every state of segment 0 once. Each
// thread does kV adjacent elements of P N (8: N % 8 == 0 and every out 16-byte aligned, one 16-byte access a chunk;
// else 1), kFixAhead chunks' loads before their stores. `jobs` (1, 2): first, second as in ssd_state_scan_kernel.
// (one thread per (job, b, h, segment >= 1, kV elements))
template <int kV, typename E>
__global__ void __launch_bounds__(kThreads)
    ssd_segment_fix_kernel(ScanJob<__nv_bfloat16, E> first, ScanJob<__nv_bfloat16, E> second, int jobs,
                           const double* G, Sizes s, Segments segs) {
  const int64_t PN = s.P * s.N, nv = PN / kV, BH = s.B * s.H, m = segs.n - 1, n = jobs * BH * m * nv;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n; idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t off = idx % nv * kV, j = (idx / nv) % m + 1, x = idx / (nv * m);
    const bool is_second = x >= BH;
    const ScanJob<__nv_bfloat16, E> job = is_second ? second : first;  // (a copy: no local-memory frame)
    const int64_t bh = is_second ? x - BH : x;
    float r[kV] = {};  // R_j
    for (int64_t i = 0; i < j; ++i) {
      const int64_t e = bh * m + i;
      const float d = expf(static_cast<float>(job.gam[e]));
      const float* src = job.ends + e * PN + off;
#pragma unroll
      for (int v = 0; v < kV; ++v) r[v] = d * r[v] + src[v];
    }
    const int64_t q0 = j * segs.len, q1 = q0 + segs.len < s.nc ? q0 + segs.len : s.nc;
    const auto at = [&](int64_t q) { return (bh * s.nc + (job.reverse ? s.nc - 1 - q : q)); };  // (b, h, chunk)
    double c = 0.0;
    for (int64_t qb = q0; qb < q1; qb += kFixAhead) {
      float o[kFixAhead][kV];
      double g[kFixAhead];
#pragma unroll
      for (int a = 0; a < kFixAhead; ++a)
        if (qb + a < q1) {
          load_part(job.out + at(qb + a) * PN + off, o[a]);
          g[a] = G[at(qb + a) * kL + kL - 1];
        }
#pragma unroll
      for (int a = 0; a < kFixAhead; ++a)
        if (qb + a < q1) {
          const float f = expf(static_cast<float>(c));
#pragma unroll
          for (int v = 0; v < kV; ++v) o[a][v] += f * r[v];
          store_part_bf16(job.out + at(qb + a) * PN + off, o[a]);
          c += g[a];
        }
    }
  }
}

// ssd_fwd_out_kernel's intra-chunk mask into the tile bc (layout L's accumulator map): M_ij = (C_i·B_j)
// e^{G_i-G_j} Δ_j for j <= i, else 0, from m = C B^T; and acc (= S_in C_i) scaled by e^{G_i}.
template <typename L, typename P>
__device__ __forceinline__ void form_m(const Acc& m, Acc& acc, const double* Gs, const float* dts, P* bc) {
  for (int a = 0; a < 4; ++a) {
    const int i = L::row(a);
    const float ei = expf(static_cast<float>(Gs[i]));
    for (int c = 0; c < 4; ++c) {
      const int j = L::col(c);
      acc.v[a][c] *= ei;
      bc[i * kLdOf<P> + j] = from_f32<P>(j <= i ? m.v[a][c] * decay(Gs[i], Gs[j]) * dts[j] : 0.0f);
    }
  }
}

// Forward output of one (b, chunk, P tile) for kHeads heads h0 .. h0 + kHeads - 1 of one group, one after the
// other, §2.5: y_i = Σ_{j<=i} (C_i·B_j) e^{G_i-G_j} Δ_j x_j + e^{G_i} S_in C_i + D x_i, products in the layout L of
// the compute dtype P (Precision); states [B, H, nc, P, N] the entering states. C B^T (the group's) is formed by the
// first head's steps and kept (registers) for the others, whose steps read only C and S_in. Grid (nc, H / kHeads,
// B PT); dynamic shared memory fwd_out_smem<P, E>(staged, kHeads): the C, B tiles and the S_in tiles (bf16: a ring of
// kStateRing, step = (head, N tile), copied ahead by cp.async where N % 8 == 0, across the heads; fp32: one, loaded
// in place), and where `staged` (bf16, at most kFwdOutStaged N tiles, every x, B and C row 16-byte aligned) the fp32
// staging tiles of every N tile's C and B rows: all copied by cp.async at the start, in one group ahead of the S_in
// ring's (so the ring's waits cover them), and converted by each thread from its own pieces (tile::put_h_staged:
// load_tile's bf16 tiles) at each head's steps (B: the first head's only); else C (and B: the first head) are
// loaded at their step. bf16 inputs (E) staged: every N tile's C and B and every head's x copied as they are into
// bf16 tiles of their own at the start (the same group), which the heads' products read (no staging tiles, nothing
// converted): bc, the x tiles (bb: the first head's), the ring, the C tiles, the B tiles.
// The x tile of M x: staged, copied into N tile 0's B staging tile once every thread has converted that (during the
// head's first products), the operand converted from it and x_i of D x (fp32, the thread's output elements) read
// from it (bf16 inputs: from the head's x tile); else fetched into registers before M is formed (its latency overlaps
// that work), with x_i of D x loaded then too: loads between the y stores would each wait for the store before them
// (y may alias xbc). A barrier between the heads (the next head's tiles and Gs, dts overwrite what the last one read).
constexpr int kFwdOutStaged = 2;
template <typename P, typename E>
constexpr size_t fwd_out_smem(bool staged, int heads) {
  if constexpr (std::is_same_v<E, __nv_bfloat16>)
    return sizeof(P) * kTileOf<P> * (2 + kStateRing + (staged ? heads - 1 + 2 * kFwdOutStaged : 0));
  return sizeof(P) * kTileOf<P> * (std::is_same_v<P, float> ? 3 : 2 + kStateRing) +
         (staged ? sizeof(float) * 2 * kFwdOutStaged * tile::kStageFloats : 0);
}
// Blocks per SM its registers are bounded for: as many as its shared memory allows (fp32 64 registers, 4; bf16
// 128 registers, 2; with kHeads > 1, 16 bytes spilled and reloaded once per head).
template <typename P>
constexpr int kFwdOutBlocks = std::is_same_v<P, float> ? 4 : 2;
template <typename P, int kHeads, typename E>
__global__ void __launch_bounds__(kSsdThreads, kFwdOutBlocks<P>)
    ssd_fwd_out_kernel(const E* xbc, const float* D, const float* dt, const double* G, const P* states, Sizes s,
                       bool staged, E* y) {
  using L = Layout<P>;
  constexpr bool kIn16 = std::is_same_v<E, __nv_bfloat16>;  // bf16 inputs
  static_assert(!kIn16 || std::is_same_v<P, __nv_bfloat16>, "bf16 inputs need bf16 compute");
  extern __shared__ __align__(16) char smem_raw[];
  P* bc = reinterpret_cast<P*>(smem_raw);
  P* bb = bc + kTileOf<P>;
  P* bs = bc + 2 * kTileOf<P>;  // S_in (bf16: the ring)
  float* stg = reinterpret_cast<float*>(bs + kStateRing * kTileOf<P>);  // (stage) C, B of N tile t: 2 t, 2 t + 1
  float* const xstg = stg + tile::kStageFloats;                         // (stage) x: N tile 0's B staging tile
  __shared__ double Gs[kL];
  __shared__ float dts[kL];
  const int64_t k = blockIdx.x, h0 = int64_t{blockIdx.y} * kHeads, b = blockIdx.z / s.PT, pt = blockIdx.z % s.PT;
  const int64_t g = h0 / (s.H / s.G), c0 = k * kL, p0 = pt * kL;
  const int nv = imin(kL, s.T - c0), np = imin(kL, s.P - p0);
  const bool async = std::is_same_v<P, __nv_bfloat16> && tile::async_ok_h(states, s.N);
  const bool stage = staged && async;
  // (stage, bf16 inputs) x of head hl at bb + hl tiles, then the ring, then C of N tile t at cbt + t tiles, B at
  // cbt + kFwdOutStaged + t tiles
  if constexpr (kIn16)
    if (stage) bs += (kHeads - 1) * kTileOf<P>;
  P* const cbt = bs + kStateRing * kTileOf<P>;
  const E* row = xbc + (b * s.T + c0) * s.W;  // token c0's row [x | B | C]
  const auto c_at = [&](int64_t n0) { return row + s.XD + s.GN + g * s.N + n0; };
  const auto b_at = [&](int64_t n0) { return row + s.XD + g * s.N + n0; };
  const auto bhk = [&](int hl) { return (b * s.H + h0 + hl) * s.nc + k; };  // head h0 + hl's chunk
  if (stage) {
    for (int t = 0; t < s.NT; ++t) {
      const int64_t n0 = int64_t{t} * kL;
      const int nn = imin(kL, s.N - n0);
      if constexpr (kIn16) {
        tile::load_h_async(cbt + t * kTileOf<P>, c_at(n0), s.W, nv, nn);
        tile::load_h_async(cbt + (kFwdOutStaged + t) * kTileOf<P>, b_at(n0), s.W, nv, nn);
        if (t == 0)
          for (int hl = 0; hl < kHeads; ++hl)
            tile::load_h_async(bb + hl * kTileOf<P>, row + (h0 + hl) * s.P + p0, s.W, nv, np);
      } else {
        tile::stage_async(stg + 2 * t * tile::kStageFloats, c_at(n0), s.W, nv, nn);
        tile::stage_async(stg + (2 * t + 1) * tile::kStageFloats, b_at(n0), s.W, nv, nn);
      }
    }
    tile::cp_async_commit();
  }
  // Step u = head u / NT, N tile u % NT: S_in[p0.., (u % NT) kL..].
  const int steps = kHeads * static_cast<int>(s.NT);
  const auto issue = [&](int u) {
    const int64_t n0 = int64_t{u % static_cast<int>(s.NT)} * kL;
    const P* src = u < steps ? states + bhk(u / static_cast<int>(s.NT)) * s.P * s.N + p0 * s.N + n0 : nullptr;
    state_issue(async, bs, u, src, s.N, np, imin(kL, s.N - n0));
  };
  for (int u = 0; u < kStateRing - 1; ++u) issue(u);
  Acc m;  // C_i·B_j, from the first head's steps
  m.zero();
  for (int hl = 0; hl < kHeads; ++hl) {
    const int64_t h = h0 + hl;
    const P* sin = states + bhk(hl) * s.P * s.N + p0 * s.N;
    const E* xs = row + h * s.P + p0;
    if (threadIdx.x < kL) {
      Gs[threadIdx.x] = G[bhk(hl) * kL + threadIdx.x];
      dts[threadIdx.x] = dt[bhk(hl) * kL + threadIdx.x];
    }
    P* const xt = kIn16 && stage ? bb + hl * kTileOf<P> : bb;  // x's operand tile
    Acc acc;
    acc.zero();
    for (int t = 0; t < s.NT; ++t) {
      const int64_t n0 = int64_t{t} * kL;
      const int nn = imin(kL, s.N - n0);
      const int u = hl * static_cast<int>(s.NT) + t;
      issue(u + kStateRing - 1);
      const P* st;
      const P* ct = bc;  // the C and B operands
      const P* bt = bb;
      if (stage) {
        st = state_take(async, bs, bs, u, sin + n0, s.N, np, nn);  // (its wait covers the older staging group)
        if constexpr (kIn16) {
          ct = cbt + t * kTileOf<P>;
          bt = cbt + (kFwdOutStaged + t) * kTileOf<P>;
        } else if constexpr (std::is_same_v<P, __nv_bfloat16>) {
          tile::put_h_staged(bc, stg + 2 * t * tile::kStageFloats, nv);
          if (hl == 0) tile::put_h_staged(bb, stg + (2 * t + 1) * tile::kStageFloats, nv);
        }
      } else {
        load_tile(bc, c_at(n0), s.W, nv, nn);
        if (hl == 0) load_tile(bb, b_at(n0), s.W, nv, nn);
        st = state_take(async, bs, bs, u, sin + n0, s.N, np, nn);
      }
      __syncthreads();
      L::template mma<false, true>(ct, st, acc);     // acc[i][p] = Σ_n C_i[n] S_in[p][n]
      if (hl == 0) L::template mma<false, true>(ct, bt, m);  // m[i][j] = C_i·B_j
      if constexpr (!kIn16) {
        if (stage && t == 0) {  // x into N tile 0's B staging tile (every thread's reads of it done: the barrier above)
          tile::stage_async(xstg, xs, s.W, nv, np);
          tile::cp_async_commit();
        }
      }
      __syncthreads();
    }
    float xd[4][4];  // x_i[p] of the thread's outputs (D x)
    if (stage) {
      if constexpr (!kIn16) tile::cp_async_wait<0>();  // the thread's pieces of x (bf16 inputs: the first step's wait)
      if constexpr (std::is_same_v<P, __nv_bfloat16> && !kIn16) tile::put_h_staged(bb, xstg, nv);
      form_m<L>(m, acc, Gs, dts, bc);
      __syncthreads();  // bc, bb complete; every piece of x landed
      for (int a = 0; a < 4; ++a)
        for (int c = 0; c < 4; ++c) {
          const int i = L::row(a), p = L::col(c);
          if constexpr (kIn16)
            xd[a][c] = to_f32(xt[i * kLdOf<P> + p]);  // (0 outside nv x np)
          else
            xd[a][c] = xstg[i * kL + p];  // (0 outside nv x np)
        }
    } else {
      for (int a = 0; a < 4; ++a)
        for (int c = 0; c < 4; ++c) {
          const int i = L::row(a), p = L::col(c);
          xd[a][c] = i < nv && p < np ? to_f32(xs[i * s.W + p]) : 0.0f;
        }
      if constexpr (std::is_same_v<P, __nv_bfloat16>) {
        tile::HRegs xr;
        tile::fetch_h(xr, xs, s.W, nv, np);
        form_m<L>(m, acc, Gs, dts, bc);
        tile::put_h(bb, xr, nv, [](int) { return 1.0f; });
      } else {
        form_m<L>(m, acc, Gs, dts, bc);
        load_tile(bb, xs, s.W, nv, np);
      }
      __syncthreads();
    }
    L::template mma<false, false>(bc, xt, acc);  // acc[i][p] += Σ_j M[i][j] x_j[p]
    const float Dh = D[h];
    if constexpr (kIn16) {  // y = bf16(acc + D x), rounded once: column pairs, 16-byte pieces where aligned
      for (int a = 0; a < 4; ++a)
        for (int c = 0; c < 4; ++c) acc.v[a][c] = acc.v[a][c] + Dh * xd[a][c];
      tile::store_acc_bf16x8(acc, y + (b * s.T + c0) * s.XD + h * s.P + p0, s.XD, nv, np);
    } else {
      for (int a = 0; a < 4; ++a)
        for (int c = 0; c < 4; ++c) {
          const int i = L::row(a), p = L::col(c);
          if (i < nv && p < np) y[(b * s.T + c0 + i) * s.XD + h * s.P + p0 + p] = acc.v[a][c] + Dh * xd[a][c];
        }
    }
    if (hl + 1 < kHeads) __syncthreads();  // every read of bc, bb, Gs, dts and x's staging tile done
  }
}

// A chunk's per-head dB or dC tile (layout L's acc[i][n]) into dst[i N + n] for n < nn, every row (those past T
// are not read): fp32 element by element; bf16 rounded once, by tile::store_acc_bf16x8 (16-byte pieces where
// N % 8 == 0: dst is then 16-byte aligned, in a 256-byte aligned array of rows of N, tiles 64 apart).
template <typename L, typename P>
__device__ __forceinline__ void store_part(const Acc& acc, P* dst, int64_t N, int nn) {
  if constexpr (std::is_same_v<P, float>) {
    for (int a = 0; a < 4; ++a)
      for (int c = 0; c < 4; ++c) {
        const int i = L::row(a), n = L::col(c);
        if (n < nn) dst[i * N + n] = acc.v[a][c];
      }
  } else {
    tile::store_acc_bf16x8(acc, dst, N, kL, nn);
  }
}

// Sums v over the 16 threads sharing each row of layout L in slot order: out[L::row(a)] = Σ_slot v[a].
// Reached by the whole block; red is a [kL][17] shared scratch.
template <typename L>
__device__ void row_sum16(const float (&v)[4], float (*red)[17], float* out) {
  for (int a = 0; a < 4; ++a) red[L::row(a)][L::row_slot()] = v[a];
  __syncthreads();
  if (threadIdx.x < kL) {
    float t = 0.0f;
    for (int q = 0; q < 16; ++q) t += red[threadIdx.x][q];
    out[threadIdx.x] = t;
  }
  __syncthreads();
}

// All gradients of one (b, h, chunk), §2.6.3 a–h, given the entering state S_in and the adjoint dS of
// the state leaving it (both [P, N], element type P), products in the layout L of the compute dtype P
// (Precision). With E_ij = e^{G_i-G_j} (j <= i), CB_ij = C_i·B_j, dcb_ij = (dy_i·x_j) Δ_j E_ij, f_j = e^{Γ-G_j}:
//   dC_i = e^{G_i} S_in^T dy_i + Σ_j dcb_ij B_j                 -> dCh (summed over the group later)
//   dB_j = Σ_i dcb_ij C_i + f_j Δ_j dS^T x_j                     -> dBh
//   v̄_j = Σ_i CB_ij E_ij dy_i + f_j dS B_j;  dx_j = Δ_j v̄_j + D dy_j
//   dG_i = Σ_j dcb_ij CB_ij - Σ_k dcb_ki CB_ki + e^{G_i} dy_i·(S_in C_i) - z_i, z_j = f_j Δ_j x_j·(dS B_j);
//   dG_last += Σ_j z_j + e^Γ <dS, S_in>;  da_k = Σ_{i>=k} dG_i;  dΔ_k = x_k·v̄_k + A da_k.
// da_k is formed without the cancelling pairs of that sum (the CPU's double arithmetic absorbs them, fp32
// would not): da_k = Σ_{i>=k, j<k} dcb_ij CB_ij + Σ_{i>=k} e^{G_i} dy_i·(S_in C_i) + Σ_{i<k} z_i
// + e^Γ <dS, S_in>. Writes ddt_raw = dΔ σ(dt_raw + dt_bias) and the chunk's (Σ ddt_raw, Σ Δ da, Σ x·dy)
// to partials. Grid (nc, H, B); dynamic shared memory bwd_chunk_smem<P>(keep): 4 tiles (kTileOf<P>), and for bf16
// an fp32 tile for dcb ∘ CB (fp32: in b0), the ring of S_in / dS tiles and (keep) 2 more tiles. The S_in / dS
// operands of the dC, dB and v̄ products (steps t = 0 .. 3 PT NT - 1 in the order they run: dC S_in[p, n] over n,
// p; dB dS[p, n] over n (kept: descending), p; v̄ dS[p, n] over p, n) are, for bf16 with N % 8 == 0, copied by cp.async
// into the ring kStateRing - 1 steps ahead (the first ones at the start, behind the CB and DX products); else
// loaded into b1 in place (the ring's shared memory unused). Kept operands (`keep`: bf16, PT, NT <= 2, for bf16 inputs
// every x, B, C and dy row 16-byte aligned, and the ring copied; b1 is then free): the CB and DX products each load all
// their tiles in one round (DX's issued before the CB products), and the operands that do not change with a loop's
// inner index stay in shared memory instead of being loaded again at every step: C, B of N tile 0 from CB through dC's
// first N tile (b0, b1), C of dC's last N tile through dB's first (b0; dB walks the N tiles from the last); dy's P
// tiles, loaded for DX into the kept tiles kt(p0), through the dC products and the v̄ step (x·v̄, z, (CB ∘ E)^T dy);
// x's P tiles, loaded into b1 and cprod's tile (xk(p0)) before the dB products, through the v̄ step; B's N tiles,
// loaded into b0 and mdcb's tile before the v̄ products. The same bf16 tiles as loaded in place.
// bf16 inputs (E) kept: those operands are copied by cp.async straight into the same tiles (tile::load_h_async), in
// groups of their own: CB's and DX's at the start, ahead of the ring's first copies; the C, B of dC's and the C of dB's
// later N tiles right after the barrier of that N tile's first state step (the previous N tile's last reads of b0, b1
// are before it); x's and B's P / N tiles (one group each) right after the phase before dB / v̄. Each thread waits for
// its own copies of a group (cp_async_wait_n: the later groups stay in flight) just before the barrier ahead of their
// first product; the ring's waits, which count groups, are then a step stricter after an input group. bf16 inputs: D dy
// of dx from dy's operand tile (the same values). The in-place loads (not kept) stay synchronous. (bf16 inputs whose
// rows cannot be copied by cp.async are not kept: the synchronous kept loads, four tiles in registers at once, would
// raise the kernel's register peak past its 128 and spill.)
template <typename P>
constexpr size_t bwd_chunk_smem(bool keep) {
  return std::is_same_v<P, float>
             ? sizeof(P) * kTileOf<P> * 4
             : sizeof(P) * kTileOf<P> * (4 + kStateRing + (keep ? 2 : 0)) + sizeof(float) * kTile;
}
// Blocks per SM its registers are bounded for: fp32 3 (80 registers), bf16 2 (128 registers).
template <typename P>
constexpr int kBwdChunkBlocks = std::is_same_v<P, float> ? 3 : 2;
template <typename P, typename E>
__global__ void __launch_bounds__(kSsdThreads, kBwdChunkBlocks<P>) ssd_bwd_chunk_kernel(
    const E* dy, const E* xbc, const float* dt_raw, const float* dt_bias, const float* A_log, const float* D,
    const float* dt, const double* G, const P* states, const P* dstates, Sizes s, bool keep,
    E* dxbc, float* ddt_raw, P* dBh, P* dCh, double* partials) {
  using L = Layout<P>;
  constexpr int ld = kLdOf<P>;
  constexpr bool kIn16 = std::is_same_v<E, __nv_bfloat16>;  // bf16 inputs
  static_assert(!kIn16 || std::is_same_v<P, __nv_bfloat16>, "bf16 inputs need bf16 compute");
  extern __shared__ __align__(16) char smem_raw[];
  P* mdcb = reinterpret_cast<P*>(smem_raw);  // dcb[i][j]
  P* mw = mdcb + kTileOf<P>;                 // CB_ij E_ij
  P* b0 = mdcb + 2 * kTileOf<P>;
  P* b1 = mdcb + 3 * kTileOf<P>;
  float* cprod =  // dcb ∘ CB
      std::is_same_v<P, float> ? reinterpret_cast<float*>(b0) : reinterpret_cast<float*>(mdcb + 4 * kTileOf<P>);
  __shared__ double Gs[kL];
  __shared__ double zpre[kL], isuf[kL], grs[kL], das[kL];  // tail: Σ_{i<k} Δ_i z_i, Σ_{i>=k} inter_i, ddt_raw_k, da_k
  __shared__ float dts[kL], cross[kL], inter[kL], diag[kL], xv[kL], zz[kL];
  __shared__ float dtr[kL], hpar[2];  // dt_raw of the chunk's rows; (A_log[h], dt_bias[h])
  __shared__ float red[kL][17];
  const int64_t k = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int64_t g = h / (s.H / s.G), bh = b * s.H + h, bhk = bh * s.nc + k, c0 = k * kL;
  const int nv = imin(kL, s.T - c0);
  const int tid = threadIdx.x;
  if (tid < kL) {
    Gs[tid] = G[bhk * kL + tid];
    dts[tid] = dt[bhk * kL + tid];
  }
  // The tail's global inputs: loads issued now, stored to dtr / hpar after the CB loop (latency hidden).
  const float dt_raw_t = tid < nv ? dt_raw[(b * s.T + c0 + tid) * s.H + h] : 0.0f;
  const float hpar_t = tid == 0 ? A_log[h] : tid == 1 ? dt_bias[h] : 0.0f;
  const E* row = xbc + (b * s.T + c0) * s.W;  // token c0's row [x | B | C]
  const E* xs = row + h * s.P;
  const E* bs = row + s.XD + g * s.N;
  const E* cs = row + s.XD + s.GN + g * s.N;
  const E* dys = dy + (b * s.T + c0) * s.XD + h * s.P;
  const P* sin = states + bhk * s.P * s.N;
  const P* dS = dstates + bhk * s.P * s.N;
  P* ring = reinterpret_cast<P*>(cprod + kTile);  // (bf16) the S_in / dS ring
  const bool async = std::is_same_v<P, __nv_bfloat16> && tile::async_ok_h(states, s.N) &&
                     tile::async_ok_h(dstates, s.N);
  const bool kept = keep && async;
  const bool kin = kIn16 && kept;  // (bf16 inputs, which are kept only so) the kept operands copied by cp.async
  // (kept) the kept tile of P tile t0 / kL (< 2), after the ring: dy's, from DX to the end of v̄
  const auto kt = [&](int64_t t0) { return ring + (kStateRing + t0 / kL) * kTileOf<P>; };
  P* const x0 = ring + (kStateRing - 1) * kTileOf<P>;  // (kept) DX's x tiles: the ring's last slot, cprod's tile
  P* const x1 = reinterpret_cast<P*>(cprod);
  // (kin) grp counts the thread's committed cp.async groups (the ring's and the inputs'); in_copy copies the tile of
  // an input operand at src (rows stride apart, cols columns from there; none past kL, all zeros where none) into dst;
  // in_group commits the copies since the last commit as a group and returns its index; in_wait(gi) waits until group
  // gi has landed (the later ones may stay in flight).
  int grp = 0;
  const auto in_copy = [&](auto* dst, const auto* src, int64_t stride, int64_t cols) {
    tile::load_h_async(dst, src, stride, nv, imin(kL, cols));
  };
  const auto in_group = [&] {
    tile::cp_async_commit();
    return grp++;
  };
  const auto in_wait = [&](int gi) { tile::cp_async_wait_n(grp - 1 - gi); };
  // The next state step to issue, iss, at tile (ip, in) of phase iph (0: dC, 1: dB, 2: v̄, 3: past the end; dB
  // kept: N tile NT - 1 - in). Each product step takes its own tile (step iss - (kStateRing - 1)), waits at the
  // barrier that completes it, runs its product, then issues the step kStateRing - 1 ahead into the slot of the
  // step before (whose product every thread finished before that barrier): where nothing else in shared memory
  // changes from one step to the next (kept), that barrier is the step's only one.
  int iss = 0, iph = 0, ip = 0, in = 0;
  const auto issue = [&] {
    const int64_t p0 = int64_t{ip} * kL, n0 = (kept && iph == 1 ? s.NT - 1 - in : int64_t{in}) * kL;
    state_issue(async, ring, iss++, iph < 3 ? (iph == 0 ? sin : dS) + p0 * s.N + n0 : nullptr, s.N,
                imin(kL, s.P - p0), imin(kL, s.N - n0));
    ++grp;  // (read with kin only: async)
    if (iph < 2) {  // dC, dB: p inner
      if (++ip == s.PT) {
        ip = 0;
        if (++in == s.NT) in = 0, ++iph;
      }
    } else if (++in == s.NT) {  // v̄: n inner
      in = 0;
      if (++ip == s.PT) ip = 0, ++iph;
    }
  };
  int g_cb = 0, g_dx = 0;  // (kin) the groups of CB's and DX's operands
  if constexpr (kIn16) {
    if (kin) {  // the kept path's first round, ahead of the ring's first copies
      in_copy(b0, cs, s.W, s.N);
      in_copy(b1, bs, s.W, s.N);
      if (s.NT > 1) {
        in_copy(mdcb, cs + kL, s.W, s.N - kL);
        in_copy(mw, bs + kL, s.W, s.N - kL);
      }
      g_cb = in_group();
      in_copy(kt(0), dys, s.XD, s.P);
      in_copy(x0, xs, s.W, s.P);
      if (s.PT > 1) {
        in_copy(kt(kL), dys + kL, s.XD, s.P - kL);
        in_copy(x1, xs + kL, s.W, s.P - kL);
      }
      g_dx = in_group();
    }
  }
  for (int t = 0; t < kStateRing - 1; ++t) issue();
  // The state tile of the step at hand (src: its first element, rows x cols).
  const auto take = [&](const P* src, int rows, int cols) {
    return state_take<kStateRing - 2>(async, ring, b1, iss - (kStateRing - 1), src, s.N, rows, cols);
  };

  // (kept) fetch2: tiles 0 and 1 of operand a (a + t kL, rows sa apart, dim columns in all; a missing tile 1 all
  // zeros) into t0, t1 (tile::fetch_h: loads issued, nothing waits); put: such a tile into a bf16 tile (put_h, scale
  // 1: load_tile's tile). Every fetch2 of a round before its puts: the round's loads all in flight at once.
  const auto fetch2 = [&](tile::HRegs& t0, tile::HRegs& t1, const E* a, int64_t sa, int64_t dim) {
    tile::fetch_h(t0, a, sa, nv, imin(kL, dim));
    tile::fetch_h(t1, a + kL, sa, nv, imin(kL, dim - kL));
  };
  const auto put = [&](auto* dst, const tile::HRegs& x) { tile::put_h(dst, x, nv, [](int) { return 1.0f; }); };

  // CB_ij and DX_ij = dy_i·x_j over the whole N and P. Kept operands: each product's tiles loaded in one round,
  // DX's loads issued before the CB products: C, B of N tile t into b0, b1 (t = 0: they stay there for dC's first
  // N tile) or mdcb, mw (t = 1); dy of P tile t into kt(t kL), where it stays for dC; x into the ring's last slot
  // (its first copy is issued by dC's first step) and cprod's tile (both written only after DX). kin: the same tiles,
  // copied at the start.
  Acc cb, dx;
  cb.zero();
  dx.zero();
  if constexpr (std::is_same_v<P, __nv_bfloat16>) {
    if (kin) {
      if (tid < kL) dtr[tid] = dt_raw_t;
      if (tid < 2) hpar[tid] = hpar_t;
      in_wait(g_cb);
      __syncthreads();
      L::template mma<false, true>(b0, b1, cb);
      if (s.NT > 1) L::template mma<false, true>(mdcb, mw, cb);
      in_wait(g_dx);
      __syncthreads();
      L::template mma<false, true>(kt(0), x0, dx);
      if (s.PT > 1) L::template mma<false, true>(kt(kL), x1, dx);
      __syncthreads();
    } else if (kept) {
      tile::HRegs r[4];
      fetch2(r[0], r[2], cs, s.W, s.N);
      fetch2(r[1], r[3], bs, s.W, s.N);
      put(b0, r[0]);
      put(b1, r[1]);
      put(mdcb, r[2]);
      put(mw, r[3]);
      if (tid < kL) dtr[tid] = dt_raw_t;
      if (tid < 2) hpar[tid] = hpar_t;
      __syncthreads();
      fetch2(r[0], r[2], dys, s.XD, s.P);
      fetch2(r[1], r[3], xs, s.W, s.P);
      L::template mma<false, true>(b0, b1, cb);
      if (s.NT > 1) L::template mma<false, true>(mdcb, mw, cb);
      __syncthreads();
      put(kt(0), r[0]);
      put(x0, r[1]);
      put(kt(kL), r[2]);
      put(x1, r[3]);
      __syncthreads();
      L::template mma<false, true>(kt(0), x0, dx);
      if (s.PT > 1) L::template mma<false, true>(kt(kL), x1, dx);
      __syncthreads();
    }
  }
  if (!kept) {
    for (int64_t n0 = 0; n0 < s.N; n0 += kL) {
      const int nn = imin(kL, s.N - n0);
      load_tile(b0, cs + n0, s.W, nv, nn);
      load_tile(b1, bs + n0, s.W, nv, nn);
      __syncthreads();
      L::template mma<false, true>(b0, b1, cb);
      __syncthreads();
    }
    if (tid < kL) dtr[tid] = dt_raw_t;
    if (tid < 2) hpar[tid] = hpar_t;
    for (int64_t p0 = 0; p0 < s.P; p0 += kL) {
      const int np = imin(kL, s.P - p0);
      load_tile(b0, dys + p0, s.XD, nv, np);
      load_tile(b1, xs + p0, s.W, nv, np);
      __syncthreads();
      L::template mma<false, true>(b0, b1, dx);
      __syncthreads();
    }
  }
  for (int a = 0; a < 4; ++a)
    for (int c = 0; c < 4; ++c) {
      const int i = L::row(a), j = L::col(c);
      if (i == j) diag[i] = dx.v[a][c];
      const bool on = j <= i;  // masked entries exactly 0 (a NaN elsewhere does not leak into them)
      const float eij = on ? decay(Gs[i], Gs[j]) : 0.0f;  // E_ij
      const float dcb = on ? dx.v[a][c] * dts[j] * eij : 0.0f;
      mdcb[i * ld + j] = from_f32<P>(dcb);
      mw[i * ld + j] = from_f32<P>(on ? cb.v[a][c] * eij : 0.0f);
      cprod[i * kPad + j] = dcb * cb.v[a][c];
    }
  __syncthreads();
  // Intra-chunk part of da_k: cross_k = Σ_{i>=k} Σ_{j<k} c_ij over c = dcb ∘ CB, from the recurrence
  // cross_0 = 0, cross_{k+1} = cross_k + d_k, d_k = Σ_{i>k} c_ik - Σ_{j<k} c_kj (O(kL²) terms where the direct sums
  // take O(kL³)). d_k by the 4 lanes 4k + q of one warp (lane q: rows i = k + 1 + q, k + 5 + q, ... of column k, and
  // columns j = q, q + 4, ... < k of row k, each in order; the lanes' sums added as (q0 + q1) + (q2 + q3)), in
  // double; then warp 0 scans d (lane l: d_{2l}, d_{2l+1}) into the exclusive prefix sums. Read as da's first term
  // after the dC and dB phases (their barriers make cross visible).
  {
    const int kk = tid >> 2, q = tid & 3;
    double t = 0.0;
    for (int i = kk + 1 + q; i < kL; i += 4) t += cprod[i * kPad + kk];
    for (int j = q; j < kk; j += 4) t -= cprod[kk * kPad + j];
    t += __shfl_xor_sync(0xffffffffu, t, 1);
    t += __shfl_xor_sync(0xffffffffu, t, 2);
    if (q == 0) das[kk] = t;  // (das: free until the tail writes da_k)
  }
  __syncthreads();
  if (tid < 32) {
    const double d0 = das[2 * tid], d1 = das[2 * tid + 1];
    double incl = d0 + d1;  // this lane's pair, then the inclusive sum over lanes <= tid
    for (int off = 1; off < 32; off <<= 1) {
      const double up = __shfl_up_sync(0xffffffffu, incl, off);
      if (tid >= off) incl += up;
    }
    const double excl = incl - (d0 + d1);
    cross[2 * tid] = static_cast<float>(excl);
    cross[2 * tid + 1] = static_cast<float>(excl + d0);
  }

  // dC per N tile, with inter_i = C_i·(e^{G_i} S_in^T dy_i).
  float gi[4] = {};
  for (int64_t n0 = 0; n0 < s.N; n0 += kL) {
    const int nn = imin(kL, s.N - n0);
    int g_c = 0;  // (kin, n0 > 0) the group of this N tile's C, B
    Acc acc;
    acc.zero();
    for (int64_t p0 = 0; p0 < s.P; p0 += kL) {
      const int np = imin(kL, s.P - p0);
      if (!kept) load_tile(b0, dys + p0, s.XD, nv, np);
      const P* sv = take(sin + p0 * s.N + n0, np, nn);
      __syncthreads();
      if constexpr (kIn16) {
        if (kin && n0 > 0 && p0 == 0) {  // into b0, b1 (their last readers, the previous N tile's, are done: the
                                         // barrier above)
          in_copy(b0, cs + n0, s.W, nn);
          in_copy(b1, bs + n0, s.W, nn);
          g_c = in_group();
        }
      }
      L::template mma<false, false>(kept ? kt(p0) : b0, sv, acc);  // acc[i][n] = Σ_p dy_i[p] S_in[p][n]
      issue();
      if (!kept) __syncthreads();
    }
    if (kin && n0 > 0) {
      in_wait(g_c);
      __syncthreads();
    } else if (!kept || n0 > 0) {  // (kept: N tile 0's still there from CB; b0, b1 last read before this tile's
                                   // step barrier)
      load_tile(b0, cs + n0, s.W, nv, nn);
      load_tile(b1, bs + n0, s.W, nv, nn);
      __syncthreads();
    }
    for (int a = 0; a < 4; ++a) {
      const int i = L::row(a);
      const float ei = expf(static_cast<float>(Gs[i]));
      for (int c = 0; c < 4; ++c) {
        acc.v[a][c] *= ei;
        gi[a] += to_f32(b0[i * ld + L::col(c)]) * acc.v[a][c];
      }
    }
    L::template mma<false, false>(mdcb, b1, acc);  // acc[i][n] += Σ_j dcb_ij B_j[n]
    store_part<L>(acc, dCh + (bh * s.nc * kL + c0) * s.N + n0, s.N, nn);
    if (!kept) __syncthreads();  // (kept: b0, b1 next written after the next tile's step barrier)
  }
  row_sum16<L>(gi, red, inter);

  // dB per N tile. (kept: x's P tiles into b1 and cprod's tile, xk(p0), until the end of v̄)
  const auto xk = [&](int64_t p0) { return p0 == 0 ? b1 : reinterpret_cast<P*>(cprod); };
  int g_x0 = 0, g_x1 = 0;  // (kin) the groups of x's P tiles
  if constexpr (std::is_same_v<P, __nv_bfloat16>) {
    if (kin) {
      if constexpr (kIn16) {
        in_copy(xk(0), xs, s.W, s.P);
        g_x0 = in_group();
        if (s.PT > 1) {
          in_copy(xk(kL), xs + kL, s.W, s.P - kL);
          g_x1 = in_group();
        }
      }
    } else if (kept) {
      tile::HRegs r[2];
      fetch2(r[0], r[1], xs, s.W, s.P);
      put(xk(0), r[0]);
      put(xk(kL), r[1]);
    }
  }
  for (int64_t ni = 0; ni < s.NT; ++ni) {
    const int64_t n0 = (kept ? s.NT - 1 - ni : ni) * kL;  // (kept: from the last N tile, whose C is dC's last)
    const int nn = imin(kL, s.N - n0);
    int g_c = 0;  // (kin, ni > 0) the group of this N tile's C
    Acc acc;
    acc.zero();
    for (int64_t p0 = 0; p0 < s.P; p0 += kL) {
      const int np = imin(kL, s.P - p0);
      if (!kept) load_tile(b0, xs + p0, s.W, nv, np);
      const P* sv = take(dS + p0 * s.N + n0, np, nn);
      if (kin && ni == 0) in_wait(p0 == 0 ? g_x0 : g_x1);
      __syncthreads();
      if constexpr (kIn16) {
        if (kin && ni > 0 && p0 == 0) {  // into b0 (its last reader, the previous N tile's, is done: the barrier above)
          in_copy(b0, cs + n0, s.W, nn);
          g_c = in_group();
        }
      }
      L::template mma<false, false>(kept ? xk(p0) : b0, sv, acc);  // acc[j][n] = Σ_p x_j[p] dS[p][n]
      issue();
      if (!kept) __syncthreads();
    }
    for (int a = 0; a < 4; ++a) {
      const int j = L::row(a);
      const float f = expf(static_cast<float>(Gs[kL - 1] - Gs[j])) * dts[j];
      for (int c = 0; c < 4; ++c) acc.v[a][c] *= f;
    }
    // (kept: the last one's still there; b0 last read before this tile's step barrier)
    if (kin && ni > 0) {
      in_wait(g_c);
      __syncthreads();
    } else if (!kept || n0 < (s.NT - 1) * kL) {
      load_tile(b0, cs + n0, s.W, nv, nn);
      __syncthreads();
    }
    L::template mma<true, false>(mdcb, b0, acc);  // acc[j][n] += Σ_i dcb_ij C_i[n]
    store_part<L>(acc, dBh + (bh * s.nc * kL + c0) * s.N + n0, s.N, nn);
    if (!kept || ni == s.NT - 1) __syncthreads();  // (kept: else b0 next written after the next tile's step barrier)
  }

  // v̄ and dx per P tile, with z_j and x_j·v̄_j.
  // (kept: B's N tiles into b0 and mdcb's tile; x_p in xk(p0); dy_p in kt(p0) since DX)
  float zp[4] = {}, xvp[4] = {};
  const float Dh = D[h];
  int g_b0 = 0, g_b1 = 0;  // (kin) the groups of B's N tiles
  if constexpr (std::is_same_v<P, __nv_bfloat16>) {
    if (kin) {
      if constexpr (kIn16) {
        in_copy(b0, bs, s.W, s.N);
        g_b0 = in_group();
        if (s.NT > 1) {
          in_copy(mdcb, bs + kL, s.W, s.N - kL);
          g_b1 = in_group();
        }
      }
    } else if (kept) {
      tile::HRegs r[2];
      fetch2(r[0], r[1], bs, s.W, s.N);
      put(b0, r[0]);
      put(mdcb, r[1]);
    }
  }
  for (int64_t p0 = 0; p0 < s.P; p0 += kL) {
    const int np = imin(kL, s.P - p0);
    Acc acc;
    acc.zero();
    for (int64_t n0 = 0; n0 < s.N; n0 += kL) {
      const int nn = imin(kL, s.N - n0);
      if (!kept) load_tile(b0, bs + n0, s.W, nv, nn);
      const P* sv = take(dS + p0 * s.N + n0, np, nn);
      if (kin && p0 == 0) in_wait(n0 == 0 ? g_b0 : g_b1);
      __syncthreads();
      L::template mma<false, true>(kept && n0 > 0 ? mdcb : b0, sv, acc);  // acc[j][p] = Σ_n B_j[n] dS[p][n]
      issue();
      if (!kept) __syncthreads();
    }
    P* const xt = kept ? xk(p0) : b0;
    P* const dyt = kept ? kt(p0) : b1;
    if (!kept) {
      load_tile(xt, xs + p0, s.W, nv, np);
      load_tile(dyt, dys + p0, s.XD, nv, np);
      __syncthreads();
    }
    for (int a = 0; a < 4; ++a) {
      const int j = L::row(a);
      const float f = expf(static_cast<float>(Gs[kL - 1] - Gs[j]));
      for (int c = 0; c < 4; ++c) {
        acc.v[a][c] *= f;
        zp[a] += to_f32(xt[j * ld + L::col(c)]) * acc.v[a][c];
      }
    }
    // dy_j[p] of D dy, loaded before the product: loads between the dxbc stores would each wait for the store
    // before them (dxbc may alias dy). bf16 inputs: from dy's operand tile (its values; 0 outside nv x np).
    float dyd[4][4];
    for (int a = 0; a < 4; ++a)
      for (int c = 0; c < 4; ++c) {
        const int j = L::row(a), p = L::col(c);
        if constexpr (kIn16)
          dyd[a][c] = to_f32(dyt[j * ld + p]);
        else
          dyd[a][c] = j < nv && p < np ? dys[j * s.XD + p0 + p] : 0.0f;
      }
    L::template mma<true, false>(mw, dyt, acc);  // acc[j][p] += Σ_i CB_ij E_ij dy_i[p]
    for (int a = 0; a < 4; ++a)
      for (int c = 0; c < 4; ++c) {
        const int j = L::row(a), p = L::col(c);
        xvp[a] += to_f32(xt[j * ld + p]) * acc.v[a][c];
        if constexpr (kIn16)  // (dx in place, stored below)
          acc.v[a][c] = dts[j] * acc.v[a][c] + Dh * dyd[a][c];
        else if (j < nv && p < np)
          dxbc[(b * s.T + c0 + j) * s.W + h * s.P + p0 + p] = dts[j] * acc.v[a][c] + Dh * dyd[a][c];
      }
    // bf16 inputs: dx = bf16(Δ_j v̄_j + D dy_j), rounded once: column pairs, 16-byte pieces where aligned
    if constexpr (kIn16) tile::store_acc_bf16x8(acc, dxbc + (b * s.T + c0) * s.W + h * s.P + p0, s.W, nv, np);
    if (!kept) __syncthreads();  // (kept: no tile read here is written before the next tile's step barrier)
  }
  row_sum16<L>(zp, red, zz);
  row_sum16<L>(xvp, red, xv);

  // e^Γ <dS, S_in> (the state passing S_out += e^Γ S_in). Thread tid sums the terms tid + m kSsdThreads in order
  // of m: in batches of kDot terms whose 2 kDot loads are all issued before the first term is added, then the
  // remaining (< kDot) terms one by one.
  constexpr int kDot = std::is_same_v<P, float> ? 16 : 32;
  const int64_t PN = s.P * s.N;
  double sd = 0.0;
  int64_t e = tid;
  for (; e + (kDot - 1) * kSsdThreads < PN; e += kDot * kSsdThreads) {
    float u[kDot], w[kDot];
#pragma unroll
    for (int q = 0; q < kDot; ++q) {
      u[q] = to_f32(dS[e + q * kSsdThreads]);
      w[q] = to_f32(sin[e + q * kSsdThreads]);
    }
#pragma unroll
    for (int q = 0; q < kDot; ++q) sd += static_cast<double>(u[q]) * w[q];
  }
#pragma unroll 1
  for (; e < PN; e += kSsdThreads) sd += static_cast<double>(to_f32(dS[e])) * to_f32(sin[e]);
  sd = block_reduce(sd, SumOp{}, 0.0);

  // da_k = cross_k + Σ_{i<k} Δ_i z_i + e^Γ <dS, S_in> + Σ_{i>=k} inter_i: the two running sums (in order) by
  // threads 0 and 32 (two warps, concurrently), then da_k and ddt_raw_k by thread k, then the chunk's partials
  // (rows in descending order) by thread 0.
  if (tid == 0) {
    double zprefix = 0.0;
#pragma unroll 8
    for (int i = 0; i < kL; ++i) {
      zpre[i] = zprefix;
      zprefix += static_cast<double>(dts[i]) * zz[i];
    }
  } else if (tid == 32) {
    double isuffix = 0.0;
#pragma unroll 8
    for (int i = kL - 1; i >= 0; --i) {
      isuffix += inter[i];
      isuf[i] = isuffix;
    }
  }
  __syncthreads();
  if (tid < nv) {
    const double A = -exp(static_cast<double>(hpar[0])), bias = hpar[1];
    const double state = exp(Gs[kL - 1]) * sd;
    const double da = static_cast<double>(cross[tid]) + zpre[tid] + state + isuf[tid];
    const double v = static_cast<double>(dtr[tid]) + bias;
    const double gr = (xv[tid] + A * da) * (v > 20.0 ? 1.0 : 1.0 / (1.0 + exp(-v)));
    ddt_raw[(b * s.T + c0 + tid) * s.H + h] = static_cast<float>(gr);
    grs[tid] = gr;
    das[tid] = da;
  }
  __syncthreads();
  if (tid == 0) {
    double ddtb = 0.0, dA = 0.0, dD = 0.0;
#pragma unroll 8
    for (int i = nv - 1; i >= 0; --i) {
      ddtb += grs[i];
      dA += dts[i] * das[i];
      dD += diag[i];
    }
    partials[bhk * 3 + 0] = ddtb;
    partials[bhk * 3 + 1] = dA;
    partials[bhk * 3 + 2] = dD;
  }
}

// The kV elements at p as float: one element, or (kV = 8, bf16, p 16-byte aligned) one 16-byte load.
template <int kV, typename E>
__device__ __forceinline__ void load_part(const E* p, float (&v)[kV]) {
  if constexpr (kV == 1) {
    v[0] = to_f32(*p);
  } else {
    static_assert(kV == 8 && std::is_same_v<E, __nv_bfloat16>, "load_part: 8 bf16 in one piece");
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = __bfloat1622float2(h[e]);
      v[2 * e] = f.x;
      v[2 * e + 1] = f.y;
    }
  }
}

// dxbc[b, t, XD + g N + n] = Σ_{h of group g} dBh[b, h, t, n] and the same for C at XD + GN + g N + n, heads in
// order; summed in double for fp32 partials (E = float), in fp32 for bf16 ones (their own rounding, 2^-9, dwarfs
// the sum's). Each thread sums kV adjacent n: 8 (bf16 with N % 8 == 0: one 16-byte load per head and array) or 1.
// dxbc of type O: float, or (bf16 inputs) bf16 rounded once from the fp32 sum, by one 16-byte store per array where
// `wide` (kV = 8 and every row's B and C parts 16-byte aligned), else element by element.
// (one thread per (b, t, g, kV columns))
template <typename E, int kV, typename O>
__global__ void ssd_group_sum_kernel(const E* dBh, const E* dCh, Sizes s, bool wide, O* dxbc) {
  using Sum = std::conditional_t<std::is_same_v<E, float>, double, float>;
  const int64_t nv = s.N / kV, n = s.B * s.T * s.G * nv, hpg = s.H / s.G, rows = s.nc * kL;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n; idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t m = idx % nv * kV, g = (idx / nv) % s.G, t = (idx / (nv * s.G)) % s.T, b = idx / (nv * s.G * s.T);
    Sum sb[kV] = {}, sc[kV] = {};
    for (int64_t h = g * hpg; h < (g + 1) * hpg; ++h) {
      const int64_t j = ((b * s.H + h) * rows + t) * s.N + m;
      float vb[kV], vc[kV];
      load_part(dBh + j, vb);
      load_part(dCh + j, vc);
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        sb[e] += vb[e];
        sc[e] += vc[e];
      }
    }
    O* out = dxbc + (b * s.T + t) * s.W + s.XD + g * s.N + m;
    if constexpr (std::is_same_v<O, __nv_bfloat16> && kV == 8) {
      if (wide) {
        store_part_bf16<kV>(out, sb);
        store_part_bf16<kV>(out + s.GN, sc);
        continue;
      }
    }
#pragma unroll
    for (int e = 0; e < kV; ++e) {
      out[e] = from_f32<O>(static_cast<float>(sb[e]));
      out[s.GN + e] = from_f32<O>(static_cast<float>(sc[e]));
    }
  }
}

// ddt_bias[h] += Σ ddt_raw; dA_log[h] += A Σ Δ da; dD[h] += Σ x·dy. Block h reads head h's rows of partials
// [B, H, nc, 3] (row j = b nc + chunk: nc contiguous rows per b), kParamsRows rows at a time, into shared memory
// (coalesced, kThreads elements at a time); thread q < 3 sums component q over the rows sequentially in order of j
// (b outer, chunk inner), then updates its parameter gradient.   Grid (H).
constexpr int kParamsRows = 512;
static_assert(3 * kParamsRows % kThreads == 0, "ssd_params_kernel's staging");
__global__ void __launch_bounds__(kThreads) ssd_params_kernel(const double* partials, const float* A_log, Sizes s,
                                                               float* ddt_bias, float* dA_log, float* dD) {
  constexpr int kPer = 3 * kParamsRows / kThreads;  // elements per thread and stage
  __shared__ double rows[3 * kParamsRows];
  const int64_t h = blockIdx.x, n = s.B * s.nc;  // rows j = b nc + chunk
  const int tid = threadIdx.x;
  double sum = 0.0;  // thread q < 3: component q
  for (int64_t j0 = 0; j0 < n; j0 += kParamsRows) {
    const int nr = imin(kParamsRows, n - j0);
    double v[kPer];
#pragma unroll
    for (int m = 0; m < kPer; ++m) {
      const int e = tid + m * kThreads;
      const int64_t j = j0 + e / 3, b = j / s.nc, k = j % s.nc;
      v[m] = e < 3 * nr ? partials[((b * s.H + h) * s.nc + k) * 3 + e % 3] : 0.0;
    }
#pragma unroll
    for (int m = 0; m < kPer; ++m) rows[tid + m * kThreads] = v[m];
    __syncthreads();
    if (tid < 3) {
#pragma unroll 8
      for (int r = 0; r < nr; ++r) sum += rows[r * 3 + tid];
    }
    __syncthreads();
  }
  if (tid == 0) ddt_bias[h] = static_cast<float>(ddt_bias[h] + sum);
  if (tid == 1) {
    const double A = -exp(static_cast<double>(A_log[h]));
    dA_log[h] = static_cast<float>(dA_log[h] + sum * A);
  }
  if (tid == 2) dD[h] = static_cast<float>(dD[h] + sum);
}

// Throws unless the grids of this call fit CUDA's limits.
void check_grid(const Sizes& s) {
  check(s.H <= 65535 && s.B * s.PT * s.NT <= 65535, "mamba2_ssd (cuda): grid too large (B {} H {} P {} N {})", s.B,
        s.H, s.P, s.N);
  check(s.G >= 1 && s.H % s.G == 0, "mamba2: n_groups ({}) must divide the number of heads ({})", s.G, s.H);
}

// kernel<<<grid, kThreads (= kSsdThreads), smem, stream>>>(args...) (smem > 0: after allowing the kernel that much
// dynamic shared memory), then the launch check; under LLMT_CUDA_EMU, the CPU emulator's launch (tests/emu/cuda_emu.h).
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, size_t smem, cudaStream_t stream, const Args&... args) {
  if (smem > 0)
    LLMT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
#ifdef LLMT_CUDA_EMU
  ::emu::launch(kernel, grid, dim3(kThreads), smem, stream, args...);
#else
  kernel<<<grid, kThreads, smem, stream>>>(args...);
#endif
  LLMT_CUDA_CHECK_LAUNCH();
}
template <typename P>
constexpr size_t tiles_bytes(int tiles) {
  return sizeof(P) * kTileOf<P> * tiles;
}

// Elements of type E in a 16-byte piece of a cp.async copy (fp32 4, bf16 8).
template <typename E>
constexpr int kPiece = static_cast<int>(16 / sizeof(E));

// Whether the tiles of an E tensor at p whose rows start multiples of dim elements after p can be copied by cp.async
// (tile::async_ok_f for fp32: stage_async; tile::async_ok_h for bf16: load_h_async).
template <typename E>
bool async_ok(const E* p, int64_t dim) {
  return std::is_same_v<E, float> ? tile::async_ok_f(p, dim) : tile::async_ok_h(p, dim);
}

// The forward scan's job: the states entering each chunk into `out`, from x, B.
template <typename P, typename E>
ScanJob<P, E> states_job(const E* xbc, const Sizes& s, P* out) {
  return {xbc, s.W, xbc + s.XD, false, out};
}

// Δ and G (prep), then the n (1 or 2) scans of `jobs`: the forward's (states_job) and / or the backward's adjoints
// into sc.dstates (the reverse scan: from dy, C). P = float: per scan the chunks' contributions
// (ssd_chunk_outer_kernel), then the scan over them (ssd_scan_kernel); bf16: ssd_state_scan_kernel, both scans in
// one launch, staged where every row of every u and v is 16-byte aligned, over segs (choose_segments; sc carved for
// them) and where segs.n > 1 then ssd_segment_fix_kernel. E: the inputs' type (bf16: P = bf16 only).
template <typename P, typename E>
void chunk_states(const ScanJob<P, E>* jobs, int n, const float* dt_raw, const float* dt_bias, const float* A_log,
                  const Sizes& s, Segments segs, const Scratch<P>& sc, cudaStream_t stream) {
  const dim3 prep(static_cast<unsigned>(s.nc), static_cast<unsigned>(ceil_div(s.H, kPrepHeads)),
                  static_cast<unsigned>(s.B));
  launch(ssd_prep_kernel, prep, 0, stream, dt_raw, dt_bias, A_log, s, sc.dt, sc.G);
  if constexpr (std::is_same_v<P, float>) {
    static_assert(std::is_same_v<E, float>, "fp32 models take fp32 inputs");
    const dim3 grid(static_cast<unsigned>(s.nc), static_cast<unsigned>(s.H), static_cast<unsigned>(s.B * s.PT * s.NT));
    for (int i = 0; i < n; ++i) {
      const ScanJob<P, E>& j = jobs[i];
      launch(ssd_chunk_outer_kernel, grid, tiles_bytes<float>(2), stream, j.u, j.u_row, j.v, sc.dt, sc.G, s,
             !j.reverse, j.out);
      launch(ssd_scan_kernel, grid_for(s.B * s.H * s.P * s.N), 0, stream, j.out, sc.G, s, j.reverse);
    }
  } else {
    // (u's rows start h P + a multiple of u_row elements after u, v's g N + a multiple of W after v)
    bool staged = s.P % kPiece<E> == 0 && s.N % kPiece<E> == 0;
    for (int i = 0; i < n; ++i) staged = staged && async_ok(jobs[i].u, jobs[i].u_row) && async_ok(jobs[i].v, s.W);
    ScanJob<P, E> js[2] = {jobs[0], jobs[n - 1]};
    const int64_t ends = s.B * s.H * (segs.n - 1);  // each job's segment ends (segs.n > 1)
    for (int i = 0; i < n && segs.n > 1; ++i) js[i].ends = sc.ends + i * ends * s.P * s.N, js[i].gam = sc.gam + i * ends;
    const auto kernel = staged ? ssd_state_scan_kernel<true, E> : ssd_state_scan_kernel<false, E>;
    const dim3 grid(static_cast<unsigned>(n * s.B * s.H * segs.n), static_cast<unsigned>(s.PT),
                    static_cast<unsigned>(s.NT));
    launch(kernel, grid, state_scan_smem<E>(staged), stream, js[0], js[n - 1], sc.dt, sc.G, s, segs);
    if (segs.n > 1) {
      // (8 elements a thread where every out is 16-byte aligned: states, dstates and saved sets hold whole P N rows)
      bool wide = s.N % 8 == 0;
      for (int i = 0; i < n; ++i) wide = wide && reinterpret_cast<uintptr_t>(js[i].out) % 16 == 0;
      const int v = wide ? 8 : 1;
      launch(wide ? ssd_segment_fix_kernel<8, E> : ssd_segment_fix_kernel<1, E>,
             grid_for(n * ends * s.P * s.N / v), 0, stream, js[0], js[n - 1], n, sc.G, s, segs);
    }
  }
}

}  // namespace

template <typename P>
size_t mamba2_ssd_saved_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim, int64_t state_dim) {
  return states_bytes<P>(make_sizes(batch, seq_len, heads, head_dim, state_dim, 1));
}

template <typename P>
size_t mamba2_ssd_fwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim,
                                    int64_t state_dim, bool saved, int scan_segments) {
  const Sizes s = make_sizes(batch, seq_len, heads, head_dim, state_dim, 1);
  return carve<P>(s, false, saved, choose_segments<P>(s, scan_segments), nullptr, nullptr);
}

template <typename P>
size_t mamba2_ssd_bwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim,
                                    int64_t state_dim, bool saved, int scan_segments) {
  const Sizes s = make_sizes(batch, seq_len, heads, head_dim, state_dim, 1);
  return carve<P>(s, true, saved, choose_segments<P>(s, scan_segments), nullptr, nullptr);
}

template <typename P, typename E>
void mamba2_ssd_fwd(const E* xbc, const float* dt_raw, const float* dt_bias, const float* A_log, const float* D,
                    int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim, int64_t state_dim,
                    int64_t groups, E* y, void* saved, void* scratch, cudaStream_t stream, int scan_segments) {
  static_assert(std::is_same_v<E, float> || std::is_same_v<P, __nv_bfloat16>, "bf16 inputs need bf16 compute");
  const Sizes s = make_sizes(batch, seq_len, heads, head_dim, state_dim, groups);
  check_grid(s);
  if (s.B * s.T * s.H == 0) return;
  const Segments segs = choose_segments<P>(s, scan_segments);
  Scratch<P> sc;
  carve(s, false, saved != nullptr, segs, scratch, &sc);
  P* const states = saved != nullptr ? static_cast<P*>(saved) : sc.states;  // the entering states
  const ScanJob<P, E> job = states_job(xbc, s, states);
  chunk_states<P, E>(&job, 1, dt_raw, dt_bias, A_log, s, segs, sc, stream);
  // Heads per ssd_fwd_out_kernel block: bf16 4 or 2 of a group where they divide its heads (fp32: 1, its 64
  // registers do not hold the kept C B^T).
  const int64_t hpg = s.H / s.G;
  int hpb = 1;
  auto kernel = ssd_fwd_out_kernel<P, 1, E>;
  if constexpr (std::is_same_v<P, __nv_bfloat16>) {
    if (hpg % 4 == 0)
      hpb = 4, kernel = ssd_fwd_out_kernel<P, 4, E>;
    else if (hpg % 2 == 0)
      hpb = 2, kernel = ssd_fwd_out_kernel<P, 2, E>;
  }
  const dim3 grid(static_cast<unsigned>(s.nc), static_cast<unsigned>(s.H / hpb),
                  static_cast<unsigned>(s.B * s.PT));
  // (x's rows start h P + a multiple of W after xbc, C's and B's g N + a multiple of W after xbc + XD and GN after
  // one another)
  const bool staged = std::is_same_v<P, __nv_bfloat16> && s.NT <= kFwdOutStaged && s.N % 8 == 0 &&
                      s.P % kPiece<E> == 0 && async_ok(xbc, s.W);
  launch(kernel, grid, fwd_out_smem<P, E>(staged, hpb), stream, xbc, D, sc.dt, sc.G, states, s, staged, y);
}

template <typename P, typename E>
void mamba2_ssd_bwd(const E* dy, const E* xbc, const float* dt_raw, const float* dt_bias, const float* A_log,
                    const float* D, int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim,
                    int64_t state_dim, int64_t groups, const void* saved, E* dxbc, float* ddt_raw,
                    float* ddt_bias, float* dA_log, float* dD, void* scratch, cudaStream_t stream,
                    int scan_segments) {
  static_assert(std::is_same_v<E, float> || std::is_same_v<P, __nv_bfloat16>, "bf16 inputs need bf16 compute");
  const Sizes s = make_sizes(batch, seq_len, heads, head_dim, state_dim, groups);
  check_grid(s);
  if (s.B * s.T * s.H == 0) return;
  const Segments segs = choose_segments<P>(s, scan_segments);
  Scratch<P> sc;
  carve(s, true, saved != nullptr, segs, scratch, &sc);
  // The adjoints' scan, after the forward's (recomputing the entering states) unless the forward saved them.
  const ScanJob<P, E> jobs[2] = {states_job(xbc, s, sc.states), {dy, s.XD, xbc + s.XD + s.GN, true, sc.dstates}};
  chunk_states<P, E>(saved != nullptr ? jobs + 1 : jobs, saved != nullptr ? 1 : 2, dt_raw, dt_bias, A_log, s, segs,
                     sc, stream);
  const P* const states = saved != nullptr ? static_cast<const P*>(saved) : sc.states;
  const dim3 grid(static_cast<unsigned>(s.nc), static_cast<unsigned>(s.H), static_cast<unsigned>(s.B));
  // (bf16 inputs kept only where every x, B, C and dy row is 16-byte aligned, as in the forward: copied by cp.async)
  const bool rows16 = s.P % 8 == 0 && s.N % 8 == 0 && async_ok(xbc, s.W) && async_ok(dy, s.XD);
  const bool keep = std::is_same_v<P, __nv_bfloat16> && s.PT <= 2 && s.NT <= 2 && s.N % 8 == 0 &&
                    (std::is_same_v<E, float> || rows16);
  launch(ssd_bwd_chunk_kernel<P, E>, grid, bwd_chunk_smem<P>(keep), stream, dy, xbc, dt_raw, dt_bias, A_log, D,
         sc.dt, sc.G, states, sc.dstates, s, keep, dxbc, ddt_raw, sc.dBh, sc.dCh, sc.partials);
  // (bf16: 8 columns a thread where N % 8 == 0; dBh and dCh are 256-byte aligned, rows of N; bf16 dxbc by 16-byte
  // stores where its rows' B and C parts start 16-byte aligned: W, XD multiples of 8)
  constexpr int kV = std::is_same_v<P, __nv_bfloat16> ? 8 : 1;
  const int v = s.N % kV == 0 ? kV : 1;
  const bool wide = v == 8 && s.W % 8 == 0 && s.XD % 8 == 0 && reinterpret_cast<uintptr_t>(dxbc) % 16 == 0;
  launch(v == kV ? ssd_group_sum_kernel<P, kV, E> : ssd_group_sum_kernel<P, 1, E>,
         grid_for(s.B * s.T * s.G * s.N / v), 0, stream, sc.dBh, sc.dCh, s, wide, dxbc);
  launch(ssd_params_kernel, static_cast<unsigned>(s.H), 0, stream, sc.partials, A_log, s, ddt_bias, dA_log, dD);
}

#define LLMT_INSTANTIATE_MAMBA2_SIZES(P)                                                                            \
  template size_t mamba2_ssd_saved_bytes<P>(int64_t, int64_t, int64_t, int64_t, int64_t);                          \
  template size_t mamba2_ssd_fwd_scratch_bytes<P>(int64_t, int64_t, int64_t, int64_t, int64_t, bool, int);          \
  template size_t mamba2_ssd_bwd_scratch_bytes<P>(int64_t, int64_t, int64_t, int64_t, int64_t, bool, int);
#define LLMT_INSTANTIATE_MAMBA2(P, E)                                                                               \
  template void mamba2_ssd_fwd<P, E>(const E*, const float*, const float*, const float*, const float*, int64_t,    \
                                     int64_t, int64_t, int64_t, int64_t, int64_t, E*, void*, void*,                 \
                                     cudaStream_t, int);                                                            \
  template void mamba2_ssd_bwd<P, E>(const E*, const E*, const float*, const float*, const float*, const float*,   \
                                     int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, const void*, E*,         \
                                     float*, float*, float*, float*, void*, cudaStream_t, int);
LLMT_INSTANTIATE_MAMBA2_SIZES(float)
LLMT_INSTANTIATE_MAMBA2_SIZES(__nv_bfloat16)
LLMT_INSTANTIATE_MAMBA2(float, float)
LLMT_INSTANTIATE_MAMBA2(__nv_bfloat16, float)
LLMT_INSTANTIATE_MAMBA2(__nv_bfloat16, __nv_bfloat16)

}  // namespace llmt::cuda
