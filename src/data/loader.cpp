#include "data/loader.h"

#include <numeric>
#include <utility>

#include "core/error.h"
#include "core/rng.h"

namespace llmt {

WindowLoader::WindowLoader(const ShardReader& shard, int64_t seq_len, uint64_t seed, bool shuffle)
    : shard_(shard), seq_len_(seq_len), seed_(seed), shuffle_(shuffle), num_windows_(0) {
  check(seq_len > 0, "loader: seq_len must be positive, got {}", seq_len);
  num_windows_ = shard.size() > 1 ? (shard.size() - 1) / seq_len : 0;
  check(num_windows_ > 0, "loader: shard {} has {} tokens, fewer than one window of seq_len + 1 = {}", shard.path(),
        shard.size(), seq_len + 1);
  build_permutation();
}

void WindowLoader::build_permutation() {
  order_.resize(static_cast<size_t>(num_windows_));
  std::iota(order_.begin(), order_.end(), int64_t{0});
  if (!shuffle_) return;
  Philox rng(seed_, state_.epoch);
  for (int64_t i = num_windows_ - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i) + 1));
    std::swap(order_[i], order_[j]);
  }
}

void WindowLoader::next(int64_t batch, int rank, int world, int32_t* out) {
  check(batch >= 0 && world > 0 && rank >= 0 && rank < world,
        "loader: need batch >= 0 and 0 <= rank < world, got batch {}, rank {}, world {}", batch, rank, world);
  for (int64_t k = 0; k < batch * world; ++k) {
    if (state_.index == static_cast<uint64_t>(num_windows_)) {
      ++state_.epoch;
      state_.index = 0;
      build_permutation();
    }
    const int64_t w = order_[state_.index++];
    const int64_t b = k - rank * batch;  // row of this rank's slice
    if (b >= 0 && b < batch) window(w, out + b * (seq_len_ + 1));
  }
}

void WindowLoader::window(int64_t w, int32_t* out) const {
  check(w >= 0 && w < num_windows_, "loader: window {} of shard {} is outside [0, {})", w, shard_.path(),
        num_windows_);
  shard_.read(w * seq_len_, seq_len_ + 1, out);
}

void WindowLoader::set_state(const LoaderState& s) {
  check(s.index <= static_cast<uint64_t>(num_windows_),
        "loader: saved index {} exceeds the {} windows of shard {} (epoch {})", s.index, num_windows_, shard_.path(),
        s.epoch);
  state_ = s;
  build_permutation();
}

}  // namespace llmt
