// Mamba2 SSD core (layers-ssm-attn.md §2.4–2.6): hand-computed recurrence, chunked form vs. the
// token-by-token oracle (forward and backward, float64), central finite differences of both
// backwards for every input, causality, float vs. double, and the CPU backend's refusal of bf16 inputs (the CUDA
// backend's with compute bf16). Loss for gradients:
// L = sum(y * R) + sum(S_T * R_S).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "core/error.h"
#include "kernels/backend.h"
#include "kernels/cpu/mamba2.h"
#include "vec_util.h"

namespace {

using namespace llmt::test;
using llmt::cpu::Mamba2Dims;

// Chunked and recurrent forms are algebraically equal; in float64 they differ by rounding only.
constexpr double kChunkTol = 1e-10;
// Central differences with h = 1e-6: truncation ~ h^2 |L'''| ~ 1e-12, rounding ~ 1e-16 |L| / h ~ 1e-9
// against O(1) gradients; a wrong term gives an error of order 1.
constexpr double kFdStep = 1e-6;
constexpr double kFdTol = 1e-7;
// float (24-bit mantissa) against double after a few hundred operations per output.
constexpr double kF32Tol = 1e-5;

size_t x_size(const Mamba2Dims& d) { return static_cast<size_t>(d.batch * d.seq_len * d.heads * d.head_dim); }
size_t tok_size(const Mamba2Dims& d) { return static_cast<size_t>(d.batch * d.seq_len * d.heads); }
size_t bc_size(const Mamba2Dims& d) { return static_cast<size_t>(d.batch * d.seq_len * d.groups * d.state_dim); }
size_t state_size(const Mamba2Dims& d) { return static_cast<size_t>(d.batch * d.heads * d.head_dim * d.state_dim); }

// Core inputs as the layer produces them: Δ = softplus(normal) · dt_scale (> 0), A uniform in
// [-a_max, -0.5] per head, B, C, x normal, D normal. s0 empty means no initial state.
struct Problem {
  Mamba2Dims d;
  Vec x, dt, A, bm, c, D, s0;
};

Problem make_problem(Mamba2Dims d, double dt_scale, double a_max, bool with_state, uint64_t seed) {
  Problem p{d,
            randn(x_size(d), seed),
            randn(tok_size(d), seed + 1),
            randn(static_cast<size_t>(d.heads), seed + 2),
            randn(bc_size(d), seed + 3),
            randn(bc_size(d), seed + 4),
            randn(static_cast<size_t>(d.heads), seed + 5),
            with_state ? randn(state_size(d), seed + 6) : Vec()};
  for (double& e : p.dt) e = dt_scale * std::log1p(std::exp(e));
  for (double& e : p.A) e = -(0.5 + (a_max - 0.5) / (1.0 + std::exp(-e)));
  return p;
}

template <typename T>
struct Typed {
  std::vector<T> x, dt, A, bm, c, D, s0;
  explicit Typed(const Problem& p)
      : x(cast<T>(p.x)), dt(cast<T>(p.dt)), A(cast<T>(p.A)), bm(cast<T>(p.bm)), c(cast<T>(p.c)), D(cast<T>(p.D)),
        s0(cast<T>(p.s0)) {}
  llmt::cpu::Mamba2Inputs<T> inputs() const {
    return {x.data(), dt.data(), A.data(), bm.data(), c.data(), D.data(), s0.empty() ? nullptr : s0.data()};
  }
};

struct Out {
  Vec y, state;
};
template <typename T>
Out forward(const Problem& p, int64_t chunk) {  // chunk 0: the recurrent form
  const Typed<T> in(p);
  std::vector<T> y(x_size(p.d)), s(state_size(p.d));
  if (chunk == 0)
    llmt::cpu::mamba2_recurrent_fwd(in.inputs(), p.d, y.data(), s.data());
  else
    llmt::cpu::mamba2_chunk_fwd(in.inputs(), p.d, y.data(), s.data(), chunk);
  return {widen(y), widen(s)};
}

struct Grads {
  Vec dx, ddt, dA, dB, dC, dD, ds0;
};
// Every gradient buffer starts with random values: the kernels must overwrite them.
template <typename T>
Grads backward(const Problem& p, const Vec& d_y, const Vec& d_state, int64_t chunk) {
  const Typed<T> in(p);
  const auto dy = cast<T>(d_y), dst = cast<T>(d_state);
  const size_t H = static_cast<size_t>(p.d.heads);
  auto dx = cast<T>(randn(x_size(p.d), 91)), ddt = cast<T>(randn(tok_size(p.d), 92)), dA = cast<T>(randn(H, 93)),
       dB = cast<T>(randn(bc_size(p.d), 94)), dC = cast<T>(randn(bc_size(p.d), 95)), dD = cast<T>(randn(H, 96)),
       ds0 = cast<T>(randn(state_size(p.d), 97));
  const llmt::cpu::Mamba2Grads<T> out{dx.data(), ddt.data(), dA.data(), dB.data(), dC.data(), dD.data(), ds0.data()};
  const T* dst_ptr = d_state.empty() ? nullptr : dst.data();
  if (chunk == 0)
    llmt::cpu::mamba2_recurrent_bwd(in.inputs(), dy.data(), dst_ptr, p.d, out);
  else
    llmt::cpu::mamba2_chunk_bwd(in.inputs(), dy.data(), dst_ptr, p.d, out, chunk);
  return {widen(dx), widen(ddt), widen(dA), widen(dB), widen(dC), widen(dD), widen(ds0)};
}

// The largest relative error over all seven gradients (printed by the tests).
double max_grad_err(const Grads& a, const Grads& ref) {
  return std::max({rel_err(a.dx, ref.dx), rel_err(a.ddt, ref.ddt), rel_err(a.dA, ref.dA), rel_err(a.dB, ref.dB),
                   rel_err(a.dC, ref.dC), rel_err(a.dD, ref.dD), rel_err(a.ds0, ref.ds0)});
}

void check_grads_close(const Grads& a, const Grads& ref, double tol) {
  CHECK(rel_err(a.dx, ref.dx) < tol);
  CHECK(rel_err(a.ddt, ref.ddt) < tol);
  CHECK(rel_err(a.dA, ref.dA) < tol);
  CHECK(rel_err(a.dB, ref.dB) < tol);
  CHECK(rel_err(a.dC, ref.dC) < tol);
  CHECK(rel_err(a.dD, ref.dD) < tol);
  CHECK(rel_err(a.ds0, ref.ds0) < tol);
}

}  // namespace

