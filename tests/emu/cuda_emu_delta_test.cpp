// The GDN, Comba and KDA cores (src/kernels/cuda/gdn_comba.cu, kda.cu) run by the CPU emulator (cuda_emu.h)
// through their own launchers, no GPU: forward, then backward, on small shapes with a ragged last chunk (T = 130,
// chunk 64), full and partial key / value tiles. bf16 compute (the tile::Mma phases: ldmatrix / mma.sync /
// cp.async; GDN and Comba also at the benchmarks' tilings, K = V = 128 and K = 256, V = 512, KDA at K = V = 128
// (also with strong decay, g down to -20), GDN and Comba with a key_dim
// beyond the Mma scans, K = 320: the tile::Tc scans; GDN with three key tiles, K = 192, V = 64: the backward scan's
// staging ring at 3 key tiles; GDN with rows that are not 16-byte aligned, K = 61, V = 60; GDN and Comba with bf16
// q, k, v, p̂ in memory, compared with the reference on the same bf16-rounded inputs, GDN also at K = 320, V = 128:
// wu's operand tiles by cp.async, more of them than its ring holds) and fp32 compute (tile::Simt).
// GDN and Comba: the forward keeps its 𝒯, h, Δ and W (the saved set, NaN before the forward; the scratch is NaN
// again before the backward) and the backward reads W, h and Δ, running neither wu nor the forward scan; KDA: the
// forward keeps P, 𝒯, Δ and h, the backward forms W from 𝒯 and runs no forward scan (KDA also at chunk 13 with
// V = 33: saved regions of odd sizes). Every output must be
// (a) finite and bit-identical under every schedule and cp.async mode of the emulator (a race, a missing barrier
//     or a missing cp.async wait changes bits under some schedule or mode);
// (b) within the GPU tests' tolerance of the CPU reference (cpu::{gdn,comba,kda}_chunk_fwd / bwd, double
//     arithmetic): kBf16CoreTol with bf16 compute, kTol with fp32 compute, dg against the scale of dβ
//     (tests/cuda_delta_test.cpp check_gdn, check_comba; cuda_test_host.h);
// (c) bit-identical to the backward without the saved set (GDN and Comba: forming A, 𝒯, W, U, h and Δ again; KDA:
//     P, 𝒯, h and Δ; one run) and, in a few small cases (every kernel variant it runs: bf16 and fp32 compute, bf16
//     inputs, KDA's odd-sized regions), to the backward from the saved set without h and Δ (save_states false: 𝒯
//     alone, KDA P and 𝒯; W and U formed from 𝒯, the forward scan run again; one run), and each saved set
//     bit-identical after the backward to what the forward left there;
// (d) with bf16 q, k, v, p̂: bit-identical to the run on fp32 inputs holding the same (bf16-rounded) values.
// Run with `ctest -L emu`; docs/ARCHITECTURE.md (Verification) says what this can and cannot catch.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "../cuda_test_host.h"
#include "cuda_emu.h"
#include "cuda_emu_test.h"
#include "kernels/cpu/comba.h"
#include "kernels/cpu/gdn.h"
#include "kernels/cpu/kda.h"
#include "kernels/cuda/ops.cuh"

using namespace llmt::test;
using namespace llmt::test::emu_test;

