// The bf16 MDN core (src/kernels/cuda/mdn.cu, P = __nv_bfloat16: tile::Mma, ldmatrix / mma.sync / cp.async) run
// by the CPU emulator (cuda_emu.h) through its own launchers, no GPU: mdn_chunk_fwd with saved residuals, the
// backward reading them (states-only scan) and the backward recomputing them (solving scan), on small shapes with
// a ragged last chunk (T = 130, chunk 64), full and partial key / value tiles. Every output must be
// (a) finite and bit-identical under every schedule and cp.async mode of the emulator (a race, a missing barrier
//     or a missing cp.async wait changes bits under some schedule or mode), and the two backward paths identical;
// (b) within kBf16CoreTol of the CPU reference (cpu::mdn_chunk_fwd / bwd, double arithmetic), the GPU tests'
//     metric and tolerance for bf16 compute (cuda_test_host.h, tests/cuda_mdn_test.cpp check_mdn).
// Run with `ctest -L emu`; docs/ARCHITECTURE.md (Verification) says what this can and cannot catch.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../cuda_test_host.h"
#include "cuda_emu.h"
#include "cuda_emu_test.h"
#include "kernels/cpu/mdn.h"
#include "kernels/cuda/ops.cuh"

using namespace llmt::test;
using namespace llmt::test::emu_test;

