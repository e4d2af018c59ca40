#include "data/bpe_tokenizer.h"

#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace llmt {
namespace {

namespace fs = std::filesystem;

// The GPT-2 pre-tokenization regex (data.md 6.1), as in OpenAI's encoder.py and HF's
// ByteLevel pre-tokenizer with use_regex.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

constexpr int32_t kNoRank = std::numeric_limits<int32_t>::max();

// GPT-2's bytes_to_unicode: the code point standing for each byte in byte-level vocabularies
// (printable Latin-1 bytes stand for themselves, the other 68 go to U+0100, U+0101, ...).
std::array<uint32_t, 256> byte_to_code_point() {
  std::array<uint32_t, 256> map{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    map[b] = printable ? b : next++;
  }
  return map;
}

std::string utf8_of(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else {  // every byte stand-in is below U+0800
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

// Decodes one byte-level-unicode vocabulary string to raw bytes. False when it holds a code
// point that is not one of the 256 byte stand-ins.
bool unicode_to_bytes(const std::string& s, const std::array<int16_t, 0x800>& byte_of_cp, std::string* out) {
  out->clear();
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<uint8_t>(s[i]);
    uint32_t cp;
    if (c < 0x80) {
      cp = c;
      i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < s.size()) {
      cp = ((c & 0x1Fu) << 6) | (static_cast<uint8_t>(s[i + 1]) & 0x3Fu);
      i += 2;
    } else {
      return false;
    }
    if (byte_of_cp[cp] < 0) return false;
    out->push_back(static_cast<char>(byte_of_cp[cp]));
  }
  return true;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  check(static_cast<bool>(in), "tokenizer: cannot open {}", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  check(!in.bad(), "tokenizer: cannot read {}", path);
  return ss.str();
}

uint64_t fnv1a64(std::string_view bytes, uint64_t h = 0xcbf29ce484222325ull) {
  for (char c : bytes) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// Length of the valid UTF-8 sequence at s[i] (1..4), or 0 when it is invalid (overlong,
// surrogate, above U+10FFFF, truncated), the same rules as PCRE2's UTF check.
size_t utf8_length(std::string_view s, size_t i) {
  const auto c = static_cast<uint8_t>(s[i]);
  if (c < 0x80) return 1;
  const auto cont = [&](size_t k) { return i + k < s.size() && (static_cast<uint8_t>(s[i + k]) & 0xC0) == 0x80; };
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (!cont(1) || !cont(2)) return 0;
    const auto c1 = static_cast<uint8_t>(s[i + 1]);
    if (c == 0xE0 && c1 < 0xA0) return 0;  // overlong
    if (c == 0xED && c1 >= 0xA0) return 0;  // surrogate
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    const auto c1 = static_cast<uint8_t>(s[i + 1]);
    if (c == 0xF0 && c1 < 0x90) return 0;  // overlong
    if (c == 0xF4 && c1 >= 0x90) return 0;  // above U+10FFFF
    return 4;
  }
  return 0;
}

void check_utf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    // Fast path over ASCII, 8 bytes at a time.
    while (i + 8 <= text.size()) {
      uint64_t w;
      std::memcpy(&w, text.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= text.size()) break;
    const size_t n = utf8_length(text, i);
    check(n != 0, "tokenizer: invalid UTF-8 at byte offset {} (byte 0x{:02X})", i, static_cast<uint8_t>(text[i]));
    i += n;
  }
}

// Open-addressing hash table (pair of ids) -> (rank, merged id).
class MergeTable {
 public:
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    keys_.assign(cap, kEmpty);
    values_.assign(cap, {0, 0});
    mask_ = cap - 1;
  }
  /// Inserts unless the pair is present (the first, lower-rank merge wins). False if present.
  bool insert(uint64_t key, int32_t rank, int32_t result) {
    for (size_t i = slot(key);; i = (i + 1) & mask_) {
      if (keys_[i] == key) return false;
      if (keys_[i] == kEmpty) {
        keys_[i] = key;
        values_[i] = {rank, result};
        return true;
      }
    }
  }
  /// (rank, merged id) of the pair, rank kNoRank when there is no such merge.
  std::pair<int32_t, int32_t> find(int32_t left, int32_t right) const {
    const uint64_t key = pair_key(left, right);
    for (size_t i = slot(key);; i = (i + 1) & mask_) {
      if (keys_[i] == key) return values_[i];
      if (keys_[i] == kEmpty) return {kNoRank, -1};
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  size_t slot(uint64_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 20) & mask_; }
  std::vector<uint64_t> keys_;
  std::vector<std::pair<int32_t, int32_t>> values_;
  size_t mask_ = 0;
};

std::atomic<uint64_t> g_next_instance{1};

}  // namespace

std::string white_space_pattern(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 32);
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '\\' && i + 1 < pattern.size()) {
      const char next = pattern[i + 1];
      if (next == 's') {
        out += "\\p{White_Space}";
      } else if (next == 'S') {
        out += "\\P{White_Space}";
      } else {
        out += pattern[i];
        out += next;
      }
      ++i;  // an escape is two characters: "\\s" stays a backslash and an 's'
    } else {
      out += pattern[i];
    }
  }
  return out;
}

