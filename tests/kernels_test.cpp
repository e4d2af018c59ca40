// CPU reference kernels: hand-computed cases, float64 central finite-difference gradient
// checks (scalar loss L = sum(out * R) with a fixed random R), and float-vs-double agreement.
#include <catch2/catch.hpp>

#include "vec_util.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
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

struct NormOut {
  Vec y, rstd;
};
template <typename T>
NormOut rmsnorm_fwd(const Vec& x, const Vec& w, int64_t rows, int64_t dim, double eps) {
  auto xt = cast<T>(x), wt = cast<T>(w);
  std::vector<T> y(x.size()), rstd(static_cast<size_t>(rows));
  llmt::cpu::rmsnorm_fwd(xt.data(), wt.data(), rows, dim, eps, y.data(), rstd.data());
  return {widen(y), widen(rstd)};
}
struct NormGrads {
  Vec dx, dw;
};
template <typename T>
NormGrads rmsnorm_bwd(const Vec& dy, const Vec& x, const Vec& w, const Vec& rstd, int64_t rows, int64_t dim,
                      const Vec& dx_in, const Vec& dw_in) {
  auto dyt = cast<T>(dy), xt = cast<T>(x), wt = cast<T>(w), rt = cast<T>(rstd);
  auto dx = cast<T>(dx_in), dw = cast<T>(dw_in);
  llmt::cpu::rmsnorm_bwd(dyt.data(), xt.data(), wt.data(), rt.data(), rows, dim, dx.data(), dw.data());
  return {widen(dx), widen(dw)};
}

template <typename T>
Vec rope(const Vec& x, int64_t b, int64_t s, int64_t h, int64_t d, double theta, bool backward) {
  auto xt = cast<T>(x);
  if (backward)
    llmt::cpu::rope_bwd(xt.data(), b, s, h, d, theta);
  else
    llmt::cpu::rope_fwd(xt.data(), b, s, h, d, theta);
  return widen(xt);
}

struct AttnShape {
  int64_t batch, seq, heads, head_dim;
  size_t numel() const { return static_cast<size_t>(batch * seq * heads * head_dim); }
  size_t rows() const { return static_cast<size_t>(batch * heads * seq); }
};
struct AttnOut {
  Vec o, lse;
};
template <typename T>
AttnOut attention_fwd(const Vec& q, const Vec& k, const Vec& v, AttnShape s, double scale) {
  auto qt = cast<T>(q), kt = cast<T>(k), vt = cast<T>(v);
  std::vector<T> o(s.numel()), lse(s.rows());
  llmt::cpu::attention_fwd(qt.data(), kt.data(), vt.data(), s.batch, s.seq, s.heads, s.head_dim, scale, o.data(),
                           lse.data());
  return {widen(o), widen(lse)};
}
struct AttnGrads {
  Vec dq, dk, dv;
};
// dq, dk, dv start filled with random values: the kernel must overwrite them.
template <typename T>
AttnGrads attention_bwd(const Vec& q, const Vec& k, const Vec& v, const AttnOut& f, const Vec& dout, AttnShape s,
                        double scale) {
  auto qt = cast<T>(q), kt = cast<T>(k), vt = cast<T>(v), ot = cast<T>(f.o), lt = cast<T>(f.lse),
       dt = cast<T>(dout);
  auto dq = cast<T>(randn(s.numel(), 901)), dk = cast<T>(randn(s.numel(), 902)), dv = cast<T>(randn(s.numel(), 903));
  llmt::cpu::attention_bwd(qt.data(), kt.data(), vt.data(), ot.data(), lt.data(), dt.data(), s.batch, s.seq,
                           s.heads, s.head_dim, scale, dq.data(), dk.data(), dv.data());
  return {widen(dq), widen(dk), widen(dv)};
}

template <typename T>
Vec swiglu_fwd(const Vec& gate, const Vec& up) {
  auto gt = cast<T>(gate), ut = cast<T>(up);
  std::vector<T> h(gate.size());
  llmt::cpu::swiglu_fwd(gt.data(), ut.data(), static_cast<int64_t>(gate.size()), h.data());
  return widen(h);
}
struct SwigluGrads {
  Vec dgate, dup;
};
// dgate, dup start filled with random values: the kernel must overwrite them.
template <typename T>
SwigluGrads swiglu_bwd(const Vec& gate, const Vec& up, const Vec& dh) {
  auto gt = cast<T>(gate), ut = cast<T>(up), dt = cast<T>(dh);
  auto dg = cast<T>(randn(gate.size(), 904)), du = cast<T>(randn(gate.size(), 905));
  llmt::cpu::swiglu_bwd(gt.data(), ut.data(), dt.data(), static_cast<int64_t>(gate.size()), dg.data(), du.data());
  return {widen(dg), widen(du)};
}

