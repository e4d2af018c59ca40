// The run configuration (src/model/config.{h,cpp}): strict parsing, defaults, derived
// quantities, error messages naming the key path, and load_config with --set overrides.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "test_util.h"
#include "kernels/backend.h"
#include "model/config.h"

namespace fs = std::filesystem;
using llmt::test::TempDir;
using llmt::test::error_of;
using Catch::Matchers::Contains;
using nlohmann::json;

namespace {

// A valid config modelled on configs/tiny/transformer.json, with some optional sections left
// out so that their defaults must be filled in. micro_batch 4 * seq_len 128 = 512 tokens per
// micro-batch, so batch_tokens 2048 is grad_accum 4; tokens 245760 / 2048 = 120 steps;
// warmup 20480 / 2048 = 10 steps.
json valid_config() {
  return json::parse(R"({
    "run_name": "tiny-transformer",
    "model": {
      "type": "transformer", "d_model": 128, "n_layers": 2, "vocab_size": 50257, "tie_embeddings": false,
      "mlp": {"type": "swiglu", "intermediate_size": 512},
      "attn": {"num_heads": 4, "head_dim": 32}
    },
    "train": {
      "tokens": 245760, "batch_tokens": 2048, "seq_len": 128, "micro_batch": 4,
      "lr": 3e-3, "min_lr": 3e-4, "warmup_tokens": 20480, "weight_decay_exclude": ["norm"]
    },
    "data": {"text": "data/some-text.txt"}
  })");
}

std::string parse_error(const json& j) {
  return error_of([&] { llmt::parse_config(j); });
}


}  // namespace

TEST_CASE("config: a valid config parses and its fields are read", "[config]") {
  const llmt::Config c = llmt::parse_config(valid_config());
  CHECK(c.run_name == "tiny-transformer");
  CHECK(c.model.type == "transformer");
  CHECK(c.model.d_model == 128);
  CHECK(c.model.n_layers == 2);
  CHECK(c.model.vocab_size == 50257);
  CHECK_FALSE(c.model.tie_embeddings);
  CHECK(c.model.mlp.intermediate_size == 512);
  CHECK(c.model.attn.num_heads == 4);
  CHECK(c.model.attn.head_dim == 32);
  CHECK(c.train.tokens == 245760);
  CHECK(c.train.batch_tokens == 2048);
  CHECK(c.train.seq_len == 128);
  CHECK(c.train.micro_batch == 4);
  CHECK(c.train.lr == 3e-3);
  CHECK(c.train.min_lr == 3e-4);
  CHECK(c.train.warmup_tokens == 20480);
  CHECK(c.train.weight_decay_exclude == std::vector<std::string>{"norm"});
  CHECK(c.data.text == "data/some-text.txt");
}

TEST_CASE("config: defaults are applied and written into resolved", "[config]") {
  const llmt::Config c = llmt::parse_config(valid_config());
  // The struct fields take the documented defaults.
  CHECK(c.model.norm_eps == 1e-6);
  CHECK(c.model.init_std == 0.02);
  CHECK(c.model.attn.rope_theta == 10000.0);
  CHECK(c.train.lr_schedule == "cosine");
  CHECK(c.train.lr_formula == "flame");
  CHECK(c.train.weight_decay == 0.1);
  CHECK(c.train.beta1 == 0.9);
  CHECK(c.train.beta2 == 0.95);
  CHECK(c.train.eps == 1e-8);
  CHECK(c.train.grad_clip == 1.0);
  CHECK(c.train.skip_nonfinite);
  CHECK_FALSE(c.train.recompute);
  CHECK(c.train.seed == 42u);
  CHECK(c.train.backend == "auto");
  CHECK(c.data.tokenizer == "gpt2");
  CHECK(c.data.val_fraction == 0.1);
  CHECK(c.data.shuffle_seed == 42u);
  CHECK(c.eval.interval_steps == 0);
  CHECK(c.eval.tokens == 2048);  // defaults to train.batch_tokens
  CHECK(c.eval.at_start);
  CHECK(c.checkpoint.interval_steps == 0);
  CHECK(c.checkpoint.keep == 2);
  CHECK(c.log.interval_steps == 1);

  // resolved holds every key, including the defaulted ones and the absent sections.
  const json& r = c.resolved;
  CHECK(r.at("run_name") == "tiny-transformer");
  CHECK(r.at("model").at("d_model") == 128);
  CHECK(r.at("model").at("norm").at("type") == "rmsnorm");
  CHECK(r.at("model").at("norm").at("eps") == 1e-6);
  CHECK(r.at("model").at("init").at("std") == 0.02);
  CHECK(r.at("model").at("attn").at("rope_theta") == 10000.0);
  CHECK(r.at("train").at("lr_formula") == "flame");
  CHECK(r.at("train").at("lr_schedule") == "cosine");
  CHECK(r.at("train").at("weight_decay") == 0.1);
  CHECK(r.at("train").at("betas") == json::array({0.9, 0.95}));
  CHECK(r.at("train").at("eps") == 1e-8);
  CHECK(r.at("train").at("seed") == 42);
  CHECK(r.at("train").at("weight_decay_exclude") == json::array({"norm"}));
  CHECK(r.at("data").at("tokenizer_dir") == "data/tokenizers/gpt2");
  CHECK(r.at("data").at("cache_dir") == "data/cache");
  CHECK(r.at("data").at("train_shard") == "");
  CHECK(r.at("eval").at("tokens") == 2048);
  CHECK(r.at("eval").at("at_start") == true);
  CHECK(r.at("checkpoint").at("keep") == 2);
  CHECK(r.at("log").at("interval_steps") == 1);

  // resolved is itself a valid config that parses to the same values.
  const llmt::Config again = llmt::parse_config(r);
  CHECK(again.resolved == r);
}

