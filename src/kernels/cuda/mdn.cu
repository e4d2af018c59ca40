// MDN (Momentum DeltaNet) core, chunked, fp32 tensors (mdn.md §6.2 with the stable coefficients of §6.4, §6.5 for
// a shorter last chunk; backward §7.3), zero initial states. Mirrors src/kernels/cpu/mdn.cpp (mdn_chunk_fwd,
// mdn_chunk_bwd) step by step. Chunk-parallel design (layers-delta.md §6, as gdn_comba.cu / kda.cu), 256 threads
// (tile::kThreads) per block, grids built with tile::launch; products over K or V on the 64 x 64 shared tiles of
// delta_tile.cuh, every kernel with products written once against a layout L (see Precision):
// Precision: the launchers' P (the layer's compute dtype) picks L; everything else is shared.
// P = float (fp32 models): L = tile::Simt, exact fp32 products on the CUDA cores (results the CPU's up to fp32
// rounding).
// P = __nv_bfloat16 (bf16 models; the authors' and FLA's precision): L = tile::Mma, every 64 x 64 x 64 product on the
// tensor cores (mma.sync m16n8k16, ldmatrix) with both operands bf16 tiles in shared memory and fp32 accumulation
// in registers (sums over several key or value tiles never leave them). Each operand is rounded to bf16 once,
// where it is loaded or formed (scaled first in fp32 where it carries a gate factor): q, k, η k, α k, v-side
// tiles (v via R, Ṽ, dO, dR), 𝒯, E = (Q K̂^T) ⊙ Γ (the bscan's formed by the coef kernel, kept in its image), R,
// the scaled Ṽ and dR rows, the scaled dO rows, dEG, dWG and the states S_0, M_0, dS, dM (staged per key tile from
// the fp32 slabs, or in the solving scan and the bscan from the registers that hold the new states, and rounded once
// more, to the same bf16, where the scans store them: the chunk-state scratch holds operand-type elements, bf16 on
// Mma as FLA's h, so out and brow load exactly the operands they used to round from fp32, and bchunk's sums
// ⟨S_0, dS⟩, ⟨M_0, dS⟩, ⟨M_0, dM⟩ read the rounded states). fp32 stays fp32: the running states S, M and their
// gradients (shared slabs), Ṽ and the saved residuals, the rest of the global scratch (coefficient images but E,
// rowk, dew), the
// coefficients (L_A, L_U, Γ, b, W and 𝒯 = (I + W)^{-1}: gates and segment sums in
// double, the inverse in fp32: row by row on Simt, blocked in 16 x 16 blocks on Mma), the products' results, and
// every element-wise and reduction step (the whole bchunk kernel). The key products Q K̂^T and P K̂^T that feed Γ-weighted W and E are bf16-operand products.
//   coef   (chunks, B H)      per chunk: the chunk-local coefficients (L_A, L_U, Γ, the key products,
//                             𝒯 = (I + W)^{-1}, the decay vectors; bf16: E = (Q K̂^T) ⊙ Γ as a bf16 tile) into
//                             global scratch, as one contiguous image (each value written by the thread that forms
//                             it) that later kernels read back;
//   scan   (value tiles, B H) sequential over chunks; the two state slabs S, M [K, 64] of a value tile in shared
//                             memory; stores each chunk's entering states (S_0, M_0) and solves for its corrected
//                             values Ṽ (stored [B, T, H, V]: into scratch, or into the caller's residuals tensor);
//                             a chunk's state update also stores the new states and forms the next chunk's
//                             S_0^T k, M_0^T k key tile by key tile; bf16: the next chunk's operands land by
//                             cp.async while a chunk runs;
//   out    (chunks, B H)      O = Diag(ᾱ) Q S_0 - Diag(b) Q M_0 + ((Q K̂^T) ⊙ Γ) Ṽ; bf16: Q's key tiles loaded once
//                             for all value tiles, the chunk-state tiles by cp.async into a ring up to 3 (value
//                             tile, key tile) steps ahead, Ṽ one value tile ahead in registers;
// The backward recomputes coef and the chunk-start states: with the forward's Ṽ saved (save_residuals, mdn.md
// §7.1: the authors' design, chunk states recomputed, corrected values saved) the states-only scan advances them
// from the saved Ṽ; without, the scan solves for Ṽ again as the forward. Both give the same states bit for bit
// (the same Ṽ bits, the same state-update code, advance_states):
//   state scan (value tiles x key tiles, B H) sequential over chunks; no triangular solve, no S_0^T k products, so
//                             a key tile's update needs only its own states: one block per key tile, the states
//                             of its 64 x 64 tile in registers; stores the tile's rows of each chunk's (S_0, M_0);
//                             bf16: the next chunk's Ṽ and k rows land by cp.async while a chunk runs.
// Then
//   bscan  (value tiles, B H) reverse over chunks; the state-gradient slabs dS, dM [K, 64] in shared memory;
//                             stores each chunk's exit gradients (dL/dS_next, dL/dM_next), dṼ -> dR = 𝒯^T dṼ = dv,
//                             and carries (dS, dM) to the chunk start; bf16: the chunk before's dS^T k, dM^T k and
//                             dstates are formed key tile by key tile inside the carry update, and every operand
//                             (the chunk before's 𝒯, E from the coef image, dO, vectors) is in flight in registers
//                             ahead of its use;
//   brow   (chunks, B H)      the products over V (dO Ṽ^T, dR Ṽ^T, S_0 dO_i, M_0 dO_i, S_0 dR_i, M_0 dR_i, dS Ṽ_i,
//                             dM Ṽ_i) and the intra-chunk sums over tokens of dq, dp, dk̂; bf16 (aligned dims): one
//                             pipeline of (product, value tile) steps, each step's operands by cp.async a step ahead;
//   bchunk (chunks, B H)      everything else of §7.3 for one chunk (dq, dk, dη, dβ, d log α, d log μ).
// Launch order: coef over every (batch, head) pair, then per group of pairs the forward's scan and out, or the
// backward's bscan, states-only scan, brow and bchunk. Pairs form one group unless the scan's value-tile blocks
// span more than one wave of the GPU but not a whole number of waves (shape (c): 24 pairs x 8 value tiles, one
// block per SM): then the last wave's pairs run as a second group on a side stream (by_waves), and the first
// group's per-chunk kernels fill the SMs that the last wave of scans leaves idle.
// The segment sums Σ_{u=r+1..i} log α_u and Σ_{u=j+1..r} log μ_u are formed directly in double (never as a
// difference of cumsums), so every exponent is <= 0, log μ = -inf gives exact zeros (μ = 0: GDN) and μ << α
// loses nothing to cancellation. Every output and scratch element is computed by one thread with a fixed
// summation order and block reductions use a fixed tree: deterministic, no atomics. Value columns are
// independent in the scans (every state column j depends only on column j of V, dO, Ṽ, dR), so a value tile's
// scan is exact without the others.
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

using tile::kN;
using bf16 = __nv_bfloat16;

// ---- operand tiles of a layout (see Precision above) ----
// L = tile::Simt: fp32 tiles (row stride tile::kLd); L = tile::Mma: bf16 tiles (row stride tile::kLdH), every
// element rounded to bf16 (nearest even) once, when the tile is loaded or formed.

/// Blocks per SM that the out and brow kernels are compiled for: 2 on tile::Mma (128 registers: out without spill,
/// brow with 20 bytes, both variants; two blocks fit beside brow's 104.5 KiB of shared memory (47 KiB where it
/// falls back to brow_direct) and out's up to 108.5 KiB, out_plan), 1 on tile::Simt.
template <typename L>
constexpr int blocks_per_sm() { return std::is_same_v<L, tile::Mma> ? 2 : 1; }

/// Operand tile element type of layout L (float or bf16).
template <typename L>
using Op = typename L::Operand;
/// Row stride of L's operand tiles.
template <typename L>
constexpr int op_ld() { return std::is_same_v<Op<L>, float> ? tile::kLd : tile::kLdH; }
/// Bytes of one operand tile of L rounded up to 16 (what op_tile carves).
template <typename L>
constexpr size_t op_bytes() { return (sizeof(Op<L>) * kN * op_ld<L>() + 15) / 16 * 16; }
/// Carves one operand tile of L.
template <typename L>
__device__ Op<L>* op_tile(tile::Carve& cv) { return cv.take<Op<L>>(kN * op_ld<L>()); }

/// s = scale(r) * src rows (rows < `rows`, columns < `cols`, else 0) into an fp32 (tile::load) or bf16
/// (tile::load_h: rounded once) operand tile.
template <typename E, typename Scale>
__device__ void load_op(float* s, const E* src, int64_t stride, int rows, int cols, Scale scale) {
  tile::load(s, src, stride, rows, cols, scale);
}
template <typename E, typename Scale>
__device__ void load_op(bf16* s, const E* src, int64_t stride, int rows, int cols, Scale scale) {
  tile::load_h(s, src, stride, rows, cols, scale);
}
template <typename T, typename E>
__device__ void load_op(T* s, const E* src, int64_t stride, int rows, int cols) {
  load_op(s, src, stride, rows, cols, [](int) { return 1.0f; });
}

/// s[r][c] = f(r, c, acc element) for the thread's elements of L (an Acc into an operand tile; no barrier).
template <typename L, typename F>
__device__ void put_op(const tile::Acc& acc, Op<L>* s, F f) {
  if constexpr (std::is_same_v<L, tile::Mma>) {
    tile::store_acc_h(acc, s, f);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int r = L::row(i), c = L::col(j);
        s[r * tile::kLd + c] = f(r, c, acc.v[i][j]);
      }
  }
}

/// (I + W) 𝒯 = I by forward substitution, row by row: 𝒯_r,m = -Σ_{m<=j<r} W_rj 𝒯_jm (m < r).
/// sW [n, n] strictly lower; sT [n, n] must hold the identity on entry. Reached by all threads (barriers).
__device__ inline void tril_inverse(const float* sW, float* sT, int n) {
  for (int r = 1; r < n; ++r) {
    for (int m = threadIdx.x; m < r; m += blockDim.x) {
      float s = 0.0f;
      for (int j = m; j < r; ++j) s -= sW[r * n + j] * sT[j * n + m];
      sT[r * n + m] = s;
    }
    __syncthreads();
  }
}

// Arguments of the MDN kernels: q, k [B, T, H, K]; v, o, d_o [B, T, H, V]; la (log α), beta, lm (log μ),
// eta [B, T, H]; gradients shaped as their inputs; NC = ceil(T / C) chunks. vt: Ṽ [B, T, H, V], read by out,
// bscan, brow and the states-only scan; vt_out: where the solving scan writes Ṽ (the same buffer as vt), null when
// vt holds the forward's saved Ṽ (the backward with save_residuals). Global scratch (ScratchLayout):
// coef [B H, NC, coef_floats(C)] (coef images: 8 vectors, 6 matrices, the bf16 E tile), states [B H, NC, 2, K, V]
// (S_0 then M_0 entering each chunk; elements of the operand type Op<L>, state_pair), Ṽ unless the caller keeps it, and for the backward
// dstates [B H, NC, 2, K, V] (dL/dS, dL/dM leaving each chunk; Op<L> as states), rowk [B H, NC, kRowkSlots, C, K] (per-row key vectors) and dew [B H, NC, 2, 64, 64]
// (dO Ṽ^T, dR Ṽ^T). The forward leaves d_o, the gradients, dstates, rowk and dew null, the backward o.
// bh0, nbh: the (batch, head) pairs bh0 .. bh0 + nbh - 1 that a launch covers (grid row y is pair bh0 + y; see
// by_waves).
struct MdnArgs {
  const float *q, *k, *v, *la, *beta, *lm, *eta, *d_o, *vt;
  int64_t B, T, H, K, V, C, NC, bh0, nbh;
  float *o, *dq, *dk, *dv, *dla, *dbeta, *dlm, *deta;
  float *coef, *states, *vt_out, *dstates, *rowk, *dew;
};

// Per-block view of one (batch, head): token-row pointers into the [B, T, H, *] tensors.
struct HeadView {
  const MdnArgs& a;
  int64_t b, h;
  __device__ int64_t tok(int64_t t) const { return (b * a.T + t) * a.H + h; }  // index into [B, T, H]
  __device__ const float* q(int64_t t) const { return a.q + tok(t) * a.K; }
  __device__ const float* k(int64_t t) const { return a.k + tok(t) * a.K; }
};

// The chunk-local coefficients in shared memory (mdn.md §6.1, §6.4; 0-based rows, row -1 is the chunk-start
// state). Vectors [C]: la, lm, beta, eta as loaded; alpha = e^{la}; abar_i = e^{Σ_{u<=i} la_u},
// mbar_i = e^{Σ_{u<=i} lm_u}; bb = L_A (β ⊙ μ̄). Matrices [n, n] (row stride n): LA[i,r] = e^{Σ_{u=r+1..i} la_u}
// (r <= i), LU[r,j] likewise with lm (j <= r), G = Γ = L_A Diag(β) L_U, QK[i,j] = q_i·k̂_j (j <= i),
// PK[i,j] = p_i·k̂_j (j < i) with p = α k, k̂ = η k; T = 𝒯 = (I + W)^{-1} with W = (P K̂^T) ⊙ Γ⁻ (Γ shifted down
// one row; formed and inverted by the coef kernel, not kept in the image). Each kernel points the members it
// uses at its own shared memory.
struct ChunkSmem {
  float *la, *lm, *beta, *eta, *alpha, *abar, *mbar, *bb;
  float *LA, *LU, *G, *QK, *PK, *T;
};

constexpr int kChunkVectors = 8, kChunkMatrices = 6;
/// Vector slots of a coef image, in order (carve_vectors' order).
enum ChunkVector { kVecLa, kVecLm, kVecBeta, kVecEta, kVecAlpha, kVecAbar, kVecMbar, kVecBb };
/// Matrix slots of a coef image, in order.
enum ChunkMatrix { kLA, kLU, kG, kQK, kPK, kT };

/// Float offset of the E slot in a coef image: after the vectors and matrices, rounded up to 4 floats (16 bytes).
__host__ __device__ constexpr int64_t coef_e_offset(int64_t C) {
  return (kChunkVectors * C + kChunkMatrices * C * C + 3) / 4 * 4;
}
/// Floats of a chunk's coef image: 8 vectors [C] (rows >= n zero), then 6 matrices [C, C] (ChunkMatrix) of which
/// the leading n x n (row stride n, n the chunk's length) are written and read, then at coef_e_offset the E slot:
/// E = (Q K̂^T) ⊙ Γ as a bf16 tile [64, 64] (row stride 64; 0 outside j <= i < n), written by the coef kernel on
/// tile::Mma only (the bf16 bscan's operand; Simt's image leaves it unwritten).
__host__ __device__ constexpr int64_t coef_floats(int64_t C) { return coef_e_offset(C) + kN * kN / 2; }

/// Bytes of n floats rounded up to 16 (what tile::Carve::take<float>(n) advances).
__host__ __device__ constexpr size_t padded_bytes(int64_t n) {
  return (sizeof(float) * static_cast<size_t>(n) + 15) / 16 * 16;
}

/// Points the vectors of `cs` at `s` (kChunkVectors * C floats, order la, lm, beta, eta, alpha, abar, mbar, bb);
/// returns the first float after them.
__device__ float* carve_vectors(float* s, int64_t C, ChunkSmem& cs) {
  float** vectors[kChunkVectors] = {&cs.la, &cs.lm, &cs.beta, &cs.eta, &cs.alpha, &cs.abar, &cs.mbar, &cs.bb};
  for (float** v : vectors) {
    *v = s;
    s += C;
  }
  return s;
}

/// The coef-scratch image of chunk `chunk` of (batch, head) bh.
__device__ float* coef_image(const MdnArgs& a, int64_t bh, int64_t chunk) {
  return a.coef + (bh * a.NC + chunk) * coef_floats(a.C);
}
/// Matrix `m` of an image.
__device__ const float* image_matrix(const float* img, int64_t C, ChunkMatrix m) {
  return img + kChunkVectors * C + static_cast<int64_t>(m) * C * C;
}
/// The E slot of an image (coef_floats).
__device__ bf16* image_e(float* img, int64_t C) { return reinterpret_cast<bf16*>(img + coef_e_offset(C)); }
__device__ const bf16* image_e(const float* img, int64_t C) {
  return reinterpret_cast<const bf16*>(img + coef_e_offset(C));
}
/// dst[i] = src[i] for i < n (block-strided; no barrier).
__device__ void copy_floats(float* dst, const float* src, int64_t n) {
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}
/// Slots [C, K] of a chunk's rowk scratch: S_0 dO_i, M_0 dO_i, S_0 dR_i, M_0 dR_i, dS Ṽ_i, dM Ṽ_i, the key-side
/// sums of dq, dp, dk̂ (all written by brow, read by bchunk).
enum RowkSlot { kSdO, kMdO, kSdR, kMdR, kGV, kHV, kEK, kWK, kKQP, kRowkSlots };
/// Slot `slot` of chunk `chunk` of (batch, head) bh in the rowk scratch.
__device__ float* rowk_slot(const MdnArgs& a, int64_t bh, int64_t chunk, RowkSlot slot) {
  return a.rowk + ((bh * a.NC + chunk) * kRowkSlots + slot) * a.C * a.K;
}
/// The (dO Ṽ^T, dR Ṽ^T) pair [2, 64, 64] of `chunk` of (batch, head) bh.
__device__ float* dew_pair(const MdnArgs& a, int64_t bh, int64_t chunk) {
  return a.dew + (bh * a.NC + chunk) * 2 * kN * kN;
}
/// The state pair (S then M, [2, K, V]) of `chunk` of (batch, head) bh in a [B H, NC, 2, K, V] scratch tensor of
/// elements E (the operand type of the kernels' layout; the fp32-sized region is used from its start).
template <typename E>
__device__ E* state_pair(const MdnArgs& a, float* p, int64_t bh, int64_t chunk) {
  return reinterpret_cast<E*>(p) + (bh * a.NC + chunk) * 2 * a.K * a.V;
}

/// Whether layout L's coef kernel inverts I + W with the blocked tile::tril_inverse_fast (Mma: 16 x 16 blocks, on
/// two fp32 tiles) rather than row by row in place (Simt: the exact order of the CPU's forward substitution).
template <typename L>
constexpr bool blocked_inverse() { return std::is_same_v<L, tile::Mma>; }

/// Bytes of the coef kernel's reused region (coef_smem): L_A and L_U (2 [C, C] matrices), then the 2 operand tiles
/// of the key products, then I + W's inverse (Mma: 2 fp32 tiles; Simt: W and 𝒯 as 2 [C, C] matrices).
template <typename L>
constexpr size_t coef_work_bytes(int64_t C) {
  const size_t ops = 2 * op_bytes<L>(), mats = 2 * padded_bytes(C * C);
  const size_t inv = blocked_inverse<L>() ? tile::smem_bytes(2, 0) : mats;
  const size_t m = ops > mats ? ops : mats;
  return m > inv ? m : inv;
}

/// Blocks per SM that the coef kernel is compiled for: 3 on tile::Mma (80 registers, no spills with
/// tile::tril_inverse_fast; 3 x 50.5 KiB of shared memory at C = 64), 1 on tile::Simt (168
/// registers; bounded to 2 it spills around its fp32 products).
template <typename L>
constexpr int coef_blocks_per_sm() { return std::is_same_v<L, tile::Mma> ? 3 : 1; }

/// Shared bytes of the coef kernel on layout L (mdn_coef_kernel): the 8 vectors, Γ, the reused region.
template <typename L>
constexpr size_t coef_smem(int64_t C) {
  return padded_bytes(kChunkVectors * C) + padded_bytes(C * C) + coef_work_bytes<L>(C);
}