template <typename T>
Vec embedding_fwd(const std::vector<int32_t>& ids, const Vec& table, int64_t vocab, int64_t dim) {
  auto tt = cast<T>(table);
  std::vector<T> out(ids.size() * static_cast<size_t>(dim));
  llmt::cpu::embedding_fwd(ids.data(), static_cast<int64_t>(ids.size()), tt.data(), vocab, dim, out.data());
  return widen(out);
}
template <typename T>
Vec embedding_bwd(const std::vector<int32_t>& ids, const Vec& dout, int64_t dim, const Vec& dtable_in) {
  auto dt = cast<T>(dout), dtable = cast<T>(dtable_in);
  llmt::cpu::embedding_bwd(ids.data(), static_cast<int64_t>(ids.size()), dt.data(), dim, dtable.data());
  return widen(dtable);
}

struct CeOut {
  double total;
  Vec losses, grad;
};
template <typename T>
CeOut cross_entropy(const Vec& logits, const std::vector<int32_t>& targets, int64_t vocab, double grad_scale) {
  auto z = cast<T>(logits);
  auto losses = cast<T>(randn(targets.size(), 906));  // every entry must be written
  const double total = llmt::cpu::cross_entropy_fwd_bwd(z.data(), targets.data(), static_cast<int64_t>(targets.size()),
                                                        vocab, grad_scale, losses.data());
  return {total, widen(losses), widen(z)};
}

}  // namespace

// ---------------------------------------------------------------- gemm

TEST_CASE("gemm: all transpose combinations match a naive triple loop, float and double", "[kernels][gemm]") {
  const int64_t M = 3, N = 4, K = 5;
  const double alpha = 0.7, beta = -0.4;
  const Vec A = randn(M * K, 1), B = randn(K * N, 2), C0 = randn(M * N, 3);
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      INFO("trans_a=" << ta << " trans_b=" << tb);
      Vec ref(M * N);
      for (int64_t i = 0; i < M; ++i) {
        for (int64_t j = 0; j < N; ++j) {
          double s = 0.0;
          for (int64_t p = 0; p < K; ++p) s += (ta ? A[p * M + i] : A[i * K + p]) * (tb ? B[j * K + p] : B[p * N + j]);
          ref[i * N + j] = alpha * s + beta * C0[i * N + j];
        }
      }
      Vec Cd = C0;
      llmt::cpu::gemm(ta, tb, M, N, K, alpha, A.data(), B.data(), beta, Cd.data());
      CHECK(rel_err(Cd, ref) < 1e-14);

      auto Af = cast<float>(A), Bf = cast<float>(B), Cf = cast<float>(C0);
      llmt::cpu::gemm(ta, tb, M, N, K, 0.7f, Af.data(), Bf.data(), -0.4f, Cf.data());
      CHECK(rel_err(widen(Cf), ref) < kF32Tol);
    }
  }
}

TEST_CASE("gemm: row strides of A and C (padding left untouched) equal the dense product", "[kernels][gemm]") {
  const int64_t M = 3, N = 4, K = 5, pad = 3;
  const Vec A = randn(M * K, 11), B = randn(K * N, 12), C0 = randn(M * N, 13);
  for (bool ta : {false, true}) {
    INFO("trans_a=" << ta);
    const int64_t arows = ta ? K : M, acols = ta ? M : K, lda = acols + pad, ldc = N + pad;
    Vec Ad(arows * lda, 99.0), Cd(M * ldc, 77.0);  // padding: values the product must neither read nor write
    for (int64_t r = 0; r < arows; ++r) std::copy_n(A.data() + r * acols, acols, Ad.data() + r * lda);
    for (int64_t r = 0; r < M; ++r) std::copy_n(C0.data() + r * N, N, Cd.data() + r * ldc);
    Vec dense = C0;
    llmt::cpu::gemm(ta, true, M, N, K, 0.7, A.data(), B.data(), -0.4, dense.data());
    llmt::cpu::gemm(ta, true, M, N, K, 0.7, Ad.data(), B.data(), -0.4, Cd.data(), lda, ldc);
    for (int64_t r = 0; r < M; ++r)
      for (int64_t c = 0; c < ldc; ++c) CHECK(Cd[r * ldc + c] == (c < N ? dense[r * N + c] : 77.0));
  }
  Vec C = C0;
  CHECK_THROWS_WITH(llmt::cpu::gemm(false, false, M, N, K, 1.0, A.data(), B.data(), 0.0, C.data(), K - 1, 0),
                    Catch::Contains("must be at least the rows' lengths"));
}

// ---------------------------------------------------------------- rmsnorm

TEST_CASE("rmsnorm: hand-computed forward", "[kernels][rmsnorm]") {
  // x = [3, 4], w = [1, 2], eps = 0.5: mean(x^2) + eps = (9 + 16) / 2 + 0.5 = 13,
  // r = 1/sqrt(13), y = [3 r, 4 r 2] = [3, 8] / sqrt(13).
  const NormOut f = rmsnorm_fwd<double>({3.0, 4.0}, {1.0, 2.0}, 1, 2, 0.5);
  const double r = 1.0 / std::sqrt(13.0);
  CHECK(f.rstd[0] == Approx(r).epsilon(1e-15));
  CHECK(f.y[0] == Approx(3.0 * r).epsilon(1e-15));
  CHECK(f.y[1] == Approx(8.0 * r).epsilon(1e-15));
}

