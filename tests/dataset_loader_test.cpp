// DatasetLoader (issue 3 point 4): a global window order fixed by the seed alone, per-rank
// slices of each global batch, and resume across a change of rank count.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/dataset_loader.h"
#include "data/shard.h"
#include "test_util.h"

using llmt::DatasetLoader;
using llmt::IndexPermutation;
using llmt::LoaderState;
using llmt::test::TempDir;
using nlohmann::json;

namespace {

constexpr int64_t kSeq = 8;
constexpr int32_t kShardBase = 1000000;

// A dataset directory whose shard s holds tokens s * 1e6 + i, so a window's first token says
// which shard and window it is. Train shards have `sizes` tokens; one val shard of 100.
std::string make_dataset(const TempDir& dir, const std::vector<int32_t>& sizes, const std::string& tokenizer = "gpt2") {
  json train = json::array();
  for (size_t s = 0; s < sizes.size(); ++s) {
    std::vector<int32_t> t(static_cast<size_t>(sizes[s]));
    for (int32_t i = 0; i < sizes[s]; ++i) t[i] = static_cast<int32_t>(s) * kShardBase + i;
    const std::string name = "train_" + std::to_string(s) + ".bin";
    llmt::write_shard(dir.file(name), t, true);
    train.push_back({{"file", name}, {"tokens", sizes[s]}});
  }
  std::vector<int32_t> v(100);
  std::iota(v.begin(), v.end(), 7 * kShardBase);
  llmt::write_shard(dir.file("val_0.bin"), v, true);
  const json ds = {{"format", "llmt-dataset"},
                   {"tokenizer", {{"name", tokenizer}}},
                   {"train", {{"shards", train}}},
                   {"val", {{"shards", {{{"file", "val_0.bin"}, {"tokens", 100}}}}}}};
  dir.write("dataset.json", ds.dump());
  return dir.path.string();
}

// Global window id of a window from its first token, given the shard sizes (windows at stride kSeq).
int64_t window_id(int32_t first_token, const std::vector<int32_t>& sizes) {
  const int32_t shard = first_token / kShardBase, offset = first_token % kShardBase;
  REQUIRE(offset % kSeq == 0);
  int64_t base = 0;
  for (int32_t s = 0; s < shard; ++s) base += (sizes[s] - 1) / kSeq;
  return base + offset / kSeq;
}

// The sorted window ids of each of `steps` global steps, read by `world` ranks (each its own
// loader, as separate processes would) with `batch` windows per rank; loaders start at `start`.
std::vector<std::vector<int64_t>> global_steps(const std::string& dir, const std::vector<int32_t>& sizes, int world,
                                               int64_t batch, int steps, LoaderState start = {},
                                               LoaderState* end = nullptr) {
  std::vector<DatasetLoader> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back(dir, "train", kSeq, 42, true);
    ranks.back().set_state(start);
  }
  std::vector<std::vector<int64_t>> out;
  std::vector<int32_t> buf(static_cast<size_t>(batch * (kSeq + 1)));
  for (int s = 0; s < steps; ++s) {
    std::vector<int64_t> ids;
    for (int r = 0; r < world; ++r) {
      ranks[r].next(batch, r, world, buf.data());
      for (int64_t b = 0; b < batch; ++b) {
        const int32_t* w = buf.data() + b * (kSeq + 1);
        for (int64_t t = 1; t <= kSeq; ++t) REQUIRE(w[t] == w[0] + t);  // contiguous tokens of one shard
        ids.push_back(window_id(w[0], sizes));
      }
    }
    std::sort(ids.begin(), ids.end());
    out.push_back(ids);
  }
  for (int r = 1; r < world; ++r) REQUIRE(ranks[r].state().index == ranks[0].state().index);
  if (end != nullptr) *end = ranks[0].state();
  return out;
}

}  // namespace

