#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"

namespace llmt {

void check_sampling(const SamplingOptions& opt) {
  check(std::isfinite(opt.temperature) && opt.temperature >= 0, "--temperature must be >= 0 (0 = greedy), got {}",
        opt.temperature);
  check(opt.top_k >= 0, "--top-k must be >= 0 (0 = no limit), got {}", opt.top_k);
  check(opt.top_p > 0 && opt.top_p <= 1, "--top-p must be in (0, 1] (1 = no limit), got {}", opt.top_p);
}

int32_t sample_token(const double* logits, int64_t vocab, const SamplingOptions& opt, Philox& rng) {
  check_sampling(opt);
  // Candidates: the ids with a logit, most likely first (ties: lower id first).
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < vocab; ++i)
    if (!std::isnan(logits[i])) ids.push_back(i);
  check(!ids.empty(), "sample_token: every one of the {} logits is NaN", vocab);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (opt.temperature == 0) return ids.front();
  if (opt.top_k > 0 && static_cast<size_t>(opt.top_k) < ids.size()) ids.resize(static_cast<size_t>(opt.top_k));
  // Softmax of logits / temperature over the candidates (shifted by the largest, which comes first).
  std::vector<double> p(ids.size());
  for (size_t j = 0; j < ids.size(); ++j) p[j] = std::exp((logits[ids[j]] - logits[ids[0]]) / opt.temperature);
  double total = std::accumulate(p.begin(), p.end(), 0.0);
  // Nucleus: the shortest prefix whose probability reaches top_p.
  if (opt.top_p < 1) {
    double mass = 0.0;
    size_t keep = 0;
    while (keep < p.size() && mass < opt.top_p * total) mass += p[keep++];
    p.resize(std::max<size_t>(keep, 1));
    total = std::accumulate(p.begin(), p.end(), 0.0);
  }
  const double u = rng.uniform() * total;
  double acc = 0.0;
  for (size_t j = 0; j < p.size(); ++j) {
    acc += p[j];
    if (u < acc) return ids[j];
  }
  return ids[p.size() - 1];  // u within rounding of the total
}

}  // namespace llmt