namespace {

enum class Core { gdn, comba, kda };

struct Case {
  Core core;
  bool bf16;  // compute dtype: bf16 (tile::Mma phases) or fp32 (tile::Simt)
  int64_t B, T, H, K, V, C;
  double g_lo;  // g uniform in [g_lo, 0)
  uint64_t seed;
  bool bf16_in = false;  // GDN, Comba with bf16 compute: q, k, v (p̂) given to the core in bf16
  std::string tag() const {
    const char* name = core == Core::gdn ? "gdn" : core == Core::comba ? "comba" : "kda";
    return std::string(name) + (bf16 ? " (bf16" : " (fp32") + " compute" + (bf16_in ? ", bf16 q, k, v" : "") +
           ") B=" + std::to_string(B) +
           " T=" + std::to_string(T) + " H=" + std::to_string(H) + " K=" + std::to_string(K) +
           " V=" + std::to_string(V) + " chunk=" + std::to_string(C) + " g in [" + std::to_string(g_lo) + ", 0)";
  }
  bool comba() const { return core == Core::comba; }
  double tol() const { return bf16 ? kBf16CoreTol : kTol; }
};

/// Inputs as check_gdn's / check_comba's (same Philox streams): unit-length keys (and Comba's p̂), queries of length
/// K^-1/2, g uniform in [g_lo, 0) ([B, T, H], KDA [B, T, H, K]), β = σ(normal), dL/do normal. With c.bf16_in, q, k,
/// v, p̂ rounded to bf16 (the core's inputs and the reference's alike).
struct Inputs {
  std::vector<float> q, k, p, v, g, beta, d_o;
  explicit Inputs(const Case& c) {
    const size_t nk = c.B * c.T * c.H * c.K, nv = c.B * c.T * c.H * c.V, nb = c.B * c.T * c.H;
    q = unit_rows(nk, c.K, c.seed + 1, 1.0 / std::sqrt(static_cast<double>(c.K)));
    k = unit_rows(nk, c.K, c.seed + 2, 1.0);
    v = randn(nv, c.seed + 3);
    g = uniform(c.core == Core::kda ? nk : nb, c.seed + 4, c.g_lo, 0.0);
    beta = sigmoid_of(randn(nb, c.seed + 5));
    d_o = randn(nv, c.seed + 7);
    if (c.comba()) p = unit_rows(nk, c.K, c.seed + 13, 1.0);
    if (c.bf16_in)
      for (std::vector<float>* x : {&q, &k, &v, &p}) *x = round_bf16(*x);
  }
};

/// o, dq, dk, dv, [dp], dg, dβ.
struct Outputs {
  std::vector<std::vector<float>> v;
};
std::vector<std::string> output_names(const Case& c) {
  if (c.comba()) return {"o", "dq", "dk", "dv", "dp", "dg", "dbeta"};
  return {"o", "dq", "dk", "dv", "dg", "dbeta"};
}

/// What the forward keeps for the backward: nothing, its saved set without h and Δ (GDN, Comba: 𝒯; KDA: P and 𝒯;
/// save_states false), or with them (GDN, Comba: 𝒯, h, Δ and W; KDA: P, 𝒯, Δ and h).
enum class Kept { none, tinv, states };

/// The forward, then the backward, in the emulator under `cfg`; every output and the scratch start as NaN (the
/// scratch again before the backward). Unless kept is none the forward keeps its saved set in a buffer of its own
/// (NaN before) that the backward reads and must leave as it was (checked here). E: the element type of q, k, v, p̂
/// (GDN, Comba; KDA: float).
template <typename P, typename E = float>
Outputs run_emulated_as(const Case& c, const Inputs& in, emu::Config cfg, Kept kept_set) {
  namespace cu = llmt::cuda;
  emu::config = cfg;
  const int64_t B = c.B, T = c.T, H = c.H, K = c.K, V = c.V, C = c.C;
  const size_t nk = B * T * H * K, nv = B * T * H * V, nb = B * T * H, ng = in.g.size();
  const Input<E> q(in.q), k(in.k), v(in.v), p(c.comba() ? in.p : std::vector<float>(1));
  const Buffer g(in.g), beta(in.beta), d_o(in.d_o);
  const bool saved = kept_set != Kept::none, states = kept_set == Kept::states;
  const int64_t nsaved = c.core == Core::kda ? cu::kda_saved_floats(B, T, H, K, V, C, states)
                                             : cu::gdn_saved_floats<P>(B, T, H, K, V, C, states);
  const Buffer tinv(saved ? static_cast<size_t>(nsaved) : 1);
  float* const kept = saved ? tinv.get() : nullptr;
  size_t scratch_bytes = 0;
  switch (c.core) {
    case Core::gdn:
      scratch_bytes = std::max(cu::gdn_chunk_fwd_scratch_bytes<P>(B, T, H, K, V, C, saved, states),
                               cu::gdn_chunk_bwd_scratch_bytes<P>(B, T, H, K, V, C, saved, states));
      break;
    case Core::comba:
      scratch_bytes = std::max(cu::comba_chunk_fwd_scratch_bytes<P>(B, T, H, K, V, C, saved, states),
                               cu::comba_chunk_bwd_scratch_bytes<P>(B, T, H, K, V, C, saved, states));
      break;
    case Core::kda:
      scratch_bytes = std::max(cu::kda_chunk_fwd_scratch_bytes(B, T, H, K, V, C, saved, states),
                               cu::kda_chunk_bwd_scratch_bytes(B, T, H, K, V, C, saved, states));
      break;
  }
  Buffer scratch(scratch_bytes / 4 + 1);
  const Buffer o(nv);
  switch (c.core) {
    case Core::gdn:
      cu::gdn_chunk_fwd<P>(q.get(), k.get(), v.get(), g.get(), beta.get(), B, T, H, K, V, C, o.get(), kept, states,
                           scratch.get(), nullptr);
      break;
    case Core::comba:
      cu::comba_chunk_fwd<P>(q.get(), k.get(), v.get(), p.get(), g.get(), beta.get(), B, T, H, K, V, C, o.get(),
                             kept, states, scratch.get(), nullptr);
      break;
    case Core::kda:
      if constexpr (std::is_same_v<E, float>)
        cu::kda_chunk_fwd<P>(q.get(), k.get(), v.get(), g.get(), beta.get(), B, T, H, K, V, C, o.get(), kept,
                             states, scratch.get(), nullptr);
      break;
  }
  std::memset(scratch.get(), 0xff, scratch.n * 4);
  const std::vector<float> kept_after_fwd = tinv.host();
  const Buffer dq(nk), dk(nk), dv(nv), dp(c.comba() ? nk : 1), dg(ng), dbeta(nb);
  switch (c.core) {
    case Core::gdn:
      cu::gdn_chunk_bwd<P>(q.get(), k.get(), v.get(), g.get(), beta.get(), d_o.get(), kept, states, B, T, H, K, V,
                           C, dq.get(), dk.get(), dv.get(), dg.get(), dbeta.get(), scratch.get(), nullptr);
      break;
    case Core::comba:
      cu::comba_chunk_bwd<P>(q.get(), k.get(), v.get(), p.get(), g.get(), beta.get(), d_o.get(), kept, states, B, T,
                             H, K, V, C, dq.get(), dk.get(), dv.get(), dp.get(), dg.get(), dbeta.get(), scratch.get(),
                             nullptr);
      break;
    case Core::kda:
      if constexpr (std::is_same_v<E, float>)
        cu::kda_chunk_bwd<P>(q.get(), k.get(), v.get(), g.get(), beta.get(), d_o.get(), kept, states, B, T, H, K, V,
                             C, dq.get(), dk.get(), dv.get(), dg.get(), dbeta.get(), scratch.get(), nullptr);
      break;
  }
  INFO("the first float of the saved set that the backward changed");
  CHECK(first_difference(kept_after_fwd, tinv.host()) == -1);
  Outputs out;
  out.v = {o.host(), dq.host(), dk.host(), dv.host()};
  if (c.comba()) out.v.push_back(dp.host());
  out.v.push_back(dg.host());
  out.v.push_back(dbeta.host());
  return out;
}
Outputs run_emulated(const Case& c, const Inputs& in, emu::Config cfg, Kept kept) {
  REQUIRE((!c.bf16_in || (c.bf16 && c.core != Core::kda)));  // (bf16 inputs: GDN, Comba with bf16 compute)
  if (c.bf16_in) return run_emulated_as<__nv_bfloat16, __nv_bfloat16>(c, in, cfg, kept);
  return c.bf16 ? run_emulated_as<__nv_bfloat16>(c, in, cfg, kept) : run_emulated_as<float>(c, in, cfg, kept);
}

/// The CPU reference (the CPU backend's: cpu::*_chunk_fwd / bwd<float>, double arithmetic inside).
Outputs run_cpu(const Case& c, const Inputs& in) {
  namespace cpu = llmt::cpu;
  const cpu::DeltaDims d{c.B, c.T, c.H, c.K, c.V};
  std::vector<float> o(in.v.size()), dq(in.q.size()), dk(in.q.size()), dv(in.v.size()), dp(in.p.size()),
      dg(in.g.size()), dbeta(in.beta.size());
  if (c.comba()) {
    const cpu::CombaInputs<float> x{in.q.data(), in.k.data(), in.v.data(), in.p.data(),
                                    in.g.data(), in.beta.data(), nullptr};
    cpu::comba_chunk_fwd<float>(x, d, o.data(), nullptr, c.C);
    const cpu::CombaGrads<float> gr{dq.data(), dk.data(), dv.data(), dp.data(), dg.data(), dbeta.data(), nullptr};
    cpu::comba_chunk_bwd<float>(x, in.d_o.data(), nullptr, d, gr, c.C);
  } else {
    const cpu::GdnInputs<float> x{in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), nullptr};
    const cpu::GdnGrads<float> gr{dq.data(), dk.data(), dv.data(), dg.data(), dbeta.data(), nullptr};
    if (c.core == Core::kda) {
      cpu::kda_chunk_fwd<float>(x, d, o.data(), nullptr, c.C);
      cpu::kda_chunk_bwd<float>(x, in.d_o.data(), nullptr, d, gr, c.C);
    } else {
      cpu::gdn_chunk_fwd<float>(x, d, o.data(), nullptr, c.C);
      cpu::gdn_chunk_bwd<float>(x, in.d_o.data(), nullptr, d, gr, c.C);
    }
  }
  Outputs out;
  out.v = {o, dq, dk, dv};
  if (c.comba()) out.v.push_back(dp);
  out.v.push_back(dg);
  out.v.push_back(dbeta);
  return out;
}

