// One optimizer step (runs.md section 1): grad_accum micro-batches of forward + backward
// into zeroed gradients, the global gradient L2 norm, a skip when it is not finite, clipping,
// and the AdamW update. Shared by the trainer and `llmtrain bench`.
//
// Data parallel (issue 8, docs/DISTRIBUTED.md): each of W ranks runs grad_accum / W of the step's
// micro-batches; their gradients, already scaled by 1 / (the global batch's targets), are summed
// over the ranks, which gives every rank the gradient of the whole global batch:
//   - all-reduce (default): in buckets of whole blocks (train/grad_buckets.h), each launched during
//     the last micro-batch's backward as soon as its blocks are done (dist.overlap), or all after
//     it; every rank then updates all parameters;
//   - ZeRO-1 (dist.zero1): rank r receives the summed gradient of its segment r of the padded flat
//     buffer: the same buckets, each piece reduced to the rank owning it (dist.overlap), or one
//     reduce-scatter after the backward; its AdamW (whose moments cover only that segment)
//     updates it, and an all-gather copies every segment's new weights to all ranks.
// Loss, gradient norm (the sum of the W segments' squares in both modes) and the non-finite
// skip are then agreed by all ranks.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
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
  /// the communicator's world size (each rank must run the same number of micro-batches), or,
  /// with dist.zero1, when the model's padded_total() does not divide into world-size segments or
  /// the optimizer's shard is not this rank's segment (zero1_shard). Gives the communicator the
  /// backend's stream (Communicator::set_compute_stream).
  StepRunner(Model& model, AdamW& optimizer, const TrainConfig& train,
             Communicator& comm = single_process_communicator(), const DistConfig& dist = DistConfig());
  /// Takes the backend's stream back from the communicator (set_compute_stream(nullptr)).
  ~StepRunner();
  StepRunner(const StepRunner&) = delete;
  StepRunner& operator=(const StepRunner&) = delete;
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
  DistConfig dist_;
  int64_t micro_batches_;
  std::vector<std::pair<int64_t, int64_t>> buckets_;  // the last backward's buckets, when not overlapped
  std::vector<int32_t> windows_;           // host staging of the step's micro-batches on this rank
  std::vector<int32_t> inputs_, targets_;  // one micro-batch
};

/// ZeRO-1's shard of rank `rank` of `world`: segment [rank c, (rank+1) c) of the padded flat buffer,
/// c = params.padded_total() / world. Throws llmt::Error when `world` does not divide it (allocate
/// the model with a pad_multiple that `world` divides).
std::pair<int64_t, int64_t> zero1_shard(const ParamStore& params, int rank, int world);

/// Pad multiple of the flat parameter buffer for `world` ranks (Model::allocate's pad_multiple):
/// world x 16 elements, so ZeRO-1's shards are equal and start 64-byte aligned.
inline int64_t param_pad_multiple(int world) { return static_cast<int64_t>(world) * 16; }

/// The AdamW of this rank: over all parameters, or with dist.zero1 over the rank's zero1_shard only
/// (moments for the shard alone). The model must have been allocated with param_pad_multiple(world).
/// Shared by the trainer and `llmtrain bench`, so that both run the configured data-parallel mode.
std::unique_ptr<AdamW> make_optimizer(ParamStore& params, const TrainConfig& train, const DistConfig& dist,
                                      const Communicator& comm);

/// Splits windows [batch, seq_len + 1] (window encoding above) into inputs [:, :-1] (token ids) and targets
/// [:, 1:] (token ids, -1 where the entry carries no label).
void split_windows(const int32_t* windows, int64_t batch, int64_t seq_len, std::vector<int32_t>& inputs,
                   std::vector<int32_t>& targets);

}  // namespace llmt
