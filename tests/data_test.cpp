// Token shards (data.md 5.1), the window loader and the text -> shards preparation.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "test_util.h"
#include "core/rng.h"
#include "data/loader.h"
#include "data/shard.h"
#include "data/text_dataset.h"

namespace fs = std::filesystem;
using llmt::test::TempDir;
using llmt::test::read_bytes;
using llmt::test::write_bytes;
using llmt::LoaderState;
using llmt::ShardReader;
using llmt::WindowLoader;
using llmt::write_shard;

namespace {

int32_t le_i32(const std::string& bytes, size_t offset) {
  int32_t v;
  std::memcpy(&v, bytes.data() + offset, 4);
  return v;
}

std::vector<int32_t> read_all(const ShardReader& r) {
  std::vector<int32_t> out(static_cast<size_t>(r.size()));
  r.read(0, r.size(), out.data());
  return out;
}

// A shard whose token i is i, so a window's first token tells which window it is.
std::string iota_shard(const TempDir& dir, int32_t n) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  std::iota(tokens.begin(), tokens.end(), 0);
  const std::string path = dir.file("iota_" + std::to_string(n) + ".bin");
  write_shard(path, tokens);
  return path;
}

// The window ids of the next `count` windows handed out one at a time.
std::vector<int64_t> take(WindowLoader& loader, int count) {
  std::vector<int64_t> ids;
  std::vector<int32_t> buf(static_cast<size_t>(loader.seq_len() + 1));
  for (int i = 0; i < count; ++i) {
    loader.next(1, buf.data());
    ids.push_back(buf[0] / loader.seq_len());
  }
  return ids;
}

std::vector<int64_t> sorted(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

std::vector<int64_t> iota64(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), int64_t{0});
  return v;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Shards

TEST_CASE("shard u16 round trip with the llm.c header", "[shard]") {
  TempDir dir;
  const std::string path = dir.file("a.bin");
  const std::vector<int32_t> tokens{0, 1, 50256, 65535, 464, 13362};
  write_shard(path, tokens);
  CHECK_FALSE(fs::exists(path + ".tmp"));

  const std::string raw = read_bytes(path);
  REQUIRE(raw.size() == 1024 + 2 * tokens.size());
  CHECK(le_i32(raw, 0) == 20240520);
  CHECK(le_i32(raw, 4) == 1);
  CHECK(le_i32(raw, 8) == 6);
  CHECK(std::all_of(raw.begin() + 12, raw.begin() + 1024, [](char c) { return c == 0; }));
  CHECK(static_cast<uint8_t>(raw[1024 + 2 * 3]) == 0xFF);  // 65535 little-endian
  CHECK(static_cast<uint8_t>(raw[1024 + 2 * 3 + 1]) == 0xFF);
  CHECK(static_cast<uint8_t>(raw[1024 + 2 * 2]) == 0x50);  // 50256 = 0xC450
  CHECK(static_cast<uint8_t>(raw[1024 + 2 * 2 + 1]) == 0xC4);

  ShardReader r(path);
  CHECK_FALSE(r.is_u32());
  CHECK(r.size() == 6);
  CHECK(r.path() == path);
  CHECK(r.at(3) == 65535);
  CHECK(read_all(r) == tokens);
  std::vector<int32_t> part(2);
  r.read(2, 2, part.data());
  CHECK(part == std::vector<int32_t>{50256, 65535});
}

TEST_CASE("shard u32 when forced or when an id is >= 65536", "[shard]") {
  TempDir dir;
  SECTION("forced") {
    const std::string path = dir.file("forced.bin");
    const std::vector<int32_t> tokens{7, 8, 9};
    write_shard(path, tokens, /*force_u32=*/true);
    const std::string raw = read_bytes(path);
    CHECK(raw.size() == 1024 + 4 * 3);
    CHECK(le_i32(raw, 4) == 7);
    ShardReader r(path);
    CHECK(r.is_u32());
    CHECK(read_all(r) == tokens);
  }
  SECTION("large id") {
    const std::string path = dir.file("large.bin");
    const std::vector<int32_t> tokens{1, 65536, 128000, 128255, 2};
    write_shard(path, tokens);
    const std::string raw = read_bytes(path);
    CHECK(raw.size() == 1024 + 4 * 5);
    CHECK(le_i32(raw, 4) == 7);
    CHECK(le_i32(raw, 1024 + 4 * 2) == 128000);
    ShardReader r(path);
    CHECK(r.is_u32());
    CHECK(r.at(1) == 65536);
    CHECK(read_all(r) == tokens);
  }
}

