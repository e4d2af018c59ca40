// The CUDA backend's bf16 paths (train.precision = bf16) against the CPU reference: every op
// that takes or gives bf16 activations runs on the GPU with bf16 tensors and on the CPU in f32
// with the same inputs already rounded to bf16, so the only differences left are the GPU's
// own roundings of its outputs. Tolerances (max|gpu - cpu| / max|cpu|): kBf16 = 1e-2 where the
// output is stored in bf16 (one rounding is at most 2^-9 = 2e-3 relative, plus the rounding of
// bf16 intermediates such as the rotated q fed back in), kTol = 1e-5 where it stays f32.
// main() (catch_main_gpu.cpp) skips without a GPU.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/backend.h"

#include "cuda_test_util.h"

using namespace llmt::test;
using llmt::DType;
using llmt::OwnedTensor;
using llmt::Tensor;

namespace {

constexpr double kBf16 = 1e-2;

/// An f32 CPU tensor holding round_bf16(host): the reference's view of a bf16 GPU input.
OwnedTensor cpu_rounded(const std::vector<float>& host, std::initializer_list<int64_t> dims) {
  return on(cpu(), round_bf16(host), dims);
}

}  // namespace

TEST_CASE("cuda bf16: convert rounds to nearest even, both ways, and refuses other pairs", "[cuda][bf16]") {
  // 4099 elements: 512 groups of eight (16-byte aligned buffers) and a tail of three.
  // Hand-picked halfway cases besides random values: 1 + 2^-8 is a tie that rounds down to 1
  // (even), 1 + 3 * 2^-8 a tie that rounds up to 1 + 2^-6; a value just above a tie rounds up.
  std::vector<float> x = randn(4099, 1, 3.0);
  x[0] = 1.0f + std::ldexp(1.0f, -8);
  x[1] = 1.0f + 3.0f * std::ldexp(1.0f, -8);
  x[2] = std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f);
  x[3] = -0.0f;
  x[4] = 3.0e38f;  // large but finite in bf16 too
  OwnedTensor a = on(gpu(), x, {4099});
  OwnedTensor b(gpu(), DType::bf16, {4099}), c(gpu(), DType::f32, {4099});
  gpu().convert(*a, *b);
  gpu().convert(*b, *c);
  const std::vector<float> expect = round_bf16(x);
  const std::vector<float> back = get(gpu(), *c);
  CHECK(expect[0] == 1.0f);
  CHECK(expect[1] == 1.0f + std::ldexp(1.0f, -6));
  CHECK(expect[2] == 1.0f + std::ldexp(1.0f, -7));
  for (size_t i = 0; i < x.size(); ++i) {
    INFO("i " << i << " x " << x[i]);
    REQUIRE(std::memcmp(&back[i], &expect[i], sizeof(float)) == 0);
  }
  // Views one element in (not 16-byte aligned, unlike the buffers: the element-a-thread path, both ways).
  const Tensor a1(static_cast<char*>(a->data) + sizeof(float), DType::f32, {4098});
  const Tensor b1(static_cast<char*>(b->data) + 2, DType::bf16, {4098});
  const Tensor c1(static_cast<char*>(c->data) + sizeof(float), DType::f32, {4098});
  const std::vector<float> zeros(4099, 0.0f);  // (bytes enough for b too: zero bits are bf16 zeros)
  gpu().upload(zeros.data(), *b);
  gpu().upload(zeros.data(), *c);
  gpu().convert(a1, b1);
  gpu().convert(b1, c1);
  const std::vector<float> back1 = get(gpu(), *c);
  for (size_t i = 1; i < x.size(); ++i) {
    INFO("view, i " << i << " x " << x[i]);
    REQUIRE(std::memcmp(&back1[i], &expect[i], sizeof(float)) == 0);
  }
  OwnedTensor d(gpu(), DType::f64, {4099});
  REQUIRE_THROWS_WITH(gpu().convert(*a, *d), Catch::Contains("convert") && Catch::Contains("f64"));
}

