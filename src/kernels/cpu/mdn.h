// MDN (Momentum DeltaNet) sequence-mixing core (mdn.md §5, §6, §7), CPU reference.
// The core starts after projections, short convolutions, the output correction, the L2 norm and the
// gates (mdn.md §4.1–4.4): it takes the vectors that enter the recurrence and returns o. Per
// (batch, head), with the memory S and the momentum M, both [K, V] (K-major: rows are key channels),
// alpha_t = exp(log_alpha_t), mu_t = exp(log_mu_t), the read key p_t = alpha_t k_t and the write key
// k̂_t = eta_t k_t (mdn.md §4.4, use_p_times_alpha = true), mdn.md §5 Eqs. 3–5:
//   ṽ_t = v_t - S_{t-1}^T p_t;  M_t = mu_t M_{t-1} - k̂_t ṽ_t^T;  S_t = alpha_t S_{t-1} - beta_t M_t;  o_t = S_t^T q_t.
// With mu = 0 (log_mu = -inf) and eta = 1 this is exactly Gated DeltaNet (gdn.h) with g = log_alpha.
// Layouts (FLA's): q, k [B, T, H, K]; v, o [B, T, H, V]; log_alpha, beta, log_mu, eta [B, T, H];
// states [B, H, K, V]. All arithmetic is in double for either T; inputs and outputs are T.
#pragma once
#include <cstdint>

#include "kernels/cpu/gdn.h"  // DeltaDims