TEST_CASE("rmsnorm: finite-difference gradients; dx and dw accumulate", "[kernels][rmsnorm]") {
  const int64_t rows = 3, dim = 5;
  const double eps = 0.1;  // large enough that a dropped eps changes the gradient visibly
  const Vec x = randn(rows * dim, 10), w = randn(dim, 11), R = randn(rows * dim, 12);
  // Pre-filled gradients: the kernel must add to them.
  const Vec dx0 = randn(rows * dim, 13), dw0 = randn(dim, 14);

  const NormOut f = rmsnorm_fwd<double>(x, w, rows, dim, eps);
  const NormGrads g = rmsnorm_bwd<double>(R, x, w, f.rstd, rows, dim, dx0, dw0);

  const Vec fd_x = fd_grad([&](const Vec& xx) { return dot(rmsnorm_fwd<double>(xx, w, rows, dim, eps).y, R); }, x);
  const Vec fd_w = fd_grad([&](const Vec& ww) { return dot(rmsnorm_fwd<double>(x, ww, rows, dim, eps).y, R); }, w);
  CHECK(rel_err(minus(g.dx, dx0), fd_x) < kFdTol);
  CHECK(rel_err(minus(g.dw, dw0), fd_w) < kFdTol);

  SECTION("float agrees with double") {
    const NormOut ff = rmsnorm_fwd<float>(x, w, rows, dim, eps);
    CHECK(rel_err(ff.y, f.y) < kF32Tol);
    CHECK(rel_err(ff.rstd, f.rstd) < kF32Tol);
    const NormGrads gf = rmsnorm_bwd<float>(R, x, w, ff.rstd, rows, dim, dx0, dw0);
    CHECK(rel_err(gf.dx, g.dx) < kF32Tol);
    CHECK(rel_err(gf.dw, g.dw) < kF32Tol);
  }
}

TEMPLATE_TEST_CASE("add_rmsnorm: equals the add followed by rmsnorm_fwd bit for bit", "[kernels][rmsnorm]", float,
                   double) {
  // The fused op replaces add + rmsnorm_fwd in Block; the loss must not change by a bit.
  const int64_t rows = 4, dim = 7;
  const auto x = cast<TestType>(randn(rows * dim, 30)), branch = cast<TestType>(randn(rows * dim, 31));
  const auto w = cast<TestType>(randn(dim, 32));
  std::vector<TestType> h(x.size()), y(x.size()), rstd(rows);
  llmt::cpu::add_rmsnorm_fwd(x.data(), branch.data(), w.data(), rows, dim, 1e-5, h.data(), y.data(), rstd.data());

  std::vector<TestType> h_ref(x.size()), y_ref(x.size()), rstd_ref(rows);
  for (size_t i = 0; i < x.size(); ++i) h_ref[i] = x[i] + branch[i];
  llmt::cpu::rmsnorm_fwd(h_ref.data(), w.data(), rows, dim, 1e-5, y_ref.data(), rstd_ref.data());
  CHECK(h == h_ref);
  CHECK(y == y_ref);
  CHECK(rstd == rstd_ref);
  CHECK(widen(y) != widen(h));  // not trivially equal: the norm ran
}

// ---------------------------------------------------------------- rope

TEST_CASE("rope: hand-computed rotate-half case", "[kernels][rope]") {
  // head_dim 4, theta 1e4: inv_freq = [1e4^0, 1e4^(-2/4)] = [1, 0.01]. At position 1 the pairs
  // (x[0], x[2]) and (x[1], x[3]) rotate by 1 and 0.01 radians.
  const Vec x = {0.5, -1.5, 2.5, -3.5, 1.0, 2.0, 3.0, 4.0};  // positions 0 and 1
  const Vec y = rope<double>(x, 1, 2, 1, 4, 1e4, false);
  const Vec expect = {0.5,
                      -1.5,
                      2.5,
                      -3.5,
                      1.0 * std::cos(1.0) - 3.0 * std::sin(1.0),
                      2.0 * std::cos(0.01) - 4.0 * std::sin(0.01),
                      1.0 * std::sin(1.0) + 3.0 * std::cos(1.0),
                      2.0 * std::sin(0.01) + 4.0 * std::cos(0.01)};
  CHECK(rel_err(y, expect) < 1e-15);
}

