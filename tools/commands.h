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

}  // namespace llmt::cli
