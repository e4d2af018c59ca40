// The training-window loader: (seq_len + 1)-token windows cut from one shard at stride
// seq_len (consecutive windows share one token, llm.c style), visited in a seeded random
// order per epoch. Its position is two integers, saved in every checkpoint.
#pragma once
#include <cstdint>
#include <vector>

#include "data/shard.h"

namespace llmt {

/// Where the loader stands: `epoch` (0-based) and `index`, the number of windows of that
/// epoch's permutation already handed out.
struct LoaderState {
  uint64_t epoch = 0;
  uint64_t index = 0;
};

class WindowLoader {
 public:
  /// Window w covers tokens [w * seq_len, w * seq_len + seq_len + 1). num_windows =
  /// (shard.size() - 1) / seq_len; throws llmt::Error naming the shard when it is 0.
  /// Epoch e visits windows in the Fisher-Yates permutation drawn from Philox(seed, e)
  /// (identity order when shuffle is false). The shard must outlive the loader.
  WindowLoader(const ShardReader& shard, int64_t seq_len, uint64_t seed, bool shuffle);

  int64_t num_windows() const { return num_windows_; }
  int64_t seq_len() const { return seq_len_; }

  /// Fills out[batch, seq_len + 1] (int32) with the next `batch` windows and advances;
  /// crossing the end of an epoch continues with the next epoch's permutation.
  void next(int64_t batch, int32_t* out) { next(batch, 0, 1, out); }
  /// Rank `rank` of `world` (data parallel, as DatasetLoader::next): fills out[batch, seq_len + 1]
  /// with positions [rank * batch, (rank + 1) * batch) of the next world * batch windows of the
  /// order, then advances the position (the same on every rank) by world * batch.
  void next(int64_t batch, int rank, int world, int32_t* out);

  /// Copies window w (in shard order, no permutation) to out[seq_len + 1]; for evaluation.
  void window(int64_t w, int32_t* out) const;

  LoaderState state() const { return state_; }
  /// Restores a saved position (the permutation is recomputed from the seed and epoch).
  void set_state(const LoaderState& s);

 private:
  void build_permutation();
  const ShardReader& shard_;
  int64_t seq_len_;
  uint64_t seed_;
  bool shuffle_;
  int64_t num_windows_;
  LoaderState state_;
  std::vector<int64_t> order_;
};

}  // namespace llmt