struct BpeTokenizer::Impl {
  std::string name, hash, pattern;
  std::vector<std::string> token_bytes;  // id -> raw bytes ("" for an unused id)
  std::array<int32_t, 256> byte_id{};    // raw byte -> id
  MergeTable merges;
  bool ignore_merges = false;
  std::unordered_map<std::string, int32_t> id_of_bytes;  // raw bytes -> id (vocabulary only)
  std::unordered_map<std::string, int32_t> id_of_text;   // raw bytes -> id (vocabulary and added)
  int32_t bos = -1, eos = -1;
  pcre2_code* regex = nullptr;
  bool jit = false;
  uint64_t instance = g_next_instance.fetch_add(1);

  ~Impl() { pcre2_code_free(regex); }

  void compile(const std::string& source_pattern, const std::string& where) {
    pattern = white_space_pattern(source_pattern);
    int error = 0;
    PCRE2_SIZE error_offset = 0;
    regex = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP, &error, &error_offset, nullptr);
    if (regex == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      throw Error(fmt::format("tokenizer {}: PCRE2 cannot compile the pre-tokenization regex at offset {}: {}", where,
                              error_offset, reinterpret_cast<const char*>(message)));
    }
    jit = pcre2_jit_compile(regex, PCRE2_JIT_COMPLETE) == 0;
  }

  void finish(const std::string& where) {
    for (int32_t id = 0; id < static_cast<int32_t>(token_bytes.size()); ++id) {
      if (!token_bytes[id].empty()) id_of_text.emplace(token_bytes[id], id);
    }
    const auto find = [&](std::initializer_list<const char*> names) {
      for (const char* n : names) {
        const auto it = id_of_text.find(n);
        if (it != id_of_text.end()) return it->second;
      }
      return -1;
    };
    bos = find({"<|begin_of_text|>", "<|endoftext|>", "<s>"});
    eos = find({"<|end_of_text|>", "<|endoftext|>", "</s>"});
    (void)where;
  }

  // Lowest-rank-first merges over `ids` (one pre-token's byte ids), ties leftmost; appends
  // the result. Short pieces: a linear scan per merge (tiktoken's loop); long ones: a heap
  // over a linked list, O(n log n), so a 1 MB "word" does not take minutes.
  void merge_loop(std::vector<int32_t>& ids, std::vector<int32_t>* out) const {
    const size_t n = ids.size();
    if (n <= 96) {
      thread_local std::vector<std::pair<int32_t, int32_t>> pr;  // (rank, result) of pair (i, i+1)
      pr.resize(n);
      for (size_t i = 0; i + 1 < n; ++i) pr[i] = merges.find(ids[i], ids[i + 1]);
      size_t len = n;
      while (len > 1) {
        int32_t best_rank = kNoRank;
        size_t best = 0;
        for (size_t i = 0; i + 1 < len; ++i) {
          if (pr[i].first < best_rank) {
            best_rank = pr[i].first;
            best = i;
          }
        }
        if (best_rank == kNoRank) break;
        ids[best] = pr[best].second;
        for (size_t i = best + 1; i + 1 < len; ++i) {
          ids[i] = ids[i + 1];
          pr[i] = pr[i + 1];
        }
        --len;
        if (best > 0) pr[best - 1] = merges.find(ids[best - 1], ids[best]);
        if (best + 1 < len) pr[best] = merges.find(ids[best], ids[best + 1]);
      }
      out->insert(out->end(), ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(len));
      return;
    }
    struct Cand {
      int32_t rank, pos, left, right;
      bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::vector<int32_t> next(n), prev(n);
    for (size_t i = 0; i < n; ++i) {
      next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
      prev[i] = static_cast<int32_t>(i) - 1;
    }
    std::vector<Cand> heap;
    const auto push = [&](int32_t pos) {
      if (pos < 0 || next[pos] < 0) return;
      const auto [rank, result] = merges.find(ids[pos], ids[next[pos]]);
      if (rank == kNoRank) return;
      heap.push_back({rank, pos, ids[pos], ids[next[pos]]});
      std::push_heap(heap.begin(), heap.end(), std::greater<Cand>());
    };
    for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<Cand>());
      const Cand c = heap.back();
      heap.pop_back();
      const int32_t r = next[c.pos];
      if (ids[c.pos] != c.left || r < 0 || ids[r] != c.right) continue;  // stale
      ids[c.pos] = merges.find(c.left, c.right).second;
      next[c.pos] = next[r];
      if (next[r] >= 0) prev[next[r]] = c.pos;
      ids[r] = -1;
      push(prev[c.pos]);
      push(c.pos);
    }
    for (int32_t i = 0; i >= 0; i = next[i]) out->push_back(ids[i]);
  }

  void bpe(std::string_view piece, std::vector<int32_t>* out) const {
    if (ignore_merges) {
      const auto it = id_of_bytes.find(std::string(piece));
      if (it != id_of_bytes.end()) {
        out->push_back(it->second);
        return;
      }
    }
    thread_local std::vector<int32_t> ids;
    ids.resize(piece.size());
    for (size_t i = 0; i < piece.size(); ++i) ids[i] = byte_id[static_cast<uint8_t>(piece[i])];
    merge_loop(ids, out);
  }
};

