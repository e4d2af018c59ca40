// GPT-2 byte-level BPE tokenizer (data.md section 6.1), id-exact with tiktoken's "gpt2"
// encode_ordinary: the GPT-2 pre-tokenization regex (through PCRE2 with UTF and UCP), then
// lowest-rank-first merges over each pre-token's UTF-8 bytes.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace llmt {

class Gpt2Tokenizer {
 public:
  /// Loads `dir`/encoder.json (token string -> id, 50257 entries) and `dir`/vocab.bpe
  /// (50000 merges). Throws llmt::Error naming the file when one is missing or malformed.
  static Gpt2Tokenizer load(const std::string& dir);

  /// Token ids of `text` (UTF-8). Special-token strings are ordinary text
  /// ("<|endoftext|>" in the text is not id 50256). Throws llmt::Error on invalid UTF-8,
  /// naming the byte offset.
  std::vector<int32_t> encode(std::string_view text) const;

  /// The UTF-8 bytes of `ids` concatenated. Throws llmt::Error for an id out of range.
  std::string decode(const std::vector<int32_t>& ids) const;

  int32_t vocab_size() const { return 50257; }
  int32_t eot_id() const { return 50256; }

  Gpt2Tokenizer(Gpt2Tokenizer&&) noexcept;
  Gpt2Tokenizer& operator=(Gpt2Tokenizer&&) noexcept;
  ~Gpt2Tokenizer();

 private:
  struct Impl;
  explicit Gpt2Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace llmt
