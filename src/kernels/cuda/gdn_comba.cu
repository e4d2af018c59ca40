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
// its inverse 𝒯 (forward substitution), the running states S (shared memory) and dS (registers), the scratch 𝒯, dΔ, dΓ,
// the sums over key / value tiles and every element-wise and reduction step (dβ, dΓ, dg).
// Comba differs only where A and W are formed (F1', F3': P̂ rows and the exclusive cumsum Γ^ex) and in their
// backward (wy phase: dP̂, dΓ^ex); every other phase is shared. Chunk-parallel design (the kernel order of
// FLA, §6.3), every phase built from 64 x 64 shared-memory tile products (delta_tile.cuh):
//   forward:  wu    (per chunk)          A, 𝒯 = (I + A)^{-1} (to tinv), W, U               (F1–F3)
//             scan  (per value tile)     h[n] = S entering chunk n; Δ = U - W S; S update  (F4, F7)
//             out   (per chunk, v tile)  O = (Q ⊙ e^Γ) h[n] + P Δ                          (F5, F6)
//   backward: wu (W, U from the forward's 𝒯; without tinv A and 𝒯 again, 𝒯 kept in scratch) and scan recompute
//             h and Δ (never stored by the forward), then
//             dv_local (per chunk, v tile)  dΔ = P^T dO                                    (B1, intra)
//             bwd_scan (per value tile)     dh[n] = dS_C of chunk n; dΔ += K^g dS_C; dS_0  (B1, B2)
//             dqk      (per chunk)          dQ, dK (P and state parts), dW, dΓ (i)–(iv)    (B3, B4, B8)
//             wy       (per chunk)          dV, dβ, dK (WY and A parts), dΓ (v)–(vi), dg   (B5–B7, B9)
// Launch order: wu over every (batch, head) pair, then per group of pairs the forward's scan and out, or the
// backward's scan, dv_local, bwd_scan, dqk and wy. Pairs form one group unless a scan's value-tile blocks span more
// than one wave of the GPU but not a whole number of waves (shape B = 4, H = 6, key_dim 256, value_dim 512: 24
// pairs x 8 value tiles, one scan block per SM): then the last wave's pairs run as a second group on a side stream
// (by_waves, by_waves.cuh), and the first group's per-chunk kernels fill the SMs the last wave of scans leaves idle.
// Every kernel takes the first pair of its launch (bh0) in its arguments.
// Chunks of chunk_size <= 64 tokens fill the rows of one tile (rows past the chunk's end are zero).
// Scratch (global): P W, U/Δ, dW and fp32 dΔ [B H, T', *] (T' = chunks x chunk_size); fp32 𝒯 [B H,
// chunks, 64, 64] (the caller's tinv, kept from the forward to the backward; else the backward's scratch); P h, dh
// [B H, chunks, K, V]; fp32 dΓ [B H, T']. Fixed summation orders and no atomics: deterministic.
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
// of element type E (float today; the hook for bf16 inputs). The scratch W, U/Δ, dW, h, dh is stored in the
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

