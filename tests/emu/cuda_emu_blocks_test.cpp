// The delta-rule layers' small blocks (src/kernels/cuda/delta_blocks.cu) run by the CPU emulator (cuda_emu.h)
// through their own launchers, no GPU: the short conv + SiLU forward and backward (widths 1, 4 and the largest the
// kernels take, 8, and an odd one, 3; with and without Mamba2's bias; sequences cut into runs of 32 tokens with a
// partial last run, one and several blocks of 8 runs; one and several blocks of channels, four or one a thread),
// the L2 norm forward and backward, the gated RMSNorm forward and backward, the gate after the norm (delta-rule layers)
// and first (Mamba2's gate_rmsnorm_*; one and several blocks of rows, the last partial; widths below and above a
// warp's 32 lanes), the decay gates backward (GDN: dim 1, KDA: dim d_k)
// and the Comba gates backward (several 64-row blocks, a partial last one). Every output must be
// (a) finite and bit-identical under every schedule of the emulator (tests/emu/cuda_emu_test.h);
// (b) within kTol of the CPU reference in double (cpu::short_conv_*, l2norm_*, gated_rmsnorm_*, gate_rmsnorm_*,
//     delta_gates_bwd, comba_gates_bwd), as tests/cuda_delta_test.cpp checks them on the GPU;
// (c) for the short conv's y and dx, the L2 norm's y and the gated RMSNorm's y and dz (Mamba2's gate first: and d_o,
//     the SSD's dy) written in bf16: the f32 outputs rounded, bit for bit (the other outputs of those runs
//     bit-identical to the f32 runs');
// (d) for the short conv backward's dy and Mamba2's gated norm's y read in bf16 (the SSD's dxbc and y with bf16
//     inputs): every output bit-identical to the run on f32 inputs holding the same (bf16-rounded) values.
// Run with `ctest -L emu`.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../cuda_test_host.h"
#include "cuda_emu.h"
#include "cuda_emu_test.h"
#include "kernels/cpu/comba_gates.h"
#include "kernels/cpu/delta_gates.h"
#include "kernels/cpu/gated_rmsnorm.h"
#include "kernels/cpu/l2norm.h"
#include "kernels/cpu/short_conv.h"
#include "kernels/cuda/ops.cuh"

using namespace llmt::test;
using namespace llmt::test::emu_test;

namespace {

std::vector<double> wide(const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); }
std::vector<float> narrow(const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); }

/// Device-like memory for n bf16 values (Buffer's NaN fill: 0xffff, a bf16 NaN).
struct Bf16Buffer {
  Buffer b;
  size_t n;
  explicit Bf16Buffer(size_t count) : b((count + 1) / 2), n(count) {}
  __nv_bfloat16* get() const { return reinterpret_cast<__nv_bfloat16*>(b.get()); }
  std::vector<float> host() const {
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = __bfloat162float(get()[i]);
    return x;
  }
};

/// The kernels' bf16 outputs are their fp32 outputs rounded to nearest even: the same bits.
void require_rounded(const std::vector<float>& bf16_out, const std::vector<float>& f32_out, const char* what) {
  INFO(what << " in bf16: the f32 output rounded");
  REQUIRE(bf16_out.size() == f32_out.size());
  std::vector<float> rounded(f32_out.size());
  for (size_t i = 0; i < f32_out.size(); ++i) rounded[i] = __bfloat162float(__float2bfloat16_rn(f32_out[i]));
  CHECK(first_difference(bf16_out, rounded) == -1);
}

/// Runs `run()` (the kernels, returning their outputs) under every emulator configuration: outputs finite and the
/// same bits in each; returns the reference run's.
template <typename Run>
std::vector<std::vector<float>> under_every_config(Run run, const std::vector<std::string>& names) {
  return outputs_under_every_config(
      [&](emu::Config cfg) {
        emu::config = cfg;
        return run();
      },
      names.size(), [&](size_t i) { return names[i].c_str(); });
}

