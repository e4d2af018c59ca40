// Mamba-3 layer-op inputs shared by the GPU tests of mamba3_fwd / mamba3_bwd (cuda_mamba3_test.cpp) and
// mamba3_decode (cuda_decode_test.cpp): a call's sizes and options, and its parameters on both backends.
#pragma once
#include <cstdint>
#include <vector>

#include "cuda_test_util.h"
#include "mamba3_case.h"
#include "kernels/backend.h"

namespace llmt::test {

// The parameters (or, with scale 0.1 around 0, their accumulated gradients' start) on both backends; the
// mimo_* and norm pairs are absent (null tensors) for SISO / without the output norm.
struct Params {
  std::vector<Pair> pairs;  // dt_bias, B_bias, C_bias, B_norm, C_norm, D, [mimo_x, mimo_z, mimo_o], [norm]
  std::vector<std::string> names;
  int mimo = -1, norm = -1;
  llmt::Backend::Mamba3Params on(bool gpu_side) const {
    auto t = [&](int i) { return i < 0 ? llmt::Tensor() : gpu_side ? *pairs[i].g : *pairs[i].c; };
    return {t(0), t(1), t(2), t(3), t(4), t(5), t(mimo), t(mimo < 0 ? -1 : mimo + 1), t(mimo < 0 ? -1 : mimo + 2),
            t(norm)};
  }
};

Params make_params(const Case& c, uint64_t seed, bool grads) {
  const size_t H = c.H, RN = c.H * c.R * c.N, RP = c.H * c.R * c.P, N = c.N, HP = c.H * c.P;
  const double R = static_cast<double>(c.R);
  auto val = [&](size_t n, double centre, uint64_t s) { return grads ? randn(n, s, 0.1) : around(n, centre, s); };
  Params p;
  p.pairs.push_back(both(grads ? randn(H, seed, 0.1) : uniform(H, seed, c.bias_lo, c.bias_hi), {c.H}));
  p.pairs.push_back(both(val(RN, 1.0, seed + 1), {c.H, c.R, c.N}));
  p.pairs.push_back(both(val(RN, 1.0, seed + 2), {c.H, c.R, c.N}));
  p.pairs.push_back(both(val(N, 1.0, seed + 3), {c.N}));
  p.pairs.push_back(both(val(N, 1.0, seed + 4), {c.N}));
  p.pairs.push_back(both(val(H, 1.0, seed + 5), {c.H}));
  p.names = {"dt_bias", "B_bias", "C_bias", "B_norm", "C_norm", "D"};
  if (c.R > 1) {
    p.mimo = static_cast<int>(p.pairs.size());
    p.names.insert(p.names.end(), {"mimo_x", "mimo_z", "mimo_o"});
    p.pairs.push_back(both(val(RP, 1.0 / R, seed + 6), {c.H, c.R, c.P}));
    p.pairs.push_back(both(val(RP, 1.0, seed + 7), {c.H, c.R, c.P}));
    p.pairs.push_back(both(val(RP, 1.0 / R, seed + 8), {c.H, c.R, c.P}));
  }
  if (c.norm) {
    p.norm = static_cast<int>(p.pairs.size());
    p.names.push_back("norm");
    p.pairs.push_back(both(val(HP, 1.0, seed + 9), {c.H * c.P}));
  }
  return p;
}

}  // namespace llmt::test
