// The CUDA backend's delta-rule ops (short conv + SiLU, L2 norm, gated RMSNorm (also Mamba2's, the gate first), GDN
// and KDA gates, the chunked GDN core, the Comba gates, the chunked Comba core and the chunked KDA core) against the
// CPU reference backend: each op runs through make_backend("cuda") and make_cpu_backend() on the same fresh
// Philox inputs (never zeros; outputs that are overwritten start from random garbage, accumulated
// ones from random values), and the results must agree to max|gpu - cpu| / max|cpu| <= kTol with every output
// finite. The GDN, Comba and KDA cores run each case with fp32 compute (exact fp32 products, kTol) and with bf16
// compute (bf16 operands on the tensor cores, kBf16CoreTol; GDN / Comba with a key_dim beyond the mma scans'
// shared memory also through the WMMA scans), on fresh inputs each. The ops that reduce (dw,
// dA_log, ddt_bias, ddecay, dD, and the GDN, Comba and KDA backwards) must give bit-identical results when
// run twice; the GDN, Comba and KDA backwards run first from what their forward saved (Backend::gdn_saved_numel:
// the chunks' 𝒯, the states h entering them, Δ and W; kda_saved_numel: P, 𝒯, Δ and h), which they must leave as it
// was, then without it (recomputing it), then from the saved set without the states (save_states false: 𝒯; KDA: P and
// 𝒯; its forward's o too), all bit-identical. GDN and Comba also take bf16 q, k, v (p̂) with bf16
// compute, compared with the reference on the same bf16-rounded inputs. The short conv's dx and the gated RMSNorm's
// y and dz, which the layers write in bf16 under bf16 compute, also run so: within half a bf16 ulp of the f32 outputs;
// the short conv's y and the L2 norm's y (the GDN / Comba cores' bf16 v, q̂, k̂, p̂): the f32 outputs rounded, bit for
// bit.
// main() (catch_main_gpu.cpp) skips without a GPU.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "kernels/backend.h"
#include "kernels/cuda/ops.cuh"
#include "cuda_test_util.h"

using namespace llmt::test;

namespace {

using llmt::Backend;
using llmt::DType;
using llmt::OwnedTensor;
using llmt::Tensor;

}  // namespace

TEST_CASE("cuda delta: short conv + SiLU forward and backward (dw accumulates), deterministic, y and dx in f32 or "
          "bf16",
          "[cuda][delta]") {
  // Runs of 32 tokens (T = 37: a full and a partial run per sequence; T = 300: 20 runs, three blocks of 8 runs in
  // the backward, the last partial), one or three blocks of channels (128 a block when four a thread: W <= 4 and
  // C % 4 == 0; else 32), an odd width and channel count, the widest kernel width (kConvMaxWidth = 8).
  for (const auto& [W, C, T] : {std::tuple<int64_t, int64_t, int64_t>{1, 48, 37}, {4, 48, 37}, {4, 300, 37},
                                {8, 48, 37}, {4, 48, 300}, {3, 37, 300}}) {
    const int64_t B = 2;
    const std::string tag = "W=" + std::to_string(W) + " C=" + std::to_string(C) + " T=" + std::to_string(T);
    Pair x = both(randn(B * T * C, 1), {B, T, C}), w = both(randn(C * W, 2, 0.5), {C, 1, W});
    Pair pre = both(randn(B * T * C, 3), {B, T, C}), y = both(randn(B * T * C, 4), {B, T, C});
    gpu().short_conv_silu_fwd(*x.g, *w.g, *pre.g, *y.g);
    cpu().short_conv_silu_fwd(*x.c, *w.c, *pre.c, *y.c);
    require_close(pre, "conv pre " + tag);
    require_close(y, "conv y " + tag);
    // y in bf16 (a GDN / Comba core's v): the f32 y rounded; pre the same.
    OwnedTensor yh(gpu(), DType::bf16, {B, T, C}), pre_h(gpu(), DType::f32, {B, T, C});
    gpu().short_conv_silu_fwd(*x.g, *w.g, *pre_h, *yh);
    CHECK(get_bf16(*yh) == round_bf16(get(gpu(), *y.g)));
    CHECK(get(gpu(), *pre_h) == get(gpu(), *pre.g));

    Pair dy = both(randn(B * T * C, 5), {B, T, C}), dx = both(randn(B * T * C, 6), {B, T, C});
    const auto dw0 = randn(C * W, 7);
    Pair dw = both(dw0, {C, 1, W});
    gpu().short_conv_silu_bwd(*dy.g, *x.g, *w.g, *pre.g, *dx.g, *dw.g);
    cpu().short_conv_silu_bwd(*dy.c, *x.c, *w.c, *pre.c, *dx.c, *dw.c);
    require_close(dx, "conv dx " + tag);
    require_close(dw, "conv dw " + tag);
    const auto first = get(gpu(), *dw.g);
    gpu().upload(dw0.data(), *dw.g);
    gpu().short_conv_silu_bwd(*dy.g, *x.g, *w.g, *pre.g, *dx.g, *dw.g);
    require_bit_identical(first, get(gpu(), *dw.g), "conv dw " + tag);
    // dx in bf16 (what the delta layers' bf16 projections read): the f32 dx rounded (within half a bf16 ulp).
    OwnedTensor dxh(gpu(), DType::bf16, {B, T, C});
    gpu().upload(dw0.data(), *dw.g);
    gpu().short_conv_silu_bwd(*dy.g, *x.g, *w.g, *pre.g, *dxh, *dw.g);
    require_close(get_bf16(*dxh), get(gpu(), *dx.g), "conv dx in bf16 " + tag, 1.0 / 256);
    require_close(dw, "conv dw with dx in bf16 " + tag);
    // dy in bf16 (Mamba2's dxbc from its SSD with bf16 inputs, the conv without a bias): the same bits as from f32 dy
    // holding the rounded values, dx in f32 and in bf16.
    const std::vector<float> dyr = round_bf16(get(gpu(), *dy.g));
    const OwnedTensor dyh = on_bf16(dyr, {B, T, C}), dyf = on(gpu(), dyr, {B, T, C});
    for (const bool dx16 : {false, true}) {
      OwnedTensor dx_f(gpu(), dx16 ? DType::bf16 : DType::f32, {B, T, C}),
          dx_h(gpu(), dx16 ? DType::bf16 : DType::f32, {B, T, C});
      const OwnedTensor dw_f = on(gpu(), dw0, {C, 1, W}), dw_h = on(gpu(), dw0, {C, 1, W});
      gpu().short_conv_silu_bwd(*dyf, *x.g, *w.g, *pre.g, *dx_f, *dw_f);
      gpu().short_conv_silu_bwd(*dyh, *x.g, *w.g, *pre.g, *dx_h, *dw_h);
      const std::string what = std::string(" from bf16 dy (dx in ") + (dx16 ? "bf16) " : "f32) ") + tag;
      if (dx16)
        require_bit_identical(get_bf16(*dx_h), get_bf16(*dx_f), "conv dx" + what);
      else
        require_bit_identical(get(gpu(), *dx_h), get(gpu(), *dx_f), "conv dx" + what);
      require_bit_identical(get(gpu(), *dw_h), get(gpu(), *dw_f), "conv dw" + what);
    }
  }
  // Wider than the kernels take: a clear error naming the limit.
  const int64_t B = 1, T = 5, C = 8, W = llmt::cuda::kConvMaxWidth + 1;
  Pair x = both(randn(B * T * C, 1), {B, T, C}), w = both(randn(C * W, 2), {C, 1, W});
  Pair pre = both(randn(B * T * C, 3), {B, T, C}), y = both(randn(B * T * C, 4), {B, T, C});
  REQUIRE_THROWS_WITH(gpu().short_conv_silu_fwd(*x.g, *w.g, *pre.g, *y.g),
                      Catch::Contains("width (conv_size) must be in [1, 8], got 9"));
}