TEST_CASE("mamba2: hand-computed recurrence, T = 2, P = N = 2", "[kernels][mamba2]") {
  // A = -ln 2, Δ = (1, 2): α1 = 0.5, α2 = 0.25. x1 = (2, 4), x2 = (1, 0); B1 = (1, 0), B2 = (1, 1);
  // C1 = (1, 2), C2 = (0, 1); D = 0.5; S0 = 0.
  // t=1: S1 = Δ1 x1 B1^T = [[2, 0], [4, 0]]; y1 = S1 C1 + D x1 = (2, 4) + (1, 2) = (3, 6).
  // t=2: S2 = 0.25 S1 + 2 x2 B2^T = [[0.5, 0], [1, 0]] + [[2, 2], [0, 0]] = [[2.5, 2], [1, 0]];
  //      y2 = S2 C2 + D x2 = (2, 0) + (0.5, 0) = (2.5, 0).
  const Problem p{{1, 2, 1, 2, 2, 1}, {2, 4, 1, 0},       {1, 2}, {-std::log(2.0)}, {1, 0, 1, 1},
                  {1, 2, 0, 1},       {0.5},              {}};
  for (int64_t chunk : {0, 1, 2, 256}) {
    INFO("chunk " << chunk);
    const Out f = forward<double>(p, chunk);
    const Vec y_ref{3, 6, 2.5, 0}, s_ref{2.5, 2, 1, 0};
    for (size_t i = 0; i < 4; ++i) {
      CHECK(f.y[i] == Approx(y_ref[i]).margin(1e-14));
      CHECK(f.state[i] == Approx(s_ref[i]).margin(1e-14));
    }
  }
}

