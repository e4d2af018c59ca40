// The CUDA backend's Mamba2 ops (conv_bias_silu_fwd/bwd, mamba2_ssd_fwd/bwd; layers-ssm-attn.md §1.4,
// §2.5, §2.6) against the CPU reference backend: each op runs through make_backend("cuda") and
// make_cpu_backend() on the same fresh Philox inputs (never zeros; overwritten outputs start from
// random garbage, accumulated ones from random values), and every output must agree to
// max|gpu - cpu| / max|cpu| <= kTol (1e-5) over the whole tensor, with every value finite on both
// sides. The SSD core runs with both compute dtypes: f32 (exact fp32 products) at kTol and bf16 (bf16
// operands on the tensor cores, kernels/cuda/mamba2.cu "Precision") at kBf16CoreTol (2e-2; the per-head
// parameter sums against a floor, head_sum_scales), against the CPU reference (double arithmetic inside).
// The passes run twice and must give bit-identical results, and once more with a saved set (the forward's
// chunk states kept for the backward: Backend::mamba2_saved_numel), bit-identical to the recompute. With bf16
// compute also on bf16 xbc and dy (the official kernels' inputs), writing bf16 y and dxbc (the official kernels'
// outputs), against the CPU on the same bf16-rounded values, and y, dxbc against the GPU's run on f32 inputs holding
// those values: its f32 y, dxbc rounded to bf16 once (every other output bit-identical).
// A NaN in an input must reach the same outputs as on the CPU (the kernels never mask one). main()
// (catch_main_gpu.cpp) skips without a GPU.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/rng.h"
#include "kernels/backend.h"
#include "cuda_test_util.h"
#include "mamba2_head_sums.h"

using namespace llmt::test;

