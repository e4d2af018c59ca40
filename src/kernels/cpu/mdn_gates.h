// The four per-head gates of the MDN layer and its output correction (mdn.md §4.2, §4.4), forward and
// backward (§7.4). Per row (token) r and head h, from the gate projections z_α, z_β, z_μ, z_η and the
// per-head parameters A_log, dt_bias, Mu_log, mu_bias, log_factor:
//   η      = 1 + tanh(z_η / τ)                 (eta_form tanh; eta_form two_sigmoid: η = 2 σ(z_η / τ))
//   s      = exp(log_factor),  x = s η,  α_max = 1 / (1 + x²) = cos² arctan x,  β_max = x² / (1 + x²) = sin² arctan x
//   log α  = -exp(A_log) softplus(z_α + dt_bias) + log α_max   (alpha_max off: no + log α_max)
//   β      = σ(z_β) β_max                      (beta_max off: β = σ(z_β))
//   log μ  = max(-exp(Mu_log) softplus(z_μ + mu_bias), min_log_mu)
// Without momentum (the paper's "no momentum" proxy, Table 4: GDN with the α_max / β_max constraints)
// there are no z_μ, z_η, Mu_log, mu_bias: log μ = -inf (μ = 0) and η = 1 (so x = s).
// Output correction: q_out = q - exp(D_log_h) k per head (before the L2 norm).
// All arithmetic is in double for float and double T (fp32 log space on the GPU).
#pragma once
#include <cstdint>

#include "kernels/mdn_gate_options.h"

namespace llmt::cpu {

/// Forward of the gates. z_alpha, z_beta, z_mu, z_eta, log_alpha, beta, log_mu, eta: [rows, heads];
/// A_log, dt_bias, Mu_log, mu_bias, log_factor: [heads]. Writes log_alpha, beta, log_mu (-inf without
/// momentum) and eta (1 without momentum).
template <typename T>
void mdn_gates_fwd(const T* z_alpha, const T* z_beta, const T* z_mu, const T* z_eta, const T* A_log,
                   const T* dt_bias, const T* Mu_log, const T* mu_bias, const T* log_factor, int64_t rows,
                   int64_t heads, const MdnGateOptions& opt, T* log_alpha, T* beta, T* log_mu, T* eta);

/// Backward of mdn_gates_fwd (mdn.md §7.4). d_log_alpha, d_beta, d_log_mu, d_eta: [rows, heads], the
/// gradients w.r.t. the outputs (d_log_mu, d_eta unused without momentum). dz_alpha, dz_beta, dz_mu, dz_eta
/// [rows, heads] are OVERWRITTEN (dz_mu, dz_eta not written without momentum); dA_log, ddt_bias, dMu_log,
/// dmu_bias, dlog_factor [heads] are ACCUMULATED (+=). Where the floor clamps log μ, dz_mu = 0 and the μ
/// parameters get nothing from that token.
template <typename T>
void mdn_gates_bwd(const T* d_log_alpha, const T* d_beta, const T* d_log_mu, const T* d_eta, const T* z_alpha,
                   const T* z_beta, const T* z_mu, const T* z_eta, const T* A_log, const T* dt_bias, const T* Mu_log,
                   const T* mu_bias, const T* log_factor, int64_t rows, int64_t heads, const MdnGateOptions& opt,
                   T* dz_alpha, T* dz_beta, T* dz_mu, T* dz_eta, T* dA_log, T* ddt_bias, T* dMu_log, T* dmu_bias,
                   T* dlog_factor);

/// Output correction (mdn.md §4.2): q, k, q_out [rows, heads * dim]; D_log [heads]. q_out = q - e^{D_log_h} k.
template <typename T>
void mdn_correction_fwd(const T* q, const T* k, const T* D_log, int64_t rows, int64_t heads, int64_t dim, T* q_out);

/// Backward of mdn_correction_fwd (mdn.md §7.4): dq_out [rows, heads * dim] is also dL/dq (nothing written
/// for q); dk += -e^{D_log_h} dq_out and dD_log[h] += -e^{D_log_h} Σ dq_out ⊙ k (both ACCUMULATED).
template <typename T>
void mdn_correction_bwd(const T* dq_out, const T* k, const T* D_log, int64_t rows, int64_t heads, int64_t dim, T* dk,
                        T* dD_log);

}  // namespace llmt::cpu
