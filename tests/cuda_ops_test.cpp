// The CUDA backend against the CPU reference backend: every op of backend.h runs on both
// with the same fresh Philox inputs (never zeros), and the results must agree to
// max|gpu - cpu| / max|cpu| <= kTol with every GPU output finite. The ops that reduce
// (embedding_bwd, rmsnorm_bwd, sum_squares, cross_entropy, attention_bwd) must also give
// bit-identical results when run twice. main() (catch_main_gpu.cpp) skips without a GPU.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"

#include "cuda_test_util.h"

using namespace llmt::test;
using llmt::Backend;
using llmt::DType;
using llmt::OwnedTensor;
using llmt::Tensor;

TEST_CASE("cuda: memory ops round-trip and the backend names itself", "[cuda]") {
  REQUIRE(gpu().name() == "cuda");
  const auto host = randn(1001, 1);
  OwnedTensor a = on(gpu(), host, {7, 143});
  REQUIRE(get(gpu(), *a) == host);

  OwnedTensor b(gpu(), DType::f32, {1001});
  gpu().copy(*a, *b);
  REQUIRE(get(gpu(), *b) == host);

  gpu().fill_zero(*b);
  REQUIRE(get(gpu(), *b) == std::vector<float>(1001, 0.0f));

  const auto ids = rand_ids(33, 1000, 2);
  OwnedTensor t = on(gpu(), ids, {33});
  REQUIRE(get<int32_t>(gpu(), *t) == ids);

  OwnedTensor wrong(gpu(), DType::f32, {1000});
  REQUIRE_THROWS_AS(gpu().copy(*a, *wrong), llmt::Error);
}

TEST_CASE("cuda: f64 is refused naming the op", "[cuda]") {
  OwnedTensor a(gpu(), DType::f64, {16});
  gpu().fill_zero(*a);
  REQUIRE_THROWS_WITH(gpu().add(*a, *a, *a), Catch::Contains("add") && Catch::Contains("f64"));
  REQUIRE_THROWS_WITH(gpu().sum_squares(*a), Catch::Contains("sum_squares"));
}

TEST_CASE("cuda: add, also in place", "[cuda]") {
  const int64_t n = 100003;
  Pair a = both(randn(n, 10), {n}), b = both(randn(n, 11), {n});
  OwnedTensor og(gpu(), DType::f32, {n}), oc(cpu(), DType::f32, {n});
  gpu().add(*a.g, *b.g, *og);
  cpu().add(*a.c, *b.c, *oc);
  require_close(get(gpu(), *og), get(cpu(), *oc), "out = a + b");
  gpu().add(*a.g, *b.g, *a.g);
  cpu().add(*a.c, *b.c, *a.c);
  require_close(a, "a = a + b");
}

TEST_CASE("cuda: sum_squares in double, deterministic", "[cuda]") {
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{(1 << 20) + 3}}) {
    INFO("n = " << n);
    Pair x = both(randn(n, 20 + n), {n});
    const double g = gpu().sum_squares(*x.g), c = cpu().sum_squares(*x.c);
    CHECK(std::isfinite(g));
    CHECK(std::abs(g - c) <= 1e-12 * c);
    const double again = gpu().sum_squares(*x.g);
    CHECK(std::memcmp(&g, &again, sizeof g) == 0);
  }
}

TEST_CASE("cuda: matmul, all transposes, with and without accumulate", "[cuda]") {
  const int64_t M = 37, N = 53, K = 301;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (bool acc : {false, true}) {
        INFO("trans_a " << ta << " trans_b " << tb << " accumulate " << acc);
        Pair a = ta ? both(randn(K * M, 30), {K, M}) : both(randn(M * K, 30), {M, K});
        Pair b = tb ? both(randn(N * K, 31), {N, K}) : both(randn(K * N, 31), {K, N});
        Pair c = both(randn(M * N, 32, 10.0), {M, N});
        gpu().matmul(*a.g, ta, *b.g, tb, *c.g, acc);
        cpu().matmul(*a.c, ta, *b.c, tb, *c.c, acc);
        require_close(c, "c");
      }
    }
  }
}

