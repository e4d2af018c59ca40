// The CUDA backend's Mamba-3 layer op (mamba3_fwd / mamba3_bwd; layers-ssm-attn.md §4.3–4.5) against the CPU
// reference backend: SISO and MIMO, with and without the output norm, softplus and heavy-tail A (and the A_floor
// clamp), mild and strong decay, T around and across the core's chunks (64 / R tokens), ragged T, and T = 4096.
// Each call runs through make_backend("cuda") and make_cpu_backend() on the same fresh Philox inputs (overwritten
// outputs start from random garbage, accumulated parameter gradients from random values), and every output must
// agree to max|gpu - cpu| / max|cpu| <= kTol (1e-5) over the whole tensor with every value finite on both sides
// (a NaN never passes). Both passes run twice on the GPU and must give bit-identical results. With
// Mamba3Options::bf16_products (bf16 models: the core's products on the tensor cores with bf16 operands) the
// bound is kBf16Tol (2e-2) against the same fp32 CPU reference (d dt_bias, a sum over tokens that cancels, against
// the root-sum-square of its terms; check_mamba3). With bf16 products the activations x, z, dout, out, dx, dz may
// also be bf16 on the GPU (Backend::mamba3_bf16_activations: what bf16 models run), against the CPU reference on the
// same bf16-rounded x, z, dout at kBf16Tol; bf16 activations without bf16 products, and bf16 bc, raw or parameters,
// are refused with an error naming the op. Every case also runs the forward with a saved set
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

// An activation (x, z, out, dout, dx, dz [B, T, H P]) of case c from host values: both(host, dims), or with
// c.bf16_acts a bf16 GPU tensor and on the CPU the same bf16-rounded values.
Pair act(const Case& c, const std::vector<float>& host, std::initializer_list<int64_t> dims) {
  if (!c.bf16_acts) return both(host, dims);
  return Pair{on_bf16(host, dims), on(cpu(), round_bf16(host), dims)};
}

