// What defines a sweep (docs/SWEEPS.md, "Re-running"): the base config, the --set overrides of every point and
// each point's own overrides, recorded in DIR/sweep.json on the first run so that a re-run into the same directory
// with a different definition is refused instead of mixing runs of two sweeps in one table.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/sweep.h"

namespace llmt {

/// The definition of a sweep: {"base": the base config file's JSON as written (formatting and key order do not
/// matter), "set": the --set overrides, "points": {point name: [its overrides]}}. Throws llmt::Error naming the
/// file when base_config cannot be read or is not valid JSON.
nlohmann::json sweep_definition(const std::string& base_config, const std::vector<std::string>& set,
                                const std::vector<SweepPoint>& points);

/// Compares `now` with the definition recorded in dir/sweep.json (written by the first run) and writes the
/// merged record back: points new to the sweep are added. Throws llmt::Error, before writing anything, when a
/// recorded point is defined differently now (the base config, a --set value or its own overrides changed):
/// the message names every such point, what changed (key paths with old and new values) and suggests a new
/// --out. Creates dir/sweep.json when absent.
void check_and_record_sweep_definition(const std::string& dir, const nlohmann::json& now);

}  // namespace llmt
