// Next-token sampling (model/sampler.h): greedy, the top-k / top-p restrictions, the sampled frequencies
// against the softmax, determinism for a seed, and the option errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "model/sampler.h"

using namespace llmt;

namespace {
const std::vector<double> kLogits = {0.5, 2.0, -1.0, 1.5, 2.0, 0.0};  // ids 1 and 4 tie for the maximum

std::vector<int> counts(const SamplingOptions& opt, int draws, uint64_t seed = 1) {
  Philox rng(seed, 0);
  std::vector<int> n(kLogits.size(), 0);
  for (int i = 0; i < draws; ++i) ++n[sample_token(kLogits.data(), 6, opt, rng)];
  return n;
}
}  // namespace

TEST_CASE("sampler: greedy is the argmax, ties to the lower id, without randomness", "[sampler]") {
  Philox rng(1, 0), untouched(1, 0);
  CHECK(sample_token(kLogits.data(), 6, {0.0, 0, 1.0}, rng) == 1);
  CHECK(rng.uniform() == untouched.uniform());
  // top_k = 1 and a tiny top_p keep only the most likely id at any temperature
  CHECK(counts({1.0, 1, 1.0}, 50) == std::vector<int>{0, 50, 0, 0, 0, 0});
  CHECK(counts({1.0, 0, 1e-9}, 50) == std::vector<int>{0, 50, 0, 0, 0, 0});
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> with_nan = {nan, 1.0, 3.0};
  CHECK(sample_token(with_nan.data(), 3, {0.0, 0, 1.0}, rng) == 2);
  const std::vector<double> all_nan = {nan, nan};
  CHECK_THROWS_WITH(sample_token(all_nan.data(), 2, {1.0, 0, 1.0}, rng), Catch::Contains("NaN"));
}

TEST_CASE("sampler: frequencies follow the tempered softmax over the kept ids", "[sampler]") {
  const int draws = 40000;
  for (const SamplingOptions opt : {SamplingOptions{1.0, 0, 1.0}, SamplingOptions{0.5, 3, 1.0},
                                    SamplingOptions{2.0, 0, 0.8}}) {
    INFO("temperature " << opt.temperature << " top_k " << opt.top_k << " top_p " << opt.top_p);
    // The kept ids by hand: order 1, 4, 3, 0, 5, 2; top_k 3 keeps {1, 4, 3}; at T = 2 the probabilities of
    // 1, 4, 3 are 0.260, 0.260, 0.203 (sum 0.723 < 0.8), so top_p 0.8 also keeps id 0 (0.123; sum 0.846).
    std::vector<bool> kept(6, true);
    if (opt.top_k == 3) kept = {false, true, false, true, true, false};
    if (opt.top_p < 1) kept = {true, true, false, true, true, false};
    double z = 0.0;
    for (int i = 0; i < 6; ++i) z += kept[i] ? std::exp(kLogits[i] / opt.temperature) : 0.0;
    const auto n = counts(opt, draws);
    for (int i = 0; i < 6; ++i) {
      const double p = kept[i] ? std::exp(kLogits[i] / opt.temperature) / z : 0.0;
      INFO("id " << i << ": " << n[i] << " draws, p = " << p);
      // 5 binomial standard deviations (at most 0.0125 at n = 40000)
      CHECK(std::abs(n[i] / static_cast<double>(draws) - p) <= 5 * std::sqrt(p * (1 - p) / draws) + 1e-12);
    }
  }
}

TEST_CASE("sampler: a seed fixes the draws; bad options name the flag", "[sampler]") {
  CHECK(counts({1.0, 0, 1.0}, 200, 7) == counts({1.0, 0, 1.0}, 200, 7));
  CHECK(counts({1.0, 0, 1.0}, 200, 7) != counts({1.0, 0, 1.0}, 200, 8));
  Philox rng(1, 0);
  CHECK_THROWS_WITH(sample_token(kLogits.data(), 6, {-1.0, 0, 1.0}, rng), Catch::Contains("--temperature"));
  CHECK_THROWS_WITH(sample_token(kLogits.data(), 6, {1.0, -2, 1.0}, rng), Catch::Contains("--top-k"));
  CHECK_THROWS_WITH(sample_token(kLogits.data(), 6, {1.0, 0, 0.0}, rng), Catch::Contains("--top-p"));
  CHECK_THROWS_WITH(sample_token(kLogits.data(), 6, {1.0, 0, 1.5}, rng), Catch::Contains("--top-p"));
}
