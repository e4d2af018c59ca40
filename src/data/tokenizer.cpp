#include "data/tokenizer.h"

#include "core/error.h"
#include "data/bpe_tokenizer.h"
#ifdef LLMT_HAVE_SENTENCEPIECE
#include "data/sentencepiece_tokenizer.h"
#endif

namespace llmt {

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