namespace {

// Per-thread matching state and pre-token cache of one tokenizer instance.
struct Scratch {
  uint64_t instance = 0;
  pcre2_match_data* match = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  std::unordered_map<std::string_view, std::pair<uint32_t, uint32_t>> cache;  // piece -> [offset, count) in ids
  std::vector<std::unique_ptr<char[]>> arena;                                 // the cached pieces' bytes
  size_t arena_used = 0, arena_chunk = 0;
  std::vector<int32_t> ids;
  static constexpr size_t kChunk = 1 << 20;
  static constexpr size_t kMaxEntries = 1 << 18;

  ~Scratch() {
    pcre2_match_data_free(match);
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
  }
  void reset(uint64_t inst) {
    cache.clear();
    ids.clear();
    arena.clear();
    arena_used = arena_chunk = 0;
    instance = inst;
  }
  std::string_view store(std::string_view piece) {
    if (piece.size() > kChunk / 4) {  // a long piece gets its own block
      arena.emplace_back(new char[piece.size()]);
      std::memcpy(arena.back().get(), piece.data(), piece.size());
      return {arena.back().get(), piece.size()};
    }
    if (arena.empty() || arena_used + piece.size() > arena_chunk) {
      arena.emplace_back(new char[kChunk]);
      arena_used = 0;
      arena_chunk = kChunk;
    }
    char* p = arena.back().get() + arena_used;
    std::memcpy(p, piece.data(), piece.size());
    arena_used += piece.size();
    return {p, piece.size()};
  }
};

}  // namespace

BpeTokenizer::BpeTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;
BpeTokenizer::~BpeTokenizer() = default;

int32_t BpeTokenizer::vocab_size() const { return static_cast<int32_t>(impl_->token_bytes.size()); }
int32_t BpeTokenizer::bos_id() const { return impl_->bos; }
int32_t BpeTokenizer::eos_id() const { return impl_->eos; }
const std::string& BpeTokenizer::name() const { return impl_->name; }
const std::string& BpeTokenizer::hash() const { return impl_->hash; }
const std::string& BpeTokenizer::pattern() const { return impl_->pattern; }