TEST_CASE("mamba2: chunked forward and backward equal the recurrent form, float64", "[kernels][mamba2]") {
  // T < chunk, T = chunk, T not a multiple of the chunk; weak and strong decay (|Δ A| up to ~ 50);
  // two groups of two heads.
  double worst_fwd = 0, worst_bwd = 0;
  for (int64_t T : {1, 13, 16, 70})
    for (int64_t chunk : {5, 16, 256})
      for (bool with_state : {false, true})
        for (double a_max : {1.0, 16.0}) {
          INFO("T " << T << " chunk " << chunk << " initial state " << with_state << " a_max " << a_max);
          const Problem p = make_problem({2, T, 4, 3, 5, 2}, a_max > 1.0 ? 1.0 : 0.1, a_max, with_state, 100 + T);
          const Out ref = forward<double>(p, 0), chk = forward<double>(p, chunk);
          CHECK(rel_err(chk.y, ref.y) < kChunkTol);
          CHECK(rel_err(chk.state, ref.state) < kChunkTol);
          worst_fwd = std::max({worst_fwd, rel_err(chk.y, ref.y), rel_err(chk.state, ref.state)});
          const Vec d_y = randn(x_size(p.d), 200 + T), d_state = randn(state_size(p.d), 300 + T);
          const Grads gc = backward<double>(p, d_y, d_state, chunk), gr = backward<double>(p, d_y, d_state, 0);
          check_grads_close(gc, gr, kChunkTol);
          check_grads_close(backward<double>(p, d_y, {}, chunk), backward<double>(p, d_y, {}, 0), kChunkTol);
          worst_bwd = std::max(worst_bwd, max_grad_err(gc, gr));
        }
  std::printf("mamba2 chunked vs recurrent (float64): forward %.3g, backward %.3g\n", worst_fwd, worst_bwd);
}

TEST_CASE("mamba2: both backwards match central finite differences for every input", "[kernels][mamba2]") {
  // T = 9 with chunk 4 exercises a partial last chunk; two groups so dB and dC sum over heads.
  for (double a_max : {1.0, 6.0}) {
    INFO("a_max " << a_max);
    Problem p = make_problem({2, 9, 4, 3, 2, 2}, 0.5, a_max, true, 400);
    const Vec R = randn(x_size(p.d), 401), RS = randn(state_size(p.d), 402);
    const Grads gr = backward<double>(p, R, RS, 0), gc = backward<double>(p, R, RS, 4);
    auto fd = [&](Vec& v) {
      Vec grad(v.size());
      for (size_t i = 0; i < v.size(); ++i) {
        const double vi = v[i];
        v[i] = vi + kFdStep;
        const Out up = forward<double>(p, 0);
        v[i] = vi - kFdStep;
        const Out down = forward<double>(p, 0);
        v[i] = vi;
        grad[i] = (dot(up.y, R) + dot(up.state, RS) - dot(down.y, R) - dot(down.state, RS)) / (2.0 * kFdStep);
      }
      return grad;
    };
    const Grads num{fd(p.x), fd(p.dt), fd(p.A), fd(p.bm), fd(p.c), fd(p.D), fd(p.s0)};
    check_grads_close(gr, num, kFdTol);
    check_grads_close(gc, num, kFdTol);
    std::printf("mamba2 finite differences (a_max %g): recurrent %.3g, chunked %.3g\n", a_max, max_grad_err(gr, num),
                max_grad_err(gc, num));
  }
}