/// Checks (a)-(d) of the header on case c; the backward from the saved set without h and Δ only with tinv_alone (a
/// few small cases: every kernel it instantiates, at one emulator run each).
void check_case(const Case& c, bool tinv_alone = false) {
  INFO(c.tag());
  const Inputs in(c);
  const std::vector<std::string> names = output_names(c);
  const std::vector<std::vector<float>> first = outputs_under_every_config(
      [&](emu::Config cfg) { return run_emulated(c, in, cfg, Kept::states).v; }, names.size(),
      [&](size_t i) { return names[i]; });
  const Outputs recomputed = run_emulated(c, in, kConfigs[0], Kept::none);
  for (size_t i = 0; i < names.size(); ++i) {
    INFO(names[i] << ": the first element whose bits differ between the backward from the saved set and the "
                     "recomputing one");
    CHECK(first_difference(first[i], recomputed.v[i]) == -1);
  }
  if (tinv_alone) {
    const Outputs from_tinv = run_emulated(c, in, kConfigs[0], Kept::tinv);
    for (size_t i = 0; i < names.size(); ++i) {
      INFO(names[i] << ": the first element whose bits differ between the backward from the saved set and the one "
                       "from the saved set without h and Δ");
      CHECK(first_difference(first[i], from_tinv.v[i]) == -1);
    }
  }
  if (c.bf16_in) {  // the bf16 operand tiles hold the same values as from fp32 inputs of the rounded values
    const Outputs f32_in = run_emulated_as<__nv_bfloat16, float>(c, in, kConfigs[0], Kept::states);
    for (size_t i = 0; i < names.size(); ++i) {
      INFO(names[i] << ": the first element whose bits differ between bf16 and fp32 inputs of the same values");
      CHECK(first_difference(first[i], f32_in.v[i]) == -1);
    }
  }
  const Outputs ref = run_cpu(c, in);
  // As the GPU tests: dg against the size of its sibling per-token gradient dβ (dg may cancel to ~0).
  double dbeta_scale = 0.0;
  for (const float x : ref.v.back()) dbeta_scale = std::max(dbeta_scale, std::abs(static_cast<double>(x)));
  for (size_t i = 0; i < ref.v.size(); ++i)
    require_close(first[i], ref.v[i], names[i], c.tol(), names[i] == "dg" ? dbeta_scale : 1e-30);
}

}  // namespace