// coef kernel, grid (NC, B H): §6.4 for chunk ch (tokens t0 .. t0 + n - 1), every coefficient written to the
// chunk's coef image (vectors [C], zero at rows >= n; matrices the leading n x n of their [C, C] slots) by the
// thread that forms it; shared memory holds only what a later step reads. Steps (barriers between):
// 1. the gates (la, lm, β, η, α = e^{la});
// 2. the segment sums in double, one thread per column r of L_A or L_U (and r = -1: ᾱ, μ̄), down the rows
//    i = r+1 .. n-1 adding la_i (lm_i) in order: each sum Σ_{u=r+1..i} in the CPU's order, O(n^2) in all (main's
//    O(n^3) per-element loops gave the same bits), exponentiated in fp32;
// 3. Γ_ij = Σ_{r=j..i} L_A[i,r] β_r L_U[r,j];  b_i = Σ_{r<=i} L_A[i,r] β_r μ̄_r;
// 4. the key products on two operand tiles of L, key tiles in order (the only products; Mma: bf16 operands):
//    QK_ij = η_j q_i·k_j (j <= i), PK_ij = α_i η_j k_i·k_j (j < i), else 0, written from the accumulators (Mma:
//    also E_ij = bf16(Γ_ij QK_ij) of the fp32 values written, j <= i < n, else 0, into the image's E slot);
//    W_ij = Γ_{i-1,j} PK_ij (j < i) from them, 𝒯 = (I + W)^{-1} in fp32 (Simt: tril_inverse, row by row, the
//    CPU's order; Mma: tile::tril_inverse_fast, 16 x 16 blocks), written to the image.
// Shared (coef_smem<L>): the vectors, Γ [n, n], then one region reused by L_A and L_U [n, n] (steps 2-3), the
// operand tiles and the inverse (W and 𝒯; step 4). Every value is computed as main's coef computed it (the same
// expressions in the same order), so the image holds the same bits (W is no longer part of it: no kernel read it).
template <typename L>
__global__ void __launch_bounds__(tile::kThreads, coef_blocks_per_sm<L>()) mdn_coef_kernel(MdnArgs a) {
  extern __shared__ __align__(16) char smem[];
  const int64_t C = a.C, K = a.K;
  const tile::Chunk ch(a, blockIdx.x, a.bh0 + blockIdx.y);
  const HeadView hv{a, ch.b, ch.h};
  const int n = ch.n;
  tile::Carve cv{smem};
  ChunkSmem cs{};
  carve_vectors(cv.take<float>(kChunkVectors * C), C, cs);
  cs.G = cv.take<float>(C * C);
  char* const work = cv.p;
  float* const img = coef_image(a, ch.bh, ch.chunk);
  // Image matrix m, image vector v (the carve_vectors order) at row r.
  const auto gmat = [&](int m) { return img + kChunkVectors * C + m * C * C; };
  const auto gvec = [&](int v, int r) -> float& { return img[v * C + r]; };

  // 1. Gates.
  for (int r = threadIdx.x; r < C; r += blockDim.x) {
    float la = 0.0f, lm = 0.0f, be = 0.0f, et = 0.0f, al = 0.0f;
    if (r < n) {
      const int64_t t = hv.tok(ch.t0 + r);
      la = a.la[t], lm = a.lm[t], be = a.beta[t], et = a.eta[t];
      al = expf(la);
    }
    cs.la[r] = la, cs.lm[r] = lm, cs.beta[r] = be, cs.eta[r] = et, cs.alpha[r] = al;
    gvec(0, r) = la, gvec(1, r) = lm, gvec(2, r) = be, gvec(3, r) = et, gvec(4, r) = al;
  }
  __syncthreads();
  // 2. Segment sums: thread t < 2 (n + 1) walks column r = t % (n + 1) - 1 of L_A (t < n + 1) or L_U.
  cs.LA = reinterpret_cast<float*>(work);
  cs.LU = cs.LA + C * C;
  for (int t = threadIdx.x; t < 2 * (n + 1); t += blockDim.x) {
    const int w = t / (n + 1), r = t % (n + 1) - 1;
    const float* lg = w == 0 ? cs.la : cs.lm;
    if (r < 0) {  // ᾱ_i = e^{Σ_{u<=i} la_u}, μ̄_i likewise
      float* bar = w == 0 ? cs.abar : cs.mbar;
      double sum = 0.0;
      for (int i = 0; i < C; ++i) {
        float x = 0.0f;
        if (i < n) {
          sum += lg[i];
          x = expf(static_cast<float>(sum));
        }
        bar[i] = x;
        gvec(w == 0 ? 5 : 6, i) = x;
      }
    } else {
      float* M = w == 0 ? cs.LA : cs.LU;
      float* gM = gmat(w == 0 ? kLA : kLU);
      double sum = 0.0;
      for (int i = 0; i < n; ++i) {
        float x = 0.0f;
        if (i == r) {
          x = 1.0f;
        } else if (i > r) {
          sum += lg[i];
          x = expf(static_cast<float>(sum));
        }
        M[i * n + r] = x;
        gM[i * n + r] = x;
      }
    }
  }
  __syncthreads();
  // 3. Γ and b. Task t: column j = t % 64 of rows i0 .. i0 + 3 (i0 = 4 (t / 64)); the 4 sums share the loads of
  // β_r and L_U[r,j], each adds its terms r = j .. i in order (a warp: 32 columns of one row group).
  for (int t = threadIdx.x; t < 16 * kN; t += blockDim.x) {
    const int j = t % kN, i0 = 4 * (t / kN);
    if (j >= n || i0 >= n) continue;
    const int il = i0 + 3 < n ? i0 + 3 : n - 1;  // the group's last row
    float g[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int r = j; r <= il; ++r) {
      const float br = cs.beta[r], lu = cs.LU[r * n + j];
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (r <= i0 + e && i0 + e <= il) g[e] += cs.LA[(i0 + e) * n + r] * br * lu;
    }
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (i0 + e <= il) {
        const int idx = (i0 + e) * n + j;
        cs.G[idx] = g[e];  // 0 for j > i0 + e (no terms)
        gmat(kG)[idx] = g[e];
      }
  }
  for (int i = threadIdx.x; i < C; i += blockDim.x) {
    float s = 0.0f;
    if (i < n)
      for (int r = 0; r <= i; ++r) s += cs.LA[i * n + r] * cs.beta[r] * cs.mbar[r];
    gvec(7, i) = s;
  }
  __syncthreads();  // L_A, L_U are dead: the region takes the operand tiles, then the inverse
  // 4. The key products, W (zero padded) from them, 𝒯 = (I + W)^{-1}.
  tile::Acc xq, xp;
  {
    Op<L>* const t0 = reinterpret_cast<Op<L>*>(work);
    Op<L>* const t1 = reinterpret_cast<Op<L>*>(work + op_bytes<L>());
    xq.zero(), xp.zero();
    for (int64_t k0 = 0; k0 < K; k0 += kN) {
      const int kc = tile::tile_cols(K, k0);
      load_op(t0, ch.in(a, a.q, K, k0), a.H * K, n, kc);
      load_op(t1, ch.in(a, a.k, K, k0), a.H * K, n, kc);
      __syncthreads();
      L::template mma<false, true>(t0, t1, xq);
      L::template mma<false, true>(t1, t1, xp);
      __syncthreads();  // the operand tiles are read (the last one: the region takes W and 𝒯)
    }
  }
  tile::store_acc<L>(xq, gmat(kQK), n, n, n, [&](int i, int j, float x) { return j <= i ? cs.eta[j] * x : 0.0f; });
  if constexpr (std::is_same_v<L, tile::Mma>) {  // E = bf16(Γ ⊙ Q K̂^T) of the values just written, whole tile
    bf16* const E = image_e(img, C);
    const auto e = [&](int i, int j, float x) { return i < n && j <= i ? cs.G[i * n + j] * (cs.eta[j] * x) : 0.0f; };
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; j += 2) {
        const int r = L::row(i), c = L::col(j);
        *reinterpret_cast<__nv_bfloat162*>(E + r * kN + c) =
            __floats2bfloat162_rn(e(r, c, xq.v[i][j]), e(r, c + 1, xq.v[i][j + 1]));
      }
  }
  tile::store_acc<L>(xp, gmat(kPK), n, n, n,
                     [&](int i, int j, float x) { return j < i ? cs.alpha[i] * cs.eta[j] * x : 0.0f; });
  const auto w_of = [&](int i, int j, float x) {
    return i < n && j < i ? cs.G[(i - 1) * n + j] * (cs.alpha[i] * cs.eta[j] * x) : 0.0f;
  };
  if constexpr (blocked_inverse<L>()) {
    float* const inv0 = reinterpret_cast<float*>(work);
    float* const inv1 = inv0 + tile::kTileFloats;
    tile::store_acc<L>(xp, inv0, tile::kLd, kN, kN, w_of);
    for (int idx = threadIdx.x; idx < kN * kN; idx += blockDim.x) {
      const int i = idx / kN, j = idx % kN;
      inv1[i * tile::kLd + j] = i == j ? 1.0f : 0.0f;
    }
    __syncthreads();
    tile::tril_inverse_fast(inv0, inv1, n);  // ends with a barrier (clobbers W's upper triangle: not read after)
    for (int idx = threadIdx.x; idx < n * n; idx += blockDim.x) gmat(kT)[idx] = inv1[(idx / n) * tile::kLd + idx % n];
  } else {
    float* const W = reinterpret_cast<float*>(work);
    float* const T = W + C * C;
    tile::store_acc<L>(xp, W, n, n, n, w_of);
    for (int idx = threadIdx.x; idx < n * n; idx += blockDim.x) T[idx] = idx / n == idx % n ? 1.0f : 0.0f;
    __syncthreads();
    tril_inverse(W, T, n);  // ends with a barrier (n > 1); for n = 1 each thread reads only its own T element
    for (int idx = threadIdx.x; idx < n * n; idx += blockDim.x) gmat(kT)[idx] = T[idx];
  }
}

/// Vector elements of a chunk's coef image per thread (kChunkVectors C <= kVecPer kThreads).
constexpr int kVecPer = static_cast<int>(kChunkVectors * kMdnMaxChunk / tile::kThreads);
static_assert(kVecPer * tile::kThreads == kChunkVectors * kMdnMaxChunk && kMdnMaxChunk <= tile::kThreads,
              "every thread loads kVecPer vector elements and at most one element of each last row");

/// A thread's share of a chunk's vectors and last rows as loaded from its coef image (load_chunk_vectors split in
/// two, as fetch_h / put_h: the loads may stay in flight across other work): x[i] = element t + i kThreads of the
/// vectors (< kChunkVectors C; t the thread), and for t < n gl = Γ_{n-1,t}, ul = L_U[n-1,t].
struct VectorLoads {
  float x[kVecPer], gl, ul;
};

/// Issues the thread's loads of chunk `chunk`'s vectors and last rows (length n; nothing waits for them here).
__device__ VectorLoads fetch_chunk_vectors(const MdnArgs& a, int64_t bh, int64_t chunk, int n) {
  const int64_t C = a.C;
  const int t = static_cast<int>(threadIdx.x);
  const float* img = coef_image(a, bh, chunk);
  VectorLoads x{};
#pragma unroll
  for (int i = 0; i < kVecPer; ++i)
    if (t + i * tile::kThreads < kChunkVectors * C) x.x[i] = img[t + i * tile::kThreads];
  if (t < n) {
    x.gl = image_matrix(img, C, kG)[(n - 1) * n + t];
    x.ul = image_matrix(img, C, kLU)[(n - 1) * n + t];
  }
  return x;
}

/// Writes the thread's share fetched by fetch_chunk_vectors (chunk length n): the vectors (kChunkVectors C floats
/// from vecs, carve_vectors' order), gl and ul [n]. No barrier.
__device__ void put_chunk_vectors(const VectorLoads& x, int64_t C, int n, float* vecs, float* gl, float* ul) {
  const int t = static_cast<int>(threadIdx.x);
#pragma unroll
  for (int i = 0; i < kVecPer; ++i)
    if (t + i * tile::kThreads < kChunkVectors * C) vecs[t + i * tile::kThreads] = x.x[i];
  if (t < n) gl[t] = x.gl, ul[t] = x.ul;
}

/// Copies chunk `chunk`'s vectors (into cs) and the last rows gl = Γ_{n-1,:}, ul = L_U[n-1,:] from its coef image
/// (no barrier). Returns the image.
__device__ const float* load_chunk_vectors(const MdnArgs& a, int64_t bh, int64_t chunk, int n, const ChunkSmem& cs,
                                           float* gl, float* ul) {
  put_chunk_vectors(fetch_chunk_vectors(a, bh, chunk, n), a.C, n, cs.la, gl, ul);
  return coef_image(a, bh, chunk);
}

/// s[r][c] = f(r, c) for r, c < n, else 0 (an operand tile of L, fp32 or rounded to bf16 once; no barrier).
template <typename L, typename F>
__device__ void fill_square(Op<L>* s, int n, F f) {
  for (int idx = threadIdx.x; idx < kN * kN; idx += blockDim.x) {
    const int r = idx / kN, c = idx % kN;
    s[r * op_ld<L>() + c] = from_f32<Op<L>>(r < n && c < n ? f(r, c) : 0.0f);
  }
}

/// Key tiles of K.
__host__ __device__ constexpr int64_t key_tiles(int64_t K) { return (K + kN - 1) / kN; }

/// Work tiles of the bscan on layout L (mdn_bscan_kernel): 7 bf16 tiles on tile::Mma (besides the 2 stage tiles),
/// 5 fp32 tiles on Simt.
template <typename L>
constexpr int bscan_work() { return std::is_same_v<L, tile::Mma> ? 7 : 5; }

/// Operand tiles the scans stage the slabs of one key tile into (bf16 copies for tile::Mma; Simt reads the fp32
/// slabs themselves).
template <typename L>
constexpr int stage_tiles() { return std::is_same_v<L, tile::Mma> ? 2 : 0; }

/// Shared bytes of a scan on layout L: the vectors, gl, ul (kChunkVectors * C + 2 C floats), `work` work
/// operand tiles, the stage tiles, the two fp32 state(-gradient) slabs as 2 key_tiles(K) fp32 tiles, and
/// `staged` fp32 staging tiles (tile::kStageFloats each; cp.async targets).
template <typename L>
constexpr size_t scan_bytes(int64_t K, int64_t C, int work, int staged) {
  return tile::smem_bytes(2 * static_cast<int>(key_tiles(K)), padded_bytes(kChunkVectors * C + 2 * C)) +
         (work + stage_tiles<L>()) * op_bytes<L>() + sizeof(float) * tile::kStageFloats * staged;
}

// Shared memory of a scan on layout L (scan_bytes<L>): the chunk's vectors (cs), gl = Γ_{n-1,:}, ul = L_U[n-1,:]
// [C]; `work` work operand tiles (contiguous, w(i)); for tile::Mma the stage tiles hx, hy (bf16 copies of one key
// tile's slabs, stage(), or in the solving scan of its new states); the fp32 slab pair X, Y [K, 64] (S, M forward;
// dS, dM backward) as tiles: X of key tile kt at x(kt), Y at y(kt); then `staged` contiguous fp32 staging tiles g
// (the scan's cp.async targets); `end` is the first byte after them. The slabs stay fp32 on both layouts (the
// running states are never rounded; only their operand copies are). Constructed by all threads; zeroes the slabs
// (no barrier).
template <typename L>
struct ScanShared {
  ChunkSmem cs;
  float *gl, *ul;
  Op<L>* work;
  Op<L>* stage_t[2];
  float *slabs, *g;
  char* end;
  int64_t KT;
  __device__ ScanShared(char* smem, int64_t K, int64_t C, int nwork, int staged) : KT(key_tiles(K)) {
    tile::Carve cv{smem};
    gl = carve_vectors(cv.take<float>(kChunkVectors * C + 2 * C), C, cs);
    ul = gl + C;
    work = cv.take<Op<L>>(static_cast<int64_t>(nwork) * kN * op_ld<L>());
    for (int i = 0; i < stage_tiles<L>(); ++i) stage_t[i] = op_tile<L>(cv);
    slabs = cv.take<float>(2 * KT * tile::kTileFloats);
    g = cv.take<float>(static_cast<int64_t>(staged) * tile::kStageFloats);
    end = cv.p;
    for (int64_t idx = threadIdx.x; idx < 2 * KT * tile::kTileFloats; idx += blockDim.x) slabs[idx] = 0.0f;
  }
  /// Work tile i (op_bytes<L>() apart: kN op_ld<L>() elements, a multiple of 16 bytes).
  __device__ Op<L>* w(int64_t i) const { return work + i * kN * op_ld<L>(); }
  __device__ float* x(int64_t kt) const { return slabs + kt * tile::kTileFloats; }
  __device__ float* y(int64_t kt) const { return slabs + (KT + kt) * tile::kTileFloats; }
  /// s, m = the slabs X, Y of key tile kt at the thread's elements of L (no barrier).
  __device__ void get_states(int64_t kt, tile::Acc& s, tile::Acc& m) const {
    const float *X = x(kt), *Y = y(kt);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int e = L::row(i) * tile::kLd + L::col(j);
        s.v[i][j] = X[e];
        m.v[i][j] = Y[e];
      }
  }
  /// The slabs X, Y of key tile kt = s, m at the thread's elements of L (no barrier).
  __device__ void set_states(int64_t kt, const tile::Acc& s, const tile::Acc& m) const {
    float *X = x(kt), *Y = y(kt);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int e = L::row(i) * tile::kLd + L::col(j);
        X[e] = s.v[i][j];
        Y[e] = m.v[i][j];
      }
  }
  /// The slabs X, Y of key tile kt in thread-major order: element (i, j) of the thread's Acc at
  /// x(kt)[4 (i kThreads + threadIdx.x) + j] (likewise Y), as 16-byte accesses without bank conflicts. For a kernel
  /// whose slab elements are only ever read and written by the thread that owns them (the bf16 bscan): its slabs
  /// are no tiles then (x, y, stage, store, keys_times_slabs apply to zero slabs only). No barrier.
  __device__ void get_own(int64_t kt, tile::Acc& s, tile::Acc& m) const {
    const float4 *X = reinterpret_cast<const float4*>(x(kt)) + threadIdx.x,
                 *Y = reinterpret_cast<const float4*>(y(kt)) + threadIdx.x;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float4 u = X[i * tile::kThreads], w = Y[i * tile::kThreads];
      s.v[i][0] = u.x, s.v[i][1] = u.y, s.v[i][2] = u.z, s.v[i][3] = u.w;
      m.v[i][0] = w.x, m.v[i][1] = w.y, m.v[i][2] = w.z, m.v[i][3] = w.w;
    }
  }
  __device__ void set_own(int64_t kt, const tile::Acc& s, const tile::Acc& m) const {
    float4 *X = reinterpret_cast<float4*>(x(kt)) + threadIdx.x, *Y = reinterpret_cast<float4*>(y(kt)) + threadIdx.x;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      X[i * tile::kThreads] = make_float4(s.v[i][0], s.v[i][1], s.v[i][2], s.v[i][3]);
      Y[i * tile::kThreads] = make_float4(m.v[i][0], m.v[i][1], m.v[i][2], m.v[i][3]);
    }
  }
  /// The operand views of key tile kt's slabs: the fp32 slabs (Simt), or (Mma) bf16 copies that stage(kt) writes
  /// (valid after a barrier that follows it).
  __device__ const Op<L>* xo(int64_t kt) const {
    if constexpr (stage_tiles<L>() > 0) return stage_t[0];
    else return x(kt);
  }
  __device__ const Op<L>* yo(int64_t kt) const {
    if constexpr (stage_tiles<L>() > 0) return stage_t[1];
    else return y(kt);
  }
  /// Mma: the slabs of key tile kt rounded to bf16 into the stage tiles (no barrier); Simt: nothing.
  __device__ void stage(int64_t kt) const {
    if constexpr (stage_tiles<L>() > 0) {
      const float *X = x(kt), *Y = y(kt);
      for (int idx = threadIdx.x; idx < kN * kN; idx += blockDim.x) {
        const int r = idx / kN, c = idx % kN;
        stage_t[0][r * op_ld<L>() + c] = from_f32<Op<L>>(X[r * tile::kLd + c]);
        stage_t[1][r * op_ld<L>() + c] = from_f32<Op<L>>(Y[r * tile::kLd + c]);
      }
    }
  }
  /// xs += K_c X, xm += K_c Y over the key tiles in order (K_c: the chunk's n key rows [n, K], loaded one key
  /// tile at a time into the work tile sK): dS^T k_r, dM^T k_r (the bscan). Barriers inside.
  __device__ void keys_times_slabs(const MdnArgs& a, const tile::Chunk& ch, int n, Op<L>* sK, tile::Acc& xs,
                                   tile::Acc& xm) const {
    // Mma: key tile kt + 1's k rows are fetched into registers (tile::fetch_h) while tile kt is stored and
    // multiplied; put_h stores what load_op stores.
    constexpr bool kMmaK = std::is_same_v<Op<L>, bf16>;
    [[maybe_unused]] tile::HRegs kf;
    if constexpr (kMmaK) {
      if (KT > 0) tile::fetch_h(kf, ch.in(a, a.k, a.K, 0), a.H * a.K, n, tile::tile_cols(a.K, 0));
    }
    for (int64_t kt = 0; kt < KT; ++kt) {
      if constexpr (kMmaK) {
        tile::put_h(sK, kf, n, [](int) { return 1.0f; });
        if (kt + 1 < KT)
          tile::fetch_h(kf, ch.in(a, a.k, a.K, (kt + 1) * kN), a.H * a.K, n, tile::tile_cols(a.K, (kt + 1) * kN));
      } else {
        load_op(sK, ch.in(a, a.k, a.K, kt * kN), a.H * a.K, n, tile::tile_cols(a.K, kt * kN));
      }
      stage(kt);
      __syncthreads();
      L::template mma<false, false>(sK, xo(kt), xs);
      L::template mma<false, false>(sK, yo(kt), xm);
      __syncthreads();
    }
  }
  /// dst (a [2, K, V] state pair of operand elements, value columns v0 .. v0 + vc - 1) = (X, Y), rounded to
  /// Op<L> (no barrier). Where dst is 16-byte aligned and V a multiple of kVec (16 bytes of Op<L>: 8 bf16, 4
  /// fp32), by 16-byte pieces of kVec columns: each block of 64 threads covers kR = 64 / kP rows x kP pieces, a
  /// warp kR rows x 32 / kR pieces, so that its shared reads X[m][j + i] (bank m + j + i mod 32, kLd odd) fall in
  /// 32 distinct banks; the same from_f32 of every element. Else element by element.
  __device__ void store(int64_t K, int64_t V, int64_t v0, int vc, Op<L>* dst) const {
    constexpr int kVec = 16 / sizeof(Op<L>), kP = kN / kVec, kR = kN / kP;  // columns per piece, pieces per row
    if (reinterpret_cast<uintptr_t>(dst) % 16 == 0 && V % kVec == 0) {
      const int t = static_cast<int>(threadIdx.x), lane = t & 31;
      const int j = kVec * (((t >> 5) & 1) * (kP / 2) + lane / kR);  // the piece's first column
      if (j >= vc) return;
      constexpr int kStep = tile::kThreads / kP;  // rows between a thread's pieces (4 blocks of kR rows)
      int m = (t >> 6) * kR + lane % kR;
      const float *px = x(0) + m * tile::kLd + j, *py = y(0) + m * tile::kLd + j;  // (x(kt) row m % kN: row m)
      Op<L>* dx = dst + m * V + v0 + j;
#pragma unroll 1
      for (; m < K; m += kStep, px += kStep * tile::kLd, py += kStep * tile::kLd, dx += kStep * V) {
        alignas(16) Op<L> ox[kVec], oy[kVec];
#pragma unroll
        for (int i = 0; i < kVec; ++i) ox[i] = from_f32<Op<L>>(px[i]), oy[i] = from_f32<Op<L>>(py[i]);
        *reinterpret_cast<uint4*>(dx) = *reinterpret_cast<const uint4*>(ox);
        *reinterpret_cast<uint4*>(dx + K * V) = *reinterpret_cast<const uint4*>(oy);
      }
      return;
    }
    for (int64_t idx = threadIdx.x; idx < K * vc; idx += blockDim.x) {
      const int64_t m = idx / vc, kt = m / kN;
      const int j = static_cast<int>(idx % vc), e = static_cast<int>(m % kN) * tile::kLd + j;
      dst[m * V + v0 + j] = from_f32<Op<L>>(x(kt)[e]);
      dst[K * V + m * V + v0 + j] = from_f32<Op<L>>(y(kt)[e]);
    }
  }
};

