#include "model/model.h"

#include <algorithm>
#include <vector>

#include "core/error.h"

namespace llmt {

Model::Model(const ModelConfig& config) : config_(config) {
  const int64_t V = config.vocab_size, D = config.d_model;
  const Init normal{Init::normal, config.init_std};
  embedding_ = store_.add("model.embeddings.weight", {V, D}, ParamKind::embedding, normal);
  for (int64_t l = 0; l < config.n_layers; ++l) {
    block_offset_.push_back(store_.total());  // a block registers its parameters one after another
    blocks_.push_back(std::make_unique<Block>(config.mixer_of(l), config, store_, fmt::format("model.layers.{}.", l)));
  }
  block_offset_.push_back(store_.total());
  final_norm_ = store_.add("model.norm.weight", {D}, ParamKind::norm, Init{Init::ones, 0});
  if (!config.tie_embeddings) lm_head_ = store_.add("lm_head.weight", {V, D}, ParamKind::weight, normal);
}

ParamCounts Model::counts() const {
  ParamCounts c;
  c.total = store_.total();
  c.embedding = store_.infos()[embedding_].numel + (lm_head_ >= 0 ? store_.infos()[lm_head_].numel : 0);
  c.non_embedding = c.total - c.embedding;
  return c;
}

int64_t Model::training_flops_per_token(int64_t seq_len) const {
  const ModelConfig& m = config_;
  const int64_t head = m.vocab_size * m.d_model;
  int64_t attn_layers = 0;
  for (int64_t l = 0; l < m.n_layers; ++l) attn_layers += m.mixer_of(l) == "transformer" ? 1 : 0;
  const int64_t attn = 12 * attn_layers * m.attn.num_heads * m.attn.head_dim * seq_len;
  return 6 * (counts().non_embedding + head) + attn;
}

void Model::plan(int64_t batch, int64_t seq_len, bool recompute) {
  if (batch == batch_ && seq_len == seq_len_ && recompute == recompute_) return;
  batch_ = batch;
  seq_len_ = seq_len;
  recompute_ = recompute;
  const int64_t rows = batch * seq_len, D = config_.d_model;
  Backend& be = store_.backend();
  const DType dt = store_.dtype(), ct = store_.compute_dtype();
  ids_ = OwnedTensor(be, DType::i32, {rows});
  targets_ = OwnedTensor(be, DType::i32, {rows});
  resid_.clear();
  for (int64_t l = 0; l <= config_.n_layers; ++l) resid_.emplace_back(be, dt, std::initializer_list<int64_t>{rows, D});
  for (OwnedTensor* t : {&dxf_, &dresid_}) *t = OwnedTensor(be, dt, {rows, D});
  xf_ = OwnedTensor(be, ct, {rows, D});
  rstdf_ = OwnedTensor(be, dt, {rows});
  head_rows_ = std::min(rows, be.head_chunk_rows());
  logits_ld_ = be.logits_stride(config_.vocab_size);
  logits_ = OwnedTensor(be, ct, {head_rows_, logits_ld_});
  losses_ = OwnedTensor(be, dt, {rows});
  // Without recompute the blocks' saved sets follow one another; with it every block starts at
  // the same base (only the block being forwarded or backpropagated holds live activations).
  saved_.reset();
  saved_ = bind_scratch(be, [&](void* base) {
    ScratchCarver all(base);
    size_t most = 0;
    for (auto& b : blocks_) {
      ScratchCarver one(base);
      b->plan(batch, seq_len, recompute ? one : all);
      most = std::max(most, one.used());
    }
    return recompute ? most : all.used();
  });
  scratch_.reset();
  scratch_ = bind_scratch(be, [&](void* base) {
    size_t most = 0;
    for (auto& b : blocks_) {
      ScratchCarver carver(base);  // every block starts at the same base: blocks run one at a time
      b->bind_scratch(carver);
      most = std::max(most, carver.used());
    }
    return most;
  });
  activation_bytes_.saved = saved_.bytes();
  activation_bytes_.residual = resid_.size() * resid_[0]->bytes();
  activation_bytes_.scratch = scratch_.bytes();
}

namespace {

/// Rows [r0, r0 + n) of a [rows, width] tensor.
Tensor row_view(const Tensor& t, int64_t r0, int64_t n, int64_t width) {
  return Tensor(static_cast<char*>(t.data) + r0 * width * dtype_size(t.dtype), t.dtype, {n, width});
}

/// t (f64, f32 or bf16) into host doubles (t.numel() of them).
void download_f64(Backend& be, const Tensor& t, double* out) {
  if (t.dtype == DType::f64) return be.download(t, out);
  std::vector<float> host(static_cast<size_t>(t.numel()));
  if (t.dtype == DType::f32) {
    be.download(t, host.data());
  } else {
    const OwnedTensor f32(be, DType::f32, {t.numel()});
    be.convert(t, *f32);
    be.download(*f32, host.data());
  }
  std::copy(host.begin(), host.end(), out);
}

}  // namespace

void Model::embed(const int32_t* ids, int64_t rows, const char* what) {
  const int64_t V = config_.vocab_size;
  for (int64_t i = 0; i < rows; ++i)
    check(ids[i] >= 0 && ids[i] < V, "token id {} at {} position {} is outside the vocabulary of {}", ids[i], what,
          i, V);
  Backend& be = store_.backend();
  const Tensor ids_t = ids_->reshape({rows});
  be.upload(ids, ids_t);
  be.embedding_fwd(ids_t, store_.master(embedding_), resid_[0]->reshape({rows, config_.d_model}));
}

void Model::final_norm() {
  store_.backend().rmsnorm_fwd(*resid_.back(), store_.master(final_norm_), config_.norm_eps, *xf_, *rstdf_);
}

Tensor Model::head_chunk(int64_t r0, int64_t n) {
  const Tensor logits_c(logits_->data, logits_->dtype, {n, config_.vocab_size});
  const Tensor W = store_.param(lm_head_ >= 0 ? lm_head_ : embedding_);
  store_.backend().matmul_strided(row_view(*xf_, r0, n, config_.d_model), 0, false, W, true, logits_c, logits_ld_,
                                  false);
  return logits_c;
}

void Model::download_head_chunk(int64_t r0, int64_t n, double* out) {
  const int64_t V = config_.vocab_size;
  head_chunk(r0, n);
  std::vector<double> rows(static_cast<size_t>(n * logits_ld_));
  download_f64(store_.backend(), Tensor(logits_->data, logits_->dtype, {n, logits_ld_}), rows.data());
  for (int64_t r = 0; r < n; ++r) std::copy_n(rows.data() + r * logits_ld_, V, out + r * V);
}

void Model::download_logits(int64_t rows, double* out) {
  for (int64_t r0 = 0; r0 < rows; r0 += head_rows_) {
    const int64_t n = std::min(head_rows_, rows - r0);
    download_head_chunk(r0, n, out + r0 * config_.vocab_size);
  }
}

void Model::logits(const int32_t* inputs, double* out) {
  check(batch_ > 0, "Model::logits before plan()");
  const int64_t rows = batch_ * seq_len_;
  embed(inputs, rows, "input");
  for (size_t l = 0; l < blocks_.size(); ++l) blocks_[l]->forward(*resid_[l], *resid_[l + 1]);
  final_norm();
  download_logits(rows, out);
}

DecodeState Model::start_decode(int64_t batch, int64_t max_len) {
  check(batch >= 1 && max_len >= 1, "Model::start_decode: batch ({}) and max_len ({}) must be >= 1", batch,
        max_len);
  DecodeState state;
  state.batch = batch;
  state.max_len = max_len;
  for (auto& b : blocks_) state.layers.push_back(b->decode_state(batch, max_len));
  return state;
}

void Model::decode(const int32_t* ids, DecodeState& state, double* logits) {
  check(state.layers.size() == blocks_.size(), "Model::decode: the state was not made by this model's start_decode");
  plan(state.batch, 1);
  continue_decode(ids, state, logits);
}

void Model::prefill(const int32_t* ids, int64_t n, DecodeState& state, double* logits) {
  check(n >= 1, "Model::prefill: the prompt is empty");
  check(state.layers.size() == blocks_.size(), "Model::prefill: the state was not made by this model's start_decode");
  plan(state.batch, n);
  continue_decode(ids, state, logits);
}

void Model::continue_decode(const int32_t* ids, DecodeState& state, double* logits) {
  check(state.position + seq_len_ <= state.max_len,
        "Model::decode: {} more tokens do not fit: the sequences are full at {} tokens (the max_len of "
        "start_decode), {} used", seq_len_, state.max_len, state.position);
  embed(ids, batch_ * seq_len_, "decode");
  for (size_t l = 0; l < blocks_.size(); ++l)
    blocks_[l]->decode(*resid_[l], state.layers[l], state.position, *resid_[l + 1]);
  final_norm();
  // The last row of each sequence (all rows when decoding one token).
  if (seq_len_ == 1) {
    download_logits(batch_, logits);
  } else {
    for (int64_t b = 0; b < batch_; ++b)
      download_head_chunk(b * seq_len_ + seq_len_ - 1, 1, logits + b * config_.vocab_size);
  }
  state.position += seq_len_;
}

double Model::forward(const int32_t* inputs, const int32_t* targets, bool with_grad, double grad_scale,
                      uint8_t* correct) {
  check(batch_ > 0, "Model::forward before plan()");
  Backend& be = store_.backend();
  const int64_t rows = batch_ * seq_len_, D = config_.d_model, V = config_.vocab_size;
  embed(inputs, rows, "input");
  for (int64_t i = 0; i < rows; ++i)
    check(targets[i] < V, "token id {} at target position {} is outside the vocabulary of {}", targets[i], i, V);
  if (correct && (correct_->data == nullptr || correct_->numel() != rows))
    correct_ = OwnedTensor(be, losses_->dtype, {rows});
  be.upload(targets, *targets_);
  for (size_t l = 0; l < blocks_.size(); ++l) blocks_[l]->forward(*resid_[l], *resid_[l + 1]);
  final_norm();

  // LM head + cross-entropy over row chunks: logits_c = xf_c W^T; the loss kernel turns
  // logits_c into grad_scale * dL/dlogits_c, from which dxf_c and dW follow at once.
  const int head = lm_head_ >= 0 ? lm_head_ : embedding_;
  const Tensor W = store_.param(head), dW = store_.grad(head);
  for (int64_t r0 = 0; r0 < rows; r0 += head_rows_) {
    const int64_t n = std::min(head_rows_, rows - r0);
    const Tensor xf_c = row_view(*xf_, r0, n, D);
    const Tensor logits_c = head_chunk(r0, n);
    const Tensor losses_c = row_view(*losses_, r0, n, 1).reshape({n});
    const Tensor targets_c(static_cast<int32_t*>(targets_->data) + r0, DType::i32, {n});
    be.cross_entropy_strided(logits_c, logits_ld_, targets_c, with_grad ? grad_scale : 0.0, losses_c,
                     correct ? row_view(*correct_, r0, n, 1).reshape({n}) : Tensor());
    if (with_grad) {
      be.matmul_strided(logits_c, logits_ld_, false, W, false, row_view(*dxf_, r0, n, D), 0, false);  // dxf_c = dlogits W
      be.matmul_strided(logits_c, logits_ld_, true, xf_c, false, dW, 0, true);  // dW += dlogits^T xf_c
    }
  }
  if (correct) {
    std::vector<double> flags(rows);
    download_f64(be, *correct_, flags.data());
    for (int64_t i = 0; i < rows; ++i) correct[i] = flags[i] > 0.5 ? 1 : 0;
  }
  return be.sum(*losses_);
}

void Model::backward(const GradReadyHook& on_ready) {
  const auto ready = [&](int64_t begin, int64_t end) {
    if (on_ready) on_ready(begin, end);
  };
  Backend& be = store_.backend();
  be.fill_zero(*dresid_);
  be.rmsnorm_bwd(*dxf_, *resid_.back(), store_.master(final_norm_), *rstdf_, *dresid_, store_.grad(final_norm_));
  ready(block_offset_.back(), store_.total());  // the final norm and the untied LM head
  for (size_t l = blocks_.size(); l-- > 0;) {
    // With recompute the arena holds the last block's activations; the others are rebuilt from
    // the block's input (the forward is deterministic: it rewrites resid_[l + 1] with the same values).
    if (recompute_ && l + 1 < blocks_.size()) blocks_[l]->forward(*resid_[l], *resid_[l + 1]);
    blocks_[l]->backward(*resid_[l], *dresid_);
    ready(block_offset_[l], block_offset_[l + 1]);
  }
  be.embedding_bwd(*ids_, *dresid_, store_.grad(embedding_));
  ready(0, block_offset_.front());
}

}  // namespace llmt
