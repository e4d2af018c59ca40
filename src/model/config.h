// The run configuration: one JSON file = one run (runs.md section 4, adapted; every key is
// documented in docs/CONFIG.md). Parsing is strict: an unknown key, a wrong type or a bad
// value throws llmt::Error naming the key path (e.g. "train.lr") and what is allowed.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace llmt {

struct AttnConfig {
  int64_t num_heads = 0;
  int64_t head_dim = 0;
  double rope_theta = 10000.0;
};

/// Gated DeltaNet mixer (layers-delta.md section 4.1; runs.md section 4.1 `model.gdn`).
struct GdnConfig {
  int64_t num_heads = 0;
  int64_t head_dim = 0;     ///< d_k
  int64_t expand_v = 2;     ///< d_v = head_dim * expand_v
  int64_t conv_size = 4;    ///< short convolution width
  int64_t chunk_size = 64;  ///< chunk length of the training algorithm
  std::string output_gate = "swish";  ///< "swish" (GDN) or "sigmoid"
  double A_min = 0, A_max = 16;                        ///< A_log = log U(A_min, A_max)
  double dt_min = 1e-3, dt_max = 0.1, dt_floor = 1e-4;  ///< dt_bias = softplus^-1(dt)
  /// GDN, Comba and KDA (model.{gdn,comba,kda}.save_states; not read for the MDN, whose switch is save_residuals):
  /// keep the core's forward scan outputs, the chunk-entering states h and Δ = v_new (GDN, Comba: and its W),
  /// besides 𝒯 (KDA: P and 𝒯) from the forward for the backward (CUDA: Backend::gdn_saved_numel / kda_saved_numel
  /// with states), or (false) keep only 𝒯 (KDA: P and 𝒯) and recompute h and Δ with the forward scan in the backward
  /// (FLA's design, layers-delta.md section 6.3). Same gradients either way; at the 400M GDN (6 heads, K 128, V 256,
  /// bf16, 16384 tokens per micro-batch) 168 MiB more saved activations per layer.
  bool save_states = true;
  int64_t value_dim() const { return head_dim * expand_v; }
};

/// Comba mixer (layers-delta.md section 4.2; runs.md section 4.1 `model.comba`): the GDN keys (output gate
/// sigmoid by default) plus the inner decay p = sigma(decay) k and the output correction q' = q - D p.
struct CombaConfig : GdnConfig {
  CombaConfig() { output_gate = "sigmoid"; }
  bool output_correction = true;   ///< FLA use_output_correction: parameter D, q' = q - D p
  double correction_factor = 1.0;  ///< initial value of D
  bool inner_decay = true;         ///< FLA use_inner_decay: parameter decay, p = sigma(decay) k (else p = k)
  double decay_init = 1.0;         ///< initial value of decay (model.comba.init.decay)
};

/// KDA mixer (layers-delta.md section 4.3; `model.kda`): the GDN keys with KDA's defaults (expand_v 1,
/// sigmoid output gate, A_log = log U(1, 16) per section 3.3). Its channel-wise decay and low-rank gate
/// projections (rank d_v) are fixed by the layer, not configurable.
struct KdaConfig : GdnConfig {
  KdaConfig() {
    expand_v = 1;
    output_gate = "sigmoid";
    A_min = 1;
  }
};

/// Mamba2 mixer (layers-ssm-attn.md section 2; runs.md section 4.1 `model.mamba2`). Inner width
/// Di = expand * d_model, H = Di / head_dim heads, B and C of n_groups x d_state.
struct Mamba2Config {
  int64_t expand = 2;
  int64_t head_dim = 64;   ///< P
  int64_t d_state = 128;   ///< N
  int64_t n_groups = 1;    ///< G: heads h share B, C of group h / (H / G)
  int64_t conv_size = 4;   ///< depthwise causal conv width (x, B, C)
  bool conv_bias = true;   ///< the conv has a per-channel bias (MDN runs: true)
  int64_t chunk_size = 256;
  double dt_min = 1e-3, dt_max = 0.1, dt_floor = 1e-4;  ///< dt_bias = softplus^-1(dt) (section 1.5)
  /// Section 2.3.2: "fla_mdn" (2.3.1, A = -1..-H), "mamba_ssm" (2.3.3: A ~ U(1, 16), PyTorch-default
  /// in_proj and conv init) or "zeros_like_skipped" (as fla_mdn but A_log = 0, dt_bias = 0: the DTensor hazard).
  std::string init_style = "fla_mdn";
  /// Keep the SSD core's chunk-entering states from the forward for the backward (CUDA:
  /// Backend::mamba2_saved_numel, the compute dtype), or (false) recompute them in the backward (layers-ssm-attn.md
  /// section 2.6.1's memory-saving choice). Same gradients either way; 128 MiB more saved activations per layer at
  /// 16 heads x 128, d_state 128, bf16 and 16384 tokens per micro-batch.
  bool save_states = true;
  int64_t inner_dim(int64_t d_model) const { return expand * d_model; }
  int64_t num_heads(int64_t d_model) const { return inner_dim(d_model) / head_dim; }
};

