// Comba core (layers-delta.md §4.2, §6.2): hand-computed recurrence, chunked form vs. the
// token-by-token oracle (forward and backward, float64), central finite differences of the recurrent
// backward for every input, and float vs. double. Loss for gradients: L = sum(o * R) + sum(S_T * R_S).
#include <catch2/catch.hpp>

#include "delta_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "kernels/cpu/comba.h"

namespace {

using namespace llmt::test;
using namespace llmt::test::delta_core;
using llmt::cpu::DeltaDims;


// Core inputs as the layer produces them: q̂ = l2norm(q') / sqrt(K), k̂ = l2norm(k), g uniform in
// [g_min, g_max] (<= 0), beta = sigmoid(normal). p̂ = l2norm(p) is drawn independently of k̂ (in the
// layer p̂ ≈ k̂, §4.2; the core must not rely on it). s0 empty means no initial state.
struct Problem {
  DeltaDims d;
  Vec q, k, v, p, g, beta, s0;
};

Problem make_problem(DeltaDims d, double g_min, double g_max, bool with_state, uint64_t seed) {
  Problem p{d,
            randn(qk_size(d), seed),
            randn(qk_size(d), seed + 1),
            randn(v_size(d), seed + 2),
            randn(qk_size(d), seed + 6),
            uniform_values(tok_size(d), g_min, g_max, 20250301, seed + 5),
            sigmoid_of(randn(tok_size(d), seed + 3)),
            with_state ? randn(state_size(d), seed + 4) : Vec()};
  set_row_lengths(p.q, d.key_dim, 1.0 / std::sqrt(static_cast<double>(d.key_dim)));
  set_row_lengths(p.k, d.key_dim, 1.0);
  set_row_lengths(p.p, d.key_dim, 1.0);
  return p;
}

// Typed copies of a Problem's inputs and the CombaInputs view of them.
template <typename T>
struct Typed : TypedArrays<T> {
  explicit Typed(const Problem& pr) : TypedArrays<T>({&pr.q, &pr.k, &pr.v, &pr.p, &pr.g, &pr.beta, &pr.s0}) {}
  llmt::cpu::CombaInputs<T> inputs() const {
    return {this->ptr(0), this->ptr(1), this->ptr(2), this->ptr(3), this->ptr(4), this->ptr(5), this->ptr(6)};
  }
};

template <typename T>
Out forward(const Problem& p, int64_t chunk) {  // chunk 0: the recurrent form
  return run_forward<T>(Typed<T>(p).inputs(), p.d, chunk, llmt::cpu::comba_recurrent_fwd<T>,
                        llmt::cpu::comba_chunk_fwd<T>);
}

// Grads: dq, dk, dv, dp, dg, dbeta, ds0. d_state empty: nullptr (zero) final-state gradient.
template <typename T>
Grads backward(const Problem& p, const Vec& d_o, const Vec& d_state, int64_t chunk) {
  GradBuffers<T> g({{qk_size(p.d), 91}, {qk_size(p.d), 92}, {v_size(p.d), 93}, {qk_size(p.d), 97}, {tok_size(p.d), 94},
                    {tok_size(p.d), 95}, {state_size(p.d), 96}});
  const llmt::cpu::CombaGrads<T> out{g[0], g[1], g[2], g[3], g[4], g[5], g[6]};
  run_backward<T>(Typed<T>(p).inputs(), d_o, d_state, p.d, chunk, out, llmt::cpu::comba_recurrent_bwd<T>,
                  llmt::cpu::comba_chunk_bwd<T>);
  return g.widened();
}

}  // namespace

