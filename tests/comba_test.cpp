// Comba core (layers-delta.md §4.2, §6.2): hand-computed recurrence, chunked form vs. the
// token-by-token oracle (forward and backward, float64), central finite differences of the recurrent
// backward for every input, and float vs. double. Loss for gradients: L = sum(o * R) + sum(S_T * R_S).
#include <catch2/catch.hpp>

#include "delta_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "kernels/cpu/comba.h"

namespace {

using namespace llmt::test;
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
struct Typed {
  std::vector<T> q, k, v, p, g, beta, s0;
  explicit Typed(const Problem& pr)
      : q(cast<T>(pr.q)), k(cast<T>(pr.k)), v(cast<T>(pr.v)), p(cast<T>(pr.p)), g(cast<T>(pr.g)),
        beta(cast<T>(pr.beta)), s0(cast<T>(pr.s0)) {}
  llmt::cpu::CombaInputs<T> inputs() const {
    return {q.data(), k.data(), v.data(), p.data(), g.data(), beta.data(), s0.empty() ? nullptr : s0.data()};
  }
};

struct Out {
  Vec o, state;
};
template <typename T>
Out forward(const Problem& p, int64_t chunk) {  // chunk 0: the recurrent form
  const Typed<T> in(p);
  std::vector<T> o(v_size(p.d)), s(state_size(p.d));
  if (chunk == 0)
    llmt::cpu::comba_recurrent_fwd(in.inputs(), p.d, o.data(), s.data());
  else
    llmt::cpu::comba_chunk_fwd(in.inputs(), p.d, o.data(), s.data(), chunk);
  return {widen(o), widen(s)};
}

struct Grads {
  Vec dq, dk, dv, dp, dg, dbeta, ds0;
};
// Every gradient buffer starts with random values: the kernels must overwrite them.
template <typename T>
Grads backward(const Problem& p, const Vec& d_o, const Vec& d_state, int64_t chunk) {
  const Typed<T> in(p);
  const auto dout = cast<T>(d_o), dst = cast<T>(d_state);
  auto dq = cast<T>(randn(qk_size(p.d), 91)), dk = cast<T>(randn(qk_size(p.d), 92)),
       dv = cast<T>(randn(v_size(p.d), 93)), dp = cast<T>(randn(qk_size(p.d), 97)),
       dg = cast<T>(randn(tok_size(p.d), 94)), db = cast<T>(randn(tok_size(p.d), 95)), ds0 = cast<T>(randn(state_size(p.d), 96));
  const llmt::cpu::CombaGrads<T> out{dq.data(), dk.data(), dv.data(), dp.data(), dg.data(), db.data(), ds0.data()};
  const T* dst_ptr = d_state.empty() ? nullptr : dst.data();
  if (chunk == 0)
    llmt::cpu::comba_recurrent_bwd(in.inputs(), dout.data(), dst_ptr, p.d, out);
  else
    llmt::cpu::comba_chunk_bwd(in.inputs(), dout.data(), dst_ptr, p.d, out, chunk);
  return {widen(dq), widen(dk), widen(dv), widen(dp), widen(dg), widen(db), widen(ds0)};
}

void check_grads_close(const Grads& a, const Grads& ref, double tol) {
  CHECK(rel_err(a.dq, ref.dq) < tol);
  CHECK(rel_err(a.dk, ref.dk) < tol);
  CHECK(rel_err(a.dv, ref.dv) < tol);
  CHECK(rel_err(a.dp, ref.dp) < tol);
  CHECK(rel_err(a.dg, ref.dg) < tol);
  CHECK(rel_err(a.dbeta, ref.dbeta) < tol);
  CHECK(rel_err(a.ds0, ref.ds0) < tol);
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
    const Out f = forward<double>(p, chunk);
    const Vec o_ref{1.0, 0.5, 0.25, 1.125}, s_ref{0.5, 0.0, -0.25, 1.125};
    for (size_t i = 0; i < 4; ++i) {
      CHECK(f.o[i] == Approx(o_ref[i]).margin(1e-15));
      CHECK(f.state[i] == Approx(s_ref[i]).margin(1e-15));
    }
  }
}

