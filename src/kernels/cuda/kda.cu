// KDA core, chunked, fp32 (layers-delta.md §4.3; §6.1 F1–F7 and §6.5 B1–B9 in the per-channel form), zero
// initial state; same results as src/kernels/cpu/kda.cpp up to fp32 rounding. The chunk-parallel design of
// gdn_comba.cu (same phases, 64 x 64 shared tiles of delta_tile.cuh), with the per-key-channel decay:
//   forward:  wu    (per chunk)          A, P, 𝒯 = (I + A)^{-1}, W, U, and Q^g = Q ⊙ e^Γ,
//                                        K^g = K ⊙ e^{Γ_C-Γ}, e^{Γ_C} for the later phases   (F1–F3, F5)
//             scan  (per value tile)     h[n]; Δ = U - W S; S = Diag(e^{Γ_C}) S + K^gT Δ      (F4, F7)
//             out   (per chunk, v tile)  O = Q^g h[n] + P Δ                                   (F6)
//   backward: without the forward's saved set, wu (keeping 𝒯) and scan recompute h and Δ; given its P and 𝒯,
//             wu forms only Γ, Q^g, K^g, e^{Γ_C}, W, U and the scan recomputes h and Δ; given also h and Δ
//             (states), wu forms only Γ, Q^g, K^g, e^{Γ_C}, W and no scan runs; then
//             dv_local (per chunk, v tile)  dΔ = P^T dO                                       (B1, intra)
//             bwd_scan (per value tile)     dh[n] = dS_C; dΔ += K^g dS_C; dS_0                (B1, B2)
//             dqk      (per chunk)          dQ, dK (P and state parts), dW, dΓ (i)–(iv)       (B3, B4, B8)
//             wy       (per chunk)          dV, dβ, dK (WY and A parts), dΓ (v)–(vi), dg      (B5–B7, B9)
// Numerics (§7.1, §7.3): per key tile, a block forms the chunk's Γ [64 rows x 64 channels] as a double cumsum
// of the fp32 g, kept in shared memory as an unevaluated float pair Γ = hi + lo (Gam), so that a difference
// Γ_r - Γ_j = (hi_r - hi_j) + (lo_r - lo_j) is accurate to fp32 rounding of the difference itself even where
// |Γ| is large (strong decay); fp32 cumsums would lose it. Every decay factor is e^{x} of one such
// difference with x <= 0: e^{Γ_r - Γ_j} (j <= r), e^{Γ_r}, e^{Γ_C - Γ_r}, e^{Γ_C}; never e^{Γ_r} e^{-Γ_j}.
// The intra-chunk sums whose factor depends on the channel (A, P; in the backward the dP- and dA-weighted
// sums: decayed_gram / decayed_left / decayed_right) use FLA's 16-token sub-chunk reference trick (§6.3):
// plain sums of pre-scaled rows off the diagonal 16 x 16 sub-blocks, one exponential per term on them;
// everything else is a tile product of rows scaled on load.
// Scratch (global, fp32): W, Q^g, K^g, dW, dΓ [B H, T', K], U/Δ, dΔ [B H, T', V] (T' = chunks x chunk_size),
// e^{Γ_C} [B H, chunks, K], P, 𝒯 [B H, chunks, 64, 64], h, dh [B H, chunks, K, V]; P, 𝒯 (and with `states`,
// model.kda.save_states, U/Δ and h) in the caller's saved buffer instead when it keeps them from the forward for
// the backward (ops.cuh kda_saved_floats, KdaSaved). Fixed summation orders, no atomics: deterministic.
// Precision: the launchers' P (the layer's compute dtype) picks the layout of the plain tile products.
// P = float (fp32 models): every phase in exact fp32 on the CUDA cores (tile::Simt); the CPU's results up to
// fp32 rounding.
// P = __nv_bfloat16 (bf16 models): every tile product runs on the tensor cores (tile::Mma: bf16 operand tiles
// in shared memory, mma.sync, fp32 register accumulators): in wu the off-diagonal 16 x 16 sub-blocks of A and P
// (operands scaled to their sub-chunk reference before rounding, so every factor is e^{x <= 0}),
// W = 𝒯 diag(β) (K ⊙ e^Γ), U = 𝒯 diag(β) V; the forward scan (W S, (K^g)^T Δ); the output (Q^g h, P Δ);
// dΔ = P^T dO; the backward scan (K^g dS, (Q^g)^T dO, W^T dΔ); dqk (dO Δ^T, dO h^T, Δ dh^T, dΔ h^T and the
// off-diagonal sub-blocks of the dP-weighted decayed sums); wy (𝒯^T dΔ, dΔ V^T, 𝒯^T dW, dW (K^d)^T, 𝒯^T d𝒯,
// M1 𝒯^T and the off-diagonal sub-blocks of the dA-weighted decayed sums). Their operands are rounded to bf16
// once, where the tile is loaded or formed (q, k with their decay factors or as sub-chunk variants, 𝒯, the
// β-scaled rows, W, K^g, Q^g, K^d, P, U/Δ, h, dh, dO, dΔ, dW, v, the running S, dS, dP, d𝒯, M1, dA, β dA); the
// diagonal sub-blocks of A, P and of the backward's decayed sums (element-wise, §7.3, from fp32 dP, dA, q, k),
// 𝒯, the running states, every accumulation, the decay factors and all element-wise steps (dΓ, dβ, with
// q, k, v, h, dh in fp32) stay fp32, as does every value written to the scratch (h[n], dh[n] are the fp32
// states).
#include <initializer_list>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/delta_chunk.cuh"
#include "kernels/cuda/delta_tile.cuh"
#include "kernels/cuda/ops.cuh"
#include "kernels/cuda/side_stream.cuh"

namespace llmt::cuda {
namespace {

#ifdef LLMT_CUDA_EMU
LLMT_CUDA_EMU_DYNAMIC_SMEM(smem);  // what the kernels' `extern __shared__ ... smem[]` name (tests/emu/cuda_emu.h)
#endif

using tile::Acc;
using tile::Carve;
using tile::Chunk;
using tile::kLd;
using tile::kLdH;
using tile::kN;
using tile::kTileHalves;
using tile::load_acc;
using tile::Mma;
using tile::Same;
using tile::store_acc;
using tile::tile_cols;
using bf16 = __nv_bfloat16;

/// The chunk's cumulative log-decay Γ for one key tile: two shared 64 x 64 tiles (leading dimension kLd), Γ at
/// tile index x being hi[x] + lo[x] (lo: the rounding residue of the double cumsum).
struct Gam {
  float *hi, *lo;
  /// e^{Γ[x]}.
  __device__ __forceinline__ float exp_at(int x) const { return expf(hi[x] + lo[x]); }
  /// e^{Γ[x] - Γ[y]}, the difference formed before the exponential.
  __device__ __forceinline__ float exp_diff(int x, int y) const { return exp_parts(hi[x], lo[x], hi[y], lo[y]); }
  /// exp_diff from the parts hi, lo of Γ[x] and Γ[y] (already loaded).
  __device__ static __forceinline__ float exp_parts(float hx, float lx, float hy, float ly) {
    return expf((hx - hy) + (lx - ly));
  }
};

// Inputs, outputs and scratch of one core call.
struct KdaFast {
  const float *q, *k, *v, *g, *beta, *d_o;
  float *o, *dq, *dk, *dv, *dg, *dbeta;
  int64_t B, T, H, K, V, C, NC;  // NC = ceil(T / C) chunks
  float *W, *U, *h, *Qg, *Kg, *aC, *P, *Tm, *dD, *dh, *dW, *dgam;
};

/// Scratch layout in floats (forward: W, U, h, Qg, Kg, aC, P; backward: all), P and 𝒯 not in it when the caller
/// keeps them (saved: the kda_saved_floats buffer, KdaSaved), U/Δ and h not when it keeps them too (states).
struct KdaScratch {
  int64_t W, U, h, Qg, Kg, aC, P, Tm, dD, dh, dW, dgam, total;
  KdaScratch(int64_t B, int64_t T, int64_t H, int64_t K, int64_t V, int64_t C, bool backward, bool saved,
             bool states) {
    const int64_t BH = B * H, NC = ceil_div(T, C), Tp = NC * C;
    int64_t at = 0;
    const auto take = [&](int64_t n) { const int64_t r = at; at += n; return r; };
    W = take(BH * Tp * K);
    U = saved && states ? 0 : take(BH * Tp * V);
    h = saved && states ? 0 : take(BH * NC * K * V);
    Qg = take(BH * Tp * K), Kg = take(BH * Tp * K), aC = take(BH * NC * K);
    P = saved ? 0 : take(BH * NC * kN * kN);
    Tm = dD = dh = dW = dgam = 0;
    if (backward) {
      if (!saved) Tm = take(BH * NC * kN * kN);
      dD = take(BH * Tp * V), dh = take(BH * NC * K * V), dW = take(BH * Tp * K), dgam = take(BH * Tp * K);
    }
    total = at;
  }
};

/// Layout in floats of the caller's saved buffer (kda_saved_floats), written by the forward and read by the
/// backward: P, 𝒯 [B H, chunks, 64, 64], and with `states` Δ (the scan's U/Δ rows) [B H, T', V] and h [B H,
/// chunks, K, V] (the fp32 states entering the chunks; without: U = h = 0), each region 16-byte aligned (its offset
/// a multiple of 4 floats).
struct KdaSaved {
  int64_t P, Tm, U, h, total;
  KdaSaved(int64_t B, int64_t T, int64_t H, int64_t K, int64_t V, int64_t C, bool states) {
    const int64_t BH = B * H, NC = ceil_div(T, C), Tp = NC * C;
    int64_t at = 0;
    const auto take = [&](int64_t n) { const int64_t r = at; at += ceil_div(n, 4) * 4; return r; };
    P = take(BH * NC * kN * kN), Tm = take(BH * NC * kN * kN), U = h = 0;
    if (states) U = take(BH * Tp * V), h = take(BH * NC * K * V);
    total = at;
  }
};

// Small per-block arrays at the start of the dynamic shared memory: β, reduction scratch and its results,
// the 16-row partial sums of the Γ cumsum.
struct Small {
  float *beta, *red, *out1;
  double* part;
  __device__ explicit Small(Carve& cv)
      : beta(cv.take<float>(kN)), red(cv.take<float>(2 * kN * 16)), out1(cv.take<float>(kN)),
        part(cv.take<double>(4 * kN)) {}
};
constexpr size_t kSmallBytes = 4 * (2 * kN + 2 * kN * 16) + 8 * 4 * kN + 4 * 16;

/// β_r of the chunk (0 for rows >= n). Ends with a barrier.
__device__ void load_beta(const KdaFast& a, const Chunk& ch, float* beta) {
  const int r = static_cast<int>(threadIdx.x);
  if (r < kN) beta[r] = r < ch.n ? a.beta[ch.gate(a, r)] : 0.0f;
  __syncthreads();
}

/// dst[r][c] = Σ_{r' >= r} src[r'][c] for the 64 rows of every column: four threads per column each sum
/// 16 rows from the bottom, then add the totals of the later 16-row parts in part order (a fixed order).
/// src and dst distinct shared tiles. Ends with a barrier.
__device__ void reverse_cumsum_cols(const float* src, float* dst) {
  const int c = static_cast<int>(threadIdx.x & 63), part = static_cast<int>(threadIdx.x >> 6);
  float acc = 0.0f;
  for (int r = 16 * part + 15; r >= 16 * part; --r) dst[r * kLd + c] = acc += src[r * kLd + c];
  __syncthreads();
  float off = 0.0f;
  for (int p = 3; p > part; --p) off += dst[16 * p * kLd + c];
  __syncthreads();
  for (int r = 16 * part; r < 16 * part + 16; ++r) dst[r * kLd + c] += off;
  __syncthreads();
}

/// G = Γ: the chunk-local inclusive cumsum over rows, per channel, of the g tile in `stage` (64 x 64 floats, rows
/// ld apart, 0 outside the chunk's rows and the key tile's channels; written before the caller's last barrier),
/// summed in double (four threads per channel: 16-row partial sums into `part` [4 x 64], then each part
/// restarts from the total of the parts before it). Rows >= n repeat Γ_{n-1} = Γ_C; channels past K are 0.
/// Ends with a barrier.
__device__ void gamma_cumsum(const float* stage, int ld, double* part, const Gam& G) {
  const int c = static_cast<int>(threadIdx.x & 63), p = static_cast<int>(threadIdx.x >> 6);
  double acc = 0.0;
  for (int r = 16 * p; r < 16 * p + 16; ++r) acc += stage[r * ld + c];
  part[p * kN + c] = acc;
  __syncthreads();
  acc = 0.0;
  for (int i = 0; i < p; ++i) acc += part[i * kN + c];
  for (int r = 16 * p; r < 16 * p + 16; ++r) {
    acc += stage[r * ld + c];
    const float hi = static_cast<float>(acc);
    G.hi[r * kLd + c] = hi;
    G.lo[r * kLd + c] = static_cast<float>(acc - hi);
  }
  __syncthreads();
}

/// G = Γ_{r, k0 + c} of the chunk (gamma_cumsum of g's key tile k0, loaded into stage: a float tile of scratch,
/// free again on return). Ends with a barrier.
__device__ void load_gamma(const KdaFast& a, const Chunk& ch, int64_t k0, float* stage, double* part, const Gam& G) {
  tile::load(stage, ch.in(a, a.g, a.K, k0), a.H * a.K, ch.n, tile_cols(a.K, k0));
  __syncthreads();
  gamma_cumsum(stage, kLd, part, G);
}

/// G = Γ of key tile k0 (as load_gamma) for the kernels that stage g by cp.async: with staged, from the g tile a
/// cp.async group copied into gS (tile::stage_async; the thread's copies are waited for, the barrier publishes
/// them); otherwise g is loaded into stage (a free float tile). One gamma_cumsum for both. Ends with a barrier.
__device__ void key_gamma(const KdaFast& a, const Chunk& ch, int64_t k0, bool staged, const float* gS, float* stage,
                          double* part, const Gam& G) {
  if (staged)
    tile::cp_async_wait<0>();
  else
    tile::load(stage, ch.in(a, a.g, a.K, k0), a.H * a.K, ch.n, tile_cols(a.K, k0));
  __syncthreads();
  gamma_cumsum(staged ? gS : stage, staged ? kN : kLd, part, G);
}

// The 16-token sub-chunk reference trick (layers-delta.md §6.3, §7.3). Sub-chunk a holds rows 16a .. 16a + 15;
// ζ_a = Γ at row 16a, η_a = Γ at row 16a + 15 (per channel). For j in an earlier sub-chunk than r (a = a(r)):
// e^{Γ_r - Γ_j} = e^{Γ_r - ζ_a} e^{ζ_a - Γ_j}, and for r in a later sub-chunk than j (a = a(j)):
// e^{Γ_r - Γ_j} = e^{Γ_r - η_a} e^{η_a - Γ_j}; every factor has an exponent <= 0 (Γ does not increase along
// rows for g <= 0), so the off-diagonal 16 x 16 sub-blocks become plain sums of pre-scaled rows. Diagonal
// sub-blocks are summed element-wise. Variant buffers hold 96 rows (two consecutive shared tiles).

/// First row in a left-variant buffer of sub-chunk a = 1..3 (rows j < 16a): 0, 16, 48.
__device__ __forceinline__ int left_base(int a) { return 8 * a * (a - 1); }
/// First row in a right-variant buffer of sub-chunk a = 0..2 (rows r >= 16(a + 1), stored from row 0 of the
/// block): 0, 48, 80.
__device__ __forceinline__ int right_base(int a) { return 48 * a - 8 * a * (a - 1); }

/// Xr[r][c] = X[r][c] e^{Γ_rc - ζ_{a(r), c}} for the 64 rows (no barrier).
__device__ void scale_rows_to_start(const float* X, const Gam& G, float* Xr) {
  for (int idx = threadIdx.x; idx < kN * kN; idx += tile::kThreads) {
    const int r = idx >> 6, c = idx & 63;
    Xr[r * kLd + c] = X[r * kLd + c] * G.exp_diff(r * kLd + c, (r & ~15) * kLd + c);
  }
}

/// Leading dimension of a variant buffer of element type T: kLd (fp32 tiles) or kLdH (bf16 tiles).
template <typename T>
constexpr int variant_ld = std::is_same_v<T, float> ? kLd : kLdH;

/// The thread's inputs of left_variants / right_variants: Y and Γ's parts of the rows r0 + q0 + 4 m (m < 12,
/// q0 = t / 64, column c = t % 64) and Γ's parts of the three reference rows ref(a) = rows[a] (a < 3), all read
/// before the first store (one round of shared loads).
struct VariantRows {
  float y[12], h[12], l[12], rh[3], rl[3];
  __device__ VariantRows(const float* Y, const Gam& G, int r0, int c, int q0, const int (&rows)[3]) {
#pragma unroll
    for (int m = 0; m < 12; ++m) {
      const int x = (r0 + q0 + 4 * m) * kLd + c;
      y[m] = Y[x], h[m] = G.hi[x], l[m] = G.lo[x];
    }
#pragma unroll
    for (int a = 0; a < 3; ++a) rh[a] = G.hi[rows[a] * kLd + c], rl[a] = G.lo[rows[a] * kLd + c];
  }
};

/// Yv[left_base(a) + j][c] = Y[j][c] e^{ζ_ac - Γ_jc} for a = 1..3, j < 16a (no barrier); Yv fp32 or bf16
/// (rounded once, the fp32 product). Pass it writes row q = 4 it + q0 (q0 = t / 64; sub-chunk a known per pass),
/// from row j = q0 + 4 m of its VariantRows (every row j is read once for up to three variants).
template <typename T>
__device__ void left_variants(const float* Y, const Gam& G, T* Yv) {
  static_assert(tile::kThreads == 4 * kN, "four rows per pass");
  const int c = static_cast<int>(threadIdx.x & 63), q0 = static_cast<int>(threadIdx.x >> 6);
  const VariantRows v(Y, G, 0, c, q0, {16, 32, 48});
#pragma unroll
  for (int it = 0; it < 96 * kN / tile::kThreads; ++it) {
    const int a = it < 4 ? 1 : it < 12 ? 2 : 3, m = it - left_base(a) / 4;  // j = 4 it + q0 - left_base(a)
    const float e = Gam::exp_parts(v.rh[a - 1], v.rl[a - 1], v.h[m], v.l[m]);
    Yv[(4 * it + q0) * variant_ld<T> + c] = from_f32<T>(v.y[m] * e);
  }
}

/// Yw[right_base(a) + r - 16(a + 1)][c] = Y[r][c] e^{Γ_rc - η_ac} for a = 0..2, r >= 16(a + 1) (no barrier);
/// Yw fp32 or bf16 (rounded once, the fp32 product). Pass it writes row q = 4 it + q0 (as left_variants), from row
/// r = 16 + q0 + 4 m of its VariantRows.
template <typename T>
__device__ void right_variants(const float* Y, const Gam& G, T* Yw) {
  const int c = static_cast<int>(threadIdx.x & 63), q0 = static_cast<int>(threadIdx.x >> 6);
  const VariantRows v(Y, G, 16, c, q0, {15, 31, 47});
#pragma unroll
  for (int it = 0; it < 96 * kN / tile::kThreads; ++it) {
    const int a = it < 12 ? 0 : it < 20 ? 1 : 2, m = it - right_base(a) / 4 + 4 * a;
    const float e = Gam::exp_parts(v.h[m], v.l[m], v.rh[a], v.rl[a]);
    Yw[(4 * it + q0) * variant_ld<T> + c] = from_f32<T>(v.y[m] * e);
  }
}

/// acc(r, c) += Σ_d X[r][d] Y[c][d] e^{Γ[r][d] - Γ[c][d]} over the tile's 64 channels d, for the thread's
/// (r, c) = (L::row(i), L::col(j)) with c < r (kStrict) or c <= r; other elements untouched. Xr: X scaled by
/// scale_rows_to_start, Yv: left_variants of Y.
template <typename L, bool kStrict>
__device__ void decayed_gram(const float* X, const float* Y, const float* Xr, const float* Yv, const Gam& G,
                             Acc& acc) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = L::row(i), c = L::col(j), a = r >> 4;
      float s = acc.v[i][j];
      if (c < 16 * a) {  // earlier sub-chunk: reference ζ_a
        const float *x = Xr + r * kLd, *y = Yv + (left_base(a) + c) * kLd;
        for (int d = 0; d < kN; ++d) s = fmaf(x[d], y[d], s);
      } else if (kStrict ? c < r : c <= r) {  // diagonal sub-block
        for (int d = 0; d < kN; ++d)
          s = fmaf(X[r * kLd + d] * Y[c * kLd + d], G.exp_diff(r * kLd + d, c * kLd + d), s);
      }
      acc.v[i][j] = s;
    }
}

