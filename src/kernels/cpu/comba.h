// Comba sequence-mixing core (layers-delta.md §4.2, §6.2, §6.4–6.5), CPU reference.
// Per (batch, head), with state S [K, V] (K-major) and alpha_t = exp(g_t):
//   r_t = v_t - S_{t-1}^T p_t;  S_t = alpha_t S_{t-1} + beta_t k_t r_t^T;  o_t = S_t^T q_t.
// Unlike GDN the prediction reads the UNDECAYED previous state; the decay is applied afterwards.
// The layer-level parts of Comba are not in the core: the inner decay sigma(lambda) and the output
// correction act before the L2 norm (§4.2 steps 2–3: q' = q - D sigma(lambda) k, p = sigma(lambda) k),
// so the core receives q̂ = s l2norm(q'), k̂ = l2norm(k), p̂ = l2norm(p); §5 maps dq̂, dk̂, dp̂ back.
// Layouts as GDN (kernels/cpu/gdn.h): q, k, p [B, T, H, K]; v, o [B, T, H, V]; g, beta [B, T, H];
// states [B, H, K, V]. All arithmetic is in double for either T.
#pragma once
#include <cstdint>

#include "kernels/cpu/gdn.h"

namespace llmt::cpu {

/// Inputs of the Comba core (FLA `chunk_comba(q', k, v, p, g, beta)` after its in-kernel L2 norm).
/// q: [B, T, H, K], q̂ (output-corrected, normalised, scaled); k: [B, T, H, K], k̂; v: [B, T, H, V];
/// p: [B, T, H, K], the normalised auxiliary key p̂ used in the prediction v_t - S_{t-1}^T p̂_t;
/// g: [B, T, H], per-token log-decay <= 0; beta: [B, T, H], post-sigmoid; initial_state: [B, H, K, V] or
/// nullptr for S_0 = 0.
template <typename T>
struct CombaInputs {
  const T* q;
  const T* k;
  const T* v;
  const T* p;
  const T* g;
  const T* beta;
  const T* initial_state;
};

/// Gradients of the Comba core, same shapes as the matching CombaInputs fields; all are OVERWRITTEN.
/// dg is w.r.t. the per-token log-decay. d_initial_state may be nullptr (not computed).
template <typename T>
struct CombaGrads {
  T* dq;
  T* dk;
  T* dv;
  T* dp;
  T* dg;
  T* dbeta;
  T* d_initial_state;
};

/// Token-by-token recurrence of §4.2 (the oracle; FLA `fused_recurrent_comba`).
/// Writes o [B, T, H, V] and, when final_state is non-null, S_T into final_state [B, H, K, V].
template <typename T>
void comba_recurrent_fwd(const CombaInputs<T>& in, const DeltaDims& dims, T* o, T* final_state);

/// Exact reverse-time backward of comba_recurrent_fwd (§6.4, Comba block). d_o: [B, T, H, V];
/// d_final_state: [B, H, K, V] or nullptr for 0. States are recomputed from checkpoints every 64 tokens.
template <typename T>
void comba_recurrent_bwd(const CombaInputs<T>& in, const T* d_o, const T* d_final_state, const DeltaDims& dims,
                         const CombaGrads<T>& grads);

/// Chunkwise-parallel forward (§6.2: F1' A_rj = beta_r e^{γ^ex_r - γ_j} p̂_r·k̂_j, F3' W = 𝒯 diag(β e^{γ^ex}) P̂,
/// F4–F7 as GDN). chunk_size >= 1 (FLA: 64); the last chunk may be shorter. Same outputs as the recurrence.
template <typename T>
void comba_chunk_fwd(const CombaInputs<T>& in, const DeltaDims& dims, T* o, T* final_state,
                     int64_t chunk_size = 64);

/// Chunked backward (§6.5 with the Comba changes): chunk-start states recomputed by a forward scan, chunks
/// processed in reverse. Same arguments and results as comba_recurrent_bwd (equal up to rounding).
template <typename T>
void comba_chunk_bwd(const CombaInputs<T>& in, const T* d_o, const T* d_final_state, const DeltaDims& dims,
                     const CombaGrads<T>& grads, int64_t chunk_size = 64);

}  // namespace llmt::cpu