/// Asks the L2 for what the solving scan (forward) or the fp32 bscan (backward) reads of chunk `chunk` of (batch, head)
/// bh (value columns v0 .. v0 + vc - 1; no effect on any result): its coefficient image (vectors, 𝒯, Γ, L_U, and
/// Q K̂^T for the backward), its k rows, and v (forward) or q and dO rows (backward). Issued one chunk ahead, so
/// the next chunk's loads wait for the L2, not for memory.
__device__ void prefetch_scan_chunk(const MdnArgs& a, int64_t bh, int64_t chunk, int64_t v0, int vc, bool backward) {
  using tile::prefetch_l2;
  const tile::Chunk nx(a, chunk, bh);
  const int64_t C = a.C, K = a.K, V = a.V, H = a.H;
  const float* img = coef_image(a, bh, chunk);
  prefetch_l2(img, 0, 1, 4 * kChunkVectors * C);
  const int64_t mat = 4 * static_cast<int64_t>(nx.n) * nx.n;  // the leading n x n of a matrix slot
  prefetch_l2(image_matrix(img, C, kT), 0, 1, mat);
  prefetch_l2(image_matrix(img, C, kLU), 0, 1, mat);
  prefetch_l2(image_matrix(img, C, kG), 0, 1, mat);
  if (backward) prefetch_l2(image_matrix(img, C, kQK), 0, 1, mat);
  prefetch_l2(nx.in(a, a.k, K, 0), 4 * H * K, nx.n, 4 * K);
  if (backward) {
    prefetch_l2(nx.in(a, a.q, K, 0), 4 * H * K, nx.n, 4 * K);
    prefetch_l2(nx.in(a, a.d_o, V, v0), 4 * H * V, nx.n, 4 * vc);
  } else {
    prefetch_l2(nx.in(a, a.v, V, v0), 4 * H * V, nx.n, 4 * vc);
  }
}

/// The scans' grid: value tiles x (batch, head).
dim3 scan_grid(int64_t V, int64_t BH) {
  return dim3(static_cast<unsigned>(ceil_div(V, kN)), static_cast<unsigned>(BH));
}

/// Dynamic shared memory a block may have (sm_90; the kernels have no static shared memory).
constexpr size_t kMaxBlockSmem = 227 * 1024;
static_assert(scan_bytes<tile::Mma>(4 * kN, kMdnMaxChunk, bscan_work<tile::Mma>(), 0) <= kMaxBlockSmem,
              "the bf16 bscan fits at key_dim 256");

/// Key tiles up to which the bf16 scan stages the chunks' k rows (fp32, cp.async) and keeps them as bf16 operand
/// tiles, the chunk's and the next chunk's: key_dim <= 128 (66.5 KiB per key tile: its two fp32 slab tiles, two
/// bf16 tiles and its fp32 staging tile; with two key tiles one more stage tile: the solving scan takes 224 KiB at
/// key_dim 128). At most 2 (the states of key tile 1 are staged in sT and one more work tile, scan_work).
constexpr int64_t kScanStagedKeyTiles = 2;
static_assert(kScanStagedKeyTiles <= 2, "the scan stages the states of at most two key tiles at once");

/// Work tiles of the solving scan: sA, sB, sT, then with kStageK the key tiles of two chunks (2 KT) and for KT = 2
/// the M stage tile of key tile 1; else one key tile sK.
constexpr int scan_work(bool stage_k, int64_t KT) { return 3 + static_cast<int>(stage_k ? 3 * KT - 1 : 1); }

/// fp32 staging tiles of the solving scan (when it stages): 𝒯, the v rows, then the KT key tiles with kStageK.
constexpr int scan_staged(bool stage_k, int64_t KT) { return 2 + static_cast<int>(stage_k ? KT : 0); }

/// Shared bytes of the solving scan on layout L (stage_k: kStageK; staged: with its staging tiles): scan_bytes with
/// its work and staging tiles, then a second buffer of the chunk vectors, gl and ul (padded_bytes as ScanShared's).
template <typename L>
constexpr size_t solve_scan_bytes(int64_t K, int64_t C, bool stage_k, bool staged) {
  return scan_bytes<L>(K, C, scan_work(stage_k, key_tiles(K)), staged ? scan_staged(stage_k, key_tiles(K)) : 0) +
         padded_bytes(kChunkVectors * C + 2 * C);
}
static_assert(solve_scan_bytes<tile::Mma>(kScanStagedKeyTiles * kN, kMdnMaxChunk, true, true) <= kMaxBlockSmem,
              "the scan with staged k fits");

/// One chunk's update (§6.2) of the states of one key tile at the thread's elements s, m of L (S, M [64, 64]):
/// (S, M) <- (aC S - bC M + K_c^T sA, mC M + K_c^T sB) with aC = ᾱ_n, bC = b_n, mC = μ̄_n (the chunk's last row),
/// kt_tile the chunk's key rows of the key tile (K_c [n, 64]), sA = Diag(η ⊙ Γ_{n,:}) Ṽ and
/// sB = -Diag(η ⊙ L_U[n,:]) Ṽ (operand tiles of L, [n, 64]). Shared by both scans (the same bits from the same
/// states and operands). No barrier.
template <typename L>
__device__ void advance_states(const Op<L>* kt_tile, const Op<L>* sA, const Op<L>* sB, float aC, float bC, float mC,
                               tile::Acc& s, tile::Acc& m) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float s0 = s.v[i][j], m0 = m.v[i][j];
      s.v[i][j] = aC * s0 - bC * m0;
      m.v[i][j] = mC * m0;
    }
  L::template mma<true, false>(kt_tile, sA, s);
  L::template mma<true, false>(kt_tile, sB, m);
}

/// store_state (with the states-only scan below): a state tile from registers into a [K, V] state, rounded to Op<L>.
template <typename L>
__device__ void store_state(const tile::Acc& x, Op<L>* dst, int64_t V, int rows, int cols);

// scan kernel on layout L, grid scan_grid (the forward, and the backward without saved Ṽ): value columns
// v0 .. v0 + vc - 1 of the states, chunk by chunk (§6.2), on 64 x 64 shared tiles: solve for the chunk's
// Ṽ = 𝒯 R with R_i = v_i - α_i (ᾱ_{i-1} S_0^T k_i - b_{i-1} M_0^T k_i) (ᾱ_{-1} = 1, b_{-1} = 0), stored to vt_out;
// then, key tile by key tile, advance_states, store the new states as the next chunk's (S_0, M_0) (store_state from
// the registers: what ScanShared::store stores from the slabs, which stores chunk 0's zero states) and add the next
// chunk's S_0^T k_i, M_0^T k_i (xs += K_next X, xm += K_next Y, key tiles in order: the sums and bits of
// ScanShared::keys_times_slabs at that chunk's start), which stay in registers until its R formation.
// Shared: ScanShared<L> with
//   work tiles sA (η Γ_{n,:} ⊙ Ṽ rows; on Simt R before), sB (-η L_U[n,:] ⊙ Ṽ rows), sT (𝒯, zero padded), then
//   the key tiles: with kStageK the chunk's KT key tiles and the next chunk's (k_tile(c, kt) = w(3 + (c % 2) KT +
//   kt)) and for KT = 2 one more stage tile; else sK (the chunk's key tile kt in the update; the next chunk's in sT);
//   R in sR (Mma: the stage tile hx(0), idle from the chunk's start to the update, so that the scaled Ṽ tiles need
//   no barrier after 𝒯 R; Simt: sA);
//   the new states of key tile kt as the products' operands hx(kt), hy(kt) (Mma: the stage tiles, rounded from the
//   registers; with kStageK key tile 1's in sT and the extra tile; Simt: the fp32 slabs);
//   the chunk vectors, gl and ul of chunk c in buffer c % 2 (ScanShared's, then one at sh.end): the next chunk's are
//   fetched into registers before the update (fetch_chunk_vectors) and written after it.
// Operands of Mma: k, 𝒯, R, the new S, M and the two scaled Ṽ tiles, each rounded to bf16 where formed; S, M, Ṽ
// stay fp32. Barriers a chunk: its start, after R, after the scaled Ṽ tiles and the key tiles the update starts
// with (Simt one more, before the scaled Ṽ tiles overwrite R in sA); in the update with kStageK one (between all
// key tiles' updates and the products), else two per key tile but the last (after its new states' operand tiles
// and the next chunk's key tile kt in sT: the products; after sK holds key tile kt + 1).
// Loads ahead (Mma, `stage`: the launcher found the staging tiles room in shared memory): the next chunk's 𝒯
// (when C and its length are multiples of 4 and the scratch is 16-byte aligned) and v rows (when v is,
// async_ok_f) land by cp.async in the fp32 staging tiles sh.g: issued after the barrier that ends this chunk's
// reads of them (after the R formation), waited for (cp_async_wait + the barrier) at the next chunk's start, and
// then converted by put_h_staged (𝒯: what fill_square stores) or read by the R formation instead of global memory
// (v: the same fp32 values). With kStageK (key_dim <= kScanStagedKeyTiles tiles, k aligned) the next chunk's k rows
// land in the staging tiles gK, issued at the chunk's start (one group before 𝒯 and v's), waited for
// (cp_async_wait<1>: the thread's own pieces) before the update's first barrier and converted there by
// put_h_staged into the next chunk's key tiles (chunk 0's before the loop). Operands that are not staged are
// loaded as without staging (k one key tile ahead in registers, tile::fetch_h: the chunk's and the next chunk's).
// The same bits either way, and as computing S_0^T k_i, M_0^T k_i from the slabs at the chunk's start.
template <typename L, bool kStageK>
__global__ void __launch_bounds__(tile::kThreads, 1) mdn_scan_kernel(MdnArgs a, bool stage) {
  extern __shared__ __align__(16) char smem[];
  constexpr bool kMma = std::is_same_v<Op<L>, bf16>;
  static_assert(kMma || !kStageK, "k staging converts into bf16 tiles");
  const int64_t K = a.K, V = a.V, C = a.C, bh = a.bh0 + blockIdx.y, v0 = static_cast<int64_t>(blockIdx.x) * kN;
  const int vc = tile::tile_cols(V, v0);
  const int64_t KT = key_tiles(K);
  const bool stg = kMma && stage;
  const ScanShared<L> sh(smem, K, C, scan_work(kStageK, KT), stg ? scan_staged(kStageK, KT) : 0);
  Op<L> *sA = sh.w(0), *sB = sh.w(1), *sT = sh.w(2), *sK = sh.w(3);
  // R: Mma in the first stage tile (idle from the chunk's start to the update's first barrier, so that the scaled
  // Ṽ tiles need no barrier after 𝒯 R), Simt in sA.
  Op<L>* const sR = kMma ? sh.stage_t[0] : sA;
  constexpr bool kFetchK = kMma && !kStageK;  // k through fetch_h / put_h, one key tile ahead
  // Key tile kt of chunk c's k rows: its operand tile (kStageK) or sK; the next chunk's during the update.
  const auto k_tile = [&](int64_t c, int64_t kt) { return kStageK ? sh.w(3 + (c % 2) * KT + kt) : sK; };
  const auto next_k_tile = [&](int64_t c, int64_t kt) { return kStageK ? k_tile(c + 1, kt) : sT; };
  // The operand tiles of key tile kt's new states X, Y for the products.
  const auto hx = [&](int64_t kt) -> Op<L>* {
    if constexpr (kMma) return kStageK && kt > 0 ? sT : sh.stage_t[0];
    else return sh.x(kt);
  };
  const auto hy = [&](int64_t kt) -> Op<L>* {
    if constexpr (kMma) return kStageK && kt > 0 ? sh.w(3 + 2 * KT) : sh.stage_t[1];
    else return sh.y(kt);
  };
  // The buffer of chunk c's vectors, gl and ul (kChunkVectors + 2 rows of C floats).
  const auto vec_buf = [&](int64_t c) { return c % 2 == 0 ? sh.cs.la : reinterpret_cast<float*>(sh.end); };
  const auto put_vectors = [&](const VectorLoads& x, int64_t c, int n) {
    float* const b = vec_buf(c);
    put_chunk_vectors(x, C, n, b, b + kChunkVectors * C, b + (kChunkVectors + 1) * C);
  };
  const auto k_rows = [&](const tile::Chunk& c, int64_t kt) { return c.in(a, a.k, K, kt * kN); };
  const auto fetch_k = [&](tile::HRegs& x, const tile::Chunk& c, int64_t kt) {
    tile::fetch_h(x, k_rows(c, kt), a.H * K, c.n, tile::tile_cols(K, kt * kN));
  };
  // Key tile kt of chunk c's k rows into dst: kFetchK from x (fetched by fetch_k), then x = key tile kt + 1's;
  // else (Simt) load_op.
  const auto put_k = [&](Op<L>* dst, tile::HRegs& x, const tile::Chunk& c, int64_t kt) {
    if constexpr (kFetchK) {
      tile::put_h(dst, x, c.n, [](int) { return 1.0f; });
      if (kt + 1 < KT) fetch_k(x, c, kt + 1);
    } else {
      load_op(dst, k_rows(c, kt), a.H * K, c.n, tile::tile_cols(K, kt * kN));
    }
  };
  // Staging tiles: 𝒯, the v rows, the key tiles.
  float *gT = sh.g, *gV = sh.g + tile::kStageFloats, *gK = gV + tile::kStageFloats;
  const bool v_async = stg && tile::async_ok_f(a.v, V);
  const bool t_aligned = stg && tile::async_ok_f(a.coef, C);
  const auto t_async = [&](int n) { return t_aligned && n % 4 == 0; };  // (rows of 𝒯 are n floats apart)
  // The staged 𝒯 and v rows of chunk c into their staging tiles (cp.async, one group).
  const auto issue_tv = [&](int64_t c) {
    const tile::Chunk nx(a, c, bh);
    if (t_async(nx.n)) tile::stage_async(gT, image_matrix(coef_image(a, bh, c), C, kT), nx.n, nx.n, nx.n);
    if (v_async) tile::stage_async(gV, nx.in(a, a.v, V, v0), a.H * V, nx.n, vc);
    tile::cp_async_commit();
  };
  // kStageK: chunk c's k rows into the staging tiles gK (cp.async, one group), and from there (the thread's own
  // pieces, after its cp_async_wait) into chunk c's key tiles.
  const auto issue_k = [&](int64_t c) {
    const tile::Chunk nx(a, c, bh);
    for (int64_t kt = 0; kt < KT; ++kt)
      tile::stage_async(gK + kt * tile::kStageFloats, k_rows(nx, kt), a.H * K, nx.n, tile::tile_cols(K, kt * kN));
    tile::cp_async_commit();
  };
  const auto convert_k = [&](int64_t c) {
    if constexpr (kStageK) {
      const int n = tile::Chunk(a, c, bh).n;
      for (int64_t kt = 0; kt < KT; ++kt) tile::put_h_staged(k_tile(c, kt), gK + kt * tile::kStageFloats, n);
    }
  };
  const int n0 = tile::Chunk(a, 0, bh).n;  // (the launchers run no scan without chunks)
  put_vectors(fetch_chunk_vectors(a, bh, 0, n0), 0, n0);
  if (stg) issue_tv(0);
  if constexpr (kStageK) {
    issue_k(0);
    tile::cp_async_wait<0>();
    convert_k(0);
  }
  // S_0^T k_i, M_0^T k_i of the chunk's rows: zero for chunk 0 (zero states), else summed by the chunk before's
  // update.
  tile::Acc xs, xm;
  xs.zero(), xm.zero();
  for (int64_t chunk = 0; chunk < a.NC; ++chunk) {
    const tile::Chunk ch(a, chunk, bh);
    const int n = ch.n;
    const bool more = chunk + 1 < a.NC;
    if (more) prefetch_scan_chunk(a, bh, chunk + 1, v0, vc, false);
    if (stg) tile::cp_async_wait<0>();  // this chunk's staged 𝒯 and v (the only group in flight)
    __syncthreads();  // the previous chunk's update and its readers of the shared buffers are done; every
                      // thread's staged pieces have landed
    if constexpr (kStageK) {
      if (more) issue_k(chunk + 1);  // (every conversion of gK is before the barrier)
    }
    ChunkSmem cs{};
    float* const gl = carve_vectors(vec_buf(chunk), C, cs);
    float* const ul = gl + C;
    if (chunk == 0) sh.store(K, V, v0, vc, state_pair<Op<L>>(a, a.states, bh, 0));  // (zero)
    const float* Timg = image_matrix(coef_image(a, bh, chunk), C, kT);
    if constexpr (kMma) {
      if (t_async(n)) tile::put_h_staged(sT, gT, n);
      else fill_square<L>(sT, n, [&](int r, int c) { return Timg[r * n + c]; });
    } else {
      fill_square<L>(sT, n, [&](int r, int c) { return Timg[r * n + c]; });
    }
    const float* v = ch.in(a, a.v, V, v0);
    tile::Acc xr;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int r = L::row(i), c = L::col(j);
        float x = 0.0f;
        if (r < n && c < vc) {
          const float am = r > 0 ? cs.abar[r - 1] : 1.0f, bm = r > 0 ? cs.bb[r - 1] : 0.0f;
          const float vr = v_async ? gV[r * kN + c] : v[r * a.H * V + c];
          x = vr - cs.alpha[r] * (am * xs.v[i][j] - bm * xm.v[i][j]);
        }
        xr.v[i][j] = x;
      }
    put_op<L>(xr, sR, tile::Same{});
    __syncthreads();  // R complete; every read of the staging tiles 𝒯, v is done
    if (stg && more) issue_tv(chunk + 1);
    tile::Acc xv;
    xv.zero();
    L::template mma<false, false>(sT, sR, xv);
    tile::store_acc<L>(xv, ch.in(a, a.vt_out, V, v0), a.H * V, n, vc, tile::Same{});
    if (!more) break;  // no one reads the final states
    // The next chunk's vectors, and (kFetchK) key tile 0's k rows of this chunk (kc) and the next (kn), in flight
    // while the block forms the scaled Ṽ tiles.
    const tile::Chunk nx(a, chunk + 1, bh);
    const VectorLoads vx = fetch_chunk_vectors(a, bh, chunk + 1, nx.n);
    [[maybe_unused]] tile::HRegs kc, kn;
    if constexpr (kFetchK) {
      if (KT > 0) fetch_k(kc, ch, 0), fetch_k(kn, nx, 0);
    }
    if constexpr (!kMma) __syncthreads();  // readers of R (sA) are done
    put_op<L>(xv, sA, [&](int r, int, float x) { return r < n ? cs.eta[r] * gl[r] * x : 0.0f; });
    put_op<L>(xv, sB, [&](int r, int, float x) { return r < n ? -cs.eta[r] * ul[r] * x : 0.0f; });
    if constexpr (kStageK) {
      tile::cp_async_wait<1>();  // the next chunk's k rows (the group before 𝒯 and v's)
      convert_k(chunk + 1);
    } else if (KT > 0) {
      put_k(sK, kc, ch, 0);
    }
    __syncthreads();  // sA, sB and the key tiles complete
    const float aC = cs.abar[n - 1], bC = cs.bb[n - 1], mC = cs.mbar[n - 1];
    Op<L>* const st = state_pair<Op<L>>(a, a.states, bh, chunk + 1) + v0;  // the next chunk's (S_0, M_0)
    const auto products = [&](int64_t kt) {
      L::template mma<false, false>(next_k_tile(chunk, kt), hx(kt), xs);
      L::template mma<false, false>(next_k_tile(chunk, kt), hy(kt), xm);
    };
    xs.zero(), xm.zero();
    for (int64_t kt = 0; kt < KT; ++kt) {
      if constexpr (!kStageK) put_k(sT, kn, nx, kt);  // (readers of sT: 𝒯 R, the products of key tile kt - 1)
      tile::Acc s, m;
      sh.get_states(kt, s, m);
      advance_states<L>(k_tile(chunk, kt), sA, sB, aC, bC, mC, s, m);
      sh.set_states(kt, s, m);
      const int rows = tile::tile_cols(K, kt * kN);
      store_state<L>(s, st + kt * kN * V, V, rows, vc);
      store_state<L>(m, st + (K + kt * kN) * V, V, rows, vc);
      if constexpr (kMma) {
        put_op<L>(s, hx(kt), tile::Same{});
        put_op<L>(m, hy(kt), tile::Same{});
      }
      if constexpr (!kStageK) {
        __syncthreads();  // key tile kt's new states and the next chunk's key tile kt complete; readers of sK done
        products(kt);
        if (kt + 1 < KT) {
          put_k(sK, kc, ch, kt + 1);
          __syncthreads();  // sK complete; readers of sT and of the stage tiles done
        }
      }
    }
    if constexpr (kStageK) {
      __syncthreads();  // every key tile's new states complete
      for (int64_t kt = 0; kt < KT; ++kt) products(kt);
    }
    put_vectors(vx, chunk + 1, nx.n);  // (readers of that buffer: the chunk before's)
  }
}

// ---- the states-only scan (the backward with saved Ṽ) ----

/// Blocks per SM that the states-only scan is compiled for: 3 when it stages its rows (tile::Mma: 80 registers,
/// 60 KiB of shared memory), else 1 (Mma without staging: 249 registers, Simt: 237; bounded to 2, both spill).
template <bool kStaged>
constexpr int state_scan_blocks_per_sm() { return kStaged ? 3 : 1; }

