// KDA core (layers-delta.md §4.3, §6): hand-computed recurrence with a per-channel decay, reduction to GDN
// when the decay is equal across channels, chunked form vs. the token-by-token oracle (forward and
// backward, float64), central finite differences of the recurrent backward for every input (incl. the
// per-channel g, beta and the initial state), and float vs. double.
// Loss for gradients: L = sum(o * R) + sum(S_T * R_S).
#include <catch2/catch.hpp>

#include "delta_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "kernels/cpu/gdn.h"
#include "kernels/cpu/kda.h"

namespace {

using namespace llmt::test;
using namespace llmt::test::delta_core;
using llmt::cpu::DeltaDims;


// Core inputs as the layer produces them: q̂ = l2norm(q) / sqrt(K), k̂ = l2norm(k), g [B, T, H, K] uniform in
// [g_min, g_max] (<= 0) independently per channel, beta = sigmoid(normal). s0 empty means no initial state.
struct Problem {
  DeltaDims d;
  Vec q, k, v, g, beta, s0;
};

Problem make_problem(DeltaDims d, double g_min, double g_max, bool with_state, uint64_t seed) {
  Problem p{d, randn(qk_size(d), seed), randn(qk_size(d), seed + 1), randn(v_size(d), seed + 2),
            uniform_values(qk_size(d), g_min, g_max, 20251029, seed + 5), sigmoid_of(randn(tok_size(d), seed + 3)),
            with_state ? randn(state_size(d), seed + 4) : Vec()};
  set_row_lengths(p.q, d.key_dim, 1.0 / std::sqrt(static_cast<double>(d.key_dim)));
  set_row_lengths(p.k, d.key_dim, 1.0);
  return p;
}

// Typed copies of a Problem's inputs and the KdaInputs view of them.
template <typename T>
struct Typed : TypedArrays<T> {
  explicit Typed(const Problem& p) : TypedArrays<T>({&p.q, &p.k, &p.v, &p.g, &p.beta, &p.s0}) {}
  llmt::cpu::KdaInputs<T> inputs() const {
    return {this->ptr(0), this->ptr(1), this->ptr(2), this->ptr(3), this->ptr(4), this->ptr(5)};
  }
};

template <typename T>
Out forward(const Problem& p, int64_t chunk) {  // chunk 0: the recurrent form
  return run_forward<T>(Typed<T>(p).inputs(), p.d, chunk, llmt::cpu::kda_recurrent_fwd<T>,
                        llmt::cpu::kda_chunk_fwd<T>);
}

// Grads: dq, dk, dv, dg, dbeta, ds0. d_state empty: nullptr (zero) final-state gradient.
template <typename T>
Grads backward(const Problem& p, const Vec& d_o, const Vec& d_state, int64_t chunk) {
  GradBuffers<T> g({{qk_size(p.d), 91}, {qk_size(p.d), 92}, {v_size(p.d), 93}, {qk_size(p.d), 94},
                    {tok_size(p.d), 95}, {state_size(p.d), 96}});
  const llmt::cpu::KdaGrads<T> out{g[0], g[1], g[2], g[3], g[4], g[5]};
  run_backward<T>(Typed<T>(p).inputs(), d_o, d_state, p.d, chunk, out, llmt::cpu::kda_recurrent_bwd<T>,
                  llmt::cpu::kda_chunk_bwd<T>);
  return g.widened();
}

}  // namespace

