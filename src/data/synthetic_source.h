// A synthetic task as the trainer's data source (data.source mqar | parity | modarith; docs/SYNTHETIC.md).
//
// Windows: one example per window of seq_len + 1 entries in the window encoding of train/step.h (an entry
// >= 0 is a token that is labelled when it is a target, -(id + 1) is token id without a label): only the
// answers are labelled; the example starts the window and unlabelled token-0 padding fills the rest (a causal
// model never sees the padding from a labelled position).
//
// Training example i (i = 0, 1, ... over the whole run, all ranks together) is a pure function of (seed, i):
// MQAR cycles through data.synthetic.train_points (point i mod P), parity / modarith draw the length uniformly
// from [min_length, max_length] (or, with the length curriculum, [min_length, longest_train_length(i)]). The position (LoaderState.index = examples handed out) is what checkpoints
// save. Evaluation sets are a separate stream: example j of set s depends on (seed, s, j) only.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/loader.h"
#include "data/synthetic_tasks.h"
#include "model/config.h"

namespace llmt {

/// One evaluation point: `examples` examples of `tokens` tokens each.
struct SyntheticEvalSet {
  std::string name;    ///< e.g. "L512_kv32" (mqar) or "L256" (parity, modarith)
  int64_t length = 0;  ///< sequence length (mqar) or expression length
  int64_t pairs = 0;   ///< key-value pairs (mqar), else 0
  int64_t tokens = 0;  ///< tokens per example
  int64_t examples = 0;
};

class SyntheticSource {
 public:
  /// task: "mqar", "parity" or "modarith". Throws llmt::Error when a training example cannot fit a window of
  /// seq_len + 1 tokens or an MQAR point is invalid (naming the data.synthetic key).
  SyntheticSource(const std::string& task, const SyntheticConfig& config, uint64_t seed, int64_t seq_len);

  /// Rank `rank` of `world`: fills out[batch, seq_len + 1] with training examples index + rank * batch + k,
  /// k < batch, then advances the position by world * batch (as DatasetLoader::next).
  void next(int64_t batch, int rank, int world, int32_t* out);
  LoaderState state() const { return state_; }
  void set_state(const LoaderState& s) { state_ = s; }

  SyntheticExample train_example(uint64_t i) const;
  /// The longest length training example i may draw (parity / modarith): max_length, or with the length
  /// curriculum (data.synthetic.curriculum_tokens or curriculum_hold_tokens > 0), with u = i * seq_len - hold
  /// tokens: curriculum_start_length while u < 0, then curriculum_start_length + (max_length -
  /// curriculum_start_length) * min(1, u / curriculum_tokens), rounded down. mqar: max_length (unused).
  int64_t longest_train_length(uint64_t i) const;
  const std::vector<SyntheticEvalSet>& eval_sets() const { return eval_sets_; }
  SyntheticExample eval_example(size_t set, int64_t j) const;
  /// Classes of the single answer (parity 2, modarith 5) for the scaled accuracy; 0 for mqar (not scaled).
  int64_t answer_classes() const;
  const std::string& task() const { return task_; }

  /// Writes `ex` into out[window] in the window encoding, padded with -1 (token 0, no label).
  /// Throws llmt::Error when the example is longer than the window.
  static void to_window(const SyntheticExample& ex, int64_t window, int32_t* out);

 private:
  SyntheticExample make(size_t set, bool eval, int64_t length, int64_t pairs, uint64_t index) const;
  std::string task_;
  SyntheticConfig config_;
  uint64_t seed_;
  int64_t seq_len_;
  LoaderState state_;
  std::vector<SyntheticEvalSet> eval_sets_;
};

}  // namespace llmt
