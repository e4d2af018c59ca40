#include "data/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include <fstream>
#include <sstream>

#include "core/error.h"

namespace llmt {

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_path)
    : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()), name_(model_path) {
  std::ifstream in(model_path, std::ios::binary);
  check(static_cast<bool>(in), "tokenizer: cannot open SentencePiece model {}", model_path);
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string bytes = ss.str();
  const auto status = sp_->LoadFromSerializedProto(bytes);
  check(status.ok(), "tokenizer {}: not a SentencePiece model: {}", model_path, status.ToString());
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : bytes) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  hash_ = fmt::format("{:016x}", h);
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

void SentencePieceTokenizer::encode_append(std::string_view text, std::vector<int32_t>* out) const {
  std::vector<int> ids;
  const auto status = sp_->Encode(text, &ids);
  check(status.ok(), "tokenizer {}: cannot encode: {}", name_, status.ToString());
  out->insert(out->end(), ids.begin(), ids.end());
}

std::string SentencePieceTokenizer::decode(const std::vector<int32_t>& ids) const {
  for (size_t i = 0; i < ids.size(); ++i) {
    check(ids[i] >= 0 && ids[i] < vocab_size(), "tokenizer {}: cannot decode id {} at position {} (vocabulary {})",
          name_, ids[i], i, vocab_size());
  }
  std::string text;
  const auto status = sp_->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
  check(status.ok(), "tokenizer {}: cannot decode: {}", name_, status.ToString());
  return text;
}

int32_t SentencePieceTokenizer::vocab_size() const { return sp_->GetPieceSize(); }
int32_t SentencePieceTokenizer::bos_id() const { return sp_->bos_id(); }
int32_t SentencePieceTokenizer::eos_id() const { return sp_->eos_id(); }

}  // namespace llmt
