// The trainer end to end on a tiny model and the bundled text: resuming from a checkpoint
// reproduces the uninterrupted run bit for bit; run directories and checkpoints fail loudly.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/prepare_data.h"
#include "model/config.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "test_util.h"

using namespace llmt;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using llmt::test::read_bytes;
using llmt::test::read_metrics;
using llmt::test::TempDir;

namespace {

/// 10 steps of 2 x 2 windows of 16 tokens, a checkpoint every 5 steps.
Config tiny_config(const fs::path& cache) {
  nlohmann::json j = {
      {"run_name", "trainer-test"},
      {"model",
       {{"type", "transformer"}, {"d_model", 16}, {"n_layers", 1}, {"vocab_size", 50257},
        {"mlp", {{"intermediate_size", 32}}}, {"attn", {{"num_heads", 2}, {"head_dim", 8}}}}},
      {"train",
       {{"tokens", 640}, {"batch_tokens", 64}, {"seq_len", 16}, {"micro_batch", 2}, {"lr", 1e-2},
        {"min_lr", 1e-3}, {"warmup_tokens", 128}, {"backend", "cpu"}}},
      {"data", {{"text", "data/fineweb-edu-sample10BT-head.part1.txt"}, {"cache_dir", cache.string()}}},
      {"eval", {{"interval_steps", 5}, {"tokens", 64}}},
      {"checkpoint", {{"interval_steps", 5}, {"keep", 3}}},
      {"log", {{"interval_steps", 100}}},
  };
  return parse_config(j);
}

}  // namespace

#ifdef LLMT_HAVE_PCRE2
TEST_CASE("trainer: trains from a prepare-data directory and resumes exactly", "[trainer][dataset]") {
  const TempDir tmp;
  const fs::path root = tmp.path;
  llmt::PrepareOptions po;
  po.inputs = {"tests/fixtures/slimpajama_derived.jsonl.zst"};
  po.tokenizer = "gpt2";
  po.out_dir = (root / "ds").string();
  po.val_fraction = 0.1;
  po.shard_tokens = 10000;  // several shards
  po.progress = false;
  llmt::prepare_data(po);
  nlohmann::json j = tiny_config(root / "cache").resolved;
  j["data"] = {{"dataset", po.out_dir}, {"tokenizer", "gpt2"}};
  const Config config = parse_config(j);
  Trainer(config, (root / "straight").string(), false).run();
  Trainer(config, (root / "resumed").string(), false).run(5);
  Trainer(config, (root / "resumed").string(), true).run();
  const auto a = read_metrics(root / "straight"), b = read_metrics(root / "resumed");
  REQUIRE(a.size() == 11);
  REQUIRE(b.size() == a.size());
  for (size_t i = 1; i < a.size(); ++i) CHECK(a[i]["loss"].get<double>() == b[i]["loss"].get<double>());
  CHECK(a.back()["loss"].get<double>() < a[1]["loss"].get<double>());
  // A dataset made with another tokenizer is refused, naming dataset.json and the key.
  j["data"]["tokenizer"] = "llama3";
  j["model"]["vocab_size"] = 128256;
  CHECK_THROWS_WITH(Trainer(parse_config(j), (root / "other").string(), false),
                    Contains("dataset.json") && Contains("tokenizer.name"));
}
#endif

TEST_CASE("trainer: stop at k and resume reproduces the uninterrupted run bit for bit", "[trainer]") {
  const TempDir tmp;
  const fs::path root = tmp.path;
  const Config config = tiny_config(root / "cache");

  Trainer(config, (root / "straight").string(), false).run();
  Trainer(config, (root / "resumed").string(), false).run(5);
  {
    Trainer resumed(config, (root / "resumed").string(), true);
    CHECK(resumed.state().step == 5);
    resumed.run();
  }

  const auto a = read_metrics(root / "straight"), b = read_metrics(root / "resumed");
  REQUIRE(a.size() == 11);  // the evaluation at step 0, then steps 1..10
  REQUIRE(b.size() == a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("line " << i);
    CHECK(a[i]["step"] == b[i]["step"]);
    if (a[i].contains("loss")) {
      CHECK(a[i]["loss"].get<double>() == b[i]["loss"].get<double>());
      CHECK(a[i]["grad_norm"].get<double>() == b[i]["grad_norm"].get<double>());
      CHECK(a[i]["lr"].get<double>() == b[i]["lr"].get<double>());
    }
    CHECK(a[i].contains("val_loss") == b[i].contains("val_loss"));
    if (a[i].contains("val_loss")) CHECK(a[i]["val_loss"].get<double>() == b[i]["val_loss"].get<double>());
  }
  // Training did something: the loss fell from the first to the last step.
  CHECK(a.back()["loss"].get<double>() < a[1]["loss"].get<double>() - 0.05);
  // Final weights and moments are byte-identical.
  const fs::path ca = latest_checkpoint((root / "straight").string()), cb = latest_checkpoint((root / "resumed").string());
  CHECK(ca.filename() == "step_00000010");
  CHECK(read_bytes((ca / "model.safetensors").string()) == read_bytes((cb / "model.safetensors").string()));
  CHECK(read_bytes((ca / "optimizer.safetensors").string()) == read_bytes((cb / "optimizer.safetensors").string()));
}

