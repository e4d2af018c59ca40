// The Hugging Face layout of the flash-linear-attention (FLA) model classes that `llmtrain export`
// writes and `llmtrain import` reads (docs/INTEROP.md): config.json keys derived from our ModelConfig,
// and our parameter names translated to FLA's. Sources read (fla-org/flash-linear-attention main):
// fla/models/{transformer,gated_deltanet,comba,kda,mamba2}/configuration_*.py and modeling_*.py,
// fla/models/hybrid.py (the `attn` block of hybrids), fla/layers/{attn,gated_deltanet,comba,kda,mamba2}.py;
// MDN: HuuYuLong/MomentumDeltaNet flash-linear-attention/fla/models/momentum_deltanet/ and
// fla/layers/momentum_deltanet.py. Mamba-3 has no FLA class of its own (FLA wraps mamba_ssm's kernels): it is
// written in mamba_ssm's layout (state-spaces/mamba: mamba_ssm/models/{config_mamba,mixer_seq_simple}.py,
// mamba_ssm/modules/{mamba3,block,mlp}.py).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/params.h"

namespace llmt {

/// FLA's config.json for `model`: model_type, architectures, hidden_size, num_hidden_layers,
/// vocab_size, tie_word_embeddings, norm_eps, initializer_range, the MLP's intermediate_size and
/// hidden_act, the mixer's own keys (num_heads, head_dim, expand_v, conv_size, ... or Mamba2's
/// state_size, expand, conv_kernel, ...) and, for hybrids, `attn` = {layers, num_heads, num_kv_heads,
/// qkv_bias, window_size, rope_theta}.
/// Throws llmt::Error naming the mixer and the config key when the model has no FLA counterpart:
/// GDN with a sigmoid output gate, Comba/KDA/MDN with a
/// swish one, the MDN ablations (momentum false, alpha_max false, beta_max false, eta two_sigmoid, non-integer
/// tau_factor), attention whose head_dim is not d_model / num_heads (FLA derives it), a delta-rule or
/// attention model without an MLP, Mamba2 with an MLP, hybrid attention layers or n_groups > 1 (FLA
/// normalises per group, we over the whole inner width).
/// mamba3 gets mamba_ssm's MambaConfig instead (d_model, d_intermediate, n_layer, vocab_size, ssm_cfg with
/// layer "Mamba3", rms_norm, residual_in_fp32, fused_add_norm, pad_vocab_size_multiple 1, tie_embeddings) and
/// is refused for A_act softplus (mamba_ssm's Mamba3 uses the heavy-tail activation), outproj_norm, hybrid
/// attention, norm eps other than 1e-5 (MambaConfig has no key for it) and an MLP width not a multiple of 128
/// (GatedMLP rounds it up).
nlohmann::json hf_config(const ModelConfig& model);

/// One tensor of the HF file: its name and shape, and the parameters of ours it holds, stacked along dim 0.
struct HfTensor {
  std::string name;
  std::vector<int64_t> shape;
  struct Part {
    size_t param = 0;     ///< index into the ParamInfo list
    int64_t row = 0;      ///< first row of dim 0 it occupies
  };
  std::vector<Part> parts;
};

/// The HF tensors of a model with parameters `params` (ParamStore::infos(), names as `llmtrain info` lists),
/// in the order of their first part. Every type but mamba2 and mamba3 keeps our names (they are FLA's);
/// mamba2 (FLA Mamba2ForCausalLM) renames
///   model.embeddings.weight          -> backbone.embeddings.weight
///   model.layers.N.attn_norm.weight  -> backbone.layers.N.norm.weight
///   model.layers.N.attn.<rest>       -> backbone.layers.N.mixer.<rest>
///   model.norm.weight                -> backbone.norm_f.weight
/// and mamba3 (mamba_ssm MambaLMHeadModel) as mamba2 but backbone.embedding.weight, plus
///   model.layers.N.mlp_norm.weight   -> backbone.layers.N.norm2.weight
///   model.layers.N.mlp.up_proj.weight, gate_proj.weight -> backbone.layers.N.mlp.fc1.weight [2F, D]
///                                       (rows 0..F-1 up, F..2F-1 gate: GatedMLP's y, gate = fc1(x).chunk(2))
///   model.layers.N.mlp.down_proj.weight -> backbone.layers.N.mlp.fc2.weight
/// lm_head.weight keeps its name. Throws llmt::Error naming a parameter the table has no rule for.
std::vector<HfTensor> hf_tensors(const ModelConfig& model, const std::vector<ParamInfo>& params);

}  // namespace llmt