TEST_CASE("mamba2: causality, perturbing inputs after t leaves outputs up to t unchanged", "[kernels][mamba2]") {
  const Problem p = make_problem({1, 23, 2, 3, 4, 1}, 0.5, 4.0, true, 700);
  const Mamba2Dims& d = p.d;
  for (int64_t chunk : {0, 8})
    for (int64_t t : {0, 7, 8, 15}) {
      INFO("chunk " << chunk << " t " << t);
      Problem q = p;
      const size_t P = static_cast<size_t>(d.head_dim), N = static_cast<size_t>(d.state_dim);
      const size_t H = static_cast<size_t>(d.heads), first = static_cast<size_t>(t + 1);
      for (size_t i = first * H * P; i < q.x.size(); ++i) q.x[i] += 1.0;
      for (size_t i = first * H; i < q.dt.size(); ++i) q.dt[i] *= 3.0;
      for (size_t i = first * N; i < q.bm.size(); ++i) q.bm[i] -= 0.7;
      for (size_t i = first * N; i < q.c.size(); ++i) q.c[i] += 2.0;
      const Out a = forward<double>(p, chunk), b = forward<double>(q, chunk);
      const size_t prefix = first * H * P;
      CHECK(Vec(a.y.begin(), a.y.begin() + prefix) == Vec(b.y.begin(), b.y.begin() + prefix));
      CHECK(Vec(a.y.begin() + prefix, a.y.end()) != Vec(b.y.begin() + prefix, b.y.end()));
    }
}

TEST_CASE("mamba2: float agrees with double for all four functions", "[kernels][mamba2]") {
  const Problem p = make_problem({2, 70, 4, 8, 6, 2}, 0.5, 4.0, true, 500);
  const Vec d_y = randn(x_size(p.d), 501), d_state = randn(state_size(p.d), 502);
  for (int64_t chunk : {0, 16}) {
    INFO("chunk " << chunk);
    const Out fd = forward<double>(p, chunk), ff = forward<float>(p, chunk);
    CHECK(rel_err(ff.y, fd.y) < kF32Tol);
    CHECK(rel_err(ff.state, fd.state) < kF32Tol);
    const Grads gf = backward<float>(p, d_y, d_state, chunk), gd = backward<double>(p, d_y, d_state, chunk);
    check_grads_close(gf, gd, kF32Tol);
    std::printf("mamba2 float vs double (chunk %lld): y %.3g, gradients %.3g\n", static_cast<long long>(chunk),
                rel_err(ff.y, fd.y), max_grad_err(gf, gd));
  }
}

TEST_CASE("mamba2: invalid chunk size and group count are rejected", "[kernels][mamba2]") {
  const Problem p = make_problem({1, 3, 2, 2, 2, 1}, 0.5, 2.0, false, 600);
  CHECK_THROWS_AS(forward<double>(p, -1), llmt::Error);
  const Problem q = make_problem({1, 3, 3, 2, 2, 2}, 0.5, 2.0, false, 601);
  CHECK_THROWS_AS(forward<double>(q, 0), llmt::Error);
}

TEST_CASE("mamba2_ssd: the CPU backend refuses bf16 xbc, dy naming the op", "[kernels][mamba2]") {
  using llmt::DType;
  using llmt::OwnedTensor;
  auto be = llmt::make_cpu_backend();
  const int64_t B = 1, T = 4, H = 2, P = 2, N = 2, W = H * P + 2 * N;
  const auto t = [&](DType d, std::initializer_list<int64_t> dims) { return OwnedTensor(*be, d, dims); };
  const OwnedTensor xbc = t(DType::bf16, {B, T, W}), dy = t(DType::bf16, {B, T, H * P});
  const OwnedTensor dtr = t(DType::f32, {B, T, H}), dtb = t(DType::f32, {H}), alog = t(DType::f32, {H});
  const OwnedTensor D = t(DType::f32, {H}), y = t(DType::f32, {B, T, H * P}), dxbc = t(DType::f32, {B, T, W});
  const OwnedTensor ddtr = t(DType::f32, {B, T, H}), ddtb = t(DType::f32, {H}), dalog = t(DType::f32, {H});
  const OwnedTensor dD = t(DType::f32, {H});
  const llmt::Tensor none;
  CHECK_THROWS_WITH(be->mamba2_ssd_fwd(*xbc, *dtr, *dtb, *alog, *D, P, 1, 4, DType::bf16, *y, none),
                    Catch::StartsWith("mamba2_ssd_fwd: the cpu backend takes xbc") && Catch::Contains("got bf16"));
  CHECK_THROWS_WITH(be->mamba2_ssd_bwd(*dy, *xbc, *dtr, *dtb, *alog, *D, none, P, 1, 4, DType::bf16, *dxbc, *ddtr,
                                       *ddtb, *dalog, *dD),
                    Catch::StartsWith("mamba2_ssd_bwd: the cpu backend takes dy, xbc") && Catch::Contains("got bf16"));
}