TEST_CASE("cuda: the LM head's strided logits (logits_stride): matmul_strided and cross_entropy_strided",
          "[cuda]") {
  // A GPT-2-sized odd vocabulary: the CUDA backend pads the logits rows to a multiple of 64 elements; the strided
  // products and loss must equal the CPU's dense ones and leave the padding untouched.
  const int64_t rows = 6, D = 96, V = 50257, ld = gpu().logits_stride(V);
  REQUIRE(ld == 50304);
  REQUIRE(cpu().logits_stride(V) == V);
  const auto x = randn(rows * D, 60), w = randn(V * D, 61, 0.2);
  auto targets = rand_ids(static_cast<size_t>(rows), V, 62);
  targets[1] = -1;
  Pair xp = both(x, {rows, D}), wp = both(w, {V, D}), tp = both(targets, {rows});
  std::vector<float> padded(static_cast<size_t>(rows * ld), 123.0f);
  OwnedTensor zg = on(gpu(), padded, {rows, ld}), zc(cpu(), DType::f32, {rows, V});
  const Tensor zgv(zg->data, DType::f32, {rows, V});
  gpu().matmul_strided(*xp.g, 0, false, *wp.g, true, zgv, ld, false);  // logits = x W^T
  cpu().matmul(*xp.c, false, *wp.c, true, *zc, false);
  Pair losses = both(randn(rows, 63), {rows});
  gpu().cross_entropy_strided(zgv, ld, *tp.g, 0.5, *losses.g, llmt::Tensor());
  cpu().cross_entropy(*zc, *tp.c, 0.5, *losses.c, llmt::Tensor());
  require_close(losses, "strided losses");
  const auto zh = get(gpu(), *zg), zref = get(cpu(), *zc);
  std::vector<float> dense(static_cast<size_t>(rows * V));
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(zh.data() + r * ld, V, dense.data() + r * V);
    for (int64_t c = V; c < ld; ++c) REQUIRE(zh[static_cast<size_t>(r * ld + c)] == 123.0f);
  }
  require_close(dense, zref, "strided logits gradient");
  // dx = dlogits W and dW = dlogits^T x read the strided gradient.
  Pair dx = both(randn(rows * D, 64), {rows, D}), dw = both(randn(V * D, 65), {V, D});
  gpu().matmul_strided(zgv, ld, false, *wp.g, false, *dx.g, 0, false);
  cpu().matmul(*zc, false, *wp.c, false, *dx.c, false);
  gpu().matmul_strided(zgv, ld, true, *xp.g, false, *dw.g, 0, true);
  cpu().matmul(*zc, true, *xp.c, false, *dw.c, true);
  require_close(dx, "dx from strided logits");
  require_close(dw, "dW from strided logits");
}

TEST_CASE("cuda: embedding forward and backward with repeated ids, deterministic", "[cuda]") {
  struct Shape {
    int64_t n, vocab, dim, distinct;  // ids drawn from [0, distinct): repeats when distinct < n
  };
  for (Shape s : {Shape{1, 5, 3, 5}, Shape{300, 97, 67, 20}, Shape{5000, 50257, 64, 50257},
                  Shape{4096, 1000, 300, 3}}) {
    INFO("n " << s.n << " vocab " << s.vocab << " dim " << s.dim);
    const auto ids_host = rand_ids(static_cast<size_t>(s.n), s.distinct, 40);
    Pair ids = both(ids_host, {s.n});
    Pair table = both(randn(s.vocab * s.dim, 41), {s.vocab, s.dim});
    OwnedTensor og(gpu(), DType::f32, {s.n, s.dim}), oc(cpu(), DType::f32, {s.n, s.dim});
    gpu().embedding_fwd(*ids.g, *table.g, *og);
    cpu().embedding_fwd(*ids.c, *table.c, *oc);
    require_close(get(gpu(), *og), get(cpu(), *oc), "embedding_fwd");

    const auto dtable0 = randn(s.vocab * s.dim, 42);
    Pair dout = both(randn(s.n * s.dim, 43), {s.n, s.dim});
    Pair dtable = both(dtable0, {s.vocab, s.dim});
    gpu().embedding_bwd(*ids.g, *dout.g, *dtable.g);
    cpu().embedding_bwd(*ids.c, *dout.c, *dtable.c);
    require_close(dtable, "embedding_bwd");

    OwnedTensor again = on(gpu(), dtable0, {s.vocab, s.dim});
    gpu().embedding_bwd(*ids.g, *dout.g, *again);
    require_bit_identical(get(gpu(), *dtable.g), get(gpu(), *again), "embedding_bwd");
  }
}

