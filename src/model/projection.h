// A linear projection y = x W^T of a layer, full rank or low rank (FLA `nn.Sequential` of two
// `nn.Linear`s, as KDA's f_proj and g_proj, layers-delta.md section 4.3), under FLA parameter names:
//   rank 0:  `<name>.weight` [out, in]                               y = x W^T
//   rank r:  `<name>.0.weight` [r, in], `<name>.1.weight` [out, r]   y = (x W0^T) W1^T (+ b)
//            and, with bias, `<name>.1.bias` [out] (initialised 0, section 3.3)
// Weights are initialised N(0, std^2) (section 3.3). No activation between the two factors.
#pragma once
#include <cstdint>
#include <string>

#include "model/params.h"
#include "model/scratch.h"

namespace llmt {

class Projection {
 public:
  /// Registers the parameters in `store` under `name` (e.g. "model.layers.0.attn.g_proj"). rank 0 means
  /// full rank; bias needs rank > 0 (the only biased projection of the delta-rule layers, KDA g_proj[1]).
  /// Throws llmt::Error for a bias without rank.
  Projection(ParamStore& store, const std::string& name, int64_t in, int64_t out, int64_t rank, bool bias,
             double init_std);

  /// Takes the saved bottleneck activation [rows, rank] (low rank only) from `saved`; allocates the
  /// bias's ones column (a constant) once per row count.
  void plan(int64_t rows, ScratchCarver& saved);
  /// Takes the backward's bottleneck gradient [rows, rank] from the shared scratch (low rank only).
  void bind_scratch(ScratchCarver& scratch, int64_t rows);
  /// y [rows, out] = projection of x [rows, in] (overwritten); x in the compute dtype, y in the master
  /// dtype (ParamStore). Saves the bottleneck (compute dtype) for the backward.
  void forward(const Tensor& x, const Tensor& y);
  /// From dy [rows, out] (master dtype) and the x of the preceding forward: accumulates the parameter
  /// gradients and writes dx [rows, in] (master dtype) = dy W_eff (accumulate_dx true: dx += dy W_eff).
  void backward(const Tensor& x, const Tensor& dy, const Tensor& dx, bool accumulate_dx);

 private:
  ParamStore& store_;
  int64_t in_, out_, rank_;
  int w0_ = -1, w1_ = -1, bias_ = -1;  // w0_ is the only weight at rank 0
  Tensor hidden_;                      // [rows, rank] bottleneck x W0^T (saved)
  OwnedTensor ones_;                   // [rows, 1] of ones (bias; a constant, outside the saved arena)
  Tensor dhidden_;                     // backward temporary (shared scratch)
  Tensor dy_c_;                        // dy rounded to the compute dtype (shared scratch; only when it differs)
};

}  // namespace llmt
