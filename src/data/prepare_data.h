// prepare-data (issue 3): corpus files -> token shards + DIR/dataset.json.
//
// Inputs, in the order given (a directory: its files recursively, sorted by path; a glob:
// its matches sorted): `.jsonl` and `.jsonl.zst` (SlimPajama: one JSON object per line,
// field "text", metadata "meta.redpajama_set_name"; `meta` may also be a JSON string),
// `.parquet` (FineWeb-Edu, converted to JSON lines by tools/parquet2jsonl.mjs under Node,
// read through a pipe; fields "text", "int_score", ...) and `.txt` (the whole file is one
// document). An unpaired UTF-16 surrogate escape in the JSON is replaced by U+FFFD and counted
// (dataset.json lone_surrogates_replaced). Documents that pass the filters are numbered g = 0, 1, ... in input order;
// document g goes to validation when splitmix64(g) / 2^64 < val_fraction, else to training.
// Each stream (train, val) is the concatenation of its documents' tokens, each preceded by the
// separator (none, EOS or BOS), cut into shards of exactly shard_tokens tokens (the last one
// shorter; a document may straddle two shards) named train_NNNNNN.bin / val_NNNNNN.bin in the
// llm.c format (data/shard.h). The output depends only on the inputs and options, never on
// the thread count. Restartable: after every finished shard (written under a temporary name,
// fsynced, renamed) DIR/prepare_state.json records the shards and where each stream stands
// (document, token offset); a rerun with the same inputs and options keeps those shards,
// tokenizes only from there on, and refuses (naming the key) when inputs or options changed.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace llmt {

struct PrepareOptions {
  std::vector<std::string> inputs;  ///< files, directories or glob patterns
  std::string tokenizer = "gpt2";   ///< name or path (load_tokenizer: BPE names/files or a SentencePiece .model)
  std::string out_dir;
  double val_fraction = 0.0;                ///< in [0, 1): share of documents held out
  int64_t shard_tokens = 100'000'000;       ///< tokens per shard (llm.c's default)
  std::string doc_separator = "none";       ///< none | eos | bos: token put before each document
  int threads = 0;                          ///< tokenizer threads; 0 = hardware concurrency
  std::vector<std::string> include_sets;    ///< keep only these redpajama_set_name values
  std::vector<std::string> exclude_sets;    ///< drop these redpajama_set_name values
  std::optional<int64_t> min_int_score;     ///< drop documents with int_score below this
  bool progress = true;                     ///< a progress line on stderr
  std::string node = "node";                ///< the Node.js binary for .parquet inputs
  int64_t stop_after_shards = -1;           ///< tests: stop (as if killed) after this many new shards
};

struct PrepareResult {
  int64_t documents = 0;        ///< documents kept (after filters)
  int64_t filtered_out = 0;     ///< documents dropped by the filters
  int64_t lone_surrogates = 0;  ///< unpaired \uD800-\uDFFF escapes replaced by U+FFFD
  int64_t train_tokens = 0, val_tokens = 0;
  int64_t shards_written = 0;   ///< shards written by this run
  int64_t shards_reused = 0;    ///< finished shards of an earlier run that were kept
  bool complete = false;        ///< false only when stopped by stop_after_shards
};

/// Runs the preparation described above. Throws llmt::Error naming the file and line (or
/// byte offset) of bad input: unparsable JSON, a missing or non-string "text", invalid UTF-8,
/// a missing int_score under --min-int-score, a corrupt zstd frame, an unknown extension, a
/// failing Node converter, and naming the key when an earlier run's state does not match.
PrepareResult prepare_data(const PrepareOptions& options);

/// The input files `inputs` expand to, in processing order (see above). Throws llmt::Error for
/// a path or pattern that matches nothing.
std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs);

/// splitmix64(g) / 2^64 < val_fraction: whether kept document g is a validation document.
bool is_val_document(int64_t g, double val_fraction);

}  // namespace llmt
