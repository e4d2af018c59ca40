#include <fmt/format.h>

#include "model/config.h"
#include "model/model.h"
#include "tools/commands.h"

namespace llmt::cli {


int info(const InfoArgs& args) {
  const Config config = load_config(args.config, args.set);
  const ModelConfig& m = config.model;
  const Model model(m);
  const ParamCounts c = model.counts();
  const int64_t flops = model.training_flops_per_token(config.train.seq_len);
  fmt::print("config: {} ({})\n", args.config, config.run_name);
  const int64_t n_attn = static_cast<int64_t>(m.attn_layers.size());
  const std::string layers = n_attn == 0 ? fmt::format("{} x {}", m.n_layers, m.type)
                                         : fmt::format("{} layers: {} x {} + {} x attention (hybrid)", m.n_layers,
                                                       m.n_layers - n_attn, m.type, n_attn);
  fmt::print("model: {}, d_model {}, vocab {}, {} embeddings\n", layers, m.d_model, m.vocab_size,
             m.tie_embeddings ? "tied" : "untied");
  fmt::print("total params: {}\n", c.total);
  fmt::print("non-embedding params: {}\n", c.non_embedding);
  fmt::print("training FLOPs per token: {} (6N + 12 L d_attn T; N = non-embedding + LM head params; T = seq_len {}{})\n",
             flops, config.train.seq_len,
             m.type == "transformer" ? "" : fmt::format("; the {} cores' own FLOPs not counted", m.type));
  fmt::print("steps: {} of {} tokens (grad_accum {})\n", config.train.steps(), config.train.batch_tokens,
             config.train.grad_accum());
  return 0;
}

}  // namespace llmt::cli
