// The MDN gates' forward and backward and the output correction's backward kernels (src/kernels/cuda/mdn_gates.cu,
// with partials.cu's add_partials) run by the CPU emulator (cuda_emu.h) through their own launchers, no GPU: with
// and without momentum, α_max and β_max, a floor that clamps some tokens' log μ, row counts that leave the last
// block of rows partial (and a single partial block), several heads. Every output must be
// (a) finite and bit-identical under every schedule of the emulator (tests/emu/cuda_emu_test.h);
// (b) within kTol of the CPU reference (cpu::mdn_gates_fwd / mdn_gates_bwd / mdn_correction_bwd<float>, double
//     arithmetic): the gates, the per-token gradients (overwritten) and the per-head parameter gradients
//     (accumulated onto random values).
// Run with `ctest -L emu`.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "../cuda_test_host.h"
#include "cuda_emu.h"
#include "cuda_emu_test.h"
#include "kernels/cpu/mdn_gates.h"
#include "kernels/cuda/ops.cuh"

using namespace llmt::test;
using namespace llmt::test::emu_test;

namespace {

const char* const kGateNames[] = {"dz_alpha", "dz_beta", "dz_mu",    "dz_eta",     "dA_log",
                                  "ddt_bias", "dMu_log", "dmu_bias", "dlog_factor"};

/// Gate inputs, output gradients and accumulated parameter gradients of `rows` tokens and `heads` heads.
struct GateInputs {
  std::vector<std::vector<float>> tok;    // z_alpha, z_beta, z_mu, z_eta, d_log_alpha, d_beta, d_log_mu, d_eta
  std::vector<std::vector<float>> param;  // A_log, dt_bias, Mu_log, mu_bias, log_factor
  std::vector<std::vector<float>> acc;    // the parameter gradients' starting values, same order
  GateInputs(int64_t rows, int64_t heads, uint64_t seed) {
    for (int i = 0; i < 8; ++i) tok.push_back(randn(static_cast<size_t>(rows * heads), seed + i, 1.5));
    param = {uniform(heads, seed + 10, 0.0, 2.0), uniform(heads, seed + 11, -3.0, 0.0),
             uniform(heads, seed + 12, -1.0, 1.0), uniform(heads, seed + 13, -1.0, 1.0),
             uniform(heads, seed + 14, -1.0, 1.0)};
    for (int i = 0; i < 5; ++i) acc.push_back(randn(heads, seed + 20 + i));
  }
};

std::vector<std::vector<float>> gates_emulated(const GateInputs& in, int64_t rows, int64_t heads,
                                               const llmt::MdnGateOptions& opt, emu::Config cfg) {
  emu::config = cfg;
  std::vector<Buffer> t, p, g, dz;
  for (const auto& v : in.tok) t.emplace_back(v);
  for (const auto& v : in.param) p.emplace_back(v);
  for (const auto& v : in.acc) g.emplace_back(v);
  for (int i = 0; i < 4; ++i) dz.emplace_back(std::vector<float>(static_cast<size_t>(rows * heads), 7.0f));
  const Buffer scratch(llmt::cuda::mdn_gates_bwd_scratch_bytes(rows, heads) / 4 + 1);
  const auto m = [&](const Buffer& b) { return opt.momentum ? b.get() : nullptr; };
  llmt::cuda::mdn_gates_bwd(t[4].get(), t[5].get(), m(t[6]), m(t[7]), t[0].get(), t[1].get(), m(t[2]), m(t[3]),
                            p[0].get(), p[1].get(), m(p[2]), m(p[3]), p[4].get(), rows, heads, opt, dz[0].get(),
                            dz[1].get(), m(dz[2]), m(dz[3]), g[0].get(), g[1].get(), m(g[2]), m(g[3]), g[4].get(),
                            scratch.get(), nullptr);
  std::vector<std::vector<float>> out;
  for (const Buffer& b : dz) out.push_back(b.host());
  for (const Buffer& b : g) out.push_back(b.host());
  return out;
}

std::vector<std::vector<float>> gates_cpu(const GateInputs& in, int64_t rows, int64_t heads,
                                          const llmt::MdnGateOptions& opt) {
  std::vector<std::vector<float>> out(4, std::vector<float>(static_cast<size_t>(rows * heads), 7.0f));
  for (const auto& v : in.acc) out.push_back(v);
  const auto& t = in.tok;
  const auto& p = in.param;
  const auto m = [&](const std::vector<float>& v) { return opt.momentum ? v.data() : nullptr; };
  const auto w = [&](std::vector<float>& v) { return opt.momentum ? v.data() : nullptr; };
  llmt::cpu::mdn_gates_bwd<float>(t[4].data(), t[5].data(), m(t[6]), m(t[7]), t[0].data(), t[1].data(), m(t[2]),
                                  m(t[3]), p[0].data(), p[1].data(), m(p[2]), m(p[3]), p[4].data(), rows, heads, opt,
                                  out[0].data(), out[1].data(), w(out[2]), w(out[3]), out[4].data(), out[5].data(),
                                  w(out[6]), w(out[7]), out[8].data());
  return out;
}

void check_gates(int64_t rows, int64_t heads, const llmt::MdnGateOptions& opt, uint64_t seed) {
  INFO("rows " << rows << " heads " << heads << " momentum " << opt.momentum << " alpha_max " << opt.alpha_max
               << " beta_max " << opt.beta_max << " min_log_mu " << opt.min_log_mu);
  const GateInputs in(rows, heads, seed);
  const auto emu_out = outputs_under_every_config(
      [&](emu::Config cfg) { return gates_emulated(in, rows, heads, opt, cfg); }, 9,
      [](size_t i) { return kGateNames[i]; });
  const auto ref = gates_cpu(in, rows, heads, opt);
  for (size_t i = 0; i < 9; ++i) require_close(emu_out[i], ref[i], kGateNames[i]);
}

/// The forward (log α, β, η and, with momentum, log μ; without momentum log μ = -inf is not compared) of `rows` tokens
/// and `heads` heads under `opt`, emulated against cpu::mdn_gates_fwd<float>.
void check_gates_fwd(int64_t rows, int64_t heads, const llmt::MdnGateOptions& opt, uint64_t seed) {
  INFO("forward: rows " << rows << " heads " << heads << " momentum " << opt.momentum << " alpha_max "
                        << opt.alpha_max << " beta_max " << opt.beta_max << " eta_two_sigmoid "
                        << opt.eta_two_sigmoid << " min_log_mu " << opt.min_log_mu);
  const GateInputs in(rows, heads, seed);
  const auto n = static_cast<size_t>(rows * heads);
  const size_t count = opt.momentum ? 4 : 3;
  const char* const names[] = {"log_alpha", "beta", "eta", "log_mu"};
  const auto run = [&](emu::Config cfg) {
    emu::config = cfg;
    std::vector<Buffer> t, p, out;
    for (int i = 0; i < 4; ++i) t.emplace_back(in.tok[i]);
    for (const auto& v : in.param) p.emplace_back(v);
    for (int i = 0; i < 4; ++i) out.emplace_back(n);
    const auto m = [&](const Buffer& b) { return opt.momentum ? b.get() : nullptr; };
    llmt::cuda::mdn_gates_fwd(t[0].get(), t[1].get(), m(t[2]), m(t[3]), p[0].get(), p[1].get(), m(p[2]), m(p[3]),
                              p[4].get(), rows, heads, opt, out[0].get(), out[1].get(), out[3].get(), out[2].get(),
                              nullptr);
    std::vector<std::vector<float>> r;
    for (size_t i = 0; i < count; ++i) r.push_back(out[i].host());
    return r;
  };
  const auto emu_out = outputs_under_every_config(run, count, [&](size_t i) { return names[i]; });
  std::vector<std::vector<float>> ref(4, std::vector<float>(n));
  const auto& t = in.tok;
  const auto& p = in.param;
  const auto m = [&](const std::vector<float>& v) { return opt.momentum ? v.data() : nullptr; };
  llmt::cpu::mdn_gates_fwd<float>(t[0].data(), t[1].data(), m(t[2]), m(t[3]), p[0].data(), p[1].data(), m(p[2]),
                                  m(p[3]), p[4].data(), rows, heads, opt, ref[0].data(), ref[1].data(), ref[3].data(),
                                  ref[2].data());
  for (size_t i = 0; i < count; ++i) require_close(emu_out[i], ref[i], names[i]);
}

void check_correction(int64_t rows, int64_t heads, int64_t dim, uint64_t seed) {
  INFO("rows " << rows << " heads " << heads << " dim " << dim);
  const size_t n = static_cast<size_t>(rows * heads * dim);
  const std::vector<float> dq = randn(n, seed), k = randn(n, seed + 1), dk0 = randn(n, seed + 2),
                           D_log = uniform(heads, seed + 3, -2.0, 1.0), dD0 = randn(heads, seed + 4);
  const auto run = [&](emu::Config cfg) {
    emu::config = cfg;
    const Buffer bdq(dq), bk(k), bD(D_log), dk(dk0), dD(dD0);
    const Buffer scratch(llmt::cuda::mdn_correction_bwd_scratch_bytes(rows, heads) / 4 + 1);
    llmt::cuda::mdn_correction_bwd(bdq.get(), bk.get(), bD.get(), rows, heads, dim, dk.get(), dD.get(),
                                   scratch.get(), nullptr);
    return std::vector<std::vector<float>>{dk.host(), dD.host()};
  };
  const char* const names[] = {"dk", "dD_log"};
  const auto emu_out = outputs_under_every_config(run, 2, [&](size_t i) { return names[i]; });
  std::vector<float> dk = dk0, dD = dD0;
  llmt::cpu::mdn_correction_bwd<float>(dq.data(), k.data(), D_log.data(), rows, heads, dim, dk.data(), dD.data());
  require_close(emu_out[0], dk, "dk");
  require_close(emu_out[1], dD, "dD_log");
}

}  // namespace

