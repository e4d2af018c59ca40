// Helpers shared by the test executables: temporary directories and whole-file I/O.
#pragma once
#include <unistd.h>

#include <catch2/catch.hpp>

#include <filesystem>
#include <functional>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace llmt::test {

/// A fresh directory under the system temp dir (unique per process and instance), removed
/// with its contents at scope exit.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           ("llmt_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path / name).string(); }
  /// Writes `text` to the file `name` inside the directory; returns its path.
  std::string write(const std::string& name, const std::string& text) const {
    const std::string p = file(name);
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    REQUIRE(out);
    return p;
  }
};

/// The whole file as bytes (REQUIREs that it opens).
inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// Replaces the file's contents with `bytes`.
inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  out.close();
  REQUIRE(out);
}

/// The objects of <run>/metrics.jsonl, one per line.
inline std::vector<nlohmann::json> read_metrics(const std::filesystem::path& run) {
  std::vector<nlohmann::json> out;
  std::ifstream in(run / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

/// The message of the llmt::Error that f() throws; fails the test when it throws nothing.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const llmt::Error& e) {
    return e.what();
  }
  FAIL("expected an llmt::Error, nothing was thrown");
  return {};
}

}  // namespace llmt::test
