// Mamba-3 sequence-mixing core (layers-ssm-attn.md §4.3.2–4.3.3, §4.4, §4.5), CPU reference, SISO (R = 1)
// and MIMO (rank R). The core starts after the per-token scalars and vectors of §4.3.1: it takes the
// rotated, biased keys k (B̄) and queries q (C̄), the (up-projected) values v, the log-decay a = A Δ, the
// trapezoid weights γ = λ Δ and ε = (1 - λ) Δ, and D. Per (batch, head) with state H [P, N]
// (rows: value channels p, columns: state channels n), α_t = exp(a_t), β_t = ε_t α_t and
// W_t = Σ_r v_{t,r} k_{t,r}^T:
//   H_t = α_t H_{t-1} + β_t W_{t-1} + γ_t W_t     (W_{-1} = 0, H_{-1} = 0)
//   y_{t,r} = H_t q_{t,r} + D v_{t,r}
// Layouts: q, k [B, T, H, R, N]; v, y [B, T, H, R, P]; a, gamma, eps [B, T, H]; D [H].
// All arithmetic is in double for either T; inputs and outputs are T.
#pragma once
#include <cstdint>

namespace llmt::cpu {

/// Sizes of one Mamba-3 core call: B, T, H (heads), P (head_dim), N (d_state), R (MIMO rank; 1 = SISO).
struct Mamba3Dims {
  int64_t batch, seq_len, heads, head_dim, state_dim, rank;
};

/// Inputs of the core (§4.3.2 / §4.3.3 after §4.3.1). q, k: [B, T, H, R, N]; v: [B, T, H, R, P];
/// a: [B, T, H], the log-decay A Δ (<= 0 in the layer; not required); gamma, eps: [B, T, H], λΔ and
/// (1 - λ)Δ; D: [H].
template <typename T>
struct Mamba3Inputs {
  const T* q;
  const T* k;
  const T* v;
  const T* a;
  const T* gamma;
  const T* eps;
  const T* D;
};

/// Gradients of the core, same shapes as the matching Mamba3Inputs fields; all are OVERWRITTEN
/// (dD summed over batch and time).
template <typename T>
struct Mamba3Grads {
  T* dq;
  T* dk;
  T* dv;
  T* da;
  T* dgamma;
  T* deps;
  T* dD;
};

/// Token-by-token recurrence of §4.3.2 / §4.3.3 (the oracle). Writes y [B, T, H, R, P].
/// Throws llmt::Error for non-positive sizes.
template <typename T>
void mamba3_recurrent_fwd(const Mamba3Inputs<T>& in, const Mamba3Dims& dims, T* y);

/// Exact reverse-time backward of mamba3_recurrent_fwd (§4.5, "recurrent-form gradient reference") given
/// d_y [B, T, H, R, P]. Keeps every state of one head (memory (T + 1) P N doubles): a test oracle.
template <typename T>
void mamba3_recurrent_bwd(const Mamba3Inputs<T>& in, const T* d_y, const Mamba3Dims& dims, const Mamba3Grads<T>& grads);

/// Chunked forward (§4.4.1–4.4.4): chunks of chunk_size positions (the last may be shorter), chunk-local
/// inclusive cumsum G of a, keys k̃_j = σ_j k_j with σ_j = γ_j + ε_{j+1} (ε_T := 0; σ crosses chunk
/// boundaries), a strictly causal intra-chunk part, the diagonal γ_i Σ_r' (q_{i,r}·k_{i,r'}) v_{i,r'},
/// the inter-chunk read e^{G_i} S_in q_{i,r} and the D skip. Same output as mamba3_recurrent_fwd up to
/// rounding. Throws llmt::Error when chunk_size < 1 (reference: 64 for SISO, 64 / R for MIMO).
template <typename T>
void mamba3_chunk_fwd(const Mamba3Inputs<T>& in, const Mamba3Dims& dims, T* y, int64_t chunk_size = 64);

/// Chunked backward (§4.5 step 2 "Core" and the σ split of step 4): chunk-entry states recomputed by a
/// forward pass over the chunks, then the chunks in reverse carrying dS. Same results as
/// mamba3_recurrent_bwd up to rounding. Throws llmt::Error when chunk_size < 1.
template <typename T>
void mamba3_chunk_bwd(const Mamba3Inputs<T>& in, const T* d_y, const Mamba3Dims& dims, const Mamba3Grads<T>& grads,
                      int64_t chunk_size = 64);

}  // namespace llmt::cpu
