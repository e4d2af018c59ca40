// Helpers shared by the delta-rule core tests (gdn_test, comba_test, kda_test): tolerances,
// tensor sizes of a DeltaDims, and inputs shaped like the ones the layers feed the cores.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "core/rng.h"
#include "kernels/cpu/gdn.h"
#include "vec_util.h"

namespace llmt::test {

// Chunked and recurrent forms are algebraically equal; in float64 they differ by rounding only.
constexpr double kChunkTol = 1e-10;
// Central differences with h = 1e-6: truncation ~ h^2 |L'''| ~ 1e-12, rounding ~ 1e-16 |L| / h ~ 1e-9
// against O(1) gradients; a wrong term gives an error of order 1.
constexpr double kFdStep = 1e-6;
constexpr double kFdTol = 1e-7;
// float (24-bit mantissa) against double after the cores' few hundred operations per output.
constexpr double kF32Tol = 1e-5;

inline size_t qk_size(const cpu::DeltaDims& d) { return static_cast<size_t>(d.batch * d.seq_len * d.heads * d.key_dim); }
inline size_t v_size(const cpu::DeltaDims& d) { return static_cast<size_t>(d.batch * d.seq_len * d.heads * d.value_dim); }
inline size_t tok_size(const cpu::DeltaDims& d) { return static_cast<size_t>(d.batch * d.seq_len * d.heads); }
inline size_t state_size(const cpu::DeltaDims& d) {
  return static_cast<size_t>(d.batch * d.heads * d.key_dim * d.value_dim);
}

/// Rescales every row of `dim` values of x to Euclidean length `length` (the L2-normalised,
/// possibly scaled q^, k^, p^ the cores receive).
inline void set_row_lengths(Vec& x, int64_t dim, double length) {
  for (size_t row = 0; row < x.size() / static_cast<size_t>(dim); ++row) {
    double ss = 0.0;
    for (int64_t c = 0; c < dim; ++c) ss += x[row * dim + c] * x[row * dim + c];
    for (int64_t c = 0; c < dim; ++c) x[row * dim + c] *= length / std::sqrt(ss);
  }
}

/// n values uniform in [lo, hi) from Philox(seed, stream) (log-decays g).
inline Vec uniform_values(size_t n, double lo, double hi, uint64_t seed, uint64_t stream) {
  Philox rng(seed, stream);
  Vec x(n);
  for (double& e : x) e = lo + (hi - lo) * rng.uniform();
  return x;
}

/// The logistic sigmoid of every element (betas from normal pre-activations).
inline Vec sigmoid_of(Vec x) {
  for (double& e : x) e = 1.0 / (1.0 + std::exp(-e));
  return x;
}

}  // namespace llmt::test