TEST_CASE("config: derived steps, warmup_steps and grad_accum", "[config]") {
  const llmt::Config c = llmt::parse_config(valid_config());
  CHECK(c.train.steps() == 120);        // 245760 / 2048
  CHECK(c.train.warmup_steps() == 10);  // 20480 / 2048
  CHECK(c.train.grad_accum() == 4);     // 2048 / (4 * 128)

  json j = valid_config();
  j["train"]["micro_batch"] = 16;       // 2048 / (16 * 128) = 1
  j["train"]["warmup_tokens"] = 0;
  j["train"]["tokens"] = 4096;          // 2 steps
  const llmt::Config d = llmt::parse_config(j);
  CHECK(d.train.grad_accum() == 1);
  CHECK(d.train.warmup_steps() == 0);
  CHECK(d.train.steps() == 2);
}

TEST_CASE("config: explicit values override the defaults", "[config]") {
  json j = valid_config();
  j["model"]["norm"] = {{"type", "rmsnorm"}, {"eps", 1e-5}};
  j["train"]["betas"] = {0.8, 0.99};
  j["train"]["lr_formula"] = "standard";
  j["train"]["seed"] = 7;
  j["eval"] = {{"interval_steps", 20}, {"tokens", 16384}, {"at_start", false}};
  const llmt::Config c = llmt::parse_config(j);
  CHECK(c.model.norm_eps == 1e-5);
  CHECK(c.train.beta1 == 0.8);
  CHECK(c.train.beta2 == 0.99);
  CHECK(c.train.lr_formula == "standard");
  CHECK(c.train.seed == 7u);
  CHECK(c.eval.interval_steps == 20);
  CHECK(c.eval.tokens == 16384);
  CHECK_FALSE(c.eval.at_start);
}

TEST_CASE("config: data may be given as a pair of shards instead of text", "[config]") {
  json j = valid_config();
  j["data"] = {{"train_shard", "a.bin"}, {"val_shard", "b.bin"}};
  const llmt::Config c = llmt::parse_config(j);
  CHECK(c.data.text.empty());
  CHECK(c.data.train_shard == "a.bin");
  CHECK(c.data.val_shard == "b.bin");
}

TEST_CASE("config: unknown keys are rejected naming the key path and the allowed keys", "[config][errors]") {
  SECTION("top level") {
    json j = valid_config();
    j["modle"] = json::object();
    const std::string msg = parse_error(j);
    CHECK_THAT(msg, Contains("unknown key modle"));
    CHECK_THAT(msg, Contains("model") && Contains("train") && Contains("data") && Contains("run_name"));
  }
  SECTION("nested: model.attn.foo") {
    json j = valid_config();
    j["model"]["attn"]["foo"] = 1;
    const std::string msg = parse_error(j);
    CHECK_THAT(msg, Contains("model.attn.foo"));
    CHECK_THAT(msg, Contains("num_heads") && Contains("head_dim") && Contains("rope_theta"));
  }
  SECTION("nested: train.lrr") {
    json j = valid_config();
    j["train"]["lrr"] = 0.1;
    const std::string msg = parse_error(j);
    CHECK_THAT(msg, Contains("train.lrr"));
    CHECK_THAT(msg, Contains("lr_formula") && Contains("min_lr") && Contains("warmup_tokens"));
  }
  SECTION("in a section that is entirely defaulted: log.foo") {
    json j = valid_config();
    j["log"] = {{"foo", 1}};
    CHECK_THAT(parse_error(j), Contains("log.foo") && Contains("interval_steps"));
  }
}