TEST_CASE("cuda bf16: matmul with bf16 operands into f32 and into bf16, all transposes", "[cuda][bf16]") {
  const int64_t M = 67, N = 129, K = 301;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (bool acc : {false, true}) {
        INFO("trans_a " << ta << " trans_b " << tb << " accumulate " << acc);
        const auto ha = randn(M * K, 30), hb = randn(K * N, 31), hc = randn(M * N, 32, 10.0);
        OwnedTensor ag = ta ? on_bf16(ha, {K, M}) : on_bf16(ha, {M, K});
        OwnedTensor ac = ta ? cpu_rounded(ha, {K, M}) : cpu_rounded(ha, {M, K});
        OwnedTensor bg = tb ? on_bf16(hb, {N, K}) : on_bf16(hb, {K, N});
        OwnedTensor bc = tb ? cpu_rounded(hb, {N, K}) : cpu_rounded(hb, {K, N});
        // f32 output: the products of bf16 values are exact in fp32, so only summation order differs.
        OwnedTensor cg = on(gpu(), hc, {M, N}), cc = on(cpu(), hc, {M, N});
        gpu().matmul(*ag, ta, *bg, tb, *cg, acc);
        cpu().matmul(*ac, ta, *bc, tb, *cc, acc);
        require_close(get(gpu(), *cg), get(cpu(), *cc), "f32 c", kTol);
        // bf16 output (accumulate reads the bf16 c).
        OwnedTensor cg16 = on_bf16(hc, {M, N}), cc16 = cpu_rounded(hc, {M, N});
        gpu().matmul(*ag, ta, *bg, tb, *cg16, acc);
        cpu().matmul(*ac, ta, *bc, tb, *cc16, acc);
        require_close(get_bf16(*cg16), get(cpu(), *cc16), "bf16 c", kBf16);
      }
    }
  }
  OwnedTensor a16 = on_bf16(randn(4, 33), {2, 2}), b32 = on(gpu(), randn(4, 34), {2, 2});
  OwnedTensor c32(gpu(), DType::f32, {2, 2});
  REQUIRE_THROWS_WITH(gpu().matmul(*a16, false, *b32, false, *c32, false), Catch::Contains("matmul"));
}

TEST_CASE("cuda bf16: rmsnorm forward into bf16", "[cuda][bf16]") {
  const int64_t rows = 75, dim = 1000;
  const auto x = randn(rows * dim, 40, 2.0), w = randn(dim, 41);
  OwnedTensor xg = on(gpu(), x, {rows, dim}), wg = on(gpu(), w, {dim}), xc = on(cpu(), x, {rows, dim}),
              wc = on(cpu(), w, {dim});
  OwnedTensor yg(gpu(), DType::bf16, {rows, dim}), rg(gpu(), DType::f32, {rows});
  OwnedTensor yc(cpu(), DType::f32, {rows, dim}), rc(cpu(), DType::f32, {rows});
  gpu().rmsnorm_fwd(*xg, *wg, 1e-6, *yg, *rg);
  cpu().rmsnorm_fwd(*xc, *wc, 1e-6, *yc, *rc);
  require_close(get_bf16(*yg), get(cpu(), *yc), "y", kBf16);
  require_close(get(gpu(), *rg), get(cpu(), *rc), "rstd", kTol);
}

TEST_CASE("cuda bf16: add_rmsnorm forward: f32 residual stream, bf16 normalised output", "[cuda][bf16]") {
  const int64_t rows = 75, dim = 1000;
  const auto x = randn(rows * dim, 42, 2.0), branch = randn(rows * dim, 43), w = randn(dim, 44);
  OwnedTensor xg = on(gpu(), x, {rows, dim}), bg = on(gpu(), branch, {rows, dim}), wg = on(gpu(), w, {dim});
  OwnedTensor xc = on(cpu(), x, {rows, dim}), bc = on(cpu(), branch, {rows, dim}), wc = on(cpu(), w, {dim});
  OwnedTensor hg(gpu(), DType::f32, {rows, dim}), yg(gpu(), DType::bf16, {rows, dim}), rg(gpu(), DType::f32, {rows});
  OwnedTensor hc(cpu(), DType::f32, {rows, dim}), yc(cpu(), DType::f32, {rows, dim}), rc(cpu(), DType::f32, {rows});
  gpu().add_rmsnorm_fwd(*xg, *bg, *wg, 1e-6, *hg, *yg, *rg);
  cpu().add_rmsnorm_fwd(*xc, *bc, *wc, 1e-6, *hc, *yc, *rc);
  require_close(get(gpu(), *hg), get(cpu(), *hc), "h", kTol);
  require_close(get_bf16(*yg), get(cpu(), *yc), "y", kBf16);
  require_close(get(gpu(), *rg), get(cpu(), *rc), "rstd", kTol);
}

