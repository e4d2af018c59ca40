// Gated DeltaNet and Comba cores, chunked (layers-delta.md §6.1 F1–F7, §6.2, §6.5 B1–B9), zero initial
// state; same results as src/kernels/cpu/{gdn,comba}.cpp up to the rounding below.
// Precision: the launchers' P (the layer's compute dtype) picks the products' layout (delta_tile.cuh) and
// the element type of the scratch W, U/Δ, dW, h, dh; all other code is shared.
// P = float (fp32 models): exact fp32 products on the CUDA cores (tile::Simt) and fp32 scratch, so the
// results are the CPU's up to fp32 rounding.
// P = __nv_bfloat16 (bf16 models; FLA's precision): every 64 x 64 x 64 tile product runs on the tensor cores
// with BOTH operand tiles rounded to bf16 and fp32 accumulation (the *_mma_kernel phases on tile::Mma: bf16
// operand tiles in shared memory, register accumulators; only when key_dim is too large for an Mma scan's
// shared memory or registers (key_dim > 256) does that scan run as gdn_scan_kernel /
// gdn_bwd_scan_kernel on tile::Tc: the same rounding points, another fp32 summation order): the inputs q, k,
// v, p̂ (scaled by their fp32 gate factors β, e^Γ, e^{Γ_C-Γ} before rounding), 𝒯 (for W, U and the backward's 𝒯^T
// products), W, U/Δ, dO, dΔ, dW, the states h[n], dh[n] and the running S, dS as operands, and the
// intra-chunk P, dP, d𝒯, dA tiles. Stored in bf16 (as FLA stores w, u, v_new, h): W, U/Δ, dW and the
// states h[n], dh[n]. Apart from the products they feed, U enters Δ = U - W S (F4) and h, dh enter Σ h ⊙ dh
// of dΓ (iv) as rounded values. Everything else is fp32: the gates and their cumulative sums (double), A and
// its inverse 𝒯 (forward substitution), the running states S and dS (registers; the tile::Tc scans: shared
// memory), the scratch 𝒯, dΔ, dΓ, the sums over key / value tiles and every element-wise and reduction step (dβ,
// dΓ, dg).
// Inputs: q, k, v, p̂ are read from global memory as the launchers' E: float, or (P = __nv_bfloat16 only) bf16, as
// FLA's kernels take them; E = bf16 gives the same bits as E = float on inputs holding the same (bf16) values: the
// operand tiles round nothing more, and the element-wise steps read the values as fp32 either way. Tiles that a
// kernel stages by cp.async come as they are (16-byte pieces of 8 bf16 instead of 4 floats: Staged<E>); where an
// operand tile takes a bf16 input unscaled (out's and dv_local's q, k: chunk_p_mma_h; wy's v, x), the copies go
// straight into the operand tile.
// Comba differs only where A and W are formed (F1', F3': P̂ rows and the exclusive cumsum Γ^ex) and in their
// backward (wy phase: dP̂, dΓ^ex); every other phase is shared. Chunk-parallel design (the kernel order of
// FLA, §6.3), every phase built from 64 x 64 shared-memory tile products (delta_tile.cuh):
//   forward:  wu    (per chunk)          A, 𝒯 = (I + A)^{-1} (to saved), W, U              (F1–F3)
//                                        (W to saved with the states)
//             scan  (per value tile)     h[n] = S entering chunk n; Δ = U - W S; S update  (F4, F7)
//                                        (h, Δ to saved)
//             out   (per chunk, v tile)  O = (Q ⊙ e^Γ) h[n] + P Δ                          (F5, F6)
//   backward: wu (none with the forward's saved 𝒯, W, h and Δ; from a saved 𝒯 alone W and U, and the scan
//             recomputes h and Δ; without `saved` A, 𝒯, W, U again, 𝒯 kept in scratch, and the scan), then
//             dv_local (per chunk, v tile)  dΔ = P^T dO                                    (B1, intra)
//             bwd_scan (per value tile)     dh[n] = dS_C of chunk n; dΔ += K^g dS_C; dS_0  (B1, B2)
//             dqk      (per chunk, k tile)  dQ, dK (P and state parts), dW, dΓ (i)–(iv)    (B3, B4, B8)
//             wy       (per chunk)          dV, dβ, dK (WY and A parts), dΓ (v)–(vi), dg   (B5–B7, B9)
// Launch order: wu over every (batch, head) pair, then per group of pairs the forward's scan and out, or the
// backward's scan (unless `saved` holds h and Δ), dv_local, bwd_scan, dqk and wy. Pairs form one group unless a
// scan's value-tile blocks span more than one wave of the GPU but not a whole number of waves (shape B = 4, H = 6,
// key_dim 256, value_dim 512: 24 pairs x 8 value tiles, one scan block per SM): then the last wave's pairs run as a
// second group on a side stream (by_waves, by_waves.cuh), and the first group's per-chunk kernels fill the SMs the
// last wave of scans leaves idle.
// Every kernel takes the first pair of its launch (bh0) in its arguments.
// Chunks of chunk_size <= 64 tokens fill the rows of one tile (rows past the chunk's end are zero).
// Scratch (global): P W, U/Δ, dW and fp32 dΔ [B H, T', *] (T' = chunks x chunk_size); fp32 𝒯 [B H,
// chunks, 64, 64]; P h, dh [B H, chunks, K, V]; fp32 dΓ [key tiles, B H, T'] (dqk's terms per key tile, added in
// order by wy). The caller's `saved` (GdnSaved; kept from the forward to the backward of the same inputs) holds 𝒯,
// and with `states` (model.gdn / model.comba save_states) h, U/Δ and W, instead of the scratch: the forward's wu and
// scan write them there, the backward reads them and runs neither wu nor the forward scan when it has W, h and Δ
// (from 𝒯 alone its wu forms W and U). Without it the forward keeps nothing and the backward forms everything again.
// Fixed summation orders and no atomics: deterministic.
#include <algorithm>
#include <initializer_list>
#include <type_traits>

#include "kernels/cuda/by_waves.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/delta_chunk.cuh"
#include "kernels/cuda/delta_tile.cuh"
#include "kernels/cuda/ops.cuh"

namespace llmt::cuda {
namespace {

#ifdef LLMT_CUDA_EMU
LLMT_CUDA_EMU_DYNAMIC_SMEM(smem);  // what the kernels' `extern __shared__ ... smem[]` name (tests/emu/cuda_emu.h)
#endif

using tile::Acc;
using tile::Carve;
using tile::Chunk;
using tile::load_acc;
using tile::store_acc;
using tile::tile_cols;
using tile::kLd;
using tile::kN;

/// e^x in fp32 of a log-decay difference formed in double.
__device__ __forceinline__ float expd(double x) { return expf(static_cast<float>(x)); }

// Inputs, outputs and scratch of one core call whose products have layout L (p, dp: Comba only); q, k, v, p
// of element type E (float, or bf16 with L::Operand bf16: see Inputs). The scratch W, U/Δ, dW, h, dh is stored in the
// type the products read their operands as (L::Operand; see Precision). bh0, nbh: the (batch, head) pairs bh0 ..
// bh0 + nbh - 1 that a launch covers (grid row y is pair bh0 + y; see by_waves).
template <typename L, typename E>
struct GdnFast {
  using S = typename L::Operand;
  const E *q, *k, *v, *p;
  const float *g, *beta, *d_o;
  float *o, *dq, *dk, *dv, *dp, *dg, *dbeta;
  int64_t B, T, H, K, V, C, NC, bh0, nbh;  // NC = ceil(T / C) chunks
  float *Tm, *dD, *dgam;
  S *W, *U, *dW, *h, *dh;
};

/// Scratch layout in floats: unless `saved` with `states` (the caller keeps 𝒯, h, Δ and W: GdnSaved) W, U/Δ and h,
/// and in the backward (and without `saved`: 𝒯) dΔ, dh, dW, dΓ; W, U, h, dh, dW have elements of `stored` bytes (4:
/// fp32; 2: bf16, two per float).
struct GdnScratch {
  int64_t W, U, h, Tm, dD, dh, dW, dgam, total;
  GdnScratch(int64_t B, int64_t T, int64_t H, int64_t K, int64_t V, int64_t C, bool backward, int64_t stored,
             bool saved, bool states) {
    const int64_t BH = B * H, NC = ceil_div(T, C), Tp = NC * C;
    int64_t at = 0;
    const auto take = [&](int64_t n) { const int64_t r = at; at += n; return r; };
    const auto take_s = [&](int64_t n) { return take((n * stored + 3) / 4); };  // floats that hold n elements
    W = U = h = Tm = dD = dh = dW = dgam = 0;
    if (!(saved && states)) W = take_s(BH * Tp * K), U = take_s(BH * Tp * V), h = take_s(BH * NC * K * V);
    if (backward) {
      if (!saved) Tm = take(BH * NC * kN * kN);
      dD = take(BH * Tp * V), dh = take_s(BH * NC * K * V), dW = take_s(BH * Tp * K);
      dgam = take(ceil_div(K, kN) * BH * Tp);
    }
    total = at;
  }
};

/// Layout in floats of the caller's `saved` (kept from the forward to the backward): fp32 𝒯 [B H, chunks, 64, 64],
/// then with `states` h [B H, chunks, K, V], Δ [B H, T', V] and W [B H, T', K] (T' = chunks x chunk_size; without:
/// h = D = W = 0), h, Δ and W with elements of `stored` bytes as the scratch; each region starts a multiple of 16
/// bytes after the start (the 16-byte alignment the kernels' cp.async copies ask of a tensor).
struct GdnSaved {
  int64_t Tm, h, D, W, total;
  GdnSaved(int64_t B, int64_t T, int64_t H, int64_t K, int64_t V, int64_t C, int64_t stored, bool states) {
    const int64_t BH = B * H, NC = ceil_div(T, C), Tp = NC * C;
    int64_t at = 0;
    const auto take = [&](int64_t n, int64_t bytes) {  // whole 16-byte pieces that hold n elements of `bytes` bytes
      const int64_t r = at;
      at += ceil_div(n * bytes, 16) * 4;
      return r;
    };
    Tm = take(BH * NC * kN * kN, 4), h = D = W = 0;
    if (states) h = take(BH * NC * K * V, stored), D = take(BH * Tp * V, stored), W = take(BH * Tp * K, stored);
    total = at;
  }
};

// Thread r < 64: row r's g and β of the chunk (0 for rows >= n), into registers (first half of load_gates).
template <typename A>
__device__ void fetch_gates(const A& a, const Chunk& ch, float& g_r, float& b_r) {
  const int r = static_cast<int>(threadIdx.x);
  if (r < kN) {
    const bool in = r < ch.n;
    g_r = in ? a.g[ch.gate(a, r)] : 0.0f;
    b_r = in ? a.beta[ch.gate(a, r)] : 0.0f;
  }
}

// Warp 0's shuffle scan of gate_pair_cumsum: Γ of rows 2l, 2l + 1 into v0, v1 of lane l (all 32 lanes of warp 0).
__device__ __forceinline__ void gate_pair_scan(float g0, float g1, double& v0, double& v1) {
  const int l = static_cast<int>(threadIdx.x);
  const double a0 = g0, pair = a0 + g1;
  double incl = pair;
  for (int o = 1; o < 32; o <<= 1) {
    const double y = __shfl_up_sync(0xffffffffu, incl, o);
    if (l >= o) incl += y;
  }
  const double excl = __shfl_up_sync(0xffffffffu, incl, 1);
  v0 = (l > 0 ? excl : 0.0) + a0;
  v1 = incl;
}

// Γ of the chunk into gam from warp 0's gate pairs (lane l: g of rows 2l, 2l + 1, 0 for rows >= n): a fixed shuffle
// scan over the lanes' pairs, in double; rows >= n repeat Γ_{n-1}. No barrier. Lanes of other warps pass anything.
__device__ void gate_pair_cumsum(float g0, float g1, double* gam) {
  if (threadIdx.x < 32) {
    const int l = static_cast<int>(threadIdx.x);
    double v0, v1;
    gate_pair_scan(g0, g1, v0, v1);
    gam[2 * l] = v0;
    gam[2 * l + 1] = v1;
  }
}

// gate_pair_cumsum, then a barrier (Γ visible to the block), which in the Mma bwd_scan also orders the previous
// chunk's state update before what follows (that chunk read Γ only before its own barriers).
__device__ void scan_gate_pair(float g0, float g1, double* gam) {
  gate_pair_cumsum(g0, g1, gam);
  __syncthreads();
}

// Γ_r (double, inclusive cumsum of g over the chunk, in a fixed order; rows >= n repeat Γ_{n-1}), β_r and g_r
// itself in tmp (Γ^ex_r = Γ_r - g_r) from fetch_gates' registers (second half of load_gates): g published to tmp,
// then scan_gate_pair over its pairs.
__device__ void scan_gates(float g_r, float b_r, double* gam, float* beta, float* tmp) {
  const int r = static_cast<int>(threadIdx.x);
  if (r < kN) {
    tmp[r] = g_r;
    beta[r] = b_r;
  }
  __syncthreads();
  const int l = r & 31;
  scan_gate_pair(tmp[2 * l], tmp[2 * l + 1], gam);
}

// Γ_r, β_r (0 for rows >= n) and g_r in tmp for the chunk (fetch_gates, then scan_gates).
template <typename A>
__device__ void load_gates(const A& a, const Chunk& ch, double* gam, float* beta, float* tmp) {
  float g_r = 0.0f, b_r = 0.0f;
  fetch_gates(a, ch, g_r, b_r);
  scan_gates(g_r, b_r, gam, beta, tmp);
}

// The chunk's gates at the start of the dynamic shared memory: Γ, β and g (tmp) by row (load_gates).
struct Gates {
  double* gam;
  float *beta, *tmp;
  __device__ explicit Gates(Carve& cv) : gam(cv.take<double>(kN)), beta(cv.take<float>(kN)), tmp(cv.take<float>(kN)) {}
  /// The log-decay that A's rows and W carry: Γ^ex_r (Comba) or Γ_r (GDN).
  template <bool kComba>
  __device__ double row_gam(int r) const { return kComba ? gam[r] - tmp[r] : gam[r]; }
};
constexpr size_t kGatesBytes = 8 * kN + 4 * 2 * kN + 3 * 16;

// Small per-block arrays at the start of the dynamic shared memory: the gates, then reduction scratch.
struct Small : Gates {
  float *red, *out1, *out2, *out3;
  __device__ explicit Small(Carve& cv)
      : Gates(cv), red(cv.take<float>(2 * kN * 16)), out1(cv.take<float>(kN)), out2(cv.take<float>(kN)),
        out3(cv.take<float>(kN)) {}
};
constexpr size_t kSmallBytes = 8 * kN + 4 * (5 * kN + 2 * kN * 16) + 7 * 16;

// ---- forward phases on layout L (fp32 models: L = Simt; the bf16 scan's large-key_dim fallback: L = Tc) ----

// F3 (Comba: F3') of chunk ch from 𝒯 in the shared tile sT and the gates in s (both written before the call,
// ordered by its first barrier): W = 𝒯 diag(β) (X ⊙ e^Γ) (Comba: e^{Γ^ex}) and U = 𝒯 diag(β) V (each tile its own
// product), through the shared operand tile sX (free at the call). Ends with a barrier.
template <typename L, typename E, bool kComba>
__device__ void wu_products(const GdnFast<L, E>& a, const Chunk& ch, const Small& s, const float* sT, float* sX) {
  const int64_t K = a.K, V = a.V;
  const E* x = kComba ? a.p : a.k;
  const auto id = [](int, int, float v) { return v; };
  Acc acc;
  for (int64_t k0 = 0; k0 < K; k0 += kN) {  // W
    tile::load(sX, ch.in(a, x, K, k0), a.H * K, ch.n, tile_cols(K, k0),
               [&](int r) { return s.beta[r] * expd(s.row_gam<kComba>(r)); });
    __syncthreads();
    acc.zero();
    L::template mma<false, false>(sT, sX, acc);
    store_acc<L>(acc, ch.rows(a, a.W, K, k0), K, ch.n, tile_cols(K, k0), id);
    __syncthreads();
  }
  for (int64_t v0 = 0; v0 < V; v0 += kN) {  // U
    tile::load(sX, ch.in(a, a.v, V, v0), a.H * V, ch.n, tile_cols(V, v0), [&](int r) { return s.beta[r]; });
    __syncthreads();
    acc.zero();
    L::template mma<false, false>(sT, sX, acc);
    store_acc<L>(acc, ch.rows(a, a.U, V, v0), V, ch.n, tile_cols(V, v0), id);
    __syncthreads();
  }
}

// F1–F3 (Comba: F1', F3') for chunk blockIdx.x of pair bh0 + blockIdx.y: A (tile), 𝒯 (tile; stored to a.Tm where
// given), W and U (wu_products). The row vectors of A and W: x = k (GDN) or p̂ (Comba).
template <typename L, typename E, bool kComba>
__global__ void __launch_bounds__(tile::kThreads) gdn_wu_kernel(GdnFast<L, E> a) {
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  Small s(cv);
  float *sA = cv.tile(), *sT = cv.tile(), *sX = cv.tile(), *sZ = cv.tile();
  const Chunk ch(a, blockIdx.x, a.bh0 + blockIdx.y);
  load_gates(a, ch, s.gam, s.beta, s.tmp);
  const int64_t K = a.K;
  const E* x = kComba ? a.p : a.k;
  Acc acc;
  acc.zero();
  for (int64_t k0 = 0; k0 < K; k0 += kN) {  // X K^T
    tile::load(sX, ch.in(a, x, K, k0), a.H * K, ch.n, tile_cols(K, k0));
    tile::load(sZ, ch.in(a, a.k, K, k0), a.H * K, ch.n, tile_cols(K, k0));
    __syncthreads();
    L::template mma<false, true>(sX, sZ, acc);
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // F1: A_rj = β_r e^{Γ_r-Γ_j} x_r·k_j (j < r); Comba: Γ^ex_r
      const int r = L::row(i), c = L::col(j);
      sA[r * kLd + c] =
          c < r && r < ch.n ? s.beta[r] * expd(s.row_gam<kComba>(r) - s.gam[c]) * acc.v[i][j] : 0.0f;
      sT[r * kLd + c] = r == c ? 1.0f : 0.0f;
    }
  __syncthreads();
  tile::tril_inverse_fast(sA, sT, ch.n);  // F2 (clobbers A's upper triangle: not read after)
  if (a.Tm != nullptr) tile::store(sT, ch.square(a, a.Tm), kN, kN, kN);
  wu_products<L, E, kComba>(a, ch, s, sT, sX);  // F3
}

// F3 (Comba: F3') for chunk blockIdx.x of pair bh0 + blockIdx.y from the 𝒯 the forward stored (a.Tm): W and U as
// gdn_wu_kernel forms them (the same bits), without A or its inverse (the backward's wu from a saved set without the
// states; with them the forward's W is kept there and no wu runs). GDN: at most 128 registers (127, no spills), two
// blocks an SM (unbounded the compiler takes 158: one); Comba: one (167 registers).
template <typename L, typename E, bool kComba>
__global__ void __launch_bounds__(tile::kThreads, kComba ? 1 : 2) gdn_wu_saved_kernel(GdnFast<L, E> a) {
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  Small s(cv);
  float *sT = cv.tile(), *sX = cv.tile();
  const Chunk ch(a, blockIdx.x, a.bh0 + blockIdx.y);
  load_gates(a, ch, s.gam, s.beta, s.tmp);
  tile::load(sT, ch.square(a, a.Tm), kN, kN, kN);
  wu_products<L, E, kComba>(a, ch, s, sT, sX);
}

// Prefetches (L2) what a scan reads of chunk nx besides the states: the gates, k and W rows (unless k_rows, w_rows
// say otherwise: a scan that copies them a whole chunk ahead), and U (forward) or q, dO and dΔ (backward) in value
// columns v0 .. v0 + vc - 1.
template <typename L, typename E>
__device__ void prefetch_chunk(const GdnFast<L, E>& a, const Chunk& nx, int64_t v0, int vc, bool backward,
                               bool k_rows = true, bool w_rows = true) {
  using tile::prefetch_l2;
  const int64_t K = a.K, V = a.V, H = a.H, e = sizeof(E), es = sizeof(typename L::Operand);
  prefetch_l2(a.g + nx.gate(a, 0), 4 * H, nx.n, 4);
  prefetch_l2(a.beta + nx.gate(a, 0), 4 * H, nx.n, 4);
  if (k_rows) prefetch_l2(nx.in(a, a.k, K, 0), e * H * K, nx.n, e * K);
  if (w_rows) prefetch_l2(nx.rows(a, a.W, K, 0), 0, 1, es * nx.n * K);  // the chunk's W rows are contiguous
  if (!backward) {
    prefetch_l2(nx.rows(a, a.U, V, v0), es * V, nx.n, es * vc);
    return;
  }
  prefetch_l2(nx.in(a, a.q, K, 0), e * H * K, nx.n, e * K);
  prefetch_l2(nx.in(a, a.d_o, V, v0), 4 * H * V, nx.n, 4 * vc);
  prefetch_l2(nx.rows(a, a.dD, V, v0), 4 * V, nx.n, 4 * vc);
}

// F4, F7 for value tile blockIdx.x of pair bh0 + blockIdx.y, chunks in order: stores h[n] (the state entering
// chunk n) and Δ = U - W h[n] (over U). The K x 64 state lives in shared memory (ceil(K / 64) tiles).
template <typename L, typename E>
__global__ void __launch_bounds__(tile::kThreads) gdn_scan_kernel(GdnFast<L, E> a) {
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  Small s(cv);
  float *sX = cv.tile(), *sD = cv.tile(), *S = cv.tile();  // S: the first of ceil(K / 64) state tiles
  const int64_t K = a.K, V = a.V, v0 = static_cast<int64_t>(blockIdx.x) * kN;
  const int bh = static_cast<int>(a.bh0) + static_cast<int>(blockIdx.y);
  const int vc = tile_cols(V, v0);
  const int nkt = static_cast<int>((K + kN - 1) / kN);
  for (int kt = 0; kt < nkt; ++kt) tile::clear(S + kt * tile::kTileFloats);
  for (int64_t chunk = 0; chunk < a.NC; ++chunk) {
    const Chunk ch(a, chunk, bh);
    if (chunk + 1 < a.NC) prefetch_chunk(a, Chunk(a, chunk + 1, bh), v0, vc, false);
    load_gates(a, ch, s.gam, s.beta, s.tmp);  // (its barrier also orders the state update before the store)
    for (int kt = 0; kt < nkt; ++kt)
      tile::store(S + kt * tile::kTileFloats, ch.state(a, a.h, kt * kN, v0), V, tile_cols(K, kt * kN), vc);
    Acc acc;
    acc.zero();
    for (int kt = 0; kt < nkt; ++kt) {  // W S
      tile::load(sX, ch.rows(a, a.W, K, kt * kN), K, ch.n, tile_cols(K, kt * kN));
      __syncthreads();
      L::template mma<false, false>(sX, S + kt * tile::kTileFloats, acc);
      __syncthreads();
    }
    typename L::Operand* U = ch.rows(a, a.U, V, v0);
    Acc d;
    load_acc<L>(d, U, V, ch.n, vc);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {  // F4: Δ = U - W S (0 outside the chunk)
        const int r = L::row(i), c = L::col(j);
        d.v[i][j] = r < ch.n && c < vc ? d.v[i][j] - acc.v[i][j] : 0.0f;
        sD[r * kLd + c] = d.v[i][j];
      }
    store_acc<L>(d, U, V, ch.n, vc, [](int, int, float x) { return x; });
    const double gC = s.gam[ch.n - 1];
    const float aC = expd(gC);
    for (int kt = 0; kt < nkt; ++kt) {  // F7: S = e^{Γ_C} S + (K ⊙ e^{Γ_C-Γ})^T Δ
      tile::load(sX, ch.in(a, a.k, K, kt * kN), a.H * K, ch.n, tile_cols(K, kt * kN),
                 [&](int r) { return expd(gC - s.gam[r]); });
      __syncthreads();
      acc.zero();
      L::template mma<true, false>(sX, sD, acc);
      float* St = S + kt * tile::kTileFloats;
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          float& e = St[L::row(i) * kLd + L::col(j)];
          e = aC * e + acc.v[i][j];
        }
      __syncthreads();
    }
  }
}

// Accumulates P = mask_{j<=r}(e^{Γ_r-Γ_j} Q K^T) of the chunk into the shared tile sP (sQ, sK scratch tiles);
// when sH is given, also acc_o += Q h[n][:, v0:v0+64] (sH scratch).
template <typename L, typename E>
__device__ void chunk_p(const GdnFast<L, E>& a, const Chunk& ch, const double* gam, float* sQ, float* sK, float* sP,
                        float* sH, int64_t v0, Acc* acc_o) {
  const int64_t K = a.K;
  Acc acc;
  acc.zero();
  for (int64_t k0 = 0; k0 < K; k0 += kN) {
    tile::load(sQ, ch.in(a, a.q, K, k0), a.H * K, ch.n, tile_cols(K, k0));
    tile::load(sK, ch.in(a, a.k, K, k0), a.H * K, ch.n, tile_cols(K, k0));
    if (acc_o) tile::load(sH, ch.state(a, a.h, k0, v0), a.V, tile_cols(K, k0), tile_cols(a.V, v0));
    __syncthreads();
    L::template mma<false, true>(sQ, sK, acc);
    if (acc_o) L::template mma<false, false>(sQ, sH, *acc_o);
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = L::row(i), c = L::col(j);
      sP[r * kLd + c] = c <= r ? expd(gam[r] - gam[c]) * acc.v[i][j] : 0.0f;
    }
}

// F5, F6 for pair bh0 + blockIdx.y and (chunk, value tile) = blockIdx.x / nvt, blockIdx.x % nvt:
// O = (Q ⊙ e^Γ) h[n] + P Δ.
// (The value tiles of a chunk are neighbours in the grid, so their reloads of the chunk's q, k hit the L2.)
template <typename L, typename E>
__global__ void __launch_bounds__(tile::kThreads) gdn_out_kernel(GdnFast<L, E> a) {
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  Small s(cv);
  float *sQ = cv.tile(), *sK = cv.tile(), *sH = cv.tile(), *sP = cv.tile();
  const int64_t V = a.V, nvt = (V + kN - 1) / kN, v0 = blockIdx.x % nvt * kN;
  const Chunk ch(a, blockIdx.x / nvt, a.bh0 + blockIdx.y);
  load_gates(a, ch, s.gam, s.beta, s.tmp);
  Acc acc_o;
  acc_o.zero();
  chunk_p<L>(a, ch, s.gam, sQ, sK, sP, sH, v0, &acc_o);
  tile::load(sQ, ch.rows(a, a.U, V, v0), V, ch.n, tile_cols(V, v0));  // Δ (sQ reused)
  __syncthreads();
  Acc acc;
  acc.zero();
  L::template mma<false, false>(sP, sQ, acc);
  float* o = ch.in(a, a.o, V, v0);
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = L::row(i), c = L::col(j);
      if (r < ch.n && c < tile_cols(V, v0)) o[r * a.H * V + c] = expd(s.gam[r]) * acc_o.v[i][j] + acc.v[i][j];
    }
}