TEST_CASE("cuda delta: l2norm forward (y in f32 or bf16) and backward (from x) with query scale", "[cuda][delta]") {
  const int64_t rows = 2 * 37 * 3, dim = 64;
  const double eps = 1e-6, scale = 0.125;
  Pair x = both(randn(rows * dim, 11), {rows, dim}), y = both(randn(rows * dim, 12), {rows, dim});
  Pair rinv = both(randn(rows, 13), {rows});
  gpu().l2norm_fwd(*x.g, dim, eps, scale, *y.g, *rinv.g);
  cpu().l2norm_fwd(*x.c, dim, eps, scale, *y.c, *rinv.c);
  require_close(y, "l2norm y");
  require_close(rinv, "l2norm rinv");
  // y in bf16 (a GDN / Comba core's q̂, k̂, p̂): the f32 y rounded; rinv the same.
  OwnedTensor yh(gpu(), DType::bf16, {rows, dim}), rinv_h(gpu(), DType::f32, {rows});
  gpu().l2norm_fwd(*x.g, dim, eps, scale, *yh, *rinv_h);
  CHECK(get_bf16(*yh) == round_bf16(get(gpu(), *y.g)));
  CHECK(get(gpu(), *rinv_h) == get(gpu(), *rinv.g));
  Pair dy = both(randn(rows * dim, 14), {rows, dim}), dx = both(randn(rows * dim, 15), {rows, dim});
  gpu().l2norm_bwd(*dy.g, *x.g, *rinv.g, dim, scale, *dx.g);
  cpu().l2norm_bwd(*dy.c, *x.c, *rinv.c, dim, scale, *dx.c);
  require_close(dx, "l2norm dx");
}

namespace {

// The gated RMSNorm's variants: the gate after the norm (gated_rmsnorm_*, silu or sigmoid; the delta-rule layers) or
// Mamba2's silu gate first (gate_rmsnorm_*).
enum class NormGate { silu_after, sigmoid_after, silu_first };

// One gated-RMSNorm case, rows x dim: forward and backward against the CPU, the backward again (dw bit-identical),
// then y and dz in bf16 (the gate first: then d_o too).
void check_gated_norm(int64_t rows, int64_t dim, NormGate gate) {
  const bool sig = gate == NormGate::sigmoid_after, first = gate == NormGate::silu_first;
  const std::string tag = std::string(first ? "silu first" : sig ? "sigmoid after" : "silu after") +
                          " dim=" + std::to_string(dim);
  INFO(tag);
  const auto fwd = [&](Backend& be, const Tensor& o, const Tensor& z, const Tensor& w, const Tensor& y,
                       const Tensor& rstd) {
    if (first)
      be.gate_rmsnorm_fwd(o, z, w, 1e-5, y, rstd);
    else
      be.gated_rmsnorm_fwd(o, z, w, 1e-5, sig, y, rstd);
  };
  const auto bwd = [&](Backend& be, const Tensor& dy, const Tensor& o, const Tensor& z, const Tensor& w,
                       const Tensor& rstd, const Tensor& d_o, const Tensor& dz, const Tensor& dw) {
    if (first)
      be.gate_rmsnorm_bwd(dy, o, z, w, rstd, d_o, dz, dw);
    else
      be.gated_rmsnorm_bwd(dy, o, z, w, rstd, sig, d_o, dz, dw);
  };
  Pair o = both(randn(rows * dim, 21), {rows, dim}), z = both(randn(rows * dim, 22, 2.0), {rows, dim});
  Pair w = both(randn(dim, 23), {dim}), y = both(randn(rows * dim, 24), {rows, dim});
  Pair rstd = both(randn(rows, 25), {rows});
  fwd(gpu(), *o.g, *z.g, *w.g, *y.g, *rstd.g);
  fwd(cpu(), *o.c, *z.c, *w.c, *y.c, *rstd.c);
  require_close(y, "gated rmsnorm y " + tag);
  require_close(rstd, "gated rmsnorm rstd " + tag);
  Pair dy = both(randn(rows * dim, 26), {rows, dim}), d_o = both(randn(rows * dim, 27), {rows, dim});
  Pair dz = both(randn(rows * dim, 28), {rows, dim});
  const auto dw0 = randn(dim, 29);
  Pair dw = both(dw0, {dim});
  bwd(gpu(), *dy.g, *o.g, *z.g, *w.g, *rstd.g, *d_o.g, *dz.g, *dw.g);
  bwd(cpu(), *dy.c, *o.c, *z.c, *w.c, *rstd.c, *d_o.c, *dz.c, *dw.c);
  require_close(d_o, "gated rmsnorm d_o " + tag);
  require_close(dz, "gated rmsnorm dz " + tag);
  require_close(dw, "gated rmsnorm dw " + tag);
  const auto first_dw = get(gpu(), *dw.g);
  gpu().upload(dw0.data(), *dw.g);
  bwd(gpu(), *dy.g, *o.g, *z.g, *w.g, *rstd.g, *d_o.g, *dz.g, *dw.g);
  require_bit_identical(first_dw, get(gpu(), *dw.g), "gated rmsnorm dw " + tag);
  // y and dz in bf16 (the output and gate / in_proj projections' operands): the f32 ones rounded (within half an
  // ulp).
  OwnedTensor yh(gpu(), DType::bf16, {rows, dim}), dzh(gpu(), DType::bf16, {rows, dim});
  fwd(gpu(), *o.g, *z.g, *w.g, *yh, *rstd.g);
  require_close(get_bf16(*yh), get(gpu(), *y.g), "gated rmsnorm y in bf16 " + tag, 1.0 / 256);
  gpu().upload(dw0.data(), *dw.g);
  bwd(gpu(), *dy.g, *o.g, *z.g, *w.g, *rstd.g, *d_o.g, *dzh, *dw.g);
  require_close(get_bf16(*dzh), get(gpu(), *dz.g), "gated rmsnorm dz in bf16 " + tag, 1.0 / 256);
  require_close(d_o, "gated rmsnorm d_o with dz in bf16 " + tag);
  require_close(dw, "gated rmsnorm dw with dz in bf16 " + tag);
  if (first) {  // d_o in bf16 too (Mamba2's SSD dy, Backend::mamba2_bf16_inputs): the f32 d_o rounded
    OwnedTensor d_oh(gpu(), DType::bf16, {rows, dim});
    gpu().upload(dw0.data(), *dw.g);
    bwd(gpu(), *dy.g, *o.g, *z.g, *w.g, *rstd.g, *d_oh, *dzh, *dw.g);
    require_close(get_bf16(*d_oh), get(gpu(), *d_o.g), "gated rmsnorm d_o in bf16 " + tag, 1.0 / 256);
    require_close(get_bf16(*dzh), get(gpu(), *dz.g), "gated rmsnorm dz in bf16 with d_o in bf16 " + tag, 1.0 / 256);
    require_close(dw, "gated rmsnorm dw with d_o in bf16 " + tag);
    // o (Mamba2's SSD output y) in bf16 too (the SSD with bf16 inputs; the layer's bf16 out, d_o, dz): every output the
    // same bits as from f32 o holding the rounded values.
    const std::vector<float> orr = round_bf16(get(gpu(), *o.g));
    const OwnedTensor oh = on_bf16(orr, {rows, dim}), of = on(gpu(), orr, {rows, dim});
    std::vector<std::vector<float>> outs[2];
    for (const bool half : {false, true}) {
      const Tensor& oi = half ? *oh : *of;
      OwnedTensor yo(gpu(), DType::bf16, {rows, dim}), rs(gpu(), DType::f32, {rows}),
          d_o2(gpu(), DType::bf16, {rows, dim}), dz2(gpu(), DType::bf16, {rows, dim});
      const OwnedTensor dw2 = on(gpu(), dw0, {dim});
      gpu().gate_rmsnorm_fwd(oi, *z.g, *w.g, 1e-5, *yo, *rs);
      gpu().gate_rmsnorm_bwd(*dy.g, oi, *z.g, *w.g, *rs, *d_o2, *dz2, *dw2);
      outs[half] = {get_bf16(*yo), get(gpu(), *rs), get_bf16(*d_o2), get_bf16(*dz2), get(gpu(), *dw2)};
    }
    const char* names[] = {"y", "rstd", "d_o", "dz", "dw"};
    for (size_t i = 0; i < 5; ++i)
      require_bit_identical(outs[1][i], outs[0][i], std::string("gated rmsnorm ") + names[i] + " from bf16 o " + tag);
  }
}

}  // namespace

