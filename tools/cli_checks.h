// Command-line validators whose messages state the rule. CLI11 2.1's PositiveNumber and NonNegativeNumber
// are ranges up to DBL_MAX and report "Value 0 not in range 0.000000 to 1797693...(309 digits).000000".
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace llmt {

/// A validator for a numeric option: accepts a value that parses as a double and is > `bound` (strict) or
/// >= `bound`; otherwise the message "must be a number > 0, got -1" (CLI11 prefixes the option name,
/// e.g. "--stride: must be a number > 0, got 0"). `name` is the type tag shown by --help (POSITIVE,
/// NONNEGATIVE, as CLI11's). The option's own conversion (e.g. to an integer) still follows.
inline CLI::Validator lower_bound_check(double bound, bool strict, const std::string& name) {
  const std::string rule = std::string(strict ? "> " : ">= ") + CLI::detail::to_string(bound);
  return CLI::Validator(
      [bound, strict, rule](std::string& input) -> std::string {
        double v = 0;
        const bool ok = CLI::detail::lexical_cast(input, v) && (strict ? v > bound : v >= bound);
        return ok ? std::string() : "must be a number " + rule + ", got " + input;
      },
      name, name);
}

/// Values > 0 (counts, sizes, lengths).
inline CLI::Validator positive_number() { return lower_bound_check(0.0, true, "POSITIVE"); }

/// Values >= 0 (0 meaning "none" or "all", as each option documents).
inline CLI::Validator non_negative_number() { return lower_bound_check(0.0, false, "NONNEGATIVE"); }

}  // namespace llmt