namespace llmt::cpu {

/// Inputs of the MDN core (mdn.md §4.5 / §5). q: [B, T, H, K], the query after the output correction,
/// L2 norm and the scale K^{-1/2} (mdn.md §4.2–4.3); k: [B, T, H, K], the L2-normalised key k_n (the core
/// forms p = alpha k_n and k̂ = eta k_n itself, so dk is the full gradient w.r.t. k_n); v: [B, T, H, V];
/// log_alpha: [B, T, H], the per-token log memory decay log α_t <= 0 (mdn.md §4.4, not a cumsum);
/// beta: [B, T, H], the step size β_t (post-sigmoid, times β_max); log_mu: [B, T, H], the per-token log
/// momentum decay log μ_t <= 0 (after the floor clamp of §4.4); -inf (μ = 0) is allowed in every function;
/// eta: [B, T, H], the write-key scale η_t in (0, 2); initial_state / initial_momentum: [B, H, K, V], S_0
/// and M_0, or nullptr for 0. The core does not rely on the norms or ranges (positive logs are computed
/// as written, but may overflow in the chunked form).
template <typename T>
struct MdnInputs {
  const T* q;
  const T* k;
  const T* v;
  const T* log_alpha;
  const T* beta;
  const T* log_mu;
  const T* eta;
  const T* initial_state;
  const T* initial_momentum;
};

/// Gradients of the MDN core, same shapes as the matching MdnInputs fields; all are OVERWRITTEN.
/// dk is dL/dk_n through both p = α k_n and k̂ = η k_n (mdn.md §7.2, last line); dlog_alpha includes the
/// read-key path (d log α_t = α_t (⟨S_{t-1}, G_t⟩ + ⟨k_n,t, dp_t⟩)); dlog_mu is μ_t dμ_t (0 where μ_t = 0).
/// d_initial_state / d_initial_momentum may be nullptr (not computed); when non-null they receive dL/dS_0
/// and dL/dM_0 (also when the matching input was nullptr).
template <typename T>
struct MdnGrads {
  T* dq;
  T* dk;
  T* dv;
  T* dlog_alpha;
  T* dbeta;
  T* dlog_mu;
  T* deta;
  T* d_initial_state;
  T* d_initial_momentum;
};

/// Token-by-token two-state recurrence of mdn.md §5 (Eqs. 3–5; the oracle, like the authors' naive.py and
/// fused_recurrent.py). Writes o [B, T, H, V] and, when non-null, S_T into final_state and M_T into
/// final_momentum ([B, H, K, V] each).
template <typename T>
void mdn_recurrent_fwd(const MdnInputs<T>& in, const DeltaDims& dims, T* o, T* final_state, T* final_momentum);

/// Exact reverse-time backward of mdn_recurrent_fwd (mdn.md §7.2). d_o: [B, T, H, V], dL/do;
/// d_final_state, d_final_momentum: [B, H, K, V], dL/dS_T and dL/dM_T, or nullptr for 0. The states
/// (S, M) are recomputed from checkpoints taken every 64 tokens (memory ~ 2 (T/64 + 65) K V doubles per head).
template <typename T>
void mdn_recurrent_bwd(const MdnInputs<T>& in, const T* d_o, const T* d_final_state, const T* d_final_momentum,
                       const DeltaDims& dims, const MdnGrads<T>& grads);

/// Chunkwise-parallel forward (mdn.md §6.2 with the stable coefficients of §6.4; §6.5 for a shorter last
/// chunk). Per chunk of n <= chunk_size tokens: L_A[i,r] = exp(Σ_{u=r+1..i} log α_u) and
/// L_U[r,j] = exp(Σ_{u=j+1..r} log μ_u) as segment sums (every exponent <= 0, no division, no difference
/// of cumsums, so μ -> 0 and μ << α are exact), Γ = L_A Diag(β) L_U, b = L_A (β ⊙ μ̄); the corrected values
/// Ṽ solve the unit-lower-triangular system (I + W) Ṽ = V - Diag(ᾱ⁻) P S_0 + Diag(b⁻) P M_0 with
/// W = (P K̂^T) ⊙ Γ⁻ (Γ shifted down one row) by forward substitution; then
/// O = Diag(ᾱ) Q S_0 - Diag(b) Q M_0 + ((Q K̂^T) ⊙ Γ) Ṽ, S_next = ᾱ_n S_0 - b_n M_0 + K̂^T Diag(Γ_{n,:}) Ṽ,
/// M_next = μ̄_n M_0 - K̂^T Diag(L_U[n,:]) Ṽ. No β eps (mdn.md gamma_beta_eps = 0). Same outputs as
/// mdn_recurrent_fwd (equal up to rounding). chunk_size >= 1 (the authors: 64), else llmt::Error.
/// vt_out: [B, T, H, V] or nullptr; when given it receives the corrected values Ṽ, which are the token
/// recurrence's ṽ_t = v_t - S_{t-1}^T p_t (mdn.md §5, §6.2; independent of chunk_size up to rounding): what a
/// saved-residuals backward (mdn.md §7.1, model.mdn.save_residuals) keeps. mdn_chunk_bwd does not read them.
template <typename T>
void mdn_chunk_fwd(const MdnInputs<T>& in, const DeltaDims& dims, T* o, T* final_state, T* final_momentum,
                   int64_t chunk_size = 64, T* vt_out = nullptr);

/// Chunked backward (mdn.md §7.3): chunk-start states (S, M) and the corrected values Ṽ are recomputed in
/// double by a forward scan (nothing is saved by the forward: the reference has no saved-residuals variant),
/// then chunks are processed in reverse with (dL/dS, dL/dM) carried between them. Inside a
/// chunk: dṼ from O and both carried states, dR = (I + W)^{-T} dṼ by back substitution, dQ, dK̂, dP,
/// dΓ / dᾱ / db / dL_U, then through Γ = L_A Diag(β) L_U and b = L_A (β ⊙ μ̄) to dβ, d log α, d log μ; the
/// log-domain gradients are taken from dL ⊙ L summed over the covered segments (no cancellation).
/// Same arguments and results as mdn_recurrent_bwd (equal up to rounding). chunk_size >= 1, else llmt::Error.
template <typename T>
void mdn_chunk_bwd(const MdnInputs<T>& in, const T* d_o, const T* d_final_state, const T* d_final_momentum,
                   const DeltaDims& dims, const MdnGrads<T>& grads, int64_t chunk_size = 64);

}  // namespace llmt::cpu