TEST_CASE("cuda emu: MDN gates backward, row blocks and their partial sums", "[emu][mdn]") {
  llmt::MdnGateOptions opt;
  opt.tau = 3.0;
  check_gates(600, 3, opt, 100);  // 256 + 256 + 88 rows
  opt.min_log_mu = -0.7;          // the floor clamps a good share of the tokens
  check_gates(600, 3, opt, 200);
  opt.beta_max = false;
  opt.eta_two_sigmoid = true;
  check_gates(100, 2, opt, 300);  // one partial block
  opt.momentum = false;
  check_gates(513, 4, opt, 400);
  // No α_max (log α without -log(1 + x²), so dx has only β's term), with and without momentum and β_max.
  opt = llmt::MdnGateOptions{};
  opt.tau = 3.0;
  opt.alpha_max = false;
  check_gates(600, 3, opt, 700);
  opt.min_log_mu = -0.7;
  opt.momentum = false;
  check_gates(300, 2, opt, 800);
  opt.momentum = true;
  opt.beta_max = false;
  check_gates(100, 2, opt, 900);
}

TEST_CASE("cuda emu: MDN gates forward with and without each ablation switch", "[emu][mdn]") {
  llmt::MdnGateOptions opt;
  opt.tau = 3.0;
  opt.min_log_mu = -0.7;  // the floor clamps a good share of the tokens
  for (const bool alpha_max : {true, false})
    for (const bool beta_max : {true, false})
      for (const bool momentum : {true, false}) {
        opt.alpha_max = alpha_max;
        opt.beta_max = beta_max;
        opt.momentum = momentum;
        opt.eta_two_sigmoid = !beta_max;
        check_gates_fwd(300, 3, opt, 1000);
      }
}

TEST_CASE("cuda emu: MDN output correction backward, row blocks and their partial sums", "[emu][mdn]") {
  check_correction(100, 3, 40, 500);  // 32 + 32 + 32 + 4 rows
  check_correction(20, 2, 128, 600);  // one partial block
}
