// One pre-norm block (runs.md section 2; layers-ssm-attn.md section 3.2):
//   h = x + Mixer(RMSNorm_attn(x));   x' = h + MLP(RMSNorm_mlp(h)).
// Without an MLP (model.mlp = null, ModelConfig::has_mlp; Mamba2 in the MDN paper,
// layers-ssm-attn.md section 2.1): x' = x + Mixer(RMSNorm_attn(x)).
// Parameter names follow flash-linear-attention: <prefix>attn_norm.weight, <prefix>attn.*,
// <prefix>mlp_norm.weight, <prefix>mlp.* (the last two only with an MLP).
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "kernels/backend.h"
#include "model/mixer.h"
#include "model/mlp.h"

namespace llmt {

class Block {
 public:
  Block(const std::string& mixer_type, const ModelConfig& config, ParamStore& store, const std::string& prefix);
  /// Takes the activations the block, its mixer and its MLP save for the backward from `saved`
  /// (model/scratch.h): its own arena, or one shared by all blocks under train.recompute.
  void plan(int64_t batch, int64_t seq_len, ScratchCarver& saved);
  /// Takes the temporaries of the block, its mixer and its MLP from the shared scratch.
  void bind_scratch(ScratchCarver& scratch);
  /// x_out = block(x_in); both [rows, D] in the master dtype (the residual stream); x_in must
  /// stay unchanged until backward. Deterministic: run again on the same x_in it rebuilds the
  /// same saved activations bit for bit (what recomputation relies on).
  void forward(const Tensor& x_in, const Tensor& x_out);
  /// In: dx = dL/dx_out. Out: dx = dL/dx_in (the same buffer, updated in place). Needs the
  /// saved activations of this block's last forward.
  void backward(const Tensor& x_in, const Tensor& dx);

  /// The zeroed decoding state of the block's mixer (Mixer::decode_state).
  MixerState decode_state(int64_t batch, int64_t max_len) const { return mixer_->decode_state(batch, max_len); }
  /// forward() for the planned seq_len new tokens per sequence from absolute `position`, x_in, x_out
  /// [batch * seq_len, D], the mixer continuing `state` (Mixer::decode).
  void decode(const Tensor& x_in, MixerState& state, int64_t position, const Tensor& x_out);

 private:
  /// The block around `mix` (xn -> branch): forward's mixer_->forward or decode's mixer_->decode.
  void run(const Tensor& x_in, const Tensor& x_out, const std::function<void(const Tensor&, const Tensor&)>& mix);

  ParamStore& store_;
  double eps_;
  int attn_norm_ = -1, mlp_norm_ = -1;
  std::unique_ptr<Mixer> mixer_;
  std::unique_ptr<SwiGluMlp> mlp_;  // null without an MLP
  Tensor xn1_, rstd1_, h_, xn2_, rstd2_;  // saved
  int64_t rows_ = 0, d_model_ = 0;
  Tensor branch_, dxn_;  // temporaries (shared scratch): sublayer output, normed-input grad
  Tensor dy_;            // the residual grad in the compute dtype (shared scratch; empty when that is f32)
};

}  // namespace llmt