TEST_CASE("comba: [B, T, H, *] layout: each head of a batched call equals a single-head call", "[kernels][comba]") {
  const Problem p = make_problem({2, 5, 3, 4, 3}, -1.0, -0.1, true, 10);
  const DeltaDims d = p.d, one{1, d.seq_len, 1, d.key_dim, d.value_dim};
  for (int64_t chunk : {0, 2}) {
    const Out all = forward<double>(p, chunk);
    for (int64_t b = 0; b < d.batch; ++b)
      for (int64_t h = 0; h < d.heads; ++h) {
        Problem s{one, {}, {}, {}, {}, {}, {}, {}};
        for (int64_t t = 0; t < d.seq_len; ++t) {
          const int64_t row = (b * d.seq_len + t) * d.heads + h;
          s.q.insert(s.q.end(), p.q.begin() + row * d.key_dim, p.q.begin() + (row + 1) * d.key_dim);
          s.k.insert(s.k.end(), p.k.begin() + row * d.key_dim, p.k.begin() + (row + 1) * d.key_dim);
          s.v.insert(s.v.end(), p.v.begin() + row * d.value_dim, p.v.begin() + (row + 1) * d.value_dim);
          s.p.insert(s.p.end(), p.p.begin() + row * d.key_dim, p.p.begin() + (row + 1) * d.key_dim);
          s.g.push_back(p.g[row]);
          s.beta.push_back(p.beta[row]);
        }
        const int64_t kv = d.key_dim * d.value_dim, head = b * d.heads + h;
        s.s0.assign(p.s0.begin() + head * kv, p.s0.begin() + (head + 1) * kv);
        const Out single = forward<double>(s, chunk);
        for (int64_t t = 0; t < d.seq_len; ++t)
          for (int64_t j = 0; j < d.value_dim; ++j)
            CHECK(single.o[t * d.value_dim + j] == all.o[((b * d.seq_len + t) * d.heads + h) * d.value_dim + j]);
        CHECK(Vec(all.state.begin() + head * kv, all.state.begin() + (head + 1) * kv) == single.state);
      }
  }
}

TEST_CASE("comba: chunked forward and backward equal the recurrent form, float64", "[kernels][comba]") {
  for (int64_t T : {1, 63, 64, 65, 200})
    for (int64_t chunk : {16, 64})
      for (bool with_state : {false, true})
        for (double g_min : {-0.05, -5.0}) {
          INFO("T " << T << " chunk " << chunk << " initial state " << with_state << " g_min " << g_min);
          const Problem p = make_problem({2, T, 2, 8, 6}, g_min, -0.001, with_state, 100 + T);
          const Out ref = forward<double>(p, 0), chk = forward<double>(p, chunk);
          CHECK(rel_err(chk.o, ref.o) < kChunkTol);
          CHECK(rel_err(chk.state, ref.state) < kChunkTol);
          const Vec d_o = randn(v_size(p.d), 200 + T), d_state = randn(state_size(p.d), 300 + T);
          const Grads gr = backward<double>(p, d_o, d_state, 0), gc = backward<double>(p, d_o, d_state, chunk);
          check_grads_close(gc, gr, kChunkTol);
          const Grads gr0 = backward<double>(p, d_o, {}, 0), gc0 = backward<double>(p, d_o, {}, chunk);
          check_grads_close(gc0, gr0, kChunkTol);
        }
}

TEST_CASE("comba: recurrent backward matches central finite differences for every input", "[kernels][comba]") {
  // T = 9 with chunk 4 also checks the chunked backward on a partial last chunk against the same numbers.
  for (double g_min : {-0.1, -3.0}) {
    INFO("g_min " << g_min);
    Problem p = make_problem({2, 9, 2, 3, 2}, g_min, -0.01, true, 400);
    const Vec R = randn(v_size(p.d), 401), RS = randn(state_size(p.d), 402);
    const Grads ga = backward<double>(p, R, RS, 0), gc = backward<double>(p, R, RS, 4);
    auto fd = [&](Vec& x) {
      Vec grad(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        const double xi = x[i];
        x[i] = xi + kFdStep;
        const Out up = forward<double>(p, 0);
        x[i] = xi - kFdStep;
        const Out down = forward<double>(p, 0);
        x[i] = xi;
        grad[i] = (dot(up.o, R) + dot(up.state, RS) - dot(down.o, R) - dot(down.state, RS)) / (2.0 * kFdStep);
      }
      return grad;
    };
    const Grads num{fd(p.q), fd(p.k), fd(p.v), fd(p.p), fd(p.g), fd(p.beta), fd(p.s0)};
    check_grads_close(ga, num, kFdTol);
    check_grads_close(gc, num, kFdTol);
  }
}

TEST_CASE("comba: float agrees with double for all four functions", "[kernels][comba]") {
  const Problem p = make_problem({2, 70, 2, 8, 6}, -2.0, -0.01, true, 500);
  const Vec d_o = randn(v_size(p.d), 501), d_state = randn(state_size(p.d), 502);
  for (int64_t chunk : {0, 16}) {
    INFO("chunk " << chunk);
    const Out fd = forward<double>(p, chunk), ff = forward<float>(p, chunk);
    CHECK(rel_err(ff.o, fd.o) < kF32Tol);
    CHECK(rel_err(ff.state, fd.state) < kF32Tol);
    check_grads_close(backward<float>(p, d_o, d_state, chunk), backward<double>(p, d_o, d_state, chunk), kF32Tol);
  }
}

TEST_CASE("comba: chunk_size must be positive", "[kernels][comba]") {
  const Problem p = make_problem({1, 3, 1, 2, 2}, -1.0, -0.1, false, 600);
  CHECK_THROWS_AS(forward<double>(p, -1), llmt::Error);
}