/// What the states-only update of a chunk needs of its coefficients (§6.2), in shared memory: g_r = η_r Γ_{n,r},
/// u_r = -η_r L_U[n,r] (r < n; the last rows of Γ and L_U, 0-based row n - 1), the scalars ᾱ_n, b_n, μ̄_n.
struct UpdateFactors {
  float g[kN], u[kN], abar, bb, mbar;
};

/// A thread's share of a chunk's UpdateFactors, as loaded from its coef image: thread t < n holds η_t, Γ_{n,t},
/// L_U[n,t]; thread kN + i (i < 3) holds ᾱ_n, b_n, μ̄_n (i = 0, 1, 2) in x[0].
struct FactorLoads {
  float x[3];
};

/// Issues the thread's loads of chunk `chunk`'s UpdateFactors (nothing waits for them here).
__device__ FactorLoads fetch_factors(const MdnArgs& a, int64_t bh, int64_t chunk) {
  const int n = tile::Chunk(a, chunk, bh).n, t = static_cast<int>(threadIdx.x);
  const int64_t C = a.C;
  const float* img = coef_image(a, bh, chunk);
  FactorLoads f{};
  if (t < n) {
    f.x[0] = img[kVecEta * C + t];
    f.x[1] = image_matrix(img, C, kG)[(n - 1) * n + t];
    f.x[2] = image_matrix(img, C, kLU)[(n - 1) * n + t];
  } else if (t >= kN && t < kN + 3) {
    const ChunkVector slot = t == kN ? kVecAbar : t == kN + 1 ? kVecBb : kVecMbar;
    f.x[0] = img[slot * C + n - 1];
  }
  return f;
}

/// Writes the thread's share fetched by fetch_factors (chunk length n) into f: g_t = η_t Γ_{n,t},
/// u_t = -η_t L_U[n,t] (the products the solving scan forms, in the same order), or its scalar. No barrier.
__device__ void put_factors(const FactorLoads& x, int n, UpdateFactors& f) {
  const int t = static_cast<int>(threadIdx.x);
  if (t < n) {
    f.g[t] = x.x[0] * x.x[1];
    f.u[t] = -x.x[0] * x.x[2];
  } else if (t == kN) {
    f.abar = x.x[0];
  } else if (t == kN + 1) {
    f.bb = x.x[0];
  } else if (t == kN + 2) {
    f.mbar = x.x[0];
  }
}

/// Asks the L2 for what a states-only scan block (key columns k0 .. k0 + kc - 1, value columns v0 .. v0 + vc - 1)
/// reads of chunk `chunk` of (batch, head) bh (no effect on any result): the coef image's vectors and the last
/// rows of Γ and L_U, its k and Ṽ rows.
__device__ void prefetch_state_chunk(const MdnArgs& a, int64_t bh, int64_t chunk, int64_t k0, int kc, int64_t v0,
                                     int vc) {
  using tile::prefetch_l2;
  const tile::Chunk nx(a, chunk, bh);
  const int64_t C = a.C, n = nx.n;
  const float* img = coef_image(a, bh, chunk);
  prefetch_l2(img, 0, 1, 4 * kChunkVectors * C);
  prefetch_l2(image_matrix(img, C, kG) + (n - 1) * n, 0, 1, 4 * n);
  prefetch_l2(image_matrix(img, C, kLU) + (n - 1) * n, 0, 1, 4 * n);
  prefetch_l2(nx.in(a, a.k, a.K, k0), 4 * a.H * a.K, nx.n, 4 * kc);
  prefetch_l2(nx.in(a, a.vt, a.V, v0), 4 * a.H * a.V, nx.n, 4 * vc);
}

/// x behind an empty volatile asm, unknown to the optimizer from here on: what is computed from it in a loop is
/// computed there, not hoisted out and held across the loop (under a register bound such held values spill;
/// recomputed where used they do not). T: a 32-bit integer or a pointer. Used by the state scan's stores (their
/// bounds) and brow_async's dew steps (the dew tensors' addresses).
template <typename T>
__device__ __forceinline__ T opaque(T x) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "a 32-bit integer or a pointer");
  if constexpr (sizeof(T) == 4) asm volatile("" : "+r"(x));
  else asm volatile("" : "+l"(x));
  return x;
}

/// dst[r * V + c] = x at the thread's elements of L with r < rows, c < cols, rounded to Op<L> (from_f32, as
/// ScanShared::store rounds): a state tile from registers into a [K, V] state. A full Mma tile (rows = cols = 64)
/// with dst 4-byte aligned and V even is stored by column pairs (c, c + 1 of a thread's j = 0, 1 and j = 2, 3), one
/// bf16x2 store each; anything else element by element (tile::store_acc, its bounds opaque: called in a loop).
template <typename L>
__device__ void store_state(const tile::Acc& x, Op<L>* dst, int64_t V, int rows, int cols) {
  if constexpr (std::is_same_v<L, tile::Mma>) {
    if (rows == kN && cols == kN && reinterpret_cast<uintptr_t>(dst) % 4 == 0 && V % 2 == 0) {
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; j += 2)
          *reinterpret_cast<__nv_bfloat162*>(dst + L::row(i) * V + L::col(j)) =
              __floats2bfloat162_rn(x.v[i][j], x.v[i][j + 1]);
      return;
    }
  }
  tile::store_acc<L>(x, dst, V, opaque(rows), opaque(cols), tile::Same{});
}

/// sA = Diag(f.g) R, sB = Diag(f.u) R for the chunk's n rows R (vc columns, rows `stride` apart at src) of an fp32
/// tensor, rows >= n and columns >= vc zero: two row-scaled operand tiles of L from one global tile (Mma: loaded
/// once, tile::fetch_h, stored twice, put_h; Simt: load_op twice). No barrier.
template <typename L>
__device__ void load_scaled_pair(Op<L>* sA, Op<L>* sB, const float* src, int64_t stride, int n, int vc,
                                 const UpdateFactors& f) {
  const auto fg = [&](int r) { return f.g[r]; };
  const auto fu = [&](int r) { return f.u[r]; };
  if constexpr (std::is_same_v<L, tile::Mma>) {
    tile::HRegs x;
    tile::fetch_h(x, src, stride, n, vc);
    tile::put_h(sA, x, n, fg);
    tile::put_h(sB, x, n, fu);
  } else {
    load_op(sA, src, stride, n, vc, fg);
    load_op(sB, src, stride, n, vc, fu);
  }
}

/// The states-only scan's grid: (value tile, key tile) pairs, key tiles fastest (neighbouring blocks share their
/// Ṽ rows), by (batch, head).
dim3 state_scan_grid(int64_t K, int64_t V, int64_t BH) {
  return dim3(static_cast<unsigned>(ceil_div(V, kN) * key_tiles(K)), static_cast<unsigned>(BH));
}

/// Shared bytes of the states-only scan on layout L: the UpdateFactors of two chunks, the operand tiles sA, sB,
/// sK and, when it stages, the fp32 staging tiles of the Ṽ and k rows (tile::Mma: 1,056 + 3 x 9,216 + 2 x 16,384
/// = 61,472 bytes; Simt: 1,056 + 3 x 16,640 = 50,976).
template <typename L>
constexpr size_t state_scan_bytes(bool staged) {
  return (2 * sizeof(UpdateFactors) + 15) / 16 * 16 + 3 * op_bytes<L>() +
         sizeof(float) * tile::kStageFloats * (staged ? 2 : 0);
}

// states-only scan kernel on layout L, grid state_scan_grid (the backward with saved Ṽ in a.vt; a.vt_out null):
// one key tile (key rows k0 .. k0 + kc - 1) and one value tile (columns v0 .. v0 + vc - 1) of the states S, M,
// chunk by chunk (§6.2): store the tile's rows of the entering (S_0, M_0), then advance_states from the chunk's
// saved Ṽ. Without the solve a key tile's update reads only its own states (no S_0^T k), so each key tile has its
// own block: its states are the thread's accumulators s, m (fp32 registers, never rounded), stored to the
// chunk-state scratch by store_state; the same expressions on the same values as the solving scan (its operands
// formed as there: sK as load_op, sA, sB as put_op of the scaled Ṽ), so the same bits. Shared
// (state_scan_bytes<L>): the UpdateFactors of two chunks (fac[chunk % 2]), the operand tiles sA (η Γ_{n,:} ⊙ Ṽ
// rows), sB (-η L_U[n,:] ⊙ Ṽ rows), sK (the chunk's k rows of the key tile), and with kStaged the fp32 staging
// tiles gV, gK. Operands of Mma: k and the two scaled Ṽ tiles, each rounded to bf16 where formed. Per chunk:
// store, B1 (the previous update's readers of sA, sB, sK are done; this chunk's rows have landed), the operand
// tiles, B2, the update. Loads ahead:
// - kStaged (Mma, Ṽ and k 16-byte aligned with dims multiples of 4: async_ok_f): the next chunk's Ṽ and k rows
//   land by cp.async in gV, gK while this chunk updates (issued after B2, waited for at the next chunk's B1) and
//   are converted by put_h_staged (the thread's own pieces); else they are loaded in the step (load_op,
//   load_scaled_pair: the same bits);
// - the next chunk's factors are loaded before B1 (fetch_factors) and written into the other fac before B2
//   (put_factors), so that this chunk's barrier and operand tiles hide their latency;
// - the L2 is asked for chunk c + 2's rows and factors at chunk c (prefetch_state_chunk).
// The last chunk's rows are never read (nothing reads the states after it).
template <typename L, bool kStaged>
__global__ void __launch_bounds__(tile::kThreads, state_scan_blocks_per_sm<kStaged>())
    mdn_state_scan_kernel(MdnArgs a) {
  extern __shared__ __align__(16) char smem[];
  static_assert(std::is_same_v<L, tile::Mma> || !kStaged, "the staged rows convert into bf16 tiles");
  // (32-bit block indices: fewer registers under the bound; grid y <= 65535, NC and the tile offsets < 2^31)
  const int64_t K = a.K, V = a.V;
  const int KT = static_cast<int>(key_tiles(K)), bh = static_cast<int>(a.bh0) + static_cast<int>(blockIdx.y);
  const int k0 = static_cast<int>(blockIdx.x) % KT * kN, v0 = static_cast<int>(blockIdx.x) / KT * kN;
  const int kc = tile::tile_cols(K, k0), vc = tile::tile_cols(V, v0), last = static_cast<int>(a.NC) - 1;
  tile::Carve cv{smem};
  UpdateFactors* fac = cv.take<UpdateFactors>(2);
  Op<L> *sA = op_tile<L>(cv), *sB = op_tile<L>(cv), *sK = op_tile<L>(cv);
  float* const gV = kStaged ? cv.take<float>(2 * tile::kStageFloats) : nullptr;
  float* const gK = kStaged ? gV + tile::kStageFloats : nullptr;
  // The staged rows of chunk c into gV, gK (cp.async, one group).
  const auto issue = [&](int c) {
    const tile::Chunk nx(a, c, bh);
    tile::stage_async(gV, nx.in(a, a.vt, V, v0), a.H * V, nx.n, vc);
    tile::stage_async(gK, nx.in(a, a.k, K, k0), a.H * K, nx.n, kc);
    tile::cp_async_commit();
  };
  if (last > 0) {
    prefetch_state_chunk(a, bh, 0, k0, kc, v0, vc);
    if (last > 1) prefetch_state_chunk(a, bh, 1, k0, kc, v0, vc);
    if constexpr (kStaged) issue(0);
    put_factors(fetch_factors(a, bh, 0), tile::Chunk(a, 0, bh).n, fac[0]);
  }
  tile::Acc s, m;
  s.zero(), m.zero();
  for (int chunk = 0;; ++chunk) {
    Op<L>* const S0 = state_pair<Op<L>>(a, a.states, bh, chunk) + k0 * V + v0;
    store_state<L>(s, S0, V, kc, vc);
    store_state<L>(m, S0 + K * V, V, kc, vc);
    if (chunk == last) break;
    const tile::Chunk ch(a, chunk, bh);
    const int n = ch.n;
    const bool next = chunk + 1 < last;  // whether the next chunk updates (reads its rows and factors)
    if (chunk + 2 < last) prefetch_state_chunk(a, bh, chunk + 2, k0, kc, v0, vc);
    const FactorLoads next_factors = next ? fetch_factors(a, bh, chunk + 1) : FactorLoads{};
    if constexpr (kStaged) tile::cp_async_wait<0>();  // this chunk's staged rows (the only group in flight)
    __syncthreads();  // B1
    const UpdateFactors& f = fac[chunk % 2];
    if constexpr (kStaged) {
      tile::put_h_staged(sK, gK, n);
      tile::put_h_staged(sA, gV, n, [&](int r) { return f.g[r]; });
      tile::put_h_staged(sB, gV, n, [&](int r) { return f.u[r]; });
    } else {
      load_op(sK, ch.in(a, a.k, K, k0), a.H * K, n, kc);
      load_scaled_pair<L>(sA, sB, ch.in(a, a.vt, V, v0), a.H * V, n, vc, f);
    }
    if (next) put_factors(next_factors, tile::Chunk(a, chunk + 1, bh).n, fac[(chunk + 1) % 2]);
    __syncthreads();  // B2: sA, sB, sK and the next chunk's factors complete; every read of gV, gK is done
    if constexpr (kStaged) {
      if (next) issue(chunk + 1);
    }
    advance_states<L>(sK, sA, sB, f.abar, f.bb, f.mbar, s, m);
  }
}

/// Dynamic shared memory an out block may take on tile::Mma and still run 2 blocks per SM (blocks_per_sm): 228 KiB a
/// multiprocessor on sm_90, 1 KiB of it reserved per block.
constexpr size_t kOutMaxSmem = 113 * 1024;
/// Most (S_0, M_0) tile pairs in the Mma out kernel's ring (the copies of up to 3 steps ahead in flight).
constexpr int kOutMaxDepth = 4;

/// Shared bytes of the out kernel on layout L. Simt: the chunk's vectors, then the operand tiles E, Q, S_0, M_0, Ṽ.
/// Mma: ᾱ and b (2 C floats), then the bf16 tiles E, Ṽ, `qtiles` Q tiles and `depth` (S_0, M_0) pairs.
template <typename L>
constexpr size_t out_bytes(int64_t C, int64_t qtiles, int depth) {
  if constexpr (std::is_same_v<L, tile::Mma>)
    return padded_bytes(2 * C) + static_cast<size_t>(2 + qtiles + 2 * depth) * op_bytes<L>();
  else
    return padded_bytes(kChunkVectors * C) + 5 * op_bytes<L>();
}

/// The out kernel's shared layout on tile::Mma (mdn_out_kernel): the ring depth and the bytes (out_bytes), with all
/// key tiles of Q in shared memory: the deepest ring up to kOutMaxDepth that fits in kOutMaxSmem (at least 2), and
/// no deeper than the steps (key tile, value tile) + 1. Simt: its fixed layout. Throws where Q and a ring of 2 do
/// not fit (key_dim > 384 at C = 64; the scans refuse key_dim > 320 before).
struct OutPlan {
  int depth;
  size_t bytes;
};
template <typename L>
OutPlan out_plan(int64_t K, int64_t V, int64_t C) {
  if constexpr (!std::is_same_v<L, tile::Mma>) {
    return {0, out_bytes<L>(C, 0, 0)};
  } else {
    const int64_t KT = key_tiles(K), steps = KT * ceil_div(V, kN);
    check(out_bytes<L>(C, KT, 2) <= kOutMaxSmem, "mdn chunk (cuda): key_dim {} too large for the out kernel", K);
    int depth = 2;
    while (depth < kOutMaxDepth && depth <= steps && out_bytes<L>(C, KT, depth + 1) <= kOutMaxSmem) ++depth;
    return {depth, out_bytes<L>(C, KT, depth)};
  }
}
static_assert(out_bytes<tile::Mma>(kMdnMaxChunk, 4, 3) <= kOutMaxSmem,
              "out keeps Q whole with a ring of 3 at key_dim 256");
static_assert(out_bytes<tile::Mma>(kMdnMaxChunk, 2, 4) <= kOutMaxSmem,
              "out keeps Q whole with a ring of 4 at key_dim 128");

/// Waits until at most n (clamped to 0 .. kOutMaxDepth - 2) of the thread's cp.async groups are in flight.
__device__ __forceinline__ void cp_async_wait_upto(int n) {
  static_assert(kOutMaxDepth - 2 == 2, "cp_async_wait_upto covers the ring's depths");
  if (n >= 2) tile::cp_async_wait<2>();
  else if (n == 1) tile::cp_async_wait<1>();
  else tile::cp_async_wait<0>();
}