TEST_CASE("trainer: run directories and checkpoints fail loudly and lose nothing", "[trainer]") {
  const TempDir tmp;
  const fs::path root = tmp.path;
  const Config config = tiny_config(root / "cache");
  const fs::path run = root / "run";
  Trainer(config, run.string(), false).run(5);
  const fs::path ckpt = latest_checkpoint(run.string());
  REQUIRE(ckpt.filename() == "step_00000005");

  SECTION("a second fresh start into the same directory is refused") {
    CHECK_THROWS_WITH(Trainer(config, run.string(), false), Contains("--resume"));
  }
  SECTION("a half-written checkpoint (temporary name) is ignored") {
    fs::create_directories(run / "checkpoints" / ".tmp-step_00000009");
    CHECK(latest_checkpoint(run.string()) == ckpt.string());
  }
  SECTION("a truncated model.safetensors names the file and says truncated") {
    const fs::path f = ckpt / "model.safetensors";
    fs::resize_file(f, fs::file_size(f) - 100);
    CHECK_THROWS_WITH(Trainer(config, run.string(), true),
                      Contains("model.safetensors") && Contains("truncated") &&
                          Contains("move step_00000005 out of " + run.string() + "/checkpoints"));
  }
  SECTION("a different model config is refused on resume, naming the key") {
    Config other = config;
    other.model.d_model = 32;
    other.resolved["model"]["d_model"] = 32;
    CHECK_THROWS_WITH(Trainer(other, run.string(), true), Contains("model.d_model"));
  }
  SECTION("--resume in an empty directory starts from step 0") {
    Trainer t(config, (root / "empty").string(), true);
    CHECK(t.state().step == 0);
  }
}

TEST_CASE("trainer: a non-finite gradient norm skips the update, the schedule advances", "[trainer]") {
  const TempDir tmp;
  const fs::path root = tmp.path;
  Config config = tiny_config(root / "cache");
  config.train.lr = 1e30;  // the first update blows the weights up; later gradients are not finite
  config.train.min_lr = 1e29;
  Trainer trainer(config, (root / "run").string(), false);
  trainer.run();
  const auto m = read_metrics(root / "run");
  REQUIRE(m.size() == 11);
  CHECK_FALSE(m[1].contains("skipped"));  // step 1 itself was finite
  int64_t skipped = 0;
  for (size_t i = 2; i < m.size(); ++i) {
    INFO("step " << m[i]["step"]);
    // nlohmann writes NaN/Inf as null
    CHECK(m[i]["grad_norm"].is_null());
    CHECK(m[i].value("skipped", false));
    skipped += m[i].value("skipped", false) ? 1 : 0;
  }
  CHECK(trainer.state().skipped_steps == skipped);
  CHECK(trainer.state().step == 10);
  CHECK(m[10]["lr"].get<double>() < m[3]["lr"].get<double>());  // the cosine went on
}

