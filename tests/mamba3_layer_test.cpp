// The Mamba-3 layer op (layers-ssm-attn.md §4.3.1–4.3.4, §4.5; kernels/cpu/mamba3_layer.h) in float64:
// central finite differences for every input and parameter (SISO, MIMO, output norm, heavy-tail A, the
// A_floor clamp), causality through the per-token scalars, the §5.4 reduction to Mamba2's SSD
// (λ ≡ 1, θ ≡ 0, zero biases, per-head constant A), float vs. double, and the Backend op's argument checks.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "core/error.h"
#include "kernels/backend.h"
#include "kernels/cpu/mamba2.h"
#include "kernels/cpu/mamba3_layer.h"
#include "vec_util.h"

namespace {

using namespace llmt::test;
using llmt::Mamba3Options;
using llmt::cpu::Mamba3LayerDims;

// As tests/mamba3_test.cpp: h = 1e-6 central differences against O(1) gradients.
constexpr double kFdStep = 1e-6;
constexpr double kFdTol = 1e-7;
constexpr double kF32Tol = 1e-5;

// Every input and parameter of the op, in double, in the layouts of kernels/cpu/mamba3_layer.h.
struct Problem {
  Mamba3LayerDims d;
  Mamba3Options opt;
  Vec x, z, bc, raw, dt_bias, B_bias, C_bias, B_norm, C_norm, D, mimo_x, mimo_z, mimo_o, norm;
  std::vector<Vec*> all() {
    return {&x, &z, &bc, &raw, &dt_bias, &B_bias, &C_bias, &B_norm, &C_norm, &D, &mimo_x, &mimo_z, &mimo_o, &norm};
  }
};

size_t rows(const Mamba3LayerDims& d) { return static_cast<size_t>(d.batch * d.seq_len); }

// Random inputs of unit scale; parameters around their initial values (ones, 1/R) with noise so that
// every gradient is generic. dd_dt is shifted by -1 and scaled to keep Δ moderate.
Problem make_problem(Mamba3LayerDims d, Mamba3Options opt, uint64_t seed) {
  const size_t H = static_cast<size_t>(d.heads), P = static_cast<size_t>(d.head_dim);
  const size_t N = static_cast<size_t>(d.state_dim);
  const size_t R = static_cast<size_t>(d.rank), G = static_cast<size_t>(d.groups), S = static_cast<size_t>(d.angles);
  const size_t n = rows(d);
  auto around = [&](size_t count, double centre, uint64_t s) {
    Vec v = randn(count, s);
    for (double& e : v) e = centre + 0.3 * e;
    return v;
  };
  Problem p{d, opt, randn(n * H * P, seed), randn(n * H * P, seed + 1), randn(n * 2 * R * G * N, seed + 2),
            randn(n * (3 * H + S), seed + 3), around(H, -1.0, seed + 4), around(H * R * N, 1.0, seed + 5),
            around(H * R * N, 1.0, seed + 6), around(N, 1.0, seed + 7), around(N, 1.0, seed + 8),
            around(H, 1.0, seed + 9), {}, {}, {}, {}};
  p.opt.rank = d.rank;
  if (d.rank > 1) {
    p.mimo_x = around(H * R * P, 1.0 / static_cast<double>(R), seed + 10);
    p.mimo_z = around(H * R * P, 1.0, seed + 11);
    p.mimo_o = around(H * R * P, 1.0 / static_cast<double>(R), seed + 12);
  }
  if (opt.outproj_norm) p.norm = around(H * P, 1.0, seed + 13);
  return p;
}

template <typename T>
const T* ptr(const std::vector<T>& v) { return v.empty() ? nullptr : v.data(); }
template <typename T>
T* ptr(std::vector<T>& v) { return v.empty() ? nullptr : v.data(); }

template <typename T>
struct Typed {
  std::vector<std::vector<T>> v;
  explicit Typed(Problem& p) {
    for (Vec* e : p.all()) v.push_back(cast<T>(*e));
  }
  llmt::cpu::Mamba3LayerParams<T> params() const {
    return {{ptr(v[4]), ptr(v[5]), ptr(v[6]), ptr(v[7]), ptr(v[8])}, ptr(v[9]), ptr(v[10]), ptr(v[11]), ptr(v[12]),
            ptr(v[13])};
  }
};

template <typename T>
Vec forward(Problem& p) {
  const Typed<T> in(p);
  std::vector<T> out(p.x.size());
  llmt::cpu::mamba3_layer_fwd<T>(in.v[0].data(), in.v[1].data(), in.v[2].data(), in.v[3].data(), in.params(), p.d,
                                 p.opt, out.data());
  return widen(out);
}

// Gradients of every entry of Problem::all(), in that order. The activation gradients start random (they
// must be overwritten), the parameter gradients start at 0.5 (they accumulate; 0.5 is subtracted back).
template <typename T>
std::vector<Vec> backward(Problem& p, const Vec& dout) {
  const Typed<T> in(p);
  std::vector<std::vector<T>> g;
  uint64_t s = 900;
  for (Vec* e : p.all()) g.push_back(g.size() < 4 ? cast<T>(randn(e->size(), s++)) : std::vector<T>(e->size(), T(0.5)));
  const auto dy = cast<T>(dout);
  const llmt::cpu::Mamba3LayerGrads<T> grads{{ptr(g[4]), ptr(g[5]), ptr(g[6]), ptr(g[7]), ptr(g[8])},
                                             ptr(g[9]), ptr(g[10]), ptr(g[11]), ptr(g[12]), ptr(g[13])};
  llmt::cpu::mamba3_layer_bwd<T>(dy.data(), in.v[0].data(), in.v[1].data(), in.v[2].data(), in.v[3].data(),
                                 in.params(), p.d, p.opt, g[0].data(), g[1].data(), g[2].data(), g[3].data(), grads);
  std::vector<Vec> out;
  for (size_t i = 0; i < g.size(); ++i) {
    Vec w = widen(g[i]);
    if (i >= 4)
      for (double& e : w) e -= 0.5;
    out.push_back(w);
  }
  return out;
}

const char* kNames[] = {"x", "z", "bc", "raw", "dt_bias", "B_bias", "C_bias", "B_norm", "C_norm", "D",
                        "mimo_x", "mimo_z", "mimo_o", "norm"};

double check_against_fd(Problem& p, uint64_t seed) {
  const Vec Rw = randn(p.x.size(), seed);
  const std::vector<Vec> an = backward<double>(p, Rw);
  double worst = 0;
  const std::vector<Vec*> vars = p.all();
  for (size_t k = 0; k < vars.size(); ++k) {
    Vec& v = *vars[k];
    Vec num(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      const double vi = v[i];
      v[i] = vi + kFdStep;
      const double up = dot(forward<double>(p), Rw);
      v[i] = vi - kFdStep;
      const double down = dot(forward<double>(p), Rw);
      v[i] = vi;
      num[i] = (up - down) / (2.0 * kFdStep);
    }
    INFO(kNames[k] << " rel err " << rel_err(an[k], num));
    CHECK(an[k].size() == num.size());
    if (!num.empty()) {
      CHECK(rel_err(an[k], num) < kFdTol);
      worst = std::max(worst, rel_err(an[k], num));
    }
  }
  return worst;
}

}  // namespace

