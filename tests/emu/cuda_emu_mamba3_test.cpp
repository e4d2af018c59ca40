// The Mamba-3 layer op (src/kernels/cuda/mamba3.cu and mamba3_prep.cu, mamba3_core.cu, mamba3_gate.cu) run by the
// CPU emulator (cuda_emu.h) through its own launchers (mamba3_fwd, mamba3_bwd), no GPU: the forward, then the
// backward recomputing the core's forward, then the forward writing the saved set (model.mamba3.save_states) and the
// backward reading it; small shapes with a ragged last chunk (T not a multiple of 64 / R), SISO and MIMO (R = 2, 4),
// with and without the output norm, one and two B/C groups, bf16 products (the tensor-core kernels) and fp32, and
// bf16 activations (x, z, dout in, out, dx, dz out: ops.cuh mamba3_fwd<__nv_bfloat16>, with bf16 products). Every
// output (out, dx, dz, dbc, draw and every parameter gradient) must be
// (a) finite and bit-identical under every schedule and cp.async mode of the emulator (a race, a missing barrier
//     or a missing cp.async wait changes bits under some schedule or mode);
// (b) bit-identical between the backward that recomputes the core's forward and the one reading the saved set;
// (c) within the GPU test's tolerance of the CPU reference (cpu::mamba3_layer_fwd / bwd, double arithmetic):
//     kTol with fp32 products, 2e-2 with bf16 products, d dt_bias then against the root-sum-square of its per-token
//     terms (tests/cuda_mamba3_test.cpp check_mamba3);
// (d) with bf16 activations (inputs x, z, dout rounded to bf16 first, on both sides): out, dx, dz the fp32-activation
//     run's on the same rounded values, rounded to bf16, and every other output bit-identical to it (the kernels
//     read the bf16 values as the fp32 ones and round the fp32 results once on their store).
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
#include "../mamba3_case.h"
#include "cuda_emu.h"
#include "cuda_emu_test.h"
#include "kernels/cpu/mamba3_layer.h"
#include "kernels/cuda/ops.cuh"

using namespace llmt::test;
using namespace llmt::test::emu_test;

