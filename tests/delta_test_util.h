// Helpers shared by the delta-rule core tests (gdn_test, comba_test, kda_test, mdn_test): tolerances,
// tensor sizes of a DeltaDims, inputs shaped like the ones the layers feed the cores, and the checks
// every core gets (layers-delta.md §6): chunked vs. recurrent in float64, finite differences, float vs.
// double, and the [B, T, H, *] layout. A test describes its core by lambdas: fwd(chunk) -> Out and
// bwd(d_o, d_state, chunk) -> Grads, with chunk 0 selecting the recurrent form.
#pragma once
#include <cmath>
#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

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

/// Central differences (step kFdStep) of loss() w.r.t. every element of x, an array that loss() reads:
/// x[i] is moved by ±kFdStep in place and restored.
template <class Loss>
Vec fd_in_place(Vec& x, Loss loss) {
  Vec grad(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double xi = x[i];
    x[i] = xi + kFdStep;
    const double up = loss();
    x[i] = xi - kFdStep;
    const double down = loss();
    x[i] = xi;
    grad[i] = (up - down) / (2.0 * kFdStep);
  }
  return grad;
}

// The harness of the single-state cores (gdn, comba, kda); mdn_test, with its second state, keeps its own
// Out / Grads and uses only the layout helpers.
namespace delta_core {

/// Outputs of one forward call, widened to double: o [B, T, H, V] and the final state [B, H, K, V].
struct Out {
  Vec o, state;
};

/// The gradients of one backward call, widened to double, in the order of the core's Grads struct.
using Grads = std::vector<Vec>;

/// Typed copies of a problem's input arrays, in the order of the core's Inputs struct; ptr(i) is
/// nullptr for an empty array (an absent initial state).
template <typename T>
struct TypedArrays {
  std::vector<std::vector<T>> a;
  TypedArrays(std::initializer_list<const Vec*> xs) {
    for (const Vec* x : xs) a.push_back(cast<T>(*x));
  }
  const T* ptr(size_t i) const { return a[i].empty() ? nullptr : a[i].data(); }
};

/// Gradient buffers of element type T, buffer i filled with randn(size_i, stream_i): the cores must
/// overwrite every value. widened() returns them as Grads.
template <typename T>
struct GradBuffers {
  std::vector<std::vector<T>> b;
  GradBuffers(std::initializer_list<std::pair<size_t, uint64_t>> shapes) {
    for (const auto& [n, stream] : shapes) b.push_back(cast<T>(randn(n, stream)));
  }
  T* operator[](size_t i) { return b[i].data(); }
  Grads widened() const {
    Grads g;
    for (const auto& x : b) g.push_back(widen(x));
    return g;
  }
};

/// One forward call of a single-state core on typed inputs: chunk 0 calls rec(in, d, o, S_T), any other
/// chunk chunked(in, d, o, S_T, chunk) (e.g. gdn_recurrent_fwd<T>, gdn_chunk_fwd<T>).
template <typename T, class Inputs, class Rec, class Chunked>
Out run_forward(const Inputs& in, const cpu::DeltaDims& d, int64_t chunk, Rec rec, Chunked chunked) {
  std::vector<T> o(v_size(d)), s(state_size(d));
  if (chunk == 0)
    rec(in, d, o.data(), s.data());
  else
    chunked(in, d, o.data(), s.data(), chunk);
  return {widen(o), widen(s)};
}

/// One backward call of a single-state core into the typed gradient views out: chunk 0 calls
/// rec(in, d_o, d_state, d, out), any other chunked(..., chunk); d_state empty passes nullptr (zero dL/dS_T).
template <typename T, class Inputs, class GradViews, class Rec, class Chunked>
void run_backward(const Inputs& in, const Vec& d_o, const Vec& d_state, const cpu::DeltaDims& d, int64_t chunk,
                  const GradViews& out, Rec rec, Chunked chunked) {
  const auto dout = cast<T>(d_o), dst = cast<T>(d_state);
  const T* dst_ptr = d_state.empty() ? nullptr : dst.data();
  if (chunk == 0)
    rec(in, dout.data(), dst_ptr, d, out);
  else
    chunked(in, dout.data(), dst_ptr, d, out, chunk);
}

/// CHECKs rel_err(a[i], ref[i]) < tol for every gradient i; returns the largest error (for reporting).
inline double check_grads_close(const Grads& a, const Grads& ref, double tol) {
  REQUIRE(a.size() == ref.size());
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("gradient " << i);
    const double e = rel_err(a[i], ref[i]);
    CHECK(e < tol);
    worst = std::max(worst, e);
  }
  return worst;
}

/// Central differences (step kFdStep) of L = o·R + S_T·R_S w.r.t. every element of x, an input array of
/// the problem that fwd() (the recurrent forward, -> Out) reads.
template <class Fwd>
Vec fd_loss_grad(Vec& x, Fwd fwd, const Vec& R, const Vec& RS) {
  return fd_in_place(x, [&] {
    const Out out = fwd();
    return dot(out.o, R) + dot(out.state, RS);
  });
}

/// The finite-difference check: the recurrent (chunk 0) and chunked (chunk 4) backward of
/// L = o·R + S_T·R_S (R, R_S random, streams 401, 402) against central differences of the recurrent
/// forward w.r.t. each array in inputs (in the order of Grads). fwd(chunk) -> Out and
/// bwd(d_o, d_state, chunk) -> Grads read the arrays. Returns the worst errors {recurrent, chunked}.
template <class Fwd, class Bwd>
std::pair<double, double> check_fd(const cpu::DeltaDims& d, std::initializer_list<Vec*> inputs, Fwd fwd, Bwd bwd) {
  const Vec R = randn(v_size(d), 401), RS = randn(state_size(d), 402);
  const Grads ga = bwd(R, RS, 0), gc = bwd(R, RS, 4);
  Grads num;
  for (Vec* x : inputs) num.push_back(fd_loss_grad(*x, [&] { return fwd(0); }, R, RS));
  return {check_grads_close(ga, num, kFdTol), check_grads_close(gc, num, kFdTol)};
}

