// The CUDA backend's incremental-decoding ops (Backend::*_decode, rope_fwd_at; kernels/backend.h) against the
// CPU backend, and whole-model decoding on the GPU. Label "gpu"; main() (catch_main_gpu.cpp) skips without a GPU.
//
// Ops: fresh Philox inputs and random carried states (conv windows, delta-rule states and MDN momenta, SSM
// states, the Mamba-3 carry, KV caches already holding earlier positions), T = 1 (a decode step) and T > 1 (a
// prefill continuing the state), through make_backend("cuda") and make_cpu_backend(). Every output and every
// updated state must agree to max|gpu - cpu| / max|cpu| <= kTol (1e-5) in fp32, 1e-2 for bf16 inputs (the CPU
// side computes on the same bf16-rounded values in fp32; the bf16 output rounding is 2^-9 = 2e-3), with every
// value finite (require_close).
//
// Model: for each mixer type (tiny configs incl. Mamba-3 SISO / MIMO and an MDN / attention hybrid), the GPU's
// prefill + decode logits against the CPU's, and the GPU's decode against its own full forward (Model::logits).
// fp32 on the GPU: the GPU sums in fp32 where the CPU kernels sum in double and the chunked forward keeps its
// states in double within a call, so the logits differ by fp32 rounding compounded through 2-4 blocks; the
// CPU-only decode_test observes < 4e-6 between its float32 decode and forward, and the tolerance here is fixed
// at 1e-4 relative to the row's largest logit (a wrong state, position or carried term is >= 1e-2 with init std
// 0.1, decode_test.cpp). bf16 (what llmtrain generate runs on a GPU): decode vs the GPU's own forward only, 5e-2
// (both round the matrix-product inputs to bf16, in differently shaped products).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/rng.h"
#include "cuda_mamba3_util.h"
#include "decode_cases.h"
#include "cuda_test_util.h"
#include "kernels/backend.h"
#include "model/config.h"
#include "model/model.h"

using namespace llmt;
using namespace llmt::test;