// ---- forward phases on bf16 operand tiles (tile::Mma; bf16 models) ----
// The phases above with the bf16 rounding points of "Precision": every product operand is rounded to bf16
// once, as it is loaded into a bf16 shared tile (q, k, v, p̂ with their fp32 gate factors; W, U/Δ, h are
// bf16 already) or as it is formed (𝒯, P, Δ, S), and the products add straight into register accumulators
// (over all key tiles of a sum). Gates, A, 𝒯 (forward substitution), the running state S and the
// element-wise steps stay fp32. a: the arguments of the bf16 instantiation (L = Tc, the layout of the scans'
// fallback; here only its scratch element type, bf16, matters).
using tile::kLdH;
using tile::kTileHalves;
using tile::Mma;
using bf16 = __nv_bfloat16;

// tile::fetch_h of a tile of q, k, v or p̂ (E) into a thread's registers (a Frag or HRegs: the same map): fp32 by
// fetch_h itself; bf16 by one bf16x2 load per column pair where every pair is 4-byte aligned (src and stride even,
// cols even), else by fetch_h. The same values either way.
__device__ __forceinline__ void fetch_pairs_h(tile::HRegs& x, const bf16* src, int64_t stride, int rows, int cols) {
  const int r0 = static_cast<int>(threadIdx.x) >> 5, c = 2 * (static_cast<int>(threadIdx.x) & 31);
#pragma unroll
  for (int it = 0; it < tile::kHPer; ++it) {
    const int r = r0 + (tile::kThreads / 32) * it;
    const float2 y = r < rows && c < cols ? __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(
                                                src + r * stride + c))
                                          : make_float2(0.0f, 0.0f);
    x[it][0] = y.x, x[it][1] = y.y;
  }
}
__device__ __forceinline__ bool pairs_ok(const bf16* src, int64_t stride, int cols) {
  return reinterpret_cast<uintptr_t>(src) % 4 == 0 && stride % 2 == 0 && cols % 2 == 0;
}
template <typename E>
__device__ __forceinline__ void fetch_in(tile::Frag& f, const E* src, int64_t stride, int rows, int cols) {
  if constexpr (std::is_same_v<E, bf16>) {
    if (pairs_ok(src, stride, cols)) return fetch_pairs_h(f.x, src, stride, rows, cols);
  }
  tile::fetch_h(f, src, stride, rows, cols);
}
template <typename E>
__device__ __forceinline__ void fetch_in(tile::HRegs& x, const E* src, int64_t stride, int rows, int cols) {
  if constexpr (std::is_same_v<E, bf16>) {
    if (pairs_ok(src, stride, cols)) return fetch_pairs_h(x, src, stride, rows, cols);
  }
  tile::fetch_h(x, src, stride, rows, cols);
}

// Tiles in F3's ring of bf16 operand tiles (wu_products_mma; gdn_wu_mma_kernel and gdn_wu_saved_mma_kernel).
constexpr int kWuRing = 4;
// Shared memory of gdn_wu_mma_kernel: the gates, F3's ring, and an fp32 area of two tiles: X K^T's two bf16
// operand tiles (where they do not come from the ring), then fp32 A and 𝒯 (the inverse), then two bf16 tiles:
// 𝒯 (where A was) and F3's product tile (where 𝒯 was).
constexpr size_t kWuMmaSmem =
    kGatesBytes + kWuRing * sizeof(bf16) * kTileHalves + 2 * sizeof(float) * tile::kTileFloats;
// Shared memory of gdn_wu_saved_mma_kernel: the gates, F3's ring, the bf16 𝒯 and F3's product tile.
constexpr size_t kWuSavedMmaSmem = kGatesBytes + (kWuRing + 2) * sizeof(bf16) * kTileHalves;

// Whether F3's operand tiles (x = k, Comba p̂, and v) come by cp.async (wu_issue): bf16 inputs with every row and
// 8-column piece 16-byte aligned (tile::async_ok_h); else through registers (wu_fetch, put_h).
template <bool kComba, typename L, typename E>
__device__ __forceinline__ bool wu_async(const GdnFast<L, E>& a) {
  if constexpr (std::is_same_v<E, bf16>)
    return tile::async_ok_h(kComba ? a.p : a.k, a.K) && tile::async_ok_h(a.v, a.V);
  else
    return false;
}

// F3's operand tile t of chunk ch, unscaled, into f (tile::fetch_h): W's (x = k, Comba p̂: key tile t) for t < nkt,
// else U's (v: value tile t - nkt).
template <bool kComba, typename L, typename E>
__device__ __forceinline__ void wu_fetch(const GdnFast<L, E>& a, const Chunk& ch, int nkt, int t, tile::Frag& f) {
  const int64_t K = a.K, V = a.V;
  if (t < nkt)
    fetch_in(f, ch.in(a, kComba ? a.p : a.k, K, kN * t), a.H * K, ch.n, tile_cols(K, kN * t));
  else
    fetch_in(f, ch.in(a, a.v, V, kN * (t - nkt)), a.H * V, ch.n, tile_cols(V, kN * (t - nkt)));
}

// wu_fetch's tile t (of nt) by cp.async, unscaled, into slot t % kSlots of the ring (tile::load_h_async; only where
// wu_async), then one commit (an empty group for t >= nt, so that every call commits one).
template <int kSlots, bool kComba, typename L, typename E>
__device__ __forceinline__ void wu_issue(const GdnFast<L, E>& a, const Chunk& ch, int nkt, int nt, int t, bf16* ring) {
  if constexpr (std::is_same_v<E, bf16>) {
    if (t < nt) {
      const int64_t K = a.K, V = a.V;
      bf16* h = ring + (t % kSlots) * kTileHalves;
      if (t < nkt)
        tile::load_h_async(h, ch.in(a, kComba ? a.p : a.k, K, kN * t), a.H * K, ch.n, tile_cols(K, kN * t));
      else
        tile::load_h_async(h, ch.in(a, a.v, V, kN * (t - nkt)), a.H * V, ch.n, tile_cols(V, kN * (t - nkt)));
    }
  }
  tile::cp_async_commit();
}

// Waits until at most n (clamped to 0 .. 6) of the thread's cp.async groups are in flight (wu, out, dv_local:
// their ring depth is known at run time only).
__device__ __forceinline__ void cp_async_wait_upto(int n) {
  switch (n < 0 ? 0 : n) {
    case 0: tile::cp_async_wait<0>(); break;
    case 1: tile::cp_async_wait<1>(); break;
    case 2: tile::cp_async_wait<2>(); break;
    case 3: tile::cp_async_wait<3>(); break;
    case 4: tile::cp_async_wait<4>(); break;
    case 5: tile::cp_async_wait<5>(); break;
    default: tile::cp_async_wait<6>(); break;
  }
}

// F3's product tile t of chunk ch (wu_fetch's order), in the bf16 tile h, to W (t < nkt) or U (as 16-byte pieces
// where aligned: tile::store_h).
template <typename L, typename E>
__device__ __forceinline__ void wu_store(const GdnFast<L, E>& a, const Chunk& ch, int nkt, int t, const bf16* h) {
  const int64_t K = a.K, V = a.V;
  if (t < nkt)
    tile::store_h(h, ch.rows(a, a.W, K, kN * t), K, ch.n, tile_cols(K, kN * t));
  else
    tile::store_h(h, ch.rows(a, a.U, V, kN * (t - nkt)), V, ch.n, tile_cols(V, kN * (t - nkt)));
}

// F3 (Comba: F3') of chunk ch on the tensor cores: W = 𝒯 diag(β) (X ⊙ e^Γ) (Comba: e^{Γ^ex}) and
// U = 𝒯 diag(β) V (each tile its own product), from the bf16 𝒯 in hT and the gates in s (both written before
// the call, ordered by its first barrier). The operand tiles t < nt (W's, then U's: wu_fetch's order) pass through
// slot t % kSlots of the bf16 ring (free at the call, but for what async says), the products through the bf16 tile
// hO (free at the call) to global (wu_store). Tile t: its slot filled with the scaled tile (the product that last
// read that slot came before the previous barrier), a barrier, the next issue, the product into hO (the store
// that last read it came before the barrier), a barrier, the store of hO.
//   async (wu_async): tiles 0 .. kSlots - 1 were issued before the call (wu_issue, one group each; the slots may
//     hold them raw already, or any tile of them may still be in flight); tile t is scaled in place by the thread
//     that copied each piece (tile::scale_h_async) once its group has landed, and after the barrier of tile
//     t > 0 tile t + kSlots - 1 is issued into the slot tile t - 1 left, so up to kSlots - 1 tiles are in flight
//     during each product;
//   else: f holds tile 0 (wu_fetch) at the call; tile t goes from f into its slot scaled (put_h), then tile t + 1
//     is fetched into f (in flight during the product).
// Either way the elements and rounding of tile::load_h with the scale: the same products and bits.
template <int kSlots, bool kComba, typename L, typename E>
__device__ __forceinline__ void wu_products_mma(const GdnFast<L, E>& a, const Chunk& ch, const Gates& s,
                                                const bf16* hT, bf16* ring, bf16* hO, bool async, tile::Frag& f) {
  const int nkt = static_cast<int>((a.K + kN - 1) / kN), nt = nkt + static_cast<int>((a.V + kN - 1) / kN);
  for (int t = 0; t < nt; ++t) {
    bf16* h = ring + (t % kSlots) * kTileHalves;
    const auto scale = [&](int r) { return t < nkt ? s.beta[r] * expd(s.row_gam<kComba>(r)) : s.beta[r]; };
    if (async) {  // tile t is group t of kSlots + max(t - 1, 0) committed
      if (t == 0)
        tile::cp_async_wait<kSlots - 1>();
      else
        tile::cp_async_wait<kSlots - 2>();
      tile::scale_h_async(h, ch.n, scale);
    } else {
      tile::put_h(f, h, ch.n, scale);
      if (t + 1 < nt) wu_fetch<kComba>(a, ch, nkt, t + 1, f);
    }
    __syncthreads();
    if (async && t > 0) wu_issue<kSlots, kComba>(a, ch, nkt, nt, t + kSlots - 1, ring);
    Acc acc;
    acc.zero();
    Mma::mma<false, false>(hT, h, acc);
    tile::store_acc_h(acc, hO, tile::Same{});
    __syncthreads();
    wu_store(a, ch, nkt, t, hO);
  }
}

