// AdamW over the model's flat parameter buffer (runs.md section 1): decoupled weight decay,
// applied to every parameter except the categories in train.weight_decay_exclude; fp32 (or
// f64 in tests) moments in two flat buffers shaped like the parameters. With ZeRO-1 (issue 8,
// docs/DISTRIBUTED.md) one optimizer per rank updates only that rank's contiguous shard of the
// flat buffer and holds moments for the shard alone.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "model/config.h"
#include "model/params.h"

namespace llmt {

class AdamW {
 public:
  /// Updates the flat elements [shard_begin, shard_end) of `store` (shard_end = -1: to
  /// store.total(); a shard may reach into the padding up to store.padded_total(), which it
  /// leaves at zero). Allocates zeroed moments m, v of shard_end - shard_begin elements and groups
  /// the shard's parameters into contiguous runs with the same weight-decay setting. Throws
  /// llmt::Error for a shard outside [0, padded_total()].
  AdamW(ParamStore& store, const TrainConfig& train, int64_t shard_begin = 0, int64_t shard_end = -1);

  /// One update of the shard with learning rate `lr`, gradients scaled by `grad_scale` (the
  /// clipping factor). Increments steps_taken() first (bias correction uses the new count).
  void step(double lr, double grad_scale);

  int64_t steps_taken() const { return steps_taken_; }
  void set_steps_taken(int64_t n) { steps_taken_ = n; }
  /// The moments of the shard: 1-D, shard_end() - shard_begin() elements; element i belongs to
  /// flat parameter element shard_begin() + i.
  Tensor m() const { return *m_; }
  Tensor v() const { return *v_; }
  int64_t shard_begin() const { return begin_; }
  int64_t shard_end() const { return end_; }
  /// Whether the shard covers every parameter (no ZeRO-1 sharding).
  bool covers_all() const { return begin_ == 0 && end_ >= store_.total(); }
  /// Bytes of optimizer state on this rank (the two moment buffers).
  size_t state_bytes() const { return m_->bytes() + v_->bytes(); }
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
  std::vector<Run> runs_;  // offsets into the flat buffer, within the shard
  int64_t begin_ = 0, end_ = 0;
  OwnedTensor m_, v_;
  int64_t steps_taken_ = 0;
};

}  // namespace llmt
