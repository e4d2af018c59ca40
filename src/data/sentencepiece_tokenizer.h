// SentencePiece `.model` files through libsentencepiece (Debian libsentencepiece-dev): the
// library's own normalization and segmentation, ids as the model defines them.
#pragma once
#include <memory>
#include <string>

#include "data/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace llmt {

class SentencePieceTokenizer : public Tokenizer {
 public:
  /// Loads the model file. Throws llmt::Error naming it when it is missing or not a model.
  explicit SentencePieceTokenizer(const std::string& model_path);
  ~SentencePieceTokenizer() override;

  void encode_append(std::string_view text, std::vector<int32_t>* out) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int32_t vocab_size() const override;
  int32_t bos_id() const override;
  int32_t eos_id() const override;
  const std::string& name() const override { return name_; }
  const std::string& hash() const override { return hash_; }

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::string name_, hash_;
};

}  // namespace llmt
