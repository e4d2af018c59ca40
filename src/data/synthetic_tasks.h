// Generators of the synthetic tasks (data.source mqar | parity | modarith; docs/SYNTHETIC.md gives the
// definitions, their sources and where we deviate). Each example is drawn from Philox(seed, stream) alone,
// so example i of a split is the same on every run, rank and resume.
//
// Token layouts (ids):
//   mqar:     keys [1, vocab/2), values [vocab/2, vocab), filler [0, vocab) (Zoology, Arora et al. 2023)
//   parity:   bits 0 and 1, '=' 2; the answer is a bit
//   modarith: digits 0..4, '+' 5, '-' 6, '*' 7, '(' 8, ')' 9, '=' 10; the answer is a digit
#pragma once
#include <cstdint>
#include <vector>

namespace llmt {

/// One example: tokens [n] and the positions of its answer tokens (ascending). Only the answers carry a
/// label; a causal model predicts tokens[p] from tokens[0, p).
struct SyntheticExample {
  std::vector<int32_t> tokens;
  std::vector<int64_t> answers;
};

namespace synth {
constexpr int32_t kParityEquals = 2;
constexpr int32_t kModulus = 5;
constexpr int32_t kPlus = 5, kMinus = 6, kTimes = 7, kOpen = 8, kClose = 9, kEquals = 10;
constexpr int64_t kParityVocab = 3, kModArithVocab = 11;
}  // namespace synth

/// Multi-query associative recall (Zoology's multiquery_ar): `length` tokens; positions [0, 2 pairs) hold
/// `pairs` key-value pairs (distinct keys, distinct values); the rest holds filler tokens, and each key is
/// queried once at position 2 pairs + 2 g, its gap g drawn without replacement from [0, (length - 2 pairs) / 2)
/// with P(g) proportional to (g + 1)^(power_a - 1); the value follows the query and is the answer.
/// Throws llmt::Error unless length is even, 4 pairs <= length and pairs < vocab / 2.
SyntheticExample make_mqar(uint64_t seed, uint64_t stream, int64_t length, int64_t pairs, int64_t vocab,
                           double power_a);

/// Parity: `bits` random bits, '=', then their XOR (bits + 2 tokens; the last is the answer). bits >= 1.
SyntheticExample make_parity(uint64_t seed, uint64_t stream, int64_t bits);

/// Modular arithmetic mod 5 over an expression of `length` tokens, then '=', then the value (length + 2 tokens).
/// Without brackets (Deletang et al. 2023, "modular arithmetic (simple)"): digits and operators + - * alternate
/// (an even length is lowered by one), evaluated with * before + and -. With brackets (their "modular arithmetic
/// with brackets", operators + and -): the random expression grammar of that task, unary minus included.
SyntheticExample make_modarith(uint64_t seed, uint64_t stream, int64_t length, bool brackets);

}  // namespace llmt
