// Tokenizer throughput (not a test): encodes a UTF-8 text file with BpeTokenizer and prints
// MB/s. Each repetition runs in a fresh thread, so the per-thread pre-token cache starts cold
// and every repetition pays for its BPE work as a single pass over new text would.
// Usage: build/tokenizer_bench [--tokenizer gpt2|llama3|PATH] [--text FILE] [--reps N] [--threads T]
// With --threads T > 1 the T threads encode the same text concurrently (cold caches) and the
// aggregate MB/s is reported as well as MB/s per thread.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "data/bpe_tokenizer.h"

int main(int argc, char** argv) {
  std::string tokenizer = "gpt2", text_path = "data/fineweb-edu-sample10BT-head.part1.txt";
  int reps = 5, threads = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--tokenizer") tokenizer = argv[i + 1];
    else if (flag == "--text") text_path = argv[i + 1];
    else if (flag == "--reps") reps = std::max(1, std::atoi(argv[i + 1]));
    else if (flag == "--threads") threads = std::max(1, std::atoi(argv[i + 1]));
    else { fmt::print(stderr, "unknown flag {}\n", flag); return 1; }
  }
  try {
    std::ifstream in(text_path, std::ios::binary);
    llmt::check(static_cast<bool>(in), "cannot open {}", text_path);
    std::ostringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    const auto t_load = std::chrono::steady_clock::now();
    const llmt::BpeTokenizer tok = llmt::BpeTokenizer::load(tokenizer);
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
    std::vector<double> seconds;
    size_t count = 0;
    for (int r = 0; r < reps; ++r) {
      std::vector<std::thread> pool;
      std::vector<size_t> counts(threads);
      const auto t0 = std::chrono::steady_clock::now();
      for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { counts[t] = tok.encode(text).size(); });
      for (auto& th : pool) th.join();
      seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      count = counts[0];
    }
    std::sort(seconds.begin(), seconds.end());
    const double median = seconds[seconds.size() / 2];
    const double mb = static_cast<double>(text.size()) / 1e6;
    fmt::print("tokenizer {} ({} loaded in {:.2f} s): {} bytes -> {} tokens; {} thread(s), median of {}: {:.3f} s, "
               "{:.2f} MB/s per thread, {:.2f} MB/s total\n",
               tok.name(), tokenizer, load_s, text.size(), count, threads, reps, median, mb / median,
               mb * threads / median);
  } catch (const llmt::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
  return 0;
}
