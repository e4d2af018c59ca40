// The language model (runs.md section 2; docs/ARCHITECTURE.md "The model"): token embedding -> n_layers
// pre-norm blocks -> final RMSNorm -> LM head (untied, or tied to the embedding) -> softmax
// cross-entropy. The LM head and the loss run over row chunks, so the full
// [tokens x vocab] logits are never stored.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
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

/// Bytes of the activations Model::plan allocated (memory of the backend's device).
struct ActivationBytes {
  size_t saved = 0;     ///< what the blocks save for the backward: every block's, or one block's with recompute
  size_t residual = 0;  ///< the residual stream at each block input, plus the output: (n_layers + 1) [rows, D]
  size_t scratch = 0;   ///< the blocks' temporaries, shared by all blocks (model/scratch.h)
  size_t total() const { return saved + residual + scratch; }
};

/// An incremental decode of `batch` sequences (Model::start_decode): every block's mixer state and the
/// number of tokens each sequence has consumed.
struct DecodeState {
  int64_t batch = 0;
  int64_t max_len = 0;   ///< tokens each sequence may hold (attention's KV cache size)
  int64_t position = 0;  ///< tokens consumed so far: the absolute position of the next one
  std::vector<MixerState> layers;
};

class Model {
 public:
  /// Vocabulary columns [first, first + count) of the LM head's products (vocab_parts).
  struct VocabPart {
    int64_t first, count;
  };

  /// Registers all parameters (names as flash-linear-attention's HF layout); allocates
  /// nothing, so counts() works for any size.
  explicit Model(const ModelConfig& config);

  /// Allocates the flat parameter/gradient buffers in `dtype` (f32 for training, f64 for
  /// gradient checks) on `backend`, computing in compute_dtype (bf16 on CUDA: matrix
  /// products and most activations; ParamStore::allocate). Parameters are zero until
  /// params().initialize(seed). `pad_multiple`: ParamStore::allocate's padding.
  void allocate(Backend& backend, DType dtype, DType compute_dtype, int64_t pad_multiple = 1) {
    store_.allocate(backend, dtype, compute_dtype, pad_multiple);
  }
  void allocate(Backend& backend, DType dtype) { allocate(backend, dtype, dtype); }

  /// Allocates the activations for micro-batches of [batch, seq_len] (once per shape and mode).
  /// With `recompute` (train.recompute) all blocks share one arena for their saved activations:
  /// the forward keeps only each block's input (the residual stream), and backward() re-runs
  /// each block's forward from it before that block's backward (gradients bit-identical to
  /// recompute off, at the cost of one more forward of the blocks).
  void plan(int64_t batch, int64_t seq_len, bool recompute = false);
  /// The bytes planned by the last plan() (zero before it).
  const ActivationBytes& activation_bytes() const { return activation_bytes_; }

  /// Forward pass and loss. inputs, targets: host int32 [batch, seq_len] (a negative target
  /// has no label); an id outside [0, vocab_size) throws llmt::Error naming it and its position. Returns the SUM of the per-target losses (nats). When with_grad, also
  /// prepares the backward with dL/dlogits scaled by grad_scale (1 / targets of the whole
  /// optimizer step gives the mean loss of the step). When `correct` is not null it receives, per
  /// position [batch, seq_len], 1 where the target is the argmax of the logits (Backend::cross_entropy; ties
  /// count as correct) and 0 elsewhere (0 where there is no label): accuracy without storing the logits.
  double forward(const int32_t* inputs, const int32_t* targets, bool with_grad, double grad_scale,
                 uint8_t* correct = nullptr);

  /// Called by backward() each time the gradients of the flat range [begin, end) (elements of
  /// params().flat_grads()) are final for this backward: after the final norm (its range and the
  /// untied LM head's, computed by the forward), after each block from the last to the first, and
  /// after the embedding (which also holds the tied LM head's gradient). The ranges tile
  /// [0, params().total()) from the end to the start, each ending where the previous began.
  using GradReadyHook = std::function<void(int64_t begin, int64_t end)>;

  /// Backward of the last forward(with_grad = true): ACCUMULATES into params().flat_grads().
  /// `on_ready` (optional) hears of each finished range (GradReadyHook), e.g. to start reducing
  /// it over the ranks (train/grad_buckets.h) while the rest of the backward runs.
  void backward(const GradReadyHook& on_ready = nullptr);

