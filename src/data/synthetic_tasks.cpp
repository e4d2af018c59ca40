// Synthetic task generators (synthetic_tasks.h; definitions and sources in docs/SYNTHETIC.md).
#include "data/synthetic_tasks.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_set>

#include "core/error.h"
#include "core/rng.h"

namespace llmt {
namespace {

int32_t mod5(int64_t x) { return static_cast<int32_t>(((x % synth::kModulus) + synth::kModulus) % synth::kModulus); }

/// `count` distinct integers of [lo, hi), in draw order.
std::vector<int32_t> distinct(Philox& rng, int64_t count, int64_t lo, int64_t hi) {
  std::vector<int32_t> out;
  std::unordered_set<int32_t> seen;
  while (static_cast<int64_t>(out.size()) < count) {
    const auto x = static_cast<int32_t>(lo + static_cast<int64_t>(rng.below(static_cast<uint64_t>(hi - lo))));
    if (seen.insert(x).second) out.push_back(x);
  }
  return out;
}

/// Appends a random bracketed expression of exactly `length` tokens to `out` and returns its value mod 5
/// (the grammar of Deletang et al.'s modular_arithmetic_brackets with operators + and -).
int32_t bracket_expression(Philox& rng, int64_t length, std::vector<int32_t>& out) {
  const auto digit = [&] { return static_cast<int32_t>(rng.below(synth::kModulus)); };
  if (length <= 4) {  // d, -d, (d), (-d)
    const bool paren = length >= 3, negate = length % 2 == 0;
    const int32_t d = digit();
    if (paren) out.push_back(synth::kOpen);
    if (negate) out.push_back(synth::kMinus);
    out.push_back(d);
    if (paren) out.push_back(synth::kClose);
    return negate ? mod5(-d) : d;
  }
  const auto left_length = static_cast<int64_t>(1 + rng.below(static_cast<uint64_t>(length - 4)));  // [1, length - 4]
  const int64_t right_length = length - left_length - 3;
  const bool plus = rng.below(2) == 0;
  out.push_back(synth::kOpen);
  const int32_t left = bracket_expression(rng, left_length, out);
  out.push_back(plus ? synth::kPlus : synth::kMinus);
  const int32_t right = bracket_expression(rng, right_length, out);
  out.push_back(synth::kClose);
  return mod5(plus ? left + right : left - right);
}

/// Appends an alternating digit / operator expression of `length` (odd) tokens and returns its value mod 5,
/// products first: the sum of the signed products of the runs joined by '*'.
int32_t flat_expression(Philox& rng, int64_t length, std::vector<int32_t>& out) {
  static constexpr int32_t ops[3] = {synth::kPlus, synth::kMinus, synth::kTimes};
  int64_t total = 0, term = static_cast<int32_t>(rng.below(synth::kModulus));
  out.push_back(static_cast<int32_t>(term));
  for (int64_t i = 1; i < length; i += 2) {
    const int32_t op = ops[rng.below(3)], d = static_cast<int32_t>(rng.below(synth::kModulus));
    out.push_back(op);
    out.push_back(d);
    if (op == synth::kTimes) {
      term = mod5(term * d);
    } else {
      total += term;
      term = op == synth::kPlus ? d : -d;
    }
  }
  return mod5(total + term);
}

}  // namespace

SyntheticExample make_mqar(uint64_t seed, uint64_t stream, int64_t length, int64_t pairs, int64_t vocab,
                           double power_a) {
  check(length % 2 == 0 && pairs > 0 && 4 * pairs <= length,
        "mqar: a sequence of {} tokens cannot hold {} key-value pairs and their queries (needs an even length >= 4 * "
        "pairs)", length, pairs);
  check(pairs < vocab / 2, "mqar: {} distinct keys need a vocabulary of more than {} ids, got {}", pairs, 2 * pairs,
        vocab);
  check(power_a > 0, "mqar: power_a must be > 0, got {}", power_a);
  Philox rng(seed, stream);
  const std::vector<int32_t> keys = distinct(rng, pairs, 1, vocab / 2), values = distinct(rng, pairs, vocab / 2, vocab);
  // Gaps: weighted sampling without replacement by the exponential-key method (Efraimidis & Spirakis 2006):
  // the `pairs` gaps with the largest log(u) / w have the distribution of successive weighted draws.
  const int64_t space = (length - 2 * pairs) / 2;
  std::vector<std::pair<double, int64_t>> scored(static_cast<size_t>(space));
  for (int64_t g = 0; g < space; ++g) {
    const double w = std::pow(static_cast<double>(g + 1), power_a - 1.0);
    scored[static_cast<size_t>(g)] = {std::log(1.0 - rng.uniform()) / w, g};
  }
  std::partial_sort(scored.begin(), scored.begin() + pairs, scored.end(),
                    [](const auto& a, const auto& b) { return a.first > b.first; });
  SyntheticExample ex;
  ex.tokens.resize(static_cast<size_t>(length));
  for (auto& t : ex.tokens) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
  for (int64_t i = 0; i < pairs; ++i) {
    ex.tokens[static_cast<size_t>(2 * i)] = keys[static_cast<size_t>(i)];
    ex.tokens[static_cast<size_t>(2 * i + 1)] = values[static_cast<size_t>(i)];
    const int64_t q = 2 * pairs + 2 * scored[static_cast<size_t>(i)].second;
    ex.tokens[static_cast<size_t>(q)] = keys[static_cast<size_t>(i)];
    ex.tokens[static_cast<size_t>(q + 1)] = values[static_cast<size_t>(i)];
    ex.answers.push_back(q + 1);
  }
  std::sort(ex.answers.begin(), ex.answers.end());
  return ex;
}

SyntheticExample make_parity(uint64_t seed, uint64_t stream, int64_t bits) {
  check(bits >= 1, "parity: need at least one bit, got {}", bits);
  Philox rng(seed, stream);
  SyntheticExample ex;
  int32_t parity = 0;
  for (int64_t i = 0; i < bits; ++i) {
    const auto b = static_cast<int32_t>(rng.below(2));
    parity ^= b;
    ex.tokens.push_back(b);
  }
  ex.tokens.push_back(synth::kParityEquals);
  ex.tokens.push_back(parity);
  ex.answers.push_back(bits + 1);
  return ex;
}

SyntheticExample make_modarith(uint64_t seed, uint64_t stream, int64_t length, bool brackets) {
  check(length >= 1, "modarith: the expression needs at least one token, got {}", length);
  Philox rng(seed, stream);
  SyntheticExample ex;
  const int32_t value = brackets ? bracket_expression(rng, length, ex.tokens)
                                 : flat_expression(rng, length % 2 == 1 ? length : length - 1, ex.tokens);
  ex.tokens.push_back(synth::kEquals);
  ex.tokens.push_back(value);
  ex.answers.push_back(static_cast<int64_t>(ex.tokens.size()) - 1);
  return ex;
}

}  // namespace llmt
