// KDA (Kimi Delta Attention) sequence-mixing core (layers-delta.md §4.3, §6.1, §6.3–6.5, §7), CPU reference.
// The core starts after projections, short convolutions, the gate and the L2 norm: it takes the vectors
// that enter the recurrence and returns o. KDA is Gated DeltaNet with the scalar decay replaced by a
// per-key-channel decay: per (batch, head), with state S [K, V] (K-major: rows are key channels) and
// alpha_t = exp(g_t) in (0, 1]^K,
//   S̄_t = Diag(alpha_t) S_{t-1};  delta_t = beta_t (v_t - S̄_t^T k_t);  S_t = S̄_t + k_t delta_t^T;  o_t = S_t^T q_t.
// Layouts (FLA's, §1): q, k, g [B, T, H, K]; v, o [B, T, H, V]; beta [B, T, H]; states [B, H, K, V].
// All arithmetic is in double for either T; inputs and outputs are T.
#pragma once
#include <cstdint>

#include "kernels/cpu/gdn.h"  // DeltaDims, GdnInputs, GdnGrads

namespace llmt::cpu {

/// Inputs of the KDA core (layers-delta.md §4.3 step 4): the fields of GdnInputs with the same meaning,
/// except g: [B, T, H, K], the per-token, per-key-channel log-decay g_{t,c} <= 0 (output of the KDA gate,
/// §4.3 step 2; not a cumsum). The core does not rely on the norms or ranges (g > 0 is computed as written,
/// but may overflow in the chunked form).
template <typename T>
using KdaInputs = GdnInputs<T>;

/// Gradients of the KDA core: the fields of GdnGrads, same shapes as the matching KdaInputs fields, all
/// OVERWRITTEN; dg: [B, T, H, K], the gradient w.r.t. the per-channel log-decay g_{t,c} (what §5 consumes).
template <typename T>
using KdaGrads = GdnGrads<T>;

/// Token-by-token recurrence of §4.3 (the oracle; FLA `naive_recurrent_kda` / `fused_recurrent_kda`).
/// Writes o [B, T, H, V] and, when final_state is non-null, S_T into final_state [B, H, K, V].
template <typename T>
void kda_recurrent_fwd(const KdaInputs<T>& in, const DeltaDims& dims, T* o, T* final_state);

/// Exact reverse-time backward of kda_recurrent_fwd (§6.4, KDA case: D_t = Diag(alpha_t) and
/// dg_t[c] = Σ_v S̄_t[c, v] dS̄[c, v]). d_o: [B, T, H, V], dL/do; d_final_state: [B, H, K, V], dL/dS_T, or
/// nullptr for 0. The states S_{t-1} are recomputed from checkpoints taken every 64 tokens
/// (memory ~ (T/64 + 65) K V doubles per head).
template <typename T>
void kda_recurrent_bwd(const KdaInputs<T>& in, const T* d_o, const T* d_final_state, const DeltaDims& dims,
                       const KdaGrads<T>& grads);

/// Chunkwise-parallel forward (§6.1 F1–F7 in the KDA vector form, kernel order of §6.3): chunks of
/// chunk_size tokens (the last one may be shorter), chunk-local inclusive cumsum Γ [n, K] of g,
/// A_rj = β_r Σ_c k_rc k_jc E_rj,c with E_rj = exp(Γ_r - Γ_j) per channel, 𝒯 = (I + A)^{-1} by forward
/// substitution, U = 𝒯 diag(β) V, W = 𝒯 diag(β) (K ⊙ e^Γ), Δ = U - W S_0, P_rj = Σ_c q_rc k_jc E_rj,c
/// (j <= r), O = (Q ⊙ e^Γ) S_0 + P Δ, S_C = Diag(e^{Γ_C}) S_0 + (K ⊙ e^{Γ_C - Γ})^T Δ.
/// Numerics (§7.3): E_rj is computed directly as exp(Γ_r - Γ_j), element-wise, for j <= r only; never
/// factored into e^{Γ_r} e^{-Γ_j}. All exponents are <= 0 (for g <= 0), so in double this is exact and
/// cannot overflow; FLA's 16-token sub-chunking is a device for fp32 GEMMs and is not needed here.
/// Same outputs as kda_recurrent_fwd (equal up to rounding). chunk_size >= 1 (FLA: 64).
template <typename T>
void kda_chunk_fwd(const KdaInputs<T>& in, const DeltaDims& dims, T* o, T* final_state, int64_t chunk_size = 64);

/// Chunked backward (§6.5 B1–B9, per-channel form): chunk-start states are recomputed by a forward scan
/// (not saved by the forward), then chunks are processed in reverse with dS_C carried between them;
/// dΓ is accumulated per row and channel and turned into dg by a reverse cumsum inside the chunk (B9).
/// E_rj is computed directly as in kda_chunk_fwd. Same arguments and results as kda_recurrent_bwd
/// (equal up to rounding). chunk_size >= 1.
template <typename T>
void kda_chunk_bwd(const KdaInputs<T>& in, const T* d_o, const T* d_final_state, const DeltaDims& dims,
                   const KdaGrads<T>& grads, int64_t chunk_size = 64);

}  // namespace llmt::cpu