TEST_CASE("config: an unknown key close to an allowed one gets a did-you-mean hint", "[config][errors]") {
  // `key` set to 1 at the path `where` of valid_config(), or of its gdn variant when `gdn`.
  const auto error_for = [](const std::vector<std::string>& where, const std::string& key, bool gdn = false) {
    json j = valid_config();
    if (gdn) {
      j["model"]["type"] = "gdn";
      j["model"].erase("attn");
      j["model"]["gdn"] = {{"num_heads", 2}, {"head_dim", 64}};
    }
    json* node = &j;
    for (const std::string& w : where) node = &(*node)[w];
    (*node)[key] = 1;
    return parse_error(j);
  };
  SECTION("misspellings at every level: one edit, a swap, two edits") {
    CHECK_THAT(error_for({}, "modle"), Contains("unknown key modle (did you mean model?)"));
    CHECK_THAT(error_for({"train"}, "lrr"), Contains("unknown key train.lrr (did you mean train.lr?)"));
    CHECK_THAT(error_for({"model"}, "d_modle"), Contains("unknown key model.d_modle (did you mean model.d_model?)"));
    CHECK_THAT(error_for({"model", "gdn"}, "save_state", true),
               Contains("unknown key model.gdn.save_state (did you mean model.gdn.save_states?)"));
    CHECK_THAT(error_for({"model", "gdn", "init"}, "dt_flor", true), Contains("(did you mean model.gdn.init.dt_floor?)"));
    CHECK_THAT(error_for({"model", "attn"}, "num_head"), Contains("(did you mean model.attn.num_heads?)"));
    CHECK_THAT(error_for({"data"}, "cahce_dri"), Contains("(did you mean data.cache_dir?)"));
    CHECK_THAT(error_for({"eval"}, "interval_step"), Contains("(did you mean eval.interval_steps?)"));
    CHECK_THAT(error_for({"checkpoint"}, "kep"), Contains("(did you mean checkpoint.keep?)"));
  }
  SECTION("case, '_' and '-' differences") {
    CHECK_THAT(error_for({"train"}, "warmupTokens"), Contains("(did you mean train.warmup_tokens?)"));
    CHECK_THAT(error_for({"train"}, "Seq-Len"), Contains("(did you mean train.seq_len?)"));
    CHECK_THAT(error_for({"model"}, "VOCABSIZE"), Contains("(did you mean model.vocab_size?)"));
  }
  SECTION("a key of a section given in another place: the section's key with its path") {
    CHECK_THAT(error_for({}, "lr"), Contains("unknown key lr (did you mean train.lr?)"));
    CHECK_THAT(error_for({}, "learning_rate"), Contains("unknown key learning_rate (did you mean train.lr?)"));
    CHECK_THAT(error_for({}, "d_model"), Contains("unknown key d_model (did you mean model.d_model?)"));
    CHECK_THAT(error_for({}, "d_modle"), Contains("unknown key d_modle (did you mean model?)"));  // closer here
    CHECK_THAT(error_for({}, "Seq-Len"), Contains("(did you mean train.seq_len?)"));
    CHECK_THAT(error_for({}, "interval_steps"),
               Contains("(did you mean checkpoint.interval_steps or eval.interval_steps or log.interval_steps?)"));
    CHECK_THAT(error_for({"model"}, "num_heads"), Contains("(did you mean model.attn.num_heads?)"));
    CHECK_THAT(error_for({}, "zzzz"), !Contains("did you mean"));
  }
  SECTION("names other trainers use, also misspelt") {
    CHECK_THAT(error_for({"train"}, "learning_rate"), Contains("(did you mean train.lr?)"));
    CHECK_THAT(error_for({"train"}, "lerning_rate"), Contains("(did you mean train.lr?)"));
    CHECK_THAT(error_for({"model"}, "hidden_size"), Contains("(did you mean model.d_model?)"));
  }
  SECTION("equally close keys are all named") {
    CHECK_THAT(error_for({"model", "gdn", "init"}, "dt_mix", true),
               Contains("(did you mean model.gdn.init.dt_max or model.gdn.init.dt_min?)"));
  }
  SECTION("no hint for a far-off key; the allowed keys are still listed") {
    for (const auto& [where, key] : std::vector<std::pair<std::vector<std::string>, std::string>>{
             {{"model", "attn"}, "foo"}, {{"train"}, "xy"}, {{"train"}, "momentum"}, {{}, "optimizer"}}) {
      const std::string msg = error_for(where, key);
      CHECK_THAT(msg, Contains("unknown key") && Contains("allowed keys here"));
      CHECK_THAT(msg, !Contains("did you mean"));
    }
  }
  SECTION("a --set override of a misspelt key") {
    TempDir dir;
    const std::string path = dir.write("c.json", valid_config().dump());
    CHECK_THAT(error_of([&] { llmt::load_config(path, {"train.lrr=1"}); }),
               Contains("(did you mean train.lr?)") && Contains("--set train.lrr=1"));
    CHECK_THAT(error_of([&] { llmt::load_config(path, {"modle.d_model=64"}); }), Contains("(did you mean model?)"));
  }
  SECTION("a misspelt required key: the given key that may be it is named") {
    json j = valid_config();
    j["train"]["lerning_rate"] = j["train"]["lr"];
    j["train"].erase("lr");
    CHECK_THAT(parse_error(j), Contains("missing required key train.lr") &&
                                   Contains("(is train.lerning_rate a misspelling of it?)"));
    j = valid_config();
    j["model"]["d_modle"] = j["model"]["d_model"];
    j["model"].erase("d_model");
    CHECK_THAT(parse_error(j), Contains("(is model.d_modle a misspelling of it?)"));
    j = valid_config();
    j["model"].erase("d_model");
    CHECK_THAT(parse_error(j), Contains("missing required key model.d_model") && !Contains("misspelling"));
  }
}

TEST_CASE("config: wrong types are rejected naming the key path", "[config][errors]") {
  SECTION("model.d_model as a string") {
    json j = valid_config();
    j["model"]["d_model"] = "128";
    const std::string msg = parse_error(j);
    CHECK_THAT(msg, Contains("model.d_model") && Contains("integer"));
  }
  SECTION("model.d_model as a fraction") {
    json j = valid_config();
    j["model"]["d_model"] = 128.5;
    CHECK_THAT(parse_error(j), Contains("model.d_model") && Contains("integer"));
  }
  SECTION("train.lr as a string") {
    json j = valid_config();
    j["train"]["lr"] = "3e-3";
    CHECK_THAT(parse_error(j), Contains("train.lr") && Contains("number"));
  }
  SECTION("model.tie_embeddings as a number") {
    json j = valid_config();
    j["model"]["tie_embeddings"] = 1;
    CHECK_THAT(parse_error(j), Contains("model.tie_embeddings") && Contains("true or false"));
  }
  SECTION("train.recompute as a string") {
    json j = valid_config();
    j["train"]["recompute"] = "yes";
    CHECK_THAT(parse_error(j), Contains("train.recompute") && Contains("true or false"));
  }
  SECTION("model.attn not an object") {
    json j = valid_config();
    j["model"]["attn"] = 4;
    CHECK_THAT(parse_error(j), Contains("model.attn") && Contains("object"));
  }
  SECTION("train.betas of the wrong length") {
    json j = valid_config();
    j["train"]["betas"] = {0.9};
    CHECK_THAT(parse_error(j), Contains("train.betas"));
  }
}

