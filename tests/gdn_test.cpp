// Gated DeltaNet core (layers-delta.md §4.1, §6): hand-computed recurrence, chunked form vs. the
// token-by-token oracle (forward and backward, float64), central finite differences of the recurrent
// backward for every input, and float vs. double. Loss for gradients: L = sum(o * R) + sum(S_T * R_S).
#include <catch2/catch.hpp>

#include "delta_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "kernels/backend.h"
#include "kernels/cpu/gdn.h"

namespace {

using namespace llmt::test;
using namespace llmt::test::delta_core;
using llmt::cpu::DeltaDims;


// Core inputs as the layer produces them: q̂ = l2norm(q) / sqrt(K), k̂ = l2norm(k), g uniform in
// [g_min, g_max] (<= 0), beta = sigmoid(normal). s0 empty means no initial state.
struct Problem {
  DeltaDims d;
  Vec q, k, v, g, beta, s0;
};

Problem make_problem(DeltaDims d, double g_min, double g_max, bool with_state, uint64_t seed) {
  Problem p{d, randn(qk_size(d), seed), randn(qk_size(d), seed + 1), randn(v_size(d), seed + 2),
            uniform_values(tok_size(d), g_min, g_max, 20250301, seed + 5), sigmoid_of(randn(tok_size(d), seed + 3)),
            with_state ? randn(state_size(d), seed + 4) : Vec()};
  set_row_lengths(p.q, d.key_dim, 1.0 / std::sqrt(static_cast<double>(d.key_dim)));
  set_row_lengths(p.k, d.key_dim, 1.0);
  return p;
}

// Typed copies of a Problem's inputs and the GdnInputs view of them.
template <typename T>
struct Typed : TypedArrays<T> {
  explicit Typed(const Problem& p) : TypedArrays<T>({&p.q, &p.k, &p.v, &p.g, &p.beta, &p.s0}) {}
  llmt::cpu::GdnInputs<T> inputs() const {
    return {this->ptr(0), this->ptr(1), this->ptr(2), this->ptr(3), this->ptr(4), this->ptr(5)};
  }
};

template <typename T>
Out forward(const Problem& p, int64_t chunk) {  // chunk 0: the recurrent form
  return run_forward<T>(Typed<T>(p).inputs(), p.d, chunk, llmt::cpu::gdn_recurrent_fwd<T>,
                        llmt::cpu::gdn_chunk_fwd<T>);
}

// Grads: dq, dk, dv, dg, dbeta, ds0. d_state empty: nullptr (zero) final-state gradient.
template <typename T>
Grads backward(const Problem& p, const Vec& d_o, const Vec& d_state, int64_t chunk) {
  GradBuffers<T> g({{qk_size(p.d), 91}, {qk_size(p.d), 92}, {v_size(p.d), 93}, {tok_size(p.d), 94},
                    {tok_size(p.d), 95}, {state_size(p.d), 96}});
  const llmt::cpu::GdnGrads<T> out{g[0], g[1], g[2], g[3], g[4], g[5]};
  run_backward<T>(Typed<T>(p).inputs(), d_o, d_state, p.d, chunk, out, llmt::cpu::gdn_recurrent_bwd<T>,
                  llmt::cpu::gdn_chunk_bwd<T>);
  return g.widened();
}

}  // namespace

TEST_CASE("gdn: hand-computed recurrence, T = 2, K = V = 2", "[kernels][gdn]") {
  // S0 = [[1, 2], [0, 1]] (rows = key channels), g = ln 0.5 both steps, beta = (0.5, 0.25),
  // k1 = (1, 0), k2 = (0, 1), v1 = (2, 0), v2 = (0, 4), q1 = q2 = (1, 1).
  // t=1: S̄ = 0.5 S0 = [[0.5, 1], [0, 0.5]]; S̄^T k1 = (0.5, 1); δ1 = 0.5 ((2, 0) - (0.5, 1)) = (0.75, -0.5);
  //      S1 = S̄ + k1 δ1^T = [[1.25, 0.5], [0, 0.5]]; o1 = S1^T q1 = (1.25, 1.0).
  // t=2: S̄ = 0.5 S1 = [[0.625, 0.25], [0, 0.25]]; S̄^T k2 = (0, 0.25); δ2 = 0.25 ((0, 4) - (0, 0.25)) = (0, 0.9375);
  //      S2 = [[0.625, 0.25], [0, 1.1875]]; o2 = S2^T q2 = (0.625, 1.4375).
  Problem p{{1, 2, 1, 2, 2},        {1, 1, 1, 1}, {1, 0, 0, 1}, {2, 0, 0, 4}, {std::log(0.5), std::log(0.5)},
            {0.5, 0.25},            {1, 2, 0, 1}};
  for (int64_t chunk : {0, 1, 2}) {
    INFO("chunk " << chunk);
    check_out_matches(forward<double>(p, chunk), Vec{1.25, 1.0, 0.625, 1.4375}, Vec{0.625, 0.25, 0.0, 1.1875});
  }
}

