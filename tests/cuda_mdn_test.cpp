// The CUDA backend's MDN ops (mdn_gates_*, mdn_correction_*, the chunked MDN core mdn_chunk_*) against the
// CPU reference backend: each op runs through make_backend("cuda") and make_cpu_backend() on the same fresh
// Philox inputs (never zeros; overwritten outputs start from random garbage, accumulated ones from random
// values). Metric: max|gpu - cpu| / max|cpu| <= kTol (1e-5, cuda_test_util.h) per output tensor, with every
// output finite (so a NaN never passes). The core runs in every gate regime of mdn.md §8 (normal, strong memory
// decay, momentum much shorter than memory μ << α, μ near 0, and no momentum: log μ = -inf, η = 1, where it must
// also equal the GPU's GDN core), at partial and full chunks, chunk sizes 16 and 64, the model's head size, and
// T = 4096. Every backward (and the core's forward) is run twice and must be bit-identical. The core also runs with
// save_residuals (mdn.md §7.1): the forward's saved corrected values Ṽ are held to the CPU's at kTol, and the
// forward's o and every gradient of the backward that reads them must be bit-identical to the recompute path's.
// The core runs with fp32 compute (exact fp32 products, kTol) and with bf16 compute (bf16 operands on the tensor
// cores, kBf16CoreTol, every check above except the comparison with the GDN core), on fresh inputs each.
// main() (catch_main_gpu.cpp) skips without a GPU.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/mdn_gate_options.h"
#include "cuda_test_util.h"

using namespace llmt::test;

