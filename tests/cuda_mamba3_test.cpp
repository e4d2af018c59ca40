// The CUDA backend's Mamba-3 layer op (mamba3_fwd / mamba3_bwd; layers-ssm-attn.md §4.3–4.5) against the CPU
// reference backend: SISO and MIMO, with and without the output norm, softplus and heavy-tail A (and the A_floor
// clamp), mild and strong decay, T around and across the core's chunks (64 / R tokens), ragged T, and T = 4096.
// Each call runs through make_backend("cuda") and make_cpu_backend() on the same fresh Philox inputs (overwritten
// outputs start from random garbage, accumulated parameter gradients from random values), and every output must
// agree to max|gpu - cpu| / max|cpu| <= kTol (1e-5) over the whole tensor with every value finite on both sides
// (a NaN never passes). Both passes run twice on the GPU and must give bit-identical results. The op is f32 on
// the GPU (as Mamba2's: the model keeps these activations in the master dtype); a bf16 input is refused. With
// Mamba3Options::bf16_products (bf16 models: the core's products on the tensor cores with bf16 operands) the
// bound is kBf16Tol (2e-2) against the same fp32 CPU reference (d dt_bias, a sum over tokens that cancels, against
// the root-sum-square of its terms; check_mamba3). Every case also runs the forward with a saved set
// (model.mamba3.save_states: Backend::mamba3_saved_numel) and the backward reading it instead of recomputing the
// core's forward, BCNorm, φ and q, k: out and every gradient bit-identical to the recompute. main()
// (catch_main_gpu.cpp) skips without a GPU.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda_mamba3_util.h"
#include "cuda_test_util.h"
#include "kernels/backend.h"

using namespace llmt::test;

