// Held-out evaluation of a model over token streams (`llmtrain eval`): token-weighted mean
// loss, perplexity and bits per byte.
//
// Windows over a stream x[0, N): window k has inputs x[s, s + T) with s = k * stride and the
// targets at positions s + 1 .. s + T. The scored targets are positions 1 .. L, L = N - 1 (or
// fewer, see max_targets), each scored exactly once, by the first window that reaches it: a
// window scores only the positions after the previous window's last one. With stride = T the
// windows are the trainer's validation windows (WindowLoader / DatasetLoader: seq_len + 1
// tokens at stride seq_len); with stride < T every target after the first window sees at
// least T - stride tokens of context. Inputs past the end of the stream are padded and have
// no label, so the tail of the stream is scored too.
#pragma once
#include <cstdint>
#include <vector>

#include "model/model.h"

namespace llmt {

/// One window of an evaluation: inputs start at `start`; it scores the target positions
/// [first, last] (1-based positions in the stream, first <= last).
struct EvalWindow {
  int64_t start = 0, first = 0, last = 0;
};

/// The windows that score target positions 1 .. min(num_tokens - 1, max_targets) (max_targets
/// <= 0: no limit) with window length seq_len and the given stride (1 <= stride <= seq_len).
/// Throws llmt::Error for a bad seq_len or stride.
std::vector<EvalWindow> plan_eval_windows(int64_t num_tokens, int64_t seq_len, int64_t stride, int64_t max_targets);

/// Sums over the targets of an evaluation.
struct EvalTotals {
  int64_t targets = 0;  ///< scored target tokens
  double loss_sum = 0;  ///< sum of their cross-entropies (nats)
  int64_t bytes = 0;    ///< sum of their byte lengths (0 when no byte lengths were given)

  double loss() const;            ///< loss_sum / targets (mean, nats per token)
  double perplexity() const;      ///< exp(loss())
  double bits_per_byte() const;   ///< loss_sum / (ln 2 * bytes)
};

/// Evaluates `model` (planned for [batch, seq_len] micro-batches; no gradients) over the
/// windows plan_eval_windows(tokens.size(), seq_len, stride, max_targets) of `tokens`,
/// `batch` windows per forward, and adds the results to `totals`. token_bytes[id], when not
/// empty, is the byte length of token id's text, summed over the scored targets.
void evaluate_stream(Model& model, int64_t batch, int64_t seq_len, const std::vector<int32_t>& tokens, int64_t stride,
                     int64_t max_targets, const std::vector<int64_t>& token_bytes, EvalTotals& totals);

}  // namespace llmt
