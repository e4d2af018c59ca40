// Mamba-3 core (layers-ssm-attn.md §4.3.2–4.3.3, §4.4, §4.5), SISO (R = 1) and MIMO (R = 2, 4):
// hand-computed recurrence, chunked form vs. the token-by-token oracle (forward and backward, float64),
// central finite differences of both backwards for every input, causality (σ_t holds token t+1's λ, Δ),
// and float vs. double. Loss for gradients: L = sum(y * Rw).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/mamba3.h"
#include "vec_util.h"

namespace {

using namespace llmt::test;
using llmt::cpu::Mamba3Dims;

// Chunked and recurrent forms are algebraically equal; in float64 they differ by rounding only.
constexpr double kChunkTol = 1e-10;
// Central differences with h = 1e-6: truncation ~ h^2 |L'''| ~ 1e-12, rounding ~ 1e-16 |L| / h ~ 1e-9
// against O(1) gradients; a wrong term gives an error of order 1.
constexpr double kFdStep = 1e-6;
constexpr double kFdTol = 1e-7;
// float (24-bit mantissa) against double after a few hundred operations per output.
constexpr double kF32Tol = 1e-5;

size_t qk_size(const Mamba3Dims& d) {
  return static_cast<size_t>(d.batch * d.seq_len * d.heads * d.rank * d.state_dim);
}
size_t v_size(const Mamba3Dims& d) { return static_cast<size_t>(d.batch * d.seq_len * d.heads * d.rank * d.head_dim); }
size_t tok_size(const Mamba3Dims& d) { return static_cast<size_t>(d.batch * d.seq_len * d.heads); }

// Core inputs as the layer produces them: Δ = softplus(normal) · dt_scale, λ = σ(normal), a = -Δ · A with
// A = softplus(normal) · a_scale, γ = λ Δ, ε = (1 - λ) Δ; q, k, v, D normal.
struct Problem {
  Mamba3Dims d;
  Vec q, k, v, a, gamma, eps, D;
};

double softplus(double x) { return std::log1p(std::exp(x)); }

Problem make_problem(Mamba3Dims d, double dt_scale, double a_scale, uint64_t seed) {
  Problem p{d, randn(qk_size(d), seed), randn(qk_size(d), seed + 1), randn(v_size(d), seed + 2),
            randn(tok_size(d), seed + 3), randn(tok_size(d), seed + 4), randn(tok_size(d), seed + 5),
            randn(static_cast<size_t>(d.heads), seed + 6)};
  const Vec A = randn(tok_size(d), seed + 7);
  for (size_t i = 0; i < p.a.size(); ++i) {
    const double dt = dt_scale * softplus(p.a[i]), lam = 1.0 / (1.0 + std::exp(-p.gamma[i]));
    p.a[i] = -dt * a_scale * softplus(A[i]);
    p.gamma[i] = lam * dt;
    p.eps[i] = (1.0 - lam) * dt;
  }
  return p;
}

template <typename T>
struct Typed {
  std::vector<T> q, k, v, a, gamma, eps, D;
  explicit Typed(const Problem& p)
      : q(cast<T>(p.q)), k(cast<T>(p.k)), v(cast<T>(p.v)), a(cast<T>(p.a)), gamma(cast<T>(p.gamma)),
        eps(cast<T>(p.eps)), D(cast<T>(p.D)) {}
  llmt::cpu::Mamba3Inputs<T> inputs() const {
    return {q.data(), k.data(), v.data(), a.data(), gamma.data(), eps.data(), D.data()};
  }
};

template <typename T>
Vec forward(const Problem& p, int64_t chunk) {  // chunk 0: the recurrent form
  const Typed<T> in(p);
  std::vector<T> y(v_size(p.d));
  if (chunk == 0)
    llmt::cpu::mamba3_recurrent_fwd(in.inputs(), p.d, y.data());
  else
    llmt::cpu::mamba3_chunk_fwd(in.inputs(), p.d, y.data(), chunk);
  return widen(y);
}

struct Grads {
  Vec dq, dk, dv, da, dgamma, deps, dD;
};
// Every gradient buffer starts with random values: the kernels must overwrite them.
template <typename T>
Grads backward(const Problem& p, const Vec& d_y, int64_t chunk) {
  const Typed<T> in(p);
  const auto dy = cast<T>(d_y);
  auto dq = cast<T>(randn(qk_size(p.d), 91)), dk = cast<T>(randn(qk_size(p.d), 92)),
       dv = cast<T>(randn(v_size(p.d), 93)), da = cast<T>(randn(tok_size(p.d), 94)),
       dg = cast<T>(randn(tok_size(p.d), 95)), de = cast<T>(randn(tok_size(p.d), 96)),
       dD = cast<T>(randn(static_cast<size_t>(p.d.heads), 97));
  const llmt::cpu::Mamba3Grads<T> out{dq.data(), dk.data(), dv.data(), da.data(), dg.data(), de.data(), dD.data()};
  if (chunk == 0)
    llmt::cpu::mamba3_recurrent_bwd(in.inputs(), dy.data(), p.d, out);
  else
    llmt::cpu::mamba3_chunk_bwd(in.inputs(), dy.data(), p.d, out, chunk);
  return {widen(dq), widen(dk), widen(dv), widen(da), widen(dg), widen(de), widen(dD)};
}

std::vector<double> grad_errs(const Grads& a, const Grads& ref) {
  return {rel_err(a.dq, ref.dq),         rel_err(a.dk, ref.dk),     rel_err(a.dv, ref.dv), rel_err(a.da, ref.da),
          rel_err(a.dgamma, ref.dgamma), rel_err(a.deps, ref.deps), rel_err(a.dD, ref.dD)};
}

// The largest relative error over all seven gradients (printed by the tests).
double max_grad_err(const Grads& a, const Grads& ref) {
  const auto e = grad_errs(a, ref);
  return *std::max_element(e.begin(), e.end());
}

void check_grads_close(const Grads& a, const Grads& ref, double tol) {
  const char* names[] = {"dq", "dk", "dv", "da", "dgamma", "deps", "dD"};
  const auto e = grad_errs(a, ref);
  for (size_t i = 0; i < e.size(); ++i) {
    INFO(names[i] << " rel err " << e[i]);
    CHECK(e[i] < tol);
  }
}

}  // namespace

