// A Mamba-3 layer-op test case (sizes and options) and its parameters' value distribution, host side only: shared
// by the GPU tests (cuda_mamba3_util.h) and the emulator test (emu/cuda_emu_mamba3_test.cpp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_test_host.h"
#include "kernels/mamba3_options.h"

namespace llmt::test {

// One call's sizes and options. dt_bias is drawn from [bias_lo, bias_hi) (dd_dt ~ N(0, 1)).
struct Case {
  int64_t B, T, H, P, N, G, R, S;
  bool norm = false, heavy_tail = false;
  double A_floor = 1e-4, bias_lo = -1.5, bias_hi = -0.5;
  uint64_t seed = 1;
  bool bf16 = false;  ///< Mamba3Options::bf16_products (the CUDA core's tensor-core path of bf16 models)
  /// (GPU tests) x, z, out, dout, dx, dz in bf16 on the GPU (Backend::mamba3_bf16_activations), the CPU reference on
  /// the same bf16-rounded inputs; with bf16 only (the CUDA op refuses them otherwise).
  bool bf16_acts = false;
  /// The layer options of this case (chunk 64 / rank, as the model sets it).
  Mamba3Options options() const {
    Mamba3Options opt;
    opt.head_dim = P;
    opt.n_groups = G;
    opt.rank = R;
    opt.chunk_size = 64 / R;
    opt.heavy_tail = heavy_tail;
    opt.outproj_norm = norm;
    opt.A_floor = A_floor;
    opt.bf16_products = bf16;
    return opt;
  }
  std::string tag() const {
    return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " H=" + std::to_string(H) + " P=" +
           std::to_string(P) + " N=" + std::to_string(N) + " G=" + std::to_string(G) + " R=" + std::to_string(R) +
           " S=" + std::to_string(S) + (norm ? " outproj_norm" : "") + (heavy_tail ? " heavy_tail" : "") +
           " A_floor=" + std::to_string(A_floor) + " dt_bias in [" + std::to_string(bias_lo) + ", " +
           std::to_string(bias_hi) + ")" + (bf16 ? " bf16 products" : "") + (bf16_acts ? " bf16 activations" : "");
  }
};

// n values around centre (N(centre, 0.3^2)): the parameters' start values.
inline std::vector<float> around(size_t n, double centre, uint64_t stream) {
  std::vector<float> v = randn(n, stream, 0.3);
  for (float& e : v) e += static_cast<float>(centre);
  return v;
}

}  // namespace llmt::test