/// Scratch layout in floats (forward: W, U, h; backward: all, but 𝒯 only without a saved one: saved_tinv); W, U,
/// h, dh, dW have elements of `stored` bytes (4: fp32; 2: bf16, two per float).
struct GdnScratch {
  int64_t W, U, h, Tm, dD, dh, dW, dgam, total;
  GdnScratch(int64_t B, int64_t T, int64_t H, int64_t K, int64_t V, int64_t C, bool backward, int64_t stored,
             bool saved_tinv) {
    const int64_t BH = B * H, NC = ceil_div(T, C), Tp = NC * C;
    int64_t at = 0;
    const auto take = [&](int64_t n) { const int64_t r = at; at += n; return r; };
    const auto take_s = [&](int64_t n) { return take((n * stored + 3) / 4); };  // floats that hold n elements
    W = take_s(BH * Tp * K), U = take_s(BH * Tp * V), h = take_s(BH * NC * K * V);
    Tm = dD = dh = dW = dgam = 0;
    if (backward) {
      if (!saved_tinv) Tm = take(BH * NC * kN * kN);
      dD = take(BH * Tp * V), dh = take_s(BH * NC * K * V), dW = take_s(BH * Tp * K);
      dgam = take(BH * Tp);
    }
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

// Γ of the chunk from warp 0's gate pairs (lane l: g of rows 2l, 2l + 1, 0 for rows >= n): a fixed shuffle scan
// over the lanes' pairs, in double; rows >= n repeat Γ_{n-1}. Ends with a barrier (Γ visible to the block), which
// in the Mma scans also orders the previous chunk's state update before what follows (that chunk read Γ only
// before its own barriers). Lanes of other warps pass anything.
__device__ void scan_gate_pair(float g0, float g1, double* gam) {
  if (threadIdx.x < 32) {
    const int l = static_cast<int>(threadIdx.x);
    const double a0 = g0, pair = a0 + g1;
    double incl = pair;
    for (int o = 1; o < 32; o <<= 1) {
      const double y = __shfl_up_sync(0xffffffffu, incl, o);
      if (l >= o) incl += y;
    }
    const double excl = __shfl_up_sync(0xffffffffu, incl, 1);
    gam[2 * l] = (l > 0 ? excl : 0.0) + a0;
    gam[2 * l + 1] = incl;
  }
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

// Small per-block arrays at the start of the dynamic shared memory.
struct Small {
  double* gam;
  float *beta, *tmp, *red, *out1, *out2, *out3;
  __device__ explicit Small(Carve& cv)
      : gam(cv.take<double>(kN)), beta(cv.take<float>(kN)), tmp(cv.take<float>(kN)),
        red(cv.take<float>(2 * kN * 16)), out1(cv.take<float>(kN)), out2(cv.take<float>(kN)),
        out3(cv.take<float>(kN)) {}
  /// The log-decay that A's rows and W carry: Γ^ex_r (Comba) or Γ_r (GDN).
  template <bool kComba>
  __device__ double row_gam(int r) const { return kComba ? gam[r] - tmp[r] : gam[r]; }
};
constexpr size_t kSmallBytes = 8 * kN + 4 * (5 * kN + 2 * kN * 16) + 7 * 16;

// ---- forward phases on layout L (fp32 models: L = Simt; the bf16 scan's large-key_dim fallback: L = Tc) ----

// F3 (Comba: F3') of chunk ch from 𝒯 in the shared tile sT and the gates in s (both written before the call,
// ordered by its first barrier): W = 𝒯 diag(β) (X ⊙ e^Γ) (Comba: e^{Γ^ex}), U = 𝒯 diag(β) V, through the shared
// operand tile sX (free at the call). Ends with a barrier.
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
// gdn_wu_kernel forms them (the same bits), without A or its inverse (the backward's wu with a saved 𝒯).
template <typename L, typename E, bool kComba>
__global__ void __launch_bounds__(tile::kThreads) gdn_wu_saved_kernel(GdnFast<L, E> a) {
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  Small s(cv);
  float *sT = cv.tile(), *sX = cv.tile();
  const Chunk ch(a, blockIdx.x, a.bh0 + blockIdx.y);
  load_gates(a, ch, s.gam, s.beta, s.tmp);
  tile::load(sT, ch.square(a, a.Tm), kN, kN, kN);
  wu_products<L, E, kComba>(a, ch, s, sT, sX);
}

// Prefetches (L2) what a scan reads of chunk nx besides the states: the gates, k and W rows, and U (forward)
// or q, dO and dΔ (backward) in value columns v0 .. v0 + vc - 1.
template <typename L, typename E>
__device__ void prefetch_chunk(const GdnFast<L, E>& a, const Chunk& nx, int64_t v0, int vc, bool backward) {
  using tile::prefetch_l2;
  const int64_t K = a.K, V = a.V, H = a.H, e = sizeof(E), es = sizeof(typename L::Operand);
  prefetch_l2(a.g + nx.gate(a, 0), 4 * H, nx.n, 4);
  prefetch_l2(a.beta + nx.gate(a, 0), 4 * H, nx.n, 4);
  prefetch_l2(nx.in(a, a.k, K, 0), e * H * K, nx.n, e * K);
  prefetch_l2(nx.rows(a, a.W, K, 0), 0, 1, es * nx.n * K);  // the chunk's W rows are contiguous
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

// Shared memory of gdn_wu_mma_kernel: fp32 A, 𝒯 (forward substitution), bf16 𝒯 and two operand tiles.
constexpr size_t kWuMmaSmem = kSmallBytes + 2 * sizeof(float) * tile::kTileFloats + 3 * sizeof(bf16) * kTileHalves;
// Shared memory of gdn_wu_saved_mma_kernel: bf16 𝒯 and two operand tiles.
constexpr size_t kWuSavedMmaSmem = kSmallBytes + 3 * sizeof(bf16) * kTileHalves;

// F3's operand tile t of chunk ch, unscaled, into f (tile::fetch_h): W's (x = k, Comba p̂: key tile t) for t < nkt,
// else U's (v: value tile t - nkt).
template <bool kComba, typename L, typename E>
__device__ __forceinline__ void wu_fetch(const GdnFast<L, E>& a, const Chunk& ch, int nkt, int t, tile::Frag& f) {
  const int64_t K = a.K, V = a.V;
  if (t < nkt)
    tile::fetch_h(f, ch.in(a, kComba ? a.p : a.k, K, kN * t), a.H * K, ch.n, tile_cols(K, kN * t));
  else
    tile::fetch_h(f, ch.in(a, a.v, V, kN * (t - nkt)), a.H * V, ch.n, tile_cols(V, kN * (t - nkt)));
}

// F3 (Comba: F3') of chunk ch on the tensor cores: W = 𝒯 diag(β) (X ⊙ e^Γ) (Comba: e^{Γ^ex}), U = 𝒯 diag(β) V,
// from the bf16 𝒯 in hT and the gates in s (both written before the call, ordered by its first barrier), with
// operand tile 0 in flight in f (wu_fetch). The operand tiles (W's, then U's: wu_fetch's order) go through the bf16
// tiles hX, hK by turns (free at the call); tile t: f (tile t) scaled into its buffer (the product that last read it
// came before the previous barrier), the fetch of tile t + 1 into f, a barrier, the product and its store.
template <bool kComba, typename L, typename E>
__device__ __forceinline__ void wu_products_mma(const GdnFast<L, E>& a, const Chunk& ch, const Small& s,
                                                const bf16* hT, bf16* hX, bf16* hK, tile::Frag& f) {
  const int64_t K = a.K, V = a.V;
  const int nkt = static_cast<int>((K + kN - 1) / kN), nt = nkt + static_cast<int>((V + kN - 1) / kN);
  const auto id = [](int, int, float v) { return v; };
  Acc acc;
  for (int t = 0; t < nt; ++t) {
    bf16* h = (t & 1) ? hK : hX;
    if (t < nkt)
      tile::put_h(f, h, ch.n, [&](int r) { return s.beta[r] * expd(s.row_gam<kComba>(r)); });
    else
      tile::put_h(f, h, ch.n, [&](int r) { return s.beta[r]; });
    if (t + 1 < nt) wu_fetch<kComba>(a, ch, nkt, t + 1, f);
    __syncthreads();
    acc.zero();
    Mma::mma<false, false>(hT, h, acc);
    if (t < nkt)
      store_acc<Mma>(acc, ch.rows(a, a.W, K, kN * t), K, ch.n, tile_cols(K, kN * t), id);
    else
      store_acc<Mma>(acc, ch.rows(a, a.U, V, kN * (t - nkt)), V, ch.n, tile_cols(V, kN * (t - nkt)), id);
  }
}

// F1–F3 for chunk blockIdx.x of pair bh0 + blockIdx.y, as gdn_wu_kernel (𝒯 stored to a.Tm where given). The same
// results bit for bit as the plain form (per tile: load_h, barrier, product, barrier), with fewer exposed load
// latencies and barriers: the chunk's k (Comba: and p) and v rows are asked of the L2 before the gates are loaded;
// X K^T takes two key tiles a step (GDN: hX, hK, each tile times itself, both loaded together; Comba: p and k of
// one key tile, one after the other); A is inverted by tile::tril_inverse_fast; F3 (wu_products_mma) runs from 𝒯
// rounded to bf16 once (hT), its first operand tile fetched into registers during the inverse (GDN; Comba: after
// it, for want of registers). At most 80 registers: three blocks an SM, as the shared memory allows.
template <typename L, typename E, bool kComba>
__global__ void __launch_bounds__(tile::kThreads, 3) gdn_wu_mma_kernel(GdnFast<L, E> a) {
  static_assert(std::is_same_v<typename L::Operand, bf16>, "bf16 scratch");
  using tile::fetch_h;
  using tile::Frag;
  using tile::put_h;
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  Small s(cv);
  float *sA = cv.tile(), *sT = cv.tile();
  bf16 *hT = cv.take<bf16>(kTileHalves), *hX = cv.take<bf16>(kTileHalves), *hK = cv.take<bf16>(kTileHalves);
  const Chunk ch(a, blockIdx.x, a.bh0 + blockIdx.y);
  const int64_t K = a.K, V = a.V, HK = a.H * K;
  const int nkt = static_cast<int>((K + kN - 1) / kN);
  const E* x = kComba ? a.p : a.k;
  const auto one = [](int) { return 1.0f; };
  // X K^T in steps: GDN (x = k) key tiles 2 st, 2 st + 1 into hX, hK (each tile times itself); Comba p and k of
  // key tile st.
  const int nxs = kComba ? nkt : (nkt + 1) / 2;
  tile::prefetch_l2(ch.in(a, a.k, K, 0), sizeof(E) * HK, ch.n, sizeof(E) * K);
  if (kComba) tile::prefetch_l2(ch.in(a, x, K, 0), sizeof(E) * HK, ch.n, sizeof(E) * K);
  tile::prefetch_l2(ch.in(a, a.v, V, 0), sizeof(E) * a.H * V, ch.n, sizeof(E) * V);
  load_gates(a, ch, s.gam, s.beta, s.tmp);
  Frag fa;
  Acc acc;
  acc.zero();
  for (int st = 0; st < nxs; ++st) {
    const int64_t ka = kComba ? kN * st : 2 * kN * st, kb = kComba ? ka : ka + kN;
    if (kComba) {  // one tile in flight at a time (80 registers)
      fetch_h(fa, ch.in(a, x, K, ka), HK, ch.n, tile_cols(K, ka));
      put_h(fa, hX, ch.n, one);
      fetch_h(fa, ch.in(a, a.k, K, kb), HK, ch.n, tile_cols(K, kb));
      put_h(fa, hK, ch.n, one);
    } else {  // both key tiles in flight together
      Frag fb;
      fetch_h(fa, ch.in(a, x, K, ka), HK, ch.n, tile_cols(K, ka));
      if (kb < K) fetch_h(fb, ch.in(a, a.k, K, kb), HK, ch.n, tile_cols(K, kb));
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
    __syncthreads();
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
  if (!kComba) wu_fetch<kComba>(a, ch, nkt, 0, fa);  // in flight during the inverse
  __syncthreads();
  tile::tril_inverse_fast(sA, sT, ch.n);  // F2 (ends with a barrier)
  if (kComba) wu_fetch<kComba>(a, ch, nkt, 0, fa);
  if (a.Tm != nullptr) tile::store(sT, ch.square(a, a.Tm), kN, kN, kN);
  tile::load_h(hT, sT, kLd, kN, kN);  // 𝒯 in bf16, once (its readers come after the next barrier)
  wu_products_mma<kComba>(a, ch, s, hT, hX, hK, fa);  // F3
}

// F3 (Comba: F3') for chunk blockIdx.x of pair bh0 + blockIdx.y from the 𝒯 the forward stored (a.Tm), as
// gdn_wu_mma_kernel forms W and U (the same bits: 𝒯 rounded to bf16 as there), without A or its inverse (the
// backward's wu with a saved 𝒯). The chunk's x (k, Comba p̂) and v rows are asked of the L2 first; 𝒯 and F3's first
// operand tile are fetched into registers while the gates are loaded. At most 64 registers (no spills): four blocks
// an SM (36.9 KiB of shared memory each), for more loads in flight.
template <typename L, typename E, bool kComba>
__global__ void __launch_bounds__(tile::kThreads, 4) gdn_wu_saved_mma_kernel(GdnFast<L, E> a) {
  static_assert(std::is_same_v<typename L::Operand, bf16>, "bf16 scratch");
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  Small s(cv);
  bf16 *hT = cv.take<bf16>(kTileHalves), *hX = cv.take<bf16>(kTileHalves), *hK = cv.take<bf16>(kTileHalves);
  const Chunk ch(a, blockIdx.x, a.bh0 + blockIdx.y);
  const int64_t K = a.K, V = a.V;
  tile::prefetch_l2(ch.in(a, kComba ? a.p : a.k, K, 0), sizeof(E) * a.H * K, ch.n, sizeof(E) * K);
  tile::prefetch_l2(ch.in(a, a.v, V, 0), sizeof(E) * a.H * V, ch.n, sizeof(E) * V);
  tile::Frag ft, fa;
  tile::fetch_h(ft, ch.square(a, a.Tm), kN, kN, kN);
  wu_fetch<kComba>(a, ch, static_cast<int>((K + kN - 1) / kN), 0, fa);
  load_gates(a, ch, s.gam, s.beta, s.tmp);
  tile::put_h(ft, hT, kN, [](int) { return 1.0f; });
  wu_products_mma<kComba>(a, ch, s, hT, hX, hK, fa);  // F3
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

// Whether gdn_scan_mma_kernel stages the next chunk's k in fp32 shared memory (cp.async; 16 KiB per key tile):
// key_dim <= 192. At key_dim 256 the staging tiles do not fit beside the rest; k is loaded synchronously there.
__host__ __device__ constexpr bool scan_k_staged(int nkt) { return nkt <= 3; }

// Shared memory of gdn_scan_mma_kernel for nkt key tiles: the fp32 state (each thread's 16 elements of each
// key tile, thread-major: conflict-free, read and written only by their owner), its bf16 copy, two buffers of
// the chunk's W tiles (the next chunk's land by cp.async while this one computes), the K^g tiles, Δ and the next
// chunk's U (bf16), and (key_dim <= 192) the fp32 staging tiles of the next chunk's k. 154.5 KiB at key_dim
// 128, 226.5 KiB at 256.
constexpr size_t scan_mma_smem(int nkt) {
  return kScanSmallBytes + sizeof(float) * 16 * tile::kThreads * nkt + sizeof(bf16) * kTileHalves * (4 * nkt + 2) +
         (scan_k_staged(nkt) ? sizeof(float) * tile::kStageFloats * nkt : 0);
}
static_assert(scan_mma_smem(3) <= 227 * 1024 && scan_mma_smem(kScanMaxKt) <= 227 * 1024, "scan shared memory");

// F4, F7 for value tile blockIdx.x of pair bh0 + blockIdx.y, chunks in order, as gdn_scan_kernel: stores h[n] (bf16)
// and Δ = U - W h[n] (over U). Per chunk: the K^g = K ⊙ e^{Γ_C-Γ} tiles (all key tiles), W S summed over the
// key tiles in registers, Δ (registers -> bf16 tile), then per key tile S = e^{Γ_C} S + (K^g)^T Δ with S fp32
// (shared, per thread) and its bf16 copy (the next W S and h[n+1]). The next chunk's operands are copied by
// cp.async once the barrier before W S has ordered every read of their buffers, and land while this chunk
// computes: its W tiles (into the other W buffer), its U tile (into hU; read back at the Mma map into
// registers) and (key_dim <= 192) its raw k tiles (into the fp32 staging tiles; each thread scales its own
// staged pieces into K^g, the arithmetic of load_h); the gates a chunk ahead in registers. Where W or U is not
// 16-byte aligned (key_dim % 8 != 0, value_dim % 8 != 0) it is loaded synchronously (load_h, load_acc) instead;
// so is k at key_dim > 192 or key_dim % 4 != 0, one key tile ahead in registers (tile 0 during the gates' scan,
// tile kt + 1 while tile kt is converted). Same arithmetic either way.
template <typename L, typename E>
__global__ void __launch_bounds__(tile::kThreads) gdn_scan_mma_kernel(GdnFast<L, E> a) {
  static_assert(std::is_same_v<typename L::Operand, bf16>, "bf16 scratch");
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  ScanSmall s(cv);
  const int64_t K = a.K, V = a.V, v0 = static_cast<int64_t>(blockIdx.x) * kN;
  const int bh = static_cast<int>(a.bh0) + static_cast<int>(blockIdx.y);
  const int vc = tile_cols(V, v0);
  const int nkt = static_cast<int>((K + kN - 1) / kN);
  float* S = cv.take<float>(16 * tile::kThreads * nkt);
  bf16 *hS = cv.take<bf16>(kTileHalves * nkt), *hW = cv.take<bf16>(2 * kTileHalves * nkt),
       *hK = cv.take<bf16>(kTileHalves * nkt), *hD = cv.take<bf16>(kTileHalves), *hU = cv.take<bf16>(kTileHalves);
  float* gK = scan_k_staged(nkt) ? cv.take<float>(nkt * tile::kStageFloats) : nullptr;
  const bool w_async = tile::async_ok_h(a.W, K), u_async = tile::async_ok_h(a.U, V);
  // (Every row of k starts a multiple of K elements after the tensor's start.)
  const bool k_async = scan_k_staged(nkt) && tile::async_ok_f(a.k, K);
  // The cp.async operands of chunk c (W into W buffer c % 2, k into the staging tiles, U into hU), one group.
  const auto issue = [&](int64_t c) {
    const Chunk nx(a, c, bh);
    for (int kt = 0; kt < nkt; ++kt) {
      const int kc = tile_cols(K, kt * kN);
      if (w_async)
        tile::load_h_async(hW + ((c & 1) * nkt + kt) * kTileHalves, nx.rows(a, a.W, K, kt * kN), K, nx.n, kc);
      if (k_async) tile::stage_async(gK + kt * tile::kStageFloats, nx.in(a, a.k, K, kt * kN), a.H * K, nx.n, kc);
    }
    if (u_async) tile::load_h_async(hU, nx.rows(a, a.U, V, v0), V, nx.n, vc);
    tile::cp_async_commit();
  };
  const int tid = static_cast<int>(threadIdx.x);
  tile::clear_state(S, hS, nkt);
  float g0 = 0.0f, g1 = 0.0f;  // (warp 0) the gate pairs of the chunk to come (fetched one chunk ahead)
  fetch_gate_pair(a, Chunk(a, 0, bh), g0, g1);
  issue(0);
  if (a.NC > 1) prefetch_chunk(a, Chunk(a, 1, bh), v0, vc, false);
  for (int64_t chunk = 0; chunk < a.NC; ++chunk) {
    const Chunk ch(a, chunk, bh);
    // (The L2 two chunks ahead: the next chunk's copies are issued during this one.)
    if (chunk + 2 < a.NC) prefetch_chunk(a, Chunk(a, chunk + 2, bh), v0, vc, false);
    // Synchronous k: key tile kt of the chunk into x (registers).
    const auto fetch_k = [&](tile::Frag& x, int kt) {
      tile::fetch_h(x, ch.in(a, a.k, K, kt * kN), a.H * K, ch.n, tile_cols(K, kt * kN));
    };
    tile::Frag kx;  // (synchronous k) the next key tile's k, in flight while the tile before is converted
    if (!k_async) fetch_k(kx, 0);   // (in flight during the gates' scan)
    tile::cp_async_wait<0>();       // this chunk's W, k, U (the barrier below makes them visible to every thread)
    scan_gate_pair(g0, g1, s.gam);  // (its barrier also orders the last update before what follows)
    const double gC = s.gam[ch.n - 1];
    const float aC = expd(gC);
    const auto kscale = [&](int r) { return expd(gC - s.gam[r]); };
    bf16* hWc = hW + (chunk & 1) * nkt * kTileHalves;
    for (int kt = 0; kt < nkt; ++kt) {
      const int kc = tile_cols(K, kt * kN);
      tile::store_h(hS + kt * kTileHalves, ch.state(a, a.h, kt * kN, v0), V, kc, vc);  // h[n] = bf16(S)
      if (!w_async) tile::load_h(hWc + kt * kTileHalves, ch.rows(a, a.W, K, kt * kN), K, ch.n, kc);
      if (k_async) {  // the thread's own staged pieces
        tile::put_h_staged(hK + kt * kTileHalves, gK + kt * tile::kStageFloats, ch.n, kscale);
      } else {
        const tile::Frag x = kx;
        if (kt + 1 < nkt) fetch_k(kx, kt + 1);
        tile::put_h(x, hK + kt * kTileHalves, ch.n, kscale);
      }
    }
    typename L::Operand* U = ch.rows(a, a.U, V, v0);
    Acc d;
    if (u_async)
      load_acc<Mma>(d, hU, kLdH, ch.n, vc);
    else
      load_acc<Mma>(d, U, V, ch.n, vc);
    // K^g, W complete; every read of the staging tiles and of hU done (the other W buffer was last read before the
    // chunk before's second barrier)
    __syncthreads();
    if (chunk + 1 < a.NC) issue(chunk + 1);
    Acc acc;
    acc.zero();
    for (int kt = 0; kt < nkt; ++kt) Mma::mma<false, false>(hWc + kt * kTileHalves, hS + kt * kTileHalves, acc);
    tile::delta_out<false>(d, acc, U, V, ch.n, vc, hD);  // F4: Δ = U - W S (0 outside the chunk)
    __syncthreads();  // hD complete; every read of hS (W S) and of Γ done
    if (chunk + 1 < a.NC) fetch_gate_pair(a, Chunk(a, chunk + 1, bh), g0, g1);  // in flight during F7
    for (int kt = 0; kt < nkt; ++kt) {  // F7: S = e^{Γ_C} S + (K ⊙ e^{Γ_C-Γ})^T Δ
      acc.zero();
      Mma::mma<true, false>(hK + kt * kTileHalves, hD, acc);
      float* St = S + kt * 16 * tile::kThreads + tid;
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          float& e = St[(4 * i + j) * tile::kThreads];
          e = aC * e + acc.v[i][j];
          acc.v[i][j] = e;
        }
      tile::store_acc_h(acc, hS + kt * kTileHalves, [](int, int, float x) { return x; });
    }
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

// Shared memory of gdn_out_mma_kernel for nkt key tiles: bf16 Q (all key tiles), K then h (all key tiles of
// one value tile), P and Δ.
constexpr size_t out_mma_smem(int nkt) { return kSmallBytes + sizeof(bf16) * kTileHalves * (2 * nkt + 2); }

// F5, F6 for chunk blockIdx.x of pair bh0 + blockIdx.y, every value tile: P = mask(e^{Γ_r-Γ_j} Q K^T) once (the sum
// over the key tiles in registers), then per value tile O = (Q ⊙ e^Γ) h[n] + P Δ (Q h summed in registers).
template <typename L, typename E>
__global__ void __launch_bounds__(tile::kThreads) gdn_out_mma_kernel(GdnFast<L, E> a) {
  static_assert(std::is_same_v<typename L::Operand, bf16>, "bf16 scratch");
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  Small s(cv);
  const int64_t K = a.K, V = a.V;
  const int nkt = static_cast<int>((K + kN - 1) / kN);
  bf16 *hQ = cv.take<bf16>(kTileHalves * nkt), *hKH = cv.take<bf16>(kTileHalves * nkt),
       *hP = cv.take<bf16>(kTileHalves), *hD = cv.take<bf16>(kTileHalves);
  const Chunk ch(a, blockIdx.x, a.bh0 + blockIdx.y);
  load_gates(a, ch, s.gam, s.beta, s.tmp);
  Acc qk;
  chunk_qk_mma(a, ch, nkt, hQ, hKH, qk);
  tile::store_acc_h(qk, hP, [&](int r, int c, float x) { return c <= r ? expd(s.gam[r] - s.gam[c]) * x : 0.0f; });
  __syncthreads();  // hP complete; the K tiles are read (hKH takes h next)
  for (int64_t v0 = 0; v0 < V; v0 += kN) {
    const int vc = tile_cols(V, v0);
    for (int kt = 0; kt < nkt; ++kt)
      tile::load_h(hKH + kt * kTileHalves, ch.state(a, a.h, kt * kN, v0), V, tile_cols(K, kt * kN), vc);
    tile::load_h(hD, ch.rows(a, a.U, V, v0), V, ch.n, vc);  // Δ
    __syncthreads();
    Acc qh, pd;
    qh.zero();
    pd.zero();
    for (int kt = 0; kt < nkt; ++kt) Mma::mma<false, false>(hQ + kt * kTileHalves, hKH + kt * kTileHalves, qh);
    Mma::mma<false, false>(hP, hD, pd);
    float* o = ch.in(a, a.o, V, v0);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int r = Mma::row(i), c = Mma::col(j);
        if (r < ch.n && c < vc) o[r * a.H * V + c] = expd(s.gam[r]) * qh.v[i][j] + pd.v[i][j];
      }
    __syncthreads();  // hKH, hD are read
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

// B3, in place in dp (= dO Δ^T): dP ⊙ E (masked); B8 (ii) into the thread's partials (qk = Q K^T).
template <typename PL>
__device__ __forceinline__ void dqk_dP(Acc& dp, const Acc& qk, const Small& s, float (&row_part)[4],
                                       float (&col_part)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = PL::row(i), c = PL::col(j);
      const float d = c <= r ? expd(s.gam[r] - s.gam[c]) * dp.v[i][j] : 0.0f;
      dp.v[i][j] = d;
      const float y = d * qk.v[i][j];
      row_part[i] += y;
      col_part[j] -= y;
    }
}

// Key tile k0 (kc columns): dQ (B3), dK (B4), dW = -dΔ h^T and dΓ terms (i), (iii) of B8 from the products
// dqs = dO h^T, dks = Δ dS_C^T, dws = dΔ h^T, dq2 = dP K, dk2 = dP^T Q; xq(i, j), xk(i, j): q, k in fp32 at the
// thread's element (i, j).
template <typename PL, typename L, typename E, typename Xq, typename Xk>
__device__ __forceinline__ void dqk_store(const GdnFast<L, E>& a, const Chunk& ch, const Small& s, int64_t k0, int kc,
                                          double gC, Xq xq, Xk xk, const Acc& dqs, const Acc& dks, const Acc& dws,
                                          const Acc& dq2, const Acc& dk2, float (&row_part)[4], float& kz) {
  const int64_t K = a.K;
  float *dq = ch.in(a, a.dq, K, k0), *dk = ch.in(a, a.dk, K, k0);
  typename L::Operand* dW = ch.rows(a, a.dW, K, k0);
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = PL::row(i), c = PL::col(j);
      const float eg = expd(s.gam[r]), ekg = expd(gC - s.gam[r]);
      row_part[i] += eg * xq(i, j) * dqs.v[i][j];  // (i)
      const float z = ekg * xk(i, j) * dks.v[i][j];
      row_part[i] -= z;  // (iii), every row
      kz += z;           // (iii), at row C
      if (r < ch.n && c < kc) {
        dq[r * a.H * K + c] = eg * dqs.v[i][j] + dq2.v[i][j];  // B3
        dk[r * a.H * K + c] = dk2.v[i][j] + ekg * dks.v[i][j];  // B4
        dW[r * K + c] = from_f32<typename L::Operand>(-dws.v[i][j]);
      }
    }
}

// The block's dΓ terms of B8 into the dΓ scratch: the row and column partials, (iii) at row C (kz: the thread's
// share) and (iv) (sd: the thread's share of Σ h ⊙ dh).
template <typename PL, typename L, typename E>
__device__ __forceinline__ void dqk_finish(const GdnFast<L, E>& a, const Chunk& ch, const Small& s, double gC,
                                           const float (&row_part)[4], const float (&col_part)[4], float kz, float sd) {
  tile::reduce_rows_cols<PL>(row_part, col_part, s.red, s.out1);
  const float kz_all = block_reduce(kz, SumOp{}, 0.0f), sd_all = block_reduce(sd, SumOp{}, 0.0f);
  const int r = static_cast<int>(threadIdx.x);
  if (r < ch.n)
    ch.rows(a, a.dgam, 1, 0)[r] = s.out1[r] + (r == ch.n - 1 ? kz_all + expd(gC) * sd_all : 0.0f);  // (iv)
}

// B3, B4 (P and state parts of dK), dW = -dΔ h^T and dΓ terms (i)–(iv) of B8 (into the dΓ scratch), for
// chunk blockIdx.x of pair bh0 + blockIdx.y.
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
  Acc qk, dp;
  qk.zero();
  dp.zero();
  for (int64_t k0 = 0; k0 < K; k0 += kN) {  // Q K^T
    tile::load(sX, ch.in(a, a.q, K, k0), a.H * K, ch.n, tile_cols(K, k0));
    tile::load(sZ, ch.in(a, a.k, K, k0), a.H * K, ch.n, tile_cols(K, k0));
    __syncthreads();
    L::template mma<false, true>(sX, sZ, qk);
    __syncthreads();
  }
  for (int64_t v0 = 0; v0 < V; v0 += kN) {  // dO Δ^T
    tile::load(sY, ch.in(a, a.d_o, V, v0), a.H * V, ch.n, tile_cols(V, v0));
    tile::load(sD, ch.rows(a, a.U, V, v0), V, ch.n, tile_cols(V, v0));
    __syncthreads();
    L::template mma<false, true>(sY, sD, dp);
    __syncthreads();
  }
  float row_part[4] = {0, 0, 0, 0}, col_part[4] = {0, 0, 0, 0};
  dqk_dP<L>(dp, qk, s, row_part, col_part);  // B3: dP ⊙ E (masked); B8 (ii)
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) sdP[L::row(i) * kLd + L::col(j)] = dp.v[i][j];
  float kz = 0.0f, sd = 0.0f;  // B8 (iii) total and Σ h ⊙ dh for (iv), this thread's share
  for (int64_t k0 = 0; k0 < K; k0 += kN) {
    const int kc = tile_cols(K, k0);
    Acc dqs, dks, dws;  // dO h^T, Δ dS_C^T, dΔ h^T
    dqs.zero();
    dks.zero();
    dws.zero();
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
    dqk_store<L>(a, ch, s, k0, kc, gC, [&](int i, int j) { return sX[L::row(i) * kLd + L::col(j)]; },
                 [&](int i, int j) { return sZ[L::row(i) * kLd + L::col(j)]; }, dqs, dks, dws, dq2, dk2, row_part, kz);
    __syncthreads();
  }
  dqk_finish<L>(a, ch, s, gC, row_part, col_part, kz, sd);
}

// ---- steps the wy kernels share, on product layout PL (gdn_bwd_wy_kernel: Simt; gdn_bwd_wy_mma_kernel: Mma) ----

// B6, in place in dtv: d𝒯 = dU (diag(β) V)^T + dW (diag(β) K^d)^T from dtv = dΔ V^T and dtw = dW K^T, lower part.
template <typename PL, bool kComba>
__device__ __forceinline__ void wy_dT(Acc& dtv, const Acc& dtw, const Small& s) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = PL::row(i), c = PL::col(j);
      dtv.v[i][j] = c <= r ? s.beta[c] * (dtv.v[i][j] + expd(s.row_gam<kComba>(c)) * dtw.v[i][j]) : 0.0f;
    }
}

// In place in m (= M1 𝒯^T): dA (j < r) times E; its B7 dβ and B8 (vi) terms into the thread's partials (kk = X K^T).
template <typename PL, bool kComba>
__device__ __forceinline__ void wy_dae(Acc& m, const Acc& kk, const Small& s, const Chunk& ch, float (&db_part)[4],
                                       float (&row_x)[4], float (&col_part)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = PL::row(i), c = PL::col(j);
      const float dae = c < r && r < ch.n ? -m.v[i][j] * expd(s.row_gam<kComba>(r) - s.gam[c]) : 0.0f;
      m.v[i][j] = dae;
      db_part[i] += dae * kk.v[i][j];
      const float y = dae * s.beta[r] * kk.v[i][j];
      row_x[i] += y;
      col_part[j] -= y;
    }
}

// B7 for key tile k0 (kc columns): dX_r += β_r (dAE K)_r (xr); (dAE^T (β X))_j (yc) goes to dK (Comba) or to dX
// (GDN: x = k).
template <typename PL, bool kComba, typename L, typename E>
__device__ __forceinline__ void wy_b7_store(const GdnFast<L, E>& a, const Chunk& ch, const Small& s, int64_t k0, int kc,
                                            float* dx, const Acc& xr, const Acc& yc) {
  const int64_t K = a.K;
  float *dk = ch.in(a, a.dk, K, k0), *dxt = ch.in(a, dx, K, k0);
  Acc dxo, dko;
  load_acc<PL>(dxo, dxt, a.H * K, ch.n, kc);
  if (kComba) load_acc<PL>(dko, dk, a.H * K, ch.n, kc);
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
  store_acc<PL>(dxo, dxt, a.H * K, ch.n, kc, [](int, int, float x) { return x; });
  if (kComba) store_acc<PL>(dko, dk, a.H * K, ch.n, kc, [](int, int, float x) { return x; });
}

// The block's dβ (B7) and dg (B9) from the thread's partials: dΓ = their row and column terms plus the dΓ scratch
// (the dqk kernel's terms), dg_t = Σ_{r >= t in the chunk} dΓ_r (+ Comba: Σ_{r > t} dΓ^ex_r).
template <typename PL, bool kComba, typename L, typename E>
__device__ __forceinline__ void wy_finish(const GdnFast<L, E>& a, const Chunk& ch, const Small& s,
                                          const float (&db_part)[4], const float (&row_part)[4],
                                          const float (&col_part)[4], const float (&ex_part)[4]) {
  const float none[4] = {0, 0, 0, 0};
  tile::reduce_rows_cols<PL>(db_part, none, s.red, s.out1);
  tile::reduce_rows_cols<PL>(row_part, col_part, s.red, s.out2);
  if (kComba) tile::reduce_rows_cols<PL>(ex_part, none, s.red, s.out3);
  const int r = static_cast<int>(threadIdx.x);
  if (r < ch.n) {
    a.dbeta[ch.gate(a, r)] = s.out1[r];
    s.out2[r] += ch.rows(a, a.dgam, 1, 0)[r];
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // B9
    float acc = 0.0f, acc_ex = 0.0f;
    for (int i = ch.n - 1; i >= 0; --i) {
      acc += s.out2[i];
      a.dg[ch.gate(a, i)] = acc + acc_ex;
      if (kComba) acc_ex += s.out3[i];
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
    wy_b7_store<L, kComba>(a, ch, s, k0, kc, dx, xr, yc);
    __syncthreads();
  }
  wy_finish<L, kComba>(a, ch, s, db_part, row_part, col_part, ex_part);  // dβ; B9
}

// ---- backward phases on tile::Mma ----

// Shared memory of gdn_dv_local_mma_kernel for nkt key tiles: bf16 Q, K (all key tiles), P and dO.
constexpr size_t dv_local_mma_smem(int nkt) { return kSmallBytes + sizeof(bf16) * kTileHalves * (2 * nkt + 2); }

// B1 (intra-chunk part) for chunk blockIdx.x of pair bh0 + blockIdx.y, every value tile, as gdn_dv_local_kernel:
// P once (Q K^T summed over the key tiles in registers), then dΔ = P^T dO per value tile.
template <typename L, typename E>
__global__ void __launch_bounds__(tile::kThreads) gdn_dv_local_mma_kernel(GdnFast<L, E> a) {
  static_assert(std::is_same_v<typename L::Operand, bf16>, "bf16 scratch");
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  Small s(cv);
  const int64_t K = a.K, V = a.V;
  const int nkt = static_cast<int>((K + kN - 1) / kN);
  bf16 *hQ = cv.take<bf16>(kTileHalves * nkt), *hK = cv.take<bf16>(kTileHalves * nkt),
       *hP = cv.take<bf16>(kTileHalves), *hO = cv.take<bf16>(kTileHalves);
  const Chunk ch(a, blockIdx.x, a.bh0 + blockIdx.y);
  load_gates(a, ch, s.gam, s.beta, s.tmp);
  Acc acc;
  chunk_qk_mma(a, ch, nkt, hQ, hK, acc);
  tile::store_acc_h(acc, hP, [&](int r, int c, float x) { return c <= r ? expd(s.gam[r] - s.gam[c]) * x : 0.0f; });
  for (int64_t v0 = 0; v0 < V; v0 += kN) {
    const int vc = tile_cols(V, v0);
    tile::load_h(hO, ch.in(a, a.d_o, V, v0), a.H * V, ch.n, vc);
    __syncthreads();  // hP (first pass) and hO complete
    acc.zero();
    Mma::mma<true, false>(hP, hO, acc);
    store_acc<Mma>(acc, ch.rows(a, a.dD, V, v0), V, ch.n, vc, [](int, int, float x) { return x; });
    __syncthreads();  // hO is read
  }
}

// The most key tiles gdn_bwd_scan_mma_kernel carries (key_dim <= 256): its running dS lives in registers, an Acc
// (16 fp32) per thread and key tile; a larger key_dim runs the tile::Tc bwd_scan.
constexpr int kBwdScanMaxKt = 4;

// Whether gdn_bwd_scan_mma_kernel stages the chunk before's k and q in fp32 shared memory (cp.async; 32 KiB per
// key tile): key_dim <= 128. A larger key_dim loads them into registers, one key tile at a time.
__host__ __device__ constexpr bool bwd_scan_kq_staged(int nkt) { return nkt <= 2; }

// Shared memory of gdn_bwd_scan_mma_kernel for nkt key tiles: the bf16 copy of dS (the products' operand), the
// chunk's K^g and Q^g tiles, two buffers of its W tiles (bf16; the chunk before's land by cp.async while this
// one computes), dO and dΔ (bf16), the fp32 staging tiles of the chunk before's dO and (key_dim <= 128) k, q.
// 189 KiB at key_dim 128, 215 KiB at 256.
constexpr size_t bwd_scan_mma_smem(int nkt) {
  return kScanSmallBytes + sizeof(bf16) * kTileHalves * (5 * nkt + 2) +
         sizeof(float) * tile::kStageFloats * (1 + (bwd_scan_kq_staged(nkt) ? 2 * nkt : 0));
}

// B1 (state part) and B2 for value tile blockIdx.x of pair bh0 + blockIdx.y, chunks in reverse, as
// gdn_bwd_scan_kernel: stores dh[n] (bf16 of dS_C), dΔ += K^g dS_C (K^g dS summed over the key tiles in
// registers), then per key tile dS = e^{Γ_C} dS + (Q ⊙ e^Γ)^T dO - W^T dΔ, dS fp32 in registers (key tile kt at
// the thread's elements of the Mma map) and its bf16 copy in shared memory. key_dim <= 64 kBwdScanMaxKt
// (launcher). Loads run one chunk ahead where they can: the chunk before's W tiles (cp.async into the other W
// buffer, issued at the start of a chunk), its dO (cp.async into an fp32 staging tile, issued once this chunk's
// dO is converted), its dΔ and gates (registers); within a chunk k, q of key tile 0 are issued first thing
// (before the gates' scan) and those of tile kt + 1 before tile kt is converted (a chunk ahead, or two tiles
// ahead, they need more registers than there are: spills). Where W or dO is
// not 16-byte aligned (key_dim % 8 != 0, value_dim % 4 != 0) that operand is loaded synchronously (load_h)
// instead. Same arithmetic either way.
template <typename L, typename E>
__global__ void __launch_bounds__(tile::kThreads) gdn_bwd_scan_mma_kernel(GdnFast<L, E> a) {
  static_assert(std::is_same_v<typename L::Operand, bf16>, "bf16 scratch");
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  ScanSmall s(cv);
  const int64_t K = a.K, V = a.V, v0 = static_cast<int64_t>(blockIdx.x) * kN;
  const int bh = static_cast<int>(a.bh0) + static_cast<int>(blockIdx.y);
  const int vc = tile_cols(V, v0);
  const int nkt = static_cast<int>((K + kN - 1) / kN);
  bf16 *hS = cv.take<bf16>(kTileHalves * nkt), *hK = cv.take<bf16>(kTileHalves * nkt),
       *hQ = cv.take<bf16>(kTileHalves * nkt), *hW = cv.take<bf16>(2 * kTileHalves * nkt),
       *hO = cv.take<bf16>(kTileHalves), *hE = cv.take<bf16>(kTileHalves);
  float* gO = cv.take<float>(tile::kStageFloats);
  float* gKQ = bwd_scan_kq_staged(nkt) ? cv.take<float>(2 * nkt * tile::kStageFloats) : nullptr;  // k, q per tile
  const bool w_async = tile::async_ok_h(a.W, K);
  // (Every row of dO, k, q starts a multiple of V or K elements after the tensor's start.)
  const bool o_async = tile::async_ok_f(a.d_o, V);
  const bool kq_async = bwd_scan_kq_staged(nkt) && tile::async_ok_f(a.k, K) && tile::async_ok_f(a.q, K);
  // The W tiles of chunk c into W buffer c % 2 (cp.async).
  const auto issue_w = [&](int64_t c) {
    const Chunk nx(a, c, bh);
    bf16* dst = hW + (c & 1) * nkt * kTileHalves;
    for (int kt = 0; kt < nkt; ++kt)
      tile::load_h_async(dst + kt * kTileHalves, nx.rows(a, a.W, K, kt * kN), K, nx.n, tile_cols(K, kt * kN));
  };
  // The dO tile of chunk c into the staging tile (cp.async).
  const auto issue_o = [&](int64_t c) {
    const Chunk nx(a, c, bh);
    tile::stage_async(gO, nx.in(a, a.d_o, V, v0), a.H * V, nx.n, vc);
  };
  // k and q of all key tiles of chunk c into their staging tiles (cp.async).
  const auto issue_kq = [&](int64_t c) {
    const Chunk nx(a, c, bh);
    for (int kt = 0; kt < nkt; ++kt) {
      const int kc = tile_cols(K, kt * kN);
      tile::stage_async(gKQ + 2 * kt * tile::kStageFloats, nx.in(a, a.k, K, kt * kN), a.H * K, nx.n, kc);
      tile::stage_async(gKQ + (2 * kt + 1) * tile::kStageFloats, nx.in(a, a.q, K, kt * kN), a.H * K, nx.n, kc);
    }
  };
  // Else k and q of key tile kt of chunk c into x[0], x[1] (registers; put_h converts them).
  using KQ = float[2][tile::kHPer][2];
  KQ kq;
  const auto fetch_kq = [&](KQ& x, const Chunk& c, int kt) {
    const int kc = tile_cols(K, kt * kN);
    tile::fetch_h(x[0], c.in(a, a.k, K, kt * kN), a.H * K, c.n, kc);
    tile::fetch_h(x[1], c.in(a, a.q, K, kt * kN), a.H * K, c.n, kc);
  };
  // The chunk before's dΔ and gates, in flight in registers until that chunk uses them.
  Acc dd;
  float g0 = 0.0f, g1 = 0.0f;  // (warp 0: gate pairs)
  const auto fetch_next = [&](int64_t c) {
    const Chunk nx(a, c, bh);
    load_acc<Mma>(dd, nx.rows(a, a.dD, V, v0), V, nx.n, vc);
    fetch_gate_pair(a, nx, g0, g1);
  };
  Acc dS[kBwdScanMaxKt];  // tiles >= nkt unused
#pragma unroll
  for (int kt = 0; kt < kBwdScanMaxKt; ++kt) dS[kt].zero();
  tile::clear_h(hS, nkt);
  if (w_async) issue_w(a.NC - 1);
  if (o_async) issue_o(a.NC - 1);
  if (kq_async) issue_kq(a.NC - 1);
  tile::cp_async_commit();
  fetch_next(a.NC - 1);
  for (int64_t chunk = a.NC - 1; chunk >= 0; --chunk) {
    const Chunk ch(a, chunk, bh);
    if (chunk > 1) prefetch_chunk(a, Chunk(a, chunk - 2, bh), v0, vc, true);
    if (!kq_async) fetch_kq(kq, ch, 0);  // (in flight during the gates' scan; the other key tiles one by one below)
    scan_gate_pair(g0, g1, s.gam);  // (its barrier also orders the last update before what follows)
    // The other W buffer was last read by the chunk after's B2, before the barrier above.
    if (w_async && chunk > 0) issue_w(chunk - 1);
    tile::cp_async_commit();  // (possibly empty: groups W(c - 1) here and dO(c - 1) below, per chunk)
    const double gC = s.gam[ch.n - 1];
    const float aC = expd(gC);
    bf16* hWc = hW + (chunk & 1) * nkt * kTileHalves;
    // K^g, Q^g (and W where synchronous) of key tile kt from the registers x.
    const auto put_kq = [&](const KQ& x, int kt) {
      const int kc = tile_cols(K, kt * kN);
      tile::store_h(hS + kt * kTileHalves, ch.state(a, a.dh, kt * kN, v0), V, kc, vc);  // dh[n] = bf16(dS_C)
      tile::put_h(hK + kt * kTileHalves, x[0], ch.n, [&](int r) { return expd(gC - s.gam[r]); });
      tile::put_h(hQ + kt * kTileHalves, x[1], ch.n, [&](int r) { return expd(s.gam[r]); });
      if (!w_async) tile::load_h(hWc + kt * kTileHalves, ch.rows(a, a.W, K, kt * kN), K, ch.n, kc);
    };
    tile::cp_async_wait<1>();  // this chunk's W, dO, k, q (all but the group just committed)
    if (kq_async) {
      for (int kt = 0; kt < nkt; ++kt) {  // from the thread's own staged pieces (its wait suffices)
        const int kc = tile_cols(K, kt * kN);
        tile::store_h(hS + kt * kTileHalves, ch.state(a, a.dh, kt * kN, v0), V, kc, vc);  // dh[n] = bf16(dS_C)
        tile::put_h_staged(hK + kt * kTileHalves, gKQ + 2 * kt * tile::kStageFloats, ch.n,
                           [&](int r) { return expd(gC - s.gam[r]); });
        tile::put_h_staged(hQ + kt * kTileHalves, gKQ + (2 * kt + 1) * tile::kStageFloats, ch.n,
                           [&](int r) { return expd(s.gam[r]); });
        if (!w_async) tile::load_h(hWc + kt * kTileHalves, ch.rows(a, a.W, K, kt * kN), K, ch.n, kc);
      }
    } else {
      for (int kt = 0; kt < nkt; ++kt) {
        if (kt > 0) fetch_kq(kq, ch, kt);
        put_kq(kq, kt);
      }
    }
    if (o_async)
      tile::put_h_staged(hO, gO, ch.n);  // the thread's own pieces (its wait suffices)
    else
      tile::load_h(hO, ch.in(a, a.d_o, V, v0), a.H * V, ch.n, vc);
    float* dD = ch.rows(a, a.dD, V, v0);
    Acc d = dd;
    if (chunk > 0) fetch_next(chunk - 1);  // in flight until the chunk before
    __syncthreads();
    Acc acc;
    acc.zero();
    for (int kt = 0; kt < nkt; ++kt) Mma::mma<false, false>(hK + kt * kTileHalves, hS + kt * kTileHalves, acc);
    tile::delta_out<true>(d, acc, dD, V, ch.n, vc, hE);  // B1: dΔ = P^T dO + K^g dS_C (0 outside the chunk)
    __syncthreads();  // hE complete; every read of hS (K^g dS) and of the staging tile done
    if (o_async && chunk > 0) issue_o(chunk - 1);
    if (kq_async && chunk > 0) issue_kq(chunk - 1);
    tile::cp_async_commit();
#pragma unroll
    for (int kt = 0; kt < kBwdScanMaxKt; ++kt) {  // B2 (unrolled: dS[kt] stays in registers)
      if (kt >= nkt) break;
      Acc qd, wd;
      qd.zero();
      wd.zero();
      Mma::mma<true, false>(hQ + kt * kTileHalves, hO, qd);
      Mma::mma<true, false>(hWc + kt * kTileHalves, hE, wd);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) dS[kt].v[i][j] = aC * dS[kt].v[i][j] + qd.v[i][j] - wd.v[i][j];
      tile::store_acc_h(dS[kt], hS + kt * kTileHalves, tile::Same{});
    }
  }
  tile::cp_async_wait<0>();
}

// Shared memory of gdn_bwd_dqk_mma_kernel for nkt key tiles: bf16 Q, K (all key tiles), dP and the five
// operand tiles of one (key tile, value tile) step (dO, h, Δ, dh, dΔ), plus (dbl) a second set of the bf16
// scratch tiles h, Δ, dh, filled by cp.async during the step before, plus (stg) two fp32 staging tiles for the
// dO and dΔ of the next step (cp.async, 16 KiB each).
__host__ __device__ constexpr size_t dqk_mma_smem(int nkt, bool dbl, bool stg) {
  return kSmallBytes + sizeof(bf16) * kTileHalves * (2 * nkt + 6 + (dbl ? 3 : 0)) +
         (stg ? 2 * sizeof(float) * tile::kStageFloats : 0);
}
// Whether the second set fits: 227 KiB a block, less 1 KiB for the kernel's static shared memory (block_reduce).
__host__ __device__ constexpr bool dqk_mma_double(int nkt) {
  return dqk_mma_smem(nkt, true, false) + 1024 <= 227 * 1024;
}
// Whether the dO, dΔ staging tiles fit as well (key_dim <= 320: 213 KiB at 5 key tiles; else dO, dΔ by load_h).
__host__ __device__ constexpr bool dqk_mma_staged(int nkt) {
  return dqk_mma_double(nkt) && dqk_mma_smem(nkt, true, true) + 1024 <= 227 * 1024;
}
__host__ __device__ constexpr size_t dqk_mma_smem(int nkt) {
  return dqk_mma_smem(nkt, dqk_mma_double(nkt), dqk_mma_staged(nkt));
}
static_assert(dqk_mma_staged(2) && dqk_mma_staged(4) && dqk_mma_staged(5) && !dqk_mma_staged(6), "dqk staging");
static_assert(dqk_mma_double(7) && !dqk_mma_double(8), "dqk second set");

// B3, B4 (P and state parts of dK), dW = -dΔ h^T and dΓ terms (i)–(iv) of B8, for chunk blockIdx.x of pair
// bh0 + blockIdx.y, as gdn_bwd_dqk_kernel: the same products on bf16 tiles with register accumulators (Q K^T over
// the key tiles, dO Δ^T over the value tiles, dO h^T, Δ dh^T, dΔ h^T over the value tiles); the element-wise
// terms read q, k in fp32 (from global memory, at the thread's elements) and h, dh as stored (bf16).
// Load order: g, β are fetched before the q, k tiles of Q K^T (their loads overlap); dO Δ^T is summed during key
// tile 0's (key tile, value tile) steps from the dO and Δ tiles those steps bring in for dO h^T and Δ dh^T (no
// loads of its own; dP is formed after that key tile's steps, before its first use); a key tile's fp32 q, k are
// loaded at the start of its steps, so that their latency is hidden behind them.
template <typename L, typename E>
__global__ void __launch_bounds__(tile::kThreads) gdn_bwd_dqk_mma_kernel(GdnFast<L, E> a) {
  static_assert(std::is_same_v<typename L::Operand, bf16>, "bf16 scratch");
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  Small s(cv);
  const int64_t K = a.K, V = a.V;
  const int nkt = static_cast<int>((K + kN - 1) / kN);
  const bool dbl = dqk_mma_double(nkt);
  bf16 *hQ = cv.take<bf16>(kTileHalves * nkt), *hK = cv.take<bf16>(kTileHalves * nkt),
       *hdP = cv.take<bf16>(kTileHalves), *hO = cv.take<bf16>(kTileHalves), *hE = cv.take<bf16>(kTileHalves);
  // h, Δ, dh of a (key tile, value tile) step: set step % 2 (3 tiles each, set 1 after set 0) when dbl, else set 0.
  bf16* hHDG = cv.take<bf16>((dbl ? 6 : 3) * kTileHalves);
  // dO, dΔ (fp32) of a step, staged by cp.async during the step before (where dqk_mma_staged).
  float* gOE = dqk_mma_staged(nkt) ? cv.take<float>(2 * tile::kStageFloats) : nullptr;
  const Chunk ch(a, blockIdx.x, a.bh0 + blockIdx.y);
  const int nvt = static_cast<int>((V + kN - 1) / kN), nsteps = nkt * nvt;
  // cp.async of the bf16 scratch tiles h, Δ, dh when every tile start is 16-byte aligned, else load_h in the step.
  const bool async = dbl && tile::async_ok_h(a.h, V) && tile::async_ok_h(a.U, V) && tile::async_ok_h(a.dh, V);
  // With them, dO and dΔ (fp32) by cp.async where the staging tiles fit and every row is 16-byte aligned.
  const bool staged = async && dqk_mma_staged(nkt) && tile::async_ok_f(a.d_o, V) && tile::async_ok_f(a.dD, V);
  auto issue = [&](int step, bf16* t) {  // h, Δ, dh of step (key tile step / nvt, value tile step % nvt) into t
    const int64_t k0 = (step / nvt) * kN, v0 = (step % nvt) * kN;
    const int kc = tile_cols(K, k0), vc = tile_cols(V, v0);
    tile::load_h_async(t, ch.state(a, a.h, k0, v0), V, kc, vc);
    tile::load_h_async(t + kTileHalves, ch.rows(a, a.U, V, v0), V, ch.n, vc);
    tile::load_h_async(t + 2 * kTileHalves, ch.state(a, a.dh, k0, v0), V, kc, vc);
    if (staged) {  // dO, dΔ of step into the staging tiles (same group)
      tile::stage_async(gOE, ch.in(a, a.d_o, V, v0), a.H * V, ch.n, vc);
      tile::stage_async(gOE + tile::kStageFloats, ch.rows(a, a.dD, V, v0), V, ch.n, vc);
    }
    tile::cp_async_commit();
  };
  if (async) issue(0, hHDG);  // lands during Q K^T (which uses other tiles)
  float g_r = 0.0f, b_r = 0.0f;
  fetch_gates(a, ch, g_r, b_r);  // in flight with the q, k loads of Q K^T
  Acc qk, dp;
  chunk_qk_mma(a, ch, nkt, hQ, hK, qk);
  scan_gates(g_r, b_r, s.gam, s.beta, s.tmp);
  const double gC = s.gam[ch.n - 1];
  dp.zero();  // dO Δ^T, summed over the value tiles as key tile 0's steps bring dO and Δ in (hO, hD)
  float row_part[4] = {0, 0, 0, 0}, col_part[4] = {0, 0, 0, 0};
  float kz = 0.0f, sd = 0.0f;  // B8 (iii) total and Σ h ⊙ dh for (iv), this thread's share
  for (int kt = 0; kt < nkt; ++kt) {
    const int64_t k0 = kt * kN;
    const int kc = tile_cols(K, k0);
    Acc xq, xk;  // q, k (fp32) at the thread's elements for dqk_store: in flight during the key tile's steps
    load_acc<Mma>(xq, ch.in(a, a.q, K, k0), a.H * K, ch.n, kc);
    load_acc<Mma>(xk, ch.in(a, a.k, K, k0), a.H * K, ch.n, kc);
    Acc dqs, dks, dws;  // dO h^T, Δ dS_C^T, dΔ h^T (tile::state_products, the next step's h, Δ, dh in flight)
    dqs.zero();
    dks.zero();
    dws.zero();
    for (int vt = 0; vt < nvt; ++vt) {
      const int step = kt * nvt + vt;
      const int64_t v0 = vt * kN;
      const int vc = tile_cols(V, v0);
      bf16* t = hHDG + (dbl && (step & 1) ? 3 * kTileHalves : 0);
      bf16 *hH = t, *hD = t + kTileHalves, *hG = t + 2 * kTileHalves;
      const bool more = step + 1 < nsteps;
      if (staged) {
        tile::cp_async_wait<0>();  // this step's group (the only one in flight)
        tile::put_h_staged(hO, gOE, ch.n);  // the thread's own pieces (its wait suffices)
        tile::put_h_staged(hE, gOE + tile::kStageFloats, ch.n);
        __syncthreads();  // every read of the staging tiles done: the next step's copies may land
        if (more) issue(step + 1, hHDG + ((step + 1) & 1 ? 3 * kTileHalves : 0));
      } else {
        if (async && more) issue(step + 1, hHDG + ((step + 1) & 1 ? 3 * kTileHalves : 0));  // that set's last reads: before the last barrier
        tile::load_h(hO, ch.in(a, a.d_o, V, v0), a.H * V, ch.n, vc);
        tile::load_h(hE, ch.rows(a, a.dD, V, v0), V, ch.n, vc);
        if (!async) {
          tile::load_h(hH, ch.state(a, a.h, k0, v0), V, kc, vc);
          tile::load_h(hD, ch.rows(a, a.U, V, v0), V, ch.n, vc);
          tile::load_h(hG, ch.state(a, a.dh, k0, v0), V, kc, vc);
        } else if (more) {
          tile::cp_async_wait<1>();  // this step's group (the next one's still in flight)
        } else {
          tile::cp_async_wait<0>();
        }
        __syncthreads();
      }
      Mma::mma<false, true>(hO, hH, dqs);
      Mma::mma<false, true>(hD, hG, dks);
      Mma::mma<false, true>(hE, hH, dws);
      if (kt == 0) Mma::mma<false, true>(hO, hD, dp);  // dO Δ^T, value tile vt
      for (int idx = threadIdx.x; idx < kN * kN; idx += tile::kThreads) {
        const int r = idx >> 6, c = idx & 63;
        sd += __bfloat162float(hH[r * kLdH + c]) * __bfloat162float(hG[r * kLdH + c]);
      }
      __syncthreads();
    }
    if (kt == 0) {
      dqk_dP<Mma>(dp, qk, s, row_part, col_part);  // B3: dP ⊙ E (masked); B8 (ii)
      tile::store_acc_h(dp, hdP, tile::Same{});
      __syncthreads();  // hdP complete
    }
    Acc dq2, dk2;  // dP K, dP^T Q
    dq2.zero();
    dk2.zero();
    Mma::mma<false, false>(hdP, hK + kt * kTileHalves, dq2);
    Mma::mma<true, false>(hdP, hQ + kt * kTileHalves, dk2);
    dqk_store<Mma>(a, ch, s, k0, kc, gC, [&](int i, int j) { return xq.v[i][j]; },
                   [&](int i, int j) { return xk.v[i][j]; }, dqs, dks, dws, dq2, dk2, row_part, kz);
  }
  dqk_finish<Mma>(a, ch, s, gC, row_part, col_part, kz, sd);
}

// Shared memory of gdn_bwd_wy_mma_kernel: bf16 𝒯, d𝒯 (then dA ⊙ E), M1 and three operand tiles, and three fp32
// staging tiles for cp.async (16 KiB each; see the kernel): 112 KiB, so that two blocks still fit an SM.
constexpr size_t kWyMmaSmem = kSmallBytes + 6 * sizeof(bf16) * kTileHalves + 3 * sizeof(float) * tile::kStageFloats;
static_assert(2 * (kWyMmaSmem + 1024) <= 228 * 1024, "two wy blocks an SM (1 KiB of each block is the system's)");

// B5–B7, B8 (v)–(vi) and B9 for chunk blockIdx.x of pair bh0 + blockIdx.y, as gdn_bwd_wy_kernel: the same products on
// bf16 tiles (𝒯 rounded once) with register accumulators; the element-wise terms read v, x in fp32 at the
// thread's elements (as the fp32 tiles held them). At most 128 registers: two blocks an SM (16 warps to hide its
// loads' latency; ptxas spills some bytes a thread to fit).
// Steps, each bringing in its operand tiles: B5 U side (step s < nvt: value tile s; dΔ, v), B5 W side (nvt + kt:
// key tile kt; dW, x), X K^T (nvt + nkt + kt; x, and k for Comba: after B5, so that its sum is not held in
// registers through B5), B7 (nvt + 2 nkt + kt; k, x). Where every row is 16-byte aligned, the operands come by
// cp.async, issued during the step before (the first step's, and 𝒯, at the start): dΔ and k into the staging tile
// gS, v / x into gX(s) (two, alternating: the U and W steps read them at other threads' elements as well as
// converting their own pieces), dW (bf16) straight into hdT / hM (free until B6), alternating. Otherwise each step
// loads its operands (load_h, load_acc). The same bits either way.
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
  const int w0 = nvt, x0 = nvt + nkt, b0 = nvt + 2 * nkt, nsteps = nvt + 3 * nkt;  // first W, X K^T, B7 step
  const E* x = kComba ? a.p : a.k;
  float* dx = kComba ? a.dp : a.dk;
  const bool staged = tile::async_ok_f(a.Tm, kN) && tile::async_ok_f(a.dD, V) && tile::async_ok_f(a.v, V) &&
                      tile::async_ok_f(x, K) && tile::async_ok_f(a.k, K) && tile::async_ok_h(a.dW, K);
  const auto issue = [&](int step) {  // step's operands (see above), one group
    const bool u = step < w0, w = !u && step < x0;
    const int64_t c0 = (u ? step : step - (w ? w0 : step < b0 ? x0 : b0)) * kN;  // first value / key column
    const int cols = tile_cols(u ? V : K, c0);
    tile::stage_async(gX(step), u ? ch.in(a, a.v, V, c0) : ch.in(a, x, K, c0), a.H * (u ? V : K), ch.n, cols);
    if (w)
      tile::load_h_async(hW(step), ch.rows(a, a.dW, K, c0), K, ch.n, cols);
    else if (u || kComba || step >= b0)
      tile::stage_async(gS, u ? ch.rows(a, a.dD, V, c0) : ch.in(a, a.k, K, c0), u ? V : a.H * K, ch.n, cols);
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
    tile::stage_async(gX(1), ch.square(a, a.Tm), kN, kN, kN);  // 𝒯 (converted at step 0, before gX(1) is reused)
    issue(0);
  }
  load_gates(a, ch, s.gam, s.beta, s.tmp);
  if (!staged) tile::load_h(hT, ch.square(a, a.Tm), kN, kN, kN);
  // Row partials of dβ, dΓ (rows and columns) and dΓ^ex (Comba; GDN adds its row terms to dΓ).
  float db_part[4] = {0, 0, 0, 0}, row_part[4] = {0, 0, 0, 0}, col_part[4] = {0, 0, 0, 0};
  float ex_part[4] = {0, 0, 0, 0};
  float(&row_x)[4] = kComba ? ex_part : row_part;
  Acc dtv, dtw;  // dΔ V^T, dW K^T (column factors applied below)
  dtv.zero();
  dtw.zero();
  // B5, U side: X_U = 𝒯^T dΔ, dV = β X_U
  tile::wy_u_side(a, ch, s.beta, hT, hZ, hY, dtv, db_part, [&](int64_t v0, int vc, Acc& vv) {
    const int vt = static_cast<int>(v0 / kN);
    if (staged) {
      staged_step(vt, [&] {
        if (vt == 0) tile::put_h_staged(hT, gX(1), kN);
        tile::put_h_staged(hZ, gS, ch.n);
        tile::put_h_staged(hY, gX(vt), ch.n);
      });
      load_acc<Mma>(vv, gX(vt), kN, ch.n, vc);
    } else {
      tile::load_h(hZ, ch.rows(a, a.dD, V, v0), V, ch.n, vc);
      tile::load_h(hY, ch.in(a, a.v, V, v0), a.H * V, ch.n, vc);
      load_acc<Mma>(vv, ch.in(a, a.v, V, v0), a.H * V, ch.n, vc);
      __syncthreads();
    }
  });
  for (int kt = 0; kt < nkt; ++kt) {  // B5, W side: X_W = 𝒯^T dW, dX (+)= β X_W ⊙ e^Γ; B8 (v)
    const int64_t k0 = kt * kN;
    const int kc = tile_cols(K, k0), step = w0 + kt;
    bf16* hD = staged ? hW(step) : hZ;  // dW
    Acc xv;
    if (staged) {
      staged_step(step, [&] { tile::put_h_staged(hX, gX(step), ch.n); });
      load_acc<Mma>(xv, gX(step), kN, ch.n, kc);
    } else {
      tile::load_h(hZ, ch.rows(a, a.dW, K, k0), K, ch.n, kc);
      tile::load_h(hX, ch.in(a, x, K, k0), a.H * K, ch.n, kc);
      load_acc<Mma>(xv, ch.in(a, x, K, k0), a.H * K, ch.n, kc);
      __syncthreads();
    }
    Acc xw;
    xw.zero();
    Mma::mma<true, false>(hT, hD, xw);
    Mma::mma<false, true>(hD, hX, dtw);
    float* dxt = ch.in(a, dx, K, k0);
    Acc d;  // dK so far (GDN); Comba writes dP̂ here first
    if (kComba)
      d.zero();
    else
      load_acc<Mma>(d, dxt, a.H * K, ch.n, kc);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int r = Mma::row(i);
        const float eg = expd(s.row_gam<kComba>(r)), xk = xw.v[i][j] * xv.v[i][j] * eg;
        db_part[i] += xk;
        row_x[i] += s.beta[r] * xk;
        d.v[i][j] += s.beta[r] * eg * xw.v[i][j];
      }
    store_acc<Mma>(d, dxt, a.H * K, ch.n, kc, [](int, int, float x) { return x; });
    __syncthreads();
  }
  Acc kk;  // X K^T (GDN: x = k, one tile for both operands)
  kk.zero();
  for (int kt = 0; kt < nkt; ++kt) {
    const int64_t k0 = kt * kN;
    const int kc = tile_cols(K, k0);
    if (staged) {
      staged_step(x0 + kt, [&] {
        tile::put_h_staged(hX, gX(x0 + kt), ch.n);
        if (kComba) tile::put_h_staged(hY, gS, ch.n);
      });
    } else {
      tile::load_h(hX, ch.in(a, x, K, k0), a.H * K, ch.n, kc);
      if (kComba) tile::load_h(hY, ch.in(a, a.k, K, k0), a.H * K, ch.n, kc);
      __syncthreads();
    }
    Mma::mma<false, true>(hX, kComba ? hY : hX, kk);
    __syncthreads();
  }
  wy_dT<Mma, kComba>(dtv, dtw, s);  // B6
  Acc m;
  tile::wy_m1(dtv, hT, hdT, hM, m);  // M1 𝒯^T, M1 = 𝒯^T d𝒯
  wy_dae<Mma, kComba>(m, kk, s, ch, db_part, row_x, col_part);  // dA (j < r) times E, into hdT; B7 dβ; B8 (vi)
  tile::store_acc_h(m, hdT, [](int, int, float x) { return x; });
  for (int kt = 0; kt < nkt; ++kt) {  // B7: dX_r += β_r Σ_j dAE_rj k_j; dK_j += Σ_r dAE_rj β_r x_r
    const int64_t k0 = kt * kN;
    const int kc = tile_cols(K, k0);
    const auto by_beta = [&](int r) { return s.beta[r]; };
    if (staged) {  // (the barrier: hdT too, on the first pass)
      staged_step(b0 + kt, [&] {
        tile::put_h_staged(hX, gS, ch.n);
        tile::put_h_staged(hZ, gX(b0 + kt), ch.n, by_beta);
      });
    } else {
      tile::load_h(hX, ch.in(a, a.k, K, k0), a.H * K, ch.n, kc);
      tile::load_h(hZ, ch.in(a, x, K, k0), a.H * K, ch.n, kc, by_beta);
      __syncthreads();  // (the first pass: hdT too)
    }
    Acc xr, yc;
    xr.zero();
    yc.zero();
    Mma::mma<false, false>(hdT, hX, xr);
    Mma::mma<true, false>(hdT, hZ, yc);
    wy_b7_store<Mma, kComba>(a, ch, s, k0, kc, dx, xr, yc);
    __syncthreads();
  }
  wy_finish<Mma, kComba>(a, ch, s, db_part, row_part, col_part, ex_part);  // dβ; B9
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

/// The arguments of a core call over every pair, its scratch carved (GdnScratch). a.Tm: tinv where given (the caller's
/// [B H, chunks, 64, 64] 𝒯: the forward stores it there, the backward reads it), else the backward's scratch 𝒯 (the
/// forward's is null: 𝒯 not kept).
template <typename L, typename E>
GdnFast<L, E> make_args(const E* q, const E* k, const E* v, const E* p, const float* g, const float* beta, int64_t B,
                        int64_t T, int64_t H, int64_t K, int64_t V, int64_t C, void* scratch, bool backward,
                        float* tinv) {
  using S = typename L::Operand;
  GdnFast<L, E> a{};
  a.q = q, a.k = k, a.v = v, a.p = p, a.g = g, a.beta = beta;
  a.B = B, a.T = T, a.H = H, a.K = K, a.V = V, a.C = C, a.NC = ceil_div(T, C), a.bh0 = 0, a.nbh = B * H;
  const GdnScratch l(B, T, H, K, V, C, backward, sizeof(S), tinv != nullptr);
  float* base = static_cast<float*>(scratch);
  const auto stored = [&](int64_t at) { return reinterpret_cast<S*>(base + at); };
  a.W = stored(l.W), a.U = stored(l.U), a.h = stored(l.h);
  a.Tm = tinv != nullptr ? tinv : backward ? base + l.Tm : nullptr;
  if (backward) a.dD = base + l.dD, a.dh = stored(l.dh), a.dW = stored(l.dW), a.dgam = base + l.dgam;
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

// The backward's wu from the 𝒯 its forward stored (a.Tm): W, U of every chunk of a's pairs (F3 only).
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

// The forward scan: W, U -> Δ, h (F4, F7). bf16: the Mma scan needs scan_mma_smem (~52 KiB of shared memory per key
// tile, ~68 KiB with the k staging of key_dim <= 192: 154.5 KiB at key_dim 128, 226.5 at 256) and runs up to
// key_dim 256 (kScanMaxKt); a larger key_dim runs the tile::Tc scan (same scratch formats).
template <typename L, typename E>
Scan<L, E> fwd_scan(const GdnFast<L, E>& a) {
  const int nkt = static_cast<int>(ceil_div(a.K, kN));
  if constexpr (kBf16<typename L::Operand>) {
    if (nkt <= kScanMaxKt && scan_mma_smem(nkt) <= kMaxBlockSmem)
      return {gdn_scan_mma_kernel<L, E>, scan_mma_smem(nkt)};
  }
  return {gdn_scan_kernel<L, E>, smem_for(2 + nkt)};
}

// The backward scan: dh, dΔ += K^g dS_C (B1 state part, B2). bf16: the Mma bwd_scan keeps dS in registers for up to
// kBwdScanMaxKt key tiles (key_dim <= 256); a larger key_dim runs the tile::Tc one.
template <typename L, typename E>
Scan<L, E> bwd_scan(const GdnFast<L, E>& a) {
  const int nkt = static_cast<int>(ceil_div(a.K, kN));
  if constexpr (kBf16<typename L::Operand>) {
    if (nkt <= kBwdScanMaxKt) return {gdn_bwd_scan_mma_kernel<L, E>, bwd_scan_mma_smem(nkt)};
  }
  return {gdn_bwd_scan_kernel<L, E>, smem_for(4 + nkt)};
}

// Forward (F1–F7): o [B, T, H, V]; 𝒯 into tinv where given. wu over every pair, then per group of pairs (by_waves:
// two groups on two streams where the scan's value-tile blocks span more than one wave of the GPU but not a whole
// number of waves) the scan and out.
template <bool kComba, typename P, typename E>
void core_fwd(const E* q, const E* k, const E* v, const E* p, const float* g, const float* beta, int64_t batch,
              int64_t seq_len, int64_t heads, int64_t key_dim, int64_t value_dim, int64_t chunk_size, float* o,
              float* tinv, void* scratch, cudaStream_t stream) {
  using L = Layout<P>;
  check_chunk(chunk_size);
  if (batch * heads == 0 || seq_len == 0 || value_dim == 0) return;
  GdnFast<L, E> a =
      make_args<L>(q, k, v, p, g, beta, batch, seq_len, heads, key_dim, value_dim, chunk_size, scratch, false, tinv);
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

// Backward (B1–B9): gradients overwritten (dp: Comba only). wu over every pair (from the forward's 𝒯 in tinv where
// given: W, U only; else forming 𝒯 again, kept in scratch), then per group of pairs (by_waves, as the forward) the
// forward scan (h, Δ), dv_local (dΔ's intra-chunk part), the backward scan (reads W and dΔ, not h or Δ; completes
// dΔ, stores dh), dqk (reads h, Δ, dh, dΔ; stores dW) and wy (reads 𝒯, dΔ, dW).
// The groups follow the smaller of the two scans' waves (the one with fewer blocks per SM: a partial last wave
// leaves SMs idle for a whole scan there): the backward scan's at every shape today (one block per SM; the
// forward scan takes two at key_dim <= 64 with bf16), which is also the longer of the two.
template <bool kComba, typename P, typename E>
void core_bwd(const E* q, const E* k, const E* v, const E* p, const float* g, const float* beta, const float* d_o,
              const float* tinv, int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim, int64_t value_dim,
              int64_t chunk_size, float* dq, float* dk, float* dv, float* dp, float* dg, float* dbeta, void* scratch,
              cudaStream_t stream) {
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
                                  true, const_cast<float*>(tinv));  // only read here
  a.d_o = d_o;
  a.dq = dq, a.dk = dk, a.dv = dv, a.dp = dp, a.dg = dg, a.dbeta = dbeta;
  if (tinv != nullptr)
    run_wu_saved<kComba>(a, stream);
  else
    run_wu<kComba>(a, stream);
  const Scan<L, E> scan = fwd_scan(a), bscan = bwd_scan(a);
  const int nkt = static_cast<int>(ceil_div(key_dim, kN));
  by_waves(a, std::min(scan.wave(value_dim), bscan.wave(value_dim)), stream,
           [&](const GdnFast<L, E>& grp, cudaStream_t s) {
             scan.run(grp, s);
             if constexpr (kBf16<P>) {
               launch(gdn_dv_local_mma_kernel<L, E>, grp.NC, dv_local_mma_smem(nkt), s, grp);
               bscan.run(grp, s);
               launch(gdn_bwd_dqk_mma_kernel<L, E>, grp.NC, dqk_mma_smem(nkt), s, grp);
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

int64_t gdn_tinv_floats(int64_t batch, int64_t seq_len, int64_t heads, int64_t chunk_size) {
  check_chunk(chunk_size);
  return batch * heads * ceil_div(seq_len, chunk_size) * kN * kN;
}

template <typename P>
size_t gdn_chunk_fwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim,
                                   int64_t value_dim, int64_t chunk_size) {
  const GdnScratch l(batch, seq_len, heads, key_dim, value_dim, chunk_size, false, sizeof(P), false);
  return sizeof(float) * static_cast<size_t>(l.total);
}

template <typename P>
size_t gdn_chunk_bwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim,
                                   int64_t value_dim, int64_t chunk_size, bool saved_tinv) {
  const GdnScratch l(batch, seq_len, heads, key_dim, value_dim, chunk_size, true, sizeof(P), saved_tinv);
  return sizeof(float) * static_cast<size_t>(l.total);
}

template <typename P>
size_t comba_chunk_fwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim,
                                     int64_t value_dim, int64_t chunk_size) {
  return gdn_chunk_fwd_scratch_bytes<P>(batch, seq_len, heads, key_dim, value_dim, chunk_size);
}

template <typename P>
size_t comba_chunk_bwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim,
                                     int64_t value_dim, int64_t chunk_size, bool saved_tinv) {
  return gdn_chunk_bwd_scratch_bytes<P>(batch, seq_len, heads, key_dim, value_dim, chunk_size, saved_tinv);
}

template <typename P>
void gdn_chunk_fwd(const float* q, const float* k, const float* v, const float* g, const float* beta, int64_t batch,
                   int64_t seq_len, int64_t heads, int64_t key_dim, int64_t value_dim, int64_t chunk_size, float* o,
                   float* tinv, void* scratch, cudaStream_t stream) {
  core_fwd<false, P, float>(q, k, v, nullptr, g, beta, batch, seq_len, heads, key_dim, value_dim, chunk_size, o,
                            tinv, scratch, stream);
}

template <typename P>
void gdn_chunk_bwd(const float* q, const float* k, const float* v, const float* g, const float* beta,
                   const float* d_o, const float* tinv, int64_t batch, int64_t seq_len, int64_t heads,
                   int64_t key_dim, int64_t value_dim, int64_t chunk_size, float* dq, float* dk, float* dv, float* dg,
                   float* dbeta, void* scratch, cudaStream_t stream) {
  core_bwd<false, P, float>(q, k, v, nullptr, g, beta, d_o, tinv, batch, seq_len, heads, key_dim, value_dim,
                            chunk_size, dq, dk, dv, nullptr, dg, dbeta, scratch, stream);
}

template <typename P>
void comba_chunk_fwd(const float* q, const float* k, const float* v, const float* p, const float* g,
                     const float* beta, int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim,
                     int64_t value_dim, int64_t chunk_size, float* o, float* tinv, void* scratch,
                     cudaStream_t stream) {
  core_fwd<true, P, float>(q, k, v, p, g, beta, batch, seq_len, heads, key_dim, value_dim, chunk_size, o, tinv,
                           scratch, stream);
}

template <typename P>
void comba_chunk_bwd(const float* q, const float* k, const float* v, const float* p, const float* g,
                     const float* beta, const float* d_o, const float* tinv, int64_t batch, int64_t seq_len,
                     int64_t heads, int64_t key_dim, int64_t value_dim, int64_t chunk_size, float* dq, float* dk,
                     float* dv, float* dp, float* dg, float* dbeta, void* scratch, cudaStream_t stream) {
  core_bwd<true, P, float>(q, k, v, p, g, beta, d_o, tinv, batch, seq_len, heads, key_dim, value_dim, chunk_size,
                           dq, dk, dv, dp, dg, dbeta, scratch, stream);
}

#define LLMT_INSTANTIATE_GDN_COMBA(P)                                                                               \
  template size_t gdn_chunk_fwd_scratch_bytes<P>(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);             \
  template size_t gdn_chunk_bwd_scratch_bytes<P>(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool);       \
  template size_t comba_chunk_fwd_scratch_bytes<P>(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);           \
  template size_t comba_chunk_bwd_scratch_bytes<P>(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool);     \
  template void gdn_chunk_fwd<P>(const float*, const float*, const float*, const float*, const float*, int64_t,     \
                                 int64_t, int64_t, int64_t, int64_t, int64_t, float*, float*, void*, cudaStream_t); \
  template void gdn_chunk_bwd<P>(const float*, const float*, const float*, const float*, const float*, const float*, \
                                 const float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float*,        \
                                 float*, float*, float*, float*, void*, cudaStream_t);                              \
  template void comba_chunk_fwd<P>(const float*, const float*, const float*, const float*, const float*,            \
                                   const float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float*,      \
                                   float*, void*, cudaStream_t);                                                    \
  template void comba_chunk_bwd<P>(const float*, const float*, const float*, const float*, const float*,            \
                                   const float*, const float*, const float*, int64_t, int64_t, int64_t, int64_t,    \
                                   int64_t, int64_t, float*, float*, float*, float*, float*, float*, void*,         \
                                   cudaStream_t);
LLMT_INSTANTIATE_GDN_COMBA(float)
LLMT_INSTANTIATE_GDN_COMBA(__nv_bfloat16)

}  // namespace llmt::cuda
