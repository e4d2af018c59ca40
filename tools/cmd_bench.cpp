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

int bench(const BenchArgs& args) {
  const Config config = load_config(args.config, args.set);
  const TrainConfig& tc = config.train;
  const std::unique_ptr<Communicator> comm = make_communicator(tc.backend);  // selects the rank's GPU first
  auto backend = make_backend(tc.backend);
  const bool lead = comm->rank() == 0;
  Model model(config.model);
  model.allocate(*backend, DType::f32, compute_dtype_for(tc.precision, *backend));
  model.params().initialize(tc.seed);
  model.plan(tc.micro_batch, tc.seq_len, tc.recompute);
  AdamW optimizer(model.params(), tc);
  StepRunner step(model, optimizer, tc, *comm);

  Philox rng(tc.seed, 7 + static_cast<uint64_t>(comm->rank()));
  const WindowSource random_windows = [&](int32_t* out) {
    for (int64_t i = 0; i < tc.micro_batch * (tc.seq_len + 1); ++i)
      out[i] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(config.model.vocab_size)));
  };
  if (lead)
    fmt::print("bench {}: backend {}, {} params, {} tokens/step (micro_batch {} x seq_len {} x grad_accum {}), {} "
               "rank(s) ({} communicator)\n",
               args.config, backend->name(), model.counts().total, tc.batch_tokens, tc.micro_batch, tc.seq_len,
               tc.grad_accum(), comm->world_size(), comm->name());
  for (int i = 0; i < args.warmup; ++i) step.run(tc.lr, random_windows);

  std::vector<double> seconds;
  double loss = 0;
  for (int i = 0; i < args.steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    loss = step.run(tc.lr, random_windows).loss;  // returns after the gradient norm reached the host
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(seconds.begin(), seconds.end());
  // The slowest rank's median sets the pace of a data-parallel step.
  const double median = comm->all_reduce_scalar(seconds[seconds.size() / 2], ReduceOp::max);
  const double tokens_per_s = static_cast<double>(tc.batch_tokens) / median;
  const double flops_per_token = static_cast<double>(model.training_flops_per_token(tc.seq_len));
  const double achieved = flops_per_token * tokens_per_s / comm->world_size();  // per device
  if (!lead) return 0;
  fmt::print("steps timed: {} (after {} warm-up), median {:.4f} s, min {:.4f} s, max {:.4f} s; last loss {:.4f}\n",
             args.steps, args.warmup, median, seconds.front(), seconds.back(), loss);
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
