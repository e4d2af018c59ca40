// llmtrain tokenize: text -> token ids (or ids -> text with --decode) with any tokenizer that
// load_tokenizer knows (data/tokenizer.h).
#include <cctype>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "tools/commands.h"
#ifdef LLMT_HAVE_PCRE2
#include "data/tokenizer.h"
#endif

namespace llmt::cli {

namespace {

/// The whole content of `path`; throws naming the file.
std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  check(static_cast<bool>(in), "tokenize: cannot open {}", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  check(!in.bad(), "tokenize: cannot read {}", path);
  return ss.str();
}

/// Integers separated by whitespace or commas, optionally inside [ ] (so both the plain and the
/// --json output of `tokenize` read back). Throws naming `source` and the offset of a bad character.
std::vector<int32_t> parse_ids(const std::string& s, const std::string& source) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (std::isspace(static_cast<unsigned char>(c)) || c == ',' || c == '[' || c == ']') {
      ++i;
      continue;
    }
    check(std::isdigit(static_cast<unsigned char>(c)), "tokenize --decode: {}: offset {}: expected a token id, got '{}'",
          source, i, c);
    size_t end = i;
    while (end < s.size() && std::isdigit(static_cast<unsigned char>(s[end]))) ++end;
    const std::string digits = s.substr(i, end - i);
    check(digits.size() <= 10 && std::stoll(digits) <= INT32_MAX, "tokenize --decode: {}: offset {}: id {} is too large",
          source, i, digits);
    ids.push_back(static_cast<int32_t>(std::stoll(digits)));
    i = end;
  }
  return ids;
}

}  // namespace

int tokenize(const TokenizeArgs& args) {
#ifndef LLMT_HAVE_PCRE2
  throw Error("tokenize: llmtrain was built without PCRE2, so it has no tokenizer; install libpcre2-dev and rebuild");
#else
  const auto tok = load_tokenizer(args.tokenizer);
  const bool from_file = !args.file.empty();
  const std::string input = from_file ? read_file(args.file) : args.text;
  if (args.decode) {
    fmt::print("{}", tok->decode(parse_ids(input, from_file ? args.file : "--text")));
    return 0;
  }
  const std::vector<int32_t> ids = tok->encode(input);
  fmt::print(args.json ? "[{}]\n" : "{}\n", fmt::join(ids, args.json ? ", " : " "));
  return 0;
#endif
}

}  // namespace llmt::cli