TEST_CASE("cuda emu: bf16 GDN core, K = V = 64 and partial key / value tiles (K = 100, V = 96), ragged last chunk",
          "[emu][gdn]") {
  check_case({Core::gdn, true, 1, 130, 2, 64, 64, 64, -0.05, 100}, true);
  check_case({Core::gdn, true, 1, 130, 2, 100, 96, 64, -1.0, 200});
}

TEST_CASE("cuda emu: bf16 GDN core, K = 256, V = 128 (four key tiles, two value tiles), ragged last chunk",
          "[emu][gdn]") {
  check_case({Core::gdn, true, 1, 130, 1, 256, 128, 64, -0.05, 1250});
}

TEST_CASE("cuda emu: bf16 GDN core, K = 192, V = 64 (three key tiles: the backward scan's staging ring, its one W "
          "buffer waited for before the update), ragged last chunk",
          "[emu][gdn]") {
  check_case({Core::gdn, true, 1, 130, 1, 192, 64, 64, -1.0, 1700});
}

TEST_CASE("cuda emu: bf16 Comba core, K = V = 64 and partial key / value tiles (K = 100, V = 96), ragged last chunk",
          "[emu][comba]") {
  check_case({Core::comba, true, 1, 130, 2, 64, 64, 64, -1.0, 300}, true);
  check_case({Core::comba, true, 1, 130, 2, 100, 96, 64, -0.05, 400});
}

