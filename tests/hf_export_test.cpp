// llmtrain export --format hf / import (train/hf_export.h, train/hf_layout.h):
// - every supported model type at tiny dims: checkpoint -> HF directory -> checkpoint is bit-exact for
//   every tensor, compared with the original checkpoint's model.safetensors;
// - the FLA parameter names of layer 0 and a few shapes are the ones written by hand below from FLA's
//   layer sources (fla/layers/{gated_deltanet,comba,kda,mamba2,attn}.py, MomentumDeltaNet's
//   fla/layers/momentum_deltanet.py), not produced by our mapping;
// - config.json of configs/mdn-paper/400m/{gdn,hybrid/gdn-h-3to1,mdn,mamba2}.json against the values of
//   spec/runs.md and layers-delta.md §3.2 (written by hand here);
// - bf16 export: each value rounded to nearest even (checked against rounding done here);
// - Mamba-3 in mamba_ssm's layout: fc1 = [up_proj; gate_proj] checked byte for byte, MambaConfig keys;
// - import errors name the missing / misshaped / unexpected tensor and the config.json key that differs;
//   export refuses mamba3 and settings without an FLA counterpart, naming them.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/safetensors.h"
#include "kernels/backend.h"
#include "model/config.h"
#include "model/model.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/hf_export.h"
#include "train/hf_layout.h"
#include "train/optimizer.h"

using namespace llmt;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

/// A freshly initialised checkpoint of `config` under run/; returns its directory.
std::string make_checkpoint(const Config& config, const std::string& run) {
  const auto be = make_backend("cpu");
  Model model(config.model);
  model.params().allocate(*be, DType::f32);
  model.params().initialize(config.train.seed);
  const AdamW opt(model.params(), config.train);
  return save_checkpoint(run, TrainState{}, model.params(), opt, config.resolved, config.train.seed, 2);
}

/// All tensors of a safetensors file as raw bytes by name.
std::map<std::string, std::pair<SafetensorsFile::Info, std::string>> tensors_of(const std::string& path) {
  const SafetensorsFile f(path);
  std::map<std::string, std::pair<SafetensorsFile::Info, std::string>> out;
  for (const auto& [name, info] : f.tensors()) {
    std::string bytes(info.end - info.begin, '\0');
    f.read(name, info.dtype, info.shape, bytes.data());
    out[name] = {info, bytes};
  }
  return out;
}

/// Names of `path`'s tensors that start with `prefix`, the prefix removed.
std::set<std::string> names_under(const std::string& path, const std::string& prefix) {
  std::set<std::string> out;
  const SafetensorsFile f(path);
  for (const auto& [name, info] : f.tensors())
    if (name.rfind(prefix, 0) == 0) out.insert(name.substr(prefix.size()));
  return out;
}

/// Rewrites the safetensors file `path` through `edit` (which may drop or change entries).
void rewrite(const std::string& path,
             const std::function<void(std::vector<SafetensorsEntry>&)>& edit) {
  const auto all = tensors_of(path);
  std::vector<SafetensorsEntry> entries;
  for (const auto& [name, t] : all) entries.push_back({name, t.first.dtype, t.first.shape, t.second.data()});
  edit(entries);
  write_safetensors(path, entries);
}

json read_json(const std::string& path) { return json::parse(test::read_bytes(path)); }

const std::set<std::string> kBlock = {"attn_norm.weight", "mlp_norm.weight", "mlp.gate_proj.weight",
                                      "mlp.up_proj.weight", "mlp.down_proj.weight"};

std::set<std::string> with_block(const std::vector<std::string>& mixer) {
  std::set<std::string> s = kBlock;
  for (const auto& m : mixer) s.insert("attn." + m);
  return s;
}

}  // namespace

