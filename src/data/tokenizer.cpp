#include "data/tokenizer.h"

#include "core/error.h"
#include "data/bpe_tokenizer.h"
#ifdef LLMT_HAVE_SENTENCEPIECE
#include "data/sentencepiece_tokenizer.h"
#endif

namespace llmt {

size_t complete_utf8_prefix(const std::string& text) {
  const size_t n = text.size();
  // Look back over at most 3 continuation bytes (10xxxxxx) for the lead byte of the last character.
  size_t i = n, continuation = 0;
  while (i > 0 && continuation < 3 && (static_cast<unsigned char>(text[i - 1]) & 0xC0) == 0x80) --i, ++continuation;
  if (i == 0) return n;
  const auto lead = static_cast<unsigned char>(text[i - 1]);
  const size_t need = lead >= 0xF0 ? 3 : lead >= 0xE0 ? 2 : lead >= 0xC0 ? 1 : 0;  // continuation bytes it takes
  return need > continuation ? i - 1 : n;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& name_or_path) {
  const std::string suffix = ".model";
  if (name_or_path.size() > suffix.size() &&
      name_or_path.compare(name_or_path.size() - suffix.size(), suffix.size(), suffix) == 0) {
#ifdef LLMT_HAVE_SENTENCEPIECE
    return std::make_unique<SentencePieceTokenizer>(name_or_path);
#else
    throw Error(fmt::format("tokenizer {}: a SentencePiece model, but this build has no libsentencepiece "
                            "(install libsentencepiece-dev and rebuild)",
                            name_or_path));
#endif
  }
  return std::make_unique<BpeTokenizer>(BpeTokenizer::load(name_or_path));
}

}  // namespace llmt