namespace {

using llmt::Backend;
using llmt::OwnedTensor;
using llmt::Mamba3Options;

constexpr double kBf16Tol = 2e-2;

Case mild(Case c) {  // Mamba's init: Δ around 0.01 to 0.05
  c.bias_lo = -5.0;
  c.bias_hi = -3.0;
  return c;
}

// Forward out and backward dx, dz, dbc, draw and every parameter gradient against the CPU reference, then both
// passes once more on the GPU, bit-identical; then both with a saved set, bit-identical to the recompute.
void check_mamba3(const Case& c) {
  const std::string tag = c.tag();
  INFO(tag);
  const double tol = c.bf16 ? kBf16Tol : kTol;
  const Mamba3Options opt = c.options();
  const int64_t HP = c.H * c.P, BC = 2 * c.R * c.G * c.N, W = 3 * c.H + c.S, BT = c.B * c.T;
  const uint64_t s = c.seed * 100;
  Pair x = both(randn(BT * HP, s + 1), {c.B, c.T, HP}), z = both(randn(BT * HP, s + 2), {c.B, c.T, HP});
  Pair bc = both(randn(BT * BC, s + 3), {c.B, c.T, BC}), raw = both(randn(BT * W, s + 4), {c.B, c.T, W});
  const Params prm = make_params(c, s + 10, false);
  const Backend::Mamba3Params pg = prm.on(true), pc = prm.on(false);

  Pair out = both(randn(BT * HP, s + 5), {c.B, c.T, HP});
  gpu().mamba3_fwd(*x.g, *z.g, *bc.g, *raw.g, pg, opt, *out.g, llmt::Tensor());
  cpu().mamba3_fwd(*x.c, *z.c, *bc.c, *raw.c, pc, opt, *out.c, llmt::Tensor());
  require_close(out, "out " + tag, tol);
  const auto out_first = get(gpu(), *out.g);
  gpu().mamba3_fwd(*x.g, *z.g, *bc.g, *raw.g, pg, opt, *out.g, llmt::Tensor());
  require_bit_identical(out_first, get(gpu(), *out.g), "out " + tag);

  Pair dout = both(randn(BT * HP, s + 6), {c.B, c.T, HP});
  Pair dx = both(randn(BT * HP, s + 7), {c.B, c.T, HP}), dz = both(randn(BT * HP, s + 8), {c.B, c.T, HP});
  Pair dbc = both(randn(BT * BC, s + 9), {c.B, c.T, BC}), draw = both(randn(BT * W, s + 30), {c.B, c.T, W});
  Params grads = make_params(c, s + 40, true);
  std::vector<std::vector<float>> start;
  for (const Pair& p : grads.pairs) start.push_back(get(cpu(), *p.c));
  auto run = [&](Backend& be, bool on_gpu, const llmt::Tensor& saved = llmt::Tensor()) {
    auto t = [&](Pair& p) -> const llmt::Tensor& { return on_gpu ? *p.g : *p.c; };
    be.mamba3_bwd(t(dout), t(x), t(z), t(bc), t(raw), saved, on_gpu ? pg : pc, opt, t(dx), t(dz), t(dbc), t(draw),
                  grads.on(on_gpu));
  };
  run(gpu(), true);
  run(cpu(), false);
  std::vector<std::pair<const Pair*, std::string>> all = {{&dx, "dx"}, {&dz, "dz"}, {&dbc, "dbc"}, {&draw, "draw"}};
  for (size_t i = 0; i < grads.pairs.size(); ++i) all.push_back({&grads.pairs[i], "d" + grads.names[i]});
  // bf16: d dt_bias[h] adds the B T per-token terms draw[b, t, h] (dt = softplus(dd_dt + dt_bias)), which cancel
  // (at T = 4096 a sum of 342 from terms whose root-sum-square is larger); independent per-term errors of relative
  // size e give a sum error of about e times that root-sum-square, so it is the scale the sum is held against
  // (as Mamba2's head_sum_scales). Every other output keeps its own max |ref| as the scale.
  double dt_bias_scale = 1e-30;
  if (c.bf16) {
    const auto d = get(cpu(), *draw.c);
    for (int64_t h = 0; h < c.H; ++h) {
      double ss = 0.0;
      for (int64_t bt = 0; bt < BT; ++bt) ss += static_cast<double>(d[static_cast<size_t>(bt * W + h)]) * d[static_cast<size_t>(bt * W + h)];
      dt_bias_scale = std::max(dt_bias_scale, std::sqrt(ss));
    }
  }
  for (const auto& [p, name] : all) require_close(*p, name + " " + tag, tol, name == "ddt_bias" ? dt_bias_scale : 1e-30);

  std::vector<std::vector<float>> first;
  for (const auto& [p, name] : all) first.push_back(get(gpu(), *p->g));
  for (size_t i = 0; i < grads.pairs.size(); ++i) gpu().upload(start[i].data(), *grads.pairs[i].g);
  run(gpu(), true);
  for (size_t i = 0; i < all.size(); ++i) require_bit_identical(first[i], get(gpu(), *all[i].first->g), all[i].second);

  // model.mamba3.save_states: the forward writes G, the chunk-entering states, y, BCNorm's outputs, φ and q, k into
  // `saved` (from garbage), the backward reads them instead of recomputing the core's forward, BCNorm, the phases
  // and q, k.
  const int64_t n_saved = gpu().mamba3_saved_numel(c.B, c.T, c.H, c.N, c.S, opt);
  REQUIRE(n_saved > 0);
  const OwnedTensor saved(gpu(), llmt::DType::f32, {n_saved});
  gpu().upload(randn(static_cast<size_t>(n_saved), s + 50).data(), *saved);
  gpu().mamba3_fwd(*x.g, *z.g, *bc.g, *raw.g, pg, opt, *out.g, *saved);
  require_bit_identical(out_first, get(gpu(), *out.g), "out (save_states) " + tag);
  for (size_t i = 0; i < grads.pairs.size(); ++i) gpu().upload(start[i].data(), *grads.pairs[i].g);
  run(gpu(), true, *saved);
  for (size_t i = 0; i < all.size(); ++i)
    require_bit_identical(first[i], get(gpu(), *all[i].first->g), all[i].second + " (save_states vs recompute)");
}

}  // namespace