TEST_CASE("export -> import is bit-exact for every model type; FLA names of layer 0 as FLA's layers define them") {
  struct Case {
    std::string type;
    std::string layer_prefix;
    std::set<std::string> layer0;
    std::vector<std::string> top;
    std::vector<std::string> sets = {};
  };
  const std::vector<std::string> std_top = {"model.embeddings.weight", "model.norm.weight", "lm_head.weight"};
  const std::vector<Case> cases = {
      {"transformer", "model.layers.0.",
       with_block({"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"}), std_top},
      {"gdn", "model.layers.0.",
       with_block({"q_proj.weight", "k_proj.weight", "v_proj.weight", "a_proj.weight", "b_proj.weight", "A_log",
                   "dt_bias", "q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight", "g_proj.weight",
                   "o_norm.weight", "o_proj.weight"}),
       std_top},
      {"comba", "model.layers.0.",
       with_block({"q_proj.weight", "k_proj.weight", "v_proj.weight", "a_proj.weight", "b_proj.weight", "decay", "D",
                   "A_log", "dt_bias", "q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight", "g_proj.weight",
                   "o_norm.weight", "o_proj.weight"}),
       std_top},
      {"kda", "model.layers.0.",
       with_block({"q_proj.weight", "k_proj.weight", "v_proj.weight", "q_conv1d.weight", "k_conv1d.weight",
                   "v_conv1d.weight", "f_proj.0.weight", "f_proj.1.weight", "b_proj.weight", "A_log", "dt_bias",
                   "g_proj.0.weight", "g_proj.1.weight", "g_proj.1.bias", "o_norm.weight", "o_proj.weight"}),
       std_top},
      {"mdn", "model.layers.0.",
       with_block({"q_proj.weight", "k_proj.weight", "v_proj.weight", "a_proj.weight", "b_proj.weight", "A_log",
                   "dt_bias", "mu_bias", "m_proj.weight", "e_proj.weight", "Mu_log", "log_factor", "D_log",
                   "q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight", "g_proj.weight", "o_norm.weight",
                   "o_proj.weight"}),
       std_top},
      {"mamba2", "backbone.layers.0.",
       {"norm.weight", "mixer.in_proj.weight", "mixer.conv1d.weight", "mixer.conv1d.bias", "mixer.dt_bias",
        "mixer.A_log", "mixer.D", "mixer.norm.weight", "mixer.out_proj.weight"},
       {"backbone.embeddings.weight", "backbone.norm_f.weight", "lm_head.weight"}},
      // a GDN/attention hybrid (FLA's `attn` block): layer 1 is softmax attention
      {"gdn", "model.layers.1.",
       with_block({"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"}), std_top,
       {"model.attn_layers=[1]", R"(model.attn={"num_heads":2,"head_dim":64})"}},
      // mamba_ssm (mamba_ssm/modules/{block,mlp,mamba3}.py): tiny Mamba-3 is SISO with tied embeddings and an MLP
      {"mamba3", "backbone.layers.0.",
       {"norm.weight", "norm2.weight", "mlp.fc1.weight", "mlp.fc2.weight", "mixer.in_proj.weight", "mixer.dt_bias",
        "mixer.B_bias", "mixer.C_bias", "mixer.B_norm.weight", "mixer.C_norm.weight", "mixer.D",
        "mixer.out_proj.weight"},
       {"backbone.embedding.weight", "backbone.norm_f.weight"},
       {"model.mamba3.A_act=heavy_tail"}},
  };
  for (const Case& c : cases) {
    SECTION(c.type + (c.sets.empty() ? "" : " " + c.sets.front())) {
      test::TempDir tmp;
      const Config config = load_config("configs/tiny/" + c.type + ".json", c.sets);
      const std::string ckpt = make_checkpoint(config, tmp.file("run"));
      export_hf(tmp.file("run"), tmp.file("hf"), DType::f32);
      const std::string hf = tmp.file("hf/model.safetensors");
      CHECK(names_under(hf, c.layer_prefix) == c.layer0);
      for (const auto& t : c.top) CHECK(SafetensorsFile(hf).contains(t));
      const json hf_cfg = read_json(tmp.file("hf/config.json"));
      CHECK(hf_cfg.at(c.type == "mamba3" ? "d_model" : "hidden_size") == 128);
      if (!c.sets.empty() && c.type == "gdn") CHECK(hf_cfg.at("attn").at("layers") == json::array({1}));

      const std::string back = import_hf(tmp.file("hf"), "", tmp.file("back"));
      CHECK(back == tmp.file("back/checkpoints/step_00000000"));
      const auto a = tensors_of(ckpt + "/model.safetensors"), b = tensors_of(back + "/model.safetensors");
      REQUIRE(a.size() == b.size());
      for (const auto& [name, t] : a) {
        INFO(name);
        REQUIRE(b.count(name) == 1);
        CHECK(b.at(name).first.dtype == DType::f32);
        CHECK(b.at(name).first.shape == t.first.shape);
        CHECK(b.at(name).second == t.second);  // bit-exact
      }
      // the imported checkpoint is one that eval / train --resume read: its config is the original's
      CHECK(checkpoint_config(back) == config.resolved);
      // a second import into the same run would hide behind newer checkpoints: refused
      CHECK_THROWS_WITH(import_hf(tmp.file("hf"), "", tmp.file("run")), Contains("already holds checkpoints"));
    }
  }
}