// F1–F3 for chunk blockIdx.x of pair bh0 + blockIdx.y, as gdn_wu_kernel (𝒯 stored to a.Tm where given), with the
// products of its bf16 rounding points (Precision). Where wu_async, F3's first kWuRing operand tiles are issued
// by cp.async before the gates are loaded (wu_issue); else k (Comba: and p̂) and v are asked of the L2 first.
// X K^T: GDN with wu_async and at most kWuRing key tiles reads the raw k tiles F3 keeps in its ring (each tile
// times itself); else in steps through two bf16 tiles of the fp32 area (GDN: key tiles 2 st, 2 st + 1, each
// times itself, both loaded together; Comba: p̂ and k of key tile st, one after the other). A is inverted by
// tile::tril_inverse_fast in the fp32 area, 𝒯 rounded to bf16 once into it (where A was), and F3
// (wu_products_mma) runs from there, its products through the fp32 area's second tile (where 𝒯 was) to global
// as 16-byte pieces. Without wu_async F3's first operand tile is fetched into registers during the inverse (GDN;
// Comba: after it, for want of registers). The same bits either way. At most 80 registers: three blocks an SM, as
// the shared memory allows (69.5 KiB).
template <typename L, typename E, bool kComba>
__global__ void __launch_bounds__(tile::kThreads, 3) gdn_wu_mma_kernel(GdnFast<L, E> a) {
  static_assert(std::is_same_v<typename L::Operand, bf16>, "bf16 scratch");
  using tile::Frag;
  using tile::put_h;
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  const Gates s(cv);
  bf16* ring = cv.take<bf16>(kWuRing * kTileHalves);
  float *sA = cv.tile(), *sT = cv.tile();
  // The fp32 area's bf16 tiles: X K^T's operands hX, hK before F1, then the bf16 𝒯 (hX) and F3's product tile
  // (hK).
  bf16 *hX = reinterpret_cast<bf16*>(sA), *hK = reinterpret_cast<bf16*>(sT);
  const Chunk ch(a, blockIdx.x, a.bh0 + blockIdx.y);
  const int64_t K = a.K, V = a.V, HK = a.H * K;
  const int nkt = static_cast<int>((K + kN - 1) / kN), nt = nkt + static_cast<int>((V + kN - 1) / kN);
  const E* x = kComba ? a.p : a.k;
  const auto one = [](int) { return 1.0f; };
  const bool async = wu_async<kComba>(a);
  const bool resident = async && !kComba && nkt <= kWuRing;  // X K^T from the ring's raw k tiles
  if (async) {
    for (int t = 0; t < kWuRing; ++t) wu_issue<kWuRing, kComba>(a, ch, nkt, nt, t, ring);
  } else {
    tile::prefetch_l2(ch.in(a, a.v, V, 0), sizeof(E) * a.H * V, ch.n, sizeof(E) * V);
  }
  if (!resident) {
    tile::prefetch_l2(ch.in(a, a.k, K, 0), sizeof(E) * HK, ch.n, sizeof(E) * K);
    if (kComba) tile::prefetch_l2(ch.in(a, x, K, 0), sizeof(E) * HK, ch.n, sizeof(E) * K);
  }
  float g_r = 0.0f, b_r = 0.0f;
  fetch_gates(a, ch, g_r, b_r);
  if (resident) cp_async_wait_upto(kWuRing - nkt);  // the k tiles' groups (the first nkt)
  scan_gates(g_r, b_r, s.gam, s.beta, s.tmp);       // (its first barrier also publishes the landed k tiles)
  Frag fa;
  Acc acc;
  acc.zero();
  if (resident) {
    for (int t = 0; t < nkt; ++t) Mma::mma<false, true>(ring + t * kTileHalves, ring + t * kTileHalves, acc);
  } else {
    // X K^T in steps: GDN (x = k) key tiles 2 st, 2 st + 1 into hX, hK (each tile times itself); Comba p and k of
    // key tile st.
    const int nxs = kComba ? nkt : (nkt + 1) / 2;
    for (int st = 0; st < nxs; ++st) {
      const int64_t ka = kComba ? kN * st : 2 * kN * st, kb = kComba ? ka : ka + kN;
      if (kComba) {  // one tile in flight at a time (80 registers)
        fetch_in(fa, ch.in(a, x, K, ka), HK, ch.n, tile_cols(K, ka));
        put_h(fa, hX, ch.n, one);
        fetch_in(fa, ch.in(a, a.k, K, kb), HK, ch.n, tile_cols(K, kb));
        put_h(fa, hK, ch.n, one);
      } else {  // both key tiles in flight together
        Frag fb;
        fetch_in(fa, ch.in(a, x, K, ka), HK, ch.n, tile_cols(K, ka));
        if (kb < K) fetch_in(fb, ch.in(a, a.k, K, kb), HK, ch.n, tile_cols(K, kb));
        put_h(fa, hX, ch.n, one);
        if (kb < K) put_h(fb, hK, ch.n, one);
      }
      __syncthreads();
      if (kComba) {
        Mma::mma<false, true>(hX, hK, acc);
      } else {
        Mma::mma<false, true>(hX, hX, acc);
        if (kb < K) Mma::mma<false, true>(hK, hK, acc);
      }
      __syncthreads();  // (also: hX, hK are read no more before F1 writes A and 𝒯 over them)
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // F1: A_rj = β_r e^{Γ_r-Γ_j} x_r·k_j (j < r); Comba: Γ^ex_r
      const int r = Mma::row(i), c = Mma::col(j);
      sA[r * kLd + c] =
          c < r && r < ch.n ? s.beta[r] * expd(s.row_gam<kComba>(r) - s.gam[c]) * acc.v[i][j] : 0.0f;
      sT[r * kLd + c] = r == c ? 1.0f : 0.0f;
    }
  if (!kComba && !async) wu_fetch<kComba>(a, ch, nkt, 0, fa);  // in flight during the inverse
  __syncthreads();
  tile::tril_inverse_fast(sA, sT, ch.n);  // F2 (ends with a barrier: A is read no more)
  if (kComba && !async) wu_fetch<kComba>(a, ch, nkt, 0, fa);
  if (a.Tm != nullptr) tile::store(sT, ch.square(a, a.Tm), kN, kN, kN);
  tile::load_h(hX, sT, kLd, kN, kN);  // 𝒯 in bf16, once, where A was (its readers, and F3's first write of hK
                                      // over the fp32 𝒯, come after F3's first barrier)
  wu_products_mma<kWuRing, kComba>(a, ch, s, hX, ring, hK, async, fa);  // F3
}

// F3 (Comba: F3') for chunk blockIdx.x of pair bh0 + blockIdx.y from the 𝒯 the forward stored (a.Tm), as
// gdn_wu_mma_kernel forms W and U (the same bits: 𝒯 rounded to bf16 as there, the same wu_products_mma), without A
// or its inverse (the backward's wu from a saved set without the states, as gdn_wu_saved_kernel). Where wu_async,
// F3's first kWuRing operand tiles are issued by cp.async first (wu_issue); else the chunk's x (k, Comba p̂) and
// v rows are asked of the L2 first and F3's first operand tile is fetched into registers; 𝒯 is fetched into
// registers while the gates are loaded. At most 64 registers (no spills): four blocks an SM (55 KiB of shared
// memory each), for more loads in flight.
template <typename L, typename E, bool kComba>
__global__ void __launch_bounds__(tile::kThreads, 4) gdn_wu_saved_mma_kernel(GdnFast<L, E> a) {
  static_assert(std::is_same_v<typename L::Operand, bf16>, "bf16 scratch");
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  const Gates s(cv);
  bf16 *ring = cv.take<bf16>(kWuRing * kTileHalves), *hT = cv.take<bf16>(kTileHalves),
       *hO = cv.take<bf16>(kTileHalves);
  const Chunk ch(a, blockIdx.x, a.bh0 + blockIdx.y);
  const int64_t K = a.K;
  const int nkt = static_cast<int>((K + kN - 1) / kN), nt = nkt + static_cast<int>((a.V + kN - 1) / kN);
  const bool async = wu_async<kComba>(a);
  tile::Frag ft, fa;
  if (async) {
    for (int t = 0; t < kWuRing; ++t) wu_issue<kWuRing, kComba>(a, ch, nkt, nt, t, ring);
  } else {
    tile::prefetch_l2(ch.in(a, kComba ? a.p : a.k, K, 0), sizeof(E) * a.H * K, ch.n, sizeof(E) * K);
    tile::prefetch_l2(ch.in(a, a.v, a.V, 0), sizeof(E) * a.H * a.V, ch.n, sizeof(E) * a.V);
  }
  tile::fetch_h(ft, ch.square(a, a.Tm), kN, kN, kN);
  if (!async) wu_fetch<kComba>(a, ch, nkt, 0, fa);
  load_gates(a, ch, s.gam, s.beta, s.tmp);
  tile::put_h(ft, hT, kN, [](int) { return 1.0f; });
  wu_products_mma<kWuRing, kComba>(a, ch, s, hT, ring, hO, async, fa);  // F3
}

// The small array of the Mma scans: Γ of the chunk (double; scan_gate_pair).
struct ScanSmall {
  double* gam;
  __device__ explicit ScanSmall(Carve& cv) : gam(cv.take<double>(kN)) {}
};
constexpr size_t kScanSmallBytes = 8 * kN;

// The scans' gates: lane l of warp 0 holds g of rows 2l, 2l + 1 of the chunk (0 for rows >= n) in g0, g1, the
// pairs scan_gates' warp 0 reads from shared memory; the scans need no β.
template <typename A>
__device__ void fetch_gate_pair(const A& a, const Chunk& ch, float& g0, float& g1) {
  const int l = static_cast<int>(threadIdx.x);
  if (l < 32) {
    g0 = 2 * l < ch.n ? a.g[ch.gate(a, 2 * l)] : 0.0f;
    g1 = 2 * l + 1 < ch.n ? a.g[ch.gate(a, 2 * l + 1)] : 0.0f;
  }
}

// The most key tiles the launcher gives gdn_scan_mma_kernel (key_dim <= 256; larger key_dim runs gdn_scan_kernel).
constexpr int kScanMaxKt = 4;

// Shared memory of gdn_scan_mma_kernel for nkt key tiles (the fp32 state itself is in registers): its bf16 copy, two
// buffers of the chunk's W tiles (the next chunk's land by cp.async while this one computes), the K^g tiles, Δ and
// the next chunk's U (bf16), and the fp32 staging tiles (16 KiB per key tile) of the next chunk's k. 122.5 KiB at
// key_dim 128, 226.5 KiB at 256.
constexpr size_t scan_mma_smem(int nkt) {
  return kScanSmallBytes + sizeof(bf16) * kTileHalves * (4 * nkt + 2) + sizeof(float) * tile::kStageFloats * nkt;
}
static_assert(scan_mma_smem(kScanMaxKt) <= 227 * 1024, "scan shared memory");

// Row factors f(r) of the N rows r0 + step i (i < N) that a thread's share of a tile conversion scales (put_h_staged:
// N = 4, step 16; put_h of a Frag: N = 8, step 8), each computed once and looked up by row (selects, no indexing)
// for every key tile: the values f(r) itself gives.
template <int N>
struct RowFactors {
  float f[N];
  int r0, step;
  template <typename F>
  __device__ RowFactors(int first, int stride, F fn) : r0(first), step(stride) {
#pragma unroll
    for (int i = 0; i < N; ++i) f[i] = fn(r0 + step * i);
  }
  __device__ float operator()(int r) const {
    float v = f[0];
#pragma unroll
    for (int i = 1; i < N; ++i)
      if (r >= r0 + step * i) v = f[i];
    return v;
  }
};

// q, k, v, p̂ tiles of element type E staged by cp.async for the Mma kernels. E = float: an fp32 staging tile
// (tile::stage_async; wy: stage_async_sw, swizzled) converted into a bf16 operand tile by put_h_staged (_sw). E = bf16:
// the bf16 rows copied as they are by 16-byte cp.async into the first half of the same staging tile
// (tile::stage_async_h: every thread's pieces where its own fp32 pieces would lie, so that a staging tile may hold
// tiles of either type by turns, as bwd_scan's ring does), scaled into the operand tile by put_h_staged_h. Either
// way a thread converts only the pieces it copied (its own cp_async_wait suffices), with load_h's elements and
// rounding: the same bits as loading the tensor by load_h.
template <typename E>
struct Staged;
template <>
struct Staged<float> {
  /// Whether the tiles of a tensor at p whose rows start at multiples of dim elements can be staged.
  __host__ __device__ static bool ok(const void* p, int64_t dim) { return tile::async_ok_f(p, dim); }
  __device__ static void stage(float* g, const float* src, int64_t stride, int rows, int cols) {
    tile::stage_async(g, src, stride, rows, cols);
  }
  template <typename Scale>
  __device__ static void put(bf16* s, const float* g, int rows, Scale scale) {
    tile::put_h_staged(s, g, rows, scale);
  }
  __device__ static void put(bf16* s, const float* g, int rows) { tile::put_h_staged(s, g, rows); }
  /// The staged value at (r, c) (another thread's piece: after a barrier).
  __device__ static float at(const float* g, int r, int c) { return g[r * kN + c]; }
  /// The rows of thread tid's pieces (put's): tid >> kRowShift + kRowStep i, i < kRows (for RowFactors).
  static constexpr int kRows = 4, kRowShift = 4, kRowStep = 16;
  // The swizzled staging of gdn_bwd_wy_mma_kernel: stage, put.
  __device__ static void stage_sw(float* g, const float* src, int64_t stride, int rows, int cols) {
    tile::stage_async_sw(g, src, stride, rows, cols);
  }
  template <typename Scale>
  __device__ static void put_sw(bf16* s, const float* g, int rows, Scale scale) {
    tile::put_h_staged_sw(s, g, rows, scale);
  }
  __device__ static void put_sw(bf16* s, const float* g, int rows) { tile::put_h_staged_sw(s, g, rows); }
};
template <>
struct Staged<bf16> {
  __host__ __device__ static bool ok(const void* p, int64_t dim) { return tile::async_ok_h(p, dim); }
  __device__ static void stage(float* g, const bf16* src, int64_t stride, int rows, int cols) {
    tile::stage_async_h(g, src, stride, rows, cols);
  }
  template <typename Scale>
  __device__ static void put(bf16* s, const float* g, int rows, Scale scale) {
    tile::put_h_staged_h(s, g, rows, scale);
  }
  __device__ static void put(bf16* s, const float* g, int rows) {
    tile::put_h_staged_h(s, g, rows, [](int) { return 1.0f; });
  }
  __device__ static float at(const float* g, int r, int c) { return tile::staged_h_at(g, r, c); }
  static constexpr int kRows = 2, kRowShift = 3, kRowStep = 32;  // (put's rows: tid / 8 + 32 i)
  // (No swizzle: a warp's 16-byte pieces are contiguous.)
  __device__ static void stage_sw(float* g, const bf16* src, int64_t stride, int rows, int cols) {
    stage(g, src, stride, rows, cols);
  }
  template <typename Scale>
  __device__ static void put_sw(bf16* s, const float* g, int rows, Scale scale) {
    put(s, g, rows, scale);
  }
  __device__ static void put_sw(bf16* s, const float* g, int rows) { put(s, g, rows); }
};

// F4, F7 for value tile blockIdx.x of pair bh0 + blockIdx.y, chunks in order, as gdn_scan_kernel: stores h[n] (bf16)
// and Δ = U - W h[n] (over U). Per chunk, two barriers:
//   1. (after the first) h[n] = hS to global (store_h: 16-byte pieces, rows contiguous, where value_dim % 8 == 0,
//      else element by element; h[0] = 0 from the cleared hS); key tile by key tile in order, W S's product
//      (summed over the key tiles in registers; S as its bf16 copy hS, which the chunk before's update wrote) and
//      the K^g = K ⊙ e^{Γ_C-Γ} tile (the row factors e^{Γ_C-Γ_r} formed once a chunk, RowFactors), so that the
//      products cover the conversions' latencies; then Δ = U - W S (registers -> the bf16 tile hD);
//   2. (after the second) Δ = hD over U (store_h as h); per key tile S = e^{Γ_C} S + (K^g)^T Δ with S fp32 in
//      registers (the thread's 16 elements of each of the kNkt key tiles: one instantiation per key-tile count),
//      then from the registers hS = bf16(S) (store_acc_h: h[n+1]'s bits, stored by the next chunk), and warp 0
//      forms the next chunk's Γ (gate_pair_cumsum; every read of this chunk's is before the second barrier). The
//      last chunk stops after Δ's store (no one reads its final state).
// Key tiles in order in every sum: the bits of forming W S from a re-read hS after the conversions.
// Loads ahead: the next chunk's W tiles (into the other W buffer, whose last readers, the chunk before's W S, are
// before its second barrier) and its raw k tiles (into the staging tiles, Staged<E>; each thread scales its own staged
// pieces into K^g, the arithmetic of load_h, and issues the next copies into them after its own conversions) as
// one cp.async group after the first barrier; its U tile (into hU, read back at the Mma map into
// registers, its readers before the second barrier) as a second group after the second; both waited for before the
// next chunk's first barrier. The gates a chunk ahead in registers (fetched during the update). The L2 is asked two
// chunks ahead (prefetch_chunk) for what is read with less notice than a chunk: the gates, U and the k, W rows that
// are not copied a whole chunk ahead. Where W or U is not 16-byte aligned (key_dim % 8 != 0, value_dim % 8 != 0) it
// is loaded synchronously instead (W by load_h at the same point, a chunk ahead; U by load_acc in the chunk); so is
// k where its rows are not 16-byte aligned (key_dim % 4 != 0; bf16 k: % 8), one key tile ahead in registers (tile 0 during the first barrier, tile kt + 1 during
// tile kt's product and conversion). Same arithmetic either way. Blocks an SM: two with one key tile (70.5 KiB of
// shared memory, at most 128 registers), else one (the shared memory allows no more; up to 255 registers).
template <typename L, typename E, int kNkt>
__global__ void __launch_bounds__(tile::kThreads, kNkt == 1 ? 2 : 1) gdn_scan_mma_kernel(GdnFast<L, E> a) {
  static_assert(std::is_same_v<typename L::Operand, bf16>, "bf16 scratch");
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  ScanSmall s(cv);
  const int64_t K = a.K, V = a.V, v0 = static_cast<int64_t>(blockIdx.x) * kN;
  const int bh = static_cast<int>(a.bh0) + static_cast<int>(blockIdx.y);
  const int vc = tile_cols(V, v0);
  constexpr int nkt = kNkt;  // (= ceil(K / 64), the launcher's choice)
  bf16 *hS = cv.take<bf16>(kTileHalves * nkt), *hW = cv.take<bf16>(2 * kTileHalves * nkt),
       *hK = cv.take<bf16>(kTileHalves * nkt), *hD = cv.take<bf16>(kTileHalves), *hU = cv.take<bf16>(kTileHalves);
  float* gK = cv.take<float>(nkt * tile::kStageFloats);
  const bool w_async = tile::async_ok_h(a.W, K), u_async = tile::async_ok_h(a.U, V);
  // (Every row of k starts a multiple of K elements after the tensor's start.)
  const bool k_async = Staged<E>::ok(a.k, K);
  const Chunk c0(a, 0, bh);  // (the others: c0.at)
  // Chunk c's W tiles into W buffer c % 2 (cp.async, or load_h) and (k_async) its k tiles into the staging tiles;
  // one cp.async group.
  const auto issue_wk = [&](int64_t c) {
    const Chunk nx = c0.at(a, c);
    for (int kt = 0; kt < nkt; ++kt) {
      const int kc = tile_cols(K, kt * kN);
      bf16* w = hW + ((c & 1) * nkt + kt) * kTileHalves;
      if (w_async)
        tile::load_h_async(w, nx.rows(a, a.W, K, kt * kN), K, nx.n, kc);
      else
        tile::load_h(w, nx.rows(a, a.W, K, kt * kN), K, nx.n, kc);
      if (k_async) Staged<E>::stage(gK + kt * tile::kStageFloats, nx.in(a, a.k, K, kt * kN), a.H * K, nx.n, kc);
    }
    tile::cp_async_commit();
  };
  // Chunk c's U tile into hU (u_async); one cp.async group.
  const auto issue_u = [&](int64_t c) {
    const Chunk nx = c0.at(a, c);
    if (u_async) tile::load_h_async(hU, nx.rows(a, a.U, V, v0), V, nx.n, vc);
    tile::cp_async_commit();
  };
  const int tid = static_cast<int>(threadIdx.x);
  Acc S[nkt];  // the running state, key tile by key tile
#pragma unroll
  for (int kt = 0; kt < nkt; ++kt) S[kt].zero();
  tile::clear_h(hS, nkt);
  float g0 = 0.0f, g1 = 0.0f;  // (warp 0) the gate pairs of the chunk to come (fetched one chunk ahead)
  fetch_gate_pair(a, c0, g0, g1);
  issue_wk(0);
  issue_u(0);
  // The L2 two chunks ahead for what is read with less notice than a chunk: the gates, U (copied during the update)
  // and the k, W rows that are not copied a whole chunk ahead.
  const auto prefetch = [&](int64_t c) { prefetch_chunk(a, c0.at(a, c), v0, vc, false, !k_async, !w_async); };
  if (a.NC > 1) prefetch(1);
  gate_pair_cumsum(g0, g1, s.gam);  // chunk 0's Γ
  Acc acc;
  for (int64_t chunk = 0; chunk < a.NC; ++chunk) {
    const Chunk ch = c0.at(a, chunk);
    const bool more = chunk + 1 < a.NC;
    if (chunk + 2 < a.NC) prefetch(chunk + 2);
    // Synchronous k: key tile kt of the chunk into x (registers).
    const auto fetch_k = [&](tile::Frag& x, int kt) {
      fetch_in(x, ch.in(a, a.k, K, kt * kN), a.H * K, ch.n, tile_cols(K, kt * kN));
    };
    tile::Frag kx;  // (synchronous k) the next key tile's k, in flight while the tile before is converted
    if (!k_async) fetch_k(kx, 0);  // (in flight during the barrier)
    tile::cp_async_wait<0>();      // this chunk's W, k, U (the barrier below makes them visible to every thread)
    // Γ, hS (the update before), the W buffer, the staged k and hU complete; every read of hK, hD by the update
    // before done
    __syncthreads();
    for (int kt = 0; kt < nkt; ++kt)  // h[n] = bf16(S) from its copy hS (h[0] = 0: the cleared hS)
      tile::store_h(hS + kt * kTileHalves, ch.state(a, a.h, kt * kN, v0), V, tile_cols(K, kt * kN), vc);
    const double gC = s.gam[ch.n - 1];
    const float aC = expd(gC);
    const auto kscale = [&](int r) { return expd(gC - s.gam[r]); };
    typename L::Operand* U = ch.rows(a, a.U, V, v0);
    Acc d;
    if (u_async)
      load_acc<Mma>(d, hU, kLdH, ch.n, vc);
    else
      load_acc<Mma>(d, U, V, ch.n, vc);
    // Per key tile in order: W S's product (acc, the sum over the key tiles) and the K^g tile, so that the products
    // cover the conversions' latencies (synchronous k: the next tile's loads).
    acc.zero();
    const bf16* hWc = hW + (chunk & 1) * nkt * kTileHalves;
    const auto ws = [&](int kt) { Mma::mma<false, false>(hWc + kt * kTileHalves, hS + kt * kTileHalves, acc); };
    if (k_async) {  // the thread's own staged pieces
      const RowFactors<Staged<E>::kRows> ks(tid >> Staged<E>::kRowShift, Staged<E>::kRowStep, kscale);
      for (int kt = 0; kt < nkt; ++kt) {
        ws(kt);
        Staged<E>::put(hK + kt * kTileHalves, gK + kt * tile::kStageFloats, ch.n, ks);
      }
    } else {  // put_h's rows tid / 32 + 8 i
      const RowFactors<8> ks(tid >> 5, 8, kscale);
      for (int kt = 0; kt < nkt; ++kt) {
        const tile::Frag x = kx;
        if (kt + 1 < nkt) fetch_k(kx, kt + 1);
        ws(kt);
        tile::put_h(x, hK + kt * kTileHalves, ch.n, ks);
      }
    }
    if (more) issue_wk(chunk + 1);  // (after the thread's own reads of the staging tiles)
    tile::delta_h<false>(d, acc, ch.n, vc, hD);  // F4: Δ = U - W S (0 outside the chunk) into hD
    __syncthreads();  // hD, hK complete; every read of U, hU, hS, this chunk's W buffer and Γ done
    tile::store_h(hD, U, V, ch.n, vc);  // Δ over U
    if (!more) break;  // (no one reads the final state)
    issue_u(chunk + 1);
    const Chunk nx = c0.at(a, chunk + 1);
    fetch_gate_pair(a, nx, g0, g1);  // in flight during F7
#pragma unroll
    for (int kt = 0; kt < nkt; ++kt) {  // F7: S = e^{Γ_C} S + (K ⊙ e^{Γ_C-Γ})^T Δ
      acc.zero();
      Mma::mma<true, false>(hK + kt * kTileHalves, hD, acc);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) S[kt].v[i][j] = aC * S[kt].v[i][j] + acc.v[i][j];
      tile::store_acc_h(S[kt], hS + kt * kTileHalves, tile::Same{});  // the next W S's operand (and h[n+1])
    }
    gate_pair_cumsum(g0, g1, s.gam);  // the next chunk's Γ
  }
}

// Q K^T of the chunk on tile::Mma into qk (the sum over the nkt key tiles in registers), q and k of every key tile
// loaded into the bf16 tiles hQ, hK first (kept there for the caller's later products).
template <typename L, typename E>
__device__ __forceinline__ void chunk_qk_mma(const GdnFast<L, E>& a, const Chunk& ch, int nkt, bf16* hQ, bf16* hK,
                                             Acc& qk) {
  const int64_t K = a.K;
  for (int kt = 0; kt < nkt; ++kt) {
    const int kc = tile_cols(K, kt * kN);
    tile::load_h(hQ + kt * kTileHalves, ch.in(a, a.q, K, kt * kN), a.H * K, ch.n, kc);
    tile::load_h(hK + kt * kTileHalves, ch.in(a, a.k, K, kt * kN), a.H * K, ch.n, kc);
  }
  __syncthreads();
  qk.zero();
  for (int kt = 0; kt < nkt; ++kt) Mma::mma<false, true>(hQ + kt * kTileHalves, hK + kt * kTileHalves, qk);
}

// Dynamic shared memory a per-chunk block may take and still run `blocks` blocks per SM (sm_90: 228 KiB a
// multiprocessor, 1 KiB of it reserved per block).
__host__ __device__ constexpr size_t smem_per_block(int blocks) { return 228 * 1024 / blocks - 1024; }
// The bf16 tiles of a per-chunk Mma kernel's layout that fit in smem_per_block(blocks) beside `small` bytes.
__host__ __device__ constexpr int tiles_within(int blocks, size_t small) {
  return static_cast<int>((smem_per_block(blocks) - small) / (sizeof(bf16) * kTileHalves));
}

// Γ of the chunk into gam (the scans' gate pairs: fetch_gate_pair, scan_gate_pair), q and k of every key tile into the
// bf16 tiles hQ, hK (load_h's bits; one key tile of each in registers at a time, tile 0's loads in flight across the
// gates' scan and tile kt + 1's while tile kt is stored), then P = mask(e^{Γ_r-Γ_j} Q K^T) into hP (the sum over
// the key tiles in registers). hP is complete, and every read of hQ, hK done, at the caller's next barrier.
template <typename L, typename E>
__device__ void chunk_p_mma(const GdnFast<L, E>& a, const Chunk& ch, int nkt, double* gam, bf16* hQ, bf16* hK,
                            bf16* hP) {
  const int64_t K = a.K;
  const auto one = [](int) { return 1.0f; };
  float g0 = 0.0f, g1 = 0.0f;
  fetch_gate_pair(a, ch, g0, g1);
  tile::Frag fq, fk;
  if (nkt > 0) {
    fetch_in(fq, ch.in(a, a.q, K, 0), a.H * K, ch.n, tile_cols(K, 0));
    fetch_in(fk, ch.in(a, a.k, K, 0), a.H * K, ch.n, tile_cols(K, 0));
  }
  scan_gate_pair(g0, g1, gam);
  for (int kt = 0; kt < nkt; ++kt) {
    const int64_t k1 = (kt + 1) * kN;
    tile::put_h(fq, hQ + kt * kTileHalves, ch.n, one);
    if (kt + 1 < nkt) fetch_in(fq, ch.in(a, a.q, K, k1), a.H * K, ch.n, tile_cols(K, k1));
    tile::put_h(fk, hK + kt * kTileHalves, ch.n, one);
    if (kt + 1 < nkt) fetch_in(fk, ch.in(a, a.k, K, k1), a.H * K, ch.n, tile_cols(K, k1));
  }
  __syncthreads();  // hQ, hK complete
  Acc qk;
  qk.zero();
  for (int kt = 0; kt < nkt; ++kt) Mma::mma<false, true>(hQ + kt * kTileHalves, hK + kt * kTileHalves, qk);
  tile::store_acc_h(qk, hP, [&](int r, int c, float x) { return c <= r ? expd(gam[r] - gam[c]) * x : 0.0f; });
}

// issue() (the caller's cp.async copies; it returns how many groups it committed), then chunk_p_mma of bf16 q, k; where
// every row of q, k is 16-byte aligned (Staged<bf16>::ok), with q, k copied as they are by cp.async straight into hQ,
// hK (load_h_async: the same bits) in one group issued before issue()'s, so that the caller's stay in flight past the
// wait for it (after the gates' scan). (Its P step repeats chunk_p_mma's: a shared helper changes the fp32-input
// kernels' code.)
template <typename L, typename Issue>
__device__ __forceinline__ void chunk_p_mma_h(const GdnFast<L, bf16>& a, const Chunk& ch, int nkt, double* gam,
                                              bf16* hQ, bf16* hK, bf16* hP, Issue issue) {
  const int64_t K = a.K;
  if (!Staged<bf16>::ok(a.q, K) || !Staged<bf16>::ok(a.k, K)) {
    issue();
    return chunk_p_mma(a, ch, nkt, gam, hQ, hK, hP);
  }
  for (int kt = 0; kt < nkt; ++kt) {
    const int kc = tile_cols(K, kt * kN);
    tile::load_h_async(hQ + kt * kTileHalves, ch.in(a, a.q, K, kt * kN), a.H * K, ch.n, kc);
    tile::load_h_async(hK + kt * kTileHalves, ch.in(a, a.k, K, kt * kN), a.H * K, ch.n, kc);
  }
  tile::cp_async_commit();
  const int issued = issue();
  float g0 = 0.0f, g1 = 0.0f;
  fetch_gate_pair(a, ch, g0, g1);
  scan_gate_pair(g0, g1, gam);
  cp_async_wait_upto(issued);  // (q, k's group)
  __syncthreads();             // hQ, hK complete
  Acc qk;
  qk.zero();
  for (int kt = 0; kt < nkt; ++kt) Mma::mma<false, true>(hQ + kt * kTileHalves, hK + kt * kTileHalves, qk);
  tile::store_acc_h(qk, hP, [&](int r, int c, float x) { return c <= r ? expd(gam[r] - gam[c]) * x : 0.0f; });
}

