// Building blocks of the Gated DeltaNet / Comba / KDA / MDN layers (layers-delta.md §2.1-2.3, §4.1 steps 2-3,
// §4.3 step 2) and Mamba2's conv bias and gated RMSNorm with the gate first (layers-ssm-attn.md §1.2, §1.4):
// hand-computed forwards, float64 central finite-difference checks of every gradient (scalar loss
// L = sum(out * R) with a fixed random R), overwrite / accumulate semantics, short-conv causality,
// softplus at large |a|, float-vs-double agreement, and the gate-first norm against swiglu then rmsnorm.
#include <catch2/catch.hpp>

#include "vec_util.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <vector>

#include "core/rng.h"
#include "kernels/cpu/delta_gates.h"
#include "kernels/cpu/gated_rmsnorm.h"
#include "kernels/cpu/l2norm.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/short_conv.h"
#include "kernels/cpu/swiglu.h"

namespace {

using namespace llmt::test;

// Central differences (fd_grad, h = 1e-5) on O(1) inputs: truncation error ~ h^2 |L'''| / 6 ~ 1e-11,
// rounding error ~ 1e-16 |L| / h ~ 1e-10, against O(1) gradients. 1e-8 leaves a wide margin
// while any wrong term in an analytic gradient gives an error of order 1.
constexpr double kFdTol = 1e-8;
// float (24-bit mantissa, ~6e-8 per rounding) against double after a few dozen operations.
constexpr double kF32Tol = 1e-5;

// ---------------------------------------------------------------- typed wrappers

struct ConvShape {
  int64_t batch, seq, channels, width;
  size_t numel() const { return static_cast<size_t>(batch * seq * channels); }
  size_t wsize() const { return static_cast<size_t>(channels * width); }
};
struct ConvOut {
  Vec pre, y;
};
template <typename T>
ConvOut conv_fwd(const Vec& x, const Vec& w, ConvShape s) {
  auto xt = cast<T>(x), wt = cast<T>(w);
  std::vector<T> pre(s.numel()), y(s.numel());
  llmt::cpu::short_conv_silu_fwd(xt.data(), wt.data(), s.batch, s.seq, s.channels, s.width, pre.data(), y.data());
  return {widen(pre), widen(y)};
}
struct ConvGrads {
  Vec dx, dw;
};
// dx starts filled with random values (the kernel must overwrite it); dw starts at dw_in (it must add).
template <typename T>
ConvGrads conv_bwd(const Vec& dy, const Vec& x, const Vec& w, const Vec& pre, ConvShape s, const Vec& dw_in) {
  auto dyt = cast<T>(dy), xt = cast<T>(x), wt = cast<T>(w), pt = cast<T>(pre);
  auto dx = cast<T>(randn(s.numel(), 900)), dw = cast<T>(dw_in);
  llmt::cpu::short_conv_silu_bwd(dyt.data(), xt.data(), wt.data(), pt.data(), s.batch, s.seq, s.channels, s.width,
                                 dx.data(), dw.data());
  return {widen(dx), widen(dw)};
}

struct NormOut {
  Vec y, stat;  // stat: rinv (l2norm) or rstd (gated_rmsnorm)
};
template <typename T>
NormOut l2norm_fwd(const Vec& x, int64_t rows, int64_t dim, double eps, double scale) {
  auto xt = cast<T>(x);
  std::vector<T> y(x.size()), rinv(static_cast<size_t>(rows));
  llmt::cpu::l2norm_fwd(xt.data(), rows, dim, eps, scale, y.data(), rinv.data());
  return {widen(y), widen(rinv)};
}
// The backward from the forward's input x and rinv (f.stat); dx starts filled with random values: the kernel must
// overwrite it.
template <typename T>
Vec l2norm_bwd(const Vec& dy, const Vec& x, const NormOut& f, int64_t rows, int64_t dim, double scale) {
  auto dyt = cast<T>(dy), xt = cast<T>(x), rt = cast<T>(f.stat);
  auto dx = cast<T>(randn(dy.size(), 901));
  llmt::cpu::l2norm_bwd(dyt.data(), xt.data(), rt.data(), rows, dim, scale, dx.data());
  return widen(dx);
}

template <typename T>
NormOut gated_fwd(const Vec& o, const Vec& z, const Vec& w, int64_t rows, int64_t dim, double eps, bool sigmoid_gate) {
  auto ot = cast<T>(o), zt = cast<T>(z), wt = cast<T>(w);
  std::vector<T> y(o.size()), rstd(static_cast<size_t>(rows));
  llmt::cpu::gated_rmsnorm_fwd(ot.data(), zt.data(), wt.data(), rows, dim, eps, sigmoid_gate, y.data(), rstd.data());
  return {widen(y), widen(rstd)};
}
struct GatedGrads {
  Vec d_o, dz, dw;
};
// d_o, dz start filled with random values (overwritten); dw starts at dw_in (accumulated).
template <typename T>
GatedGrads gated_bwd(const Vec& dy, const Vec& o, const Vec& z, const Vec& w, const Vec& rstd, int64_t rows,
                     int64_t dim, bool sigmoid_gate, const Vec& dw_in) {
  auto dyt = cast<T>(dy), ot = cast<T>(o), zt = cast<T>(z), wt = cast<T>(w), rt = cast<T>(rstd);
  auto d_o = cast<T>(randn(o.size(), 902)), dz = cast<T>(randn(o.size(), 903)), dw = cast<T>(dw_in);
  llmt::cpu::gated_rmsnorm_bwd(dyt.data(), ot.data(), zt.data(), wt.data(), rt.data(), rows, dim, sigmoid_gate,
                               d_o.data(), dz.data(), dw.data());
  return {widen(d_o), widen(dz), widen(dw)};
}

// Mamba2's gate-first norm (gate_rmsnorm_*): y is the SSD output, z the gate.
template <typename T>
NormOut gate_first_fwd(const Vec& y, const Vec& z, const Vec& w, int64_t rows, int64_t dim, double eps) {
  auto yt = cast<T>(y), zt = cast<T>(z), wt = cast<T>(w);
  std::vector<T> out(y.size()), rstd(static_cast<size_t>(rows));
  llmt::cpu::gate_rmsnorm_fwd(yt.data(), zt.data(), wt.data(), rows, dim, eps, out.data(), rstd.data());
  return {widen(out), widen(rstd)};
}
struct GateFirstGrads {
  Vec dy, dz, dw;
};
// dy, dz start filled with random values (overwritten); dw starts at dw_in (accumulated).
template <typename T>
GateFirstGrads gate_first_bwd(const Vec& dout, const Vec& y, const Vec& z, const Vec& w, const Vec& rstd, int64_t rows,
                              int64_t dim, const Vec& dw_in) {
  auto dt = cast<T>(dout), yt = cast<T>(y), zt = cast<T>(z), wt = cast<T>(w), rt = cast<T>(rstd);
  auto dy = cast<T>(randn(y.size(), 906)), dz = cast<T>(randn(y.size(), 907)), dw = cast<T>(dw_in);
  llmt::cpu::gate_rmsnorm_bwd(dt.data(), yt.data(), zt.data(), wt.data(), rt.data(), rows, dim, dy.data(), dz.data(),
                              dw.data());
  return {widen(dy), widen(dz), widen(dw)};
}

struct GatesIn {
  Vec a, b, A_log, dt_bias;
  int64_t rows, heads;
  int64_t dim = 1;  // decay channels per head: 1 for GDN, d_k for KDA
};
struct GatesOut {
  Vec g, beta;
};
template <typename T>
GatesOut gates_fwd(const GatesIn& in) {
  auto at = cast<T>(in.a), bt = cast<T>(in.b), At = cast<T>(in.A_log), dt = cast<T>(in.dt_bias);
  std::vector<T> g(in.a.size()), beta(in.b.size());
  llmt::cpu::delta_gates_fwd(at.data(), bt.data(), At.data(), dt.data(), in.rows, in.heads, in.dim, g.data(),
                             beta.data());
  return {widen(g), widen(beta)};
}
struct GatesGrads {
  Vec da, db, dA_log, ddt_bias;
};
// da, db start filled with random values (overwritten); dA_log, ddt_bias start at the given values (accumulated).
template <typename T>
GatesGrads gates_bwd(const Vec& dg, const Vec& dbeta, const GatesIn& in, const Vec& dA_in, const Vec& ddt_in) {
  auto dgt = cast<T>(dg), dbt = cast<T>(dbeta), at = cast<T>(in.a), bt = cast<T>(in.b), At = cast<T>(in.A_log),
       dt = cast<T>(in.dt_bias);
  auto da = cast<T>(randn(in.a.size(), 904)), db = cast<T>(randn(in.b.size(), 905));
  auto dA = cast<T>(dA_in), ddt = cast<T>(ddt_in);
  llmt::cpu::delta_gates_bwd(dgt.data(), dbt.data(), at.data(), bt.data(), At.data(), dt.data(), in.rows, in.heads,
                             in.dim, da.data(), db.data(), dA.data(), ddt.data());
  return {widen(da), widen(db), widen(dA), widen(ddt)};
}

double silu(double z) { return z / (1.0 + std::exp(-z)); }

}  // namespace