/// Mamba-3 mixer (layers-ssm-attn.md section 4; runs.md section 4.1 `model.mamba3`). Inner width
/// Di = expand * d_model, H = Di / head_dim heads, B and C of mimo_rank x n_groups x d_state, S rotation
/// angles (section 4.1) shared by all heads.
struct Mamba3Config {
  int64_t expand = 2;
  int64_t head_dim = 64;   ///< P
  int64_t d_state = 128;   ///< N
  int64_t n_groups = 1;    ///< G: heads h share B, C of group h / (H / G)
  int64_t mimo_rank = 1;   ///< R; 1 = SISO
  int64_t chunk_size = 64; ///< Q of the chunked core (SISO 64, MIMO 64 / R)
  double rope_fraction = 0.5;  ///< 0.5 or 1.0: the rotated fraction of d_state
  double A_floor = 1e-4;       ///< A_t <= -A_floor
  std::string A_act = "softplus";  ///< "softplus" (paper era) or "heavy_tail" (section 4 code history)
  double dt_min = 1e-3, dt_max = 0.1, dt_floor = 1e-4;  ///< dt_bias = softplus^-1(dt) (section 1.5)
  bool outproj_norm = false;   ///< per-head RMSNorm of y before the gate (section 4.3.4)
  double bc_bias_init = 1.0;   ///< B_bias, C_bias initial value (section 4.2: ones)
  /// "mamba_ssm" (section 4.8: PyTorch-default U(±1/sqrt(fan_in)) in_proj and out_proj) or "fla"
  /// (N(0, model.init.std^2) for both).
  std::string init_style = "mamba_ssm";
  /// Keep the core's forward intermediates for the backward (CUDA: the chunk-local cumsum G, the states entering
  /// each chunk, the core output y, BCNorm's normalised B, C, the phases φ and the rotated q, k; fp32, the states,
  /// y, q, k bf16 for a bf16 compute dtype; Backend::mamba3_saved_numel), or (false) recompute them in the backward.
  /// Same gradients either way; 1048 MiB more saved activations per layer at 64 heads x 64, d_state 128, 32 angles,
  /// SISO, bf16 and 16384 tokens per micro-batch (fp32: 1944 MiB).
  bool save_states = true;
  int64_t inner_dim(int64_t d_model) const { return expand * d_model; }
  int64_t num_heads(int64_t d_model) const { return inner_dim(d_model) / head_dim; }
  /// S = floor(N rope_fraction), minus 1 if odd, halved (section 4.1: 32 for N = 128).
  int64_t num_angles() const {
    int64_t s = static_cast<int64_t>(static_cast<double>(d_state) * rope_fraction);
    if (s % 2 != 0) --s;
    return s / 2;
  }
  /// in_proj output width 2 Di + 2 G N R + 3 H + S (section 4.2).
  int64_t in_proj_dim(int64_t d_model) const {
    return 2 * inner_dim(d_model) + 2 * n_groups * d_state * mimo_rank + 3 * num_heads(d_model) + num_angles();
  }
};