namespace {

using llmt::Backend;
using llmt::DType;
using llmt::MdnGateOptions;
using llmt::Tensor;

// ---- gates ----

// The per-head parameters of one backend (MdnGateParams views; the momentum ones absent without momentum).
Backend::MdnGateParams params_of(bool gpu_side, const Pair& A_log, const Pair& dt_bias, const Pair& Mu_log,
                                 const Pair& mu_bias, const Pair& log_factor, bool momentum) {
  const auto pick = [&](const Pair& p) { return gpu_side ? *p.g : *p.c; };
  return {pick(A_log), pick(dt_bias), momentum ? pick(Mu_log) : Tensor(), momentum ? pick(mu_bias) : Tensor(),
          pick(log_factor)};
}

// One gates case: forward and backward against the CPU, then the backward once more, bit-identical.
// Mu_log = -0.5, 0.5, 1.5 with z_μ ~ 3 N(0, 1) puts part of the tokens on the floor (zero μ gradient) and part
// off it.
void check_gates(const MdnGateOptions& opt, const std::string& tag) {
  INFO(tag);
  const int64_t rows = 2 * 300, H = 3, n = rows * H;
  const bool mom = opt.momentum;
  Pair za = both(randn(n, 1, 3.0), {rows, H}), zb = both(randn(n, 2, 2.0), {rows, H});
  Pair zm = both(randn(n, 3, 3.0), {rows, H}), ze = both(randn(n, 4, 30.0), {rows, H});
  Pair A_log = both(randn(H, 5, 0.5), {H}), dt_bias = both(randn(H, 6), {H});
  Pair Mu_log = both(std::vector<float>{-0.5f, 0.5f, 1.5f}, {H}), mu_bias = both(randn(H, 8), {H});
  Pair log_factor = both(randn(H, 9, 0.7), {H});
  Pair la = both(randn(n, 10), {rows, H}), beta = both(randn(n, 11), {rows, H});
  Pair lm = both(randn(n, 12), {rows, H}), eta = both(randn(n, 13), {rows, H});
  const Tensor none;
  const auto pg = params_of(true, A_log, dt_bias, Mu_log, mu_bias, log_factor, mom);
  const auto pc = params_of(false, A_log, dt_bias, Mu_log, mu_bias, log_factor, mom);
  gpu().mdn_gates_fwd(*za.g, *zb.g, mom ? *zm.g : none, mom ? *ze.g : none, pg, opt, *la.g, *beta.g, *lm.g, *eta.g);
  cpu().mdn_gates_fwd(*za.c, *zb.c, mom ? *zm.c : none, mom ? *ze.c : none, pc, opt, *la.c, *beta.c, *lm.c, *eta.c);
  require_close(la, tag + " log_alpha");
  require_close(beta, tag + " beta");
  require_close(eta, tag + " eta");
  if (mom) {
    require_close(lm, tag + " log_mu");
    size_t floored = 0;
    for (float x : get(cpu(), *lm.c)) floored += x == static_cast<float>(opt.min_log_mu);
    CHECK(floored > 0);                         // the clamp is exercised ...
    CHECK(floored < static_cast<size_t>(n));  // ... and so is the unclamped branch
  } else {
    for (float x : get(gpu(), *lm.g)) REQUIRE(x == -std::numeric_limits<float>::infinity());
  }

  Pair dla = both(randn(n, 14), {rows, H}), dbeta = both(randn(n, 15), {rows, H});
  Pair dlm = both(randn(n, 16), {rows, H}), deta = both(randn(n, 17), {rows, H});
  Pair dza = both(randn(n, 18), {rows, H}), dzb = both(randn(n, 19), {rows, H});
  Pair dzm = both(randn(n, 20), {rows, H}), dze = both(randn(n, 21), {rows, H});
  const std::vector<std::vector<float>> d0 = {randn(H, 22), randn(H, 23), randn(H, 24), randn(H, 25), randn(H, 26)};
  Pair dA = both(d0[0], {H}), ddt = both(d0[1], {H}), dMu = both(d0[2], {H}), dmub = both(d0[3], {H});
  Pair dlf = both(d0[4], {H});
  const auto dpg = params_of(true, dA, ddt, dMu, dmub, dlf, mom);
  const auto dpc = params_of(false, dA, ddt, dMu, dmub, dlf, mom);
  const auto run_gpu = [&] {
    gpu().mdn_gates_bwd(*dla.g, *dbeta.g, mom ? *dlm.g : none, mom ? *deta.g : none, *za.g, *zb.g,
                        mom ? *zm.g : none, mom ? *ze.g : none, pg, opt, *dza.g, *dzb.g, mom ? *dzm.g : none,
                        mom ? *dze.g : none, dpg);
  };
  run_gpu();
  cpu().mdn_gates_bwd(*dla.c, *dbeta.c, mom ? *dlm.c : none, mom ? *deta.c : none, *za.c, *zb.c, mom ? *zm.c : none,
                      mom ? *ze.c : none, pc, opt, *dza.c, *dzb.c, mom ? *dzm.c : none, mom ? *dze.c : none, dpc);
  require_close(dza, tag + " dz_alpha");
  require_close(dzb, tag + " dz_beta");
  require_close(dzm, tag + " dz_mu");  // without momentum: untouched on both sides
  require_close(dze, tag + " dz_eta");
  require_close(dA, tag + " dA_log");
  require_close(ddt, tag + " ddt_bias");
  require_close(dMu, tag + " dMu_log");  // without momentum: untouched (still the random start)
  require_close(dmub, tag + " dmu_bias");
  require_close(dlf, tag + " dlog_factor");

  const Pair* grads[] = {&dA, &ddt, &dMu, &dmub, &dlf, &dza, &dzb, &dzm, &dze};
  std::vector<std::vector<float>> first;
  for (const Pair* p : grads) first.push_back(get(gpu(), *p->g));
  for (size_t i = 0; i < d0.size(); ++i) gpu().upload(d0[i].data(), *grads[i]->g);
  run_gpu();
  for (size_t i = 0; i < first.size(); ++i)
    require_bit_identical(first[i], get(gpu(), *grads[i]->g), tag + " gradient #" + std::to_string(i));
}

}  // namespace

