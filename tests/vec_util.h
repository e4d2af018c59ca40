// Vector helpers shared by the kernel tests: random inputs, element-type casts, error
// measures and central finite differences over std::vector<double>.
#pragma once
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/rng.h"

namespace llmt::test {

using Vec = std::vector<double>;

/// n standard-normal values from Philox(seed, stream).
inline Vec randn(size_t n, uint64_t stream, uint64_t seed = 20240611) {
  Philox rng(seed, stream);
  Vec x(n);
  for (double& e : x) e = rng.normal();
  return x;
}

template <typename T>
std::vector<T> cast(const Vec& x) {
  return std::vector<T>(x.begin(), x.end());
}

template <typename T>
Vec widen(const std::vector<T>& x) {
  return Vec(x.begin(), x.end());
}

inline double dot(const Vec& a, const Vec& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

inline Vec minus(const Vec& a, const Vec& b) {
  Vec d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

/// max_i |a_i - ref_i| / max_i |ref_i|: the error relative to the size of the reference (the
/// absolute error when the reference is all zeros).
inline double rel_err(const Vec& a, const Vec& ref) {
  REQUIRE(a.size() == ref.size());
  double err = 0.0, mag = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::abs(a[i] - ref[i]));
    mag = std::max(mag, std::abs(ref[i]));
  }
  return mag > 0.0 ? err / mag : err;
}

/// (L(x + h e_i) - L(x - h e_i)) / 2h for every i.
inline Vec fd_grad(const std::function<double(const Vec&)>& loss, Vec x, double h = 1e-5) {
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double xi = x[i];
    x[i] = xi + h;
    const double up = loss(x);
    x[i] = xi - h;
    const double down = loss(x);
    x[i] = xi;
    g[i] = (up - down) / (2.0 * h);
  }
  return g;
}

}  // namespace llmt::test
