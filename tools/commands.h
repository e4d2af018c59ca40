// The subcommands of the llmtrain binary. Each returns the process exit code.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace llmt::cli {

struct TrainArgs {
  std::string config;
  std::string out;  ///< run directory; default runs/<run_name>
  bool resume = false;
  std::vector<std::string> set;  ///< "a.b=value" overrides
};
int train(const TrainArgs& args);

/// llmtrain sweep (docs/SWEEPS.md).
struct SweepArgs {
  std::string base;                 ///< base config
  std::vector<std::string> set;     ///< "key.path=value" applied to every point, before the point's own
  std::vector<std::string> grids;   ///< "key.path=v1,v2,..."
  std::string file;                 ///< sweep JSON {"points": [{...}, ...]} (instead of grids)
  std::string out;                  ///< sweep directory; default sweeps/<base stem>
  bool emit_slurm = false;          ///< write the scripts and a Slurm array script, run nothing
  bool collect = false;             ///< run nothing; only gather results.csv / results.md
};
int sweep(const SweepArgs& args);

struct InfoArgs {
  std::string config;
  std::vector<std::string> set;
};
int info(const InfoArgs& args);

struct ProbeArgs {
  std::string mixer;
  std::string config;   ///< optional: take the mixer's dimensions from this config's model
  std::string inputs;   ///< optional safetensors with x, dy and parameters
  std::string out;      ///< optional safetensors for y, dx, grad.<param>
  std::string dtype = "f64";
  bool selftest = false;
  int64_t batch = 2, seq_len = 8;
};
int probe(const ProbeArgs& args);

struct BenchArgs {
  std::string config;
  std::vector<std::string> set;
  int steps = 10;
  int warmup = 2;
  double peak_tflops = 0;  ///< the device's peak for MFU; 0 = not reported
};
int bench(const BenchArgs& args);

struct PrepareDataArgs {
  std::vector<std::string> inputs;  ///< files, directories, globs
  std::string tokenizer = "gpt2";
  std::string out;
  double val_fraction = 0.0005;
  int64_t shard_tokens = 100'000'000;
  std::string doc_separator = "none";
  int threads = 0;
  std::vector<std::string> include_sets, exclude_sets;
  int64_t min_int_score = 0;
  bool min_int_score_set = false;
  bool quiet = false;
  std::string node = "node";
};
int prepare_data(const PrepareDataArgs& args);

struct TokenizeArgs {
  std::string tokenizer = "gpt2";  ///< a name or path that load_tokenizer accepts
  std::string text;                ///< the input itself, or
  std::string file;                ///< a file holding it
  bool json = false;               ///< print the ids as a JSON list
  bool decode = false;             ///< the input is ids; print their text
};
/// Prints the ids of the input text (space-separated, or a JSON list), or with `decode` the
/// text of the input ids (separated by whitespace or commas, brackets allowed) exactly.
int tokenize(const TokenizeArgs& args);

struct EvalArgs {
  std::string checkpoint;     ///< a checkpoint directory, or a run directory (its newest checkpoint)
  std::string data;           ///< a prepare-data directory, or
  std::string text;           ///< a UTF-8 text file
  std::string split = "val";  ///< the stream of `data`
  std::string tokenizer;      ///< for `text`; default the checkpoint's data.tokenizer
  int64_t seq_len = 0;        ///< window length; 0 = the checkpoint's train.seq_len
  int64_t stride = 0;         ///< window stride; 0 = seq_len (non-overlapping)
  int64_t batch = 0;          ///< windows per forward; 0 = the checkpoint's train.micro_batch
  int64_t max_tokens = 0;     ///< score only the first N targets (the trainer's eval.tokens); 0 = all
  std::string backend = "auto";
  std::string precision;    ///< compute precision: auto, fp32 or bf16; empty = the checkpoint's train.precision
  bool json = false;
  std::string dump_logits;  ///< also write the first window's input_ids and logits to this safetensors file
};
/// Text (--data or --text): prints the token-weighted mean loss, perplexity and bits per byte of a checkpoint
/// over the windows of train/evaluate.h. Neither given and the checkpoint's data.source a synthetic task:
/// prints the accuracy per evaluation point (train/synthetic_eval.h, the trainer's evaluation record).
/// Throws llmt::Error when neither is given for a checkpoint trained on tokens.
int eval(const EvalArgs& args);

struct ExportArgs {
  std::string checkpoint;      ///< a checkpoint directory, or a run directory (its newest checkpoint)
  std::string format = "hf";   ///< hf: flash-linear-attention's Hugging Face layout
  std::string out;             ///< output directory
  std::string dtype = "f32";   ///< f32 (the master weights) or bf16
};
/// Writes model.safetensors + config.json (+ llmtrain_config.json) in FLA's layout (train/hf_export.h).
int export_model(const ExportArgs& args);

struct ImportArgs {
  std::string in;      ///< an HF directory (model.safetensors, config.json)
  std::string config;  ///< the llmtrain config; default <in>/llmtrain_config.json
  std::string out;     ///< run directory that receives checkpoints/step_00000000
};
/// Reads an FLA-layout HF directory into a checkpoint of model weights only (train/hf_export.h).
int import_model(const ImportArgs& args);

struct GenerateArgs {
  std::string checkpoint;        ///< a checkpoint directory, or a run directory (its newest checkpoint)
  std::string prompt;            ///< the text to continue
  int64_t max_new_tokens = 64;   ///< stop after this many new tokens (or at the tokenizer's end-of-text)
  double temperature = 1.0;      ///< 0 = greedy
  int64_t top_k = 0;             ///< 0 = no limit
  double top_p = 1.0;            ///< 1 = no limit
  uint64_t seed = 0;             ///< the sampling stream: the same seed gives the same text
  std::string backend = "auto";  ///< auto (cuda when a GPU is visible, else cpu), cpu or cuda
};
/// Prints the prompt followed by its continuation, sampled token by token from the checkpoint's model
/// (Model::prefill / decode; model/sampler.h) with the checkpoint's tokenizer (data.tokenizer).
int generate(const GenerateArgs& args);

}  // namespace llmt::cli
