// Gated DeltaNet gates (layers-delta.md section 4.1 steps 2-3, gradients section 5):
// beta = sigmoid(b); g = -exp(A_log) * softplus(a + dt_bias), the per-token log-decay (<= 0).
#pragma once
#include <cstdint>

namespace llmt::cpu {

/// a, b, g, beta: [rows, heads] (rows = batch * seq_len); A_log, dt_bias: [heads]. Writes g and beta.
/// Arithmetic in double for any T; softplus is evaluated stably (no overflow for large |a|).
template <typename T>
void gdn_gates_fwd(const T* a, const T* b, const T* A_log, const T* dt_bias, int64_t rows, int64_t heads, T* g,
                   T* beta);

/// Backward of gdn_gates_fwd. dg, dbeta, a, b, da, db: [rows, heads]; A_log, dt_bias, dA_log, ddt_bias: [heads].
/// da and db are OVERWRITTEN; dA_log and ddt_bias += (ACCUMULATE).
template <typename T>
void gdn_gates_bwd(const T* dg, const T* dbeta, const T* a, const T* b, const T* A_log, const T* dt_bias,
                   int64_t rows, int64_t heads, T* da, T* db, T* dA_log, T* ddt_bias);

}  // namespace llmt::cpu
