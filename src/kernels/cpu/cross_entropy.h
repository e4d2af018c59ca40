// Softmax cross-entropy over the vocabulary, forward and backward in one pass.
#pragma once
#include <cstdint>

namespace llmt::cpu {

/// logits: [rows, vocab]; targets: [rows], a negative target means "no label" (loss 0,
/// gradient 0). Writes losses[r] = logsumexp(logits[r]) - logits[r, target[r]] and, in place
/// over logits, the gradient grad_scale * (softmax(logits[r]) - onehot(target[r])).
/// Returns the sum of the losses (double). Statistics in double for any T.
/// When `correct` is not null, correct[r] receives 1 when the target is the unique argmax of logits[r] (every
/// other logit is smaller; a tie counts as wrong, so a model at chance whose logits round to equal values in
/// bf16 does not score) and 0 otherwise, 0 for a row without a label: the accuracy of the synthetic tasks
/// (docs/SYNTHETIC.md) without storing the logits.
/// ld: the row stride of logits (elements, >= vocab; 0 = vocab): row r starts at logits + r * ld.
/// A target >= vocab throws llmt::Error naming the row and the id.
template <typename T>
double cross_entropy_fwd_bwd(T* logits, const int32_t* targets, int64_t rows, int64_t vocab, double grad_scale,
                             T* losses, T* correct = nullptr, int64_t ld = 0);

}  // namespace llmt::cpu