TEST_CASE("config: enum values outside the allowed set list the allowed ones", "[config][errors]") {
  SECTION("train.lr_formula") {
    json j = valid_config();
    j["train"]["lr_formula"] = "bogus";
    const std::string msg = parse_error(j);
    CHECK_THAT(msg, Contains("train.lr_formula") && Contains("bogus") && Contains("flame, standard"));
  }
  SECTION("train.weight_decay_exclude") {
    json j = valid_config();
    j["train"]["weight_decay_exclude"] = {"norm", "biases"};
    const std::string msg = parse_error(j);
    CHECK_THAT(msg, Contains("train.weight_decay_exclude") && Contains("biases") &&
                        Contains("bias, norm, embedding, ssm_param"));
  }
}

TEST_CASE("config: batch, token and warmup arithmetic is validated", "[config][errors]") {
  SECTION("batch_tokens not a multiple of micro_batch * seq_len") {
    json j = valid_config();
    j["train"]["micro_batch"] = 3;  // 3 * 128 = 384 does not divide 2048
    const std::string msg = parse_error(j);
    CHECK_THAT(msg, Contains("inconsistent batch"));
    CHECK_THAT(msg, Contains("train.batch_tokens") && Contains("384"));
  }
  SECTION("tokens not a multiple of batch_tokens") {
    json j = valid_config();
    j["train"]["tokens"] = 245760 + 1000;
    const std::string msg = parse_error(j);
    CHECK_THAT(msg, Contains("train.tokens") && Contains("246760") && Contains("2048"));
  }
  SECTION("warmup not whole steps") {
    json j = valid_config();
    j["train"]["warmup_tokens"] = 20480 + 1;
    CHECK_THAT(parse_error(j), Contains("train.warmup_tokens") && Contains("20481"));
  }
  SECTION("warmup as long as the run") {
    json j = valid_config();
    j["train"]["warmup_tokens"] = 245760;
    CHECK_THAT(parse_error(j), Contains("train.warmup_tokens"));
  }
  SECTION("min_lr above lr") {
    json j = valid_config();
    j["train"]["min_lr"] = 1.0;
    CHECK_THAT(parse_error(j), Contains("train.min_lr"));
  }
  SECTION("non-positive batch_tokens") {
    json j = valid_config();
    j["train"]["batch_tokens"] = 0;
    CHECK_THAT(parse_error(j), Contains("train.batch_tokens") && Contains("> 0"));
  }
}

TEST_CASE("config: missing keys, data sources and head_dim", "[config][errors]") {
  SECTION("missing required model.d_model") {
    json j = valid_config();
    j["model"].erase("d_model");
    CHECK_THAT(parse_error(j), Contains("missing required key model.d_model"));
  }
  SECTION("missing required model.attn.num_heads (attn section absent)") {
    json j = valid_config();
    j["model"].erase("attn");
    CHECK_THAT(parse_error(j), Contains("model.attn.num_heads"));
  }
  SECTION("data with neither text nor shards") {
    json j = valid_config();
    j["data"] = json::object();
    const std::string msg = parse_error(j);
    CHECK_THAT(msg, Contains("data.text") && Contains("data.train_shard") && Contains("data.val_shard"));
  }
  SECTION("data with only a train shard") {
    json j = valid_config();
    j["data"] = {{"train_shard", "a.bin"}};
    CHECK_THAT(parse_error(j), Contains("data.val_shard"));
  }
  SECTION("data with both text and shards") {
    json j = valid_config();
    j["data"]["train_shard"] = "a.bin";
    j["data"]["val_shard"] = "b.bin";
    CHECK_THAT(parse_error(j), Contains("exclusive"));
  }
  SECTION("odd head_dim") {
    json j = valid_config();
    j["model"]["attn"]["head_dim"] = 33;
    CHECK_THAT(parse_error(j), Contains("model.attn.head_dim") && Contains("even") && Contains("33"));
  }
}

TEST_CASE("load_config: files, syntax errors and --set overrides", "[config][load]") {
  TempDir dir;
  const std::string good = dir.write("good.json", valid_config().dump(2));

  SECTION("a valid file loads") {
    const llmt::Config c = llmt::load_config(good);
    CHECK(c.model.d_model == 128);
    CHECK(c.train.steps() == 120);
  }
  SECTION("a missing file names the file") {
    const std::string missing = (dir.path / "nope.json").string();
    CHECK_THAT(error_of([&] { llmt::load_config(missing); }), Contains(missing));
  }
  SECTION("a JSON syntax error names the file and the line") {
    const std::string bad = dir.write("bad.json", "{\n  \"run_name\": \"x\",\n  ,\n}\n");
    const std::string msg = error_of([&] { llmt::load_config(bad); });
    CHECK_THAT(msg, Contains(bad));
    CHECK_THAT(msg, Contains("line 3"));
  }
  SECTION("a validation error names the file too") {
    json j = valid_config();
    j["model"]["attn"]["foo"] = 1;
    const std::string path = dir.write("unknown.json", j.dump());
    const std::string msg = error_of([&] { llmt::load_config(path); });
    CHECK_THAT(msg, Contains("model.attn.foo") && Contains(path));
  }
  SECTION("--set overrides: numbers, nested keys, bare-word strings") {
    const llmt::Config c =
        llmt::load_config(good, {"train.lr=0.001", "model.attn.num_heads=8", "run_name=abc",
                                 "train.lr_formula=standard", "model.tie_embeddings=true"});
    CHECK(c.train.lr == 0.001);
    CHECK(c.model.attn.num_heads == 8);
    CHECK(c.run_name == "abc");
    CHECK(c.train.lr_formula == "standard");
    CHECK(c.model.tie_embeddings);
    CHECK(c.resolved.at("train").at("lr") == 0.001);
    CHECK(c.resolved.at("run_name") == "abc");
    // untouched keys keep the file's values
    CHECK(c.model.attn.head_dim == 32);
    CHECK(c.train.min_lr == 3e-4);
  }
  SECTION("--set may fill a key of a section absent from the file") {
    const llmt::Config c = llmt::load_config(good, {"model.norm.eps=1e-5", "log.interval_steps=5"});
    CHECK(c.model.norm_eps == 1e-5);
    CHECK(c.log.interval_steps == 5);
  }
  SECTION("a later --set wins") {
    const llmt::Config c = llmt::load_config(good, {"train.lr=0.001", "train.lr=0.002"});
    CHECK(c.train.lr == 0.002);
  }
  SECTION("--set of a nonexistent key names it") {
    const std::string msg = error_of([&] { llmt::load_config(good, {"train.lrr=1"}); });
    CHECK_THAT(msg, Contains("train.lrr"));
  }
  SECTION("--set with a wrong type names the key") {
    const std::string msg = error_of([&] { llmt::load_config(good, {"model.d_model=big"}); });
    CHECK_THAT(msg, Contains("model.d_model"));
  }
  SECTION("--set without '=' is rejected") {
    CHECK_THAT(error_of([&] { llmt::load_config(good, {"train.lr"}); }), Contains("train.lr"));
  }
}