TEST_CASE("cuda mdn: gates forward and backward in every option combination, deterministic", "[cuda][mdn]") {
  MdnGateOptions opt;
  opt.tau = 32.0;
  check_gates(opt, "momentum, tanh eta, beta_max");
  opt.eta_two_sigmoid = true;
  opt.beta_max = false;
  opt.min_log_mu = -1.0;
  check_gates(opt, "momentum, two-sigmoid eta, no beta_max, floor -1");
  MdnGateOptions none;
  none.tau = 32.0;
  none.momentum = false;
  check_gates(none, "no momentum");
}

TEST_CASE("cuda mdn: output correction forward and backward (dk, dD_log accumulate), deterministic", "[cuda][mdn]") {
  const int64_t rows = 2 * 300, H = 3, K = 32, n = rows * H * K;
  Pair q = both(randn(n, 31), {rows, H * K}), k = both(randn(n, 32), {rows, H * K});
  Pair D_log = both(randn(H, 33, 0.5), {H}), q_out = both(randn(n, 34), {rows, H * K});
  gpu().mdn_correction_fwd(*q.g, *k.g, *D_log.g, *q_out.g);
  cpu().mdn_correction_fwd(*q.c, *k.c, *D_log.c, *q_out.c);
  require_close(q_out, "correction q_out");
  const auto dk0 = randn(n, 35), dD0 = randn(H, 36);
  Pair dq_out = both(randn(n, 37), {rows, H * K}), dk = both(dk0, {rows, H * K}), dD = both(dD0, {H});
  gpu().mdn_correction_bwd(*dq_out.g, *k.g, *D_log.g, *dk.g, *dD.g);
  cpu().mdn_correction_bwd(*dq_out.c, *k.c, *D_log.c, *dk.c, *dD.c);
  require_close(dk, "correction dk");
  require_close(dD, "correction dD_log");
  const auto first_dk = get(gpu(), *dk.g), first_dD = get(gpu(), *dD.g);
  gpu().upload(dk0.data(), *dk.g);
  gpu().upload(dD0.data(), *dD.g);
  gpu().mdn_correction_bwd(*dq_out.g, *k.g, *D_log.g, *dk.g, *dD.g);
  require_bit_identical(first_dk, get(gpu(), *dk.g), "correction dk");
  require_bit_identical(first_dD, get(gpu(), *dD.g), "correction dD_log");
}