// dst[r * stride + c] = f(r, c, acc element) for the thread's elements (tile::Mma map) with r < rows, c < cols, into
// an fp32 tensor. vec (dst 16-byte aligned; stride and cols multiples of 4): by 16-byte pieces, lanes 2m and 2m + 1
// swapping a column pair (shuffles) so that the even lane holds columns col(0) .. + 3 and the odd one col(2) - 2 .. +
// 3 of each of its rows; else element by element (store_acc). Reached by every thread (the shuffles).
template <typename F>
__device__ __forceinline__ void store_acc_f4(const Acc& acc, float* dst, int64_t stride, int rows, int cols, bool vec,
                                             F f) {
  if (!vec) {
    store_acc<Mma>(acc, dst, stride, rows, cols, f);
    return;
  }
  const bool odd = threadIdx.x & 1;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = Mma::row(i);
    float x[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) x[j] = f(r, Mma::col(j), acc.v[i][j]);
    const float y0 = __shfl_xor_sync(0xffffffffu, odd ? x[0] : x[2], 1);
    const float y1 = __shfl_xor_sync(0xffffffffu, odd ? x[1] : x[3], 1);
    const int c = odd ? Mma::col(2) - 2 : Mma::col(0);
    if (r < rows && c < cols)
      *reinterpret_cast<float4*>(dst + r * stride + c) =
          odd ? make_float4(y0, y1, x[2], x[3]) : make_float4(x[0], x[1], y0, y1);
  }
}

// The ring of gdn_out_mma_kernel for nkt key tiles: the most bf16 tiles that fit beside Γ, e^Γ, Q (nkt tiles) and P
// in the shared memory of 3 blocks per SM (key_dim <= 128) or 2 (larger), at most kOutMaxRing, at least nkt + 1 (the
// K tiles and one step's copy while P is formed).
constexpr size_t kOutSmallBytes = sizeof(double) * kN + sizeof(float) * kN;  // Γ, e^Γ
constexpr int kOutMaxRing = 8;
__host__ __device__ constexpr int out_ring(int nkt) {
  const int fit = tiles_within(nkt <= 2 ? 3 : 2, kOutSmallBytes) - nkt - 1;
  const int r = fit < kOutMaxRing ? fit : kOutMaxRing;
  return r > nkt + 1 ? r : nkt + 1;
}
// Shared memory of gdn_out_mma_kernel for nkt key tiles: Γ, e^Γ, then the bf16 tiles Q (nkt), P and the ring.
// 72.75 KiB at key_dim 128 (ring of 5), 108.75 KiB at 256 (ring of 7).
constexpr size_t out_mma_smem(int nkt) {
  return kOutSmallBytes + sizeof(bf16) * kTileHalves * (nkt + 1 + out_ring(nkt));
}
static_assert(out_mma_smem(2) <= smem_per_block(3) && out_mma_smem(4) <= smem_per_block(2), "out blocks per SM");

// F5, F6 for chunk blockIdx.x of pair bh0 + blockIdx.y, every value tile: P = mask(e^{Γ_r-Γ_j} Q K^T) once
// (chunk_p_mma), then per value tile O = (Q ⊙ e^Γ) h[n] + P Δ (Q h summed over the key tiles in registers, P Δ from
// zero; the same sums and roundings whatever the path below). A step is one bf16 tile of h[n] or Δ: per value tile
// its nkt h[n] tiles (key tiles in order), then its Δ tile; step s's tile in ring slot s % R (R = out_ring(nkt)).
// In flight (h, U 16-byte aligned: tile::async_ok_h):
//   prologue: the copies of steps 0 .. A - 1 (A = R - nkt; load_h_async, one group a step) are issued first (bf16
//     q, k 16-byte aligned: right after Q and K's own group, chunk_p_mma_h), then chunk_p_mma (Γ, Q, K with K in slots
//     A .. R - 1, P) runs while they land;
//   step s: wait for its own copies, one barrier (step s's tile complete; every product of step s - 1 done, so slot
//     (s - 1) % R is free; at s = 0: P complete and the K tiles read), then the copies of step s + R - 1 into that
//     slot (at s = 0: of steps A .. R - 1 into the K slots), one group a step (empty past the last step), then the
//     step's product: Q h[n] into qh or, at a Δ step, P Δ and o = e^Γ qh + P Δ stored (16-byte pieces where o is
//     16-byte aligned and value_dim % 4 == 0). R - 1 steps' tiles in flight behind the products.
// Fallback (h or U not 16-byte aligned: value_dim % 8 != 0): each step loads its tile synchronously (load_h: the
// same bits) into its slot before its barrier (the slot was last read by step s - R, before step s - 1's barrier;
// slots >= A hold K until step 0's barrier). At most 80 registers, for 3 blocks per SM (ptxas spills 16 bytes).
template <typename L, typename E>
__global__ void __launch_bounds__(tile::kThreads, 3) gdn_out_mma_kernel(GdnFast<L, E> a) {
  static_assert(std::is_same_v<typename L::Operand, bf16>, "bf16 scratch");
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  const int64_t K = a.K, V = a.V;
  const int nkt = static_cast<int>((K + kN - 1) / kN), R = out_ring(nkt), A = R - nkt;
  double* gam = cv.take<double>(kN);
  float* ex = cv.take<float>(kN);
  bf16 *hQ = cv.take<bf16>(kTileHalves * nkt), *hP = cv.take<bf16>(kTileHalves),
       *ring = cv.take<bf16>(kTileHalves * R);
  const Chunk ch(a, blockIdx.x, a.bh0 + blockIdx.y);
  const bool async = tile::async_ok_h(a.h, V) && tile::async_ok_h(a.U, V);
  // The next step's tile into slot (steps in order; (nv0, nt): its value tile and its key tile, nt = nkt: Δ); async: by
  // cp.async, one group (empty past the last step).
  const bf16 *h0 = ch.state(a, a.h, 0, 0), *u0 = ch.rows(a, a.U, V, 0);
  int nv0 = 0, nt = 0;
  const auto load_next = [&](bf16* slot) {
    if (nv0 < V) {
      const bf16* src = nt < nkt ? h0 + nt * kN * V + nv0 : u0 + nv0;
      const int rows = nt < nkt ? tile_cols(K, nt * kN) : ch.n;
      if (async)
        tile::load_h_async(slot, src, V, rows, tile_cols(V, nv0));
      else
        tile::load_h(slot, src, V, rows, tile_cols(V, nv0));
      if (++nt > nkt) nt = 0, nv0 += kN;
    }
    if (async) tile::cp_async_commit();
  };
  const auto prologue = [&] {
    if (async)
      for (int i = 0; i < A; ++i) load_next(ring + i * kTileHalves);
    return async ? A : 0;
  };
  if constexpr (std::is_same_v<E, bf16>)
    chunk_p_mma_h(a, ch, nkt, gam, hQ, ring + A * kTileHalves, hP, prologue);
  else
    prologue(), chunk_p_mma(a, ch, nkt, gam, hQ, ring + A * kTileHalves, hP);
  if (threadIdx.x < kN) ex[threadIdx.x] = expd(gam[threadIdx.x]);  // (read after step 0's barrier)
  float* const o = ch.in(a, a.o, V, 0);
  const bool o_vec = tile::async_ok_f(a.o, V);  // (o's rows start at multiples of V elements)
  int slot = 0;  // the step's ring slot (the step mod R)
  for (int v0 = 0; v0 < V; v0 += kN) {
    Acc qh;
    qh.zero();
    for (int t = 0; t <= nkt; ++t) {  // step (v0, t): h[n]'s key tile t, then (t = nkt) Δ
      const bool first = v0 == 0 && t == 0;
      bf16* cur = ring + slot * kTileHalves;
      if (async)
        cp_async_wait_upto(first ? A - 1 : R - 2);  // this step's group (the newer ones may stay in flight)
      else
        load_next(cur);
      __syncthreads();
      if (async) {
        if (first)
          for (int i = A; i < R; ++i) load_next(ring + i * kTileHalves);
        else
          load_next(ring + (slot == 0 ? R - 1 : slot - 1) * kTileHalves);
      }
      slot = slot + 1 == R ? 0 : slot + 1;
      if (t < nkt) {
        Mma::mma<false, false>(hQ + t * kTileHalves, cur, qh);
        continue;
      }
      Acc pd;
      pd.zero();
      Mma::mma<false, false>(hP, cur, pd);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) pd.v[i][j] = ex[Mma::row(i)] * qh.v[i][j] + pd.v[i][j];  // o
      store_acc_f4(pd, o + v0, a.H * V, ch.n, tile_cols(V, v0), o_vec, tile::Same{});
    }
  }
}

// ---- backward phases on layout L (fp32 models: L = Simt; the bf16 bwd_scan's large-key_dim fallback: L = Tc) ----

// B1 (intra-chunk part) for pair bh0 + blockIdx.y and (chunk, value tile) as gdn_out_kernel: dΔ = P^T dO.
template <typename L, typename E>
__global__ void __launch_bounds__(tile::kThreads) gdn_dv_local_kernel(GdnFast<L, E> a) {
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  Small s(cv);
  float *sQ = cv.tile(), *sK = cv.tile(), *sP = cv.tile();
  const int64_t V = a.V, nvt = (V + kN - 1) / kN, v0 = blockIdx.x % nvt * kN;
  const Chunk ch(a, blockIdx.x / nvt, a.bh0 + blockIdx.y);
  load_gates(a, ch, s.gam, s.beta, s.tmp);
  chunk_p<L>(a, ch, s.gam, sQ, sK, sP, nullptr, v0, nullptr);
  tile::load(sQ, ch.in(a, a.d_o, V, v0), a.H * V, ch.n, tile_cols(V, v0));  // dO (sQ reused)
  __syncthreads();
  Acc acc;
  acc.zero();
  L::template mma<true, false>(sP, sQ, acc);
  store_acc<L>(acc, ch.rows(a, a.dD, V, v0), V, ch.n, tile_cols(V, v0), [](int, int, float x) { return x; });
}

// B1 (state part) and B2 for value tile blockIdx.x of pair bh0 + blockIdx.y, chunks in reverse: stores dh[n]
// (= dS_C, the gradient of the state leaving chunk n), completes dΔ += K^g dS_C, then
// dS <- e^{Γ_C} dS_C + (Q ⊙ e^Γ)^T dO - W^T dΔ.
template <typename L, typename E>
__global__ void __launch_bounds__(tile::kThreads) gdn_bwd_scan_kernel(GdnFast<L, E> a) {
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  Small s(cv);
  float *sX = cv.tile(), *sZ = cv.tile(), *sY = cv.tile(), *sE = cv.tile(), *dS = cv.tile();
  const int64_t K = a.K, V = a.V, v0 = static_cast<int64_t>(blockIdx.x) * kN;
  const int bh = static_cast<int>(a.bh0) + static_cast<int>(blockIdx.y);
  const int vc = tile_cols(V, v0);
  const int nkt = static_cast<int>((K + kN - 1) / kN);
  for (int kt = 0; kt < nkt; ++kt) tile::clear(dS + kt * tile::kTileFloats);
  for (int64_t chunk = a.NC - 1; chunk >= 0; --chunk) {
    const Chunk ch(a, chunk, bh);
    if (chunk > 0) prefetch_chunk(a, Chunk(a, chunk - 1, bh), v0, vc, true);
    load_gates(a, ch, s.gam, s.beta, s.tmp);
    for (int kt = 0; kt < nkt; ++kt)
      tile::store(dS + kt * tile::kTileFloats, ch.state(a, a.dh, kt * kN, v0), V, tile_cols(K, kt * kN), vc);
    const double gC = s.gam[ch.n - 1];
    const float aC = expd(gC);
    Acc acc;
    acc.zero();
    for (int kt = 0; kt < nkt; ++kt) {  // K^g dS_C
      tile::load(sX, ch.in(a, a.k, K, kt * kN), a.H * K, ch.n, tile_cols(K, kt * kN),
                 [&](int r) { return expd(gC - s.gam[r]); });
      __syncthreads();
      L::template mma<false, false>(sX, dS + kt * tile::kTileFloats, acc);
      __syncthreads();
    }
    float* dD = ch.rows(a, a.dD, V, v0);
    Acc d;
    load_acc<L>(d, dD, V, ch.n, vc);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {  // B1: dΔ = P^T dO + K^g dS_C (0 outside the chunk)
        const int r = L::row(i), c = L::col(j);
        d.v[i][j] = r < ch.n && c < vc ? d.v[i][j] + acc.v[i][j] : 0.0f;
        sE[r * kLd + c] = d.v[i][j];
      }
    store_acc<L>(d, dD, V, ch.n, vc, [](int, int, float x) { return x; });
    tile::load(sY, ch.in(a, a.d_o, V, v0), a.H * V, ch.n, vc);
    for (int kt = 0; kt < nkt; ++kt) {  // B2
      tile::load(sX, ch.in(a, a.q, K, kt * kN), a.H * K, ch.n, tile_cols(K, kt * kN),
                 [&](int r) { return expd(s.gam[r]); });
      tile::load(sZ, ch.rows(a, a.W, K, kt * kN), K, ch.n, tile_cols(K, kt * kN));
      __syncthreads();
      Acc qd, wd;
      qd.zero();
      wd.zero();
      L::template mma<true, false>(sX, sY, qd);
      L::template mma<true, false>(sZ, sE, wd);
      float* St = dS + kt * tile::kTileFloats;
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          float& e = St[L::row(i) * kLd + L::col(j)];
          e = aC * e + qd.v[i][j] - wd.v[i][j];
        }
      __syncthreads();
    }
  }
}

// ---- steps the dqk kernels share, on product layout PL (gdn_bwd_dqk_kernel: Simt; gdn_bwd_dqk_mma_kernel: Mma) ----

/// The chunk's rows of part p (key tile p) of the dΓ scratch [key tiles, B H, T']: the dqk kernels' B8 terms
/// of key tile p (dqk_finish); wy adds the parts in order (dgam_sum).
template <typename A>
__device__ __forceinline__ float* dgam_part(const A& a, const Chunk& ch, int p) {
  return ch.rows(a, a.dgam + p * a.B * a.H * a.NC * a.C, 1, 0);
}
/// Row r of the chunk's dΓ terms of the dqk kernels: the parts of every key tile added in key-tile order.
template <typename A>
__device__ __forceinline__ float dgam_sum(const A& a, const Chunk& ch, int r) {
  float s = 0.0f;
  for (int p = 0; p * kN < a.K; ++p) s += dgam_part(a, ch, p)[r];
  return s;
}

// B3, in place in dp (= dO Δ^T): dP ⊙ E (masked).
template <typename PL>
__device__ __forceinline__ void dqk_dP(Acc& dp, const double* gam) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = PL::row(i), c = PL::col(j);
      dp.v[i][j] = c <= r ? expd(gam[r] - gam[c]) * dp.v[i][j] : 0.0f;
    }
}

// Key tile k0 (kc columns): dQ (B3), dK (B4), dW = -dΔ h^T and dΓ terms (i)–(iii) of B8 from the products
// dqs = dO h^T, dks = Δ dS_C^T, dws = dΔ h^T, dq2 = dP K, dk2 = dP^T Q (dP ⊙ E, masked); xq(i, j), xk(i, j): q, k
// in fp32 at the thread's element (i, j). (ii) is the key tile's share of Σ_j dP_rj (Q K^T)_rj at row r and
// -Σ_r dP_rj (Q K^T)_rj at row j, by Σ_j dP_rj (Q K^T)_rj = Σ_c q_rc (dP K)_rc and
// Σ_r dP_rj (Q K^T)_rj = Σ_c k_jc (dP^T Q)_jc: row terms of this key tile only (no Q K^T). On Mma, whose columns
// j, j + 1 (j even) of a thread are adjacent, dQ and dK are stored as float2 and dW as bf16x2 where aligned.
template <typename PL, typename L, typename E, typename Xq, typename Xk>
__device__ __forceinline__ void dqk_store(const GdnFast<L, E>& a, const Chunk& ch, const double* gam, int64_t k0,
                                          int kc, double gC, Xq xq, Xk xk, const Acc& dqs, const Acc& dks,
                                          const Acc& dws, const Acc& dq2, const Acc& dk2, float (&row_part)[4],
                                          float& kz) {
  using S = typename L::Operand;
  constexpr bool kAdjacent = std::is_same_v<PL, tile::Mma>;
  const int64_t K = a.K, ld = a.H * K;
  float *dq = ch.in(a, a.dq, K, k0), *dk = ch.in(a, a.dk, K, k0);
  S* dW = ch.rows(a, a.dW, K, k0);
  const bool pairs = kAdjacent && K % 2 == 0 && reinterpret_cast<uintptr_t>(a.dq) % 8 == 0 &&
                     reinterpret_cast<uintptr_t>(a.dk) % 8 == 0 && reinterpret_cast<uintptr_t>(a.dW) % 4 == 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = PL::row(i);
    const float eg = expd(gam[r]), ekg = expd(gC - gam[r]);
#pragma unroll
    for (int jp = 0; jp < 4; jp += 2) {
      float vq[2], vk[2], vw[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int j = jp + e;
        const float x = xq(i, j), y = xk(i, j);
        row_part[i] += eg * x * dqs.v[i][j];                // (i)
        row_part[i] += x * dq2.v[i][j] - y * dk2.v[i][j];  // (ii)
        const float z = ekg * y * dks.v[i][j];
        row_part[i] -= z;  // (iii), every row
        kz += z;           // (iii), at row C
        vq[e] = eg * dqs.v[i][j] + dq2.v[i][j];  // B3
        vk[e] = dk2.v[i][j] + ekg * dks.v[i][j];  // B4
        vw[e] = -dws.v[i][j];
      }
      if (r >= ch.n) continue;
      const int c = PL::col(jp);
      if constexpr (kAdjacent) {
        if (pairs && c + 1 < kc) {
          *reinterpret_cast<float2*>(dq + r * ld + c) = make_float2(vq[0], vq[1]);
          *reinterpret_cast<float2*>(dk + r * ld + c) = make_float2(vk[0], vk[1]);
          *reinterpret_cast<__nv_bfloat162*>(dW + r * K + c) = __floats2bfloat162_rn(vw[0], vw[1]);
          continue;
        }
      }
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int ce = PL::col(jp + e);
        if (ce < kc) {
          dq[r * ld + ce] = vq[e];
          dk[r * ld + ce] = vk[e];
          dW[r * K + ce] = from_f32<S>(vw[e]);
        }
      }
    }
  }
}

// Key tile kt's dΓ terms of B8 into its part of the dΓ scratch (dgam_part): the row partials, (iii) at row C
// (kz: the thread's share) and (iv) (sd: the thread's share of the key tile's Σ h ⊙ dh). red: 64 x 16 floats,
// out: 64 floats of shared scratch.
template <typename PL, typename L, typename E>
__device__ __forceinline__ void dqk_finish(const GdnFast<L, E>& a, const Chunk& ch, int kt, double gC, float* red,
                                           float* out, const float (&row_part)[4], float kz, float sd) {
  tile::reduce_rows<PL>(row_part, red, out);
  const float c_all = block_reduce(kz + expd(gC) * sd, SumOp{}, 0.0f);  // (iii) and (iv) at row C
  const int r = static_cast<int>(threadIdx.x);
  if (r < ch.n) dgam_part(a, ch, kt)[r] = out[r] + (r == ch.n - 1 ? c_all : 0.0f);
}

// B3, B4 (P and state parts of dK), dW = -dΔ h^T and dΓ terms (i)–(iv) of B8 (into the dΓ scratch, one part per
// key tile), for chunk blockIdx.x of pair bh0 + blockIdx.y.
template <typename L, typename E>
__global__ void __launch_bounds__(tile::kThreads) gdn_bwd_dqk_kernel(GdnFast<L, E> a) {
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  Small s(cv);
  float *sdP = cv.tile(), *sX = cv.tile(), *sZ = cv.tile(), *sY = cv.tile(), *sH = cv.tile(), *sD = cv.tile(),
        *sG = cv.tile(), *sE = cv.tile();
  const Chunk ch(a, blockIdx.x, a.bh0 + blockIdx.y);
  const int64_t K = a.K, V = a.V;
  load_gates(a, ch, s.gam, s.beta, s.tmp);
  const double gC = s.gam[ch.n - 1];
  Acc dp;
  dp.zero();
  for (int64_t v0 = 0; v0 < V; v0 += kN) {  // dO Δ^T
    tile::load(sY, ch.in(a, a.d_o, V, v0), a.H * V, ch.n, tile_cols(V, v0));
    tile::load(sD, ch.rows(a, a.U, V, v0), V, ch.n, tile_cols(V, v0));
    __syncthreads();
    L::template mma<false, true>(sY, sD, dp);
    __syncthreads();
  }
  dqk_dP<L>(dp, s.gam);  // B3: dP ⊙ E (masked)
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) sdP[L::row(i) * kLd + L::col(j)] = dp.v[i][j];
  for (int64_t k0 = 0; k0 < K; k0 += kN) {
    const int kc = tile_cols(K, k0);
    Acc dqs, dks, dws;  // dO h^T, Δ dS_C^T, dΔ h^T
    dqs.zero();
    dks.zero();
    dws.zero();
    float sd = 0.0f;  // Σ h ⊙ dh for (iv), this thread's share
    for (int64_t v0 = 0; v0 < V; v0 += kN) {
      const int vc = tile_cols(V, v0);
      tile::load(sY, ch.in(a, a.d_o, V, v0), a.H * V, ch.n, vc);
      tile::load(sH, ch.state(a, a.h, k0, v0), V, kc, vc);
      tile::load(sD, ch.rows(a, a.U, V, v0), V, ch.n, vc);
      tile::load(sG, ch.state(a, a.dh, k0, v0), V, kc, vc);
      tile::load(sE, ch.rows(a, a.dD, V, v0), V, ch.n, vc);
      __syncthreads();
      L::template mma<false, true>(sY, sH, dqs);
      L::template mma<false, true>(sD, sG, dks);
      L::template mma<false, true>(sE, sH, dws);
      for (int idx = threadIdx.x; idx < kN * kN; idx += tile::kThreads) {
        const int r = idx >> 6, c = idx & 63;
        sd += sH[r * kLd + c] * sG[r * kLd + c];
      }
      __syncthreads();
    }
    tile::load(sX, ch.in(a, a.q, K, k0), a.H * K, ch.n, kc);
    tile::load(sZ, ch.in(a, a.k, K, k0), a.H * K, ch.n, kc);
    __syncthreads();
    Acc dq2, dk2;  // dP K, dP^T Q
    dq2.zero();
    dk2.zero();
    L::template mma<false, false>(sdP, sZ, dq2);
    L::template mma<true, false>(sdP, sX, dk2);
    float row_part[4] = {0, 0, 0, 0}, kz = 0.0f;  // B8 (i)–(iii) rows, (iii) total: this thread's share
    dqk_store<L>(a, ch, s.gam, k0, kc, gC, [&](int i, int j) { return sX[L::row(i) * kLd + L::col(j)]; },
                 [&](int i, int j) { return sZ[L::row(i) * kLd + L::col(j)]; }, dqs, dks, dws, dq2, dk2, row_part, kz);
    // (dqk_finish's barriers order the reads of sX, sZ before the next key tile's loads)
    dqk_finish<L>(a, ch, static_cast<int>(k0 / kN), gC, s.red, s.out1, row_part, kz, sd);
  }
}

