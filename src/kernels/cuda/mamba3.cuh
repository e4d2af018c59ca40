// Pieces shared by the Mamba-3 layer files (mamba3.cu: the launchers and the scratch; mamba3_prep.cu: the
// per-token prep, gate and parameter sums; mamba3_core.cu: the chunked core). Layouts as src/kernels/cpu/
// mamba3_prep.h and mamba3.h: rows = B T tokens, E = rows H (token, head) pairs; q, k [B, T, H, R, N]; v, y
// [B, T, H, R, P]; per-(token, head) scalars [B, T, H]; φ [B, T, H, S].
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.cuh"

namespace llmt::cuda::m3 {

/// Rows of one core chunk (Lc tokens x R ranks): the chunk length is Lc = max(1, kRows / R), 64 for SISO and
/// 64 / R for MIMO (the reference chunk sizes of §4.4; the result does not depend on it beyond rounding).
constexpr int kRows = 64;

/// Sizes of one call: the layer's B, T, H, P, N, G, R, S; W = 3 H + S (raw's width); rows = B T; E = rows H;
/// Lc tokens per core chunk, nc chunks.
struct Sizes {
  int64_t B, T, H, P, N, G, R, S, W, rows, E, Lc, nc;
};

inline Sizes make_sizes(const cpu::Mamba3LayerDims& d) {
  const int64_t Lc = std::max<int64_t>(1, kRows / d.rank);
  return {d.batch, d.seq_len, d.heads, d.head_dim, d.state_dim, d.groups, d.rank, d.angles, 3 * d.heads + d.angles,
          d.batch * d.seq_len, d.batch * d.seq_len * d.heads, Lc, ceil_div(d.seq_len, Lc)};
}

/// The scratch of one call, carved by mamba3.cu. Forward (also recomputed by the backward): dt = Δ, lam = λ,
/// A, clamped (1 where the A_floor clamp is active), a = A Δ, gam = γ, eps = ε, sig = σ (γ_t + ε_{t+1}) [E];
/// dtd (Δ in double) [E]; theta (θ = π tanh(angles), double) [rows S]; phi [E S]; nb, ncn (normalised
/// pre-weight B, C) [rows R G N]; rb, rc (their reciprocal RMS) [rows R G];
/// q, k [E R N]; v, y [E R P] (SISO: v is the input x itself: v, or vh with bf16 activations); rs (output-norm
/// reciprocal RMS) [E R]; G (chunk-local cumsum of a, double) [B H nc Lc]; states (the state entering each chunk)
/// [B H nc P N]. G, states, y, nb, ncn, rb, rc, phi, q and k (the saved set) lie in the caller's `saved` memory when
/// mamba3_fwd / mamba3_bwd are given one (with bf16 products the states, y, q, k there in bf16, below), else in the
/// scratch.
/// Backward: dy, dv [E R P] (SISO: dv is the output dx itself: dv, or dvh with bf16 activations); dq, dk [E R N]
/// (MIMO: then un-rotated in place); da, dgam, dsig [E]; dstates (the adjoint of the state leaving each chunk)
/// [B H nc P N]; dDp (per-chunk dD, double) [B H nc]; dphi [E S] (then the reverse cumsum dψ); c1, c2 [E R P],
/// c3 [E P], cbn, ccn [rows R G N]: per-row parameter-gradient terms; dnb, dnc [rows R G N] (the gradients of the
/// normalised B, C); gmean [E R] (output-norm backward means); partial (double): the column sums' partials.
/// bf16 products (the chunked core on the tensor cores, not decoding): q, k, the states, y, dy and the adjoint
/// states are kept in bf16 (qh, kh, states_h, y_h, dy_h, dstates_h: places of bf16 size, mamba3.cu carve; the fp32
/// pointers then null). The core's kernels read q, k and the states only as bf16 operands, and the rotation backward
/// recomputes the fp32 q, k it needs (mamba3_prep.cu rotate_pair); the tensor-core kernels round y, dy and the
/// adjoint states to bf16 for their products anyway, and the gate, the v·dy, D dy and inter terms of the chunk
/// gradients, <dS, S_in> and the dS_in scan read the rounded values. Otherwise (and decoding) all of them fp32, the
/// bf16 pointers null.
/// bf16 activations (ops.cuh mamba3_fwd<A> with A = __nv_bfloat16; SISO): vh, dvh are the bf16 input x and output dx
/// as the core's v and dv (v, dv then null); the chunked core reads v only in its tensor-core kernels (bf16 products)
/// and decoding as fp32 values. Otherwise (fp32 activations, and MIMO, whose v, dv are fp32 scratch) both null.
struct Buffers {
  float *dt, *lam, *A, *clamped, *a, *gam, *eps, *sig, *phi, *nb, *ncn, *rb, *rc, *q, *k, *v, *y, *rs;
  double *dtd, *theta, *G;
  float* states;
  __nv_bfloat16 *qh, *kh, *states_h, *y_h, *dy_h, *dstates_h, *vh, *dvh;
  float *dy, *dv, *dq, *dk, *da, *dgam, *dsig, *dstates, *dphi, *c1, *c2, *c3, *cbn, *ccn, *dnb, *dnc, *gmean;
  double *dDp, *partial;
};

/// Column-sum partial buffer: at most kSplits row ranges of each column of one colsums call.
constexpr int64_t kSplits = 128;

/// One column sum: out[c] += Σ_{row < rows} in[row ld + c] for c < cols. in null: its row ranges' sums are given
/// (colsums: already in buf.partial, at its place).
struct ColSum {
  const float* in;
  int64_t rows, cols, ld;
  float* out;
  int64_t splits = 0;  // its row ranges (<= kSplits); 0: colsum_ranges(rows)
};
/// The most column sums of one colsums call.
constexpr int kMaxSums = 5;
/// The row ranges of a column sum over `rows` rows.
inline int64_t colsum_ranges(int64_t rows) { return std::clamp<int64_t>(rows / 256, 1, kSplits); }

// mamba3.cu
/// Each column sum of sums[0 .. n) (n <= kMaxSums) as a double sum in a fixed order: the rows cut into its splits
/// (or colsum_ranges(rows)) ranges [rows r / ranges, rows (r + 1) / ranges), each range's sum in row order, then the
/// ranges' sums in order; all of them in two launches. The ranges' sums lie in buf.partial, sum j's [ranges, cols]
/// after those of the sums before it (a sum with in null: written there by the caller beforehand, in as many ranges
/// as it says: rot_bcnorm_bwd_kernel's, a number that fills the GPU). With dDp (and dD): also dD[h] += Σ_{b, chunk}
/// dDp[b, h, chunk] in (b, chunk) order (s.B, s.H, s.nc), in the second launch. Errors: more than kSplits ranges.
void colsums(const ColSum* sums, int n, const Buffers& buf, cudaStream_t stream, const Sizes* s = nullptr,
             const double* dDp = nullptr, float* dD = nullptr);
/// colsums of the one column sum {in, rows, cols, ld, out}.
void colsum(const float* in, int64_t rows, int64_t cols, int64_t ld, const Buffers& buf, float* out,
            cudaStream_t stream);

// The functions below that take activations (x, z, out, dout, dx, dz [B, T, H P]) are templates on their element
// type A (float or __nv_bfloat16: ops.cuh mamba3_fwd<A>), instantiated for both; the arithmetic is fp32 either way
// and bf16 outputs are rounded to nearest even on their store.

// mamba3_prep.cu
/// §4.3.1: scalars, phases, BCNorm, biased rotated q and k, v = x ∘ mimo_x (MIMO, fp32 v; SISO's v is x). phase0:
/// [B, H, S], the phases carried into the first token (decoding, §4.6), or nullptr for 0. saved: buf's φ, n̂_B,
/// n̂_C, rb, rc and q, k (or qh, kh) hold the forward's (the backward reading the saved set), not recomputed: only
/// the per-token scalars, θ and v are. x: A (fp32 or bf16).
template <typename A>
void prep_fwd(const A* x, const float* bc, const float* raw, const Mamba3Ptrs& p, const Sizes& s,
              const Mamba3Options& opt, const Buffers& buf, cudaStream_t stream, const float* phase0 = nullptr,
              bool saved = false);
/// §4.5 steps 3–6 from buf.dq, dk, da, dgam, dsig: dbc, draw overwritten, the prep parameter gradients and
/// dD (from buf.dDp) accumulated.
void prep_bwd(const float* raw, const Mamba3Ptrs& p, const Sizes& s, const Mamba3Options& opt, const Buffers& buf,
              float* dbc, float* draw, const Mamba3GradPtrs& g, cudaStream_t stream);

// mamba3_gate.cu
/// §4.3.4: optional per-head RMSNorm_P of y (buf.y_h where set, else buf.y), the gate, the MIMO down-projection
/// into out. z, out: A (fp32 or bf16).
template <typename A>
void gate_fwd(const A* z, const Mamba3Ptrs& p, const Sizes& s, const Mamba3Options& opt, const Buffers& buf,
              A* out, cudaStream_t stream);
/// §4.5 step 1: dy (into buf.dy_h, bf16, where set, else buf.dy) and dz from dout and y (as gate_fwd); the gate's
/// parameter gradients accumulated into g. dout, z, dz: A (fp32 or bf16).
template <typename A>
void gate_bwd(const A* dout, const A* z, const Mamba3Ptrs& p, const Sizes& s, const Mamba3Options& opt,
              const Buffers& buf, A* dz, const Mamba3GradPtrs& g, cudaStream_t stream);
/// MIMO: dx = Σ_r dv ∘ mimo_x (dv fp32), dmimo_x accumulated (SISO: nothing to do, core_bwd wrote dv = dx). x, dx:
/// A (fp32 or bf16).
template <typename A>
void up_bwd(const A* x, const Mamba3Ptrs& p, const Sizes& s, const Buffers& buf, A* dx, const Mamba3GradPtrs& g,
            cudaStream_t stream);

// mamba3_core.cu
/// Chunked core forward (§4.4): G, the entering states, y. bf16: Mamba3Options::bf16_products (mamba3_core.cu
/// "Precision"; then the states and y in bf16: buf.states_h, buf.y_h). v: buf.vh (bf16; bf16 products only) where
/// set, else buf.v.
void core_fwd(const float* D, const Sizes& s, const Buffers& buf, bool bf16, cudaStream_t stream);
/// Chunked core backward (§4.5 step 2) after core_fwd, from dy (bf16: buf.dy_h): dq, dk (rotated, σ split
/// included), dv (buf.dvh, bf16, where set: bf16 products only; else buf.dv), da, dgam (diagonal + dσ), dsig (dσ,
/// for ε_{t+1}), dDp.
void core_bwd(const float* D, const Sizes& s, const Buffers& buf, bool bf16, cudaStream_t stream);
/// Throws llmt::Error unless the core's shared memory and grids fit the device (with bf16: its kernels too).
void core_check(const Sizes& s, bool bf16);

// mamba3_decode.cu
/// The recurrence of §4.6 over the prepped tokens (cpu::mamba3_layer_step's core), continuing `carry`:
/// per token H = α H + ε α W_prev + γ W, y_r = H q_r + D v_r into buf.y (v: buf.vh, bf16, where set, else buf.v;
/// as fp32 values); then k, v, φ are carried (fp32).
/// carry: state [B, H, P, N], k_prev [B, H, R, N], v_prev [B, H, R, P], phase [B, H, S] (null when S = 0).
void step_fwd(const float* D, const Sizes& s, const Buffers& buf, float* state, float* k_prev, float* v_prev,
              float* phase, cudaStream_t stream);

}  // namespace llmt::cuda::m3