/// acc(r, c) += Σ_{j <= r} M[r][j] Y[j][c] e^{Γ[r][c] - Γ[j][c]} (c a channel) for the thread's elements.
/// Yv: left_variants of Y.
template <typename L>
__device__ void decayed_left(const float* M, const float* Y, const float* Yv, const Gam& G, Acc& acc) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      const int r = L::row(i), c = L::col(jj), a = r >> 4;
      float off = 0.0f, s = acc.v[i][jj];
      for (int j = 0; j < 16 * a; ++j) off = fmaf(M[r * kLd + j], Yv[(left_base(a) + j) * kLd + c], off);
      if (a > 0) s = fmaf(G.exp_diff(r * kLd + c, 16 * a * kLd + c), off, s);
      for (int j = 16 * a; j <= r; ++j)
        s = fmaf(M[r * kLd + j] * Y[j * kLd + c], G.exp_diff(r * kLd + c, j * kLd + c), s);
      acc.v[i][jj] = s;
    }
}

/// acc(j, c) += Σ_{r >= j} M[r][j] Y[r][c] e^{Γ[r][c] - Γ[j][c]} (c a channel) for the thread's elements.
/// Yw: right_variants of Y.
template <typename L>
__device__ void decayed_right(const float* M, const float* Y, const float* Yw, const Gam& G, Acc& acc) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      const int j = L::row(i), c = L::col(jj), a = j >> 4, end = 16 * a + 16;
      float off = 0.0f, s = acc.v[i][jj];
      for (int r = end; r < kN; ++r) off = fmaf(M[r * kLd + j], Yw[(right_base(a) + r - end) * kLd + c], off);
      if (a < 3) s = fmaf(G.exp_diff((end - 1) * kLd + c, j * kLd + c), off, s);
      for (int r = j; r < end; ++r)
        s = fmaf(M[r * kLd + j] * Y[r * kLd + c], G.exp_diff(r * kLd + c, j * kLd + c), s);
      acc.v[i][jj] = s;
    }
}

// ---- forward phases ----

// F1–F3 and F5 for chunk blockIdx.x of head blockIdx.y: A and P (element-wise decayed sums over the key
// tiles), 𝒯 (kept in a.Tm when keep_T), W, U, P, and per key tile Q^g, K^g, e^{Γ_C} for the later phases.
// kSaved (the backward's wu with the forward's saved set): per key tile only Γ, Q^g, K^g, e^{Γ_C}, then W and,
// with kU, U from the 𝒯 in a.Tm (the same bits), without A, P or the inverse (keep_T unused; without kU Δ is
// saved). kU is true without kSaved.
template <typename L, bool kSaved, bool kU>
__global__ void __launch_bounds__(tile::kThreads) kda_wu_kernel(KdaFast a, bool keep_T) {
  static_assert(kSaved || kU, "wu without a saved set forms U");
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  Small s(cv);
  const Gam G{cv.tile(), cv.tile()};
  float *sA = cv.tile(), *sT = cv.tile(), *sX = cv.tile(), *sZ = cv.tile(), *sXr = cv.tile(), *sZr = cv.tile();
  float* sZv = cv.tile();  // two tiles: the 96 rows of K's left variants
  cv.tile();
  const Chunk ch(a, blockIdx.x, blockIdx.y);
  const int64_t K = a.K, V = a.V;
  load_beta(a, ch, s.beta);
  Acc kk, qk;  // Σ_c k_rc k_jc E_rj,c (j < r), Σ_c q_rc k_jc E_rj,c (j <= r)
  kk.zero();
  qk.zero();
  for (int64_t k0 = 0; k0 < K; k0 += kN) {
    const int kc = tile_cols(K, k0);
    load_gamma(a, ch, k0, sX, s.part, G);
    tile::load(sX, ch.in(a, a.q, K, k0), a.H * K, ch.n, kc);
    tile::load(sZ, ch.in(a, a.k, K, k0), a.H * K, ch.n, kc);
    __syncthreads();
    if constexpr (!kSaved) {
      scale_rows_to_start(sX, G, sXr);
      scale_rows_to_start(sZ, G, sZr);
      left_variants(sZ, G, sZv);
      __syncthreads();
      decayed_gram<L, true>(sZ, sZ, sZr, sZv, G, kk);
      decayed_gram<L, false>(sX, sZ, sXr, sZv, G, qk);
    }
    float *qg = ch.rows(a, a.Qg, K, k0), *kg = ch.rows(a, a.Kg, K, k0);
    for (int idx = threadIdx.x; idx < kN * kN; idx += tile::kThreads) {
      const int r = idx >> 6, c = idx & 63;
      if (r < ch.n && c < kc) {
        qg[r * K + c] = G.exp_at(r * kLd + c) * sX[r * kLd + c];
        kg[r * K + c] = G.exp_diff((ch.n - 1) * kLd + c, r * kLd + c) * sZ[r * kLd + c];
      }
    }
    if (static_cast<int>(threadIdx.x) < kc)
      a.aC[(ch.bh * a.NC + ch.chunk) * K + k0 + threadIdx.x] = G.exp_at((ch.n - 1) * kLd + threadIdx.x);
    __syncthreads();
  }
  if constexpr (kSaved) {
    tile::load(sT, ch.square(a, a.Tm), kN, kN, kN);  // 𝒯 (its readers come after F3's first barrier)
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {  // F1: A_rj = β_r Σ_c k_rc k_jc E_rj,c (j < r)
        const int r = L::row(i), c = L::col(j);
        sA[r * kLd + c] = c < r && r < ch.n ? s.beta[r] * kk.v[i][j] : 0.0f;
        sT[r * kLd + c] = r == c ? 1.0f : 0.0f;
      }
    store_acc<L>(qk, ch.square(a, a.P), kN, kN, kN,  // F5: P (j <= r < n, else 0)
                 [&](int r, int c, float x) { return c <= r && r < ch.n ? x : 0.0f; });
    __syncthreads();
    tile::tril_inverse_fast(sA, sT, ch.n);  // F2 (A's upper triangle is scratch there; A is not read after)
    if (keep_T) tile::store(sT, ch.square(a, a.Tm), kN, kN, kN);
  }
  for (int64_t k0 = 0; k0 < K; k0 += kN) {  // F3: W = 𝒯 diag(β) (K ⊙ e^Γ)
    const int kc = tile_cols(K, k0);
    load_gamma(a, ch, k0, sX, s.part, G);
    tile::load_rc(sX, ch.in(a, a.k, K, k0), a.H * K, ch.n, kc,
                  [&](int r, int c) { return s.beta[r] * G.exp_at(r * kLd + c); });
    __syncthreads();
    Acc acc;
    acc.zero();
    L::template mma<false, false>(sT, sX, acc);
    store_acc<L>(acc, ch.rows(a, a.W, K, k0), K, ch.n, kc, Same{});
    __syncthreads();
  }
  if constexpr (!kU) return;
  for (int64_t v0 = 0; v0 < V; v0 += kN) {  // F3: U = 𝒯 diag(β) V
    tile::load(sX, ch.in(a, a.v, V, v0), a.H * V, ch.n, tile_cols(V, v0), [&](int r) { return s.beta[r]; });
    __syncthreads();
    Acc acc;
    acc.zero();
    L::template mma<false, false>(sT, sX, acc);
    store_acc<L>(acc, ch.rows(a, a.U, V, v0), V, ch.n, tile_cols(V, v0), Same{});
    __syncthreads();
  }
}

/// e^{Γ_C} of channel k0 + row(i) of the chunk (0 past K), the decay of state row row(i) of key tile k0.
template <typename L>
__device__ __forceinline__ float state_decay(const KdaFast& a, const Chunk& ch, int64_t k0, int i) {
  const int64_t m = k0 + L::row(i);
  return m < a.K ? a.aC[(ch.bh * a.NC + ch.chunk) * a.K + m] : 0.0f;
}

// F4, F7 for value tile blockIdx.x of head blockIdx.y, chunks in order: stores h[n] (the state entering
// chunk n) and Δ = U - W h[n] (over U). The K x 64 state lives in shared memory (ceil(K / 64) tiles).
template <typename L>
__global__ void __launch_bounds__(tile::kThreads) kda_scan_kernel(KdaFast a) {
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  float *sX = cv.tile(), *sD = cv.tile(), *S = cv.tile();  // S: the first of ceil(K / 64) state tiles
  const int64_t K = a.K, V = a.V, v0 = static_cast<int64_t>(blockIdx.x) * kN;
  const int vc = tile_cols(V, v0);
  const int nkt = static_cast<int>((K + kN - 1) / kN);
  for (int kt = 0; kt < nkt; ++kt) tile::clear(S + kt * tile::kTileFloats);
  __syncthreads();
  for (int64_t chunk = 0; chunk < a.NC; ++chunk) {
    const Chunk ch(a, chunk, blockIdx.y);
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
    float* U = ch.rows(a, a.U, V, v0);
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
    store_acc<L>(d, U, V, ch.n, vc, Same{});
    for (int kt = 0; kt < nkt; ++kt) {  // F7: S = Diag(e^{Γ_C}) S + (K ⊙ e^{Γ_C-Γ})^T Δ
      tile::load(sX, ch.rows(a, a.Kg, K, kt * kN), K, ch.n, tile_cols(K, kt * kN));
      __syncthreads();
      acc.zero();
      L::template mma<true, false>(sX, sD, acc);
      float* St = S + kt * tile::kTileFloats;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float aC = state_decay<L>(a, ch, kt * kN, i);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          float& e = St[L::row(i) * kLd + L::col(j)];
          e = aC * e + acc.v[i][j];
        }
      }
      __syncthreads();
    }
  }
}

// F6 for chunk blockIdx.x, head blockIdx.y, value tile blockIdx.z: O = (Q ⊙ e^Γ) h[n] + P Δ.
template <typename L>
__global__ void __launch_bounds__(tile::kThreads) kda_out_kernel(KdaFast a) {
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  float *sQ = cv.tile(), *sH = cv.tile(), *sP = cv.tile();
  const Chunk ch(a, blockIdx.x, blockIdx.y);
  const int64_t K = a.K, V = a.V, v0 = static_cast<int64_t>(blockIdx.z) * kN;
  const int vc = tile_cols(V, v0);
  Acc acc;
  acc.zero();
  for (int64_t k0 = 0; k0 < K; k0 += kN) {
    tile::load(sQ, ch.rows(a, a.Qg, K, k0), K, ch.n, tile_cols(K, k0));
    tile::load(sH, ch.state(a, a.h, k0, v0), V, tile_cols(K, k0), vc);
    __syncthreads();
    L::template mma<false, false>(sQ, sH, acc);
    __syncthreads();
  }
  tile::load(sP, ch.square(a, a.P), kN, kN, kN);
  tile::load(sQ, ch.rows(a, a.U, V, v0), V, ch.n, vc);  // Δ (sQ reused)
  __syncthreads();
  L::template mma<false, false>(sP, sQ, acc);
  store_acc<L>(acc, ch.in(a, a.o, V, v0), a.H * V, ch.n, vc, Same{});
}

