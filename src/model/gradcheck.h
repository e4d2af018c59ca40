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
};

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
