// The GPU tests' helpers that need no backend: tolerances, Philox inputs, the comparison against the CPU
// reference and the host's bf16 rounding. Shared by cuda_test_util.h (the GPU tests) and the CPU emulator's tests (tests/emu/).
#pragma once
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/rng.h"

namespace llmt::test {

// fp32 on both sides against a reference whose scale is the largest |value|: a float
// rounding is 6e-8 relative, and the longest accumulations here (a few hundred terms,
// summed in different orders) stay well below 1e-5 of the largest output.
constexpr double kTol = 1e-5;
// The GDN and Comba cores with bf16 compute (kernels/cuda/gdn_comba.cu, "Precision") round both operands of
// every tile product, and their scratch W, U/Δ, dW, h, dh, to bf16. bf16 keeps 8 significant bits: <= 2^-8 = 3.9e-3 relative per
// operand, <= 7.8e-3 per term of a product; the terms' errors largely cancel in the sums, while an output
// may pass through three chained products (𝒯 -> W -> Δ -> O; dO -> dΔ -> dW -> dK). A CPU emulation of the
// kernels measured 2e-3 .. 1.2e-2 of each output's largest element on the shapes of cuda_delta_test; 2e-2
// leaves room for that and still fails any indexing or algebra error, which is O(1). The largest element
// must be a typical one: with few tokens (T = 1, B H = 6) every q·k of a tensor can cancel and leave the
// largest |o| or |dv| near its own rounding error (2.3e-2 seen in 200 draws), so the GDN and Comba sweeps
// use B = 8 (at least 24 tokens; 1.1e-2 at most over 42 draws at T = 1).
constexpr double kBf16CoreTol = 2e-2;

// n normal values times `scale` from Philox stream `stream`.
inline std::vector<float> randn(size_t n, uint64_t stream, double scale = 1.0) {
  Philox rng(20240611, stream);
  std::vector<float> x(n);
  for (float& e : x) e = static_cast<float>(scale * rng.normal());
  return x;
}

// n values uniform in [lo, hi) from Philox stream `stream`.
inline std::vector<float> uniform(size_t n, uint64_t stream, double lo, double hi) {
  llmt::Philox rng(20240917, stream);
  std::vector<float> x(n);
  for (float& e : x) {
    e = static_cast<float>(lo + (hi - lo) * rng.uniform());
    if (e >= static_cast<float>(hi)) e = std::nextafter(static_cast<float>(hi), -1.0f);  // keep g < 0
  }
  return x;
}

// Rows of `dim` normalised to length `scale` (the L2-normalised q̂, k̂ the GDN core receives).
inline std::vector<float> unit_rows(size_t n, int64_t dim, uint64_t stream, double scale) {
  std::vector<float> x = randn(n, stream);
  for (size_t r = 0; r < n / static_cast<size_t>(dim); ++r) {
    double ss = 0.0;
    for (int64_t j = 0; j < dim; ++j) ss += static_cast<double>(x[r * dim + j]) * x[r * dim + j];
    const double f = scale / std::sqrt(ss);
    for (int64_t j = 0; j < dim; ++j) x[r * dim + j] = static_cast<float>(x[r * dim + j] * f);
  }
  return x;
}

inline std::vector<float> sigmoid_of(std::vector<float> x) {
  for (float& e : x) e = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(e))));
  return x;
}

/// gpu agrees with cpu: all finite, max|g - c| / max(max|c|, floor) <= tol. `floor` is the
/// scale of the terms that make up the output where the output itself may vanish.
inline void require_close(const std::vector<float>& g, const std::vector<float>& c, const std::string& what,
                          double tol = kTol, double floor = 1e-30) {
  INFO(what);
  REQUIRE(g.size() == c.size());
  size_t non_finite = 0;
  double err = 0.0, mag = 0.0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (!std::isfinite(g[i]) || !std::isfinite(c[i])) ++non_finite;
    err = std::max(err, std::abs(static_cast<double>(g[i]) - c[i]));
    mag = std::max(mag, std::abs(static_cast<double>(c[i])));
  }
  REQUIRE(non_finite == 0);
  INFO("max abs err " << err << ", max |ref| " << mag);
  CHECK(err / std::max(mag, floor) <= tol);
}

// ---- bf16 on the host: the reference rounding, written from the format's definition (the top
// 16 bits of a float, rounded to nearest even), independent of the CUDA intrinsics under test.

/// The bf16 bits of x rounded to nearest even (NaN stays NaN).
inline uint16_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_value(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
/// x with every element rounded to bf16 (as floats).
inline std::vector<float> round_bf16(std::vector<float> x) {
  for (float& e : x) e = bf16_value(bf16_bits(e));
  return x;
}

}  // namespace llmt::test
