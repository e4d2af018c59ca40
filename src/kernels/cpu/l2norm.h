// In-kernel L2 norm with query scale (layers-delta.md section 2.2):
// y = scale * x * r, r = (sum_c x_c^2 + eps)^(-1/2) (eps inside the square root, not a clamp).
#pragma once
#include <cstdint>

namespace llmt::cpu {

/// x, y: [rows, dim] (rows = batch * seq_len * heads, dim = head key dim); rinv: [rows] receives r.
/// scale = 1 for keys, d_k^(-1/2) for queries. Statistics are accumulated in double for any T.
template <typename T>
void l2norm_fwd(const T* x, int64_t rows, int64_t dim, double eps, double scale, T* y, T* rinv);

/// Backward of l2norm_fwd given its input x and saved rinv (scale the same as in forward; x̃ = x rinv).
/// dy, x, dx: [rows, dim]; rinv: [rows]. dx is OVERWRITTEN.
template <typename T>
void l2norm_bwd(const T* dy, const T* x, const T* rinv, int64_t rows, int64_t dim, double scale, T* dx);

}  // namespace llmt::cpu
