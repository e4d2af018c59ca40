#include "data/dataset_loader.h"

#include <algorithm>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace llmt {
namespace {

uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::string canonical_tokenizer(const std::string& name) { return name == "llama3.1" ? "llama3" : name; }

}  // namespace

IndexPermutation::IndexPermutation(uint64_t n, uint64_t seed, uint64_t epoch) : n_(n) {
  int bits = 2;
  while (bits < 64 && (uint64_t{1} << bits) < n) bits += 2;
  half_bits_ = bits / 2;
  for (int k = 0; k < 4; ++k) keys_[k] = mix64(mix64(seed ^ 0x5851F42D4C957F2Dull) ^ mix64(epoch * 4 + k));
}

uint64_t IndexPermutation::encrypt(uint64_t x) const {
  const uint64_t mask = (uint64_t{1} << half_bits_) - 1;
  uint64_t left = x >> half_bits_, right = x & mask;
  for (int k = 0; k < 4; ++k) {
    const uint64_t next = left ^ (mix64(right ^ keys_[k]) & mask);
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

uint64_t IndexPermutation::operator()(uint64_t i) const {
  uint64_t x = i;
  do {
    x = encrypt(x);
  } while (x >= n_);  // the domain is < 4n, so this takes under 4 rounds on average
  return x;
}

DatasetLoader::DatasetLoader(const std::string& dir, const std::string& stream, int64_t seq_len, uint64_t seed,
                             bool shuffle, const std::string& expected_tokenizer)
    : dir_(dir), seq_len_(seq_len), seed_(seed), shuffle_(shuffle) {
  check(seq_len > 0, "loader: seq_len must be positive, got {}", seq_len);
  check(stream == "train" || stream == "val", "loader: stream must be train or val, got {}", stream);
  const std::string path = dir + "/dataset.json";
  std::ifstream in(path);
  check(static_cast<bool>(in), "loader: cannot open {} (make it with llmtrain prepare-data)", path);
  const nlohmann::json ds = nlohmann::json::parse(in, nullptr, false);
  check(!ds.is_discarded() && ds.is_object(), "loader: {} is not valid JSON", path);
  check(ds.value("format", std::string()) == "llmt-dataset", "loader: {}: key format is not \"llmt-dataset\"", path);
  check(ds.contains("tokenizer") && ds["tokenizer"].contains("name") && ds["tokenizer"]["name"].is_string(),
        "loader: {}: missing key tokenizer.name", path);
  const std::string tokenizer = ds["tokenizer"]["name"];
  check(expected_tokenizer.empty() || canonical_tokenizer(tokenizer) == canonical_tokenizer(expected_tokenizer),
        "loader: {}: key tokenizer.name is \"{}\" but the config's tokenizer is \"{}\"", path, tokenizer,
        expected_tokenizer);
  check(ds.contains(stream) && ds[stream].contains("shards") && ds[stream]["shards"].is_array(),
        "loader: {}: missing key {}.shards", path, stream);
  const auto& shards = ds[stream]["shards"];
  first_window_.push_back(0);
  for (size_t i = 0; i < shards.size(); ++i) {
    check(shards[i].contains("file") && shards[i]["file"].is_string() && shards[i].contains("tokens") &&
              shards[i]["tokens"].is_number_integer(),
          "loader: {}: key {}.shards[{}] needs file and tokens", path, stream, i);
    auto reader = std::make_unique<ShardReader>(dir + "/" + shards[i]["file"].get<std::string>());
    check(reader->size() == shards[i]["tokens"].get<int64_t>(),
          "loader: shard {} holds {} tokens but {} key {}.shards[{}].tokens says {}", reader->path(), reader->size(),
          path, stream, i, shards[i]["tokens"].get<int64_t>());
    const int64_t windows = reader->size() > 1 ? (reader->size() - 1) / seq_len : 0;
    total_tokens_ += reader->size();
    total_windows_ += windows;
    first_window_.push_back(total_windows_);
    shards_.push_back(std::move(reader));
  }
  // What to do about it: an empty validation stream comes from prepare-data's per-document split.
  const std::string remedy =
      stream == "val" && total_tokens_ == 0
          ? "prepare-data holds out whole documents for validation (--val-fraction, default 0.0005; a .txt file is "
            "one document): prepare it again from more documents or with a larger --val-fraction, or give a "
            "single text file as data.text instead"
          : "lower train.seq_len or add data";
  check(total_windows_ > 0, "loader: the {} stream of {} ({} tokens in {} shards) has no window of seq_len + 1 = {}; {}",
        stream, dir, total_tokens_, shards_.size(), seq_len + 1, remedy);
  perm_ = std::make_unique<IndexPermutation>(total_windows_, seed_, state_.epoch);
}

int64_t DatasetLoader::window_at(uint64_t epoch, uint64_t index) const {
  check(index < static_cast<uint64_t>(total_windows_), "loader: position {} of epoch {} is outside [0, {})", index,
        epoch, total_windows_);
  if (!shuffle_) return static_cast<int64_t>(index);
  if (epoch == state_.epoch) return static_cast<int64_t>((*perm_)(index));
  return static_cast<int64_t>(IndexPermutation(total_windows_, seed_, epoch)(index));
}

void DatasetLoader::window(int64_t w, int32_t* out) const {
  check(w >= 0 && w < total_windows_, "loader: window {} is outside [0, {}) in {}", w, total_windows_, dir_);
  const auto it = std::upper_bound(first_window_.begin(), first_window_.end(), w) - 1;
  const auto shard = static_cast<size_t>(it - first_window_.begin());
  shards_[shard]->read((w - *it) * seq_len_, seq_len_ + 1, out);
}

void DatasetLoader::next(int64_t batch, int rank, int world, int32_t* out) {
  check(batch >= 0 && world > 0 && rank >= 0 && rank < world,
        "loader: need batch >= 0 and 0 <= rank < world, got batch {}, rank {}, world {}", batch, rank, world);
  const auto n = static_cast<uint64_t>(total_windows_);
  const uint64_t global = static_cast<uint64_t>(batch) * static_cast<uint64_t>(world);
  const uint64_t begin = static_cast<uint64_t>(batch) * static_cast<uint64_t>(rank);
  for (uint64_t k = 0; k < static_cast<uint64_t>(batch); ++k) {
    // Position begin + k after the current one, possibly in a later epoch.
    const uint64_t ahead = state_.index + begin + k;
    const uint64_t epoch = state_.epoch + ahead / n, index = ahead % n;
    window(window_at(epoch, index), out + static_cast<int64_t>(k) * (seq_len_ + 1));
  }
  const uint64_t after = state_.index + global;
  if (after / n > 0) {
    state_.epoch += after / n;
    perm_ = std::make_unique<IndexPermutation>(total_windows_, seed_, state_.epoch);
  }
  state_.index = after % n;
}

void DatasetLoader::set_state(const LoaderState& s) {
  check(s.index <= static_cast<uint64_t>(total_windows_),
        "loader: saved position {} exceeds the {} windows of {} (epoch {})", s.index, total_windows_, dir_, s.epoch);
  state_ = s;
  if (state_.index == static_cast<uint64_t>(total_windows_)) {
    ++state_.epoch;
    state_.index = 0;
  }
  perm_ = std::make_unique<IndexPermutation>(total_windows_, seed_, state_.epoch);
}

}  // namespace llmt
