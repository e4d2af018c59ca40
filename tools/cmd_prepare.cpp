// llmtrain prepare-data: corpus files (SlimPajama .jsonl/.jsonl.zst, FineWeb-Edu .parquet,
// plain .txt) -> llm.c token shards + dataset.json (src/data/prepare_data.h).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "tools/commands.h"
#ifdef LLMT_HAVE_PCRE2
#include "data/prepare_data.h"
#endif

namespace llmt::cli {

int prepare_data(const PrepareDataArgs& args) {
#ifndef LLMT_HAVE_PCRE2
  throw Error("prepare-data: llmtrain was built without PCRE2, so it has no tokenizer; install libpcre2-dev and rebuild");
#else
  PrepareOptions o;
  o.inputs = args.inputs;
  o.tokenizer = args.tokenizer;
  o.out_dir = args.out;
  o.val_fraction = args.val_fraction;
  o.shard_tokens = args.shard_tokens;
  o.doc_separator = args.doc_separator;
  o.threads = args.threads;
  o.include_sets = args.include_sets;
  o.exclude_sets = args.exclude_sets;
  if (args.min_int_score_set) o.min_int_score = args.min_int_score;
  o.progress = !args.quiet;
  o.node = args.node;
  const PrepareResult r = llmt::prepare_data(o);
  fmt::print("{}: {} documents ({} filtered out), {} train + {} val tokens; {} shards written, {} kept from an "
             "earlier run\n",
             args.out, r.documents, r.filtered_out, r.train_tokens, r.val_tokens, r.shards_written, r.shards_reused);
  if (r.val_tokens == 0)
    spdlog::warn("prepare-data: no validation tokens ({}); the validation share is chosen per document (a .txt "
                 "file is one document), and training needs a validation stream",
                 args.val_fraction > 0 ? fmt::format("--val-fraction {} over {} documents", args.val_fraction,
                                                     r.documents)
                                       : std::string("--val-fraction is 0"));
  return 0;
#endif
}

}  // namespace llmt::cli