void check_conv(int64_t B, int64_t T, int64_t C, int64_t W, bool bias, uint64_t seed) {
  INFO("short conv B=" << B << " T=" << T << " C=" << C << " W=" << W << (bias ? " with bias" : ""));
  const size_t n = static_cast<size_t>(B * T * C);
  const auto x = randn(n, seed), w = randn(static_cast<size_t>(C * W), seed + 1, 0.5), dy = randn(n, seed + 2);
  const auto b = randn(static_cast<size_t>(C), seed + 3), dw0 = randn(static_cast<size_t>(C * W), seed + 4),
             db0 = randn(static_cast<size_t>(C), seed + 5);
  const auto out = under_every_config(
      [&] {
        Buffer bx(x), bw(w), bb(b), bdy(dy), pre(n), y(n), dx(n), dw(dw0), db(db0);
        Buffer scratch(llmt::cuda::short_conv_silu_bwd_scratch_bytes(B, T, C, W) / sizeof(float) + 1);
        llmt::cuda::short_conv_silu_fwd(bx.get(), bw.get(), bias ? bb.get() : nullptr, B, T, C, W, pre.get(), y.get(),
                                        nullptr);
        llmt::cuda::short_conv_silu_bwd(bdy.get(), bx.get(), bw.get(), pre.get(), B, T, C, W, dx.get(), dw.get(),
                                        bias ? db.get() : nullptr, scratch.get(), nullptr);
        // Again with dx in bf16 (what the delta layers hand their bf16 projections).
        Bf16Buffer dxh(n);
        Buffer dw2(dw0), db2(db0);
        llmt::cuda::short_conv_silu_bwd(bdy.get(), bx.get(), bw.get(), pre.get(), B, T, C, W, dxh.get(), dw2.get(),
                                        bias ? db2.get() : nullptr, scratch.get(), nullptr);
        // And the forward with y in bf16 (a GDN / Comba core's v).
        Bf16Buffer yh(n);
        Buffer pre2(n);
        llmt::cuda::short_conv_silu_fwd(bx.get(), bw.get(), bias ? bb.get() : nullptr, B, T, C, W, pre2.get(),
                                        yh.get(), nullptr);
        // And the backward from dy rounded to bf16, given as f32 and as bf16 (Mamba2's dxbc from its bf16 SSD).
        const std::vector<float> dyr = round_bf16(dy);
        const Buffer bdyr(dyr);
        const Input<__nv_bfloat16> bdyh(dyr);
        Buffer dx3(n), dw3(dw0), db3(db0), dx4(n), dw4(dw0), db4(db0);
        llmt::cuda::short_conv_silu_bwd(bdyr.get(), bx.get(), bw.get(), pre.get(), B, T, C, W, dx3.get(), dw3.get(),
                                        bias ? db3.get() : nullptr, scratch.get(), nullptr);
        llmt::cuda::short_conv_silu_bwd(bdyh.get(), bx.get(), bw.get(), pre.get(), B, T, C, W, dx4.get(), dw4.get(),
                                        bias ? db4.get() : nullptr, scratch.get(), nullptr);
        return std::vector<std::vector<float>>{pre.host(), y.host(),  dx.host(),   dw.host(),  db.host(),
                                               dxh.host(), dw2.host(), db2.host(), yh.host(),  pre2.host(),
                                               dx3.host(), dw3.host(), db3.host(), dx4.host(), dw4.host(),
                                               db4.host()};
      },
      {"pre", "y", "dx", "dw", "dbias", "dx (bf16)", "dw (bf16 dx)", "dbias (bf16 dx)", "y (bf16)", "pre (bf16 y)",
       "dx (rounded dy)", "dw (rounded dy)", "dbias (rounded dy)", "dx (bf16 dy)", "dw (bf16 dy)", "dbias (bf16 dy)"});
  require_rounded(out[5], out[2], "dx");
  CHECK(first_difference(out[6], out[3]) == -1);
  CHECK(first_difference(out[7], out[4]) == -1);
  require_rounded(out[8], out[1], "y");
  CHECK(first_difference(out[9], out[0]) == -1);
  for (size_t i = 0; i < 3; ++i) {
    INFO((i == 0 ? "dx" : i == 1 ? "dw" : "dbias") << " from bf16 dy: the f32 run's on the same values");
    CHECK(first_difference(out[13 + i], out[10 + i]) == -1);
  }
  // The reference: the CPU's conv in double (its bias variant through the Mamba2 path's pre = conv + bias).
  std::vector<double> pre(n), y(n), dx(n), dw = wide(dw0), db = wide(db0);
  const std::vector<double> xd = wide(x), wd = wide(w), dyd = wide(dy), bd = wide(b);
  llmt::cpu::short_conv_silu_fwd<double>(xd.data(), wd.data(), B, T, C, W, pre.data(), y.data(), bias ? bd.data() : nullptr);
  llmt::cpu::short_conv_silu_bwd<double>(dyd.data(), xd.data(), wd.data(), pre.data(), B, T, C, W, dx.data(), dw.data(),
                                         bias ? db.data() : nullptr);
  require_close(out[0], narrow(pre), "pre");
  require_close(out[1], narrow(y), "y");
  require_close(out[2], narrow(dx), "dx");
  require_close(out[3], narrow(dw), "dw");
  if (bias) require_close(out[4], narrow(db), "dbias");
}