TEST_CASE("cuda mamba3: SISO, small shapes around the 64-token chunk, with and without the output norm",
          "[cuda][mamba3]") {
  // Not T = 1 with the norm: a single SISO token's core output is a scalar multiple of v, which RMSNorm_P
  // removes, so the gradients reaching bc and raw vanish (up to eps) and both sides hold rounding noise.
  uint64_t seed = 1;
  for (const int64_t T : {1, 5, 63, 64, 65, 150})
    for (const bool norm : {false, true}) {
      if (T == 1 && norm) continue;
      check_mamba3({2, T, 4, 16, 8, 2, 1, 2, norm, false, 1e-4, -1.5, -0.5, seed++});
      check_mamba3(mild({1, T, 3, 5, 6, 1, 1, 3, norm, false, 1e-4, 0, 0, seed++}));
    }
}

TEST_CASE("cuda mamba3: MIMO (R = 2, 4), small shapes around the 64 / R-token chunk, with and without the norm",
          "[cuda][mamba3]") {
  uint64_t seed = 100;
  for (const int64_t R : {2, 4})
    for (const int64_t T : {1, 15, 16, 17, 33, 70})
      for (const bool norm : {false, true}) {
        check_mamba3({2, T, 4, 16, 8, 2, R, 2, norm, false, 1e-4, -1.5, -0.5, seed++});
        check_mamba3(mild({1, T, 2, 24, 12, 1, R, 3, norm, false, 1e-4, 0, 0, seed++}));
      }
}

TEST_CASE("cuda mamba3: P and N across the core's 64-wide tiles (P = 80, N = 70)", "[cuda][mamba3]") {
  check_mamba3({2, 70, 2, 80, 70, 1, 1, 17, false, false, 1e-4, -1.5, -0.5, 60});
  check_mamba3({1, 40, 2, 80, 70, 1, 2, 10, true, false, 1e-4, -1.5, -0.5, 61});
}

TEST_CASE("cuda mamba3: SISO with an odd d_state (N = 9: a lone unrotated channel) and R G N = 8192 (the q, k "
          "kernel's one-row blocks, 64 KB of shared memory)",
          "[cuda][mamba3]") {
  check_mamba3({2, 70, 3, 16, 9, 1, 1, 4, false, false, 1e-4, -1.5, -0.5, 62});
  check_mamba3({1, 37, 8, 16, 256, 8, 4, 5, true, false, 1e-4, -1.5, -0.5, 63});
}

TEST_CASE("cuda mamba3: heavy-tail A with the A_floor clamp active, no rotation (S = 0)", "[cuda][mamba3]") {
  // A_floor = 0.5 clamps the tokens with f(dd_A) < 0.5 (dd_A < -1 under the heavy tail).
  check_mamba3({2, 70, 4, 16, 8, 1, 1, 4, true, true, 0.5, -1.5, -0.5, 7});
  check_mamba3({2, 40, 4, 16, 8, 1, 4, 2, false, true, 0.5, -1.5, -0.5, 8});
  check_mamba3({1, 70, 2, 16, 8, 1, 1, 0, false, false, 1e-4, -1.5, -0.5, 9});
}

TEST_CASE("cuda mamba3: the 1.5B head shape (64 heads x 64, d_state 128, 32 angles), SISO and MIMO",
          "[cuda][mamba3]") {
  check_mamba3(mild({1, 130, 64, 64, 128, 1, 1, 32, false, false, 1e-4, 0, 0, 20}));
  check_mamba3(mild({1, 100, 64, 64, 128, 1, 4, 32, true, false, 1e-4, 0, 0, 21}));
}