// ---------------------------------------------------------------- short convolution + SiLU

TEST_CASE("short_conv: hand-computed width 2, 3 tokens, 2 channels, 2 batch rows", "[delta_blocks][short_conv]") {
  // w[c] = (previous-token tap, current-token tap): channel 0 (0.5, 2), channel 1 (1, -1).
  // Row 0: x channel 0 = (1, 2, 3) -> pre = (2*1, 0.5*1 + 2*2, 0.5*2 + 2*3) = (2, 4.5, 7);
  //        x channel 1 = (10, 20, 30) -> pre = (-10, 10 - 20, 20 - 30) = (-10, -10, -10).
  // Row 1: x channel 0 = (4, 5, 6) -> pre = (8, 0.5*4 + 2*5, 0.5*5 + 2*6) = (8, 12, 14.5): the history
  //        restarts (row 0's last token 3 does not leak in); channel 1 = 0 -> pre = 0.
  const ConvShape s{2, 3, 2, 2};
  const Vec x = {1, 10, 2, 20, 3, 30, 4, 0, 5, 0, 6, 0};
  const Vec w = {0.5, 2.0, 1.0, -1.0};
  const Vec pre = {2, -10, 4.5, -10, 7, -10, 8, 0, 12, 0, 14.5, 0};
  const ConvOut f = conv_fwd<double>(x, w, s);
  for (size_t i = 0; i < pre.size(); ++i) {
    CHECK(f.pre[i] == Approx(pre[i]).epsilon(1e-15));
    CHECK(f.y[i] == Approx(silu(pre[i])).epsilon(1e-15));
  }
}

