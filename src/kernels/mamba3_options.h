// The options of the Mamba-3 layer op (layers-ssm-attn.md §4.1, §4.3), shared by the Backend interface
// (kernels/backend.h) and the CPU kernels (kernels/cpu/mamba3_layer.h).
#pragma once
#include <cstdint>

namespace llmt {

/// Options of the Mamba-3 layer op (§4.1 hyperparameters; §4.3.1 A activation; §4.3.4 output norm).
struct Mamba3Options {
  int64_t head_dim = 64;     ///< P
  int64_t n_groups = 1;      ///< G: head h reads the B/C group h / (H / G)
  int64_t rank = 1;          ///< R, MIMO rank; 1 = SISO (rotation pairs (2i, 2i+1); R > 1: (i, i + N/2))
  int64_t chunk_size = 64;   ///< Q of the chunked core (§4.4): 64 for SISO, 64 / R for MIMO
  double A_floor = 1e-4;     ///< A_t <= -A_floor
  bool heavy_tail = false;   ///< A_t = -f(dd_A), f(x) = 1 + x (x >= 0), 1 / (1 - x) (x < 0); false: softplus
  bool outproj_norm = false; ///< per-head RMSNorm_P of y before the gate (is_outproj_norm, §4.3.4)
  double eps = 1e-5;         ///< BCNorm and output-norm epsilon
  /// The CUDA core's products on the tensor cores, bf16 operands and fp32 sums (the model sets it for a bf16
  /// compute dtype; cuda/mamba3_core.cu "Precision"); false: exact fp32 products. The CPU backend ignores it.
  bool bf16_products = false;
};

}  // namespace llmt