TEST_CASE("mamba3 layer op: every gradient matches central finite differences", "[kernels][mamba3]") {
  struct Case {
    const char* name;
    Mamba3LayerDims d;
    bool outproj_norm, heavy_tail;
  };
  // T = 7 with chunk 3: partial last chunk. N = 6 with S = 2 angles leaves unrotated coordinates; two groups.
  const Case cases[] = {{"SISO", {2, 7, 4, 3, 6, 2, 1, 2}, false, false},
                        {"SISO + output norm + heavy-tail A", {1, 7, 2, 3, 6, 1, 1, 3}, true, true},
                        {"MIMO R = 2", {2, 7, 2, 3, 6, 1, 2, 2}, false, false},
                        {"MIMO R = 3 + output norm", {1, 7, 4, 2, 4, 2, 3, 1}, true, false}};
  for (const Case& c : cases) {
    INFO(c.name);
    Mamba3Options opt;
    opt.head_dim = c.d.head_dim;
    opt.n_groups = c.d.groups;
    opt.rank = c.d.rank;
    opt.chunk_size = 3;
    opt.outproj_norm = c.outproj_norm;
    opt.heavy_tail = c.heavy_tail;
    Problem p = make_problem(c.d, opt, 1000);
    // Two positions with dd_A far below zero: softplus(-12) < A_floor, the clamp is active (zero gradient);
    // for the heavy tail 1 / (1 + 12) is not clamped and x < 0 takes the 1 / (1 - x)^2 branch.
    const size_t W = static_cast<size_t>(3 * c.d.heads + c.d.angles), H = static_cast<size_t>(c.d.heads);
    p.raw[W + H] = -12.0;
    p.raw[3 * W + H + 1] = -14.0;
    const double worst = check_against_fd(p, 1100);
    std::printf("mamba3 layer op finite differences (%s): max rel err %.3g\n", c.name, worst);
  }
}

