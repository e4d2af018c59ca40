// Comba layer-level blocks (layers-delta.md §4.2 steps 2-3, §5): the inner decay p = sigma(decay) k and the
// output correction q' = q - D sigma(decay) k, applied before the L2 norm. Hand-computed forward, float64
// central finite differences of every gradient for each on/off combination, accumulate semantics,
// float-vs-double agreement, and the CPU backend ops (comba_gates_*, comba_chunk_*) against the kernels.
#include <catch2/catch.hpp>

#include "vec_util.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <vector>

#include "core/rng.h"
#include "kernels/backend.h"
#include "kernels/cpu/comba.h"
#include "kernels/cpu/comba_gates.h"

namespace {

using namespace llmt::test;

// Central differences (fd_grad, h = 1e-5) on O(1) inputs: error ~1e-10 against O(1) gradients (as delta_blocks_test).
constexpr double kFdTol = 1e-8;
constexpr double kF32Tol = 1e-5;

struct In {
  Vec q, k, decay, D;
  int64_t rows, heads, dim;
  bool inner_decay = true, correction = true;
};
struct Out {
  Vec q_out, p;
};
template <typename T>
Out fwd(const In& in) {
  auto q = cast<T>(in.q), k = cast<T>(in.k), decay = cast<T>(in.decay), D = cast<T>(in.D);
  std::vector<T> q_out(in.q.size()), p(in.q.size());
  llmt::cpu::comba_gates_fwd<T>(q.data(), k.data(), in.inner_decay ? decay.data() : nullptr,
                                in.correction ? D.data() : nullptr, in.rows, in.heads, in.dim, q_out.data(),
                                p.data());
  return {widen(q_out), widen(p)};
}
struct Grads {
  Vec dk, ddecay, dD;
};
// dk, ddecay, dD start at the given values (all accumulated).
template <typename T>
Grads bwd(const Vec& dq_out, const Vec& dp, const In& in, const Vec& dk0, const Vec& ddecay0, const Vec& dD0) {
  auto dqo = cast<T>(dq_out), dpt = cast<T>(dp), k = cast<T>(in.k), decay = cast<T>(in.decay), D = cast<T>(in.D);
  auto dk = cast<T>(dk0), ddecay = cast<T>(ddecay0), dD = cast<T>(dD0);
  llmt::cpu::comba_gates_bwd<T>(dqo.data(), dpt.data(), k.data(), in.inner_decay ? decay.data() : nullptr,
                                in.correction ? D.data() : nullptr, in.rows, in.heads, in.dim, dk.data(),
                                in.inner_decay ? ddecay.data() : nullptr, in.correction ? dD.data() : nullptr);
  return {widen(dk), widen(ddecay), widen(dD)};
}

}  // namespace

TEST_CASE("comba_gates: hand-computed inner decay and output correction", "[comba_blocks]") {
  // Two heads of dim 2, one row. decay = (0, ln 3): s = (0.5, 0.75). D = (2, -1): D s = (1, -0.75).
  // head 0: k = (1, 2), q = (1, 1): p = (0.5, 1), q' = q - 1 * k = (0, -1).
  // head 1: k = (4, -4), q = (0, 0): p = (3, -3), q' = q + 0.75 k = (3, -3).
  In in{{1, 1, 0, 0}, {1, 2, 4, -4}, {0.0, std::log(3.0)}, {2, -1}, 1, 2, 2};
  Out o = fwd<double>(in);
  const Vec p{0.5, 1, 3, -3}, q_out{0, -1, 3, -3};
  for (size_t i = 0; i < 4; ++i) {
    CHECK(o.p[i] == Approx(p[i]).margin(1e-15));
    CHECK(o.q_out[i] == Approx(q_out[i]).margin(1e-15));
  }
  SECTION("without the inner decay s = 1: p = k, q' = q - D k") {
    in.inner_decay = false;
    o = fwd<double>(in);
    CHECK(o.p == in.k);
    CHECK(o.q_out == Vec{1 - 2, 1 - 4, 0 + 4, 0 - 4});
  }
  SECTION("without the output correction q' = q") {
    in.correction = false;
    o = fwd<double>(in);
    CHECK(o.q_out == in.q);
    CHECK(o.p == p);
  }
}