namespace {

// ---- the chunked core ----

/// The gate regimes of the core tests (mdn.md §8.3-8.4, §12.1, §12.3).
enum class Regime { normal, strong_decay, mu_much_less_than_alpha, mu_near_zero, no_momentum };

// The core's tolerance for a compute dtype (f32: exact fp32 products; bf16: bf16 operands, cuda_test_util.h).
double core_tol(DType compute) { return compute == DType::bf16 ? kBf16CoreTol : kTol; }

const char* name_of(Regime r) {
  switch (r) {
    case Regime::normal: return "normal";
    case Regime::strong_decay: return "strong decay";
    case Regime::mu_much_less_than_alpha: return "mu << alpha";
    case Regime::mu_near_zero: return "mu near 0";
    case Regime::no_momentum: return "no momentum";
  }
  return "";
}

/// Per-token gates [n] of a regime: log α, log μ (-inf without momentum), η (1 without momentum) and
/// β = (1 - α) σ(z) (α + β < 1, as the gates of §4.4 guarantee).
struct Gates {
  std::vector<float> la, lm, eta, beta;
};
Gates gates_for(Regime r, size_t n, uint64_t seed) {
  Gates g;
  switch (r) {
    case Regime::normal:
      g.la = uniform(n, seed, -0.7, -0.01), g.lm = uniform(n, seed + 1, -2.0, -0.05);
      break;
    case Regime::strong_decay:  // memory decays within a few tokens; e^{A} underflows inside a chunk
      g.la = uniform(n, seed, -20.0, -2.0), g.lm = uniform(n, seed + 1, -2.0, -0.5);
      break;
    case Regime::mu_much_less_than_alpha:  // §8.4: the authors' γ formula cancels to 0 here
      g.la = uniform(n, seed, -0.02, -0.001), g.lm = uniform(n, seed + 1, -2.0, -1.5);
      break;
    case Regime::mu_near_zero:  // μ ~ 1e-9 .. 1e-13
      g.la = uniform(n, seed, -0.7, -0.01), g.lm = uniform(n, seed + 1, -30.0, -20.0);
      break;
    case Regime::no_momentum:
      g.la = uniform(n, seed, -0.7, -0.01), g.lm.assign(n, -std::numeric_limits<float>::infinity());
      break;
  }
  g.eta = r == Regime::no_momentum ? std::vector<float>(n, 1.0f) : uniform(n, seed + 2, 0.3, 1.7);
  g.beta = sigmoid_of(randn(n, seed + 3));
  for (size_t i = 0; i < n; ++i) g.beta[i] = static_cast<float>((1.0 - std::exp(double(g.la[i]))) * g.beta[i]);
  return g;
}

// One core case with the products' compute dtype `compute` (tolerance core_tol): forward o and backward dq, dk,
// dv, d log α, dβ, d log μ, dη against the CPU reference (recompute path, no residuals tensor), then on the GPU the
// forward with save_residuals (o bit-identical, Ṽ against the CPU's), the recompute backward once more and the
// backward reading the saved Ṽ, both bit-identical to the first. Without momentum d log μ must be exactly 0 (μ = 0
// has no gradient path), and with fp32 compute the GPU's MDN must also match its GDN core (g = log α).
void check_mdn(int64_t B, int64_t T, int64_t H, int64_t K, int64_t V, int64_t chunk, Regime regime, uint64_t seed,
               DType compute = DType::f32) {
  const double tol = core_tol(compute);
  const std::string tag = std::string(name_of(regime)) + " B=" + std::to_string(B) + " T=" + std::to_string(T) +
                          " H=" + std::to_string(H) + " K=" + std::to_string(K) + " V=" + std::to_string(V) +
                          " chunk=" + std::to_string(chunk) + (compute == DType::bf16 ? " bf16" : " fp32");
  INFO(tag);
  const int64_t nk = B * T * H * K, nv = B * T * H * V, nb = B * T * H;
  const Gates gt = gates_for(regime, static_cast<size_t>(nb), seed + 20);
  Pair q = both(unit_rows(nk, K, seed + 1, 1.0 / std::sqrt(static_cast<double>(K))), {B, T, H, K});
  Pair k = both(unit_rows(nk, K, seed + 2, 1.0), {B, T, H, K});
  Pair v = both(randn(nv, seed + 3), {B, T, H, V});
  Pair la = both(gt.la, {B, T, H}), beta = both(gt.beta, {B, T, H}), lm = both(gt.lm, {B, T, H});
  Pair eta = both(gt.eta, {B, T, H});
  Pair o = both(randn(nv, seed + 4), {B, T, H, V}), residuals = both(randn(nv, seed + 19), {B, T, H, V});
  const Tensor recompute;  // no residuals tensor: the backward recomputes Ṽ
  gpu().mdn_chunk_fwd(*q.g, *k.g, *v.g, *la.g, *beta.g, *lm.g, *eta.g, chunk, compute, *o.g, recompute);
  cpu().mdn_chunk_fwd(*q.c, *k.c, *v.c, *la.c, *beta.c, *lm.c, *eta.c, chunk, DType::f32, *o.c, *residuals.c);
  require_close(o, "o " + tag, tol);
  const auto o_first = get(gpu(), *o.g);
  gpu().mdn_chunk_fwd(*q.g, *k.g, *v.g, *la.g, *beta.g, *lm.g, *eta.g, chunk, compute, *o.g, *residuals.g);
  require_bit_identical(o_first, get(gpu(), *o.g), "o (save_residuals vs recompute) " + tag);
  require_close(residuals, "saved residuals " + tag, tol);
  // MDN with μ = 0, η = 1 is GDN with g = log α (mdn.md §5). Both GPU cores (GDN with fp32 products) are within
  // kTol of CPU references that agree to double rounding, so they agree within 2 kTol (triangle inequality).
  const bool vs_gdn = regime == Regime::no_momentum && compute == DType::f32;
  if (vs_gdn) {
    llmt::OwnedTensor o_gdn = on(gpu(), randn(nv, seed + 5), {B, T, H, V});
    gpu().gdn_chunk_fwd(*q.g, *k.g, *v.g, *la.g, *beta.g, chunk, llmt::DType::f32, *o_gdn, Tensor());
    require_close(get(gpu(), *o_gdn), o_first, "mdn (no momentum) vs gdn on the GPU: o " + tag, 2 * kTol);
  }

  Pair d_o = both(randn(nv, seed + 6), {B, T, H, V});
  Pair dq = both(randn(nk, seed + 7), {B, T, H, K}), dk = both(randn(nk, seed + 8), {B, T, H, K});
  Pair dv = both(randn(nv, seed + 9), {B, T, H, V});
  Pair dla = both(randn(nb, seed + 10), {B, T, H}), dbeta = both(randn(nb, seed + 11), {B, T, H});
  Pair dlm = both(randn(nb, seed + 12), {B, T, H}), deta = both(randn(nb, seed + 13), {B, T, H});
  const auto run_gpu = [&](const Tensor& saved) {
    gpu().mdn_chunk_bwd(*q.g, *k.g, *v.g, *la.g, *beta.g, *lm.g, *eta.g, *d_o.g, saved, chunk, compute, *dq.g, *dk.g,
                        *dv.g, *dla.g, *dbeta.g, *dlm.g, *deta.g);
  };
  run_gpu(recompute);
  cpu().mdn_chunk_bwd(*q.c, *k.c, *v.c, *la.c, *beta.c, *lm.c, *eta.c, *d_o.c, recompute, chunk, DType::f32, *dq.c,
                      *dk.c, *dv.c, *dla.c, *dbeta.c, *dlm.c, *deta.c);
  require_close(dq, "dq " + tag, tol);
  require_close(dk, "dk " + tag, tol);
  require_close(dv, "dv " + tag, tol);
  require_close(dbeta, "dbeta " + tag, tol);
  require_close(deta, "deta " + tag, tol);
  // The log-gate gradients are formed from segment sums of dL ⊙ L (no cancellation), so they are held to the
  // same bound as the others, against their own scale (exactly 0 on both sides at T = 1).
  require_close(dla, "dlog_alpha " + tag, tol);
  if (regime == Regime::no_momentum) {  // μ = 0: no gradient path to log μ, exactly 0 on both sides
    for (float x : get(gpu(), *dlm.g)) REQUIRE(x == 0.0f);
    for (float x : get(cpu(), *dlm.c)) REQUIRE(x == 0.0f);
  } else if (regime == Regime::mu_near_zero && compute == DType::bf16) {
    // d log μ = μ dμ vanishes with μ (~1e-10 here) and sums terms of both signs: its bf16 error is held against
    // the scale of the other log-gate gradient, d log α (CPU emulation of the kernels: 1e-11 of it; against its
    // own scale 2.6e-3 .. 1.8e-2 over 7 draws, too close to kBf16CoreTol for a test).
    double dla_scale = 0;
    for (float x : get(cpu(), *dla.c)) dla_scale = std::max(dla_scale, std::abs(static_cast<double>(x)));
    require_close(dlm, "dlog_mu " + tag, tol, dla_scale);
  } else {
    require_close(dlm, "dlog_mu " + tag, tol);
  }

  if (vs_gdn) {  // the GDN backward: dk through both uses of k, dg = d log α (incl. the read path), dβ, dq, dv
    llmt::OwnedTensor gq = on(gpu(), randn(nk, seed + 14), {B, T, H, K});
    llmt::OwnedTensor gk = on(gpu(), randn(nk, seed + 15), {B, T, H, K});
    llmt::OwnedTensor gv = on(gpu(), randn(nv, seed + 16), {B, T, H, V});
    llmt::OwnedTensor gg = on(gpu(), randn(nb, seed + 17), {B, T, H});
    llmt::OwnedTensor gb = on(gpu(), randn(nb, seed + 18), {B, T, H});
    gpu().gdn_chunk_bwd(*q.g, *k.g, *v.g, *la.g, *beta.g, *d_o.g, Tensor(), chunk, llmt::DType::f32, *gq, *gk, *gv,
                        *gg, *gb);
    const std::pair<const llmt::OwnedTensor*, const Pair*> same[] = {{&gq, &dq}, {&gk, &dk}, {&gv, &dv}, {&gg, &dla},
                                                                      {&gb, &dbeta}};
    // GDN's own dg guarantee is relative to the scale of dβ (cuda_delta_test), so that comparison uses it too.
    double dbeta_scale = 0;
    for (float x : get(cpu(), *dbeta.c)) dbeta_scale = std::max(dbeta_scale, std::abs(static_cast<double>(x)));
    for (const auto& [gdn, mdn] : same)
      require_close(get(gpu(), **gdn), get(gpu(), *mdn->g), "mdn (no momentum) vs gdn on the GPU: gradient " + tag,
                    2 * kTol, mdn == &dla ? dbeta_scale : 1e-30);
  }

  const Pair* grads[] = {&dq, &dk, &dv, &dla, &dbeta, &dlm, &deta};
  const char* names[] = {"dq", "dk", "dv", "dlog_alpha", "dbeta", "dlog_mu", "deta"};
  std::vector<std::vector<float>> first;
  for (const Pair* p : grads) first.push_back(get(gpu(), *p->g));
  const std::pair<const Tensor*, const char*> reruns[] = {{&recompute, " (recompute, again) "},
                                                          {&*residuals.g, " (save_residuals vs recompute) "}};
  for (const auto& [saved, what] : reruns) {
    for (const Pair* p : grads) gpu().fill_zero(*p->g);
    run_gpu(*saved);
    for (size_t i = 0; i < first.size(); ++i)
      require_bit_identical(first[i], get(gpu(), *grads[i]->g), std::string(names[i]) + what + tag);
  }
}

constexpr Regime kAllRegimes[] = {Regime::normal, Regime::strong_decay, Regime::mu_much_less_than_alpha,
                                  Regime::mu_near_zero, Regime::no_momentum};

}  // namespace