TEST_CASE("comba: hand-computed recurrence, T = 2, K = V = 2", "[kernels][comba]") {
  // S0 = [[1, 2], [0, 1]] (rows = key channels), g = ln 0.5 both steps, beta = (0.5, 0.25),
  // k1 = (1, 0), k2 = (0, 1), p1 = (1, 0), p2 = (1, 1), v1 = (2, 0), v2 = (0, 4), q1 = q2 = (1, 1).
  // t=1: r1 = v1 - S0^T p1 = (2, 0) - (1, 2) = (1, -2);
  //      S1 = 0.5 S0 + 0.5 k1 r1^T = [[0.5, 1], [0, 0.5]] + [[0.5, -1], [0, 0]] = [[1, 0], [0, 0.5]];
  //      o1 = S1^T q1 = (1, 0.5).
  // t=2: r2 = v2 - S1^T p2 = (0, 4) - (1, 0.5) = (-1, 3.5)   (the undecayed S1: a GDN-style order gives (-0.5, 3.75));
  //      S2 = 0.5 S1 + 0.25 k2 r2^T = [[0.5, 0], [0, 0.25]] + [[0, 0], [-0.25, 0.875]] = [[0.5, 0], [-0.25, 1.125]];
  //      o2 = S2^T q2 = (0.25, 1.125).
  Problem p{{1, 2, 1, 2, 2}, {1, 1, 1, 1}, {1, 0, 0, 1}, {2, 0, 0, 4}, {1, 0, 1, 1}, {std::log(0.5), std::log(0.5)},
            {0.5, 0.25},     {1, 2, 0, 1}};
  for (int64_t chunk : {0, 1, 2}) {
    INFO("chunk " << chunk);
    check_out_matches(forward<double>(p, chunk), Vec{1.0, 0.5, 0.25, 1.125}, Vec{0.5, 0.0, -0.25, 1.125});
  }
}

TEST_CASE("comba: [B, T, H, *] layout: each head of a batched call equals a single-head call", "[kernels][comba]") {
  const Problem p = make_problem({2, 5, 3, 4, 3}, -1.0, -0.1, true, 10);
  const DeltaDims d = p.d, one{1, d.seq_len, 1, d.key_dim, d.value_dim};
  for (int64_t chunk : {0, 2})
    check_heads_independent(d, forward<double>(p, chunk), [&](int64_t b, int64_t h) {
      const Problem s{one,
                      head_rows(p.q, d, b, h, d.key_dim),
                      head_rows(p.k, d, b, h, d.key_dim),
                      head_rows(p.v, d, b, h, d.value_dim),
                      head_rows(p.p, d, b, h, d.key_dim),
                      head_rows(p.g, d, b, h, 1),
                      head_rows(p.beta, d, b, h, 1),
                      head_state(p.s0, d, b, h)};
      return forward<double>(s, chunk);
    });
}

TEST_CASE("comba: chunked forward and backward equal the recurrent form, float64", "[kernels][comba]") {
  for_each_chunk_case([](int64_t T, int64_t chunk, bool with_state, double g_min) {
    const Problem p = make_problem({2, T, 2, 8, 6}, g_min, -0.001, with_state, 100 + T);
    check_chunk_fwd([&](int64_t c) { return forward<double>(p, c); }, chunk);
    check_chunk_bwd([&](const Vec& d_o, const Vec& d_s, int64_t c) { return backward<double>(p, d_o, d_s, c); }, p.d,
                    chunk);
  });
}

TEST_CASE("comba: recurrent backward matches central finite differences for every input", "[kernels][comba]") {
  // T = 9 with chunk 4 also checks the chunked backward on a partial last chunk against the same numbers.
  for (double g_min : {-0.1, -3.0}) {
    INFO("g_min " << g_min);
    Problem p = make_problem({2, 9, 2, 3, 2}, g_min, -0.01, true, 400);
    check_fd(p.d, {&p.q, &p.k, &p.v, &p.p, &p.g, &p.beta, &p.s0}, [&](int64_t c) { return forward<double>(p, c); },
             [&](const Vec& d_o, const Vec& d_s, int64_t c) { return backward<double>(p, d_o, d_s, c); });
  }
}

TEST_CASE("comba: float agrees with double for all four functions", "[kernels][comba]") {
  const Problem p = make_problem({2, 70, 2, 8, 6}, -2.0, -0.01, true, 500);
  check_float_vs_double(
      p.d, [&](auto x, int64_t c) { return forward<decltype(x)>(p, c); },
      [&](auto x, const Vec& d_o, const Vec& d_s, int64_t c) { return backward<decltype(x)>(p, d_o, d_s, c); });
}

TEST_CASE("comba: chunk_size must be positive", "[kernels][comba]") {
  const Problem p = make_problem({1, 3, 1, 2, 2}, -1.0, -0.1, false, 600);
  CHECK_THROWS_AS(forward<double>(p, -1), llmt::Error);
}
