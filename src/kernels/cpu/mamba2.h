// Mamba2 SSD sequence-mixing core (layers-ssm-attn.md §2.4–2.6), CPU reference.
// The core starts after in_proj, the conv + SiLU and the discretisation: it takes x, Δ (after
// softplus(dt_raw + dt_bias)), A = -exp(A_log), B, C and D and returns y. Per (batch, head h) with
// group g = h / (H / G) and state S [P, N] (rows: head channels p, columns: state channels n):
//   α_t = exp(Δ_t A);  S_t = α_t S_{t-1} + Δ_t x_t B_t^T;  y_t = S_t C_t + D x_t.
// Layouts: x, y [B, T, H, P]; dt [B, T, H]; Bm, C [B, T, G, N]; A, D [H]; states [B, H, P, N].
// All arithmetic is in double for either T; inputs and outputs are T.
#pragma once
#include <cstdint>

namespace llmt::cpu {

/// Sizes of one Mamba2 core call: B, T, H (heads), P (head_dim), N (d_state), G (n_groups).
/// H must be a multiple of G; heads h = g·H/G … (g+1)·H/G - 1 share the group's B and C.
struct Mamba2Dims {
  int64_t batch, seq_len, heads, head_dim, state_dim, groups;
};

/// Inputs of the SSD core (§2.2 steps 4–5). x: [B, T, H, P]; dt: [B, T, H], Δ >= 0 (after softplus
/// and dt_bias); A: [H], the per-head decay rate (A = -exp(A_log) <= 0; not required to be negative);
/// Bm, C: [B, T, G, N]; D: [H], the skip; initial_state: [B, H, P, N] or nullptr for S_{-1} = 0.
template <typename T>
struct Mamba2Inputs {
  const T* x;
  const T* dt;
  const T* A;
  const T* Bm;
  const T* C;
  const T* D;
  const T* initial_state;
};

/// Gradients of the SSD core, same shapes as the matching Mamba2Inputs fields; all are OVERWRITTEN
/// (dB and dC are summed over the heads of a group, dA and dD over batch and time).
/// d_initial_state may be nullptr (not computed); when non-null it receives dL/dS_{-1}.
template <typename T>
struct Mamba2Grads {
  T* dx;
  T* ddt;
  T* dA;
  T* dB;
  T* dC;
  T* dD;
  T* d_initial_state;
};

/// Token-by-token recurrence of §2.4 (the oracle). Writes y [B, T, H, P] and, when final_state is
/// non-null, the last state into final_state [B, H, P, N]. Throws llmt::Error when G does not divide H.
template <typename T>
void mamba2_recurrent_fwd(const Mamba2Inputs<T>& in, const Mamba2Dims& dims, T* y, T* final_state);

/// Exact reverse-time backward of mamba2_recurrent_fwd (§2.6.4). d_y: [B, T, H, P], dL/dy;
/// d_final_state: [B, H, P, N] or nullptr for 0. The states are recomputed from checkpoints taken every
/// 64 tokens (memory ~ (T/64 + 65) P N doubles).
template <typename T>
void mamba2_recurrent_bwd(const Mamba2Inputs<T>& in, const T* d_y, const T* d_final_state, const Mamba2Dims& dims,
                          const Mamba2Grads<T>& grads);

/// Chunked SSD forward (§2.5): chunks of chunk_size tokens (the last may be shorter), chunk-local
/// inclusive cumsum G of a = Δ A, intra-chunk y_i = Σ_{j<=i} (C_i·B_j) e^{G_i-G_j} Δ_j x_j, inter-chunk
/// e^{G_i} S_in C_i, the D skip, and the state passed to the next chunk. Same outputs as
/// mamba2_recurrent_fwd up to rounding. Throws llmt::Error when chunk_size < 1 (reference: 256).
template <typename T>
void mamba2_chunk_fwd(const Mamba2Inputs<T>& in, const Mamba2Dims& dims, T* y, T* final_state,
                      int64_t chunk_size = 256);

/// Chunked SSD backward (§2.6.3 a–h): the chunk-entry states are recomputed by a forward pass over the
/// chunks (not saved), then the chunks are processed in reverse with dS_in carried between them. Same
/// arguments and results as mamba2_recurrent_bwd up to rounding. Throws llmt::Error when chunk_size < 1.
template <typename T>
void mamba2_chunk_bwd(const Mamba2Inputs<T>& in, const T* d_y, const T* d_final_state, const Mamba2Dims& dims,
                      const Mamba2Grads<T>& grads, int64_t chunk_size = 256);

/// The layer's SSD step (§2.2 steps 3–5, §2.6.2 steps 3–5): split the conv output, discretise, run the
/// chunked core. xbc: [B, T, H P + 2 G N], each row [x (H P) | B (G N) | C (G N)]; dt_raw: [B, T, H];
/// dt_bias, A_log, D: [H]; y: [B, T, H P]. Δ = softplus(dt_raw + dt_bias) (the identity above 20),
/// A = -exp(A_log). Arithmetic in double for any T. state: [B, H, P, N] or nullptr
/// (zero initial state); when given, the SSD continues from it and it receives the final state (a decode
/// step is T = 1, layers-ssm-attn.md §2.8). Throws llmt::Error for bad sizes (as mamba2_chunk_fwd).
template <typename T>
void mamba2_ssd_fwd(const T* xbc, const T* dt_raw, const T* dt_bias, const T* A_log, const T* D,
                    const Mamba2Dims& dims, int64_t chunk_size, T* y, T* state = nullptr);

/// Backward of mamba2_ssd_fwd given dy [B, T, H P]: dxbc [B, T, H P + 2 G N] and ddt_raw [B, T, H] are
/// OVERWRITTEN; ddt_bias, dA_log, dD [H] ACCUMULATE (dΔ σ(dt_raw + dt_bias) summed; dA · A; dD).
template <typename T>
void mamba2_ssd_bwd(const T* dy, const T* xbc, const T* dt_raw, const T* dt_bias, const T* A_log, const T* D,
                    const Mamba2Dims& dims, int64_t chunk_size, T* dxbc, T* ddt_raw, T* ddt_bias, T* dA_log, T* dD);

}  // namespace llmt::cpu
