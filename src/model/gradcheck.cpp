#include "model/gradcheck.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/rng.h"

namespace llmt {

std::vector<GradCheckReport> finite_difference_check(const std::function<double()>& loss,
                                                     std::vector<GradCheckInput>& inputs, double h, double rel_tol,
                                                     double abs_tol, int64_t max_elements) {
  std::vector<GradCheckReport> reports;
  for (size_t k = 0; k < inputs.size(); ++k) {
    GradCheckInput& in = inputs[k];
    double* x = in.value.as<double>();
    const int64_t n = in.value.numel();
    check(static_cast<int64_t>(in.analytic.size()) == n, "gradcheck {}: {} analytic values for {} elements", in.name,
          in.analytic.size(), n);
    std::vector<int64_t> idx;
    if (n <= max_elements) {
      for (int64_t i = 0; i < n; ++i) idx.push_back(i);
    } else {
      Philox rng(12345, k);
      for (int64_t j = 0; j < max_elements; ++j) idx.push_back(static_cast<int64_t>(rng.below(n)));
    }
    GradCheckReport r{in.name};
    for (int64_t i : idx) {
      const double saved = x[i];
      x[i] = saved + h;
      const double lp = loss();
      x[i] = saved - h;
      const double lm = loss();
      x[i] = saved;
      const double fd = (lp - lm) / (2 * h), an = in.analytic[i];
      const double err = std::fabs(fd - an);
      const double scale = std::max(std::fabs(fd), std::fabs(an));
      r.max_abs_error = std::max(r.max_abs_error, err);
      if (scale > 0) r.max_rel_error = std::max(r.max_rel_error, err / scale);
      if (!(err <= abs_tol + rel_tol * scale)) r.ok = false;  // NaN fails too
      ++r.checked;
    }
    reports.push_back(r);
  }
  return reports;
}

}  // namespace llmt
