// Core utilities: Philox4x32-10 (src/core/rng.h), the safetensors reader/writer
// (src/core/safetensors.{h,cpp}) and the metrics log (src/train/metrics.{h,cpp}).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "test_util.h"
#include "core/rng.h"
#include "core/safetensors.h"
#include "train/metrics.h"

namespace fs = std::filesystem;
using llmt::test::TempDir;
using llmt::test::error_of;
using llmt::test::read_bytes;
using llmt::test::write_bytes;
using Catch::Matchers::Contains;
using llmt::DType;
using llmt::Philox;

namespace {

using Block = std::array<uint32_t, 4>;

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Philox4x32-10
// ---------------------------------------------------------------------------------------

// Random123 kat_vectors, philox4x32 10 rounds: counter words c0..c3, key words k0 k1.
// Philox(seed, stream).block(counter) uses key {seed lo, seed hi} and counter words
// {counter lo, counter hi, stream lo, stream hi}.
TEST_CASE("Philox4x32-10: Random123 known-answer vectors", "[rng][kat]") {
  SECTION("counter 0, key 0") {
    CHECK(Philox(0, 0).block(0) == Block{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
  }
  SECTION("counter ffffffff x4, key ffffffff ffffffff") {
    CHECK(Philox(0xffffffffffffffffull, 0xffffffffffffffffull).block(0xffffffffffffffffull) ==
          Block{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
  }
  SECTION("pi digits: counter 243f6a88 85a308d3 13198a2e 03707344, key a4093822 299f31d0") {
    const Philox rng(/*seed*/ 0x299f31d0a4093822ull, /*stream*/ 0x0370734413198a2eull);
    CHECK(rng.block(/*counter*/ 0x85a308d3243f6a88ull) == Block{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u});
  }
}

TEST_CASE("Philox: skip_to(w) continues with the stream's w-th word", "[rng]") {
  Philox seq(7, 3);
  std::vector<uint32_t> words(40);
  for (auto& w : words) w = seq.next_u32();
  for (uint64_t start : {0, 1, 2, 3, 4, 5, 7, 8, 13}) {
    Philox r(7, 3);
    r.next_u32();  // a used stream is repositioned too
    r.skip_to(start);
    for (uint64_t i = start; i < start + 20; ++i) CHECK(r.next_u32() == words[i]);
  }
}

TEST_CASE("Philox: the stream is block(0), block(1), ... and depends only on (seed, stream, n)", "[rng]") {
  Philox a(0, 0);
  // the first four words are the counter-0 KAT block
  CHECK(a.next_u32() == 0x6627e8d5u);
  CHECK(a.next_u32() == 0xe169c58du);
  CHECK(a.next_u32() == 0xbc57ac4cu);
  CHECK(a.next_u32() == 0x9b00dbd8u);
  const Block b1 = Philox(0, 0).block(1);
  for (int i = 0; i < 4; ++i) CHECK(a.next_u32() == b1[i]);

  // uniform() takes 27 bits of the first word and 26 of the second (53 bits):
  //   (0x6627e8d5 >> 5) = 0x03313f46 = 53559110, (0xe169c58d >> 6) = 0x0385a716 = 59090710
  //   (53559110 * 2^26 + 59090710) / 2^53
  CHECK((0x6627e8d5u >> 5) == 53559110u);
  CHECK((0xe169c58du >> 6) == 59090710u);
  CHECK(Philox(0, 0).uniform() == (53559110.0 * 67108864.0 + 59090710.0) / 9007199254740992.0);

  // same key -> same sequence; another stream or seed -> another sequence
  Philox x(42, 7), y(42, 7), z(42, 8), w(43, 7);
  bool differs_z = false, differs_w = false;
  for (int i = 0; i < 16; ++i) {
    const uint32_t vx = x.next_u32();
    CHECK(vx == y.next_u32());
    differs_z |= vx != z.next_u32();
    differs_w |= vx != w.next_u32();
  }
  CHECK(differs_z);
  CHECK(differs_w);
}

TEST_CASE("Philox: uniform, normal and below statistics", "[rng]") {
  constexpr int n = 100000;
  SECTION("uniform in [0, 1), mean 1/2, variance 1/12") {
    Philox rng(1234, 0);
    double sum = 0, sum2 = 0, lo = 1, hi = 0;
    int outside = 0;
    for (int i = 0; i < n; ++i) {
      const double u = rng.uniform();
      outside += !(u >= 0.0 && u < 1.0);
      sum += u;
      sum2 += u * u;
      lo = std::min(lo, u);
      hi = std::max(hi, u);
    }
    CHECK(outside == 0);
    const double mean = sum / n, var = sum2 / n - mean * mean;
    // sd of the mean = sqrt(1/12 / 1e5) = 9.13e-4; 5 sigma = 4.6e-3
    CHECK(std::abs(mean - 0.5) < 4.6e-3);
    // sd of the sample variance ~ sqrt((1/80 - 1/144) / 1e5) = 2.4e-4; 5 sigma = 1.2e-3
    CHECK(std::abs(var - 1.0 / 12.0) < 1.2e-3);
    CHECK(lo < 1e-3);
    CHECK(hi > 1 - 1e-3);
  }
  SECTION("normal: mean 0, variance 1") {
    Philox rng(99, 3);
    double sum = 0, sum2 = 0;
    int beyond_2 = 0, nonfinite = 0;
    for (int i = 0; i < n; ++i) {
      const double x = rng.normal();
      nonfinite += !std::isfinite(x);
      sum += x;
      sum2 += x * x;
      beyond_2 += std::abs(x) > 2.0;
    }
    CHECK(nonfinite == 0);
    const double mean = sum / n, var = sum2 / n - mean * mean;
    // sd of the mean = 1/sqrt(1e5) = 3.16e-3; 5 sigma = 1.6e-2
    CHECK(std::abs(mean) < 1.6e-2);
    // sd of the sample variance = sqrt(2 / 1e5) = 4.47e-3; 5 sigma = 2.3e-2
    CHECK(std::abs(var - 1.0) < 2.3e-2);
    // P(|x| > 2) = 0.0455: expected 4550 of 1e5, sd sqrt(1e5 * 0.0455 * 0.9545) = 66; 5 sigma = 330
    CHECK(std::abs(beyond_2 - 4550) < 330);
  }
  SECTION("below(n) stays in [0, n) and covers it evenly") {
    Philox rng(5, 5);
    std::vector<int> counts(7, 0);
    int outside = 0;
    for (int i = 0; i < 70000; ++i) {
      const uint64_t k = rng.below(7);
      if (k < 7u) ++counts[k]; else ++outside;
    }
    CHECK(outside == 0);
    // expected 10000 each, sd sqrt(70000 * 1/7 * 6/7) = 92.6; 5 sigma = 463
    for (int c : counts) CHECK(std::abs(c - 10000) < 463);
    int wrong = 0;
    for (int i = 0; i < 100; ++i) wrong += rng.below(1) != 0u;
    const uint64_t big = (uint64_t{1} << 40) + 3, huge = UINT64_MAX - 5;
    bool above_2_32 = false;
    for (int i = 0; i < 1000; ++i) {
      const uint64_t k = rng.below(big);
      wrong += k >= big;
      above_2_32 |= k > UINT32_MAX;  // uses the high bits too
      wrong += rng.below(huge) >= huge;
    }
    CHECK(wrong == 0);
    CHECK(above_2_32);
  }
}

// ---------------------------------------------------------------------------------------
// safetensors
// ---------------------------------------------------------------------------------------

namespace {

struct SampleTensors {
  std::vector<float> a{1.5f, -2.25f, 3.0f, 0.0f, 1e-20f, -7.0f};  // F32 [2, 3]
  std::vector<double> b{0.1, -1e300, 3.141592653589793, 2.0};      // F64 [4]
  std::vector<int32_t> c{-1, 0, 2147483647};                       // I32 [3]
  std::map<std::string, std::string> meta{{"format", "pt"}, {"step", "7"}};

  void write(const std::string& path) const {
    llmt::write_safetensors(path,
                            {{"a", DType::f32, {2, 3}, a.data()},
                             {"b", DType::f64, {4}, b.data()},
                             {"c", DType::i32, {3}, c.data()}},
                            meta);
  }
};

// data section: 6*4 + 4*8 + 3*4 = 24 + 32 + 12 = 68 bytes
constexpr size_t kDataBytes = 68;

uint64_t header_length(const std::string& bytes) {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{static_cast<uint8_t>(bytes[i])} << (8 * i);
  return n;
}

}  // namespace

TEST_CASE("safetensors: F32, F64, I32 and metadata round trip", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  const SampleTensors s;
  s.write(path);

  const llmt::SafetensorsFile f(path);
  CHECK(f.path() == path);
  CHECK(f.tensors().size() == 3);
  CHECK(f.contains("a"));
  CHECK_FALSE(f.contains("d"));
  CHECK(f.metadata() == s.meta);
  CHECK(f.info("a").dtype == DType::f32);
  CHECK(f.info("a").shape == std::vector<int64_t>{2, 3});
  CHECK(f.info("b").dtype == DType::f64);
  CHECK(f.info("c").dtype == DType::i32);
  CHECK(f.info("c").shape == std::vector<int64_t>{3});
  // tensors in the given order, back to back
  CHECK(f.info("a").begin == 0);
  CHECK(f.info("a").end == 24);
  CHECK(f.info("b").begin == 24);
  CHECK(f.info("b").end == 56);
  CHECK(f.info("c").begin == 56);
  CHECK(f.info("c").end == 68);

  std::vector<float> a(6);
  std::vector<double> b(4);
  std::vector<int32_t> c(3);
  f.read("a", DType::f32, {2, 3}, a.data());
  f.read("b", DType::f64, {4}, b.data());
  f.read("c", DType::i32, {3}, c.data());
  CHECK(a == s.a);
  CHECK(b == s.b);
  CHECK(c == s.c);
  // read_f64 converts F32 exactly and passes F64 through
  const std::vector<double> a64 = f.read_f64("a");
  REQUIRE(a64.size() == 6);
  for (size_t i = 0; i < 6; ++i) CHECK(a64[i] == static_cast<double>(s.a[i]));
  CHECK(f.read_f64("b") == s.b);
  CHECK_THAT(error_of([&] { f.read_f64("c"); }), Contains("I32"));
  CHECK_THAT(error_of([&] { f.info("d"); }), Contains("no tensor named d") && Contains(path));
}

TEST_CASE("safetensors: the header is length-prefixed little-endian and 8-byte aligned", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  SampleTensors().write(path);
  const std::string bytes = read_bytes(path);
  REQUIRE(bytes.size() >= 8);
  const uint64_t n = header_length(bytes);
  CHECK(n % 8 == 0);
  CHECK(bytes.size() == 8 + n + kDataBytes);
  const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
  CHECK(header.at("a").at("dtype") == "F32");
  CHECK(header.at("b").at("dtype") == "F64");
  CHECK(header.at("c").at("dtype") == "I32");
  CHECK(header.at("a").at("shape") == nlohmann::json::array({2, 3}));
  CHECK(header.at("b").at("data_offsets") == nlohmann::json::array({24, 56}));
  CHECK(header.at("__metadata__").at("step") == "7");
  // the last tensor's bytes are the file's last bytes: I32 2147483647 = ff ff ff 7f
  CHECK(bytes.substr(bytes.size() - 4) == std::string("\xff\xff\xff\x7f", 4));

  // also aligned when there are no tensors and no metadata
  const std::string empty = dir.file("empty.safetensors");
  llmt::write_safetensors(empty, {});
  const std::string eb = read_bytes(empty);
  CHECK(header_length(eb) % 8 == 0);
  CHECK(eb.size() == 8 + header_length(eb));
  CHECK(llmt::SafetensorsFile(empty).tensors().empty());
}

TEST_CASE("safetensors: truncated and malformed files name the file", "[safetensors][errors]") {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  SampleTensors().write(path);
  const std::string bytes = read_bytes(path);

  SECTION("last bytes cut off") {
    const std::string cut = dir.file("cut.safetensors");
    write_bytes(cut, bytes.substr(0, bytes.size() - 3));
    const std::string msg = error_of([&] { llmt::SafetensorsFile f(cut); });
    CHECK_THAT(msg, Contains(cut) && Contains("truncated"));
    CHECK_THAT(msg, Contains(std::to_string(bytes.size())));  // the expected size
  }
  SECTION("cut inside the header") {
    const std::string cut = dir.file("cut.safetensors");
    write_bytes(cut, bytes.substr(0, 20));
    CHECK_THAT(error_of([&] { llmt::SafetensorsFile f(cut); }), Contains(cut) && Contains("truncated"));
  }
  SECTION("shorter than 8 bytes") {
    const std::string cut = dir.file("short.safetensors");
    write_bytes(cut, bytes.substr(0, 5));
    CHECK_THAT(error_of([&] { llmt::SafetensorsFile f(cut); }), Contains(cut) && Contains("truncated"));
  }
  SECTION("empty file") {
    const std::string cut = dir.file("empty.safetensors");
    write_bytes(cut, "");
    CHECK_THAT(error_of([&] { llmt::SafetensorsFile f(cut); }), Contains(cut) && Contains("truncated"));
  }
  SECTION("missing file") {
    const std::string missing = dir.file("missing.safetensors");
    CHECK_THAT(error_of([&] { llmt::SafetensorsFile f(missing); }), Contains(missing));
  }
  SECTION("bad JSON header") {
    std::string bad = bytes;
    bad[8] = '[';  // the header starts with '{'
    bad[9] = ',';
    const std::string p = dir.file("bad.safetensors");
    write_bytes(p, bad);
    CHECK_THAT(error_of([&] { llmt::SafetensorsFile f(p); }), Contains(p));
  }
}

TEST_CASE("safetensors: read() checks dtype and shape", "[safetensors][errors]") {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  SampleTensors().write(path);
  const llmt::SafetensorsFile f(path);
  std::vector<double> buf(16);
  SECTION("wrong shape") {
    const std::string msg = error_of([&] { f.read("a", DType::f32, {3, 2}, buf.data()); });
    CHECK_THAT(msg, Contains(path) && Contains("[2,3]") && Contains("[3,2]"));
  }
  SECTION("wrong rank") {
    CHECK_THAT(error_of([&] { f.read("a", DType::f32, {6}, buf.data()); }), Contains("[6]"));
  }
  SECTION("wrong dtype") {
    const std::string msg = error_of([&] { f.read("a", DType::f64, {2, 3}, buf.data()); });
    CHECK_THAT(msg, Contains(path) && Contains("F32") && Contains("F64"));
  }
  SECTION("I32 read as F32") {
    CHECK_THAT(error_of([&] { f.read("c", DType::f32, {3}, buf.data()); }), Contains("I32") && Contains("F32"));
  }
  SECTION("unknown name") {
    CHECK_THAT(error_of([&] { f.read("zz", DType::f32, {1}, buf.data()); }), Contains("zz"));
  }
}

// ---------------------------------------------------------------------------------------
// metrics.jsonl
// ---------------------------------------------------------------------------------------

TEST_CASE("MetricsLog: resume keeps lines up to the step and drops a partial last line", "[metrics]") {
  TempDir dir;
  const std::string path = dir.file("metrics.jsonl");
  write_bytes(path,
              "{\"step\":0,\"loss\":10.5}\n"
              "{\"step\":1,\"loss\":9.5}\n"
              "{\"step\":2,\"loss\":8.5}\n"
              "{\"step\":3,\"loss\":7.5}\n"
              "{\"step\":4,\"loss\":6.5}\n"
              "{\"step\":5,\"lo");  // cut short by a crash

  SECTION("keep_up_to_step = 2") {
    {
      llmt::MetricsLog log(path, 2);
      log.write({{"step", 3}, {"loss", 7.25}});
    }
    const std::vector<std::string> lines = read_lines(path);
    REQUIRE(lines.size() == 4);
    CHECK(lines[0] == "{\"step\":0,\"loss\":10.5}");
    CHECK(lines[1] == "{\"step\":1,\"loss\":9.5}");
    CHECK(lines[2] == "{\"step\":2,\"loss\":8.5}");
    CHECK(nlohmann::json::parse(lines[3]) == nlohmann::json{{"step", 3}, {"loss", 7.25}});
  }
  SECTION("keep_up_to_step beyond the last complete line keeps all complete lines") {
    { llmt::MetricsLog log(path, 100); }
    const std::vector<std::string> lines = read_lines(path);
    REQUIRE(lines.size() == 5);
    CHECK(lines[4] == "{\"step\":4,\"loss\":6.5}");
  }
  SECTION("keep_up_to_step = 0") {
    { llmt::MetricsLog log(path, 0); }
    CHECK(read_lines(path) == std::vector<std::string>{"{\"step\":0,\"loss\":10.5}"});
  }
  SECTION("keep_up_to_step = -1 (a fresh start) drops everything") {
    {
      llmt::MetricsLog log(path, -1);
      log.write({{"step", 0}, {"loss", 11.0}});
    }
    const std::vector<std::string> lines = read_lines(path);
    REQUIRE(lines.size() == 1);
    CHECK(nlohmann::json::parse(lines[0]) == nlohmann::json{{"step", 0}, {"loss", 11.0}});
  }
}

TEST_CASE("MetricsLog: a new file; each write is one flushed line", "[metrics]") {
  TempDir dir;
  const std::string path = dir.file("metrics.jsonl");
  llmt::MetricsLog log(path, -1);
  log.write({{"step", 0}, {"loss", 0.1}});
  // flushed: visible before the log is closed
  REQUIRE(read_lines(path).size() == 1);
  log.write({{"step", 1}, {"loss", 1.0 / 3.0}});
  const std::vector<std::string> lines = read_lines(path);
  REQUIRE(lines.size() == 2);
  // doubles round-trip exactly
  CHECK(nlohmann::json::parse(lines[1]).at("loss").get<double>() == 1.0 / 3.0);
  CHECK(nlohmann::json::parse(lines[0]).at("loss").get<double>() == 0.1);
}