TEST_CASE("gdn: [B, T, H, *] layout: each head of a batched call equals a single-head call", "[kernels][gdn]") {
  const Problem p = make_problem({2, 5, 3, 4, 3}, -1.0, -0.1, true, 10);
  const DeltaDims d = p.d, one{1, d.seq_len, 1, d.key_dim, d.value_dim};
  for (int64_t chunk : {0, 2})
    check_heads_independent(d, forward<double>(p, chunk), [&](int64_t b, int64_t h) {
      const Problem s{one,
                      head_rows(p.q, d, b, h, d.key_dim),
                      head_rows(p.k, d, b, h, d.key_dim),
                      head_rows(p.v, d, b, h, d.value_dim),
                      head_rows(p.g, d, b, h, 1),
                      head_rows(p.beta, d, b, h, 1),
                      head_state(p.s0, d, b, h)};
      return forward<double>(s, chunk);
    });
}

TEST_CASE("gdn: chunked forward and backward equal the recurrent form, float64", "[kernels][gdn]") {
  for_each_chunk_case([](int64_t T, int64_t chunk, bool with_state, double g_min) {
    const Problem p = make_problem({2, T, 2, 8, 6}, g_min, -0.001, with_state, 100 + T);
    check_chunk_fwd([&](int64_t c) { return forward<double>(p, c); }, chunk);
    check_chunk_bwd([&](const Vec& d_o, const Vec& d_s, int64_t c) { return backward<double>(p, d_o, d_s, c); }, p.d,
                    chunk);
  });
}

TEST_CASE("gdn: recurrent backward matches central finite differences for every input", "[kernels][gdn]") {
  // T = 9 with chunk 4 also checks the chunked backward on a partial last chunk against the same numbers.
  for (double g_min : {-0.1, -3.0}) {
    INFO("g_min " << g_min);
    Problem p = make_problem({2, 9, 2, 3, 2}, g_min, -0.01, true, 400);
    check_fd(p.d, {&p.q, &p.k, &p.v, &p.g, &p.beta, &p.s0}, [&](int64_t c) { return forward<double>(p, c); },
             [&](const Vec& d_o, const Vec& d_s, int64_t c) { return backward<double>(p, d_o, d_s, c); });
  }
}

TEST_CASE("gdn: float agrees with double for all four functions", "[kernels][gdn]") {
  const Problem p = make_problem({2, 70, 2, 8, 6}, -2.0, -0.01, true, 500);
  check_float_vs_double(
      p.d, [&](auto x, int64_t c) { return forward<decltype(x)>(p, c); },
      [&](auto x, const Vec& d_o, const Vec& d_s, int64_t c) { return backward<decltype(x)>(p, d_o, d_s, c); });
}

TEST_CASE("gdn: chunk_size must be positive", "[kernels][gdn]") {
  const Problem p = make_problem({1, 3, 1, 2, 2}, -1.0, -0.1, false, 600);
  CHECK_THROWS_AS(forward<double>(p, -1), llmt::Error);
}

TEST_CASE("gdn, comba: the CPU backend refuses bf16 q, k, v (p) naming the op", "[kernels][gdn][comba]") {
  using llmt::DType;
  using llmt::OwnedTensor;
  auto be = llmt::make_cpu_backend();
  const int64_t B = 1, T = 4, H = 1, K = 8, V = 8, C = 4;
  const auto t = [&](DType d, std::initializer_list<int64_t> dims) { return OwnedTensor(*be, d, dims); };
  const OwnedTensor q = t(DType::bf16, {B, T, H, K}), k = t(DType::bf16, {B, T, H, K});
  const OwnedTensor p = t(DType::bf16, {B, T, H, K}), v = t(DType::bf16, {B, T, H, V});
  const OwnedTensor g = t(DType::f32, {B, T, H}), beta = t(DType::f32, {B, T, H}), o = t(DType::f32, {B, T, H, V});
  const OwnedTensor dq = t(DType::f32, {B, T, H, K}), dk = t(DType::f32, {B, T, H, K});
  const OwnedTensor dp = t(DType::f32, {B, T, H, K});
  const OwnedTensor dv = t(DType::f32, {B, T, H, V}), dg = t(DType::f32, {B, T, H}), dbeta = t(DType::f32, {B, T, H});
  const llmt::Tensor none;
  const std::string refused = "the cpu backend takes q, k, v";
  CHECK_THROWS_WITH(be->gdn_chunk_fwd(*q, *k, *v, *g, *beta, C, DType::bf16, *o, none),
                    Catch::StartsWith("gdn_chunk_fwd: " + refused) && Catch::Contains("got bf16"));
  CHECK_THROWS_WITH(be->gdn_chunk_bwd(*q, *k, *v, *g, *beta, *o, none, C, DType::bf16, *dq, *dk, *dv, *dg, *dbeta),
                    Catch::StartsWith("gdn_chunk_bwd: " + refused) && Catch::Contains("got bf16"));
  CHECK_THROWS_WITH(be->comba_chunk_fwd(*q, *k, *v, *p, *g, *beta, C, DType::bf16, *o, none),
                    Catch::StartsWith("comba_chunk_fwd: " + refused + ", p") && Catch::Contains("got bf16"));
  CHECK_THROWS_WITH(
      be->comba_chunk_bwd(*q, *k, *v, *p, *g, *beta, *o, none, C, DType::bf16, *dq, *dk, *dv, *dp, *dg, *dbeta),
      Catch::StartsWith("comba_chunk_bwd: " + refused + ", p") && Catch::Contains("got bf16"));
}