TEST_CASE("mamba3 layer op: outputs up to t do not depend on tokens after t", "[kernels][mamba3]") {
  Mamba3Options opt;
  opt.head_dim = 3;
  opt.chunk_size = 4;
  for (int64_t R : {1, 2}) {
    opt.rank = R;
    Problem p = make_problem({1, 11, 2, 3, 6, 1, R, 2}, opt, 1200);
    const size_t t = 5, HP = 6, W = 3 * 2 + 2;
    Problem q = p;
    for (size_t i = (t + 1) * HP; i < q.x.size(); ++i) q.x[i] += 1.0;
    for (size_t i = (t + 1) * W; i < q.raw.size(); ++i) q.raw[i] -= 0.8;  // Δ, A, λ, θ of later tokens
    for (size_t i = (t + 1) * q.bc.size() / 11; i < q.bc.size(); ++i) q.bc[i] *= 2.0;
    const Vec a = forward<double>(p), b = forward<double>(q);
    INFO("R " << R);
    CHECK(Vec(a.begin(), a.begin() + (t + 1) * HP) == Vec(b.begin(), b.begin() + (t + 1) * HP));
    CHECK(Vec(a.begin() + (t + 1) * HP, a.end()) != Vec(b.begin() + (t + 1) * HP, b.end()));
  }
}

TEST_CASE("mamba3 layer op: λ = 1, θ = 0, zero biases and constant A reduce to Mamba2's SSD", "[kernels][mamba3]") {
  // §5.4: the exponential-Euler special case is Mamba2 with k̃ = Δ k, an inclusive diagonal, B and C the
  // BCNorm outputs, then the SiLU(z) gate.
  const Mamba3LayerDims d{2, 9, 4, 3, 4, 2, 1, 2};
  Mamba3Options opt;
  opt.head_dim = 3;
  opt.n_groups = 2;
  opt.chunk_size = 4;
  Problem p = make_problem(d, opt, 1300);
  std::fill(p.B_bias.begin(), p.B_bias.end(), 0.0);
  std::fill(p.C_bias.begin(), p.C_bias.end(), 0.0);
  const size_t n = rows(d), H = 4, P = 3, N = 4, G = 2, W = 3 * H + 2;
  const Vec ddA = randn(H, 1301);
  for (size_t r = 0; r < n; ++r) {
    for (size_t h = 0; h < H; ++h) {
      p.raw[r * W + H + h] = ddA[h];
      p.raw[r * W + 2 * H + h] = 40.0;  // σ(40) == 1 in double
    }
    p.raw[r * W + 3 * H] = p.raw[r * W + 3 * H + 1] = 0.0;
  }
  const Vec out = forward<double>(p);
  // The same thing through the Mamba2 core.
  Vec dt(n * H), A(H), Bm(n * G * N), C(n * G * N);
  for (size_t h = 0; h < H; ++h) A[h] = -std::log1p(std::exp(ddA[h]));
  for (size_t r = 0; r < n; ++r) {
    for (size_t h = 0; h < H; ++h) dt[r * H + h] = std::log1p(std::exp(p.raw[r * W + h] + p.dt_bias[h]));
    for (size_t which = 0; which < 2; ++which)
      for (size_t g = 0; g < G; ++g) {
        const double* src = &p.bc[r * 2 * G * N + which * G * N + g * N];
        double ss = 0;
        for (size_t i = 0; i < N; ++i) ss += src[i] * src[i];
        const double rs = 1.0 / std::sqrt(ss / N + opt.eps);
        for (size_t i = 0; i < N; ++i)
          (which == 0 ? Bm : C)[(r * G + g) * N + i] = src[i] * rs * (which == 0 ? p.B_norm : p.C_norm)[i];
      }
  }
  Vec y(n * H * P);
  llmt::cpu::mamba2_chunk_fwd<double>({p.x.data(), dt.data(), A.data(), Bm.data(), C.data(), p.D.data(), nullptr},
                                      {d.batch, d.seq_len, 4, 3, 4, 2}, y.data(), nullptr, 5);
  for (size_t i = 0; i < y.size(); ++i) y[i] *= p.z[i] / (1.0 + std::exp(-p.z[i]));
  const double err = rel_err(out, y);
  std::printf("mamba3 (λ = 1, θ = 0) vs mamba2 SSD: rel err %.3g\n", err);
  CHECK(err < 1e-12);
}

