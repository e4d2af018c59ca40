// Errors of the project: one exception type carrying a message that names what was wrong
// (a config key path, a file and byte offset, a shape).
#pragma once
#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace llmt {

/// The exception every module throws for bad input or a violated precondition.
/// The message is meant for the user: it names the key, file, offset or shape involved.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

/// Throws Error(fmt::format(format, args...)) when `condition` is false.
template <typename... Args>
void check(bool condition, fmt::format_string<Args...> format, Args&&... args) {
  if (!condition) throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace llmt