TEST_CASE("mamba3: hand-computed recurrence, T = 2, P = N = R = 1", "[kernels][mamba3]") {
  // t=0: H0 = γ0 v0 k0 = 1·2·1 = 2; y0 = H0 q0 + D v0 = 6 + 1 = 7 (a0 and ε0 have nothing to act on).
  // t=1: α1 = 0.5; H1 = α1 H0 + ε1 α1 v0 k0 + γ1 v1 k1 = 1 + 2 + 2 = 5; y1 = H1 q1 + D v1 = 5 + 2 = 7.
  const Problem p{{1, 2, 1, 1, 1, 1}, {3, 1}, {1, 1}, {2, 4}, {-1.0, -std::log(2.0)}, {1, 0.5}, {5, 2}, {0.5}};
  for (int64_t chunk : {0, 1, 2, 64}) {
    INFO("chunk " << chunk);
    const Vec y = forward<double>(p, chunk);
    CHECK(y[0] == Approx(7.0).margin(1e-14));
    CHECK(y[1] == Approx(7.0).margin(1e-14));
  }
}

TEST_CASE("mamba3: chunked forward and backward equal the recurrent form, float64", "[kernels][mamba3]") {
  // T in {1, Q-1, Q, Q+1, 3Q+5} for Q = 16 and the reference Q = 64; weak and strong decay; R = 1, 2, 4.
  double worst_fwd = 0, worst_bwd = 0;
  for (int64_t R : {1, 2, 4})
    for (int64_t T : {1, 15, 16, 17, 53, 70})
      for (int64_t chunk : {16, 64})
        for (double a_scale : {0.5, 8.0}) {
          INFO("R " << R << " T " << T << " chunk " << chunk << " a_scale " << a_scale);
          const Problem p = make_problem({2, T, 3, 3, 5, R}, 0.5, a_scale, 100 + T + R);
          const Vec ref = forward<double>(p, 0), chk = forward<double>(p, chunk);
          CHECK(rel_err(chk, ref) < kChunkTol);
          worst_fwd = std::max(worst_fwd, rel_err(chk, ref));
          const Vec d_y = randn(v_size(p.d), 200 + T);
          const Grads gc = backward<double>(p, d_y, chunk), gr = backward<double>(p, d_y, 0);
          check_grads_close(gc, gr, kChunkTol);
          worst_bwd = std::max(worst_bwd, max_grad_err(gc, gr));
        }
  std::printf("mamba3 core chunked vs recurrent (float64): forward %.3g, backward %.3g\n", worst_fwd, worst_bwd);
}