TEST_CASE("cuda delta: gated rmsnorm forward and backward, both gates after the norm and Mamba2's gate first, "
          "deterministic dw, y and dz (the gate first: and d_o) in f32 or bf16",
          "[cuda][delta]") {
  for (const NormGate gate : {NormGate::silu_after, NormGate::sigmoid_after, NormGate::silu_first})
    check_gated_norm(2 * 300 * 3, 128, gate);  // eight 256-row dw blocks, the last partial
  // Mamba2's one group per token at the 400M configs' Di = 2048: 64 KiB of dw run sums a block (above 48 KiB).
  check_gated_norm(2 * 300, 2048, NormGate::silu_first);
}

namespace {

// One decay-gates case: dim = 1 through gdn_gates_*, dim = d_k through kda_gates_* (per-channel a and dt_bias,
// A_log per head), forward and backward against the CPU, then the backward once more, bit-identical.
void check_gates(int64_t dim, bool kda) {
  const int64_t rows = 2 * 300, H = 3, n = rows * H * dim;
  const std::string tag = std::string(kda ? "kda" : "gdn") + " gates dim=" + std::to_string(dim);
  INFO(tag);
  const auto fwd = kda ? &Backend::kda_gates_fwd : &Backend::gdn_gates_fwd;
  const auto bwd = kda ? &Backend::kda_gates_bwd : &Backend::gdn_gates_bwd;
  Pair a = both(randn(n, 31, 3.0), {rows, H * dim}), b = both(randn(rows * H, 32, 2.0), {rows, H});
  Pair A_log = both(randn(H, 33, 0.5), {H}), dt_bias = both(randn(H * dim, 34), {H * dim});
  Pair g = both(randn(n, 35), {rows, H * dim}), beta = both(randn(rows * H, 36), {rows, H});
  (gpu().*fwd)(*a.g, *b.g, *A_log.g, *dt_bias.g, *g.g, *beta.g);
  (cpu().*fwd)(*a.c, *b.c, *A_log.c, *dt_bias.c, *g.c, *beta.c);
  require_close(g, tag + " g");
  require_close(beta, tag + " beta");
  Pair dg = both(randn(n, 37), {rows, H * dim}), dbeta = both(randn(rows * H, 38), {rows, H});
  Pair da = both(randn(n, 39), {rows, H * dim}), db = both(randn(rows * H, 40), {rows, H});
  const auto dA0 = randn(H, 41), ddt0 = randn(H * dim, 42);
  Pair dA_log = both(dA0, {H}), ddt_bias = both(ddt0, {H * dim});
  (gpu().*bwd)(*dg.g, *dbeta.g, *a.g, *b.g, *A_log.g, *dt_bias.g, *da.g, *db.g, *dA_log.g, *ddt_bias.g);
  (cpu().*bwd)(*dg.c, *dbeta.c, *a.c, *b.c, *A_log.c, *dt_bias.c, *da.c, *db.c, *dA_log.c, *ddt_bias.c);
  require_close(da, tag + " da");
  require_close(db, tag + " db");
  require_close(dA_log, tag + " dA_log");
  require_close(ddt_bias, tag + " ddt_bias");
  const auto first_A = get(gpu(), *dA_log.g), first_dt = get(gpu(), *ddt_bias.g);
  gpu().upload(dA0.data(), *dA_log.g);
  gpu().upload(ddt0.data(), *ddt_bias.g);
  (gpu().*bwd)(*dg.g, *dbeta.g, *a.g, *b.g, *A_log.g, *dt_bias.g, *da.g, *db.g, *dA_log.g, *ddt_bias.g);
  require_bit_identical(first_A, get(gpu(), *dA_log.g), tag + " dA_log");
  require_bit_identical(first_dt, get(gpu(), *ddt_bias.g), tag + " ddt_bias");
}

}  // namespace

TEST_CASE("cuda delta: GDN gates forward and backward, deterministic dA_log and ddt_bias", "[cuda][delta]") {
  check_gates(1, false);
}

TEST_CASE("cuda delta: KDA channel-wise gates forward and backward, deterministic dA_log and ddt_bias",
          "[cuda][delta][kda]") {
  for (const int64_t dim : {1, 16, 128}) check_gates(dim, true);
}

