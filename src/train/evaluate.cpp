#include "train/evaluate.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace llmt {

std::vector<EvalWindow> plan_eval_windows(int64_t num_tokens, int64_t seq_len, int64_t stride, int64_t max_targets) {
  check(seq_len > 0, "eval: seq_len must be positive, got {}", seq_len);
  check(stride >= 1 && stride <= seq_len, "eval: stride must be in [1, seq_len = {}], got {}", seq_len, stride);
  int64_t last_target = num_tokens - 1;
  if (max_targets > 0) last_target = std::min(last_target, max_targets);
  std::vector<EvalWindow> windows;
  int64_t scored = 0;  // targets 1 .. scored are done; stride <= seq_len makes every window score one or more
  for (int64_t start = 0; scored < last_target; start += stride) {
    const int64_t last = std::min(start + seq_len, last_target);
    windows.push_back({start, scored + 1, last});
    scored = last;
  }
  return windows;
}

double EvalTotals::loss() const { return loss_sum / static_cast<double>(targets); }
double EvalTotals::perplexity() const { return std::exp(loss()); }
double EvalTotals::bits_per_byte() const { return loss_sum / (std::log(2.0) * static_cast<double>(bytes)); }

void evaluate_stream(Model& model, int64_t batch, int64_t seq_len, const std::vector<int32_t>& tokens, int64_t stride,
                     int64_t max_targets, const std::vector<int64_t>& token_bytes, EvalTotals& totals) {
  const auto windows = plan_eval_windows(static_cast<int64_t>(tokens.size()), seq_len, stride, max_targets);
  const int64_t T = seq_len, n = static_cast<int64_t>(windows.size());
  std::vector<int32_t> inputs(batch * T), targets(batch * T);
  for (int64_t w0 = 0; w0 < n; w0 += batch) {
    std::fill(inputs.begin(), inputs.end(), 0);  // padding: token 0 without a label
    std::fill(targets.begin(), targets.end(), -1);
    for (int64_t b = 0; b < batch && w0 + b < n; ++b) {
      const EvalWindow& w = windows[w0 + b];
      for (int64_t t = 0; t < T && w.start + t < static_cast<int64_t>(tokens.size()); ++t)
        inputs[b * T + t] = tokens[w.start + t];
      for (int64_t p = w.first; p <= w.last; ++p) {
        const int32_t id = tokens[p];
        targets[b * T + (p - w.start - 1)] = id;
        if (!token_bytes.empty()) {
          check(id >= 0 && id < static_cast<int64_t>(token_bytes.size()),
                "eval: token {} at position {} is outside the tokenizer's {} ids", id, p, token_bytes.size());
          totals.bytes += token_bytes[id];
        }
      }
      totals.targets += w.last - w.first + 1;
    }
    totals.loss_sum += model.forward(inputs.data(), targets.data(), false, 0.0);
  }
}

}  // namespace llmt