TEST_CASE("IndexPermutation is a bijection that depends on seed and epoch", "[dataset_loader]") {
  for (uint64_t n : {1, 2, 3, 5, 16, 17, 1000, 4097}) {
    const IndexPermutation p(n, 42, 0);
    std::vector<uint64_t> image;
    for (uint64_t i = 0; i < n; ++i) image.push_back(p(i));
    std::sort(image.begin(), image.end());
    std::vector<uint64_t> expected(n);
    std::iota(expected.begin(), expected.end(), uint64_t{0});
    CHECK(image == expected);
  }
  const auto order = [](uint64_t seed, uint64_t epoch) {
    const IndexPermutation p(1000, seed, epoch);
    std::vector<uint64_t> v;
    for (uint64_t i = 0; i < 1000; ++i) v.push_back(p(i));
    return v;
  };
  CHECK(order(42, 0) == order(42, 0));
  CHECK(order(42, 0) != order(42, 1));
  CHECK(order(42, 0) != order(43, 0));
  // Not the identity and not a rotation: few fixed points.
  const auto v = order(42, 0);
  int fixed = 0;
  for (uint64_t i = 0; i < v.size(); ++i) fixed += v[i] == i;
  CHECK(fixed < 20);
}

TEST_CASE("1, 2 and 3 ranks see the same multiset of windows per global step", "[dataset_loader]") {
  TempDir dir;
  const std::vector<int32_t> sizes = {97, 200, 41, 150};  // 12 + 24 + 5 + 18 = 59 windows
  const std::string ds = make_dataset(dir, sizes);
  const DatasetLoader probe(ds, "train", kSeq, 42, true);
  REQUIRE(probe.num_windows() == 59);
  // Global batch 6, 25 steps = 150 windows: crosses two epoch boundaries.
  const auto one = global_steps(ds, sizes, 1, 6, 25);
  CHECK(global_steps(ds, sizes, 2, 3, 25) == one);
  CHECK(global_steps(ds, sizes, 3, 2, 25) == one);
  // The first epoch visits every window exactly once (59 = 9 steps of 6 + 5 of the 10th).
  std::vector<int64_t> epoch0;
  for (int s = 0; s < 9; ++s) epoch0.insert(epoch0.end(), one[s].begin(), one[s].end());
  std::sort(epoch0.begin(), epoch0.end());
  CHECK(std::adjacent_find(epoch0.begin(), epoch0.end()) == epoch0.end());
  CHECK(epoch0.size() == 54);
  // Shuffled: the first step is not the first six windows in file order.
  CHECK(one[0] != std::vector<int64_t>{0, 1, 2, 3, 4, 5});
}

TEST_CASE("resume on a different number of ranks continues the same stream", "[dataset_loader]") {
  TempDir dir;
  const std::vector<int32_t> sizes = {300, 120};
  const std::string ds = make_dataset(dir, sizes);
  const auto uninterrupted = global_steps(ds, sizes, 1, 4, 30);
  LoaderState saved;
  const auto first = global_steps(ds, sizes, 2, 2, 11, {}, &saved);  // as saved in a checkpoint
  const auto rest = global_steps(ds, sizes, 4, 1, 19, saved);         // resumed on 4 ranks
  std::vector<std::vector<int64_t>> joined = first;
  joined.insert(joined.end(), rest.begin(), rest.end());
  CHECK(joined == uninterrupted);
  // And back from 4 ranks to 1.
  LoaderState saved2;
  const auto a = global_steps(ds, sizes, 4, 1, 7, {}, &saved2);
  const auto b = global_steps(ds, sizes, 1, 4, 23, saved2);
  std::vector<std::vector<int64_t>> joined2 = a;
  joined2.insert(joined2.end(), b.begin(), b.end());
  CHECK(joined2 == uninterrupted);
}

TEST_CASE("the order depends on the seed alone; no shuffle is file order", "[dataset_loader]") {
  TempDir dir;
  const std::string ds = make_dataset(dir, {200});
  DatasetLoader a(ds, "train", kSeq, 1, true), b(ds, "train", kSeq, 1, true), c(ds, "train", kSeq, 2, true);
  DatasetLoader plain(ds, "train", kSeq, 1, false);
  std::vector<int32_t> wa(5 * (kSeq + 1)), wb(wa.size()), wc(wa.size()), wp(wa.size());
  a.next(5, 0, 1, wa.data());
  b.next(5, 0, 1, wb.data());
  c.next(5, 0, 1, wc.data());
  plain.next(5, 0, 1, wp.data());
  CHECK(wa == wb);
  CHECK(wa != wc);
  for (int k = 0; k < 5; ++k) CHECK(wp[k * (kSeq + 1)] == k * kSeq);
}