TEST_CASE("short_conv: causal: changing x at t+1 leaves y up to t unchanged", "[delta_blocks][short_conv]") {
  const ConvShape s{2, 6, 3, 4};
  const Vec x = randn(s.numel(), 20), w = randn(s.wsize(), 21);
  const ConvOut f = conv_fwd<double>(x, w, s);
  for (int64_t t = 0; t + 1 < s.seq; ++t) {
    Vec x2 = x;
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t c = 0; c < s.channels; ++c) x2[static_cast<size_t>((b * s.seq + t + 1) * s.channels + c)] += 1.0;
    const ConvOut f2 = conv_fwd<double>(x2, w, s);
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t c = 0; c < s.channels; ++c) {
        for (int64_t u = 0; u <= t; ++u) {
          const size_t i = static_cast<size_t>((b * s.seq + u) * s.channels + c);
          CHECK(f2.y[i] == f.y[i]);
        }
        const size_t next = static_cast<size_t>((b * s.seq + t + 1) * s.channels + c);
        CHECK(f2.y[next] != f.y[next]);  // and the change does reach the current token
      }
  }
}

TEST_CASE("short_conv: finite-difference gradients; dx overwritten, dw accumulated; float", "[delta_blocks][short_conv]") {
  // Sequences longer and shorter than the kernel width (the second has only clipped windows).
  for (const ConvShape s : {ConvShape{2, 6, 3, 4}, ConvShape{1, 2, 2, 4}}) {
    INFO("batch " << s.batch << " seq " << s.seq << " channels " << s.channels << " width " << s.width);
    const Vec x = randn(s.numel(), 30), w = randn(s.wsize(), 31), R = randn(s.numel(), 32);
    const Vec dw0 = randn(s.wsize(), 33);
    const ConvOut f = conv_fwd<double>(x, w, s);
    const ConvGrads g = conv_bwd<double>(R, x, w, f.pre, s, dw0);
    const Vec fd_x = fd_grad([&](const Vec& xx) { return dot(conv_fwd<double>(xx, w, s).y, R); }, x);
    const Vec fd_w = fd_grad([&](const Vec& ww) { return dot(conv_fwd<double>(x, ww, s).y, R); }, w);
    const double ex = rel_err(g.dx, fd_x), ew = rel_err(minus(g.dw, dw0), fd_w);
    std::printf("short_conv fd (seq %lld): dx %.3g dw %.3g\n", static_cast<long long>(s.seq), ex, ew);
    CHECK(ex < kFdTol);
    CHECK(ew < kFdTol);

    const ConvOut ff = conv_fwd<float>(x, w, s);
    CHECK(rel_err(ff.pre, f.pre) < kF32Tol);
    CHECK(rel_err(ff.y, f.y) < kF32Tol);
    const ConvGrads gf = conv_bwd<float>(R, x, w, ff.pre, s, dw0);
    CHECK(rel_err(gf.dx, g.dx) < kF32Tol);
    CHECK(rel_err(gf.dw, g.dw) < kF32Tol);
  }
}