namespace {

// The delta-rule cores' tolerance for a compute dtype (f32: exact fp32 products; bf16: bf16 operands).
double core_tol(DType compute) { return compute == DType::bf16 ? kBf16CoreTol : kTol; }

// The batch of the GDN, Comba and KDA sweeps: 2, or 8 with bf16 compute (see kBf16CoreTol).
int64_t sweep_batch(DType compute) { return compute == DType::bf16 ? 8 : 2; }

// Which core check_gdn runs, with which compute dtype: GDN, or KDA (g per key channel [B, T, H, K], through
// kda_chunk_*); bf16_in: GDN with bf16 q, k, v (compute bf16).
struct GdnCore {
  DType compute;
  bool kda;
  bool bf16_in = false;
};
GdnCore gdn_core(DType compute) { return {compute, false}; }
GdnCore kda_core(DType compute) { return {compute, true}; }
const GdnCore kGdnBf16Inputs{DType::bf16, false, true};

// An input of the GDN and Comba cores (q, k, v, p̂): both(host, dims), or with bf16_in a bf16 GPU tensor and on the
// CPU the same bf16-rounded values in f32 (the reference run on the core's own inputs).
Pair core_input(const std::vector<float>& host, std::initializer_list<int64_t> dims, bool bf16_in) {
  if (!bf16_in) return both(host, dims);
  return Pair{on_bf16(host, dims), on(cpu(), round_bf16(host), dims)};
}

/// The floats of the CUDA GDN / Comba cores' saved set (Backend::gdn_saved_numel), counted here: per chunk and
/// (batch, head) the fp32 64 x 64 𝒯, then with states the K x V state h, the chunk's chunk_size x V rows of Δ and its
/// chunk_size x K rows of W, h, Δ and W in the compute dtype (bf16: two a float), each region rounded up to whole 16
/// bytes.
int64_t gdn_saved_floats(int64_t B, int64_t T, int64_t H, int64_t K, int64_t V, int64_t chunk, DType compute,
                         bool states) {
  const int64_t pairs_chunks = B * H * ((T + chunk - 1) / chunk), bytes = compute == DType::bf16 ? 2 : 4;
  const auto floats = [&](int64_t n) { return (n * bytes + 15) / 16 * 4; };
  return pairs_chunks * 64 * 64 +
         (states ? floats(pairs_chunks * K * V) + floats(pairs_chunks * chunk * V) + floats(pairs_chunks * chunk * K)
                 : 0);
}

/// A GPU buffer of n NaNs (a saved set before the forward writes it).
OwnedTensor nan_buffer(int64_t n) { return on(gpu(), std::vector<float>(n, std::nanf("")), {n}); }

// One GDN or KDA core case: forward o and backward dq, dk, dv, dg, dbeta against the CPU reference, then the
// backward once more on the GPU, bit-identical. The GPU's forward keeps its saved set (GDN: 𝒯, h, Δ and W,
// gdn_saved_numel; KDA: P, 𝒯, Δ and h, kda_saved_numel; NaN before the forward) and its first backward reads it (and
// must leave it bit for bit as the forward wrote it); the second runs without it (forming them again); then a
// forward keeping the saved set without h and Δ (GDN: 𝒯; KDA: P and 𝒯) and a backward from it (forming W, U from 𝒯
// and running the forward scan), o and the gradients bit-identical to the first.
void check_gdn(int64_t B, int64_t T, int64_t H, int64_t K, int64_t V, int64_t chunk, double g_lo, uint64_t seed,
               GdnCore core) {
  const bool kda = core.kda;
  const std::string tag = std::string(kda ? "kda" : "gdn") + " (" + dtype_name(core.compute) + " compute" +
                          (core.bf16_in ? ", bf16 q, k, v" : "") + ") B=" +
                          std::to_string(B) + " T=" + std::to_string(T) + " H=" + std::to_string(H) +
                          " K=" + std::to_string(K) + " V=" + std::to_string(V) + " chunk=" + std::to_string(chunk) +
                          " g in [" + std::to_string(g_lo) + ", 0)";
  INFO(tag);
  const double tol = core_tol(core.compute);
  const int64_t nk = B * T * H * K, nv = B * T * H * V, nb = B * T * H, ng = nb * (kda ? K : 1);
  const auto gate_pair = [&](const std::vector<float>& x) { return kda ? both(x, {B, T, H, K}) : both(x, {B, T, H}); };
  Pair q =
      core_input(unit_rows(nk, K, seed + 1, 1.0 / std::sqrt(static_cast<double>(K))), {B, T, H, K}, core.bf16_in);
  Pair k = core_input(unit_rows(nk, K, seed + 2, 1.0), {B, T, H, K}, core.bf16_in);
  Pair v = core_input(randn(nv, seed + 3), {B, T, H, V}, core.bf16_in);
  Pair g = gate_pair(uniform(ng, seed + 4, g_lo, 0.0));
  Pair beta = both(sigmoid_of(randn(nb, seed + 5)), {B, T, H});
  Pair o = both(randn(nv, seed + 6), {B, T, H, V});
  Pair d_o = both(randn(nv, seed + 7), {B, T, H, V});
  Pair dq = both(randn(nk, seed + 8), {B, T, H, K}), dk = both(randn(nk, seed + 9), {B, T, H, K});
  Pair dv = both(randn(nv, seed + 10), {B, T, H, V});
  Pair dg = gate_pair(randn(ng, seed + 11)), dbeta = both(randn(nb, seed + 12), {B, T, H});
  const auto saved_numel = [&](bool states) {
    return kda ? gpu().kda_saved_numel(B, T, H, K, V, chunk, core.compute, states)
               : gpu().gdn_saved_numel(B, T, H, K, V, chunk, core.compute, states);
  };
  const int64_t n_saved = saved_numel(true), n_tinv = saved_numel(false);
  const int64_t nc = (T + chunk - 1) / chunk, bhc = B * H * nc;
  const auto pad4 = [](int64_t n) { return (n + 3) / 4 * 4; };  // (KDA's P, 𝒯, Δ, h: each 16-byte aligned)
  REQUIRE(n_saved == (kda ? 2 * bhc * 64 * 64 + pad4(bhc * chunk * V) + pad4(bhc * K * V)
                          : gdn_saved_floats(B, T, H, K, V, chunk, core.compute, true)));
  REQUIRE(n_tinv == (kda ? 2 * bhc * 64 * 64 : gdn_saved_floats(B, T, H, K, V, chunk, core.compute, false)));
  for (const bool states : {true, false}) {
    REQUIRE(cpu().gdn_saved_numel(B, T, H, K, V, chunk, core.compute, states) == 0);
    REQUIRE(cpu().kda_saved_numel(B, T, H, K, V, chunk, core.compute, states) == 0);
  }
  const OwnedTensor saved = nan_buffer(n_saved), tinv = nan_buffer(n_tinv);
  const Tensor none;
  // The core's forward / backward on the GPU (on_gpu, with the saved set kept) or the CPU (kept: none), on that
  // backend's tensors.
  const auto fwd = [&](bool on_gpu, const Tensor& kept) {
    const auto t = [&](const Pair& x) -> const Tensor& { return on_gpu ? *x.g : *x.c; };
    Backend& be = on_gpu ? gpu() : cpu();
    if (kda)
      be.kda_chunk_fwd(t(q), t(k), t(v), t(g), t(beta), chunk, core.compute, t(o), kept);
    else
      be.gdn_chunk_fwd(t(q), t(k), t(v), t(g), t(beta), chunk, core.compute, t(o), kept);
  };
  const auto bwd = [&](bool on_gpu, const Tensor& kept) {
    const auto t = [&](const Pair& x) -> const Tensor& { return on_gpu ? *x.g : *x.c; };
    Backend& be = on_gpu ? gpu() : cpu();
    if (kda)
      be.kda_chunk_bwd(t(q), t(k), t(v), t(g), t(beta), t(d_o), kept, chunk, core.compute, t(dq), t(dk), t(dv),
                       t(dg), t(dbeta));
    else
      be.gdn_chunk_bwd(t(q), t(k), t(v), t(g), t(beta), t(d_o), kept, chunk, core.compute, t(dq), t(dk), t(dv),
                       t(dg), t(dbeta));
  };
  fwd(true, *saved);
  fwd(false, none);
  require_close(o, "o " + tag, tol);
  const std::vector<float> o_first = get(gpu(), *o.g), kept = get(gpu(), *saved);
  bwd(true, *saved);
  require_bit_identical(kept, get(gpu(), *saved), "saved set after the backward " + tag);
  bwd(false, none);
  require_close(dq, "dq " + tag, tol);
  require_close(dk, "dk " + tag, tol);
  require_close(dv, "dv " + tag, tol);
  // With T = 1 and no initial state dg is exactly 0 (the decay acts on a zero state), while
  // the GPU's chunk formula leaves fp32 cancellation residue of ~1e-9. Measure dg's error
  // against the size of its sibling per-token gradient dbeta instead of against zero.
  double dbeta_scale = 0;
  for (float x : get(cpu(), *dbeta.c)) dbeta_scale = std::max(dbeta_scale, std::abs(static_cast<double>(x)));
  require_close(dg, "dg " + tag, tol, dbeta_scale);
  require_close(dbeta, "dbeta " + tag, tol);

  std::vector<std::vector<float>> first;
  for (const Pair* p : {&dq, &dk, &dv, &dg, &dbeta}) first.push_back(get(gpu(), *p->g));
  const char* names[] = {"dq", "dk", "dv", "dg", "dbeta"};
  const auto same_as_first = [&](const std::string& how) {
    size_t i = 0;
    for (const Pair* p : {&dq, &dk, &dv, &dg, &dbeta}) {
      require_bit_identical(first[i], get(gpu(), *p->g), std::string(names[i]) + " " + how + " " + tag);
      ++i;
    }
  };
  bwd(true, none);
  same_as_first("recomputed");
  fwd(true, *tinv);
  require_bit_identical(o_first, get(gpu(), *o.g), "o keeping the saved set without h and Δ " + tag);
  const std::vector<float> kept_tinv = get(gpu(), *tinv);
  bwd(true, *tinv);
  require_bit_identical(kept_tinv, get(gpu(), *tinv), "saved set without h and Δ after the backward " + tag);
  same_as_first("from the saved set without h and Δ");
}

}  // namespace

TEST_CASE("cuda delta: GDN chunked core forward and backward, fp32 and bf16 compute, deterministic",
          "[cuda][delta][gdn]") {
  uint64_t seed = 100;
  for (const auto& kv : {std::pair<int64_t, int64_t>{16, 32}, std::pair<int64_t, int64_t>{64, 128}})
    for (const int64_t T : {1, 63, 64, 65, 200})
      for (const int64_t chunk : {16, 64})
        for (const double g_lo : {-5.0, -0.05})
          for (const DType compute : {DType::f32, DType::bf16}) {
            check_gdn(sweep_batch(compute), T, 3, kv.first, kv.second, chunk, g_lo, seed, gdn_core(compute));
            seed += 20;
          }
}