TEST_CASE("rope: identity at position 0, orthogonal, relative, finite-difference gradient", "[kernels][rope]") {
  const int64_t B = 2, S = 3, H = 2, D = 6;
  const double theta = 100.0;
  const Vec x = randn(B * S * H * D, 20), R = randn(B * S * H * D, 21);
  const Vec y = rope<double>(x, B, S, H, D, theta, false);

  SECTION("position 0 is the identity, later positions are not") {
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < S; ++t) {
        const auto first = static_cast<size_t>((b * S + t) * H * D);
        const Vec xs(x.begin() + first, x.begin() + first + H * D), ys(y.begin() + first, y.begin() + first + H * D);
        if (t == 0)
          CHECK(ys == xs);
        else
          CHECK(rel_err(ys, xs) > 1e-3);
      }
    }
  }
  SECTION("rope_bwd(rope_fwd(x)) == x") {
    CHECK(rel_err(rope<double>(y, B, S, H, D, theta, true), x) < 1e-15);
  }
  SECTION("q.k after rotation depends only on the position difference") {
    // One head, the same q (resp. k) at every position of an 8-long sequence.
    const int64_t T = 8;
    const Vec q1 = randn(D, 22), k1 = randn(D, 23);
    Vec qs, ks;
    for (int64_t t = 0; t < T; ++t) {
      qs.insert(qs.end(), q1.begin(), q1.end());
      ks.insert(ks.end(), k1.begin(), k1.end());
    }
    const Vec qr = rope<double>(qs, 1, T, 1, D, theta, false), kr = rope<double>(ks, 1, T, 1, D, theta, false);
    auto score = [&](int64_t t, int64_t s) {
      double acc = 0.0;
      for (int64_t d = 0; d < D; ++d) acc += qr[t * D + d] * kr[s * D + d];
      return acc;
    };
    CHECK(score(5, 2) == Approx(score(3, 0)).epsilon(1e-13));
    CHECK(score(7, 4) == Approx(score(3, 0)).epsilon(1e-13));
    CHECK(score(4, 4) == Approx(dot(q1, k1)).epsilon(1e-13));
  }
  SECTION("finite-difference gradient: rope_bwd(R) = dL/dx") {
    const Vec fd = fd_grad([&](const Vec& xx) { return dot(rope<double>(xx, B, S, H, D, theta, false), R); }, x);
    CHECK(rel_err(rope<double>(R, B, S, H, D, theta, true), fd) < kFdTol);
  }
  SECTION("float agrees with double") {
    CHECK(rel_err(rope<float>(x, B, S, H, D, theta, false), y) < kF32Tol);
    CHECK(rel_err(rope<float>(R, B, S, H, D, theta, true), rope<double>(R, B, S, H, D, theta, true)) < kF32Tol);
  }
  SECTION("odd head_dim throws") {
    Vec odd = randn(3, 24);
    CHECK_THROWS_AS(llmt::cpu::rope_fwd(odd.data(), 1, 1, 1, 3, theta), llmt::Error);
  }
}

// ---------------------------------------------------------------- attention

TEST_CASE("attention: hand-computed seq_len 2", "[kernels][attention]") {
  // One head, head_dim 1, scale 1: q = [1, 2], k = [1, 0.5], v = [3, 5].
  // t = 0: only s = 0; o = 3, lse = q0 k0 = 1.
  // t = 1: scores 2*1 = 2, 2*0.5 = 1; weights e^2, e^1 over e^2 + e;
  //        o = (3 e^2 + 5 e) / (e^2 + e) = (3 e + 5) / (e + 1), lse = log(e^2 + e) = 1 + log(e + 1).
  const double e = std::exp(1.0);
  const AttnOut f = attention_fwd<double>({1.0, 2.0}, {1.0, 0.5}, {3.0, 5.0}, {1, 2, 1, 1}, 1.0);
  CHECK(f.o[0] == Approx(3.0).epsilon(1e-15));
  CHECK(f.lse[0] == Approx(1.0).epsilon(1e-15));
  CHECK(f.o[1] == Approx((3.0 * e + 5.0) / (e + 1.0)).epsilon(1e-15));
  CHECK(f.lse[1] == Approx(1.0 + std::log(e + 1.0)).epsilon(1e-15));
}

