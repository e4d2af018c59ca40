// One optimizer step (runs.md section 1): grad_accum micro-batches of forward + backward
// into zeroed gradients, the global gradient L2 norm, a skip when it is not finite, clipping,
// and the AdamW update. Shared by the trainer and `llmtrain bench`.
//
// Data parallel (issue 8): each of W ranks runs grad_accum / W of the step's micro-batches;
// their gradients, already scaled by 1 / (the global batch's targets), are summed over the ranks
// in fp32 buckets after the last backward (not yet overlapped with it), which gives every rank
// the gradient of the whole global batch. Loss, gradient norm and the non-finite skip are then
// agreed by all ranks.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "dist/communicator.h"
#include "model/config.h"
#include "model/model.h"
#include "train/optimizer.h"

namespace llmt {

struct StepResult {
  double loss = 0;       ///< mean cross-entropy over the step's labelled targets (nats): all batch_tokens of a
                         ///< token stream, the answers of a synthetic task
  double grad_norm = 0;  ///< global L2 norm before clipping
  bool skipped = false;  ///< the update was skipped (non-finite norm and train.skip_nonfinite)
};

/// Windows of one micro-batch: fills out[micro_batch, seq_len + 1] with token ids in the window encoding:
/// an entry v >= 0 is token v (labelled when it is a target), v < 0 is token -(v + 1) without a label
/// (synthetic tasks label only their answers, data/synthetic_source.h; -1 is unlabelled token-0 padding).
/// Token streams (shards) hold only ids >= 0.
using WindowSource = std::function<void(int32_t* out)>;

class StepRunner {
 public:
  /// Throws llmt::Error when train.batch_tokens is not a multiple of micro_batch * seq_len *
  /// the communicator's world size (each rank must run the same number of micro-batches).
  StepRunner(Model& model, AdamW& optimizer, const TrainConfig& train,
             Communicator& comm = single_process_communicator());
  /// Runs one optimizer step at learning rate `lr`, drawing this rank's micro_batches_per_rank()
  /// micro-batches from `next`.
  StepResult run(double lr, const WindowSource& next);
  /// grad_accum / world size.
  int64_t micro_batches_per_rank() const { return micro_batches_; }

 private:
  Model& model_;
  AdamW& optimizer_;
  const TrainConfig& train_;
  Communicator& comm_;
  int64_t micro_batches_;
  std::vector<int32_t> windows_;           // host staging of the step's micro-batches on this rank
  std::vector<int32_t> inputs_, targets_;  // one micro-batch
};

/// Sums `flat` (f32 or f64) over the ranks of `comm` in place, in consecutive buckets of at most
/// `bucket_elements` elements (the unit that a later step overlaps with backward).
void all_reduce_in_buckets(Communicator& comm, const Tensor& flat, int64_t bucket_elements);

/// Splits windows [batch, seq_len + 1] (window encoding above) into inputs [:, :-1] (token ids) and targets
/// [:, 1:] (token ids, -1 where the entry carries no label).
void split_windows(const std::vector<int32_t>& windows, int64_t batch, int64_t seq_len, std::vector<int32_t>& inputs,
                   std::vector<int32_t>& targets);

}  // namespace llmt
