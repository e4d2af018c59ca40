// The options of the MDN gates (mdn.md §4.4; the ablations of the MDN paper's Tables 4 and 6), shared by
// the Backend interface (kernels/backend.h) and the CPU kernels (kernels/cpu/mdn_gates.h).
#pragma once

namespace llmt {

/// Options of the MDN gates (mdn.md §4.4).
struct MdnGateOptions {
  double tau = 1.0;               ///< τ = sqrt(d_model / tau_factor) > 0
  double min_log_mu = -2.0;       ///< floor of log μ (hard clamp, zero gradient where active)
  bool alpha_max = true;          ///< log α gets + log α_max (false: log α = -A softplus, the "no α_max" ablation)
  bool beta_max = true;           ///< β = σ(z_β) β_max (false: β = σ(z_β), the "no β_max" ablation)
  bool eta_two_sigmoid = false;   ///< η = 2 σ(z_η / τ) instead of 1 + tanh(z_η / τ) (ablation)
  bool momentum = true;           ///< false: μ = 0, η = 1; z_μ, z_η, Mu_log, mu_bias unused (the no-momentum proxy)
};

}  // namespace llmt