// ---- steps the wy kernels share, on product layout PL (gdn_bwd_wy_kernel: Simt; gdn_bwd_wy_mma_kernel: Mma) ----

// How a wy kernel reads and writes the thread's elements (layout PL) of an fp32 tile of dK, dP̂ or dV in global
// memory: element by element (load_acc, store_acc), or, with kPairs (PL = Mma only; 8-byte aligned tensors, even
// strides and dims), by column pairs (load_acc_pairs, store_acc_pairs). The same values either way.
template <typename PL, bool kPairs>
struct AccIo {
  __device__ void load(Acc& out, const float* src, int64_t stride, int rows, int cols) const {
    if constexpr (kPairs)
      tile::load_acc_pairs(out, src, static_cast<int>(stride), rows, cols);
    else
      load_acc<PL>(out, src, stride, rows, cols);
  }
  template <typename F>
  __device__ void store(const Acc& acc, float* dst, int64_t stride, int rows, int cols, F f) const {
    if constexpr (kPairs)
      tile::store_acc_pairs(acc, dst, static_cast<int>(stride), rows, cols, f);
    else
      store_acc<PL>(acc, dst, stride, rows, cols, f);
  }
};

// B6, in place in dtv: d𝒯 = dU (diag(β) V)^T + dW (diag(β) K^d)^T from dtv = dΔ V^T and dtw = dW K^T, lower part.
template <typename PL, bool kComba>
__device__ __forceinline__ void wy_dT(Acc& dtv, const Acc& dtw, const Small& s) {
  float eg[4];  // e^Γ of the thread's columns
#pragma unroll
  for (int j = 0; j < 4; ++j) eg[j] = expd(s.row_gam<kComba>(PL::col(j)));
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = PL::row(i), c = PL::col(j);
      dtv.v[i][j] = c <= r ? s.beta[c] * (dtv.v[i][j] + eg[j] * dtw.v[i][j]) : 0.0f;
    }
}

// In place in m (= M1 𝒯^T): dA (j < r) times E (dAE).
template <typename PL, bool kComba>
__device__ __forceinline__ void wy_dae_e(Acc& m, const Small& s, const Chunk& ch) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = PL::row(i), c = PL::col(j);
      m.v[i][j] = c < r && r < ch.n ? -m.v[i][j] * expd(s.row_gam<kComba>(r) - s.gam[c]) : 0.0f;
    }
}

// dAE's B7 dβ and B8 (vi) terms into the thread's partials (dae = dAE from wy_dae_e, kk = X K^T).
template <typename PL>
__device__ __forceinline__ void wy_dae_terms(const Acc& dae, const Acc& kk, const Small& s, float (&db_part)[4],
                                             float (&row_x)[4], float (&col_part)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      db_part[i] += dae.v[i][j] * kk.v[i][j];
      const float y = dae.v[i][j] * s.beta[PL::row(i)] * kk.v[i][j];
      row_x[i] += y;
      col_part[j] -= y;
    }
}

// In place in m (= M1 𝒯^T): dAE (wy_dae_e), and its terms into the thread's partials (wy_dae_terms).
template <typename PL, bool kComba>
__device__ __forceinline__ void wy_dae(Acc& m, const Acc& kk, const Small& s, const Chunk& ch, float (&db_part)[4],
                                       float (&row_x)[4], float (&col_part)[4]) {
  wy_dae_e<PL, kComba>(m, s, ch);
  wy_dae_terms<PL>(m, kk, s, db_part, row_x, col_part);
}

// Key tile k0 (kc columns) of dX and of Comba's dK as they are before B7, at the thread's elements into dxo, dko
// (io: see AccIo).
template <bool kComba, typename L, typename E, typename Io>
__device__ __forceinline__ void wy_b7_load(const GdnFast<L, E>& a, const Chunk& ch, int64_t k0, int kc, float* dx,
                                           const Io& io, Acc& dxo, Acc& dko) {
  io.load(dxo, ch.in(a, dx, a.K, k0), a.H * a.K, ch.n, kc);
  if (kComba) io.load(dko, ch.in(a, a.dk, a.K, k0), a.H * a.K, ch.n, kc);
}

// B7 for key tile k0 (kc columns), onto dxo, dko (wy_b7_load) and stored: dX_r += β_r (dAE K)_r (xr);
// (dAE^T (β X))_j (yc) goes to dK (Comba) or to dX (GDN: x = k).
template <typename PL, bool kComba, typename L, typename E, typename Io>
__device__ __forceinline__ void wy_b7_store(const GdnFast<L, E>& a, const Chunk& ch, const Small& s, int64_t k0, int kc,
                                            float* dx, const Acc& xr, const Acc& yc, const Io& io, Acc& dxo,
                                            Acc& dko) {
  const int64_t K = a.K;
  float *dk = ch.in(a, a.dk, K, k0), *dxt = ch.in(a, dx, K, k0);
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      dxo.v[i][j] += s.beta[PL::row(i)] * xr.v[i][j];
      if (kComba)
        dko.v[i][j] += yc.v[i][j];
      else
        dxo.v[i][j] += yc.v[i][j];  // GDN: x = k, both terms go to dK
    }
  io.store(dxo, dxt, a.H * K, ch.n, kc, tile::Same{});
  if (kComba) io.store(dko, dk, a.H * K, ch.n, kc, tile::Same{});
}

// Slot stride of wy_finish's partials (8 mod 32 banks: a warp's Mma row partials land in 32 different banks).
constexpr int kWyRedLd = 72;
// Floats of shared scratch that wy_finish needs (gdn_bwd_wy_kernel: its tiles sX .. sZ).
constexpr int kWyRedFloats = 4 * 16 * kWyRedLd;
static_assert(kWyRedFloats <= 3 * tile::kTileFloats, "wy_finish's scratch in gdn_bwd_wy_kernel's sX .. sZ");

// The block's dβ (B7) and dg (B9) from the thread's partials: dΓ = their row and column terms plus the dΓ scratch
// (the dqk kernels' terms, dgam_sum), dg_t = Σ_{r >= t in the chunk} dΓ_r (+ Comba: Σ_{r > t} dΓ^ex_r). One pass:
// every partial into red (kWyRedFloats floats of free shared memory; slot-major, so that a row's 16 partials are
// read without bank conflicts), a barrier, then threads 0..63 sum dβ, 64..127 dΓ, 128..191 dΓ^ex of row t % 64 (the
// 16 row partials in slot order, then the 16 column partials: tile::reduce_rows_cols's order and bits).
template <typename PL, bool kComba, typename L, typename E>
__device__ __forceinline__ void wy_finish(const GdnFast<L, E>& a, const Chunk& ch, const Small& s, float* red,
                                          const float (&db_part)[4], const float (&row_part)[4],
                                          const float (&col_part)[4], const float (&ex_part)[4]) {
  const int t = static_cast<int>(threadIdx.x), r = t & (kN - 1), part = t >> 6;
  const float dgam = part == 1 && r < ch.n ? dgam_sum(a, ch, r) : 0.0f;  // the dqk kernels' dΓ terms
  float *rdb = red, *rrow = red + 16 * kWyRedLd, *rcol = rrow + 16 * kWyRedLd, *rex = rcol + 16 * kWyRedLd;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int at = PL::row_slot() * kWyRedLd + PL::row(i);
    rdb[at] = db_part[i];
    rrow[at] = row_part[i];
    if (kComba) rex[at] = ex_part[i];
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) rcol[PL::col_slot() * kWyRedLd + PL::col(j)] = col_part[j];
  __syncthreads();
  if (part == 0 || (kComba && part == 2)) {  // dβ, dΓ^ex: row partials only (their column partials are zero)
    const float* p = part == 0 ? rdb : rex;
    float acc = 0.0f;
    for (int q = 0; q < 16; ++q) acc += p[q * kWyRedLd + r];
    acc += 0.0f;
    if (part == 0 && r < ch.n) a.dbeta[ch.gate(a, r)] = acc;
    if (part == 2) s.out3[r] = acc;
  } else if (part == 1) {  // dΓ
    float acc = 0.0f;
    for (int q = 0; q < 16; ++q) acc += rrow[q * kWyRedLd + r];
    for (int q = 0; q < 16; ++q) acc += rcol[q * kWyRedLd + r];
    s.out2[r] = r < ch.n ? acc + dgam : acc;
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // B9, rows n - 1 .. 0 in order; each 16 rows' dΓ read first (their loads overlap)
    float acc = 0.0f, acc_ex = 0.0f, *dg = a.dg + ch.gate(a, 0);
#pragma unroll 1
    for (int i0 = kN - 16; i0 >= 0; i0 -= 16) {
      float d2[16], d3[16];
#pragma unroll
      for (int q = 0; q < 16; ++q) {
        d2[q] = s.out2[i0 + q];
        d3[q] = kComba ? s.out3[i0 + q] : 0.0f;
      }
#pragma unroll
      for (int q = 15; q >= 0; --q) {
        const int i = i0 + q;
        if (i < ch.n) {
          acc += d2[q];
          dg[i * a.H] = acc + acc_ex;
          if (kComba) acc_ex += d3[q];
        }
      }
    }
  }
}

// B5–B7, B8 (v)–(vi) and B9 for chunk blockIdx.x of pair bh0 + blockIdx.y: dV, dβ, dK += (WY and A parts), dg.
// Comba (§6.5 "Comba changes"): the row vectors x = p̂ with Γ^ex; their gradient goes to dP̂ (written here),
// the row terms of dΓ to dΓ^ex, and dg_t = Σ_{r>=t} dΓ_r + Σ_{r>t} dΓ^ex_r.
template <typename L, typename E, bool kComba>
__global__ void __launch_bounds__(tile::kThreads) gdn_bwd_wy_kernel(GdnFast<L, E> a) {
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  Small s(cv);
  float *sT = cv.tile(), *sdT = cv.tile(), *sM = cv.tile(), *sX = cv.tile(), *sY = cv.tile(), *sZ = cv.tile();
  const Chunk ch(a, blockIdx.x, a.bh0 + blockIdx.y);
  const int64_t K = a.K, V = a.V;
  load_gates(a, ch, s.gam, s.beta, s.tmp);
  tile::load(sT, ch.square(a, a.Tm), kN, kN, kN);
  const E* x = kComba ? a.p : a.k;
  float* dx = kComba ? a.dp : a.dk;
  Acc kk;
  kk.zero();
  for (int64_t k0 = 0; k0 < K; k0 += kN) {  // X K^T
    tile::load(sX, ch.in(a, x, K, k0), a.H * K, ch.n, tile_cols(K, k0));
    tile::load(sY, ch.in(a, a.k, K, k0), a.H * K, ch.n, tile_cols(K, k0));
    __syncthreads();
    L::template mma<false, true>(sX, sY, kk);
    __syncthreads();
  }
  // Row partials of dβ, dΓ (rows and columns) and dΓ^ex (Comba; GDN adds its row terms to dΓ).
  float db_part[4] = {0, 0, 0, 0}, row_part[4] = {0, 0, 0, 0}, col_part[4] = {0, 0, 0, 0};
  float ex_part[4] = {0, 0, 0, 0};
  float(&row_x)[4] = kComba ? ex_part : row_part;
  Acc dtv, dtw;  // dΔ V^T, dW K^T (column factors applied below)
  dtv.zero();
  dtw.zero();
  for (int64_t v0 = 0; v0 < V; v0 += kN) {  // B5, U side: X_U = 𝒯^T dΔ, dV = β X_U
    const int vc = tile_cols(V, v0);
    tile::load(sZ, ch.rows(a, a.dD, V, v0), V, ch.n, vc);
    tile::load(sY, ch.in(a, a.v, V, v0), a.H * V, ch.n, vc);
    __syncthreads();
    Acc x;
    x.zero();
    L::template mma<true, false>(sT, sZ, x);
    L::template mma<false, true>(sZ, sY, dtv);
    float* dv = ch.in(a, a.dv, V, v0);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int r = L::row(i), c = L::col(j);
        db_part[i] += x.v[i][j] * sY[r * kLd + c];
        if (r < ch.n && c < vc) dv[r * a.H * V + c] = s.beta[r] * x.v[i][j];
      }
    __syncthreads();
  }
  for (int64_t k0 = 0; k0 < K; k0 += kN) {  // B5, W side: X_W = 𝒯^T dW, dX (+)= β X_W ⊙ e^Γ; B8 (v)
    const int kc = tile_cols(K, k0);
    tile::load(sZ, ch.rows(a, a.dW, K, k0), K, ch.n, kc);
    tile::load(sX, ch.in(a, x, K, k0), a.H * K, ch.n, kc);
    __syncthreads();
    Acc xw;
    xw.zero();
    L::template mma<true, false>(sT, sZ, xw);
    L::template mma<false, true>(sZ, sX, dtw);
    float* dxt = ch.in(a, dx, K, k0);
    Acc d;  // dK so far (GDN); Comba writes dP̂ here first
    if (kComba)
      d.zero();
    else
      load_acc<L>(d, dxt, a.H * K, ch.n, kc);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int r = L::row(i), c = L::col(j);
        const float eg = expd(s.row_gam<kComba>(r)), xk = xw.v[i][j] * sX[r * kLd + c] * eg;
        db_part[i] += xk;
        row_x[i] += s.beta[r] * xk;
        d.v[i][j] += s.beta[r] * eg * xw.v[i][j];
      }
    store_acc<L>(d, dxt, a.H * K, ch.n, kc, [](int, int, float x) { return x; });
    __syncthreads();
  }
  wy_dT<L, kComba>(dtv, dtw, s);  // B6
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) sdT[L::row(i) * kLd + L::col(j)] = dtv.v[i][j];
  __syncthreads();
  Acc m;
  m.zero();
  L::template mma<true, false>(sT, sdT, m);  // M1 = 𝒯^T d𝒯
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) sM[L::row(i) * kLd + L::col(j)] = m.v[i][j];
  __syncthreads();
  m.zero();
  L::template mma<false, true>(sM, sT, m);  // M1 𝒯^T
  wy_dae<L, kComba>(m, kk, s, ch, db_part, row_x, col_part);  // dA (j < r) times E, into sdT; B7 dβ; B8 (vi)
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) sdT[L::row(i) * kLd + L::col(j)] = m.v[i][j];
  __syncthreads();
  for (int64_t k0 = 0; k0 < K; k0 += kN) {  // B7: dX_r += β_r Σ_j dAE_rj k_j; dK_j += Σ_r dAE_rj β_r x_r
    const int kc = tile_cols(K, k0);
    tile::load(sX, ch.in(a, a.k, K, k0), a.H * K, ch.n, kc);
    tile::load(sZ, ch.in(a, x, K, k0), a.H * K, ch.n, kc, [&](int r) { return s.beta[r]; });
    __syncthreads();
    Acc xr, yc;
    xr.zero();
    yc.zero();
    L::template mma<false, false>(sdT, sX, xr);
    L::template mma<true, false>(sdT, sZ, yc);
    const AccIo<L, false> io;
    Acc dxo, dko;
    wy_b7_load<kComba>(a, ch, k0, kc, dx, io, dxo, dko);
    wy_b7_store<L, kComba>(a, ch, s, k0, kc, dx, xr, yc, io, dxo, dko);
    __syncthreads();
  }
  wy_finish<L, kComba>(a, ch, s, sX, db_part, row_part, col_part, ex_part);  // dβ; B9 (sX .. sZ free)
}

// ---- backward phases on tile::Mma ----

// The dO staging slots of gdn_dv_local_mma_kernel for nkt key tiles: one of its own, and as many fp32 staging tiles
// as fit in the Q, K tiles' room (2 nkt bf16 tiles, at least 2) beside the two dO tiles, at most kDvMaxStage in all.
constexpr int kDvMaxStage = 4;
__host__ __device__ constexpr int dv_qk_tiles(int nkt) { return nkt > 1 ? 2 * nkt : 2; }
__host__ __device__ constexpr int dv_stages(int nkt) {
  const int m = 1 + static_cast<int>(sizeof(bf16) * kTileHalves * (dv_qk_tiles(nkt) - 2) /
                                     (sizeof(float) * tile::kStageFloats));
  return m < kDvMaxStage ? m : kDvMaxStage;
}
// Shared memory of gdn_dv_local_mma_kernel for nkt key tiles: Γ, the bf16 tiles P and Q, K (dv_qk_tiles; then the
// two dO tiles and dv_stages - 1 staging tiles), and a staging tile. 61.5 KiB at key_dim 128, 97.5 KiB at 256.
constexpr size_t dv_local_mma_smem(int nkt) {
  return sizeof(double) * kN + sizeof(bf16) * kTileHalves * (1 + dv_qk_tiles(nkt)) +
         sizeof(float) * tile::kStageFloats;
}
static_assert(dv_local_mma_smem(2) <= smem_per_block(3) && dv_local_mma_smem(4) <= smem_per_block(2),
              "dv_local blocks per SM");

// B1 (intra-chunk part) for chunk blockIdx.x of pair bh0 + blockIdx.y, every value tile, as gdn_dv_local_kernel: P once
// (chunk_p_mma), then dΔ = P^T dO per value tile (dO rounded to bf16 as load_h does, dΔ stored in fp32, 16-byte pieces
// where dΔ is 16-byte aligned and value_dim % 4 == 0). In flight (dO 16-byte aligned with value_dim % 4 == 0:
// tile::async_ok_f): value tile 0's dO (stage_async into the block's own staging tile) while chunk_p_mma runs (bf16 q,
// k 16-byte aligned: issued after Q and K's own copies, chunk_p_mma_h); after the barrier that completes P (Q, K read),
// value tiles 1 .. M - 1's (M = dv_stages(nkt) slots, slot v % M; slots >= 1 in Q, K's room); value tile v: its own
// group waited for, the thread's own staged pieces into dO tile v % 2 (put_h_staged), one barrier (the dO tile
// complete; value tile v - 1's product, the last reader of the other dO tile and of slot (v - 1) % M's pieces, done),
// value tile v + M's copies into slot v % M, the product and the store. Fallback (dO not aligned so): dO loaded
// synchronously (load_h: the same bits).
template <typename L, typename E>
__global__ void __launch_bounds__(tile::kThreads) gdn_dv_local_mma_kernel(GdnFast<L, E> a) {
  static_assert(std::is_same_v<typename L::Operand, bf16>, "bf16 scratch");
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  const int64_t K = a.K, V = a.V, nvt = (V + kN - 1) / kN;
  const int nkt = static_cast<int>((K + kN - 1) / kN), M = dv_stages(nkt);
  double* gam = cv.take<double>(kN);
  bf16 *hP = cv.take<bf16>(kTileHalves), *hQK = cv.take<bf16>(kTileHalves * dv_qk_tiles(nkt));
  float* gO = cv.take<float>(tile::kStageFloats);
  // Staging slot m: the block's own tile, or the room after the two dO tiles (hQK, hQK + kTileHalves).
  const auto slot = [&](int64_t v) {
    const int m = static_cast<int>(v % M);
    return m == 0 ? gO : reinterpret_cast<float*>(hQK + 2 * kTileHalves) + (m - 1) * tile::kStageFloats;
  };
  const Chunk ch(a, blockIdx.x, a.bh0 + blockIdx.y);
  const bool async = tile::async_ok_f(a.d_o, V);
  // dO of value tile v into its slot by cp.async, one group (empty past the last value tile).
  const auto issue = [&](int64_t v) {
    if (v < nvt) tile::stage_async(slot(v), ch.in(a, a.d_o, V, v * kN), a.H * V, ch.n, tile_cols(V, v * kN));
    tile::cp_async_commit();
  };
  const auto prologue = [&] {
    if (async) issue(0);
    return async ? 1 : 0;
  };
  if constexpr (std::is_same_v<E, bf16>)
    chunk_p_mma_h(a, ch, nkt, gam, hQK, hQK + nkt * kTileHalves, hP, prologue);
  else
    prologue(), chunk_p_mma(a, ch, nkt, gam, hQK, hQK + nkt * kTileHalves, hP);
  __syncthreads();  // hP complete; hQK read (it takes the dO tiles and staging slots next)
  if (async)
    for (int m = 1; m < M; ++m) issue(m);
  const bool d_vec = tile::async_ok_f(a.dD, V);
  for (int64_t v = 0; v < nvt; ++v) {
    const int64_t v0 = v * kN;
    const int vc = tile_cols(V, v0);
    bf16* hO = hQK + (v & 1) * kTileHalves;
    if (async) {
      cp_async_wait_upto(M - 1);  // value tile v's group
      tile::put_h_staged(hO, slot(v), ch.n);
    } else {
      tile::load_h(hO, ch.in(a, a.d_o, V, v0), a.H * V, ch.n, vc);
    }
    __syncthreads();
    if (async) issue(v + M);
    Acc acc;
    acc.zero();
    Mma::mma<true, false>(hP, hO, acc);
    store_acc_f4(acc, ch.rows(a, a.dD, V, v0), V, ch.n, vc, d_vec, tile::Same{});
  }
}

// The most key tiles gdn_bwd_scan_mma_kernel carries (key_dim <= 256): its running dS lives in registers, an Acc
// (16 fp32) per thread and key tile; a larger key_dim runs the tile::Tc bwd_scan.
constexpr int kBwdScanMaxKt = 4;

