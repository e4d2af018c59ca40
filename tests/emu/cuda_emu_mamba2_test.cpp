// The Mamba2 SSD core (src/kernels/cuda/mamba2.cu) run by the CPU emulator (cuda_emu.h) through its own launchers,
// no GPU: mamba2_ssd_fwd, then mamba2_ssd_bwd (recomputing the chunk states), then both again with a saved set (the
// forward's chunk states kept for the backward), on small shapes whose last 64-token kernel chunk is ragged (T = 130:
// chunks of 64, 64 and 2 tokens), P = N = 128 (two tiles each), partial P / N tiles and 1, 2 or 4 heads a group
// (the output kernel's heads a block). bf16 compute (tile::Mma:
// ldmatrix / mma.sync; cp.async for the state scan's staged u, v tiles, the output kernel's staged C, B tiles and the
// S_in / dS rings, and the synchronous loads where rows are not 16-byte aligned, N = 70) and fp32 compute
// (tile::Simt: the chunk contributions and their scan); bf16 compute also with bf16 xbc and dy in memory (the
// official kernels' inputs: rounded copies of the fp32 draws, the reference run on the same rounded values): the
// operand tiles copied by cp.async as they are (the state scan's two tile pairs, u scaled in place; the output
// kernel's C, B and x tiles; the backward chunk kernel's kept operands) where P, N are multiples of 8, else the
// synchronous loads (N = 70; P = 20: kept operands loaded through registers). Every output must be
// (a) finite and bit-identical under every schedule and cp.async mode of the emulator (a race, a missing barrier
//     or a missing cp.async wait changes bits under some schedule or mode);
// (b) with the saved set bit-identical to the recompute;
// (c) within the GPU test's tolerance of the CPU reference (cpu::mamba2_ssd_fwd / bwd<float>, double arithmetic,
//     at the layer's chunk_size: the model's 256 or 64; the kernels chunk by 64 whatever it is): kBf16CoreTol with
//     bf16 compute, the per-head sums ddt_bias, dA_log, dD against head_sum_scales; kTol with fp32 compute
//     (tests/cuda_mamba2_test.cpp check_ssd; cuda_test_host.h);
// (d) with bf16 xbc, dy (and so bf16 y, dxbc): y and dxbc the run's on fp32 inputs holding the same (bf16-rounded)
//     values rounded to bf16 once, every other output bit-identical to that run's.
// Run with `ctest -L emu`; docs/ARCHITECTURE.md (Verification) says what this can and cannot catch.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../cuda_test_host.h"
#include "../mamba2_head_sums.h"
#include "cuda_emu.h"
#include "cuda_emu_test.h"
#include "kernels/cpu/mamba2.h"
#include "kernels/cuda/ops.cuh"

using namespace llmt::test;
using namespace llmt::test::emu_test;