/// MDN (Momentum DeltaNet) mixer (mdn.md; runs.md section 4.1 `model.mdn`): the GDN keys (sigmoid output gate
/// by default) plus the momentum gates of mdn.md §4.4 and the output correction of §4.2, and the switches of the
/// paper's ablations (Tables 4 and 6).
struct MdnConfig : GdnConfig {
  MdnConfig() { output_gate = "sigmoid"; }
  double min_log_mu = -2.0;        ///< floor of log mu (FLA min_log_mu)
  double tau_factor = 1.0;         ///< tau = sqrt(d_model / tau_factor)
  bool output_correction = true;   ///< q <- q - exp(D_log) k before the L2 norm (parameter D_log)
  bool alpha_max = true;           ///< log alpha = -A softplus + log alpha_max (false: the "no alpha_max" ablation)
  bool beta_max = true;            ///< beta = sigmoid(z_beta) * beta_max (false: the "no beta_max" ablation)
  std::string eta = "tanh";        ///< "tanh": eta = 1 + tanh(z/tau); "two_sigmoid": eta = 2 sigmoid(z/tau)
  bool momentum = true;            ///< false: the "no momentum" proxy (mu = 0, eta = 1: GDN + alpha_max/beta_max)
  double mu_A_min = 0, mu_A_max = 16;           ///< Mu_log = log U(mu_A_min, mu_A_max)
  std::string mu_bias_init = "copy_dt_bias";    ///< "copy_dt_bias" (the authors) or "independent" (own draw)
  std::string log_factor_init = "log_uniform_0_4";  ///< "log_uniform_0_4" (s ~ U(0,4)) or "zero" (s = 1)
  std::string D_log_init = "log_uniform_0_1";       ///< "log_uniform_0_1" (delta ~ U(0,1)) or "zero" (delta = 1)
  /// Keep the core's corrected values Ṽ from the forward for the backward (mdn.md §7.1, the authors' faster
  /// variant; B T H d_v more saved activations per layer), or (false) recompute them in the backward.
  bool save_residuals = true;
};

struct MlpConfig {
  int64_t intermediate_size = 0;  ///< SwiGLU hidden width F
};

struct ModelConfig {
  std::string type = "transformer";  ///< default mixer of every layer
  int64_t d_model = 0;
  int64_t n_layers = 0;
  int64_t vocab_size = 0;
  bool tie_embeddings = false;
  double norm_eps = 1e-6;  ///< RMSNorm eps (model.norm.eps)
  MlpConfig mlp;
  bool has_mlp = true;     ///< false (model.mlp = null): blocks are mixer-only (Mamba2 in the MDN paper)
  double init_std = 0.02;  ///< model.init.std: N(0, std^2) for Linear and Embedding weights
  /// model.init.residual_rescale: "none", or "kaiming_div_sqrt" = the mixer out_proj and the MLP down_proj
  /// drawn U(±1/sqrt(fan_in)) / sqrt(residual_rescale_n) (mamba2 and mamba3; layers-ssm-attn.md sections 2.3.1, 4.8)
  std::string residual_rescale = "none";
  int64_t residual_rescale_n = 0;  ///< default n_layers
  std::vector<int64_t> attn_layers;  ///< hybrids: 0-based layers whose mixer is softmax attention (model.attn)
  AttnConfig attn;  ///< used by type "transformer" and by attn_layers
  GdnConfig gdn;    ///< used by type "gdn"
  CombaConfig comba;  ///< used by type "comba"
  KdaConfig kda;      ///< used by type "kda"
  Mamba2Config mamba2;  ///< used by type "mamba2"
  Mamba3Config mamba3;  ///< used by type "mamba3"
  MdnConfig mdn;      ///< used by type "mdn"

  /// The mixer type of layer `layer`: "transformer" for the attention layers of a hybrid, else `type`.
  std::string mixer_of(int64_t layer) const {
    for (int64_t a : attn_layers)
      if (a == layer) return "transformer";
    return type;
  }
  /// Whether any layer uses softmax attention.
  bool has_attention() const { return type == "transformer" || !attn_layers.empty(); }
};

struct TrainConfig {
  int64_t tokens = 0;        ///< total training tokens
  int64_t batch_tokens = 0;  ///< tokens per optimizer step
  int64_t seq_len = 0;
  int64_t micro_batch = 0;   ///< sequences per forward/backward pass
  double lr = 0, min_lr = 0;
  std::string lr_schedule = "cosine";
  std::string lr_formula = "flame";  ///< "flame" (runs.md section 1) or "standard"
  int64_t warmup_tokens = 0;
  double weight_decay = 0.1;
  std::vector<std::string> weight_decay_exclude;  ///< subset of {bias, norm, embedding, ssm_param}
  double beta1 = 0.9, beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;  ///< global L2 norm; 0 disables clipping
  bool skip_nonfinite = true;
  uint64_t seed = 42;
  std::string backend = "auto";  ///< auto (cuda when built with it and a GPU is visible), cpu, cuda
  std::string precision = "auto";  ///< auto (bf16 on cuda, fp32 on cpu), fp32, bf16
  bool recompute = false;  ///< per-block activation recomputation (Model::plan)

  // Derived (validated) quantities.
  int64_t steps() const { return tokens / batch_tokens; }
  int64_t warmup_steps() const { return warmup_tokens / batch_tokens; }
  int64_t grad_accum() const { return batch_tokens / (micro_batch * seq_len); }
};

