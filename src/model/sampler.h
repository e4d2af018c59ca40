// Next-token sampling from logits for `llmtrain generate`: greedy (temperature 0), or softmax sampling at a
// temperature restricted to the top-k ids and/or the smallest top-p ("nucleus") set, in that order (the usual
// Hugging Face `generate` semantics: temperature, then top-k, then top-p).
#pragma once
#include <cstdint>

#include "core/rng.h"

namespace llmt {

/// How to pick the next token.
struct SamplingOptions {
  double temperature = 1.0;  ///< 0 = greedy (argmax, ties to the lowest id); > 0 divides the logits
  int64_t top_k = 0;         ///< keep the k most likely ids; 0 = all
  double top_p = 1.0;        ///< keep the most likely ids until their probability reaches p, in (0, 1]; 1 = all
};

/// Throws llmt::Error naming the option (--temperature, --top-k, --top-p) unless temperature >= 0 and finite,
/// top_k >= 0 and 0 < top_p <= 1.
void check_sampling(const SamplingOptions& opt);

/// The next token id in [0, vocab) from logits [vocab] (host, double). Greedy uses no randomness; otherwise
/// exactly one rng.uniform() draw, so a seed fixes the whole generation. Ids whose logit is NaN are never
/// picked (llmt::Error when all are). Ties in the top-k / top-p order go to the lower id.
int32_t sample_token(const double* logits, int64_t vocab, const SamplingOptions& opt, Philox& rng);

}  // namespace llmt