TEST_CASE("shard with no tokens", "[shard]") {
  TempDir dir;
  const std::string path = dir.file("empty.bin");
  write_shard(path, {});
  CHECK(fs::file_size(path) == 1024);
  ShardReader r(path);
  CHECK(r.size() == 0);
}

TEST_CASE("write_shard rejects negative ids naming the path", "[shard]") {
  TempDir dir;
  const std::string path = dir.file("neg.bin");
  CHECK_THROWS_WITH(write_shard(path, {1, -2, 3}), Catch::Contains(path) && Catch::Contains("-2"));
  CHECK_FALSE(fs::exists(path));
  CHECK_THROWS_WITH(write_shard(dir.file("no/such/dir/x.bin"), {1}), Catch::Contains("no/such/dir/x.bin"));
}

TEST_CASE("shard validation names the file and the offset or sizes", "[shard]") {
  TempDir dir;
  const std::string path = dir.file("s.bin");
  write_shard(path, std::vector<int32_t>(10, 5));  // u16: 1024 + 20 bytes
  const std::string good = read_bytes(path);

  SECTION("truncated body") {
    write_bytes(path, good.substr(0, 1024 + 15));
    CHECK_THROWS_WITH(ShardReader(path), Catch::Contains(path) && Catch::Contains("1039") && Catch::Contains("1044"));
  }
  SECTION("body longer than the header says") {
    write_bytes(path, good + "xx");
    CHECK_THROWS_WITH(ShardReader(path), Catch::Contains(path) && Catch::Contains("1046") && Catch::Contains("1044"));
  }
  SECTION("shorter than the header") {
    write_bytes(path, good.substr(0, 100));
    CHECK_THROWS_WITH(ShardReader(path), Catch::Contains(path) && Catch::Contains("100") && Catch::Contains("1024"));
  }
  SECTION("bad magic") {
    std::string bad = good;
    bad[0] = 0x01;
    write_bytes(path, bad);
    CHECK_THROWS_WITH(ShardReader(path), Catch::Contains(path) && Catch::Contains("offset 0"));
  }
  SECTION("unknown version") {
    std::string bad = good;
    bad[4] = 3;
    write_bytes(path, bad);
    CHECK_THROWS_WITH(ShardReader(path), Catch::Contains(path) && Catch::Contains("offset 4"));
  }
  SECTION("missing file") {
    CHECK_THROWS_WITH(ShardReader(dir.file("nope.bin")), Catch::Contains(dir.file("nope.bin")));
  }
  SECTION("read out of range") {
    ShardReader r(path);
    std::vector<int32_t> out(4);
    CHECK_THROWS_WITH(r.read(8, 3, out.data()), Catch::Contains(path));
    CHECK_THROWS_AS(r.read(-1, 1, out.data()), llmt::Error);
  }
}

TEST_CASE("ShardReader moves", "[shard]") {
  TempDir dir;
  const std::string path = dir.file("m.bin");
  write_shard(path, {4, 5, 6});
  ShardReader a(path);
  ShardReader b(std::move(a));
  CHECK(b.size() == 3);
  CHECK(b.at(2) == 6);
  write_shard(dir.file("n.bin"), {1, 70000});
  ShardReader c(dir.file("n.bin"));
  c = std::move(b);
  CHECK(c.path() == path);
  CHECK_FALSE(c.is_u32());
  CHECK(read_all(c) == std::vector<int32_t>{4, 5, 6});
}