// ---------------------------------------------------------------- L2 norm + query scale

TEST_CASE("short_conv with bias (Mamba2 conv1d): hand value, finite-difference gradients; dbias accumulated",
          "[delta_blocks][short_conv]") {
  // Hand value: width 2, one channel, w = (0.5, 2), bias 1, x = (1, 3): pre = (1 + 2*1, 1 + 0.5*1 + 2*3) = (3, 7.5).
  {
    const std::vector<double> x{1, 3}, w{0.5, 2}, bias{1};
    std::vector<double> pre(2), y(2);
    llmt::cpu::short_conv_silu_fwd(x.data(), w.data(), 1, 2, 1, 2, pre.data(), y.data(), bias.data());
    CHECK(pre[0] == Approx(3.0).margin(1e-15));
    CHECK(pre[1] == Approx(7.5).margin(1e-15));
    CHECK(y[1] == Approx(7.5 / (1.0 + std::exp(-7.5))).margin(1e-15));
  }
  const ConvShape s{2, 6, 3, 4};
  const Vec x = randn(s.numel(), 40), w = randn(s.wsize(), 41), bias = randn(3, 42), R = randn(s.numel(), 43);
  const Vec dw0 = randn(s.wsize(), 44), db0 = randn(3, 45);
  const auto fwd = [&](const Vec& xx, const Vec& ww, const Vec& bb) {
    Vec pre(s.numel()), y(s.numel());
    llmt::cpu::short_conv_silu_fwd(xx.data(), ww.data(), s.batch, s.seq, s.channels, s.width, pre.data(), y.data(),
                                   bb.data());
    return std::pair<Vec, Vec>{pre, y};
  };
  const Vec pre = fwd(x, w, bias).first;
  Vec dx = randn(s.numel(), 46), dw = dw0, db = db0;
  llmt::cpu::short_conv_silu_bwd(R.data(), x.data(), w.data(), pre.data(), s.batch, s.seq, s.channels, s.width,
                                 dx.data(), dw.data(), db.data());
  const Vec fd_x = fd_grad([&](const Vec& xx) { return dot(fwd(xx, w, bias).second, R); }, x);
  const Vec fd_w = fd_grad([&](const Vec& ww) { return dot(fwd(x, ww, bias).second, R); }, w);
  const Vec fd_b = fd_grad([&](const Vec& bb) { return dot(fwd(x, w, bb).second, R); }, bias);
  CHECK(rel_err(dx, fd_x) < kFdTol);
  CHECK(rel_err(minus(dw, dw0), fd_w) < kFdTol);
  CHECK(rel_err(minus(db, db0), fd_b) < kFdTol);
}

TEST_CASE("l2norm: hand-computed (3, 4)", "[delta_blocks][l2norm]") {
  // eps = 0: r = 1/5, y = (0.6, 0.8). eps = 11 (inside the sqrt), scale 2: r = 1/sqrt(25 + 11) = 1/6,
  // y = 2 (3, 4) / 6 = (1, 4/3).
  const NormOut f0 = l2norm_fwd<double>({3.0, 4.0}, 1, 2, 0.0, 1.0);
  CHECK(f0.stat[0] == Approx(0.2).epsilon(1e-15));
  CHECK(f0.y[0] == Approx(0.6).epsilon(1e-15));
  CHECK(f0.y[1] == Approx(0.8).epsilon(1e-15));
  const NormOut f1 = l2norm_fwd<double>({3.0, 4.0}, 1, 2, 11.0, 2.0);
  CHECK(f1.stat[0] == Approx(1.0 / 6.0).epsilon(1e-15));
  CHECK(f1.y[0] == Approx(1.0).epsilon(1e-15));
  CHECK(f1.y[1] == Approx(4.0 / 3.0).epsilon(1e-15));
}