TEST_CASE("FLA shapes of a tiny GDN layer as FLA's GatedDeltaNet defines them") {
  // configs/tiny/gdn.json: D 128, H 2, head_dim 64, expand_v 2 -> key_dim 128, value_dim 256, head_v_dim 128
  test::TempDir tmp;
  make_checkpoint(load_config("configs/tiny/gdn.json"), tmp.file("run"));
  export_hf(tmp.file("run"), tmp.file("hf"), DType::f32);
  const SafetensorsFile f(tmp.file("hf/model.safetensors"));
  const std::string p = "model.layers.1.attn.";
  CHECK(f.info(p + "q_proj.weight").shape == std::vector<int64_t>{128, 128});
  CHECK(f.info(p + "v_proj.weight").shape == std::vector<int64_t>{256, 128});
  CHECK(f.info(p + "a_proj.weight").shape == std::vector<int64_t>{2, 128});
  CHECK(f.info(p + "A_log").shape == std::vector<int64_t>{2});
  CHECK(f.info(p + "v_conv1d.weight").shape == std::vector<int64_t>{256, 1, 4});
  CHECK(f.info(p + "o_norm.weight").shape == std::vector<int64_t>{128});
  CHECK(f.info(p + "o_proj.weight").shape == std::vector<int64_t>{128, 256});
  CHECK(f.info("lm_head.weight").shape == std::vector<int64_t>{50257, 128});
}

TEST_CASE("Mamba-3: mamba_ssm's fc1 stacks up_proj (rows 0..F-1) over gate_proj (rows F..2F-1)") {
  // GatedMLP: y, gate = fc1(x).chunk(2); y * silu(gate); ours silu(gate_proj x) * up_proj x. tiny: F 256, D 128
  test::TempDir tmp;
  const std::string ckpt =
      make_checkpoint(load_config("configs/tiny/mamba3.json", {"model.mamba3.A_act=heavy_tail"}), tmp.file("run"));
  export_hf(tmp.file("run"), tmp.file("hf"), DType::f32);
  const auto hf = tensors_of(tmp.file("hf/model.safetensors"));
  const auto ours = tensors_of(ckpt + "/model.safetensors");
  const auto& fc1 = hf.at("backbone.layers.2.mlp.fc1.weight");
  CHECK(fc1.first.shape == std::vector<int64_t>{512, 128});
  const std::string& up = ours.at("model.layers.2.mlp.up_proj.weight").second;
  const std::string& gate = ours.at("model.layers.2.mlp.gate_proj.weight").second;
  CHECK(fc1.second.substr(0, up.size()) == up);
  CHECK(fc1.second.substr(up.size()) == gate);
  CHECK(hf.count("lm_head.weight") == 0);  // tied
  const json c = read_json(tmp.file("hf/config.json"));
  CHECK(c.at("d_model") == 128);
  CHECK(c.at("n_layer") == 4);
  CHECK(c.at("d_intermediate") == 256);
  CHECK(c.at("tie_embeddings") == true);
  CHECK(c.at("pad_vocab_size_multiple") == 1);
  CHECK(c.at("ssm_cfg").at("layer") == "Mamba3");
  CHECK(c.at("ssm_cfg").at("headdim") == 32);
  CHECK(c.at("ssm_cfg").at("d_state") == 16);
  CHECK(c.at("ssm_cfg").at("is_mimo") == false);
}

