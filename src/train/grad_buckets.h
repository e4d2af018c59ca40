// Gradient buckets of the data-parallel reduction (issue 8, docs/DISTRIBUTED.md "Overlap"):
// Model::backward reports flat gradient ranges as they become final, from the end of the flat
// buffer towards its start (Model::GradReadyHook); GradBuckets joins consecutive ranges into
// buckets of at least `min_elements` elements, so that bucket edges fall on block edges, and hands
// each bucket to `launch` as soon as its last range has arrived (the last bucket, ending at element
// 0, may be smaller). The buckets depend only on the model and min_elements, so every rank launches
// the same sequence.
#pragma once
#include <cstdint>
#include <functional>

namespace llmt {

class GradBuckets {
 public:
  /// launch(begin, end): the flat range [begin, end) of a complete bucket.
  using Launch = std::function<void(int64_t begin, int64_t end)>;
  /// `total`: elements of the flat gradient; `min_elements` > 0. Throws llmt::Error otherwise.
  GradBuckets(int64_t total, int64_t min_elements, Launch launch);
  /// The gradients of [begin, end) are final. The ranges must tile [0, total) downwards: the first
  /// ends at total, each next one ends where the previous began. Throws llmt::Error naming the
  /// range otherwise (a model whose backward does not report its parameters in layout order).
  void ready(int64_t begin, int64_t end);
  /// Throws llmt::Error unless the ranges reached element 0 (every bucket was launched).
  void check_complete() const;

 private:
  int64_t total_, min_elements_;
  int64_t frontier_;  // lowest begin reported so far
  int64_t top_;       // end of the bucket being filled: [frontier_, top_) is final but not launched
  Launch launch_;
};

}  // namespace llmt