TEST_CASE("cuda: add_rmsnorm forward (residual add + norm) against the CPU and the unfused ops", "[cuda]") {
  struct Shape {
    int64_t rows, dim;
  };
  for (Shape s : {Shape{1, 1}, Shape{5, 64}, Shape{1000, 768}, Shape{10007, 67}}) {
    INFO("rows " << s.rows << " dim " << s.dim);
    const double eps = 1e-5;
    Pair x = both(randn(s.rows * s.dim, 60, 2.0), {s.rows, s.dim});
    Pair branch = both(randn(s.rows * s.dim, 61), {s.rows, s.dim});
    Pair w = both(randn(s.dim, 62), {s.dim});
    Pair h = both(randn(s.rows * s.dim, 63), {s.rows, s.dim});
    Pair y = both(randn(s.rows * s.dim, 64), {s.rows, s.dim});
    Pair rstd = both(randn(s.rows, 65), {s.rows});
    gpu().add_rmsnorm_fwd(*x.g, *branch.g, *w.g, eps, *h.g, *y.g, *rstd.g);
    cpu().add_rmsnorm_fwd(*x.c, *branch.c, *w.c, eps, *h.c, *y.c, *rstd.c);
    require_close(h, "h");
    require_close(y, "y");
    require_close(rstd, "rstd");

    // The GPU's own add followed by its rmsnorm_fwd gives the same bits (the kernels share the row code).
    OwnedTensor h2(gpu(), DType::f32, {s.rows, s.dim}), y2(gpu(), DType::f32, {s.rows, s.dim}),
        r2(gpu(), DType::f32, {s.rows});
    gpu().add(*x.g, *branch.g, *h2);
    gpu().rmsnorm_fwd(*h2, *w.g, eps, *y2, *r2);
    require_bit_identical(get(gpu(), *h.g), get(gpu(), *h2), "add_rmsnorm_fwd h");
    require_bit_identical(get(gpu(), *y.g), get(gpu(), *y2), "add_rmsnorm_fwd y");
    require_bit_identical(get(gpu(), *rstd.g), get(gpu(), *r2), "add_rmsnorm_fwd rstd");
  }
}