// Whether gdn_bwd_scan_mma_kernel stages k and q in fp32 shared memory (cp.async; 32 KiB per key tile): key_dim
// <= 128. A larger key_dim streams them through a ring of staging tiles (kRing) or, where k, q or dO is not 16-byte
// aligned, loads them through registers, one key tile ahead.
__host__ __device__ constexpr bool bwd_scan_kq_staged(int nkt) { return nkt <= 2; }

// The row factors of gdn_bwd_scan_mma_kernel (scan_gate_factors): two Q^g sets (this chunk's and the chunk
// before's, kN + 4 floats each: e^{Γ_C} after the rows) and the K^g set of the chunk before.
constexpr int kBwdFactorFloats = 3 * kN + 8;

// The ring of fp32 staging tiles of gdn_bwd_scan_mma_kernel<kRing = true> (key_dim > 128 with k, q, dO 16-byte
// aligned): q, dO and k stream through it a tile at a time, kBwdRingSlots - 1 tiles in flight behind the one converted.
constexpr int kBwdRingSlots = 4;

// Shared memory of gdn_bwd_scan_mma_kernel for nkt key tiles (ring: the kRing instantiation): the row factors, the
// bf16 copy of dS (the K^g dS products' operand), K^g of the chunk before and Q^g of this chunk, W tiles (bf16; two
// buffers, the chunk before's landing by cp.async while this one computes; ring: one), dO and dΔ (bf16), then the
// fp32 staging tiles: dO and (key_dim <= 128) k, q; ring: kBwdRingSlots. 189 KiB at key_dim 128, 226.8 KiB at 256
// (ring; 214.8 KiB without).
constexpr size_t bwd_scan_mma_smem(int nkt, bool ring) {
  return sizeof(float) * kBwdFactorFloats + sizeof(bf16) * kTileHalves * ((ring ? 4 : 5) * nkt + 2) +
         sizeof(float) * tile::kStageFloats *
             (ring ? kBwdRingSlots : 1 + (bwd_scan_kq_staged(nkt) ? 2 * nkt : 0));
}
static_assert(bwd_scan_mma_smem(kBwdScanMaxKt, true) <= 227 * 1024, "bwd_scan shared memory");

// The row factors of a chunk of n rows from warp 0's gate pairs (as scan_gate_pair; Γ_C = Γ_{n-1}): fq[r] = e^{Γ_r}
// (Q^g), fk[r] = e^{Γ_C-Γ_r} (K^g) for rows r < n, else 0, and fq[kN] = e^{Γ_C}: expd of the Γ scan_gate_pair
// stores, each computed once per chunk (Γ_C sent to every lane by shuffles). Ends with a barrier (the factors
// visible; as scan_gate_pair's). Lanes of other warps pass anything.
__device__ void scan_gate_factors(float g0, float g1, int n, float* fq, float* fk) {
  if (threadIdx.x < 32) {
    const int l = static_cast<int>(threadIdx.x), m = (n - 1) >> 1;
    double v0, v1;
    gate_pair_scan(g0, g1, v0, v1);
    double gC = ((n - 1) & 1) ? v1 : v0;  // lane m's is Γ_{n-1}: a butterfly takes it to every lane
    for (int o = 16; o > 0; o >>= 1) {
      const double y = __shfl_xor_sync(0xffffffffu, gC, o);
      if ((l ^ m) & o) gC = y;
    }
    fq[2 * l] = 2 * l < n ? expd(v0) : 0.0f;
    fq[2 * l + 1] = 2 * l + 1 < n ? expd(v1) : 0.0f;
    fk[2 * l] = 2 * l < n ? expd(gC - v0) : 0.0f;
    fk[2 * l + 1] = 2 * l + 1 < n ? expd(gC - v1) : 0.0f;
    if (l == 0) fq[kN] = expd(gC);
  }
  __syncthreads();
}

// tile::stage_async(g, src, stride, rows, cols) and tile::load_h_async(s, src, stride, rows, cols): the same
// copies by the same threads, where the tile is full (rows = cols = 64) without the per-piece bounds and zero-fill
// (fewer instructions: gdn_bwd_scan_mma_kernel issues them every chunk).
__device__ __forceinline__ void stage_tile_async(float* g, const float* src, int64_t stride, int rows, int cols) {
  if (rows != kN || cols != kN) return tile::stage_async(g, src, stride, rows, cols);
  const int t = static_cast<int>(threadIdx.x), r = t >> 4, c = 4 * (t & 15);
#pragma unroll
  for (int it = 0; it < kN / 16; ++it)
    tile::cp_async16(g + (r + 16 * it) * kN + c, src + (r + 16 * it) * stride + c, 16);
}
__device__ __forceinline__ void load_tile_h_async(bf16* s, const bf16* src, int64_t stride, int rows, int cols) {
  if (rows != kN || cols != kN) return tile::load_h_async(s, src, stride, rows, cols);
  const int t = static_cast<int>(threadIdx.x), r = t >> 3, c = 8 * (t & 7);
#pragma unroll
  for (int it = 0; it < kN / 32; ++it)
    tile::cp_async16(s + (r + 32 * it) * kLdH + c, src + (r + 32 * it) * stride + c, 16);
}
// stage_tile_async of a bf16 tensor (Staged<bf16>).
__device__ __forceinline__ void stage_tile_async(float* g, const bf16* src, int64_t stride, int rows, int cols) {
  tile::stage_async_h(g, src, stride, rows, cols);
}

// B1 (state part) and B2 for value tile blockIdx.x of pair bh0 + blockIdx.y, chunks in reverse, as
// gdn_bwd_scan_kernel: stores dh[n] (bf16 of dS_C), dΔ += K^g dS_C (K^g dS summed over the key tiles in order in
// registers), then per key tile dS = e^{Γ_C} dS + (Q ⊙ e^Γ)^T dO - W^T dΔ, dS fp32 in registers (key tile kt at
// the thread's elements of the Mma map); no dS after chunk 0 (no one reads the initial state's gradient).
// key_dim <= 64 kBwdScanMaxKt (launcher). Software-pipelined by a chunk: chunk n's state update stores each key
// tile's new dS (= dS_C of chunk n - 1) from its registers as bf16 to hS (chunk n - 1 copies it to dh[n - 1] after
// its dΔ, before its second barrier: store_h, 16-byte pieces, rows contiguous, where value_dim % 8 == 0, else element
// by element; the bits of a bf16 store from the registers; there, not right after the first barrier, it spills no
// register), and forms K^g of chunk n - 1 (the row factors e^{Γ_C-Γ_r}, e^Γ_r, e^{Γ_C} of chunk n - 1 are computed
// once, by warp 0 with its Γ scan, before the update: scan_gate_factors); the next chunk starts with the barrier
// after which K^g hS (B1 of chunk n - 1) and dh[n - 1] read hS. Per chunk n (2 barriers):
//   B | K^g hS in registers (key tiles in order), Q^g of chunk n into hQ in turn; dO into hO;
//       dΔ = P^T dO + K^g hS -> dD, hE; dh[n] <- hS; row factors of chunk n - 1 |
//   B | per key tile: K^g of chunk n - 1 into hK; dS update (hQ, hO, W, hE); hS <- dS.
// (The last chunk: dS_C = 0, hS zero, its factors and K^g before the loop.) In flight ahead of their use: by
// cp.async, the chunk before's W tiles (into the other W buffer, issued after the first barrier), dO and (key_dim
// <= 128) q (staging tiles, Staged<E>, issued once this chunk's are converted) and k (staging tiles, issued after the
// update has converted the chunk before's: two chunks ahead); in registers, the chunk before's dΔ (P^T dO) and the
// gates of the chunk before that; at key_dim > 128 k, q through the ring below (kRing) or, where k, q or dO is not
// 16-byte aligned, one key tile ahead in registers (q of key tile 0 from the chunk after's update on), with the L2
// asked for the rows of the chunk two before. Where W or dO is not 16-byte aligned (key_dim % 8 != 0, value_dim % 4
// != 0) that operand is loaded synchronously (load_h) instead. Same arithmetic either way.
// kRing (the launcher's choice at key_dim > 128 where k, q and dO are 16-byte aligned): k, q and dO instead stream
// through a ring of kBwdRingSlots fp32 staging tiles in the order they are converted (per chunk n: q of chunk n key
// tile by key tile, dO, then in the update k of chunk n - 1), one cp.async group a tile: each thread waits for its
// own pieces of the tile, converts them (Staged<E>::put, put_h_staged: the same bits) and issues the copies of the
// tile kBwdRingSlots on into the slot (no barrier: it reads only the pieces it copied, and with bf16 q, k copies
// only into them: tile::stage_async_h). One W buffer (the shared memory
// allows no more): chunk n's tiles are issued after its first barrier (every read of chunk n + 1's done), into the
// group of the tile kBwdRingSlots after q's first (waited for by dO's conversion at key_dim 256, before the
// barrier that ends B1; at 3 key tiles by a wait before it). The L2 is asked for the rows of k, q, W and dO of the
// chunk two before. Registers (ptxas): 250 (kRing = false), 234 (kRing); one block an SM either way.
template <typename L, typename E, bool kRing>
__global__ void __launch_bounds__(tile::kThreads) gdn_bwd_scan_mma_kernel(GdnFast<L, E> a) {
  static_assert(std::is_same_v<typename L::Operand, bf16>, "bf16 scratch");
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  // The row factors (scan_gate_factors): Q^g of chunk c at fq_of(c) (with e^{Γ_C} at [kN]), K^g of one chunk at fk.
  float* const fac = cv.take<float>(kBwdFactorFloats);
  const auto fq_of = [&](int64_t c) { return fac + (c & 1) * (kN + 4); };
  float* const fk = fac + 2 * (kN + 4);
  const int64_t K = a.K, V = a.V, v0 = static_cast<int64_t>(blockIdx.x) * kN;
  const int bh = static_cast<int>(a.bh0) + static_cast<int>(blockIdx.y);
  const int vc = tile_cols(V, v0);
  const int nkt = static_cast<int>((K + kN - 1) / kN);
  bf16 *hS = cv.take<bf16>(kTileHalves * nkt), *hK = cv.take<bf16>(kTileHalves * nkt),
       *hQ = cv.take<bf16>(kTileHalves * nkt), *hW = cv.take<bf16>((kRing ? 1 : 2) * kTileHalves * nkt),
       *hO = cv.take<bf16>(kTileHalves), *hE = cv.take<bf16>(kTileHalves);
  float* gO = kRing ? nullptr : cv.take<float>(tile::kStageFloats);
  // k, q per tile (staged), or the ring
  float* gKQ = kRing                     ? cv.take<float>(kBwdRingSlots * tile::kStageFloats)
               : bwd_scan_kq_staged(nkt) ? cv.take<float>(2 * nkt * tile::kStageFloats)
                                         : nullptr;
  const bool w_async = tile::async_ok_h(a.W, K);
  // (Every row of dO, k, q starts a multiple of V or K elements after the tensor's start.)
  const bool o_async = !kRing && tile::async_ok_f(a.d_o, V);
  const bool kq_async = !kRing && bwd_scan_kq_staged(nkt) && Staged<E>::ok(a.k, K) && Staged<E>::ok(a.q, K);
  const bool kq_regs = !kRing && !kq_async;  // k, q one key tile ahead in registers
  // Chunk c's W buffer (c % 2; ring: the one).
  const auto w_of = [&](int64_t c) { return kRing ? hW : hW + (c & 1) * nkt * kTileHalves; };
  // The W tiles of chunk nx into its W buffer (cp.async).
  const auto issue_w = [&](const Chunk& nx) {
    bf16* dst = w_of(nx.chunk);
    for (int kt = 0; kt < nkt; ++kt)
      load_tile_h_async(dst + kt * kTileHalves, nx.rows(a, a.W, K, kt * kN), K, nx.n, tile_cols(K, kt * kN));
  };
  // dO (where o_async) and q of all key tiles (where kq_async) of chunk nx into their staging tiles (cp.async).
  const auto issue_qo = [&](const Chunk& nx) {
    if (o_async) stage_tile_async(gO, nx.in(a, a.d_o, V, v0), a.H * V, nx.n, vc);
    if (kq_async)
      for (int kt = 0; kt < nkt; ++kt)
        stage_tile_async(gKQ + (2 * kt + 1) * tile::kStageFloats, nx.in(a, a.q, K, kt * kN), a.H * K, nx.n,
                         tile_cols(K, kt * kN));
  };
  // k of all key tiles of chunk nx into their staging tiles (cp.async; kq_async).
  const auto issue_k = [&](const Chunk& nx) {
    for (int kt = 0; kt < nkt; ++kt)
      stage_tile_async(gKQ + 2 * kt * tile::kStageFloats, nx.in(a, a.k, K, kt * kN), a.H * K, nx.n,
                       tile_cols(K, kt * kN));
  };
  // kRing: ring tile i (in conversion order: per chunk c from the last down to 1, q of key tiles 0 .. nkt - 1 of c,
  // dO of c, k of key tiles 0 .. nkt - 1 of c - 1) into slot i % kBwdRingSlots (cp.async), then a commit (an empty
  // group past the last tile).
  const int per = 2 * nkt + 1;  // ring tiles a chunk
  const auto issue_ring = [&](int64_t i) {
    if (i < (a.NC - 1) * per) {
      const int64_t c = a.NC - 1 - i / per;
      const int r = static_cast<int>(i % per);
      float* g = gKQ + (i % kBwdRingSlots) * tile::kStageFloats;
      if (r == nkt) {
        const Chunk nx(a, c, bh);
        stage_tile_async(g, nx.in(a, a.d_o, V, v0), a.H * V, nx.n, vc);
      } else {
        const Chunk nx(a, r < nkt ? c : c - 1, bh);
        const int kt = r < nkt ? r : r - nkt - 1;
        stage_tile_async(g, nx.in(a, r < nkt ? a.q : a.k, K, kt * kN), a.H * K, nx.n, tile_cols(K, kt * kN));
      }
    }
    tile::cp_async_commit();
  };
  int64_t ring = 0;  // the next ring tile to convert
  // kRing: the thread's pieces of ring tile `ring` (waited for), and after their conversion the next copies into
  // the slot.
  const auto ring_tile = [&]() {
    tile::cp_async_wait<kBwdRingSlots - 1>();
    return gKQ + (ring % kBwdRingSlots) * tile::kStageFloats;
  };
  const auto ring_next = [&]() {
    issue_ring(ring + kBwdRingSlots);
    ++ring;
  };
  // Else key tile kt of p (q or k) of chunk c into x (registers; put_q / put_k convert them).
  tile::HRegs x;
  const auto fetch_x = [&](const E* p, const Chunk& c, int kt) {
    fetch_in(x, c.in(a, p, K, kt * kN), a.H * K, c.n, tile_cols(K, kt * kN));
  };
  // Q^g (q ⊙ e^Γ) and K^g (k ⊙ e^{Γ_C-Γ}) of key tile kt of chunk c (row factors f) into hQ, hK: from the
  // thread's own staged pieces (its cp_async_wait suffices) or from x.
  const auto put_q = [&](int kt, const Chunk& c, const float* f) {
    const auto scale = [&](int r) { return f[r]; };
    if (kRing) {
      Staged<E>::put(hQ + kt * kTileHalves, ring_tile(), c.n, scale);
      ring_next();
    } else if (kq_async) {
      Staged<E>::put(hQ + kt * kTileHalves, gKQ + (2 * kt + 1) * tile::kStageFloats, c.n, scale);
    } else {
      tile::put_h(hQ + kt * kTileHalves, x, c.n, scale);
    }
  };
  const auto put_k = [&](int kt, const Chunk& c) {
    const auto scale = [&](int r) { return fk[r]; };
    if (kRing) {
      Staged<E>::put(hK + kt * kTileHalves, ring_tile(), c.n, scale);
      ring_next();
    } else if (kq_async) {
      Staged<E>::put(hK + kt * kTileHalves, gKQ + 2 * kt * tile::kStageFloats, c.n, scale);
    } else {
      tile::put_h(hK + kt * kTileHalves, x, c.n, scale);
    }
  };
  Acc dd;                      // dΔ (P^T dO) of the chunk next processed, in flight in registers
  float g0 = 0.0f, g1 = 0.0f;  // (warp 0: the gate pairs of the chunk whose Γ is scanned next)
  Acc dS[kBwdScanMaxKt];       // tiles >= nkt unused
#pragma unroll
  for (int kt = 0; kt < kBwdScanMaxKt; ++kt) dS[kt].zero();
  {  // The last chunk: dS_C = 0 (hS cleared: dh stored from it in the loop), its Γ and K^g (load_h).
    const Chunk ch(a, a.NC - 1, bh);
    if (kRing) {  // the first kBwdRingSlots ring tiles (W: in the chunk)
      for (int i = 0; i < kBwdRingSlots; ++i) issue_ring(i);
    } else {
      if (ch.chunk > 0) {
        if (w_async) issue_w(ch);
        issue_qo(ch);
      }
      tile::cp_async_commit();
    }
    fetch_gate_pair(a, ch, g0, g1);
    tile::clear_h(hS, nkt);
    scan_gate_factors(g0, g1, ch.n, fq_of(ch.chunk), fk);
    for (int kt = 0; kt < nkt; ++kt)
      tile::load_h(hK + kt * kTileHalves, ch.in(a, a.k, K, kt * kN), a.H * K, ch.n, tile_cols(K, kt * kN),
                   [&](int r) { return fk[r]; });
    if (ch.chunk > 0) {
      const Chunk pv(a, ch.chunk - 1, bh);
      fetch_gate_pair(a, pv, g0, g1);
      if (kq_async)
        issue_k(pv);
      else if (kq_regs)
        fetch_x(a.q, ch, 0);
    }
    if (!kRing) tile::cp_async_commit();
    load_acc<Mma>(dd, ch.rows(a, a.dD, V, v0), V, ch.n, vc);
  }
  for (int64_t chunk = a.NC - 1; chunk >= 0; --chunk) {
    const Chunk ch(a, chunk, bh);
    const bool upd = chunk > 0;  // whether this chunk updates dS
    const float* fq = fq_of(chunk);
    if (!kq_async && chunk > 1) {  // (L2) k, q of the chunk two before, fetched during the chunk before's update
      const Chunk nx(a, chunk - 2, bh);
      tile::prefetch_l2(nx.in(a, a.k, K, 0), sizeof(E) * a.H * K, nx.n, sizeof(E) * K);
      tile::prefetch_l2(nx.in(a, a.q, K, 0), sizeof(E) * a.H * K, nx.n, sizeof(E) * K);
      if (kRing) {  // (and W, dO: copied with less notice than a chunk)
        tile::prefetch_l2(nx.rows(a, a.W, K, 0), sizeof(bf16) * K, nx.n, sizeof(bf16) * K);
        tile::prefetch_l2(nx.in(a, a.d_o, V, v0), sizeof(float) * a.H * V, nx.n, sizeof(float) * vc);
      }
    }
    __syncthreads();  // the chunk after's update done: hS complete; its reads of hQ, hO, hE, the other W buffer done
    if (kRing) {
      if (w_async && upd) issue_w(ch);  // (into the group of q's first tile's ring_next)
    } else {
      if (w_async && chunk > 1) issue_w(Chunk(a, chunk - 1, bh));
      tile::cp_async_commit();  // (possibly empty: groups W(c - 1) here, q, dO(c - 1) below, k(c - 2) at the end)
      tile::cp_async_wait<2>();  // this chunk's W, q, dO (all but k of the chunk before and the group just committed)
    }
    bf16* hWc = w_of(chunk);
    Acc acc;
    acc.zero();
    for (int kt = 0; kt < nkt; ++kt) {  // B1: K^g dS_C (key tiles in order); Q^g of this chunk in turn
      if (upd) {
        put_q(kt, ch, fq);
        if (kq_regs) {
          if (kt + 1 < nkt)
            fetch_x(a.q, ch, kt + 1);
          else
            fetch_x(a.k, Chunk(a, chunk - 1, bh), 0);
        }
        if (!w_async)
          tile::load_h(hWc + kt * kTileHalves, ch.rows(a, a.W, K, kt * kN), K, ch.n, tile_cols(K, kt * kN));
      }
      Mma::mma<false, false>(hK + kt * kTileHalves, hS + kt * kTileHalves, acc);
    }
    if (upd) {
      if (kRing) {
        tile::put_h_staged(hO, ring_tile(), ch.n);
        ring_next();
      } else if (o_async) {
        tile::put_h_staged(hO, gO, ch.n);  // the thread's own pieces (its wait suffices)
      } else {
        tile::load_h(hO, ch.in(a, a.d_o, V, v0), a.H * V, ch.n, vc);
      }
    }
    if (!kRing) {
      if (chunk > 1) issue_qo(Chunk(a, chunk - 1, bh));
      tile::cp_async_commit();
    }
    tile::delta_out<true>(dd, acc, ch.rows(a, a.dD, V, v0), V, ch.n, vc, hE);  // dΔ = P^T dO + K^g dS_C
    for (int kt = 0; kt < nkt; ++kt)  // dh[n] = bf16(dS_C) from its copy hS (the last chunk's: the cleared hS)
      tile::store_h(hS + kt * kTileHalves, ch.state(a, a.dh, kt * kN, v0), V, tile_cols(K, kt * kN), vc);
    if (!upd) break;
    const Chunk pv(a, chunk - 1, bh);
    load_acc<Mma>(dd, pv.rows(a, a.dD, V, v0), V, pv.n, vc);  // in flight until the chunk before
    // kRing: this chunk's W (in the group of ring tile q_0 + kBwdRingSlots, where nkt < kBwdRingSlots after dO's).
    if (kRing && nkt < kBwdRingSlots) tile::cp_async_wait<kBwdRingSlots - 1>();
    // The chunk before's row factors; the barrier: hE, hQ, hO, this chunk's W complete, the reads of hK above done.
    scan_gate_factors(g0, g1, pv.n, fq_of(chunk - 1), fk);
    if (chunk > 1) fetch_gate_pair(a, Chunk(a, chunk - 2, bh), g0, g1);
    if (!kRing) tile::cp_async_wait<2>();  // k of the chunk before (all but the two groups committed since)
    const float aC = fq[kN];  // e^{Γ_C}
#pragma unroll
    for (int kt = 0; kt < kBwdScanMaxKt; ++kt) {  // B2 (unrolled: dS[kt] stays in registers)
      if (kt >= nkt) break;
      put_k(kt, pv);
      if (kq_regs) {
        if (kt + 1 < nkt)
          fetch_x(a.k, pv, kt + 1);
        else if (chunk > 1)
          fetch_x(a.q, pv, 0);
      }
      Acc qd, wd;
      qd.zero();
      wd.zero();
      Mma::mma<true, false>(hQ + kt * kTileHalves, hO, qd);
      Mma::mma<true, false>(hWc + kt * kTileHalves, hE, wd);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) dS[kt].v[i][j] = aC * dS[kt].v[i][j] + qd.v[i][j] - wd.v[i][j];
      tile::store_acc_h(dS[kt], hS + kt * kTileHalves, tile::Same{});  // (and dh[n - 1], stored by chunk n - 1)
    }
    if (kq_async && chunk > 1) issue_k(Chunk(a, chunk - 2, bh));
    if (!kRing) tile::cp_async_commit();
  }
  tile::cp_async_wait<0>();
}