int32_t BpeTokenizer::token_id(std::string_view token) const {
  const auto it = impl_->id_of_text.find(std::string(token));
  return it == impl_->id_of_text.end() ? -1 : it->second;
}

BpeTokenizer BpeTokenizer::from_gpt2_files(const std::string& dir) {
  auto impl = std::make_unique<Impl>();
  const std::array<uint32_t, 256> cp_of_byte = byte_to_code_point();
  std::array<int16_t, 0x800> byte_of_cp;
  byte_of_cp.fill(-1);
  for (int b = 0; b < 256; ++b) byte_of_cp[cp_of_byte[b]] = static_cast<int16_t>(b);

  const std::string encoder_path = dir + "/encoder.json";
  const std::string encoder_text = read_file(encoder_path);
  const nlohmann::json encoder = nlohmann::json::parse(encoder_text, nullptr, false);
  check(encoder.is_object() && !encoder.empty(), "tokenizer: {} is not a non-empty JSON object", encoder_path);
  std::unordered_map<std::string, int32_t> id_of;  // byte-level-unicode string -> id
  id_of.reserve(encoder.size());
  std::string bytes;
  int64_t max_id = -1;
  for (const auto& [key, value] : encoder.items()) {
    check(value.is_number_integer(), "tokenizer: {}: id of \"{}\" is not an integer", encoder_path, key);
    const int64_t id = value.get<int64_t>();
    check(id >= 0 && id < (1 << 30), "tokenizer: {}: id {} of \"{}\" is out of range", encoder_path, id, key);
    max_id = std::max(max_id, id);
  }
  impl->token_bytes.assign(static_cast<size_t>(max_id + 1), std::string());
  for (const auto& [key, value] : encoder.items()) {
    const auto id = value.get<int32_t>();
    check(impl->token_bytes[id].empty(), "tokenizer: {}: id {} of \"{}\" is repeated", encoder_path, id, key);
    check(unicode_to_bytes(key, byte_of_cp, &bytes), "tokenizer: {}: token \"{}\" is not byte-level unicode",
          encoder_path, key);
    check(!bytes.empty(), "tokenizer: {}: empty token for id {}", encoder_path, id);
    impl->token_bytes[id] = bytes;
    impl->id_of_bytes.emplace(bytes, id);
    id_of.emplace(key, id);
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = id_of.find(utf8_of(cp_of_byte[b]));
    check(it != id_of.end(), "tokenizer: {} has no token for byte 0x{:02X}", encoder_path, b);
    impl->byte_id[b] = it->second;
  }

  const std::string merges_path = dir + "/vocab.bpe";
  const std::string merges_text = read_file(merges_path);
  std::istringstream merges_in(merges_text);
  impl->merges.reserve(id_of.size());
  std::string line;
  int64_t line_no = 0;
  int32_t rank = 0;
  while (std::getline(merges_in, line)) {
    ++line_no;
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t space = line.find(' ');
    check(space != std::string::npos && line.find(' ', space + 1) == std::string::npos,
          "tokenizer: {} line {}: expected two tokens separated by one space", merges_path, line_no);
    const std::string left = line.substr(0, space), right = line.substr(space + 1);
    const auto l = id_of.find(left), r = id_of.find(right), m = id_of.find(left + right);
    check(l != id_of.end() && r != id_of.end() && m != id_of.end(), "tokenizer: {} line {}: \"{}\" is not in {}",
          merges_path, line_no, line, encoder_path);
    impl->merges.insert(pair_key(l->second, r->second), rank++, m->second);
  }
  check(rank > 0, "tokenizer: {} has no merges", merges_path);
  impl->compile(kGpt2Pattern, dir);
  impl->name = dir;
  impl->hash = fmt::format("{:016x}", fnv1a64(merges_text, fnv1a64(encoder_text)));
  impl->finish(dir);
  return BpeTokenizer(std::move(impl));
}