TEST_CASE("cuda emu: bf16 KDA core, K = V = 64 and partial key / value tiles (K = 100, V = 96), ragged last chunk",
          "[emu][kda]") {
  check_case({Core::kda, true, 1, 130, 2, 64, 64, 64, -0.05, 500}, true);
  check_case({Core::kda, true, 1, 130, 2, 100, 96, 64, -1.0, 600});
}

TEST_CASE("cuda emu: bf16 KDA core at the model's head size, K = V = 128, moderate and strong decay (g down to -20 "
          "per channel: e^{Γ} underflows inside a sub-chunk), ragged last chunk",
          "[emu][kda]") {
  check_case({Core::kda, true, 1, 130, 1, 128, 128, 64, -1.0, 650});
  check_case({Core::kda, true, 1, 130, 1, 128, 128, 64, -20.0, 660});
}

TEST_CASE("cuda emu: KDA core with chunk 13, K = 40, V = 33, three heads (the saved Δ of 3 x 130 x 33 floats: h's "
          "region after it padded to 16 bytes), bf16 and fp32 compute",
          "[emu][kda]") {
  check_case({Core::kda, true, 1, 130, 3, 40, 33, 13, -2.0, 670}, true);
  check_case({Core::kda, false, 1, 130, 3, 40, 33, 13, -2.0, 680}, true);
}

TEST_CASE("cuda emu: fp32 GDN, Comba and KDA cores (tile::Simt), K = 100, V = 96, ragged last chunk",
          "[emu][gdn][comba][kda]") {
  check_case({Core::gdn, false, 1, 130, 2, 100, 96, 64, -1.0, 700}, true);
  check_case({Core::comba, false, 1, 130, 2, 100, 96, 64, -0.05, 800}, true);
  check_case({Core::kda, false, 1, 130, 2, 100, 96, 64, -1.0, 900}, true);
}

TEST_CASE("cuda emu: bf16 GDN and Comba cores with a key_dim beyond the Mma scans (K = 320: the tile::Tc scans)",
          "[emu][gdn][comba]") {
  check_case({Core::gdn, true, 1, 130, 1, 320, 64, 64, -1.0, 1000});
  check_case({Core::comba, true, 1, 130, 1, 320, 64, 64, -0.05, 1100});
}