TEST_CASE("cuda mdn: chunked core forward and backward, partial and full chunks, deterministic", "[cuda][mdn]") {
  uint64_t seed = 100;
  for (const auto& kv : {std::pair<int64_t, int64_t>{16, 32}, std::pair<int64_t, int64_t>{64, 128}})
    for (const int64_t T : {1, 63, 64, 65, 200})
      for (const int64_t chunk : {16, 64}) {
        check_mdn(2, T, 3, kv.first, kv.second, chunk, Regime::normal, seed);
        seed += 40;
      }
}

TEST_CASE("cuda mdn: chunked core in every gate regime (strong decay, mu << alpha, mu near 0, no momentum)",
          "[cuda][mdn]") {
  uint64_t seed = 3000;
  for (const Regime r : kAllRegimes)
    for (const int64_t T : {65, 200}) {
      check_mdn(2, T, 3, 32, 64, 64, r, seed);
      seed += 40;
    }
}

TEST_CASE("cuda mdn: chunked core at the model's head sizes (K = 128, V = 256 and V = 128)", "[cuda][mdn]") {
  check_mdn(1, 130, 2, 128, 256, 64, Regime::normal, 5000);
  check_mdn(1, 130, 2, 128, 128, 64, Regime::mu_much_less_than_alpha, 5100);
}

