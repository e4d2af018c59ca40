// Rotary position embedding, GPT-NeoX rotate-half convention (layers-ssm-attn.md §3.3).
#include "kernels/cpu/rope.h"

#include <cmath>
#include <vector>

#include "core/error.h"

namespace llmt::cpu {
namespace {

// x0' = x0 cos(phi) - sign x1 sin(phi),  x1' = sign x0 sin(phi) + x1 cos(phi),
// phi[pos, i] = (position0 + pos) theta^(-2i/Dh) (layers-ssm-attn.md §3.3). sign = +1 is the forward
// rotation, sign = -1 its transpose (the backward).
template <typename T>
void rotate(T* x, int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim, double theta, double sign,
            int64_t position0) {
  check(head_dim > 0 && head_dim % 2 == 0, "rope: head_dim must be even and positive, got {}", head_dim);
  const int64_t half = head_dim / 2;
  std::vector<double> cos_t(static_cast<size_t>(seq_len * half)), sin_t(static_cast<size_t>(seq_len * half));
  for (int64_t pos = 0; pos < seq_len; ++pos) {
    for (int64_t i = 0; i < half; ++i) {
      const double phi =
          static_cast<double>(position0 + pos) * std::pow(theta, -2.0 * static_cast<double>(i) / head_dim);
      cos_t[pos * half + i] = std::cos(phi);
      sin_t[pos * half + i] = sign * std::sin(phi);
    }
  }
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t pos = 0; pos < seq_len; ++pos) {
      const double* c = cos_t.data() + pos * half;
      const double* s = sin_t.data() + pos * half;
      for (int64_t h = 0; h < heads; ++h) {
        T* xh = x + ((b * seq_len + pos) * heads + h) * head_dim;
        for (int64_t i = 0; i < half; ++i) {
          const double x0 = xh[i], x1 = xh[half + i];
          xh[i] = static_cast<T>(x0 * c[i] - x1 * s[i]);
          xh[half + i] = static_cast<T>(x0 * s[i] + x1 * c[i]);
        }
      }
    }
  }
}

}  // namespace

template <typename T>
void rope_fwd(T* x, int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim, double theta) {
  rotate(x, batch, seq_len, heads, head_dim, theta, 1.0, 0);
}

template <typename T>
void rope_fwd_at(T* x, int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim, double theta,
                 int64_t position0) {
  rotate(x, batch, seq_len, heads, head_dim, theta, 1.0, position0);
}

// Backward: the same rotation with sin -> -sin (layers-ssm-attn.md §3.3).
template <typename T>
void rope_bwd(T* dx, int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim, double theta) {
  rotate(dx, batch, seq_len, heads, head_dim, theta, -1.0, 0);
}

template void rope_fwd<float>(float*, int64_t, int64_t, int64_t, int64_t, double);
template void rope_fwd<double>(double*, int64_t, int64_t, int64_t, int64_t, double);
template void rope_fwd_at<float>(float*, int64_t, int64_t, int64_t, int64_t, double, int64_t);
template void rope_fwd_at<double>(double*, int64_t, int64_t, int64_t, int64_t, double, int64_t);
template void rope_bwd<float>(float*, int64_t, int64_t, int64_t, int64_t, double);
template void rope_bwd<double>(double*, int64_t, int64_t, int64_t, int64_t, double);

}  // namespace llmt::cpu
