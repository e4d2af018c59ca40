// ShortConvolution + SiLU forward and backward (layers-delta.md §2.1), arithmetic in double.
#include "kernels/cpu/short_conv.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

namespace llmt::cpu {

// pre_t[c] = bias[c] + Σ_{i=0}^{W-1} w[c,i] x_{t-W+1+i}[c] (x_τ = 0 for τ < 0);  y_t = silu(pre_t) = pre_t σ(pre_t)
// (layers-delta.md §2.1; layers-ssm-attn.md §1.4)
template <typename T>
void short_conv_silu_fwd(const T* x, const T* w, int64_t batch, int64_t seq_len, int64_t channels, int64_t width,
                         T* pre, T* y, const T* bias) {
  check(width >= 1, "short_conv: width must be >= 1, got {}", width);
  for (int64_t b = 0; b < batch; ++b) {
    const T* xb = x + b * seq_len * channels;
    for (int64_t t = 0; t < seq_len; ++t) {
      const int64_t i0 = std::max<int64_t>(0, width - 1 - t);  // first tap with a token at time >= 0
      const int64_t row = (b * seq_len + t) * channels;
      for (int64_t c = 0; c < channels; ++c) {
        double acc = bias != nullptr ? static_cast<double>(bias[c]) : 0.0;
        for (int64_t i = i0; i < width; ++i)
          acc += static_cast<double>(w[c * width + i]) * xb[(t - width + 1 + i) * channels + c];
        const double sig = 1.0 / (1.0 + std::exp(-acc));
        pre[row + c] = static_cast<T>(acc);
        y[row + c] = static_cast<T>(acc * sig);
      }
    }
  }
}

// ȳ_t = dy_t ∘ silu'(pre_t), silu'(z) = σ(z)(1 + z(1 - σ(z)));
// dx_τ[c] = Σ_i w[c,i] ȳ_{τ+W-1-i}[c] (terms past the end dropped);  dw[c,i] += Σ_{b,t} ȳ_t[c] x_{t-W+1+i}[c]
// dbias[c] += Σ_{b,t} ȳ_t[c]   (layers-delta.md §2.1; layers-ssm-attn.md §1.4)
template <typename T>
void short_conv_silu_bwd(const T* dy, const T* x, const T* w, const T* pre, int64_t batch, int64_t seq_len,
                         int64_t channels, int64_t width, T* dx, T* dw, T* dbias) {
  check(width >= 1, "short_conv: width must be >= 1, got {}", width);
  const int64_t n = batch * seq_len * channels;
  std::vector<double> ybar(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    const double z = pre[j];
    const double sig = 1.0 / (1.0 + std::exp(-z));
    ybar[static_cast<size_t>(j)] = static_cast<double>(dy[j]) * sig * (1.0 + z * (1.0 - sig));
  }
  std::vector<double> dw_acc(static_cast<size_t>(channels * width), 0.0);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t base = b * seq_len * channels;
    for (int64_t t = 0; t < seq_len; ++t) {
      // Tap i links input t-W+1+i to output t, and input t to output t+W-1-i.
      const int64_t row = base + t * channels;
      const int64_t i_in = std::max<int64_t>(0, width - 1 - t);          // taps whose input t-W+1+i >= 0
      const int64_t i_out = std::max<int64_t>(0, t + width - seq_len);   // taps whose output t+W-1-i < T
      for (int64_t c = 0; c < channels; ++c) {
        double acc = 0.0;
        for (int64_t i = i_out; i < width; ++i)
          acc += static_cast<double>(w[c * width + i]) * ybar[static_cast<size_t>(row + (width - 1 - i) * channels + c)];
        dx[row + c] = static_cast<T>(acc);
        const double yb = ybar[static_cast<size_t>(row + c)];
        for (int64_t i = i_in; i < width; ++i)
          dw_acc[static_cast<size_t>(c * width + i)] += yb * x[row + (i - width + 1) * channels + c];
      }
    }
  }
  for (int64_t j = 0; j < channels * width; ++j) dw[j] = static_cast<T>(dw[j] + dw_acc[static_cast<size_t>(j)]);
  if (dbias == nullptr) return;
  std::vector<double> db_acc(static_cast<size_t>(channels), 0.0);
  for (int64_t j = 0; j < n; ++j) db_acc[static_cast<size_t>(j % channels)] += ybar[static_cast<size_t>(j)];
  for (int64_t c = 0; c < channels; ++c) dbias[c] = static_cast<T>(dbias[c] + db_acc[static_cast<size_t>(c)]);
}

// The forward's pre_t[c] = bias[c] + Σ_i w[c,i] u_{t-W+1+i}[c] over u = [window; x] (window = the W - 1 inputs
// before x), then the window becomes the last W - 1 rows of u.
template <typename T>
void short_conv_silu_step(const T* x, const T* w, int64_t batch, int64_t seq_len, int64_t channels, int64_t width,
                          T* window, T* y, const T* bias) {
  check(width >= 1, "short_conv: width must be >= 1, got {}", width);
  const int64_t hist = width - 1, len = hist + seq_len;
  std::vector<double> u(static_cast<size_t>(len * channels));
  for (int64_t b = 0; b < batch; ++b) {
    T* win = window + b * hist * channels;
    std::copy(win, win + hist * channels, u.begin());
    std::copy(x + b * seq_len * channels, x + (b + 1) * seq_len * channels, u.begin() + hist * channels);
    for (int64_t t = 0; t < seq_len; ++t)
      for (int64_t c = 0; c < channels; ++c) {
        double acc = bias != nullptr ? static_cast<double>(bias[c]) : 0.0;
        for (int64_t i = 0; i < width; ++i) acc += static_cast<double>(w[c * width + i]) * u[(t + i) * channels + c];
        y[(b * seq_len + t) * channels + c] = static_cast<T>(acc / (1.0 + std::exp(-acc)));
      }
    for (int64_t i = 0; i < hist * channels; ++i) win[i] = static_cast<T>(u[seq_len * channels + i]);
  }
}

template void short_conv_silu_step<float>(const float*, const float*, int64_t, int64_t, int64_t, int64_t, float*,
                                          float*, const float*);
template void short_conv_silu_step<double>(const double*, const double*, int64_t, int64_t, int64_t, int64_t, double*,
                                           double*, const double*);
template void short_conv_silu_fwd<float>(const float*, const float*, int64_t, int64_t, int64_t, int64_t, float*,
                                         float*, const float*);
template void short_conv_silu_fwd<double>(const double*, const double*, int64_t, int64_t, int64_t, int64_t, double*,
                                          double*, const double*);
template void short_conv_silu_bwd<float>(const float*, const float*, const float*, const float*, int64_t, int64_t,
                                         int64_t, int64_t, float*, float*, float*);
template void short_conv_silu_bwd<double>(const double*, const double*, const double*, const double*, int64_t,
                                          int64_t, int64_t, int64_t, double*, double*, double*);

}  // namespace llmt::cpu
