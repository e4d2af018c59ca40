// RMSNorm (layers-ssm-attn.md section 1.1): y = x / sqrt(mean(x^2) + eps) * w.
#pragma once
#include <cstdint>

namespace llmt::cpu {

/// x, y: [rows, dim]; w: [dim]; rstd: [rows] receives 1/sqrt(mean(x^2)+eps).
/// Statistics are accumulated in double for any T.
template <typename T>
void rmsnorm_fwd(const T* x, const T* w, int64_t rows, int64_t dim, double eps, T* y, T* rstd);

/// Backward of rmsnorm_fwd given its saved rstd.
/// dx += d/dx (ACCUMULATES into dx: in a pre-norm block dx is the residual-stream gradient);
/// dw += d/dw (accumulates). dy, x: [rows, dim]; w, dw: [dim]; rstd: [rows].
template <typename T>
void rmsnorm_bwd(const T* dy, const T* x, const T* w, const T* rstd, int64_t rows, int64_t dim, T* dx, T* dw);

}  // namespace llmt::cpu
