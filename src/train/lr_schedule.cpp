#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace llmt {

double learning_rate(const TrainConfig& t, int64_t s) {
  const int64_t W = t.warmup_steps(), N = t.steps();
  const double pi = 3.14159265358979323846;
  if (s < W) return t.lr * static_cast<double>(s + 1) / static_cast<double>(W);
  if (t.lr_formula == "flame") {
    if (s == W) return t.lr;
    const double r = t.min_lr / t.lr;
    const double progress = static_cast<double>(s - W) / static_cast<double>(N - W);
    return t.lr * (r + (1 - r) * 0.5 * (1 + std::cos(pi * progress)));
  }
  const double span = static_cast<double>(std::max<int64_t>(1, N - 1 - W));
  const double progress = std::min(1.0, static_cast<double>(s - W) / span);
  return t.min_lr + (t.lr - t.min_lr) * 0.5 * (1 + std::cos(pi * progress));
}

}  // namespace llmt
