// Sweep points, launch scripts and result collection (sweep.h).
#include "train/sweep.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/config.h"

namespace llmt {
namespace fs = std::filesystem;
namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, sep);) parts.push_back(part);
  return parts;
}

/// A directory name from the overrides: "key=value" joined by "__", characters outside [A-Za-z0-9._=+-]
/// replaced by '_'; a name over 150 characters becomes "point-<hash>".
std::string point_name(const std::vector<std::string>& overrides) {
  std::string name;
  for (const auto& o : overrides) name += (name.empty() ? "" : "__") + o;
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && std::string("._=+-").find(c) == std::string::npos) c = '_';
  if (name.empty()) return "base";
  if (name.size() > 150) return fmt::format("point-{:016x}", std::hash<std::string>{}(name));
  return name;
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string cell(double x) { return std::isnan(x) ? "" : fmt::format("{:.6g}", x); }

}  // namespace

std::vector<SweepPoint> sweep_points(const std::vector<std::string>& grids, const std::string& sweep_file) {
  std::vector<std::vector<std::string>> sets{{}};
  if (!sweep_file.empty()) {
    check(grids.empty(), "sweep: give --grid or a sweep file, not both");
    std::ifstream in(sweep_file);
    check(in.good(), "sweep: cannot open {}", sweep_file);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::parse_error& e) {
      throw Error(fmt::format("sweep: {} is not valid JSON: {}", sweep_file, e.what()));
    }
    check(j.is_object() && j.contains("points") && j["points"].is_array() && !j["points"].empty(),
          "sweep: {} must be an object with a non-empty list \"points\" of override objects", sweep_file);
    sets.clear();
    for (size_t i = 0; i < j["points"].size(); ++i) {
      const auto& p = j["points"][i];
      check(p.is_object(), "sweep: {}: points[{}] must be an object of \"key.path\": value", sweep_file, i);
      std::vector<std::string> overrides;
      for (const auto& [key, value] : p.items()) overrides.push_back(key + "=" + value.dump());
      sets.push_back(overrides);
    }
  }
  for (const std::string& g : grids) {
    const auto eq = g.find('=');
    check(eq != std::string::npos && eq > 0 && eq + 1 < g.size(), "sweep: --grid {}: expected key.path=v1,v2,...", g);
    const std::string key = g.substr(0, eq);
    const std::vector<std::string> values = split(g.substr(eq + 1), ',');
    std::vector<std::vector<std::string>> next;
    for (const auto& s : sets)
      for (const auto& v : values) {
        check(!v.empty(), "sweep: --grid {}: empty value", g);
        auto o = s;
        o.push_back(key + "=" + v);
        next.push_back(o);
      }
    sets = next;
  }
  std::vector<SweepPoint> points;
  std::map<std::string, size_t> seen;
  for (const auto& s : sets) {
    SweepPoint p{s, point_name(s)};
    check(seen.emplace(p.name, points.size()).second, "sweep: two points share the overrides {}", p.name);
    points.push_back(p);
  }
  return points;
}

SweepResult read_sweep_result(const std::string& run_dir) {
  SweepResult r;
  std::ifstream code(run_dir + "/exit_code");
  int exit_code = -1;
  r.status = code >> exit_code ? (exit_code == 0 ? "finished" : "failed") : "pending";
  std::ifstream metrics(run_dir + "/metrics.jsonl");
  double tps_sum = 0, first_tps = NAN;
  int64_t tps_n = 0;
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json rec = nlohmann::json::parse(line, nullptr, false);
    if (rec.is_discarded() || !rec.is_object()) continue;
    if (rec.contains("val_loss")) {
      const double v = rec["val_loss"].get<double>();
      r.final_val_loss = v;
      r.best_val_loss = std::isnan(r.best_val_loss) ? v : std::min(r.best_val_loss, v);
    }
    if (rec.contains("val_acc")) r.final_val_acc = rec["val_acc"].get<double>();
    if (rec.contains("val_scaled_acc")) r.final_val_scaled_acc = rec["val_scaled_acc"].get<double>();
    if (rec.contains("tokens_per_s")) {
      if (std::isnan(first_tps)) {
        first_tps = rec["tokens_per_s"].get<double>();
      } else {
        tps_sum += rec["tokens_per_s"].get<double>();
        ++tps_n;
      }
    }
  }
  r.tokens_per_s = tps_n > 0 ? tps_sum / static_cast<double>(tps_n) : first_tps;
  if (r.status == "failed") {
    std::ifstream log(run_dir + "/train.log");
    for (std::string line; std::getline(log, line);)
      if (line.find("error") != std::string::npos) r.error = line;
    if (r.error.empty()) r.error = fmt::format("exit code {}", exit_code);
  }
  return r;
}