namespace {

using llmt::Backend;

// n values uniform in [lo, hi) from Philox stream `stream`.
std::vector<float> uniform(size_t n, uint64_t stream, double lo, double hi) {
  llmt::Philox rng(20241129, stream);
  std::vector<float> x(n);
  for (float& e : x) e = static_cast<float>(lo + (hi - lo) * rng.uniform());
  return x;
}

std::vector<float> log_of(std::vector<float> x) {
  for (float& e : x) e = static_cast<float>(std::log(static_cast<double>(e)));
  return x;
}

// One SSD call's sizes and parameter ranges. -A = exp(A_log) is drawn from [a_lo, a_hi) and dt_bias
// from [bias_lo, bias_hi); dt_raw ~ N(0, 1), so Δ = softplus(dt_raw + dt_bias).
struct SsdCase {
  int64_t B, T, H, P, N, G, chunk;
  double a_lo, a_hi, bias_lo, bias_hi;
  uint64_t seed;
  llmt::DType compute = llmt::DType::f32;  // the core's compute dtype (mamba2.cu, Precision)
  bool bf16_in = false;                    // (compute bf16) xbc and dy bf16 on the GPU
  std::string tag() const {
    return std::string("(") + llmt::dtype_name(compute) + " compute" + (bf16_in ? ", bf16 xbc, dy" : "") +
           ") B=" + std::to_string(B) +
           " T=" + std::to_string(T) + " H=" + std::to_string(H) +
           " P=" + std::to_string(P) + " N=" + std::to_string(N) + " G=" + std::to_string(G) +
           " chunk=" + std::to_string(chunk) + " -A in [" + std::to_string(a_lo) + ", " + std::to_string(a_hi) +
           ") dt_bias in [" + std::to_string(bias_lo) + ", " + std::to_string(bias_hi) + ")";
  }
};

// Realistic decays (Mamba's init: -A in [1, 16), Δ around 0.02) and strong ones (Δ around 1.3 with
// -A up to 16: a token's decay e^{ΔA} down to ~1e-9, so chunk-level exponents underflow), and weak ones (Δ around
// 3e-4: a 64-token chunk keeps e^Γ ≈ 0.7-1 of the state, so the state passing and its <dS, S_in> term in dA_log,
// ddt_bias are large enough for the tolerance; under the other two e^Γ < 1e-3).
constexpr double kMildBias[2] = {-5.0, -3.0};
constexpr double kStrongBias[2] = {0.5, 1.5};
constexpr double kWeakBias[2] = {-9.0, -7.0};

SsdCase mild(int64_t B, int64_t T, int64_t H, int64_t P, int64_t N, int64_t G, int64_t chunk, uint64_t seed) {
  return {B, T, H, P, N, G, chunk, 1.0, 16.0, kMildBias[0], kMildBias[1], seed};
}
SsdCase strong(int64_t B, int64_t T, int64_t H, int64_t P, int64_t N, int64_t G, int64_t chunk, uint64_t seed) {
  return {B, T, H, P, N, G, chunk, 1.0, 16.0, kStrongBias[0], kStrongBias[1], seed};
}
SsdCase weak(int64_t B, int64_t T, int64_t H, int64_t P, int64_t N, int64_t G, int64_t chunk, uint64_t seed) {
  return {B, T, H, P, N, G, chunk, 1.0, 16.0, kWeakBias[0], kWeakBias[1], seed};
}

// c with the given compute dtype.
SsdCase with(SsdCase c, llmt::DType compute) {
  c.compute = compute;
  return c;
}

// c with compute bf16 and bf16 xbc, dy.
SsdCase bf16_inputs(SsdCase c) {
  c.compute = llmt::DType::bf16;
  c.bf16_in = true;
  return c;
}

// The compute dtypes every SSD case runs with.
constexpr llmt::DType kComputes[2] = {llmt::DType::f32, llmt::DType::bf16};

// xbc or dy of case c: both(host, dims), or with c.bf16_in a bf16 GPU tensor and on the CPU the same bf16-rounded
// values in f32 (the reference run on the core's own inputs).
Pair ssd_input(const SsdCase& c, const std::vector<float>& host, std::initializer_list<int64_t> dims) {
  if (!c.bf16_in) return both(host, dims);
  return Pair{on_bf16(host, dims), on(cpu(), round_bf16(host), dims)};
}

// y or dxbc of case c (garbage to overwrite): both(host, dims), or with c.bf16_in a bf16 GPU tensor (the core writes
// its outputs in its inputs' dtype) and an f32 CPU one.
Pair ssd_output(const SsdCase& c, const std::vector<float>& host, std::initializer_list<int64_t> dims) {
  if (!c.bf16_in) return both(host, dims);
  return Pair{on_bf16(host, dims), on(cpu(), host, dims)};
}

// A GPU tensor's values (f32, or bf16 as floats).
std::vector<float> values(const llmt::Tensor& t) {
  return t.dtype == llmt::DType::bf16 ? get_bf16(t) : get(gpu(), t);
}

// The SSD's inputs on both backends.
struct SsdInputs {
  Pair xbc, dt_raw, dt_bias, A_log, D;
};

SsdInputs ssd_inputs(const SsdCase& c) {
  const int64_t W = c.H * c.P + 2 * c.G * c.N;
  return {ssd_input(c, randn(c.B * c.T * W, c.seed + 1), {c.B, c.T, W}),
          both(randn(c.B * c.T * c.H, c.seed + 2), {c.B, c.T, c.H}),
          both(uniform(c.H, c.seed + 3, c.bias_lo, c.bias_hi), {c.H}),
          both(log_of(uniform(c.H, c.seed + 4, c.a_lo, c.a_hi)), {c.H}),
          both(randn(c.H, c.seed + 5), {c.H})};
}

// Forward y and backward dxbc, ddt_raw, ddt_bias, dA_log, dD against the CPU reference (bf16 compute: the
// per-head sums against at least head_sum_scales), then y and the backward once more on the GPU, bit-identical;
// then both with a saved set, bit-identical to the recompute.
void check_ssd(const SsdCase& c) {
  const std::string tag = c.tag();
  INFO(tag);
  const double tol = c.compute == llmt::DType::bf16 ? kBf16CoreTol : kTol;
  const int64_t W = c.H * c.P + 2 * c.G * c.N, XD = c.H * c.P;
  SsdInputs in = ssd_inputs(c);
  Pair y = ssd_output(c, randn(c.B * c.T * XD, c.seed + 6), {c.B, c.T, XD});
  gpu().mamba2_ssd_fwd(*in.xbc.g, *in.dt_raw.g, *in.dt_bias.g, *in.A_log.g, *in.D.g, c.P, c.G, c.chunk, c.compute,
                       *y.g, llmt::Tensor());
  cpu().mamba2_ssd_fwd(*in.xbc.c, *in.dt_raw.c, *in.dt_bias.c, *in.A_log.c, *in.D.c, c.P, c.G, c.chunk, c.compute,
                       *y.c, llmt::Tensor());
  require_close(values(*y.g), get(cpu(), *y.c), "y " + tag, tol);
  const auto y_first = values(*y.g);
  gpu().mamba2_ssd_fwd(*in.xbc.g, *in.dt_raw.g, *in.dt_bias.g, *in.A_log.g, *in.D.g, c.P, c.G, c.chunk, c.compute,
                       *y.g, llmt::Tensor());
  require_bit_identical(y_first, values(*y.g), "y " + tag);

  Pair dy = ssd_input(c, randn(c.B * c.T * XD, c.seed + 7), {c.B, c.T, XD});
  Pair dxbc = ssd_output(c, randn(c.B * c.T * W, c.seed + 8), {c.B, c.T, W});
  Pair ddt_raw = both(randn(c.B * c.T * c.H, c.seed + 9), {c.B, c.T, c.H});
  const auto acc0 = randn(3 * c.H, c.seed + 10);
  const std::vector<float> db0(acc0.begin(), acc0.begin() + c.H), da0(acc0.begin() + c.H, acc0.begin() + 2 * c.H),
      dd0(acc0.begin() + 2 * c.H, acc0.end());
  Pair ddt_bias = both(db0, {c.H}), dA_log = both(da0, {c.H}), dD = both(dd0, {c.H});
  auto run = [&](Backend& be, bool on_gpu, const llmt::Tensor& saved = llmt::Tensor()) {
    auto t = [&](Pair& p) -> const llmt::Tensor& { return on_gpu ? *p.g : *p.c; };
    be.mamba2_ssd_bwd(t(dy), t(in.xbc), t(in.dt_raw), t(in.dt_bias), t(in.A_log), t(in.D), saved, c.P, c.G,
                      c.chunk, c.compute, t(dxbc), t(ddt_raw), t(ddt_bias), t(dA_log), t(dD));
  };
  run(gpu(), true);
  run(cpu(), false);
  require_close(values(*dxbc.g), get(cpu(), *dxbc.c), "dxbc " + tag, tol);
  require_close(ddt_raw, "ddt_raw " + tag, tol);
  const HeadSumScales floor =
      c.compute == llmt::DType::bf16
          ? head_sum_scales(c.B * c.T, c.H, c.P, W, get(cpu(), *in.xbc.c), get(cpu(), *in.dt_raw.c),
                            get(cpu(), *in.dt_bias.c), get(cpu(), *in.D.c), get(cpu(), *dy.c), get(cpu(), *dxbc.c),
                            get(cpu(), *ddt_raw.c))
          : HeadSumScales{1e-30, 1e-30, 1e-30};
  require_close(ddt_bias, "ddt_bias " + tag, tol, floor.dt_bias);
  require_close(dA_log, "dA_log " + tag, tol, floor.A_log);
  require_close(dD, "dD " + tag, tol, floor.D);

  std::vector<std::vector<float>> first;
  for (const Pair* p : {&dxbc, &ddt_raw, &ddt_bias, &dA_log, &dD}) first.push_back(values(*p->g));
  gpu().upload(db0.data(), *ddt_bias.g);
  gpu().upload(da0.data(), *dA_log.g);
  gpu().upload(dd0.data(), *dD.g);
  run(gpu(), true);
  const char* names[] = {"dxbc", "ddt_raw", "ddt_bias", "dA_log", "dD"};
  const auto same_as_first = [&](const std::string& what) {
    size_t i = 0;
    for (const Pair* p : {&dxbc, &ddt_raw, &ddt_bias, &dA_log, &dD}) {
      require_bit_identical(first[i], values(*p->g), std::string(names[i]) + what + " " + tag);
      ++i;
    }
  };
  same_as_first("");

  // The forward writes the chunk-entering states into `saved` (from garbage), the backward reads them instead of
  // recomputing them.
  const int64_t n_saved = gpu().mamba2_saved_numel(c.B, c.T, c.H, c.P, c.N, c.compute);
  REQUIRE(n_saved > 0);
  const llmt::OwnedTensor saved(gpu(), llmt::DType::f32, {n_saved});
  gpu().upload(randn(static_cast<size_t>(n_saved), c.seed + 11).data(), *saved);
  gpu().mamba2_ssd_fwd(*in.xbc.g, *in.dt_raw.g, *in.dt_bias.g, *in.A_log.g, *in.D.g, c.P, c.G, c.chunk, c.compute,
                       *y.g, *saved);
  require_bit_identical(y_first, values(*y.g), "y (saved) " + tag);
  gpu().upload(db0.data(), *ddt_bias.g);
  gpu().upload(da0.data(), *dA_log.g);
  gpu().upload(dd0.data(), *dD.g);
  run(gpu(), true, *saved);
  same_as_first(" (saved vs recompute)");
  if (!c.bf16_in) return;

  // bf16 inputs: the GPU run on f32 xbc, dy holding the same (rounded) values (f32 y, dxbc): y and dxbc rounded to
  // bf16 once are the bf16 run's, every other output the same bits.
  const int64_t rows = c.B * c.T;
  const llmt::OwnedTensor xf = on(gpu(), get(cpu(), *in.xbc.c), {c.B, c.T, W});
  const llmt::OwnedTensor dyf = on(gpu(), get(cpu(), *dy.c), {c.B, c.T, XD});
  const llmt::OwnedTensor yf(gpu(), llmt::DType::f32, {c.B, c.T, XD}), dxf(gpu(), llmt::DType::f32, {c.B, c.T, W});
  const llmt::OwnedTensor ddtf(gpu(), llmt::DType::f32, {c.B, c.T, c.H});
  const llmt::OwnedTensor dbf = on(gpu(), db0, {c.H}), daf = on(gpu(), da0, {c.H}), ddf = on(gpu(), dd0, {c.H});
  gpu().mamba2_ssd_fwd(*xf, *in.dt_raw.g, *in.dt_bias.g, *in.A_log.g, *in.D.g, c.P, c.G, c.chunk, c.compute, *yf,
                       llmt::Tensor());
  gpu().mamba2_ssd_bwd(*dyf, *xf, *in.dt_raw.g, *in.dt_bias.g, *in.A_log.g, *in.D.g, llmt::Tensor(), c.P, c.G,
                       c.chunk, c.compute, *dxf, *ddtf, *dbf, *daf, *ddf);
  REQUIRE(rows * XD == static_cast<int64_t>(y_first.size()));
  require_bit_identical(y_first, round_bf16(get(gpu(), *yf)), "y (bf16) vs f32 inputs' y rounded " + tag);
  require_bit_identical(first[0], round_bf16(get(gpu(), *dxf)), "dxbc (bf16) vs f32 inputs' dxbc rounded " + tag);
  size_t i = 1;
  for (const llmt::OwnedTensor* t : {&ddtf, &dbf, &daf, &ddf}) {
    require_bit_identical(first[i], get(gpu(), **t), std::string(names[i]) + " (bf16 vs f32 inputs) " + tag);
    ++i;
  }
}

// The positions of the non-finite values of a host array.
std::vector<size_t> non_finite(const std::vector<float>& x) {
  std::vector<size_t> at;
  for (size_t i = 0; i < x.size(); ++i)
    if (!std::isfinite(x[i])) at.push_back(i);
  return at;
}

}  // namespace