// out kernel on layout L, grid (NC, B H): per value tile v0 (in order), over the key tiles k0 in order,
// xs += Q_k0 S_0[k0, v0], xm += Q_k0 M_0[k0, v0]; then xe = E Ṽ_v0 with E = (Q K̂^T) ⊙ Γ and
// O = Diag(ᾱ) xs - Diag(b) xm + xe. A step is one (value tile, key tile) pair, steps in that order (key tiles
// fastest).
// Simt (fp32 tiles): the chunk's vectors, then the tiles E, Q, S_0, M_0, Ṽ (out_bytes); every operand loaded when
// it is used, two barriers a step.
// Mma (bf16 tiles, each operand rounded to bf16 once where loaded or formed: the same bits as load_op), kFast (the
// launcher's choice: Q fits whole and the state scratch allows 16-byte copies) or the fallbacks below: shared
// (out_plan / out_bytes) ᾱ and b [C] each, then the tiles E, Ṽ, Q (all KT key tiles, loaded once for every value
// tile) and a ring of `depth` (S_0, M_0) tile pairs, step s's in
// slot s % depth. In flight:
//   prologue: the ring's copies of steps 0 .. depth - 2 (cp.async, one group a step, as load_h_async: the same
//     bits as load_op) are issued first; then ᾱ, b, E's inputs (Γ, Q K̂^T) and the Q tiles (two key tiles' loads
//     at a time, tile::fetch_h) are loaded while they land, and Ṽ's first value tile is fetched into registers;
//   step s: wait for its own copies (cp_async_wait: depth - 2 newer groups may stay in flight), one barrier (every
//     thread's copies of step s have landed; every thread's products of step s - 1 are done, so slot (s - 1) %
//     depth is free), then step s + depth - 1's copies into that slot (one group, empty past the last step), then
//     the two products: depth - 1 steps' chunk-state tiles in flight behind the products;
//   end of a value tile: Ṽ's registers into the Ṽ tile (put_h), the next value tile's Ṽ fetched into them (in
//     flight through the next value tile's steps), a barrier, E Ṽ, o stored (column pairs as 8-byte stores where
//     o is 8-byte aligned). The next write of the Ṽ tile is after the next value tile's first step barrier
//     (key_dim 0: a barrier of its own).
// Fallback (!kFast; 128 registers without spill: Ṽ is loaded at the value tile's end, as Simt does), the same
// bits: where the chunk states are not 16-byte aligned (V not a multiple of 8, tile::async_ok_h) each step loads
// its S_0, M_0 tiles synchronously into its slot before its barrier (the slot was last read by step s - depth,
// before step s - 1's barrier). The sums are those of the Simt order: xs, xm over the key tiles in order, xe from zero, o = ᾱ xs - b xm + xe.
template <typename L, bool kFast>
__global__ void __launch_bounds__(tile::kThreads, blocks_per_sm<L>()) mdn_out_kernel(MdnArgs a, int depth) {
  extern __shared__ __align__(16) char smem[];
  const int64_t K = a.K, V = a.V, C = a.C;
  const tile::Chunk ch(a, blockIdx.x, a.bh0 + blockIdx.y);
  const int n = ch.n;
  tile::Carve cv{smem};
  const float* img = coef_image(a, ch.bh, ch.chunk);
  const float *G = image_matrix(img, C, kG), *QK = image_matrix(img, C, kQK);
  const Op<L>* S0 = state_pair<Op<L>>(a, a.states, ch.bh, ch.chunk);
  const Op<L>* M0 = S0 + K * V;
  float* o = ch.in(a, a.o, V, 0);
  if constexpr (!std::is_same_v<L, tile::Mma>) {
    ChunkSmem cs;
    carve_vectors(cv.take<float>(kChunkVectors * C), C, cs);
    Op<L> *sE = op_tile<L>(cv), *sQ = op_tile<L>(cv), *sS = op_tile<L>(cv), *sM = op_tile<L>(cv),
          *sV = op_tile<L>(cv);
    copy_floats(cs.la, img, kChunkVectors * C);
    for (int idx = threadIdx.x; idx < kN * kN; idx += blockDim.x) {
      const int r = idx / kN, c = idx % kN;
      sE[r * op_ld<L>() + c] = from_f32<Op<L>>(r < n && c <= r ? G[r * n + c] * QK[r * n + c] : 0.0f);
    }
    for (int64_t v0 = 0; v0 < V; v0 += kN) {
      const int vc = tile::tile_cols(V, v0);
      tile::Acc xs, xm, xe;
      xs.zero(), xm.zero(), xe.zero();
      for (int64_t k0 = 0; k0 < K; k0 += kN) {
        const int kc = tile::tile_cols(K, k0);
        load_op(sQ, ch.in(a, a.q, K, k0), a.H * K, n, kc);
        load_op(sS, S0 + k0 * V + v0, V, kc, vc);
        load_op(sM, M0 + k0 * V + v0, V, kc, vc);
        __syncthreads();
        L::template mma<false, false>(sQ, sS, xs);
        L::template mma<false, false>(sQ, sM, xm);
        __syncthreads();
      }
      load_op(sV, ch.in(a, a.vt, V, v0), a.H * V, n, vc);
      __syncthreads();
      L::template mma<false, false>(sE, sV, xe);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int r = L::row(i), c = L::col(j);
          if (r < n && c < vc) o[r * a.H * V + v0 + c] = cs.abar[r] * xs.v[i][j] - cs.bb[r] * xm.v[i][j] + xe.v[i][j];
        }
      __syncthreads();
    }
  } else {
    constexpr int kTile = tile::kTileHalves;  // bf16 elements of a tile (op_bytes apart)
    const int64_t KT = key_tiles(K);
    const bool async = kFast || (K > 0 && tile::async_ok_h(S0, V) && tile::async_ok_h(M0, V));
    float* sab = cv.take<float>(2 * C);  // ᾱ [C], then b [C]
    bf16 *sE = op_tile<L>(cv), *sV = op_tile<L>(cv);
    bf16* sQ = cv.take<bf16>(KT * kTile);
    bf16* ring = cv.take<bf16>(2 * static_cast<int64_t>(depth) * kTile);  // slot i: S_0 at 2 i kTile, M_0 after
    const auto one = [](int) { return 1.0f; };
    // The pair of step (v0, k0) into a ring slot (async: cp.async, no commit; else load_op).
    const auto load_pair = [&](int64_t v0, int64_t k0, bf16* slot, bool by_copy) {
      const int kc = tile::tile_cols(K, k0), vc = tile::tile_cols(V, v0);
      if (by_copy) {
        tile::load_h_async(slot, S0 + k0 * V + v0, V, kc, vc);
        tile::load_h_async(slot + kTile, M0 + k0 * V + v0, V, kc, vc);
      } else {
        load_op(slot, S0 + k0 * V + v0, V, kc, vc);
        load_op(slot + kTile, M0 + k0 * V + v0, V, kc, vc);
      }
    };
    // Prologue: the copies of steps 0 .. depth - 2, one group a step (empty past the last); (nv0, nk0): the next
    // step to copy.
    int64_t nv0 = 0, nk0 = 0;
    const auto copy_next = [&](bf16* slot) {
      if (nv0 < V) {
        load_pair(nv0, nk0, slot, true);
        nk0 += kN;
        if (nk0 >= K) nk0 = 0, nv0 += kN;
      }
      tile::cp_async_commit();
    };
    if (async)
      for (int i = 0; i + 1 < depth; ++i) copy_next(ring + 2 * i * kTile);
    // ᾱ and b from the image (its vectors: rows >= n zero).
    {
      ChunkSmem iv;  // pointers into the image (read only)
      carve_vectors(const_cast<float*>(img), C, iv);
      const int t = static_cast<int>(threadIdx.x);
      if (t < C) sab[t] = iv.abar[t];
      else if (t < 2 * C) sab[t] = iv.bb[t - C];
    }
    const float* vt = ch.in(a, a.vt, V, 0);
    tile::Frag vf;  // kFast: the next value tile's Ṽ rows (the first fetched in the prologue)
    // E = (Q K̂^T) ⊙ Γ (j <= i < n, else 0) in load_h's map (column pairs), all loads issued before the stores;
    // Q's key tiles two at a time (the first two with E's loads).
    {
      float e[tile::kHPer][2][2];
#pragma unroll
      for (int it = 0; it < tile::kHPer; ++it) {
        const int idx = static_cast<int>(threadIdx.x) + it * tile::kThreads, r = idx >> 5, c = 2 * (idx & 31);
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const bool in = r < n && c + u <= r;
          e[it][u][0] = in ? G[r * n + c + u] : 0.0f;
          e[it][u][1] = in ? QK[r * n + c + u] : 0.0f;
        }
      }
      const float* q = ch.in(a, a.q, K, 0);
      const int64_t qrows = a.H * K, qtiles = KT;
      tile::Frag qa, qb;
      if (qtiles > 0) tile::fetch_h(qa, q, qrows, n, tile::tile_cols(K, 0));
      if (qtiles > 1) tile::fetch_h(qb, q + kN, qrows, n, tile::tile_cols(K, kN));
#pragma unroll
      for (int it = 0; it < tile::kHPer; ++it) {
        const int idx = static_cast<int>(threadIdx.x) + it * tile::kThreads, r = idx >> 5, c = 2 * (idx & 31);
        float x[2];
#pragma unroll
        for (int u = 0; u < 2; ++u) x[u] = r < n && c + u <= r ? e[it][u][0] * e[it][u][1] : 0.0f;
        *reinterpret_cast<__nv_bfloat162*>(sE + r * tile::kLdH + c) = __floats2bfloat162_rn(x[0], x[1]);
      }
      if constexpr (kFast) tile::fetch_h(vf, vt, a.H * V, n, tile::tile_cols(V, 0));
      for (int64_t kt = 0; kt < qtiles; kt += 2) {
        if (kt > 0) {
          tile::fetch_h(qa, q + kt * kN, qrows, n, tile::tile_cols(K, kt * kN));
          if (kt + 1 < qtiles) tile::fetch_h(qb, q + (kt + 1) * kN, qrows, n, tile::tile_cols(K, (kt + 1) * kN));
        }
        tile::put_h(qa, sQ + kt * kTile, n, one);
        if (kt + 1 < qtiles) tile::put_h(qb, sQ + (kt + 1) * kTile, n, one);
      }
    }
    const bool o_pairs = reinterpret_cast<uintptr_t>(a.o) % 8 == 0;  // (kFast: V is a multiple of 8)
    int slot = 0;   // ring slot of the step (the step mod depth)
    for (int64_t v0 = 0; v0 < V; v0 += kN) {
      const int vc = tile::tile_cols(V, v0);
      tile::Acc xs, xm, xe;
      xs.zero(), xm.zero();
      for (int64_t k0 = 0, kt = 0; k0 < K; k0 += kN, ++kt) {
        bf16* sS = ring + 2 * slot * kTile;
        const bf16* sq = sQ + kt * kTile;
        if (async)
          cp_async_wait_upto(depth - 2);
        else
          load_pair(v0, k0, sS, false);
        __syncthreads();
        if (async) copy_next(ring + 2 * (slot == 0 ? depth - 1 : slot - 1) * kTile);
        L::template mma<false, false>(sq, sS, xs);
        L::template mma<false, false>(sq, sS + kTile, xm);
        slot = slot + 1 == depth ? 0 : slot + 1;
      }
      if (K == 0) __syncthreads();  // (no step barrier: the last value tile's E Ṽ read sV)
      if constexpr (!kFast) tile::fetch_h(vf, vt + v0, a.H * V, n, vc);
      tile::put_h(vf, sV, n, one);
      if (kFast && v0 + kN < V) tile::fetch_h(vf, vt + v0 + kN, a.H * V, n, tile::tile_cols(V, v0 + kN));
      __syncthreads();
      xe.zero();
      L::template mma<false, false>(sE, sV, xe);
      const float *abar = sab, *bb = sab + C;
      const auto out = [&](int i, int j) {
        const int r = L::row(i);
        return abar[r] * xs.v[i][j] - bb[r] * xm.v[i][j] + xe.v[i][j];
      };
      if (kFast && o_pairs) {  // columns j, j + 1 (c even; vc a multiple of 8) as one 8-byte store
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; j += 2) {
            const int r = L::row(i), c = L::col(j);
            if (r < n && c < vc)
              *reinterpret_cast<float2*>(o + r * a.H * V + v0 + c) = make_float2(out(i, j), out(i, j + 1));
          }
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int r = L::row(i), c = L::col(j);
            if (r < n && c < vc) o[r * a.H * V + v0 + c] = out(i, j);
          }
      }
    }
  }
}

/// The bscan's dṼ and dR of a chunk (sE = E, sD = dO, sT = 𝒯, the chunk's vectors, gl and ul ordered before by a
/// barrier; xs = dS^T k_r, xm = dM^T k_r): dṼ_r = Σ_{i>=r} E_ir dO_i + η_r (Γ_{n,r} xs_r - L_U[n,r] xm_r) (rows
/// < n, else 0) into sX, then xr = dR = 𝒯^T dṼ, stored to dv (value columns v0 .. v0 + vc - 1). One barrier.
template <typename L>
__device__ void bscan_dr(const MdnArgs& a, const tile::Chunk& ch, const ScanShared<L>& sh, const Op<L>* sE,
                         const Op<L>* sD, const Op<L>* sT, Op<L>* sX, const tile::Acc& xs, const tile::Acc& xm,
                         int64_t v0, int vc, tile::Acc& xr) {
  const ChunkSmem& cs = sh.cs;
  const int n = ch.n;
  tile::Acc xe, xd;
  xe.zero();
  L::template mma<true, false>(sE, sD, xe);
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = L::row(i);
      xd.v[i][j] = r < n ? xe.v[i][j] + cs.eta[r] * (sh.gl[r] * xs.v[i][j] - sh.ul[r] * xm.v[i][j]) : 0.0f;
    }
  put_op<L>(xd, sX, tile::Same{});
  __syncthreads();
  xr.zero();
  L::template mma<true, false>(sT, sX, xr);
  tile::store_acc<L>(xr, ch.in(a, a.dv, a.V, v0), a.H * a.V, n, vc, tile::Same{});
}

/// The carry update's dR operands from xr = dR (readers of sT, sX done; no barrier): sT = -α ᾱ⁻ ⊙ dR rows,
/// sX = α b⁻ ⊙ dR rows (rows < n, else 0).
template <typename L>
__device__ void put_dr_operands(const tile::Acc& xr, const ChunkSmem& cs, int n, Op<L>* sT, Op<L>* sX) {
  put_op<L>(xr, sT, [&](int r, int, float x) {
    const float am = r > 0 ? cs.abar[r - 1] : 1.0f;
    return r < n ? -cs.alpha[r] * am * x : 0.0f;
  });
  put_op<L>(xr, sX, [&](int r, int, float x) {
    const float bm = r > 0 ? cs.bb[r - 1] : 0.0f;
    return r < n ? cs.alpha[r] * bm * x : 0.0f;
  });
}

// bscan kernel on layout L, grid scan_grid: value columns v0 .. v0 + vc - 1, chunks in reverse (§7.3), on 64 x 64
// shared tiles, carrying dS = dL/dS_next, dM = dL/dM_next (zero after the last chunk; fp32 slabs): store them
// (dstates); dṼ_r = Σ_{i>=r} E_ir dO_i + η_r (Γ_{n,r} dS^T k_r - L_U[n,r] dM^T k_r) with E = (Q K̂^T) ⊙ Γ;
// dR = 𝒯^T dṼ (= dv, written; bscan_dr); then per key tile
// dS_0 = ᾱ_n dS + Q^T Diag(ᾱ) dO - K^T Diag(α ᾱ⁻) dR, dM_0 = -b_n dS + μ̄_n dM - Q^T Diag(b) dO + K^T Diag(α b⁻) dR
// (ᾱ⁻_i = ᾱ_{i-1}, b⁻_i = b_{i-1}; ᾱ_{-1} = 1, b_{-1} = 0) become the previous chunk's (dS, dM).
// Operands: q, k, E, 𝒯, dO and its scaled copies (scaled in fp32, then rounded), dṼ, the scaled dR, dS and dM
// (Mma: each rounded to bf16 once, where formed or loaded).
// tile::Mma: the previous chunk's dS^T k_r, dM^T k_r are software-pipelined into this chunk's update: once a key
// tile's new (dS, dM) are in registers they are written to the slabs (thread-major, get_own / set_own: no thread
// reads another's slab elements) and rounded to bf16 into the stage tiles hx, hy, and after the next barrier the
// previous chunk's k rows of that key tile (sP) multiply them into its (xs, xm) and the same bf16 go to its
// dstates (tile::store_h); the last key tile's products run after the next chunk start's barrier. Key tiles in
// order, so (xs, xm) and dstates have the bits of stage + keys_times_slabs + store (the last chunk's: zero, stored
// from the zero slabs). Per key tile kt (2 barriers; sQ, sK, sP, hx, hy written in turn, each read after the
// barrier that follows its write and written again after the one that follows its reads):
//   q_kt -> sQ | B | ns, nm += Q^T (ᾱ dO), Q^T (-b dO); products of kt - 1; k_kt -> sK |
//   B | ns, nm += K^T (dR scaled); slabs, hx, hy <- (ns, nm); k_kt of the previous chunk -> sP.
// Every global operand is in flight in registers ahead of its use: q, k and the previous chunk's k rows one key
// tile ahead (tile::fetch_h, their tile 0 at the chunk start), the previous chunk's vectors and last rows
// (fetch_chunk_vectors), 𝒯 and dO (fetch_h) and E (its bf16 image slot, written by the coef kernel, fetch_pairs)
// during this chunk's update; put_h / put_pairs / put_chunk_vectors then store what load_chunk_vectors,
// fill_square (𝒯, Γ ⊙ Q K̂^T rounded once) and load_op store; dO stays in registers for its scaled copies.
// Shared: ScanShared<L> (no staging tiles) with the work tiles sQ, sK (the chunk's q, k rows of one key tile), sP
// (the previous chunk's k rows of one key tile), sD (dO; then ᾱ ⊙ dO rows), sE (E; then -b ⊙ dO rows), sT (𝒯; then
// -α ᾱ⁻ ⊙ dR rows), sX (dṼ; then α b⁻ ⊙ dR rows) and the stage tiles hx, hy: 9 bf16 tiles (213.5 KiB at key_dim
// 256, 148.5 KiB at 128).
// tile::Simt: per chunk, synchronous loads (fill_square, load_op), dstates stored from the slabs (ScanShared::store)
// and dS^T k_r, dM^T k_r by keys_times_slabs at its start, then the update one key tile at a time through one work
// tile sK (q, then k rows) with the operand tiles sE, sT, sD, sX as on Mma (5 fp32 tiles).
template <typename L>
__global__ void __launch_bounds__(tile::kThreads) mdn_bscan_kernel(MdnArgs a) {
  extern __shared__ __align__(16) char smem[];
  const int64_t K = a.K, V = a.V, C = a.C, KT = key_tiles(K), bh = a.bh0 + blockIdx.y;
  const int64_t v0 = static_cast<int64_t>(blockIdx.x) * kN;
  const int vc = tile::tile_cols(V, v0);
  const ScanShared<L> sh(smem, K, C, bscan_work<L>(), 0);
  const ChunkSmem& cs = sh.cs;
  if constexpr (std::is_same_v<L, tile::Mma>) {
    bf16 *sQ = sh.w(0), *sK = sh.w(1), *sP = sh.w(2), *sD = sh.w(3), *sE = sh.w(4), *sT = sh.w(5), *sX = sh.w(6);
    bf16 *hx = sh.stage_t[0], *hy = sh.stage_t[1];
    const auto one = [](int) { return 1.0f; };
    // Key tile kt's rows of p (q or k) of chunk c into registers.
    const auto fetch_rows = [&](tile::HRegs& r, const float* p, const tile::Chunk& c, int64_t kt) {
      tile::fetch_h(r, c.in(a, p, K, kt * kN), a.H * K, c.n, tile::tile_cols(K, kt * kN));
    };
    // What chunk c's start reads, into registers: its vectors and last rows, 𝒯, E, dO.
    VectorLoads fv{};
    tile::HRegs fT, fO;
    tile::HPairs fE;
    const auto fetch_chunk = [&](int64_t c) {
      const tile::Chunk nx(a, c, bh);
      const float* im = coef_image(a, bh, c);
      fv = fetch_chunk_vectors(a, bh, c, nx.n);
      tile::fetch_h(fT, image_matrix(im, C, kT), nx.n, nx.n, nx.n);
      tile::fetch_pairs(fE, image_e(im, C), kN);
      tile::fetch_h(fO, nx.in(a, a.d_o, V, v0), a.H * V, nx.n, vc);
    };
    // The pipelined products of key tile kt (hx, hy, sP written, then a barrier): xs += P_kt bf16(dS_kt),
    // xm += P_kt bf16(dM_kt); the same bf16 into key tile kt's rows of the dstates pair ds.
    tile::Acc xs, xm;  // the chunk's dS^T k_r, dM^T k_r (summed during the later chunk's update)
    const auto products = [&](int64_t kt, bf16* ds) {
      L::template mma<false, false>(sP, hx, xs);
      L::template mma<false, false>(sP, hy, xm);
      const int kc = tile::tile_cols(K, kt * kN);
      tile::store_h(hx, ds + kt * kN * V + v0, V, kc, vc);
      tile::store_h(hy, ds + (K + kt * kN) * V + v0, V, kc, vc);
    };
    tile::HRegs fq, fk, fp;  // the update's q, k rows and the previous chunk's k rows, one key tile ahead
    xs.zero(), xm.zero();
    fetch_chunk(a.NC - 1);
    for (int64_t chunk = a.NC - 1; chunk >= 0; --chunk) {
      const tile::Chunk ch(a, chunk, bh);
      const int n = ch.n, last = n - 1;
      bf16* const ds = state_pair<bf16>(a, a.dstates, bh, chunk);
      __syncthreads();  // the later chunk's update and its readers of the shared buffers are done
      if (chunk + 1 == a.NC) sh.store(K, V, v0, vc, ds);  // the zero carry (the slabs as zeroed)
      else if (KT > 0) products(KT - 1, ds);
      put_chunk_vectors(fv, C, n, cs.la, sh.gl, sh.ul);
      tile::put_h(sT, fT, n, one);
      tile::put_pairs(sE, fE);
      tile::put_h(sD, fO, n, one);
      if (chunk > 0 && KT > 0) {
        fetch_rows(fq, a.q, ch, 0);
        fetch_rows(fk, a.k, ch, 0);
        fetch_rows(fp, a.k, tile::Chunk(a, chunk - 1, bh), 0);
      }
      __syncthreads();
      tile::Acc xr;
      bscan_dr<L>(a, ch, sh, sE, sD, sT, sX, xs, xm, v0, vc, xr);
      if (chunk == 0) break;  // no one reads the gradients of the initial states
      __syncthreads();        // readers of E, 𝒯, dO, dṼ are done
      tile::put_h(sD, fO, n, [&](int r) { return cs.abar[r]; });
      tile::put_h(sE, fO, n, [&](int r) { return -cs.bb[r]; });
      put_dr_operands<L>(xr, cs, n, sT, sX);
      const tile::Chunk pv(a, chunk - 1, bh);
      bf16* const dp = state_pair<bf16>(a, a.dstates, bh, chunk - 1);
      fetch_chunk(chunk - 1);
      xs.zero(), xm.zero();
      const float aC = cs.abar[last], bC = cs.bb[last], mC = cs.mbar[last];
      for (int64_t kt = 0; kt < KT; ++kt) {
        tile::Acc ns, nm;
        sh.get_own(kt, ns, nm);
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const float s = ns.v[i][j], m = nm.v[i][j];
            ns.v[i][j] = aC * s;
            nm.v[i][j] = -bC * s + mC * m;
          }
        tile::put_h(sQ, fq, n, one);
        if (kt + 1 < KT) fetch_rows(fq, a.q, ch, kt + 1);
        __syncthreads();
        L::template mma<true, false>(sQ, sD, ns);
        L::template mma<true, false>(sQ, sE, nm);
        if (kt > 0) products(kt - 1, dp);
        tile::put_h(sK, fk, n, one);
        if (kt + 1 < KT) fetch_rows(fk, a.k, ch, kt + 1);
        __syncthreads();
        L::template mma<true, false>(sK, sT, ns);
        L::template mma<true, false>(sK, sX, nm);
        sh.set_own(kt, ns, nm);
        tile::store_acc_h(ns, hx, tile::Same{});
        tile::store_acc_h(nm, hy, tile::Same{});
        tile::put_h(sP, fp, pv.n, one);
        if (kt + 1 < KT) fetch_rows(fp, a.k, pv, kt + 1);
      }
    }
  } else {
    constexpr int kLd = tile::kLd;
    Op<L> *sK = sh.w(0), *sE = sh.w(1), *sT = sh.w(2), *sD = sh.w(3), *sX = sh.w(4);
    for (int64_t chunk = a.NC - 1; chunk >= 0; --chunk) {
      const tile::Chunk ch(a, chunk, bh);
      const int n = ch.n, last = n - 1;
      if (chunk > 0) prefetch_scan_chunk(a, bh, chunk - 1, v0, vc, true);
      __syncthreads();  // the later chunk's carry update and its readers of the shared buffers are done
      const float* img = load_chunk_vectors(a, bh, chunk, n, cs, sh.gl, sh.ul);
      const float *Timg = image_matrix(img, C, kT), *G = image_matrix(img, C, kG), *QK = image_matrix(img, C, kQK);
      const float* dO = ch.in(a, a.d_o, V, v0);
      fill_square<L>(sT, n, [&](int r, int c) { return Timg[r * n + c]; });
      fill_square<L>(sE, n, [&](int r, int c) { return G[r * n + c] * QK[r * n + c]; });
      load_op(sD, dO, a.H * V, n, vc);
      sh.store(K, V, v0, vc, state_pair<Op<L>>(a, a.dstates, bh, chunk));
      tile::Acc xs, xm;  // dS^T k_r, dM^T k_r (key tiles in order)
      xs.zero(), xm.zero();
      sh.keys_times_slabs(a, ch, n, sK, xs, xm);
      __syncthreads();  // sE, sD filled (also when K = 0)
      tile::Acc xr;
      bscan_dr<L>(a, ch, sh, sE, sD, sT, sX, xs, xm, v0, vc, xr);
      if (chunk == 0) break;  // no one reads the gradients of the initial states
      __syncthreads();        // readers of E, 𝒯, dO, dṼ are done
      load_op(sD, dO, a.H * V, n, vc, [&](int r) { return cs.abar[r]; });
      load_op(sE, dO, a.H * V, n, vc, [&](int r) { return -cs.bb[r]; });
      put_dr_operands<L>(xr, cs, n, sT, sX);
      const float aC = cs.abar[last], bC = cs.bb[last], mC = cs.mbar[last];
      for (int64_t kt = 0; kt < KT; ++kt) {
        const int kc = tile::tile_cols(K, kt * kN);
        float *Sk = sh.x(kt), *Mk = sh.y(kt);
        tile::Acc ns, nm;
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int e = L::row(i) * kLd + L::col(j);
            ns.v[i][j] = aC * Sk[e];
            nm.v[i][j] = -bC * Sk[e] + mC * Mk[e];
          }
        load_op(sK, ch.in(a, a.q, K, kt * kN), a.H * K, n, kc);
        __syncthreads();
        L::template mma<true, false>(sK, sD, ns);
        L::template mma<true, false>(sK, sE, nm);
        __syncthreads();
        load_op(sK, ch.in(a, a.k, K, kt * kN), a.H * K, n, kc);
        __syncthreads();
        L::template mma<true, false>(sK, sT, ns);
        L::template mma<true, false>(sK, sX, nm);
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int e = L::row(i) * kLd + L::col(j);
            Sk[e] = ns.v[i][j];
            Mk[e] = nm.v[i][j];
          }
        __syncthreads();  // readers of sK are done
      }
    }
  }
}