/// A synthetic task (data.source mqar | parity | modarith; data.synthetic; docs/SYNTHETIC.md). MQAR defaults:
/// Zoology's training mix (the MDN paper's Fig. 4 setting: 64-256 tokens, 4-64 pairs) and test points up to 2048
/// tokens / 512 pairs; state tracking defaults: the Mamba-3 paper's Table 5b (train up to length 160, test 256).
struct SyntheticConfig {
  int64_t vocab = 8192;  ///< mqar: token ids [0, vocab) (Zoology: 8192)
  /// mqar: [sequence length, key-value pairs] points; training examples cycle through train_points
  std::vector<std::array<int64_t, 2>> train_points{{64, 4}, {128, 8}, {256, 16}, {256, 32}, {256, 64}};
  std::vector<std::array<int64_t, 2>> eval_points{{512, 32},   {512, 64},   {512, 128}, {1024, 128},
                                                   {1024, 256}, {2048, 256}, {2048, 512}};
  double power_a = 0.01;  ///< mqar: query gap g has P ~ (g + 1)^(power_a - 1)
  int64_t min_length = 3, max_length = 160;  ///< parity / modarith: training lengths, uniform
  /// parity / modarith length curriculum: the longest training length stays at curriculum_start_length for the
  /// first curriculum_hold_tokens training tokens, then grows linearly to max_length over the next
  /// curriculum_tokens (both 0: no curriculum, max_length throughout)
  int64_t curriculum_tokens = 0;
  int64_t curriculum_hold_tokens = 0;
  int64_t curriculum_start_length = 0;  ///< resolved to min_length when not given
  std::vector<int64_t> eval_lengths{256};     ///< parity / modarith: evaluation lengths
  bool brackets = false;                      ///< modarith: with brackets (operators + -)
  int64_t eval_examples = 1000;               ///< examples per evaluation point
};

struct DataConfig {
  std::string source = "tokens";  ///< tokens (text, shards or dataset) | mqar | parity | modarith
  SyntheticConfig synthetic;      ///< used when source is not tokens
  std::string tokenizer = "gpt2";  ///< gpt2 | llama3 | llama3.1 (checked against the dataset's)
  std::string tokenizer_dir = "data/tokenizers/gpt2";
  std::string text;          ///< raw UTF-8 text tokenized once into cache_dir (optional)
  double val_fraction = 0.1;
  std::string cache_dir = "data/cache";
  std::string train_shard;   ///< pre-tokenized shards (used when text is empty)
  std::string val_shard;
  std::string dataset;       ///< a prepare-data directory (dataset.json + shards); exclusive with text/shards
  bool shuffle = true;
  uint64_t shuffle_seed = 42;
};

struct EvalConfig {
  int64_t interval_steps = 0;  ///< 0 = only at start and end
  int64_t tokens = 0;          ///< validation tokens per evaluation (whole windows)
  bool at_start = true;
};

struct CheckpointConfig {
  int64_t interval_steps = 0;  ///< 0 = only at the end
  int64_t keep = 2;            ///< newest checkpoints kept
};

struct LogConfig {
  int64_t interval_steps = 1;
};

/// Data-parallel options (docs/DISTRIBUTED.md); inert for one process. They may change across a
/// resume: checkpoints hold the same data whatever they are.
struct DistConfig {
  bool zero1 = false;      ///< shard the AdamW moments over the ranks (reduce-scatter, all-gather)
  bool overlap = true;     ///< start each gradient bucket's all-reduce as its layers finish backward
  double bucket_mb = 25;   ///< least MiB of fp32 gradient per bucket (PyTorch DDP's bucket_cap_mb)
  /// bucket_mb in fp32 elements (at least 1).
  int64_t bucket_elements() const;
};

struct Config {
  std::string run_name;
  ModelConfig model;
  TrainConfig train;
  DataConfig data;
  EvalConfig eval;
  CheckpointConfig checkpoint;
  LogConfig log;
  DistConfig dist;
  nlohmann::json resolved;  ///< the full config with defaults filled in (saved in checkpoints)
};

/// Parses and validates a config object. Throws llmt::Error naming the key path.
Config parse_config(const nlohmann::json& j);

/// Reads a JSON file (error names the file, line and column of a syntax error), applies
/// `overrides` of the form "a.b.c=value" (value parsed as JSON, else taken as a string;
/// the key must exist in the schema), then parse_config.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

}  // namespace llmt