TEST_CASE("attention: layout, causality, finite-difference gradients, float", "[kernels][attention]") {
  const AttnShape s{2, 4, 2, 3};
  const double scale = 0.6;
  const Vec q = randn(s.numel(), 30), k = randn(s.numel(), 31), v = randn(s.numel(), 32), R = randn(s.numel(), 33);
  const AttnOut f = attention_fwd<double>(q, k, v, s, scale);
  auto at = [&](int64_t b, int64_t t, int64_t h) { return static_cast<size_t>(((b * s.seq + t) * s.heads + h) * s.head_dim); };

  SECTION("matches a naive softmax over the [batch, seq, heads, head_dim] layout") {
    Vec o(s.numel()), lse(s.rows());
    for (int64_t b = 0; b < s.batch; ++b) {
      for (int64_t h = 0; h < s.heads; ++h) {
        for (int64_t t = 0; t < s.seq; ++t) {
          Vec w(static_cast<size_t>(t + 1));
          double z = 0.0;
          for (int64_t j = 0; j <= t; ++j) {
            double sc = 0.0;
            for (int64_t d = 0; d < s.head_dim; ++d) sc += q[at(b, t, h) + d] * k[at(b, j, h) + d];
            w[j] = std::exp(scale * sc);
            z += w[j];
          }
          for (int64_t j = 0; j <= t; ++j)
            for (int64_t d = 0; d < s.head_dim; ++d) o[at(b, t, h) + d] += w[j] / z * v[at(b, j, h) + d];
          lse[(b * s.heads + h) * s.seq + t] = std::log(z);
        }
      }
    }
    CHECK(rel_err(f.o, o) < 1e-14);
    CHECK(rel_err(f.lse, lse) < 1e-14);
  }
  SECTION("changing k, v at position p leaves o and lse at t < p bit-identical and changes t = p") {
    for (int64_t p = 1; p < s.seq; ++p) {
      INFO("perturbed position " << p);
      Vec k2 = k, v2 = v;
      const Vec noise = randn(s.numel(), 34);
      for (int64_t b = 0; b < s.batch; ++b)
        for (int64_t h = 0; h < s.heads; ++h)
          for (int64_t d = 0; d < s.head_dim; ++d) {
            k2[at(b, p, h) + d] += noise[at(b, p, h) + d];
            v2[at(b, p, h) + d] += noise[at(b, p, h) + d];
          }
      const AttnOut f2 = attention_fwd<double>(q, k2, v2, s, scale);
      for (int64_t b = 0; b < s.batch; ++b) {
        for (int64_t h = 0; h < s.heads; ++h) {
          for (int64_t t = 0; t <= p; ++t) {
            const Vec o1(f.o.begin() + at(b, t, h), f.o.begin() + at(b, t, h) + s.head_dim);
            const Vec o2(f2.o.begin() + at(b, t, h), f2.o.begin() + at(b, t, h) + s.head_dim);
            const size_t r = static_cast<size_t>((b * s.heads + h) * s.seq + t);
            if (t < p) {
              CHECK(o1 == o2);
              CHECK(f.lse[r] == f2.lse[r]);
            } else {
              CHECK(rel_err(o2, o1) > 1e-6);
            }
          }
        }
      }
    }
  }
  SECTION("finite-difference dq, dk, dv (dq, dk, dv are overwritten)") {
    const AttnGrads g = attention_bwd<double>(q, k, v, f, R, s, scale);
    const Vec fd_q = fd_grad([&](const Vec& x) { return dot(attention_fwd<double>(x, k, v, s, scale).o, R); }, q);
    const Vec fd_k = fd_grad([&](const Vec& x) { return dot(attention_fwd<double>(q, x, v, s, scale).o, R); }, k);
    const Vec fd_v = fd_grad([&](const Vec& x) { return dot(attention_fwd<double>(q, k, x, s, scale).o, R); }, v);
    CHECK(rel_err(g.dq, fd_q) < kFdTol);
    CHECK(rel_err(g.dk, fd_k) < kFdTol);
    CHECK(rel_err(g.dv, fd_v) < kFdTol);
  }
  SECTION("float agrees with double") {
    const AttnOut ff = attention_fwd<float>(q, k, v, s, scale);
    CHECK(rel_err(ff.o, f.o) < kF32Tol);
    CHECK(rel_err(ff.lse, f.lse) < kF32Tol);
    const AttnGrads gd = attention_bwd<double>(q, k, v, f, R, s, scale);
    const AttnGrads gf = attention_bwd<float>(q, k, v, ff, R, s, scale);
    CHECK(rel_err(gf.dq, gd.dq) < kF32Tol);
    CHECK(rel_err(gf.dk, gd.dk) < kF32Tol);
    CHECK(rel_err(gf.dv, gd.dv) < kF32Tol);
  }
}

// ---------------------------------------------------------------- swiglu

TEST_CASE("swiglu: hand-computed forward", "[kernels][swiglu]") {
  // h = a sigmoid(a) b: (1, 2) -> 2 / (1 + e^-1); (-2, 3) -> -6 / (1 + e^2).
  const Vec h = swiglu_fwd<double>({1.0, -2.0}, {2.0, 3.0});
  CHECK(h[0] == Approx(2.0 / (1.0 + std::exp(-1.0))).epsilon(1e-15));
  CHECK(h[1] == Approx(-6.0 / (1.0 + std::exp(2.0))).epsilon(1e-15));
}