// fp32 (tile::Simt) with key and value dims not multiples of 4 and chunk 13: bchunk's scalar key-column loads and
// its state dots without the cp.async ring (K V not a multiple of 4), which every other fp32 shape here skips.
TEST_CASE("cuda mdn: chunked core with unaligned dims and chunk 13 (fp32)", "[cuda][mdn]") {
  check_mdn(2, 100, 3, 30, 45, 13, Regime::normal, 5300);
}

TEST_CASE("cuda mdn: chunked core, long sequence T = 4096", "[cuda][mdn]") {
  check_mdn(1, 4096, 2, 64, 64, 64, Regime::normal, 7000);
  check_mdn(1, 4096, 2, 64, 64, 64, Regime::no_momentum, 7100);
}

TEST_CASE("cuda mdn: save_residuals at T = 4096 in the extreme gate regimes (mu << alpha, strong decay)",
          "[cuda][mdn]") {
  check_mdn(1, 4096, 2, 64, 128, 64, Regime::mu_much_less_than_alpha, 7200);
  check_mdn(1, 4096, 2, 64, 64, 64, Regime::strong_decay, 7300);
}

// bf16 compute: the sweeps use B = 8 (at least 24 tokens; see kBf16CoreTol), fresh inputs (other seeds).
TEST_CASE("cuda mdn: bf16 compute, chunked core, partial and full chunks, every gate regime, deterministic",
          "[cuda][mdn]") {
  uint64_t seed = 9000;
  for (const auto& kv : {std::pair<int64_t, int64_t>{16, 32}, std::pair<int64_t, int64_t>{64, 128}})
    for (const int64_t T : {1, 63, 64, 65, 200})
      for (const int64_t chunk : {16, 64}) {
        check_mdn(8, T, 3, kv.first, kv.second, chunk, Regime::normal, seed, DType::bf16);
        seed += 40;
      }
  for (const Regime r : kAllRegimes)
    for (const int64_t T : {65, 200}) {
      check_mdn(8, T, 3, 32, 64, 64, r, seed, DType::bf16);
      seed += 40;
    }
}

