// Helpers of the CPU emulator's tests (tests/emu/*_test.cpp): device-like buffers (also bf16 inputs and outputs),
// the emulator configurations every test runs under, and bit comparison.
#pragma once
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../cuda_test_host.h"
#include "cuda_emu.h"

namespace llmt::test::emu_test {

/// Device-like memory: 256-byte aligned (as cudaMalloc's), filled with 0xff bytes (NaN) or given values.
struct Buffer {
  std::unique_ptr<float, decltype(&std::free)> p{nullptr, &std::free};
  size_t n = 0;
  explicit Buffer(size_t count) : n(count) {
    const size_t bytes = (count * sizeof(float) + 255) / 256 * 256 + 256;
    p.reset(static_cast<float*>(std::aligned_alloc(256, bytes)));
    std::memset(p.get(), 0xff, bytes);
  }
  explicit Buffer(const std::vector<float>& x) : Buffer(x.size()) { std::memcpy(p.get(), x.data(), x.size() * 4); }
  float* get() const { return p.get(); }
  std::vector<float> host() const { return std::vector<float>(p.get(), p.get() + n); }
};

/// x as a kernel's input of element type E (float or __nv_bfloat16): a Buffer holding x (float), or x's bf16 bits (x
/// already rounded: bf16_bits).
template <typename E>
struct Input {
  Buffer b;
  explicit Input(const std::vector<float>& x) : b(std::is_same_v<E, float> ? x.size() : x.size() / 2 + 1) {
    if constexpr (std::is_same_v<E, float>) {
      std::memcpy(b.get(), x.data(), 4 * x.size());
    } else {
      uint16_t* h = reinterpret_cast<uint16_t*>(b.get());
      for (size_t i = 0; i < x.size(); ++i) h[i] = bf16_bits(x[i]);
    }
  }
  const E* get() const { return reinterpret_cast<const E*>(b.get()); }
};

/// An output of element type E (float or __nv_bfloat16) of n elements: a Buffer filled with 0xff bytes (NaN), read
/// back as floats.
template <typename E>
struct Output {
  Buffer b;
  size_t n;
  explicit Output(size_t count) : b(std::is_same_v<E, float> ? count : count / 2 + 1), n(count) {}
  E* get() const { return reinterpret_cast<E*>(b.get()); }
  std::vector<float> host() const {
    if constexpr (std::is_same_v<E, float>) {
      return b.host();
    } else {
      std::vector<float> x(n);
      const uint16_t* h = reinterpret_cast<const uint16_t*>(b.get());
      for (size_t i = 0; i < n; ++i) x[i] = bf16_value(h[i]);
      return x;
    }
  }
};

/// The configurations a test runs its kernels under: the reference run first (round robin, cp.async at issue);
/// each of the others must reproduce its bits: the cp.async mode alone, the schedule alone, both.
inline const emu::Config kConfigs[] = {{emu::Schedule::round_robin, emu::CpAsync::at_issue, 1},
                                       {emu::Schedule::round_robin, emu::CpAsync::at_wait, 1},
                                       {emu::Schedule::warps_reverse, emu::CpAsync::at_issue, 1},
                                       {emu::Schedule::warps_shuffled, emu::CpAsync::at_wait, 7}};

/// Index of the first element whose bits differ, or -1.
inline int64_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], 4) != 0) return static_cast<int64_t>(i);
  return -1;
}

inline const char* name_of(emu::Schedule s) {
  switch (s) {
    case emu::Schedule::round_robin: return "round_robin";
    case emu::Schedule::warps_forward: return "warps_forward";
    case emu::Schedule::warps_reverse: return "warps_reverse";
    case emu::Schedule::warps_shuffled: return "warps_shuffled";
  }
  return "";
}
inline const char* name_of(emu::CpAsync c) { return c == emu::CpAsync::at_wait ? "at the wait" : "at issue"; }

/// Runs `run(cfg)` (one emulated run: its outputs, `count` float vectors) under every configuration of kConfigs and
/// checks each output finite and, after the first (reference) run, bit-identical to the reference's; returns the
/// reference run's outputs. name(i): output i's name in the messages.
template <typename Run, typename Name>
std::vector<std::vector<float>> outputs_under_every_config(Run run, size_t count, Name name) {
  std::vector<std::vector<float>> first;
  for (const emu::Config& cfg : kConfigs) {
    const bool reference = &cfg == kConfigs;
    INFO("schedule " << name_of(cfg.schedule) << ", cp.async " << name_of(cfg.cp_async));
    std::vector<std::vector<float>> out = run(cfg);
    REQUIRE(out.size() == count);
    for (size_t i = 0; i < out.size(); ++i) {
      INFO(std::string(name(i)));
      size_t non_finite = 0;
      for (const float e : out[i]) non_finite += !std::isfinite(e);
      CHECK(non_finite == 0);
      if (!reference) {
        INFO("the first element whose bits differ from the reference run's (round robin, cp.async at issue)");
        CHECK(first_difference(first[i], out[i]) == -1);
      }
    }
    if (reference) first = std::move(out);
  }
  return first;
}

}  // namespace llmt::test::emu_test