TEST_CASE("cuda mamba2: conv + bias + SiLU forward and backward (dw, dbias accumulate), deterministic",
          "[cuda][mamba2]") {
  uint64_t seed = 10;
  for (const int64_t W : {1, 4})
    for (const int64_t T : {1, 37}) {
      const int64_t B = 2, C = 48;
      const std::string tag = "W=" + std::to_string(W) + " T=" + std::to_string(T);
      Pair x = both(randn(B * T * C, seed + 1), {B, T, C}), w = both(randn(C * W, seed + 2, 0.5), {C, 1, W});
      Pair bias = both(randn(C, seed + 3), {C});
      Pair pre = both(randn(B * T * C, seed + 4), {B, T, C}), y = both(randn(B * T * C, seed + 5), {B, T, C});
      gpu().conv_bias_silu_fwd(*x.g, *w.g, *bias.g, *pre.g, *y.g);
      cpu().conv_bias_silu_fwd(*x.c, *w.c, *bias.c, *pre.c, *y.c);
      require_close(pre, "conv pre " + tag);
      require_close(y, "conv y " + tag);

      Pair dy = both(randn(B * T * C, seed + 6), {B, T, C}), dx = both(randn(B * T * C, seed + 7), {B, T, C});
      const auto dw0 = randn(C * W, seed + 8), db0 = randn(C, seed + 9);
      Pair dw = both(dw0, {C, 1, W}), dbias = both(db0, {C});
      gpu().conv_bias_silu_bwd(*dy.g, *x.g, *w.g, *pre.g, *dx.g, *dw.g, *dbias.g);
      cpu().conv_bias_silu_bwd(*dy.c, *x.c, *w.c, *pre.c, *dx.c, *dw.c, *dbias.c);
      require_close(dx, "conv dx " + tag);
      require_close(dw, "conv dw " + tag);
      require_close(dbias, "conv dbias " + tag);
      const auto dw_first = get(gpu(), *dw.g), db_first = get(gpu(), *dbias.g);
      gpu().upload(dw0.data(), *dw.g);
      gpu().upload(db0.data(), *dbias.g);
      gpu().conv_bias_silu_bwd(*dy.g, *x.g, *w.g, *pre.g, *dx.g, *dw.g, *dbias.g);
      require_bit_identical(dw_first, get(gpu(), *dw.g), "conv dw " + tag);
      require_bit_identical(db_first, get(gpu(), *dbias.g), "conv dbias " + tag);
      // y in bf16 (the SSD's xbc with mamba2_bf16_inputs): the f32 y rounded, the same pre
      const llmt::OwnedTensor yh = on_bf16(randn(B * T * C, seed + 10), {B, T, C});
      const llmt::OwnedTensor pre_h = on(gpu(), randn(B * T * C, seed + 11), {B, T, C});
      gpu().conv_bias_silu_fwd(*x.g, *w.g, *bias.g, *pre_h, *yh);
      CHECK(get_bf16(*yh) == round_bf16(get(gpu(), *y.g)));
      CHECK(get(gpu(), *pre_h) == get(gpu(), *pre.g));
      // dy in bf16 (the SSD's dxbc with mamba2_bf16_inputs): dx, dw, dbias the same bits as from f32 dy holding the
      // rounded values
      const std::vector<float> dyr = round_bf16(get(gpu(), *dy.g));
      const llmt::OwnedTensor dyh = on_bf16(dyr, {B, T, C}), dyf = on(gpu(), dyr, {B, T, C});
      llmt::OwnedTensor dx_f(gpu(), llmt::DType::f32, {B, T, C}), dx_h(gpu(), llmt::DType::f32, {B, T, C});
      const llmt::OwnedTensor dw_f = on(gpu(), dw0, {C, 1, W}), dw_h = on(gpu(), dw0, {C, 1, W});
      const llmt::OwnedTensor db_f = on(gpu(), db0, {C}), db_h = on(gpu(), db0, {C});
      gpu().conv_bias_silu_bwd(*dyf, *x.g, *w.g, *pre.g, *dx_f, *dw_f, *db_f);
      gpu().conv_bias_silu_bwd(*dyh, *x.g, *w.g, *pre.g, *dx_h, *dw_h, *db_h);
      require_bit_identical(get(gpu(), *dx_h), get(gpu(), *dx_f), "conv dx from bf16 dy " + tag);
      require_bit_identical(get(gpu(), *dw_h), get(gpu(), *dw_f), "conv dw from bf16 dy " + tag);
      require_bit_identical(get(gpu(), *db_h), get(gpu(), *db_f), "conv dbias from bf16 dy " + tag);
      seed += 10;
    }
}

