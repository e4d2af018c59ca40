#include "data/gpt2_tokenizer.h"

#include <pcre2.h>

#include <array>
#include <fstream>
#include <limits>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace llmt {
namespace {

// The GPT-2 pre-tokenization regex with `\s` spelled \p{White_Space}, the Unicode property
// that tiktoken (Rust regex) and the Python `regex` module use. PCRE2's UCP `\s` differs: it
// also matches U+180E, which is not White_Space.
constexpr const char* kPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\p{White_Space}\p{L}\p{N}]+)"
    R"(|\p{White_Space}+(?!\P{White_Space})|\p{White_Space}+)";

constexpr int32_t kVocabSize = 50257;
constexpr int32_t kNumMerges = 50000;

// GPT-2's bytes_to_unicode: the code point that stands for each byte in encoder.json and
// vocab.bpe (printable Latin-1 bytes stand for themselves, the other 68 go to U+0100...).
std::array<uint32_t, 256> byte_to_code_point() {
  std::array<uint32_t, 256> map{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    map[b] = printable ? b : next++;
  }
  return map;
}

// Decodes one byte-level-unicode string of encoder.json / vocab.bpe to its raw bytes.
// Returns false when it holds a code point outside the 256 byte stand-ins.
bool unicode_to_bytes(const std::string& s, const std::unordered_map<uint32_t, uint8_t>& inverse,
                      std::string* out) {
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
      return false;  // every stand-in is below U+0800
    }
    const auto it = inverse.find(cp);
    if (it == inverse.end()) return false;
    out->push_back(static_cast<char>(it->second));
  }
  return true;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  check(static_cast<bool>(in), "GPT-2 tokenizer: cannot open {}", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

}  // namespace

struct Gpt2Tokenizer::Impl {
  struct Merge {
    int32_t rank;    // line number in vocab.bpe: lower merges first
    int32_t result;  // id of the merged token
  };
  std::vector<std::string> token_bytes;  // id -> raw bytes
  std::array<int32_t, 256> byte_id{};    // raw byte -> id
  std::unordered_map<uint64_t, Merge> merges;
  pcre2_code* regex = nullptr;

  ~Impl() { pcre2_code_free(regex); }

  // Lowest-rank-first BPE over the bytes of one pre-token.
  void bpe(std::string_view piece, std::vector<int32_t>* out) const {
    std::vector<int32_t> ids;
    ids.reserve(piece.size());
    for (char c : piece) ids.push_back(byte_id[static_cast<uint8_t>(c)]);
    while (ids.size() > 1) {
      int32_t best_rank = std::numeric_limits<int32_t>::max();
      size_t best = 0;
      const Merge* best_merge = nullptr;
      for (size_t i = 0; i + 1 < ids.size(); ++i) {
        const auto it = merges.find(pair_key(ids[i], ids[i + 1]));
        if (it != merges.end() && it->second.rank < best_rank) {
          best_rank = it->second.rank;
          best = i;
          best_merge = &it->second;
        }
      }
      if (best_merge == nullptr) break;
      ids[best] = best_merge->result;
      ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    }
    out->insert(out->end(), ids.begin(), ids.end());
  }
};

Gpt2Tokenizer::Gpt2Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Gpt2Tokenizer::Gpt2Tokenizer(Gpt2Tokenizer&&) noexcept = default;
Gpt2Tokenizer& Gpt2Tokenizer::operator=(Gpt2Tokenizer&&) noexcept = default;
Gpt2Tokenizer::~Gpt2Tokenizer() = default;

