// The MDN gates and output correction (mdn.md §4.2, §4.4, §7.4; kernels/cpu/mdn_gates.h): hand-computed
// forwards, float64 central finite-difference checks of every gradient (loss L = Σ out ⊙ R with fixed random
// R) in every option (floor clamping, no α_max, no β_max, η = 2σ, no momentum), overwrite / accumulate semantics.
#include <catch2/catch.hpp>

#include "vec_util.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/mdn_gates.h"
#include "test_util.h"

namespace {

using namespace llmt::test;
using llmt::MdnGateOptions;

// Central differences (h = 1e-5) on O(1) inputs: truncation ~1e-11, rounding ~1e-10 against O(1)
// gradients; a wrong term in an analytic gradient is of order 1.
constexpr double kFdTol = 1e-8;

// All gate inputs of `rows` tokens and `heads` heads, in the order of the kernel's arguments.
struct GateIn {
  Vec za, zb, zm, ze, A_log, dt_bias, Mu_log, mu_bias, log_factor;
};
struct GateOut {
  Vec log_alpha, beta, log_mu, eta;
};

GateOut gates_fwd(const GateIn& in, int64_t rows, int64_t heads, const MdnGateOptions& opt) {
  const auto n = static_cast<size_t>(rows * heads);
  GateOut o{Vec(n), Vec(n), Vec(n), Vec(n)};
  llmt::cpu::mdn_gates_fwd<double>(in.za.data(), in.zb.data(), in.zm.data(), in.ze.data(), in.A_log.data(),
                                   in.dt_bias.data(), in.Mu_log.data(), in.mu_bias.data(), in.log_factor.data(), rows,
                                   heads, opt, o.log_alpha.data(), o.beta.data(), o.log_mu.data(), o.eta.data());
  return o;
}

TEST_CASE("mdn gates: hand-computed values") {
  // z = 0 everywhere, A_log = dt_bias = Mu_log = mu_bias = log_factor = 0: softplus(0) = log 2, η = 1, s = 1,
  // x = 1, α_max = β_max = 1/2: log α = -2 log 2, β = σ(0) / 2 = 1/4, log μ = -log 2 (above the floor -2).
  GateIn in{{0}, {0}, {0}, {0}, {0}, {0}, {0}, {0}, {0}};
  MdnGateOptions opt;
  opt.tau = 32.0;
  GateOut o = gates_fwd(in, 1, 1, opt);
  CHECK(o.log_alpha[0] == Approx(-2.0 * std::log(2.0)).epsilon(1e-14));
  CHECK(o.beta[0] == Approx(0.25).epsilon(1e-14));
  CHECK(o.log_mu[0] == Approx(-std::log(2.0)).epsilon(1e-14));
  CHECK(o.eta[0] == Approx(1.0).epsilon(1e-14));
  // A floor above -log 2 clamps log μ.
  opt.min_log_mu = -0.5;
  CHECK(gates_fwd(in, 1, 1, opt).log_mu[0] == -0.5);
  // z_η = τ atanh(1/2): η = 3/2; s = 2: x = 3, α_max = 1/10, β_max = 9/10. z_β = log 3: σ = 3/4, β = 27/40.
  // z_α = log(e - 1) - dt_bias with A_log = log 3: softplus = 1, log α = -3 + log(1/10).
  // z_μ = 0, mu_bias = log(e^{0.25} - 1), Mu_log = log 2: log μ = -2 * 0.25 = -0.5 (floor -2).
  in = {{std::log(std::exp(1.0) - 1.0) - 0.3},
        {std::log(3.0)},
        {0.0},
        {32.0 * std::atanh(0.5)},
        {std::log(3.0)},
        {0.3},
        {std::log(2.0)},
        {std::log(std::exp(0.25) - 1.0)},
        {std::log(2.0)}};
  opt.min_log_mu = -2.0;
  o = gates_fwd(in, 1, 1, opt);
  CHECK(o.eta[0] == Approx(1.5).epsilon(1e-13));
  CHECK(o.log_alpha[0] == Approx(-3.0 + std::log(0.1)).epsilon(1e-13));
  CHECK(o.beta[0] == Approx(27.0 / 40.0).epsilon(1e-13));
  CHECK(o.log_mu[0] == Approx(-0.5).epsilon(1e-13));
  // Ablations: no β_max gives β = σ(z_β) = 3/4; η = 2σ(z_η/τ) = 2σ(atanh(1/2)) = 2 / (1 + e^{-atanh(1/2)})
  // = 2 / (1 + 1/sqrt(3)).
  opt.beta_max = false;
  opt.eta_two_sigmoid = true;
  o = gates_fwd(in, 1, 1, opt);
  const double eta2 = 2.0 / (1.0 + 1.0 / std::sqrt(3.0)), x = 2.0 * eta2;
  CHECK(o.beta[0] == Approx(0.75).epsilon(1e-13));
  CHECK(o.eta[0] == Approx(eta2).epsilon(1e-13));
  CHECK(o.log_alpha[0] == Approx(-3.0 - std::log(1.0 + x * x)).epsilon(1e-13));
  // No α_max: log α = -3 (the decay alone), β unchanged.
  opt.alpha_max = false;
  o = gates_fwd(in, 1, 1, opt);
  CHECK(o.log_alpha[0] == Approx(-3.0).epsilon(1e-13));
  CHECK(o.beta[0] == Approx(0.75).epsilon(1e-13));
  opt.beta_max = true;
  CHECK(gates_fwd(in, 1, 1, opt).beta[0] == Approx(0.75 * x * x / (1.0 + x * x)).epsilon(1e-13));
  // No momentum: μ = 0 (log μ = -inf), η = 1, x = s = 2: α_max = 1/5, β_max = 4/5.
  opt = MdnGateOptions{};
  opt.tau = 32.0;
  opt.momentum = false;
  o = gates_fwd(in, 1, 1, opt);
  CHECK(o.log_mu[0] == -std::numeric_limits<double>::infinity());
  CHECK(o.eta[0] == 1.0);
  CHECK(o.log_alpha[0] == Approx(-3.0 + std::log(0.2)).epsilon(1e-13));
  CHECK(o.beta[0] == Approx(0.75 * 0.8).epsilon(1e-13));
}

// Packs the differentiable inputs into one vector (z's then parameters) and back.
Vec pack(const GateIn& g) {
  Vec v;
  for (const Vec* p : {&g.za, &g.zb, &g.zm, &g.ze, &g.A_log, &g.dt_bias, &g.Mu_log, &g.mu_bias, &g.log_factor})
    v.insert(v.end(), p->begin(), p->end());
  return v;
}
GateIn unpack(const Vec& v, size_t n, size_t h) {
  GateIn g;
  size_t at = 0;
  const auto take = [&](Vec& dst, size_t m) {
    dst.assign(v.begin() + static_cast<std::ptrdiff_t>(at), v.begin() + static_cast<std::ptrdiff_t>(at + m));
    at += m;
  };
  take(g.za, n), take(g.zb, n), take(g.zm, n), take(g.ze, n);
  take(g.A_log, h), take(g.dt_bias, h), take(g.Mu_log, h), take(g.mu_bias, h), take(g.log_factor, h);
  return g;
}

TEST_CASE("mdn gates: finite-difference gradients in every option") {
  const int64_t rows = 7, heads = 3;
  const auto n = static_cast<size_t>(rows * heads), H = static_cast<size_t>(heads);
  GateIn in{randn(n, 1), randn(n, 2), randn(n, 3), randn(n, 4), randn(H, 5), randn(H, 6), randn(H, 7), randn(H, 8),
            randn(H, 9)};
  for (double& z : in.ze) z *= 3.0;  // with τ = 2 below, z_η / τ spans the non-linear part of tanh
  const Vec ra = randn(n, 10), rb = randn(n, 11), rm = randn(n, 12), re = randn(n, 13);
  MdnGateOptions base;
  base.tau = 2.0;
  base.min_log_mu = -1.0;  // clamps some tokens of this draw (checked below)
  struct Case {
    const char* name;
    bool alpha_max, beta_max, two_sigmoid, momentum;
  };
  // No α_max drops log α's dependence on x = s η: with β_max, log_factor and z_η still get β's gradient; without
  // either, x feeds nothing (dlog_factor = 0, dz_η = d_η dη/dz_η only).
  for (const Case c : {Case{"default", true, true, false, true}, Case{"no alpha_max", false, true, false, true},
                       Case{"no beta_max", true, false, false, true},
                       Case{"no alpha_max, no beta_max", false, false, false, true},
                       Case{"eta = 2 sigmoid", true, true, true, true}, Case{"no momentum", true, true, false, false},
                       Case{"no momentum, no alpha_max", false, true, false, false}}) {
    SECTION(c.name) {
      MdnGateOptions opt = base;
      opt.alpha_max = c.alpha_max;
      opt.beta_max = c.beta_max;
      opt.eta_two_sigmoid = c.two_sigmoid;
      opt.momentum = c.momentum;
      const auto loss = [&](const Vec& v) {
        const GateOut o = gates_fwd(unpack(v, n, H), rows, heads, opt);
        double l = dot(o.log_alpha, ra) + dot(o.beta, rb);
        if (opt.momentum) l += dot(o.log_mu, rm) + dot(o.eta, re);
        return l;
      };
      const Vec fd = fd_grad(loss, pack(in));
      if (opt.momentum) {
        const GateOut o = gates_fwd(in, rows, heads, opt);
        int clamped = 0;
        for (double lm : o.log_mu) clamped += lm == opt.min_log_mu;
        CHECK(clamped > 0);
        CHECK(clamped < static_cast<int>(n));
      }
      // Overwritten outputs start as garbage; accumulated ones start at a known offset.
      GateIn d{randn(n, 20), randn(n, 21), randn(n, 22), randn(n, 23), Vec(H, 0.5), Vec(H, 0.5), Vec(H, 0.5),
               Vec(H, 0.5), Vec(H, 0.5)};
      const Vec dzm_before = d.zm, dze_before = d.ze;
      llmt::cpu::mdn_gates_bwd<double>(ra.data(), rb.data(), rm.data(), re.data(), in.za.data(), in.zb.data(),
                                       in.zm.data(), in.ze.data(), in.A_log.data(), in.dt_bias.data(),
                                       in.Mu_log.data(), in.mu_bias.data(), in.log_factor.data(), rows, heads, opt,
                                       d.za.data(), d.zb.data(), d.zm.data(), d.ze.data(), d.A_log.data(),
                                       d.dt_bias.data(), d.Mu_log.data(), d.mu_bias.data(), d.log_factor.data());
      for (Vec* p : {&d.A_log, &d.dt_bias, &d.Mu_log, &d.mu_bias, &d.log_factor})
        for (double& e : *p) e -= 0.5;
      if (!opt.momentum) {  // nothing written for the absent μ / η inputs and parameters
        CHECK(d.zm == dzm_before);
        CHECK(d.ze == dze_before);
        for (Vec* p : {&d.zm, &d.ze, &d.Mu_log, &d.mu_bias}) std::fill(p->begin(), p->end(), 0.0);
      }
      const Vec an = pack(d);
      double err = 0.0;
      for (size_t i = 0; i < an.size(); ++i) err = std::max(err, std::abs(an[i] - fd[i]));
      CHECK(err < kFdTol);
    }
  }
}

TEST_CASE("mdn output correction: hand values and finite-difference gradients") {
  // One token, two heads of dim 2: q - e^{D_log} k with δ = 1/2 and 2.
  const Vec q{1, 2, 3, 4}, k{2, -2, 1, 0.5}, D_log{std::log(0.5), std::log(2.0)};
  Vec out(4);
  llmt::cpu::mdn_correction_fwd<double>(q.data(), k.data(), D_log.data(), 1, 2, 2, out.data());
  CHECK(out == Vec{0.0, 3.0, 1.0, 3.0});
  const int64_t rows = 5, heads = 2, dim = 3;
  const auto n = static_cast<size_t>(rows * heads * dim);
  const Vec qq = randn(n, 30), kk = randn(n, 31), dl = randn(2, 32), r = randn(n, 33);
  const auto fwd = [&](const Vec& qv, const Vec& kv, const Vec& dv) {
    Vec o(n);
    llmt::cpu::mdn_correction_fwd<double>(qv.data(), kv.data(), dv.data(), rows, heads, dim, o.data());
    return dot(o, r);
  };
  const Vec fdk = fd_grad([&](const Vec& v) { return fwd(qq, v, dl); }, kk);
  const Vec fdd = fd_grad([&](const Vec& v) { return fwd(qq, kk, v); }, dl);
  const Vec fdq = fd_grad([&](const Vec& v) { return fwd(v, kk, dl); }, qq);
  CHECK(rel_err(r, fdq) < kFdTol);  // dL/dq = dq_out: the kernel writes nothing for q
  Vec dk(n, 0.25), dD(2, 0.25);     // accumulated
  llmt::cpu::mdn_correction_bwd<double>(r.data(), kk.data(), dl.data(), rows, heads, dim, dk.data(), dD.data());
  for (double& e : dk) e -= 0.25;
  for (double& e : dD) e -= 0.25;
  CHECK(rel_err(dk, fdk) < kFdTol);
  CHECK(rel_err(dD, fdd) < kFdTol);
}

TEST_CASE("mdn gates through the CPU backend: float agrees with double; missing inputs are errors") {
  const int64_t rows = 5, heads = 2;
  const auto n = static_cast<size_t>(rows * heads), H = static_cast<size_t>(heads);
  const GateIn in{randn(n, 40), randn(n, 41), randn(n, 42), randn(n, 43), randn(H, 44), randn(H, 45),
                  randn(H, 46), randn(H, 47), randn(H, 48)};
  MdnGateOptions opt;
  opt.tau = 2.0;
  const GateOut ref = gates_fwd(in, rows, heads, opt);
  auto be = llmt::make_cpu_backend();
  // float copies of everything, viewed as backend tensors (CPU backend memory is host memory)
  std::vector<std::vector<float>> f;
  for (const Vec* v : {&in.za, &in.zb, &in.zm, &in.ze, &in.A_log, &in.dt_bias, &in.Mu_log, &in.mu_bias,
                       &in.log_factor})
    f.push_back(cast<float>(*v));
  std::vector<std::vector<float>> out(4, std::vector<float>(n));
  const auto rt = [&](std::vector<float>& v) { return llmt::Tensor(v.data(), llmt::DType::f32, {rows, heads}); };
  const auto ht = [&](std::vector<float>& v) { return llmt::Tensor(v.data(), llmt::DType::f32, {heads}); };
  const llmt::Backend::MdnGateParams p{ht(f[4]), ht(f[5]), ht(f[6]), ht(f[7]), ht(f[8])};
  be->mdn_gates_fwd(rt(f[0]), rt(f[1]), rt(f[2]), rt(f[3]), p, opt, rt(out[0]), rt(out[1]), rt(out[2]), rt(out[3]));
  // float (24-bit mantissa) against double after a few dozen operations on O(1) values
  CHECK(rel_err(widen(out[0]), ref.log_alpha) < 1e-5);
  CHECK(rel_err(widen(out[1]), ref.beta) < 1e-5);
  CHECK(rel_err(widen(out[2]), ref.log_mu) < 1e-5);
  CHECK(rel_err(widen(out[3]), ref.eta) < 1e-5);
  // With momentum, z_mu / z_eta / Mu_log / mu_bias must be given; without, they must not.
  const std::string err = llmt::test::error_of([&] {
    be->mdn_gates_fwd(rt(f[0]), rt(f[1]), llmt::Tensor(), rt(f[3]), p, opt, rt(out[0]), rt(out[1]), rt(out[2]),
                      rt(out[3]));
  });
  CHECK_THAT(err, Catch::Contains("mdn_gates_fwd"));
  opt.momentum = false;
  CHECK_THAT(llmt::test::error_of([&] {
               be->mdn_gates_fwd(rt(f[0]), rt(f[1]), rt(f[2]), rt(f[3]), p, opt, rt(out[0]), rt(out[1]), rt(out[2]),
                                 rt(out[3]));
             }),
             Catch::Contains("exactly with momentum"));
}

}  // namespace
