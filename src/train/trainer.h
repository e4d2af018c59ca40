// The training loop (runs.md section 1; docs/ARCHITECTURE.md "Training loop and state"): per optimizer step,
// grad_accum micro-batches of forward + backward, the global gradient norm, skip on a
// non-finite norm, clipping, AdamW with the scheduled LR, metrics, evaluation and
// checkpoints at their intervals.
//
// Data parallel (issue 8, docs/DISTRIBUTED.md): with a communicator of W ranks, train.batch_tokens
// stays the global batch; rank r reads its slice of every global micro-batch of the window order
// (the loader position, saved in checkpoints, is global, so a run resumes on any W), gradients are
// summed over the ranks by the StepRunner (with dist.zero1 each rank's AdamW holds the moments of
// its shard only; they are gathered for a checkpoint), and only rank 0 writes config.json, metrics
// and checkpoints (the others wait at a barrier after each checkpoint).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "data/dataset_loader.h"
#include "data/loader.h"
#include "data/shard.h"
#include "data/synthetic_source.h"
#include "dist/communicator.h"
#include "kernels/backend.h"
#include "model/config.h"
#include "model/model.h"
#include "train/checkpoint.h"
#include "train/metrics.h"
#include "train/optimizer.h"
#include "train/step.h"

namespace llmt {

class Trainer {
 public:
  /// Prepares data (tokenizing data.text once), builds the model and optimizer, and either
  /// initialises from config.train.seed or, when `resume` is set and run_dir has a
  /// checkpoint, restores the newest one. Writes run_dir/config.json. Every rank of `comm`
  /// constructs its Trainer with the same arguments (run_dir on a file system all ranks see).
  /// Throws llmt::Error before preparing any data when run_dir holds a checkpoint and `resume`
  /// is false, or when the newest checkpoint's config is not this run's (check_resume_config).
  Trainer(const Config& config, const std::string& run_dir, bool resume,
          Communicator& comm = single_process_communicator());
  ~Trainer();

  /// How run() ended.
  enum class RunEnd { finished, preempted };

  /// Trains to the configured number of steps or, when stop_at_step > 0, until that step
  /// (then writes a checkpoint there, as a clean stop that a resume continues from). When a
  /// preemption signal (SIGTERM, SIGUSR1 or SIGINT: train/preempt.h) has arrived it finishes the
  /// current step, writes a checkpoint and returns RunEnd::preempted.
  RunEnd run(int64_t stop_at_step = -1);

  /// The evaluation metrics (a collective call). Token streams: {"val_loss": mean loss over the first
  /// eval.tokens / seq_len windows of the validation shard, the micro-batches shared out among the ranks}.
  /// Synthetic tasks: evaluate_synthetic's record (val_loss, accuracies, per-point results).
  nlohmann::json evaluate();

  const TrainState& state() const { return state_; }

 private:

  Config config_;
  std::string run_dir_;
  Communicator& comm_;
  bool lead_;  // rank 0: the one that logs and writes files
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<ShardReader> train_shard_, val_shard_;
  std::unique_ptr<WindowLoader> loader_, val_loader_;          // data.text or data.*_shard
  std::unique_ptr<DatasetLoader> dataset_, val_dataset_;        // data.dataset
  std::unique_ptr<SyntheticSource> synthetic_;                  // data.source mqar | parity | modarith
  std::unique_ptr<Model> model_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<StepRunner> step_;
  std::unique_ptr<MetricsLog> metrics_;  // rank 0 only
  TrainState state_;
  std::vector<int32_t> windows_, inputs_, targets_;  // host staging of one evaluation micro-batch

  double evaluate_tokens();
  void next_windows(int32_t* out);   // this rank's next training micro-batch from the configured source
  LoaderState loader_state() const;
};

}  // namespace llmt