TEST_CASE("cuda mdn: bf16 compute at the model's head sizes (K = V = 128; K = 128, V = 256; K = 256, V = 512)",
          "[cuda][mdn]") {
  check_mdn(1, 130, 2, 128, 128, 64, Regime::normal, 11000, DType::bf16);
  check_mdn(1, 130, 2, 128, 256, 64, Regime::mu_much_less_than_alpha, 11100, DType::bf16);
  check_mdn(1, 200, 2, 256, 512, 64, Regime::normal, 11200, DType::bf16);
}

// The backward with saved Ṽ runs one states-only scan block per (value tile, key tile): these shapes give it
// several key tiles with a partial last one (K = 160: 64 + 64 + 32; K = 100: 64 + 36) and several value tiles,
// full and partial (V = 192, 100), on both layouts; aligned dims, so the bf16 one stages its Ṽ and k rows.
TEST_CASE("cuda mdn: several key tiles with a partial last one and several value tiles (save_residuals)",
          "[cuda][mdn]") {
  check_mdn(2, 130, 2, 160, 100, 64, Regime::normal, 5200);
  check_mdn(8, 130, 2, 160, 192, 64, Regime::normal, 11300, DType::bf16);
  check_mdn(8, 200, 2, 100, 100, 64, Regime::strong_decay, 11400, DType::bf16);
}

