#include "train/step.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace llmt {

void split_windows(const std::vector<int32_t>& windows, int64_t batch, int64_t seq_len, std::vector<int32_t>& inputs,
                   std::vector<int32_t>& targets) {
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < seq_len; ++t) {
      const int32_t in = windows[b * (seq_len + 1) + t], next = windows[b * (seq_len + 1) + t + 1];
      inputs[b * seq_len + t] = in >= 0 ? in : -(in + 1);
      targets[b * seq_len + t] = next >= 0 ? next : -1;
    }
}

namespace {

// 25 MiB of fp32 per bucket (the default bucket of PyTorch DDP).
constexpr int64_t kBucketElements = 25 * 1024 * 1024 / 4;

}  // namespace

void all_reduce_in_buckets(Communicator& comm, const Tensor& flat, int64_t bucket_elements) {
  check(bucket_elements > 0, "all_reduce_in_buckets: bucket size must be positive, got {}", bucket_elements);
  const size_t es = dtype_size(flat.dtype);
  for (int64_t i = 0; i < flat.numel(); i += bucket_elements) {
    const int64_t n = std::min(bucket_elements, flat.numel() - i);
    comm.all_reduce(Tensor(static_cast<char*>(flat.data) + i * static_cast<int64_t>(es), flat.dtype, {n}),
                    ReduceOp::sum);
  }
}

StepRunner::StepRunner(Model& model, AdamW& optimizer, const TrainConfig& train, Communicator& comm)
    : model_(model),
      optimizer_(optimizer),
      train_(train),
      comm_(comm),
      micro_batches_(train.grad_accum() / comm.world_size()),
      windows_(micro_batches_ * train.micro_batch * (train.seq_len + 1)),
      inputs_(train.micro_batch * train.seq_len),
      targets_(train.micro_batch * train.seq_len) {
  check(train.grad_accum() % comm.world_size() == 0,
        "train.batch_tokens = {} is not divisible by micro_batch ({}) x seq_len ({}) x world size ({}): every rank "
        "must run the same number of micro-batches; change train.batch_tokens or train.micro_batch",
        train.batch_tokens, train.micro_batch, train.seq_len, comm.world_size());
}

StepResult StepRunner::run(double lr, const WindowSource& next) {
  ParamStore& params = model_.params();
  Backend& be = params.backend();
  be.fill_zero(params.flat_grads());
  // The step's windows are drawn first, so that the loss is the mean over the labelled targets of the whole
  // global batch (batch_tokens for token streams; the answers only for synthetic tasks).
  const int64_t window = train_.micro_batch * (train_.seq_len + 1);
  double labelled = 0;
  for (int64_t micro = 0; micro < micro_batches_; ++micro) {
    int32_t* w = windows_.data() + micro * window;
    next(w);
    for (int64_t b = 0; b < train_.micro_batch; ++b)
      for (int64_t t = 1; t <= train_.seq_len; ++t) labelled += w[b * (train_.seq_len + 1) + t] >= 0 ? 1 : 0;
  }
  const double targets_per_step = std::max(1.0, comm_.all_reduce_scalar(labelled, ReduceOp::sum));
  double loss_sum = 0;
  for (int64_t micro = 0; micro < micro_batches_; ++micro) {
    const std::vector<int32_t> w(windows_.begin() + micro * window, windows_.begin() + (micro + 1) * window);
    split_windows(w, train_.micro_batch, train_.seq_len, inputs_, targets_);
    loss_sum += model_.forward(inputs_.data(), targets_.data(), true, 1.0 / targets_per_step);
    model_.backward();
  }
  all_reduce_in_buckets(comm_, params.flat_grads(), kBucketElements);  // the identity for one process
  loss_sum = comm_.all_reduce_scalar(loss_sum, ReduceOp::sum);
  StepResult r;
  r.loss = loss_sum / targets_per_step;
  // Every rank holds the same reduced gradient; the norm and the skip are still agreed explicitly,
  // so that a rounding difference between ranks can never make one rank skip alone.
  const double local_norm = std::sqrt(be.sum_squares(params.flat_grads()));
  r.grad_norm = comm_.all_reduce_scalar(local_norm, ReduceOp::max);
  const bool any_nonfinite = comm_.all_reduce_scalar(std::isfinite(local_norm) ? 0.0 : 1.0, ReduceOp::max) > 0;
  r.skipped = train_.skip_nonfinite && any_nonfinite;
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