BpeTokenizer BpeTokenizer::from_hf_json(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  const std::string text = read_file(path);
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  check(!j.is_discarded() && j.is_object(), "tokenizer {}: not a JSON object", path);
  const auto need = [&](const nlohmann::json& parent, const char* key, const char* where) -> const nlohmann::json& {
    check(parent.is_object() && parent.contains(key), "tokenizer {}: missing key {}{}", path, where, key);
    return parent[key];
  };

  // normalizer: none is supported (GPT-2 and Llama-3 have none).
  check(!j.contains("normalizer") || j["normalizer"].is_null(),
        "tokenizer {}: key normalizer is {}; only null (no normalizer) is supported", path,
        j.contains("normalizer") ? j["normalizer"].dump().substr(0, 80) : "");

  const nlohmann::json& model = need(j, "model", "");
  check(model.is_object() && model.value("type", std::string("BPE")) == "BPE",
        "tokenizer {}: key model.type must be \"BPE\"", path);
  check(!model.value("byte_fallback", false), "tokenizer {}: key model.byte_fallback = true is not supported", path);
  impl->ignore_merges = model.value("ignore_merges", false);

  // pre_tokenizer: the regex, and byte-level mapping.
  std::string pattern;
  bool byte_level = false;
  const nlohmann::json& pre = need(j, "pre_tokenizer", "");
  std::function<void(const nlohmann::json&, const std::string&)> walk = [&](const nlohmann::json& p,
                                                                             const std::string& key) {
    check(p.is_object() && p.contains("type") && p["type"].is_string(), "tokenizer {}: key {} has no type", path,
          key);
    const std::string type = p["type"];
    if (type == "Sequence") {
      const nlohmann::json& list = need(p, "pretokenizers", (key + ".").c_str());
      check(list.is_array(), "tokenizer {}: key {}.pretokenizers is not an array", path, key);
      for (size_t i = 0; i < list.size(); ++i) walk(list[i], fmt::format("{}.pretokenizers[{}]", key, i));
    } else if (type == "ByteLevel") {
      check(!p.value("add_prefix_space", false), "tokenizer {}: key {}.add_prefix_space = true is not supported",
            path, key);
      byte_level = true;
      if (p.value("use_regex", true)) {
        check(pattern.empty(), "tokenizer {}: key {}: a second pre-tokenization regex is not supported", path, key);
        pattern = kGpt2Pattern;
      }
    } else if (type == "Split") {
      check(p.contains("pattern") && p["pattern"].is_object() && p["pattern"].contains("Regex") &&
                p["pattern"]["Regex"].is_string(),
            "tokenizer {}: key {}.pattern must be {{\"Regex\": ...}}", path, key);
      check(p.value("behavior", std::string()) == "Isolated" && !p.value("invert", false),
            "tokenizer {}: key {}: only behavior \"Isolated\" without invert is supported", path, key);
      check(pattern.empty(), "tokenizer {}: key {}: a second pre-tokenization regex is not supported", path, key);
      pattern = p["pattern"]["Regex"].get<std::string>();
    } else {
      throw Error(fmt::format("tokenizer {}: key {}.type \"{}\" is not supported (ByteLevel, Split, Sequence are)",
                              path, key, type));
    }
  };
  walk(pre, "pre_tokenizer");
  check(byte_level, "tokenizer {}: key pre_tokenizer has no ByteLevel step: not a byte-level BPE", path);
  check(!pattern.empty(), "tokenizer {}: key pre_tokenizer gives no regex", path);

  const std::array<uint32_t, 256> cp_of_byte = byte_to_code_point();
  std::array<int16_t, 0x800> byte_of_cp;
  byte_of_cp.fill(-1);
  for (int b = 0; b < 256; ++b) byte_of_cp[cp_of_byte[b]] = static_cast<int16_t>(b);

  const nlohmann::json& vocab = need(model, "vocab", "model.");
  check(vocab.is_object() && !vocab.empty(), "tokenizer {}: key model.vocab is not a non-empty object", path);
  int64_t max_id = -1;
  for (const auto& [key, value] : vocab.items()) {
    check(value.is_number_integer() && value.get<int64_t>() >= 0 && value.get<int64_t>() < (1 << 30),
          "tokenizer {}: key model.vocab[\"{}\"]: id is not an integer in [0, 2^30)", path, key);
    max_id = std::max(max_id, value.get<int64_t>());
  }
  const nlohmann::json added = j.value("added_tokens", nlohmann::json::array());
  check(added.is_array(), "tokenizer {}: key added_tokens is not an array", path);
  for (size_t i = 0; i < added.size(); ++i) {
    check(added[i].is_object() && added[i].contains("id") && added[i]["id"].is_number_integer() &&
              added[i]["id"].get<int64_t>() >= 0 && added[i]["id"].get<int64_t>() < (1 << 30) &&
              added[i].contains("content") && added[i]["content"].is_string(),
          "tokenizer {}: key added_tokens[{}] needs an integer id in [0, 2^30) and a string content", path, i);
    max_id = std::max(max_id, added[i]["id"].get<int64_t>());
  }
  impl->token_bytes.assign(static_cast<size_t>(max_id + 1), std::string());
  std::unordered_map<std::string, int32_t> id_of;
  id_of.reserve(vocab.size());
  std::string bytes;
  for (const auto& [key, value] : vocab.items()) {
    const auto id = value.get<int32_t>();
    check(impl->token_bytes[id].empty(), "tokenizer {}: key model.vocab[\"{}\"]: id {} is repeated", path, key, id);
    check(unicode_to_bytes(key, byte_of_cp, &bytes) && !bytes.empty(),
          "tokenizer {}: key model.vocab[\"{}\"] is not a byte-level-unicode string", path, key);
    impl->token_bytes[id] = bytes;
    impl->id_of_bytes.emplace(bytes, id);
    id_of.emplace(key, id);
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = id_of.find(utf8_of(cp_of_byte[b]));
    check(it != id_of.end(), "tokenizer {}: key model.vocab has no token for byte 0x{:02X}", path, b);
    impl->byte_id[b] = it->second;
  }
  for (size_t i = 0; i < added.size(); ++i) {
    const auto id = added[i]["id"].get<int32_t>();
    const std::string content = added[i]["content"];
    check(impl->token_bytes[id].empty() || impl->token_bytes[id] == content,
          "tokenizer {}: key added_tokens[{}]: id {} is already the vocabulary token of other bytes", path, i, id);
    impl->token_bytes[id] = content;
  }

  const nlohmann::json& merges = need(model, "merges", "model.");
  check(merges.is_array(), "tokenizer {}: key model.merges is not an array", path);
  impl->merges.reserve(merges.size());
  std::string left, right;
  for (size_t i = 0; i < merges.size(); ++i) {
    const nlohmann::json& m = merges[i];
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      check(space != std::string::npos && s.find(' ', space + 1) == std::string::npos,
            "tokenizer {}: key model.merges[{}] = \"{}\": expected two tokens separated by one space", path, i, s);
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else {
      check(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
            "tokenizer {}: key model.merges[{}] is neither \"a b\" nor [\"a\", \"b\"]", path, i);
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    }
    const auto l = id_of.find(left), r = id_of.find(right), res = id_of.find(left + right);
    check(l != id_of.end() && r != id_of.end() && res != id_of.end(),
          "tokenizer {}: key model.merges[{}]: \"{}\", \"{}\" or their concatenation is not in model.vocab", path, i,
          left, right);
    impl->merges.insert(pair_key(l->second, r->second), static_cast<int32_t>(i), res->second);
  }
  impl->compile(pattern, path);
  impl->name = path;
  impl->hash = fmt::format("{:016x}", fnv1a64(text));
  impl->finish(path);
  return BpeTokenizer(std::move(impl));
}