TEST_CASE("cuda: rmsnorm forward and backward (dx and dw accumulate), deterministic", "[cuda]") {
  struct Shape {
    int64_t rows, dim;
  };
  for (Shape s : {Shape{1, 1}, Shape{5, 64}, Shape{1000, 768}, Shape{10007, 67}}) {
    INFO("rows " << s.rows << " dim " << s.dim);
    const double eps = 1e-5;
    Pair x = both(randn(s.rows * s.dim, 50, 2.0), {s.rows, s.dim});
    Pair w = both(randn(s.dim, 51), {s.dim});
    Pair y = both(randn(s.rows * s.dim, 52), {s.rows, s.dim});
    Pair rstd = both(randn(s.rows, 53), {s.rows});
    gpu().rmsnorm_fwd(*x.g, *w.g, eps, *y.g, *rstd.g);
    cpu().rmsnorm_fwd(*x.c, *w.c, eps, *y.c, *rstd.c);
    require_close(y, "y");
    require_close(rstd, "rstd");

    // The backward of both runs from the CPU's rstd, so that only the backward is compared.
    const auto rstd_host = get(cpu(), *rstd.c);
    const auto dx0 = randn(s.rows * s.dim, 54), dw0 = randn(s.dim, 55);
    Pair r = both(rstd_host, {s.rows});
    Pair dy = both(randn(s.rows * s.dim, 56), {s.rows, s.dim});
    Pair dx = both(dx0, {s.rows, s.dim}), dw = both(dw0, {s.dim});
    gpu().rmsnorm_bwd(*dy.g, *x.g, *w.g, *r.g, *dx.g, *dw.g);
    cpu().rmsnorm_bwd(*dy.c, *x.c, *w.c, *r.c, *dx.c, *dw.c);
    require_close(dx, "dx");
    require_close(dw, "dw");

    OwnedTensor dx2 = on(gpu(), dx0, {s.rows, s.dim}), dw2 = on(gpu(), dw0, {s.dim});
    gpu().rmsnorm_bwd(*dy.g, *x.g, *w.g, *r.g, *dx2, *dw2);
    require_bit_identical(get(gpu(), *dx.g), get(gpu(), *dx2), "rmsnorm_bwd dx");
    require_bit_identical(get(gpu(), *dw.g), get(gpu(), *dw2), "rmsnorm_bwd dw");
  }
}

TEST_CASE("cuda: rope forward and backward", "[cuda]") {
  for (int64_t head_dim : {2, 32, 64, 128}) {
    const int64_t B = 2, T = 67, H = 3, n = B * T * H * head_dim;
    INFO("head_dim " << head_dim);
    Pair x = both(randn(n, 60), {B, T, H, head_dim});
    gpu().rope_fwd(*x.g, 10000.0);
    cpu().rope_fwd(*x.c, 10000.0);
    require_close(x, "rope_fwd");
    Pair dx = both(randn(n, 61), {B, T, H, head_dim});
    gpu().rope_bwd(*dx.g, 500000.0);
    cpu().rope_bwd(*dx.c, 500000.0);
    require_close(dx, "rope_bwd");
  }
}

TEST_CASE("cuda: causal attention forward and backward, deterministic", "[cuda]") {
  struct Shape {
    int64_t B, T, H, Dh;
  };
  for (Shape s : {Shape{1, 1, 1, 32}, Shape{2, 7, 3, 64}, Shape{1, 67, 2, 128}, Shape{2, 130, 2, 64},
                  Shape{1, 130, 1, 32}, Shape{1, 257, 2, 64}}) {
    INFO("B " << s.B << " T " << s.T << " H " << s.H << " Dh " << s.Dh);
    const int64_t n = s.B * s.T * s.H * s.Dh, rows = s.B * s.H * s.T;
    const double scale = 1.0 / std::sqrt(static_cast<double>(s.Dh));
    Pair q = both(randn(n, 70), {s.B, s.T, s.H, s.Dh}), k = both(randn(n, 71), {s.B, s.T, s.H, s.Dh});
    Pair v = both(randn(n, 72), {s.B, s.T, s.H, s.Dh});
    Pair o = both(randn(n, 73), {s.B, s.T, s.H, s.Dh}), lse = both(randn(rows, 74), {s.B, s.H, s.T});
    gpu().attention_fwd(*q.g, *k.g, *v.g, scale, *o.g, *lse.g);
    cpu().attention_fwd(*q.c, *k.c, *v.c, scale, *o.c, *lse.c);
    require_close(o, "o");
    require_close(lse, "lse");

    // dq, dk, dv start random: the backward must overwrite them.
    Pair dout = both(randn(n, 75), {s.B, s.T, s.H, s.Dh});
    Pair dq = both(randn(n, 76), {s.B, s.T, s.H, s.Dh}), dk = both(randn(n, 77), {s.B, s.T, s.H, s.Dh});
    Pair dv = both(randn(n, 78), {s.B, s.T, s.H, s.Dh});
    gpu().attention_bwd(*q.g, *k.g, *v.g, *o.g, *lse.g, *dout.g, scale, *dq.g, *dk.g, *dv.g);
    cpu().attention_bwd(*q.c, *k.c, *v.c, *o.c, *lse.c, *dout.c, scale, *dq.c, *dk.c, *dv.c);
    // At T = 1, dq and dk vanish (dS = P (dO.v - dO.o) with o = v): compare against the
    // O(1) size of their terms (unit-normal inputs) rather than against zero.
    require_close(dq, "dq", kTol, 1.0);
    require_close(dk, "dk", kTol, 1.0);
    require_close(dv, "dv", kTol, 1.0);

    OwnedTensor dq2(gpu(), DType::f32, {s.B, s.T, s.H, s.Dh}), dk2(gpu(), DType::f32, {s.B, s.T, s.H, s.Dh});
    OwnedTensor dv2(gpu(), DType::f32, {s.B, s.T, s.H, s.Dh});
    gpu().attention_bwd(*q.g, *k.g, *v.g, *o.g, *lse.g, *dout.g, scale, *dq2, *dk2, *dv2);
    require_bit_identical(get(gpu(), *dq.g), get(gpu(), *dq2), "attention_bwd dq");
    require_bit_identical(get(gpu(), *dk.g), get(gpu(), *dk2), "attention_bwd dk");
    require_bit_identical(get(gpu(), *dv.g), get(gpu(), *dv2), "attention_bwd dv");
  }
}