TEST_CASE("l2norm: finite-difference gradient with and without scale; dx overwritten; float", "[delta_blocks][l2norm]") {
  const int64_t rows = 4, dim = 6;
  const double eps = 0.1;  // large enough that a dropped eps changes the gradient visibly
  const Vec x = randn(rows * dim, 40), R = randn(rows * dim, 41);
  for (const double scale : {1.0, 0.35}) {
    INFO("scale " << scale);
    const NormOut f = l2norm_fwd<double>(x, rows, dim, eps, scale);
    const Vec dx = l2norm_bwd<double>(R, x, f, rows, dim, scale);
    const Vec fd_x = fd_grad([&](const Vec& xx) { return dot(l2norm_fwd<double>(xx, rows, dim, eps, scale).y, R); }, x);
    const double ex = rel_err(dx, fd_x);
    std::printf("l2norm fd (scale %g): dx %.3g\n", scale, ex);
    CHECK(ex < kFdTol);

    const NormOut ff = l2norm_fwd<float>(x, rows, dim, eps, scale);
    CHECK(rel_err(ff.y, f.y) < kF32Tol);
    CHECK(rel_err(ff.stat, f.stat) < kF32Tol);
    CHECK(rel_err(l2norm_bwd<float>(R, x, ff, rows, dim, scale), dx) < kF32Tol);
  }
}

// ---------------------------------------------------------------- FusedRMSNormGated

TEST_CASE("gated_rmsnorm: hand-computed 2-vector, sigmoid and silu gates", "[delta_blocks][gated_rmsnorm]") {
  // o = (3, 4), eps = 0.5: mean(o^2) + eps = 12.5 + 0.5 = 13, rho = 1/sqrt(13); w = (1, 2); z = (0, ln 3):
  // sigmoid(z) = (1/2, 3/4) -> y = (3 * 1/2, 4 * 2 * 3/4) rho = (1.5, 6) rho;
  // silu(z) = (0, 3/4 ln 3)   -> y = (0, 4 * 2 * 3/4 ln 3) rho = (0, 6 ln 3) rho.
  const double rho = 1.0 / std::sqrt(13.0), ln3 = std::log(3.0);
  const Vec o = {3.0, 4.0}, z = {0.0, ln3}, w = {1.0, 2.0};
  const NormOut fs = gated_fwd<double>(o, z, w, 1, 2, 0.5, true);
  CHECK(fs.stat[0] == Approx(rho).epsilon(1e-15));
  CHECK(fs.y[0] == Approx(1.5 * rho).epsilon(1e-15));
  CHECK(fs.y[1] == Approx(6.0 * rho).epsilon(1e-15));
  const NormOut fz = gated_fwd<double>(o, z, w, 1, 2, 0.5, false);
  CHECK(fz.stat[0] == Approx(rho).epsilon(1e-15));
  CHECK(fz.y[0] == 0.0);
  CHECK(fz.y[1] == Approx(6.0 * ln3 * rho).epsilon(1e-14));
}

TEST_CASE("gated_rmsnorm: finite-difference gradients, both gates; d_o, dz overwritten, dw accumulated; float",
          "[delta_blocks][gated_rmsnorm]") {
  const int64_t rows = 6, dim = 5;  // e.g. batch 1, seq 3, heads 2 sharing one w
  const double eps = 0.1;
  const Vec o = randn(rows * dim, 50), z = randn(rows * dim, 51), w = randn(dim, 52), R = randn(rows * dim, 53);
  const Vec dw0 = randn(dim, 54);
  for (const bool sigmoid_gate : {false, true}) {
    INFO("sigmoid_gate " << sigmoid_gate);
    const NormOut f = gated_fwd<double>(o, z, w, rows, dim, eps, sigmoid_gate);
    const GatedGrads g = gated_bwd<double>(R, o, z, w, f.stat, rows, dim, sigmoid_gate, dw0);
    auto loss = [&](const Vec& oo, const Vec& zz, const Vec& ww) {
      return dot(gated_fwd<double>(oo, zz, ww, rows, dim, eps, sigmoid_gate).y, R);
    };
    const Vec fd_o = fd_grad([&](const Vec& v) { return loss(v, z, w); }, o);
    const Vec fd_z = fd_grad([&](const Vec& v) { return loss(o, v, w); }, z);
    const Vec fd_w = fd_grad([&](const Vec& v) { return loss(o, z, v); }, w);
    const double eo = rel_err(g.d_o, fd_o), ez = rel_err(g.dz, fd_z), ew = rel_err(minus(g.dw, dw0), fd_w);
    std::printf("gated_rmsnorm fd (%s): d_o %.3g dz %.3g dw %.3g\n", sigmoid_gate ? "sigmoid" : "silu", eo, ez, ew);
    CHECK(eo < kFdTol);
    CHECK(ez < kFdTol);
    CHECK(ew < kFdTol);

    const NormOut ff = gated_fwd<float>(o, z, w, rows, dim, eps, sigmoid_gate);
    CHECK(rel_err(ff.y, f.y) < kF32Tol);
    CHECK(rel_err(ff.stat, f.stat) < kF32Tol);
    const GatedGrads gf = gated_bwd<float>(R, o, z, w, ff.stat, rows, dim, sigmoid_gate, dw0);
    CHECK(rel_err(gf.d_o, g.d_o) < kF32Tol);
    CHECK(rel_err(gf.dz, g.dz) < kF32Tol);
    CHECK(rel_err(gf.dw, g.dw) < kF32Tol);
  }
}