// Shared memory of gdn_bwd_dqk_mma_kernel: Γ (double), β, g, the row reduction's 64 x 16 floats and its 64 sums;
// bf16 dO, dΔ (then dP), two sets of the bf16 scratch tiles h, Δ, dh (then Q, K); two fp32 staging tiles (dO, dΔ
// of the next value tile, then q, k): 109 KiB, so that two blocks fit an SM.
constexpr size_t kDqkMmaSmem =
    8 * kN + 4 * (3 * kN + 16 * kN) + sizeof(bf16) * kTileHalves * 8 + 2 * sizeof(float) * tile::kStageFloats;
static_assert(2 * (kDqkMmaSmem + 1024 + 128) <= 228 * 1024, "two dqk blocks an SM (with block_reduce's 128 bytes)");

// B3, B4 (P and state parts of dK), dW = -dΔ h^T and dΓ terms (i)–(iv) of B8 (key tile kt's part of the dΓ
// scratch), as gdn_bwd_dqk_kernel for one key tile: block (blockIdx.x = chunk nkt + kt, pair bh0 + blockIdx.y), the
// products on bf16 tiles with register accumulators: dO h^T, Δ dh^T, dΔ h^T of key tile kt and dO Δ^T (every block
// of the chunk forms it), summed over the value tiles; then dP K, dP^T Q of key tile kt. The element-wise terms read
// q, k as fp32 (from their staging tiles, Staged<E>::at) and h, dh as stored (bf16). At most 128 registers (ptxas spills ~100 bytes a
// thread, mostly in the load_h fallbacks): two blocks an SM.
// In flight: h, Δ, dh of value tile 0 and (staged) its dO, dΔ during the gates' scan; those of value tile vt + 1
// during value tile vt's products (cp.async into the other set of tiles and, after the step's dO, dΔ are converted,
// the staging tiles); q, k (Staged<E>, into the staging tiles) during the last value tile's products.
// Fallbacks: h, Δ, dh by load_h in the step unless they are 16-byte aligned with value_dim % 8 == 0 (async); dO, dΔ
// by load_h in the step unless async and their rows are 16-byte aligned (staged); Q, K by load_h and q, k from
// global memory at the thread's elements unless their rows are 16-byte aligned (qk_staged).
template <typename L, typename E>
__global__ void __launch_bounds__(tile::kThreads, 2) gdn_bwd_dqk_mma_kernel(GdnFast<L, E> a) {
  static_assert(std::is_same_v<typename L::Operand, bf16>, "bf16 scratch");
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  double* gam = cv.take<double>(kN);
  float *beta = cv.take<float>(kN), *tmp = cv.take<float>(kN), *red = cv.take<float>(16 * kN),
        *out = cv.take<float>(kN);
  bf16 *hO = cv.take<bf16>(kTileHalves), *hE = cv.take<bf16>(kTileHalves);
  bf16* hHDG = cv.take<bf16>(6 * kTileHalves);  // h, Δ, dh of value tile vt: set vt % 2 (3 tiles each)
  float* gOE = cv.take<float>(2 * tile::kStageFloats);
  const int64_t K = a.K, V = a.V;
  const int nkt = static_cast<int>((K + kN - 1) / kN), kt = static_cast<int>(blockIdx.x) % nkt;
  const int nvt = static_cast<int>((V + kN - 1) / kN);
  const Chunk ch(a, blockIdx.x / nkt, a.bh0 + blockIdx.y);
  const int64_t k0 = kt * kN;
  const int kc = tile_cols(K, k0);
  const bool async = tile::async_ok_h(a.h, V) && tile::async_ok_h(a.U, V) && tile::async_ok_h(a.dh, V);
  const bool staged = async && tile::async_ok_f(a.d_o, V) && tile::async_ok_f(a.dD, V);
  const bool qk_staged = Staged<E>::ok(a.q, K) && Staged<E>::ok(a.k, K);
  const E *q = ch.in(a, a.q, K, k0), *k = ch.in(a, a.k, K, k0);
  const auto set = [&](int vt) { return hHDG + (vt & 1) * 3 * kTileHalves; };
  auto issue = [&](int vt) {  // h, Δ, dh of value tile vt into its set; staged: dO, dΔ into the staging tiles
    const int64_t v0 = vt * kN;
    const int vc = tile_cols(V, v0);
    bf16* t = set(vt);
    tile::load_h_async(t, ch.state(a, a.h, k0, v0), V, kc, vc);
    tile::load_h_async(t + kTileHalves, ch.rows(a, a.U, V, v0), V, ch.n, vc);
    tile::load_h_async(t + 2 * kTileHalves, ch.state(a, a.dh, k0, v0), V, kc, vc);
    if (staged) {
      tile::stage_async(gOE, ch.in(a, a.d_o, V, v0), a.H * V, ch.n, vc);
      tile::stage_async(gOE + tile::kStageFloats, ch.rows(a, a.dD, V, v0), V, ch.n, vc);
    }
    tile::cp_async_commit();
  };
  if (async) issue(0);  // lands during the gates' scan
  float g_r = 0.0f, b_r = 0.0f;
  fetch_gates(a, ch, g_r, b_r);
  scan_gates(g_r, b_r, gam, beta, tmp);
  const double gC = gam[ch.n - 1];
  Acc dqs, dks, dws, dp;  // dO h^T, Δ dS_C^T, dΔ h^T, dO Δ^T
  dqs.zero();
  dks.zero();
  dws.zero();
  dp.zero();
  float sd = 0.0f;  // Σ h ⊙ dh for (iv), this thread's share
  for (int vt = 0; vt < nvt; ++vt) {
    const int64_t v0 = vt * kN;
    const int vc = tile_cols(V, v0);
    bf16 *hH = set(vt), *hD = hH + kTileHalves, *hG = hH + 2 * kTileHalves;
    const bool more = vt + 1 < nvt;
    if (staged) {
      tile::cp_async_wait<0>();  // this value tile's group (the only one in flight)
      tile::put_h_staged(hO, gOE, ch.n);  // the thread's own pieces (its wait suffices)
      tile::put_h_staged(hE, gOE + tile::kStageFloats, ch.n);
      __syncthreads();  // every read of the staging tiles done: the next copies may land
      if (more) issue(vt + 1);
    } else {
      if (async && more) issue(vt + 1);  // that set's last reads: before the last barrier
      tile::load_h(hO, ch.in(a, a.d_o, V, v0), a.H * V, ch.n, vc);
      tile::load_h(hE, ch.rows(a, a.dD, V, v0), V, ch.n, vc);
      if (!async) {
        tile::load_h(hH, ch.state(a, a.h, k0, v0), V, kc, vc);
        tile::load_h(hD, ch.rows(a, a.U, V, v0), V, ch.n, vc);
        tile::load_h(hG, ch.state(a, a.dh, k0, v0), V, kc, vc);
      } else if (more) {
        tile::cp_async_wait<1>();  // this value tile's group (the next one's still in flight)
      } else {
        tile::cp_async_wait<0>();
      }
      __syncthreads();
    }
    if (!more && qk_staged) {  // q, k into the staging tiles (free: read before the barrier above)
      Staged<E>::stage(gOE, q, a.H * K, ch.n, kc);
      Staged<E>::stage(gOE + tile::kStageFloats, k, a.H * K, ch.n, kc);
      tile::cp_async_commit();
    }
    Mma::mma<false, true>(hO, hH, dqs);
    Mma::mma<false, true>(hD, hG, dks);
    Mma::mma<false, true>(hE, hH, dws);
    Mma::mma<false, true>(hO, hD, dp);
    for (int idx = threadIdx.x; idx < kN * kN / 4; idx += tile::kThreads) {  // 4 columns (8 bytes) at a time
      const int r = idx >> 4, c = 4 * (idx & 15);
      const uint2 x = *reinterpret_cast<const uint2*>(hH + r * kLdH + c), y = *reinterpret_cast<const uint2*>(hG + r * kLdH + c);
      const float2 x0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x.x)),
                   x1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x.y)),
                   y0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&y.x)),
                   y1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&y.y));
      sd += x0.x * y0.x + x0.y * y0.y + x1.x * y1.x + x1.y * y1.y;
    }
    __syncthreads();  // every read of this value tile's tiles done
  }
  bf16 *hdP = hO, *hQ = hHDG, *hK = hHDG + kTileHalves;  // (free now)
  const float *gQ = gOE, *gK = gOE + tile::kStageFloats;
  dqk_dP<Mma>(dp, gam);  // B3: dP ⊙ E (masked)
  tile::store_acc_h(dp, hdP, tile::Same{});
  if (qk_staged) {
    tile::cp_async_wait<0>();
    Staged<E>::put(hQ, gQ, ch.n);
    Staged<E>::put(hK, gK, ch.n);
  } else {
    tile::load_h(hQ, q, a.H * K, ch.n, kc);
    tile::load_h(hK, k, a.H * K, ch.n, kc);
  }
  __syncthreads();  // hdP, hQ, hK complete (and, qk_staged, every thread's staged q, k visible)
  Acc dq2, dk2;  // dP K, dP^T Q
  dq2.zero();
  dk2.zero();
  Mma::mma<false, false>(hdP, hK, dq2);
  Mma::mma<true, false>(hdP, hQ, dk2);
  const auto x_at = [&](const float* g, const E* src, int i, int j) {  // q or k (fp32) at element (i, j)
    const int r = Mma::row(i), c = Mma::col(j);
    return qk_staged ? Staged<E>::at(g, r, c) : r < ch.n && c < kc ? to_f32(src[r * a.H * K + c]) : 0.0f;
  };
  float row_part[4] = {0, 0, 0, 0}, kz = 0.0f;  // B8 (i)–(iii) rows, (iii) total: this thread's share
  dqk_store<Mma>(a, ch, gam, k0, kc, gC, [&](int i, int j) { return x_at(gQ, q, i, j); },
                 [&](int i, int j) { return x_at(gK, k, i, j); }, dqs, dks, dws, dq2, dk2, row_part, kz);
  dqk_finish<Mma>(a, ch, kt, gC, red, out, row_part, kz, sd);
}

// Shared memory of gdn_bwd_wy_mma_kernel: bf16 𝒯, d𝒯 (then dA ⊙ E), M1 and three operand tiles, and three fp32
// staging tiles for cp.async (16 KiB each; see the kernel; at the end wy_finish's scratch): 112 KiB, so that two
// blocks still fit an SM.
constexpr size_t kWyMmaSmem = kSmallBytes + 6 * sizeof(bf16) * kTileHalves + 3 * sizeof(float) * tile::kStageFloats;
static_assert(2 * (kWyMmaSmem + 1024) <= 228 * 1024, "two wy blocks an SM (1 KiB of each block is the system's)");
static_assert(kWyRedFloats <= 3 * tile::kStageFloats, "wy_finish's scratch in the staging tiles");

// B5–B7, B8 (v)–(vi) and B9 for chunk blockIdx.x of pair bh0 + blockIdx.y, as gdn_bwd_wy_kernel: the same products on
// bf16 tiles (𝒯 rounded once) with register accumulators; the element-wise terms read v, x as fp32 at the
// thread's elements (as the fp32 tiles held them). At most 128 registers: two blocks an SM (16 warps to hide its
// loads' latency; ptxas spills some bytes a thread to fit).
// Steps, each bringing in its operand tiles: B5 U side (step s < nvt: value tile s; dΔ, v), B5 W side (nvt + kt: key
// tile kt; dW, x), B7 (nvt + nkt + kt; k, and p̂ for Comba), where X K^T sums too: dAE, formed before the B7 steps
// (into hdT, as their operand), is parked in fp32 in gX(b0 + 1) (park_acc) until the B7 loop ends and its dβ and dΓ
// terms, which need X K^T, are added. Where every row is 16-byte aligned (dK, dP̂ and dV too), the operands come by
// cp.async, issued during the step before (the first step's, and 𝒯, at the start), into swizzled staging tiles
// (stage_async_sw; bf16 k, p̂: Staged<bf16>'s, unswizzled): dΔ and k into gS, v / x into gX(s) (two, alternating: the U
// and W steps read them at other threads' elements, without bank conflicts, as well as converting their own pieces;
// bf16 v / x instead as they are straight into their operand tiles, hV(s), and read back from there at the thread's
// elements: load_acc_h), Comba's p̂ into gX(b0) (only converted), dW (bf16) straight into hdT / hM (free until B6),
// alternating; and dK, dP̂, dV are read and written by column pairs (AccIo). Otherwise (the fallback) each step loads
// its operands (load_h, load_acc) and reads and writes element by element. The same bits either way. A step starts with
// a barrier (its bf16 tiles complete); Comba's B7 steps and the fallback's steps also end with one (their tiles are the
// next step's). The staged U and W steps need none: even steps s use hZ, hY, hdT (U: dΔ, v; W: x, dW), odd steps hX, hM
// (U: dΔ, v; W: x, dW), so that step s + 1 writes (converts into, or issues copies to) only tiles that step s - 1 used,
// after step s's opening barrier (one barrier after the W loop: hdT and hM are wy_m1's); likewise GDN's staged B7 steps
// alternate their k and β k tiles between (hX, hZ) and (hY, hM). GDN's dK is read before a W step's products (and on
// the staged path a B7 step's), so that the loads are in flight through them. At the end the staging tiles are
// wy_finish's scratch.
template <typename L, typename E, bool kComba>
__global__ void __launch_bounds__(tile::kThreads, 2) gdn_bwd_wy_mma_kernel(GdnFast<L, E> a) {
  static_assert(std::is_same_v<typename L::Operand, bf16>, "bf16 scratch");
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  Small s(cv);
  bf16 *hT = cv.take<bf16>(kTileHalves), *hdT = cv.take<bf16>(kTileHalves), *hM = cv.take<bf16>(kTileHalves),
       *hX = cv.take<bf16>(kTileHalves), *hY = cv.take<bf16>(kTileHalves), *hZ = cv.take<bf16>(kTileHalves);
  float* gS = cv.take<float>(3 * tile::kStageFloats);
  const auto gX = [&](int step) { return gS + (1 + (step & 1)) * tile::kStageFloats; };
  const auto hW = [&](int step) { return step & 1 ? hM : hdT; };
  const Chunk ch(a, blockIdx.x, a.bh0 + blockIdx.y);
  const int64_t K = a.K, V = a.V;
  const int nvt = static_cast<int>((V + kN - 1) / kN), nkt = static_cast<int>((K + kN - 1) / kN);
  const int w0 = nvt, b0 = nvt + nkt, nsteps = nvt + 2 * nkt;  // first W, B7 step
  constexpr bool kH = std::is_same_v<E, bf16>;  // (bf16 v, x: by cp.async straight into their operand tiles, hV)
  const auto hV = [&](int step) { return step & 1 ? (step < w0 ? hM : hX) : hY; };  // v (U step), x (W step)
  const E* x = kComba ? a.p : a.k;
  float* dx = kComba ? a.dp : a.dk;
  const bool staged = tile::async_ok_f(a.Tm, kN) && tile::async_ok_f(a.dD, V) && Staged<E>::ok(a.v, V) &&
                      Staged<E>::ok(x, K) && Staged<E>::ok(a.k, K) && tile::async_ok_h(a.dW, K) &&
                      tile::async_ok_f(dx, K) && tile::async_ok_f(a.dk, K) && tile::async_ok_f(a.dv, V);
  const auto issue = [&](int step) {  // step's operands (see above), one group
    const bool u = step < w0, w = !u && step < b0;
    const int64_t c0 = (u ? step : step - (w ? w0 : b0)) * kN;  // first value / key column
    const int cols = tile_cols(u ? V : K, c0);
    if constexpr (kH) {
      if (u || w)
        tile::load_h_async(hV(step), u ? ch.in(a, a.v, V, c0) : ch.in(a, x, K, c0), a.H * (u ? V : K), ch.n, cols);
    }
    // (Comba's B7: p̂ always into gX(b0), converted only; gX(b0 + 1) holds dAE)
    if (kH ? !u && !w && kComba : u || w || kComba)
      Staged<E>::stage_sw(gX(u || w ? step : b0), u ? ch.in(a, a.v, V, c0) : ch.in(a, x, K, c0), a.H * (u ? V : K),
                          ch.n, cols);
    if (w)
      tile::load_h_async(hW(step), ch.rows(a, a.dW, K, c0), K, ch.n, cols);
    else if constexpr (std::is_same_v<E, float>)
      tile::stage_async_sw(gS, u ? ch.rows(a, a.dD, V, c0) : ch.in(a, a.k, K, c0), u ? V : a.H * K, ch.n, cols);
    else if (u)  // (bf16 k: staged as bf16)
      tile::stage_async_sw(gS, ch.rows(a, a.dD, V, c0), V, ch.n, cols);
    else
      Staged<E>::stage_sw(gS, ch.in(a, a.k, K, c0), a.H * K, ch.n, cols);
    tile::cp_async_commit();
  };
  // Start of a staged step: its group landed, the thread's own pieces converted (convert), a barrier (the bf16 tiles
  // complete; every thread's reads of its own staged pieces and the step before's reads of the other gX done), then
  // the next step's copies issued.
  const auto staged_step = [&](int step, auto convert) {
    tile::cp_async_wait<0>();
    convert();
    __syncthreads();
    if (step + 1 < nsteps) issue(step + 1);
  };
  if (staged) {
    tile::stage_async_sw(gX(1), ch.square(a, a.Tm), kN, kN, kN);  // 𝒯 (converted at step 0, before gX(1) is reused)
    issue(0);
  }
  load_gates(a, ch, s.gam, s.beta, s.tmp);
  if (!staged) tile::load_h(hT, ch.square(a, a.Tm), kN, kN, kN);
  // The steps on the staged path (kStaged) or the fallback.
  const auto steps = [&](auto staged_path) {
    constexpr bool kStaged = decltype(staged_path)::value;
    const AccIo<Mma, kStaged> io;
    // Row partials of dβ, dΓ (rows and columns) and dΓ^ex (Comba; GDN adds its row terms to dΓ).
    float db_part[4] = {0, 0, 0, 0}, row_part[4] = {0, 0, 0, 0}, col_part[4] = {0, 0, 0, 0};
    float ex_part[4] = {0, 0, 0, 0};
    float(&row_x)[4] = kComba ? ex_part : row_part;
    Acc dtv, dtw;  // dΔ V^T, dW K^T (column factors applied below)
    dtv.zero();
    dtw.zero();
    // B5, U side: X_U = 𝒯^T dΔ, dV = β X_U (staged: the tiles of step s, (dΔ, v), are (hZ, hY) for even s, (hX, hM)
    // for odd s)
    tile::wy_u_side(
        a, ch, s.beta, hT, [&](int vt) { return kStaged && (vt & 1) ? tile::UTiles{hX, hM} : tile::UTiles{hZ, hY}; },
        dtv, db_part,
        [&](int64_t v0, int vc, Acc& vv, tile::UTiles t) {
          const int vt = static_cast<int>(v0 / kN);
          if constexpr (kStaged) {
            staged_step(vt, [&] {
              if (vt == 0) tile::put_h_staged_sw(hT, gX(1), kN);
              tile::put_h_staged_sw(t.z, gS, ch.n);
              if constexpr (!kH) Staged<E>::put_sw(t.y, gX(vt), ch.n);
            });
            if constexpr (kH)
              tile::load_acc_h(vv, t.y);
            else
              tile::load_acc_sw(vv, gX(vt));
          } else {
            tile::load_h(t.z, ch.rows(a, a.dD, V, v0), V, ch.n, vc);
            tile::load_h(t.y, ch.in(a, a.v, V, v0), a.H * V, ch.n, vc);
            load_acc<Mma>(vv, ch.in(a, a.v, V, v0), a.H * V, ch.n, vc);
            __syncthreads();
          }
        },
        [&](const Acc& xu, auto f, int64_t v0, int vc) { io.store(xu, ch.in(a, a.dv, V, v0), a.H * V, ch.n, vc, f); },
        !kStaged);
    for (int kt = 0; kt < nkt; ++kt) {  // B5, W side: X_W = 𝒯^T dW, dX (+)= β X_W ⊙ e^Γ; B8 (v)
      const int64_t k0 = kt * kN;
      const int kc = tile_cols(K, k0), step = w0 + kt;
      float* dxt = ch.in(a, dx, K, k0);
      Acc d;  // dK so far (GDN); Comba writes dP̂ here first
      if (kComba)
        d.zero();
      else
        io.load(d, dxt, a.H * K, ch.n, kc);
      bf16 *hD = kStaged ? hW(step) : hZ, *hx = kStaged && !(step & 1) ? hY : hX;  // dW, x
      if constexpr (kStaged) {
        staged_step(step, [&] {
          if constexpr (!kH) Staged<E>::put_sw(hx, gX(step), ch.n);
        });
      } else {
        tile::load_h(hZ, ch.rows(a, a.dW, K, k0), K, ch.n, kc);
        tile::load_h(hX, ch.in(a, x, K, k0), a.H * K, ch.n, kc);
        __syncthreads();
      }
      Acc xw;
      xw.zero();
      Mma::mma<true, false>(hT, hD, xw);
      Mma::mma<false, true>(hD, hx, dtw);
      Acc xv;  // x at the thread's elements
      if constexpr (kStaged && kH)
        tile::load_acc_h(xv, hx);
      else if constexpr (kStaged)
        tile::load_acc_sw(xv, gX(step));
      else
        load_acc<Mma>(xv, ch.in(a, x, K, k0), a.H * K, ch.n, kc);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = Mma::row(i);
        const float eg = expd(s.row_gam<kComba>(r)), br = s.beta[r];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float xk = xw.v[i][j] * xv.v[i][j] * eg;
          db_part[i] += xk;
          row_x[i] += br * xk;
          d.v[i][j] += br * eg * xw.v[i][j];
        }
      }
      io.store(d, dxt, a.H * K, ch.n, kc, tile::Same{});
      if (!kStaged) __syncthreads();  // (staged: the tiles alternate, see above)
    }
    if (kStaged) __syncthreads();  // the W steps' products done: hdT is wy_m1's
    wy_dT<Mma, kComba>(dtv, dtw, s);  // B6
    Acc m;
    tile::wy_m1(dtv, hT, hdT, hM, m);  // M1 𝒯^T, M1 = 𝒯^T d𝒯
    wy_dae_e<Mma, kComba>(m, s, ch);   // dAE = dA (j < r) times E, into hdT and parked in gX(b0 + 1) (fp32)
    tile::store_acc_h(m, hdT, tile::Same{});
    tile::park_acc(m, gX(b0 + 1));
    Acc kk;  // X K^T (GDN: x = k, one tile for both operands)
    kk.zero();
    // GDN, staged: k and β k alternate between (hX, hZ) and (hY, hM), so that a B7 step needs no closing barrier.
    constexpr bool kAlt = !kComba && kStaged;
    for (int kt = 0; kt < nkt; ++kt) {  // B7: dX_r += β_r Σ_j dAE_rj k_j; dK_j += Σ_r dAE_rj β_r x_r; X K^T
      const int64_t k0 = kt * kN;
      const int kc = tile_cols(K, k0);
      const auto by_beta = [&](int r) { return s.beta[r]; };
      Acc dxo, dko;  // GDN, staged: read first, to be in flight through the products (else after them: registers)
      if (kAlt) wy_b7_load<kComba>(a, ch, k0, kc, dx, io, dxo, dko);
      bf16 *hk = kAlt && (kt & 1) ? hY : hX, *hbx = kAlt && (kt & 1) ? hM : hZ;  // k, β x
      if constexpr (kStaged) {  // (the barrier: hdT too, on the first pass)
        staged_step(b0 + kt, [&] {  // k from gS (GDN: β x = β k too), β p̂ and p̂ from gX (Comba)
          Staged<E>::put_sw(hk, gS, ch.n);
          Staged<E>::put_sw(hbx, kComba ? gX(b0) : gS, ch.n, by_beta);
          if (kComba) Staged<E>::put_sw(hY, gX(b0), ch.n);
        });
      } else {
        tile::load_h(hX, ch.in(a, a.k, K, k0), a.H * K, ch.n, kc);
        tile::load_h(hZ, ch.in(a, x, K, k0), a.H * K, ch.n, kc, by_beta);
        if (kComba) tile::load_h(hY, ch.in(a, x, K, k0), a.H * K, ch.n, kc);
        __syncthreads();  // (the first pass: hdT too)
      }
      Acc xr, yc;
      xr.zero();
      yc.zero();
      Mma::mma<false, false>(hdT, hk, xr);
      Mma::mma<true, false>(hdT, hbx, yc);
      Mma::mma<false, true>(kComba ? hY : hk, hk, kk);
      if (!kAlt) wy_b7_load<kComba>(a, ch, k0, kc, dx, io, dxo, dko);
      wy_b7_store<Mma, kComba>(a, ch, s, k0, kc, dx, xr, yc, io, dxo, dko);
      if (!kAlt && kt + 1 < nkt) __syncthreads();
    }
    tile::unpark_acc(m, gX(b0 + 1));
    wy_dae_terms<Mma>(m, kk, s, db_part, row_x, col_part);  // dAE's B7 dβ and B8 (vi) terms
    __syncthreads();  // every read of the staging tiles done: they are wy_finish's scratch
    wy_finish<Mma, kComba>(a, ch, s, gS, db_part, row_part, col_part, ex_part);  // dβ; B9
  };
  if (staged)
    steps(std::true_type{});
  else
    steps(std::false_type{});
}