TEST_CASE("swiglu: finite-difference gradients, float", "[kernels][swiglu]") {
  const size_t n = 9;
  Vec gate = randn(n, 40);
  gate[0] = 4.0 * gate[0];  // one gate in the saturating range
  const Vec up = randn(n, 41), R = randn(n, 42);
  const SwigluGrads g = swiglu_bwd<double>(gate, up, R);
  const Vec fd_gate = fd_grad([&](const Vec& x) { return dot(swiglu_fwd<double>(x, up), R); }, gate);
  const Vec fd_up = fd_grad([&](const Vec& x) { return dot(swiglu_fwd<double>(gate, x), R); }, up);
  CHECK(rel_err(g.dgate, fd_gate) < kFdTol);
  CHECK(rel_err(g.dup, fd_up) < kFdTol);

  CHECK(rel_err(swiglu_fwd<float>(gate, up), swiglu_fwd<double>(gate, up)) < kF32Tol);
  const SwigluGrads gf = swiglu_bwd<float>(gate, up, R);
  CHECK(rel_err(gf.dgate, g.dgate) < kF32Tol);
  CHECK(rel_err(gf.dup, g.dup) < kF32Tol);
}

// ---------------------------------------------------------------- embedding

TEST_CASE("embedding: lookup, accumulating finite-difference gradient, range errors", "[kernels][embedding]") {
  const int64_t vocab = 5, dim = 3;
  const std::vector<int32_t> ids = {2, 0, 2, 4};  // id 2 twice: its gradient rows add up
  const Vec table = randn(vocab * dim, 50), R = randn(ids.size() * dim, 51), dtable0 = randn(vocab * dim, 52);

  const Vec out = embedding_fwd<double>(ids, table, vocab, dim);
  for (size_t i = 0; i < ids.size(); ++i)
    for (int64_t j = 0; j < dim; ++j) CHECK(out[i * dim + j] == table[ids[i] * dim + j]);

  const Vec dtable = embedding_bwd<double>(ids, R, dim, dtable0);
  const Vec fd = fd_grad([&](const Vec& t) { return dot(embedding_fwd<double>(ids, t, vocab, dim), R); }, table);
  CHECK(rel_err(minus(dtable, dtable0), fd) < kFdTol);

  CHECK(rel_err(embedding_fwd<float>(ids, table, vocab, dim), out) < kF32Tol);
  CHECK(rel_err(embedding_bwd<float>(ids, R, dim, dtable0), dtable) < kF32Tol);

  const std::vector<int32_t> too_big = {1, 12345}, negative = {-7}, just_past = {5};
  CHECK_THROWS_WITH(embedding_fwd<double>(too_big, table, vocab, dim), Catch::Contains("12345"));
  CHECK_THROWS_WITH(embedding_fwd<double>(negative, table, vocab, dim), Catch::Contains("-7"));
  CHECK_THROWS_AS(embedding_fwd<double>(just_past, table, vocab, dim), llmt::Error);
}

// ---------------------------------------------------------------- cross-entropy

TEST_CASE("cross_entropy: hand-computed 3-way vocab, ignored target", "[kernels][cross_entropy]") {
  // Row 0: logits [1, 2, 3], target 0. logsumexp = log(e + e^2 + e^3) = 3.40760596444438,
  // loss = 3.40760596444438 - 1 = 2.40760596444438;
  // softmax = [e, e^2, e^3] / (e + e^2 + e^3) = [0.0900305731703805, 0.2447284710547976, 0.6652409557748218],
  // gradient = 0.5 * (softmax - [1, 0, 0]).
  // Row 1: target -1: loss 0 and gradient 0.
  const CeOut c = cross_entropy<double>({1.0, 2.0, 3.0, 0.5, -1.0, 2.0}, {0, -1}, 3, 0.5);
  CHECK(c.losses[0] == Approx(2.40760596444438).epsilon(1e-14));
  CHECK(c.losses[1] == 0.0);
  CHECK(c.total == Approx(2.40760596444438).epsilon(1e-14));
  const Vec grad = {0.5 * (0.0900305731703805 - 1.0), 0.5 * 0.2447284710547976, 0.5 * 0.6652409557748218,
                    0.0, 0.0, 0.0};
  CHECK(rel_err(c.grad, grad) < 1e-14);
}

TEST_CASE("cross_entropy: finite-difference gradient, float, target out of range", "[kernels][cross_entropy]") {
  const int64_t vocab = 5;
  const std::vector<int32_t> targets = {3, -1, 0, 4};
  const double grad_scale = 0.37;
  const Vec logits = randn(targets.size() * vocab, 60);
  const CeOut c = cross_entropy<double>(logits, targets, vocab, grad_scale);

  double sum = 0.0;
  for (double l : c.losses) sum += l;
  CHECK(c.total == Approx(sum).epsilon(1e-15));
  CHECK(c.losses[1] == 0.0);

  // The written gradient is d(grad_scale * total)/dlogits.
  const Vec fd =
      fd_grad([&](const Vec& z) { return grad_scale * cross_entropy<double>(z, targets, vocab, grad_scale).total; },
              logits);
  CHECK(rel_err(c.grad, fd) < kFdTol);

  const CeOut cf = cross_entropy<float>(logits, targets, vocab, grad_scale);
  CHECK(cf.total == Approx(c.total).epsilon(kF32Tol));
  CHECK(rel_err(cf.losses, c.losses) < kF32Tol);
  CHECK(rel_err(cf.grad, c.grad) < kF32Tol);

  const std::vector<int32_t> at_vocab = {3, -1, 5, 0}, far_out = {3, -1, 0, 77};
  CHECK_THROWS_AS(cross_entropy<double>(logits, at_vocab, vocab, grad_scale), llmt::Error);
  CHECK_THROWS_WITH(cross_entropy<double>(logits, far_out, vocab, grad_scale),
                    Catch::Contains("row 3") && Catch::Contains("77"));
}