namespace {

constexpr double kBf16Tol = 2e-2;  // tests/cuda_mamba3_test.cpp

/// The CPU reference's layer sizes of case c.
llmt::cpu::Mamba3LayerDims dims(const Case& c) { return {c.B, c.T, c.H, c.P, c.N, c.G, c.R, c.S}; }

/// The inputs (as tests/cuda_mamba3_util.h make_params: dt_bias uniform in [c.bias_lo, c.bias_hi), the other parameters
/// around their centres) and the parameter gradients' start values. params: dt_bias, B_bias, C_bias, B_norm,
/// C_norm, D, [mimo_x, mimo_z, mimo_o], [norm].
struct Inputs {
  std::vector<float> x, z, bc, raw, dout;
  std::vector<std::vector<float>> params, grads;
  std::vector<std::string> names;
  explicit Inputs(const Case& c) {
    const size_t BT = c.B * c.T, HP = c.H * c.P, W = 3 * c.H + c.S, BC = 2 * c.R * c.G * c.N;
    const uint64_t s = c.seed * 100;
    x = randn(BT * HP, s + 1);
    z = randn(BT * HP, s + 2);
    bc = randn(BT * BC, s + 3);
    raw = randn(BT * W, s + 4);
    dout = randn(BT * HP, s + 6);
    const size_t RN = c.H * c.R * c.N, RP = c.H * c.R * c.P;
    params = {uniform(c.H, s + 10, c.bias_lo, c.bias_hi), around(RN, 1.0, s + 11), around(RN, 1.0, s + 12),
              around(c.N, 1.0, s + 13), around(c.N, 1.0, s + 14), around(c.H, 1.0, s + 15)};
    names = {"dt_bias", "B_bias", "C_bias", "B_norm", "C_norm", "D"};
    if (c.R > 1) {
      const double R = static_cast<double>(c.R);
      params.push_back(around(RP, 1.0 / R, s + 16));
      params.push_back(around(RP, 1.0, s + 17));
      params.push_back(around(RP, 1.0 / R, s + 18));
      names.insert(names.end(), {"mimo_x", "mimo_z", "mimo_o"});
    }
    if (c.norm) {
      params.push_back(around(HP, 1.0, s + 19));
      names.push_back("norm");
    }
    for (size_t i = 0; i < params.size(); ++i) grads.push_back(randn(params[i].size(), s + 40 + i, 0.1));
  }
  /// The parameter list p as Mamba3Ptrs / Mamba3GradPtrs (Out; nullptr for an absent mimo_* or norm).
  template <typename Out, typename T>
  static Out ordered(const std::vector<T>& p, bool mimo, bool norm) {
    const size_t m = 6, n = mimo ? 9 : 6;
    return {p[0], p[1], p[2], p[3], p[4], p[5], mimo ? p[m] : nullptr, mimo ? p[m + 1] : nullptr,
            mimo ? p[m + 2] : nullptr, norm ? p[n] : nullptr};
  }
};

std::vector<std::string> output_names(const Inputs& in) {
  std::vector<std::string> n = {"out", "dx", "dz", "dbc", "draw"};
  for (const std::string& p : in.names) n.push_back("d" + p);
  return n;
}

/// out, dx, dz, dbc, draw, the parameter gradients: the forward and the backward in the emulator under `cfg`,
/// with the saved set (saved: the forward writes it, the backward reads it) or without (the backward recomputes
/// the core's forward); overwritten outputs and the scratch start as NaN. A: the activations' element type (x, z,
/// dout as Input<A>: bf16 ones hold in's values rounded; out, dx, dz written in A).
template <typename A = float>
std::vector<std::vector<float>> run_emulated(const Case& c, const Inputs& in, bool saved, emu::Config cfg) {
  namespace cu = llmt::cuda;
  emu::config = cfg;
  const llmt::cpu::Mamba3LayerDims d = dims(c);
  const llmt::Mamba3Options opt = c.options();
  const Input<A> x(in.x), z(in.z), dout(in.dout);
  const Buffer bc(in.bc), raw(in.raw);
  std::vector<Buffer> prm, grd;
  for (const auto& p : in.params) prm.emplace_back(p);
  for (const auto& g : in.grads) grd.emplace_back(g);
  auto ptrs = [&](const std::vector<Buffer>& b) {
    std::vector<float*> p;
    for (const Buffer& e : b) p.push_back(e.get());
    return p;
  };
  const std::vector<float*> pp = ptrs(prm), gp = ptrs(grd);
  const bool mimo = c.R > 1;
  const std::vector<const float*> cp(pp.begin(), pp.end());
  const auto P = Inputs::ordered<cu::Mamba3Ptrs>(cp, mimo, c.norm);
  const auto Gr = Inputs::ordered<cu::Mamba3GradPtrs>(gp, mimo, c.norm);
  const size_t scratch_bytes =
      std::max(cu::mamba3_fwd_scratch_bytes(d, opt, saved), cu::mamba3_bwd_scratch_bytes(d, opt, saved));
  Buffer scratch(scratch_bytes / 4 + 1);
  Buffer keep(saved ? cu::mamba3_saved_bytes(d, opt) / 4 + 1 : 1);
  float* kept = saved ? keep.get() : nullptr;
  const Output<A> out(in.x.size());
  cu::mamba3_fwd<A>(x.get(), z.get(), bc.get(), raw.get(), P, d, opt, out.get(), kept, scratch.get(), nullptr);
  std::memset(scratch.get(), 0xff, scratch.n * 4);
  const Output<A> dx(in.x.size()), dz(in.z.size());
  const Buffer dbc(in.bc.size()), draw(in.raw.size());
  cu::mamba3_bwd<A>(dout.get(), x.get(), z.get(), bc.get(), raw.get(), kept, P, d, opt, dx.get(), dz.get(),
                    dbc.get(), draw.get(), Gr, scratch.get(), nullptr);
  std::vector<std::vector<float>> o = {out.host(), dx.host(), dz.host(), dbc.host(), draw.host()};
  for (const Buffer& g : grd) o.push_back(g.host());
  return o;
}

/// The CPU reference (cpu::mamba3_layer_fwd / bwd<float>, double arithmetic inside), same outputs.
std::vector<std::vector<float>> run_cpu(const Case& c, const Inputs& in) {
  namespace cpu = llmt::cpu;
  const bool mimo = c.R > 1;
  std::vector<const float*> pp;
  for (const auto& p : in.params) pp.push_back(p.data());
  std::vector<std::vector<float>> g = in.grads;
  std::vector<float*> gp;
  for (auto& e : g) gp.push_back(e.data());
  const size_t m = 6, n = mimo ? 9 : 6;
  const cpu::Mamba3LayerParams<float> prm{{pp[0], pp[1], pp[2], pp[3], pp[4]},
                                          pp[5],
                                          mimo ? pp[m] : nullptr,
                                          mimo ? pp[m + 1] : nullptr,
                                          mimo ? pp[m + 2] : nullptr,
                                          c.norm ? pp[n] : nullptr};
  const cpu::Mamba3LayerGrads<float> grd{{gp[0], gp[1], gp[2], gp[3], gp[4]},
                                         gp[5],
                                         mimo ? gp[m] : nullptr,
                                         mimo ? gp[m + 1] : nullptr,
                                         mimo ? gp[m + 2] : nullptr,
                                         c.norm ? gp[n] : nullptr};
  std::vector<float> out(in.x.size()), dx(in.x.size()), dz(in.z.size()), dbc(in.bc.size()), draw(in.raw.size());
  cpu::mamba3_layer_fwd<float>(in.x.data(), in.z.data(), in.bc.data(), in.raw.data(), prm, dims(c), c.options(),
                               out.data());
  cpu::mamba3_layer_bwd<float>(in.dout.data(), in.x.data(), in.z.data(), in.bc.data(), in.raw.data(), prm, dims(c),
                               c.options(), dx.data(), dz.data(), dbc.data(), draw.data(), grd);
  std::vector<std::vector<float>> o = {out, dx, dz, dbc, draw};
  for (auto& e : g) o.push_back(std::move(e));
  return o;
}

/// Checks (a)-(c) for sizes B..S, the output norm, bf16 products and the inputs' seed; with bf16_acts (bf16 products
/// only) the activations in bf16 and (d).
void check_case(int64_t B, int64_t T, int64_t H, int64_t P, int64_t N, int64_t G, int64_t R, int64_t S, bool norm,
                bool bf16, uint64_t seed, bool bf16_acts = false) {
  Case c{B, T, H, P, N, G, R, S, norm};
  c.bf16 = bf16;
  c.seed = seed;
  INFO(c.tag() << (bf16_acts ? " bf16 activations" : ""));
  Inputs in(c);
  if (bf16_acts)
    for (std::vector<float>* v : {&in.x, &in.z, &in.dout}) *v = round_bf16(*v);
  const std::vector<std::string> names = output_names(in);
  const auto run = [&](bool saved, emu::Config cfg) {
    return bf16_acts ? run_emulated<__nv_bfloat16>(c, in, saved, cfg) : run_emulated<float>(c, in, saved, cfg);
  };
  const auto first = outputs_under_every_config([&](emu::Config cfg) { return run(false, cfg); }, names.size(),
                                                [&](size_t i) { return names[i]; });
  if (bf16_acts) {
    INFO("bf16 activations against fp32 ones holding the same values (out, dx, dz: rounded)");
    const auto f32 = run_emulated<float>(c, in, false, kConfigs[0]);
    for (size_t i = 0; i < names.size(); ++i) {
      INFO(names[i]);
      CHECK(first_difference(first[i], i < 3 ? round_bf16(f32[i]) : f32[i]) == -1);
    }
  }
  {
    INFO("the backward reading the saved set against the one recomputing the core's forward");
    const auto with_saved = run(true, kConfigs[0]);
    for (size_t i = 0; i < names.size(); ++i) {
      INFO(names[i]);
      CHECK(first_difference(first[i], with_saved[i]) == -1);
    }
  }
  const auto ref = run_cpu(c, in);
  // bf16: d dt_bias against the root-sum-square of its per-token terms draw[b, t, h] (check_mamba3).
  double dt_bias_scale = 1e-30;
  if (c.bf16) {
    const int64_t W = 3 * c.H + c.S;
    const std::vector<float>& d = ref[4];
    for (int64_t h = 0; h < c.H; ++h) {
      double ss = 0.0;
      for (int64_t bt = 0; bt < c.B * c.T; ++bt) ss += static_cast<double>(d[bt * W + h]) * d[bt * W + h];
      dt_bias_scale = std::max(dt_bias_scale, std::sqrt(ss));
    }
  }
  const double tol = c.bf16 ? kBf16Tol : kTol;
  for (size_t i = 0; i < names.size(); ++i)
    require_close(first[i], ref[i], names[i], tol, names[i] == "ddt_bias" ? dt_bias_scale : 1e-30);
}

}  // namespace

