// MDN core (mdn.md §5, §6.2, §6.4, §7.2, §7.3): hand-computed two-state recurrence, reduction to the GDN
// core (an independent oracle: mu = 0 gives GDN with beta' = beta eta), chunked form vs. the token-by-token
// oracle in many gate regimes (forward and backward, float64), central finite differences of both backwards
// for every input, and float vs. double.
// Loss for gradients: L = sum(o * R) + sum(S_T * R_S) + sum(M_T * R_M).
#include <catch2/catch.hpp>

#include "delta_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "kernels/cpu/gdn.h"
#include "kernels/cpu/mdn.h"

namespace {

using namespace llmt::test;
using llmt::cpu::DeltaDims;

// Ranges of the per-token gates: log α, log μ, β and η, each uniform in [min, max].
struct Regime {
  const char* name;
  double la_min, la_max, lm_min, lm_max, beta_min, beta_max, eta_min, eta_max;
};

// The regimes of the task and of mdn.md §8 / §12.1. "mu << alpha" and "authors' formula fails" are the
// cases where the code's (1 - exp(l_{j-1} - l_i)) form cancels (mdn.md §8.4 table, rows 1–2).
const Regime kRandom{"random gates", -1.0, -0.01, -2.0, -0.01, 0.05, 0.95, 0.1, 1.9};
const Regime kMuSmall{"mu << alpha", -0.02, -0.001, -3.0, -2.0, 0.05, 0.95, 0.1, 1.9};
const Regime kAuthorsFail{"authors' formula fails (log a = -0.01, log mu = -2, beta = 0.01)", -0.0101, -0.0099,
                          -2.0001, -1.9999, 0.0099, 0.0101, 0.9, 1.1};
const Regime kMuLarge{"mu > alpha", -2.0, -1.0, -0.05, -0.001, 0.05, 0.95, 0.1, 1.9};
const Regime kMuZero{"mu near 0 (log mu in [-40, -30])", -0.5, -0.01, -40.0, -30.0, 0.05, 0.95, 0.1, 1.9};
const Regime kStrong{"strong decay", -6.0, -3.0, -6.0, -3.0, 0.05, 0.95, 0.1, 1.9};
const Regime kBetaOne{"beta near 1", -0.2, -0.01, -1.0, -0.1, 0.95, 0.999, 0.5, 1.5};
// α = μ (constant): the closed form of mdn.md §6.4 changes to γ_ij = β (i-j+1) α^{i-j} (its α ≠ μ form divides by 0).
const Regime kEqual{"alpha == mu (constant 0.75)", std::log(0.75), std::log(0.75), std::log(0.75), std::log(0.75), 0.05,
                    0.95, 0.1, 1.9};
const Regime kAllRegimes[] = {kRandom, kMuSmall, kAuthorsFail, kMuLarge, kMuZero, kStrong, kBetaOne, kEqual};

// Core inputs as the layer produces them: q = l2norm(q) / sqrt(K), k = l2norm(k) (k_n), gates from the
// regime. s0/m0 empty means no initial state / momentum.
struct Problem {
  DeltaDims d;
  Vec q, k, v, la, beta, lm, eta, s0, m0;
};

Problem make_problem(DeltaDims d, const Regime& g, bool with_state, uint64_t seed) {
  const size_t n = tok_size(d);
  Problem p{d,
            randn(qk_size(d), seed),
            randn(qk_size(d), seed + 1),
            randn(v_size(d), seed + 2),
            uniform_values(n, g.la_min, g.la_max, 20251129, seed + 3),
            uniform_values(n, g.beta_min, g.beta_max, 20251129, seed + 4),
            uniform_values(n, g.lm_min, g.lm_max, 20251129, seed + 5),
            uniform_values(n, g.eta_min, g.eta_max, 20251129, seed + 6),
            with_state ? randn(state_size(d), seed + 7) : Vec(),
            with_state ? randn(state_size(d), seed + 8) : Vec()};
  set_row_lengths(p.q, d.key_dim, 1.0 / std::sqrt(static_cast<double>(d.key_dim)));
  set_row_lengths(p.k, d.key_dim, 1.0);
  return p;
}

// Typed copies of a Problem's inputs and the MdnInputs view of them.
template <typename T>
struct Typed {
  std::vector<T> q, k, v, la, beta, lm, eta, s0, m0;
  explicit Typed(const Problem& p)
      : q(cast<T>(p.q)),
        k(cast<T>(p.k)),
        v(cast<T>(p.v)),
        la(cast<T>(p.la)),
        beta(cast<T>(p.beta)),
        lm(cast<T>(p.lm)),
        eta(cast<T>(p.eta)),
        s0(cast<T>(p.s0)),
        m0(cast<T>(p.m0)) {}
  llmt::cpu::MdnInputs<T> inputs() const {
    return {q.data(),   k.data(),  v.data(), la.data(), beta.data(), lm.data(), eta.data(),
            s0.empty() ? nullptr : s0.data(), m0.empty() ? nullptr : m0.data()};
  }
};

struct Out {
  Vec o, state, momentum;
};
template <typename T>
Out forward(const Problem& p, int64_t chunk) {  // chunk 0: the recurrent form
  const Typed<T> in(p);
  std::vector<T> o(v_size(p.d)), s(state_size(p.d)), m(state_size(p.d));
  if (chunk == 0)
    llmt::cpu::mdn_recurrent_fwd(in.inputs(), p.d, o.data(), s.data(), m.data());
  else
    llmt::cpu::mdn_chunk_fwd(in.inputs(), p.d, o.data(), s.data(), m.data(), chunk);
  return {widen(o), widen(s), widen(m)};
}

struct Grads {
  Vec dq, dk, dv, dla, dbeta, dlm, deta, ds0, dm0;
};
// Every gradient buffer starts with random values: the kernels must overwrite them. d_state / d_mom
// empty: nullptr (zero) final-state gradients.
template <typename T>
Grads backward(const Problem& p, const Vec& d_o, const Vec& d_state, const Vec& d_mom, int64_t chunk) {
  const Typed<T> in(p);
  const auto dout = cast<T>(d_o), dst = cast<T>(d_state), dmo = cast<T>(d_mom);
  const size_t qk = qk_size(p.d), vs = v_size(p.d), tok = tok_size(p.d), st = state_size(p.d);
  auto dq = cast<T>(randn(qk, 91)), dk = cast<T>(randn(qk, 92)), dv = cast<T>(randn(vs, 93)),
       dla = cast<T>(randn(tok, 94)), db = cast<T>(randn(tok, 95)), dlm = cast<T>(randn(tok, 96)),
       de = cast<T>(randn(tok, 97)), ds0 = cast<T>(randn(st, 98)), dm0 = cast<T>(randn(st, 99));
  const llmt::cpu::MdnGrads<T> out{dq.data(),  dk.data(), dv.data(),  dla.data(), db.data(),
                                   dlm.data(), de.data(), ds0.data(), dm0.data()};
  const T* dst_ptr = d_state.empty() ? nullptr : dst.data();
  const T* dmo_ptr = d_mom.empty() ? nullptr : dmo.data();
  if (chunk == 0)
    llmt::cpu::mdn_recurrent_bwd(in.inputs(), dout.data(), dst_ptr, dmo_ptr, p.d, out);
  else
    llmt::cpu::mdn_chunk_bwd(in.inputs(), dout.data(), dst_ptr, dmo_ptr, p.d, out, chunk);
  return {widen(dq), widen(dk), widen(dv), widen(dla), widen(db), widen(dlm), widen(de), widen(ds0), widen(dm0)};
}

// Returns the largest of the nine relative errors (for reporting) after checking each against tol.
double check_grads_close(const Grads& a, const Grads& ref, double tol) {
  const double e[9] = {rel_err(a.dq, ref.dq),       rel_err(a.dk, ref.dk),   rel_err(a.dv, ref.dv),
                       rel_err(a.dla, ref.dla),     rel_err(a.dbeta, ref.dbeta), rel_err(a.dlm, ref.dlm),
                       rel_err(a.deta, ref.deta),   rel_err(a.ds0, ref.ds0), rel_err(a.dm0, ref.dm0)};
  const char* names[9] = {"dq", "dk", "dv", "dlog_alpha", "dbeta", "dlog_mu", "deta", "dS0", "dM0"};
  for (int i = 0; i < 9; ++i) {
    INFO(names[i]);
    CHECK(e[i] < tol);
  }
  return *std::max_element(e, e + 9);
}

double check_out_close(const Out& a, const Out& ref, double tol) {
  const double eo = rel_err(a.o, ref.o), es = rel_err(a.state, ref.state), em = rel_err(a.momentum, ref.momentum);
  CHECK(eo < tol);
  CHECK(es < tol);
  CHECK(em < tol);
  return std::max({eo, es, em});
}

// The grid of the chunked-vs-recurrent tests in regime g: f(problem, chunk) for T in {1, 5, 64, 65, 150},
// chunk in {16, 64}, with and without initial states.
template <class F>
void for_each_chunk_case(const Regime& g, F f) {
  for (int64_t T : {1, 5, 64, 65, 150})
    for (int64_t chunk : {16, 64})
      for (bool with_state : {false, true}) {
        INFO(g.name << ": T " << T << " chunk " << chunk << " initial states " << with_state);
        f(make_problem({2, T, 2, 8, 6}, g, with_state, 100 + T), chunk);
      }
}

}  // namespace