// ---------------------------------------------------------------------------------------
// Window loader

TEST_CASE("loader windows have seq_len + 1 tokens and overlap by one", "[loader]") {
  TempDir dir;
  ShardReader shard(iota_shard(dir, 41));
  WindowLoader loader(shard, 4, 1, true);
  CHECK(loader.num_windows() == 10);
  std::vector<int32_t> w(5);
  loader.window(0, w.data());
  CHECK(w == std::vector<int32_t>{0, 1, 2, 3, 4});
  loader.window(1, w.data());
  CHECK(w == std::vector<int32_t>{4, 5, 6, 7, 8});
  loader.window(9, w.data());
  CHECK(w == std::vector<int32_t>{36, 37, 38, 39, 40});
  CHECK_THROWS_AS(loader.window(10, w.data()), llmt::Error);

  ShardReader shard44(iota_shard(dir, 44));
  CHECK(WindowLoader(shard44, 4, 1, true).num_windows() == 10);
  ShardReader shard45(iota_shard(dir, 45));
  CHECK(WindowLoader(shard45, 4, 1, true).num_windows() == 11);
}

TEST_CASE("loader rejects a shard shorter than one window, naming it", "[loader]") {
  TempDir dir;
  const std::string path = iota_shard(dir, 4);
  ShardReader shard(path);
  CHECK_THROWS_WITH(WindowLoader(shard, 4, 1, true), Catch::Contains(path));
}

TEST_CASE("loader batches are consecutive windows of the permutation", "[loader]") {
  TempDir dir;
  ShardReader shard(iota_shard(dir, 41));
  WindowLoader batched(shard, 4, 9, true), single(shard, 4, 9, true);
  std::vector<int32_t> batch(3 * 5);
  batched.next(3, batch.data());
  const std::vector<int64_t> ids = take(single, 3);
  for (int b = 0; b < 3; ++b) {
    for (int t = 0; t < 5; ++t) CHECK(batch[b * 5 + t] == ids[b] * 4 + t);
  }
  CHECK(batched.state().epoch == 0);
  CHECK(batched.state().index == 3);
}

TEST_CASE("loader visits every window once per epoch, in a new order each epoch", "[loader]") {
  TempDir dir;
  ShardReader shard(iota_shard(dir, 4 * 50 + 1));
  WindowLoader loader(shard, 4, 1234, true);
  const std::vector<int64_t> e0 = take(loader, 50);
  CHECK(loader.state().epoch == 0);
  CHECK(loader.state().index == 50);
  const std::vector<int64_t> e1 = take(loader, 50);
  CHECK(loader.state().epoch == 1);
  CHECK(sorted(e0) == iota64(50));
  CHECK(sorted(e1) == iota64(50));
  CHECK(e0 != iota64(50));
  CHECK(e0 != e1);
}

TEST_CASE("loader order is the Fisher-Yates permutation of Philox(seed, epoch)", "[loader]") {
  // Fisher-Yates from the top: for i = n-1 .. 1 swap order[i] with order[below(i + 1)].
  const auto expected = [](uint64_t seed, uint64_t epoch, int64_t n) {
    std::vector<int64_t> order = iota64(n);
    llmt::Philox rng(seed, epoch);
    for (int64_t i = n - 1; i > 0; --i) std::swap(order[i], order[rng.below(i + 1)]);
    return order;
  };
  TempDir dir;
  ShardReader shard(iota_shard(dir, 8 * 30 + 1));
  WindowLoader loader(shard, 8, 77, true);
  CHECK(take(loader, 30) == expected(77, 0, 30));
  CHECK(take(loader, 30) == expected(77, 1, 30));
}

TEST_CASE("loader order depends on the seed only", "[loader]") {
  TempDir dir;
  ShardReader shard(iota_shard(dir, 4 * 40 + 1));
  WindowLoader a(shard, 4, 5, true), b(shard, 4, 5, true), c(shard, 4, 6, true);
  const std::vector<int64_t> order_a = take(a, 100), order_b = take(b, 100), order_c = take(c, 100);
  CHECK(order_a == order_b);
  CHECK(order_a != order_c);
}

