// Synthetic tasks as a window source (synthetic_source.h).
#include "data/synthetic_source.h"

#include <algorithm>

#include "core/error.h"
#include "core/rng.h"

namespace llmt {
namespace {

// Philox stream of an example: bits 8.. the example index, bits 1..7 the set (a training point or an
// evaluation set; 127 = the draw of a training length), bit 0 the split (1 = evaluation).
constexpr uint64_t kLengthSet = 127;
uint64_t stream_of(uint64_t index, uint64_t set, bool eval) { return (index << 8) | (set << 1) | (eval ? 1 : 0); }

}  // namespace

SyntheticSource::SyntheticSource(const std::string& task, const SyntheticConfig& config, uint64_t seed,
                                 int64_t seq_len)
    : task_(task), config_(config), seed_(seed), seq_len_(seq_len) {
  check(task == "mqar" || task == "parity" || task == "modarith", "synthetic: unknown task {}", task);
  const auto fits = [&](int64_t tokens, const char* key) {
    check(tokens <= seq_len + 1, "synthetic: data.synthetic.{} gives {}-token training examples, longer than a window "
          "of train.seq_len + 1 = {}", key, tokens, seq_len + 1);
  };
  if (task == "mqar") {
    check(config.train_points.size() < kLengthSet && config.eval_points.size() < kLengthSet,
          "synthetic: at most {} MQAR points per list", kLengthSet - 1);
    for (const auto& [len, pairs] : config.train_points) fits(len, "train_points");
    for (const auto& [len, pairs] : config.eval_points)
      eval_sets_.push_back({fmt::format("L{}_kv{}", len, pairs), len, pairs, len, config.eval_examples});
  } else {
    fits(config.max_length + 2, "max_length");
    check(config.eval_lengths.size() < kLengthSet, "synthetic: at most {} evaluation lengths", kLengthSet - 1);
    for (int64_t len : config.eval_lengths) {
      // A flat modarith expression has odd length (an even one is lowered by one).
      const int64_t used = task == "modarith" && !config.brackets && len % 2 == 0 ? len - 1 : len;
      eval_sets_.push_back({fmt::format("L{}", len), len, 0, used + 2, config.eval_examples});
    }
  }
}

int64_t SyntheticSource::answer_classes() const {
  if (task_ == "parity") return 2;
  if (task_ == "modarith") return synth::kModulus;
  return 0;
}

SyntheticExample SyntheticSource::make(size_t set, bool eval, int64_t length, int64_t pairs, uint64_t index) const {
  const uint64_t stream = stream_of(index, set, eval);
  if (task_ == "mqar") return make_mqar(seed_, stream, length, pairs, config_.vocab, config_.power_a);
  if (task_ == "parity") return make_parity(seed_, stream, length);
  return make_modarith(seed_, stream, length, config_.brackets);
}

SyntheticExample SyntheticSource::train_example(uint64_t i) const {
  if (task_ == "mqar") {
    const size_t p = static_cast<size_t>(i % config_.train_points.size());
    return make(p, false, config_.train_points[p][0], config_.train_points[p][1], i);
  }
  Philox rng(seed_, stream_of(i, kLengthSet, false));
  const int64_t longest = longest_train_length(i);
  const int64_t length =
      config_.min_length + static_cast<int64_t>(rng.below(static_cast<uint64_t>(longest - config_.min_length + 1)));
  return make(0, false, length, 0, i);
}

int64_t SyntheticSource::longest_train_length(uint64_t i) const {
  if (task_ == "mqar" || (config_.curriculum_tokens <= 0 && config_.curriculum_hold_tokens <= 0))
    return config_.max_length;
  const int64_t start = std::max(config_.curriculum_start_length, config_.min_length);
  // Example i starts after i windows of seq_len tokens (long double: no overflow, exact at these sizes).
  const long double ramp = static_cast<long double>(static_cast<long double>(i) * seq_len_ - config_.curriculum_hold_tokens);
  if (ramp < 0) return start;
  if (ramp >= static_cast<long double>(config_.curriculum_tokens)) return config_.max_length;
  return start + static_cast<int64_t>(static_cast<long double>(config_.max_length - start) * ramp /
                                      static_cast<long double>(config_.curriculum_tokens));
}

SyntheticExample SyntheticSource::eval_example(size_t set, int64_t j) const {
  const SyntheticEvalSet& s = eval_sets_.at(set);
  check(j >= 0 && j < s.examples, "synthetic: example {} of evaluation set {} is outside [0, {})", j, s.name,
        s.examples);
  return make(set, true, s.length, s.pairs, static_cast<uint64_t>(j));
}

void SyntheticSource::to_window(const SyntheticExample& ex, int64_t window, int32_t* out) {
  const auto n = static_cast<int64_t>(ex.tokens.size());
  check(n <= window, "synthetic: an example of {} tokens does not fit a window of {}", n, window);
  for (int64_t p = 0; p < n; ++p) out[p] = -(ex.tokens[static_cast<size_t>(p)] + 1);
  for (int64_t a : ex.answers) out[a] = ex.tokens[static_cast<size_t>(a)];
  std::fill(out + n, out + window, -1);
}

void SyntheticSource::next(int64_t batch, int rank, int world, int32_t* out) {
  check(batch >= 0 && world > 0 && rank >= 0 && rank < world,
        "synthetic: need batch >= 0 and 0 <= rank < world, got batch {}, rank {}, world {}", batch, rank, world);
  const uint64_t first = state_.index + static_cast<uint64_t>(batch) * static_cast<uint64_t>(rank);
  for (int64_t k = 0; k < batch; ++k)
    to_window(train_example(first + static_cast<uint64_t>(k)), seq_len_ + 1, out + k * (seq_len_ + 1));
  state_.index += static_cast<uint64_t>(batch) * static_cast<uint64_t>(world);
}

}  // namespace llmt