// An operand of the value-dimension products: `rows` rows of V elements E (float, or the chunk states' operand
// type), `stride` apart (rows beyond it read as 0).
template <typename E>
struct VRows {
  const E* p;
  int64_t stride;
  int rows;
};

/// Products over V (64 x 64, depth = the V value channels, tiles and channels in order) of a pair sharing one
/// operand U, loaded once per value tile: kSharedLeft: x += U B1^T, y += U B2^T; else x += B1 U^T, y += B2 U^T.
/// Uses the operand tiles t[0..2] of L (U in t[0]). B1 and B2 rows of bf16 operands (the chunk states on
/// tile::Mma) are copied by cp.async (tile::load_h_async: the same bits) where every row is 16-byte aligned
/// (tile::async_ok_h): a value tile's copies are issued before U's loads (for the next tile, right after the
/// barrier that ends the reads of t[1], t[2]), so both are in flight together; else all three are loaded by
/// load_op. Ends with a barrier.
template <bool kSharedLeft, typename L, typename E0, typename E1, typename E2>
__device__ void products_over_v(int64_t V, const VRows<E0>& u, const VRows<E1>& b1, const VRows<E2>& b2,
                                Op<L>* const t[3], tile::Acc& x, tile::Acc& y) {
  constexpr bool kCopyB = std::is_same_v<Op<L>, bf16> && std::is_same_v<E1, bf16> && std::is_same_v<E2, bf16>;
  bool copy_b = false;
  const auto copy = [&](int64_t v0) {  // B1, B2 of value tile v0 into t[1], t[2] (cp.async, one group)
    if constexpr (kCopyB) {
      const int vc = tile::tile_cols(V, v0);
      tile::load_h_async(t[1], b1.p + v0, b1.stride, b1.rows, vc);
      tile::load_h_async(t[2], b2.p + v0, b2.stride, b2.rows, vc);
      tile::cp_async_commit();
    }
  };
  if constexpr (kCopyB) copy_b = tile::async_ok_h(b1.p, b1.stride) && tile::async_ok_h(b2.p, b2.stride);
  if (copy_b) copy(0);
  for (int64_t v0 = 0; v0 < V; v0 += kN) {
    const int vc = tile::tile_cols(V, v0);
    load_op(t[0], u.p + v0, u.stride, u.rows, vc);
    if (copy_b) {
      tile::cp_async_wait<0>();
    } else {
      load_op(t[1], b1.p + v0, b1.stride, b1.rows, vc);
      load_op(t[2], b2.p + v0, b2.stride, b2.rows, vc);
    }
    __syncthreads();
    if constexpr (kSharedLeft) {
      L::template mma<false, true>(t[0], t[1], x);
      L::template mma<false, true>(t[0], t[2], y);
    } else {
      L::template mma<false, true>(t[1], t[0], x);
      L::template mma<false, true>(t[2], t[0], y);
    }
    __syncthreads();
    if (copy_b && v0 + kN < V) copy(v0 + kN);
  }
}

/// Stores dew = (x, y) = (dO Ṽ^T, dR Ṽ^T) of chunk ch by store(acc, dst, stride, rows, cols) and forms from them the
/// operand tiles dEG = dE ⊙ Γ (dE_ij = dO_i·Ṽ_j, j <= i) and dWG = dW ⊙ Γ⁻ (dW_ij = -dR_i·Ṽ_j, j < i), rows >= n zero;
/// Γ (rows n apart) read from the coef image in global memory. No barrier.
template <typename L, typename Store>
__device__ void brow_dew_out(const MdnArgs& a, const tile::Chunk& ch, const tile::Acc& x, const tile::Acc& y,
                             const float* G, Op<L>* sEG, Op<L>* sWG, Store store) {
  const int n = ch.n;
  float* dew = dew_pair(a, ch.bh, ch.chunk);
  store(x, dew, kN, kN, kN);
  store(y, dew + kN * kN, kN, kN, kN);
  put_op<L>(x, sEG, [&](int r, int c, float e) { return r < n && c <= r ? e * G[r * n + c] : 0.0f; });
  put_op<L>(y, sWG, [&](int r, int c, float e) { return r < n && c < r ? -e * G[(r - 1) * n + c] : 0.0f; });
}

/// The key-side sums of key tile k0 (kc columns): (dEG K̂)_i, (dWG K̂)_i into rowk slots kEK, kWK and
/// (dEG^T Q + dWG^T P)_i into kKQP (summed over the chunk's rows in order; K̂ = η k in t0, q in t1, P = α k in t2),
/// by store(acc, dst, stride, rows, cols). Expects the operand tiles complete; no barrier.
template <typename L, typename Slot, typename Store>
__device__ void brow_key_sums(const Op<L>* sEG, const Op<L>* sWG, const Op<L>* t0, const Op<L>* t1, const Op<L>* t2,
                              int64_t K, int64_t k0, int n, int kc, tile::Acc& x, tile::Acc& y, Slot slot,
                              Store store) {
  x.zero(), y.zero();
  L::template mma<false, false>(sEG, t0, x);
  L::template mma<false, false>(sWG, t0, y);
  store(x, slot(kEK) + k0, K, n, kc);
  store(y, slot(kWK) + k0, K, n, kc);
  x.zero();
  L::template mma<true, false>(sEG, t1, x);
  L::template mma<true, false>(sWG, t2, x);
  store(x, slot(kKQP) + k0, K, n, kc);
}

/// store_acc<tile::Mma>(acc, dst, stride, rows, cols, Same) by column pairs (the thread's columns j, j + 1 of the
/// Mma map are adjacent): float2 stores, half the store instructions. dst 8-byte aligned, stride and cols even.
__device__ void store_acc_pairs(const tile::Acc& acc, float* dst, int64_t stride, int rows, int cols) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; j += 2) {
      const int r = tile::Mma::row(i), c = tile::Mma::col(j);
      if (r < rows && c < cols)
        *reinterpret_cast<float2*>(dst + r * stride + c) = make_float2(acc.v[i][j], acc.v[i][j + 1]);
    }
}

// brow kernel on layout L, grid (NC, B H): the backward's products for one chunk on 64 x 64 shared tiles:
// dew [2, 64, 64] = (dO Ṽ^T, dR Ṽ^T) (dR = dv from bscan); from them dEG = dE ⊙ Γ (dE_ij = dO_i·Ṽ_j, j <= i) and
// dWG = dW ⊙ Γ⁻ (dW_ij = -dR_i·Ṽ_j, j < i); then per key tile the rowk rows [i][m] S_0 dO_i, M_0 dO_i, S_0 dR_i,
// M_0 dR_i, dS Ṽ_i, dM Ṽ_i and the key-side sums (dEG K̂)_i, (dWG K̂)_i, (dEG^T Q + dWG^T P)_i. Rows >= n are zero
// padding. Two variants, the same products in the same order (the same bits):
// kAsync = false (tile::Simt; tile::Mma where brow_async_ok fails: the launcher's fallback) loads in the step:
// each product pair loads its shared operand once per value tile (dew: Ṽ; rowk: dO, dR, Ṽ; the bf16 chunk states
// of the rowk pairs by cp.async where aligned, see products_over_v), and the key-side sums load η k, q, α k
// together (one barrier pair; Mma: k and q read once, into registers). Shared: the chunk's vectors
// (kChunkVectors * C floats), then 5 operand tiles: 3 work tiles (Mma: dO, dR, Ṽ, S_0, M_0, dS, dM, q, η k, α k)
// and dEG, dWG, each rounded to bf16 where loaded or formed; the products fp32.
// kAsync = true (tile::Mma only): brow_async, the same steps as one pipeline with every operand in flight a step
// ahead.
template <typename L>
__device__ __forceinline__ void brow_direct(const MdnArgs& a) {
  extern __shared__ __align__(16) char smem[];
  const int64_t C = a.C, K = a.K, V = a.V, KV = K * V;
  const tile::Chunk ch(a, blockIdx.x, a.bh0 + blockIdx.y);
  const int n = ch.n;
  tile::Carve cv{smem};
  ChunkSmem cs;
  carve_vectors(cv.take<float>(kChunkVectors * C), C, cs);
  Op<L>* const t[3] = {op_tile<L>(cv), op_tile<L>(cv), op_tile<L>(cv)};
  Op<L> *sEG = op_tile<L>(cv), *sWG = op_tile<L>(cv);
  const float* img = coef_image(a, ch.bh, ch.chunk);
  const float* G = image_matrix(img, C, kG);
  copy_floats(cs.la, img, kChunkVectors * C);
  const VRows<float> dO{ch.in(a, a.d_o, V, 0), a.H * V, n}, dR{ch.in(a, a.dv, V, 0), a.H * V, n},
      VT{ch.in(a, a.vt, V, 0), a.H * V, n};
  const auto store = [](const tile::Acc& acc, float* dst, int64_t stride, int rows, int cols) {
    tile::store_acc<L>(acc, dst, stride, rows, cols, tile::Same{});
  };
  tile::Acc x, y;
  x.zero(), y.zero();
  products_over_v<false, L>(V, VT, dO, dR, t, x, y);
  brow_dew_out<L>(a, ch, x, y, G, sEG, sWG, store);
  const Op<L>* S0 = state_pair<Op<L>>(a, a.states, ch.bh, ch.chunk);
  const Op<L>* dS = state_pair<Op<L>>(a, a.dstates, ch.bh, ch.chunk);
  const auto slot = [&](RowkSlot p) { return rowk_slot(a, ch.bh, ch.chunk, p); };
  for (int64_t k0 = 0; k0 < K; k0 += kN) {
    const int kc = tile::tile_cols(K, k0);
    const VRows<Op<L>> s{S0 + k0 * V, V, kc}, m{S0 + KV + k0 * V, V, kc}, g{dS + k0 * V, V, kc},
        h{dS + KV + k0 * V, V, kc};
    const auto pair = [&](RowkSlot p, RowkSlot q, const auto& u, const auto& b1, const auto& b2) {
      x.zero(), y.zero();
      products_over_v<true, L>(V, u, b1, b2, t, x, y);
      store(x, slot(p) + k0, K, n, kc);
      store(y, slot(q) + k0, K, n, kc);
    };
    pair(kSdO, kMdO, dO, s, m);
    pair(kSdR, kMdR, dR, s, m);
    pair(kGV, kHV, VT, g, h);
    // dEG K̂, dWG K̂ (K̂ = η k), dEG^T Q + dWG^T P (P = α k), summed over the chunk's rows in order.
    const float *kk = ch.in(a, a.k, K, k0), *qq = ch.in(a, a.q, K, k0);
    const auto eta = [&](int r) { return cs.eta[r]; };
    const auto alpha = [&](int r) { return cs.alpha[r]; };
    if constexpr (std::is_same_v<Op<L>, bf16>) {  // k and q loaded once, all their loads in flight together
      tile::Frag fk, fq;
      tile::fetch_h(fk, kk, a.H * K, n, kc);
      tile::fetch_h(fq, qq, a.H * K, n, kc);
      tile::put_h(fk, t[0], n, eta);
      tile::put_h(fq, t[1], n, [](int) { return 1.0f; });
      tile::put_h(fk, t[2], n, alpha);
    } else {
      load_op(t[0], kk, a.H * K, n, kc, eta);
      load_op(t[1], qq, a.H * K, n, kc);
      load_op(t[2], kk, a.H * K, n, kc, alpha);
    }
    __syncthreads();
    brow_key_sums<L>(sEG, sWG, t[0], t[1], t[2], K, k0, n, kc, x, y, slot, store);
    __syncthreads();
  }
}

/// A step of brow_async: key tile kt and, for p = -1, the dew pair's value tile v (kt = 0); p = 0, 1, 2: rowk pair
/// p's value tile v, the pairs (dO; S_0, M_0), (dR; S_0, M_0), (Ṽ; dS, dM); p = 3: the key-side sums.
struct BrowStep {
  int kt, p, v;
  /// The step after this one (nvt value tiles): the dew steps, then per key tile the three pairs' value tiles in
  /// order and the key-side sums; kt is past the last key tile after the last step.
  __device__ BrowStep next(int nvt) const {
    if (p == 3) return {kt + 1, 0, 0};
    if (v + 1 < nvt) return {kt, p, v + 1};
    return {kt, p + 1, 0};
  }
};

/// Shared bytes of brow_async for chunk size C: η and α [C], 8 bf16 operand tiles (two slots of U, B1, B2, then
/// dEG, dWG), 2 fp32 staging tiles (104.5 KiB at C = 64: two blocks per SM).
constexpr size_t brow_async_bytes(int64_t C) {
  return padded_bytes(2 * C) + 8 * op_bytes<tile::Mma>() + 2 * sizeof(float) * tile::kStageFloats;
}
static_assert(2 * op_bytes<tile::Mma>() >= sizeof(float) * tile::kStageFloats,
              "brow_async stages the dew steps' dR over dEG and dWG");
static_assert(kVecAlpha == kVecEta + 1, "brow_async copies η and α as one run of the coef image");

// brow_async (mdn_brow_kernel<tile::Mma, true>): brow's products as one sequence of steps (BrowStep), each step's
// operands copied by cp.async one step ahead, while the step before computes; one barrier a step. A step's
// operands land in one of two slots of three bf16 tiles (U, B1, B2). fp32 operands go through the staging tiles
// g0, g1 (and, for the dew steps, g2 over dEG and dWG, which are formed after the last dew step) and are rounded
// into the slot by put_h_staged (load_op's elements, scales and rounding):
//   dew step v:        Ṽ, dO, dR of value tile v (g0, g1, g2 -> U, B1, B2); x += dO Ṽ^T, y += dR Ṽ^T;
//   pair p's step v:   u = dO, dR, Ṽ (p = 0, 1, 2) of value tile v (g0 -> U) and the bf16 chunk states (S_0, M_0)
//                      or (dS, dM) of key tile kt straight into B1, B2 (load_h_async); x += U B1^T, y += U B2^T;
//   key step:          k, q of key tile kt (g0, g1 -> η k, q, α k into U, B1, B2); brow_key_sums.
// Iteration s: wait for step s's copies (issued at iteration s - 1), round its staged operands into slot s % 2
// (each thread its own staged pieces), barrier (slot s % 2 complete; every read of slot (s + 1) % 2, by step
// s - 1, and of the staging tiles done), issue step s + 1 into slot (s + 1) % 2 and the staging tiles, compute
// step s. A pair's accumulators sum its value tiles in order as brow_direct does (the same bits); results are
// stored by column pairs (store_acc_pairs). Before step 0's copies: η and α (cp.async, in step 0's group) and an L2
// prefetch of Γ (read by brow_dew_out after the dew steps). Launched where brow_async_ok holds.
__device__ __forceinline__ void brow_async(const MdnArgs& a) {
  using L = tile::Mma;
  constexpr int kT = tile::kTileHalves;
  extern __shared__ __align__(16) char smem[];
  const int64_t C = a.C, K = a.K, V = a.V, KV = K * V, HV = a.H * V, HK = a.H * K;
  const tile::Chunk ch(a, blockIdx.x, a.bh0 + blockIdx.y);
  const int n = ch.n, nvt = static_cast<int>((V + kN - 1) / kN), nkt = static_cast<int>((K + kN - 1) / kN);
  tile::Carve cv{smem};
  float* const vec = cv.take<float>(2 * C);  // η, α
  bf16* const slots = cv.take<bf16>(6 * kT);  // slot b: U, B1, B2 at tiles 3 b, 3 b + 1, 3 b + 2
  bf16 *const sEG = op_tile<L>(cv), *const sWG = op_tile<L>(cv);
  float *const g0 = cv.take<float>(tile::kStageFloats), *const g1 = cv.take<float>(tile::kStageFloats);
  float* const g2 = reinterpret_cast<float*>(sEG);
  const float* img = coef_image(a, ch.bh, ch.chunk);
  const float* G = image_matrix(img, C, kG);
  const float *dO = ch.in(a, a.d_o, V, 0), *dR = ch.in(a, a.dv, V, 0), *VT = ch.in(a, a.vt, V, 0);
  const bf16* S0 = state_pair<bf16>(a, a.states, ch.bh, ch.chunk);
  const bf16* dS = state_pair<bf16>(a, a.dstates, ch.bh, ch.chunk);
  const auto slot = [&](RowkSlot p) { return rowk_slot(a, ch.bh, ch.chunk, p); };
  const int hv = static_cast<int>(HV), hk = static_cast<int>(HK);  // (64 H K, 64 H V < 2^31: brow_async_ok)
  const auto stage = [&](float* g, const float* src, int stride, int cols) {  // stage_async, 32-bit row offsets
    tile::stage_async(g, [=](int r) { return src + r * stride; }, n, cols);
  };
  const auto issue = [&](const BrowStep& st, int b) {
    bf16* const u = slots + 3 * b * kT;
    const int64_t v0 = st.v * kN, k0 = st.kt * kN;
    const int vc = tile::tile_cols(V, v0), kc = tile::tile_cols(K, k0);
    if (st.p < 0) {
      stage(g0, opaque(VT) + v0, hv, vc);
      stage(g1, opaque(dO) + v0, hv, vc);
      stage(g2, opaque(dR) + v0, hv, vc);
    } else if (st.p < 3) {
      stage(g0, (st.p == 0 ? dO : st.p == 1 ? dR : VT) + v0, hv, vc);
      const bf16* b1 = (st.p < 2 ? S0 : dS) + k0 * V + v0;
      tile::load_h_async(u + kT, b1, V, kc, vc);
      tile::load_h_async(u + 2 * kT, b1 + KV, V, kc, vc);
    } else {
      stage(g0, ch.in(a, a.k, K, k0), hk, kc);
      stage(g1, ch.in(a, a.q, K, k0), hk, kc);
    }
    tile::cp_async_commit();
  };
  const auto round = [&](const BrowStep& st, int b) {
    bf16* const u = slots + 3 * b * kT;
    if (st.p < 3) {
      tile::put_h_staged(u, g0, n);
      if (st.p < 0) {
        tile::put_h_staged(u + kT, g1, n);
        tile::put_h_staged(u + 2 * kT, g2, n);
      }
    } else {
      tile::put_h_staged(u, g0, n, [&](int r) { return vec[r]; });           // η k
      tile::put_h_staged(u + kT, g1, n);                                     // q
      tile::put_h_staged(u + 2 * kT, g0, n, [&](int r) { return vec[C + r]; });  // α k
    }
  };
  tile::Acc x, y;
  const auto compute = [&](const BrowStep& st, int b) {
    const bf16 *const u = slots + 3 * b * kT, *const b1 = u + kT, *const b2 = b1 + kT;
    const int64_t k0 = st.kt * kN;
    const int kc = tile::tile_cols(K, k0);
    if (st.p == 3) {
      brow_key_sums<L>(sEG, sWG, u, b1, b2, K, k0, n, kc, x, y, slot, store_acc_pairs);
      return;
    }
    const bool dew = st.p < 0;  // dew: x += B1 U^T, y += B2 U^T; rowk: x += U B1^T, y += U B2^T
    if (st.v == 0) x.zero(), y.zero();
    L::mma<false, true>(dew ? b1 : u, dew ? u : b1, x);
    L::mma<false, true>(dew ? b2 : u, dew ? u : b2, y);
    if (st.v + 1 < nvt) return;
    if (dew) {
      brow_dew_out<L>(a, ch, x, y, G, sEG, sWG, store_acc_pairs);
    } else {
      store_acc_pairs(x, slot(static_cast<RowkSlot>(2 * st.p)) + k0, K, n, kc);
      store_acc_pairs(y, slot(static_cast<RowkSlot>(2 * st.p + 1)) + k0, K, n, kc);
    }
  };
  for (int i = static_cast<int>(threadIdx.x); i < 2 * C; i += tile::kThreads)
    tile::cp_async4(vec + i, img + kVecEta * C + i);
  tile::prefetch_l2(G, 0, 1, sizeof(float) * n * n);
  BrowStep st{0, -1, 0};
  issue(st, 0);
#pragma unroll 1
  for (int b = 0;; b ^= 1) {
    tile::cp_async_wait<0>();
    round(st, b);
    __syncthreads();
    const BrowStep nx = st.next(nvt);
    if (nx.kt < nkt) issue(nx, b ^ 1);
    compute(st, b);
    if (nx.kt >= nkt) break;
    st = nx;
  }
}

/// The brow kernel on layout L (the comment above brow_direct): brow_async where kAsync, else brow_direct.
template <typename L, bool kAsync>
__global__ void __launch_bounds__(tile::kThreads, blocks_per_sm<L>()) mdn_brow_kernel(MdnArgs a) {
  if constexpr (kAsync) {
    static_assert(std::is_same_v<L, tile::Mma>, "brow's pipeline is written for the bf16 tiles of tile::Mma");
    brow_async(a);
  } else {
    brow_direct<L>(a);
  }
}