// ---- host side ----

constexpr size_t smem_for(int tiles) { return tile::smem_bytes(tiles, kSmallBytes); }

/// Launches kernel on the grid (blocks, a.nbh): grid row y is (batch, head) pair a.bh0 + y.
template <typename Kernel, typename L, typename E, typename... Extra>
void launch(Kernel kernel, int64_t blocks, size_t smem, cudaStream_t stream, const GdnFast<L, E>& a,
            Extra... extra) {
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(a.nbh));
  tile::launch("gdn chunk", a.K, kernel, grid, smem, stream, a, extra...);
}

void check_chunk(int64_t chunk_size) {
  check(chunk_size >= 1 && chunk_size <= kGdnMaxChunk, "gdn chunk (cuda): chunk_size must be in [1, {}], got {}",
        kGdnMaxChunk, chunk_size);
}

/// The layout L of GdnFast for operand type P (delta_tile.cuh): exact fp32 (float), or for bf16 tile::Tc, on which
/// the scans' large-key_dim fallback runs (the Mma phases take only its scratch element type from it).
template <typename P>
using Layout = std::conditional_t<std::is_same_v<P, float>, tile::Simt, tile::Tc>;

/// The arguments of a core call over every pair, its scratch carved (GdnScratch). Where `saved` is given (the caller's
/// GdnSaved: the forward stores 𝒯 there and with `states` its wu's W and its scan's h and Δ, the backward reads them)
/// a.Tm and with `states` a.h, a.U, a.W point into it; else W, h and U/Δ are scratch, and 𝒯 the backward's scratch
/// (the forward's a.Tm is null: 𝒯 not kept).
template <typename L, typename E>
GdnFast<L, E> make_args(const E* q, const E* k, const E* v, const E* p, const float* g, const float* beta, int64_t B,
                        int64_t T, int64_t H, int64_t K, int64_t V, int64_t C, void* scratch, bool backward,
                        float* saved, bool states) {
  using S = typename L::Operand;
  GdnFast<L, E> a{};
  a.q = q, a.k = k, a.v = v, a.p = p, a.g = g, a.beta = beta;
  a.B = B, a.T = T, a.H = H, a.K = K, a.V = V, a.C = C, a.NC = ceil_div(T, C), a.bh0 = 0, a.nbh = B * H;
  const GdnScratch l(B, T, H, K, V, C, backward, sizeof(S), saved != nullptr, states);
  float* base = static_cast<float*>(scratch);
  const auto stored = [](float* at) { return reinterpret_cast<S*>(at); };
  a.W = stored(base + l.W);
  a.Tm = backward ? base + l.Tm : nullptr, a.h = stored(base + l.h), a.U = stored(base + l.U);  // (unless saved)
  if (saved != nullptr) {
    const GdnSaved sv(B, T, H, K, V, C, sizeof(S), states);
    a.Tm = saved + sv.Tm;
    if (states) a.h = stored(saved + sv.h), a.U = stored(saved + sv.D), a.W = stored(saved + sv.W);
  }
  if (backward) a.dD = base + l.dD, a.dh = stored(base + l.dh), a.dW = stored(base + l.dW), a.dgam = base + l.dgam;
  return a;
}

/// Whether P (the products' operand type) is bf16: the phases on tile::Mma (else the fp32 Simt kernels).
template <typename P>
constexpr bool kBf16 = std::is_same_v<P, __nv_bfloat16>;

/// Dynamic shared memory a block may have (sm_90); the Mma scans fit under it up to a key_dim, beyond which the
/// Tc scans take over.
constexpr size_t kMaxBlockSmem = 227 * 1024;

// wu: A, 𝒯, W, U of every chunk of a's pairs (F1–F3; 𝒯 stored to a.Tm where given).
template <bool kComba, typename L, typename E>
void run_wu(const GdnFast<L, E>& a, cudaStream_t stream) {
  if constexpr (kBf16<typename L::Operand>)
    launch(gdn_wu_mma_kernel<L, E, kComba>, a.NC, kWuMmaSmem, stream, a);
  else
    launch(gdn_wu_kernel<L, E, kComba>, a.NC, smem_for(4), stream, a);
}

// The backward's wu from the 𝒯 its forward stored (a.Tm) without its states: W and U of every chunk of a's pairs (F3
// only).
template <bool kComba, typename L, typename E>
void run_wu_saved(const GdnFast<L, E>& a, cudaStream_t stream) {
  if constexpr (kBf16<typename L::Operand>)
    launch(gdn_wu_saved_mma_kernel<L, E, kComba>, a.NC, kWuSavedMmaSmem, stream, a);
  else
    launch(gdn_wu_saved_kernel<L, E, kComba>, a.NC, smem_for(2), stream, a);
}

/// A scan kernel (one block per value tile and pair) with its dynamic shared memory, chosen for a launcher's shape
/// (fwd_scan, bwd_scan).
template <typename L, typename E>
struct Scan {
  void (*kernel)(GdnFast<L, E>);
  size_t smem;
  /// Pairs of (batch, head) whose value tiles fill one wave of the GPU with this scan (by_waves.cuh).
  int64_t wave(int64_t V) const { return wave_pairs(kernel, tile::kThreads, smem, ceil_div(V, kN)); }
  /// Launches it over the value tiles of a's pairs.
  void run(const GdnFast<L, E>& a, cudaStream_t stream) const { launch(kernel, ceil_div(a.V, kN), smem, stream, a); }
};

// The forward scan: W, U -> Δ, h (F4, F7). bf16: the Mma scan (one instantiation per key-tile count) needs
// scan_mma_smem (~52 KiB of shared memory per key tile: 122.5 KiB at key_dim 128, 226.5 at 256) and runs up to
// key_dim 256 (kScanMaxKt); a larger key_dim runs the tile::Tc scan (same scratch formats).
template <typename L, typename E>
Scan<L, E> fwd_scan(const GdnFast<L, E>& a) {
  const int nkt = static_cast<int>(ceil_div(a.K, kN));
  if constexpr (kBf16<typename L::Operand>) {
    static_assert(kScanMaxKt == 4, "one instantiation per key-tile count");
    if (scan_mma_smem(nkt) <= kMaxBlockSmem) {
      switch (nkt) {
        case 1: return {gdn_scan_mma_kernel<L, E, 1>, scan_mma_smem(1)};
        case 2: return {gdn_scan_mma_kernel<L, E, 2>, scan_mma_smem(2)};
        case 3: return {gdn_scan_mma_kernel<L, E, 3>, scan_mma_smem(3)};
        case 4: return {gdn_scan_mma_kernel<L, E, 4>, scan_mma_smem(4)};
        default: break;
      }
    }
  }
  return {gdn_scan_kernel<L, E>, smem_for(2 + nkt)};
}

// The backward scan: dh, dΔ += K^g dS_C (B1 state part, B2). bf16: the Mma bwd_scan keeps dS in registers for up to
// kBwdScanMaxKt key tiles (key_dim <= 256); a larger key_dim runs the tile::Tc one.
template <typename L, typename E>
Scan<L, E> bwd_scan(const GdnFast<L, E>& a) {
  const int nkt = static_cast<int>(ceil_div(a.K, kN));
  if constexpr (kBf16<typename L::Operand>) {
    if (nkt <= kBwdScanMaxKt) {
      if (!bwd_scan_kq_staged(nkt) && Staged<E>::ok(a.k, a.K) && Staged<E>::ok(a.q, a.K) &&
          tile::async_ok_f(a.d_o, a.V))
        return {gdn_bwd_scan_mma_kernel<L, E, true>, bwd_scan_mma_smem(nkt, true)};
      return {gdn_bwd_scan_mma_kernel<L, E, false>, bwd_scan_mma_smem(nkt, false)};
    }
  }
  return {gdn_bwd_scan_kernel<L, E>, smem_for(4 + nkt)};
}

// Forward (F1–F7): o [B, T, H, V]; where `saved` is given (GdnSaved), 𝒯 and with `states` the scan's h and Δ
// there. wu over every pair, then per group of pairs (by_waves: two groups on two streams where the scan's
// value-tile blocks span more than one wave of the GPU but not a whole number of waves) the scan and out.
template <bool kComba, typename P, typename E>
void core_fwd(const E* q, const E* k, const E* v, const E* p, const float* g, const float* beta, int64_t batch,
              int64_t seq_len, int64_t heads, int64_t key_dim, int64_t value_dim, int64_t chunk_size, float* o,
              float* saved, bool states, void* scratch, cudaStream_t stream) {
  static_assert(std::is_same_v<E, float> || kBf16<P>, "bf16 inputs need bf16 compute");
  using L = Layout<P>;
  check_chunk(chunk_size);
  if (batch * heads == 0 || seq_len == 0 || value_dim == 0) return;
  GdnFast<L, E> a = make_args<L>(q, k, v, p, g, beta, batch, seq_len, heads, key_dim, value_dim, chunk_size, scratch,
                                  false, saved, states);
  a.o = o;
  run_wu<kComba>(a, stream);
  const Scan<L, E> scan = fwd_scan(a);
  const int nkt = static_cast<int>(ceil_div(key_dim, kN));
  by_waves(a, scan.wave(value_dim), stream, [&](const GdnFast<L, E>& grp, cudaStream_t s) {
    scan.run(grp, s);
    if constexpr (kBf16<P>)
      launch(gdn_out_mma_kernel<L, E>, grp.NC, out_mma_smem(nkt), s, grp);
    else
      launch(gdn_out_kernel<L, E>, grp.NC * ceil_div(value_dim, kN), smem_for(4), s, grp);
  });
}

// Backward (B1–B9): gradients overwritten (dp: Comba only). Where `saved` is given (the forward's GdnSaved) with
// `states`, W, h and Δ are read from there and no wu runs; without `states` wu forms W and U from its 𝒯
// (run_wu_saved) and each group's forward scan forms h and Δ; without `saved` wu forms A, 𝒯 (kept in scratch), W
// and U again, and the scan runs as there. Then per group of pairs (by_waves, as the forward) dv_local (dΔ's
// intra-chunk part), the backward scan (reads W and dΔ, not h or Δ; completes dΔ, stores dh), dqk (reads h, Δ, dh,
// dΔ; stores dW) and wy (reads 𝒯, dΔ, dW). No kernel after wu writes W, nor after the forward scan h or Δ.
// The groups follow the smaller of the two scans' waves (the one with fewer blocks per SM: a partial last wave
// leaves SMs idle for a whole scan there; with h and Δ saved, the backward scan's alone): the backward scan's at
// every shape today (one block per SM; the forward scan takes two at key_dim <= 64 with bf16), which is also the
// longer of the two.
template <bool kComba, typename P, typename E>
void core_bwd(const E* q, const E* k, const E* v, const E* p, const float* g, const float* beta, const float* d_o,
              const float* saved, bool states, int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim,
              int64_t value_dim, int64_t chunk_size, float* dq, float* dk, float* dv, float* dp, float* dg,
              float* dbeta, void* scratch, cudaStream_t stream) {
  static_assert(std::is_same_v<E, float> || kBf16<P>, "bf16 inputs need bf16 compute");
  using L = Layout<P>;
  check_chunk(chunk_size);
  if (batch * heads == 0 || seq_len == 0) return;
  if (value_dim == 0) {  // o = 0: every gradient is 0
    const size_t rows = static_cast<size_t>(batch * seq_len * heads);
    for (float* x : {dq, dk, dp})
      if (x) LLMT_CUDA_CHECK(cudaMemsetAsync(x, 0, sizeof(float) * rows * key_dim, stream));
    for (float* x : {dg, dbeta}) LLMT_CUDA_CHECK(cudaMemsetAsync(x, 0, sizeof(float) * rows, stream));
    return;
  }
  GdnFast<L, E> a = make_args<L>(q, k, v, p, g, beta, batch, seq_len, heads, key_dim, value_dim, chunk_size, scratch,
                                  true, const_cast<float*>(saved), states);  // only read here
  a.d_o = d_o;
  a.dq = dq, a.dk = dk, a.dv = dv, a.dp = dp, a.dg = dg, a.dbeta = dbeta;
  const bool kept = saved != nullptr && states;  // W, h and Δ the forward's: no wu
  if (!kept) {
    if (saved != nullptr)
      run_wu_saved<kComba>(a, stream);
    else
      run_wu<kComba>(a, stream);
  }
  const Scan<L, E> scan = fwd_scan(a), bscan = bwd_scan(a);
  const int nkt = static_cast<int>(ceil_div(key_dim, kN));
  const int64_t wave = kept ? bscan.wave(value_dim) : std::min(scan.wave(value_dim), bscan.wave(value_dim));
  by_waves(a, wave, stream,
           [&](const GdnFast<L, E>& grp, cudaStream_t s) {
             if (!kept) scan.run(grp, s);
             if constexpr (kBf16<P>) {
               launch(gdn_dv_local_mma_kernel<L, E>, grp.NC, dv_local_mma_smem(nkt), s, grp);
               bscan.run(grp, s);
               launch(gdn_bwd_dqk_mma_kernel<L, E>, grp.NC * nkt, kDqkMmaSmem, s, grp);
               launch(gdn_bwd_wy_mma_kernel<L, E, kComba>, grp.NC, kWyMmaSmem, s, grp);
             } else {
               launch(gdn_dv_local_kernel<L, E>, grp.NC * ceil_div(value_dim, kN), smem_for(3), s, grp);
               bscan.run(grp, s);
               launch(gdn_bwd_dqk_kernel<L, E>, grp.NC, smem_for(8), s, grp);
               launch(gdn_bwd_wy_kernel<L, E, kComba>, grp.NC, smem_for(6), s, grp);
             }
           });
}

}  // namespace

template <typename P>
int64_t gdn_saved_floats(int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim, int64_t value_dim,
                         int64_t chunk_size, bool states) {
  check_chunk(chunk_size);
  return GdnSaved(batch, seq_len, heads, key_dim, value_dim, chunk_size, sizeof(P), states).total;
}

template <typename P>
size_t gdn_chunk_fwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim,
                                   int64_t value_dim, int64_t chunk_size, bool saved, bool states) {
  const GdnScratch l(batch, seq_len, heads, key_dim, value_dim, chunk_size, false, sizeof(P), saved, states);
  return sizeof(float) * static_cast<size_t>(l.total);
}

template <typename P>
size_t gdn_chunk_bwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim,
                                   int64_t value_dim, int64_t chunk_size, bool saved, bool states) {
  const GdnScratch l(batch, seq_len, heads, key_dim, value_dim, chunk_size, true, sizeof(P), saved, states);
  return sizeof(float) * static_cast<size_t>(l.total);
}

template <typename P>
size_t comba_chunk_fwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim,
                                     int64_t value_dim, int64_t chunk_size, bool saved, bool states) {
  return gdn_chunk_fwd_scratch_bytes<P>(batch, seq_len, heads, key_dim, value_dim, chunk_size, saved, states);
}

template <typename P>
size_t comba_chunk_bwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim,
                                     int64_t value_dim, int64_t chunk_size, bool saved, bool states) {
  return gdn_chunk_bwd_scratch_bytes<P>(batch, seq_len, heads, key_dim, value_dim, chunk_size, saved, states);
}

template <typename P, typename E>
void gdn_chunk_fwd(const E* q, const E* k, const E* v, const float* g, const float* beta, int64_t batch,
                   int64_t seq_len, int64_t heads, int64_t key_dim, int64_t value_dim, int64_t chunk_size, float* o,
                   float* saved, bool states, void* scratch, cudaStream_t stream) {
  core_fwd<false, P, E>(q, k, v, nullptr, g, beta, batch, seq_len, heads, key_dim, value_dim, chunk_size, o, saved,
                        states, scratch, stream);
}

template <typename P, typename E>
void gdn_chunk_bwd(const E* q, const E* k, const E* v, const float* g, const float* beta, const float* d_o,
                   const float* saved, bool states, int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim,
                   int64_t value_dim, int64_t chunk_size, float* dq, float* dk, float* dv, float* dg, float* dbeta,
                   void* scratch, cudaStream_t stream) {
  core_bwd<false, P, E>(q, k, v, nullptr, g, beta, d_o, saved, states, batch, seq_len, heads, key_dim, value_dim,
                        chunk_size, dq, dk, dv, nullptr, dg, dbeta, scratch, stream);
}

template <typename P, typename E>
void comba_chunk_fwd(const E* q, const E* k, const E* v, const E* p, const float* g, const float* beta,
                     int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim, int64_t value_dim,
                     int64_t chunk_size, float* o, float* saved, bool states, void* scratch, cudaStream_t stream) {
  core_fwd<true, P, E>(q, k, v, p, g, beta, batch, seq_len, heads, key_dim, value_dim, chunk_size, o, saved, states,
                       scratch, stream);
}

template <typename P, typename E>
void comba_chunk_bwd(const E* q, const E* k, const E* v, const E* p, const float* g, const float* beta,
                     const float* d_o, const float* saved, bool states, int64_t batch, int64_t seq_len,
                     int64_t heads, int64_t key_dim, int64_t value_dim, int64_t chunk_size, float* dq, float* dk,
                     float* dv, float* dp, float* dg, float* dbeta, void* scratch, cudaStream_t stream) {
  core_bwd<true, P, E>(q, k, v, p, g, beta, d_o, saved, states, batch, seq_len, heads, key_dim, value_dim, chunk_size,
                       dq, dk, dv, dp, dg, dbeta, scratch, stream);
}

#define LLMT_INSTANTIATE_GDN_COMBA_SCRATCH(P)                                                                   \
  template int64_t gdn_saved_floats<P>(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool);                 \
  template size_t gdn_chunk_fwd_scratch_bytes<P>(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool);   \
  template size_t gdn_chunk_bwd_scratch_bytes<P>(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool);   \
  template size_t comba_chunk_fwd_scratch_bytes<P>(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool); \
  template size_t comba_chunk_bwd_scratch_bytes<P>(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool);
#define LLMT_INSTANTIATE_GDN_COMBA(P, E)                                                                          \
  template void gdn_chunk_fwd<P, E>(const E*, const E*, const E*, const float*, const float*, int64_t, int64_t,   \
                                    int64_t, int64_t, int64_t, int64_t, float*, float*, bool, void*,             \
                                    cudaStream_t);                                                                \
  template void gdn_chunk_bwd<P, E>(const E*, const E*, const E*, const float*, const float*, const float*,       \
                                    const float*, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,     \
                                    float*, float*, float*, float*, float*, void*, cudaStream_t);                 \
  template void comba_chunk_fwd<P, E>(const E*, const E*, const E*, const E*, const float*, const float*,         \
                                      int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float*, float*, bool, \
                                      void*, cudaStream_t);                                                       \
  template void comba_chunk_bwd<P, E>(const E*, const E*, const E*, const E*, const float*, const float*,         \
                                      const float*, const float*, bool, int64_t, int64_t, int64_t, int64_t,       \
                                      int64_t, int64_t, float*, float*, float*, float*, float*, float*, void*,    \
                                      cudaStream_t);
LLMT_INSTANTIATE_GDN_COMBA_SCRATCH(float)
LLMT_INSTANTIATE_GDN_COMBA_SCRATCH(__nv_bfloat16)
LLMT_INSTANTIATE_GDN_COMBA(float, float)
LLMT_INSTANTIATE_GDN_COMBA(__nv_bfloat16, float)
LLMT_INSTANTIATE_GDN_COMBA(__nv_bfloat16, __nv_bfloat16)

}  // namespace llmt::cuda
