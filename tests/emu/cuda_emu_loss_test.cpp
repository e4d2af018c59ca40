// The softmax cross-entropy kernel (src/kernels/cuda/cross_entropy.cu) run by the CPU emulator (cuda_emu.h) through
// its own launcher, no GPU: fp32 and bf16 logits; vocabularies below one 16-byte piece (7), of a few pieces with a
// ragged end (1000 + 3), and GPT-2's odd 50257 both with dense rows (ld = vocab: each row starts at another offset
// from a 16-byte boundary, so the scalar head, the pieces and the scalar tail all occur) and with the CUDA
// backend's padded stride (ld = 50304: every row aligned); rows without a label, targets at a row's first and last
// element and at a piece's edges, rows whose target ties another logit for the maximum, -inf logits. Every output
// must be
// (a) finite and bit-identical under every schedule of the emulator (tests/emu/cuda_emu_test.h);
// (b) within kTol of the CPU reference (cpu::cross_entropy_fwd_bwd<double> on the same, for bf16 already rounded,
//     logits): the losses, and the gradient (bf16: within its rounding, 2^-8 of the largest element); the argmax
//     flags equal;
// (c) the padding between vocab and ld untouched.
// And a NaN logit makes its row's loss and gradient NaN, and only its row's. Run with `ctest -L emu`.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "../cuda_test_host.h"
#include "cuda_emu.h"
#include "cuda_emu_test.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cuda/ops.cuh"

using namespace llmt::test;
using namespace llmt::test::emu_test;

namespace {

constexpr float kPad = 123.0f;

/// Device-like memory of n logits of type T (256-byte aligned, as cudaMalloc's), from host floats.
template <typename T>
struct Logits {
  Buffer b;
  size_t n;
  explicit Logits(const std::vector<float>& x) : b((x.size() * sizeof(T) + 3) / 4), n(x.size()) {
    for (size_t i = 0; i < n; ++i) get()[i] = from(x[i]);
  }
  static T from(float v) {
    if constexpr (std::is_same_v<T, float>) return v;
    else return __float2bfloat16_rn(v);
  }
  T* get() const { return reinterpret_cast<T*>(b.get()); }
  std::vector<float> host() const {
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) {
      if constexpr (std::is_same_v<T, float>) x[i] = get()[i];
      else x[i] = __bfloat162float(get()[i]);
    }
    return x;
  }
};

/// Targets of `rows` rows over `vocab`: random ids, every 5th row unlabelled (-1), and the special places: the
/// first and last element, both sides of the first 16-byte boundaries.
std::vector<int32_t> make_targets(int64_t rows, int64_t vocab, uint64_t seed) {
  llmt::Philox rng(20261201, seed);
  std::vector<int32_t> t(static_cast<size_t>(rows));
  const int32_t special[] = {0, static_cast<int32_t>(vocab - 1), 7, 8, 15, 16};
  for (int64_t r = 0; r < rows; ++r) {
    t[r] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
    if (r % 7 < 6 && special[r % 7] < vocab) t[r] = special[r % 7];
    if (r % 5 == 4) t[r] = -1;
  }
  return t;
}