TEST_CASE("cuda delta: GDN chunked core, long sequence T = 4096, fp32 and bf16 compute", "[cuda][delta][gdn]") {
  check_gdn(1, 4096, 2, 64, 64, 64, -0.05, 1700, gdn_core(DType::f32));
  check_gdn(1, 4096, 2, 64, 64, 64, -0.05, 1750, gdn_core(DType::bf16));
}

TEST_CASE("cuda delta: GDN chunked core at the model's head sizes (K = V = 128; K = 256, V = 512), fp32 and bf16 "
          "compute",
          "[cuda][delta][gdn]") {
  uint64_t seed = 1800;
  for (const DType compute : {DType::f32, DType::bf16}) {
    check_gdn(1, 4096, 2, 128, 128, 64, -5.0, seed, gdn_core(compute));        // T = 4096, strong decay
    check_gdn(2, 4000, 1, 128, 128, 64, -0.05, seed + 20, gdn_core(compute));  // ragged T (last chunk: 32 tokens)
    check_gdn(1, 1000, 2, 256, 512, 64, -0.05, seed + 40, gdn_core(compute));  // ragged T, 4 key and 8 value tiles
    check_gdn(1, 300, 1, 256, 512, 64, -5.0, seed + 60, gdn_core(compute));
    seed += 100;
  }
}

TEST_CASE("cuda delta: GDN core refuses chunk_size above the kernel's limit", "[cuda][delta][gdn]") {
  Pair q = both(randn(2 * 8 * 4, 1), {1, 8, 2, 4}), v = both(randn(2 * 8 * 4, 2), {1, 8, 2, 4});
  Pair g = both(uniform(16, 3, -1.0, 0.0), {1, 8, 2}), beta = both(randn(16, 4), {1, 8, 2});
  Pair o = both(randn(2 * 8 * 4, 5), {1, 8, 2, 4});
  for (const DType compute : {DType::f32, DType::bf16})
    REQUIRE_THROWS_WITH(gpu().gdn_chunk_fwd(*q.g, *q.g, *v.g, *g.g, *beta.g, 128, compute, *o.g, Tensor()),
                        Catch::Contains("chunk_size"));
}

TEST_CASE("cuda delta: GDN and KDA cores refuse a saved set of neither size, naming both", "[cuda][delta][gdn][kda]") {
  // B = 1, T = 8, H = 2, K = V = 4, chunk 64: 2 (batch, head) pairs x 1 chunk.
  Pair q = both(randn(2 * 8 * 4, 1), {1, 8, 2, 4}), v = both(randn(2 * 8 * 4, 2), {1, 8, 2, 4});
  Pair g = both(uniform(16, 3, -1.0, 0.0), {1, 8, 2}), gk = both(uniform(64, 3, -1.0, 0.0), {1, 8, 2, 4});
  Pair beta = both(randn(16, 4), {1, 8, 2}), o = both(randn(2 * 8 * 4, 5), {1, 8, 2, 4});
  const DType compute = DType::f32;
  const int64_t gdn_with = gpu().gdn_saved_numel(1, 8, 2, 4, 4, 64, compute, true);
  const int64_t gdn_without = gpu().gdn_saved_numel(1, 8, 2, 4, 4, 64, compute, false);
  const int64_t kda_with = gpu().kda_saved_numel(1, 8, 2, 4, 4, 64, compute, true);
  const int64_t kda_without = gpu().kda_saved_numel(1, 8, 2, 4, 4, 64, compute, false);
  REQUIRE(gdn_without == 2 * 64 * 64);
  REQUIRE(kda_without == 2 * 2 * 64 * 64);
  const OwnedTensor wrong = nan_buffer(gdn_without + 4);
  REQUIRE_THROWS_WITH(gpu().gdn_chunk_fwd(*q.g, *q.g, *v.g, *g.g, *beta.g, 64, compute, *o.g, *wrong),
                      Catch::Contains(std::to_string(gdn_with)) && Catch::Contains(std::to_string(gdn_without)));
  REQUIRE_THROWS_WITH(gpu().kda_chunk_fwd(*q.g, *q.g, *v.g, *gk.g, *beta.g, 64, compute, *o.g, *wrong),
                      Catch::Contains(std::to_string(kda_with)) && Catch::Contains(std::to_string(kda_without)));
}

TEST_CASE("cuda delta: Comba gates forward and backward with both, one or none of decay / D", "[cuda][delta][comba]") {
  const int64_t rows = 2 * 300, H = 3, K = 32;
  for (const int variant : {0, 1, 2}) {  // 0: decay and D, 1: decay only, 2: D only
    const bool has_decay = variant != 2, has_D = variant != 1;
    const std::string tag = std::string(has_decay ? "decay" : "") + (has_D ? " D" : "");
    INFO(tag);
    Pair q = both(randn(rows * H * K, 51), {rows, H * K}), k = both(randn(rows * H * K, 52), {rows, H * K});
    Pair decay = both(randn(H, 53, 2.0), {H}), D = both(randn(H, 54), {H});
    const Tensor none;
    const Tensor& dec_g = has_decay ? *decay.g : none;
    const Tensor& dec_c = has_decay ? *decay.c : none;
    const Tensor& D_g = has_D ? *D.g : none;
    const Tensor& D_c = has_D ? *D.c : none;
    Pair q_out = both(randn(rows * H * K, 55), {rows, H * K}), p = both(randn(rows * H * K, 56), {rows, H * K});
    gpu().comba_gates_fwd(*q.g, *k.g, dec_g, D_g, *q_out.g, *p.g);
    cpu().comba_gates_fwd(*q.c, *k.c, dec_c, D_c, *q_out.c, *p.c);
    require_close(q_out, "comba gates q_out " + tag);
    require_close(p, "comba gates p " + tag);

    Pair dq_out = both(randn(rows * H * K, 57), {rows, H * K}), dp = both(randn(rows * H * K, 58), {rows, H * K});
    const auto dk0 = randn(rows * H * K, 59), ddecay0 = randn(H, 60), dD0 = randn(H, 61);
    Pair dk = both(dk0, {rows, H * K}), ddecay = both(ddecay0, {H}), dD = both(dD0, {H});
    gpu().comba_gates_bwd(*dq_out.g, *dp.g, *k.g, dec_g, D_g, *dk.g, *ddecay.g, *dD.g);
    cpu().comba_gates_bwd(*dq_out.c, *dp.c, *k.c, dec_c, D_c, *dk.c, *ddecay.c, *dD.c);
    require_close(dk, "comba gates dk " + tag);
    require_close(ddecay, "comba gates ddecay " + tag);  // untouched (still ddecay0) without decay
    require_close(dD, "comba gates dD " + tag);          // untouched (still dD0) without D
    const auto first_dk = get(gpu(), *dk.g), first_decay = get(gpu(), *ddecay.g), first_D = get(gpu(), *dD.g);
    gpu().upload(dk0.data(), *dk.g);
    gpu().upload(ddecay0.data(), *ddecay.g);
    gpu().upload(dD0.data(), *dD.g);
    gpu().comba_gates_bwd(*dq_out.g, *dp.g, *k.g, dec_g, D_g, *dk.g, *ddecay.g, *dD.g);
    require_bit_identical(first_dk, get(gpu(), *dk.g), "comba gates dk " + tag);
    require_bit_identical(first_decay, get(gpu(), *ddecay.g), "comba gates ddecay " + tag);
    require_bit_identical(first_D, get(gpu(), *dD.g), "comba gates dD " + tag);
  }
  // Neither decay nor D: refused, as on the CPU.
  Pair q = both(randn(4 * 6, 62), {4, 6}), out = both(randn(4 * 6, 63), {4, 6});
  const Tensor none;
  REQUIRE_THROWS_WITH(gpu().comba_gates_fwd(*q.g, *q.g, none, none, *out.g, *out.g),
                      Catch::Contains("neither decay nor D"));
  REQUIRE_THROWS_WITH(cpu().comba_gates_fwd(*q.c, *q.c, none, none, *out.c, *out.c),
                      Catch::Contains("neither decay nor D"));
  REQUIRE_THROWS_WITH(gpu().comba_gates_bwd(*q.g, *q.g, *q.g, none, none, *out.g, none, none),
                      Catch::Contains("neither decay nor D"));
}