TEST_CASE("cuda bf16: rope, swiglu forward and backward", "[cuda][bf16]") {
  const int64_t B = 2, T = 67, H = 3, Dh = 64, n = B * T * H * Dh;
  const auto x = randn(n, 60);
  OwnedTensor xg = on_bf16(x, {B, T, H, Dh}), xc = cpu_rounded(x, {B, T, H, Dh});
  gpu().rope_fwd(*xg, 10000.0);
  cpu().rope_fwd(*xc, 10000.0);
  require_close(get_bf16(*xg), get(cpu(), *xc), "rope_fwd", kBf16);
  gpu().rope_bwd(*xg, 10000.0);
  cpu().rope_bwd(*xc, 10000.0);
  require_close(get_bf16(*xg), get(cpu(), *xc), "rope_bwd", kBf16);

  const int64_t m = 50021;
  const auto a = randn(m, 61, 2.0), u = randn(m, 62), dh = randn(m, 63);
  OwnedTensor ag = on_bf16(a, {m}), ug = on_bf16(u, {m}), dhg = on_bf16(dh, {m});
  OwnedTensor ac = cpu_rounded(a, {m}), uc = cpu_rounded(u, {m}), dhc = cpu_rounded(dh, {m});
  OwnedTensor hg(gpu(), DType::bf16, {m}), hc(cpu(), DType::f32, {m});
  gpu().swiglu_fwd(*ag, *ug, *hg);
  cpu().swiglu_fwd(*ac, *uc, *hc);
  require_close(get_bf16(*hg), get(cpu(), *hc), "swiglu h", kBf16);
  OwnedTensor dag(gpu(), DType::bf16, {m}), dug(gpu(), DType::bf16, {m});
  OwnedTensor dac(cpu(), DType::f32, {m}), duc(cpu(), DType::f32, {m});
  gpu().swiglu_bwd(*ag, *ug, *dhg, *dag, *dug);
  cpu().swiglu_bwd(*ac, *uc, *dhc, *dac, *duc);
  require_close(get_bf16(*dag), get(cpu(), *dac), "swiglu dgate", kBf16);
  require_close(get_bf16(*dug), get(cpu(), *duc), "swiglu dup", kBf16);
}

TEST_CASE("cuda bf16: causal attention forward and backward, deterministic", "[cuda][bf16]") {
  struct Shape {
    int64_t B, T, H, Dh;
  };
  // Head sizes 64 and 128 take the tensor-core kernel, 32 the fp32 kernel on widened copies.
  for (Shape s : {Shape{1, 1, 1, 64}, Shape{2, 67, 2, 64}, Shape{1, 200, 2, 128}, Shape{1, 1024, 1, 128},
                  Shape{2, 67, 2, 32}}) {
    INFO("B " << s.B << " T " << s.T << " H " << s.H << " Dh " << s.Dh);
    const int64_t n = s.B * s.T * s.H * s.Dh;
    const double scale = 1.0 / std::sqrt(static_cast<double>(s.Dh));
    const std::initializer_list<int64_t> dims{s.B, s.T, s.H, s.Dh};
    const auto q = randn(n, 70), k = randn(n, 71), v = randn(n, 72), dout = randn(n, 75);
    OwnedTensor qg = on_bf16(q, dims), kg = on_bf16(k, dims), vg = on_bf16(v, dims), dog = on_bf16(dout, dims);
    OwnedTensor qc = cpu_rounded(q, dims), kc = cpu_rounded(k, dims), vc = cpu_rounded(v, dims),
                doc = cpu_rounded(dout, dims);
    OwnedTensor og(gpu(), DType::bf16, dims), lg(gpu(), DType::f32, {s.B, s.H, s.T});
    OwnedTensor oc(cpu(), DType::f32, dims), lc(cpu(), DType::f32, {s.B, s.H, s.T});
    gpu().attention_fwd(*qg, *kg, *vg, scale, *og, *lg);
    cpu().attention_fwd(*qc, *kc, *vc, scale, *oc, *lc);
    require_close(get_bf16(*og), get(cpu(), *oc), "o", kBf16);
    require_close(get(gpu(), *lg), get(cpu(), *lc), "lse", 1e-4, 1.0);

    // The backward reads the GPU's own bf16 o; the reference gets the same values.
    OwnedTensor oc_same = on(cpu(), get_bf16(*og), dims);
    OwnedTensor dqg(gpu(), DType::bf16, dims), dkg(gpu(), DType::bf16, dims), dvg(gpu(), DType::bf16, dims);
    OwnedTensor dqc(cpu(), DType::f32, dims), dkc(cpu(), DType::f32, dims), dvc(cpu(), DType::f32, dims);
    gpu().attention_bwd(*qg, *kg, *vg, *og, *lg, *dog, scale, *dqg, *dkg, *dvg);
    cpu().attention_bwd(*qc, *kc, *vc, *oc_same, *lc, *doc, scale, *dqc, *dkc, *dvc);
    // At T = 1, dq and dk vanish: compare against the O(1) size of their terms.
    require_close(get_bf16(*dqg), get(cpu(), *dqc), "dq", kBf16, 1.0);
    require_close(get_bf16(*dkg), get(cpu(), *dkc), "dk", kBf16, 1.0);
    require_close(get_bf16(*dvg), get(cpu(), *dvc), "dv", kBf16, 1.0);

    OwnedTensor dq2(gpu(), DType::bf16, dims), dk2(gpu(), DType::bf16, dims), dv2(gpu(), DType::bf16, dims);
    gpu().attention_bwd(*qg, *kg, *vg, *og, *lg, *dog, scale, *dq2, *dk2, *dv2);
    require_bit_identical(get_bf16(*dqg), get_bf16(*dq2), "attention_bwd dq");
    require_bit_identical(get_bf16(*dkg), get_bf16(*dk2), "attention_bwd dk");
    require_bit_identical(get_bf16(*dvg), get_bf16(*dv2), "attention_bwd dv");
  }
}