TEST_CASE("mdn: hand-computed two-state recurrence, T = 2, K = V = 1", "[kernels][mdn]") {
  // S0 = 1, M0 = 0.5, k = 1 both steps. p = α k, k̂ = η k.
  // t=1: α = 0.5, μ = 0.5, β = 0.5, η = 1, q = 1, v = 2: ṽ = 2 - 1·0.5 = 1.5; M1 = 0.5·0.5 - 1.5 = -1.25;
  //      S1 = 0.5·1 - 0.5·(-1.25) = 1.125; o1 = 1.125.
  // t=2: α = 0.25, μ = 0.5, β = 0.25, η = 2, q = 2, v = 1: ṽ = 1 - 1.125·0.25 = 0.71875;
  //      M2 = 0.5·(-1.25) - 2·0.71875 = -2.0625; S2 = 0.25·1.125 - 0.25·(-2.0625) = 0.796875; o2 = 2 S2 = 1.59375.
  Problem p{{1, 2, 1, 1, 1}, {1, 2},     {1, 1}, {2, 1}, {std::log(0.5), std::log(0.25)}, {0.5, 0.25},
            {std::log(0.5), std::log(0.5)}, {1, 2}, {1}, {0.5}};
  for (int64_t chunk : {0, 1, 2, 64}) {
    INFO("chunk " << chunk);
    const Out f = forward<double>(p, chunk);
    CHECK(f.o[0] == Approx(1.125).margin(1e-15));
    CHECK(f.o[1] == Approx(1.59375).margin(1e-15));
    CHECK(f.state[0] == Approx(0.796875).margin(1e-15));
    CHECK(f.momentum[0] == Approx(-2.0625).margin(1e-15));
  }
}

