// Comba layer-level corrections (layers-delta.md §4.2 steps 2-3, gradients §5), applied to the
// post-conv q, k BEFORE the in-kernel L2 norm. Per head h, with s_h = sigma(decay_h) (inner decay):
//   p = s_h k;   q' = q - D_h s_h k  (= q - D_h p, the output correction).
// Either part can be switched off (FLA use_inner_decay / use_output_correction): without the inner
// decay s_h = 1 (p = k); without the output correction q' = q.
#pragma once
#include <cstdint>

namespace llmt::cpu {

/// q, k, q_out, p: [rows, heads * dim] (rows = batch * seq_len, head-major within a row);
/// decay, D: [heads], or nullptr when the inner decay / output correction is off.
/// Writes q_out = q' and p. Arithmetic in double for any T.
template <typename T>
void comba_gates_fwd(const T* q, const T* k, const T* decay, const T* D, int64_t rows, int64_t heads, int64_t dim,
                     T* q_out, T* p);

/// Backward of comba_gates_fwd. dq_out (= dq', the gradient w.r.t. q' after its L2-norm backward) and dp:
/// [rows, heads * dim]; k as in the forward. The gradient w.r.t. q is dq' itself (not written).
///   dk     += s dp - D s dq'                              (ACCUMULATE; pass the L2-norm backward of k̂)
///   ddecay += s (1 - s) sum_{rows, dim} (k dp - D k dq')  (ACCUMULATE; only when decay != nullptr)
///   dD     += -s sum_{rows, dim} k dq'                    (ACCUMULATE; only when D != nullptr)
template <typename T>
void comba_gates_bwd(const T* dq_out, const T* dp, const T* k, const T* decay, const T* D, int64_t rows,
                     int64_t heads, int64_t dim, T* dk, T* ddecay, T* dD);

}  // namespace llmt::cpu
