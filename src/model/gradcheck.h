// Central finite-difference gradient checks in float64 on the CPU backend (the project's
// standard for every hand-written backward: docs/ARCHITECTURE.md "Verification").
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace llmt {

/// One differentiable input: its f64 values in host memory (perturbed in place, then
/// restored) and the analytic gradient of the loss with respect to it (same size).
struct GradCheckInput {
  std::string name;
  Tensor value;
  std::vector<double> analytic;
};

struct GradCheckReport {
  std::string name;
  int64_t checked = 0;
  double max_abs_error = 0;
  double max_rel_error = 0;  ///< |fd - analytic| / max(|fd|, |analytic|)
  bool ok = true;
  /// (failed only) The failing element with the largest error, and |fd - analytic| there at h and at h / √10.
  /// Their ratio tells the causes apart: ~0.1 is the O(h²) truncation of a strongly curved loss (a smaller h
  /// passes), ~1 an analytic gradient that is wrong (or, for a tiny h, rounding noise: eps |loss| / h).
  int64_t worst_index = -1;
  double worst_error = 0, worst_error_smaller_h = 0;
};

/// One line for a report: "name: max rel err .., max abs err ..", and for a failed one the worst element's errors at
/// h and h / √10 with what their ratio suggests (truncation or a wrong gradient).
std::string describe(const GradCheckReport& r);

/// For each input, checks up to `max_elements` elements (all when the tensor is smaller;
/// otherwise a seeded random subset): fd = (loss(x + h) - loss(x - h)) / (2h). An element
/// passes when |fd - analytic| <= abs_tol + rel_tol * max(|fd|, |analytic|).
/// abs_tol covers the rounding noise of the difference quotient, about eps * |loss| / h
/// (5e-10 for a loss of 24 and h = 1e-5): choose it a decade or two above that.
std::vector<GradCheckReport> finite_difference_check(const std::function<double()>& loss,
                                                     std::vector<GradCheckInput>& inputs, double h = 1e-5,
                                                     double rel_tol = 1e-6, double abs_tol = 1e-8,
                                                     int64_t max_elements = 64);

}  // namespace llmt
