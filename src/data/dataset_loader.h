// The multi-shard, multi-rank training loader over a prepare-data directory (issue 3, point 4).
//
// Windows: each shard of the stream (train or val, as listed in DIR/dataset.json) is cut into
// (seq_len + 1)-token windows at stride seq_len (llm.c style: consecutive windows share one
// token; a window never crosses a shard). Window ids are global: shard 0's windows first, then
// shard 1's, ... (N windows in all).
//
// Order: epoch e visits all N windows in the order perm_e(0), perm_e(1), ..., where perm_e is a
// bijection of [0, N) keyed by (seed, e) alone (a 4-round Feistel network with cycle walking:
// O(1) memory for any N), or the identity when shuffle is off. The order therefore does not
// depend on the number of ranks.
//
// Ranks: a global step takes the next world * batch windows of that order; rank r of `world`
// reads positions [r * batch, (r + 1) * batch) of it. The position in the global order
// (LoaderState: epoch, index) is the same on every rank and is what checkpoints save, so a run
// resumed on a different number of ranks (same global batch) continues the same stream without
// repeating or skipping a window.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/loader.h"
#include "data/shard.h"

namespace llmt {

/// A keyed bijection of [0, n): a balanced Feistel network on the smallest even-bit-width
/// domain >= n, cycle-walked back into [0, n). Deterministic in (n, seed, epoch).
class IndexPermutation {
 public:
  IndexPermutation(uint64_t n, uint64_t seed, uint64_t epoch);
  uint64_t operator()(uint64_t i) const;
  uint64_t size() const { return n_; }

 private:
  uint64_t encrypt(uint64_t x) const;
  uint64_t n_;
  int half_bits_;
  uint64_t keys_[4];
};

class DatasetLoader {
 public:
  /// Opens the shards that `dir`/dataset.json lists for `stream` ("train" or "val") and
  /// memory-maps them. Throws llmt::Error naming the file and what is wrong: a missing or
  /// malformed dataset.json (naming the key), a tokenizer other than `expected_tokenizer`
  /// (when non-empty; compared with tokenizer.name, and the aliases llama3 / llama3.1 are
  /// equal), a shard whose header token count differs from dataset.json's, and (from
  /// ShardReader) a missing, truncated or corrupt shard, wrong magic or version. Throws when the
  /// stream has no window of seq_len + 1 tokens, saying what to change (an empty val stream:
  /// prepare-data's --val-fraction or data.text; else train.seq_len or more data).
  DatasetLoader(const std::string& dir, const std::string& stream, int64_t seq_len, uint64_t seed, bool shuffle,
                const std::string& expected_tokenizer = "");

  int64_t num_windows() const { return total_windows_; }
  int64_t seq_len() const { return seq_len_; }
  int64_t num_tokens() const { return total_tokens_; }

  /// Rank `rank` of `world`: fills out[batch, seq_len + 1] (int32) with its slice of the next
  /// global batch of world * batch windows, then advances the global position by world * batch
  /// (crossing into the next epoch's order when an epoch ends).
  void next(int64_t batch, int rank, int world, int32_t* out);

  /// The global window id at position `index` of epoch `epoch`'s order.
  int64_t window_at(uint64_t epoch, uint64_t index) const;
  /// Copies window w (global id) to out[seq_len + 1].
  void window(int64_t w, int32_t* out) const;

  size_t num_shards() const { return shards_.size(); }
  /// Shard i of the stream, in dataset.json order (for evaluation over whole shards).
  const ShardReader& shard(size_t i) const { return *shards_.at(i); }

  LoaderState state() const { return state_; }
  /// Restores a saved global position; throws when index > num_windows().
  void set_state(const LoaderState& s);

 private:
  std::string dir_;
  int64_t seq_len_;
  uint64_t seed_;
  bool shuffle_;
  std::vector<std::unique_ptr<ShardReader>> shards_;
  std::vector<int64_t> first_window_;  // global id of each shard's first window; back() = N
  int64_t total_windows_ = 0, total_tokens_ = 0;
  LoaderState state_;
  std::unique_ptr<IndexPermutation> perm_;  // of state_.epoch
};

}  // namespace llmt
