// Learning-rate schedules (runs.md section 1). Steps are 0-based optimizer steps s of N.
#pragma once
#include <cstdint>

#include "model/config.h"

namespace llmt {

/// "flame" (flame/torchtitan, exactly as runs.md section 1), with W warmup steps and
/// r = min_lr / lr:
///   f(s) = (s + 1) / W                                  s < W
///   f(W) = 1
///   f(s) = r + (1 - r) * 0.5 * (1 + cos(pi (s - W) / (N - W)))   s > W
/// so min_lr is approached but not reached on the last step.
/// "standard": the same warmup, then cosine from lr at s = W down to exactly min_lr at
/// s = N - 1:  min_lr + (lr - min_lr) * 0.5 * (1 + cos(pi (s - W) / (N - 1 - W))).
/// Returns the absolute learning rate for step s (0 <= s < N).
double learning_rate(const TrainConfig& train, int64_t step);

}  // namespace llmt