TEST_CASE("kda: hand-computed recurrence with per-channel decay, T = 2, K = V = 2", "[kernels][kda]") {
  // S0 = [[1, 2], [0, 1]] (rows = key channels), alpha_1 = (0.5, 1), alpha_2 = (1, 0.5) (g = ln alpha),
  // beta = (0.5, 0.25), k1 = (1, 0), k2 = (0, 1), v1 = (2, 0), v2 = (0, 4), q1 = q2 = (1, 1).
  // t=1: S̄ = Diag(0.5, 1) S0 = [[0.5, 1], [0, 1]]; S̄^T k1 = (0.5, 1); δ1 = 0.5 ((2, 0) - (0.5, 1)) = (0.75, -0.5);
  //      S1 = S̄ + k1 δ1^T = [[1.25, 0.5], [0, 1]]; o1 = S1^T q1 = (1.25, 1.5).
  // t=2: S̄ = Diag(1, 0.5) S1 = [[1.25, 0.5], [0, 0.5]]; S̄^T k2 = (0, 0.5); δ2 = 0.25 ((0, 4) - (0, 0.5)) = (0, 0.875);
  //      S2 = [[1.25, 0.5], [0, 1.375]]; o2 = S2^T q2 = (1.25, 1.875).
  // (A scalar decay could not produce this: channel 0 decays only at t=1, channel 1 only at t=2.)
  const double h = std::log(0.5);
  Problem p{{1, 2, 1, 2, 2}, {1, 1, 1, 1}, {1, 0, 0, 1}, {2, 0, 0, 4}, {h, 0.0, 0.0, h}, {0.5, 0.25}, {1, 2, 0, 1}};
  for (int64_t chunk : {0, 1, 2}) {
    INFO("chunk " << chunk);
    check_out_matches(forward<double>(p, chunk), Vec{1.25, 1.5, 1.25, 1.875}, Vec{1.25, 0.5, 0.0, 1.375});
  }
}

TEST_CASE("kda: equal decay on every channel reduces to GDN (forward and backward)", "[kernels][kda]") {
  Problem p = make_problem({2, 37, 2, 5, 3}, -1.5, -0.01, true, 50);
  const DeltaDims& d = p.d;
  Vec g_tok(tok_size(d));
  for (size_t row = 0; row < tok_size(d); ++row) {
    g_tok[row] = p.g[row * d.key_dim];
    for (int64_t c = 0; c < d.key_dim; ++c) p.g[row * d.key_dim + c] = g_tok[row];
  }
  const Vec d_o = randn(v_size(d), 51), d_state = randn(state_size(d), 52);
  Vec o(v_size(d)), s(state_size(d)), dq(qk_size(d)), dk(qk_size(d)), dv(v_size(d)), dg(tok_size(d)),
      db(tok_size(d)), ds0(state_size(d));
  const llmt::cpu::GdnInputs<double> gin{p.q.data(), p.k.data(), p.v.data(), g_tok.data(), p.beta.data(), p.s0.data()};
  llmt::cpu::gdn_recurrent_fwd(gin, d, o.data(), s.data());
  llmt::cpu::gdn_recurrent_bwd(gin, d_o.data(), d_state.data(), d,
                               llmt::cpu::GdnGrads<double>{dq.data(), dk.data(), dv.data(), dg.data(), db.data(),
                                                           ds0.data()});
  for (int64_t chunk : {0, 8}) {
    INFO("chunk " << chunk);
    const Out f = forward<double>(p, chunk);
    CHECK(rel_err(f.o, o) < 1e-12);
    CHECK(rel_err(f.state, s) < 1e-12);
    const Grads gk = backward<double>(p, d_o, d_state, chunk);  // dq, dk, dv, dg, dbeta, ds0
    Vec dg_sum(tok_size(d), 0.0);  // dL/dg_scalar = Σ_c dL/dg_c
    for (size_t row = 0; row < tok_size(d); ++row)
      for (int64_t c = 0; c < d.key_dim; ++c) dg_sum[row] += gk[3][row * d.key_dim + c];
    CHECK(rel_err(gk[0], dq) < 1e-12);
    CHECK(rel_err(gk[1], dk) < 1e-12);
    CHECK(rel_err(gk[2], dv) < 1e-12);
    CHECK(rel_err(dg_sum, dg) < 1e-12);
    CHECK(rel_err(gk[4], db) < 1e-12);
    CHECK(rel_err(gk[5], ds0) < 1e-12);
  }
}