template <typename T>
void check(int64_t rows, int64_t vocab, int64_t ld, uint64_t seed) {
  INFO((std::is_same_v<T, float> ? "fp32" : "bf16") << " logits, rows " << rows << " vocab " << vocab << " ld " << ld);
  const std::vector<int32_t> targets = make_targets(rows, vocab, seed);
  std::vector<float> z(static_cast<size_t>(rows * ld), kPad);
  const std::vector<float> draw = randn(static_cast<size_t>(rows * vocab), seed + 1, 3.0);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = z.data() + r * ld;
    std::copy_n(draw.data() + r * vocab, vocab, row);
    const int32_t t = targets[r];
    if (t >= 0 && r % 3 == 0) {  // the target the unique maximum (r % 6 == 0) or tied with another logit (== 3)
      row[t] = *std::max_element(row, row + vocab) + 1.0f;
      if (r % 6 == 3 && vocab > 1) row[(t + 1 + r) % vocab] = row[t];
    }
    if (r % 4 == 2 && (r * 31) % vocab != t) row[(r * 31) % vocab] = -INFINITY;  // (not the target: loss +inf)
  }
  const double grad_scale = 0.37;
  const char* const names[] = {"losses", "correct", "gradient"};
  const auto out = outputs_under_every_config(
      [&](emu::Config cfg) {
        emu::config = cfg;
        Logits<T> lg(z);
        Buffer losses(static_cast<size_t>(rows)), correct(static_cast<size_t>(rows));
        llmt::cuda::cross_entropy(lg.get(), targets.data(), rows, vocab, ld, grad_scale, losses.get(), correct.get(),
                                  nullptr);
        return std::vector<std::vector<float>>{losses.host(), correct.host(), lg.host()};
      },
      3, [&](size_t i) { return names[i]; });
  // The reference on the logits as the kernel saw them (bf16: rounded), in double.
  const std::vector<float> seen = Logits<T>(z).host();
  std::vector<double> zd(seen.begin(), seen.end()), ld_(static_cast<size_t>(rows)), cd(static_cast<size_t>(rows));
  llmt::cpu::cross_entropy_fwd_bwd<double>(zd.data(), targets.data(), rows, vocab, grad_scale, ld_.data(), cd.data(),
                                           ld);
  require_close(out[0], std::vector<float>(ld_.begin(), ld_.end()), "losses");
  CHECK(first_difference(out[1], std::vector<float>(cd.begin(), cd.end())) == -1);
  int64_t right = 0;
  for (const float c : out[1]) right += c == 1.0f;
  CHECK(right > 0);  // (some rows have the target the unique maximum)
  std::vector<float> g, gref;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < ld; ++j) {
      const size_t i = static_cast<size_t>(r * ld + j);
      if (j >= vocab) {
        INFO("padding at row " << r << " column " << j);
        REQUIRE(out[2][i] == kPad);
        continue;
      }
      g.push_back(out[2][i]);
      gref.push_back(static_cast<float>(zd[i]));
    }
  require_close(g, gref, "gradient", std::is_same_v<T, float> ? kTol : 1.0 / 256);
}

template <typename T>
void check_nan_row() {
  INFO((std::is_same_v<T, float> ? "fp32" : "bf16") << " logits with a NaN");
  const int64_t rows = 4, vocab = 1003;
  std::vector<float> z = randn(static_cast<size_t>(rows * vocab), 77);
  z[1 * vocab + 500] = NAN;  // inside a piece
  z[2 * vocab + 1002] = NAN;  // in the scalar tail
  const std::vector<int32_t> targets = {3, 4, 5, 6};
  Logits<T> lg(z);
  Buffer losses(rows);
  llmt::cuda::cross_entropy(lg.get(), targets.data(), rows, vocab, vocab, 1.0, losses.get(), nullptr, nullptr);
  const std::vector<float> l = losses.host(), g = lg.host();
  for (int64_t r = 0; r < rows; ++r) {
    INFO("row " << r);
    const bool poisoned = r == 1 || r == 2;
    CHECK(std::isnan(l[r]) == poisoned);
    size_t nan = 0;
    for (int64_t j = 0; j < vocab; ++j) nan += std::isnan(g[static_cast<size_t>(r * vocab + j)]);
    CHECK(nan == (poisoned ? static_cast<size_t>(vocab) : 0u));
  }
}

}  // namespace

TEST_CASE("emu cross_entropy: fp32 and bf16 logits, aligned and unaligned rows, against the CPU", "[emu]") {
  check<float>(12, 7, 7, 1);
  check<__nv_bfloat16>(12, 7, 7, 2);
  check<float>(14, 1003, 1003, 3);
  check<__nv_bfloat16>(14, 1003, 1003, 4);
  check<float>(9, 50257, 50257, 5);
  check<__nv_bfloat16>(9, 50257, 50257, 6);
  check<__nv_bfloat16>(7, 50257, 50304, 7);
}

TEST_CASE("emu cross_entropy: a NaN logit poisons its row only", "[emu]") {
  check_nan_row<float>();
  check_nan_row<__nv_bfloat16>();
}
