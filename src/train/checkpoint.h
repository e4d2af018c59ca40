// Checkpoints (docs/ARCHITECTURE.md "Training loop and state"): a directory <run>/checkpoints/step_XXXXXXXX holding
//   model.safetensors      master weights, names as flash-linear-attention's HF layout
//   optimizer.safetensors  AdamW moments: "exp_avg.<name>", "exp_avg_sq.<name>"
//   state.json             step, optimizer updates, tokens, loader position, seed, resolved
//                          config, source revision
// It is written under a temporary name (.tmp-step_XXXXXXXX), every file fsynced, then renamed
// and the parent directory fsynced: a crash at any moment leaves the previous checkpoint
// intact and never a half one under a final name.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "data/loader.h"
#include "dist/communicator.h"
#include "model/params.h"
#include "train/optimizer.h"

namespace llmt {

/// Training progress saved in state.json.
struct TrainState {
  int64_t step = 0;           ///< optimizer steps completed (the LR schedule position)
  int64_t tokens = 0;         ///< training tokens consumed
  int64_t skipped_steps = 0;  ///< steps whose update was skipped (non-finite gradient norm)
  LoaderState loader;
};

/// Writes the checkpoint of `state` into run_dir/checkpoints and removes the oldest ones so
/// that at most `keep` remain. Returns the checkpoint directory. With a ZeRO-1 optimizer (its
/// shard is rank r's segment of params.padded_total() / world size elements) every rank of
/// `comm` must call it: the moment shards are all-gathered and rank 0 writes the same full-length
/// moments as without ZeRO-1 (so the checkpoint resumes on any world size, sharded or not). Only
/// rank 0 writes; the other ranks return "" (they need not call it without ZeRO-1).
std::string save_checkpoint(const std::string& run_dir, const TrainState& state, const ParamStore& params,
                            const AdamW& optimizer, const nlohmann::json& resolved_config, uint64_t seed,
                            int64_t keep, Communicator& comm = single_process_communicator());

/// The newest complete checkpoint directory of run_dir, or "" when there is none.
std::string latest_checkpoint(const std::string& run_dir);

/// `path` itself when it is a checkpoint directory (holds state.json), else the newest
/// checkpoint of the run directory `path`. Throws llmt::Error naming `path` when it is neither.
std::string resolve_checkpoint(const std::string& path);

/// The resolved config saved in `dir`/state.json (key "config"); throws naming the file.
nlohmann::json checkpoint_config(const std::string& dir);

/// Throws llmt::Error naming the key, `dir` and the way out when the model, train or data config saved in
/// `dir`/state.json differs from `resolved_config`'s (the keys that may change under a resume excepted:
/// train.backend, train.precision, data.cache_dir and the layers' save_states / save_residuals), or naming
/// the file when it cannot be read. It reads state.json only, so a refused resume costs no model or data setup.
void check_resume_config(const std::string& dir, const nlohmann::json& resolved_config);

/// Restores only the weights (`dir`/model.safetensors) into `params`; throws naming the file
/// and tensor that is missing or mismatching.
void load_weights(const std::string& dir, ParamStore& params);

/// Restores weights and moments into `params` / `optimizer` (its shard of the saved moments)
/// from `dir` and returns the saved state. Throws llmt::Error naming the file (and offset) for a missing, truncated or
/// mismatching file, and naming the key when the saved model, train or data config differs
/// from `resolved_config`'s (check_resume_config).
TrainState load_checkpoint(const std::string& dir, ParamStore& params, AdamW& optimizer,
                           const nlohmann::json& resolved_config);

}  // namespace llmt
