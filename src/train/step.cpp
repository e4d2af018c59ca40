#include "train/step.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "train/grad_buckets.h"

namespace llmt {

void split_windows(const int32_t* windows, int64_t batch, int64_t seq_len, std::vector<int32_t>& inputs,
                   std::vector<int32_t>& targets) {
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < seq_len; ++t) {
      const int32_t in = windows[b * (seq_len + 1) + t], next = windows[b * (seq_len + 1) + t + 1];
      inputs[b * seq_len + t] = in >= 0 ? in : -(in + 1);
      targets[b * seq_len + t] = next >= 0 ? next : -1;
    }
}

std::pair<int64_t, int64_t> zero1_shard(const ParamStore& params, int rank, int world) {
  check(params.padded_total() % world == 0,
        "ZeRO-1: the {} (padded) parameter elements do not divide into {} shards; allocate the model with a "
        "pad_multiple that the world size divides",
        params.padded_total(), world);
  const int64_t c = params.padded_total() / world;
  return {rank * c, (rank + 1) * c};
}

std::unique_ptr<AdamW> make_optimizer(ParamStore& params, const TrainConfig& train, const DistConfig& dist,
                                      const Communicator& comm) {
  if (!dist.zero1) return std::make_unique<AdamW>(params, train);
  const auto [begin, end] = zero1_shard(params, comm.rank(), comm.world_size());
  return std::make_unique<AdamW>(params, train, begin, end);
}

StepRunner::StepRunner(Model& model, AdamW& optimizer, const TrainConfig& train, Communicator& comm,
                       const DistConfig& dist)
    : model_(model),
      optimizer_(optimizer),
      train_(train),
      comm_(comm),
      dist_(dist),
      micro_batches_(train.grad_accum() / comm.world_size()),
      windows_(micro_batches_ * train.micro_batch * (train.seq_len + 1)),
      inputs_(train.micro_batch * train.seq_len),
      targets_(train.micro_batch * train.seq_len) {
  check(train.grad_accum() % comm.world_size() == 0,
        "train.batch_tokens = {} is not divisible by micro_batch ({}) x seq_len ({}) x world size ({}): every rank "
        "must run the same number of micro-batches; change train.batch_tokens or train.micro_batch",
        train.batch_tokens, train.micro_batch, train.seq_len, comm.world_size());
  if (dist.zero1) {
    const auto [begin, end] = zero1_shard(model.params(), comm.rank(), comm.world_size());
    check(optimizer.shard_begin() == begin && optimizer.shard_end() == end,
          "dist.zero1: the optimizer updates [{}, {}), but rank {}'s shard is [{}, {})", optimizer.shard_begin(),
          optimizer.shard_end(), comm.rank(), begin, end);
  } else {
    check(optimizer.covers_all(), "the optimizer is sharded (ZeRO-1) but dist.zero1 is off");
  }
  comm.set_compute_stream(model.params().backend().native_stream());
}

StepRunner::~StepRunner() { comm_.set_compute_stream(nullptr); }

StepResult StepRunner::run(double lr, const WindowSource& next) {
  ParamStore& params = model_.params();
  Backend& be = params.backend();
  const Tensor grads = params.padded_grads();
  be.fill_zero(grads);
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
  // With overlap the last backward's buckets are reduced as they complete: all-reduced, or with
  // ZeRO-1 each piece of a bucket reduced to the rank whose shard holds it. Without overlap the
  // same buckets are all-reduced after the backward (the same bits), or ZeRO-1 reduce-scatters.
  const int world = comm_.world_size();
  const int64_t seg = (params.padded_total() + world - 1) / world;  // ZeRO-1's shard size
  buckets_.clear();
  GradBuckets buckets(params.total(), dist_.bucket_elements(), [&](int64_t begin, int64_t end) {
    if (!dist_.overlap) {
      buckets_.emplace_back(begin, end);
    } else if (!dist_.zero1) {
      comm_.all_reduce_async(grads.range(begin, end));
    } else {
      for (int64_t owner = begin / seg; owner * seg < end; ++owner)
        comm_.reduce_async(grads.range(std::max(begin, owner * seg), std::min(end, (owner + 1) * seg)),
                           static_cast<int>(owner));
    }
  });
  const bool hooked = dist_.overlap || !dist_.zero1;
  double loss_sum = 0;
  for (int64_t micro = 0; micro < micro_batches_; ++micro) {
    split_windows(windows_.data() + micro * window, train_.micro_batch, train_.seq_len, inputs_, targets_);
    loss_sum += model_.forward(inputs_.data(), targets_.data(), true, 1.0 / targets_per_step);
    if (micro + 1 == micro_batches_ && hooked) {
      model_.backward([&](int64_t begin, int64_t end) { buckets.ready(begin, end); });
    } else {
      model_.backward();
    }
  }
  // Every collective below is the identity for one process. The squared gradient norm is the sum
  // of the squares of W segments (ZeRO-1's shards), added in rank order, in both modes: with 2
  // ranks the clipping factor is then the same bits with and without ZeRO-1.
  if (hooked) buckets.check_complete();
  double sum_sq = 0;
  if (dist_.zero1) {
    if (!dist_.overlap) comm_.reduce_scatter(grads);
    comm_.wait_all();
    sum_sq = comm_.all_reduce_scalar(be.sum_squares(grads.range(comm_.rank() * seg, (comm_.rank() + 1) * seg)),
                                     ReduceOp::sum);
  } else {
    for (const auto& [begin, end] : buckets_) comm_.all_reduce(grads.range(begin, end), ReduceOp::sum);
    comm_.wait_all();
    for (int64_t begin = 0; begin < params.padded_total(); begin += seg)
      sum_sq += be.sum_squares(grads.range(begin, std::min(begin + seg, params.padded_total())));
  }
  loss_sum = comm_.all_reduce_scalar(loss_sum, ReduceOp::sum);
  StepResult r;
  r.loss = loss_sum / targets_per_step;
  // The norm and the skip are agreed explicitly, so that a rounding difference between ranks can
  // never make one rank skip alone.
  const double local_norm = std::sqrt(sum_sq);
  r.grad_norm = comm_.all_reduce_scalar(local_norm, ReduceOp::max);
  const bool any_nonfinite = comm_.all_reduce_scalar(std::isfinite(local_norm) ? 0.0 : 1.0, ReduceOp::max) > 0;
  r.skipped = train_.skip_nonfinite && any_nonfinite;
  if (!r.skipped) {
    // torch.nn.utils.clip_grad_norm_: scale by clip / (norm + 1e-6) when the norm exceeds clip
    const double scale = train_.grad_clip > 0 && r.grad_norm > train_.grad_clip
                             ? train_.grad_clip / (r.grad_norm + 1e-6)
                             : 1.0;
    optimizer_.step(lr, scale);
    if (dist_.zero1) {
      // Every rank updated its shard: copy the new weights to all, then re-round the bf16
      // working copy from them (what adamw_step writes for its own shard: the same rounding).
      comm_.all_gather(params.padded_params());
      params.refresh_working();
    }
  }
  return r;
}

}  // namespace llmt