TEST_CASE("mamba3 layer op: float agrees with double", "[kernels][mamba3]") {
  Mamba3Options opt;
  opt.head_dim = 4;
  opt.chunk_size = 8;
  for (int64_t R : {1, 2}) {
    opt.rank = R;
    Problem p = make_problem({2, 20, 2, 4, 8, 1, R, 2}, opt, 1400);
    const Vec dout = randn(p.x.size(), 1401);
    const Vec fd = forward<double>(p), ff = forward<float>(p);
    CHECK(rel_err(ff, fd) < kF32Tol);
    const std::vector<Vec> gd = backward<double>(p, dout), gf = backward<float>(p, dout);
    for (size_t k = 0; k < gd.size(); ++k)
      if (!gd[k].empty()) {
        INFO("R " << R << " " << kNames[k] << " rel err " << rel_err(gf[k], gd[k]));
        CHECK(rel_err(gf[k], gd[k]) < kF32Tol);
      }
  }
}

TEST_CASE("mamba3 backend op: the CPU backend matches the kernel and checks its arguments", "[kernels][mamba3]") {
  auto be = llmt::make_cpu_backend();
  using llmt::DType;
  using llmt::OwnedTensor;
  Mamba3Options opt;
  opt.head_dim = 3;
  opt.chunk_size = 4;
  opt.rank = 2;
  Problem p = make_problem({2, 5, 2, 3, 4, 1, 2, 2}, opt, 1500);
  const int64_t B = 2, T = 5, HP = 6;
  auto put = [&](const Vec& v, std::initializer_list<int64_t> shape) {
    OwnedTensor t(*be, DType::f64, shape);
    be->upload(v.data(), *t);
    return t;
  };
  const OwnedTensor x = put(p.x, {B, T, HP}), z = put(p.z, {B, T, HP}), bc = put(p.bc, {B, T, 16}),
                    raw = put(p.raw, {B, T, 8}), dt_bias = put(p.dt_bias, {2}), B_bias = put(p.B_bias, {2, 2, 4}),
                    C_bias = put(p.C_bias, {2, 2, 4}), B_norm = put(p.B_norm, {4}), C_norm = put(p.C_norm, {4}),
                    D = put(p.D, {2}), mx = put(p.mimo_x, {2, 2, 3}), mz = put(p.mimo_z, {2, 2, 3}),
                    mo = put(p.mimo_o, {2, 2, 3}), out = put(Vec(p.x.size()), {B, T, HP});
  llmt::Backend::Mamba3Params prm{*dt_bias, *B_bias, *C_bias, *B_norm, *C_norm, *D, *mx, *mz, *mo, llmt::Tensor()};
  be->mamba3_fwd(*x, *z, *bc, *raw, prm, opt, *out, llmt::Tensor());
  Vec got(p.x.size());
  be->download(*out, got.data());
  CHECK(got == forward<double>(p));
  // SISO options with MIMO parameters, a missing output-norm weight, and a raw width below 3 H.
  Mamba3Options siso = opt;
  siso.rank = 1;
  CHECK_THROWS_AS(be->mamba3_fwd(*x, *z, *bc, *raw, prm, siso, *out, llmt::Tensor()), llmt::Error);
  Mamba3Options normed = opt;
  normed.outproj_norm = true;
  CHECK_THROWS_AS(be->mamba3_fwd(*x, *z, *bc, *raw, prm, normed, *out, llmt::Tensor()), llmt::Error);
  const OwnedTensor narrow = put(Vec(static_cast<size_t>(B * T * 5)), {B, T, 5});
  CHECK_THROWS_AS(be->mamba3_fwd(*x, *z, *bc, *narrow, prm, opt, *out, llmt::Tensor()), llmt::Error);
}
