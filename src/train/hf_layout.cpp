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
  check(d.alpha_max, "export: mixer mdn: model.mdn.alpha_max = false (an ablation) has no FLA config key");
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

json mamba3_config(const ModelConfig& m) {
  const Mamba3Config& s = m.mamba3;
  check(s.A_act == "heavy_tail",
        "export: mixer mamba3: mamba_ssm's Mamba3 computes A with the heavy-tail activation, but model.mamba3.A_act "
        "is {}",
        s.A_act);
  check(!s.outproj_norm, "export: mixer mamba3: model.mamba3.outproj_norm = true is not mapped (mamba_ssm "
                         "is_outproj_norm with its fused pre-gate norm was not checked)");
  check(m.attn_layers.empty(), "export: mixer mamba3: hybrid attention layers (model.attn_layers) are not mapped");
  check(m.norm_eps == 1e-5, "export: mixer mamba3: mamba_ssm's MambaConfig fixes the norm eps at 1e-5, but "
                            "model.norm.eps is {}", m.norm_eps);
  check(!m.has_mlp || m.mlp.intermediate_size % 128 == 0,
        "export: mixer mamba3: mamba_ssm's GatedMLP rounds its width up to a multiple of 128, but "
        "model.mlp.intermediate_size is {}",
        m.mlp.intermediate_size);
  return {{"d_model", m.d_model},
          {"d_intermediate", m.has_mlp ? m.mlp.intermediate_size : 0},
          {"n_layer", m.n_layers},
          {"vocab_size", m.vocab_size},
          {"ssm_cfg",
           {{"layer", "Mamba3"}, {"d_state", s.d_state}, {"expand", s.expand}, {"headdim", s.head_dim},
            {"ngroups", s.n_groups}, {"rope_fraction", s.rope_fraction}, {"dt_min", s.dt_min},
            {"dt_max", s.dt_max}, {"dt_init_floor", s.dt_floor}, {"A_floor", s.A_floor},
            {"is_outproj_norm", false}, {"is_mimo", s.mimo_rank > 1}, {"mimo_rank", s.mimo_rank},
            {"chunk_size", s.chunk_size}}},
          {"attn_layer_idx", json::array()},
          {"attn_cfg", json::object()},
          {"rms_norm", true},
          {"residual_in_fp32", true},
          {"fused_add_norm", true},
          {"pad_vocab_size_multiple", 1},
          {"tie_embeddings", m.tie_embeddings}};
}

/// One renaming rule: a name equal to `ours` (or, when `ours` ends in '.', starting with it) becomes `hf`
/// (plus the rest). "{}" stands for the layer number. `second_half`: the parameter is stacked below
/// another one (rows F.. of mamba_ssm's fc1).
struct Rule {
  const char* ours;
  const char* hf;
  bool second_half = false;
};

/// FLA's Mamba2ForCausalLM: base_model_prefix "backbone", Mamba2Block.{norm,mixer}, Mamba2Model.norm_f.
const std::vector<Rule> kMamba2Rules = {
    {"model.embeddings.weight", "backbone.embeddings.weight"},
    {"model.norm.weight", "backbone.norm_f.weight"},
    {"model.layers.{}.attn_norm.weight", "backbone.layers.{}.norm.weight"},
    {"model.layers.{}.attn.", "backbone.layers.{}.mixer."},
    {"lm_head.weight", "lm_head.weight"},
};

/// mamba_ssm's MambaLMHeadModel: backbone.embedding, Block.{norm,mixer,norm2,mlp}, GatedMLP.{fc1,fc2}, norm_f.
const std::vector<Rule> kMamba3Rules = {
    {"model.embeddings.weight", "backbone.embedding.weight"},
    {"model.norm.weight", "backbone.norm_f.weight"},
    {"model.layers.{}.attn_norm.weight", "backbone.layers.{}.norm.weight"},
    {"model.layers.{}.mlp_norm.weight", "backbone.layers.{}.norm2.weight"},
    {"model.layers.{}.mlp.up_proj.weight", "backbone.layers.{}.mlp.fc1.weight"},
    {"model.layers.{}.mlp.gate_proj.weight", "backbone.layers.{}.mlp.fc1.weight", true},
    {"model.layers.{}.mlp.down_proj.weight", "backbone.layers.{}.mlp.fc2.weight"},
    {"model.layers.{}.attn.", "backbone.layers.{}.mixer."},
    {"lm_head.weight", "lm_head.weight"},
};