// ---------------------------------------------------------------- GDN gates

// ---------------------------------------------------------------- Mamba2 gated RMSNorm, the gate first

TEST_CASE("gate_rmsnorm: equals swiglu then rmsnorm, forward and backward, in double", "[delta_blocks][gate_rmsnorm]") {
  // The composition the Mamba2 layer ran before (layers-ssm-attn.md §1.2): u = swiglu(z, y), rmsnorm(u); backward
  // rmsnorm_bwd into du = 0, then swiglu_bwd. Two rows of Di = 48 (one group).
  const int64_t rows = 2, dim = 48, n = rows * dim;
  const double eps = 1e-5;
  const Vec y = randn(n, 60), z = randn(n, 61), w = randn(dim, 62), R = randn(n, 63), dw0 = randn(dim, 64);
  const size_t ne = static_cast<size_t>(n);
  Vec u(ne), out(ne), rstd(static_cast<size_t>(rows)), du(ne, 0.0), dy(ne), dz(ne), dw = dw0;
  llmt::cpu::swiglu_fwd(z.data(), y.data(), n, u.data());
  llmt::cpu::rmsnorm_fwd(u.data(), w.data(), rows, dim, eps, out.data(), rstd.data());
  llmt::cpu::rmsnorm_bwd(R.data(), u.data(), w.data(), rstd.data(), rows, dim, du.data(), dw.data());
  llmt::cpu::swiglu_bwd(z.data(), y.data(), du.data(), n, dz.data(), dy.data());

  const NormOut f = gate_first_fwd<double>(y, z, w, rows, dim, eps);
  const GateFirstGrads g = gate_first_bwd<double>(R, y, z, w, f.stat, rows, dim, dw0);
  const double eo = rel_err(f.y, out), er = rel_err(f.stat, rstd), ey = rel_err(g.dy, dy), ez = rel_err(g.dz, dz),
               ew = rel_err(g.dw, dw);
  std::printf("gate_rmsnorm vs swiglu + rmsnorm: out %.3g rstd %.3g dy %.3g dz %.3g dw %.3g\n", eo, er, ey, ez, ew);
  CHECK(eo < 1e-12);
  CHECK(er < 1e-12);
  CHECK(ey < 1e-12);
  CHECK(ez < 1e-12);
  CHECK(ew < 1e-12);
}

TEST_CASE("gate_rmsnorm: finite-difference gradients; dy, dz overwritten, dw accumulated; float",
          "[delta_blocks][gate_rmsnorm]") {
  const int64_t rows = 6, dim = 5;
  const double eps = 0.1;
  const Vec y = randn(rows * dim, 70), z = randn(rows * dim, 71), w = randn(dim, 72), R = randn(rows * dim, 73);
  const Vec dw0 = randn(dim, 74);
  const NormOut f = gate_first_fwd<double>(y, z, w, rows, dim, eps);
  const GateFirstGrads g = gate_first_bwd<double>(R, y, z, w, f.stat, rows, dim, dw0);
  auto loss = [&](const Vec& yy, const Vec& zz, const Vec& ww) {
    return dot(gate_first_fwd<double>(yy, zz, ww, rows, dim, eps).y, R);
  };
  const Vec fd_y = fd_grad([&](const Vec& v) { return loss(v, z, w); }, y);
  const Vec fd_z = fd_grad([&](const Vec& v) { return loss(y, v, w); }, z);
  const Vec fd_w = fd_grad([&](const Vec& v) { return loss(y, z, v); }, w);
  const double ey = rel_err(g.dy, fd_y), ez = rel_err(g.dz, fd_z), ew = rel_err(minus(g.dw, dw0), fd_w);
  std::printf("gate_rmsnorm fd: dy %.3g dz %.3g dw %.3g\n", ey, ez, ew);
  CHECK(ey < kFdTol);
  CHECK(ez < kFdTol);
  CHECK(ew < kFdTol);

  const NormOut ff = gate_first_fwd<float>(y, z, w, rows, dim, eps);
  CHECK(rel_err(ff.y, f.y) < kF32Tol);
  CHECK(rel_err(ff.stat, f.stat) < kF32Tol);
  const GateFirstGrads gf = gate_first_bwd<float>(R, y, z, w, ff.stat, rows, dim, dw0);
  CHECK(rel_err(gf.dy, g.dy) < kF32Tol);
  CHECK(rel_err(gf.dz, g.dz) < kF32Tol);
  CHECK(rel_err(gf.dw, g.dw) < kF32Tol);
}

