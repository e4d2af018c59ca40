// Gated DeltaNet core (layers-delta.md §4.1, §6): hand-computed recurrence, chunked form vs. the
// token-by-token oracle (forward and backward, float64), central finite differences of the recurrent
// backward for every input, and float vs. double. Loss for gradients: L = sum(o * R) + sum(S_T * R_S).
#include <catch2/catch.hpp>

#include "delta_test_util.h"

#include <cmath>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "kernels/backend.h"
#include "kernels/cpu/gdn.h"

namespace {

namespace cpu = llmt::cpu;
using namespace llmt::test;
using namespace llmt::test::delta_core;

// GDN in the shared harness (delta_test_util.h): no p̂, g [B, T, H] (one log-decay per token).
struct Gdn {
  static constexpr CoreSpec kSpec{/*has_p=*/false, /*g_per_channel=*/false, /*g_seed=*/20250301};
  template <typename T>
  static constexpr CoreFns kFns{cpu::gdn_recurrent_fwd<T>, cpu::gdn_chunk_fwd<T>, cpu::gdn_recurrent_bwd<T>,
                                cpu::gdn_chunk_bwd<T>};
};

}  // namespace

TEST_CASE("gdn: hand-computed recurrence, T = 2, K = V = 2", "[kernels][gdn]") {
  // S0 = [[1, 2], [0, 1]] (rows = key channels), g = ln 0.5 both steps, beta = (0.5, 0.25),
  // k1 = (1, 0), k2 = (0, 1), v1 = (2, 0), v2 = (0, 4), q1 = q2 = (1, 1).
  // t=1: S̄ = 0.5 S0 = [[0.5, 1], [0, 0.5]]; S̄^T k1 = (0.5, 1); δ1 = 0.5 ((2, 0) - (0.5, 1)) = (0.75, -0.5);
  //      S1 = S̄ + k1 δ1^T = [[1.25, 0.5], [0, 0.5]]; o1 = S1^T q1 = (1.25, 1.0).
  // t=2: S̄ = 0.5 S1 = [[0.625, 0.25], [0, 0.25]]; S̄^T k2 = (0, 0.25); δ2 = 0.25 ((0, 4) - (0, 0.25)) = (0, 0.9375);
  //      S2 = [[0.625, 0.25], [0, 1.1875]]; o2 = S2^T q2 = (0.625, 1.4375).
  // p = {}: no p̂.
  Problem p{{1, 2, 1, 2, 2}, {1, 1, 1, 1}, {1, 0, 0, 1}, {2, 0, 0, 4}, {}, {std::log(0.5), std::log(0.5)},
            {0.5, 0.25},     {1, 2, 0, 1}};
  for (int64_t chunk : {0, 1, 2}) {
    INFO("chunk " << chunk);
    check_out_matches(forward<Gdn>(p, chunk), Vec{1.25, 1.0, 0.625, 1.4375}, Vec{0.625, 0.25, 0.0, 1.1875});
  }
}

TEST_CASE("gdn: [B, T, H, *] layout: each head of a batched call equals a single-head call", "[kernels][gdn]") {
  check_layout<Gdn>();
}

TEST_CASE("gdn: chunked forward and backward equal the recurrent form, float64", "[kernels][gdn]") {
  for_each_chunk_case<Gdn>([](const Problem& p, int64_t chunk) {
    check_chunk_fwd<Gdn>(p, chunk);
    check_chunk_bwd<Gdn>(p, chunk);
  });
}

TEST_CASE("gdn: recurrent backward matches central finite differences for every input", "[kernels][gdn]") {
  check_fd<Gdn>();
}

TEST_CASE("gdn: float agrees with double for all four functions", "[kernels][gdn]") { check_float_vs_double<Gdn>(); }

TEST_CASE("gdn: chunk_size must be positive", "[kernels][gdn]") {
  const Problem p = make_problem<Gdn>({1, 3, 1, 2, 2}, -1.0, -0.1, false, 600);
  CHECK_THROWS_AS(forward<Gdn>(p, -1), llmt::Error);
}

TEST_CASE("gdn, comba: the CPU backend refuses bf16 q, k, v (p) naming the op", "[kernels][gdn][comba]") {
  using llmt::DType;
  using llmt::OwnedTensor;
  auto be = llmt::make_cpu_backend();
  const int64_t B = 1, T = 4, H = 1, K = 8, V = 8, C = 4;
  const auto t = [&](DType d, std::initializer_list<int64_t> dims) { return OwnedTensor(*be, d, dims); };
  const OwnedTensor q = t(DType::bf16, {B, T, H, K}), k = t(DType::bf16, {B, T, H, K});
  const OwnedTensor p = t(DType::bf16, {B, T, H, K}), v = t(DType::bf16, {B, T, H, V});
  const OwnedTensor g = t(DType::f32, {B, T, H}), beta = t(DType::f32, {B, T, H}), o = t(DType::f32, {B, T, H, V});
  const OwnedTensor dq = t(DType::f32, {B, T, H, K}), dk = t(DType::f32, {B, T, H, K});
  const OwnedTensor dp = t(DType::f32, {B, T, H, K});
  const OwnedTensor dv = t(DType::f32, {B, T, H, V}), dg = t(DType::f32, {B, T, H}), dbeta = t(DType::f32, {B, T, H});
  const llmt::Tensor none;
  const std::string refused = "the cpu backend takes q, k, v";
  CHECK_THROWS_WITH(be->gdn_chunk_fwd(*q, *k, *v, *g, *beta, C, DType::bf16, *o, none),
                    Catch::StartsWith("gdn_chunk_fwd: " + refused) && Catch::Contains("got bf16"));
  CHECK_THROWS_WITH(be->gdn_chunk_bwd(*q, *k, *v, *g, *beta, *o, none, C, DType::bf16, *dq, *dk, *dv, *dg, *dbeta),
                    Catch::StartsWith("gdn_chunk_bwd: " + refused) && Catch::Contains("got bf16"));
  CHECK_THROWS_WITH(be->comba_chunk_fwd(*q, *k, *v, *p, *g, *beta, C, DType::bf16, *o, none),
                    Catch::StartsWith("comba_chunk_fwd: " + refused + ", p") && Catch::Contains("got bf16"));
  CHECK_THROWS_WITH(
      be->comba_chunk_bwd(*q, *k, *v, *p, *g, *beta, *o, none, C, DType::bf16, *dq, *dk, *dv, *dp, *dg, *dbeta),
      Catch::StartsWith("comba_chunk_bwd: " + refused + ", p") && Catch::Contains("got bf16"));
}