// The bchunk kernel's shared memory: the chunk's vectors, then vectors [C] dabar (dL/dᾱ), db (dL/db), dmbar
// (dL/dμ̄), dlul (dL/dL_U of the last row, from M_next), kdp (k_i·dp_i); the row dots [kRowDots, C] (RowDot);
// the matrix LUA [C, ld]: L_U in its lower triangle (LUA[r][j] = L_U[r,j], j <= r) and column r of L_A right of
// the diagonal of row r (LUA[r][i + 1] = L_A[i,r], i >= r; whence ld > C); then, 16-byte aligned, one region that
// holds in turn the state dots' cp.async ring (kDotStages stages), the staged key columns of the row dots
// (kStaged planes [C, kColStride]) and the matrices [n, n] dG (dΓ, then F_A: the segment prefix of
// dL_A ⊙ L_A), Y, dLU (then in place F_U: the segment prefix of dL_U ⊙ L_U), of which only the lower triangles
// are written and read. Matrix rows are bchunk_ld(C) floats apart (odd: a column read by consecutive threads
// hits distinct banks). Γ's last row, Q K̂^T, P K̂^T and dew are read from global memory, each element once.
// About 70 KiB at C = 64: three blocks per SM.
constexpr int kBwdVectors = 5, kBwdMatrices = 3;
/// The dot products over K of chunk row r that bchunk combines, by pairs sharing their left factor:
/// q_r·(S_0 dO_r), q_r·(M_0 dO_r); k_r·(S_0 dR_r), k_r·(M_0 dR_r); k_r·(dM Ṽ_r), k_r·(dS Ṽ_r) (row 0's k·(S_0 dR),
/// k·(M_0 dR) are not used).
enum RowDot { kQSdO, kQMdO, kKSdR, kKMdR, kKHV, kKGV, kRowDots };
/// Key columns bchunk stages per step of its row dots, and the row stride of a staged plane (odd, as bchunk_ld).
constexpr int kColStep = 16, kColStride = kColStep + 1;
/// Staged planes of a key-column step: q, k and the rowk slots of the row dots (the pair of dot d is planes
/// 2 + 2d, 3 + 2d against q for d = 0, else k), then dk̂ and dp formed in the step (dot 3: k·dk̂, k·dp).
enum Staged { kStQ, kStK, kStSdO, kStMdO, kStSdR, kStMdR, kStHV, kStGV, kStDKH, kStDP, kStaged };
static_assert(4 * kMdnMaxChunk <= tile::kThreads, "bchunk gives each row dot pair its own thread");
/// The state dots' operands (S_0, M_0, dS, dM) and the stages of their cp.async ring; a stage holds one 16-byte
/// piece of each operand per thread (16 KiB).
constexpr int kDotOperands = 4, kDotStages = 3;
constexpr int64_t kDotStageFloats = kDotOperands * tile::kThreads * 4;

/// Blocks per SM that bchunk is compiled for (at most 85 registers; 80 unbounded): three fit beside its 70 KiB
/// of shared memory at C = 64.
constexpr int kBchunkBlocksPerSm = 3;
/// Row stride of bchunk's shared matrices (odd, above C).
constexpr int64_t bchunk_ld(int64_t C) { return (C + 1) | 1; }
/// Floats of bchunk's shared region: the ring, the staged key columns, then dG, Y, dLU.
constexpr int64_t bchunk_region(int64_t C) {
  const int64_t ring = kDotStages * kDotStageFloats, staged = kStaged * kColStride * C,
                mats = kBwdMatrices * C * bchunk_ld(C), m = staged > mats ? staged : mats;
  return ring > m ? ring : m;
}
/// Floats of bchunk's shared memory before the region (vectors, row dots, LUA), rounded up to 16 bytes.
constexpr int64_t bchunk_head(int64_t C) {
  return ((kChunkVectors + kBwdVectors + kRowDots) * C + C * bchunk_ld(C) + 3) / 4 * 4;
}
/// Floats of the bchunk kernel's shared memory for chunk size C.
constexpr int64_t bchunk_floats(int64_t C) { return bchunk_head(C) + bchunk_region(C); }
static_assert(kBchunkBlocksPerSm * (4 * bchunk_floats(kMdnMaxChunk) + 2048) <= 228 * 1024,
              "bchunk: three blocks per SM (with 1 KiB of static and 1 KiB of reserved shared memory each)");

/// Elements of each state operand that bchunk's state dots load per thread before their first use (without the
/// ring).
constexpr int kDotBatch = 8;
/// Lower-triangle elements of an n x n matrix (n <= kMdnMaxChunk) that each bchunk thread forms of dΓ.
constexpr int kDgPerThread = (kMdnMaxChunk * (kMdnMaxChunk + 1) / 2 + tile::kThreads - 1) / tile::kThreads;

/// 4 bytes into shared dst from global src (both 4-byte aligned) by cp.async (.ca); lands as tile::cp_async16's.
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
#ifdef __CUDA_ARCH__
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
               "l"(src)
               : "memory");
#elif defined(LLMT_CUDA_EMU)
  ::emu::cp_async(dst, src, 4, 4);
#endif
}

/// LUA (the bchunk layout) from the image's L_U and L_A (row stride n) by cp.async (no commit, no barrier):
/// thread t copies column c = t % n of rows t / n, + P, + 2 P, ... (P = kThreads / n rows a pass) of the lower
/// triangles, L_U[r,c] to LUA[r][c] and L_A[r,c] to LUA[c][r + 1] (coalesced reads; ld odd: no bank conflicts).
__device__ void copy_lua_async(float* LUA, const float* LU, const float* LA, int n, int ld) {
  const int t = static_cast<int>(threadIdx.x), per = tile::kThreads / n, c = t % n;
  if (t >= per * n) return;
  for (int r = t / n; r < n; r += per)
    if (c <= r) {
      cp_async4(LUA + r * ld + c, LU + r * n + c);
      cp_async4(LUA + c * ld + r + 1, LA + r * n + c);
    }
}

/// block_reduce(v, SumOp{}, 0.0)'s butterfly within a warp (every lane gets the same sum).
__device__ __forceinline__ double butterfly_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/// This thread's parts of the state dots ⟨S_0, dS⟩, ⟨M_0, dS⟩, ⟨M_0, dM⟩ of a chunk (elements E; S_0 then M_0 at
/// S0, dS then dM at dS, K V each): thread t sums its elements t, t + kThreads, ... in that order, in double. With
/// `ring` (S0 and dS 16-byte aligned, K V a multiple of a 16-byte piece) the four operands stream by cp.async
/// through the ring at buf (kDotStages stages of kDotStageFloats floats; thread t copies piece t of each operand a
/// stage): two stages in flight while one is summed, a barrier a stage (all threads call it), the thread's older
/// cp.async groups landed at the first stage; the caller's barrier must come before buf is reused. Otherwise
/// kDotBatch elements of each operand (4 kDotBatch loads) are loaded before their first use.
template <typename E>
__device__ double3 state_dots(const E* S0, const E* dS, int64_t KV, bool ring, float* buf) {
  double3 d = make_double3(0.0, 0.0, 0.0);
  const auto add = [&](float s, float m, float ds, float dm) {
    d.x += static_cast<double>(s) * ds;
    d.y += static_cast<double>(m) * ds;
    d.z += static_cast<double>(m) * dm;
  };
  const int t = static_cast<int>(threadIdx.x);
  const E *M0 = S0 + KV, *dM = dS + KV;
  if (!ring) {
    int64_t i0 = t;
    for (; i0 + (kDotBatch - 1) * tile::kThreads < KV; i0 += kDotBatch * tile::kThreads) {
      float s[kDotBatch], m[kDotBatch], ds[kDotBatch], dm[kDotBatch];
#pragma unroll
      for (int j = 0; j < kDotBatch; ++j) {
        const int64_t e = i0 + j * tile::kThreads;
        s[j] = to_f32(S0[e]), m[j] = to_f32(M0[e]), ds[j] = to_f32(dS[e]), dm[j] = to_f32(dM[e]);
      }
#pragma unroll
      for (int j = 0; j < kDotBatch; ++j) add(s[j], m[j], ds[j], dm[j]);
    }
    for (; i0 < KV; i0 += tile::kThreads) add(to_f32(S0[i0]), to_f32(M0[i0]), to_f32(dS[i0]), to_f32(dM[i0]));
    return d;
  }
  constexpr int kPiece = 16 / sizeof(E), kStage = tile::kThreads * kPiece;  // elements: a piece, an operand's stage
  static_assert(kDotOperands * kStage * sizeof(E) == sizeof(float) * kDotStageFloats, "bchunk: ring stage size");
  E* const st = reinterpret_cast<E*>(buf);
  const E* const src[kDotOperands] = {S0, M0, dS, dM};
  const int stages = static_cast<int>((KV + kStage - 1) / kStage);
  const auto issue = [&](int s) {  // stage s (none past the last) into slot s % kDotStages, one group
    const int64_t e = static_cast<int64_t>(s) * kStage + t * kPiece;
    if (e < KV) {
      E* const dst = st + (s % kDotStages) * kDotOperands * kStage + t * kPiece;
#pragma unroll
      for (int o = 0; o < kDotOperands; ++o) tile::cp_async16(dst + o * kStage, src[o] + e, 16);
    }
    tile::cp_async_commit();
  };
  issue(0);
  issue(1);
  for (int s = 0; s < stages; ++s) {
    tile::cp_async_wait<1>();  // stage s landed (stage s + 1 may be in flight)
    __syncthreads();           // ... for every thread, and every thread is done with stage s - 1's slot
    issue(s + 2);
    // The thread's kPiece elements of each operand in the stage, read before the first is summed (the slot's
    // elements past K V are stale and not summed).
    const E* const x = st + (s % kDotStages) * kDotOperands * kStage + t;
    const int64_t left = KV - static_cast<int64_t>(s) * kStage - t;
    const int valid = left < kStage ? static_cast<int>(left) : kStage;
    float v[kPiece][kDotOperands];
#pragma unroll
    for (int j = 0; j < kPiece; ++j)
#pragma unroll
      for (int o = 0; o < kDotOperands; ++o) v[j][o] = to_f32(x[o * kStage + j * tile::kThreads]);
#pragma unroll
    for (int j = 0; j < kPiece; ++j)
      if (j * tile::kThreads < valid) add(v[j][0], v[j][1], v[j][2], v[j][3]);
  }
  return d;
}

/// Row of position q in the row order of a lower triangle (row r holds r + 1 elements, from r (r + 1) / 2).
__device__ __forceinline__ int tri_row(int q) {
  int r = static_cast<int>((sqrtf(8.0f * static_cast<float>(q) + 1.0f) - 1.0f) * 0.5f);
  if ((r + 1) * (r + 2) / 2 <= q) ++r;
  if (r * (r + 1) / 2 > q) --r;
  return r;
}

/// x[j] = p[j] for j < m (1 .. 4), 0 after: one 16-byte load when vec (p 16-byte aligned, m = 4), else scalar loads.
__device__ __forceinline__ void load4(float (&x)[4], const float* p, bool vec, int m) {
  if (vec) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) x[j] = j < m ? p[j] : 0.0f;
  }
}
/// p[j] = x[j] for j < m (1 .. 4): one 16-byte store when vec (p 16-byte aligned, m = 4), else scalar stores.
__device__ __forceinline__ void store4(float* p, const float (&x)[4], bool vec, int m) {
  if (vec) {
    *reinterpret_cast<float4*>(p) = make_float4(x[0], x[1], x[2], x[3]);
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (j < m) p[j] = x[j];
  }
}

/// acc += (Σ_c x[c] y[c], Σ_c x[c] z[c]) over c < kc, each in column order (fp32 fma): one step of dot products
/// over K summed in key order across the column steps.
__device__ inline void dotf2_step(const float* x, const float* y, const float* z, int kc, float2& acc) {
  for (int c = 0; c < kc; ++c) {
    acc.x = fmaf(x[c], y[c], acc.x);
    acc.y = fmaf(x[c], z[c], acc.y);
  }
}

// bchunk kernel on layout L (which only sets the chunk states' element type, Op<L>: every step is fp32 or double
// on the CUDA cores), grid (NC, B H), one chunk of §7.3 given the scans' S_0, M_0 (states), dS, dM leaving the
// chunk (dstates) and brow's products (dew, rowk): dq, dp, dk̂, the coefficient gradients, and through
// Γ = L_A Diag(β) L_U, b = L_A (β ⊙ μ̄) to dβ, d log α, d log μ (segment sums of dL ⊙ L).
// Shared: bchunk_floats(C) floats (see kBwdVectors). In flight: the vectors and LUA by cp.async beside the state
// dots' ring (state_dots; the chunk states stream through the region two stages ahead), whose block sums finish
// after the key columns (one barrier for the warp sums). One pass over the key columns, kColStep at a time
// staged in the region, forms dq, dk, dk̂, dp element-wise and continues the row dots (3 n pairs over the rowk
// slots and n pairs k·dk̂, k·dp, one pair per thread, each summed in column order); dk̂ and dp never leave the
// block. dΓ's operands go to the L2 during the last step (prefetch_l2) and to registers (all of a thread's) before
// the barrier that ends the pass. The per-element and per-row steps after it run on all threads, the O(n^3) sums
// of Y and dL_U as warp tasks of (nearly) equal length, dβ beside the segment prefixes (disjoint threads).
template <typename L>
__global__ void __launch_bounds__(tile::kThreads, kBchunkBlocksPerSm) mdn_bchunk_kernel(MdnArgs a) {
  extern __shared__ __align__(16) char smem[];
  __shared__ double dot_part[3][tile::kThreads / 32];  // the state dots' warp sums
  __shared__ float dot_sum[3];                          // ... and block sums (rounded to fp32)
  constexpr int kWarps = tile::kThreads / 32;
  const int64_t C = a.C, K = a.K, V = a.V, KV = K * V;
  const tile::Chunk ch(a, blockIdx.x, a.bh0 + blockIdx.y);
  const HeadView hv{a, ch.b, ch.h};
  const int64_t c0 = ch.t0;
  const int n = ch.n, last = n - 1, ld = static_cast<int>(bchunk_ld(C));
  const int t = static_cast<int>(threadIdx.x), lane = t & 31, warp = t >> 5;
  ChunkSmem cs{};
  float* dabar = carve_vectors(reinterpret_cast<float*>(smem), C, cs);
  float* db = dabar + C;
  float* dmbar = db + C;
  float* dlul = dmbar + C;
  float* kdp = dlul + C;
  float* dots = kdp + C;
  float* const LUA = dots + kRowDots * C;
  cs.LU = LUA;
  float* const region = reinterpret_cast<float*>(smem) + bchunk_head(C);
  float* const stage = region;
  float* const dG = region;
  float* const Y = dG + C * ld;
  float* const dLU = Y + C * ld;
  const float* img = coef_image(a, ch.bh, ch.chunk);
  const float *G = image_matrix(img, C, kG), *QK = image_matrix(img, C, kQK), *PK = image_matrix(img, C, kPK);
  const Op<L>* S0 = state_pair<Op<L>>(a, a.states, ch.bh, ch.chunk);
  const Op<L>* dS = state_pair<Op<L>>(a, a.dstates, ch.bh, ch.chunk);
  const auto slot = [&](RowkSlot p) { return rowk_slot(a, ch.bh, ch.chunk, p); };
  const float *EK = slot(kEK), *WK = slot(kWK), *KQP = slot(kKQP);
  for (int i = t; i < kChunkVectors * C; i += tile::kThreads) cp_async4(cs.la + i, img + i);
  copy_lua_async(LUA, image_matrix(img, C, kLU), image_matrix(img, C, kLA), n, ld);
  tile::cp_async_commit();
  // ⟨S_0, dS⟩, ⟨M_0, dS⟩, ⟨M_0, dM⟩: block_reduce's fixed tree, its warp 0 step after the key columns.
  const bool ring = reinterpret_cast<uintptr_t>(S0) % 16 == 0 && reinterpret_cast<uintptr_t>(dS) % 16 == 0 &&
                    KV % (16 / sizeof(Op<L>)) == 0;
  double3 sd = state_dots(S0, dS, KV, ring, region);
  tile::cp_async_wait<0>();
  sd.x = butterfly_sum(sd.x), sd.y = butterfly_sum(sd.y), sd.z = butterfly_sum(sd.z);
  if (lane == 0) dot_part[0][warp] = sd.x, dot_part[1][warp] = sd.y, dot_part[2][warp] = sd.z;
  __syncthreads();  // publishes the copies and the warp sums; the ring's slots are free for the key columns

  // Per key-column step: dq_i = ᾱ_i S_0 dO_i - b_i M_0 dO_i + Σ_{j<=i} dE_ij Γ_ij k̂_j;
  // dp_i = -ᾱ_{i-1} S_0 dR_i + b_{i-1} M_0 dR_i + Σ_{j<i} dW_ij Γ_{i-1,j} k̂_j;
  // dk̂_i = Σ_{r>=i} dE_ri Γ_ri q_r + Σ_{r>i} dW_ri Γ_{r-1,i} p_r + Γ_{n,i} dS Ṽ_i - L_U[n,i] dM Ṽ_i
  // (the sums over j and r from brow: EK, WK, KQP); dk = η dk̂ + α dp (p = α k, k̂ = η k). Thread t forms these
  // for row t / 4, columns 4 (t % 4) .. + 3 of the step: it loads all 11 operands of its columns before their
  // first use (16-byte loads where every row is 16-byte aligned and the step's width is a multiple of 4, else
  // scalar), writes dq, dk and stages q, k, the rowk slots, dk̂, dp; then thread t < 4 n continues dot t / n of
  // row t % n (RowDot pairs, then dη = k·dk̂ and k·dp for d log α).
  static_assert(kColStep == 16 && 4 * kMdnMaxChunk <= tile::kThreads, "bchunk: one 4-column piece a thread");
  const float* const rowk[kStDKH - kStSdO] = {slot(kSdO), slot(kMdO), slot(kSdR), slot(kMdR), slot(kHV), slot(kGV)};
  const bool vec_rows = tile::async_ok_f(a.q, K) && tile::async_ok_f(a.k, K) && tile::async_ok_f(a.rowk, K) &&
                        tile::async_ok_f(a.dq, K) && tile::async_ok_f(a.dk, K);
  const int er = t >> 2, ec = 4 * (t & 3);
  const auto plane = [&](int p, int r) { return stage + (p * C + r) * kColStride; };
  const int dot = t / n, row = t % n;
  const float gl = er < n ? G[last * n + er] : 0.0f;
  float2 acc = make_float2(0.0f, 0.0f);
  const float* dew = dew_pair(a, ch.bh, ch.chunk);
  static_assert(kPK == kQK + 1, "bchunk prefetches Q K^T and P K^T as two rows of one L2 prefetch");
  for (int64_t k0 = 0; k0 < K; k0 += kColStep) {
    if (k0 > 0) __syncthreads();  // the step before's row dots are done with the planes
    if (k0 + kColStep >= K) {     // dΓ's operands (rows < n of dew's pair, Q K̂^T, P K̂^T) into the L2 meanwhile
      tile::prefetch_l2(dew, sizeof(float) * kN * kN, 2, sizeof(float) * kN * n);
      tile::prefetch_l2(QK, sizeof(float) * C * C, 2, sizeof(float) * n * n);
    }
    const int kc = static_cast<int>(K - k0 < kColStep ? K - k0 : kColStep);
    const int m = kc - ec < 4 ? kc - ec : 4;
    if (er < n && m > 0) {
      const bool vec = vec_rows && kc % 4 == 0;
      const int64_t idx = er * K + k0 + ec;
      float x[kStaged][4], wk[4], kqp[4], ek[4], dq[4], dk[4];
      load4(x[kStQ], hv.q(c0 + er) + k0 + ec, vec, m);
      load4(x[kStK], hv.k(c0 + er) + k0 + ec, vec, m);
#pragma unroll
      for (int p = kStSdO; p < kStDKH; ++p) load4(x[p], rowk[p - kStSdO] + idx, vec, m);
      load4(wk, WK + idx, vec, m);
      load4(kqp, KQP + idx, vec, m);
      load4(ek, EK + idx, vec, m);
      const float am = er > 0 ? cs.abar[er - 1] : 1.0f, bm = er > 0 ? cs.bb[er - 1] : 0.0f;
      const float ul = cs.LU[last * ld + er];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float dp = -am * x[kStSdR][j] + bm * x[kStMdR][j] + wk[j];
        const float dkh = gl * x[kStGV][j] - ul * x[kStHV][j] + kqp[j];
        dq[j] = cs.abar[er] * x[kStSdO][j] - cs.bb[er] * x[kStMdO][j] + ek[j];
        dk[j] = cs.eta[er] * dkh + cs.alpha[er] * dp;
        x[kStDKH][j] = dkh;
        x[kStDP][j] = dp;
      }
      const int64_t out = hv.tok(c0 + er) * K + k0 + ec;
      store4(a.dq + out, dq, vec, m);
      store4(a.dk + out, dk, vec, m);
#pragma unroll
      for (int p = 0; p < kStaged; ++p)
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (j < m) plane(p, er)[ec + j] = x[p][j];
    }
    __syncthreads();
    if (dot < 4)
      dotf2_step(plane(dot == 0 ? kStQ : kStK, row), plane(2 + 2 * dot, row), plane(3 + 2 * dot, row), kc, acc);
  }

  // dΓ_ij = dE_ij (q_i·k̂_j) + dW_{i+1,j} (p_{i+1}·k̂_j) (j <= i) + [i = n-1] k̂_j·(dS Ṽ_j), with dE_ij = dO_i·Ṽ_j
  // and dW_ij = -dR_i·Ṽ_j (j < i) from brow's products, over the lower triangle with rows i and n-1-i folded into
  // one line of n + 1 positions (position q of line l: row l, column q for q <= l, else row n-1-l, column
  // q-l-1; an odd n's middle row is the last line, cut at the triangle's end): thread t forms positions t,
  // t + kThreads, ..., whose operands it loads here, before the barrier that ends the key columns.
  const int ntri = n * (n + 1) / 2;
  const auto fold = [&](int p, int& i, int& j) {
    const int l = p / (n + 1), q = p - l * (n + 1);
    if (q <= l) {
      i = l, j = q;
    } else {
      i = n - 1 - l, j = q - l - 1;
    }
  };
  float de[kDgPerThread], qk[kDgPerThread], dw[kDgPerThread], pk[kDgPerThread];