TEST_CASE("cross_entropy: a row stride past the vocabulary gives the dense results, padding untouched",
          "[kernels][cross_entropy]") {
  const int64_t rows = 3, vocab = 5, ld = 8;
  const Vec logits = randn(rows * vocab, 21);
  const std::vector<int32_t> targets = {4, -1, 0};
  Vec dense = logits, losses(rows), strided(rows * ld, 55.0), losses_s(rows), flags(rows), flags_s(rows);
  for (int64_t r = 0; r < rows; ++r) std::copy_n(logits.data() + r * vocab, vocab, strided.data() + r * ld);
  const double total = llmt::cpu::cross_entropy_fwd_bwd(dense.data(), targets.data(), rows, vocab, 0.5,
                                                        losses.data(), flags.data());
  const double total_s = llmt::cpu::cross_entropy_fwd_bwd(strided.data(), targets.data(), rows, vocab, 0.5,
                                                          losses_s.data(), flags_s.data(), ld);
  CHECK(total_s == total);
  CHECK(losses_s == losses);
  CHECK(flags_s == flags);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < ld; ++c) CHECK(strided[r * ld + c] == (c < vocab ? dense[r * vocab + c] : 55.0));
  CHECK_THROWS_WITH(llmt::cpu::cross_entropy_fwd_bwd(dense.data(), targets.data(), rows, vocab, 0.5, losses.data(),
                                                     static_cast<double*>(nullptr), vocab - 1),
                    Catch::Contains("row stride 4 is shorter than the vocabulary of 5"));
}

TEST_CASE("cross_entropy: argmax flags (correct) by hand, ties and unlabelled rows", "[kernels][cross_entropy]") {
  // Rows: [1, 2, 3] target 2 (argmax) -> 1; target 0 -> 0; [4, 4, 0] target 1 (tied maximum: a model at
  // chance whose two answers' logits round to one value must not score) -> 0; unlabelled -> 0. The flags do
  // not change the losses.
  const Vec logits = {1.0, 2.0, 3.0, 1.0, 2.0, 3.0, 4.0, 4.0, 0.0, 5.0, 0.0, 0.0};
  const std::vector<int32_t> targets = {2, 0, 1, -1};
  for (int precision = 0; precision < 2; ++precision) {
    INFO("precision " << (precision ? "float" : "double"));
    std::vector<double> flags(4, 7.0);
    std::vector<float> flags_f(4, 7.0f);
    Vec with(4);
    auto z = logits;
    auto zf = cast<float>(logits);
    std::vector<float> lf(4);
    if (precision == 0) {
      llmt::cpu::cross_entropy_fwd_bwd(z.data(), targets.data(), 4, 3, 1.0, with.data(), flags.data());
    } else {
      llmt::cpu::cross_entropy_fwd_bwd(zf.data(), targets.data(), 4, 3, 1.0, lf.data(), flags_f.data());
      flags.assign(flags_f.begin(), flags_f.end());
      with = widen(lf);
    }
    CHECK(flags == std::vector<double>{1.0, 0.0, 0.0, 0.0});
    const CeOut plain = cross_entropy<double>(logits, targets, 3, 1.0);
    CHECK(rel_err(with, plain.losses) < kF32Tol);
  }
}

// ---------------------------------------------------------------- adamw