namespace {

// One Comba core case with the given compute dtype: forward o and backward dq, dk, dv, dp, dg, dbeta against the
// CPU reference, then the backward once more on the GPU, bit-identical (the first from the forward's saved 𝒯, the
// second without it, as check_gdn). p̂ is drawn as unit rows independent of k̂. bf16_in: q, k, v, p̂ bf16 on the GPU
// (compute bf16; core_input).
void check_comba(int64_t B, int64_t T, int64_t H, int64_t K, int64_t V, int64_t chunk, double g_lo, uint64_t seed,
                 DType compute, bool bf16_in = false) {
  const std::string tag = std::string("(") + dtype_name(compute) + " compute" + (bf16_in ? ", bf16 q, k, v, p" : "") +
                          ") B=" + std::to_string(B) +
                          " T=" + std::to_string(T) + " H=" + std::to_string(H) + " K=" + std::to_string(K) +
                          " V=" + std::to_string(V) + " chunk=" + std::to_string(chunk) + " g in [" +
                          std::to_string(g_lo) + ", 0)";
  INFO(tag);
  const double tol = core_tol(compute);
  const int64_t nk = B * T * H * K, nv = B * T * H * V, ng = B * T * H;
  Pair q = core_input(unit_rows(nk, K, seed + 1, 1.0 / std::sqrt(static_cast<double>(K))), {B, T, H, K}, bf16_in);
  Pair k = core_input(unit_rows(nk, K, seed + 2, 1.0), {B, T, H, K}, bf16_in);
  Pair p = core_input(unit_rows(nk, K, seed + 13, 1.0), {B, T, H, K}, bf16_in);
  Pair v = core_input(randn(nv, seed + 3), {B, T, H, V}, bf16_in);
  Pair g = both(uniform(ng, seed + 4, g_lo, 0.0), {B, T, H});
  Pair beta = both(sigmoid_of(randn(ng, seed + 5)), {B, T, H});
  Pair o = both(randn(nv, seed + 6), {B, T, H, V});
  const int64_t n_saved = gpu().gdn_saved_numel(B, T, H, K, V, chunk, compute, true);
  const int64_t n_tinv = gpu().gdn_saved_numel(B, T, H, K, V, chunk, compute, false);
  REQUIRE(n_saved == gdn_saved_floats(B, T, H, K, V, chunk, compute, true));
  REQUIRE(n_tinv == gdn_saved_floats(B, T, H, K, V, chunk, compute, false));
  const OwnedTensor saved = nan_buffer(n_saved), tinv = nan_buffer(n_tinv);
  const Tensor none;
  gpu().comba_chunk_fwd(*q.g, *k.g, *v.g, *p.g, *g.g, *beta.g, chunk, compute, *o.g, *saved);
  cpu().comba_chunk_fwd(*q.c, *k.c, *v.c, *p.c, *g.c, *beta.c, chunk, compute, *o.c, none);
  require_close(o, "comba o " + tag, tol);

  Pair d_o = both(randn(nv, seed + 7), {B, T, H, V});
  Pair dq = both(randn(nk, seed + 8), {B, T, H, K}), dk = both(randn(nk, seed + 9), {B, T, H, K});
  Pair dv = both(randn(nv, seed + 10), {B, T, H, V}), dp = both(randn(nk, seed + 14), {B, T, H, K});
  Pair dg = both(randn(ng, seed + 11), {B, T, H}), dbeta = both(randn(ng, seed + 12), {B, T, H});
  const std::vector<float> kept = get(gpu(), *saved);
  gpu().comba_chunk_bwd(*q.g, *k.g, *v.g, *p.g, *g.g, *beta.g, *d_o.g, *saved, chunk, compute, *dq.g, *dk.g, *dv.g,
                        *dp.g, *dg.g, *dbeta.g);
  require_bit_identical(kept, get(gpu(), *saved), "comba saved set after the backward " + tag);
  cpu().comba_chunk_bwd(*q.c, *k.c, *v.c, *p.c, *g.c, *beta.c, *d_o.c, none, chunk, compute, *dq.c, *dk.c, *dv.c,
                        *dp.c, *dg.c, *dbeta.c);
  require_close(dq, "comba dq " + tag, tol);
  require_close(dk, "comba dk " + tag, tol);
  require_close(dv, "comba dv " + tag, tol);
  require_close(dp, "comba dp " + tag, tol);
  // As for GDN: with T = 1 and no initial state dg is exactly 0 on the CPU, while the GPU's chunk
  // formula leaves fp32 cancellation residue; measure dg against the size of dbeta.
  double dbeta_scale = 0;
  for (float x : get(cpu(), *dbeta.c)) dbeta_scale = std::max(dbeta_scale, std::abs(static_cast<double>(x)));
  require_close(dg, "comba dg " + tag, tol, dbeta_scale);
  require_close(dbeta, "comba dbeta " + tag, tol);

  std::vector<std::vector<float>> first;
  for (const Pair* x : {&dq, &dk, &dv, &dp, &dg, &dbeta}) first.push_back(get(gpu(), *x->g));
  const char* names[] = {"dq", "dk", "dv", "dp", "dg", "dbeta"};
  const auto same_as_first = [&](const std::string& how) {
    size_t i = 0;
    for (const Pair* x : {&dq, &dk, &dv, &dp, &dg, &dbeta}) {
      require_bit_identical(first[i], get(gpu(), *x->g), std::string("comba ") + names[i] + " " + how + " " + tag);
      ++i;
    }
  };
  gpu().comba_chunk_bwd(*q.g, *k.g, *v.g, *p.g, *g.g, *beta.g, *d_o.g, none, chunk, compute, *dq.g, *dk.g, *dv.g,
                        *dp.g, *dg.g, *dbeta.g);
  same_as_first("recomputed");
  // The saved set without h and Δ (save_states false: 𝒯 alone): o and the gradients bit-identical.
  const std::vector<float> o_first = get(gpu(), *o.g);
  gpu().comba_chunk_fwd(*q.g, *k.g, *v.g, *p.g, *g.g, *beta.g, chunk, compute, *o.g, *tinv);
  require_bit_identical(o_first, get(gpu(), *o.g), "comba o keeping 𝒯 alone " + tag);
  const std::vector<float> kept_tinv = get(gpu(), *tinv);
  gpu().comba_chunk_bwd(*q.g, *k.g, *v.g, *p.g, *g.g, *beta.g, *d_o.g, *tinv, chunk, compute, *dq.g, *dk.g, *dv.g,
                        *dp.g, *dg.g, *dbeta.g);
  require_bit_identical(kept_tinv, get(gpu(), *tinv), "comba 𝒯 after the backward " + tag);
  same_as_first("from 𝒯 alone");
}

}  // namespace

TEST_CASE("cuda delta: Comba chunked core forward and backward, fp32 and bf16 compute, deterministic",
          "[cuda][delta][comba]") {
  uint64_t seed = 2000;
  for (const auto& kv : {std::pair<int64_t, int64_t>{16, 32}, std::pair<int64_t, int64_t>{64, 128}})
    for (const int64_t T : {1, 63, 64, 65, 200})
      for (const int64_t chunk : {16, 64})
        for (const double g_lo : {-5.0, -0.05})
          for (const DType compute : {DType::f32, DType::bf16}) {
            check_comba(sweep_batch(compute), T, 3, kv.first, kv.second, chunk, g_lo, seed, compute);
            seed += 20;
          }
}

TEST_CASE("cuda delta: Comba chunked core, long sequence T = 4096, fp32 and bf16 compute", "[cuda][delta][comba]") {
  check_comba(1, 4096, 2, 64, 64, 64, -0.05, 3700, DType::f32);
  check_comba(1, 4096, 2, 64, 64, 64, -0.05, 3750, DType::bf16);
}