TEST_CASE("loader without shuffle goes in shard order every epoch", "[loader]") {
  TempDir dir;
  ShardReader shard(iota_shard(dir, 4 * 12 + 1));
  WindowLoader loader(shard, 4, 5, false);
  CHECK(take(loader, 12) == iota64(12));
  CHECK(take(loader, 12) == iota64(12));
}

TEST_CASE("loader resumes exactly from a saved state", "[loader]") {
  TempDir dir;
  ShardReader shard(iota_shard(dir, 4 * 10 + 1));
  const int64_t batch = 3, width = 5;
  for (int k : {0, 1, 3, 4, 7}) {  // 4 and 7 batches cross epoch boundaries
    WindowLoader uninterrupted(shard, 4, 42, true);
    std::vector<int32_t> buf(batch * width);
    for (int i = 0; i < k; ++i) uninterrupted.next(batch, buf.data());
    const LoaderState saved = uninterrupted.state();
    CHECK(saved.epoch == static_cast<uint64_t>(k * batch / 10));
    CHECK(saved.index == static_cast<uint64_t>(k * batch % 10));

    WindowLoader resumed(shard, 4, 42, true);
    resumed.set_state(saved);
    std::vector<int32_t> want(batch * width), got(batch * width);
    for (int i = 0; i < 15; ++i) {
      uninterrupted.next(batch, want.data());
      resumed.next(batch, got.data());
      REQUIRE(got == want);
    }
    CHECK(resumed.state().epoch == uninterrupted.state().epoch);
    CHECK(resumed.state().index == uninterrupted.state().index);
  }
}

TEST_CASE("loader set_state at the end of an epoch and out of range", "[loader]") {
  TempDir dir;
  const std::string path = iota_shard(dir, 4 * 10 + 1);
  ShardReader shard(path);
  WindowLoader a(shard, 4, 3, true), b(shard, 4, 3, true);
  take(a, 10);
  b.set_state(LoaderState{0, 10});
  CHECK(take(a, 10) == take(b, 10));
  CHECK_THROWS_WITH(b.set_state(LoaderState{2, 11}), Catch::Contains(path));
}

// ---------------------------------------------------------------------------------------
// Text -> train/val shards

#ifdef LLMT_HAVE_PCRE2

TEST_CASE("prepare_text_shards splits by tokens and records the source", "[text]") {
  TempDir dir;
  const std::string text_path = dir.file("foobar.txt");
  write_bytes(text_path, "foobar");
  const std::string out = dir.file("out");
  const llmt::TextShards shards = llmt::prepare_text_shards(text_path, "data/tokenizers/gpt2", out, 0.5);
  CHECK(shards.train_path == out + "/train.bin");
  CHECK(shards.val_path == out + "/val.bin");
  CHECK(read_all(ShardReader(shards.train_path)) == std::vector<int32_t>{6513});  // "foo" "bar"
  CHECK(read_all(ShardReader(shards.val_path)) == std::vector<int32_t>{30973});
  const nlohmann::json source = nlohmann::json::parse(read_bytes(out + "/source.json"));
  CHECK(source.at("text_bytes") == 6);
  CHECK(source.at("text_fnv1a64") == "85944171f73967e8");  // FNV-1a 64 test vector of "foobar"
  CHECK(source.at("tokenizer") == "gpt2");
  CHECK(source.at("val_fraction") == 0.5);
}