TEST_CASE("gdn_gates: hand-computed gates", "[delta_blocks][gdn_gates]") {
  // Head 0: A_log = ln 2, dt_bias = 0.5, a = ln 3 - 0.5: u = ln 3, softplus(u) = ln 4, g = -2 ln 4;
  //         b = ln 3: beta = 3 / 4.
  // Head 1: A_log = 0, dt_bias = -1, a = 1: u = 0, softplus = ln 2, g = -ln 2; b = 0: beta = 1/2.
  const double ln3 = std::log(3.0);
  const GatesIn in{{ln3 - 0.5, 1.0}, {ln3, 0.0}, {std::log(2.0), 0.0}, {0.5, -1.0}, 1, 2};
  const GatesOut f = gates_fwd<double>(in);
  CHECK(f.g[0] == Approx(-2.0 * std::log(4.0)).epsilon(1e-15));
  CHECK(f.g[1] == Approx(-std::log(2.0)).epsilon(1e-15));
  CHECK(f.beta[0] == Approx(0.75).epsilon(1e-15));
  CHECK(f.beta[1] == Approx(0.5).epsilon(1e-15));
}

TEST_CASE("gdn_gates: softplus at large |a| does not overflow, float and double", "[delta_blocks][gdn_gates]") {
  // A_log = 0, dt_bias = 0: g = -softplus(a). softplus(50) = 50 + log1p(e^-50) = 50 to double precision;
  // softplus(-50) = log1p(e^-50) = e^-50 (1 - e^-50 / 2) ≈ 1.9287e-22; a naive log(1 + e^1000) is inf.
  // Gradient: da = dg (-sigmoid(a)) with dg = 1: -1 at a = 50, -e^-50 at a = -50.
  const Vec a = {50.0, -50.0, 1000.0, -1000.0};
  const GatesIn in{a, a, {0.0, 0.0, 0.0, 0.0}, {0.0, 0.0, 0.0, 0.0}, 1, 4};
  const GatesOut f = gates_fwd<double>(in);
  CHECK(f.g[0] == -50.0);
  CHECK(f.g[1] == Approx(-std::exp(-50.0)).epsilon(1e-15));
  CHECK(f.g[2] == -1000.0);
  CHECK(f.g[3] == 0.0);
  CHECK(f.beta[0] == 1.0);
  CHECK(f.beta[1] == Approx(std::exp(-50.0)).epsilon(1e-15));
  const GatesGrads g = gates_bwd<double>({1.0, 1.0, 1.0, 1.0}, {1.0, 1.0, 1.0, 1.0}, in, {0, 0, 0, 0}, {0, 0, 0, 0});
  CHECK(g.da[0] == Approx(-1.0).epsilon(1e-15));
  CHECK(g.da[1] == Approx(-std::exp(-50.0)).epsilon(1e-15));
  for (const Vec* v : {&f.g, &f.beta, &g.da, &g.db, &g.dA_log, &g.ddt_bias})
    for (const double e : *v) CHECK(std::isfinite(e));

  const GatesIn in_f{{50.0, -50.0}, {50.0, -50.0}, {0.0, 0.0}, {0.0, 0.0}, 1, 2};
  const GatesOut ff = gates_fwd<float>(in_f);
  CHECK(ff.g[0] == -50.0);
  CHECK(ff.g[1] == Approx(-std::exp(-50.0)).epsilon(1e-6));
}

