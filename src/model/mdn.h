// MDN (Momentum DeltaNet) mixer (mdn.md; the authors' fla/layers/momentum_deltanet.py): the shared
// delta-layer structure (model/delta_layer.h: q/k/v projections, short convs + SiLU, a_proj, b_proj, A_log,
// dt_bias, g_proj, o_norm, o_proj) around the MDN core, FLA parameter names (mdn.md §3):
//   q' = q - exp(D_log) k   (output correction, before the L2 norm; q' = q when off)     (§4.2)
//   q^ = l2norm(q') / sqrt(d_k), k_n = l2norm(k)                                          (§4.3)
//   log α, β, log μ, η from a_proj, b_proj, m_proj, e_proj and A_log, dt_bias, Mu_log,
//   mu_bias, log_factor (τ = sqrt(d_model / tau_factor), floor min_log_mu; the ablation switches alpha_max,
//   beta_max, eta, momentum)                                                              (§4.4)
//   o = MDN core (chunked, §6) of (q^, k_n, v, log α, β, log μ, η)                        (§4.5)
//       (with model.mdn.save_residuals the core's corrected values Ṽ [rows, H dv] are saved for the backward, §7.1)
//   y = o_proj(rmsnorm_per_head(o) * o_norm.weight * sigmoid(g_proj x))                   (§4.6)
// Parameters beyond the shared ones: m_proj.weight [H, D], e_proj.weight [H, D] (N(0, std²)); Mu_log [H]
// (log U(mu_A_range)); mu_bias [H] (the values of dt_bias, or an own draw of its distribution);
// log_factor [H] (log U(0, 4) or 0); D_log [H] (log U(0, 1) or 0; only with the output correction). Without
// momentum (the paper's "no momentum" proxy: GDN with the α_max / β_max constraints) there is no m_proj,
// e_proj, Mu_log, mu_bias, and the core runs with μ = 0, η = 1. Configured by model.mdn (MdnConfig).
#pragma once
#include "model/delta_layer.h"

namespace llmt {

class MdnMixer final : public DeltaLayer {
 public:
  /// Registers the MDN parameters of one layer under `prefix` (FLA names, see the file comment).
  MdnMixer(const ModelConfig& config, ParamStore& store, const std::string& prefix);

 private:
  void plan_core(int64_t rows, ScratchCarver& saved) override;
  void bind_core_scratch(ScratchCarver& scratch, int64_t rows) override;
  void core_forward(const MixerState* state) override;
  int core_states() const override { return 2; }  // S and the momentum M
  void core_backward() override;
  void gates_forward(const Tensor& x) override;
  void gates_backward(const Tensor& x, const Tensor& dx) override;

  /// The gate parameters A_log, dt_bias, Mu_log, mu_bias, log_factor (master copies; Mu_log, mu_bias empty
  /// without momentum) and, from gate_grads, their gradients.
  Backend::MdnGateParams gate_params() const;
  Backend::MdnGateParams gate_grads() const;
  /// The saved corrected values Ṽ as [B, T, H, dv] (save_residuals), else a default-constructed tensor (none: the
  /// core's backward recomputes them).
  Tensor residuals() const { return mc_.save_residuals ? heads_v(vt_) : Tensor(); }

  const MdnConfig mc_;
  MdnGateOptions opt_;
  int wm_ = -1, we_ = -1, Mu_log_ = -1, mu_bias_ = -1, log_factor_ = -1, D_log_ = -1;
  Tensor zm_, ze_, log_mu_, eta_;          // μ, η gate pre-activations and gates [rows, H]
  Tensor qcor_;                            // q' = q - δ k (only with the output correction)
  Tensor qhat_, khat_, rq_, rk_;           // L2-normalised q' (scaled), k; their 1/norm [rows * H]
  Tensor vt_;                              // the core's corrected values Ṽ [rows, H dv] (only with save_residuals)
  Tensor dqhat_, dkhat_, dlog_mu_, deta_, dzm_, dze_;  // backward temporaries (shared scratch)
};

}  // namespace llmt