  /// The full forward's logits, for evaluation and tests: inputs host int32 [batch, seq_len] of the last
  /// plan(); writes out [batch * seq_len, vocab] (host, row-major; the logits in double, exact for the f32
  /// and f64 dtypes). Throws llmt::Error for an id outside the vocabulary (naming it and its position).
  void logits(const int32_t* inputs, double* out);

  // ---- incremental decoding (the inference path; docs/ARCHITECTURE.md) ----
  /// Starts decoding `batch` sequences of at most `max_len` tokens each: returns the zeroed state of every
  /// mixer (Mixer::decode_state). decode() and prefill() then plan the model for their shapes ([batch, 1],
  /// [batch, n]; replacing any earlier plan). Runs on the backend's *_decode ops (both backends have them).
  DecodeState start_decode(int64_t batch, int64_t max_len);
  /// Feeds one token per sequence, ids host int32 [batch], at position state.position (then incremented) and
  /// writes the next-token logits [batch, vocab] (host, double) into `logits`. Throws llmt::Error when a
  /// sequence would exceed state.max_len, for an id outside the vocabulary, or for a state of another model.
  void decode(const int32_t* ids, DecodeState& state, double* logits);
  /// Feeds a prompt, ids host int32 [batch, n] (row-major), at positions state.position .. + n - 1 in one pass
  /// (plans [batch, n], the activation memory of a forward of n tokens: the chunked algorithms continuing each
  /// mixer's state, see Mixer::decode) and writes the logits after its last token [batch, vocab] into `logits`.
  /// n >= 1; the same errors as decode(). Prefill then decode steps equal the full forward up to rounding
  /// (tests/decode_test.cpp).
  void prefill(const int32_t* ids, int64_t n, DecodeState& state, double* logits);

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
  /// Checks the ids [rows] against the vocabulary (`what` names them in the error) and embeds them into resid_[0].
  void embed(const int32_t* ids, int64_t rows, const char* what);
  /// The final norm of the residual stream's last entry into xf_.
  void final_norm();
  /// logits_ (first n rows, row stride logits_ld_) = rows [r0, r0 + n) of xf_ times the LM head; returns that
  /// view, [n, V] (n <= head_rows_).
  Tensor head_chunk(int64_t r0, int64_t n);
  /// head_chunk(r0, n), downloaded into out [n, V] (double).
  void download_head_chunk(int64_t r0, int64_t n, double* out);
  /// The LM head's products over the vocabulary in two parts: where the backend pads the logits rows
  /// (logits_stride > V), the first part is the vocabulary rounded down to a multiple of 64 columns, so that its
  /// GEMMs have every extent and stride 16-byte aligned (cuBLAS's fast kernels: GPT-2's 50257 is odd), and the rest
  /// (< 64 columns) is a small product of its own; otherwise the whole vocabulary, then nothing.
  std::array<VocabPart, 2> vocab_parts() const;
  /// The logits of all `rows` rows of xf_, chunk by chunk, into host `out` [rows, V] in double.
  void download_logits(int64_t rows, double* out);
  /// decode() / prefill() of the planned [batch, seq_len] tokens ids [batch * seq_len]; logits of each
  /// sequence's last token.
  void continue_decode(const int32_t* ids, DecodeState& state, double* logits);

  ModelConfig config_;
  ParamStore store_;
  int embedding_ = -1, final_norm_ = -1, lm_head_ = -1;
  std::vector<std::unique_ptr<Block>> blocks_;
  std::vector<int64_t> block_offset_;  // flat offset of each block's first parameter, then of the final norm
  int64_t batch_ = 0, seq_len_ = 0;
  bool recompute_ = false;
  ActivationBytes activation_bytes_;
  OwnedTensor ids_, targets_;               // i32 [rows]
  std::vector<OwnedTensor> resid_;          // residual stream at each block input, plus the output
  OwnedTensor xf_, rstdf_, dxf_, dresid_;   // final norm output / its rstd / grads
  int64_t head_rows_ = 0;                   // rows of the LM head per chunk (Backend::head_chunk_rows)
  int64_t logits_ld_ = 0;                   // row stride of logits_ (Backend::logits_stride(V) >= V)
  OwnedTensor logits_, losses_;             // one head chunk's logits [head_rows_, logits_ld_]; losses [rows]
  OwnedTensor correct_;                     // [rows] in the losses' dtype, allocated by the first forward that asks
  Buffer saved_;                            // the blocks' saved activations (one block's with recompute)
  Buffer scratch_;                          // the blocks' temporaries, shared (model/scratch.h)
};

}  // namespace llmt