namespace {

const char* const kNames[] = {"y",         "dxbc",         "ddt_raw",         "ddt_bias",         "dA_log",
                              "dD",        "y (saved)",    "dxbc (saved)",    "ddt_raw (saved)",  "ddt_bias (saved)",
                              "dA_log (saved)",            "dD (saved)"};
constexpr size_t kOutputs = 6;  // of each pass (the names of the second: kNames[kOutputs + i])

struct Case {
  bool bf16;  // compute dtype: bf16 (tile::Mma) or fp32 (tile::Simt)
  int64_t B, T, H, P, N, G;
  int64_t chunk;            // the CPU reference's chunk_size
  double bias_lo, bias_hi;  // dt_bias uniform in [bias_lo, bias_hi)
  uint64_t seed;
  bool bf16_in = false;  // (bf16 compute) xbc and dy given to the core in bf16
  int segments = 0;      // the cores' scan_segments (0: their choice from the emulated device's 132 SMs)
  int64_t XD() const { return H * P; }
  int64_t W() const { return H * P + 2 * G * N; }
  std::string tag() const {
    return std::string(bf16 ? "(bf16" : "(fp32") + " compute" + (bf16_in ? ", bf16 xbc, dy" : "") +
           ") B=" + std::to_string(B) + " T=" + std::to_string(T) +
           " H=" + std::to_string(H) + " P=" + std::to_string(P) + " N=" + std::to_string(N) +
           " G=" + std::to_string(G) + " chunk=" + std::to_string(chunk) + " dt_bias in [" +
           std::to_string(bias_lo) + ", " + std::to_string(bias_hi) + ") scan_segments=" + std::to_string(segments);
  }
};
// check_ssd's decay regimes: Mamba's init (Δ around 0.02) and strong decays (Δ around 1.3: a token's decay down to
// ~1e-9, chunk-level exponents underflow); -A in [1, 16) for both. kWeak (Δ around 3e-4: a 64-token chunk decays the
// state by e^Γ ≈ 0.7-1) keeps the state passing S_out += e^Γ S_in, and so the <dS, S_in> term of dA_log / ddt_bias,
// large enough for the tolerance to see (with kMild / kStrong, e^Γ < 1e-3 and dropping that term passes).
constexpr double kMild[2] = {-5.0, -3.0}, kStrong[2] = {0.5, 1.5}, kWeak[2] = {-9.0, -7.0};

/// Inputs distributed as check_ssd's (the same streams; the uniform draws from cuda_test_host.h's generator): xbc,
/// dt_raw, D, dy normal; dt_bias uniform in the case's range; -A = exp(A_log) uniform in [1, 16); the accumulated
/// gradients ddt_bias, dA_log, dD start from normal values. With c.bf16_in, xbc and dy rounded to bf16 (the core's
/// inputs and the reference's alike).
struct Inputs {
  std::vector<float> xbc, dt_raw, dt_bias, A_log, D, dy, acc0;
  explicit Inputs(const Case& c) {
    const size_t rows = c.B * c.T;
    xbc = randn(rows * c.W(), c.seed + 1);
    dt_raw = randn(rows * c.H, c.seed + 2);
    dt_bias = uniform(c.H, c.seed + 3, c.bias_lo, c.bias_hi);
    A_log = uniform(c.H, c.seed + 4, 1.0, 16.0);
    for (float& e : A_log) e = static_cast<float>(std::log(static_cast<double>(e)));
    D = randn(c.H, c.seed + 5);
    dy = randn(rows * c.XD(), c.seed + 7);
    acc0 = randn(3 * c.H, c.seed + 10);
    if (c.bf16_in)
      for (std::vector<float>* x : {&xbc, &dy}) *x = round_bf16(*x);
  }
  std::vector<float> acc(int i, int64_t H) const {  // the initial ddt_bias (0), dA_log (1), dD (2)
    return std::vector<float>(acc0.begin() + i * H, acc0.begin() + (i + 1) * H);
  }
};

/// The forward, then the backward, in the emulator under `cfg`, twice: without a saved set (the backward recomputes
/// the chunk states), then with one (kept from the forward); y, dxbc, ddt_raw, the scratch and the saved set start
/// as NaN, the scratch again before each call. The outputs of both passes, in that order; with `states`, also the
/// saved set's chunk states after the forward (P = bf16: as floats). E: the element type of xbc and dy, y and dxbc.
template <typename P, typename E = float>
std::vector<std::vector<float>> run_emulated_as(const Case& c, const Inputs& in, emu::Config cfg,
                                                std::vector<float>* states = nullptr) {
  namespace cu = llmt::cuda;
  emu::config = cfg;
  const size_t rows = c.B * c.T;
  const Input<E> xbc(in.xbc), dy(in.dy);
  const Buffer dt_raw(in.dt_raw), dt_bias(in.dt_bias), A_log(in.A_log), D(in.D);
  Buffer scratch(std::max(cu::mamba2_ssd_fwd_scratch_bytes<P>(c.B, c.T, c.H, c.P, c.N, false, c.segments),
                          cu::mamba2_ssd_bwd_scratch_bytes<P>(c.B, c.T, c.H, c.P, c.N, false, c.segments)) / 4 + 1);
  const size_t saved_bytes = cu::mamba2_ssd_saved_bytes<P>(c.B, c.T, c.H, c.P, c.N);
  const Buffer saved(saved_bytes / 4 + 1);
  std::vector<std::vector<float>> out;
  for (float* sv : {static_cast<float*>(nullptr), saved.get()}) {
    const Output<E> y(rows * c.XD());
    std::memset(scratch.get(), 0xff, scratch.n * 4);
    cu::mamba2_ssd_fwd<P>(xbc.get(), dt_raw.get(), dt_bias.get(), A_log.get(), D.get(), c.B, c.T, c.H, c.P, c.N,
                          c.G, y.get(), sv, scratch.get(), nullptr, c.segments);
    if (sv != nullptr && states != nullptr) {
      states->resize(saved_bytes / sizeof(P));
      for (size_t i = 0; i < states->size(); ++i) {
        if constexpr (std::is_same_v<P, float>)
          (*states)[i] = sv[i];
        else
          (*states)[i] = bf16_value(reinterpret_cast<const uint16_t*>(sv)[i]);
      }
    }
    std::memset(scratch.get(), 0xff, scratch.n * 4);
    const Output<E> dxbc(rows * c.W());
    const Buffer ddt_raw(rows * c.H), ddt_bias(in.acc(0, c.H)), dA_log(in.acc(1, c.H)), dD(in.acc(2, c.H));
    cu::mamba2_ssd_bwd<P>(dy.get(), xbc.get(), dt_raw.get(), dt_bias.get(), A_log.get(), D.get(), c.B, c.T, c.H,
                          c.P, c.N, c.G, sv, dxbc.get(), ddt_raw.get(), ddt_bias.get(), dA_log.get(), dD.get(),
                          scratch.get(), nullptr, c.segments);
    out.push_back(y.host());
    out.push_back(dxbc.host());
    for (const Buffer* b : {&ddt_raw, &ddt_bias, &dA_log, &dD}) out.push_back(b->host());
  }
  return out;
}

/// The CPU reference (the CPU backend's: cpu::mamba2_ssd_fwd / bwd<float>, double arithmetic inside).
std::vector<std::vector<float>> run_cpu(const Case& c, const Inputs& in) {
  const llmt::cpu::Mamba2Dims d{c.B, c.T, c.H, c.P, c.N, c.G};
  const size_t rows = c.B * c.T;
  std::vector<float> y(rows * c.XD()), dxbc(rows * c.W()), ddt_raw(rows * c.H), ddt_bias = in.acc(0, c.H),
      dA_log = in.acc(1, c.H), dD = in.acc(2, c.H);
  llmt::cpu::mamba2_ssd_fwd<float>(in.xbc.data(), in.dt_raw.data(), in.dt_bias.data(), in.A_log.data(), in.D.data(),
                                   d, c.chunk, y.data());
  llmt::cpu::mamba2_ssd_bwd<float>(in.dy.data(), in.xbc.data(), in.dt_raw.data(), in.dt_bias.data(),
                                   in.A_log.data(), in.D.data(), d, c.chunk, dxbc.data(), ddt_raw.data(),
                                   ddt_bias.data(), dA_log.data(), dD.data());
  return {y, dxbc, ddt_raw, ddt_bias, dA_log, dD};
}

void check_case(const Case& c) {
  INFO(c.tag());
  REQUIRE((!c.bf16_in || c.bf16));  // (bf16 inputs: bf16 compute only)
  const Inputs in(c);
  const std::vector<std::vector<float>> first = outputs_under_every_config(
      [&](emu::Config cfg) {
        if (c.bf16_in) return run_emulated_as<__nv_bfloat16, __nv_bfloat16>(c, in, cfg);
        return c.bf16 ? run_emulated_as<__nv_bfloat16>(c, in, cfg) : run_emulated_as<float>(c, in, cfg);
      },
      2 * kOutputs, [](size_t i) { return kNames[i]; });
  for (size_t i = 0; i < kOutputs; ++i) {
    INFO(kNames[kOutputs + i] << ": the first element whose bits differ from the recompute's");
    CHECK(first_difference(first[i], first[kOutputs + i]) == -1);
  }
  if (c.bf16_in) {  // the bf16 operand tiles hold the same values as from fp32 inputs of the rounded values; y and
                    // dxbc (bf16) are those fp32 runs' values rounded once
    const std::vector<std::vector<float>> f32_in = run_emulated_as<__nv_bfloat16>(c, in, kConfigs[0]);
    for (size_t i = 0; i < 2 * kOutputs; ++i) {
      const bool rounded = i % kOutputs < 2;  // y, dxbc
      INFO(kNames[i] << ": the first element whose bits differ between bf16 and fp32 inputs of the same values"
                     << (rounded ? " (the fp32 run's rounded to bf16)" : ""));
      CHECK(first_difference(first[i], rounded ? round_bf16(f32_in[i]) : f32_in[i]) == -1);
    }
  }
  const std::vector<std::vector<float>> ref = run_cpu(c, in);
  const double tol = c.bf16 ? kBf16CoreTol : kTol;
  const HeadSumScales floor = c.bf16 ? head_sum_scales(c.B * c.T, c.H, c.P, c.W(), in.xbc, in.dt_raw, in.dt_bias,
                                                       in.D, in.dy, ref[1], ref[2])
                                     : HeadSumScales{1e-30, 1e-30, 1e-30};
  const double floors[kOutputs] = {1e-30, 1e-30, 1e-30, floor.dt_bias, floor.A_log, floor.D};
  for (size_t i = 0; i < kOutputs; ++i) require_close(first[i], ref[i], kNames[i], tol, floors[i]);
}

// A bf16 case with segmented state scans (c.segments > 1, or 0 where the emulated device picks more than one)
// checked as check_case does, then against the same case scanned in one walk (scan_segments = 1), on the reference
// configuration: y, dxbc, ddt_raw within the CPU tolerance of the one walk's, and the forward's chunk states (the
// saved set) within 2^-6 of their largest magnitude M: a state's part from within its segment is rounded to bf16 by
// the scan and the sum once more by the fix-up (half an ulp, at most 2^-8 relative, of values up to 2 M and M), the
// one walk's once (M 2^-8): 4 x 2^-8 in all.
void check_segmented(const Case& c) {
  REQUIRE((c.bf16 && c.segments != 1));
  check_case(c);
  INFO(c.tag());
  const Inputs in(c);
  Case one = c;
  one.segments = 1;
  const auto run = [&](const Case& k, std::vector<float>* states) {
    return k.bf16_in ? run_emulated_as<__nv_bfloat16, __nv_bfloat16>(k, in, kConfigs[0], states)
                     : run_emulated_as<__nv_bfloat16>(k, in, kConfigs[0], states);
  };
  std::vector<float> states, states_one;
  const std::vector<std::vector<float>> seg = run(c, &states), whole = run(one, &states_one);
  for (size_t i = 0; i < 3; ++i)
    require_close(seg[i], whole[i], std::string(kNames[i]) + ": segmented vs one walk", kBf16CoreTol);
  require_close(states, states_one, "the forward's chunk states: segmented vs one walk", 0x1p-6);
}

}  // namespace