TEST_CASE("cuda delta: Comba chunked core at the model's head sizes (K = V = 128; K = 256, V = 512), fp32 and bf16 "
          "compute",
          "[cuda][delta][comba]") {
  uint64_t seed = 3800;
  for (const DType compute : {DType::f32, DType::bf16}) {
    check_comba(1, 4096, 2, 128, 128, 64, -5.0, seed, compute);        // T = 4096, strong decay
    check_comba(2, 4000, 1, 128, 128, 64, -0.05, seed + 20, compute);  // ragged T
    check_comba(1, 1000, 2, 256, 512, 64, -0.05, seed + 40, compute);  // ragged T, 4 key and 8 value tiles
    seed += 100;
  }
}

TEST_CASE("cuda delta: GDN and Comba bf16 cores with a key_dim beyond the mma scans' shared memory (tile::Tc scans)",
          "[cuda][delta][gdn][comba]") {
  // K = 320 (> 256): both scans on tile::Tc, every other phase on tile::Mma. K = 200 (a partial fourth key tile):
  // both scans on Mma with four key tiles, their most (K = 256, full key tiles, is in the head-size cases above).
  // Weak or moderate decays (-0.05, -1): with g down to -5 the state carried from chunk to chunk is too small for
  // an error in it to show at kBf16CoreTol.
  check_gdn(1, 300, 1, 320, 64, 64, -1.0, 5180, gdn_core(DType::bf16));
  check_comba(1, 300, 1, 320, 64, 64, -0.05, 5200, DType::bf16);
  check_gdn(2, 130, 1, 200, 96, 64, -0.05, 5220, gdn_core(DType::bf16));
  check_comba(2, 130, 1, 200, 96, 64, -1.0, 5240, DType::bf16);
}

// Short sequences at the benchmarks' tilings (K = V = 128; K = 256, V = 512): every bf16 Mma kernel on its fast
// paths, small enough for compute-sanitizer (racecheck, synccheck) to run in a minute or two.
TEST_CASE("cuda delta: GDN and Comba bf16 cores at the benchmarks' tilings, short sequences",
          "[cuda][delta][gdn][comba]") {
  check_gdn(1, 200, 2, 128, 128, 64, -0.05, 5600, gdn_core(DType::bf16));
  check_comba(1, 200, 2, 128, 128, 64, -1.0, 5620, DType::bf16);
  check_gdn(1, 130, 1, 256, 512, 64, -1.0, 5640, gdn_core(DType::bf16));
  check_comba(1, 130, 1, 256, 512, 64, -0.05, 5660, DType::bf16);
}

TEST_CASE("cuda delta: GDN and Comba bf16 cores with 3 key tiles and with the Mma scans' synchronous loads",
          "[cuda][delta][gdn][comba]") {
  // K = 136: three key tiles, the forward scan's k staging at its largest (222.5 KiB of shared memory). K = 90,
  // V = 70: no row of W, k, U, dO 16-byte aligned, every operand the scans and the backward dqk / wy kernels copy by
  // cp.async elsewhere is loaded synchronously. K = 100, V = 72: W synchronous, k, U, dO by cp.async; the backward
  // wy kernel loads its operands synchronously (dW rows not 16-byte aligned).
  check_gdn(1, 200, 2, 136, 128, 64, -0.05, 5260, gdn_core(DType::bf16));
  check_comba(1, 200, 2, 136, 64, 64, -1.0, 5280, DType::bf16);
  check_gdn(2, 130, 1, 90, 70, 64, -1.0, 5300, gdn_core(DType::bf16));
  check_comba(2, 130, 1, 90, 70, 64, -0.05, 5320, DType::bf16);
  check_gdn(2, 130, 1, 100, 72, 64, -0.05, 5340, gdn_core(DType::bf16));
}

// bf16 q, k, v (Comba: and p̂) in GPU memory, as FLA's kernels take them (compute bf16), against the CPU reference on
// the same bf16-rounded inputs in f32, at kBf16CoreTol: the model's head sizes with T = 4096 and a ragged T; then
// short cases (small enough for compute-sanitizer) at the benchmarks' tilings and through the other paths (chunk 16
// and T = 1; K = 100, V = 72: rows not 16-byte aligned in bf16, every q, k, v load synchronous; K = 192: the backward
// scan's staging ring; K = 320: the tile::Tc scans).
TEST_CASE("cuda delta: GDN and Comba bf16 cores with bf16 q/k/v/p inputs at the model's head sizes",
          "[cuda][delta][gdn][comba]") {
  check_gdn(1, 4096, 2, 128, 128, 64, -5.0, 6000, kGdnBf16Inputs);
  check_gdn(2, 4000, 1, 128, 128, 64, -0.05, 6020, kGdnBf16Inputs);
  check_gdn(1, 4096, 1, 256, 512, 64, -0.05, 6040, kGdnBf16Inputs);
  check_gdn(1, 1000, 2, 256, 512, 64, -1.0, 6060, kGdnBf16Inputs);
  check_comba(1, 4096, 2, 128, 128, 64, -5.0, 6100, DType::bf16, true);
  check_comba(2, 4000, 1, 128, 128, 64, -0.05, 6120, DType::bf16, true);
  check_comba(1, 4096, 1, 256, 512, 64, -0.05, 6140, DType::bf16, true);
  check_comba(1, 1000, 2, 256, 512, 64, -1.0, 6160, DType::bf16, true);
}

TEST_CASE("cuda delta: GDN and Comba bf16 cores with bf16 q/k/v/p inputs in short sequences",
          "[cuda][delta][gdn][comba]") {
  check_gdn(1, 200, 2, 128, 128, 64, -0.05, 6180, kGdnBf16Inputs);
  check_comba(1, 130, 1, 256, 512, 64, -1.0, 6190, DType::bf16, true);
  check_gdn(8, 65, 3, 64, 128, 16, -0.05, 6200, kGdnBf16Inputs);
  check_comba(8, 1, 3, 16, 32, 64, -5.0, 6220, DType::bf16, true);
  check_gdn(2, 130, 1, 100, 72, 64, -1.0, 6240, kGdnBf16Inputs);
  check_comba(2, 130, 1, 100, 72, 64, -0.05, 6260, DType::bf16, true);
  check_gdn(1, 200, 2, 192, 64, 64, -1.0, 6280, kGdnBf16Inputs);
  check_comba(1, 200, 2, 192, 64, 64, -0.05, 6300, DType::bf16, true);
  check_gdn(1, 300, 1, 320, 64, 64, -1.0, 6320, kGdnBf16Inputs);
  check_comba(1, 300, 1, 320, 64, 64, -0.05, 6340, DType::bf16, true);
}

TEST_CASE("cuda delta: GDN and Comba cores refuse bf16 q/k/v with compute f32 and mixed input dtypes",
          "[cuda][delta][gdn][comba]") {
  const int64_t B = 1, T = 8, H = 2, K = 8, V = 8;
  const OwnedTensor qh = on_bf16(randn(B * T * H * K, 1), {B, T, H, K});
  const OwnedTensor vh = on_bf16(randn(B * T * H * V, 2), {B, T, H, V});
  const OwnedTensor qf = on(gpu(), randn(B * T * H * K, 3), {B, T, H, K});
  const OwnedTensor g = on(gpu(), uniform(B * T * H, 4, -1.0, 0.0), {B, T, H});
  const OwnedTensor beta = on(gpu(), randn(B * T * H, 5), {B, T, H});
  const OwnedTensor o = on(gpu(), randn(B * T * H * V, 6), {B, T, H, V});
  REQUIRE_THROWS_WITH(gpu().gdn_chunk_fwd(*qh, *qh, *vh, *g, *beta, 64, DType::f32, *o, Tensor()),
                      Catch::Contains("gdn_chunk_fwd") && Catch::Contains("bf16 q, k, v need compute bf16"));
  REQUIRE_THROWS_WITH(gpu().comba_chunk_fwd(*qh, *qh, *vh, *qh, *g, *beta, 64, DType::f32, *o, Tensor()),
                      Catch::Contains("comba_chunk_fwd") && Catch::Contains("bf16 q, k, v, p need compute bf16"));
  REQUIRE_THROWS_WITH(gpu().gdn_chunk_fwd(*qf, *qh, *vh, *g, *beta, 64, DType::bf16, *o, Tensor()),
                      Catch::Contains("gdn_chunk_fwd") &&
                          Catch::Contains("q, k, v must be all f32 or all bf16, got f32, bf16, bf16"));
}

