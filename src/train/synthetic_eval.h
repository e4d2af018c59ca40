// Accuracy of a model on the evaluation sets of a synthetic task (docs/SYNTHETIC.md), written to
// metrics.jsonl at each evaluation.
#pragma once
#include <cstdint>

#include <nlohmann/json.hpp>

#include "data/synthetic_source.h"
#include "dist/communicator.h"
#include "model/model.h"

namespace llmt {

/// Evaluates every set of `source` with `model` (no gradients). Each set runs in batches of
/// max(1, rows / (tokens - 1)) examples, one per window of the set's length (the model is re-planned for it
/// and, at the end, back to [train_batch, train_seq_len]); the batches are shared out among the ranks of `comm`
/// (a collective call). Per set and over all sets it reports, over the labelled (answer) positions:
///   loss: mean cross-entropy (nats); acc: the fraction of answers whose target is the argmax;
///   example_acc: the fraction of examples with every answer correct; and, for tasks with one answer of C classes
///   (parity C = 2, modarith C = 5), scaled_acc = (acc - 1/C) / (1 - 1/C) (0 = chance, 1 = perfect; the Mamba-3
///   paper's Table 5b metric).
/// Returns {"val_loss", "val_acc", "val_example_acc"[, "val_scaled_acc"], "eval_points": [{"name", "seq_len",
/// ["kv_pairs",] "loss", "acc", "example_acc"[, "scaled_acc"]}, ...]}; the overall values pool all answers
/// (examples) of all sets.
nlohmann::json evaluate_synthetic(Model& model, const SyntheticSource& source, int64_t train_batch,
                                  int64_t train_seq_len, bool recompute, Communicator& comm);

}  // namespace llmt