TEST_CASE("cuda mamba3: long sequence T = 4096 and a ragged T = 1001, SISO and MIMO", "[cuda][mamba3]") {
  for (const bool norm : {false, true}) {
    const uint64_t seed = norm ? 40 : 30;
    check_mamba3(mild({1, 4096, 2, 64, 128, 1, 1, 32, norm, false, 1e-4, 0, 0, seed}));
    check_mamba3(mild({1, 4096, 2, 64, 128, 1, 4, 32, norm, false, 1e-4, 0, 0, seed + 1}));
    check_mamba3({2, 1001, 2, 64, 128, 1, 1, 32, norm, false, 1e-4, -1.5, -0.5, seed + 2});
    check_mamba3({2, 1001, 2, 64, 128, 1, 4, 32, norm, false, 1e-4, -1.5, -0.5, seed + 3});
  }
}

Case bf16(Case c) {
  c.bf16 = true;
  return c;
}

TEST_CASE("cuda mamba3: bf16 products (tensor cores), SISO and MIMO (R = 2, 4), T = 4096 and ragged T",
          "[cuda][mamba3]") {
  // Fresh inputs (seeds unused above); the 1.5B head shape, the long sequence, a T that is no multiple of the
  // chunk, with and without the norm; P and N across the 64-wide tiles. The state scan stages the chunks' rows by
  // cp.async at N = 128 and loads them synchronously at N = 70 (rows not 16-byte aligned).
  for (const int64_t R : {1, 2, 4}) {
    const uint64_t seed = 200 + 10 * static_cast<uint64_t>(R);
    check_mamba3(bf16(mild({1, 4096, 2, 64, 128, 1, R, 32, R == 2, false, 1e-4, 0, 0, seed})));
    check_mamba3(bf16({2, 1001, 2, 64, 128, 1, R, 32, R != 2, false, 1e-4, -1.5, -0.5, seed + 1}));
    check_mamba3(bf16({1, 150, 3, 80, 70, 1, R, 17, false, true, 0.5, -1.5, -0.5, seed + 2}));
  }
  // Three 64-wide tiles of N, then of P: the backward's <dS, S_in> walks rows of 192 columns with 256 threads and
  // loads 48 elements per thread, past the 32 it loads ahead (SISO; MIMO loads 16 ahead: N = 128 above goes past
  // them); the tile loads take two tiles per batch: odd tile counts, and pairs that cross a row of tiles (P = 160).
  check_mamba3(bf16({1, 100, 2, 64, 160, 1, 1, 16, false, false, 1e-4, -1.5, -0.5, 250}));
  check_mamba3(bf16({1, 70, 2, 160, 32, 1, 2, 16, true, false, 1e-4, -1.5, -0.5, 251}));
}

TEST_CASE("cuda mamba3: bf16 activations are refused with an error naming the op", "[cuda][mamba3]") {
  const int64_t B = 1, T = 4, H = 2, P = 8, N = 4, W = 3 * H + 1;
  OwnedTensor x(gpu(), llmt::DType::bf16, {B, T, H * P}), z(gpu(), llmt::DType::bf16, {B, T, H * P});
  OwnedTensor bc(gpu(), llmt::DType::bf16, {B, T, 2 * N}), raw(gpu(), llmt::DType::bf16, {B, T, W});
  OwnedTensor out(gpu(), llmt::DType::bf16, {B, T, H * P});
  std::vector<OwnedTensor> p;
  for (const int64_t n : {H, H * N, H * N, N, N, H}) p.push_back(OwnedTensor(gpu(), llmt::DType::bf16, {n}));
  const Backend::Mamba3Params prm{*p[0], *p[1], *p[2], *p[3], *p[4], *p[5], {}, {}, {}, {}};
  Mamba3Options opt;
  opt.head_dim = P;
  REQUIRE_THROWS_WITH(gpu().mamba3_fwd(*x, *z, *bc, *raw, prm, opt, *out, llmt::Tensor()),
                      Catch::Contains("mamba3_fwd") && Catch::Contains("f32"));
}
