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
    // the central difference at element i with step s (x restored after)
    const auto central = [&](int64_t i, double s) {
      const double saved = x[i];
      x[i] = saved + s;
      const double lp = loss();
      x[i] = saved - s;
      const double lm = loss();
      x[i] = saved;
      return (lp - lm) / (2 * s);
    };
    GradCheckReport r{in.name};
    for (int64_t i : idx) {
      const double fd = central(i, h), an = in.analytic[i];
      const double err = std::fabs(fd - an);
      const double scale = std::max(std::fabs(fd), std::fabs(an));
      r.max_abs_error = std::max(r.max_abs_error, err);
      if (scale > 0) r.max_rel_error = std::max(r.max_rel_error, err / scale);
      if (!(err <= abs_tol + rel_tol * scale)) {  // NaN fails too
        if (r.ok || err > r.worst_error || std::isnan(err)) r.worst_index = i, r.worst_error = err;
        r.ok = false;
      }
      ++r.checked;
    }
    if (!r.ok)
      r.worst_error_smaller_h = std::fabs(central(r.worst_index, h / std::sqrt(10.0)) - in.analytic[r.worst_index]);
    reports.push_back(r);
  }
  return reports;
}

std::string describe(const GradCheckReport& r) {
  std::string s = fmt::format("{}: max rel err {:.3e}, max abs err {:.3e}", r.name, r.max_rel_error, r.max_abs_error);
  if (r.ok) return s;
  const double ratio = r.worst_error_smaller_h / r.worst_error;
  const char* cause = ratio < 0.2    ? "the error scales as h^2: truncation of a curved loss, try a smaller h"
                      : ratio > 0.5  ? "the error does not shrink with h: a wrong analytic gradient (or rounding noise)"
                                     : "between h^2 and constant: unclear, try a few h";
  return s + fmt::format("; worst failing element {}: error {:.3e} at h, {:.3e} at h / sqrt(10) (ratio {:.2f}: {})",
                         r.worst_index, r.worst_error, r.worst_error_smaller_h, ratio, cause);
}

}  // namespace llmt
