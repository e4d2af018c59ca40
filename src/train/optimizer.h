// AdamW over the model's flat parameter buffer (runs.md section 1): decoupled weight decay,
// applied to every parameter except the categories in train.weight_decay_exclude; fp32 (or
// f64 in tests) moments in two flat buffers shaped like the parameters.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "model/config.h"
#include "model/params.h"

namespace llmt {

class AdamW {
 public:
  /// Allocates zeroed moments m, v for every parameter of `store` and groups the parameters
  /// into contiguous runs with the same weight-decay setting.
  AdamW(ParamStore& store, const TrainConfig& train);

  /// One update with learning rate `lr`, gradients scaled by `grad_scale` (the clipping
  /// factor). Increments steps_taken() first (bias correction uses the new count).
  void step(double lr, double grad_scale);

  int64_t steps_taken() const { return steps_taken_; }
  void set_steps_taken(int64_t n) { steps_taken_ = n; }
  Tensor m() const { return m_->reshape({store_.total()}); }
  Tensor v() const { return v_->reshape({store_.total()}); }
  /// Whether parameter i receives weight decay.
  bool decays(int i) const { return decays_.at(i); }

 private:
  struct Run {
    int64_t offset, numel;
    bool decay;
  };
  ParamStore& store_;
  AdamWParams hp_;
  std::vector<bool> decays_;
  std::vector<Run> runs_;
  OwnedTensor m_, v_;
  int64_t steps_taken_ = 0;
};

}  // namespace llmt
