// Byte-level BPE tokenizer (data.md section 6): one class for GPT-2 (encoder.json +
// vocab.bpe, the OpenAI files) and for any Hugging Face `tokenizer.json` whose model is a
// byte-level BPE (GPT-2, Llama-3/3.1). Encoding = the pre-tokenization regex (PCRE2 with UTF
// and UCP, `\s` read as Unicode White_Space like Rust `regex` / Python `regex`), then per
// pre-token the lowest-rank-first merge loop over its UTF-8 bytes (ties: leftmost), which is
// both tiktoken's and HF `tokenizers`' BPE. With `ignore_merges` (Llama-3) a pre-token that is
// itself a vocabulary entry is emitted whole. Data encoding is "ordinary": added/special
// token strings in the text are plain text (llm.c's encode_ordinary).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer.h"

namespace llmt {

class BpeTokenizer : public Tokenizer {
 public:
  /// Loads the tokenizer `name_or_path`: "gpt2" (data/tokenizers/gpt2, the OpenAI files),
  /// "llama3" or "llama3.1" (data/tokenizers/llama3/tokenizer.json), a directory holding
  /// tokenizer.json or encoder.json + vocab.bpe, or a tokenizer.json file. Named tokenizers
  /// are looked up under ./data/tokenizers, then under the source tree's data/tokenizers.
  /// Throws llmt::Error naming the file (and JSON key or line) that is missing or malformed.
  static BpeTokenizer load(const std::string& name_or_path);

  /// The file or directory `name_or_path` resolves to (see load); throws when none exists.
  static std::string resolve(const std::string& name_or_path);

  /// Loads `dir`/encoder.json (byte-level-unicode token string -> id) and `dir`/vocab.bpe
  /// ("#version" line, then merges "A B" in priority order) with the GPT-2 regex.
  static BpeTokenizer from_gpt2_files(const std::string& dir);

  /// Loads a Hugging Face tokenizer.json: model.type "BPE" with model.vocab (string -> id),
  /// model.merges (strings "a b" or arrays ["a", "b"], priority order), model.ignore_merges;
  /// pre_tokenizer ByteLevel (use_regex: the GPT-2 regex) or Split{Regex, Isolated} followed
  /// by ByteLevel{use_regex: false}, possibly inside a Sequence; normalizer null; added_tokens
  /// (id, content). Anything else is rejected naming the key.
  static BpeTokenizer from_hf_json(const std::string& path);

  /// Appends the token ids of `text` (UTF-8) to `out`. Added/special token strings are
  /// ordinary text. Thread-safe (const; per-thread scratch and pre-token cache). Throws
  /// llmt::Error on invalid UTF-8, naming the byte offset.
  void encode_append(std::string_view text, std::vector<int32_t>* out) const override;
  using Tokenizer::encode;

  /// The UTF-8 bytes of `ids` concatenated (added tokens give their content). Throws
  /// llmt::Error for an id out of range, naming its position.
  std::string decode(const std::vector<int32_t>& ids) const override;

  /// Number of ids (max id + 1 over the vocabulary and the added tokens).
  int32_t vocab_size() const override;
  /// Document delimiters: bos = <|begin_of_text|> (Llama-3) or <|endoftext|> (GPT-2);
  /// eos = <|end_of_text|> or <|endoftext|>; -1 when the tokenizer has neither.
  int32_t bos_id() const override;
  int32_t eos_id() const override;
  /// The id of the token whose text is exactly `token` (added tokens included), or -1.
  int32_t token_id(std::string_view token) const;
  /// "gpt2", "llama3" or the path it was loaded from.
  const std::string& name() const override;
  /// FNV-1a 64 of the files it was loaded from, as 16 hex digits: identifies the tokenizer.
  const std::string& hash() const override;
  /// The pre-tokenization regex as compiled by PCRE2 (after the `\s` rewrite).
  const std::string& pattern() const;

  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;
  ~BpeTokenizer() override;

  struct Impl;

 private:
  explicit BpeTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// `pattern` with the regex escapes `\s` / `\S` rewritten as `\p{White_Space}` /
/// `\P{White_Space}` (inside and outside character classes), the form PCRE2 needs to match
/// like Rust `regex` and Python `regex` (PCRE2's UCP `\s` also matches U+180E).
std::string white_space_pattern(std::string_view pattern);

}  // namespace llmt