TEST_CASE("cuda mamba2: SSD forward and backward, small shapes, mild and strong decay, deterministic",
          "[cuda][mamba2]") {
  // T around the kernel's 64-token chunks and the layer's chunk_size (not multiples of either);
  // P, N below, at and across the 64-wide tiles; G = 1, 2 and H (one head per group). (bf16: the state scan
  // stages its tiles by cp.async at P = 16, N = 8 and loads them synchronously where rows are not 16-byte aligned,
  // P = 5 and N = 70; the output and backward chunk kernels copy their S_in / dS tiles by cp.async where N % 8 = 0,
  // N = 8 and 72 (P = 80: 2 x 2 tiles, taken in different orders by the dC / dB and the v̄ products), and load them
  // in place at N = 3 and 70.)
  uint64_t seed = 100;
  // bf16: 4 times the batch, so that each output's largest element is a typical one (with T = 1 and 3 heads, a
  // per-token gradient can be a cancelled C·B of 3 terms; the emulation saw 1.6e-2 of max|ref| at B = 1).
  for (const llmt::DType compute : kComputes)
    for (const int64_t T : {1, 5, 63, 64, 65, 200})
      for (const bool strong_decay : {false, true}) {
        const auto make = strong_decay ? strong : mild;
        const int64_t m = compute == llmt::DType::bf16 ? 4 : 1;
        check_ssd(with(make(2 * m, T, 4, 16, 8, 2, 64, seed), compute));
        check_ssd(with(make(1 * m, T, 3, 5, 3, 3, 16, seed + 20), compute));
        check_ssd(with(make(2 * m, T, 2, 80, 70, 1, 256, seed + 40), compute));
        check_ssd(with(make(1 * m, T, 2, 80, 72, 2, 64, seed + 60), compute));
        seed += 100;
      }
}