TEST_CASE("comba_gates: finite-difference gradients, all accumulated, every on/off combination; float",
          "[comba_blocks]") {
  const int64_t rows = 5, heads = 3, dim = 4;
  const size_t n = static_cast<size_t>(rows * heads * dim), nh = static_cast<size_t>(heads);
  for (const bool inner_decay : {true, false}) {
    for (const bool correction : {true, false}) {
      if (!inner_decay && !correction) continue;  // nothing to do: the layer skips the op
      INFO("inner_decay " << inner_decay << ", output_correction " << correction);
      In in{randn(n, 10), randn(n, 11), randn(nh, 12), randn(nh, 13), rows, heads, dim, inner_decay, correction};
      const Vec Rq = randn(n, 14), Rp = randn(n, 15), dk0 = randn(n, 16), ddecay0 = randn(nh, 17),
                dD0 = randn(nh, 18);
      const Grads g = bwd<double>(Rq, Rp, in, dk0, ddecay0, dD0);
      auto loss = [&](const In& p) {
        const Out f = fwd<double>(p);
        return dot(f.q_out, Rq) + dot(f.p, Rp);
      };
      auto fd = [&](Vec In::*field) {
        return fd_grad(
            [&](const Vec& v) {
              In p = in;
              p.*field = v;
              return loss(p);
            },
            in.*field);
      };
      // dq = dq' = Rq: the op writes no dq, check that this is the whole gradient of q.
      const double eq = rel_err(Rq, fd(&In::q)), ek = rel_err(minus(g.dk, dk0), fd(&In::k));
      std::printf("comba_gates fd (inner_decay %d, correction %d): dq %.3g dk %.3g", inner_decay, correction, eq, ek);
      CHECK(eq < kFdTol);
      CHECK(ek < kFdTol);
      if (inner_decay) {
        const double ed = rel_err(minus(g.ddecay, ddecay0), fd(&In::decay));
        std::printf(" ddecay %.3g", ed);
        CHECK(ed < kFdTol);
      } else {
        CHECK(g.ddecay == ddecay0);  // untouched
      }
      if (correction) {
        const double eD = rel_err(minus(g.dD, dD0), fd(&In::D));
        std::printf(" dD %.3g", eD);
        CHECK(eD < kFdTol);
      } else {
        CHECK(g.dD == dD0);
      }
      std::printf("\n");

      const Out f64 = fwd<double>(in), f32 = fwd<float>(in);
      CHECK(rel_err(f32.q_out, f64.q_out) < kF32Tol);
      CHECK(rel_err(f32.p, f64.p) < kF32Tol);
      const Grads g32 = bwd<float>(Rq, Rp, in, dk0, ddecay0, dD0);
      CHECK(rel_err(g32.dk, g.dk) < kF32Tol);
      if (inner_decay) CHECK(rel_err(g32.ddecay, g.ddecay) < kF32Tol);
      if (correction) CHECK(rel_err(g32.dD, g.dD) < kF32Tol);
    }
  }
}

