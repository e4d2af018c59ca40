// Per-(batch, head) helpers shared by the CPU delta-rule cores (gdn, comba, kda, mdn):
// copying one head's rows between the [B, T, H, width] layout and dense [T, width] double
// buffers, states, and small vector products. Internal to src/kernels/cpu.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu/gdn.h"

namespace llmt::cpu::delta {

using Vec = std::vector<double>;

// Copies the rows [b, t, h, 0:width) of a [B, T, H, width] tensor into out [T, width].
template <typename T>
Vec gather(const T* x, const DeltaDims& d, int64_t b, int64_t h, int64_t width) {
  Vec out(static_cast<size_t>(d.seq_len * width));
  for (int64_t t = 0; t < d.seq_len; ++t)
    for (int64_t c = 0; c < width; ++c) out[t * width + c] = x[((b * d.seq_len + t) * d.heads + h) * width + c];
  return out;
}

// Inverse of gather: writes in [T, width] to the rows [b, t, h, 0:width) of x.
template <typename T>
void scatter(const Vec& in, const DeltaDims& d, int64_t b, int64_t h, int64_t width, T* x) {
  for (int64_t t = 0; t < d.seq_len; ++t)
    for (int64_t c = 0; c < width; ++c)
      x[((b * d.seq_len + t) * d.heads + h) * width + c] = static_cast<T>(in[t * width + c]);
}

// Reads the [K, V] state of head (b, h) from a [B, H, K, V] tensor; zeros when src is null.
template <typename T>
Vec load_state(const T* src, const DeltaDims& d, int64_t b, int64_t h) {
  Vec s(static_cast<size_t>(d.key_dim * d.value_dim), 0.0);
  if (src != nullptr) {
    const T* in = src + (b * d.heads + h) * d.key_dim * d.value_dim;
    std::copy(in, in + d.key_dim * d.value_dim, s.begin());
  }
  return s;
}

// Writes a [K, V] state of head (b, h) into a [B, H, K, V] tensor (nothing when dst is null).
template <typename T>
void store_state(const Vec& s, const DeltaDims& d, int64_t b, int64_t h, T* dst) {
  if (dst == nullptr) return;
  T* out = dst + (b * d.heads + h) * d.key_dim * d.value_dim;
  for (size_t i = 0; i < s.size(); ++i) out[i] = static_cast<T>(s[i]);
}

inline double dot(const double* a, const double* b, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// o_t = S_t^T q_t, written to o [V].
inline void read_out(const Vec& S, const double* q, int64_t K, int64_t V, double* o) {
  for (int64_t j = 0; j < V; ++j) {
    double s = 0.0;
    for (int64_t c = 0; c < K; ++c) s += S[c * V + j] * q[c];
    o[j] = s;
  }
}

}  // namespace llmt::cpu::delta
