// The scales the Mamba2 SSD tests compare the per-head parameter sums against with bf16 compute: shared by the GPU
// test (cuda_mamba2_test.cpp) and the CPU emulator's (emu/cuda_emu_mamba2_test.cpp). Host vectors only.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace llmt::test {

// The scales of the per-head sums ddt_bias, dA_log, dD [H] for bf16 compute: each adds B T per-token terms whose
// bf16 errors are independent, so its error grows like the terms' root-sum-square while the sum itself may
// cancel far below it (a CPU emulation of the bf16 kernels saw 3e-2 of max|ref| with H = 2 heads, and
// <= 1e-2 of this scale). Per head, sqrt(Σ_{b,t} term²) with the terms from the inputs and the CPU reference:
// ddt_raw (ddt_bias); A Δ da = Δ ddt_raw / σ - x·(dx - D dy) (dA_log; dx = Δ v̄ + D dy and
// ddt_raw = σ (x·v̄ + A da), σ = σ(dt_raw + dt_bias) the derivative of Δ); x·dy (dD). The largest over heads.
struct HeadSumScales {
  double dt_bias = 0, A_log = 0, D = 0;
};
// rows = B T tokens, H heads of P channels, xbc / dxbc rows of W = H P + 2 G N; the CPU reference's dxbc, ddt_raw.
inline HeadSumScales head_sum_scales(int64_t rows, int64_t H, int64_t P, int64_t W, const std::vector<float>& xbc,
                                     const std::vector<float>& dt_raw, const std::vector<float>& bias,
                                     const std::vector<float>& D, const std::vector<float>& dy,
                                     const std::vector<float>& dx, const std::vector<float>& ddt_raw) {
  const int64_t XD = H * P;
  std::vector<double> sb(H), sa(H), sd(H);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < H; ++h) {
      const double v = static_cast<double>(dt_raw[r * H + h]) + bias[h];
      const double delta = v > 20.0 ? v : std::log1p(std::exp(v)), sigma = v > 20.0 ? 1.0 : 1.0 / (1.0 + std::exp(-v));
      double xdy = 0.0, xvbar = 0.0;  // x·dy and x·(Δ v̄)
      for (int64_t p = 0; p < P; ++p) {
        const double x = xbc[r * W + h * P + p], d = dy[r * XD + h * P + p];
        xdy += x * d;
        xvbar += x * (dx[r * W + h * P + p] - D[h] * d);
      }
      const double gr = ddt_raw[r * H + h], da = delta * gr / sigma - xvbar;
      sb[h] += gr * gr;
      sa[h] += da * da;
      sd[h] += xdy * xdy;
    }
  HeadSumScales out;
  for (int64_t h = 0; h < H; ++h) {
    out.dt_bias = std::max(out.dt_bias, std::sqrt(sb[h]));
    out.A_log = std::max(out.A_log, std::sqrt(sa[h]));
    out.D = std::max(out.D, std::sqrt(sd[h]));
  }
  return out;
}

}  // namespace llmt::test