namespace {

constexpr double kBf16Tol = 1e-2;

TEST_CASE("cuda decode: rope_fwd_at", "[gpu][decode]") {
  const int64_t T = GENERATE(1, 5), pos = GENERATE(0, 37);
  INFO("T " << T << " position " << pos);
  const int64_t B = 2, H = 3, Dh = 16, n = B * T * H * Dh;
  Pair x = both(randn(n, 1), {B, T, H, Dh});
  gpu().rope_fwd_at(*x.g, 10000.0, pos);
  cpu().rope_fwd_at(*x.c, 10000.0, pos);
  require_close(x, "x");
  const std::vector<float> xb = round_bf16(randn(n, 2));
  OwnedTensor g = on_bf16(xb, {B, T, H, Dh}), c = on(cpu(), xb, {B, T, H, Dh});
  gpu().rope_fwd_at(*g, 10000.0, pos);
  cpu().rope_fwd_at(*c, 10000.0, pos);
  require_close(get_bf16(*g), get(cpu(), *c), "x (bf16)", kBf16Tol);
}

TEST_CASE("cuda decode: attention_decode through a KV cache", "[gpu][decode]") {
  // position 150 with T = 4: queries over 151..154 cached positions, more than one tile of the kernel's 128.
  const int64_t T = GENERATE(1, 4), pos = GENERATE(0, 9, 150);
  INFO("T " << T << " position " << pos);
  const int64_t B = 2, H = 2, Dh = 24, cap = pos + T + 3, n = B * T * H * Dh, nc = B * cap * H * Dh;
  const double scale = 1.0 / std::sqrt(static_cast<double>(Dh));
  SECTION("fp32") {
    Pair q = both(randn(n, 1), {B, T, H, Dh}), k = both(randn(n, 2), {B, T, H, Dh}), v = both(randn(n, 3), {B, T, H, Dh});
    Pair kc = both(randn(nc, 4), {B, cap, H, Dh}), vc = both(randn(nc, 5), {B, cap, H, Dh});
    Pair o = both(randn(n, 6), {B, T, H, Dh});
    gpu().attention_decode(*q.g, *k.g, *v.g, *kc.g, *vc.g, pos, scale, *o.g);
    cpu().attention_decode(*q.c, *k.c, *v.c, *kc.c, *vc.c, pos, scale, *o.c);
    require_close(o, "o");
    require_close(kc, "k_cache");
    require_close(vc, "v_cache");
  }
  SECTION("bf16") {
    const std::vector<float> hq = round_bf16(randn(n, 1)), hk = round_bf16(randn(n, 2)), hv = round_bf16(randn(n, 3));
    const std::vector<float> hkc = round_bf16(randn(nc, 4)), hvc = round_bf16(randn(nc, 5));
    OwnedTensor qg = on_bf16(hq, {B, T, H, Dh}), kg = on_bf16(hk, {B, T, H, Dh}), vg = on_bf16(hv, {B, T, H, Dh});
    OwnedTensor kcg = on_bf16(hkc, {B, cap, H, Dh}), vcg = on_bf16(hvc, {B, cap, H, Dh});
    OwnedTensor qc = on(cpu(), hq, {B, T, H, Dh}), kc = on(cpu(), hk, {B, T, H, Dh}), vc = on(cpu(), hv, {B, T, H, Dh});
    OwnedTensor kcc = on(cpu(), hkc, {B, cap, H, Dh}), vcc = on(cpu(), hvc, {B, cap, H, Dh});
    OwnedTensor og = on_bf16(randn(n, 6), {B, T, H, Dh}), oc(cpu(), DType::f32, {B, T, H, Dh});
    gpu().attention_decode(*qg, *kg, *vg, *kcg, *vcg, pos, scale, *og);
    cpu().attention_decode(*qc, *kc, *vc, *kcc, *vcc, pos, scale, *oc);
    require_close(get_bf16(*og), get(cpu(), *oc), "o (bf16)", kBf16Tol);
    require_close(get_bf16(*kcg), get(cpu(), *kcc), "k_cache (bf16)", kBf16Tol);
    require_close(get_bf16(*vcg), get(cpu(), *vcc), "v_cache (bf16)", kBf16Tol);
  }
}

TEST_CASE("cuda decode: short_conv_silu_decode continues its window", "[gpu][decode]") {
  const int64_t T = GENERATE(1, 6), W = GENERATE(1, 4);
  const bool bias = GENERATE(false, true);
  INFO("T " << T << " width " << W << (bias ? " with bias" : ""));
  const int64_t B = 2, C = 70;
  Pair x = both(randn(B * T * C, 1), {B, T, C}), w = both(randn(C * W, 2), {C, 1, W});
  Pair win = both(randn(B * (W - 1) * C, 3), {B, W - 1, C}), y = both(randn(B * T * C, 4), {B, T, C});
  Pair b = both(randn(C, 5), {C});
  const auto bias_of = [&](bool g) { return bias ? (g ? *b.g : *b.c) : Tensor(); };
  gpu().short_conv_silu_decode(*x.g, *w.g, bias_of(true), *win.g, *y.g);
  cpu().short_conv_silu_decode(*x.c, *w.c, bias_of(false), *win.c, *y.c);
  require_close(y, "y");
  if (W > 1) require_close(win, "window");
}

TEST_CASE("cuda decode: short_conv_silu_decode writes y in bf16: the f32 y rounded, the same window",
          "[gpu][decode]") {
  // y in bf16: the v that the GDN and Comba layers hand their decode with compute bf16 (delta_core_bf16_inputs).
  const int64_t B = 2, T = 6, C = 70, W = 4;
  const std::vector<float> hx = randn(B * T * C, 1), hw = randn(C * W, 2), hwin = randn(B * (W - 1) * C, 3);
  OwnedTensor x = on(gpu(), hx, {B, T, C}), w = on(gpu(), hw, {C, 1, W});
  OwnedTensor win = on(gpu(), hwin, {B, W - 1, C}), win_h = on(gpu(), hwin, {B, W - 1, C});
  OwnedTensor y = on(gpu(), randn(B * T * C, 4), {B, T, C}), yh = on_bf16(randn(B * T * C, 5), {B, T, C});
  gpu().short_conv_silu_decode(*x, *w, Tensor(), *win, *y);
  gpu().short_conv_silu_decode(*x, *w, Tensor(), *win_h, *yh);
  CHECK(get_bf16(*yh) == round_bf16(get(gpu(), *y)));
  CHECK(get(gpu(), *win_h) == get(gpu(), *win));
}

// Inputs of a delta-rule decode call: normalised q (scaled K^-1/2), k, p; decays in [-0.7, -0.01); beta in
// [0.05, 0.95); log μ in [-2, -0.05) (with one μ = 0 when T > 1); η in [0.2, 1.8); random S_0, M_0.
struct DeltaCall {
  int64_t B, T, H, K, V;
  Pair q, k, p, v, g, gk, beta, log_mu, eta, state, momentum, o;
  DeltaCall(int64_t B_, int64_t T_, int64_t H_, int64_t K_, int64_t V_)
      : B(B_), T(T_), H(H_), K(K_), V(V_),
        q(both(unit_rows(B * T * H * K, K, 1, 1.0 / std::sqrt(static_cast<double>(K))), {B, T, H, K})),
        k(both(unit_rows(B * T * H * K, K, 2, 1.0), {B, T, H, K})),
        p(both(unit_rows(B * T * H * K, K, 3, 1.0), {B, T, H, K})),
        v(both(randn(B * T * H * V, 4), {B, T, H, V})),
        g(both(uniform(B * T * H, 5, -0.7, -0.01), {B, T, H})),
        gk(both(uniform(B * T * H * K, 6, -0.7, -0.01), {B, T, H, K})),
        beta(both(uniform(B * T * H, 7, 0.05, 0.95), {B, T, H})),
        log_mu(both(mu_values(B * T * H, T), {B, T, H})),
        eta(both(uniform(B * T * H, 9, 0.2, 1.8), {B, T, H})),
        state(both(randn(B * H * K * V, 10, 0.5), {B, H, K, V})),
        momentum(both(randn(B * H * K * V, 11, 0.3), {B, H, K, V})),
        o(both(randn(B * T * H * V, 12), {B, T, H, V})) {}
  static std::vector<float> mu_values(int64_t n, int64_t T) {
    std::vector<float> x = uniform(n, 8, -2.0, -0.05);
    if (T > 1) x[1] = -INFINITY;
    return x;
  }
  void require_outputs(bool with_momentum) {
    require_close(o, "o");
    require_close(state, "state");
    if (with_momentum) require_close(momentum, "momentum");
  }
};

TEST_CASE("cuda decode: gdn, kda, comba, mdn decode continue their states", "[gpu][decode]") {
  const int64_t T = GENERATE(1, 7);
  // K = 20, V = 19: ragged against the kernel's 16 value columns and 16 row groups; K = 128, V = 64: a real head.
  const auto [K, V] = GENERATE(std::make_pair<int64_t, int64_t>(20, 19), std::make_pair<int64_t, int64_t>(128, 64));
  INFO("T " << T << " K " << K << " V " << V);
  DeltaCall a(2, T, 3, K, V);
  SECTION("gdn") {
    gpu().gdn_decode(*a.q.g, *a.k.g, *a.v.g, *a.g.g, *a.beta.g, 8, *a.state.g, *a.o.g);
    cpu().gdn_decode(*a.q.c, *a.k.c, *a.v.c, *a.g.c, *a.beta.c, 8, *a.state.c, *a.o.c);
    a.require_outputs(false);
  }
  SECTION("kda") {
    gpu().kda_decode(*a.q.g, *a.k.g, *a.v.g, *a.gk.g, *a.beta.g, 8, *a.state.g, *a.o.g);
    cpu().kda_decode(*a.q.c, *a.k.c, *a.v.c, *a.gk.c, *a.beta.c, 8, *a.state.c, *a.o.c);
    a.require_outputs(false);
  }
  SECTION("comba") {
    gpu().comba_decode(*a.q.g, *a.k.g, *a.v.g, *a.p.g, *a.g.g, *a.beta.g, 8, *a.state.g, *a.o.g);
    cpu().comba_decode(*a.q.c, *a.k.c, *a.v.c, *a.p.c, *a.g.c, *a.beta.c, 8, *a.state.c, *a.o.c);
    a.require_outputs(false);
  }
  SECTION("mdn") {
    gpu().mdn_decode(*a.q.g, *a.k.g, *a.v.g, *a.g.g, *a.beta.g, *a.log_mu.g, *a.eta.g, 8, *a.state.g,
                     *a.momentum.g, *a.o.g);
    cpu().mdn_decode(*a.q.c, *a.k.c, *a.v.c, *a.g.c, *a.beta.c, *a.log_mu.c, *a.eta.c, 8, *a.state.c,
                     *a.momentum.c, *a.o.c);
    a.require_outputs(true);
  }
}

TEST_CASE("cuda decode: gdn and comba decode take bf16 q, k, v, p: the f32 decode of the same values, bit for bit",
          "[gpu][decode]") {
  // What the GDN and Comba layers hand their decode with compute bf16 (delta_core_bf16_inputs); the kernel reads
  // them as fp32, so the results equal the f32 call's on the rounded values. Mixed input dtypes are refused.
  const int64_t T = GENERATE(1, 7), B = 2, H = 3, K = 128, V = 64;
  INFO("T " << T);
  DeltaCall a(B, T, H, K, V);
  const auto rounded = [](const Pair& t) { return round_bf16(get(gpu(), *t.g)); };
  const std::vector<float> q = rounded(a.q), k = rounded(a.k), v = rounded(a.v), p = rounded(a.p),
                           s0 = get(gpu(), *a.state.g);
  OwnedTensor qf = on(gpu(), q, {B, T, H, K}), kf = on(gpu(), k, {B, T, H, K}), vf = on(gpu(), v, {B, T, H, V}),
              pf = on(gpu(), p, {B, T, H, K});
  OwnedTensor qh = on_bf16(q, {B, T, H, K}), kh = on_bf16(k, {B, T, H, K}), vh = on_bf16(v, {B, T, H, V}),
              ph = on_bf16(p, {B, T, H, K});
  OwnedTensor sf = on(gpu(), s0, {B, H, K, V}), sh = on(gpu(), s0, {B, H, K, V});
  OwnedTensor of(gpu(), DType::f32, {B, T, H, V}), oh(gpu(), DType::f32, {B, T, H, V});
  const Tensor &g = *a.g.g, &beta = *a.beta.g;
  SECTION("gdn") {
    gpu().gdn_decode(*qf, *kf, *vf, g, beta, 8, *sf, *of);
    gpu().gdn_decode(*qh, *kh, *vh, g, beta, 8, *sh, *oh);
    REQUIRE_THROWS_WITH(gpu().gdn_decode(*qh, *kf, *vh, g, beta, 8, *sh, *oh),
                        Catch::Contains("q, k, v must be all f32 or all bf16, got bf16, f32, bf16"));
  }
  SECTION("comba") {
    gpu().comba_decode(*qf, *kf, *vf, *pf, g, beta, 8, *sf, *of);
    gpu().comba_decode(*qh, *kh, *vh, *ph, g, beta, 8, *sh, *oh);
    REQUIRE_THROWS_WITH(gpu().comba_decode(*qh, *kh, *vh, *pf, g, beta, 8, *sh, *oh),
                        Catch::Contains("q, k, v, p must be all f32 or all bf16, got bf16, bf16, bf16, f32"));
  }
  CHECK(get(gpu(), *oh) == get(gpu(), *of));
  CHECK(get(gpu(), *sh) == get(gpu(), *sf));
}

TEST_CASE("cuda decode: mamba2_ssd_decode continues its state", "[gpu][decode]") {
  const int64_t T = GENERATE(1, 7);
  INFO("T " << T);
  const int64_t B = 2, H = 4, P = 16, N = 24, G = 2, width = H * P + 2 * G * N;
  Pair xbc = both(randn(B * T * width, 1), {B, T, width}), dt_raw = both(randn(B * T * H, 2), {B, T, H});
  Pair dt_bias = both(uniform(H, 3, -3.0, -1.0), {H}), A_log = both(randn(H, 4, 0.5), {H}), D = both(randn(H, 5), {H});
  Pair state = both(randn(B * H * P * N, 6, 0.5), {B, H, P, N}), y = both(randn(B * T * H * P, 7), {B, T, H * P});
  gpu().mamba2_ssd_decode(*xbc.g, *dt_raw.g, *dt_bias.g, *A_log.g, *D.g, P, G, 8, *state.g, *y.g);
  cpu().mamba2_ssd_decode(*xbc.c, *dt_raw.c, *dt_bias.c, *A_log.c, *D.c, P, G, 8, *state.c, *y.c);
  require_close(y, "y");
  require_close(state, "state");
}

TEST_CASE("cuda decode: mamba2_ssd_decode takes bf16 xbc and writes bf16 y: the f32 decode of the same values, bit "
          "for bit (y rounded once)",
          "[gpu][decode]") {
  // What the Mamba2 layer hands its decode with compute bf16 (mamba2_bf16_inputs); the kernel reads xbc as fp32 and
  // writes y in xbc's dtype (the layer's y, as the SSD forward's), rounded from the fp32 result; the state fp32.
  const int64_t T = GENERATE(1, 7);
  INFO("T " << T);
  const int64_t B = 2, H = 4, P = 16, N = 24, G = 2, width = H * P + 2 * G * N;
  const std::vector<float> hx = round_bf16(randn(B * T * width, 1)), s0 = randn(B * H * P * N, 6, 0.5);
  OwnedTensor xf = on(gpu(), hx, {B, T, width}), xh = on_bf16(hx, {B, T, width});
  OwnedTensor dt_raw = on(gpu(), randn(B * T * H, 2), {B, T, H}), dt_bias = on(gpu(), uniform(H, 3, -3.0, -1.0), {H});
  OwnedTensor A_log = on(gpu(), randn(H, 4, 0.5), {H}), D = on(gpu(), randn(H, 5), {H});
  OwnedTensor sf = on(gpu(), s0, {B, H, P, N}), sh = on(gpu(), s0, {B, H, P, N});
  OwnedTensor yf(gpu(), DType::f32, {B, T, H * P}), yh(gpu(), DType::bf16, {B, T, H * P});
  gpu().mamba2_ssd_decode(*xf, *dt_raw, *dt_bias, *A_log, *D, P, G, 8, *sf, *yf);
  gpu().mamba2_ssd_decode(*xh, *dt_raw, *dt_bias, *A_log, *D, P, G, 8, *sh, *yh);
  CHECK(get_bf16(*yh) == round_bf16(get(gpu(), *yf)));
  CHECK(get(gpu(), *sh) == get(gpu(), *sf));
  // xbc and y in one dtype: a clear error otherwise
  REQUIRE_THROWS_WITH(gpu().mamba2_ssd_decode(*xh, *dt_raw, *dt_bias, *A_log, *D, P, G, 8, *sh, *yf),
                      Catch::Contains("mamba2_ssd_decode") &&
                          Catch::Contains("xbc, y must be all f32 or all bf16, got bf16, f32"));
}

TEST_CASE("cuda decode: mamba3_decode continues its carry", "[gpu][decode]") {
  const int64_t T = GENERATE(1, 6);
  const Case c = GENERATE_COPY(Case{2, T, 4, 16, 32, 2, 1, 8, false},           // SISO
                               Case{1, T, 2, 32, 64, 1, 2, 16, true, true},     // MIMO rank 2, norm, heavy tail
                               Case{2, T, 3, 8, 16, 1, 4, 0, true});            // MIMO rank 4, no rotation
  const std::string tag = c.tag();
  INFO(tag);
  const Mamba3Options opt = c.options();
  const int64_t HP = c.H * c.P, BC = 2 * c.R * c.G * c.N, W = 3 * c.H + c.S, BT = c.B * c.T, BH = c.B * c.H;
  Pair x = both(randn(BT * HP, 1), {c.B, c.T, HP}), z = both(randn(BT * HP, 2), {c.B, c.T, HP});
  Pair bc = both(randn(BT * BC, 3), {c.B, c.T, BC}), raw = both(randn(BT * W, 4), {c.B, c.T, W});
  const Params prm = make_params(c, 10, false);
  Pair state = both(randn(BH * c.P * c.N, 20, 0.5), {c.B, c.H, c.P, c.N});
  Pair k_prev = both(randn(BH * c.R * c.N, 21, 0.5), {c.B, c.H, c.R, c.N});
  Pair v_prev = both(randn(BH * c.R * c.P, 22, 0.5), {c.B, c.H, c.R, c.P});
  Pair phase = both(uniform(BH * c.S, 23, 0.0, 6.28), {c.B, c.H, c.S});
  Pair out = both(randn(BT * HP, 5), {c.B, c.T, HP});
  gpu().mamba3_decode(*x.g, *z.g, *bc.g, *raw.g, prm.on(true), opt, {*state.g, *k_prev.g, *v_prev.g, *phase.g},
                      *out.g);
  cpu().mamba3_decode(*x.c, *z.c, *bc.c, *raw.c, prm.on(false), opt, {*state.c, *k_prev.c, *v_prev.c, *phase.c},
                      *out.c);
  require_close(out, "out " + tag);
  require_close(state, "state");
  require_close(k_prev, "k_prev");
  require_close(v_prev, "v_prev");
  if (c.S > 0) require_close(phase, "phase");
}

TEST_CASE("cuda decode: mamba3_decode with bf16 activations (x, z, out) matches f32 ones holding the same values",
          "[gpu][decode]") {
  // Backend::mamba3_bf16_activations: the layer of a bf16 model decodes with its bf16 x, z, out (and f32 bc, raw,
  // carry), with bf16 products set (the layer's options) or not (decoding has no products to round): the recurrence
  // reads the bf16 x as its fp32 values, so out is the f32 call's on the rounded x, z, rounded once, and the carry
  // bit-identical; and out within the bf16 tolerance (2e-2, cuda_mamba3_test.cpp) of the CPU reference.
  const int64_t T = GENERATE(1, 6);
  const bool products = GENERATE(false, true);
  Case c = GENERATE_COPY(Case{2, T, 4, 16, 32, 2, 1, 8, false},         // SISO: the step reads the bf16 x as v
                         Case{1, T, 2, 32, 64, 1, 2, 16, true, true},   // MIMO rank 2, norm, heavy tail
                         Case{2, T, 3, 8, 16, 1, 4, 0, true});          // MIMO rank 4, no rotation
  c.bf16 = products;
  const std::string tag = c.tag();
  INFO(tag);
  const Mamba3Options opt = c.options();
  const int64_t HP = c.H * c.P, BC = 2 * c.R * c.G * c.N, W = 3 * c.H + c.S, BT = c.B * c.T, BH = c.B * c.H;
  const std::vector<float> xv = round_bf16(randn(BT * HP, 1)), zv = round_bf16(randn(BT * HP, 2));
  Pair x = both(xv, {c.B, c.T, HP}), z = both(zv, {c.B, c.T, HP});
  const OwnedTensor xh = on_bf16(xv, {c.B, c.T, HP}), zh = on_bf16(zv, {c.B, c.T, HP});
  Pair bc = both(randn(BT * BC, 3), {c.B, c.T, BC}), raw = both(randn(BT * W, 4), {c.B, c.T, W});
  const Params prm = make_params(c, 10, false);
  const auto carry = [&]() {
    std::vector<Pair> k;
    k.push_back(both(randn(BH * c.P * c.N, 20, 0.5), {c.B, c.H, c.P, c.N}));
    k.push_back(both(randn(BH * c.R * c.N, 21, 0.5), {c.B, c.H, c.R, c.N}));
    k.push_back(both(randn(BH * c.R * c.P, 22, 0.5), {c.B, c.H, c.R, c.P}));
    k.push_back(both(uniform(BH * c.S, 23, 0.0, 6.28), {c.B, c.H, c.S}));
    return k;
  };
  std::vector<Pair> kf = carry(), kh = carry();
  Pair out = both(randn(BT * HP, 5), {c.B, c.T, HP});
  const OwnedTensor outh = on_bf16(randn(BT * HP, 6), {c.B, c.T, HP});
  gpu().mamba3_decode(*x.g, *z.g, *bc.g, *raw.g, prm.on(true), opt, {*kf[0].g, *kf[1].g, *kf[2].g, *kf[3].g},
                      *out.g);
  gpu().mamba3_decode(*xh, *zh, *bc.g, *raw.g, prm.on(true), opt, {*kh[0].g, *kh[1].g, *kh[2].g, *kh[3].g}, *outh);
  CHECK(get_bf16(*outh) == round_bf16(get(gpu(), *out.g)));
  for (size_t i = 0; i < kf.size(); ++i) CHECK(get(gpu(), *kh[i].g) == get(gpu(), *kf[i].g));
  cpu().mamba3_decode(*x.c, *z.c, *bc.c, *raw.c, prm.on(false), opt, {*kf[0].c, *kf[1].c, *kf[2].c, *kf[3].c},
                      *out.c);
  require_close(get_bf16(*outh), get(cpu(), *out.c), "out (bf16) " + tag, 2e-2);
}

// ---- the model ----

constexpr int64_t kVocab = kDecodeVocab, kBatch = 2, kLen = 20;

/// The largest |a - b| over each row of V logits relative to that row's largest |b|, maximised over the rows.
double logits_error(const std::vector<double>& a, const std::vector<double>& b, int64_t V) {
  double worst = 0.0;
  for (size_t r = 0; r < a.size() / static_cast<size_t>(V); ++r) {
    double err = 0.0, scale = 0.0;
    for (int64_t i = 0; i < V; ++i) {
      REQUIRE(std::isfinite(a[r * V + i]));
      err = std::max(err, std::abs(a[r * V + i] - b[r * V + i]));
      scale = std::max(scale, std::abs(b[r * V + i]));
    }
    worst = std::max(worst, err / scale);
  }
  return worst;
}

/// The logits after each segment of both sequences (a prompt of 9 tokens, then single tokens) [kLen - 8 rows
/// of kBatch x V], and the full forward's logits at the same positions.
struct Decoded {
  std::vector<double> steps, full;
};
Decoded decode_sequences(Backend& be, const ModelConfig& config, DType compute) {
  Model model(config);
  model.allocate(be, DType::f32, compute);
  model.params().initialize(11);
  Philox rng(5, 3);
  std::vector<int32_t> ids(static_cast<size_t>(kBatch * kLen));
  for (auto& id : ids) id = static_cast<int32_t>(rng.below(kVocab));
  const int64_t V = config.vocab_size, prompt = 9;
  model.plan(kBatch, kLen);
  std::vector<double> all(static_cast<size_t>(kBatch * kLen * V)), step(static_cast<size_t>(kBatch * V));
  model.logits(ids.data(), all.data());
  Decoded d;
  DecodeState state = model.start_decode(kBatch, kLen);
  std::vector<int32_t> segment(static_cast<size_t>(kBatch * prompt));
  for (int64_t b = 0; b < kBatch; ++b) std::copy_n(&ids[b * kLen], prompt, &segment[b * prompt]);
  model.prefill(segment.data(), prompt, state, step.data());
  for (int64_t t = prompt - 1; t < kLen; ++t) {
    if (t >= prompt) {
      for (int64_t b = 0; b < kBatch; ++b) segment[b] = ids[b * kLen + t];
      model.decode(segment.data(), state, step.data());
    }
    d.steps.insert(d.steps.end(), step.begin(), step.end());
    for (int64_t b = 0; b < kBatch; ++b)
      d.full.insert(d.full.end(), &all[(b * kLen + t) * V], &all[(b * kLen + t + 1) * V]);
  }
  return d;
}

TEST_CASE("cuda decode: model prefill + decode on the GPU match the CPU and the GPU's full forward",
          "[gpu][decode][model]") {
  for (const DecodeCase& m : decode_cases()) {
    const ModelConfig config = decode_tiny(m.type, m.sets);
    SECTION(m.name + " (fp32)") {
      const Decoded g = decode_sequences(gpu(), config, DType::f32), c = decode_sequences(cpu(), config, DType::f32);
      CHECK(logits_error(g.steps, c.steps, kVocab) < 1e-4);
      CHECK(logits_error(g.steps, g.full, kVocab) < 1e-4);
    }
    SECTION(m.name + " (bf16)") {
      const Decoded g = decode_sequences(gpu(), config, DType::bf16);
      CHECK(logits_error(g.steps, g.full, kVocab) < 5e-2);
    }
  }
}

}  // namespace
