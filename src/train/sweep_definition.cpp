// The sweep definition record (sweep_definition.h).
#include "train/sweep_definition.h"

#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "core/error.h"

namespace llmt {
namespace {

using nlohmann::json;

/// "key.path: old -> new" for every leaf where a and b differ ("(absent)" for a missing side).
void diff(const json& a, const json& b, const std::string& path, std::vector<std::string>& out) {
  if (a.is_object() && b.is_object()) {
    for (const auto& [k, v] : a.items()) diff(v, b.contains(k) ? b[k] : json(), path.empty() ? k : path + "." + k, out);
    for (const auto& [k, v] : b.items())
      if (!a.contains(k)) diff(json(), v, path.empty() ? k : path + "." + k, out);
    return;
  }
  if (a == b) return;
  const auto show = [](const json& v) { return v.is_null() ? std::string("(absent)") : v.dump(); };
  out.push_back(fmt::format("{}: {} -> {}", path.empty() ? "(top level)" : path, show(a), show(b)));
}

std::string join(const std::vector<std::string>& items, const std::string& sep) {
  std::string s;
  for (const auto& i : items) s += (s.empty() ? "" : sep) + i;
  return s;
}

}  // namespace

json sweep_definition(const std::string& base_config, const std::vector<std::string>& set,
                      const std::vector<SweepPoint>& points) {
  std::ifstream in(base_config);
  check(in.good(), "sweep: cannot open {}", base_config);
  json def;
  try {
    def["base"] = json::parse(in);
  } catch (const json::parse_error& e) {
    throw Error(fmt::format("sweep: {} is not valid JSON: {}", base_config, e.what()));
  }
  def["set"] = set;
  def["points"] = json::object();
  for (const auto& p : points) def["points"][p.name] = p.overrides;
  return def;
}

void check_and_record_sweep_definition(const std::string& dir, const json& now) {
  const std::string file = dir + "/sweep.json";
  json recorded = now;
  if (std::filesystem::exists(file)) {
    std::ifstream in(file);
    recorded = json::parse(in, nullptr, false);
    check(!recorded.is_discarded() && recorded.is_object() && recorded.contains("base") &&
              recorded.contains("set") && recorded.contains("points") && recorded["points"].is_object(),
          "sweep: {} is not a sweep record; give a new --out", file);
    std::vector<std::string> shared;  // what changed for every recorded point: the base and the --set overrides
    diff(recorded["base"], now["base"], "", shared);
    if (recorded["set"] != now["set"])
      shared.push_back(fmt::format("--set {} -> {}", recorded["set"].dump(), now["set"].dump()));
    std::vector<std::string> problems;
    for (const auto& [name, overrides] : now["points"].items()) {
      if (!recorded["points"].contains(name)) continue;  // a point new to the sweep
      std::vector<std::string> changed = shared;
      if (recorded["points"][name] != overrides)
        changed.push_back(fmt::format("overrides {} -> {}", recorded["points"][name].dump(), overrides.dump()));
      if (!changed.empty()) problems.push_back(fmt::format("point {}: {}", name, join(changed, ", ")));
    }
    check(problems.empty(),
          "sweep: {} already holds a sweep defined differently ({}); its points are refused so that one "
          "directory does not mix two sweeps: {}. Give a new --out (or remove {} to start over)",
          dir, file, join(problems, "; "), dir);
    for (const auto& [name, overrides] : now["points"].items()) recorded["points"][name] = overrides;
  }
  std::ofstream out(file);
  check(out.good(), "sweep: cannot write {}", file);
  out << recorded.dump(2) << '\n';
}

}  // namespace llmt
