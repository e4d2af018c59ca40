// Synthetic-task evaluation (synthetic_eval.h).
#include "train/synthetic_eval.h"

#include <algorithm>
#include <vector>

#include "train/step.h"

namespace llmt {
namespace {

struct Tally {
  double loss_sum = 0, answers = 0, correct = 0, examples = 0, examples_correct = 0;
  void add(const Tally& o) {
    loss_sum += o.loss_sum;
    answers += o.answers;
    correct += o.correct;
    examples += o.examples;
    examples_correct += o.examples_correct;
  }
};

void report(const Tally& t, int64_t classes, const std::string& prefix, nlohmann::json& out) {
  const double acc = t.correct / t.answers;
  out[prefix + "loss"] = t.loss_sum / t.answers;
  out[prefix + "acc"] = acc;
  out[prefix + "example_acc"] = t.examples_correct / t.examples;
  if (classes > 0) out[prefix + "scaled_acc"] = (acc - 1.0 / classes) / (1.0 - 1.0 / classes);
}

}  // namespace

nlohmann::json evaluate_synthetic(Model& model, const SyntheticSource& source, int64_t train_batch,
                                  int64_t train_seq_len, bool recompute, Communicator& comm) {
  nlohmann::json out, points = nlohmann::json::array();
  Tally all;
  const int64_t rows = train_batch * train_seq_len;
  for (size_t s = 0; s < source.eval_sets().size(); ++s) {
    const SyntheticEvalSet& set = source.eval_sets()[s];
    const int64_t T = set.tokens - 1, B = std::max<int64_t>(1, rows / T);
    model.plan(B, T, recompute);
    std::vector<int32_t> windows(B * (T + 1)), inputs(B * T), targets(B * T);
    std::vector<uint8_t> correct(B * T);
    Tally t;
    // Rank r evaluates batches r, r + W, r + 2W, ...; rows past the set's end are padding without labels.
    for (int64_t e0 = comm.rank() * B; e0 < set.examples; e0 += comm.world_size() * B) {
      std::vector<SyntheticExample> batch;
      for (int64_t b = 0; b < B; ++b) {
        int32_t* win = windows.data() + b * (T + 1);
        if (e0 + b < set.examples) {
          batch.push_back(source.eval_example(s, e0 + b));
          SyntheticSource::to_window(batch.back(), T + 1, win);
        } else {
          std::fill(win, win + T + 1, -1);
        }
      }
      split_windows(windows.data(), B, T, inputs, targets);
      t.loss_sum += model.forward(inputs.data(), targets.data(), false, 0.0, correct.data());
      for (size_t b = 0; b < batch.size(); ++b) {
        bool all_right = true;
        for (int64_t a : batch[b].answers) {
          const bool right = correct[static_cast<size_t>(static_cast<int64_t>(b) * T + a - 1)] != 0;
          t.correct += right ? 1 : 0;
          all_right = all_right && right;
        }
        t.answers += static_cast<double>(batch[b].answers.size());
        t.examples += 1;
        t.examples_correct += all_right ? 1 : 0;
      }
    }
    for (double* x : {&t.loss_sum, &t.answers, &t.correct, &t.examples, &t.examples_correct})
      *x = comm.all_reduce_scalar(*x, ReduceOp::sum);
    nlohmann::json p = {{"name", set.name}, {"seq_len", set.length}};
    if (set.pairs > 0) p["kv_pairs"] = set.pairs;
    report(t, source.answer_classes(), "", p);
    points.push_back(p);
    all.add(t);
  }
  model.plan(train_batch, train_seq_len, recompute);
  report(all, source.answer_classes(), "val_", out);
  out["eval_points"] = points;
  return out;
}

}  // namespace llmt