TEST_CASE("cuda: swiglu forward and backward", "[cuda]") {
  const int64_t n = 10007;
  Pair gate = both(randn(n, 80, 3.0), {n}), up = both(randn(n, 81), {n});
  Pair h = both(randn(n, 82), {n});
  gpu().swiglu_fwd(*gate.g, *up.g, *h.g);
  cpu().swiglu_fwd(*gate.c, *up.c, *h.c);
  require_close(h, "h");
  Pair dh = both(randn(n, 83), {n});
  Pair dgate = both(randn(n, 84), {n}), dup = both(randn(n, 85), {n});
  gpu().swiglu_bwd(*gate.g, *up.g, *dh.g, *dgate.g, *dup.g);
  cpu().swiglu_bwd(*gate.c, *up.c, *dh.c, *dgate.c, *dup.c);
  require_close(dgate, "dgate");
  require_close(dup, "dup");
}

TEST_CASE("cuda: cross_entropy with negative targets, deterministic", "[cuda]") {
  struct Shape {
    int64_t rows, vocab;
  };
  for (Shape s : {Shape{5, 7}, Shape{8, 50257}, Shape{300, 1000}}) {
    INFO("rows " << s.rows << " vocab " << s.vocab);
    auto targets = rand_ids(static_cast<size_t>(s.rows), s.vocab, 90);
    int64_t labelled = 0;
    for (size_t r = 0; r < targets.size(); ++r) {
      if (r % 3 == 1) targets[r] = -1;
      labelled += targets[r] >= 0;
    }
    const double grad_scale = 1.0 / static_cast<double>(labelled);
    auto logits0 = randn(s.rows * s.vocab, 91, 3.0);
    // Every 4th labelled row: the target's logit is the row's maximum, tied with another entry (a tie is
    // wrong); every 4th + 2: the target is the unique maximum.
    for (int64_t r = 0; r < s.rows; r += 2) {
      const int64_t t = targets[static_cast<size_t>(r)];
      if (t < 0) continue;
      float* z = logits0.data() + r * s.vocab;
      z[t] = *std::max_element(z, z + s.vocab) + 1.0f;
      if (r % 4 == 0) z[(t + 1 + r % (s.vocab - 1)) % s.vocab] = z[t];
    }
    Pair logits = both(logits0, {s.rows, s.vocab});
    Pair t = both(targets, {s.rows});
    Pair losses = both(randn(s.rows, 92), {s.rows});
    Pair correct = both(randn(s.rows, 93), {s.rows});  // every entry must be written
    gpu().cross_entropy(*logits.g, *t.g, grad_scale, *losses.g, *correct.g);
    cpu().cross_entropy(*logits.c, *t.c, grad_scale, *losses.c, *correct.c);
    // The argmax flags equal the CPU's and an independent host count: 1 iff the target beats every other logit.
    const auto flags = get(gpu(), *correct.g);
    int64_t right = 0, ties = 0;
    for (int64_t r = 0; r < s.rows; ++r) {
      const int64_t t = targets[static_cast<size_t>(r)];
      int64_t reaching = 0;  // other logits >= the target's
      for (int64_t j = 0; t >= 0 && j < s.vocab; ++j)
        reaching += j != t && logits0[static_cast<size_t>(r * s.vocab + j)] >= logits0[static_cast<size_t>(r * s.vocab + t)];
      const float expect = t >= 0 && reaching == 0 ? 1.0f : 0.0f;
      REQUIRE(flags[static_cast<size_t>(r)] == expect);
      right += expect > 0;
      ties += t >= 0 && r % 4 == 0;
    }
    CHECK(right > 0);
    CHECK(ties > 0);
    require_bit_identical(flags, get(cpu(), *correct.c), "cross_entropy correct");
    const double g = gpu().sum(*losses.g), c = cpu().sum(*losses.c);
    CHECK(std::isfinite(g));
    CHECK(std::abs(g - c) <= kTol * std::abs(c));
    require_close(losses, "losses");
    require_close(logits, "gradient");

    const auto grad = get(gpu(), *logits.g), loss_rows = get(gpu(), *losses.g);
    for (int64_t r = 1; r < s.rows; r += 3) {
      CHECK(loss_rows[static_cast<size_t>(r)] == 0.0f);
      for (int64_t j = 0; j < s.vocab; ++j) REQUIRE(grad[static_cast<size_t>(r * s.vocab + j)] == 0.0f);
    }

    OwnedTensor logits2 = on(gpu(), logits0, {s.rows, s.vocab}), losses2(gpu(), DType::f32, {s.rows});
    gpu().cross_entropy(*logits2, *t.g, grad_scale, *losses2, llmt::Tensor());
    const double g2 = gpu().sum(*losses2);
    CHECK(std::memcmp(&g, &g2, sizeof g) == 0);
    require_bit_identical(grad, get(gpu(), *logits2), "cross_entropy gradient");
    require_bit_identical(loss_rows, get(gpu(), *losses2), "cross_entropy losses");
  }
}