std::string BpeTokenizer::resolve(const std::string& name_or_path) {
  std::string sub;
  if (name_or_path == "gpt2") sub = "gpt2";
  if (name_or_path == "llama3" || name_or_path == "llama3.1") sub = "llama3/tokenizer.json";
  if (!sub.empty()) {
    std::vector<std::string> roots = {"data/tokenizers"};
#ifdef LLMT_SOURCE_DIR
    roots.push_back(std::string(LLMT_SOURCE_DIR) + "/data/tokenizers");
#endif
    for (const std::string& root : roots) {
      const std::string p = root + "/" + sub;
      if (fs::exists(p)) return p;
    }
    throw Error(fmt::format("tokenizer \"{}\": {} not found under ./data/tokenizers or the source tree's", name_or_path,
                            sub));
  }
  std::error_code ec;
  if (fs::is_directory(name_or_path, ec)) {
    if (fs::exists(name_or_path + "/tokenizer.json")) return name_or_path + "/tokenizer.json";
    if (fs::exists(name_or_path + "/encoder.json")) return name_or_path;
    throw Error(fmt::format("tokenizer directory {} holds neither tokenizer.json nor encoder.json + vocab.bpe",
                            name_or_path));
  }
  check(fs::is_regular_file(name_or_path, ec),
        "tokenizer \"{}\" is neither a known name (gpt2, llama3, llama3.1) nor an existing file or directory",
        name_or_path);
  return name_or_path;
}