TEST_CASE("mdn: mu = 0 is GDN with beta' = beta eta (independent oracle: gdn_recurrent_fwd/bwd)", "[kernels][mdn]") {
  // With μ_t = 0: M_t = -η_t k_t ṽ_t^T, S_t = α_t S_{t-1} + β_t η_t k_t (v_t - α_t S_{t-1}^T k_t)^T, i.e. GDN with
  // g = log α and β' = βη; then dβ = η dβ', dη = β dβ', d log μ = 0 and dM_0 = 0 (M_0 is multiplied by μ_1 = 0).
  // η = 1 is mdn.md §5's stated reduction; random η also checks the eta path. log μ = -inf is exact μ = 0;
  // log μ = -60 (μ ~ 1e-26) must agree to rounding.
  const double inf = std::numeric_limits<double>::infinity();
  double worst = 0.0;
  for (double lm : {-inf, -60.0})
    for (bool unit_eta : {true, false}) {
      INFO("log mu " << lm << " eta = 1 " << unit_eta);
      Problem p = make_problem({2, 37, 2, 5, 3}, kRandom, true, 50);
      const DeltaDims& d = p.d;
      std::fill(p.lm.begin(), p.lm.end(), lm);
      if (unit_eta) std::fill(p.eta.begin(), p.eta.end(), 1.0);
      Vec beta_g(tok_size(d));
      for (size_t i = 0; i < beta_g.size(); ++i) beta_g[i] = p.beta[i] * p.eta[i];
      const Vec d_o = randn(v_size(d), 51), d_state = randn(state_size(d), 52), d_mom = randn(state_size(d), 53);
      Vec o(v_size(d)), s(state_size(d)), dq(qk_size(d)), dk(qk_size(d)), dv(v_size(d)), dg(tok_size(d)),
          db(tok_size(d)), ds0(state_size(d));
      const llmt::cpu::GdnInputs<double> gin{p.q.data(), p.k.data(), p.v.data(), p.la.data(), beta_g.data(),
                                             p.s0.data()};
      llmt::cpu::gdn_recurrent_fwd(gin, d, o.data(), s.data());
      llmt::cpu::gdn_recurrent_bwd(gin, d_o.data(), d_state.data(), d,
                                   llmt::cpu::GdnGrads<double>{dq.data(), dk.data(), dv.data(), dg.data(), db.data(),
                                                               ds0.data()});
      Vec dbeta_ref(tok_size(d)), deta_ref(tok_size(d));
      for (size_t i = 0; i < db.size(); ++i) {
        dbeta_ref[i] = p.eta[i] * db[i];
        deta_ref[i] = p.beta[i] * db[i];
      }
      for (int64_t chunk : {0, 8, 64}) {
        INFO("chunk " << chunk);
        const Out f = forward<double>(p, chunk);
        const double eo = rel_err(f.o, o), es = rel_err(f.state, s);
        CHECK(eo < 1e-12);
        CHECK(es < 1e-12);
        // No dL/dM_T here: GDN has no momentum output to compare its gradient with.
        const Grads gm = backward<double>(p, d_o, d_state, {}, chunk);
        const double e[7] = {rel_err(gm.dq, dq),  rel_err(gm.dk, dk),       rel_err(gm.dv, dv),
                             rel_err(gm.dla, dg), rel_err(gm.dbeta, dbeta_ref), rel_err(gm.deta, deta_ref),
                             rel_err(gm.ds0, ds0)};
        for (double x : e) CHECK(x < 1e-12);
        worst = std::max({worst, eo, es, *std::max_element(e, e + 7)});
        if (std::isinf(lm)) {
          for (double x : gm.dlm) CHECK(x == 0.0);
          for (double x : gm.dm0) CHECK(x == 0.0);
          // With a final-momentum gradient too, nothing may become NaN (0 * inf) and dM_0 stays exactly 0.
          const Grads gh = backward<double>(p, d_o, d_state, d_mom, chunk);
          for (double x : gh.dm0) CHECK(x == 0.0);
          for (double x : gh.dlm) CHECK(x == 0.0);
          for (double x : gh.dq) CHECK(std::isfinite(x));
          for (double x : gh.dla) CHECK(std::isfinite(x));
        } else {
          CHECK(rel_err(gm.dlm, Vec(gm.dlm.size(), 0.0)) < 1e-20);
        }
      }
    }
  WARN("mdn vs GDN oracle (mu = 0): max rel err " << worst);
}