TEST_CASE("prepare_text_shards on real text: 90/10 split, then reuse", "[text]") {
  TempDir dir;
  // The bundled file's first 20,000 bytes cut after the last newline: 19,757 bytes that
  // encode (OpenAI gpt-2 encoder.py) to 4,074 tokens, so 407 validation tokens.
  std::string text = read_bytes("data/fineweb-edu-sample10BT-head.part1.txt").substr(0, 20000);
  text.resize(text.rfind('\n') + 1);
  REQUIRE(text.size() == 19757);
  const std::string text_path = dir.file("sample.txt");
  write_bytes(text_path, text);
  const std::string out = dir.file("shards");

  const llmt::TextShards shards = llmt::prepare_text_shards(text_path, "data/tokenizers/gpt2", out, 0.1);
  std::vector<int32_t> train = read_all(ShardReader(shards.train_path));
  const std::vector<int32_t> val = read_all(ShardReader(shards.val_path));
  CHECK(train.size() == 3667);
  CHECK(val.size() == 407);
  CHECK(std::vector<int32_t>(train.begin(), train.begin() + 3) == std::vector<int32_t>{464, 13362, 12091});
  CHECK(std::vector<int32_t>(val.begin(), val.begin() + 3) == std::vector<int32_t>{2846, 389, 4622});
  CHECK(std::vector<int32_t>(val.end() - 3, val.end()) == std::vector<int32_t>{3586, 13, 198});

  // A second call with the same text and split rewrites nothing.
  const auto old_time = fs::file_time_type::clock::now() - std::chrono::hours(24);
  const std::vector<std::string> files{shards.train_path, shards.val_path, out + "/source.json"};
  for (const auto& f : files) fs::last_write_time(f, old_time);
  const llmt::TextShards again = llmt::prepare_text_shards(text_path, "data/tokenizers/gpt2", out, 0.1);
  CHECK(again.train_path == shards.train_path);
  CHECK(again.val_path == shards.val_path);
  for (const auto& f : files) CHECK(fs::last_write_time(f) == old_time);

  // Another split or changed text redoes the work.
  llmt::prepare_text_shards(text_path, "data/tokenizers/gpt2", out, 0.5);
  CHECK(ShardReader(shards.val_path).size() == 2037);
  CHECK(fs::last_write_time(shards.train_path) != old_time);
  write_bytes(text_path, "foobar");
  llmt::prepare_text_shards(text_path, "data/tokenizers/gpt2", out, 0.5);
  CHECK(read_all(ShardReader(shards.train_path)) == std::vector<int32_t>{6513});

  // A damaged shard no longer matches source.json and is rebuilt.
  write_bytes(shards.val_path, "junk");
  llmt::prepare_text_shards(text_path, "data/tokenizers/gpt2", out, 0.5);
  CHECK(read_all(ShardReader(shards.val_path)) == std::vector<int32_t>{30973});
}

TEST_CASE("prepare_text_shards errors name the problem", "[text]") {
  TempDir dir;
  CHECK_THROWS_WITH(llmt::prepare_text_shards(dir.file("missing.txt"), "data/tokenizers/gpt2", dir.file("o"), 0.1),
                    Catch::Contains(dir.file("missing.txt")));
  const std::string text_path = dir.file("t.txt");
  write_bytes(text_path, "hello world");
  CHECK_THROWS_AS(llmt::prepare_text_shards(text_path, "data/tokenizers/gpt2", dir.file("o"), 1.0), llmt::Error);
  CHECK_THROWS_AS(llmt::prepare_text_shards(text_path, "data/tokenizers/gpt2", dir.file("o"), 0.0), llmt::Error);
  CHECK_THROWS_WITH(llmt::prepare_text_shards(text_path, dir.file("no-tok"), dir.file("o"), 0.5),
                    Catch::Contains(dir.file("no-tok")));
  write_bytes(text_path, "a");  // one token cannot be split
  CHECK_THROWS_WITH(llmt::prepare_text_shards(text_path, "data/tokenizers/gpt2", dir.file("o"), 0.5),
                    Catch::Contains(text_path));
}

#else

TEST_CASE("prepare_text_shards without PCRE2 says so", "[text]") {
  TempDir dir;
  const std::string text_path = dir.file("t.txt");
  write_bytes(text_path, "hello world");
  CHECK_THROWS_WITH(llmt::prepare_text_shards(text_path, "data/tokenizers/gpt2", dir.file("o"), 0.5),
                    Catch::Contains("PCRE2"));
}

#endif