// ---- backward phases ----

// B1 (intra-chunk part) for chunk blockIdx.x, head blockIdx.y, value tile blockIdx.z: dΔ = P^T dO.
template <typename L>
__global__ void __launch_bounds__(tile::kThreads) kda_dv_local_kernel(KdaFast a) {
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  float *sP = cv.tile(), *sO = cv.tile();
  const Chunk ch(a, blockIdx.x, blockIdx.y);
  const int64_t V = a.V, v0 = static_cast<int64_t>(blockIdx.z) * kN;
  tile::load(sP, ch.square(a, a.P), kN, kN, kN);
  tile::load(sO, ch.in(a, a.d_o, V, v0), a.H * V, ch.n, tile_cols(V, v0));
  __syncthreads();
  Acc acc;
  acc.zero();
  L::template mma<true, false>(sP, sO, acc);
  store_acc<L>(acc, ch.rows(a, a.dD, V, v0), V, ch.n, tile_cols(V, v0), Same{});
}

// B1 (state part) and B2 for value tile blockIdx.x of head blockIdx.y, chunks in reverse: stores dh[n]
// (= dS_C, the gradient of the state leaving chunk n), completes dΔ += K^g dS_C, then
// dS <- Diag(e^{Γ_C}) dS_C + (Q ⊙ e^Γ)^T dO - W^T dΔ.
template <typename L>
__global__ void __launch_bounds__(tile::kThreads) kda_bwd_scan_kernel(KdaFast a) {
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  float *sX = cv.tile(), *sZ = cv.tile(), *sY = cv.tile(), *sE = cv.tile(), *dS = cv.tile();
  const int64_t K = a.K, V = a.V, v0 = static_cast<int64_t>(blockIdx.x) * kN;
  const int vc = tile_cols(V, v0);
  const int nkt = static_cast<int>((K + kN - 1) / kN);
  for (int kt = 0; kt < nkt; ++kt) tile::clear(dS + kt * tile::kTileFloats);
  __syncthreads();
  for (int64_t chunk = a.NC - 1; chunk >= 0; --chunk) {
    const Chunk ch(a, chunk, blockIdx.y);
    for (int kt = 0; kt < nkt; ++kt)
      tile::store(dS + kt * tile::kTileFloats, ch.state(a, a.dh, kt * kN, v0), V, tile_cols(K, kt * kN), vc);
    Acc acc;
    acc.zero();
    for (int kt = 0; kt < nkt; ++kt) {  // K^g dS_C
      tile::load(sX, ch.rows(a, a.Kg, K, kt * kN), K, ch.n, tile_cols(K, kt * kN));
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
    store_acc<L>(d, dD, V, ch.n, vc, Same{});
    tile::load(sY, ch.in(a, a.d_o, V, v0), a.H * V, ch.n, vc);
    for (int kt = 0; kt < nkt; ++kt) {  // B2
      tile::load(sX, ch.rows(a, a.Qg, K, kt * kN), K, ch.n, tile_cols(K, kt * kN));
      tile::load(sZ, ch.rows(a, a.W, K, kt * kN), K, ch.n, tile_cols(K, kt * kN));
      __syncthreads();
      Acc qd, wd;
      qd.zero();
      wd.zero();
      L::template mma<true, false>(sX, sY, qd);
      L::template mma<true, false>(sZ, sE, wd);
      float* St = dS + kt * tile::kTileFloats;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float aC = state_decay<L>(a, ch, kt * kN, i);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          float& e = St[L::row(i) * kLd + L::col(j)];
          e = aC * e + qd.v[i][j] - wd.v[i][j];
        }
      }
      __syncthreads();
    }
  }
}

/// The dqk kernels' step per key tile k0 (kc channels) after the products: dQ, dK (B3, B4) of the tile and its dΓ
/// terms (i)–(iv) of B8 into the dΓ scratch, from dqs = dO h^T, dks = Δ dS_C^T, the decayed sums dq2, dk2 (see
/// kda_bwd_dqk_kernel), sd[i] = the thread's share of Σ_v h ⊙ dh of state row (channel) L::row(i) and the fp32
/// q, k tiles sX, sZ. Ends with the barrier of reduce_rows_cols (then stores the dΓ tile).
template <typename L>
__device__ void dqk_store(const KdaFast& a, const Chunk& ch, const Small& s, int64_t k0, int kc, const Gam& G,
                          const float* sX, const float* sZ, const Acc& dqs, const Acc& dks, const Acc& dq2,
                          const Acc& dk2, const float (&sd)[4]) {
  const int64_t K = a.K;
  float *dq = ch.in(a, a.dq, K, k0), *dk = ch.in(a, a.dk, K, k0);
  float zc[4] = {0, 0, 0, 0}, sdc[4];
  Acc dgam;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    sdc[i] = G.exp_at((ch.n - 1) * kLd + L::row(i)) * sd[i];  // B8 (iv): state row = channel row(i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = L::row(i), c = L::col(j);
      const float eg = G.exp_at(r * kLd + c), ekg = G.exp_diff((ch.n - 1) * kLd + c, r * kLd + c);
      const float dqv = eg * dqs.v[i][j] + dq2.v[i][j], zk = ekg * dks.v[i][j];
      const float z = sZ[r * kLd + c] * zk;
      dgam.v[i][j] = sX[r * kLd + c] * dqv - sZ[r * kLd + c] * dk2.v[i][j] - z;  // (i), (ii), (iii) rows
      if (r < ch.n) zc[j] += z;  // (iii) at row C
      if (r < ch.n && c < kc) {
        dq[r * a.H * K + c] = dqv;                // B3
        dk[r * a.H * K + c] = dk2.v[i][j] + zk;   // B4
      }
    }
  }
  tile::reduce_rows_cols<L>(sdc, zc, s.red, s.out1);  // out1[c]: the row-C extra of channel c
  store_acc<L>(dgam, ch.rows(a, a.dgam, K, k0), K, ch.n, kc,
               [&](int r, int c, float x) { return r == ch.n - 1 ? x + s.out1[c] : x; });
}

// B3, B4 (P and state parts of dK), dW = -dΔ h^T and dΓ terms (i)–(iv) of B8 (into the dΓ scratch), for
// chunk blockIdx.x of head blockIdx.y. Per element (r, c), with dq2 = Σ_{j<=r} dP_rj k_jc E_rj,c and
// dk2 = Σ_{i>=r} dP_ir q_ic E_ir,c: dΓ_rc = q_rc (e^{Γ_rc} (dO h^T)_rc + dq2) - k_rc (dk2 + z_rc) with
// z = K^g ⊙ (Δ dS_C^T), and at row C additionally Σ_j z_jc + e^{Γ_C,c} Σ_v h[c, v] dS_C[c, v].
template <typename L>
__global__ void __launch_bounds__(tile::kThreads) kda_bwd_dqk_kernel(KdaFast a) {
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  Small s(cv);
  const Gam G{cv.tile(), cv.tile()};
  float *sdP = cv.tile(), *sX = cv.tile(), *sZ = cv.tile(), *sY = cv.tile(), *sH = cv.tile(), *sD = cv.tile(),
        *sG = cv.tile(), *sE = cv.tile();
  const Chunk ch(a, blockIdx.x, blockIdx.y);
  const int64_t K = a.K, V = a.V;
  Acc dp;
  dp.zero();
  for (int64_t v0 = 0; v0 < V; v0 += kN) {  // dO Δ^T
    tile::load(sY, ch.in(a, a.d_o, V, v0), a.H * V, ch.n, tile_cols(V, v0));
    tile::load(sD, ch.rows(a, a.U, V, v0), V, ch.n, tile_cols(V, v0));
    __syncthreads();
    L::template mma<false, true>(sY, sD, dp);
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // B3: dP = tril_{j<=r}(dO Δ^T)
      const int r = L::row(i), c = L::col(j);
      sdP[r * kLd + c] = c <= r ? dp.v[i][j] : 0.0f;
    }
  for (int64_t k0 = 0; k0 < K; k0 += kN) {
    const int kc = tile_cols(K, k0);
    Acc dqs, dks, dws;  // dO h^T, Δ dS_C^T, dΔ h^T
    dqs.zero();
    dks.zero();
    dws.zero();
    float sd[4] = {0, 0, 0, 0};  // Σ_v h ⊙ dh of state rows (channels) L::row(i), this thread's share
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
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int r = L::row(i), c = L::col(j);
          sd[i] += sH[r * kLd + c] * sG[r * kLd + c];
        }
      __syncthreads();
    }
    store_acc<L>(dws, ch.rows(a, a.dW, K, k0), K, ch.n, kc, [](int, int, float x) { return -x; });  // dW
    load_gamma(a, ch, k0, sX, s.part, G);
    tile::load(sX, ch.in(a, a.q, K, k0), a.H * K, ch.n, kc);
    tile::load(sZ, ch.in(a, a.k, K, k0), a.H * K, ch.n, kc);
    __syncthreads();
    left_variants(sZ, G, sY);  // into sY, sH (free until the next key tile)
    right_variants(sX, G, sD);  // into sD, sG
    __syncthreads();
    Acc dq2, dk2;
    dq2.zero();
    dk2.zero();
    decayed_left<L>(sdP, sZ, sY, G, dq2);
    decayed_right<L>(sdP, sX, sD, G, dk2);
    dqk_store<L>(a, ch, s, k0, kc, G, sX, sZ, dqs, dks, dq2, dk2, sd);
  }
}

/// The dK and dΓ scratch tiles of key tile k0 (kc channels) at the thread's elements, read for the wy kernels'
/// read-modify-write: dk, dgam point at the tiles, dko, dgo hold their values (0 outside the chunk's n x kc).
template <typename L>
struct DkDgam {
  float *dk, *dgam;
  Acc dko, dgo;
  __device__ DkDgam(const KdaFast& a, const Chunk& ch, int64_t k0, int kc)
      : dk(ch.in(a, a.dk, a.K, k0)), dgam(ch.rows(a, a.dgam, a.K, k0)) {
    load_acc<L>(dko, dk, a.H * a.K, ch.n, kc);
    load_acc<L>(dgo, dgam, a.K, ch.n, kc);
  }
};

/// The wy kernels' B5 W-side step for key tile k0 (kc channels) after X_W = 𝒯^T dW (xw): dK += β X_W ⊙ e^Γ
/// and B8 (v) dΓ += β X_W ⊙ K^d (read-modify-write of the dK and dΓ scratch at the thread's elements); db_part[i]
/// += the thread's share of X_W ⊙ K^d of row L::row(i). kd: the fp32 K^d = K ⊙ e^Γ tile.
template <typename L>
__device__ void wy_w_store(const KdaFast& a, const Chunk& ch, const Small& s, int64_t k0, int kc, const Gam& G,
                           const float* kd, const Acc& xw, float (&db_part)[4]) {
  const int64_t K = a.K;
  DkDgam<L> t(a, ch, k0, kc);
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = L::row(i), c = L::col(j);
      const float xk = xw.v[i][j] * kd[r * kLd + c];
      db_part[i] += xk;
      t.dgo.v[i][j] += s.beta[r] * xk;
      t.dko.v[i][j] += s.beta[r] * G.exp_at(r * kLd + c) * xw.v[i][j];
    }
  store_acc<L>(t.dko, t.dk, a.H * K, ch.n, kc, Same{});
  store_acc<L>(t.dgo, t.dgam, K, ch.n, kc, Same{});
}

/// The wy kernels' B5 W-side products for key tile k0 (kc channels) once their operand tiles (L's operand type P:
/// T = 𝒯, Z = dW, X = K^d) are complete: X_W = 𝒯^T dW, dtw += dW (K^d)^T, then wy_w_store (kd: K^d in fp32) and
/// a barrier.
template <typename L, typename P>
__device__ __forceinline__ void wy_w_step(const KdaFast& a, const Chunk& ch, const Small& s, int64_t k0, int kc,
                                          const Gam& G, const P* T, const P* Z, const P* X, const float* kd, Acc& dtw,
                                          float (&db_part)[4]) {
  Acc xw;
  xw.zero();
  L::template mma<true, false>(T, Z, xw);
  L::template mma<false, true>(Z, X, dtw);
  wy_w_store<L>(a, ch, s, k0, kc, G, kd, xw, db_part);
  __syncthreads();
}

/// B6 on L's element map: dtv = d𝒯 = dU (diag(β) V)^T + dW (diag(β) K^d)^T, i.e. β_c (dtv + dtw) in the lower part
/// (c <= r), 0 above.
template <typename L>
__device__ __forceinline__ void wy_dT(Acc& dtv, const Acc& dtw, const float* beta) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = L::row(i), c = L::col(j);
      dtv.v[i][j] = c <= r ? beta[c] * (dtv.v[i][j] + dtw.v[i][j]) : 0.0f;
    }
}

/// The wy kernels' B7 step for key tile k0 (kc channels) after the decayed sums xr, yc (see kda_bwd_wy_kernel):
/// dK += β xr + yc, B8 (vi), db_part[i] += the thread's share of Σ_c k ⊙ xr of row L::row(i), then B9: dg of the
/// tile = the reverse cumsum of its dΓ (the scratch's terms plus (vi)) over the chunk's rows. k: the fp32 k tile;
/// sY, sZ: free fp32 tiles (the dΓ tile and its cumsum). Reads k before its first barrier; ends with a barrier.
template <typename L>
__device__ void wy_b7_store(const KdaFast& a, const Chunk& ch, const Small& s, int64_t k0, int kc, const float* k,
                            const Acc& xr, const Acc& yc, float* sY, float* sZ, float (&db_part)[4]) {
  const int64_t K = a.K;
  DkDgam<L> t(a, ch, k0, kc);
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = L::row(i), c = L::col(j);
      const float kv = k[r * kLd + c];
      db_part[i] += kv * xr.v[i][j];
      t.dko.v[i][j] += s.beta[r] * xr.v[i][j] + yc.v[i][j];
      // dΓ of rows >= n stays 0 (load_acc), so the reverse cumsum below starts at row n - 1.
      sY[r * kLd + c] = r < ch.n ? t.dgo.v[i][j] + kv * (s.beta[r] * xr.v[i][j] - yc.v[i][j]) : 0.0f;
    }
  store_acc<L>(t.dko, t.dk, a.H * K, ch.n, kc, Same{});
  __syncthreads();
  reverse_cumsum_cols(sY, sZ);  // B9: dg_t = Σ_{r >= t in the chunk} dΓ_r, per channel
  tile::store(sZ, ch.in(a, a.dg, K, k0), a.H * K, ch.n, kc);
  __syncthreads();
}