TEST_CASE("cuda mamba2: SSD at the tiny config's shape (8 heads x 32, d_state 16, chunk 64)", "[cuda][mamba2]") {
  for (const llmt::DType compute : kComputes) check_ssd(with(mild(3, 67, 8, 32, 16, 1, 64, 2000), compute));
}

TEST_CASE("cuda mamba2: SSD at the 1.3B head shape (64 heads x 64, d_state 128, 1 group)", "[cuda][mamba2]") {
  for (const llmt::DType compute : kComputes) {
    check_ssd(with(mild(1, 300, 64, 64, 128, 1, 256, 3000), compute));
    check_ssd(with(strong(2, 130, 64, 64, 128, 1, 256, 3100), compute));
  }
}

TEST_CASE("cuda mamba2: SSD, long sequence T = 4096", "[cuda][mamba2]") {
  for (const llmt::DType compute : kComputes) {
    check_ssd(with(mild(1, 4096, 2, 64, 128, 1, 256, 4000), compute));
    check_ssd(with(strong(1, 4096, 2, 64, 128, 2, 256, 4100), compute));
    check_ssd(with(weak(1, 4096, 2, 64, 128, 1, 256, 4200), compute));
  }
}

// bf16 xbc and dy (compute bf16): the operand tiles copied by cp.async as they are where P, N are multiples of 8
// (P = 16, N = 8; P = 80, N = 72; the 1.3B heads; the benchmark's 16 heads x 128), else the synchronous loads (P = 5,
// N = 3; N = 70; P = 20); at T = 4096 also the weak decay (the <dS, S_in> term).
TEST_CASE("cuda mamba2: SSD with bf16 xbc and dy (compute bf16), small shapes, the 1.3B heads, T = 4096",
          "[cuda][mamba2]") {
  uint64_t seed = 7000;
  for (const int64_t T : {1, 65, 200})
    for (const bool strong_decay : {false, true}) {
      const auto make = strong_decay ? strong : mild;
      check_ssd(bf16_inputs(make(8, T, 4, 16, 8, 2, 64, seed)));
      check_ssd(bf16_inputs(make(4, T, 3, 5, 3, 3, 16, seed + 20)));
      check_ssd(bf16_inputs(make(8, T, 2, 80, 70, 1, 256, seed + 40)));
      check_ssd(bf16_inputs(make(4, T, 2, 80, 72, 2, 64, seed + 60)));
      check_ssd(bf16_inputs(make(4, T, 2, 20, 64, 1, 64, seed + 80)));
      seed += 100;
    }
  check_ssd(bf16_inputs(mild(1, 300, 64, 64, 128, 1, 256, 8000)));
  check_ssd(bf16_inputs(strong(2, 130, 64, 64, 128, 1, 256, 8100)));
  check_ssd(bf16_inputs(mild(1, 4096, 16, 128, 128, 1, 256, 8200)));
  check_ssd(bf16_inputs(strong(1, 4096, 2, 64, 128, 2, 256, 8300)));
  check_ssd(bf16_inputs(weak(1, 4096, 2, 64, 128, 1, 256, 8400)));
}

