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

/// Mamba2's gated RMSNorm, the gate first (norm_before_gate = False; layers-ssm-attn.md §1.2, §2.2 step 6, one
/// group): u = y ∘ silu(z), rho = (mean_c(u_c^2) + eps)^(-1/2), out = u rho ∘ w. y, z, out: [rows, dim]; w: [dim];
/// rstd: [rows] receives rho. Equal to swiglu then rmsnorm, without storing u. Arithmetic in double for any T.
template <typename T>
void gate_rmsnorm_fwd(const T* y, const T* z, const T* w, int64_t rows, int64_t dim, double eps, T* out, T* rstd);

/// Backward of gate_rmsnorm_fwd given its saved rstd (u recomputed from y, z): dout, y, z, dy, dz: [rows, dim];
/// w, dw: [dim]; rstd: [rows]. With û = u rho, dû = dout ∘ w: du = rho (dû - û (1/dim) Σ_c dû_c û_c),
/// dy = du ∘ silu(z), dz = du ∘ y ∘ silu'(z) (OVERWRITTEN); dw += Σ_rows dout ∘ û (ACCUMULATES).
template <typename T>
void gate_rmsnorm_bwd(const T* dout, const T* y, const T* z, const T* w, const T* rstd, int64_t rows, int64_t dim,
                      T* dy, T* dz, T* dw);

}  // namespace llmt::cpu