TEST_CASE("cuda bf16: cross_entropy on bf16 logits, f32 losses", "[cuda][bf16]") {
  const int64_t rows = 37, vocab = 50257;
  auto targets = rand_ids(rows, vocab, 90);
  targets[5] = -1;
  const auto z = randn(rows * vocab, 91, 3.0);
  OwnedTensor zg = on_bf16(z, {rows, vocab}), zc = cpu_rounded(z, {rows, vocab});
  OwnedTensor tg = on(gpu(), targets, {rows}), tc = on(cpu(), targets, {rows});
  OwnedTensor lg(gpu(), DType::f32, {rows}), lc(cpu(), DType::f32, {rows});
  gpu().cross_entropy(*zg, *tg, 0.25, *lg, llmt::Tensor());
  cpu().cross_entropy(*zc, *tc, 0.25, *lc, llmt::Tensor());
  require_close(get(gpu(), *lg), get(cpu(), *lc), "losses", kTol);
  require_close(get_bf16(*zg), get(cpu(), *zc), "gradient", kBf16);
  CHECK(std::abs(gpu().sum(*lg) - cpu().sum(*lc)) <= kTol * std::abs(cpu().sum(*lc)));
}

TEST_CASE("cuda bf16: adamw_step writes the bf16 working copy of the updated params", "[cuda][bf16]") {
  const int64_t n = 10007;
  const auto p0 = randn(n, 100), m0 = randn(n, 101, 0.01), g = randn(n, 102);
  auto v0 = randn(n, 103, 1e-3);
  for (float& e : v0) e = e * e;
  Pair p = both(p0, {n}), m = both(m0, {n}), v = both(v0, {n}), grads = both(g, {n});
  OwnedTensor working(gpu(), DType::bf16, {n});
  llmt::AdamWParams hp;
  hp.lr = 1e-3;
  hp.weight_decay = 0.1;
  gpu().adamw_step(*p.g, *grads.g, *m.g, *v.g, hp, 0.5, 1, *working);
  cpu().adamw_step(*p.c, *grads.c, *m.c, *v.c, hp, 0.5, 1, Tensor());
  require_close(p, "params", 1e-6);
  const std::vector<float> master = get(gpu(), *p.g), expect = round_bf16(master), w = get_bf16(*working);
  INFO("the working copy must be bf16(master) bit for bit");
  REQUIRE(std::memcmp(w.data(), expect.data(), w.size() * sizeof(float)) == 0);
  OwnedTensor wrong(gpu(), DType::f32, {n});
  REQUIRE_THROWS_WITH(gpu().adamw_step(*p.g, *grads.g, *m.g, *v.g, hp, 0.5, 2, *wrong), Catch::Contains("bf16"));
}