// The bf16 scan stages the next chunk's 𝒯, v (or Ṽ) and, for key_dim <= 128, k rows by cp.async where they are
// 16-byte aligned; these shapes take its synchronous fallbacks: key and value dims not multiples of 4 (k and v
// loaded directly, k one key tile ahead in registers), chunk 13 (𝒯 rows not aligned), and with chunk 64 a last
// chunk of 2 tokens (𝒯 of that chunk only), key_dim 130 (three key tiles: k never staged). The same shapes take
// the states-only scan without staging and its element-wise state stores, the bscan's element-wise dstates stores
// (tile::store_h; value dims not multiples of 8), bchunk's scalar loads (key dims not multiples of 4; K V not a
// multiple of 8: its state dots without the cp.async ring) and brow's and out's loads of the chunk states without
// cp.async (value dims not multiples of 8; out's synchronous variant, Q still whole).
TEST_CASE("cuda mdn: bf16 compute, the scan's synchronous fallbacks (unaligned dims, chunk 13, ragged last chunk)",
          "[cuda][mdn]") {
  check_mdn(8, 100, 3, 30, 50, 13, Regime::normal, 13000, DType::bf16);
  check_mdn(8, 130, 2, 130, 70, 64, Regime::mu_much_less_than_alpha, 13100, DType::bf16);
  check_mdn(8, 66, 2, 62, 36, 64, Regime::strong_decay, 13200, DType::bf16);
}

// The bf16 out kernel keeps a chunk's Q key tiles in shared memory and copies the chunk states by cp.async into a
// ring of (S_0, M_0) tile pairs, up to 3 (value tile, key tile) steps ahead (out_plan; unaligned value dims take its
// synchronous loads, above). These shapes run that path with partial last key and value tiles: key_dim 100 and 130
// (last key tile 36 and 2 rows), value_dim 96 and 136 (last value tile 32 and 8 columns), a ring of 4 over 4 steps
// (chunk 64, last chunk 2 tokens) and a ring of 3 wrapping over 9 steps (chunk 16, last chunk 4 tokens).
TEST_CASE("cuda mdn: bf16 compute, the out kernel's cp.async ring with partial key and value tiles", "[cuda][mdn]") {
  check_mdn(8, 130, 2, 100, 96, 64, Regime::normal, 13300, DType::bf16);
  check_mdn(8, 100, 2, 130, 136, 16, Regime::mu_much_less_than_alpha, 13400, DType::bf16);
}

TEST_CASE("cuda mdn: bf16 compute, T = 4096 and a ragged T = 4001 in every gate regime", "[cuda][mdn]") {
  uint64_t seed = 12000;
  for (const Regime r : kAllRegimes) {
    check_mdn(1, 4096, 2, 64, 64, 64, r, seed, DType::bf16);
    check_mdn(1, 4001, 2, 128, 128, 64, r, seed + 20, DType::bf16);
    seed += 40;
  }
}

// Value dim 2048 (32 value tiles): on an H200 (132 SMs, one scan block per SM) one wave of the scans holds 4
// (batch, head) pairs, so the 6 pairs here run as two groups, the second on the side stream (by_waves in mdn.cu).
TEST_CASE("cuda mdn: pairs beyond a whole wave of the scan, in two groups on two streams (fp32 and bf16)",
          "[cuda][mdn]") {
  check_mdn(2, 130, 3, 64, 2048, 64, Regime::normal, 14000);
  check_mdn(2, 130, 3, 64, 2048, 64, Regime::mu_much_less_than_alpha, 14100, DType::bf16);
}

TEST_CASE("cuda mdn: core refuses chunk_size above the kernel's limit", "[cuda][mdn]") {
  Pair q = both(randn(2 * 8 * 4, 1), {1, 8, 2, 4}), v = both(randn(2 * 8 * 4, 2), {1, 8, 2, 4});
  Pair la = both(uniform(16, 3, -1.0, 0.0), {1, 8, 2}), beta = both(uniform(16, 4, 0.1, 0.5), {1, 8, 2});
  Pair o = both(randn(2 * 8 * 4, 5), {1, 8, 2, 4});
  for (const DType compute : {DType::f32, DType::bf16})
    REQUIRE_THROWS_WITH(
        gpu().mdn_chunk_fwd(*q.g, *q.g, *v.g, *la.g, *beta.g, *la.g, *beta.g, 128, compute, *o.g, Tensor()),
        Catch::Contains("chunk_size"));
}
