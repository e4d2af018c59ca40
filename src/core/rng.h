// Philox-4x32-10 counter-based random numbers (Salmon et al., SC'11). A stream is a
// (seed, stream id) key; the n-th draw depends only on (key, n), so initialisation and
// data order are reproducible independently of the order in which things are created, and
// a CUDA kernel can later draw the same numbers.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>

namespace llmt {

class Philox {
 public:
  /// seed: the run's seed; stream: an id that separates independent uses (a parameter
  /// index, an epoch of the data order, ...).
  Philox(uint64_t seed, uint64_t stream) : key_{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)},
        stream_(stream) {}

  /// Four uniform 32-bit words for block `counter`.
  std::array<uint32_t, 4> block(uint64_t counter) const {
    std::array<uint32_t, 4> c{static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32),
                              static_cast<uint32_t>(stream_), static_cast<uint32_t>(stream_ >> 32)};
    std::array<uint32_t, 2> k = key_;
    for (int round = 0; round < 10; ++round) {
      const uint64_t p0 = uint64_t{0xD2511F53u} * c[0];
      const uint64_t p1 = uint64_t{0xCD9E8D57u} * c[2];
      c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
           static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
      k[0] += 0x9E3779B9u;
      k[1] += 0xBB67AE85u;
    }
    return c;
  }

  /// Positions the stream so that the next next_u32() returns its `word`-th 32-bit word (0-based;
  /// word w lies in block w / 4). Lets several threads draw disjoint ranges of one stream and get
  /// exactly the numbers one sequential pass would (uniform() takes 2 words, normal() 4).
  void skip_to(uint64_t word) {
    counter_ = word / 4;
    used_ = 4;
    if (word % 4 != 0) {
      buf_ = block(counter_++);
      used_ = static_cast<int>(word % 4);
    }
  }
  /// The next uniform 32-bit word of the stream.
  uint32_t next_u32() {
    if (used_ == 4) {
      buf_ = block(counter_++);
      used_ = 0;
    }
    return buf_[used_++];
  }
  /// Uniform in [0, 1) with 53 random bits.
  double uniform() {
    const uint64_t hi = next_u32() >> 5, lo = next_u32() >> 6;
    return (static_cast<double>(hi) * 67108864.0 + static_cast<double>(lo)) * (1.0 / 9007199254740992.0);
  }
  /// Standard normal by Box-Muller (one value per call; the pair's second half is dropped
  /// so that the n-th value depends only on n).
  double normal() {
    const double u1 = 1.0 - uniform();  // (0, 1]
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  /// Uniform integer in [0, n) (n > 0), by rejection so it is unbiased.
  uint64_t below(uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    for (;;) {
      const uint64_t r = (uint64_t{next_u32()} << 32) | next_u32();
      if (r < limit) return r % n;
    }
  }

 private:
  std::array<uint32_t, 2> key_;
  uint64_t stream_;
  uint64_t counter_ = 0;
  std::array<uint32_t, 4> buf_{};
  int used_ = 4;
};

}  // namespace llmt
