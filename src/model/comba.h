// Comba mixer (layers-delta.md section 4.2): the shared delta-layer structure
// (model/delta_layer.h) around the Comba core, FLA names (fla/layers/comba.py):
//   s = sigmoid(decay) (inner decay; 1 when off), p = s k                         (4.2 step 2)
//   q' = q - D s k (output correction; q' = q when off)                           (4.2 step 3)
//   q^ = l2norm(q') / sqrt(d_k), k^ = l2norm(k), p^ = l2norm(p)                    (4.2 step 5, 2.2)
//   o = Comba core (chunked, section 6.2) of (q^, k^, v, p^, g, beta)
//       (the layer keeps what the backend's core saves for its backward, Backend::gdn_saved_numel; CUDA: the
//       chunks' 𝒯 = (I + A)^{-1} and with model.comba.save_states the states h entering them, v_new Δ and W,
//       section 6.3)
// p is normalised separately from k (bit-faithful to FLA; p^ = k^ up to the 1e-6 eps), so decay
// reaches the loss essentially only through the output correction (sections 4.2, 10.1).
// Parameters beyond the shared ones: decay [H] (inner_decay), D [H] (output_correction);
// decay = model.comba.init.decay (1.0), D = correction_factor (1.0). Output gate sigmoid by default.
// q^, k^, p^ and v reach the core in bf16 where the backend's core takes them so (DeltaLayer::core_input_dtype:
// CUDA with compute bf16; the L2 norms and the short conv write them rounded, the norms' backward reads q', k, p).
#pragma once
#include "model/delta_layer.h"

namespace llmt {

class CombaMixer final : public DeltaLayer {
 public:
  CombaMixer(const ModelConfig& config, ParamStore& store, const std::string& prefix);

 private:
  bool bf16_input_core() const override { return true; }
  void plan_core(int64_t rows, ScratchCarver& saved) override;
  void bind_core_scratch(ScratchCarver& scratch, int64_t rows) override;
  void core_forward(const MixerState* state) override;
  void core_backward() override;

  bool has_gates() const { return decay_ >= 0 || D_ >= 0; }
  Tensor param_or_none(int i) const { return i >= 0 ? store_.master(i) : Tensor(); }
  Tensor grad_or_none(int i) const { return i >= 0 ? store_.grad(i) : Tensor(); }
  /// The L2 norms' inputs q' and p (q and k without the gates).
  const Tensor& q_in() const { return has_gates() ? qcor_ : qc_; }
  const Tensor& p_in() const { return has_gates() ? p_ : kc_; }

  int decay_ = -1, D_ = -1;
  Tensor qcor_, p_;                           // q' and p before the L2 norm (only with the gates)
  Tensor qhat_, khat_, phat_, rq_, rk_, rp_;  // L2-normalised q' (scaled), k, p (in core_input_dtype()); their
                                              // 1/norm [rows * H]
  Tensor kept_;                               // the core's saved forward intermediates (none where the backend
                                              // keeps nothing)
  Tensor dqhat_, dkhat_, dphat_, dp_;         // backward temporaries (shared scratch)
};

}  // namespace llmt