TEST_CASE("config: messages point at the fix", "[config][errors]") {
  SECTION("a misspelt required key: the keys that were given are listed") {
    json j = valid_config();
    j["model"]["dmodel"] = j["model"]["d_model"];
    j["model"].erase("d_model");
    CHECK_THAT(parse_error(j), Contains("missing required key model.d_model") && Contains("dmodel"));
  }
  SECTION("warmup as long as the run: the key to lower is named") {
    json j = valid_config();
    j["train"]["warmup_tokens"] = j["train"]["tokens"];
    CHECK_THAT(parse_error(j), Contains("--set train.warmup_tokens="));
  }
  SECTION("a vocabulary smaller than the tokenizer's") {
    json j = valid_config();
    j["model"]["vocab_size"] = 1000;
    CHECK_THAT(parse_error(j), Contains("model.vocab_size (1000)") && Contains("50257"));
  }
  SECTION("an error caused by --set names the override, not only the file") {
    TempDir dir;
    const std::string path = dir.write("c.json", valid_config().dump());
    const std::string msg = error_of([&] { llmt::load_config(path, {"train.lr=-1"}); });
    CHECK_THAT(msg, Contains("train.lr") && Contains("--set train.lr=-1"));
  }
}

TEST_CASE("config: mixer blocks", "[config]") {
  SECTION("a gdn model reads model.gdn with its defaults") {
    json j = valid_config();
    j["model"]["type"] = "gdn";
    j["model"].erase("attn");
    j["model"]["gdn"] = {{"num_heads", 6}, {"head_dim", 128}};
    const llmt::Config c = llmt::parse_config(j);
    CHECK(c.model.gdn.expand_v == 2);
    CHECK(c.model.gdn.value_dim() == 256);
    CHECK(c.model.gdn.conv_size == 4);
    CHECK(c.model.gdn.chunk_size == 64);
    CHECK(c.model.gdn.output_gate == "swish");
    CHECK(c.model.gdn.A_max == 16.0);
    CHECK(c.resolved["model"]["gdn"]["init"]["dt_floor"] == 1e-4);
  }
  SECTION("a comba model reads model.comba with its defaults (runs.md 4.1, layers-delta.md 3.2-3.3)") {
    json j = valid_config();
    j["model"]["type"] = "comba";
    j["model"].erase("attn");
    j["model"]["comba"] = {{"num_heads", 6}, {"head_dim", 128}};
    const llmt::Config c = llmt::parse_config(j);
    const llmt::CombaConfig& cc = c.model.comba;
    CHECK(cc.expand_v == 2);
    CHECK(cc.value_dim() == 256);
    CHECK(cc.conv_size == 4);
    CHECK(cc.chunk_size == 64);
    CHECK(cc.output_gate == "sigmoid");
    CHECK(cc.output_correction);
    CHECK(cc.correction_factor == 1.0);
    CHECK(cc.inner_decay);
    CHECK(cc.decay_init == 1.0);
    CHECK(cc.A_min == 0.0);
    CHECK(cc.A_max == 16.0);
    CHECK(c.resolved["model"]["comba"]["output_gate"] == "sigmoid");
    CHECK(c.resolved["model"]["comba"]["correction_factor"] == 1.0);
    CHECK(c.resolved["model"]["comba"]["init"]["decay"] == 1.0);
    CHECK(c.resolved["model"]["comba"]["init"]["dt_floor"] == 1e-4);
  }
  SECTION("a kda model reads model.kda with KDA's defaults (layers-delta.md 3.2-3.3, 4.3)") {
    json j = valid_config();
    j["model"]["type"] = "kda";
    j["model"].erase("attn");
    j["model"]["kda"] = {{"num_heads", 8}, {"head_dim", 128}};
    const llmt::Config c = llmt::parse_config(j);
    const llmt::KdaConfig& kc = c.model.kda;
    CHECK(kc.expand_v == 1);
    CHECK(kc.value_dim() == 128);
    CHECK(kc.conv_size == 4);
    CHECK(kc.chunk_size == 64);
    CHECK(kc.output_gate == "sigmoid");
    CHECK(kc.A_min == 1.0);
    CHECK(kc.A_max == 16.0);
    CHECK(kc.dt_min == 1e-3);
    CHECK(kc.dt_max == 0.1);
    CHECK(c.resolved["model"]["kda"]["init"]["A_range"] == json::array({1.0, 16.0}));
    CHECK(c.resolved["model"]["kda"]["expand_v"] == 1);
    CHECK(c.model.mixer_of(0) == "kda");
  }
  SECTION("gdn, comba and kda read save_states (a bool, default true); the mdn has save_residuals instead") {
    for (const char* type : {"gdn", "comba", "kda"}) {
      INFO(type);
      json j = valid_config();
      j["model"]["type"] = type;
      j["model"].erase("attn");
      j["model"][type] = {{"num_heads", 2}, {"head_dim", 64}};
      const auto states = [&](const llmt::Config& c) {
        const std::string t = type;
        return t == "gdn" ? c.model.gdn.save_states : t == "comba" ? c.model.comba.save_states
                                                                   : c.model.kda.save_states;
      };
      const llmt::Config c = llmt::parse_config(j);
      CHECK(states(c));
      CHECK(c.resolved["model"][type]["save_states"] == true);
      j["model"][type]["save_states"] = false;
      CHECK_FALSE(states(llmt::parse_config(j)));
      j["model"][type]["save_states"] = "no";
      CHECK_THAT(parse_error(j),
                 Contains(std::string("model.") + type + ".save_states") && Contains("true or false"));
    }
    json j = valid_config();
    j["model"]["type"] = "mdn";
    j["model"].erase("attn");
    j["model"]["mdn"] = {{"num_heads", 2}, {"head_dim", 64}, {"save_states", false}};
    CHECK_THAT(parse_error(j), Contains("model.mdn.save_states"));
  }
  SECTION("an mdn model reads model.mdn with MDN's defaults (mdn.md 2-4, runs.md 4.1)") {
    json j = valid_config();
    j["model"]["type"] = "mdn";
    j["model"].erase("attn");
    j["model"]["mdn"] = {{"num_heads", 6}, {"head_dim", 128}};
    const llmt::Config c = llmt::parse_config(j);
    const llmt::MdnConfig& mc = c.model.mdn;
    CHECK(mc.expand_v == 2);
    CHECK(mc.output_gate == "sigmoid");
    CHECK(mc.min_log_mu == -2.0);
    CHECK(mc.tau_factor == 1.0);
    CHECK(mc.output_correction);
    CHECK(mc.alpha_max);
    CHECK(mc.beta_max);
    CHECK(mc.eta == "tanh");
    CHECK(mc.momentum);
    CHECK(mc.A_min == 0.0);
    CHECK(mc.mu_A_max == 16.0);
    CHECK(mc.mu_bias_init == "copy_dt_bias");
    CHECK(mc.log_factor_init == "log_uniform_0_4");
    CHECK(mc.D_log_init == "log_uniform_0_1");
    CHECK(mc.save_residuals);
    CHECK(c.resolved["model"]["mdn"]["save_residuals"] == true);
    CHECK(c.resolved["model"]["mdn"]["init"]["mu_A_range"] == json::array({0.0, 16.0}));
    CHECK(c.resolved["model"]["mdn"]["min_log_mu"] == -2.0);
    CHECK(c.resolved["model"]["mdn"]["alpha_max"] == true);
    CHECK(c.model.mixer_of(0) == "mdn");
  }
  SECTION("model.mdn ablation switches and init choices are read and checked") {
    json j = valid_config();
    j["model"]["type"] = "mdn";
    j["model"].erase("attn");
    j["model"]["mdn"] = {{"num_heads", 6},        {"head_dim", 128},      {"min_log_mu", -1.357},
                         {"tau_factor", 8},       {"alpha_max", false},   {"beta_max", false},
                         {"eta", "two_sigmoid"},  {"momentum", false},    {"output_correction", false},
                         {"save_residuals", false},
                         {"init", {{"log_factor", "zero"}, {"D_log", "zero"}, {"mu_bias", "independent"}}}};
    const llmt::MdnConfig mc = llmt::parse_config(j).model.mdn;
    CHECK(mc.min_log_mu == -1.357);
    CHECK(mc.tau_factor == 8.0);
    CHECK_FALSE(mc.alpha_max);
    CHECK_FALSE(mc.beta_max);
    CHECK(mc.eta == "two_sigmoid");
    CHECK_FALSE(mc.momentum);
    CHECK_FALSE(mc.output_correction);
    CHECK(mc.log_factor_init == "zero");
    CHECK(mc.D_log_init == "zero");
    CHECK(mc.mu_bias_init == "independent");
    CHECK_FALSE(mc.save_residuals);
    j["model"]["mdn"]["save_residuals"] = "yes";
    CHECK_THAT(parse_error(j), Contains("model.mdn.save_residuals") && Contains("true or false"));
    j["model"]["mdn"]["save_residuals"] = true;
    for (const json& bad : {json("false"), json(0)}) {  // a string, a number: not booleans
      j["model"]["mdn"]["alpha_max"] = bad;
      CHECK_THAT(parse_error(j), Contains("model.mdn.alpha_max") && Contains("true or false"));
    }
    j["model"]["mdn"]["alpha_max"] = false;
    j["model"]["mdn"]["min_log_mu"] = 0.5;
    CHECK_THAT(parse_error(j), Contains("model.mdn.min_log_mu"));
    j["model"]["mdn"]["min_log_mu"] = -1.0;
    j["model"]["mdn"]["eta"] = "sigmoid";
    CHECK_THAT(parse_error(j), Contains("model.mdn.eta"));
    j["model"]["mdn"]["eta"] = "tanh";
    j["model"]["mdn"]["correction_factor"] = 1.0;  // a Comba key
    CHECK_THAT(parse_error(j), Contains("model.mdn.correction_factor"));
  }
  SECTION("Comba-only keys are not KDA keys") {
    json j = valid_config();
    j["model"]["type"] = "kda";
    j["model"].erase("attn");
    j["model"]["kda"] = {{"num_heads", 8}, {"head_dim", 128}, {"correction_factor", 1.0}};
    CHECK_THAT(parse_error(j), Contains("model.kda.correction_factor"));
  }
  SECTION("model.comba switches and init values are read") {
    json j = valid_config();
    j["model"]["type"] = "comba";
    j["model"].erase("attn");
    j["model"]["comba"] = {{"num_heads", 2},
                           {"head_dim", 16},
                           {"output_correction", false},
                           {"correction_factor", 0.02},
                           {"inner_decay", false},
                           {"output_gate", "swish"},
                           {"init", {{"decay", 0.5}}}};
    const llmt::CombaConfig cc = llmt::parse_config(j).model.comba;
    CHECK_FALSE(cc.output_correction);
    CHECK(cc.correction_factor == 0.02);
    CHECK_FALSE(cc.inner_decay);
    CHECK(cc.output_gate == "swish");
    CHECK(cc.decay_init == 0.5);
  }
  SECTION("Comba-only keys are not GDN keys") {
    json j = valid_config();
    j["model"]["type"] = "gdn";
    j["model"].erase("attn");
    j["model"]["gdn"] = {{"num_heads", 6}, {"head_dim", 128}, {"inner_decay", true}};
    CHECK_THAT(parse_error(j), Contains("model.gdn.inner_decay"));
  }
  SECTION("a block for a mixer the model does not use is refused") {
    json j = valid_config();
    j["model"]["gdn"] = {{"num_heads", 6}, {"head_dim", 128}};
    CHECK_THAT(parse_error(j), Contains("model.gdn is given but no layer uses it (model.type is \"transformer\""));
    json k = valid_config();
    k["model"]["type"] = "gdn";
    k["model"].erase("attn");
    k["model"]["gdn"] = {{"num_heads", 6}, {"head_dim", 128}};
    k["model"]["comba"] = {{"num_heads", 6}, {"head_dim", 128}};
    CHECK_THAT(parse_error(k), Contains("model.comba is given but no layer uses it (model.type is \"gdn\""));
  }
  SECTION("the used mixer's block is required") {
    json j = valid_config();
    j["model"]["type"] = "gdn";
    j["model"].erase("attn");
    CHECK_THAT(parse_error(j), Contains("model.gdn"));
    j["model"]["type"] = "comba";
    CHECK_THAT(parse_error(j), Contains("model.comba"));
    j["model"]["type"] = "kda";
    CHECK_THAT(parse_error(j), Contains("model.kda"));
  }
}