TEST_CASE("comba backend ops: the CPU backend matches the kernels; absent decay is a default Tensor",
          "[comba_blocks]") {
  auto be = llmt::make_cpu_backend();
  using llmt::DType;
  using llmt::OwnedTensor;
  const int64_t B = 2, T = 7, H = 2, K = 3, V = 2, rows = B * T;
  const size_t nk = static_cast<size_t>(rows * H * K), nv = static_cast<size_t>(rows * H * V),
               nh = static_cast<size_t>(rows * H);
  auto put = [&](const Vec& v, std::initializer_list<int64_t> shape) {
    OwnedTensor t(*be, DType::f64, shape);
    be->upload(v.data(), *t);
    return t;
  };
  auto get = [&](const OwnedTensor& t) {
    Vec v(static_cast<size_t>(t->numel()));
    be->download(*t, v.data());
    return v;
  };

  SECTION("comba_gates_fwd / bwd") {
    In in{randn(nk, 30), randn(nk, 31), randn(H, 32), randn(H, 33), rows, H, K, false, true};
    const OwnedTensor q = put(in.q, {rows, H * K}), k = put(in.k, {rows, H * K}), D = put(in.D, {H}),
                      q_out = put(Vec(nk), {rows, H * K}), p = put(Vec(nk), {rows, H * K});
    be->comba_gates_fwd(*q, *k, llmt::Tensor(), *D, *q_out, *p);
    const Out ref = fwd<double>(in);
    CHECK(get(q_out) == ref.q_out);
    CHECK(get(p) == ref.p);
    const Vec Rq = randn(nk, 34), Rp = randn(nk, 35), dk0 = randn(nk, 36), dD0 = randn(H, 37);
    const OwnedTensor dq = put(Rq, {rows, H * K}), dp = put(Rp, {rows, H * K}), dk = put(dk0, {rows, H * K}),
                      dD = put(dD0, {H});
    be->comba_gates_bwd(*dq, *dp, *k, llmt::Tensor(), *D, *dk, llmt::Tensor(), *dD);
    const Grads g = bwd<double>(Rq, Rp, in, dk0, Vec(H), dD0);
    CHECK(get(dk) == g.dk);
    CHECK(get(dD) == g.dD);
    // Neither part given is refused, as is a per-head vector that does not divide the rows.
    CHECK_THROWS(be->comba_gates_fwd(*q, *k, llmt::Tensor(), llmt::Tensor(), *q_out, *p));
    const OwnedTensor D4 = put(Vec(4, 1.0), {4});
    CHECK_THROWS(be->comba_gates_fwd(*q, *k, llmt::Tensor(), *D4, *q_out, *p));
  }

  SECTION("comba_chunk_fwd / bwd equal the recurrent core with a zero initial state") {
    // Normalised-looking inputs are not needed by the core; g <= 0, beta in (0, 1).
    Vec q = randn(nk, 40), k = randn(nk, 41), p = randn(nk, 42), v = randn(nv, 43), g = randn(nh, 44),
        beta = randn(nh, 45), d_o = randn(nv, 46);
    for (double& x : g) x = -std::abs(x);
    for (double& x : beta) x = 1.0 / (1.0 + std::exp(-x));
    const OwnedTensor tq = put(q, {B, T, H, K}), tk = put(k, {B, T, H, K}), tp = put(p, {B, T, H, K}),
                      tv = put(v, {B, T, H, V}), tg = put(g, {B, T, H}), tb = put(beta, {B, T, H}),
                      to = put(Vec(nv), {B, T, H, V}), tdo = put(d_o, {B, T, H, V});
    // T = 7: a full and a partial chunk; nothing saved (the CPU backend keeps nothing from the forward).
    be->comba_chunk_fwd(*tq, *tk, *tv, *tp, *tg, *tb, 4, DType::f64, *to, llmt::Tensor());
    const llmt::cpu::CombaInputs<double> in{q.data(), k.data(), v.data(), p.data(), g.data(), beta.data(), nullptr};
    const llmt::cpu::DeltaDims d{B, T, H, K, V};
    Vec o_ref(nv);
    llmt::cpu::comba_recurrent_fwd<double>(in, d, o_ref.data(), nullptr);
    CHECK(rel_err(get(to), o_ref) < 1e-12);

    const OwnedTensor dq = put(Vec(nk), {B, T, H, K}), dk = put(Vec(nk), {B, T, H, K}),
                      dp = put(Vec(nk), {B, T, H, K}), dv = put(Vec(nv), {B, T, H, V}), dg = put(Vec(nh), {B, T, H}),
                      dbeta = put(Vec(nh), {B, T, H});
    be->comba_chunk_bwd(*tq, *tk, *tv, *tp, *tg, *tb, *tdo, llmt::Tensor(), 4, DType::f64, *dq, *dk, *dv, *dp, *dg,
                        *dbeta);
    Vec rq(nk), rk(nk), rp(nk), rv(nv), rg(nh), rb(nh);
    const llmt::cpu::CombaGrads<double> ref{rq.data(), rk.data(), rv.data(), rp.data(), rg.data(), rb.data(), nullptr};
    llmt::cpu::comba_recurrent_bwd<double>(in, d_o.data(), nullptr, d, ref);
    CHECK(rel_err(get(dq), rq) < 1e-12);
    CHECK(rel_err(get(dk), rk) < 1e-12);
    CHECK(rel_err(get(dp), rp) < 1e-12);
    CHECK(rel_err(get(dv), rv) < 1e-12);
    CHECK(rel_err(get(dg), rg) < 1e-12);
    CHECK(rel_err(get(dbeta), rb) < 1e-12);
  }
}
