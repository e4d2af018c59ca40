// SwiGLU MLP (layers-ssm-attn.md section 1.3): y = down(silu(gate(x)) * up(x)); gate_proj,
// up_proj [F, D], down_proj [D, F], no biases, N(0, init_std^2); with model.init.residual_rescale
// "kaiming_div_sqrt" down_proj is U(±1/sqrt(F)) / sqrt(residual_rescale_n) (mamba_ssm's fc2, section 4.8).
#pragma once
#include <string>

#include "kernels/backend.h"
#include "model/config.h"
#include "model/params.h"
#include "model/scratch.h"

namespace llmt {

class SwiGluMlp {
 public:
  SwiGluMlp(const ModelConfig& config, ParamStore& store, const std::string& prefix);
  /// Takes its saved activations for [rows = batch * seq_len, d_model] inputs from `saved`.
  void plan(int64_t rows, ScratchCarver& saved);
  /// Takes its backward temporaries from the shared scratch (model/scratch.h).
  void bind_scratch(ScratchCarver& scratch);
  /// y = mlp(x), x and y [rows, D].
  void forward(const Tensor& x, const Tensor& y);
  /// dx = dL/dx (overwritten); parameter gradients accumulate.
  void backward(const Tensor& x, const Tensor& dy, const Tensor& dx);

 private:
  ParamStore& store_;
  int64_t d_model_, hidden_;
  int w_gate_, w_up_, w_down_;
  Tensor gate_, up_, h_;       // saved [rows, F]
  int64_t rows_ = 0;
  Tensor dh_, dgate_, dup_;         // backward temporaries [rows, F] (shared scratch)
};

}  // namespace llmt
