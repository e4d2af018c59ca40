// llmtrain sweep: runs or scripts every point of a grid or points file (docs/SWEEPS.md).
#include <sys/wait.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <spdlog/spdlog.h>

#include "core/error.h"
#include "tools/commands.h"
#include "train/sweep.h"
#include "train/sweep_definition.h"

namespace llmt::cli {
namespace fs = std::filesystem;

int sweep(const SweepArgs& args) {
  const std::vector<SweepPoint> points = sweep_points(args.grids, args.file);
  const std::string base = fs::absolute(args.base).string();
  const std::string dir = fs::absolute(args.out.empty() ? "sweeps/" + fs::path(args.base).stem().string() : args.out)
                              .lexically_normal().string();
  const std::string llmtrain = fs::read_symlink("/proc/self/exe").string();
  // Every point's config, loaded as the trainer will, before anything is written: --emit-slurm refuses a bad
  // point (its script would only fail on the cluster); a local run reports it and runs the others.
  // A local run with no point that loads (a misspelt grid key) is refused the same way: nothing would run, and a
  // DIR written now would refuse the corrected sweep as a different one.
  const std::vector<std::string> errors = sweep_config_errors(base, args.set, points);
  if (!errors.empty() && (args.emit_slurm || (!args.collect && errors.size() == points.size()))) {
    for (const std::string& e : errors) spdlog::error("sweep: {}", e);
    spdlog::error("sweep: {} of {} points have config errors; nothing written", errors.size(), points.size());
    return 2;
  }
  if (!args.collect)
    for (const std::string& e : errors) spdlog::warn("sweep: {} (the point will fail)", e);
  const nlohmann::json definition = sweep_definition(base, args.set, points);
  fs::create_directories(dir);
  check_and_record_sweep_definition(dir, definition);
  std::vector<std::string> scripts;
  for (const SweepPoint& p : points) {
    const std::string run_dir = dir + "/" + p.name, script = run_dir + "/launch.sh";
    fs::create_directories(run_dir);
    std::ofstream(script) << sweep_launch_script(llmtrain, base, args.set, p, run_dir);
    fs::permissions(script, fs::perms::owner_exec | fs::perms::group_exec, fs::perm_options::add);
    scripts.push_back(script);
  }
  std::vector<SweepResult> results(points.size());
  const auto collect = [&] {
    for (size_t i = 0; i < points.size(); ++i) results[i] = read_sweep_result(dir + "/" + points[i].name);
    write_sweep_results(dir, points, results);
  };
  if (args.emit_slurm) {
    std::ofstream(dir + "/sweep.slurm") << sweep_slurm_script(scripts, dir);
    collect();
    spdlog::info("sweep: {} points; launch scripts in {}/*/launch.sh, array job: sbatch {}/sweep.slurm; then "
                 "llmtrain sweep --collect with the same arguments writes {}/results.csv", points.size(), dir, dir,
                 dir);
    return 0;
  }
  if (!args.collect) {
    for (size_t i = 0; i < points.size(); ++i) {
      const std::string run_dir = dir + "/" + points[i].name;
      if (read_sweep_result(run_dir).status == "finished") {
        spdlog::info("sweep: point {}/{} {}: finished before, skipped", i + 1, points.size(), points[i].name);
        continue;
      }
      spdlog::info("sweep: point {}/{} {}: running (log {}/train.log)", i + 1, points.size(), points[i].name, run_dir);
      const int rc = std::system(("bash '" + scripts[i] + "'").c_str());
      if (WIFSIGNALED(rc) || (WIFEXITED(rc) && WEXITSTATUS(rc) == 128 + SIGINT)) {
        collect();
        spdlog::warn("sweep: interrupted during point {}; re-run the same command to continue", points[i].name);
        return 130;
      }
      const SweepResult r = read_sweep_result(run_dir);
      if (r.status == "finished") {
        spdlog::info("sweep: point {} finished: final val_loss {:.4f}", points[i].name, r.final_val_loss);
      } else {
        spdlog::error("sweep: point {} failed: {}", points[i].name, r.error);
      }
      collect();
    }
  }
  collect();
  int finished = 0;
  for (const auto& r : results) finished += r.status == "finished";
  spdlog::info("sweep: {} of {} points finished; results in {}/results.csv and results.md", finished, points.size(),
               dir);
  return finished == static_cast<int>(points.size()) ? 0 : 1;
}

}  // namespace llmt::cli