/// A hand-computed case: o and the final state equal o_ref, s_ref to 1e-15.
inline void check_out_matches(const Out& f, const Vec& o_ref, const Vec& s_ref) {
  REQUIRE(f.o.size() == o_ref.size());
  REQUIRE(f.state.size() == s_ref.size());
  for (size_t i = 0; i < o_ref.size(); ++i) CHECK(f.o[i] == Approx(o_ref[i]).margin(1e-15));
  for (size_t i = 0; i < s_ref.size(); ++i) CHECK(f.state[i] == Approx(s_ref[i]).margin(1e-15));
}

/// Runs f(T, chunk, with_state, g_min) over the grid of the chunked-vs-recurrent tests: T in {1, 63, 64,
/// 65, 200} (partial, exact and multiple chunks), chunk in {16, 64}, with and without an initial state,
/// g_min in {-0.05, -5.0} (weak and strong decay).
template <class F>
void for_each_chunk_case(F f) {
  for (int64_t T : {1, 63, 64, 65, 200})
    for (int64_t chunk : {16, 64})
      for (bool with_state : {false, true})
        for (double g_min : {-0.05, -5.0}) {
          INFO("T " << T << " chunk " << chunk << " initial state " << with_state << " g_min " << g_min);
          f(T, chunk, with_state, g_min);
        }
}

/// Chunked forward (chunk) against the recurrent one (0), o and S_T within kChunkTol; returns the larger error.
template <class Fwd>
double check_chunk_fwd(Fwd fwd, int64_t chunk) {
  const Out ref = fwd(0), chk = fwd(chunk);
  const double eo = rel_err(chk.o, ref.o), es = rel_err(chk.state, ref.state);
  CHECK(eo < kChunkTol);
  CHECK(es < kChunkTol);
  return std::max(eo, es);
}

/// Chunked backward against the recurrent one within kChunkTol, for random dL/do (stream 200 + T) with
/// random dL/dS_T (stream 300 + T) and without it; returns the largest error.
template <class Bwd>
double check_chunk_bwd(Bwd bwd, const cpu::DeltaDims& d, int64_t chunk) {
  const Vec d_o = randn(v_size(d), 200 + d.seq_len), d_state = randn(state_size(d), 300 + d.seq_len);
  const double e = check_grads_close(bwd(d_o, d_state, chunk), bwd(d_o, d_state, 0), kChunkTol);
  return std::max(e, check_grads_close(bwd(d_o, Vec(), chunk), bwd(d_o, Vec(), 0), kChunkTol));
}

/// float against double (kF32Tol) for the recurrent (chunk 0) and chunked (16) forward and backward.
/// fwd(x, chunk) and bwd(x, d_o, d_state, chunk) take the element type from x (0.0f or 0.0).
/// Returns the largest error.
template <class Fwd, class Bwd>
double check_float_vs_double(const cpu::DeltaDims& d, Fwd fwd, Bwd bwd) {
  const Vec d_o = randn(v_size(d), 501), d_state = randn(state_size(d), 502);
  double worst = 0.0;
  for (int64_t chunk : {0, 16}) {
    INFO("chunk " << chunk);
    const Out fd = fwd(0.0, chunk), ff = fwd(0.0f, chunk);
    const double eo = rel_err(ff.o, fd.o), es = rel_err(ff.state, fd.state);
    CHECK(eo < kF32Tol);
    CHECK(es < kF32Tol);
    worst = std::max({worst, eo, es,
                      check_grads_close(bwd(0.0f, d_o, d_state, chunk), bwd(0.0, d_o, d_state, chunk), kF32Tol)});
  }
  return worst;
}

}  // namespace delta_core

/// Head (b, h) of a [B, T, H, width] tensor as [T, width].
inline Vec head_rows(const Vec& x, const cpu::DeltaDims& d, int64_t b, int64_t h, int64_t width) {
  Vec out;
  for (int64_t t = 0; t < d.seq_len; ++t) {
    const int64_t row = (b * d.seq_len + t) * d.heads + h;
    out.insert(out.end(), x.begin() + row * width, x.begin() + (row + 1) * width);
  }
  return out;
}

/// Head (b, h) of a [B, H, K, V] state as [K, V].
inline Vec head_state(const Vec& s, const cpu::DeltaDims& d, int64_t b, int64_t h) {
  const int64_t kv = d.key_dim * d.value_dim, head = b * d.heads + h;
  return Vec(s.begin() + head * kv, s.begin() + (head + 1) * kv);
}

namespace delta_core {

/// The [B, T, H, *] layout check: for every head, single(b, h) (-> Out of a call on that head alone,
/// dims {1, T, 1, K, V}) must equal head (b, h) of all, the batched call, exactly.
template <class Single>
void check_heads_independent(const cpu::DeltaDims& d, const Out& all, Single single) {
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h) {
      const Out one = single(b, h);
      CHECK(head_rows(all.o, d, b, h, d.value_dim) == one.o);
      CHECK(head_state(all.state, d, b, h) == one.state);
    }
}

}  // namespace delta_core

}  // namespace llmt::test
