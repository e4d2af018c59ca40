// metrics.jsonl: one JSON object per line, written by the trainer (doubles with 17
// significant digits, so losses round-trip exactly).
#pragma once
#include <cstdint>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace llmt {

class MetricsLog {
 public:
  /// Opens `path` for appending after dropping every line whose "step" is greater than
  /// `keep_up_to_step` (and any partial line), so a resumed run continues exactly where the
  /// checkpoint was; -1 (a fresh start) drops every line.
  MetricsLog(const std::string& path, int64_t keep_up_to_step);
  /// Appends one object as one line and flushes.
  void write(const nlohmann::json& record);

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace llmt