TEST_CASE("cuda mamba2: SSD refuses bf16 xbc / dy with compute f32 and mixed input dtypes", "[cuda][mamba2]") {
  const int64_t B = 1, T = 8, H = 2, P = 8, N = 8, W = H * P + 2 * N;
  const llmt::OwnedTensor xh = on_bf16(randn(B * T * W, 1), {B, T, W});
  const llmt::OwnedTensor dyh = on_bf16(randn(B * T * H * P, 2), {B, T, H * P});
  const llmt::OwnedTensor dyf = on(gpu(), randn(B * T * H * P, 3), {B, T, H * P});
  const llmt::OwnedTensor dtr = on(gpu(), randn(B * T * H, 4), {B, T, H}), par = on(gpu(), randn(H, 5), {H});
  const llmt::OwnedTensor y = on(gpu(), randn(B * T * H * P, 6), {B, T, H * P});
  const llmt::OwnedTensor yh = on_bf16(randn(B * T * H * P, 6), {B, T, H * P});
  const llmt::OwnedTensor dxbc = on(gpu(), randn(B * T * W, 7), {B, T, W});
  const llmt::OwnedTensor dxbch = on_bf16(randn(B * T * W, 7), {B, T, W});
  const llmt::OwnedTensor ddtr = on(gpu(), randn(B * T * H, 8), {B, T, H});
  const llmt::OwnedTensor dpar = on(gpu(), randn(H, 9), {H});
  REQUIRE_THROWS_WITH(gpu().mamba2_ssd_fwd(*xh, *dtr, *par, *par, *par, P, 1, 64, llmt::DType::f32, *yh,
                                           llmt::Tensor()),
                      Catch::Contains("mamba2_ssd_fwd") && Catch::Contains("bf16 xbc, y need compute bf16"));
  // y and dxbc in the inputs' dtype (bf16 inputs: bf16 outputs)
  REQUIRE_THROWS_WITH(gpu().mamba2_ssd_fwd(*xh, *dtr, *par, *par, *par, P, 1, 64, llmt::DType::bf16, *y,
                                           llmt::Tensor()),
                      Catch::Contains("mamba2_ssd_fwd") &&
                          Catch::Contains("xbc, y must be all f32 or all bf16, got bf16, f32"));
  REQUIRE_THROWS_WITH(gpu().mamba2_ssd_bwd(*dyh, *xh, *dtr, *par, *par, *par, llmt::Tensor(), P, 1, 64,
                                           llmt::DType::bf16, *dxbc, *ddtr, *dpar, *dpar, *dpar),
                      Catch::Contains("mamba2_ssd_bwd") &&
                          Catch::Contains("dy, xbc, dxbc must be all f32 or all bf16, got bf16, bf16, f32"));
  REQUIRE_THROWS_WITH(gpu().mamba2_ssd_bwd(*dyf, *xh, *dtr, *par, *par, *par, llmt::Tensor(), P, 1, 64,
                                           llmt::DType::bf16, *dxbch, *ddtr, *dpar, *dpar, *dpar),
                      Catch::Contains("mamba2_ssd_bwd") &&
                          Catch::Contains("dy, xbc, dxbc must be all f32 or all bf16, got f32, bf16, bf16"));
  REQUIRE_THROWS_WITH(gpu().mamba2_ssd_bwd(*dyh, *xh, *dtr, *par, *par, *par, llmt::Tensor(), P, 1, 64,
                                           llmt::DType::f32, *dxbch, *ddtr, *dpar, *dpar, *dpar),
                      Catch::Contains("mamba2_ssd_bwd") && Catch::Contains("bf16 dy, xbc, dxbc need compute bf16"));
}