TEST_CASE("kda: [B, T, H, *] layout: each head of a batched call equals a single-head call", "[kernels][kda]") {
  const Problem p = make_problem({2, 5, 3, 4, 3}, -1.0, -0.1, true, 10);
  const DeltaDims d = p.d, one{1, d.seq_len, 1, d.key_dim, d.value_dim};
  for (int64_t chunk : {0, 2})
    check_heads_independent(d, forward<double>(p, chunk), [&](int64_t b, int64_t h) {
      const Problem s{one,
                      head_rows(p.q, d, b, h, d.key_dim),
                      head_rows(p.k, d, b, h, d.key_dim),
                      head_rows(p.v, d, b, h, d.value_dim),
                      head_rows(p.g, d, b, h, d.key_dim),
                      head_rows(p.beta, d, b, h, 1),
                      head_state(p.s0, d, b, h)};
      return forward<double>(s, chunk);
    });
}

TEST_CASE("kda: recurrent backward matches central finite differences for every input", "[kernels][kda]") {
  // T = 9 with chunk 4 also checks the chunked backward on a partial last chunk against the same numbers.
  double worst_rec = 0.0, worst_chk = 0.0;
  for (double g_min : {-0.1, -3.0}) {
    INFO("g_min " << g_min);
    Problem p = make_problem({2, 9, 2, 3, 2}, g_min, -0.01, true, 400);
    const auto [rec, chk] = check_fd(
        p.d, {&p.q, &p.k, &p.v, &p.g, &p.beta, &p.s0}, [&](int64_t c) { return forward<double>(p, c); },
        [&](const Vec& d_o, const Vec& d_s, int64_t c) { return backward<double>(p, d_o, d_s, c); });
    worst_rec = std::max(worst_rec, rec);
    worst_chk = std::max(worst_chk, chk);
  }
  WARN("kda FD: max rel err recurrent bwd " << worst_rec << ", chunk bwd " << worst_chk);
}

TEST_CASE("kda: chunked forward equals the recurrent form, float64", "[kernels][kda]") {
  double worst = 0.0;
  for_each_chunk_case([&](int64_t T, int64_t chunk, bool with_state, double g_min) {
    const Problem p = make_problem({2, T, 2, 8, 6}, g_min, -0.001, with_state, 100 + T);
    worst = std::max(worst, check_chunk_fwd([&](int64_t c) { return forward<double>(p, c); }, chunk));
  });
  WARN("kda chunk fwd vs recurrent: max rel err " << worst);
}

TEST_CASE("kda: chunked backward equals the recurrent backward, float64", "[kernels][kda]") {
  double worst = 0.0;
  for_each_chunk_case([&](int64_t T, int64_t chunk, bool with_state, double g_min) {
    const Problem p = make_problem({2, T, 2, 8, 6}, g_min, -0.001, with_state, 100 + T);
    auto bwd = [&](const Vec& d_o, const Vec& d_s, int64_t c) { return backward<double>(p, d_o, d_s, c); };
    worst = std::max(worst, check_chunk_bwd(bwd, p.d, chunk));
  });
  WARN("kda chunk bwd vs recurrent: max rel err " << worst);
}

TEST_CASE("kda: float agrees with double for all four functions", "[kernels][kda]") {
  const Problem p = make_problem({2, 70, 2, 8, 6}, -2.0, -0.01, true, 500);
  const double worst = check_float_vs_double(
      p.d, [&](auto x, int64_t c) { return forward<decltype(x)>(p, c); },
      [&](auto x, const Vec& d_o, const Vec& d_s, int64_t c) { return backward<decltype(x)>(p, d_o, d_s, c); });
  WARN("kda float vs double: max rel err " << worst);
}

TEST_CASE("kda: chunk_size must be positive", "[kernels][kda]") {
  const Problem p = make_problem({1, 3, 1, 2, 2}, -1.0, -0.1, false, 600);
  CHECK_THROWS_AS(forward<double>(p, -1), llmt::Error);
  const Typed<double> in(p);
  Vec o(v_size(p.d));
  CHECK_THROWS_AS(llmt::cpu::kda_chunk_fwd(in.inputs(), p.d, o.data(), static_cast<double*>(nullptr), 0), llmt::Error);
}