// B5–B7, B8 (v)–(vi) and B9 for chunk blockIdx.x of head blockIdx.y: dV, dβ, dK += (WY and A parts), dg.
// With X_W = 𝒯^T dW, K^d = K ⊙ e^Γ, dA from B6, xr_rc = Σ_{j<r} dA_rj k_jc E_rj,c and
// yc_jc = Σ_{r>j} β_r dA_rj k_rc E_rj,c: dK += β X_W ⊙ e^Γ + β xr + yc; dβ_r += X_U,r·v_r + X_W,r·K^d_r +
// Σ_c k_rc xr_rc; dΓ += β X_W ⊙ K^d (v) + β K ⊙ xr - K ⊙ yc (vi); then dg = reverse cumsum of dΓ (B9).
template <typename L>
__global__ void __launch_bounds__(tile::kThreads) kda_bwd_wy_kernel(KdaFast a) {
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  Small s(cv);
  const Gam G{cv.tile(), cv.tile()};
  float *sT = cv.tile(), *sdT = cv.tile(), *sM = cv.tile(), *sX = cv.tile(), *sY = cv.tile(), *sZ = cv.tile();
  float* sV = cv.tile();  // two tiles: K's left variants
  cv.tile();
  float* sW = cv.tile();  // two tiles: K's right variants
  cv.tile();
  const Chunk ch(a, blockIdx.x, blockIdx.y);
  const int64_t K = a.K, V = a.V;
  load_beta(a, ch, s.beta);
  tile::load(sT, ch.square(a, a.Tm), kN, kN, kN);
  float db_part[4] = {0, 0, 0, 0}, none[4] = {0, 0, 0, 0};
  Acc dtv, dtw;  // dΔ V^T, dW (K^d)^T
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
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) db_part[i] += x.v[i][j] * sY[L::row(i) * kLd + L::col(j)];
    store_acc<L>(x, ch.in(a, a.dv, V, v0), a.H * V, ch.n, vc, [&](int r, int, float y) { return s.beta[r] * y; });
    __syncthreads();
  }
  for (int64_t k0 = 0; k0 < K; k0 += kN) {  // B5, W side: X_W = 𝒯^T dW; dK += β X_W ⊙ e^Γ; B8 (v)
    const int kc = tile_cols(K, k0);
    load_gamma(a, ch, k0, sX, s.part, G);
    tile::load(sZ, ch.rows(a, a.dW, K, k0), K, ch.n, kc);
    tile::load_rc(sX, ch.in(a, a.k, K, k0), a.H * K, ch.n, kc, [&](int r, int c) { return G.exp_at(r * kLd + c); });
    __syncthreads();
    wy_w_step<L>(a, ch, s, k0, kc, G, sT, sZ, sX, sX, dtw, db_part);
  }
  wy_dT<L>(dtv, dtw, s.beta);  // B6
  store_acc<L>(dtv, sdT, kLd, kN, kN, Same{});
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
  __syncthreads();                          // sM and sdT are rewritten below
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // dA (j < r < n) into sdT, β_r dA_rj into sM
      const int r = L::row(i), c = L::col(j);
      const float da = c < r && r < ch.n ? -m.v[i][j] : 0.0f;
      sdT[r * kLd + c] = da;
      sM[r * kLd + c] = s.beta[r] * da;
    }
  for (int64_t k0 = 0; k0 < K; k0 += kN) {  // B7, B8 (vi), B9
    const int kc = tile_cols(K, k0);
    load_gamma(a, ch, k0, sX, s.part, G);  // (its first barrier also publishes sdT, sM)
    tile::load(sX, ch.in(a, a.k, K, k0), a.H * K, ch.n, kc);
    __syncthreads();
    left_variants(sX, G, sV);
    right_variants(sX, G, sW);
    __syncthreads();
    Acc xr, yc;
    xr.zero();
    yc.zero();
    decayed_left<L>(sdT, sX, sV, G, xr);
    decayed_right<L>(sM, sX, sW, G, yc);
    wy_b7_store<L>(a, ch, s, k0, kc, sX, xr, yc, sY, sZ, db_part);
  }
  tile::reduce_rows_cols<L>(db_part, none, s.red, s.out1);
  const int r = static_cast<int>(threadIdx.x);
  if (r < ch.n) a.dbeta[ch.gate(a, r)] = s.out1[r];
}

// ---- phases on tile::Mma (bf16 models; see Precision) ----

/// Writes the thread's 16 elements of a per-thread fp32 state tile (element (Mma::row(i), Mma::col(j)) at
/// St[(4 i + j) kThreads], St already offset by the thread id) to the [K, V] state block at dst (rows V
/// apart), rows < rows, columns < cols.
__device__ __forceinline__ void store_state(const float* St, float* dst, int64_t V, int rows, int cols) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = Mma::row(i), c = Mma::col(j);
      if (r < rows && c < cols) dst[r * V + c] = St[(4 * i + j) * tile::kThreads];
    }
}

/// Asks the L2 cache for the `bytes` (< 2^31) contiguous bytes at p (prefetch.global.L2; no effect on any result):
/// thread t the 128-byte steps t, t + kThreads, ... from p (tile::prefetch_l2's one-row case in a few instructions).
__device__ __forceinline__ void prefetch_span(const void* p, int bytes) {
#ifdef __CUDA_ARCH__
  const char* c = static_cast<const char*>(p);
#pragma unroll 1
  for (int o = 128 * static_cast<int>(threadIdx.x); o < bytes; o += 128 * tile::kThreads)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(c + o));
#endif
}

// Shared memory of kda_wu_mma_kernel: β, the Γ cumsum's partial sums, Γ (two fp32 tiles; after the A/P pass A
// and 𝒯), q (then P) and k (fp32 tiles), bf16 tiles: q and k scaled to their sub-chunk starts (before them the
// key tile's fp32 g, over both; after the A/P pass 𝒯 and F3's operand) and k's 96 left-variant rows. 99 KiB: two
// blocks per SM. kda_wu_mma_kernel<true> (from a saved 𝒯) has a bf16 tile of 𝒯 instead of the left variants:
// 94.25 KiB (still two blocks per SM).
template <bool kSaved>
constexpr size_t kWuMmaSmem = sizeof(float) * kN + sizeof(double) * 4 * kN + 4 * sizeof(float) * tile::kTileFloats +
                              sizeof(bf16) * (2 * kTileHalves + (kSaved ? kTileHalves : 96 * kLdH));
static_assert(2 * sizeof(bf16) * kTileHalves >= sizeof(float) * tile::kTileFloats, "g's tile over the bf16 operands");

/// tile::load_rc(s, src, stride, rows, cols, scale) from the thread's own pieces of a staging tile g that
/// tile::stage_async filled from the same src, rows, cols: s[r][c] = scale(r, c) x for r < rows, c < cols, else
/// 0 (the elements and arithmetic of load_rc, stage_async's thread -> element map). All of the thread's values are
/// formed before its first store (so that the loads scale makes are not held behind the stores). No barrier.
template <typename Scale>
__device__ __forceinline__ void put_rc_staged(float* s, const float* g, int rows, int cols, Scale scale) {
  constexpr int kPer = kN * kN / 4 / tile::kThreads;
  float y[kPer][4];
#pragma unroll
  for (int it = 0; it < kPer; ++it) {
    const int idx = static_cast<int>(threadIdx.x) + it * tile::kThreads, r = idx >> 4, c = 4 * (idx & 15);
    const float4 x4 = *reinterpret_cast<const float4*>(g + r * kN + c);
    const float x[4] = {x4.x, x4.y, x4.z, x4.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) y[it][e] = r < rows && c + e < cols ? scale(r, c + e) * x[e] : 0.0f;
  }
#pragma unroll
  for (int it = 0; it < kPer; ++it) {
    const int idx = static_cast<int>(threadIdx.x) + it * tile::kThreads, r = idx >> 4, c = 4 * (idx & 15);
#pragma unroll
    for (int e = 0; e < 4; ++e) s[r * kLd + c + e] = y[it][e];
  }
}

/// acc += A B on fragment row mt of the warp's tile::Mma block (rows 16 mt .. 16 mt + 15 of its 32): fa the 16 x 16
/// op(A) fragment, fb[2 nt], fb[2 nt + 1] the op(B) fragment of columns 8 nt .. 8 nt + 7, nt = 0, 1 (as Mma::mma).
__device__ __forceinline__ void mma_rows(Acc& acc, int mt, const uint32_t (&fa)[4], const uint32_t (&fb)[4]) {
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    float c[4] = {acc.v[2 * mt][2 * nt], acc.v[2 * mt][2 * nt + 1], acc.v[2 * mt + 1][2 * nt],
                  acc.v[2 * mt + 1][2 * nt + 1]};
    ::llmt::cuda::mma::mma_16816(c, fa, fb[2 * nt], fb[2 * nt + 1]);
    acc.v[2 * mt][2 * nt] = c[0], acc.v[2 * mt][2 * nt + 1] = c[1];
    acc.v[2 * mt + 1][2 * nt] = c[2], acc.v[2 * mt + 1][2 * nt + 1] = c[3];
  }
}

/// The off-diagonal 16 x 16 sub-blocks of the decayed grams on the tensor cores: acc(r, c) += Σ_d Xr[r][d]
/// Yv[left_base(a) + c][d] (a = a(r)) for the thread's fragment elements whose column sub-chunk is earlier
/// than their row sub-chunk (c < 16 a), that is Σ_d X_rd Y_cd e^{Γ_rd - Γ_cd} with both factors' exponents <= 0
/// (the sub-chunk reference trick, above); other elements untouched. Xr: bf16 rows of X scaled to their
/// sub-chunk start (scale_rows_to_start), Yv: bf16 left variants of Y (96 rows). Warp w's 2 x 2 fragments
/// (tile::Mma) cover row sub-chunks 2 (w / 4) + mt and column sub-chunk w % 4, so the test is warp-uniform.
__device__ void offdiag_gram_mma(const bf16* Xr, const bf16* Yv, Acc& acc) {
  const int w = Mma::warp(), l = Mma::lane(), b = w & 3, m = l >> 3, i = l & 7;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    const int a = 2 * (w >> 2) + mt;
    if (b >= a) continue;
#pragma unroll
    for (int d = 0; d < kN; d += 16) {
      uint32_t fa[4], fb[4];  // as Mma::mma<false, true>: op(A) rows of sub-chunk a, op(B) columns of sub-chunk b
      ::llmt::cuda::mma::ldsm_x4(fa, Xr + (16 * a + 8 * (m & 1) + i) * kLdH + d + 8 * (m >> 1));
      ::llmt::cuda::mma::ldsm_x4(fb, Yv + (left_base(a) + 16 * b + 8 * (m >> 1) + i) * kLdH + d + 8 * (m & 1));
      mma_rows(acc, mt, fa, fb);
    }
  }
}

/// The off-diagonal sub-blocks of decayed_left (kRight = false) or decayed_right (kRight = true) on the tensor
/// cores, the sums that left_finish / right_finish take as `off`: for the thread's fragment elements (r, c) of row
/// sub-chunk a = r / 16, acc(r, c) += Σ_{j < 16a} M[r][j] Yx[left_base(a) + j][c] (left; Yx: bf16 left_variants
/// of Y) or Σ_{j >= 16a + 16} M[j][r] Yx[right_base(a) + j - 16a - 16][c] (right; Yx: bf16 right_variants of Y);
/// other elements untouched (a = 0, resp. a = 3, add nothing). M: a bf16 tile. Warp w's 2 x 2 fragments
/// (tile::Mma) cover row sub-chunks 2 (w / 4) + mt, so the depth range is warp-uniform.
template <bool kRight>
__device__ void offdiag_mma(const bf16* M, const bf16* Yx, Acc& acc) {
  const int w = Mma::warp(), l = Mma::lane(), c0 = 16 * (w & 3), m = l >> 3, i = l & 7;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    const int a = 2 * (w >> 2) + mt, d0 = kRight ? 16 * a + 16 : 0, d1 = kRight ? kN : 16 * a;
    const int y0 = kRight ? right_base(a) - d0 : left_base(a);  // Yx row of depth index 0
    for (int d = d0; d < d1; d += 16) {
      uint32_t fa[4], fb[4];  // as Mma::mma<kRight, false>: op(A) rows of sub-chunk a, op(B) the 64-wide Yx rows
      const int rr = 16 * a + 8 * (m & 1), dd = d + 8 * (m >> 1);
      if (kRight)
        ::llmt::cuda::mma::ldsm_x4_trans(fa, M + (dd + i) * kLdH + rr);
      else
        ::llmt::cuda::mma::ldsm_x4(fa, M + (rr + i) * kLdH + dd);
      ::llmt::cuda::mma::ldsm_x4_trans(fb, Yx + (y0 + d + 8 * (m & 1) + i) * kLdH + c0 + 8 * (m >> 1));
      mma_rows(acc, mt, fa, fb);
    }
  }
}

/// The thread's elements of the diagonal 16 x 16 sub-blocks of the decayed grams (diag_grams), warp-uniform: the
/// 136 elements c <= r of sub-block b's rows r = 16 b + ρ, c = 16 b + γ (γ <= ρ) as 64 pairs in one row,
/// columns γ = 2 p, 2 p + 1 (p < (ρ + 1) / 2; the second one the diagonal element for odd ρ), pair i = t % 64 of
/// row-major order to thread t of sub-block b = t / 64; the diagonal elements of the even rows, r = c = 16 (u / 8)
/// + 2 (u % 8), to the threads t = 224 + u of warp 7 besides (extra).
struct DiagElems {
  int r, c0, extra;
  __device__ DiagElems() {
    const int t = static_cast<int>(threadIdx.x), b = t >> 6, i = t & 63, u = t - 224;
    int rho = 1, first = 0;  // row ρ holds pairs first .. first + (ρ + 1) / 2 - 1
    while (first + (rho + 1) / 2 <= i) first += (rho + 1) / 2, ++rho;
    r = 16 * b + rho, c0 = 16 * b + 2 * (i - first);
    extra = u >= 0 ? 16 * (u >> 3) + 2 * (u & 7) : -1;
  }
};

/// The diagonal 16 x 16 sub-blocks of both decayed grams, element-wise in fp32 (no factoring, §7.3), for the
/// thread's elements (DiagElems de), each channel sum in order of d (fmaf) after the key tiles' before: for the
/// pair's columns c = c0 + e (e = 0, 1), qk[e] += Σ_d q_rd z_d, kk[e] += Σ_d k_rd z_d, z_d = k_cd E,
/// E = e^{Γ_rd - Γ_cd} formed once for both (kk of a diagonal element c = r is not used); for the extra diagonal
/// element x (E = e^0 = 1), qk[2] += Σ_d q_xd k_xd. X = q, Z = k (fp32 tiles).
__device__ void diag_grams(const float* X, const float* Z, const Gam& G, const DiagElems& de, float qk[3],
                           float kk[2]) {
  const int r = de.r * kLd, c0 = de.c0 * kLd, c1 = c0 + kLd;
  float sq0 = qk[0], sk0 = kk[0], sq1 = qk[1], sk1 = kk[1];
#pragma unroll 4
  for (int d = 0; d < kN; ++d) {
    const float x = X[r + d], y = Z[r + d];
    const float z0 = Z[c0 + d] * G.exp_diff(r + d, c0 + d), z1 = Z[c1 + d] * G.exp_diff(r + d, c1 + d);
    sq0 = fmaf(x, z0, sq0);
    sk0 = fmaf(y, z0, sk0);
    sq1 = fmaf(x, z1, sq1);
    sk1 = fmaf(y, z1, sk1);
  }
  qk[0] = sq0, kk[0] = sk0, qk[1] = sq1, kk[1] = sk1;
  if (de.extra >= 0) {
    const int x = de.extra * kLd;
    float sq = qk[2];
#pragma unroll 4
    for (int d = 0; d < kN; ++d) sq = fmaf(X[x + d], Z[x + d], sq);
    qk[2] = sq;
  }
}

/// tile::load(s[i], src[i], stride, rows, cols) for three tiles at once: s[i][r][c] = src[i][r stride + c] for
/// r < rows, c < cols, else 0. The thread's rows t / 64 + 4 j (column t % 64) through one row offset stepped by
/// 4 stride, and all 48 of its loads issued before its first shared store (one round trip for the three tiles).
/// No barrier.
__device__ __forceinline__ void load3(float* const (&s)[3], const float* const (&src)[3], int64_t stride, int rows,
                                      int cols) {
  const int c = static_cast<int>(threadIdx.x & 63), r0 = static_cast<int>(threadIdx.x >> 6);
  constexpr int kPer = kN * kN / tile::kThreads;
  float x[3][kPer];
  int64_t off = r0 * stride + c;
#pragma unroll
  for (int j = 0; j < kPer; ++j, off += 4 * stride) {
    const bool in = r0 + 4 * j < rows && c < cols;
#pragma unroll
    for (int i = 0; i < 3; ++i) x[i][j] = in ? src[i][off] : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < kPer; ++j)
#pragma unroll
    for (int i = 0; i < 3; ++i) s[i][(r0 + 4 * j) * kLd + c] = x[i][j];
}