TEST_CASE("mdn: [B, T, H, *] layout: each head of a batched call equals a single-head call", "[kernels][mdn]") {
  const Problem p = make_problem({2, 5, 3, 4, 3}, kRandom, true, 10);
  const DeltaDims d = p.d, one{1, d.seq_len, 1, d.key_dim, d.value_dim};
  for (int64_t chunk : {0, 2}) {
    const Out all = forward<double>(p, chunk);
    for (int64_t b = 0; b < d.batch; ++b)
      for (int64_t h = 0; h < d.heads; ++h) {
        const Problem s{one,
                        head_rows(p.q, d, b, h, d.key_dim),
                        head_rows(p.k, d, b, h, d.key_dim),
                        head_rows(p.v, d, b, h, d.value_dim),
                        head_rows(p.la, d, b, h, 1),
                        head_rows(p.beta, d, b, h, 1),
                        head_rows(p.lm, d, b, h, 1),
                        head_rows(p.eta, d, b, h, 1),
                        head_state(p.s0, d, b, h),
                        head_state(p.m0, d, b, h)};
        const Out single = forward<double>(s, chunk);
        CHECK(head_rows(all.o, d, b, h, d.value_dim) == single.o);
        CHECK(head_state(all.state, d, b, h) == single.state);
        CHECK(head_state(all.momentum, d, b, h) == single.momentum);
      }
  }
}

TEST_CASE("mdn: chunked forward equals the recurrent form in every gate regime, float64", "[kernels][mdn]") {
  for (const Regime& g : kAllRegimes) {
    double worst = 0.0;
    for_each_chunk_case(g, [&](const Problem& p, int64_t chunk) {
      worst = std::max(worst, check_out_close(forward<double>(p, chunk), forward<double>(p, 0), kChunkTol));
    });
    WARN("mdn chunk fwd vs recurrent, " << g.name << ": max rel err " << worst);
  }
}

TEST_CASE("mdn: chunked backward equals the recurrent backward in every gate regime, float64", "[kernels][mdn]") {
  for (const Regime& g : kAllRegimes) {
    double worst = 0.0;
    for_each_chunk_case(g, [&](const Problem& p, int64_t chunk) {
      const int64_t T = p.d.seq_len;
      const Vec d_o = randn(v_size(p.d), 200 + T), d_state = randn(state_size(p.d), 300 + T),
                d_mom = randn(state_size(p.d), 400 + T);
      worst = std::max(worst, check_grads_close(backward<double>(p, d_o, d_state, d_mom, chunk),
                                                backward<double>(p, d_o, d_state, d_mom, 0), kChunkTol));
      worst = std::max(worst, check_grads_close(backward<double>(p, d_o, {}, {}, chunk),
                                                backward<double>(p, d_o, {}, {}, 0), kChunkTol));
    });
    WARN("mdn chunk bwd vs recurrent, " << g.name << ": max rel err " << worst);
  }
}

