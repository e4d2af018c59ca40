// The finite-difference checker itself (src/model/gradcheck.h): a right gradient passes, a wrong one fails, and a
// failure's diagnosis tells the O(h²) truncation of a strongly curved loss (error / 10 when h / √10) from a wrong
// analytic gradient (error unchanged).
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "model/gradcheck.h"

using Catch::Matchers::Contains;
using llmt::DType;
using llmt::GradCheckInput;
using llmt::Tensor;

namespace {

// loss(x) = Σ_i sin(w x_i) / w with w = `curvature`: gradient cos(w x_i), third derivative -w² cos(w x_i), so
// the central difference's truncation error is about w² h² / 6 |cos(w x_i)|.
struct SineLoss {
  explicit SineLoss(double curvature) : w(curvature) {}
  std::vector<double> x{0.3, -1.1, 0.7};
  double w;
  double operator()() const {
    double s = 0;
    for (double v : x) s += std::sin(w * v) / w;
    return s;
  }
  std::vector<double> gradient(double error_on_1 = 0) const {
    std::vector<double> g;
    for (double v : x) g.push_back(std::cos(w * v));
    g[1] += error_on_1;
    return g;
  }
};

llmt::GradCheckReport check(SineLoss& f, std::vector<double> analytic, double h) {
  std::vector<GradCheckInput> in{{"x", Tensor(f.x.data(), DType::f64, {3}), std::move(analytic)}};
  const auto reports = llmt::finite_difference_check([&] { return f(); }, in, h);
  REQUIRE(reports.size() == 1);
  return reports[0];
}

}  // namespace

TEST_CASE("gradcheck: a right gradient passes, the values restored", "[gradcheck]") {
  SineLoss f(1.0);
  const std::vector<double> x0 = f.x;
  const auto r = check(f, f.gradient(), 1e-5);
  CHECK(r.ok);
  CHECK(r.checked == 3);
  CHECK(r.worst_index == -1);
  CHECK(f.x == x0);
  CHECK_THAT(llmt::describe(r), !Contains("worst failing"));
}

TEST_CASE("gradcheck: a wrong gradient fails, diagnosed as wrong (the error does not shrink with h)", "[gradcheck]") {
  SineLoss f(1.0);
  const auto r = check(f, f.gradient(1e-3), 1e-5);
  CHECK_FALSE(r.ok);
  CHECK(r.worst_index == 1);
  CHECK(r.worst_error == Approx(1e-3).epsilon(1e-4));
  CHECK(r.worst_error_smaller_h == Approx(1e-3).epsilon(1e-4));
  CHECK_THAT(llmt::describe(r), Contains("worst failing element 1") && Contains("wrong analytic gradient"));
}

TEST_CASE("gradcheck: truncation of a curved loss fails at a large h, diagnosed as h^2; a smaller h passes",
          "[gradcheck]") {
  SineLoss f(1000.0);  // w² h² / 6 = 1.7e-5 at h = 1e-5: far above rel_tol
  const auto r = check(f, f.gradient(), 1e-5);
  CHECK_FALSE(r.ok);
  CHECK(r.worst_error_smaller_h / r.worst_error == Approx(0.1).epsilon(0.05));
  CHECK_THAT(llmt::describe(r), Contains("scales as h^2"));
  CHECK(check(f, f.gradient(), 1e-8).ok);  // w² h² / 6 = 1.7e-11
}