// The gated RMSNorm's variants: the gate after the norm (gated_rmsnorm_*, silu or sigmoid) or Mamba2's silu gate
// first (gate_rmsnorm_*).
enum class NormGate { silu_after, sigmoid_after, silu_first };

// The variant's forward (o: the normed input, Mamba2's y) and backward (dy: the output's gradient, d_o: o's) on
// device-like memory, y and dz float or bf16; then the CPU reference in double.
template <typename TY>
void norm_fwd(NormGate g, const float* o, const float* z, const float* w, int64_t rows, int64_t dim, TY* y,
              float* rstd) {
  if (g == NormGate::silu_first)
    llmt::cuda::gate_rmsnorm_fwd(o, z, w, rows, dim, 1e-5, y, rstd, nullptr);
  else
    llmt::cuda::gated_rmsnorm_fwd(o, z, w, rows, dim, 1e-5, g == NormGate::sigmoid_after, y, rstd, nullptr);
}
template <typename TZ>
void norm_bwd(NormGate g, const float* dy, const float* o, const float* z, const float* w, const float* rstd,
              int64_t rows, int64_t dim, float* d_o, TZ* dz, float* dw, void* scratch) {
  if (g == NormGate::silu_first)
    llmt::cuda::gate_rmsnorm_bwd(dy, o, z, w, rstd, rows, dim, d_o, dz, dw, scratch, nullptr);
  else
    llmt::cuda::gated_rmsnorm_bwd(dy, o, z, w, rstd, rows, dim, g == NormGate::sigmoid_after, d_o, dz, dw, scratch,
                                  nullptr);
}
void norm_ref(NormGate g, const double* dy, const double* o, const double* z, const double* w, const double* rstd_in,
              int64_t rows, int64_t dim, double* y, double* rstd, double* d_o, double* dz, double* dw) {
  const bool sig = g == NormGate::sigmoid_after;
  if (g == NormGate::silu_first) {
    llmt::cpu::gate_rmsnorm_fwd(o, z, w, rows, dim, 1e-5, y, rstd);
    llmt::cpu::gate_rmsnorm_bwd(dy, o, z, w, rstd_in, rows, dim, d_o, dz, dw);
  } else {
    llmt::cpu::gated_rmsnorm_fwd(o, z, w, rows, dim, 1e-5, sig, y, rstd);
    llmt::cpu::gated_rmsnorm_bwd(dy, o, z, w, rstd_in, rows, dim, sig, d_o, dz, dw);
  }
}
const char* gate_name(NormGate g) {
  if (g == NormGate::silu_first) return "silu first (Mamba2)";
  return g == NormGate::sigmoid_after ? "sigmoid after" : "silu after";
}

