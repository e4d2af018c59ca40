#include "train/step.h"

#include <cmath>

namespace llmt {

void split_windows(const std::vector<int32_t>& windows, int64_t batch, int64_t seq_len, std::vector<int32_t>& inputs,
                   std::vector<int32_t>& targets) {
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < seq_len; ++t) {
      inputs[b * seq_len + t] = windows[b * (seq_len + 1) + t];
      targets[b * seq_len + t] = windows[b * (seq_len + 1) + t + 1];
    }
}

StepRunner::StepRunner(Model& model, AdamW& optimizer, const TrainConfig& train)
    : model_(model),
      optimizer_(optimizer),
      train_(train),
      windows_(train.micro_batch * (train.seq_len + 1)),
      inputs_(train.micro_batch * train.seq_len),
      targets_(train.micro_batch * train.seq_len) {}

StepResult StepRunner::run(double lr, const WindowSource& next) {
  ParamStore& params = model_.params();
  Backend& be = params.backend();
  be.fill_zero(params.flat_grads());
  const double targets_per_step = static_cast<double>(train_.batch_tokens);
  double loss_sum = 0;
  for (int64_t micro = 0; micro < train_.grad_accum(); ++micro) {
    next(windows_.data());
    split_windows(windows_, train_.micro_batch, train_.seq_len, inputs_, targets_);
    loss_sum += model_.forward(inputs_.data(), targets_.data(), true, 1.0 / targets_per_step);
    model_.backward();
  }
  StepResult r;
  r.loss = loss_sum / targets_per_step;
  r.grad_norm = std::sqrt(be.sum_squares(params.flat_grads()));
  r.skipped = train_.skip_nonfinite && !std::isfinite(r.grad_norm);
  if (!r.skipped) {
    // torch.nn.utils.clip_grad_norm_: scale by clip / (norm + 1e-6) when the norm exceeds clip
    const double scale = train_.grad_clip > 0 && r.grad_norm > train_.grad_clip
                             ? train_.grad_clip / (r.grad_norm + 1e-6)
                             : 1.0;
    optimizer_.step(lr, scale);
  }
  return r;
}

}  // namespace llmt