// F1–F3 and F5 for chunk blockIdx.x of head blockIdx.y, as kda_wu_kernel: the off-diagonal sub-blocks of A and
// P on the tensor cores (bf16 operands scaled to their sub-chunk references, offdiag_gram_mma), the diagonal
// ones in fp32 (diag_grams), 𝒯 in fp32, then W = 𝒯 (diag(β) (K ⊙ e^Γ)) and U = 𝒯 diag(β) V on the tensor cores
// (𝒯 and the scaled rows rounded to bf16); Q^g, K^g, e^{Γ_C} and P (fp32) into the scratch. Per key tile of the
// A/P pass: g, q and k loaded together (load3; g over the bf16 operand tiles), Γ; the bf16 operands, Q^g, K^g,
// e^{Γ_C} and W's operand β_r e^{Γ_rc} k_rc (fp32, into the W rows, which F3's W step reads back and overwrites
// with W). F3 steps j < nkt (W of key tile j) and then the value tiles (U): each step's operand tile is fetched
// into registers (fetch_h) before the previous step's product, so its loads are in flight during it. Two blocks
// per SM (kWuMmaSmem, launch bounds): the other block computes while one waits for its loads.
// kSaved (the backward's wu with the forward's saved set, 𝒯 in a.Tm): 𝒯 read from a.Tm into a bf16 tile first
// (rounded as here), then per key tile only Γ, Q^g, K^g, e^{Γ_C} and W's operand, which goes straight into a bf16
// tile (the value the other path writes to the W rows and reads back, rounded once as it is there) for that key
// tile's W product; then with kU U's steps as here (without kU Δ is saved). The same bits of W, U; no A/P operands,
// A, P or inverse (keep_T unused). kU is true without kSaved.
template <bool kSaved, bool kU>
__global__ void __launch_bounds__(tile::kThreads, 2) kda_wu_mma_kernel(KdaFast a, bool keep_T) {
  static_assert(kSaved || kU, "wu without a saved set forms U");
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  float* beta = cv.take<float>(kN);
  double* part = cv.take<double>(4 * kN);
  const Gam G{cv.tile(), cv.tile()};
  float *sX = cv.tile(), *sZ = cv.tile();
  bf16 *hXr = cv.take<bf16>(kTileHalves), *hZr = cv.take<bf16>(kTileHalves);
  bf16* const hZv = kSaved ? nullptr : cv.take<bf16>(96 * kLdH);
  bf16* const hT = kSaved ? cv.take<bf16>(kTileHalves) : hXr;  // bf16 𝒯 (the other path: after the A/P pass)
  const Chunk ch(a, blockIdx.x, blockIdx.y);
  const int64_t K = a.K, V = a.V, HK = a.H * K;
  const int nkt = static_cast<int>((K + kN - 1) / kN), nsteps = nkt + static_cast<int>((V + kN - 1) / kN);
  load_beta(a, ch, beta);
  Acc kk, qk;  // off-diagonal sub-blocks: Σ_c k_rc k_jc E_rj,c, Σ_c q_rc k_jc E_rj,c
  kk.zero();
  qk.zero();
  const DiagElems de;
  float dqk[3] = {0, 0, 0}, dkk[2] = {0, 0};  // the thread's elements of the diagonal sub-blocks (diag_grams)
  if constexpr (kSaved) tile::load_h(hT, ch.square(a, a.Tm), kN, kN, kN);  // (read after the loop's barriers)
  for (int64_t k0 = 0; k0 < K; k0 += kN) {
    const int kc = tile_cols(K, k0);
    float* const sG = reinterpret_cast<float*>(hXr);  // g (a float tile over hXr, hZr until Γ is formed)
    __syncthreads();  // the last key tile's products have read the bf16 operands
    load3({sG, sX, sZ}, {ch.in(a, a.g, K, k0), ch.in(a, a.q, K, k0), ch.in(a, a.k, K, k0)}, HK, ch.n, kc);
    __syncthreads();
    gamma_cumsum(sG, kLd, part, G);  // (ends with a barrier: g read, hXr, hZr free)
    const int c = static_cast<int>(threadIdx.x & 63), r0 = static_cast<int>(threadIdx.x >> 6);
    if constexpr (!kSaved) {
#pragma unroll
      for (int it = 0; it < kN * kN / tile::kThreads; ++it) {  // the bf16 operands, rounded once (rows 4 it + r0)
        const int r = 4 * it + r0;
        const float e = G.exp_diff(r * kLd + c, 16 * (it >> 2) * kLd + c);  // (sub-chunk it / 4)
        hXr[r * kLdH + c] = __float2bfloat16_rn(sX[r * kLd + c] * e);
        hZr[r * kLdH + c] = __float2bfloat16_rn(sZ[r * kLd + c] * e);
      }
      left_variants(sZ, G, hZv);
    }
    float *qg = ch.rows(a, a.Qg, K, k0), *kg = ch.rows(a, a.Kg, K, k0), *wk = ch.rows(a, a.W, K, k0);
#pragma unroll
    for (int it = 0; it < kN * kN / tile::kThreads; ++it) {
      const int r = 4 * it + r0;
      if (r < ch.n && c < kc) {
        const float e = G.exp_at(r * kLd + c);
        qg[r * K + c] = e * sX[r * kLd + c];
        if constexpr (kSaved)
          hZr[r * kLdH + c] = __float2bfloat16_rn(beta[r] * e * sZ[r * kLd + c]);
        else
          wk[r * K + c] = beta[r] * e * sZ[r * kLd + c];  // F3's operand β_r e^{Γ_rc} k_rc
        kg[r * K + c] = G.exp_diff((ch.n - 1) * kLd + c, r * kLd + c) * sZ[r * kLd + c];
      } else if constexpr (kSaved) {
        hZr[r * kLdH + c] = __float2bfloat16_rn(0.0f);
      }
    }
    if (static_cast<int>(threadIdx.x) < kc)
      a.aC[(ch.bh * a.NC + ch.chunk) * K + k0 + threadIdx.x] = G.exp_at((ch.n - 1) * kLd + threadIdx.x);
    if constexpr (kSaved) {  // F3: W of this key tile, 𝒯 (diag(β) (K ⊙ e^Γ))
      __syncthreads();  // the operand complete
      Acc acc;
      acc.zero();
      Mma::mma<false, false>(hT, hZr, acc);
      store_acc<Mma>(acc, wk, K, ch.n, kc, Same{});
    } else {
      diag_grams(sX, sZ, G, de, dqk, dkk);
      __syncthreads();  // the bf16 operands complete
      offdiag_gram_mma(hZr, hZv, kk);
      offdiag_gram_mma(hXr, hZv, qk);
    }
  }
  if constexpr (!kU) return;
  __syncthreads();  // every read of sX (diag_grams), of Γ and of hZr done: sX takes P, Γ's tiles A and 𝒯
  float *sP = sX, *sA = G.hi, *sT = G.lo;
  if constexpr (!kSaved) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {  // F1: A_rj = β_r Σ_c k_rc k_jc E_rj,c (j < r); F5: P (j <= r); off the diagonal blocks
        const int r = Mma::row(i), c = Mma::col(j);
        sT[r * kLd + c] = r == c ? 1.0f : 0.0f;
        if ((r >> 4) == (c >> 4) && c <= r) continue;  // (the diagonal blocks' upper triangles: 0)
        sA[r * kLd + c] = c < r && r < ch.n ? beta[r] * kk.v[i][j] : 0.0f;
        sP[r * kLd + c] = c < r && r < ch.n ? qk.v[i][j] : 0.0f;
      }
#pragma unroll
    for (int e = 0; e < 2; ++e) {  // the diagonal blocks' lower triangles
      const int r = de.r, c = de.c0 + e;
      sA[r * kLd + c] = c < r && r < ch.n ? beta[r] * dkk[e] : 0.0f;
      sP[r * kLd + c] = r < ch.n ? dqk[e] : 0.0f;
    }
    if (de.extra >= 0) {
      sA[de.extra * kLd + de.extra] = 0.0f;
      sP[de.extra * kLd + de.extra] = de.extra < ch.n ? dqk[2] : 0.0f;
    }
  }
  // F3 step j's operand: the W rows of key tile j (β e^Γ k), or value tile j - nkt of v (its rows scaled by β); from
  // a saved 𝒯 the value tiles' steps only (j >= j0).
  const auto src = [&](int j) { return j < nkt ? ch.rows(a, a.W, K, j * kN) : ch.in(a, a.v, V, (j - nkt) * kN); };
  const auto stride = [&](int j) { return j < nkt ? K : a.H * V; };
  const auto cols = [&](int j) { return j < nkt ? tile_cols(K, j * kN) : tile_cols(V, (j - nkt) * kN); };
  const int j0 = kSaved ? nkt : 0;
  tile::HRegs x;
  tile::fetch_h(x, src(j0), stride(j0), ch.n, cols(j0));  // (the W rows' writers passed the last barrier)
  bf16* const hY = hZr;
  if constexpr (!kSaved) {
    __syncthreads();
    tile::store(sP, ch.square(a, a.P), kN, kN, kN);  // F5: P (j <= r < n, else 0)
    tile::tril_inverse_fast(sA, sT, ch.n);  // F2 (ends with a barrier; clobbers A's upper triangle, not read after)
    if (keep_T) tile::store(sT, ch.square(a, a.Tm), kN, kN, kN);
    tile::load_h(hT, sT, kLd, kN, kN);  // 𝒯 in bf16, once (its readers come after the next barrier)
  }
  for (int j = j0; j < nsteps; ++j) {  // F3: W = 𝒯 (diag(β) (K ⊙ e^Γ)), U = 𝒯 diag(β) V
    const bool w = j < nkt;
    tile::put_h(hY, x, ch.n, [&](int r) { return w ? 1.0f : beta[r]; });
    if (j + 1 < nsteps) tile::fetch_h(x, src(j + 1), stride(j + 1), ch.n, cols(j + 1));
    __syncthreads();
    Acc acc;
    acc.zero();
    Mma::mma<false, false>(hT, hY, acc);
    store_acc<Mma>(acc, w ? ch.rows(a, a.W, K, j * kN) : ch.rows(a, a.U, V, (j - nkt) * kN), w ? K : V, ch.n,
                   cols(j), Same{});
    __syncthreads();  // the product's readers of hY are done
  }
}

// Whether kda_scan_mma_kernel can stage the next chunk's W, K^g (fp32, 32 KiB per key tile) and e^{Γ_C} by
// cp.async: key_dim <= 128. At three key tiles the staging does not fit beside the rest.
constexpr bool scan_staged(int nkt) { return nkt <= 2; }

// Shared memory of kda_scan_mma_kernel for nkt key tiles: the fp32 state (each thread's 16 elements of each
// key tile, thread-major: read and written only by their owner), its bf16 copy, the chunk's W and K^g tiles
// (bf16, all key tiles) and Δ (bf16); when it stages, the fp32 staging tiles of the next chunk's W and K^g
// and two buffers of e^{Γ_C}. About 47 KiB per key tile, plus 32.5 KiB per key tile staged (95 KiB at key_dim
// 128, 160 KiB staged).
constexpr size_t scan_mma_smem(int nkt, bool stage) {
  return sizeof(float) * 16 * tile::kThreads * nkt + sizeof(bf16) * kTileHalves * (3 * nkt + 1) +
         (stage ? sizeof(float) * (2 * tile::kStageFloats + 2 * kN) * nkt : 0);
}

// F4, F7 for value tile blockIdx.x of head blockIdx.y, chunks in order, as kda_scan_kernel: stores h[n] (the
// fp32 state entering chunk n) and Δ = U - W h[n] (over U). Per chunk: W and K^g of all key tiles into bf16
// tiles, W S summed over the key tiles in registers, Δ (registers -> bf16 tile), then per key tile
// S = Diag(e^{Γ_C}) S + (K^g)^T Δ with S fp32 (shared, per thread) and its bf16 copy (the next W S). The next
// chunk's U is loaded into registers during F7. With stage (launcher: scan_staged) and 16-byte aligned rows of
// W, K^g, e^{Γ_C} (key_dim % 4 == 0), the next chunk's W and K^g tiles (into fp32 staging tiles; each thread
// rounds its own staged pieces, the arithmetic of load_h) and e^{Γ_C} (into the other of two buffers) are copied
// by cp.async while this chunk computes; otherwise W, K^g are loaded synchronously (load_h) and e^{Γ_C} read from
// global in F7. Same arithmetic either way.
__global__ void __launch_bounds__(tile::kThreads) kda_scan_mma_kernel(KdaFast a, bool stage) {
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  const int64_t K = a.K, V = a.V, v0 = static_cast<int64_t>(blockIdx.x) * kN;
  const int vc = tile_cols(V, v0);
  const int nkt = static_cast<int>((K + kN - 1) / kN);
  float* S = cv.take<float>(16 * tile::kThreads * nkt);
  bf16 *hS = cv.take<bf16>(kTileHalves * nkt), *hW = cv.take<bf16>(kTileHalves * nkt),
       *hK = cv.take<bf16>(kTileHalves * nkt), *hD = cv.take<bf16>(kTileHalves);
  // (stage) W, K^g of key tile kt at staging tiles 2 kt, 2 kt + 1; e^{Γ_C} of chunk c at gC + (c % 2) nkt kN.
  float* gWK = stage ? cv.take<float>(2 * nkt * tile::kStageFloats) : nullptr;
  float* gC = stage ? cv.take<float>(2 * nkt * kN) : nullptr;
  // (Every row of W, K^g and e^{Γ_C} starts a multiple of K floats after the tensor's start.)
  const bool staged = stage && tile::async_ok_f(a.W, K) && tile::async_ok_f(a.Kg, K) && tile::async_ok_f(a.aC, K);
  const int tid = static_cast<int>(threadIdx.x);
  // The cp.async operands of chunk c, one group: W, K^g (staging), e^{Γ_C} (channels past K zero-filled).
  const auto issue = [&](int64_t c) {
    const Chunk nx(a, c, blockIdx.y);
    for (int kt = 0; kt < nkt; ++kt) {
      const int kc = tile_cols(K, kt * kN);
      tile::stage_async(gWK + 2 * kt * tile::kStageFloats, nx.rows(a, a.W, K, kt * kN), K, nx.n, kc);
      tile::stage_async(gWK + (2 * kt + 1) * tile::kStageFloats, nx.rows(a, a.Kg, K, kt * kN), K, nx.n, kc);
    }
    if (tid < nkt * kN / 4) {
      const float* src = a.aC + (nx.bh * a.NC + c) * K;
      const int64_t m = K - 4 * tid < 4 ? (K - 4 * tid > 0 ? K - 4 * tid : 0) : 4;
      tile::cp_async16(gC + (c & 1) * nkt * kN + 4 * tid, m > 0 ? src + 4 * tid : src, static_cast<int>(4 * m));
    }
    tile::cp_async_commit();
  };
  // The chunk's W, K^g rows (contiguous) and U columns into L2.
  const auto prefetch = [&](int64_t c) {
    const Chunk nx(a, c, blockIdx.y);
    tile::prefetch_l2(nx.rows(a, a.W, K, 0), 0, 1, 4 * nx.n * K);
    tile::prefetch_l2(nx.rows(a, a.Kg, K, 0), 0, 1, 4 * nx.n * K);
    tile::prefetch_l2(nx.rows(a, a.U, V, v0), 4 * V, nx.n, 4 * vc);
  };
  tile::clear_state(S, hS, nkt);
  Acc d;  // the chunk's U (loaded a chunk ahead)
  {
    const Chunk c0(a, 0, blockIdx.y);
    load_acc<Mma>(d, c0.rows(a, a.U, V, v0), V, c0.n, vc);
  }
  if (staged) issue(0);
  if (a.NC > 1) prefetch(1);
  for (int64_t chunk = 0; chunk < a.NC; ++chunk) {
    const Chunk ch(a, chunk, blockIdx.y);
    if (chunk + 2 < a.NC) prefetch(chunk + 2);  // (the next chunk's copies and U loads are issued during this one)
    if (staged) tile::cp_async_wait<0>();  // this chunk's W, K^g, e^{Γ_C} (the barrier publishes e^{Γ_C})
    __syncthreads();  // the last chunk's readers of hW, hK, hD, gC and writers of hS are done
    for (int kt = 0; kt < nkt; ++kt) {
      const int kc = tile_cols(K, kt * kN);
      store_state(S + kt * 16 * tile::kThreads + tid, ch.state(a, a.h, kt * kN, v0), V, kc, vc);  // h[n]
      if (staged) {  // the thread's own staged pieces
        tile::put_h_staged(hW + kt * kTileHalves, gWK + 2 * kt * tile::kStageFloats, ch.n);
        tile::put_h_staged(hK + kt * kTileHalves, gWK + (2 * kt + 1) * tile::kStageFloats, ch.n);
      } else {
        tile::load_h(hW + kt * kTileHalves, ch.rows(a, a.W, K, kt * kN), K, ch.n, kc);
        tile::load_h(hK + kt * kTileHalves, ch.rows(a, a.Kg, K, kt * kN), K, ch.n, kc);
      }
    }
    // (The staging pieces were read by their own thread above; the other e^{Γ_C} buffer's readers, F7 of the
    // chunk before, passed the barrier above.)
    if (staged && chunk + 1 < a.NC) issue(chunk + 1);
    float* U = ch.rows(a, a.U, V, v0);
    __syncthreads();
    Acc acc;
    acc.zero();
    for (int kt = 0; kt < nkt; ++kt) Mma::mma<false, false>(hW + kt * kTileHalves, hS + kt * kTileHalves, acc);
    tile::delta_out<false>(d, acc, U, V, ch.n, vc, hD);  // F4: Δ = U - W S (0 outside the chunk)
    if (chunk + 1 < a.NC) {  // the next chunk's U, in flight during F7
      const Chunk nx(a, chunk + 1, blockIdx.y);
      load_acc<Mma>(d, nx.rows(a, a.U, V, v0), V, nx.n, vc);
    }
    __syncthreads();  // hD complete; every read of hS (W S) done
    const float* aCs = gC + (chunk & 1) * nkt * kN;
    for (int kt = 0; kt < nkt; ++kt) {  // F7: S = Diag(e^{Γ_C}) S + (K ⊙ e^{Γ_C-Γ})^T Δ
      acc.zero();
      Mma::mma<true, false>(hK + kt * kTileHalves, hD, acc);
      float* St = S + kt * 16 * tile::kThreads + tid;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float aC = staged ? aCs[kt * kN + Mma::row(i)] : state_decay<Mma>(a, ch, kt * kN, i);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          float& e = St[(4 * i + j) * tile::kThreads];
          e = aC * e + acc.v[i][j];
          acc.v[i][j] = e;
        }
      }
      tile::store_acc_h(acc, hS + kt * kTileHalves, Same{});
    }
  }
}

