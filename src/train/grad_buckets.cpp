#include "train/grad_buckets.h"

#include <utility>

#include "core/error.h"

namespace llmt {

GradBuckets::GradBuckets(int64_t total, int64_t min_elements, Launch launch)
    : total_(total), min_elements_(min_elements), frontier_(total), top_(total), launch_(std::move(launch)) {
  check(total >= 0 && min_elements > 0, "GradBuckets: {} elements in buckets of at least {}: both must be positive",
        total, min_elements);
}

void GradBuckets::ready(int64_t begin, int64_t end) {
  check(end == frontier_ && 0 <= begin && begin <= end,
        "GradBuckets: gradient range [{}, {}) reported final, but the next range must end at {} (ranges tile [0, {}) "
        "from the end)",
        begin, end, frontier_, total_);
  frontier_ = begin;
  if (top_ - frontier_ >= min_elements_ || (frontier_ == 0 && top_ > 0)) {
    launch_(frontier_, top_);
    top_ = frontier_;
  }
}

void GradBuckets::check_complete() const {
  check(frontier_ == 0, "GradBuckets: the backward reported gradients down to element {} only, not 0", frontier_);
}

}  // namespace llmt
