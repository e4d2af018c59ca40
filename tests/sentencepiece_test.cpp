// SentencePiece `.model` tokenizers through libsentencepiece, against the reference encoder
// `spm_encode` (tests/fixtures/sentencepiece_reference.json, made by
// tests/fixtures/make_sentencepiece_reference.sh with a small model trained on the bundled text).
#include <catch2/catch.hpp>

#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/prepare_data.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "test_util.h"

using nlohmann::json;

namespace {
const char* kModel = "tests/fixtures/spm_fineweb_derived.model";
const json& reference() {
  static const json ref = json::parse(llmt::test::read_bytes("tests/fixtures/sentencepiece_reference.json"));
  return ref;
}
}  // namespace

TEST_CASE("SentencePiece: hard strings equal spm_encode", "[sentencepiece]") {
  const auto tok = llmt::load_tokenizer(kModel);
  REQUIRE(reference()["strings"].size() == 8);
  for (const auto& e : reference()["strings"]) {
    const std::string text = e["text"];
    INFO(text);
    const std::vector<int32_t> ids = tok->encode(text);
    CHECK(ids == e["ids"].get<std::vector<int32_t>>());
  }
  CHECK(tok->vocab_size() == 2000);
  CHECK(tok->bos_id() == 1);
  CHECK(tok->eos_id() == 2);
  CHECK(tok->decode(tok->encode("hello world")) == "hello world");
  CHECK_THROWS_WITH(tok->decode({2000}), Catch::Contains("2000"));
}

TEST_CASE("SentencePiece: every line of the bundled text equals spm_encode", "[sentencepiece]") {
  const auto tok = llmt::load_tokenizer(kModel);
  std::istringstream text(llmt::test::read_bytes("data/fineweb-edu-sample10BT-head.part1.txt"));
  const auto& counts = reference()["text_line_counts"];
  const auto& first = reference()["text_first_lines_ids"];
  std::string line;
  size_t i = 0;
  int64_t total = 0, expected_total = 0;
  while (std::getline(text, line)) {
    REQUIRE(i < counts.size());
    const std::vector<int32_t> ids = tok->encode(line);
    if (i < first.size()) CHECK(ids == first[i].get<std::vector<int32_t>>());
    CHECK(static_cast<int64_t>(ids.size()) == counts[i].get<int64_t>());
    total += static_cast<int64_t>(ids.size());
    expected_total += counts[i].get<int64_t>();
    ++i;
  }
  CHECK(i == 3542);
  CHECK(total == expected_total);
}

TEST_CASE("SentencePiece: prepare-data takes a .model tokenizer", "[sentencepiece]") {
  llmt::test::TempDir dir;
  llmt::PrepareOptions o;
  o.inputs = {dir.write("a.txt", reference()["strings"][0]["text"].get<std::string>())};
  o.tokenizer = kModel;
  o.out_dir = dir.file("out");
  o.doc_separator = "bos";
  o.progress = false;
  const auto r = llmt::prepare_data(o);
  const auto expected = reference()["strings"][0]["ids"].get<std::vector<int32_t>>();
  CHECK(r.train_tokens == static_cast<int64_t>(expected.size()) + 1);
  const llmt::ShardReader shard(dir.file("out") + "/train_000000.bin");
  CHECK(shard.at(0) == 1);
  CHECK(shard.at(1) == expected[0]);
  CHECK_THROWS_WITH(llmt::load_tokenizer(dir.file("missing.model")), Catch::Contains("missing.model"));
}