namespace {

struct Outputs {
  std::vector<std::vector<float>> v;  // o, Ṽ, then the gradients of the saved-Ṽ and of the recompute backward
};
const char* const kNames[] = {"o", "saved residuals", "dq", "dk", "dv", "dlog_alpha", "dbeta", "dlog_mu", "deta"};
constexpr int kFwd = 2, kGrads = 7;

struct Case {
  int64_t B, T, H, K, V, C;
  uint64_t seed;
  std::string tag() const {
    return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " H=" + std::to_string(H) + " K=" +
           std::to_string(K) + " V=" + std::to_string(V) + " chunk=" + std::to_string(C);
  }
};

/// Inputs as check_mdn's (the normal gate regime): unit-length keys, queries of length K^-1/2, log α in
/// [-0.7, -0.01), log μ in [-2, -0.05), η in [0.3, 1.7), β = (1 - α) σ(z); dL/do normal.
struct Inputs {
  std::vector<float> q, k, v, la, beta, lm, eta, d_o;
  explicit Inputs(const Case& c) {
    const size_t nk = c.B * c.T * c.H * c.K, nv = c.B * c.T * c.H * c.V, nb = c.B * c.T * c.H;
    q = unit_rows(nk, c.K, c.seed + 1, 1.0 / std::sqrt(static_cast<double>(c.K)));
    k = unit_rows(nk, c.K, c.seed + 2, 1.0);
    v = randn(nv, c.seed + 3);
    la = uniform(nb, c.seed + 20, -0.7, -0.01), lm = uniform(nb, c.seed + 21, -2.0, -0.05);
    eta = uniform(nb, c.seed + 22, 0.3, 1.7);
    beta = sigmoid_of(randn(nb, c.seed + 23));
    for (size_t i = 0; i < nb; ++i) beta[i] = static_cast<float>((1.0 - std::exp(double(la[i]))) * beta[i]);
    d_o = randn(nv, c.seed + 6);
  }
};

/// The forward (saving Ṽ), the backward from the saved Ṽ and the backward recomputing it, in the emulator under
/// `cfg`; every output and the scratch start as NaN.
Outputs run_emulated(const Case& c, const Inputs& in, emu::Config cfg) {
  emu::config = cfg;
  using bf16 = __nv_bfloat16;
  const size_t nk = c.B * c.T * c.H * c.K, nv = c.B * c.T * c.H * c.V, nb = c.B * c.T * c.H;
  const Buffer q(in.q), k(in.k), v(in.v), la(in.la), beta(in.beta), lm(in.lm), eta(in.eta), d_o(in.d_o);
  const Buffer o(nv), vt(nv);
  size_t scratch_bytes = llmt::cuda::mdn_chunk_fwd_scratch_bytes(c.B, c.T, c.H, c.K, c.V, c.C, true);
  for (const bool saved : {true, false})
    scratch_bytes = std::max(scratch_bytes, llmt::cuda::mdn_chunk_bwd_scratch_bytes(c.B, c.T, c.H, c.K, c.V, c.C, saved));
  Buffer scratch(scratch_bytes / 4 + 1);
  llmt::cuda::mdn_chunk_fwd<bf16>(q.get(), k.get(), v.get(), la.get(), beta.get(), lm.get(), eta.get(), c.B, c.T,
                                  c.H, c.K, c.V, c.C, o.get(), vt.get(), scratch.get(), nullptr);
  Outputs out;
  out.v = {o.host(), vt.host()};
  for (const bool saved : {true, false}) {
    const Buffer dq(nk), dk(nk), dv(nv), dla(nb), dbeta(nb), dlm(nb), deta(nb);
    std::memset(scratch.get(), 0xff, scratch.n * 4);
    llmt::cuda::mdn_chunk_bwd<bf16>(q.get(), k.get(), v.get(), la.get(), beta.get(), lm.get(), eta.get(), d_o.get(),
                                    saved ? vt.get() : nullptr, c.B, c.T, c.H, c.K, c.V, c.C, dq.get(), dk.get(),
                                    dv.get(), dla.get(), dbeta.get(), dlm.get(), deta.get(), scratch.get(), nullptr);
    for (const Buffer* g : {&dq, &dk, &dv, &dla, &dbeta, &dlm, &deta}) out.v.push_back(g->host());
  }
  return out;
}

/// The CPU reference: o, Ṽ and the gradients (the reference's backward recomputes Ṽ).
Outputs run_cpu(const Case& c, const Inputs& in) {
  const llmt::cpu::DeltaDims d{c.B, c.T, c.H, c.K, c.V};
  const llmt::cpu::MdnInputs<float> x{in.q.data(),  in.k.data(),   in.v.data(), in.la.data(), in.beta.data(),
                                      in.lm.data(), in.eta.data(), nullptr,     nullptr};
  Outputs out;
  out.v = {std::vector<float>(in.v.size()), std::vector<float>(in.v.size())};
  llmt::cpu::mdn_chunk_fwd<float>(x, d, out.v[0].data(), nullptr, nullptr, c.C, out.v[1].data());
  std::vector<std::vector<float>> g = {in.q, in.q, in.v, in.la, in.la, in.la, in.la};  // (sizes)
  const llmt::cpu::MdnGrads<float> grads{g[0].data(), g[1].data(), g[2].data(), g[3].data(), g[4].data(),
                                         g[5].data(), g[6].data(), nullptr,     nullptr};
  llmt::cpu::mdn_chunk_bwd<float>(x, in.d_o.data(), nullptr, nullptr, d, grads, c.C);
  for (auto& e : g) out.v.push_back(std::move(e));
  return out;
}

/// What an output is called in messages (index into Outputs::v).
std::string output_name(size_t i) {
  if (i < kFwd) return kNames[i];
  return std::string(kNames[kFwd + (i - kFwd) % kGrads]) + (i >= kFwd + kGrads ? " (recomputing backward)" : "");
}

void check_case(const Case& c) {
  INFO(c.tag());
  const Inputs in(c);
  const std::vector<std::vector<float>> first = outputs_under_every_config(
      [&](emu::Config cfg) { return run_emulated(c, in, cfg).v; }, kFwd + 2 * kGrads, output_name);
  for (int i = 0; i < kGrads; ++i) {  // the backward from the saved Ṽ and the recomputing one: the same bits
    INFO(kNames[kFwd + i] << ": the backward from the saved residuals vs the recomputing backward");
    CHECK(first_difference(first[kFwd + i], first[kFwd + kGrads + i]) == -1);
  }
  const Outputs ref = run_cpu(c, in);
  for (size_t i = 0; i < ref.v.size(); ++i) require_close(first[i], ref.v[i], kNames[i], kBf16CoreTol);
}

}  // namespace

TEST_CASE("cuda emu: bf16 MDN core, K = V = 64, ragged last chunk", "[emu][mdn]") {
  check_case({1, 130, 2, 64, 64, 64, 100});
}

TEST_CASE("cuda emu: bf16 MDN core, partial key and value tiles (K = 100, V = 96)", "[emu][mdn]") {
  check_case({1, 130, 2, 100, 96, 64, 200});
}

TEST_CASE("cuda emu: bf16 MDN core, K = V = 128 (two key and two value tiles)", "[emu][mdn]") {
  check_case({1, 130, 2, 128, 128, 64, 300});
}