TEST_CASE("mamba2_ssd (packed layer inputs): split, softplus, A = -exp(A_log) and their gradients", "[kernels][mamba2]") {
  // B = 1, T = 7, H = 4, P = 2, G = 2, N = 3, chunk 3: xbc rows [x (8) | B (6) | C (6)].
  const Mamba2Dims d{1, 7, 4, 2, 3, 2};
  const size_t rows = 7, width = 8 + 12, H = 4;
  Vec xbc = randn(rows * width, 800), dtr = randn(rows * H, 801), dtb = randn(H, 802), alog = randn(H, 803),
      D = randn(H, 804);
  dtr[5] = 25.0;  // softplus above its threshold: the identity, derivative 1
  for (double& a : alog) a *= 0.5;
  const Vec R = randn(rows * 8, 805);
  const auto fwd = [&]() {
    Vec y(rows * 8);
    llmt::cpu::mamba2_ssd_fwd(xbc.data(), dtr.data(), dtb.data(), alog.data(), D.data(), d, 3, y.data());
    return y;
  };
  // Against the core on unpacked, discretised inputs (computed here, not by the packed function).
  Problem p{d, {}, {}, {}, {}, {}, D, {}};
  for (size_t r = 0; r < rows; ++r) {
    p.x.insert(p.x.end(), xbc.begin() + r * width, xbc.begin() + r * width + 8);
    p.bm.insert(p.bm.end(), xbc.begin() + r * width + 8, xbc.begin() + r * width + 14);
    p.c.insert(p.c.end(), xbc.begin() + r * width + 14, xbc.begin() + (r + 1) * width);
    for (size_t h = 0; h < H; ++h) {
      const double v = dtr[r * H + h] + dtb[h];
      p.dt.push_back(v > 20.0 ? v : std::log1p(std::exp(v)));
    }
  }
  for (double a : alog) p.A.push_back(-std::exp(a));
  CHECK(rel_err(fwd(), forward<double>(p, 0).y) < kChunkTol);

  Vec dxbc = randn(xbc.size(), 810), ddtr = randn(dtr.size(), 811);
  const Vec g0 = randn(H, 812);
  Vec ddtb = g0, dalog = g0, dD = g0;  // accumulated onto
  llmt::cpu::mamba2_ssd_bwd(R.data(), xbc.data(), dtr.data(), dtb.data(), alog.data(), D.data(), d, 3, dxbc.data(),
                            ddtr.data(), ddtb.data(), dalog.data(), dD.data());
  auto fd = [&](Vec& v) {
    Vec grad(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      const double vi = v[i];
      v[i] = vi + kFdStep;
      const double up = dot(fwd(), R);
      v[i] = vi - kFdStep;
      const double down = dot(fwd(), R);
      v[i] = vi;
      grad[i] = (up - down) / (2.0 * kFdStep);
    }
    return grad;
  };
  CHECK(rel_err(dxbc, fd(xbc)) < kFdTol);
  CHECK(rel_err(ddtr, fd(dtr)) < kFdTol);
  CHECK(rel_err(minus(ddtb, g0), fd(dtb)) < kFdTol);
  CHECK(rel_err(minus(dalog, g0), fd(alog)) < kFdTol);
  CHECK(rel_err(minus(dD, g0), fd(D)) < kFdTol);
}
