#include <fmt/format.h>

#include "model/config.h"
#include "model/model.h"
#include "tools/commands.h"

namespace llmt::cli {


int info(const InfoArgs& args) {
  const Config config = load_config(args.config, args.set);
  const ModelConfig& m = config.model;
  const ParamCounts c = Model(m).counts();
  // Training FLOPs per token, PaLM convention (Chowdhery et al. 2022, App. B): 6 N for the
  // matrix products, N = every parameter used in a product (non-embedding + the LM head),
  // plus 12 * n_layers * (heads * head_dim) * seq_len for attention scores and values
  // (causal masking not discounted).
  const int64_t head = m.vocab_size * m.d_model;
  const int64_t attn = 12 * m.n_layers * m.attn.num_heads * m.attn.head_dim * config.train.seq_len;
  const int64_t flops = 6 * (c.non_embedding + head) + attn;
  fmt::print("config: {} ({})\n", args.config, config.run_name);
  fmt::print("model: {} x {}, d_model {}, vocab {}, {} embeddings\n", m.n_layers, m.type, m.d_model, m.vocab_size,
             m.tie_embeddings ? "tied" : "untied");
  fmt::print("total params: {}\n", c.total);
  fmt::print("non-embedding params: {}\n", c.non_embedding);
  fmt::print("training FLOPs per token: {} (6N + 12 L d_attn T, seq_len {})\n", flops, config.train.seq_len);
  fmt::print("steps: {} of {} tokens (grad_accum {})\n", config.train.steps(), config.train.batch_tokens,
             config.train.grad_accum());
  return 0;
}

}  // namespace llmt::cli