TEST_CASE("trainer: resume refuses a changed schedule but accepts another log cadence", "[trainer]") {
  const TempDir tmp;
  const Config config = tiny_config(tmp.path / "cache");
  const fs::path run = tmp.path / "run";
  Trainer(config, run.string(), false).run(5);

  Config longer = config;
  longer.resolved["train"]["tokens"] = 1280;
  CHECK_THROWS_WITH(Trainer(longer, run.string(), true),
                    Contains("train.tokens is 1280 in the config but 640 in the checkpoint"));
  Config chatty = config;
  chatty.resolved["log"]["interval_steps"] = 1;
  Trainer resumed(chatty, run.string(), true);
  CHECK(resumed.state().step == 5);

  // A checkpoint from before data.source existed resumes with the default source (token streams) only.
  const fs::path state = run / "checkpoints" / "step_00000005" / "state.json";
  nlohmann::json st = nlohmann::json::parse(std::ifstream(state));
  REQUIRE(st["config"]["data"]["source"] == "tokens");
  st["config"]["data"].erase("source");
  std::ofstream(state) << st.dump();
  CHECK(Trainer(config, run.string(), true).state().step == 5);
  Config synthetic = config;
  synthetic.resolved["data"]["source"] = "parity";
  CHECK_THROWS_WITH(Trainer(synthetic, run.string(), true),
                    Contains("data.source is \"parity\" in the config but absent in the checkpoint"));
}

TEST_CASE("trainer: an MDN checkpoint from before model.mdn.alpha_max resumes only with alpha_max true",
          "[trainer][mdn]") {
  // check_resume_config reads only state.json: a hand-written one with the resolved config minus the new key.
  const TempDir tmp;
  const Config config = load_config("configs/tiny/mdn.json");
  nlohmann::json saved = config.resolved;
  REQUIRE(saved["model"]["mdn"]["alpha_max"] == true);
  saved["model"]["mdn"].erase("alpha_max");
  std::ofstream(tmp.path / "state.json") << nlohmann::json{{"config", saved}}.dump();
  CHECK_NOTHROW(check_resume_config(tmp.path.string(), config.resolved));
  const Config ablation = load_config("configs/tiny/mdn.json", {"model.mdn.alpha_max=false"});
  CHECK_THROWS_WITH(check_resume_config(tmp.path.string(), ablation.resolved),
                    Contains("model.mdn.alpha_max is false in the config but absent in the checkpoint"));
}

TEST_CASE("trainer: a Gated DeltaNet model trains on the bundled text", "[trainer][gdn]") {
  const TempDir tmp;
  nlohmann::json j = tiny_config(tmp.path / "cache").resolved;
  j["model"].erase("attn");
  j["model"]["type"] = "gdn";
  j["model"]["gdn"] = {{"num_heads", 2}, {"head_dim", 8}, {"chunk_size", 8}};
  Trainer trainer(parse_config(j), (tmp.path / "run").string(), false);
  trainer.run();
  const auto m = read_metrics(tmp.path / "run");
  REQUIRE(m.size() == 11);
  // 64-token batches make single-step training losses noisy; the validation windows are fixed,
  // so their loss measures learning without sampling noise.
  CHECK(m.back()["val_loss"].get<double>() < m[0]["val_loss"].get<double>() - 0.02);
}

TEST_CASE("trainer: a Comba model trains on the bundled text", "[trainer][comba]") {
  const TempDir tmp;
  nlohmann::json j = tiny_config(tmp.path / "cache").resolved;
  j["model"].erase("attn");
  j["model"]["type"] = "comba";
  j["model"]["comba"] = {{"num_heads", 2}, {"head_dim", 8}, {"chunk_size", 8}};
  Trainer trainer(parse_config(j), (tmp.path / "run").string(), false);
  trainer.run();
  const auto m = read_metrics(tmp.path / "run");
  REQUIRE(m.size() == 11);
  // 64-token batches make single-step training losses noisy; the validation windows are fixed,
  // so their loss measures learning without sampling noise.
  CHECK(m.back()["val_loss"].get<double>() < m[0]["val_loss"].get<double>() - 0.02);
}

TEST_CASE("trainer: a KDA model trains on the bundled text", "[trainer][kda]") {
  const TempDir tmp;
  nlohmann::json j = tiny_config(tmp.path / "cache").resolved;
  j["model"].erase("attn");
  j["model"]["type"] = "kda";
  j["model"]["kda"] = {{"num_heads", 2}, {"head_dim", 8}, {"chunk_size", 8}};
  Trainer trainer(parse_config(j), (tmp.path / "run").string(), false);
  trainer.run();
  const auto m = read_metrics(tmp.path / "run");
  REQUIRE(m.size() == 11);
  // 64-token batches make single-step training losses noisy; the validation windows are fixed,
  // so their loss measures learning without sampling noise.
  CHECK(m.back()["val_loss"].get<double>() < m[0]["val_loss"].get<double>() - 0.02);
}