// Shared memory of kda_out_mma_kernel for nkt key tiles: bf16 Q^g and h (all key tiles), P and Δ.
constexpr size_t out_mma_smem(int nkt) { return sizeof(bf16) * kTileHalves * (2 * nkt + 2); }

// F6 for chunk blockIdx.x of head blockIdx.y, every value tile, as kda_out_kernel: Q^g and P loaded once,
// then per value tile O = Q^g h[n] + P Δ (summed over the key tiles in registers).
__global__ void __launch_bounds__(tile::kThreads) kda_out_mma_kernel(KdaFast a) {
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  const int64_t K = a.K, V = a.V;
  const int nkt = static_cast<int>((K + kN - 1) / kN);
  bf16 *hQ = cv.take<bf16>(kTileHalves * nkt), *hH = cv.take<bf16>(kTileHalves * nkt),
       *hP = cv.take<bf16>(kTileHalves), *hD = cv.take<bf16>(kTileHalves);
  const Chunk ch(a, blockIdx.x, blockIdx.y);
  for (int kt = 0; kt < nkt; ++kt)
    tile::load_h(hQ + kt * kTileHalves, ch.rows(a, a.Qg, K, kt * kN), K, ch.n, tile_cols(K, kt * kN));
  tile::load_h(hP, ch.square(a, a.P), kN, kN, kN);
  for (int64_t v0 = 0; v0 < V; v0 += kN) {
    const int vc = tile_cols(V, v0);
    for (int kt = 0; kt < nkt; ++kt)
      tile::load_h(hH + kt * kTileHalves, ch.state(a, a.h, kt * kN, v0), V, tile_cols(K, kt * kN), vc);
    tile::load_h(hD, ch.rows(a, a.U, V, v0), V, ch.n, vc);  // Δ
    __syncthreads();
    Acc acc;
    acc.zero();
    for (int kt = 0; kt < nkt; ++kt) Mma::mma<false, false>(hQ + kt * kTileHalves, hH + kt * kTileHalves, acc);
    Mma::mma<false, false>(hP, hD, acc);
    store_acc<Mma>(acc, ch.in(a, a.o, V, v0), a.H * V, ch.n, vc, Same{});
    __syncthreads();  // hH, hD are read
  }
}

// Shared memory of kda_dv_local_mma_kernel: bf16 P and dO.
constexpr size_t kDvLocalMmaSmem = sizeof(bf16) * kTileHalves * 2;

// B1 (intra-chunk part) for chunk blockIdx.x of head blockIdx.y, every value tile, as kda_dv_local_kernel:
// P loaded once, then dΔ = P^T dO per value tile.
__global__ void __launch_bounds__(tile::kThreads) kda_dv_local_mma_kernel(KdaFast a) {
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  bf16 *hP = cv.take<bf16>(kTileHalves), *hO = cv.take<bf16>(kTileHalves);
  const Chunk ch(a, blockIdx.x, blockIdx.y);
  const int64_t V = a.V;
  tile::load_h(hP, ch.square(a, a.P), kN, kN, kN);
  for (int64_t v0 = 0; v0 < V; v0 += kN) {
    const int vc = tile_cols(V, v0);
    tile::load_h(hO, ch.in(a, a.d_o, V, v0), a.H * V, ch.n, vc);
    __syncthreads();  // hP (first pass) and hO complete
    Acc acc;
    acc.zero();
    Mma::mma<true, false>(hP, hO, acc);
    store_acc<Mma>(acc, ch.rows(a, a.dD, V, v0), V, ch.n, vc, Same{});
    __syncthreads();  // hO is read
  }
}

// Whether kda_bwd_scan_mma_kernel stages the chunk before's K^g, Q^g and W (fp32 staging tiles, cp.async; 48 KiB
// per key tile): key_dim 65 .. 128, where its blocks are one per SM either way (122 KiB, 218 KiB staged). At
// key_dim <= 64 the staging would cut three blocks per SM to one; past 128 it does not fit.
constexpr bool bwd_scan_staged(int nkt) { return nkt == 2; }

// Shared memory of kda_bwd_scan_mma_kernel for nkt key tiles: the fp32 dS (per thread, as the scan's S), its
// bf16 copy, the chunk's K^g, Q^g and W tiles (bf16), dO and dΔ (bf16); when it stages, the fp32 staging tiles
// of the chunk before's K^g, Q^g and W. About 52 KiB per key tile, plus 48 KiB per key tile staged.
constexpr size_t bwd_scan_mma_smem(int nkt, bool stage) {
  return sizeof(float) * 16 * tile::kThreads * nkt + sizeof(bf16) * kTileHalves * (4 * nkt + 2) +
         (stage ? sizeof(float) * 3 * tile::kStageFloats * nkt : 0);
}

// B1 (state part) and B2 for value tile blockIdx.x of head blockIdx.y, chunks in reverse, as
// kda_bwd_scan_kernel: stores dh[n] (fp32 dS_C), dΔ += K^g dS_C (summed over the key tiles in registers),
// then per key tile dS = Diag(e^{Γ_C}) dS + (Q^g)^T dO - W^T dΔ. With stage (launcher: bwd_scan_staged) and
// 16-byte aligned rows of K^g, Q^g, W (key_dim % 4 == 0), the chunk before's K^g, Q^g and W tiles are copied
// into fp32 staging tiles by cp.async while this chunk computes (each thread rounds its own staged pieces, the
// arithmetic of load_h); otherwise they are loaded synchronously (load_h). Same arithmetic either way.
__global__ void __launch_bounds__(tile::kThreads) kda_bwd_scan_mma_kernel(KdaFast a, bool stage) {
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  const int64_t K = a.K, V = a.V, v0 = static_cast<int64_t>(blockIdx.x) * kN;
  const int vc = tile_cols(V, v0);
  const int nkt = static_cast<int>((K + kN - 1) / kN);
  float* dS = cv.take<float>(16 * tile::kThreads * nkt);
  bf16 *hS = cv.take<bf16>(kTileHalves * nkt), *hK = cv.take<bf16>(kTileHalves * nkt),
       *hQ = cv.take<bf16>(kTileHalves * nkt), *hW = cv.take<bf16>(kTileHalves * nkt),
       *hO = cv.take<bf16>(kTileHalves), *hE = cv.take<bf16>(kTileHalves);
  // (stage) K^g, Q^g, W of key tile kt at staging tiles 3 kt, 3 kt + 1, 3 kt + 2.
  float* gKQW = stage ? cv.take<float>(3 * nkt * tile::kStageFloats) : nullptr;
  // (Every row of K^g, Q^g and W starts a multiple of K floats after the tensor's start.)
  const bool staged = stage && tile::async_ok_f(a.Kg, K) && tile::async_ok_f(a.Qg, K) && tile::async_ok_f(a.W, K);
  const int tid = static_cast<int>(threadIdx.x);
  // The cp.async operands of chunk c (K^g, Q^g, W of every key tile), one group.
  const auto issue = [&](int64_t c) {
    const Chunk nx(a, c, blockIdx.y);
    for (int kt = 0; kt < nkt; ++kt) {
      const int kc = tile_cols(K, kt * kN);
      float* g = gKQW + 3 * kt * tile::kStageFloats;
      tile::stage_async(g, nx.rows(a, a.Kg, K, kt * kN), K, nx.n, kc);
      tile::stage_async(g + tile::kStageFloats, nx.rows(a, a.Qg, K, kt * kN), K, nx.n, kc);
      tile::stage_async(g + 2 * tile::kStageFloats, nx.rows(a, a.W, K, kt * kN), K, nx.n, kc);
    }
    tile::cp_async_commit();
  };
  // Chunk c's K^g, Q^g, W rows (contiguous) into L2.
  const auto prefetch_kqw = [&](int64_t c) {
    const Chunk nx(a, c, blockIdx.y);
    tile::prefetch_l2(nx.rows(a, a.Kg, K, 0), 0, 1, 4 * nx.n * K);
    tile::prefetch_l2(nx.rows(a, a.Qg, K, 0), 0, 1, 4 * nx.n * K);
    tile::prefetch_l2(nx.rows(a, a.W, K, 0), 0, 1, 4 * nx.n * K);
  };
  tile::clear_state(dS, hS, nkt);
  if (staged) {
    issue(a.NC - 1);
    if (a.NC > 1) prefetch_kqw(a.NC - 2);
  }
  for (int64_t chunk = a.NC - 1; chunk >= 0; --chunk) {
    const Chunk ch(a, chunk, blockIdx.y);
    if (chunk > 0) {  // the previous chunk's dO and dΔ columns (and, unstaged, K^g, Q^g, W) into L2
      const Chunk nx(a, chunk - 1, blockIdx.y);
      if (!staged) prefetch_kqw(chunk - 1);
      tile::prefetch_l2(nx.in(a, a.d_o, V, v0), 4 * a.H * V, nx.n, 4 * vc);
      tile::prefetch_l2(nx.rows(a, a.dD, V, v0), 4 * V, nx.n, 4 * vc);
    }
    // (staged: the chunk before's copies are issued during this chunk, so its L2 prefetch is two chunks ahead)
    if (staged && chunk > 1) prefetch_kqw(chunk - 2);
    if (staged) tile::cp_async_wait<0>();  // this chunk's K^g, Q^g, W (the thread's own pieces: no barrier needed)
    __syncthreads();  // the last chunk's readers of hK, hQ, hW, hO, hE and writers of hS are done
    for (int kt = 0; kt < nkt; ++kt) {
      const int kc = tile_cols(K, kt * kN);
      store_state(dS + kt * 16 * tile::kThreads + tid, ch.state(a, a.dh, kt * kN, v0), V, kc, vc);  // dh[n]
      if (staged) {  // the thread's own staged pieces
        const float* g = gKQW + 3 * kt * tile::kStageFloats;
        tile::put_h_staged(hK + kt * kTileHalves, g, ch.n);
        tile::put_h_staged(hQ + kt * kTileHalves, g + tile::kStageFloats, ch.n);
        tile::put_h_staged(hW + kt * kTileHalves, g + 2 * tile::kStageFloats, ch.n);
      } else {
        tile::load_h(hK + kt * kTileHalves, ch.rows(a, a.Kg, K, kt * kN), K, ch.n, kc);
        tile::load_h(hQ + kt * kTileHalves, ch.rows(a, a.Qg, K, kt * kN), K, ch.n, kc);
        tile::load_h(hW + kt * kTileHalves, ch.rows(a, a.W, K, kt * kN), K, ch.n, kc);
      }
    }
    // (The staging pieces were read by their own thread above.)
    if (staged && chunk > 0) issue(chunk - 1);
    tile::load_h(hO, ch.in(a, a.d_o, V, v0), a.H * V, ch.n, vc);
    float* dD = ch.rows(a, a.dD, V, v0);
    Acc d;
    load_acc<Mma>(d, dD, V, ch.n, vc);
    __syncthreads();
    Acc acc;
    acc.zero();
    for (int kt = 0; kt < nkt; ++kt) Mma::mma<false, false>(hK + kt * kTileHalves, hS + kt * kTileHalves, acc);
    tile::delta_out<true>(d, acc, dD, V, ch.n, vc, hE);  // B1: dΔ = P^T dO + K^g dS_C (0 outside the chunk)
    __syncthreads();  // hE complete; every read of hS (K^g dS) done
    for (int kt = 0; kt < nkt; ++kt) {  // B2
      Acc qd, wd;
      qd.zero();
      wd.zero();
      Mma::mma<true, false>(hQ + kt * kTileHalves, hO, qd);
      Mma::mma<true, false>(hW + kt * kTileHalves, hE, wd);
      float* St = dS + kt * 16 * tile::kThreads + tid;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float aC = state_decay<Mma>(a, ch, kt * kN, i);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          float& e = St[(4 * i + j) * tile::kThreads];
          e = aC * e + qd.v[i][j] - wd.v[i][j];
          qd.v[i][j] = e;
        }
      }
      tile::store_acc_h(qd, hS + kt * kTileHalves, Same{});
    }
  }
}

/// The diagonal 16 x 16 sub-blocks of a decayed_left and a decayed_right sum at once, element-wise in fp32 (§7.3):
/// thread t takes sub-chunk a = t / 64 and channel c = t % 64 and, with E = e^{Γ_rc - Γ_jc} formed once per pair
/// j <= r of the sub-chunk, writes DL[r][c] = Σ_{16a <= j <= r} ML[r][j] YL[j][c] E and
/// DR[j][c] = Σ_{j <= r < 16a + 16} MR[r][j] YR[r][c] E for the sub-chunk's rows (j, r in increasing order). All
/// fp32 tiles; M reads are warp-uniform, Y, Γ, D accesses conflict-free. No barrier. The j side (Γ_jc's parts,
/// YL[j][c]) is read once into registers. The row loop stays rolled (unrolled, the triangle is about 2,600
/// instructions run once per key tile, and its warps wait on instruction fetches); its pair steps go in groups of
/// four j (left after the last group with j <= r by a warp-uniform branch), each group's M loads issued together
/// and its steps independent until their sums, the steps j > r of the last group computed and discarded (select).
__device__ void diag_pairs(const float* ML, const float* YL, const float* MR, const float* YR, const Gam& G,
                           float* DL, float* DR) {
  const int t = static_cast<int>(threadIdx.x), c = t & 63, r0 = 16 * (t >> 6);
  float dr[16], hj[16], lj[16], yj[16];
#pragma unroll
  for (int q = 0; q < 16; ++q) {
    const int x = (r0 + q) * kLd + c;
    dr[q] = 0.0f, hj[q] = G.hi[x], lj[q] = G.lo[x], yj[q] = YL[x];
  }
#pragma unroll 1
  for (int rr = 0; rr < 16; ++rr) {
    const int r = r0 + rr, x = r * kLd + c, m = r * kLd + r0;
    const float yr = YR[x], hr = G.hi[x], lr = G.lo[x];
    float dl = 0.0f;
#pragma unroll
    for (int j4 = 0; j4 < 16; j4 += 4) {
      if (j4 > rr) break;
      float ml[4], mr[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) ml[e] = ML[m + j4 + e], mr[e] = MR[m + j4 + e];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int jj = j4 + e;
        const float ex = Gam::exp_parts(hr, lr, hj[jj], lj[jj]);
        const float tl = fmaf(ml[e] * yj[jj], ex, dl), tr = fmaf(mr[e] * yr, ex, dr[jj]);
        dl = jj <= rr ? tl : dl;
        dr[jj] = jj <= rr ? tr : dr[jj];
      }
    }
    DL[x] = dl;
  }
