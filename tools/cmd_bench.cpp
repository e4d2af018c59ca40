// llmtrain bench: time whole training steps (forward, backward, gradient norm, AdamW) of a
// config's model on random tokens, and report tokens/s, model FLOPs utilisation and peak
// memory. Separate from the tests: speed is measured, never asserted. Under mpirun / srun every rank
// runs its share of the global batch and the gradients are reduced as in training (the timing then
// includes the communication; tokens/s is reported in all and per rank).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "core/rng.h"
#include "dist/communicator.h"
#include "kernels/backend.h"
#include "model/config.h"
#include "model/model.h"
#include "tools/commands.h"
#include "train/optimizer.h"
#include "train/step.h"

namespace llmt::cli {

namespace {

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Seconds the step's collectives take alone, without compute to hide behind: the all-reduce of the
/// whole fp32 gradient, or with ZeRO-1 its reduce-scatter plus the all-gather of the weights (the
/// collectives are host-synchronous). Overwrites the gradient (the timed steps are over); the
/// all-gather copies weights that every rank already holds. Median of 3, slowest rank.
double time_communication(Communicator& comm, const ParamStore& params, const DistConfig& dist) {
  std::vector<double> seconds;
  for (int i = 0; i < 3; ++i) {
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    if (dist.zero1) {
      comm.reduce_scatter(params.padded_grads());
      comm.all_gather(params.padded_params());
    } else {
      comm.all_reduce(params.padded_grads(), ReduceOp::sum);
    }
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return comm.all_reduce_scalar(median_of(seconds), ReduceOp::max);
}

}  // namespace

int bench(const BenchArgs& args) {
  const Config config = load_config(args.config, args.set);
  const TrainConfig& tc = config.train;
  const std::unique_ptr<Communicator> comm = make_communicator(tc.backend);  // selects the rank's GPU first
  auto backend = make_backend(tc.backend);
  const bool lead = comm->rank() == 0;
  Model model(config.model);
  model.allocate(*backend, DType::f32, compute_dtype_for(tc.precision, *backend),
                 param_pad_multiple(comm->world_size()));
  model.params().initialize(tc.seed);
  model.plan(tc.micro_batch, tc.seq_len, tc.recompute);
  const std::unique_ptr<AdamW> optimizer = make_optimizer(model.params(), tc, config.dist, *comm);
  StepRunner step(model, *optimizer, tc, *comm, config.dist);

  Philox rng(tc.seed, 7 + static_cast<uint64_t>(comm->rank()));
  const WindowSource random_windows = [&](int32_t* out) {
    for (int64_t i = 0; i < tc.micro_batch * (tc.seq_len + 1); ++i)
      out[i] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(config.model.vocab_size)));
  };
  if (lead)
    fmt::print("bench {}: backend {}, {} params, {} tokens/step (micro_batch {} x seq_len {} x grad_accum {}), {} "
               "rank(s) ({} communicator{})\n",
               args.config, backend->name(), model.counts().total, tc.batch_tokens, tc.micro_batch, tc.seq_len,
               tc.grad_accum(), comm->world_size(), comm->name(),
               comm->world_size() == 1 ? ""
               : fmt::format("; gradients {}, {}", config.dist.zero1 ? "ZeRO-1" : "all-reduced",
                             config.dist.overlap ? "overlapped with backward" : "after backward"));
  for (int i = 0; i < args.warmup; ++i) step.run(tc.lr, random_windows);

  std::vector<double> seconds;
  double loss = 0;
  for (int i = 0; i < args.steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    loss = step.run(tc.lr, random_windows).loss;  // returns after the gradient norm reached the host
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  // The slowest rank's median sets the pace of a data-parallel step.
  const double median = comm->all_reduce_scalar(median_of(seconds), ReduceOp::max);
  const double comm_seconds = comm->world_size() > 1 ? time_communication(*comm, model.params(), config.dist) : 0;
  const double tokens_per_s = static_cast<double>(tc.batch_tokens) / median;
  const double flops_per_token = static_cast<double>(model.training_flops_per_token(tc.seq_len));
  const double achieved = flops_per_token * tokens_per_s / comm->world_size();  // per device
  if (!lead) return 0;
  fmt::print("steps timed: {} (after {} warm-up), median {:.4f} s (slowest rank), rank 0: min {:.4f} s, max {:.4f} s; last loss {:.4f}\n",
             args.steps, args.warmup, median, *std::min_element(seconds.begin(), seconds.end()),
             *std::max_element(seconds.begin(), seconds.end()), loss);
  if (comm->world_size() > 1)
    fmt::print("communication alone: {:.2f} ms per step for the {:.1f} MiB fp32 gradient ({}; median of 3, slowest "
               "rank); the step's exposed part is its time minus one rank's time at the same per-rank batch\n",
               1e3 * comm_seconds, static_cast<double>(model.params().padded_total()) * 4 / (1024.0 * 1024.0),
               config.dist.zero1 ? "reduce-scatter, then all-gather of the weights" : "one all-reduce");
  fmt::print("tokens/s: {:.0f}", tokens_per_s);
  if (comm->world_size() > 1) fmt::print(" ({:.0f} per rank)", tokens_per_s / comm->world_size());
  fmt::print("\nmodel FLOPs/token: {:.4g} (6 N + 12 L d_attn T, PaLM convention); achieved {:.2f} TFLOP/s per device\n",
             flops_per_token, achieved / 1e12);
  if (args.peak_tflops > 0)
    fmt::print("MFU: {:.1f}% of {:.1f} TFLOP/s\n", 100.0 * achieved / (args.peak_tflops * 1e12), args.peak_tflops);
  const auto mib = [](size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); };
  const ActivationBytes& act = model.activation_bytes();
  fmt::print("activations planned: {:.3f} MiB (saved by the blocks {:.3f}{}, residual stream {:.3f}, scratch {:.3f})\n",
             mib(act.total()), mib(act.saved), tc.recompute ? " with recompute: one block's" : "", mib(act.residual),
             mib(act.scratch));
  fmt::print("peak memory held by the backend (rank 0): {:.3f} GiB\n",
             static_cast<double>(backend->peak_allocated_bytes()) / (1024.0 * 1024.0 * 1024.0));
  return 0;
}

}  // namespace llmt::cli
