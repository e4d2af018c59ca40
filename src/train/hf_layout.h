// The Hugging Face layout of the flash-linear-attention (FLA) model classes that `llmtrain export`
// writes and `llmtrain import` reads (docs/INTEROP.md): config.json keys derived from our ModelConfig,
// and our parameter names translated to FLA's. Sources read (fla-org/flash-linear-attention main):
// fla/models/{transformer,gated_deltanet,comba,kda,mamba2}/configuration_*.py and modeling_*.py,
// fla/models/hybrid.py (the `attn` block of hybrids), fla/layers/{attn,gated_deltanet,comba,kda,mamba2}.py;
// MDN: HuuYuLong/MomentumDeltaNet flash-linear-attention/fla/models/momentum_deltanet/ and
// fla/layers/momentum_deltanet.py.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "model/config.h"

namespace llmt {

/// FLA's config.json for `model`: model_type, architectures, hidden_size, num_hidden_layers,
/// vocab_size, tie_word_embeddings, norm_eps, initializer_range, the MLP's intermediate_size and
/// hidden_act, the mixer's own keys (num_heads, head_dim, expand_v, conv_size, ... or Mamba2's
/// state_size, expand, conv_kernel, ...) and, for hybrids, `attn` = {layers, num_heads, num_kv_heads,
/// qkv_bias, window_size, rope_theta}.
/// Throws llmt::Error naming the mixer and the config key when the model has no FLA counterpart:
/// mamba3 (mamba_ssm layout, not written yet), GDN with a sigmoid output gate, Comba/KDA/MDN with a
/// swish one, the MDN ablations (momentum false, beta_max false, eta two_sigmoid, non-integer
/// tau_factor), attention whose head_dim is not d_model / num_heads (FLA derives it), a delta-rule or
/// attention model without an MLP, Mamba2 with an MLP, hybrid attention layers or n_groups > 1 (FLA
/// normalises per group, we over the whole inner width).
nlohmann::json hf_config(const ModelConfig& model);

/// FLA's name of our parameter `name` (a name `llmtrain info` lists) for a model of `model.type`.
/// Every type but mamba2 keeps our names (they are FLA's already); mamba2 renames
///   model.embeddings.weight          -> backbone.embeddings.weight
///   model.layers.N.attn_norm.weight  -> backbone.layers.N.norm.weight
///   model.layers.N.attn.<rest>       -> backbone.layers.N.mixer.<rest>
///   model.norm.weight                -> backbone.norm_f.weight
///   lm_head.weight                   -> lm_head.weight
/// Throws llmt::Error naming `name` when the table of the type has no rule for it.
std::string hf_param_name(const ModelConfig& model, const std::string& name);

}  // namespace llmt
