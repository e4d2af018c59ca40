// FusedRMSNormGated (layers-delta.md section 2.3): per-head RMSNorm times a gate,
// y = o rho ∘ w ∘ phi(z), rho = (mean(o^2) + eps)^(-1/2), phi = silu (GDN) or sigmoid (Comba, KDA).
#pragma once
#include <cstdint>

namespace llmt::cpu {

/// o, z, y: [rows, dim] (rows = batch * seq_len * heads, dim = head value dim d_v); w: [dim], shared
/// by all rows (all heads); rstd: [rows] receives rho. sigmoid_gate selects phi = sigmoid, else silu.
/// Statistics and arithmetic in double for any T.
template <typename T>
void gated_rmsnorm_fwd(const T* o, const T* z, const T* w, int64_t rows, int64_t dim, double eps, bool sigmoid_gate,
                       T* y, T* rstd);

/// Backward of gated_rmsnorm_fwd given its saved rstd. dy, o, z, d_o, dz: [rows, dim]; w, dw: [dim];
/// rstd: [rows]. d_o and dz are OVERWRITTEN; dw += d/dw (ACCUMULATES).
template <typename T>
void gated_rmsnorm_bwd(const T* dy, const T* o, const T* z, const T* w, const T* rstd, int64_t rows, int64_t dim,
                       bool sigmoid_gate, T* d_o, T* dz, T* dw);

}  // namespace llmt::cpu
