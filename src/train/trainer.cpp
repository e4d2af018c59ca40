#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>

#include <spdlog/spdlog.h>

#include "core/error.h"
#include "data/text_dataset.h"
#include "train/lr_schedule.h"
#include "train/preempt.h"
#include "train/synthetic_eval.h"

namespace llmt {
namespace fs = std::filesystem;

namespace {

/// "val_loss X" and, for synthetic tasks, the accuracies of an evaluation record.
std::string eval_summary(const nlohmann::json& rec) {
  std::string s = fmt::format("val_loss {:.4f}", rec["val_loss"].get<double>());
  for (const char* key : {"val_acc", "val_example_acc", "val_scaled_acc"})
    if (rec.contains(key)) s += fmt::format(" | {} {:.4f}", key, rec[key].get<double>());
  return s;
}

std::string format_duration(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02d}m", s / 3600, (s / 60) % 60);
  if (s >= 60) return fmt::format("{}m{:02d}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

}  // namespace

Trainer::Trainer(const Config& config, const std::string& run_dir, bool resume, Communicator& comm)
    : config_(config), run_dir_(run_dir), comm_(comm), lead_(comm.rank() == 0) {
  const TrainConfig& tc = config_.train;
  const DataConfig& dc = config_.data;
  // A start the run directory refuses fails here, before any data preparation (tokenizing data.text can take
  // minutes) and before the model is built: checkpoints without --resume, or a config that is not the run's.
  const std::string latest = latest_checkpoint(run_dir_);
  check(resume || latest.empty(),
        "{} already holds checkpoints (newest: {}); pass --resume to continue it or --out to start elsewhere",
        run_dir_, latest);
  if (!latest.empty()) check_resume_config(latest, config_.resolved);
  backend_ = make_backend(tc.backend);

  const auto require_path = [](const std::string& key, const std::string& path) {
    check(fs::exists(path), "{} = {}: not found (relative paths are resolved from the current directory {}; run "
          "from the repository root or give an absolute path)", key, path, fs::current_path().string());
  };
  std::string train_path = dc.train_shard, val_path = dc.val_shard;
  if (dc.source != "tokens") {
    synthetic_ = std::make_unique<SyntheticSource>(dc.source, dc.synthetic, dc.shuffle_seed, tc.seq_len);
  } else if (!dc.dataset.empty()) {
    require_path("data.dataset", dc.dataset);
    dataset_ = std::make_unique<DatasetLoader>(dc.dataset, "train", tc.seq_len, dc.shuffle_seed, dc.shuffle,
                                               dc.tokenizer);
    val_dataset_ = std::make_unique<DatasetLoader>(dc.dataset, "val", tc.seq_len, 0, false, dc.tokenizer);
  } else if (dc.text.empty()) {
    require_path("data.train_shard", train_path);
    require_path("data.val_shard", val_path);
  } else {
    require_path("data.text", dc.text);
    require_path("data.tokenizer_dir", dc.tokenizer_dir);
    const std::string out = (fs::path(dc.cache_dir) / (fs::path(dc.text).stem().string() + "-" + dc.tokenizer)).string();
    // Rank 0 tokenizes into the cache first; the others then find it there.
    if (!lead_) comm_.barrier();
    const TextShards shards = prepare_text_shards(dc.text, dc.tokenizer_dir, out, dc.val_fraction);
    if (lead_) comm_.barrier();
    train_path = shards.train_path;
    val_path = shards.val_path;
  }
  if (!dataset_ && !synthetic_) {
    train_shard_ = std::make_unique<ShardReader>(train_path);
    val_shard_ = std::make_unique<ShardReader>(val_path);
    loader_ = std::make_unique<WindowLoader>(*train_shard_, tc.seq_len, dc.shuffle_seed, dc.shuffle);
    val_loader_ = std::make_unique<WindowLoader>(*val_shard_, tc.seq_len, 0, false);
  }

  model_ = std::make_unique<Model>(config_.model);
  model_->allocate(*backend_, DType::f32, compute_dtype_for(tc.precision, *backend_),
                   param_pad_multiple(comm_.world_size()));
  model_->plan(tc.micro_batch, tc.seq_len, tc.recompute);
  optimizer_ = make_optimizer(model_->params(), tc, config_.dist, comm_);
  step_ = std::make_unique<StepRunner>(*model_, *optimizer_, config_.train, comm_, config_.dist);
  windows_.resize(tc.micro_batch * (tc.seq_len + 1));
  inputs_.resize(tc.micro_batch * tc.seq_len);
  targets_.resize(tc.micro_batch * tc.seq_len);

  if (lead_) fs::create_directories(run_dir_);
  comm_.barrier();
  if (!latest.empty()) {
    try {
      state_ = load_checkpoint(latest, model_->params(), *optimizer_, config_.resolved);
    } catch (const Error& e) {  // (checkpoints are written atomically: a damaged one was damaged afterwards)
      throw Error(fmt::format("{}\n--resume reads the newest checkpoint; to continue from the one before it, move {} "
                              "out of {}/checkpoints", e.what(), fs::path(latest).filename().string(), run_dir_));
    }
    if (synthetic_) {
      synthetic_->set_state(state_.loader);
    } else if (dataset_) {
      dataset_->set_state(state_.loader);
    } else {
      loader_->set_state(state_.loader);
    }
    if (lead_) spdlog::info("resumed from {} at step {}", latest, state_.step);
    if (lead_ && state_.step >= tc.steps())
      spdlog::info("the run had finished: its newest checkpoint is at its last step, {}; nothing to train",
                   state_.step);
  } else {
    if (resume && lead_) spdlog::warn("--resume: no checkpoint in {}; starting from step 0", run_dir_);
    model_->params().initialize(tc.seed);
  }
  // Every rank has read the checkpoint before rank 0 may write (and prune) the next one.
  comm_.barrier();
  if (!lead_) return;
  metrics_ = std::make_unique<MetricsLog>((fs::path(run_dir_) / "metrics.jsonl").string(),
                                          latest.empty() ? -1 : state_.step);
  std::ofstream((fs::path(run_dir_) / "config.json").string()) << config_.resolved.dump(2) << '\n';

  const ParamCounts pc = model_->counts();
  spdlog::info("model: {} layers of {}, d_model {}, {} parameters ({} non-embedding); backend {}",
               config_.model.n_layers, config_.model.type, config_.model.d_model, pc.total, pc.non_embedding,
               backend_->name());
  if (synthetic_) {
    spdlog::info("data: synthetic task {}, one example per window of {} tokens, {} evaluation points; {} steps of "
                 "{} tokens (micro_batch {} x grad_accum {})", dc.source, tc.seq_len + 1,
                 synthetic_->eval_sets().size(), tc.steps(), tc.batch_tokens, tc.micro_batch, tc.grad_accum());
  } else {
    spdlog::info("data: {} training tokens ({} windows of {}), {} validation tokens; {} steps of {} tokens "
                 "(micro_batch {} x grad_accum {})",
                 dataset_ ? dataset_->num_tokens() : train_shard_->size(),
                 dataset_ ? dataset_->num_windows() : loader_->num_windows(), tc.seq_len,
                 dataset_ ? val_dataset_->num_tokens() : val_shard_->size(), tc.steps(),
                 tc.batch_tokens, tc.micro_batch, tc.grad_accum());
  }
  if (comm_.world_size() > 1)
    spdlog::info("data parallel: {} ranks ({} communicator), {} micro-batches per rank and step; gradients {}; "
                 "optimizer state {:.2f} MiB per rank{}",
                 comm_.world_size(), comm_.name(), step_->micro_batches_per_rank(),
                 fmt::format("{} {}", config_.dist.zero1 ? "reduced to their ZeRO-1 shards" : "all-reduced",
                             config_.dist.overlap ? "in buckets overlapped with backward" : "after backward"),
                 static_cast<double>(optimizer_->state_bytes()) / (1024.0 * 1024.0),
                 config_.dist.zero1 ? fmt::format(" (ZeRO-1: 1/{} of the moments)", comm_.world_size()) : "");
}

Trainer::~Trainer() = default;

void Trainer::next_windows(int32_t* out) {
  const int64_t B = config_.train.micro_batch;
  if (synthetic_) {
    synthetic_->next(B, comm_.rank(), comm_.world_size(), out);
  } else if (dataset_) {
    dataset_->next(B, comm_.rank(), comm_.world_size(), out);
  } else {
    loader_->next(B, comm_.rank(), comm_.world_size(), out);
  }
}

LoaderState Trainer::loader_state() const {
  if (synthetic_) return synthetic_->state();
  return dataset_ ? dataset_->state() : loader_->state();
}

nlohmann::json Trainer::evaluate() {
  if (synthetic_)
    return evaluate_synthetic(*model_, *synthetic_, config_.train.micro_batch, config_.train.seq_len,
                              config_.train.recompute, comm_);
  return {{"val_loss", evaluate_tokens()}};
}

double Trainer::evaluate_tokens() {
  const int64_t B = config_.train.micro_batch, T = config_.train.seq_len;
  const int64_t n = std::min(config_.eval.tokens / T,
                             val_dataset_ ? val_dataset_->num_windows() : val_loader_->num_windows());
  double loss_sum = 0;
  // Rank r evaluates micro-batches r, r + W, r + 2W, ...
  for (int64_t w0 = comm_.rank() * B; w0 < n; w0 += comm_.world_size() * B) {
    for (int64_t b = 0; b < B; ++b) {
      int32_t* win = windows_.data() + b * (T + 1);
      if (w0 + b < n) {
        if (val_dataset_) {
          val_dataset_->window(w0 + b, win);
        } else {
          val_loader_->window(w0 + b, win);
        }
      } else {
        std::fill(win, win + T + 1, -1);  // padding rows: token 0, no labels (window encoding, step.h)
      }
    }
    split_windows(windows_.data(), B, T, inputs_, targets_);
    loss_sum += model_->forward(inputs_.data(), targets_.data(), false, 0.0);
  }
  return comm_.all_reduce_scalar(loss_sum, ReduceOp::sum) / static_cast<double>(n * T);
}

Trainer::RunEnd Trainer::run(int64_t stop_at_step) {
  const TrainConfig& tc = config_.train;
  const int64_t N = tc.steps();
  const int64_t stop = stop_at_step > 0 ? std::min(stop_at_step, N) : N;
  if (state_.step == 0 && config_.eval.at_start) {
    nlohmann::json rec = {{"step", 0}, {"tokens", 0}};
    rec.update(evaluate());
    if (lead_) {
      metrics_->write(rec);
      spdlog::info("step 0/{} | {}", N, eval_summary(rec));
    }
  }
  using clock = std::chrono::steady_clock;
  const auto session_start = clock::now();
  const int64_t first_step = state_.step;
  while (state_.step < stop) {
    const auto t0 = clock::now();
    const double lr = learning_rate(tc, state_.step);
    const StepResult r = step_->run(lr, [&](int32_t* out) { next_windows(out); });
    if (r.skipped) {
      ++state_.skipped_steps;
      if (lead_)
        spdlog::warn("step {}: gradient norm is {}; update skipped (the LR schedule advances)", state_.step + 1,
                   r.grad_norm);
    }
    ++state_.step;
    state_.tokens += tc.batch_tokens;
    state_.loader = loader_state();
    const double dt = std::chrono::duration<double>(clock::now() - t0).count();
    const double tokens_per_s = static_cast<double>(tc.batch_tokens) / dt;

    nlohmann::json rec = {{"step", state_.step}, {"loss", r.loss}, {"lr", lr}, {"grad_norm", r.grad_norm},
                          {"tokens", state_.tokens}, {"tokens_per_s", tokens_per_s}};
    if (r.skipped) rec["skipped"] = true;
    const SyntheticConfig& sc = config_.data.synthetic;
    if (synthetic_ && (sc.curriculum_tokens > 0 || sc.curriculum_hold_tokens > 0) && state_.loader.index > 0)
      rec["curriculum_max_length"] = synthetic_->longest_train_length(state_.loader.index - 1);  // the step's last example
    const bool last = state_.step == N;
    const auto every = [&](int64_t interval) { return interval > 0 && state_.step % interval == 0; };
    if (every(config_.eval.interval_steps) || last) rec.update(evaluate());
    if (lead_) metrics_->write(rec);

    if (lead_ && (every(config_.log.interval_steps) || last || state_.step == first_step + 1 || rec.contains("val_loss"))) {
      const double elapsed = std::chrono::duration<double>(clock::now() - session_start).count();
      const double per_step = elapsed / static_cast<double>(state_.step - first_step);
      std::string line = fmt::format("step {}/{} | loss {:.4f} | lr {:.3e} | grad_norm {:.3f} | {:.0f} tok/s | ETA {}",
                                     state_.step, N, r.loss, lr, r.grad_norm, tokens_per_s,
                                     format_duration(per_step * static_cast<double>(N - state_.step)));
      if (rec.contains("val_loss")) line += " | " + eval_summary(rec);
      spdlog::info("{}", line);
    }
    // A preemption signal may reach some ranks only: all stop together if any was signalled.
    const bool preempted =
        comm_.all_reduce_scalar(preemption_requested() ? 1.0 : 0.0, ReduceOp::max) > 0 && state_.step < stop;
    if (every(config_.checkpoint.interval_steps) || state_.step == stop || preempted) {
      // The weights are the same on every rank, the moments too or (ZeRO-1) gathered from the
      // ranks' shards: rank 0 writes, and no rank runs ahead (or exits) before it is complete.
      const std::string dir = save_checkpoint(run_dir_, state_, model_->params(), *optimizer_, config_.resolved,
                                              tc.seed, config_.checkpoint.keep, comm_);
      if (lead_) spdlog::debug("checkpoint {}", dir);
      comm_.barrier();
      if (preempted) {
        if (lead_)
          spdlog::warn("{}: stopped after step {} with checkpoint {}; continue with --resume",
                       preemption_signal() == SIGINT ? "interrupted (Ctrl-C)" : "preempted", state_.step, dir);
        return RunEnd::preempted;
      }
    }
  }
  return RunEnd::finished;
}

}  // namespace llmt