#pragma unroll
  for (int k = 0; k < kDgPerThread; ++k) {
    const int p = t + k * tile::kThreads;
    de[k] = qk[k] = dw[k] = pk[k] = 0.0f;
    if (p < ntri) {
      int i, j;
      fold(p, i, j);
      de[k] = dew[i * kN + j], qk[k] = QK[i * n + j];
      if (i + 1 < n) dw[k] = dew[kN * kN + (i + 1) * kN + j], pk[k] = PK[(i + 1) * n + j];
    }
  }
  if (dot < 3) {
    dots[2 * dot * C + row] = acc.x;
    dots[(2 * dot + 1) * C + row] = acc.y;
  } else if (dot == 3) {
    a.deta[hv.tok(c0 + row)] = acc.x;
    kdp[row] = acc.y;
  }
  if (warp == 0) {
#pragma unroll
    for (int d = 0; d < 3; ++d) {
      const double v = butterfly_sum(lane < kWarps ? dot_part[d][lane] : 0.0);
      if (lane == 0) dot_sum[d] = static_cast<float>(v);
    }
  }
  __syncthreads();
  const float *qSdO = dots + kQSdO * C, *qMdO = dots + kQMdO * C, *kSdR = dots + kKSdR * C,
              *kMdR = dots + kKMdR * C, *kHV = dots + kKHV * C, *kGV = dots + kKGV * C;
#pragma unroll
  for (int k = 0; k < kDgPerThread; ++k) {
    const int p = t + k * tile::kThreads;
    if (p < ntri) {
      int i, j;
      fold(p, i, j);
      float d = __fmul_rn(de[k], qk[k]);
      if (i + 1 < n) d = fmaf(-dw[k], pk[k], d);
      if (i == last) d = fmaf(cs.eta[j], kGV[j], d);
      dG[i * ld + j] = d;
    }
  }
  // Per row i: dᾱ_i, db_i, dμ̄_i (state terms at the last row), dL_U[n, i] from M_next.
  for (int i = t; i < n; i += tile::kThreads) {
    float da = qSdO[i], dbi = -qMdO[i], dmb = 0.0f;
    if (i + 1 < n) {
      da -= cs.alpha[i + 1] * kSdR[i + 1];
      dbi += cs.alpha[i + 1] * kMdR[i + 1];
    }
    if (i == last) {
      da += dot_sum[0];
      dbi -= dot_sum[1];
      dmb = dot_sum[2];
    }
    dabar[i] = da;
    db[i] = dbi;
    dmbar[i] = dmb;
    dlul[i] = -cs.eta[i] * kHV[i];
  }
  __syncthreads();
  // Y_ir = db_i μ̄_r + Σ_{j<=r} dΓ_ij L_U[r,j] (r <= i), so that dL_A[i,r] = β_r Y_ir;
  // dL_U[r,j] = β_r Σ_{i>=r} L_A[i,r] dΓ_ij + [r = n-1] dlul_j (j <= r). Each sum in that order by one lane of a
  // warp task: 32 consecutive elements of Y's lower triangle in column order (column r: rows r .. n-1, r + 1
  // terms each; tasks 0 .. T-1) or of dL_U's in row order (row r: columns 0 .. r, n - r terms each; tasks T ..
  // 2T-1), so that a task's lanes sum (nearly) as many terms; warp w takes tasks w, w + kWarps, ... (Y's costly
  // tasks are its last, dL_U's its first: each warp gets about as many terms).
  const int tasks = (ntri + 31) / 32;
  for (int k = warp; k < 2 * tasks; k += kWarps) {
    const int p = 32 * (k < tasks ? k : k - tasks) + lane;
    const bool on = p < ntri;
    if (k < tasks) {  // Y: position p in column order is position q = ntri-1-p in row order from the last row up
      const int q = on ? ntri - 1 - p : 0, rho = tri_row(q);
      const int r = n - 1 - rho, i = n - 1 - (q - rho * (rho + 1) / 2);
      const int top = __reduce_max_sync(0xffffffffu, on ? r : 0);
      const float *g = dG + i * ld, *u = LUA + r * ld;
      float y = __fmul_rn(db[i], cs.mbar[r]);
      for (int j = 0; j <= top; ++j) {
        const float gj = g[j], uj = u[j];
        if (j <= r) y = fmaf(gj, uj, y);
      }
      if (on) Y[i * ld + r] = y;
    } else {  // dL_U: position p in row order
      const int r = tri_row(on ? p : 0), j = (on ? p : 0) - r * (r + 1) / 2;
      const int len = n - r, most = __reduce_max_sync(0xffffffffu, on ? len : 0);
      const float *la = LUA + r * ld + r + 1, *g = dG + r * ld + j;  // L_A[r+s, r] = la[s], dΓ_{r+s, j} = g[s ld]
      float sum = 0.0f;
      for (int s = 0; s < most; ++s)
        if (s < len) sum = fmaf(la[s], g[s * ld], sum);
      if (on) dLU[r * ld + j] = __fadd_rn(__fmul_rn(cs.beta[r], sum), r == last ? dlul[j] : 0.0f);
    }
  }
  __syncthreads();
  // Thread r < n: dβ_r = Σ_{i>=r} L_A[i,r] Y_ir, dμ̄_r += β_r Σ_{i>=r} L_A[i,r] db_i. Thread n + i: the segment
  // prefixes of row i (u <= i), F_A[i,u] = Σ_{r<u} dL_A[i,r] L_A[i,r] (dL_A[i,r] L_A[i,r] = (β_r Y_ir) L_A[i,r])
  // into dG's place and, in place, F_U[i,u] = Σ_{j<u} dL_U[i,j] L_U[i,j]. Both only read Y: no barrier between.
  if (t < n) {
    const int r = t;
    const float* la = LUA + r * ld + 1;  // L_A[i,r] = la[i]
    float dbeta = 0.0f, dmb = 0.0f;
    for (int i = r; i < n; ++i) {
      dbeta = fmaf(la[i], Y[i * ld + r], dbeta);
      dmb = fmaf(la[i], db[i], dmb);
    }
    a.dbeta[hv.tok(c0 + r)] = dbeta;
    dmbar[r] = fmaf(cs.beta[r], dmb, dmbar[r]);
  } else if (t < 2 * n) {
    const int i = t - n;
    float run_a = 0.0f, run_u = 0.0f;
    for (int u = 0; u <= i; ++u) {
      const int e = i * ld + u;
      const float za = __fmul_rn(__fmul_rn(cs.beta[u], Y[e]), LUA[u * ld + i + 1]), zu = dLU[e];
      dG[e] = run_a;
      dLU[e] = run_u;
      run_a = __fadd_rn(run_a, za);
      run_u = fmaf(zu, LUA[e], run_u);
    }
  }
  __syncthreads();
  // d log α_u = Σ_{i>=u} (F_A[i,u] + ᾱ_i dᾱ_i) + α_u k_u·dp_u;  d log μ_u = Σ_{i>=u} (F_U[i,u] + μ̄_i dμ̄_i).
  for (int u = t; u < n; u += tile::kThreads) {
    double ga = 0.0, gu = 0.0;
    for (int i = u; i < n; ++i) {
      ga = __dadd_rn(ga, __fma_rn(static_cast<double>(cs.abar[i]), static_cast<double>(dabar[i]),
                                  static_cast<double>(dG[i * ld + u])));
      gu = __dadd_rn(gu, __fma_rn(static_cast<double>(cs.mbar[i]), static_cast<double>(dmbar[i]),
                                  static_cast<double>(dLU[i * ld + u])));
    }
    a.dla[hv.tok(c0 + u)] =
        static_cast<float>(__fma_rn(static_cast<double>(cs.alpha[u]), static_cast<double>(kdp[u]), ga));
    a.dlm[hv.tok(c0 + u)] = static_cast<float>(gu);
  }
}

void check_chunk(int64_t chunk_size) {
  check(chunk_size >= 1 && chunk_size <= kMdnMaxChunk, "mdn chunk (cuda): chunk_size must be in [1, {}], got {}",
        kMdnMaxChunk, chunk_size);
}

// Offsets (in floats) of the scratch tensors of MdnArgs; the forward uses coef, states and vt (none when the caller
// holds Ṽ: saved_residuals), the backward all.
struct ScratchLayout {
  int64_t coef, states, vt, dstates, rowk, dew, fwd_end, bwd_end;
  ScratchLayout(int64_t B, int64_t T, int64_t H, int64_t K, int64_t V, int64_t C, bool saved_residuals) {
    const int64_t bh = B * H, nc = ceil_div(T, C);
    coef = 0;
    states = coef + bh * nc * coef_floats(C);
    vt = states + bh * nc * 2 * K * V;
    fwd_end = vt + (saved_residuals ? 0 : B * T * H * V);
    dstates = fwd_end;
    rowk = dstates + bh * nc * 2 * K * V;
    dew = rowk + bh * nc * kRowkSlots * C * K;
    bwd_end = dew + bh * nc * 2 * kN * kN;
  }
};

// The arguments with the scratch carved. Ṽ is the scratch's (vt = vt_out) unless saved_residuals: then the caller
// points vt (and, in the forward, vt_out) at its residuals tensor.
MdnArgs mdn_args(const float* q, const float* k, const float* v, const float* log_alpha, const float* beta,
                 const float* log_mu, const float* eta, int64_t batch, int64_t seq_len, int64_t heads,
                 int64_t key_dim, int64_t value_dim, int64_t chunk_size, void* scratch, bool backward,
                 bool saved_residuals) {
  MdnArgs args{};
  args.q = q, args.k = k, args.v = v, args.la = log_alpha, args.beta = beta, args.lm = log_mu, args.eta = eta;
  args.B = batch, args.T = seq_len, args.H = heads, args.K = key_dim, args.V = value_dim;
  args.C = chunk_size, args.NC = ceil_div(seq_len, chunk_size), args.bh0 = 0, args.nbh = batch * heads;
  const ScratchLayout l(batch, seq_len, heads, key_dim, value_dim, chunk_size, saved_residuals);
  float* s = static_cast<float*>(scratch);
  args.coef = s + l.coef, args.states = s + l.states;
  if (!saved_residuals) args.vt = args.vt_out = s + l.vt;
  if (backward) args.dstates = s + l.dstates, args.rowk = s + l.rowk, args.dew = s + l.dew;
  return args;
}

size_t floats_bytes(int64_t n) { return sizeof(float) * static_cast<size_t>(n); }

/// Grid (chunks, pairs) of the per-chunk kernels over the pairs of a.
dim3 per_chunk(const MdnArgs& a) { return dim3(static_cast<unsigned>(a.NC), static_cast<unsigned>(a.nbh)); }

/// The coef kernel (layout L): the coefficient images of the chunks of a's pairs into a.coef.
template <typename L>
void run_coef(const MdnArgs& a, cudaStream_t stream) {
  tile::launch("mdn chunk", a.K, mdn_coef_kernel<L>, per_chunk(a), coef_smem<L>(a.C), stream, a);
}

/// A scan kernel with its dynamic shared memory and launch arguments, chosen once for a launcher's shape.
template <typename Kernel>
struct ScanLaunch {
  Kernel kernel;
  size_t smem;
  bool stage;  // (the solving scan's)
  /// Pairs of (batch, head) whose value tiles fill one wave of the GPU (at least 1; the occupancy of `kernel`;
  /// by_waves.cuh).
  int64_t wave_pairs(int64_t V) const { return cuda::wave_pairs(kernel, tile::kThreads, smem, ceil_div(V, kN)); }
};

/// The solving scan (layout L) for a's shape: the chunk states into a.states and Ṽ into a.vt_out (the forward's,
/// and the backward's without saved Ṽ). Mma: k staged where key_dim <= kScanStagedKeyTiles tiles and k is 16-byte
/// aligned; 𝒯 and the v rows staged where the staging tiles fit (mdn_scan_kernel checks their alignment itself).
template <typename L>
ScanLaunch<void (*)(MdnArgs, bool)> scan_launch(const MdnArgs& a) {
  constexpr bool kMma = std::is_same_v<L, tile::Mma>;
  const int64_t KT = key_tiles(a.K);
  const bool stage_k = kMma && KT <= kScanStagedKeyTiles && tile::async_ok_f(a.k, a.K);
  const size_t staged = solve_scan_bytes<L>(a.K, a.C, stage_k, true);
  const bool stage = kMma && staged <= kMaxBlockSmem;
  const auto kernel = stage && stage_k ? mdn_scan_kernel<L, kMma> : mdn_scan_kernel<L, false>;
  return {kernel, stage ? staged : solve_scan_bytes<L>(a.K, a.C, false, false), stage};
}

/// The bscan (layout L) for a's shape: its shared memory (key_dim up to 256; tile::launch refuses more).
template <typename L>
ScanLaunch<void (*)(MdnArgs)> bscan_launch(const MdnArgs& a) {
  return {mdn_bscan_kernel<L>, scan_bytes<L>(a.K, a.C, bscan_work<L>(), 0), false};
}

/// Launches scan s over the value tiles of a's pairs.
template <typename Kernel>
void run_scan(const ScanLaunch<Kernel>& s, const MdnArgs& a, cudaStream_t stream) {
  if constexpr (std::is_same_v<Kernel, void (*)(MdnArgs, bool)>)
    tile::launch("mdn chunk", a.K, s.kernel, scan_grid(a.V, a.nbh), s.smem, stream, a, s.stage);
  else
    tile::launch("mdn chunk", a.K, s.kernel, scan_grid(a.V, a.nbh), s.smem, stream, a);
}

/// The states-only scan (layout L): the chunk states of a's pairs into a.states from the saved Ṽ (a.vt). The
/// backward's with saved Ṽ.
template <typename L>
void run_state_scan(const MdnArgs& a, cudaStream_t stream) {
  if (a.V == 0 || a.K == 0) return;  // (no state elements)
  const dim3 grid = state_scan_grid(a.K, a.V, a.nbh);
  // Mma: the Ṽ and k rows staged where both tensors are 16-byte aligned with dims multiples of 4.
  if constexpr (std::is_same_v<L, tile::Mma>) {
    if (tile::async_ok_f(a.vt, a.V) && tile::async_ok_f(a.k, a.K)) {
      tile::launch("mdn chunk", a.K, mdn_state_scan_kernel<L, true>, grid, state_scan_bytes<L>(true), stream, a);
      return;
    }
  }
  tile::launch("mdn chunk", a.K, mdn_state_scan_kernel<L, false>, grid, state_scan_bytes<L>(false), stream, a);
}

/// Whether brow_async can run on a's tensors: value tiles present, V a multiple of 8 and K of 4 (16-byte pieces),
/// dO, dR, Ṽ, k, q and the chunk-state scratch 16-byte aligned (every staged fp32 row and every bf16 state tile
/// then is: tile::async_ok_f, tile::async_ok_h), rowk 8-byte aligned (store_acc_pairs; dew, a multiple of 4 floats
/// after rowk, then is too) and a tile's row offsets within 32 bits (64 H K, 64 H V < 2^31).
bool brow_async_ok(const MdnArgs& a) {
  constexpr int64_t kMaxRowOffset = int64_t{1} << 31;
  return a.V > 0 && a.V % 8 == 0 && tile::async_ok_f(a.d_o, a.V) && tile::async_ok_f(a.dv, a.V) &&
         tile::async_ok_f(a.vt, a.V) && tile::async_ok_f(a.k, a.K) && tile::async_ok_f(a.q, a.K) &&
         tile::async_ok_f(a.states, a.V) && tile::async_ok_f(a.dstates, a.V) &&
         reinterpret_cast<uintptr_t>(a.rowk) % 8 == 0 && kN * a.H * a.K < kMaxRowOffset &&
         kN * a.H * a.V < kMaxRowOffset;
}

/// Launches brow (layout L) over a's pairs: on tile::Mma the pipelined brow_async where brow_async_ok holds, else
/// brow_direct.
template <typename L>
void run_brow(const MdnArgs& a, cudaStream_t stream) {
  if constexpr (std::is_same_v<L, tile::Mma>) {
    if (brow_async_ok(a)) {
      tile::launch("mdn chunk", a.K, mdn_brow_kernel<L, true>, per_chunk(a), brow_async_bytes(a.C), stream, a);
      return;
    }
  }
  tile::launch("mdn chunk", a.K, mdn_brow_kernel<L, false>, per_chunk(a),
               padded_bytes(kChunkVectors * a.C) + 5 * op_bytes<L>(), stream, a);
}

/// The products' layout of compute type P (Precision): float -> tile::Simt, __nv_bfloat16 -> tile::Mma.
template <typename P>
using Layout = std::conditional_t<std::is_same_v<P, float>, tile::Simt, tile::Mma>;

}  // namespace

size_t mdn_chunk_fwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim,
                                   int64_t value_dim, int64_t chunk_size, bool saved_residuals) {
  return floats_bytes(ScratchLayout(batch, seq_len, heads, key_dim, value_dim, chunk_size, saved_residuals).fwd_end);
}

size_t mdn_chunk_bwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim,
                                   int64_t value_dim, int64_t chunk_size, bool saved_residuals) {
  return floats_bytes(ScratchLayout(batch, seq_len, heads, key_dim, value_dim, chunk_size, saved_residuals).bwd_end);
}

template <typename P>
void mdn_chunk_fwd(const float* q, const float* k, const float* v, const float* log_alpha, const float* beta,
                   const float* log_mu, const float* eta, int64_t batch, int64_t seq_len, int64_t heads,
                   int64_t key_dim, int64_t value_dim, int64_t chunk_size, float* o, float* residuals,
                   void* scratch, cudaStream_t stream) {
  using L = Layout<P>;
  check_chunk(chunk_size);
  if (batch * heads == 0 || seq_len == 0 || value_dim == 0) return;
  MdnArgs args = mdn_args(q, k, v, log_alpha, beta, log_mu, eta, batch, seq_len, heads, key_dim, value_dim,
                          chunk_size, scratch, false, residuals != nullptr);
  args.o = o;
  if (residuals != nullptr) args.vt = args.vt_out = residuals;
  run_coef<L>(args, stream);
  const auto scan = scan_launch<L>(args);
  // Mma: kFast (the chunk states by cp.async) where the state scratch allows 16-byte copies (its start 16-byte
  // aligned and V a multiple of 8: every pair, row and 64-column tile then is, tile::async_ok_h).
  constexpr bool kMma = std::is_same_v<L, tile::Mma>;
  const OutPlan plan = out_plan<L>(key_dim, value_dim, chunk_size);
  const bool fast = kMma && key_dim > 0 && value_dim % 8 == 0 && reinterpret_cast<uintptr_t>(args.states) % 16 == 0;
  by_waves(args, scan.wave_pairs(value_dim), stream, [&](const MdnArgs& g, cudaStream_t s) {
    run_scan(scan, g, s);
    tile::launch("mdn chunk", key_dim, fast ? mdn_out_kernel<L, kMma> : mdn_out_kernel<L, false>, per_chunk(g),
                 plan.bytes, s, g, plan.depth);
  });
}

template <typename P>
void mdn_chunk_bwd(const float* q, const float* k, const float* v, const float* log_alpha, const float* beta,
                   const float* log_mu, const float* eta, const float* d_o, const float* residuals, int64_t batch,
                   int64_t seq_len, int64_t heads, int64_t key_dim, int64_t value_dim, int64_t chunk_size,
                   float* dq, float* dk, float* dv, float* dlog_alpha, float* dbeta, float* dlog_mu, float* deta,
                   void* scratch, cudaStream_t stream) {
  using L = Layout<P>;
  check_chunk(chunk_size);
  if (batch * heads == 0 || seq_len == 0) return;
  MdnArgs args = mdn_args(q, k, v, log_alpha, beta, log_mu, eta, batch, seq_len, heads, key_dim, value_dim,
                          chunk_size, scratch, true, residuals != nullptr);
  args.d_o = d_o;
  if (residuals != nullptr) args.vt = residuals;  // vt_out stays null: the scan reads the saved Ṽ
  args.dq = dq, args.dk = dk, args.dv = dv, args.dla = dlog_alpha, args.dbeta = dbeta, args.dlm = dlog_mu,
  args.deta = deta;
  run_coef<L>(args, stream);
  if (value_dim == 0) {  // no states, no bscan: the per-chunk kernels alone
    run_brow<L>(args, stream);
    tile::launch("mdn chunk", key_dim, mdn_bchunk_kernel<L>, per_chunk(args), floats_bytes(bchunk_floats(chunk_size)),
                 stream, args);
    return;
  }
  // Per group: the bscan, then the chunk states (the bscan reads none; brow reads both): from the saved Ṽ by the
  // states-only scan, or by the solving scan; brow, bchunk.
  const auto scan = scan_launch<L>(args);
  const auto bscan = bscan_launch<L>(args);
  by_waves(args, bscan.wave_pairs(value_dim), stream, [&](const MdnArgs& g, cudaStream_t s) {
    run_scan(bscan, g, s);
    if (residuals != nullptr) run_state_scan<L>(g, s);
    else run_scan(scan, g, s);
    run_brow<L>(g, s);
    tile::launch("mdn chunk", key_dim, mdn_bchunk_kernel<L>, per_chunk(g), floats_bytes(bchunk_floats(chunk_size)), s,
                 g);
  });
}

#define LLMT_INSTANTIATE_MDN(P)                                                                                    \
  template void mdn_chunk_fwd<P>(const float*, const float*, const float*, const float*, const float*,             \
                                 const float*, const float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, \
                                 float*, float*, void*, cudaStream_t);                                             \
  template void mdn_chunk_bwd<P>(const float*, const float*, const float*, const float*, const float*,             \
                                 const float*, const float*, const float*, const float*, int64_t, int64_t,         \
                                 int64_t, int64_t, int64_t, int64_t, float*, float*, float*, float*, float*,       \
                                 float*, float*, void*, cudaStream_t);
LLMT_INSTANTIATE_MDN(float)
LLMT_INSTANTIATE_MDN(__nv_bfloat16)

}  // namespace llmt::cuda