#pragma unroll
  for (int q = 0; q < 16; ++q) DR[(r0 + q) * kLd + c] = dr[q];
}

/// A decayed_left (kRight = false) or decayed_right (true) sum on the Mma element map from its parts:
/// acc(r, c) = e^{Γ_rc - ζ_ac} acc(r, c) + D[r][c] (left) or e^{η_ac - Γ_rc} acc(r, c) + D[r][c] (right), a = r / 16,
/// acc the off-diagonal sum of offdiag_mma (0 for a = 0, resp. a = 3; the factor is <= 1 there too), D the diagonal
/// one of diag_pairs.
template <bool kRight>
__device__ __forceinline__ void decayed_finish(const float* D, const Gam& G, Acc& acc) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = Mma::row(i), c = Mma::col(j), x = r * kLd + c;
      const float e = kRight ? G.exp_diff((r | 15) * kLd + c, x) : G.exp_diff(x, (r & ~15) * kLd + c);
      acc.v[i][j] = fmaf(e, acc.v[i][j], D[x]);
    }
}

/// The decayed_left sum L(r, c) = Σ_{j<=r} ML[r][j] YL[j][c] E_rj,c and the decayed_right sum
/// R(j, c) = Σ_{r>=j} MR[r][j] YR[r][c] E_rj,c of one key tile on the Mma element map (the step the two Mma
/// backward kernels share): YL's left variants into hYv and YR's right variants into hYw (96 rows each), the
/// diagonal sub-blocks in fp32 (diag_pairs from the fp32 ML, MR into DL, DR), a barrier, then the off-diagonal
/// ones on the tensor cores (offdiag_mma from the bf16 copies hML, hMR) and decayed_finish. Expects YL, YR, Γ
/// and ML, MR (fp32 and bf16) complete; ends without a barrier (hYv, hYw, DL, DR are read until the caller's next).
__device__ __forceinline__ void decayed_sums(const float* ML, const bf16* hML, const float* YL, const float* MR,
                                             const bf16* hMR, const float* YR, const Gam& G, bf16* hYv, bf16* hYw,
                                             float* DL, float* DR, Acc& left, Acc& right) {
  left_variants(YL, G, hYv);
  right_variants(YR, G, hYw);
  diag_pairs(ML, YL, MR, YR, G, DL, DR);
  __syncthreads();
  left.zero();
  right.zero();
  offdiag_mma<false>(hML, hYv, left);
  offdiag_mma<true>(hMR, hYw, right);
  decayed_finish<false>(DL, G, left);
  decayed_finish<true>(DR, G, right);
}

// Shared memory of the two Mma backward kernels: Small, Γ (two fp32 tiles), five more fp32 tiles, six bf16 ones and
// three fp32 staging tiles (cp.async of a key tile's g, k and q or dW: stage_key_tile).
// kda_bwd_dqk_mma_kernel: fp32 dP, q, k, the two diagonal parts; bf16 dP and a region of five bf16 tiles: the
// operands dO, h, Δ, dh, dΔ of one (key tile, value tile) step, then k's left and q's right variants (96 rows each).
// kda_bwd_wy_mma_kernel: fp32 K^d (then k), dΓ and its cumsum, dA, β dA; bf16 𝒯, d𝒯 (then dA), M1 (then β dA) and
// a region of three bf16 tiles: two operand tiles, then k's left and right variants (96 rows each).
// 225.3 KiB: one block per SM (as the registers allow anyway).
constexpr size_t kBwdMmaSmem = kSmallBytes + 7 * sizeof(float) * tile::kTileFloats + 6 * sizeof(bf16) * kTileHalves +
                               3 * sizeof(float) * tile::kStageFloats;
static_assert(kBwdMmaSmem <= 227 * 1024, "the Mma backward kernels' shared memory exceeds a block's 227 KiB");

/// The Mma backward kernels' cp.async group (one commit) of key tile k0: g and k (token rows) into the staging
/// tiles gS and gS + kStageFloats and, when x is given (x's tile at key tile k0, rows xs apart), x into
/// gS + 2 kStageFloats; rows >= ch.n and channels past key_dim zero-filled (tile::stage_async). Every row of g,
/// k, x 16-byte aligned (tile::async_ok_f).
__device__ __forceinline__ void stage_key_tile(const KdaFast& a, const Chunk& ch, int64_t k0, float* gS,
                                               const float* x, int64_t xs) {
  const int kc = tile_cols(a.K, k0);
  tile::stage_async(gS, ch.in(a, a.g, a.K, k0), a.H * a.K, ch.n, kc);
  tile::stage_async(gS + tile::kStageFloats, ch.in(a, a.k, a.K, k0), a.H * a.K, ch.n, kc);
  if (x != nullptr) tile::stage_async(gS + 2 * tile::kStageFloats, x, xs, ch.n, kc);
  tile::cp_async_commit();
}

// B3, B4 (P and state parts of dK), dW = -dΔ h^T and dΓ terms (i)–(iv) of B8 for chunk blockIdx.x of head
// blockIdx.y, as kda_bwd_dqk_kernel: dO Δ^T, and per key tile dO h^T, Δ dS_C^T, dΔ h^T (over the value tiles)
// on bf16 tiles with register accumulators; the decayed sums dq2 = Σ_{j<=r} dP_rj k_jc E_rj,c and
// dk2 = Σ_{i>=r} dP_ir q_ic E_ir,c with their off-diagonal sub-blocks on the tensor cores (offdiag_mma: bf16 dP
// and bf16 variants of k, q) and their diagonal ones in fp32 (diag_pairs: fp32 dP, q, k); Σ h ⊙ dh of (iv)
// from the fp32 states (global memory, at the thread's elements). Where every row of q, k, g is 16-byte aligned
// (key_dim % 4 == 0) a key tile's g, k, q are copied by cp.async (stage_key_tile) while the state products before
// their use run: key tile 0's at the start, the next one's as soon as the staging tiles are read; otherwise they
// are loaded synchronously (load_gamma, tile::load). Same arithmetic either way. The rows of the synchronous tile
// loads are asked of the L2 ahead (prefetch_l2, prefetch_span): dO, Δ, dΔ and key tile 0's h, dh at the start,
// the next key tile's h, dh after a key tile's state products.
__global__ void __launch_bounds__(tile::kThreads) kda_bwd_dqk_mma_kernel(KdaFast a) {
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  Small s(cv);
  const Gam G{cv.tile(), cv.tile()};
  float *sdP = cv.tile(), *sX = cv.tile(), *sZ = cv.tile(), *sDL = cv.tile(), *sDR = cv.tile();
  bf16 *hdP = cv.take<bf16>(kTileHalves), *hO = cv.take<bf16>(5 * kTileHalves);
  bf16 *hH = hO + kTileHalves, *hD = hO + 2 * kTileHalves, *hG = hO + 3 * kTileHalves, *hE = hO + 4 * kTileHalves;
  bf16 *hKv = hO, *hQw = hO + 96 * kLdH;  // the variants, once a key tile's products are done
  float* gS = cv.take<float>(3 * tile::kStageFloats);  // staging: g, k, q of a key tile
  const Chunk ch(a, blockIdx.x, blockIdx.y);
  const int64_t K = a.K, V = a.V;
  // (Every row of q, k, g starts a multiple of K floats after the tensor's start.)
  const bool staged = tile::async_ok_f(a.q, K) && tile::async_ok_f(a.k, K) && tile::async_ok_f(a.g, K);
  if (staged) stage_key_tile(a, ch, 0, gS, ch.in(a, a.q, K, 0), a.H * K);
  // L2 prefetches of the synchronous loads' rows: dO, Δ, dΔ (every value tile) and key tile 0's states h, dh, so
  // that only the first value tile of dO Δ^T waits for memory.
  tile::prefetch_l2(ch.in(a, a.d_o, V, 0), 4 * a.H * V, ch.n, 4 * V);
  prefetch_span(ch.rows(a, a.U, V, 0), static_cast<int>(4 * ch.n * V));  // (a chunk's scratch rows are contiguous)
  prefetch_span(ch.rows(a, a.dD, V, 0), static_cast<int>(4 * ch.n * V));
  const auto prefetch_states = [&](int64_t k0) {  // h, dh of key tile k0 (its rows of a chunk state are contiguous)
    prefetch_span(ch.state(a, a.h, k0, 0), static_cast<int>(4 * tile_cols(K, k0) * V));
    prefetch_span(ch.state(a, a.dh, k0, 0), static_cast<int>(4 * tile_cols(K, k0) * V));
  };
  prefetch_states(0);
  Acc dp;
  dp.zero();
  tile::acc_dO_delta(a, ch, hO, hD, dp);  // dO Δ^T
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // B3: dP = tril_{j<=r}(dO Δ^T), fp32 and bf16 (read after the next barrier)
      const int r = Mma::row(i), c = Mma::col(j);
      dp.v[i][j] = c <= r ? dp.v[i][j] : 0.0f;
      sdP[r * kLd + c] = dp.v[i][j];
    }
  tile::store_acc_h(dp, hdP, Same{});
  for (int64_t k0 = 0; k0 < K; k0 += kN) {
    const int kc = tile_cols(K, k0);
    Acc dqs, dks, dws;  // dO h^T, Δ dS_C^T, dΔ h^T
    float sd[4] = {0, 0, 0, 0};  // Σ_v h ⊙ dh of state rows (channels) Mma::row(i), this thread's share
    // h, dh in fp32 at the thread's elements, of the value tile the next per-tile step sums: loaded a value tile
    // ahead, so that the loads are in flight during the operand loads and products before.
    Acc hv, gv;
    load_acc<Mma>(hv, ch.state(a, a.h, k0, 0), V, kc, tile_cols(V, 0));
    load_acc<Mma>(gv, ch.state(a, a.dh, k0, 0), V, kc, tile_cols(V, 0));
    tile::state_products(a, ch, k0, kc, hO, hH, hD, hG, hE, dqs, dks, dws, [&](int64_t v0, int) {
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) sd[i] += hv.v[i][j] * gv.v[i][j];
      if (v0 + kN < V) {
        load_acc<Mma>(hv, ch.state(a, a.h, k0, v0 + kN), V, kc, tile_cols(V, v0 + kN));
        load_acc<Mma>(gv, ch.state(a, a.dh, k0, v0 + kN), V, kc, tile_cols(V, v0 + kN));
      }
    });
    if (k0 + kN < K) prefetch_states(k0 + kN);  // (read after this key tile's decayed sums)
    store_acc<Mma>(dws, ch.rows(a, a.dW, K, k0), K, ch.n, kc, [](int, int, float x) { return -x; });  // dW
    key_gamma(a, ch, k0, staged, gS, sX, s.part, G);  // (its first barrier: the last key tile's readers are done)
    if (staged) {  // the thread's own staged pieces (the g tile's readers passed key_gamma's last barrier)
      put_rc_staged(sX, gS + 2 * tile::kStageFloats, ch.n, kc, [](int, int) { return 1.0f; });
      put_rc_staged(sZ, gS + tile::kStageFloats, ch.n, kc, [](int, int) { return 1.0f; });
      if (k0 + kN < K) stage_key_tile(a, ch, k0 + kN, gS, ch.in(a, a.q, K, k0 + kN), a.H * K);
    } else {
      tile::load(sX, ch.in(a, a.q, K, k0), a.H * K, ch.n, kc);
      tile::load(sZ, ch.in(a, a.k, K, k0), a.H * K, ch.n, kc);
    }
    __syncthreads();
    Acc dq2, dk2;
    decayed_sums(sdP, hdP, sZ, sdP, hdP, sX, G, hKv, hQw, sDL, sDR, dq2, dk2);
    // (dqk_store's barrier: hKv, hQw, sDL, sDR are read before the next key tile writes them)
    dqk_store<Mma>(a, ch, s, k0, kc, G, sX, sZ, dqs, dks, dq2, dk2, sd);
  }
}