TEST_CASE("cuda emu: Mamba-3 SISO, fp32 and bf16 products, with and without the output norm, two groups and an "
          "odd d_state, ragged last chunk",
          "[emu][mamba3]") {
  check_case(2, 70, 2, 16, 16, 1, 1, 4, true, false, 1);
  check_case(1, 70, 2, 64, 64, 1, 1, 8, false, true, 2);
  check_case(1, 70, 4, 16, 11, 2, 1, 3, false, false, 5);  // the lone last channel of N = 11, unrotated
  // bf16 with N = 11: the bf16 q, k and states copied element by element, the state scan's rows loaded without
  // cp.async, the states stored one by one, the dS swap's pieces loaded a float at a time
  check_case(2, 37, 4, 16, 11, 2, 1, 5, true, true, 10);
  // 520 rows: the parameter column sums in two row ranges, the bias sums' partials from the rotation backward in 65
  // (rot_ranges: one per 8 rows here; colsums takes each sum's own count)
  check_case(2, 260, 2, 16, 16, 1, 1, 4, false, false, 13);
  // 300 heads in one group: the rotation backward's blocks of 75 slices x 3 pairs (225 of 256 threads: the last warp
  // partly idle), 2 pair blocks (the second's pairs partly past N / 2); 5 rows: one row range, the last group of 2 rows
  // partial
  check_case(1, 5, 300, 16, 8, 1, 1, 2, false, false, 14);
  // 64 heads, N = 16: the rotation backward's blocks of 16 slices of 4 heads x 8 pairs, as at the benchmark's shape
  // (there 2 chunks of 8 pairs); 20 rows: two row ranges of 5 groups of 2 rows, the two dū buffers alternating
  check_case(1, 20, 64, 16, 16, 1, 1, 4, false, false, 23);
  // 63 heads per group, N = 49, S = 10: the rotation backward's 16 slices of 4 heads (the last one of 3) x 2 chunks
  // of 8 pairs per block, 2 pair blocks (block 1's second chunk: the lone unrotated channel 48 and pairs past it),
  // chunks partly rotated; 21 rows: two row ranges of 10 and 11 rows (5 and 6 groups of 2 rows, the last one partial)
  check_case(1, 21, 126, 16, 49, 2, 1, 10, false, false, 24);
  // N = 40: the BCNorm kernels' staged vectors narrower than their 128 threads; 260 vectors (130 per side): the last
  // block of 32 holds 4 in the forward (bcnorm_kernel), 2 in the backward (bcnorm_dx_kernel, one side a block)
  check_case(1, 130, 2, 16, 40, 1, 1, 4, true, false, 16);
  // bf16 with P = 10: the backward chunk kernel's v rows loaded a float at a time and the bf16 dy rows copied
  // element by element (no 16-byte pieces) while q, k, S_in come by cp.async; the gate one channel per thread, the
  // dS scan's bf16 dy rows loaded without cp.async
  check_case(1, 70, 2, 10, 16, 1, 1, 4, false, true, 17);
  // bf16 with P = 128: two P tiles of S_in and dS (the cp.async pieces of two tile rows)
  check_case(1, 70, 2, 128, 16, 1, 1, 4, false, true, 18);
  // bf16 at the benchmark's P = 64, N = 128: the backward chunk kernel's dS swap walks two tiles wide in RowWalk's
  // short form (a fixed 4-column piece per thread), 8 pieces per thread, all loaded ahead
  check_case(1, 130, 1, 64, 128, 1, 1, 8, false, true, 19);
  // bf16 with N = 136: three N tiles, the dS swap's general walk (the piece steps and wraps) and loads past the
  // ones ahead
  check_case(1, 70, 1, 16, 136, 1, 1, 4, false, true, 20);
  // H S = 64: two full blocks of the phase scans (every lane's (h, i) in range), segments of 19 steps (several
  // batches of steps loaded ahead, the last one partial, forward and reverse)
  check_case(1, 300, 16, 16, 8, 1, 1, 4, false, false, 21);
  // H S = 70, S = 5: the phase scans' blocks starting mid-head, the third block's lanes partly past H S; segments
  // of 10 steps (the last one empty)
  check_case(1, 150, 14, 16, 10, 2, 1, 5, false, false, 22);
}