TEST_CASE("adamw_step: two steps against hand arithmetic", "[kernels][adamw]") {
  // lr 0.1, beta1 0.9, beta2 0.99, eps 0.25, weight_decay 0.1 (decay factor 1 - 0.01 = 0.99),
  // grad_scale 0.5.
  //
  // Element 0: p = 1, raw grads 2 then -4, so g = 1 then -2.
  //  step 1: p = 1 * 0.99 = 0.99; m = 0.1 * 1 = 0.1; v = 0.01 * 1 = 0.01;
  //          1 - 0.9^1 = 0.1, 1 - 0.99^1 = 0.01; denom = sqrt(0.01) / sqrt(0.01) + 0.25 = 1.25;
  //          p = 0.99 - (0.1 / 0.1) * 0.1 / 1.25 = 0.99 - 0.08 = 0.91.
  //  step 2: p = 0.91 * 0.99 = 0.9009; m = 0.9 * 0.1 + 0.1 * (-2) = -0.11;
  //          v = 0.99 * 0.01 + 0.01 * 4 = 0.0499; 1 - 0.9^2 = 0.19, 1 - 0.99^2 = 0.0199;
  //          denom = sqrt(0.0499 / 0.0199) + 0.25 = 1.5835206624614062 + 0.25 = 1.8335206624614062;
  //          p = 0.9009 - (0.1 / 0.19) * (-0.11) / 1.8335206624614062 = 0.9009 + 0.031575720976269005
  //            = 0.9324757209762691.
  // Element 1: p = -2, raw grads 6 then 2, so g = 3 then 1.
  //  step 1: p = -2 * 0.99 = -1.98; m = 0.3; v = 0.01 * 9 = 0.09;
  //          denom = sqrt(0.09) / sqrt(0.01) + 0.25 = 3.25;
  //          p = -1.98 - (0.1 / 0.1) * 0.3 / 3.25 = -1.98 - 0.0923076923076923 = -2.0723076923076923.
  //  step 2: p = -2.0723076923076923 * 0.99 = -2.0515846153846153; m = 0.27 + 0.1 = 0.37;
  //          v = 0.0891 + 0.01 = 0.0991;
  //          denom = sqrt(0.0991 / 0.0199) + 0.25 = 2.2315688422021482 + 0.25 = 2.4815688422021482;
  //          p = -2.0515846153846153 - (0.1 / 0.19) * 0.37 / 2.4815688422021482
  //            = -2.0515846153846153 - 0.07847327819140949 = -2.130057893576025.
  Vec p = {1.0, -2.0}, m = {0.0, 0.0}, v = {0.0, 0.0};
  const Vec g1 = {2.0, 6.0}, g2 = {-4.0, 2.0};
  llmt::cpu::adamw_step(p.data(), g1.data(), m.data(), v.data(), 2, 0.1, 0.9, 0.99, 0.25, 0.1, 0.5, 1);
  CHECK(std::abs(p[0] - 0.91) < 1e-12);
  CHECK(std::abs(p[1] - -2.0723076923076923) < 1e-12);
  CHECK(std::abs(m[0] - 0.1) < 1e-12);
  CHECK(std::abs(m[1] - 0.3) < 1e-12);
  CHECK(std::abs(v[0] - 0.01) < 1e-12);
  CHECK(std::abs(v[1] - 0.09) < 1e-12);
  llmt::cpu::adamw_step(p.data(), g2.data(), m.data(), v.data(), 2, 0.1, 0.9, 0.99, 0.25, 0.1, 0.5, 2);
  CHECK(std::abs(p[0] - 0.9324757209762691) < 1e-12);
  CHECK(std::abs(p[1] - -2.130057893576025) < 1e-12);
  CHECK(std::abs(m[0] - -0.11) < 1e-12);
  CHECK(std::abs(m[1] - 0.37) < 1e-12);
  CHECK(std::abs(v[0] - 0.0499) < 1e-12);
  CHECK(std::abs(v[1] - 0.0991) < 1e-12);
}

TEST_CASE("adamw_step: float agrees with double over three steps", "[kernels][adamw]") {
  const size_t n = 16;
  Vec pd = randn(n, 70), md(n, 0.0), vd(n, 0.0);
  auto pf = cast<float>(pd), mf = cast<float>(md), vf = cast<float>(vd);
  for (int64_t step = 1; step <= 3; ++step) {
    const Vec g = randn(n, 70 + static_cast<uint64_t>(step));
    const auto gf = cast<float>(g);
    llmt::cpu::adamw_step(pd.data(), g.data(), md.data(), vd.data(), n, 1e-2, 0.9, 0.95, 1e-8, 0.1, 0.8, step);
    llmt::cpu::adamw_step(pf.data(), gf.data(), mf.data(), vf.data(), n, 1e-2, 0.9, 0.95, 1e-8, 0.1, 0.8, step);
  }
  CHECK(rel_err(widen(pf), pd) < kF32Tol);
  CHECK(rel_err(widen(mf), md) < kF32Tol);
  CHECK(rel_err(widen(vf), vd) < kF32Tol);
  CHECK_THROWS_AS(llmt::cpu::adamw_step(pd.data(), pd.data(), md.data(), vd.data(), n, 1e-2, 0.9, 0.95, 1e-8, 0.1,
                                        1.0, 0),
                  llmt::Error);
}

TEST_CASE("sum_squares: hand value and random data, float and double", "[kernels][adamw]") {
  const Vec x = {1.0, -2.0, 3.0};  // 1 + 4 + 9 = 14
  const auto xf = cast<float>(x);
  CHECK(llmt::cpu::sum_squares(x.data(), 3) == 14.0);
  CHECK(llmt::cpu::sum_squares(xf.data(), 3) == 14.0);

  const Vec r = randn(101, 80);
  CHECK(llmt::cpu::sum_squares(r.data(), 101) == Approx(dot(r, r)).epsilon(1e-14));
  const auto rf = cast<float>(r);
  CHECK(llmt::cpu::sum_squares(rf.data(), 101) == Approx(dot(r, r)).epsilon(kF32Tol));
}
