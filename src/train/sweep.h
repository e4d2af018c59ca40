// Sweeps (`llmtrain sweep`, docs/SWEEPS.md): a base config and a list of points, each a set of config overrides
// ("key.path=value", as --set); per point a run directory, a launch script and an exit status; results collected
// from each run's metrics.jsonl into results.csv and results.md.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace llmt {

/// One point of a sweep: its overrides in order, and its directory name under the sweep directory.
struct SweepPoint {
  std::vector<std::string> overrides;  ///< "key.path=value"
  std::string name;
};

/// The cartesian product of `grids` ("key.path=v1,v2,..." each; the first grid varies slowest), or, when
/// `sweep_file` is not empty, the points of that JSON file: {"points": [{"key.path": value, ...}, ...]} (values as
/// JSON). Throws llmt::Error naming the grid or the file and offset of a malformed entry.
std::vector<SweepPoint> sweep_points(const std::vector<std::string>& grids, const std::string& sweep_file);

/// What a point's run left behind.
struct SweepResult {
  std::string status;            ///< "finished", "failed" or "pending" (no exit status yet)
  double final_val_loss = NAN;   ///< the last val_loss in metrics.jsonl
  double best_val_loss = NAN;    ///< the smallest val_loss
  double tokens_per_s = NAN;     ///< mean tokens_per_s of the step records after the first (all if only one)
  double final_val_acc = NAN;    ///< synthetic tasks: the last val_acc
  double final_val_scaled_acc = NAN;  ///< parity / modular arithmetic: the last val_scaled_acc (0 = chance)
  std::string error;             ///< failed: the last line of train.log that reports an error
};

/// Reads run_dir/exit_code (written when the run ends: 0 = finished), run_dir/metrics.jsonl and run_dir/train.log.
SweepResult read_sweep_result(const std::string& run_dir);

/// Writes dir/results.csv and dir/results.md: one row per point (point, one column per override key, status,
/// final_val_loss, best_val_loss, tokens_per_s, final_val_acc, final_val_scaled_acc, error); empty cells for
/// missing values.
void write_sweep_results(const std::string& dir, const std::vector<SweepPoint>& points,
                         const std::vector<SweepResult>& results);

/// The config errors of the points: for each point whose config (load_config of base_config with `set`, then the
/// point's overrides: what the trainer loads) does not load, "point NAME: the error". Empty when all load.
std::vector<std::string> sweep_config_errors(const std::string& base_config, const std::vector<std::string>& set,
                                             const std::vector<SweepPoint>& points);

/// The launch script of a point: runs `llmtrain train --resume` (a stopped point continues from its newest
/// checkpoint) on the base config with the `set` overrides, then the point's, into run_dir, its output in
/// run_dir/train.log, then writes the exit status to run_dir/exit_code. SIGTERM / SIGUSR1 sent to the script's
/// shell do not end it (the trainer gets them: docs/SWEEPS.md, "Slurm"), so exit_code is still written.
std::string sweep_launch_script(const std::string& llmtrain, const std::string& base_config,
                                const std::vector<std::string>& set, const SweepPoint& point,
                                const std::string& run_dir);

/// A Slurm array script with one task per launch script (task i runs scripts[i]): asks for SIGUSR1 120 s before
/// the time limit, forwards it to the point's trainer (which checkpoints and exits 75, docs/PREEMPTION.md) and
/// requeues the task on exit code 75.
std::string sweep_slurm_script(const std::vector<std::string>& scripts, const std::string& dir);

}  // namespace llmt