TEST_CASE("cuda emu: bf16 Mamba2 SSD, P = N = 128, ragged last chunk (CPU chunk 256)", "[emu][mamba2]") {
  check_case({true, 1, 130, 2, 128, 128, 1, 256, kMild[0], kMild[1], 100});
}

TEST_CASE("cuda emu: bf16 Mamba2 SSD, partial P / N tiles (P = 80, N = 72 and P = 16, N = 70), chunk 64",
          "[emu][mamba2]") {
  check_case({true, 1, 130, 2, 80, 72, 2, 64, kStrong[0], kStrong[1], 200});
  check_case({true, 1, 130, 2, 16, 70, 1, 64, kMild[0], kMild[1], 310});
}

TEST_CASE("cuda emu: bf16 Mamba2 SSD, 4 heads a group (the output kernel's 4 heads a block), chunk 64",
          "[emu][mamba2]") {
  check_case({true, 1, 130, 4, 64, 128, 1, 64, kMild[0], kMild[1], 500});
}

TEST_CASE("cuda emu: fp32 Mamba2 SSD (tile::Simt), P = 80, N = 72, ragged last chunk", "[emu][mamba2]") {
  check_case({false, 1, 130, 2, 80, 72, 2, 256, kStrong[0], kStrong[1], 400});
}