TEST_CASE("cuda emu: Mamba-3 MIMO (R = 2, 4), fp32 and bf16 products, ragged last chunk", "[emu][mamba3]") {
  check_case(1, 40, 2, 16, 16, 2, 2, 4, false, false, 3);
  check_case(1, 20, 2, 32, 32, 1, 4, 8, true, true, 4);
  check_case(1, 25, 3, 24, 12, 1, 2, 6, true, true, 12);  // bf16 with N % 8 = 4: q, k rows without 16-byte pieces
  check_case(1, 20, 2, 6, 8, 1, 2, 2, true, false, 15);     // P = 6: the gate kernels one channel per thread
}

TEST_CASE("cuda emu: Mamba-3 bf16 activations (bf16 products), SISO and MIMO, against fp32 activations of the same "
          "values",
          "[emu][mamba3]") {
  // SISO at the benchmark's P = 64, N = 128: the bf16 x rows staged by cp.async into the state scan and copied into
  // the core's V tiles, dx stored as bf16 pairs; without the norm (as the configs) the gate kernels' plain form 8
  // channels per thread (16-byte bf16 pieces), with it their general form 4 channels per thread; P = 10: the x rows
  // not 16-byte aligned (loaded element-wise), the gate one channel per thread; MIMO: up_kernel and dx_kernel on bf16
  // x, dx.
  check_case(1, 130, 1, 64, 128, 1, 1, 8, false, true, 33, true);
  check_case(1, 130, 1, 64, 128, 1, 1, 8, true, true, 30, true);
  check_case(1, 70, 2, 10, 16, 1, 1, 4, false, true, 31, true);
  check_case(1, 20, 2, 32, 32, 1, 4, 8, true, true, 32, true);
}
