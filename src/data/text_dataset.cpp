#include "data/text_dataset.h"

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/shard.h"
#ifdef LLMT_HAVE_PCRE2
#include "data/bpe_tokenizer.h"
#endif

namespace llmt {
namespace {

namespace fs = std::filesystem;

uint64_t fnv1a64(const std::string& bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : bytes) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

std::vector<int32_t> tokenize(const std::string& text, const std::string& text_path, const std::string& tokenizer_dir) {
#ifdef LLMT_HAVE_PCRE2
  return BpeTokenizer::load(tokenizer_dir).encode(text);
#else
  throw Error(fmt::format("cannot tokenize {}: llmtrain was built without PCRE2 (install libpcre2-dev and rebuild), "
                          "so the GPT-2 tokenizer is unavailable; train from existing shards instead",
                          text_path));
#endif
}

// The parts of source.json that decide whether the shards are still valid.
bool source_matches(const nlohmann::json& saved, const nlohmann::json& wanted, const TextShards& shards) {
  if (!saved.is_object()) return false;
  for (const char* key : {"text_bytes", "text_fnv1a64", "tokenizer", "val_fraction"}) {
    if (!saved.contains(key) || saved[key] != wanted[key]) return false;
  }
  std::error_code ec;
  for (const auto& [path, key] : {std::pair{shards.train_path, "train_file_bytes"},
                                  std::pair{shards.val_path, "val_file_bytes"}}) {
    const auto bytes = fs::file_size(path, ec);
    if (ec || !saved.contains(key) || saved[key] != bytes) return false;
  }
  return true;
}

}  // namespace

TextShards prepare_text_shards(const std::string& text_path, const std::string& tokenizer_dir,
                               const std::string& out_dir, double val_fraction) {
  check(val_fraction > 0.0 && val_fraction < 1.0, "prepare_text_shards: val_fraction must be in (0, 1), got {}",
        val_fraction);
  std::ifstream in(text_path, std::ios::binary);
  check(static_cast<bool>(in), "prepare_text_shards: cannot open text file {}", text_path);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  check(!in.bad(), "prepare_text_shards: cannot read text file {}", text_path);
  const std::string text = buffer.str();

  const TextShards shards{out_dir + "/train.bin", out_dir + "/val.bin"};
  const std::string source_path = out_dir + "/source.json";
  nlohmann::json source = {
      {"text_path", text_path},
      {"text_bytes", text.size()},
      {"text_fnv1a64", fmt::format("{:016x}", fnv1a64(text))},
      {"tokenizer", "gpt2"},
      {"tokenizer_dir", tokenizer_dir},
      {"val_fraction", val_fraction},
  };
  {
    std::ifstream saved_in(source_path);
    if (saved_in) {
      const nlohmann::json saved = nlohmann::json::parse(saved_in, nullptr, false);
      if (source_matches(saved, source, shards)) return shards;
    }
  }

  const std::vector<int32_t> tokens = tokenize(text, text_path, tokenizer_dir);
  const auto num_val = static_cast<int64_t>(std::llround(static_cast<double>(tokens.size()) * val_fraction));
  const int64_t num_train = static_cast<int64_t>(tokens.size()) - num_val;
  check(num_val > 0 && num_train > 0,
        "prepare_text_shards: {} gives {} tokens, too few to split into train and validation at val_fraction {}",
        text_path, tokens.size(), val_fraction);

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  check(!ec, "prepare_text_shards: cannot create directory {}: {}", out_dir, ec.message());
  fs::remove(source_path, ec);  // stale until both shards are rewritten
  write_shard(shards.train_path, std::vector<int32_t>(tokens.begin(), tokens.begin() + num_train));
  write_shard(shards.val_path, std::vector<int32_t>(tokens.begin() + num_train, tokens.end()));

  source["train_tokens"] = num_train;
  source["val_tokens"] = num_val;
  source["train_file_bytes"] = fs::file_size(shards.train_path);
  source["val_file_bytes"] = fs::file_size(shards.val_path);
  const std::string tmp = source_path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << source.dump(2) << '\n';
    check(static_cast<bool>(out.flush()), "prepare_text_shards: cannot write {}", tmp);
  }
  fs::rename(tmp, source_path, ec);
  check(!ec, "prepare_text_shards: cannot rename {} to {}: {}", tmp, source_path, ec.message());
  return shards;
}

}  // namespace llmt