TEST_CASE("config.json of the MDN paper's 400M configs carries the values runs.md gives") {
  // runs.md section 2 / layers-delta.md 3.2: GDN 400M = D 1024, 21 layers, 6 heads x 128, expand_v 2, conv 4,
  // MLP 2816, vocab 50257, untied, norm_eps 1e-6
  const json gdn = hf_config(load_config("configs/mdn-paper/400m/gdn.json").model);
  CHECK(gdn.at("model_type") == "gated_deltanet");
  CHECK(gdn.at("hidden_size") == 1024);
  CHECK(gdn.at("num_hidden_layers") == 21);
  CHECK(gdn.at("num_heads") == 6);
  CHECK(gdn.at("head_dim") == 128);
  CHECK(gdn.at("expand_v") == 2);
  CHECK(gdn.at("conv_size") == 4);
  CHECK(gdn.at("intermediate_size") == 2816);
  CHECK(gdn.at("vocab_size") == 50257);
  CHECK(gdn.at("tie_word_embeddings") == false);
  CHECK(gdn.at("norm_eps") == 1e-6);
  CHECK(gdn.at("use_gate") == true);
  CHECK_FALSE(gdn.contains("attn"));

  // GDN-H 3:1: 24 layers, GDN 8 x 128 expand_v 1, attention at 3,7,...,23 with 8 heads, RoPE 1e4, no bias
  const json h = hf_config(load_config("configs/mdn-paper/400m/hybrid/gdn-h-3to1.json").model);
  CHECK(h.at("num_hidden_layers") == 24);
  CHECK(h.at("num_heads") == 8);
  CHECK(h.at("expand_v") == 1);
  CHECK(h.at("attn").at("layers") == json::array({3, 7, 11, 15, 19, 23}));
  CHECK(h.at("attn").at("num_heads") == 8);
  CHECK(h.at("attn").at("num_kv_heads") == 8);
  CHECK(h.at("attn").at("qkv_bias") == false);
  CHECK(h.at("attn").at("rope_theta") == 10000.0);

  // MDN 400M (MomentumDeltaNet's flame/configs/momentum_deltanet_400M.json): 21 layers, 6 x 128, expand_v 2,
  // min_log_mu -2, tau_factor 1, output correction, p times alpha
  const json mdn = hf_config(load_config("configs/mdn-paper/400m/mdn.json").model);
  CHECK(mdn.at("model_type") == "momentum_deltanet");
  CHECK(mdn.at("num_hidden_layers") == 21);
  CHECK(mdn.at("num_heads") == 6);
  CHECK(mdn.at("head_dim") == 128);
  CHECK(mdn.at("expand_v") == 2);
  CHECK(mdn.at("min_log_mu") == -2.0);
  CHECK(mdn.at("tau_factor") == 1);
  CHECK(mdn.at("use_output_correction") == true);
  CHECK(mdn.at("use_p_times_alpha") == true);

  // Mamba2 400M: D 1024, 48 layers, head_dim 64, N 128, expand 2, n_groups 1, conv 4 with bias, chunk 256
  const json m2 = hf_config(load_config("configs/mdn-paper/400m/mamba2.json").model);
  CHECK(m2.at("model_type") == "mamba2");
  CHECK(m2.at("hidden_size") == 1024);
  CHECK(m2.at("num_hidden_layers") == 48);
  CHECK(m2.at("head_dim") == 64);
  CHECK(m2.at("state_size") == 128);
  CHECK(m2.at("expand") == 2);
  CHECK(m2.at("n_groups") == 1);
  CHECK(m2.at("conv_kernel") == 4);
  CHECK(m2.at("use_conv_bias") == true);
  CHECK(m2.at("chunk_size") == 256);
}

TEST_CASE("bf16 export rounds each value to nearest even; import widens it exactly") {
  test::TempDir tmp;
  const std::string ckpt = make_checkpoint(load_config("configs/tiny/gdn.json"), tmp.file("run"));
  export_hf(tmp.file("run"), tmp.file("hf"), DType::bf16);
  CHECK(SafetensorsFile(tmp.file("hf/model.safetensors")).info("model.norm.weight").dtype == DType::bf16);
  const std::string back = import_hf(tmp.file("hf"), "", tmp.file("back"));
  const SafetensorsFile a(ckpt + "/model.safetensors"), b(back + "/model.safetensors");
  for (const std::string name : {"model.layers.0.attn.q_proj.weight", "model.layers.0.attn.A_log", "lm_head.weight"}) {
    INFO(name);
    const auto& info = a.info(name);
    std::vector<float> x(static_cast<size_t>((info.end - info.begin) / 4)), y(x.size());
    size_t wrong = 0;
    a.read(name, DType::f32, info.shape, x.data());
    b.read(name, DType::f32, info.shape, y.data());
    for (size_t i = 0; i < x.size(); ++i) {
      uint32_t u;
      std::memcpy(&u, &x[i], 4);
      // nearest bf16 below and above (truncation and one ulp up), then the nearer one, ties to even
      const uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u, rest = u & 0xffffu;
      const uint32_t want = rest < 0x8000u ? lo : rest > 0x8000u ? hi : ((lo >> 16) & 1 ? hi : lo);
      uint32_t got;
      std::memcpy(&got, &y[i], 4);
      wrong += got == want ? 0 : 1;
    }
    CHECK(wrong == 0);
  }
}