TEST_CASE("config: mamba2 block, mixer-only blocks and the out_proj rescale", "[config][mamba2]") {
  json j = valid_config();
  j["model"]["type"] = "mamba2";
  j["model"].erase("attn");
  j["model"]["mlp"] = nullptr;
  j["model"]["mamba2"] = json::object();
  j["model"]["init"] = {{"residual_rescale", "kaiming_div_sqrt"}};
  const llmt::Config c = llmt::parse_config(j);
  const llmt::Mamba2Config& m = c.model.mamba2;
  CHECK_FALSE(c.model.has_mlp);
  CHECK(c.resolved["model"]["mlp"].is_null());
  CHECK(m.expand == 2);
  CHECK(m.head_dim == 64);
  CHECK(m.d_state == 128);
  CHECK(m.n_groups == 1);
  CHECK(m.conv_size == 4);
  CHECK(m.conv_bias);
  CHECK(m.chunk_size == 256);
  CHECK(m.dt_floor == 1e-4);
  CHECK(m.init_style == "fla_mdn");
  CHECK(c.model.residual_rescale == "kaiming_div_sqrt");
  CHECK(c.model.residual_rescale_n == c.model.n_layers);
  SECTION("head_dim must divide expand * d_model") {
    j["model"]["mamba2"]["head_dim"] = 7;
    CHECK_THAT(parse_error(j), Catch::Contains("model.mamba2.head_dim"));
  }
  SECTION("init_style names the allowed styles") {
    j["model"]["mamba2"]["init_style"] = "random";
    CHECK_THAT(parse_error(j), Catch::Contains("model.mamba2.init_style") && Catch::Contains("zeros_like_skipped"));
  }
  SECTION("n_groups must divide the heads") {
    j["model"]["mamba2"]["head_dim"] = static_cast<int64_t>(j["model"]["d_model"]) * 2;  // one head
    j["model"]["mamba2"]["n_groups"] = 2;
    CHECK_THAT(parse_error(j), Catch::Contains("model.mamba2.n_groups"));
  }
  SECTION("the rescale is refused for mixers that do not implement it") {
    json g = valid_config();
    g["model"]["init"] = {{"residual_rescale", "kaiming_div_sqrt"}};
    CHECK_THAT(parse_error(g), Catch::Contains("model.init.residual_rescale"));
  }
  SECTION("model.mamba2 without model.type mamba2 is an error") {
    json g = valid_config();
    g["model"]["mamba2"] = json::object();
    CHECK_THAT(parse_error(g), Catch::Contains("model.mamba2"));
  }
}