TEST_CASE("cuda: adamw_step over several steps", "[cuda]") {
  const int64_t n = 10007;
  Pair p = both(randn(n, 100), {n}), m = both(randn(n, 101, 0.01), {n});
  auto v0 = randn(n, 102, 1e-3);
  for (float& e : v0) e = e * e;  // second moments are non-negative
  Pair v = both(v0, {n});
  llmt::AdamWParams hp;
  hp.lr = 1e-3;
  hp.weight_decay = 0.1;
  for (int64_t step = 1; step <= 5; ++step) {
    Pair grads = both(randn(n, 110 + step), {n});
    gpu().adamw_step(*p.g, *grads.g, *m.g, *v.g, hp, 0.5, step, Tensor());
    cpu().adamw_step(*p.c, *grads.c, *m.c, *v.c, hp, 0.5, step, Tensor());
  }
  // Arithmetic in double on both sides: the results are at most a float rounding apart,
  // far below the size of one update (lr = 1e-3 against parameters of size ~1).
  require_close(p, "params", 1e-6);
  require_close(m, "m", 1e-6);
  require_close(v, "v", 1e-6);
  Pair grads = both(randn(n, 120), {n});
  REQUIRE_THROWS_AS(gpu().adamw_step(*p.g, *grads.g, *m.g, *v.g, hp, 1.0, 0, Tensor()), llmt::Error);
}
