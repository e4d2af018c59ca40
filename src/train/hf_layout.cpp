#include "train/hf_layout.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"

namespace llmt {
namespace {

using nlohmann::json;

/// Keys every FLA causal-LM config has (the ones we set; FLA's defaults cover the rest).
json common_keys(const ModelConfig& m, const std::string& model_type, const std::string& architecture) {
  return {{"model_type", model_type},         {"architectures", {architecture}},
          {"hidden_size", m.d_model},         {"num_hidden_layers", m.n_layers},
          {"vocab_size", m.vocab_size},       {"tie_word_embeddings", m.tie_embeddings},
          {"norm_eps", m.norm_eps},           {"initializer_range", m.init_std}};
}

/// The SwiGLU MLP every FLA block of these classes has (GatedMLP, hidden_act swish).
void add_mlp(const ModelConfig& m, json& c) {
  check(m.has_mlp, "export: model.type {}: FLA's blocks always have an MLP, but model.mlp is null", m.type);
  c["intermediate_size"] = m.mlp.intermediate_size;
  c["hidden_act"] = "swish";
  c["fuse_cross_entropy"] = true;
}

/// FLA's Attention derives head_dim = hidden_size / num_heads; MHA, no qkv bias, no QK norm, full causal.
void check_attention_shape(const ModelConfig& m) {
  check(m.attn.num_heads * m.attn.head_dim == m.d_model,
        "export: softmax attention: FLA's Attention has head_dim = hidden_size / num_heads = {} / {}, but "
        "model.attn.head_dim is {}",
        m.d_model, m.attn.num_heads, m.attn.head_dim);
}

/// FLA's hybrid `attn` block (fla/models/hybrid.py HybridAttentionSpec).
json attn_block(const ModelConfig& m) {
  check_attention_shape(m);
  std::vector<int64_t> layers = m.attn_layers;
  std::sort(layers.begin(), layers.end());
  return {{"layers", layers},       {"num_heads", m.attn.num_heads}, {"num_kv_heads", m.attn.num_heads},
          {"qkv_bias", false},      {"window_size", nullptr},        {"rope_theta", m.attn.rope_theta}};
}

/// Keys shared by the delta-rule classes (GatedDeltaNet, Comba, KDA, MomentumDeltaNet).
json delta_keys(const ModelConfig& m, const GdnConfig& g, const std::string& type, const std::string& gate,
                const std::string& model_type, const std::string& architecture) {
  check(g.output_gate == gate,
        "export: mixer {}: FLA's layer gates its output norm with {}, but model.{}.output_gate is {}", type, gate, type,
        g.output_gate);
  json c = common_keys(m, model_type, architecture);
  add_mlp(m, c);
  c["attn_mode"] = "chunk";
  c["num_heads"] = g.num_heads;
  c["head_dim"] = g.head_dim;
  c["expand_v"] = g.expand_v;
  c["conv_size"] = g.conv_size;
  c["use_short_conv"] = true;
  c["allow_neg_eigval"] = false;
  if (!m.attn_layers.empty()) c["attn"] = attn_block(m);
  return c;
}

json transformer_config(const ModelConfig& m) {
  check_attention_shape(m);
  json c = common_keys(m, "transformer", "TransformerForCausalLM");
  add_mlp(m, c);
  c["num_heads"] = m.attn.num_heads;
  c["num_kv_heads"] = m.attn.num_heads;
  c["qkv_bias"] = false;
  c["qk_norm"] = false;
  c["window_size"] = nullptr;
  c["rope_theta"] = m.attn.rope_theta;
  return c;
}

json mdn_config(const ModelConfig& m) {
  const MdnConfig& d = m.mdn;
  check(d.momentum, "export: mixer mdn: model.mdn.momentum = false (the no-momentum ablation) has no FLA class");
  check(d.beta_max, "export: mixer mdn: model.mdn.beta_max = false (an ablation) has no FLA config key");
  check(d.eta == "tanh", "export: mixer mdn: model.mdn.eta = {} (an ablation) has no FLA config key", d.eta);
  check(d.tau_factor == std::floor(d.tau_factor),
        "export: mixer mdn: FLA's tau_factor is an integer, but model.mdn.tau_factor is {}", d.tau_factor);
  json c = delta_keys(m, d, "mdn", "sigmoid", "momentum_deltanet", "MomentumDeltaNetForCausalLM");
  c["use_gate"] = true;
  c["use_lora_gate"] = false;
  c["use_p_times_alpha"] = true;
  c["use_output_correction"] = d.output_correction;
  c["min_log_mu"] = d.min_log_mu;
  c["tau_factor"] = static_cast<int64_t>(d.tau_factor);
  return c;
}

json mamba2_config(const ModelConfig& m) {
  const Mamba2Config& s = m.mamba2;
  check(!m.has_mlp, "export: mixer mamba2: FLA's Mamba2 blocks have no MLP, but model.mlp is given");
  check(m.attn_layers.empty(), "export: mixer mamba2: FLA's Mamba2 model has no hybrid attention (model.attn_layers)");
  check(s.n_groups == 1,
        "export: mixer mamba2: FLA normalises the gated output per group of B/C, we over the whole inner width; "
        "model.mamba2.n_groups must be 1, not {}",
        s.n_groups);
  json c = common_keys(m, "mamba2", "Mamba2ForCausalLM");
  c["head_dim"] = s.head_dim;
  c["state_size"] = s.d_state;
  c["expand"] = s.expand;
  c["conv_kernel"] = s.conv_size;
  c["n_groups"] = s.n_groups;
  c["use_bias"] = false;
  c["use_conv_bias"] = s.conv_bias;
  c["chunk_size"] = s.chunk_size;
  c["rmsnorm"] = true;
  c["norm_before_gate"] = false;
  c["D_has_hdim"] = false;
  c["residual_in_fp32"] = true;
  c["hidden_act"] = "silu";
  c["fuse_cross_entropy"] = true;
  return c;
}

/// One renaming rule: a name equal to `ours` (or, when `ours` ends in '.', starting with it) becomes `hf`
/// (plus the rest). "{}" stands for the layer number.
struct Rule {
  const char* ours;
  const char* hf;
};

/// The rules of mamba2 (FLA's Mamba2ForCausalLM: base_model_prefix "backbone", Mamba2Block.{norm,mixer},
/// Mamba2Model.norm_f). Every other type keeps our names (FLA's *ForCausalLM: model.*, lm_head).
const std::vector<Rule> kMamba2Rules = {
    {"model.embeddings.weight", "backbone.embeddings.weight"},
    {"model.norm.weight", "backbone.norm_f.weight"},
    {"model.layers.{}.attn_norm.weight", "backbone.layers.{}.norm.weight"},
    {"model.layers.{}.attn.", "backbone.layers.{}.mixer."},
    {"lm_head.weight", "lm_head.weight"},
};

}  // namespace

json hf_config(const ModelConfig& m) {
  if (m.type == "transformer") return transformer_config(m);
  if (m.type == "gdn") {
    json c = delta_keys(m, m.gdn, "gdn", "swish", "gated_deltanet", "GatedDeltaNetForCausalLM");
    c["use_gate"] = true;
    return c;
  }
  if (m.type == "comba") {
    json c = delta_keys(m, m.comba, "comba", "sigmoid", "comba", "CombaForCausalLM");
    c["use_output_gate"] = true;
    c["use_output_correction"] = m.comba.output_correction;
    c["use_inner_decay"] = m.comba.inner_decay;
    c["correction_factor"] = m.comba.correction_factor;
    return c;
  }
  if (m.type == "kda") {
    json c = delta_keys(m, m.kda, "kda", "sigmoid", "kda", "KDAForCausalLM");
    c["safe_gate"] = false;
    return c;
  }
  if (m.type == "mdn") return mdn_config(m);
  if (m.type == "mamba2") return mamba2_config(m);
  throw Error(fmt::format("export: mixer {} has no FLA model class (Mamba-3's mamba_ssm layout is not written yet)",
                          m.type));
}

std::string hf_param_name(const ModelConfig& m, const std::string& name) {
  if (m.type != "mamba2") return name;
  // Replace the layer number of "model.layers.N." by "{}" to match the table, then put it back.
  std::string key = name, layer;
  const std::string lp = "model.layers.";
  if (name.rfind(lp, 0) == 0) {
    size_t e = lp.size();
    while (e < name.size() && std::isdigit(static_cast<unsigned char>(name[e]))) ++e;
    layer = name.substr(lp.size(), e - lp.size());
    key = lp + "{}" + name.substr(e);
  }
  for (const Rule& r : kMamba2Rules) {
    const std::string ours = r.ours;
    const bool prefix = ours.back() == '.';
    if (prefix ? key.rfind(ours, 0) == 0 : key == ours) {
      std::string hf = r.hf;
      const size_t at = hf.find("{}");
      if (at != std::string::npos) hf.replace(at, 2, layer);
      return hf + key.substr(ours.size());
    }
  }
  throw Error(fmt::format("export: mixer mamba2: no FLA name for parameter {}", name));
}

}  // namespace llmt