// A GPU tensor's values as floats (f32, or bf16 widened).
std::vector<float> values(const llmt::Tensor& t) {
  return t.dtype == llmt::DType::bf16 ? get_bf16(t) : get(gpu(), t);
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
  const auto close = [&](const Pair& p, const std::string& what, double floor = 1e-30) {
    require_close(values(*p.g), get(cpu(), *p.c), what, tol, floor);
  };
  Pair x = act(c, randn(BT * HP, s + 1), {c.B, c.T, HP}), z = act(c, randn(BT * HP, s + 2), {c.B, c.T, HP});
  Pair bc = both(randn(BT * BC, s + 3), {c.B, c.T, BC}), raw = both(randn(BT * W, s + 4), {c.B, c.T, W});
  const Params prm = make_params(c, s + 10, false);
  const Backend::Mamba3Params pg = prm.on(true), pc = prm.on(false);

  Pair out = act(c, randn(BT * HP, s + 5), {c.B, c.T, HP});
  gpu().mamba3_fwd(*x.g, *z.g, *bc.g, *raw.g, pg, opt, *out.g, llmt::Tensor());
  cpu().mamba3_fwd(*x.c, *z.c, *bc.c, *raw.c, pc, opt, *out.c, llmt::Tensor());
  close(out, "out " + tag);
  const auto out_first = values(*out.g);
  gpu().mamba3_fwd(*x.g, *z.g, *bc.g, *raw.g, pg, opt, *out.g, llmt::Tensor());
  require_bit_identical(out_first, values(*out.g), "out " + tag);

  Pair dout = act(c, randn(BT * HP, s + 6), {c.B, c.T, HP});
  Pair dx = act(c, randn(BT * HP, s + 7), {c.B, c.T, HP}), dz = act(c, randn(BT * HP, s + 8), {c.B, c.T, HP});
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
  for (const auto& [p, name] : all) close(*p, name + " " + tag, name == "ddt_bias" ? dt_bias_scale : 1e-30);

  std::vector<std::vector<float>> first;
  for (const auto& [p, name] : all) first.push_back(values(*p->g));
  for (size_t i = 0; i < grads.pairs.size(); ++i) gpu().upload(start[i].data(), *grads.pairs[i].g);
  run(gpu(), true);
  for (size_t i = 0; i < all.size(); ++i) require_bit_identical(first[i], values(*all[i].first->g), all[i].second);

  // model.mamba3.save_states: the forward writes G, the chunk-entering states, y, BCNorm's outputs, φ and q, k into
  // `saved` (from garbage), the backward reads them instead of recomputing the core's forward, BCNorm, the phases
  // and q, k.
  const int64_t n_saved = gpu().mamba3_saved_numel(c.B, c.T, c.H, c.N, c.S, opt);
  REQUIRE(n_saved > 0);
  const OwnedTensor saved(gpu(), llmt::DType::f32, {n_saved});
  gpu().upload(randn(static_cast<size_t>(n_saved), s + 50).data(), *saved);
  gpu().mamba3_fwd(*x.g, *z.g, *bc.g, *raw.g, pg, opt, *out.g, *saved);
  require_bit_identical(out_first, values(*out.g), "out (save_states) " + tag);
  for (size_t i = 0; i < grads.pairs.size(); ++i) gpu().upload(start[i].data(), *grads.pairs[i].g);
  run(gpu(), true, *saved);
  for (size_t i = 0; i < all.size(); ++i)
    require_bit_identical(first[i], values(*all[i].first->g), all[i].second + " (save_states vs recompute)");
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

// R = 1, 2, 4 at the 1.5B head shape with T = 4096, a ragged T = 1001 and P = 80, N = 70, each case made by `mode`
// (bf16 products, or bf16 activations too), seeds from seed0 + 10 R.
void check_bf16_shapes(Case (*mode)(Case), uint64_t seed0) {
  for (const int64_t R : {1, 2, 4}) {
    const uint64_t seed = seed0 + 10 * static_cast<uint64_t>(R);
    check_mamba3(mode(mild({1, 4096, 2, 64, 128, 1, R, 32, R == 2, false, 1e-4, 0, 0, seed})));
    check_mamba3(mode({2, 1001, 2, 64, 128, 1, R, 32, R != 2, false, 1e-4, -1.5, -0.5, seed + 1}));
    check_mamba3(mode({1, 150, 3, 80, 70, 1, R, 17, false, true, 0.5, -1.5, -0.5, seed + 2}));
  }
}

TEST_CASE("cuda mamba3: bf16 products (tensor cores), SISO and MIMO (R = 2, 4), T = 4096 and ragged T",
          "[cuda][mamba3]") {
  // Fresh inputs (seeds unused above); the 1.5B head shape, the long sequence, a T that is no multiple of the
  // chunk, with and without the norm; P and N across the 64-wide tiles. The state scan stages the chunks' rows by
  // cp.async at N = 128 and loads them synchronously at N = 70 (rows not 16-byte aligned).
  check_bf16_shapes(bf16, 200);
  // Three 64-wide tiles of N, then of P: the backward's <dS, S_in> walks rows of 192 columns with 256 threads and
  // loads 48 elements per thread, past the 32 it loads ahead (SISO; MIMO loads 16 ahead: N = 128 above goes past
  // them); the tile loads take two tiles per batch: odd tile counts, and pairs that cross a row of tiles (P = 160).
  check_mamba3(bf16({1, 100, 2, 64, 160, 1, 1, 16, false, false, 1e-4, -1.5, -0.5, 250}));
  check_mamba3(bf16({1, 70, 2, 160, 32, 1, 2, 16, true, false, 1e-4, -1.5, -0.5, 251}));
}

Case bf16_acts(Case c) {
  c.bf16 = true;
  c.bf16_acts = true;
  return c;
}

TEST_CASE("cuda mamba3: bf16 activations (x, z, out, dout, dx, dz) with bf16 products, SISO and MIMO (R = 2, 4)",
          "[cuda][mamba3]") {
  // The layer's bf16 runs (Backend::mamba3_bf16_activations): the bench shape's heads at T = 4096 (the bf16 x rows
  // staged by cp.async into the state scan, copied into the core's operand tiles, dx stored as bf16 pairs), a
  // ragged T, and P = 80, N = 70 (rows not 16-byte aligned: loaded element by element; P tiles across 64).
  check_bf16_shapes(bf16_acts, 300);
  check_mamba3(bf16_acts({2, 5, 4, 10, 8, 2, 1, 2, true, false, 1e-4, -1.5, -0.5, 340}));  // P = 10: odd pairs
}

TEST_CASE("cuda mamba3: bf16 activations without bf16 products, and bf16 bc / raw / parameters, are refused with an "
          "error naming the op",
          "[cuda][mamba3]") {
  const int64_t B = 1, T = 4, H = 2, P = 8, N = 4, W = 3 * H + 1;
  const auto t = [&](llmt::DType d, std::initializer_list<int64_t> dims) { return OwnedTensor(gpu(), d, dims); };
  const llmt::DType bf = llmt::DType::bf16, f = llmt::DType::f32;
  OwnedTensor x = t(bf, {B, T, H * P}), z = t(bf, {B, T, H * P}), out = t(bf, {B, T, H * P});
  OwnedTensor bc = t(f, {B, T, 2 * N}), raw = t(f, {B, T, W}), bc_h = t(bf, {B, T, 2 * N}), raw_h = t(bf, {B, T, W});
  std::vector<OwnedTensor> p, ph;
  for (const int64_t n : {H, H * N, H * N, N, N, H}) {
    p.push_back(t(f, {n}));
    ph.push_back(t(bf, {n}));
  }
  const Backend::Mamba3Params prm{*p[0], *p[1], *p[2], *p[3], *p[4], *p[5], {}, {}, {}, {}};
  const Backend::Mamba3Params prm_h{*ph[0], *ph[1], *ph[2], *ph[3], *ph[4], *ph[5], {}, {}, {}, {}};
  Mamba3Options opt;
  opt.head_dim = P;
  REQUIRE(gpu().mamba3_bf16_activations(llmt::DType::bf16));
  REQUIRE_FALSE(gpu().mamba3_bf16_activations(llmt::DType::f32));
  REQUIRE_FALSE(cpu().mamba3_bf16_activations(llmt::DType::bf16));
  // bf16 activations need bf16 products in the chunked op
  REQUIRE_THROWS_WITH(gpu().mamba3_fwd(*x, *z, *bc, *raw, prm, opt, *out, llmt::Tensor()),
                      Catch::Contains("mamba3_fwd") && Catch::Contains("bf16_products"));
  OwnedTensor dx = t(bf, {B, T, H * P}), dz = t(bf, {B, T, H * P}), dbc = t(f, {B, T, 2 * N}), draw = t(f, {B, T, W});
  REQUIRE_THROWS_WITH(gpu().mamba3_bwd(*out, *x, *z, *bc, *raw, llmt::Tensor(), prm, opt, *dx, *dz, *dbc, *draw, prm),
                      Catch::Contains("mamba3_bwd") && Catch::Contains("bf16_products"));
  // bc, raw and the parameters stay f32
  opt.bf16_products = true;
  REQUIRE_THROWS_WITH(gpu().mamba3_fwd(*x, *z, *bc_h, *raw_h, prm_h, opt, *out, llmt::Tensor()),
                      Catch::Contains("mamba3_fwd") && Catch::Contains("f32"));
  // x, z, out in one dtype
  OwnedTensor out_f = t(f, {B, T, H * P});
  REQUIRE_THROWS_WITH(gpu().mamba3_fwd(*x, *z, *bc, *raw, prm, opt, *out_f, llmt::Tensor()),
                      Catch::Contains("mamba3_fwd") && Catch::Contains("dtype"));
}