TEST_CASE("config: mamba3 block, its defaults and its checks", "[config][mamba3]") {
  json j = valid_config();
  j["model"]["type"] = "mamba3";
  j["model"].erase("attn");
  j["model"]["mamba3"] = json::object();
  j["model"]["init"] = {{"residual_rescale", "kaiming_div_sqrt"}, {"residual_rescale_n", 8}};
  const llmt::Config c = llmt::parse_config(j);
  const llmt::Mamba3Config& m = c.model.mamba3;
  CHECK(m.expand == 2);
  CHECK(m.head_dim == 64);
  CHECK(m.d_state == 128);
  CHECK(m.n_groups == 1);
  CHECK(m.mimo_rank == 1);
  CHECK(m.chunk_size == 64);
  CHECK(m.rope_fraction == 0.5);
  CHECK(m.num_angles() == 32);
  CHECK(m.A_floor == 1e-4);
  CHECK(m.A_act == "softplus");
  CHECK_FALSE(m.outproj_norm);
  CHECK(m.bc_bias_init == 1.0);
  CHECK(m.init_style == "mamba_ssm");
  CHECK(m.save_states);
  CHECK(c.resolved["model"]["mamba3"]["save_states"] == true);
  CHECK(c.model.residual_rescale_n == 8);
  SECTION("save_states is a bool") {
    j["model"]["mamba3"]["save_states"] = false;
    CHECK_FALSE(llmt::parse_config(j).model.mamba3.save_states);
    j["model"]["mamba3"]["save_states"] = "yes";
    CHECK_THAT(parse_error(j), Catch::Contains("model.mamba3.save_states") && Catch::Contains("true or false"));
  }
  SECTION("an unknown key is named with the allowed keys") {
    j["model"]["mamba3"]["rank"] = 4;
    CHECK_THAT(parse_error(j), Catch::Contains("model.mamba3.rank") && Catch::Contains("mimo_rank"));
  }
  SECTION("A_act and init_style name their allowed values") {
    j["model"]["mamba3"]["A_act"] = "exp";
    CHECK_THAT(parse_error(j), Catch::Contains("model.mamba3.A_act") && Catch::Contains("heavy_tail"));
    j["model"]["mamba3"]["A_act"] = "heavy_tail";
    j["model"]["mamba3"]["init_style"] = "fla_mdn";
    CHECK_THAT(parse_error(j), Catch::Contains("model.mamba3.init_style") && Catch::Contains("mamba_ssm"));
  }
  SECTION("rope_fraction is 0.5 or 1.0; A_floor > 0; head_dim divides Di") {
    j["model"]["mamba3"]["rope_fraction"] = 0.25;
    CHECK_THAT(parse_error(j), Catch::Contains("model.mamba3.rope_fraction"));
    j["model"]["mamba3"]["rope_fraction"] = 1.0;
    j["model"]["mamba3"]["A_floor"] = 0;
    CHECK_THAT(parse_error(j), Catch::Contains("model.mamba3.A_floor"));
    j["model"]["mamba3"]["A_floor"] = 1e-4;
    j["model"]["mamba3"]["head_dim"] = 7;
    CHECK_THAT(parse_error(j), Catch::Contains("model.mamba3.head_dim"));
  }
  SECTION("MIMO needs an even d_state") {
    j["model"]["mamba3"]["mimo_rank"] = 4;
    j["model"]["mamba3"]["d_state"] = 7;
    CHECK_THAT(parse_error(j), Catch::Contains("model.mamba3.d_state"));
  }
  SECTION("model.mamba3 without model.type mamba3 is an error") {
    json g = valid_config();
    g["model"]["mamba3"] = json::object();
    CHECK_THAT(parse_error(g), Catch::Contains("model.mamba3"));
  }
}