TEST_CASE("cuda emu: Mamba2 SSD with weak decay (the chunk-to-chunk state term), bf16 and fp32", "[emu][mamba2]") {
  check_case({true, 1, 200, 2, 64, 128, 1, 64, kWeak[0], kWeak[1], 600});
  check_case({false, 1, 200, 2, 80, 72, 2, 256, kWeak[0], kWeak[1], 700});
}

// bf16 xbc and dy in memory (the official kernels' inputs), against the reference on the same bf16-rounded values.
TEST_CASE("cuda emu: bf16 Mamba2 SSD with bf16 xbc, dy: P = N = 128, ragged last chunk (CPU chunk 256)",
          "[emu][mamba2][bf16_in]") {
  check_case({true, 1, 130, 2, 128, 128, 1, 256, kMild[0], kMild[1], 1200, true});
}

TEST_CASE("cuda emu: bf16 Mamba2 SSD with bf16 xbc, dy: partial P / N tiles (P = 80, N = 72), 4 heads a group at "
          "P = 64 (one P tile), P = N = 64 (one tile each, T = 200: the state scan's tile pairs each used twice), "
          "chunk 64",
          "[emu][mamba2][bf16_in]") {
  check_case({true, 1, 130, 2, 80, 72, 2, 64, kStrong[0], kStrong[1], 1300, true});
  check_case({true, 1, 130, 4, 64, 128, 1, 64, kMild[0], kMild[1], 1400, true});
  check_case({true, 1, 200, 2, 64, 64, 1, 64, kStrong[0], kStrong[1], 1500, true});
}

