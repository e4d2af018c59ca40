// RMSNorm (layers-ssm-attn.md section 1.1): y = x / sqrt(mean(x^2) + eps) * w.
#pragma once
#include <cstdint>

namespace llmt::cpu {

/// x, y: [rows, dim]; w: [dim]; rstd: [rows] receives 1/sqrt(mean(x^2)+eps).
/// Statistics are accumulated in double for any T.
template <typename T>
void rmsnorm_fwd(const T* x, const T* w, int64_t rows, int64_t dim, double eps, T* y, T* rstd);

/// The residual add fused with the norm that follows it (a pre-norm block's second half):
/// h = x + branch (in T, as an elementwise add), then rmsnorm_fwd of h into y and rstd, row by
/// row in one pass. Equal bit for bit to the add followed by rmsnorm_fwd. x, branch, h, y:
/// [rows, dim]; w: [dim]; rstd: [rows]. Its backward is rmsnorm_bwd into the residual-stream
/// gradient: the add passes that gradient unchanged to x and to branch.
template <typename T>
void add_rmsnorm_fwd(const T* x, const T* branch, const T* w, int64_t rows, int64_t dim, double eps, T* h, T* y,
                     T* rstd);

/// Backward of rmsnorm_fwd given its saved rstd.
/// dx += d/dx (ACCUMULATES into dx: in a pre-norm block dx is the residual-stream gradient);
/// dw += d/dw (accumulates). dy, x: [rows, dim]; w, dw: [dim]; rstd: [rows].
template <typename T>
void rmsnorm_bwd(const T* dy, const T* x, const T* w, const T* rstd, int64_t rows, int64_t dim, T* dx, T* dw);

}  // namespace llmt::cpu