void check_gated_norm(int64_t rows, int64_t dim, NormGate g) {
  INFO("gated rmsnorm rows=" << rows << " dim=" << dim << " gate " << gate_name(g));
  const size_t n = static_cast<size_t>(rows * dim);
  const auto o = randn(n, 500), z = randn(n, 501, 2.0), wn = randn(static_cast<size_t>(dim), 502), dy = randn(n, 503),
             dw0 = randn(static_cast<size_t>(dim), 504);
  const auto out = under_every_config(
      [&] {
        Buffer bo(o), bz(z), bw(wn), bdy(dy), y(n), rstd(static_cast<size_t>(rows)), d_o(n), dz(n), dw(dw0);
        Buffer scratch(llmt::cuda::gated_rmsnorm_bwd_scratch_bytes(rows, dim) / sizeof(float) + 1);
        norm_fwd(g, bo.get(), bz.get(), bw.get(), rows, dim, y.get(), rstd.get());
        norm_bwd(g, bdy.get(), bo.get(), bz.get(), bw.get(), rstd.get(), rows, dim, d_o.get(), dz.get(), dw.get(),
                 scratch.get());
        // Again with y and dz in bf16 (the output and gate / in_proj projections' operands).
        Bf16Buffer yh(n), dzh(n);
        Buffer rstd2(static_cast<size_t>(rows)), d_o2(n), dw2(dw0);
        norm_fwd(g, bo.get(), bz.get(), bw.get(), rows, dim, yh.get(), rstd2.get());
        norm_bwd(g, bdy.get(), bo.get(), bz.get(), bw.get(), rstd.get(), rows, dim, d_o2.get(), dzh.get(), dw2.get(),
                 scratch.get());
        std::vector<std::vector<float>> outs{rstd.host(), d_o.host(), dz.host(),    dw.host(),   y.host(),
                                             yh.host(),   dzh.host(), rstd2.host(), d_o2.host(), dw2.host()};
        if (g == NormGate::silu_first) {  // and with d_o in bf16 too (Mamba2's SSD dy: Backend::mamba2_bf16_inputs)
          Bf16Buffer d_oh(n), dzh2(n);
          Buffer dw3(dw0);
          llmt::cuda::gate_rmsnorm_bwd(bdy.get(), bo.get(), bz.get(), bw.get(), rstd.get(), rows, dim, d_oh.get(),
                                       dzh2.get(), dw3.get(), scratch.get(), nullptr);
          for (auto* b : {&d_oh, &dzh2}) outs.push_back(b->host());
          outs.push_back(dw3.host());
          // and with y (o) rounded to bf16, given as f32 and as bf16 (the SSD's output with bf16 inputs; Mamba2's
          // bf16 layer: out, d_o and dz bf16 too)
          const std::vector<float> orr = round_bf16(o);
          const Buffer bor(orr);
          const Input<__nv_bfloat16> boh(orr);
          for (const bool half : {false, true}) {
            Bf16Buffer yo(n), d_o4(n), dz4(n);
            Buffer rstd4(static_cast<size_t>(rows)), dw4(dw0);
            if (half) {
              llmt::cuda::gate_rmsnorm_fwd(boh.get(), bz.get(), bw.get(), rows, dim, 1e-5, yo.get(), rstd4.get(),
                                           nullptr);
              llmt::cuda::gate_rmsnorm_bwd(bdy.get(), boh.get(), bz.get(), bw.get(), rstd4.get(), rows, dim,
                                           d_o4.get(), dz4.get(), dw4.get(), scratch.get(), nullptr);
            } else {
              llmt::cuda::gate_rmsnorm_fwd(bor.get(), bz.get(), bw.get(), rows, dim, 1e-5, yo.get(), rstd4.get(),
                                           nullptr);
              llmt::cuda::gate_rmsnorm_bwd(bdy.get(), bor.get(), bz.get(), bw.get(), rstd4.get(), rows, dim,
                                           d_o4.get(), dz4.get(), dw4.get(), scratch.get(), nullptr);
            }
            for (auto* b : {&yo, &d_o4, &dz4}) outs.push_back(b->host());
            for (auto* b : {&rstd4, &dw4}) outs.push_back(b->host());
          }
        }
        return outs;
      },
      g == NormGate::silu_first
          ? std::vector<std::string>{"rstd", "d_o", "dz", "dw", "y", "y (bf16)", "dz (bf16)", "rstd (bf16 y)",
                                     "d_o (bf16 dz)", "dw (bf16 dz)", "d_o (bf16)", "dz (bf16 d_o)", "dw (bf16 d_o)",
                                     "y (rounded o)", "d_o (rounded o)", "dz (rounded o)", "rstd (rounded o)",
                                     "dw (rounded o)", "y (bf16 o)", "d_o (bf16 o)", "dz (bf16 o)", "rstd (bf16 o)",
                                     "dw (bf16 o)"}
          : std::vector<std::string>{"rstd", "d_o", "dz", "dw", "y", "y (bf16)", "dz (bf16)", "rstd (bf16 y)",
                                     "d_o (bf16 dz)", "dw (bf16 dz)"});
  require_rounded(out[5], out[4], "y");
  require_rounded(out[6], out[2], "dz");
  for (const auto& [a, b] : {std::pair<size_t, size_t>{7, 0}, {8, 1}, {9, 3}})
    CHECK(first_difference(out[a], out[b]) == -1);
  if (g == NormGate::silu_first) {
    require_rounded(out[10], out[1], "d_o");
    require_rounded(out[11], out[2], "dz (with d_o bf16)");
    CHECK(first_difference(out[12], out[3]) == -1);
    for (size_t i = 0; i < 5; ++i) {
      INFO("output " << i << " of the bf16 layer's norm from bf16 o: the f32 run's on the same values");
      CHECK(first_difference(out[18 + i], out[13 + i]) == -1);
    }
  }
  // The reference: the forward, and the backward from the kernels' rstd (as tests/cuda_delta_test.cpp does).
  std::vector<double> y(n), rstd(static_cast<size_t>(rows)), d_o(n), dz(n), dw = wide(dw0);
  const std::vector<double> od = wide(o), zd = wide(z), wd = wide(wn), dyd = wide(dy), rs = wide(out[0]);
  norm_ref(g, dyd.data(), od.data(), zd.data(), wd.data(), rs.data(), rows, dim, y.data(), rstd.data(),
                   d_o.data(), dz.data(), dw.data());
  require_close(out[4], narrow(y), "y");
  require_close(out[0], narrow(rstd), "rstd");
  require_close(out[1], narrow(d_o), "d_o");
  require_close(out[2], narrow(dz), "dz");
  require_close(out[3], narrow(dw), "dw");
}

}  // namespace

