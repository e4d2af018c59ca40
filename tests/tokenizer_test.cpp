// GPT-2 tokenizer against the test vectors of data.md 6.1 and the golden count of the
// bundled FineWeb-Edu text (shared/data/README.md), both produced by js-tiktoken.
#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/gpt2_tokenizer.h"

using llmt::Gpt2Tokenizer;

namespace {

const Gpt2Tokenizer& tokenizer() {
  static const Gpt2Tokenizer tok = Gpt2Tokenizer::load("data/tokenizers/gpt2");
  return tok;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("GPT-2 test vectors of data.md 6.1", "[tokenizer]") {
  const auto& tok = tokenizer();
  CHECK(tok.encode("hello world") == std::vector<int32_t>{31373, 995});
  CHECK(tok.encode("Hello world!") == std::vector<int32_t>{15496, 995, 0});
  CHECK(tok.encode(" The quick brown fox's 12345 jumps\n\n  over   the lazy dog.") ==
        std::vector<int32_t>{383, 2068, 7586, 21831, 338, 17031, 2231, 18045, 628, 220, 625, 220, 220, 262, 16931,
                             3290, 13});
  CHECK(tok.encode("").empty());
}

TEST_CASE("GPT-2 encodes special-token strings as ordinary text", "[tokenizer]") {
  CHECK(tokenizer().encode("<|endoftext|>") == std::vector<int32_t>{27, 91, 437, 1659, 5239, 91, 29});
  CHECK(tokenizer().eot_id() == 50256);
  CHECK(tokenizer().vocab_size() == 50257);
}

TEST_CASE("GPT-2 golden count on the bundled FineWeb-Edu text", "[tokenizer]") {
  const std::string text = read_text("data/fineweb-edu-sample10BT-head.part1.txt");
  REQUIRE(text.size() == 803005);
  const std::vector<int32_t> ids = tokenizer().encode(text);
  CHECK(ids.size() == 172762);
  REQUIRE(ids.size() >= 8);
  CHECK(std::vector<int32_t>(ids.begin(), ids.begin() + 8) ==
        std::vector<int32_t>{464, 13362, 12091, 198, 1890, 477, 262, 1842});
  CHECK(tokenizer().decode(ids) == text);
}

TEST_CASE("GPT-2 decode of known ids and rejection of bad ids", "[tokenizer]") {
  CHECK(tokenizer().decode({15496, 995, 0}) == "Hello world!");
  CHECK(tokenizer().decode({50256}) == "<|endoftext|>");
  CHECK_THROWS_WITH(tokenizer().decode({50257}), Catch::Contains("50257"));
  CHECK_THROWS_AS(tokenizer().decode({-1}), llmt::Error);
}

TEST_CASE("GPT-2 rejects invalid UTF-8 naming the byte offset", "[tokenizer]") {
  CHECK_THROWS_WITH(tokenizer().encode(std::string("abc \xff def")), Catch::Contains("byte offset 4"));
}

TEST_CASE("GPT-2 whitespace follows Unicode White_Space", "[tokenizer]") {
  // Expected ids from OpenAI's gpt-2 encoder.py (Python `regex`, whose \s is White_Space).
  // U+0085 and U+00A0 are White_Space: between punctuation they split it. U+180E is not
  // (PCRE2's UCP \s matches it): after a space it is punctuation, taking the space along.
  const auto& tok = tokenizer();
  CHECK(tok.encode("!\xc2\x85!") == std::vector<int32_t>{0, 126, 227, 0});
  CHECK(tok.encode("!\xc2\xa0!") == std::vector<int32_t>{0, 1849, 0});
  CHECK(tok.encode("x \xe1\xa0\x8e" "1") == std::vector<int32_t>{87, 28053, 254, 236, 16});
}

TEST_CASE("GPT-2 load names the missing file", "[tokenizer]") {
  CHECK_THROWS_WITH(Gpt2Tokenizer::load("data/tokenizers/no-such-dir"),
                    Catch::Contains("data/tokenizers/no-such-dir/encoder.json"));
}
