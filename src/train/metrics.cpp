#include "train/metrics.h"

#include <sstream>
#include <vector>

#include "core/error.h"

namespace llmt {

MetricsLog::MetricsLog(const std::string& path, int64_t keep_up_to_step) : path_(path) {
  // Keep only the lines with step <= keep_up_to_step: on a fresh start (-1) none, so stale
  // lines of an earlier run in the same directory never mix with the new ones.
  std::vector<std::string> kept;
  if (keep_up_to_step >= 0) {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      if (line.empty()) continue;
      try {
        if (nlohmann::json::parse(line).at("step").get<int64_t>() <= keep_up_to_step) kept.push_back(line);
      } catch (const nlohmann::json::exception&) {
        // a line cut short by a crash: dropped
      }
    }
  }
  {
    std::ofstream rewrite(path, std::ios::trunc);
    for (const auto& l : kept) rewrite << l << '\n';
  }
  out_.open(path, std::ios::app);
  check(out_.good(), "cannot open {} for writing", path);
}

void MetricsLog::write(const nlohmann::json& record) {
  out_ << record.dump() << '\n';
  out_.flush();
}

}  // namespace llmt
