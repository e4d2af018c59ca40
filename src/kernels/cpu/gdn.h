// Gated DeltaNet sequence-mixing core (layers-delta.md §4.1, §6.1, §6.3–6.5), CPU reference.
// The core starts after projections, short convolutions, gates and the L2 norm: it takes the
// vectors that enter the recurrence and returns o. Per (batch, head), with state S [K, V]
// (K-major: rows are key channels) and alpha_t = exp(g_t):
//   S̄_t = alpha_t S_{t-1};  delta_t = beta_t (v_t - S̄_t^T k_t);  S_t = S̄_t + k_t delta_t^T;  o_t = S_t^T q_t.
// Layouts (FLA's, §1): q, k [B, T, H, K]; v, o [B, T, H, V]; g, beta [B, T, H]; states [B, H, K, V].
// All arithmetic is in double for either T; inputs and outputs are T.
#pragma once
#include <cstdint>

namespace llmt::cpu {

/// Sizes of one delta-rule core call: B, T, H, K (= d_k) and V (= d_v).
struct DeltaDims {
  int64_t batch, seq_len, heads, key_dim, value_dim;
};

/// Inputs of the GDN core (layers-delta.md §4.1 step 4). q: [B, T, H, K], the query after L2 norm and the
/// scale s (q̂ of §2.2); k: [B, T, H, K], the L2-normalised key k̂; v: [B, T, H, V]; g: [B, T, H], the
/// per-token log-decay g_t <= 0 (not a cumsum); beta: [B, T, H], post-sigmoid, in (0, 1);
/// initial_state: [B, H, K, V] or nullptr for S_0 = 0. The core does not rely on the norms or ranges.
template <typename T>
struct GdnInputs {
  const T* q;
  const T* k;
  const T* v;
  const T* g;
  const T* beta;
  const T* initial_state;
};

/// Gradients of the GDN core, same shapes as the matching GdnInputs fields; all are OVERWRITTEN.
/// dg is the gradient w.r.t. the per-token log-decay g_t (what §5 consumes). d_initial_state may be
/// nullptr (not computed); when non-null it receives dL/dS_0 (also when the input S_0 was nullptr).
template <typename T>
struct GdnGrads {
  T* dq;
  T* dk;
  T* dv;
  T* dg;
  T* dbeta;
  T* d_initial_state;
};

/// Token-by-token recurrence of §4.1 (the oracle; FLA `fused_recurrent_gated_delta_rule`).
/// Writes o [B, T, H, V] and, when final_state is non-null, S_T into final_state [B, H, K, V].
template <typename T>
void gdn_recurrent_fwd(const GdnInputs<T>& in, const DeltaDims& dims, T* o, T* final_state);

/// Exact reverse-time backward of gdn_recurrent_fwd (§6.4). d_o: [B, T, H, V], dL/do;
/// d_final_state: [B, H, K, V], dL/dS_T, or nullptr for 0. The states S_{t-1} are recomputed from
/// checkpoints taken every 64 tokens (memory ~ (T/64 + 65) K V doubles per head).
template <typename T>
void gdn_recurrent_bwd(const GdnInputs<T>& in, const T* d_o, const T* d_final_state, const DeltaDims& dims,
                       const GdnGrads<T>& grads);

/// Chunkwise-parallel forward (§6.1 F1–F7, kernel order of §6.3): chunks of chunk_size tokens (the last one
/// may be shorter), chunk-local inclusive cumsum of g, A, T = (I + A)^{-1} by forward substitution, the WY
/// factors U, W, Delta = U - W S_0, O = (Q ⊙ e^Γ) S_0 + P Delta, and the state carried to the next chunk.
/// Same outputs as gdn_recurrent_fwd (equal up to rounding). chunk_size >= 1 (FLA: 64).
template <typename T>
void gdn_chunk_fwd(const GdnInputs<T>& in, const DeltaDims& dims, T* o, T* final_state, int64_t chunk_size = 64);

/// Chunked backward (§6.5 B1–B9): chunk-start states are recomputed by a forward scan (not saved by the
/// forward), then chunks are processed in reverse with dS_C carried between them. Same arguments and
/// results as gdn_recurrent_bwd (equal up to rounding). chunk_size >= 1.
template <typename T>
void gdn_chunk_bwd(const GdnInputs<T>& in, const T* d_o, const T* d_final_state, const DeltaDims& dims,
                   const GdnGrads<T>& grads, int64_t chunk_size = 64);

}  // namespace llmt::cpu
