// llmtrain eval: loss, perplexity and bits per byte of a checkpoint over held-out text
// (train/evaluate.h defines the windows), or its accuracy on the evaluation points of the synthetic task
// it was trained on (train/synthetic_eval.h).
#include <cmath>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/safetensors.h"
#include "data/dataset_loader.h"
#include "data/synthetic_source.h"
#include "dist/communicator.h"
#include "kernels/backend.h"
#include "model/config.h"
#include "model/model.h"
#include "tools/commands.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/synthetic_eval.h"
#ifdef LLMT_HAVE_PCRE2
#include "data/tokenizer.h"
#endif

namespace llmt::cli {

namespace {

/// Byte length of each id's text under tokenizer `name` (for bits per byte); throws when the
/// build has no tokenizer.
std::vector<int64_t> token_byte_lengths(const std::string& name) {
#ifndef LLMT_HAVE_PCRE2
  throw Error(fmt::format("eval: bits per byte need the tokenizer {}, but llmtrain was built without PCRE2; install "
                          "libpcre2-dev and rebuild", name));
#else
  const auto tok = load_tokenizer(name);
  std::vector<int64_t> bytes(static_cast<size_t>(tok->vocab_size()));
  for (int32_t id = 0; id < tok->vocab_size(); ++id) bytes[id] = static_cast<int64_t>(tok->decode({id}).size());
  return bytes;
#endif
}

/// The token ids of the text file `path` under tokenizer `name`.
std::vector<int32_t> tokenize_file(const std::string& path, const std::string& name) {
  std::ifstream in(path, std::ios::binary);
  check(static_cast<bool>(in), "eval: cannot open {}", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  check(!in.bad(), "eval: cannot read {}", path);
#ifndef LLMT_HAVE_PCRE2
  throw Error(fmt::format("eval --text {}: llmtrain was built without PCRE2, so it has no tokenizer; install "
                          "libpcre2-dev and rebuild", path));
#else
  return load_tokenizer(name)->encode(ss.str());
#endif
}

/// Writes the logits of the model's full forward over the first window of `tokens` (min(T, size) tokens)
/// to the safetensors file `path`: input_ids i32 [n], logits f32 [n, vocab_size] (the next-token logits at
/// each position, what a Hugging Face model's forward(input_ids).logits gives: docs/INTEROP.md).
void dump_logits(Model& model, const std::vector<int32_t>& tokens, int64_t T, const std::string& path) {
  const int64_t n = std::min<int64_t>(T, static_cast<int64_t>(tokens.size()));
  const int64_t V = model.config().vocab_size;
  model.plan(1, n);
  std::vector<double> logits64(static_cast<size_t>(n * V));
  model.logits(tokens.data(), logits64.data());
  const std::vector<float> logits(logits64.begin(), logits64.end());
  write_safetensors(path, {{"input_ids", DType::i32, {n}, tokens.data()}, {"logits", DType::f32, {n, V}, logits.data()}});
}

/// The synthetic-task evaluation of `model` (allocated, weights loaded) on the evaluation sets of `config`'s
/// data source, printed as the trainer's record (--json) or a table of the points.
int eval_synthetic(Model& model, const Config& config, const std::string& dir, int64_t batch, bool json,
                   const std::string& precision_used) {
  const DataConfig& dc = config.data;
  const SyntheticSource source(dc.source, dc.synthetic, dc.shuffle_seed, config.train.seq_len);
  nlohmann::json r = evaluate_synthetic(model, source, batch, config.train.seq_len, config.train.recompute,
                                        single_process_communicator());
  if (json) {
    r["checkpoint"] = dir;
    r["task"] = dc.source;
    r["compute"] = precision_used;
    fmt::print("{}\n", r.dump());
    return 0;
  }
  const bool scaled = r.contains("val_scaled_acc");  // parity, modarith: the Mamba-3 paper's scaled accuracy
  fmt::print("{}: {} ({} evaluation points, {})\n{:<14} {:>8} {:>10} {:>8} {:>12}{}\n", dir, dc.source,
             r["eval_points"].size(), precision_used, "point", "seq_len", "loss", "acc", "example_acc",
             scaled ? "   scaled_acc" : "");
  // one table row from a point's record ("loss", "acc", ...) or the totals ("val_loss", "val_acc", ...)
  const auto row = [scaled](const std::string& name, const std::string& seq_len, const nlohmann::json& m,
                            const std::string& prefix) {
    const auto get = [&](const char* key) { return m.at(prefix + key).get<double>(); };
    fmt::print("{:<14} {:>8} {:>10.4f} {:>8.4f} {:>12.4f}{}\n", name, seq_len, get("loss"), get("acc"),
               get("example_acc"), scaled ? fmt::format(" {:>12.4f}", get("scaled_acc")) : "");
  };
  for (const auto& p : r["eval_points"])
    row(p["name"].get<std::string>(), std::to_string(p["seq_len"].get<int64_t>()), p, "");
  row("all", "", r, "val_");
  return 0;
}

}  // namespace

int eval(const EvalArgs& args) {
  const std::string dir = resolve_checkpoint(args.checkpoint);
  const Config config = parse_config(checkpoint_config(dir));
  const bool synthetic = args.data.empty() && args.text.empty();
  check(!synthetic || config.data.source != "tokens",
        "eval: give the held-out text with --data DATASET_DIR or --text FILE ({} was trained on tokens; without "
        "either, eval scores the evaluation points of a synthetic task)", dir);
  check(!synthetic || (args.seq_len == 0 && args.stride == 0 && args.max_tokens == 0 && args.dump_logits.empty() &&
                      args.tokenizer.empty()),
        "eval: --seq-len, --stride, --max-tokens, --tokenizer and --dump-logits apply to text (--data or --text); the "
        "evaluation points of the synthetic task {} fix their own lengths (data.synthetic in the checkpoint's config)",
        config.data.source);
  check(synthetic || config.data.source == "tokens",
        "eval: {} was trained on the synthetic task {}, not on text; drop --data / --text to score its evaluation "
        "points", dir, config.data.source);
  const std::string precision = args.precision.empty() ? config.train.precision : args.precision;
  const int64_t T = args.seq_len > 0 ? args.seq_len : config.train.seq_len;
  const int64_t stride = args.stride > 0 ? args.stride : T;
  const int64_t batch = args.batch > 0 ? args.batch : config.train.micro_batch;

  std::string source, tokenizer;
  std::vector<int32_t> text_tokens;
  int64_t rows = batch;
  if (!args.text.empty()) {
    tokenizer = args.tokenizer.empty() ? config.data.tokenizer : args.tokenizer;
    text_tokens = tokenize_file(args.text, tokenizer);
    check(text_tokens.size() >= 2, "eval: {} gives {} tokens; at least 2 are needed", args.text, text_tokens.size());
    // no more rows per forward than there are windows (a short text would otherwise compute padding)
    const auto windows = plan_eval_windows(static_cast<int64_t>(text_tokens.size()), T, stride, args.max_tokens);
    rows = std::max<int64_t>(1, std::min<int64_t>(batch, static_cast<int64_t>(windows.size())));
  }

  const auto backend = make_backend(args.backend);
  const DType compute =
      compute_dtype_for(precision, *backend, args.precision.empty() ? "train.precision" : "--precision");
  Model model(config.model);
  model.allocate(*backend, DType::f32, compute);
  model.plan(rows, T);
  load_weights(dir, model.params());
  if (synthetic)
    return eval_synthetic(model, config, dir, batch, args.json,
                          fmt::format("{} {}", backend->name(), dtype_name(compute)));

  EvalTotals totals;
  std::vector<int32_t> first_window;  // the stream's first tokens, for --dump-logits
  if (!args.data.empty()) {
    // seq_len 1 here: every shard with two or more tokens counts; the windows are evaluate's.
    const DatasetLoader ds(args.data, args.split, 1, 0, false, config.data.tokenizer);
    std::ifstream meta(args.data + "/dataset.json");
    tokenizer = nlohmann::json::parse(meta).at("tokenizer").at("name").get<std::string>();
    const auto bytes = token_byte_lengths(tokenizer);
    for (size_t i = 0; i < ds.num_shards(); ++i) {
      const int64_t remaining = args.max_tokens > 0 ? args.max_tokens - totals.targets : 0;
      if (args.max_tokens > 0 && remaining <= 0) break;
      std::vector<int32_t> tokens(static_cast<size_t>(ds.shard(i).size()));
      ds.shard(i).read(0, ds.shard(i).size(), tokens.data());
      if (first_window.empty()) first_window.assign(tokens.begin(), tokens.begin() + std::min<int64_t>(T, tokens.size()));
      evaluate_stream(model, batch, T, tokens, stride, remaining, bytes, totals);
    }
    source = fmt::format("{} ({} stream, {} shards)", args.data, args.split, ds.num_shards());
  } else {
    evaluate_stream(model, rows, T, text_tokens, stride, args.max_tokens, token_byte_lengths(tokenizer), totals);
    source = args.text;
    first_window.assign(text_tokens.begin(), text_tokens.begin() + std::min<int64_t>(T, text_tokens.size()));
  }
  if (!args.dump_logits.empty()) dump_logits(model, first_window, T, args.dump_logits);

  if (args.json) {
    const nlohmann::json out = {{"checkpoint", dir},      {"source", source},
                                {"tokenizer", tokenizer}, {"seq_len", T},
                                {"stride", stride},       {"tokens", totals.targets},
                                {"loss_sum", totals.loss_sum}, {"loss", totals.loss()},
                                {"perplexity", totals.perplexity()}, {"bytes", totals.bytes},
                                {"bits_per_byte", totals.bits_per_byte()}};
    fmt::print("{}\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  } else {
    fmt::print("{}: {} tokens of {} (seq_len {}, stride {})\nloss {:.6f} | perplexity {:.4f} | bits per byte {:.6f} "
               "({} bytes)\n",
               dir, totals.targets, source, T, stride, totals.loss(), totals.perplexity(), totals.bits_per_byte(),
               totals.bytes);
  }
  return 0;
}

}  // namespace llmt::cli