TEST_CASE("cuda emu: short conv + SiLU, widths 1, 3, 4, 8, with and without a bias, runs of 32 tokens, dx in f32 "
          "and bf16",
          "[emu][blocks]") {
  // The backward takes four channels a thread (float4) when the width is at most 4 and the channel count a
  // multiple of 4, else one; a block 8 runs (one a warp) and 32 lanes' channels.
  check_conv(2, 37, 48, 1, false, 100);
  check_conv(2, 37, 48, 4, false, 110);
  check_conv(1, 70, 300, 4, true, 120);  // three blocks of 128 channels (four a thread), the last partial
  check_conv(2, 37, 40, 8, true, 130);   // width 8: one channel a thread
  check_conv(1, 3, 16, 4, false, 140);   // a sequence shorter than the width
  check_conv(2, 300, 40, 4, false, 150);  // 20 runs: three blocks of 8 runs, the last partial
  check_conv(3, 130, 37, 3, true, 160);   // odd channel count and width: one channel a thread; 15 runs
}

TEST_CASE("cuda emu: L2 norm forward (y in f32 and bf16) and backward (from x), gated RMSNorm forward (one warp per "
          "row)",
          "[emu][blocks]") {
  const int64_t rows = 75, dim = 80;
  const size_t n = static_cast<size_t>(rows * dim);
  const auto x = randn(n, 200), dy = randn(n, 201), z = randn(n, 202, 2.0), wn = randn(static_cast<size_t>(dim), 203);
  for (const bool sig : {false, true}) {
    const auto out = under_every_config(
        [&] {
          Buffer bx(x), bdy(dy), bz(z), bw(wn), y(n), rinv(static_cast<size_t>(rows)), dx(n), gy(n),
              rstd(static_cast<size_t>(rows));
          llmt::cuda::l2norm_fwd(bx.get(), rows, dim, 1e-6, 0.125, y.get(), rinv.get(), nullptr);
          llmt::cuda::l2norm_bwd(bdy.get(), bx.get(), rinv.get(), rows, dim, 0.125, dx.get(), nullptr);
          llmt::cuda::gated_rmsnorm_fwd(bx.get(), bz.get(), bw.get(), rows, dim, 1e-5, sig, gy.get(), rstd.get(),
                                        nullptr);
          // Again with y in bf16 (a GDN / Comba core's q̂, k̂, p̂).
          Bf16Buffer yh(n);
          Buffer rinv2(static_cast<size_t>(rows));
          llmt::cuda::l2norm_fwd(bx.get(), rows, dim, 1e-6, 0.125, yh.get(), rinv2.get(), nullptr);
          return std::vector<std::vector<float>>{y.host(),  rinv.host(), dx.host(),
                                                 gy.host(), rstd.host(), yh.host(), rinv2.host()};
        },
        {"l2norm y", "l2norm rinv", "l2norm dx", "gated rmsnorm y", "gated rmsnorm rstd", "l2norm y (bf16)",
         "l2norm rinv (bf16 y)"});
    require_rounded(out[5], out[0], "l2norm y");
    CHECK(first_difference(out[6], out[1]) == -1);
    std::vector<double> y(n), rinv(static_cast<size_t>(rows)), dx(n), gy(n), rstd(static_cast<size_t>(rows));
    const std::vector<double> xd = wide(x), dyd = wide(dy), zd = wide(z), wd = wide(wn);
    llmt::cpu::l2norm_fwd<double>(xd.data(), rows, dim, 1e-6, 0.125, y.data(), rinv.data());
    const std::vector<double> rf = wide(out[1]);  // the backward from the kernel's saved rinv
    llmt::cpu::l2norm_bwd<double>(dyd.data(), xd.data(), rf.data(), rows, dim, 0.125, dx.data());
    llmt::cpu::gated_rmsnorm_fwd<double>(xd.data(), zd.data(), wd.data(), rows, dim, 1e-5, sig, gy.data(), rstd.data());
    require_close(out[0], narrow(y), "l2norm y");
    require_close(out[1], narrow(rinv), "l2norm rinv");
    require_close(out[2], narrow(dx), "l2norm dx");
    require_close(out[3], narrow(gy), sig ? "gated rmsnorm y (sigmoid)" : "gated rmsnorm y (silu)");
    require_close(out[4], narrow(rstd), "gated rmsnorm rstd");
  }
}