TEST_CASE("the validation stream is separate", "[dataset_loader]") {
  TempDir dir;
  const std::string ds = make_dataset(dir, {200});
  DatasetLoader val(ds, "val", kSeq, 0, false);
  CHECK(val.num_windows() == 99 / kSeq);
  std::vector<int32_t> w(kSeq + 1);
  val.window(0, w.data());
  CHECK(w[0] == 7 * kShardBase);
}

TEST_CASE("dataset loader errors name the file and what is wrong", "[dataset_loader]") {
  TempDir dir;
  const std::string ds = make_dataset(dir, {200, 100}, "llama3");
  CHECK_NOTHROW(DatasetLoader(ds, "train", kSeq, 0, true, "llama3.1"));
  CHECK_THROWS_WITH(DatasetLoader(ds, "train", kSeq, 0, true, "gpt2"),
                    Catch::Contains("dataset.json") && Catch::Contains("tokenizer.name") &&
                        Catch::Contains("\"llama3\"") && Catch::Contains("\"gpt2\""));
  CHECK_THROWS_WITH(DatasetLoader(dir.file("nowhere"), "train", kSeq, 0, true),
                    Catch::Contains("nowhere/dataset.json"));
  // Truncated shard: ShardReader names it with the expected and actual sizes.
  const std::string bytes = llmt::test::read_bytes(dir.file("train_1.bin"));
  llmt::test::write_bytes(dir.file("train_1.bin"), bytes.substr(0, bytes.size() - 10));
  CHECK_THROWS_WITH(DatasetLoader(ds, "train", kSeq, 0, true), Catch::Contains("train_1.bin") &&
                                                                    Catch::Contains("expected"));
  // A shard whose count differs from dataset.json's.
  std::vector<int32_t> t(50, 1);
  llmt::write_shard(dir.file("train_1.bin"), t, true);
  CHECK_THROWS_WITH(DatasetLoader(ds, "train", kSeq, 0, true),
                    Catch::Contains("train_1.bin") && Catch::Contains("train.shards[1].tokens"));
  // Wrong magic.
  std::string bad = llmt::test::read_bytes(dir.file("train_0.bin"));
  bad[0] = 0x11;
  llmt::test::write_bytes(dir.file("train_0.bin"), bad);
  CHECK_THROWS_WITH(DatasetLoader(ds, "train", kSeq, 0, true), Catch::Contains("train_0.bin") &&
                                                                    Catch::Contains("magic"));
  DatasetLoader val(ds, "val", kSeq, 0, true);
  CHECK_THROWS_WITH(val.set_state({0, 1000}), Catch::Contains("exceeds"));
}

TEST_CASE("a stream without a window says what to change", "[dataset_loader]") {
  TempDir dir;
  const std::string ds = make_dataset(dir, {200});
  // prepare-data of one .txt file: every token in train, none in val.
  json meta = json::parse(llmt::test::read_bytes(dir.file("dataset.json")));
  meta["val"]["shards"] = json::array();
  dir.write("dataset.json", meta.dump());
  CHECK_THROWS_WITH(DatasetLoader(ds, "val", kSeq, 0, false),
                    Catch::Contains("val stream") && Catch::Contains("0 tokens") &&
                        Catch::Contains("--val-fraction") && Catch::Contains("data.text"));
  // Shards shorter than one window: the window length is what to change.
  CHECK_THROWS_WITH(DatasetLoader(ds, "train", 300, 0, true),
                    Catch::Contains("train stream") && Catch::Contains("seq_len + 1 = 301") &&
                        Catch::Contains("lower train.seq_len"));
}