Gpt2Tokenizer Gpt2Tokenizer::load(const std::string& dir) {
  auto impl = std::make_unique<Impl>();
  const std::array<uint32_t, 256> cp_of_byte = byte_to_code_point();
  std::unordered_map<uint32_t, uint8_t> byte_of_cp;
  for (int b = 0; b < 256; ++b) byte_of_cp[cp_of_byte[b]] = static_cast<uint8_t>(b);

  // encoder.json: byte-level-unicode token string -> id.
  const std::string encoder_path = dir + "/encoder.json";
  const nlohmann::json encoder = nlohmann::json::parse(read_file(encoder_path), nullptr, false);
  check(encoder.is_object() && encoder.size() == kVocabSize,
        "GPT-2 tokenizer: {} is not a JSON object of {} entries", encoder_path, kVocabSize);
  impl->token_bytes.assign(kVocabSize, std::string());
  std::vector<bool> seen(kVocabSize, false);
  std::unordered_map<std::string, int32_t> id_of;  // byte-level-unicode string -> id
  id_of.reserve(kVocabSize);
  std::string bytes;
  for (const auto& [key, value] : encoder.items()) {
    check(value.is_number_integer(), "GPT-2 tokenizer: {}: id of \"{}\" is not an integer", encoder_path, key);
    const int64_t id = value.get<int64_t>();
    check(id >= 0 && id < kVocabSize && !seen[id], "GPT-2 tokenizer: {}: id {} of \"{}\" is out of range or repeated",
          encoder_path, id, key);
    check(unicode_to_bytes(key, byte_of_cp, &bytes), "GPT-2 tokenizer: {}: token \"{}\" is not byte-level unicode",
          encoder_path, key);
    seen[id] = true;
    impl->token_bytes[id] = bytes;
    id_of.emplace(key, static_cast<int32_t>(id));
  }
  for (int b = 0; b < 256; ++b) {
    std::string cp_utf8;
    const uint32_t cp = cp_of_byte[b];
    if (cp < 0x80) {
      cp_utf8.push_back(static_cast<char>(cp));
    } else {
      cp_utf8.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      cp_utf8.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    const auto it = id_of.find(cp_utf8);
    check(it != id_of.end(), "GPT-2 tokenizer: {} has no token for byte 0x{:02X}", encoder_path, b);
    impl->byte_id[b] = it->second;
  }

  // vocab.bpe: "#version" line, then merges "A B" in priority order.
  const std::string merges_path = dir + "/vocab.bpe";
  std::istringstream merges_text(read_file(merges_path));
  std::string line;
  int64_t line_no = 0;
  int32_t rank = 0;
  while (std::getline(merges_text, line)) {
    ++line_no;
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t space = line.find(' ');
    check(space != std::string::npos && line.find(' ', space + 1) == std::string::npos,
          "GPT-2 tokenizer: {} line {}: expected two tokens separated by one space", merges_path, line_no);
    const std::string left = line.substr(0, space), right = line.substr(space + 1);
    const auto l = id_of.find(left), r = id_of.find(right), m = id_of.find(left + right);
    check(l != id_of.end() && r != id_of.end() && m != id_of.end(),
          "GPT-2 tokenizer: {} line {}: \"{}\" is not in {}", merges_path, line_no, line, encoder_path);
    impl->merges.emplace(pair_key(l->second, r->second), Impl::Merge{rank++, m->second});
  }
  check(rank == kNumMerges, "GPT-2 tokenizer: {} has {} merges, expected {}", merges_path, rank, kNumMerges);

  int error = 0;
  PCRE2_SIZE error_offset = 0;
  impl->regex = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                              PCRE2_UTF | PCRE2_UCP, &error, &error_offset, nullptr);
  if (impl->regex == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    throw Error(fmt::format("GPT-2 tokenizer: PCRE2 cannot compile the pre-tokenization regex at offset {}: {}",
                            error_offset, reinterpret_cast<const char*>(message)));
  }
  pcre2_jit_compile(impl->regex, PCRE2_JIT_COMPLETE);  // when JIT is unavailable pcre2_match interprets
  return Gpt2Tokenizer(std::move(impl));
}

std::vector<int32_t> Gpt2Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3);
  std::unordered_map<std::string_view, std::vector<int32_t>> cache;  // pre-token -> ids
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
      pcre2_match_data_create_from_pattern(impl_->regex, nullptr), &pcre2_match_data_free);
  check(match != nullptr, "GPT-2 tokenizer: out of memory for PCRE2 match data");
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  uint32_t options = 0;  // the first match validates the whole text as UTF-8, later ones skip it
  for (PCRE2_SIZE offset = 0; offset < text.size();) {
    const int rc = pcre2_match(impl_->regex, subject, text.size(), offset, options, match.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      if (rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21) {
        throw Error(fmt::format("GPT-2 tokenizer: invalid UTF-8 at byte offset {}: {}",
                                pcre2_get_startchar(match.get()), reinterpret_cast<const char*>(message)));
      }
      throw Error(fmt::format("GPT-2 tokenizer: PCRE2 match failed at byte offset {}: {}", offset,
                              reinterpret_cast<const char*>(message)));
    }
    options = PCRE2_NO_UTF_CHECK;
    const PCRE2_SIZE* span = pcre2_get_ovector_pointer(match.get());
    const std::string_view piece = text.substr(span[0], span[1] - span[0]);
    auto it = cache.find(piece);
    if (it == cache.end()) {
      std::vector<int32_t> piece_ids;
      impl_->bpe(piece, &piece_ids);
      it = cache.emplace(piece, std::move(piece_ids)).first;
    }
    ids.insert(ids.end(), it->second.begin(), it->second.end());
    offset = span[1];
  }
  return ids;
}

std::string Gpt2Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    check(ids[i] >= 0 && ids[i] < kVocabSize, "GPT-2 tokenizer: cannot decode id {} at position {} (vocabulary {})",
          ids[i], i, kVocabSize);
    out += impl_->token_bytes[ids[i]];
  }
  return out;
}

}  // namespace llmt
