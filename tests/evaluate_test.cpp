// The evaluation windows of `llmtrain eval` (train/evaluate.h) against hand-computed plans:
// every target position 1 .. N-1 scored exactly once, by the first window that reaches it.
#include <catch2/catch.hpp>

#include <vector>

#include "core/error.h"
#include "train/evaluate.h"

using namespace llmt;
using Catch::Matchers::Contains;

namespace {

using Plan = std::vector<std::vector<int64_t>>;  // {start, first, last} per window

Plan plan(int64_t n, int64_t t, int64_t s, int64_t max_targets) {
  Plan out;
  for (const EvalWindow& w : plan_eval_windows(n, t, s, max_targets)) out.push_back({w.start, w.first, w.last});
  return out;
}

}  // namespace

TEST_CASE("non-overlapping windows are the trainer's, plus a padded tail") {
  // 10 tokens: targets 1..9; windows of 4 at stride 4 start at 0, 4, 8
  CHECK(plan(10, 4, 4, 0) == Plan{{0, 1, 4}, {4, 5, 8}, {8, 9, 9}});
  // 9 tokens: exactly two full windows
  CHECK(plan(9, 4, 4, 0) == Plan{{0, 1, 4}, {4, 5, 8}});
  // max_targets = 5 (the trainer's eval.tokens): the second window scores only position 5
  CHECK(plan(10, 4, 4, 5) == Plan{{0, 1, 4}, {4, 5, 5}});
}

TEST_CASE("sliding windows score only the targets not scored before") {
  // stride 2: each later window adds the 2 positions past the previous window's end
  CHECK(plan(10, 4, 2, 0) == Plan{{0, 1, 4}, {2, 5, 6}, {4, 7, 8}, {6, 9, 9}});
  // stride 1: one new position per window, each with 3 tokens of context before it
  CHECK(plan(7, 4, 1, 0) == Plan{{0, 1, 4}, {1, 5, 5}, {2, 6, 6}});
  // fewer tokens than one window
  CHECK(plan(3, 4, 1, 0) == Plan{{0, 1, 2}});
  CHECK(plan(1, 4, 1, 0).empty());
}

TEST_CASE("bad strides and lengths are errors naming them") {
  CHECK_THROWS_WITH(plan_eval_windows(10, 4, 5, 0), Contains("stride must be in [1, seq_len = 4], got 5"));
  CHECK_THROWS_WITH(plan_eval_windows(10, 4, 0, 0), Contains("got 0"));
  CHECK_THROWS_WITH(plan_eval_windows(10, 0, 1, 0), Contains("seq_len must be positive"));
}

TEST_CASE("totals: mean loss, perplexity and bits per byte") {
  EvalTotals t;
  t.targets = 4;
  t.loss_sum = 8.0;
  t.bytes = 16;
  CHECK(t.loss() == 2.0);
  CHECK(t.perplexity() == Approx(7.38905609893065));                      // e^2
  CHECK(t.bits_per_byte() == Approx(0.7213475204444817).epsilon(1e-12));  // 8 / (16 ln 2)
}
