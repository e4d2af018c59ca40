// One optimizer step (runs.md section 1): grad_accum micro-batches of forward + backward
// into zeroed gradients, the global gradient L2 norm, a skip when it is not finite, clipping,
// and the AdamW update. Shared by the trainer and `llmtrain bench`.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "model/config.h"
#include "model/model.h"
#include "train/optimizer.h"

namespace llmt {

struct StepResult {
  double loss = 0;       ///< mean cross-entropy over the step's batch_tokens targets (nats)
  double grad_norm = 0;  ///< global L2 norm before clipping
  bool skipped = false;  ///< the update was skipped (non-finite norm and train.skip_nonfinite)
};

/// Windows of one micro-batch: fills out[micro_batch, seq_len + 1] with token ids.
using WindowSource = std::function<void(int32_t* out)>;

class StepRunner {
 public:
  StepRunner(Model& model, AdamW& optimizer, const TrainConfig& train);
  /// Runs one optimizer step at learning rate `lr`, drawing grad_accum micro-batches from `next`.
  StepResult run(double lr, const WindowSource& next);

 private:
  Model& model_;
  AdamW& optimizer_;
  const TrainConfig& train_;
  std::vector<int32_t> windows_, inputs_, targets_;  // host staging of one micro-batch
};

/// Splits windows [batch, seq_len + 1] into inputs [:, :-1] and targets [:, 1:].
void split_windows(const std::vector<int32_t>& windows, int64_t batch, int64_t seq_len, std::vector<int32_t>& inputs,
                   std::vector<int32_t>& targets);

}  // namespace llmt
