// Comba core (layers-delta.md §4.2, §6.2): hand-computed recurrence, chunked form vs. the
// token-by-token oracle (forward and backward, float64), central finite differences of the recurrent
// backward for every input, and float vs. double. Loss for gradients: L = sum(o * R) + sum(S_T * R_S).
#include <catch2/catch.hpp>

#include "delta_test_util.h"

#include <cmath>
#include <cstdint>

#include "core/error.h"
#include "kernels/cpu/comba.h"

namespace {

namespace cpu = llmt::cpu;
using namespace llmt::test;
using namespace llmt::test::delta_core;

// Comba in the shared harness (delta_test_util.h): p̂ drawn independently of k̂, g [B, T, H].
struct Comba {
  static constexpr CoreSpec kSpec{/*has_p=*/true, /*g_per_channel=*/false, /*g_seed=*/20250301};
  template <typename T>
  static constexpr CoreFns kFns{cpu::comba_recurrent_fwd<T>, cpu::comba_chunk_fwd<T>, cpu::comba_recurrent_bwd<T>,
                                cpu::comba_chunk_bwd<T>};
};

}  // namespace

TEST_CASE("comba: hand-computed recurrence, T = 2, K = V = 2", "[kernels][comba]") {
  // S0 = [[1, 2], [0, 1]] (rows = key channels), g = ln 0.5 both steps, beta = (0.5, 0.25),
  // k1 = (1, 0), k2 = (0, 1), p1 = (1, 0), p2 = (1, 1), v1 = (2, 0), v2 = (0, 4), q1 = q2 = (1, 1).
  // t=1: r1 = v1 - S0^T p1 = (2, 0) - (1, 2) = (1, -2);
  //      S1 = 0.5 S0 + 0.5 k1 r1^T = [[0.5, 1], [0, 0.5]] + [[0.5, -1], [0, 0]] = [[1, 0], [0, 0.5]];
  //      o1 = S1^T q1 = (1, 0.5).
  // t=2: r2 = v2 - S1^T p2 = (0, 4) - (1, 0.5) = (-1, 3.5)   (the undecayed S1: a GDN-style order gives (-0.5, 3.75));
  //      S2 = 0.5 S1 + 0.25 k2 r2^T = [[0.5, 0], [0, 0.25]] + [[0, 0], [-0.25, 0.875]] = [[0.5, 0], [-0.25, 1.125]];
  //      o2 = S2^T q2 = (0.25, 1.125).
  Problem p{{1, 2, 1, 2, 2}, {1, 1, 1, 1}, {1, 0, 0, 1}, {2, 0, 0, 4}, {1, 0, 1, 1}, {std::log(0.5), std::log(0.5)},
            {0.5, 0.25},     {1, 2, 0, 1}};
  for (int64_t chunk : {0, 1, 2}) {
    INFO("chunk " << chunk);
    check_out_matches(forward<Comba>(p, chunk), Vec{1.0, 0.5, 0.25, 1.125}, Vec{0.5, 0.0, -0.25, 1.125});
  }
}

TEST_CASE("comba: [B, T, H, *] layout: each head of a batched call equals a single-head call", "[kernels][comba]") {
  check_layout<Comba>();
}

TEST_CASE("comba: chunked forward and backward equal the recurrent form, float64", "[kernels][comba]") {
  for_each_chunk_case<Comba>([](const Problem& p, int64_t chunk) {
    check_chunk_fwd<Comba>(p, chunk);
    check_chunk_bwd<Comba>(p, chunk);
  });
}

TEST_CASE("comba: recurrent backward matches central finite differences for every input", "[kernels][comba]") {
  check_fd<Comba>();
}

TEST_CASE("comba: float agrees with double for all four functions", "[kernels][comba]") {
  check_float_vs_double<Comba>();
}

TEST_CASE("comba: chunk_size must be positive", "[kernels][comba]") {
  const Problem p = make_problem<Comba>({1, 3, 1, 2, 2}, -1.0, -0.1, false, 600);
  CHECK_THROWS_AS(forward<Comba>(p, -1), llmt::Error);
}