namespace {

// Finite-difference check of the decay gates with `dim` channels per head (1: GDN, > 1: KDA): da, db
// overwritten, dA_log, ddt_bias accumulated; float agrees with double.
void check_gates_fd(int64_t rows, int64_t heads, int64_t dim, const char* name) {
  const size_t n = static_cast<size_t>(rows * heads), nh = static_cast<size_t>(heads), nc = n * dim;
  const GatesIn in{randn(nc, 60), randn(n, 61), randn(nh, 62), randn(nh * dim, 63), rows, heads, dim};
  const Vec Rg = randn(nc, 64), Rb = randn(n, 65), dA0 = randn(nh, 66), ddt0 = randn(nh * dim, 67);
  const GatesGrads g = gates_bwd<double>(Rg, Rb, in, dA0, ddt0);
  auto loss = [&](const GatesIn& p) {
    const GatesOut f = gates_fwd<double>(p);
    return dot(f.g, Rg) + dot(f.beta, Rb);
  };
  auto fd = [&](Vec GatesIn::*field) {
    return fd_grad(
        [&](const Vec& v) {
          GatesIn p = in;
          p.*field = v;
          return loss(p);
        },
        in.*field);
  };
  const double ea = rel_err(g.da, fd(&GatesIn::a)), eb = rel_err(g.db, fd(&GatesIn::b)),
               eA = rel_err(minus(g.dA_log, dA0), fd(&GatesIn::A_log)),
               edt = rel_err(minus(g.ddt_bias, ddt0), fd(&GatesIn::dt_bias));
  std::printf("%s fd: da %.3g db %.3g dA_log %.3g ddt_bias %.3g\n", name, ea, eb, eA, edt);
  CHECK(ea < kFdTol);
  CHECK(eb < kFdTol);
  CHECK(eA < kFdTol);
  CHECK(edt < kFdTol);

  const GatesOut fd64 = gates_fwd<double>(in), f32 = gates_fwd<float>(in);
  CHECK(rel_err(f32.g, fd64.g) < kF32Tol);
  CHECK(rel_err(f32.beta, fd64.beta) < kF32Tol);
  const GatesGrads gf = gates_bwd<float>(Rg, Rb, in, dA0, ddt0);
  CHECK(rel_err(gf.da, g.da) < kF32Tol);
  CHECK(rel_err(gf.db, g.db) < kF32Tol);
  CHECK(rel_err(gf.dA_log, g.dA_log) < kF32Tol);
  CHECK(rel_err(gf.ddt_bias, g.ddt_bias) < kF32Tol);
}

}  // namespace

TEST_CASE("gdn_gates: finite-difference gradients; da, db overwritten, dA_log, ddt_bias accumulated; float",
          "[delta_blocks][gdn_gates]") {
  check_gates_fd(5, 3, 1, "gdn_gates");
}

// ---------------------------------------------------------------- KDA gates (per key channel)

TEST_CASE("kda_gates: hand-computed channel-wise gates and gradients", "[delta_blocks][kda_gates]") {
  // One token, one head, d_k = 2: A_log = ln 2 (shared by the channels), dt_bias = (0.5, -1) (per channel),
  // f = (ln 3 - 0.5, 1): u = (ln 3, 0), softplus(u) = (ln 4, ln 2), g = -2 (ln 4, ln 2); b = ln 3: beta = 3/4.
  // Backward with dg = (1, 2), dbeta = 4: df = dg (-2 sigma(u)) = (-2 * 3/4, 2 * -2 * 1/2) = (-1.5, -2);
  // dA_log = Σ_c dg_c g_c = -4 ln 2 - 4 ln 2 = -8 ln 2; ddt_bias = df = (-1.5, -2); db = 4 * 3/4 * 1/4 = 0.75.
  const double ln2 = std::log(2.0), ln3 = std::log(3.0);
  const GatesIn in{{ln3 - 0.5, 1.0}, {ln3}, {ln2}, {0.5, -1.0}, 1, 1, 2};
  const GatesOut f = gates_fwd<double>(in);
  REQUIRE(f.g.size() == 2);
  REQUIRE(f.beta.size() == 1);
  CHECK(f.g[0] == Approx(-4.0 * ln2).epsilon(1e-15));
  CHECK(f.g[1] == Approx(-2.0 * ln2).epsilon(1e-15));
  CHECK(f.beta[0] == Approx(0.75).epsilon(1e-15));
  const GatesGrads g = gates_bwd<double>({1.0, 2.0}, {4.0}, in, {0.0}, {0.0, 0.0});
  CHECK(g.da[0] == Approx(-1.5).epsilon(1e-15));
  CHECK(g.da[1] == Approx(-2.0).epsilon(1e-15));
  CHECK(g.dA_log[0] == Approx(-8.0 * ln2).epsilon(1e-15));
  CHECK(g.ddt_bias[0] == Approx(-1.5).epsilon(1e-15));
  CHECK(g.ddt_bias[1] == Approx(-2.0).epsilon(1e-15));
  CHECK(g.db[0] == Approx(0.75).epsilon(1e-15));
}

TEST_CASE("kda_gates: finite-difference gradients; df, db overwritten, dA_log, ddt_bias accumulated; float",
          "[delta_blocks][kda_gates]") {
  check_gates_fd(5, 3, 4, "kda_gates");
}