TEST_CASE("import names the first mismatch: missing, misshaped or unexpected tensors, config.json keys") {
  test::TempDir tmp;
  make_checkpoint(load_config("configs/tiny/kda.json"), tmp.file("run"));
  const auto fresh = [&](const std::string& name) {
    export_hf(tmp.file("run"), tmp.file(name), DType::f32);
    return tmp.file(name);
  };
  SECTION("missing tensor") {
    const std::string hf = fresh("a");
    rewrite(hf + "/model.safetensors", [](std::vector<SafetensorsEntry>& e) {
      e.erase(std::remove_if(e.begin(), e.end(),
                             [](const SafetensorsEntry& x) { return x.name == "model.layers.1.attn.g_proj.1.bias"; }),
              e.end());
    });
    CHECK_THROWS_WITH(import_hf(hf, "", tmp.file("out")),
                      Contains("model.layers.1.attn.g_proj.1.bias") && Contains("has no tensor"));
  }
  SECTION("wrong shape") {
    const std::string hf = fresh("b");
    rewrite(hf + "/model.safetensors", [](std::vector<SafetensorsEntry>& e) {
      for (auto& x : e)
        if (x.name == "model.layers.0.attn.q_proj.weight") x.shape = {64, 256};  // same size, transposed-ish
    });
    CHECK_THROWS_WITH(import_hf(hf, "", tmp.file("out")),
                      Contains("model.layers.0.attn.q_proj.weight") && Contains("64x256"));
  }
  SECTION("unexpected tensor") {
    const std::string hf = fresh("c");
    const std::vector<float> one = {1.0f};
    rewrite(hf + "/model.safetensors", [&](std::vector<SafetensorsEntry>& e) {
      e.push_back({"model.layers.0.attn.q_norm.weight", DType::f32, {1}, one.data()});
    });
    CHECK_THROWS_WITH(import_hf(hf, "", tmp.file("out")), Contains("unexpected tensor model.layers.0.attn.q_norm.weight"));
  }
  SECTION("config.json differs from the llmtrain config") {
    const std::string hf = fresh("d");
    json c = read_json(hf + "/config.json");
    c["num_heads"] = 4;
    test::write_bytes(hf + "/config.json", c.dump());
    CHECK_THROWS_WITH(import_hf(hf, "", tmp.file("out")), Contains("num_heads is 4"));
    c.erase("expand_v");
    test::write_bytes(hf + "/config.json", c.dump());
    CHECK_THROWS_WITH(import_hf(hf, "", tmp.file("out")), Contains("no key expand_v"));
  }
  CHECK_FALSE(fs::exists(tmp.file("out")));
}

TEST_CASE("export refuses what FLA has no class for, naming the mixer or key") {
  test::TempDir tmp;
  make_checkpoint(load_config("configs/tiny/mamba3.json"), tmp.file("m3"));  // A_act softplus: paper-era code
  CHECK_THROWS_WITH(export_hf(tmp.file("m3"), tmp.file("hf"), DType::f32), Contains("model.mamba3.A_act"));
  CHECK_FALSE(fs::exists(tmp.file("hf")));

  const auto model_of = [](const std::string& path, const std::vector<std::string>& sets) {
    return load_config(path, sets).model;
  };
  CHECK_THROWS_WITH(hf_config(model_of("configs/tiny/gdn.json", {"model.gdn.output_gate=sigmoid"})),
                    Contains("model.gdn.output_gate"));
  CHECK_THROWS_WITH(hf_config(model_of("configs/tiny/comba.json", {"model.comba.output_correction=false"})),
                    Contains("model.comba.output_correction"));
  CHECK_THROWS_WITH(hf_config(model_of("configs/tiny/comba.json", {"model.comba.inner_decay=false"})),
                    Contains("model.comba.inner_decay"));
  CHECK_THROWS_WITH(hf_config(model_of("configs/tiny/mdn.json", {"model.mdn.momentum=false"})),
                    Contains("model.mdn.momentum"));
  CHECK_THROWS_WITH(hf_config(model_of("configs/tiny/mdn.json", {"model.mdn.alpha_max=false"})),
                    Contains("model.mdn.alpha_max"));
  CHECK_THROWS_WITH(hf_config(model_of("configs/tiny/mamba2.json", {"model.mamba2.n_groups=2"})),
                    Contains("model.mamba2.n_groups"));
  CHECK_THROWS_WITH(hf_config(model_of("configs/tiny/transformer.json", {"model.attn.head_dim=16"})),
                    Contains("model.attn.head_dim"));
  CHECK_THROWS_WITH(hf_config(model_of("configs/tiny/mamba3.json",
                                       {"model.mamba3.A_act=heavy_tail", "model.mlp.intermediate_size=200"})),
                    Contains("model.mlp.intermediate_size"));
}
