// The tokenizer interface of the data pipeline, and the loader that picks an implementation by
// name or file: byte-level BPE (data/bpe_tokenizer.h: "gpt2", "llama3", "llama3.1", a
// tokenizer.json or an encoder.json + vocab.bpe directory) or SentencePiece (a `.model` file,
// through libsentencepiece; data/sentencepiece_tokenizer.h).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace llmt {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  /// Appends the ids of `text` (UTF-8) to `out`; special-token strings are ordinary text.
  /// Thread-safe. Throws llmt::Error on input the tokenizer cannot encode, naming the offset.
  virtual void encode_append(std::string_view text, std::vector<int32_t>* out) const = 0;
  /// encode_append into a fresh vector.
  std::vector<int32_t> encode(std::string_view text) const {
    std::vector<int32_t> ids;
    ids.reserve(text.size() / 3);
    encode_append(text, &ids);
    return ids;
  }
  /// Text of `ids`; throws llmt::Error for an id out of range, naming its position.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int32_t vocab_size() const = 0;  ///< number of ids
  virtual int32_t bos_id() const = 0;      ///< -1 when none
  virtual int32_t eos_id() const = 0;      ///< -1 when none
  virtual const std::string& name() const = 0;  ///< canonical name or the path loaded
  virtual const std::string& hash() const = 0;  ///< FNV-1a 64 (hex) of the files loaded
};

/// Length in bytes of the longest prefix of `text` that does not end inside a UTF-8 sequence: text.size(),
/// unless the last 1-3 bytes are the start of a multi-byte character whose continuation bytes have not
/// come yet (a byte-level BPE token may end mid-character). For printing decoded text as it grows.
size_t complete_utf8_prefix(const std::string& text);

/// "gpt2", "llama3", "llama3.1", a tokenizer.json, a directory (tokenizer.json or
/// encoder.json + vocab.bpe) -> BpeTokenizer; a path ending in ".model" -> SentencePiece.
/// Throws llmt::Error naming the file, or saying which library the build lacks.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& name_or_path);

}  // namespace llmt