TEST_CASE("cuda mamba2: a NaN in dt_raw reaches the same outputs as on the CPU", "[cuda][mamba2]") {
  for (const llmt::DType compute : kComputes) {
    const SsdCase c = with(mild(1, 150, 2, 16, 8, 1, 64, 5000), compute);
    INFO(c.tag());
    const int64_t XD = c.H * c.P, W = XD + 2 * c.G * c.N;
    SsdInputs in = ssd_inputs(c);
    auto dt = get(cpu(), *in.dt_raw.c);
    dt[70 * c.H + 1] = std::numeric_limits<float>::quiet_NaN();  // token 70, head 1
    gpu().upload(dt.data(), *in.dt_raw.g);
    cpu().upload(dt.data(), *in.dt_raw.c);
    Pair y = both(randn(c.B * c.T * XD, c.seed + 6), {c.B, c.T, XD});
    gpu().mamba2_ssd_fwd(*in.xbc.g, *in.dt_raw.g, *in.dt_bias.g, *in.A_log.g, *in.D.g, c.P, c.G, c.chunk, c.compute,
                         *y.g, llmt::Tensor());
    cpu().mamba2_ssd_fwd(*in.xbc.c, *in.dt_raw.c, *in.dt_bias.c, *in.A_log.c, *in.D.c, c.P, c.G, c.chunk, c.compute,
                         *y.c, llmt::Tensor());
    const auto yc = non_finite(get(cpu(), *y.c));
    REQUIRE(!yc.empty());
    CHECK(non_finite(get(gpu(), *y.g)) == yc);

    Pair dy = both(randn(c.B * c.T * XD, c.seed + 7), {c.B, c.T, XD});
    Pair dxbc = both(randn(c.B * c.T * W, c.seed + 8), {c.B, c.T, W});
    Pair ddt_raw = both(randn(c.B * c.T * c.H, c.seed + 9), {c.B, c.T, c.H});
    Pair ddt_bias = both(randn(c.H, c.seed + 10), {c.H}), dA_log = both(randn(c.H, c.seed + 11), {c.H});
    Pair dD = both(randn(c.H, c.seed + 12), {c.H});
    gpu().mamba2_ssd_bwd(*dy.g, *in.xbc.g, *in.dt_raw.g, *in.dt_bias.g, *in.A_log.g, *in.D.g, llmt::Tensor(), c.P,
                         c.G, c.chunk, c.compute, *dxbc.g, *ddt_raw.g, *ddt_bias.g, *dA_log.g, *dD.g);
    cpu().mamba2_ssd_bwd(*dy.c, *in.xbc.c, *in.dt_raw.c, *in.dt_bias.c, *in.A_log.c, *in.D.c, llmt::Tensor(), c.P,
                         c.G, c.chunk, c.compute, *dxbc.c, *ddt_raw.c, *ddt_bias.c, *dA_log.c, *dD.c);
    CHECK(!non_finite(get(gpu(), *dxbc.g)).empty());
    for (const Pair* p : {&ddt_bias, &dA_log, &dD})
      CHECK(non_finite(get(gpu(), *p->g)) == non_finite(get(cpu(), *p->c)));
    CHECK(!non_finite(get(gpu(), *dA_log.g)).empty());
  }
}

TEST_CASE("cuda mamba2: SSD refuses n_groups that do not divide the heads and chunk_size < 1", "[cuda][mamba2]") {
  const SsdCase c = mild(1, 8, 3, 4, 4, 2, 4, 6000);  // xbc width 3*4 + 2*2*4 = 28: shapes fine, 2 does not divide 3
  SsdInputs in = ssd_inputs(c);
  Pair y = both(randn(c.B * c.T * c.H * c.P, 1), {c.B, c.T, c.H * c.P});
  CHECK_THROWS(gpu().mamba2_ssd_fwd(*in.xbc.g, *in.dt_raw.g, *in.dt_bias.g, *in.A_log.g, *in.D.g, c.P, c.G, 64,
                                    c.compute, *y.g, llmt::Tensor()));
  CHECK_THROWS(gpu().mamba2_ssd_fwd(*in.xbc.g, *in.dt_raw.g, *in.dt_bias.g, *in.A_log.g, *in.D.g, c.P, 1, 0,
                                    c.compute, *y.g, llmt::Tensor()));
}
