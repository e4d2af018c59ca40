// The default data path of a tiny run: one UTF-8 text file tokenized once into a train
// shard and a held-out validation shard (the last val_fraction of the tokens).
#pragma once
#include <string>

namespace llmt {

struct TextShards {
  std::string train_path;  ///< <out_dir>/train.bin
  std::string val_path;    ///< <out_dir>/val.bin
};

/// Tokenizes `text_path` with the GPT-2 tokenizer in `tokenizer_dir` and writes
/// <out_dir>/train.bin (first 1 - val_fraction of the tokens) and <out_dir>/val.bin (the
/// rest), plus <out_dir>/source.json recording the text's size and FNV-1a hash, the
/// tokenizer and the split. When source.json already matches, nothing is redone.
/// val_fraction in (0, 1). Throws llmt::Error naming the missing/unreadable file, or when
/// the build has no tokenizer (PCRE2 absent).
TextShards prepare_text_shards(const std::string& text_path, const std::string& tokenizer_dir,
                               const std::string& out_dir, double val_fraction);

}  // namespace llmt