// Value dim 2048 (32 value tiles): on an H200 (132 SMs) one wave of a scan with one block per SM holds 4 (batch,
// head) pairs, so the 6 pairs here run as two groups (4 + 2), the second on the side stream (by_waves in
// gdn_comba.cu). One block per SM: both fp32 scans (registers), both bf16 scans at K = 128 (the forward's shared
// memory, the backward's registers) and the tile::Tc scans at K = 320. At K = 64 the bf16 forward scan takes two
// blocks per SM (8 pairs a wave: the forward in one group), the backward's one (the backward in two groups).
TEST_CASE("cuda delta: GDN and Comba cores with pairs beyond a whole wave of the scans, in two groups on two "
          "streams (fp32 and bf16 compute)",
          "[cuda][delta][gdn][comba]") {
  check_gdn(2, 130, 3, 128, 2048, 64, -1.0, 5400, gdn_core(DType::f32));
  check_gdn(2, 130, 3, 128, 2048, 64, -0.05, 5420, gdn_core(DType::bf16));
  check_comba(2, 130, 3, 128, 2048, 64, -0.05, 5440, DType::f32);
  check_comba(2, 130, 3, 128, 2048, 64, -1.0, 5460, DType::bf16);
  check_gdn(2, 130, 3, 64, 2048, 64, -1.0, 5480, gdn_core(DType::bf16));
  check_gdn(2, 70, 3, 320, 2048, 64, -0.05, 5500, gdn_core(DType::bf16));
}

TEST_CASE("cuda delta: Comba core refuses chunk_size above the kernel's limit", "[cuda][delta][comba]") {
  Pair q = both(randn(2 * 8 * 4, 1), {1, 8, 2, 4}), v = both(randn(2 * 8 * 4, 2), {1, 8, 2, 4});
  Pair g = both(uniform(16, 3, -1.0, 0.0), {1, 8, 2}), beta = both(randn(16, 4), {1, 8, 2});
  Pair o = both(randn(2 * 8 * 4, 5), {1, 8, 2, 4});
  for (const DType compute : {DType::f32, DType::bf16})
    REQUIRE_THROWS_WITH(gpu().comba_chunk_fwd(*q.g, *q.g, *v.g, *q.g, *g.g, *beta.g, 128, compute, *o.g, Tensor()),
                        Catch::Contains("chunk_size"));
}

TEST_CASE("cuda delta: KDA chunked core forward and backward, fp32 and bf16 compute, deterministic",
          "[cuda][delta][kda]") {
  uint64_t seed = 5000;
  for (const auto& kv : {std::pair<int64_t, int64_t>{16, 32}, std::pair<int64_t, int64_t>{64, 128}})
    for (const int64_t T : {1, 63, 64, 65, 200})
      for (const int64_t chunk : {16, 64})
        for (const double g_lo : {-5.0, -0.05})
          for (const DType compute : {DType::f32, DType::bf16}) {
            check_gdn(sweep_batch(compute), T, 3, kv.first, kv.second, chunk, g_lo, seed, kda_core(compute));
            seed += 20;
          }
}

TEST_CASE("cuda delta: KDA chunked core at the model's head size, K = V = 128, with strong decay, fp32 and bf16 "
          "compute",
          "[cuda][delta][kda]") {
  // g down to -20 per channel (layers-delta.md 11.2): e^{Γ} underflows inside a chunk; the kernel must form
  // e^{Γ_r - Γ_j} directly (never e^{Γ_r} e^{-Γ_j}, which overflows) to match the CPU.
  uint64_t seed = 6000;
  for (const DType compute : {DType::f32, DType::bf16}) {
    check_gdn(1, 130, 2, 128, 128, 64, -20.0, seed, kda_core(compute));
    check_gdn(1, 130, 2, 128, 128, 64, -0.01, seed + 100, kda_core(compute));
    check_gdn(1, 4096, 2, 128, 128, 64, -5.0, seed + 200, kda_core(compute));    // T = 4096, strong decay
    check_gdn(2, 4000, 1, 128, 128, 64, -0.05, seed + 300, kda_core(compute));   // ragged T (last chunk: 32 tokens)
    seed += 1000;
  }
}

TEST_CASE("cuda delta: KDA chunked core, head sizes off the 64-wide tiles and K = 256, fp32 and bf16 compute",
          "[cuda][delta][kda]") {
  // Partial second key and value tiles (K = 80, V = 70; chunk 32), and four key tiles (K = 256: four state
  // tiles in the scans; with bf16 the backward scan falls back to fp32 tiles, its shared memory too large).
  uint64_t seed = 6200;
  for (const DType compute : {DType::f32, DType::bf16}) {
    check_gdn(1, 100, 2, 80, 70, 32, -1.0, seed, kda_core(compute));
    check_gdn(1, 70, 1, 256, 64, 64, -2.0, seed + 100, kda_core(compute));
    seed += 1000;
  }
}

TEST_CASE("cuda delta: KDA bf16 core with and without the cp.async staging of wu, the scans and the backward dqk "
          "and wy kernels",
          "[cuda][delta][kda]") {
  // K = 90, V = 70: no row of q, k, g, v, W, K^g, Q^g, e^{Γ_C} or dW 16-byte aligned, so the wu steps, both scans and
  // the backward dqk / wy key tiles load every tile synchronously. K = 100, V = 72: partial key and value tiles,
  // everything staged. K = 192: three key tiles, wu, dqk and wy staged, both scans synchronous (their staging would
  // not fit). B = 2, H = 34, K = V = 128:
  // 136 scan blocks, more than an H200's 132 SMs, so the launcher runs the forward scan unstaged (two blocks per SM).
  check_gdn(2, 130, 1, 90, 70, 64, -1.0, 6400, kda_core(DType::bf16));
  check_gdn(2, 130, 1, 100, 72, 64, -0.05, 6420, kda_core(DType::bf16));
  check_gdn(1, 130, 2, 192, 96, 64, -1.0, 6440, kda_core(DType::bf16));
  check_gdn(2, 70, 34, 128, 128, 64, -1.0, 6460, kda_core(DType::bf16));
}

TEST_CASE("cuda delta: KDA chunked core, long sequence T = 4096, fp32 and bf16 compute", "[cuda][delta][kda]") {
  check_gdn(1, 4096, 2, 64, 64, 64, -0.05, 7000, kda_core(DType::f32));
  check_gdn(1, 4096, 2, 64, 64, 64, -0.05, 7050, kda_core(DType::bf16));
}

TEST_CASE("cuda delta: KDA core refuses chunk_size above the kernel's limit", "[cuda][delta][kda]") {
  Pair q = both(randn(2 * 8 * 4, 1), {1, 8, 2, 4}), v = both(randn(2 * 8 * 4, 2), {1, 8, 2, 4});
  Pair g = both(uniform(2 * 8 * 4, 3, -1.0, 0.0), {1, 8, 2, 4}), beta = both(randn(16, 4), {1, 8, 2});
  Pair o = both(randn(2 * 8 * 4, 5), {1, 8, 2, 4});
  for (const DType compute : {DType::f32, DType::bf16})
    REQUIRE_THROWS_WITH(gpu().kda_chunk_fwd(*q.g, *q.g, *v.g, *g.g, *beta.g, 128, compute, *o.g, Tensor()),
                        Catch::Contains("chunk_size"));
}