BpeTokenizer BpeTokenizer::load(const std::string& name_or_path) {
  const std::string path = resolve(name_or_path);
  std::error_code ec;
  BpeTokenizer tok = fs::is_directory(path, ec) ? from_gpt2_files(path) : from_hf_json(path);
  if (name_or_path == "gpt2") tok.impl_->name = "gpt2";
  if (name_or_path == "llama3" || name_or_path == "llama3.1") tok.impl_->name = "llama3";
  return tok;
}

void BpeTokenizer::encode_append(std::string_view text, std::vector<int32_t>* out) const {
  if (text.empty()) return;
  check_utf8(text);
  const Impl& impl = *impl_;
  thread_local Scratch s;
  if (s.match == nullptr) {
    s.match = pcre2_match_data_create(1, nullptr);
    s.context = pcre2_match_context_create(nullptr);
    s.stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    check(s.match != nullptr && s.context != nullptr && s.stack != nullptr,
          "tokenizer: out of memory for PCRE2 match data");
    pcre2_jit_stack_assign(s.context, nullptr, s.stack);
  }
  if (s.instance != impl.instance || s.cache.size() > Scratch::kMaxEntries) s.reset(impl.instance);

  const auto emit = [&](std::string_view piece) {
    if (piece.size() == 1) {
      out->push_back(impl.byte_id[static_cast<uint8_t>(piece[0])]);
      return;
    }
    const auto it = s.cache.find(piece);
    if (it != s.cache.end()) {
      out->insert(out->end(), s.ids.begin() + it->second.first, s.ids.begin() + it->second.first + it->second.second);
      return;
    }
    const size_t before = out->size();
    impl.bpe(piece, out);
    if (piece.size() <= 256) {  // do not let rare long pieces fill the cache
      const auto offset = static_cast<uint32_t>(s.ids.size());
      s.ids.insert(s.ids.end(), out->begin() + static_cast<std::ptrdiff_t>(before), out->end());
      s.cache.emplace(s.store(piece), std::pair<uint32_t, uint32_t>{offset, static_cast<uint32_t>(out->size() - before)});
    }
  };

  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t gap = 0;  // start of text not yet emitted
  for (PCRE2_SIZE offset = 0; offset < text.size();) {
    const int rc = impl.jit ? pcre2_jit_match(impl.regex, subject, text.size(), offset, 0, s.match, s.context)
                            : pcre2_match(impl.regex, subject, text.size(), offset, PCRE2_NO_UTF_CHECK, s.match,
                                          s.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      throw Error(fmt::format("tokenizer: PCRE2 match failed at byte offset {}: {}", offset,
                              reinterpret_cast<const char*>(message)));
    }
    const PCRE2_SIZE* span = pcre2_get_ovector_pointer(s.match);
    if (span[1] == span[0]) {  // empty match: step one character, it stays in the gap
      offset = span[0] + std::max<size_t>(1, utf8_length(text, span[0]));
      continue;
    }
    if (span[0] > gap) emit(text.substr(gap, span[0] - gap));  // HF "Isolated": unmatched text is a piece too
    emit(text.substr(span[0], span[1] - span[0]));
    gap = offset = span[1];
  }
  if (gap < text.size()) emit(text.substr(gap));
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    check(ids[i] >= 0 && ids[i] < vocab_size() && !impl_->token_bytes[ids[i]].empty(),
          "tokenizer: cannot decode id {} at position {} (vocabulary {})", ids[i], i, vocab_size());
    out += impl_->token_bytes[ids[i]];
  }
  return out;
}

}  // namespace llmt
