// The language model (runs.md section 2; DESIGN.md data flow): token embedding -> n_layers
// pre-norm blocks -> final RMSNorm -> LM head (untied, or tied to the embedding) -> softmax
// cross-entropy. The LM head and the loss run over row chunks, so the full
// [tokens x vocab] logits are never stored.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "model/block.h"
#include "model/config.h"
#include "model/params.h"

namespace llmt {

/// Parameter counts as `llmtrain info` reports them.
struct ParamCounts {
  int64_t total = 0;
  int64_t embedding = 0;      ///< input embedding + untied LM head
  int64_t non_embedding = 0;  ///< total - embedding
};

class Model {
 public:
  /// Registers all parameters (names as flash-linear-attention's HF layout); allocates
  /// nothing, so counts() works for any size.
  explicit Model(const ModelConfig& config);

  /// Allocates the flat parameter/gradient buffers in `dtype` (f32 for training, f64 for
  /// gradient checks) on `backend`, computing in compute_dtype (bf16 on CUDA: matrix
  /// products and most activations; ParamStore::allocate). Parameters are zero until
  /// params().initialize(seed).
  void allocate(Backend& backend, DType dtype, DType compute_dtype) { store_.allocate(backend, dtype, compute_dtype); }
  void allocate(Backend& backend, DType dtype) { allocate(backend, dtype, dtype); }

  /// Allocates the activations for micro-batches of [batch, seq_len] (once per shape).
  void plan(int64_t batch, int64_t seq_len);

  /// Forward pass and loss. inputs, targets: host int32 [batch, seq_len] (a negative target
  /// has no label); an id outside [0, vocab_size) throws llmt::Error naming it and its position. Returns the SUM of the per-target losses (nats). When with_grad, also
  /// prepares the backward with dL/dlogits scaled by grad_scale (1 / targets of the whole
  /// optimizer step gives the mean loss of the step).
  double forward(const int32_t* inputs, const int32_t* targets, bool with_grad, double grad_scale);

  /// Backward of the last forward(with_grad = true): ACCUMULATES into params().flat_grads().
  void backward();

  ParamStore& params() { return store_; }
  const ModelConfig& config() const { return config_; }
  ParamCounts counts() const;

  /// Training FLOPs per token, PaLM convention (Chowdhery et al. 2022, App. B):
  /// 6 * (parameters used in matrix products: non-embedding + the LM head)
  /// + 12 * n_layers * (heads * head_dim) * seq_len for the attention scores and values
  /// (causal masking not discounted; transformer layers only: the recurrent cores of the
  /// other mixers are not counted yet).
  int64_t training_flops_per_token(int64_t seq_len) const;

 private:
  ModelConfig config_;
  ParamStore store_;
  int embedding_ = -1, final_norm_ = -1, lm_head_ = -1;
  std::vector<std::unique_ptr<Block>> blocks_;
  int64_t batch_ = 0, seq_len_ = 0;
  OwnedTensor ids_, targets_;               // i32 [rows]
  std::vector<OwnedTensor> resid_;          // residual stream at each block input, plus the output
  OwnedTensor xf_, rstdf_, dxf_, dresid_;   // final norm output / its rstd / grads
  int64_t head_rows_ = 0;                   // rows of the LM head per chunk (Backend::head_chunk_rows)
  OwnedTensor logits_, losses_;             // one head chunk's logits [head_rows_, V]; losses [rows]
  Buffer scratch_;                          // the blocks' temporaries, shared (model/scratch.h)
};

}  // namespace llmt