TEST_CASE("config: hybrid attention layers", "[config][hybrid]") {
  json j = valid_config();
  j["model"]["type"] = "gdn";
  j["model"]["gdn"] = {{"num_heads", 2}, {"head_dim", 64}};
  j["model"]["n_layers"] = 4;
  SECTION("attn_layers select the attention layers, model.attn gives their shape") {
    j["model"]["attn_layers"] = {1, 3};
    const llmt::Config c = llmt::parse_config(j);
    CHECK(c.model.mixer_of(0) == "gdn");
    CHECK(c.model.mixer_of(1) == "transformer");
    CHECK(c.model.mixer_of(3) == "transformer");
    CHECK(c.model.attn.num_heads == 4);
  }
  SECTION("without attention layers model.attn is refused") {
    CHECK_THAT(parse_error(j), Contains("model.attn is given but no layer uses it"));
  }
  SECTION("an index outside the model is refused") {
    j["model"]["attn_layers"] = {1, 4};
    CHECK_THAT(parse_error(j), Contains("model.attn_layers") && Contains("[0, 4)"));
  }
  SECTION("a repeated index is refused") {
    j["model"]["attn_layers"] = {2, 2};
    CHECK_THAT(parse_error(j), Contains("distinct"));
  }
}

TEST_CASE("config: train.precision resolves per backend; bf16 on the CPU names the key", "[config]") {
  const auto be = llmt::make_cpu_backend();
  CHECK(llmt::compute_dtype_for("auto", *be) == llmt::DType::f32);
  CHECK(llmt::compute_dtype_for("fp32", *be) == llmt::DType::f32);
  CHECK_THROWS_WITH(llmt::compute_dtype_for("bf16", *be),
                    Catch::Contains("train.precision") && Catch::Contains("cuda") && Catch::Contains("fp32"));
  CHECK_THROWS_WITH(llmt::compute_dtype_for("fp16", *be), Catch::Contains("auto, fp32, bf16"));
}