void write_sweep_results(const std::string& dir, const std::vector<SweepPoint>& points,
                         const std::vector<SweepResult>& results) {
  check(points.size() == results.size(), "sweep: {} points but {} results", points.size(), results.size());
  std::vector<std::string> keys;  // every override key, in first-seen order
  for (const auto& p : points)
    for (const auto& o : p.overrides) {
      const std::string key = o.substr(0, o.find('='));
      if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
    }
  std::vector<std::string> header = {"point"};
  header.insert(header.end(), keys.begin(), keys.end());
  for (const char* h : {"status", "final_val_loss", "best_val_loss", "tokens_per_s", "final_val_acc",
                        "final_val_scaled_acc", "error"})
    header.push_back(h);
  std::vector<std::vector<std::string>> rows;
  for (size_t i = 0; i < points.size(); ++i) {
    std::vector<std::string> row = {points[i].name};
    for (const auto& key : keys) {
      std::string value;
      for (const auto& o : points[i].overrides)
        if (o.substr(0, o.find('=')) == key) value = o.substr(o.find('=') + 1);
      row.push_back(value);
    }
    const SweepResult& r = results[i];
    for (const std::string& c : {r.status, cell(r.final_val_loss), cell(r.best_val_loss), cell(r.tokens_per_s),
                                 cell(r.final_val_acc), cell(r.final_val_scaled_acc), r.error})
      row.push_back(c);
    rows.push_back(row);
  }
  const auto csv_field = [](const std::string& s) {
    if (s.find_first_of(",\"\n") == std::string::npos) return s;
    std::string q = "\"";
    for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  };
  std::ofstream csv(dir + "/results.csv"), md(dir + "/results.md");
  check(csv.good() && md.good(), "sweep: cannot write the results into {}", dir);
  const auto line = [&](const std::vector<std::string>& cells) {
    std::string c, m = "|";
    for (size_t i = 0; i < cells.size(); ++i) {
      c += (i ? "," : "") + csv_field(cells[i]);
      std::string escaped;
      for (char ch : cells[i]) escaped += ch == '|' ? std::string("\\|") : std::string(1, ch);
      m += " " + escaped + " |";
    }
    csv << c << '\n';
    md << m << '\n';
  };
  line(header);
  md << "|" << [&] {
    std::string s;
    for (size_t i = 0; i < header.size(); ++i) s += " --- |";
    return s;
  }() << '\n';
  for (const auto& row : rows) line(row);
}

std::vector<std::string> sweep_config_errors(const std::string& base_config, const std::vector<std::string>& set,
                                             const std::vector<SweepPoint>& points) {
  std::vector<std::string> errors;
  for (const auto& p : points) {
    std::vector<std::string> overrides = set;
    overrides.insert(overrides.end(), p.overrides.begin(), p.overrides.end());
    try {
      load_config(base_config, overrides);
    } catch (const Error& e) {
      errors.push_back(fmt::format("point {}: {}", p.name, e.what()));
    }
  }
  return errors;
}

std::string sweep_launch_script(const std::string& llmtrain, const std::string& base_config,
                                const std::vector<std::string>& set, const SweepPoint& point,
                                const std::string& run_dir) {
  std::string cmd = shell_quote(llmtrain) + " train --config " + shell_quote(base_config);
  for (const auto& o : set) cmd += " --set " + shell_quote(o);
  for (const auto& o : point.overrides) cmd += " --set " + shell_quote(o);
  cmd += " --out " + shell_quote(run_dir) + " --resume";  // a stopped point continues from its newest checkpoint
  return fmt::format(
      "#!/usr/bin/env bash\n"
      "# llmtrain sweep point {}\n"
      "trap : TERM USR1  # the trainer gets these (docs/SWEEPS.md, Slurm); this shell stays to write exit_code\n"
      "mkdir -p {}\n"
      "rm -f {}/exit_code\n"
      "{} > {}/train.log 2>&1\n"
      "code=$?\n"
      "echo $code > {}/exit_code\n"
      "exit $code\n",
      point.name, shell_quote(run_dir), shell_quote(run_dir), cmd, shell_quote(run_dir), shell_quote(run_dir));
}

std::string sweep_slurm_script(const std::vector<std::string>& scripts, const std::string& dir) {
  std::string list;
  for (const auto& s : scripts) list += "  " + shell_quote(s) + "\n";
  return fmt::format(
      "#!/usr/bin/env bash\n"
      "# llmtrain sweep: one array task per point; add #SBATCH lines for your cluster (partition, GPUs, time).\n"
      "#SBATCH --job-name=llmtrain-sweep\n"
      "#SBATCH --array=0-{}\n"
      "#SBATCH --output={}/slurm-%A_%a.out\n"
      "#SBATCH --open-mode=append\n"
      "#SBATCH --signal=B:USR1@120\n"
      "#SBATCH --requeue\n"
      "scripts=(\n{})\n"
      "# SIGUSR1 120 s before the time limit comes to this shell only (B:): forward it to the trainer, the child of\n"
      "# the launch script, which checkpoints and exits 75 (docs/PREEMPTION.md). SIGTERM (scancel, preemption)\n"
      "# reaches every process of the job, the trainer included: not forwarded (a second one skips the checkpoint).\n"
      "trap : TERM\n"
      "bash \"${{scripts[$SLURM_ARRAY_TASK_ID]}}\" &\n"
      "pid=$!\n"
      "trap 'pkill -USR1 -P \"$pid\"' USR1\n"
      "while true; do\n"
      "  wait \"$pid\"; rc=$?\n"
      "  kill -0 \"$pid\" 2>/dev/null || break  # still running: wait returned early because a trap ran\n"
      "done\n"
      "if [ \"$rc\" -eq 75 ]; then  # stopped with a checkpoint: run again, the launch script resumes\n"
      "  scontrol requeue \"${{SLURM_ARRAY_JOB_ID}}_${{SLURM_ARRAY_TASK_ID}}\"\n"
      "fi\n"
      "exit \"$rc\"\n",
      scripts.size() - 1, dir, list);
}

}  // namespace llmt