TEST_CASE("mdn: both backwards match central finite differences for every input", "[kernels][mdn]") {
  // T = 9 with chunk 4 puts a partial last chunk in the chunked backward. "mu near 0" is left out here:
  // its d log μ ~ μ ~ 1e-13 is below the finite-difference noise; the GDN-oracle test covers μ = 0.
  for (const Regime& g : {kRandom, kMuSmall, kMuLarge, kStrong, kBetaOne, kEqual}) {
    double worst_rec = 0.0, worst_chk = 0.0;
    Problem p = make_problem({2, 9, 2, 3, 2}, g, true, 400);
    const Vec R = randn(v_size(p.d), 401), RS = randn(state_size(p.d), 402), RM = randn(state_size(p.d), 403);
    const Grads ga = backward<double>(p, R, RS, RM, 0), gc = backward<double>(p, R, RS, RM, 4);
    auto fd = [&](Vec& x) {
      return fd_in_place(x, [&] {
        const Out out = forward<double>(p, 0);
        return dot(out.o, R) + dot(out.state, RS) + dot(out.momentum, RM);
      });
    };
    const Grads num{fd(p.q), fd(p.k), fd(p.v), fd(p.la), fd(p.beta), fd(p.lm), fd(p.eta), fd(p.s0), fd(p.m0)};
    {
      INFO(g.name << ": recurrent backward");
      worst_rec = check_grads_close(ga, num, kFdTol);
    }
    {
      INFO(g.name << ": chunked backward");
      worst_chk = check_grads_close(gc, num, kFdTol);
    }
    WARN("mdn FD, " << g.name << ": max rel err recurrent bwd " << worst_rec << ", chunk bwd " << worst_chk);
  }
}

TEST_CASE("mdn: float agrees with double for all four functions in every gate regime", "[kernels][mdn]") {
  // The float instantiation still computes in double internally; this checks the T = float I/O path and
  // that rounding the inputs to float is not amplified in any regime (incl. mu << alpha and mu near 0).
  for (const Regime& g : kAllRegimes) {
    const Problem p = make_problem({2, 70, 2, 8, 6}, g, true, 500);
    const Vec d_o = randn(v_size(p.d), 501), d_state = randn(state_size(p.d), 502),
              d_mom = randn(state_size(p.d), 503);
    double worst = 0.0;
    for (int64_t chunk : {0, 16}) {
      INFO(g.name << ": chunk " << chunk);
      worst = std::max(worst, check_out_close(forward<float>(p, chunk), forward<double>(p, chunk), kF32Tol));
      worst = std::max(worst, check_grads_close(backward<float>(p, d_o, d_state, d_mom, chunk),
                                                backward<double>(p, d_o, d_state, d_mom, chunk), kF32Tol));
    }
    WARN("mdn float vs double, " << g.name << ": max rel err " << worst);
  }
}

TEST_CASE("mdn: chunk_size must be positive", "[kernels][mdn]") {
  const Problem p = make_problem({1, 3, 1, 2, 2}, kRandom, false, 600);
  CHECK_THROWS_AS(forward<double>(p, -1), llmt::Error);
  const Typed<double> in(p);
  Vec o(v_size(p.d)), dq(qk_size(p.d)), dk(qk_size(p.d)), dv(v_size(p.d)), t1(tok_size(p.d)), t2(tok_size(p.d)),
      t3(tok_size(p.d)), t4(tok_size(p.d));
  CHECK_THROWS_AS(llmt::cpu::mdn_chunk_fwd(in.inputs(), p.d, o.data(), static_cast<double*>(nullptr),
                                           static_cast<double*>(nullptr), 0),
                  llmt::Error);
  const llmt::cpu::MdnGrads<double> gr{dq.data(), dk.data(), dv.data(), t1.data(), t2.data(),
                                       t3.data(), t4.data(), nullptr,   nullptr};
  CHECK_THROWS_AS(llmt::cpu::mdn_chunk_bwd(in.inputs(), o.data(), static_cast<const double*>(nullptr),
                                           static_cast<const double*>(nullptr), p.d, gr, 0),
                  llmt::Error);
}
