// The decay and beta gates of the delta-rule layers, forward and backward (layers-delta.md §4.1
// steps 2-3, §4.3 steps 2-3, gradients §5): beta = sigmoid(b); g = -exp(A_log) * softplus(a + dt_bias),
// the per-token log-decay (<= 0). Gated DeltaNet and Comba have one decay per head (dim = 1); KDA has
// one per key channel (dim = d_k): a, g and dt_bias carry `dim` channels per head, A_log is per head.
#pragma once
#include <cstdint>

namespace llmt::cpu {

/// a, g: [rows, heads * dim] (rows = batch * seq_len); b, beta: [rows, heads]; A_log: [heads];
/// dt_bias: [heads * dim]. Channel (h, c) uses A_log[h] and dt_bias[h * dim + c]. Writes g and beta.
/// dim = 1: the GDN / Comba gates (§4.1); dim = d_k: the KDA channel-wise gate (§4.3, FLA fused_kda_gate).
/// Arithmetic in double for any T; softplus is evaluated stably (no overflow for large |a|).
template <typename T>
void delta_gates_fwd(const T* a, const T* b, const T* A_log, const T* dt_bias, int64_t rows, int64_t heads,
                     int64_t dim, T* g, T* beta);

/// Backward of delta_gates_fwd (§5). dg, a, da: [rows, heads * dim]; dbeta, b, db: [rows, heads];
/// A_log, dA_log: [heads]; dt_bias, ddt_bias: [heads * dim]. da and db are OVERWRITTEN; dA_log and
/// ddt_bias += (ACCUMULATE): dA_log[h] += Σ_{rows, c} dg g, ddt_bias[h * dim + c] += Σ_rows da.
template <typename T>
void delta_gates_bwd(const T* dg, const T* dbeta, const T* a, const T* b, const T* A_log, const T* dt_bias,
                     int64_t rows, int64_t heads, int64_t dim, T* da, T* db, T* dA_log, T* ddt_bias);

}  // namespace llmt::cpu