// B5–B7, B8 (v)–(vi) and B9 for chunk blockIdx.x of head blockIdx.y, as kda_bwd_wy_kernel: 𝒯^T dΔ, dΔ V^T,
// 𝒯^T dW, dW (K^d)^T, 𝒯^T d𝒯 and M1 𝒯^T on bf16 tiles (𝒯 rounded once) with register accumulators; the decayed
// sums xr = Σ_{j<r} dA_rj k_jc E_rj,c and yc = Σ_{r>j} β_r dA_rj k_rc E_rj,c with their off-diagonal sub-blocks
// on the tensor cores (offdiag_mma: bf16 dA, β dA and variants of k) and their diagonal ones in fp32 (diag_pairs:
// fp32 dA, β dA, k); v read in fp32 at the thread's elements (global memory) for dβ.
// The key tiles' inputs go through a sequence of steps: j < nkt the W side's key tile j (g, k, dW), then B7's key
// tile j - nkt (g, k). Where every row of k, g and dW is 16-byte aligned (key_dim % 4 == 0) each step's tiles are
// copied by cp.async (stage_key_tile): step 0's at the start (landing during the U side), the next step's as soon
// as the staging tiles are read; otherwise each step loads them synchronously (load_gamma, load_h, load_rc,
// tile::load). Same arithmetic either way. 𝒯 and the U side's dΔ, v rows are asked of the L2 at the start
// (prefetch_span, prefetch_l2). Each key tile step reads its dK, dΓ (DkDgam) where it updates them, after the
// products: issuing those loads at the step's start measured slower (wy 2.02 -> 2.57 ms at (a), 241 registers).
__global__ void __launch_bounds__(tile::kThreads) kda_bwd_wy_mma_kernel(KdaFast a) {
  extern __shared__ __align__(16) char smem[];
  Carve cv{smem};
  Small s(cv);
  const Gam G{cv.tile(), cv.tile()};
  float *sX = cv.tile(), *sY = cv.tile(), *sZ = cv.tile(), *sA = cv.tile(), *sB = cv.tile();
  bf16 *hT = cv.take<bf16>(kTileHalves), *hA = cv.take<bf16>(kTileHalves), *hB = cv.take<bf16>(kTileHalves),
       *hY = cv.take<bf16>(3 * kTileHalves);
  bf16 *hZ = hY + kTileHalves, *hKv = hY, *hKw = hY + 96 * kLdH;  // hKv, hKw: in B7
  float* gS = cv.take<float>(3 * tile::kStageFloats);  // staging: g, k (and dW) of a step
  const Chunk ch(a, blockIdx.x, blockIdx.y);
  const int64_t K = a.K;
  const int nkt = static_cast<int>((K + kN - 1) / kN);
  // (Every row of k, g starts a multiple of K floats after the tensor's start, of dW (scratch) too.)
  const bool staged = tile::async_ok_f(a.k, K) && tile::async_ok_f(a.g, K) && tile::async_ok_f(a.dW, K);
  const auto issue = [&](int j) {  // step j's tiles
    const int64_t k0 = static_cast<int64_t>(j < nkt ? j : j - nkt) * kN;
    stage_key_tile(a, ch, k0, gS, j < nkt ? ch.rows(a, a.dW, K, k0) : nullptr, K);
  };
  if (staged) issue(0);
  // L2 prefetches of the synchronous loads' rows: 𝒯 (during β's load) and the U side's dΔ, v (every value tile).
  prefetch_span(ch.square(a, a.Tm), 4 * kN * kN);
  prefetch_span(ch.rows(a, a.dD, a.V, 0), static_cast<int>(4 * ch.n * a.V));  // (a chunk's scratch rows are contiguous)
  tile::prefetch_l2(ch.in(a, a.v, a.V, 0), 4 * a.H * a.V, ch.n, 4 * a.V);
  load_beta(a, ch, s.beta);
  tile::load_h(hT, ch.square(a, a.Tm), kN, kN, kN);
  float db_part[4] = {0, 0, 0, 0}, none[4] = {0, 0, 0, 0};
  Acc dtv, dtw;  // dΔ V^T, dW (K^d)^T
  dtv.zero();
  dtw.zero();
  tile::wy_u_side(a, ch, s.beta, hT, hZ, hY, dtv, db_part);  // B5, U side: X_U = 𝒯^T dΔ, dV = β X_U
  for (int64_t k0 = 0; k0 < K; k0 += kN) {  // B5, W side: X_W = 𝒯^T dW; dK += β X_W ⊙ e^Γ; B8 (v)
    const int kc = tile_cols(K, k0);
    key_gamma(a, ch, k0, staged, gS, sX, s.part, G);
    const auto kd = [&](int r, int c) { return G.exp_at(r * kLd + c); };
    if (staged) {  // the thread's own staged pieces (the g tile's readers passed key_gamma's last barrier)
      tile::put_h_staged(hZ, gS + 2 * tile::kStageFloats, ch.n);
      put_rc_staged(sX, gS + tile::kStageFloats, ch.n, kc, kd);
      issue(static_cast<int>(k0 / kN) + 1);  // (B7's key tile 0 after the last one)
    } else {
      tile::load_h(hZ, ch.rows(a, a.dW, K, k0), K, ch.n, kc);
      tile::load_rc(sX, ch.in(a, a.k, K, k0), a.H * K, ch.n, kc, kd);
    }
    __syncthreads();
    tile::load_h(hY, sX, kLd, kN, kN);  // K^d in bf16
    __syncthreads();
    wy_w_step<Mma>(a, ch, s, k0, kc, G, hT, hZ, hY, sX, dtw, db_part);
  }
  wy_dT<Mma>(dtv, dtw, s.beta);  // B6
  Acc m;
  tile::wy_m1(dtv, hT, hA, hB, m);  // M1 𝒯^T, M1 = 𝒯^T d𝒯
  __syncthreads();  // hB is read: hA, hB take dA, β dA below
  Acc bm;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // dA (j < r < n) into sA, hA; β_r dA_rj into sB, hB
      const int r = Mma::row(i), c = Mma::col(j);
      m.v[i][j] = c < r && r < ch.n ? -m.v[i][j] : 0.0f;
      bm.v[i][j] = s.beta[r] * m.v[i][j];
      sA[r * kLd + c] = m.v[i][j];
      sB[r * kLd + c] = bm.v[i][j];
    }
  tile::store_acc_h(m, hA, Same{});
  tile::store_acc_h(bm, hB, Same{});
  for (int64_t k0 = 0; k0 < K; k0 += kN) {  // B7, B8 (vi), B9
    const int kc = tile_cols(K, k0);
    key_gamma(a, ch, k0, staged, gS, sX, s.part, G);  // (its first barrier also publishes sA, sB, hA, hB)
    if (staged) {  // the thread's own staged pieces (the g tile's readers passed key_gamma's last barrier)
      put_rc_staged(sX, gS + tile::kStageFloats, ch.n, kc, [](int, int) { return 1.0f; });
      if (k0 + kN < K) issue(nkt + static_cast<int>(k0 / kN) + 1);
    } else {
      tile::load(sX, ch.in(a, a.k, K, k0), a.H * K, ch.n, kc);
    }
    __syncthreads();
    Acc xr, yc;  // diagonal parts into sY, sZ: free until wy_b7_store, which reads them first
    decayed_sums(sA, hA, sX, sB, hB, sX, G, hKv, hKw, sY, sZ, xr, yc);
    wy_b7_store<Mma>(a, ch, s, k0, kc, sX, xr, yc, sY, sZ, db_part);
  }
  tile::reduce_rows_cols<Mma>(db_part, none, s.red, s.out1);
  const int r = static_cast<int>(threadIdx.x);
  if (r < ch.n) a.dbeta[ch.gate(a, r)] = s.out1[r];
}

// ---- host side ----

/// Dynamic shared memory of a kernel with `tiles` float tiles (Γ's two included) and, when `small`, the
/// Small arrays.
constexpr size_t smem_for(int tiles, bool small) { return tile::smem_bytes(tiles, small ? kSmallBytes : 0); }

void check_chunk(int64_t chunk_size) {
  check(chunk_size >= 1 && chunk_size <= kKdaMaxChunk, "kda chunk (cuda): chunk_size must be in [1, {}], got {}",
        kKdaMaxChunk, chunk_size);
}

/// The products' layout (delta_tile.cuh).
using Layout = tile::Simt;

template <typename Kernel, typename... Extra>
void launch(Kernel kernel, dim3 grid, size_t smem, cudaStream_t stream, const KdaFast& a, Extra... extra) {
  tile::launch("kda chunk", a.K, kernel, grid, smem, stream, a, extra...);
}

/// The arguments of one core call; P, 𝒯 and with `states` U/Δ and h in `saved` (kda_saved_floats, KdaSaved) when
/// not nullptr, else in the scratch (𝒯 in the backward's only).
KdaFast make_args(const float* q, const float* k, const float* v, const float* g, const float* beta, int64_t B,
                  int64_t T, int64_t H, int64_t K, int64_t V, int64_t C, const float* saved, bool states,
                  void* scratch, bool backward) {
  KdaFast a{};
  a.q = q, a.k = k, a.v = v, a.g = g, a.beta = beta;
  a.B = B, a.T = T, a.H = H, a.K = K, a.V = V, a.C = C, a.NC = ceil_div(T, C);
  const KdaScratch l(B, T, H, K, V, C, backward, saved != nullptr, states);
  float* base = static_cast<float*>(scratch);
  a.W = base + l.W, a.Qg = base + l.Qg, a.Kg = base + l.Kg, a.aC = base + l.aC;
  if (backward) a.dD = base + l.dD, a.dh = base + l.dh, a.dW = base + l.dW, a.dgam = base + l.dgam;
  a.U = base + l.U, a.h = base + l.h;  // (unless saved with states)
  if (saved != nullptr) {  // (the backward only reads it)
    const KdaSaved sv(B, T, H, K, V, C, states);
    float* const p = const_cast<float*>(saved);
    a.P = p + sv.P, a.Tm = p + sv.Tm;
    if (states) a.U = p + sv.U, a.h = p + sv.h;
  } else {
    a.P = base + l.P;
    if (backward) a.Tm = base + l.Tm;
  }
  return a;
}

/// Whether P (the compute dtype's operand type) runs the bf16 phases on tile::Mma.
template <typename P>
constexpr bool kBf16 = std::is_same_v<P, __nv_bfloat16>;

/// Whether a tile::Mma kernel needing `smem` bytes fits one block (227 KiB); else its fp32 version runs.
bool fits(size_t smem) { return smem <= 227 * 1024; }

// wu: W, U, P, Q^g, K^g, e^{Γ_C} (and 𝒯 when keep_T); with from_saved (the backward given the forward's saved
// set) only W, Q^g, K^g, e^{Γ_C} and, with form_U (h and Δ not saved), U, from the 𝒯 in a.Tm. bf16 on tile::Mma.
template <typename P>
void wu(const KdaFast& a, bool keep_T, bool from_saved, bool form_U, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.NC), static_cast<unsigned>(a.B * a.H));
  const auto run = [&](auto saved_c, auto u_c) {
    constexpr bool kSaved = decltype(saved_c)::value, kU = decltype(u_c)::value;
    if (kBf16<P>)
      launch(kda_wu_mma_kernel<kSaved, kU>, grid, kWuMmaSmem<kSaved>, stream, a, keep_T);
    else
      launch(kda_wu_kernel<Layout, kSaved, kU>, grid, smem_for(10, true), stream, a, keep_T);
  };
  if (!from_saved)
    run(std::false_type{}, std::true_type{});
  else if (form_U)
    run(std::true_type{}, std::true_type{});
  else
    run(std::true_type{}, std::false_type{});
}

// scan: W, U, K^g, e^{Γ_C} -> Δ (over U), h. bf16 on tile::Mma (16 + 27 KiB of shared memory per key tile and
// 9 KiB: key_dim <= 320 there). It stages its operands (scan_staged: key_dim <= 128) only where its blocks have an
// SM each anyway (value tiles x heads <= SMs); with more blocks, two unstaged blocks per SM (as their shared memory
// allows) hide each other's latencies instead.
template <typename P>
void scan(const KdaFast& a, cudaStream_t stream) {
  using L = Layout;
  const unsigned BH = static_cast<unsigned>(a.B * a.H);
  const unsigned nvt = static_cast<unsigned>(ceil_div(a.V, kN));
  const int nkt = static_cast<int>(ceil_div(a.K, kN));
  const bool stage = scan_staged(nkt) && static_cast<int64_t>(nvt) * BH <= sm_count();
  if (kBf16<P> && fits(scan_mma_smem(nkt, stage)))
    launch(kda_scan_mma_kernel, dim3(nvt, BH), scan_mma_smem(nkt, stage), stream, a, stage);
  else
    launch(kda_scan_kernel<L>, dim3(nvt, BH), smem_for(2 + nkt, false), stream, a);
}

}  // namespace

size_t kda_chunk_fwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim,
                                   int64_t value_dim, int64_t chunk_size, bool saved, bool states) {
  const KdaScratch l(batch, seq_len, heads, key_dim, value_dim, chunk_size, false, saved, states);
  return sizeof(float) * static_cast<size_t>(l.total);
}

size_t kda_chunk_bwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim,
                                   int64_t value_dim, int64_t chunk_size, bool saved, bool states) {
  const KdaScratch l(batch, seq_len, heads, key_dim, value_dim, chunk_size, true, saved, states);
  return sizeof(float) * static_cast<size_t>(l.total);
}

int64_t kda_saved_floats(int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim, int64_t value_dim,
                         int64_t chunk_size, bool states) {
  check_chunk(chunk_size);
  return KdaSaved(batch, seq_len, heads, key_dim, value_dim, chunk_size, states).total;
}

template <typename P>
void kda_chunk_fwd(const float* q, const float* k, const float* v, const float* g, const float* beta, int64_t batch,
                   int64_t seq_len, int64_t heads, int64_t key_dim, int64_t value_dim, int64_t chunk_size, float* o,
                   float* saved, bool states, void* scratch, cudaStream_t stream) {
  check_chunk(chunk_size);
  if (batch * heads == 0 || seq_len == 0 || value_dim == 0) return;
  KdaFast a = make_args(q, k, v, g, beta, batch, seq_len, heads, key_dim, value_dim, chunk_size, saved, states,
                        scratch, false);
  a.o = o;
  wu<P>(a, saved != nullptr, false, true, stream);
  scan<P>(a, stream);
  const unsigned NC = static_cast<unsigned>(a.NC), BH = static_cast<unsigned>(batch * heads);
  const int nkt = static_cast<int>(ceil_div(key_dim, kN));
  if (kBf16<P> && fits(out_mma_smem(nkt)))
    launch(kda_out_mma_kernel, dim3(NC, BH), out_mma_smem(nkt), stream, a);
  else
    launch(kda_out_kernel<Layout>, dim3(NC, BH, static_cast<unsigned>(ceil_div(value_dim, kN))), smem_for(3, false),
           stream, a);
}

template <typename P>
void kda_chunk_bwd(const float* q, const float* k, const float* v, const float* g, const float* beta,
                   const float* d_o, const float* saved, bool states, int64_t batch, int64_t seq_len, int64_t heads,
                   int64_t key_dim, int64_t value_dim, int64_t chunk_size, float* dq, float* dk, float* dv, float* dg,
                   float* dbeta, void* scratch, cudaStream_t stream) {
  using L = Layout;
  check_chunk(chunk_size);
  if (batch * heads == 0 || seq_len == 0) return;
  if (value_dim == 0) {  // o = 0: every gradient is 0
    const size_t rows = static_cast<size_t>(batch * seq_len * heads);
    for (float* x : {dq, dk, dg}) LLMT_CUDA_CHECK(cudaMemsetAsync(x, 0, sizeof(float) * rows * key_dim, stream));
    LLMT_CUDA_CHECK(cudaMemsetAsync(dbeta, 0, sizeof(float) * rows, stream));
    return;
  }
  KdaFast a = make_args(q, k, v, g, beta, batch, seq_len, heads, key_dim, value_dim, chunk_size, saved, states,
                        scratch, true);
  a.d_o = d_o;
  a.dq = dq, a.dk = dk, a.dv = dv, a.dg = dg, a.dbeta = dbeta;
  const bool kept = saved != nullptr && states;  // h and Δ the forward's, in saved
  wu<P>(a, saved == nullptr, saved != nullptr, !kept, stream);
  if (!kept) scan<P>(a, stream);
  const unsigned BH = static_cast<unsigned>(batch * heads), NC = static_cast<unsigned>(a.NC);
  const unsigned nvt = static_cast<unsigned>(ceil_div(value_dim, kN));
  const int nkt = static_cast<int>(ceil_div(key_dim, kN));
  if (kBf16<P>)
    launch(kda_dv_local_mma_kernel, dim3(NC, BH), kDvLocalMmaSmem, stream, a);
  else
    launch(kda_dv_local_kernel<L>, dim3(NC, BH, nvt), smem_for(2, false), stream, a);
  const bool bwd_stage = bwd_scan_staged(nkt);
  if (kBf16<P> && fits(bwd_scan_mma_smem(nkt, bwd_stage)))  // key_dim <= 256 (226 KiB at 256)
    launch(kda_bwd_scan_mma_kernel, dim3(nvt, BH), bwd_scan_mma_smem(nkt, bwd_stage), stream, a, bwd_stage);
  else
    launch(kda_bwd_scan_kernel<L>, dim3(nvt, BH), smem_for(4 + nkt, false), stream, a);
  if (kBf16<P>) {
    launch(kda_bwd_dqk_mma_kernel, dim3(NC, BH), kBwdMmaSmem, stream, a);
    launch(kda_bwd_wy_mma_kernel, dim3(NC, BH), kBwdMmaSmem, stream, a);
  } else {
    launch(kda_bwd_dqk_kernel<L>, dim3(NC, BH), smem_for(10, true), stream, a);
    launch(kda_bwd_wy_kernel<L>, dim3(NC, BH), smem_for(12, true), stream, a);
  }
}

#define LLMT_KDA_INSTANTIATE(P)                                                                                     \
  template void kda_chunk_fwd<P>(const float*, const float*, const float*, const float*, const float*, int64_t,     \
                                 int64_t, int64_t, int64_t, int64_t, int64_t, float*, float*, bool, void*,          \
                                 cudaStream_t);                                                                     \
  template void kda_chunk_bwd<P>(const float*, const float*, const float*, const float*, const float*, const float*, \
                                 const float*, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float*,   \
                                 float*, float*, float*, float*, void*, cudaStream_t);
LLMT_KDA_INSTANTIATE(float)
LLMT_KDA_INSTANTIATE(__nv_bfloat16)
#undef LLMT_KDA_INSTANTIATE

}  // namespace llmt::cuda