TEST_CASE("mamba3: both backwards match central finite differences for every input", "[kernels][mamba3]") {
  // T = 9 with chunk 4 exercises a partial last chunk and σ across chunk boundaries.
  for (int64_t R : {1, 3}) {
    INFO("R " << R);
    Problem p = make_problem({2, 9, 2, 3, 2, R}, 0.5, 2.0, 400 + R);
    const Vec Rw = randn(v_size(p.d), 401);
    const Grads gr = backward<double>(p, Rw, 0), gc = backward<double>(p, Rw, 4);
    auto fd = [&](Vec& v) {
      Vec grad(v.size());
      for (size_t i = 0; i < v.size(); ++i) {
        const double vi = v[i];
        v[i] = vi + kFdStep;
        const double up = dot(forward<double>(p, 0), Rw);
        v[i] = vi - kFdStep;
        const double down = dot(forward<double>(p, 0), Rw);
        v[i] = vi;
        grad[i] = (up - down) / (2.0 * kFdStep);
      }
      return grad;
    };
    const Grads num{fd(p.q), fd(p.k), fd(p.v), fd(p.a), fd(p.gamma), fd(p.eps), fd(p.D)};
    check_grads_close(gr, num, kFdTol);
    check_grads_close(gc, num, kFdTol);
    std::printf("mamba3 core finite differences (R %lld): recurrent %.3g, chunked %.3g\n", static_cast<long long>(R),
                max_grad_err(gr, num), max_grad_err(gc, num));
  }
}

TEST_CASE("mamba3: causality, perturbing inputs after t leaves outputs up to t unchanged", "[kernels][mamba3]") {
  const Problem p = make_problem({1, 23, 2, 3, 4, 2}, 0.5, 2.0, 700);
  const Mamba3Dims& d = p.d;
  for (int64_t chunk : {0, 8})
    for (int64_t t : {0, 7, 8, 15}) {
      INFO("chunk " << chunk << " t " << t);
      Problem q = p;
      const size_t H = static_cast<size_t>(d.heads), first = static_cast<size_t>(t + 1);
      const size_t qk_row = H * static_cast<size_t>(d.rank * d.state_dim);
      const size_t v_row = H * static_cast<size_t>(d.rank * d.head_dim);
      for (size_t i = first * qk_row; i < q.q.size(); ++i) q.q[i] += 1.0;
      for (size_t i = first * qk_row; i < q.k.size(); ++i) q.k[i] -= 0.7;
      for (size_t i = first * v_row; i < q.v.size(); ++i) q.v[i] += 2.0;
      for (size_t i = first * H; i < q.a.size(); ++i) {  // token t+1's λ, Δ enter σ_t
        q.a[i] *= 3.0;
        q.gamma[i] += 0.3;
        q.eps[i] *= 2.0;
      }
      const Vec a = forward<double>(p, chunk), b = forward<double>(q, chunk);
      const size_t prefix = first * v_row;
      CHECK(Vec(a.begin(), a.begin() + prefix) == Vec(b.begin(), b.begin() + prefix));
      CHECK(Vec(a.begin() + prefix, a.end()) != Vec(b.begin() + prefix, b.end()));
    }
}

TEST_CASE("mamba3: float agrees with double for all four functions", "[kernels][mamba3]") {
  for (int64_t R : {1, 4}) {
    const Problem p = make_problem({2, 70, 3, 8, 6, R}, 0.5, 2.0, 500);
    const Vec d_y = randn(v_size(p.d), 501);
    for (int64_t chunk : {0, 16}) {
      INFO("R " << R << " chunk " << chunk);
      const Vec yd = forward<double>(p, chunk), yf = forward<float>(p, chunk);
      CHECK(rel_err(yf, yd) < kF32Tol);
      const Grads gf = backward<float>(p, d_y, chunk), gd = backward<double>(p, d_y, chunk);
      check_grads_close(gf, gd, kF32Tol);
      std::printf("mamba3 core float vs double (R %lld, chunk %lld): y %.3g, gradients %.3g\n",
                  static_cast<long long>(R), static_cast<long long>(chunk), rel_err(yf, yd), max_grad_err(gf, gd));
    }
  }
}

TEST_CASE("mamba3: invalid chunk size and sizes are rejected", "[kernels][mamba3]") {
  const Problem p = make_problem({1, 3, 2, 2, 2, 1}, 0.5, 2.0, 600);
  CHECK_THROWS_AS(forward<double>(p, -1), llmt::Error);
  Problem q = p;
  q.d.rank = 0;
  CHECK_THROWS_AS(forward<double>(q, 0), llmt::Error);
}