// Rows that are not 16-byte aligned (P = 20, N = 70: W = 180): the synchronous loads of the bf16 inputs, and y, dx
// and the dB, dC sums stored element by element in bf16 (no 16-byte pieces).
TEST_CASE("cuda emu: bf16 Mamba2 SSD with bf16 xbc, dy: rows not 16-byte aligned (P = 20, N = 70), bf16 y, dxbc "
          "element by element",
          "[emu][mamba2][bf16_in]") {
  check_case({true, 1, 130, 2, 20, 70, 1, 64, kMild[0], kMild[1], 1600, true});
}

// Long sequences with few scan blocks: the state scans walk segments of the chunks in parallel, then a fix-up adds the
// states entering them (two-level scan). T = 1026: 17 chunks, the last of 2 tokens; B H PT NT = 2 scan blocks, so the
// emulated device's 132 SMs pick 2 segments (of 9 and 8 chunks: at least 8 each); forced, at T = 642 (11 chunks): 4
// (3, 3, 3, 2) and 11 (a segment per chunk); weak decay (e^Γ ≈ 0.7-1 a chunk: the entering states matter across whole
// segments) and strong.
TEST_CASE("cuda emu: bf16 Mamba2 SSD, segmented state scans: the SM count's choice (2 segments), bf16 xbc, dy",
          "[emu][mamba2][segments]") {
  namespace cu = llmt::cuda;
  const Case c{true, 1, 1026, 2, 64, 64, 1, 64, kWeak[0], kWeak[1], 1800, true};
  for (const bool saved : {false, true}) {  // (the automatic choice is 2: its scratch is that of 2 forced)
    const size_t fwd = cu::mamba2_ssd_fwd_scratch_bytes<__nv_bfloat16>(c.B, c.T, c.H, c.P, c.N, saved);
    const size_t bwd = cu::mamba2_ssd_bwd_scratch_bytes<__nv_bfloat16>(c.B, c.T, c.H, c.P, c.N, saved);
    CHECK(fwd == cu::mamba2_ssd_fwd_scratch_bytes<__nv_bfloat16>(c.B, c.T, c.H, c.P, c.N, saved, 2));
    CHECK(bwd == cu::mamba2_ssd_bwd_scratch_bytes<__nv_bfloat16>(c.B, c.T, c.H, c.P, c.N, saved, 2));
    CHECK(fwd > cu::mamba2_ssd_fwd_scratch_bytes<__nv_bfloat16>(c.B, c.T, c.H, c.P, c.N, saved, 1));
  }
  check_segmented(c);
}

TEST_CASE("cuda emu: bf16 Mamba2 SSD, segmented state scans forced to 4 segments: partial tiles P = 80, N = 72, fp32 "
          "xbc, dy, strong decay",
          "[emu][mamba2][segments]") {
  check_segmented({true, 1, 642, 1, 80, 72, 1, 64, kStrong[0], kStrong[1], 1900, false, 4});
}

TEST_CASE("cuda emu: bf16 Mamba2 SSD, segmented state scans forced to a segment per chunk: N = 70, one element a "
          "fix-up thread, weak decay",
          "[emu][mamba2][segments]") {
  check_segmented({true, 1, 642, 1, 16, 70, 1, 64, kWeak[0], kWeak[1], 2000, false, 11});
}