TEST_CASE("cuda emu: gated RMSNorm, the gate after the norm and Mamba2's gate first, forward and backward (dw over "
          "blocks of 8 warps x 32 rows), y and dz (the gate first: and d_o) in f32 and bf16",
          "[emu][blocks]") {
  // One partial block; three blocks, the last partial (warps without rows); an odd width below a warp's 32 lanes;
  // a width of several lanes' columns, not a multiple of 32.
  for (const auto& [rows, dim] : {std::pair<int64_t, int64_t>{75, 80}, {600, 40}, {130, 7}, {140, 200}})
    for (const NormGate g : {NormGate::silu_after, NormGate::sigmoid_after, NormGate::silu_first})
      check_gated_norm(rows, dim, g);
}

TEST_CASE("cuda emu: decay gates (GDN: dim 1, KDA: dim d_k) and Comba gates (64-row blocks) backward",
          "[emu][blocks]") {
  for (const auto& [rows, H, dim] : {std::tuple<int64_t, int64_t, int64_t>{600, 3, 1}, {130, 2, 40}, {5, 2, 3}}) {
    INFO("decay gates rows=" << rows << " heads=" << H << " dim=" << dim);
    const size_t n = static_cast<size_t>(rows * H * dim), nh = static_cast<size_t>(rows * H);
    const auto dg = randn(n, 300), a = randn(n, 301), dbeta = randn(nh, 302), b = randn(nh, 303),
               A_log = randn(static_cast<size_t>(H), 304), dt_bias = randn(static_cast<size_t>(H * dim), 305),
               dA0 = randn(static_cast<size_t>(H), 306), ddt0 = randn(static_cast<size_t>(H * dim), 307);
    const auto out = under_every_config(
        [&] {
          Buffer bdg(dg), ba(a), bdbeta(dbeta), bb(b), bA(A_log), bdt(dt_bias), da(n), db(nh), dA(dA0), ddt(ddt0);
          Buffer scratch(llmt::cuda::decay_gates_bwd_scratch_bytes(rows, H, dim) / sizeof(float) + 1);
          llmt::cuda::decay_gates_bwd(bdg.get(), bdbeta.get(), ba.get(), bb.get(), bA.get(), bdt.get(), rows, H, dim,
                                      da.get(), db.get(), dA.get(), ddt.get(), scratch.get(), nullptr);
          return std::vector<std::vector<float>>{da.host(), db.host(), dA.host(), ddt.host()};
        },
        {"da", "db", "dA_log", "ddt_bias"});
    std::vector<double> da(n), db(nh), dA = wide(dA0), ddt = wide(ddt0);
    const std::vector<double> dgd = wide(dg), ad = wide(a), dbd = wide(dbeta), bd = wide(b), Ad = wide(A_log),
                              dtd = wide(dt_bias);
    llmt::cpu::delta_gates_bwd<double>(dgd.data(), dbd.data(), ad.data(), bd.data(), Ad.data(), dtd.data(), rows, H, dim,
                                       da.data(), db.data(), dA.data(), ddt.data());
    require_close(out[0], narrow(da), "da");
    require_close(out[1], narrow(db), "db");
    require_close(out[2], narrow(dA), "dA_log");
    require_close(out[3], narrow(ddt), "ddt_bias");
  }
  for (const int64_t rows : {600, 64, 5}) {
    INFO("comba gates rows=" << rows);
    const int64_t H = 3, K = 32;
    const size_t n = static_cast<size_t>(rows * H * K);
    const auto dq = randn(n, 400), dp = randn(n, 401), k = randn(n, 402), dk0 = randn(n, 403),
               decay = randn(static_cast<size_t>(H), 404), D = randn(static_cast<size_t>(H), 405),
               dd0 = randn(static_cast<size_t>(H), 406), dD0 = randn(static_cast<size_t>(H), 407);
    const auto out = under_every_config(
        [&] {
          Buffer bdq(dq), bdp(dp), bk(k), bdecay(decay), bD(D), dk(dk0), dd(dd0), dD(dD0);
          Buffer scratch(llmt::cuda::comba_gates_bwd_scratch_bytes(rows, H) / sizeof(float) + 1);
          llmt::cuda::comba_gates_bwd(bdq.get(), bdp.get(), bk.get(), bdecay.get(), bD.get(), rows, H, K, dk.get(),
                                      dd.get(), dD.get(), scratch.get(), nullptr);
          return std::vector<std::vector<float>>{dk.host(), dd.host(), dD.host()};
        },
        {"dk", "ddecay", "dD"});
    std::vector<double> dk = wide(dk0), dd = wide(dd0), dD = wide(dD0);
    const std::vector<double> dqd = wide(dq), dpd = wide(dp), kd = wide(k), decd = wide(decay), Dd = wide(D);
    llmt::cpu::comba_gates_bwd<double>(dqd.data(), dpd.data(), kd.data(), decd.data(), Dd.data(), rows, H, K, dk.data(),
                                       dd.data(), dD.data());
    require_close(out[0], narrow(dk), "dk");
    require_close(out[1], narrow(dd), "ddecay");
    require_close(out[2], narrow(dD), "dD");
  }
}
