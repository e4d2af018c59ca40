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
#include "kernels/cpu/gdn.h"
#include "kernels/cpu/kda.h"

namespace {

namespace cpu = llmt::cpu;
using namespace llmt::test;
using namespace llmt::test::delta_core;
using llmt::cpu::DeltaDims;

// KDA in the shared harness (delta_test_util.h): no p̂, g [B, T, H, K] (independently per key channel).
struct Kda {
  static constexpr CoreSpec kSpec{/*has_p=*/false, /*g_per_channel=*/true, /*g_seed=*/20251029};
  template <typename T>
  static constexpr CoreFns kFns{cpu::kda_recurrent_fwd<T>, cpu::kda_chunk_fwd<T>, cpu::kda_recurrent_bwd<T>,
                                cpu::kda_chunk_bwd<T>};
};

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
  // p = {}: no p̂.
  Problem p{{1, 2, 1, 2, 2}, {1, 1, 1, 1}, {1, 0, 0, 1}, {2, 0, 0, 4}, {}, {h, 0.0, 0.0, h}, {0.5, 0.25}, {1, 2, 0, 1}};
  for (int64_t chunk : {0, 1, 2}) {
    INFO("chunk " << chunk);
    check_out_matches(forward<Kda>(p, chunk), Vec{1.25, 1.5, 1.25, 1.875}, Vec{1.25, 0.5, 0.0, 1.375});
  }
}

TEST_CASE("kda: equal decay on every channel reduces to GDN (forward and backward)", "[kernels][kda]") {
  Problem p = make_problem<Kda>({2, 37, 2, 5, 3}, -1.5, -0.01, true, 50);
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
    const Out f = forward<Kda>(p, chunk);
    CHECK(rel_err(f.o, o) < 1e-12);
    CHECK(rel_err(f.state, s) < 1e-12);
    const Grads gk = backward<Kda>(p, d_o, d_state, chunk);  // dq, dk, dv, dg, dbeta, ds0
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
  check_layout<Kda>();
}

TEST_CASE("kda: recurrent backward matches central finite differences for every input", "[kernels][kda]") {
  const auto [worst_rec, worst_chk] = check_fd<Kda>();
  WARN("kda FD: max rel err recurrent bwd " << worst_rec << ", chunk bwd " << worst_chk);
}

TEST_CASE("kda: chunked forward equals the recurrent form, float64", "[kernels][kda]") {
  double worst = 0.0;
  for_each_chunk_case<Kda>(
      [&](const Problem& p, int64_t chunk) { worst = std::max(worst, check_chunk_fwd<Kda>(p, chunk)); });
  WARN("kda chunk fwd vs recurrent: max rel err " << worst);
}

TEST_CASE("kda: chunked backward equals the recurrent backward, float64", "[kernels][kda]") {
  double worst = 0.0;
  for_each_chunk_case<Kda>(
      [&](const Problem& p, int64_t chunk) { worst = std::max(worst, check_chunk_bwd<Kda>(p, chunk)); });
  WARN("kda chunk bwd vs recurrent: max rel err " << worst);
}

TEST_CASE("kda: float agrees with double for all four functions", "[kernels][kda]") {
  const double worst = check_float_vs_double<Kda>();
  WARN("kda float vs double: max rel err " << worst);
}

TEST_CASE("kda: chunk_size must be positive", "[kernels][kda]") {
  const Problem p = make_problem<Kda>({1, 3, 1, 2, 2}, -1.0, -0.1, false, 600);
  CHECK_THROWS_AS(forward<Kda>(p, -1), llmt::Error);
  const TypedInputs<Kda, double> in(p);
  Vec o(v_size(p.d));
  CHECK_THROWS_AS(cpu::kda_chunk_fwd(in.inputs(), p.d, o.data(), static_cast<double*>(nullptr), 0), llmt::Error);
}