TEST_CASE("cuda emu: bf16 GDN and Comba cores at the benchmarks' tiling K = V = 128, ragged last chunk",
          "[emu][gdn][comba]") {
  check_case({Core::gdn, true, 1, 130, 1, 128, 128, 64, -1.0, 1200});
  check_case({Core::comba, true, 1, 130, 1, 128, 128, 64, -0.05, 1300});
}

TEST_CASE("cuda emu: bf16 GDN and Comba cores at the benchmarks' tiling K = 256, V = 512, ragged last chunk",
          "[emu][gdn][comba]") {
  check_case({Core::gdn, true, 1, 130, 1, 256, 512, 64, -0.05, 1400});
  check_case({Core::comba, true, 1, 130, 1, 256, 512, 64, -1.0, 1500});
}

TEST_CASE("cuda emu: bf16 GDN core with rows that are not 16-byte aligned (K = 61, V = 60: no cp.async in dqk, "
          "scalar stores)",
          "[emu][gdn]") {
  check_case({Core::gdn, true, 1, 130, 2, 61, 60, 64, -1.0, 1600});
}

// bf16 q, k, v (and Comba's p̂) in memory (FLA's inputs), against the reference on the same bf16-rounded values.
TEST_CASE("cuda emu: bf16 GDN and Comba cores with bf16 q, k, v, p̂: K = V = 64, and K = 100, V = 96 (rows not "
          "16-byte aligned in bf16: the synchronous loads), ragged last chunk",
          "[emu][gdn][comba][bf16_in]") {
  check_case({Core::gdn, true, 1, 130, 1, 64, 64, 64, -0.05, 1800, true}, true);
  check_case({Core::comba, true, 1, 130, 1, 64, 64, 64, -1.0, 1810, true}, true);
  check_case({Core::gdn, true, 1, 130, 1, 100, 96, 64, -1.0, 1820, true});
  check_case({Core::comba, true, 1, 130, 1, 100, 96, 64, -0.05, 1830, true});
}

TEST_CASE("cuda emu: bf16 GDN and Comba cores with bf16 q, k, v, p̂ at the benchmarks' tiling K = V = 128, ragged "
          "last chunk",
          "[emu][gdn][comba][bf16_in]") {
  check_case({Core::gdn, true, 1, 130, 1, 128, 128, 64, -1.0, 1840, true});
  check_case({Core::comba, true, 1, 130, 1, 128, 128, 64, -0.05, 1850, true});
}

TEST_CASE("cuda emu: bf16 GDN and Comba cores with bf16 q, k, v, p̂ at the benchmarks' tiling K = 256, V = 512, "
          "ragged last chunk",
          "[emu][gdn][comba][bf16_in]") {
  check_case({Core::gdn, true, 1, 130, 1, 256, 512, 64, -0.05, 1860, true});
  check_case({Core::comba, true, 1, 130, 1, 256, 512, 64, -1.0, 1870, true});
}

TEST_CASE("cuda emu: bf16 GDN and Comba cores with bf16 q, k, v, p̂: K = 192 (the backward scan's staging ring), "
          "K = 320 (the tile::Tc scans)",
          "[emu][gdn][comba][bf16_in]") {
  check_case({Core::gdn, true, 1, 130, 1, 192, 64, 64, -1.0, 1880, true});
  check_case({Core::comba, true, 1, 130, 1, 320, 64, 64, -0.05, 1890, true});
}

TEST_CASE("cuda emu: bf16 GDN core with bf16 q, k, v: K = 320, V = 128 (wu's X K^T beyond the four k tiles of F3's "
          "cp.async ring, six operand tiles through the ring, also in the backward's wu from a saved 𝒯)",
          "[emu][gdn][bf16_in]") {
  check_case({Core::gdn, true, 1, 130, 1, 320, 128, 64, -1.0, 1900, true}, true);
}