/// The HF name of `name` under `rules`, and whether it is a second half.
std::pair<std::string, bool> apply_rules(const std::vector<Rule>& rules, const std::string& type,
                                         const std::string& name) {
  // Replace the layer number of "model.layers.N." by "{}" to match the table, then put it back.
  std::string key = name, layer;
  const std::string lp = "model.layers.";
  if (name.rfind(lp, 0) == 0) {
    size_t e = lp.size();
    while (e < name.size() && std::isdigit(static_cast<unsigned char>(name[e]))) ++e;
    layer = name.substr(lp.size(), e - lp.size());
    key = lp + "{}" + name.substr(e);
  }
  for (const Rule& r : rules) {
    const std::string ours = r.ours;
    const bool prefix = ours.back() == '.';
    if (prefix ? key.rfind(ours, 0) == 0 : key == ours) {
      std::string hf = r.hf;
      const size_t at = hf.find("{}");
      if (at != std::string::npos) hf.replace(at, 2, layer);
      return {hf + key.substr(ours.size()), r.second_half};
    }
  }
  throw Error(fmt::format("export: mixer {}: no HF name for parameter {}", type, name));
}

}  // namespace

json hf_config(const ModelConfig& m) {
  if (m.type == "transformer") return transformer_config(m);
  if (m.type == "gdn") {
    json c = delta_keys(m, m.gdn, "gdn", "swish", "gated_deltanet", "GatedDeltaNetForCausalLM");
    c["use_gate"] = true;
    return c;
  }
  if (m.type == "comba") {
    // FLA's CombaBlock passes neither use_output_correction nor use_inner_decay to its Comba layer, so
    // CombaForCausalLM always has both (parameters D and decay) whatever config.json says.
    check(m.comba.output_correction && m.comba.inner_decay,
          "export: mixer comba: FLA's CombaForCausalLM always builds its layers with use_output_correction and "
          "use_inner_decay (CombaBlock does not pass the keys on), but model.comba.output_correction is {} and "
          "model.comba.inner_decay is {}",
          m.comba.output_correction, m.comba.inner_decay);
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
  if (m.type == "mamba3") return mamba3_config(m);
  throw Error(fmt::format("export: mixer {} has no FLA model class", m.type));
}

std::vector<HfTensor> hf_tensors(const ModelConfig& m, const std::vector<ParamInfo>& params) {
  const std::vector<Rule>* rules = m.type == "mamba2" ? &kMamba2Rules : m.type == "mamba3" ? &kMamba3Rules : nullptr;
  std::vector<HfTensor> out;
  std::vector<std::pair<size_t, size_t>> second;  // (tensor, param) of second halves, stacked at the end
  for (size_t i = 0; i < params.size(); ++i) {
    const auto [name, below] = rules ? apply_rules(*rules, m.type, params[i].name)
                                     : std::pair<std::string, bool>{params[i].name, false};
    auto it = std::find_if(out.begin(), out.end(), [&](const HfTensor& t) { return t.name == name; });
    if (it == out.end()) it = out.insert(out.end(), HfTensor{name, {}, {}});
    if (below) second.push_back({static_cast<size_t>(it - out.begin()), i});
    else it->parts.push_back({i, 0});
  }
  for (const auto& [t, i] : second) out[t].parts.push_back({i, 0});
  for (HfTensor& t : out) {
    int64_t rows = 0;
    for (HfTensor::Part& part : t.parts) {
      const std::vector<int64_t>& shape = params[part.param].shape;
      check(t.shape.empty() || std::equal(shape.begin() + 1, shape.end(), t.shape.begin() + 1, t.shape.end()),
            "export: {} stacks parameters whose shapes differ beyond dim 0", t.name);
      t.shape = shape;
      part.row = rows;
      rows += shape[0];
    }
    t.shape[0] = rows;
  }
  return out;
}

}  // namespace llmt
