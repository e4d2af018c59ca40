// Causal multi-head softmax attention, CPU reference (layers-ssm-attn.md §3.3).
// Direct loops over (batch, head, query); softmax statistics and accumulations in double.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace llmt::cpu {
namespace {

// Offset of element [b, t, h, 0] in a [batch, seq_len, heads, head_dim] tensor.
int64_t offset(int64_t b, int64_t t, int64_t h, int64_t seq_len, int64_t heads, int64_t head_dim) {
  return ((b * seq_len + t) * heads + h) * head_dim;
}

template <typename T>
double dot(const T* a, const T* b, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

}  // namespace

// S_ts = scale q_t.k_s (s <= t);  lse_t = log Σ_{s<=t} exp(S_ts);  o_t = Σ_{s<=t} exp(S_ts - lse_t) v_s
// (layers-ssm-attn.md §3.3)
template <typename T>
void attention_fwd(const T* q, const T* k, const T* v, int64_t batch, int64_t seq_len, int64_t heads,
                   int64_t head_dim, double scale, T* o, T* lse) {
  std::vector<double> p(static_cast<size_t>(seq_len)), acc(static_cast<size_t>(head_dim));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t t = 0; t < seq_len; ++t) {
        const T* qt = q + offset(b, t, h, seq_len, heads, head_dim);
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t s = 0; s <= t; ++s) {
          p[s] = scale * dot(qt, k + offset(b, s, h, seq_len, heads, head_dim), head_dim);
          mx = std::max(mx, p[s]);
        }
        double sum = 0.0;
        for (int64_t s = 0; s <= t; ++s) {
          p[s] = std::exp(p[s] - mx);
          sum += p[s];
        }
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t s = 0; s <= t; ++s) {
          const T* vs = v + offset(b, s, h, seq_len, heads, head_dim);
          for (int64_t d = 0; d < head_dim; ++d) acc[d] += p[s] * vs[d];
        }
        T* ot = o + offset(b, t, h, seq_len, heads, head_dim);
        for (int64_t d = 0; d < head_dim; ++d) ot[d] = static_cast<T>(acc[d] / sum);
        lse[(b * heads + h) * seq_len + t] = static_cast<T>(mx + std::log(sum));
      }
    }
  }
}

// P_ts = exp(scale q_t.k_s - lse_t);  dV = P^T dO;  dP = dO V^T;  Delta_t = Σ_d dO_td O_td;
// dS = P ∘ (dP - Delta);  dQ = scale dS K;  dK = scale dS^T Q   (layers-ssm-attn.md §3.3)
template <typename T>
void attention_bwd(const T* q, const T* k, const T* v, const T* o, const T* lse, const T* dout, int64_t batch,
                   int64_t seq_len, int64_t heads, int64_t head_dim, double scale, T* dq, T* dk, T* dv) {
  std::vector<double> dq_acc(static_cast<size_t>(head_dim));
  std::vector<double> dk_acc(static_cast<size_t>(seq_len * head_dim)), dv_acc(static_cast<size_t>(seq_len * head_dim));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      std::fill(dk_acc.begin(), dk_acc.end(), 0.0);
      std::fill(dv_acc.begin(), dv_acc.end(), 0.0);
      for (int64_t t = 0; t < seq_len; ++t) {
        const int64_t at = offset(b, t, h, seq_len, heads, head_dim);
        const T* qt = q + at;
        const T* dout_t = dout + at;
        const double lse_t = lse[(b * heads + h) * seq_len + t];
        const double delta = dot(dout_t, o + at, head_dim);
        std::fill(dq_acc.begin(), dq_acc.end(), 0.0);
        for (int64_t s = 0; s <= t; ++s) {
          const T* ks = k + offset(b, s, h, seq_len, heads, head_dim);
          const T* vs = v + offset(b, s, h, seq_len, heads, head_dim);
          const double p = std::exp(scale * dot(qt, ks, head_dim) - lse_t);
          const double ds = p * (dot(dout_t, vs, head_dim) - delta);
          for (int64_t d = 0; d < head_dim; ++d) {
            dv_acc[s * head_dim + d] += p * dout_t[d];
            dk_acc[s * head_dim + d] += scale * ds * qt[d];
            dq_acc[d] += scale * ds * ks[d];
          }
        }
        for (int64_t d = 0; d < head_dim; ++d) dq[at + d] = static_cast<T>(dq_acc[d]);
      }
      for (int64_t s = 0; s < seq_len; ++s) {
        const int64_t as = offset(b, s, h, seq_len, heads, head_dim);
        for (int64_t d = 0; d < head_dim; ++d) {
          dk[as + d] = static_cast<T>(dk_acc[s * head_dim + d]);
          dv[as + d] = static_cast<T>(dv_acc[s * head_dim + d]);
        }
      }
    }
  }
}

// The forward's rows t = position .. position + seq_len - 1 over the cached keys and values (§3.3).
template <typename T>
void attention_decode(const T* q, const T* k, const T* v, int64_t batch, int64_t seq_len, int64_t heads,
                      int64_t head_dim, int64_t capacity, int64_t position, double scale, T* k_cache, T* v_cache,
                      T* o) {
  std::vector<double> p(static_cast<size_t>(position + seq_len)), acc(static_cast<size_t>(head_dim));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < seq_len; ++t)
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t row = offset(b, t, h, seq_len, heads, head_dim);
        const int64_t slot = offset(b, position + t, h, capacity, heads, head_dim);
        std::copy(k + row, k + row + head_dim, k_cache + slot);
        std::copy(v + row, v + row + head_dim, v_cache + slot);
      }
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < seq_len; ++t)
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t row = offset(b, t, h, seq_len, heads, head_dim), last = position + t;
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t s = 0; s <= last; ++s) {
          p[s] = scale * dot(q + row, k_cache + offset(b, s, h, capacity, heads, head_dim), head_dim);
          mx = std::max(mx, p[s]);
        }
        double sum = 0.0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t s = 0; s <= last; ++s) {
          p[s] = std::exp(p[s] - mx);
          sum += p[s];
          const T* vs = v_cache + offset(b, s, h, capacity, heads, head_dim);
          for (int64_t d = 0; d < head_dim; ++d) acc[d] += p[s] * vs[d];
        }
        for (int64_t d = 0; d < head_dim; ++d) o[row + d] = static_cast<T>(acc[d] / sum);
      }
}

template void attention_decode<float>(const float*, const float*, const float*, int64_t, int64_t, int64_t, int64_t,
                                      int64_t, int64_t, double, float*, float*, float*);
template void attention_decode<double>(const double*, const double*, const double*, int64_t, int64_t, int64_t,
                                       int64_t, int64_t, int64_t, double, double*, double*, double*);
template void attention_fwd<float>(const float*, const float*, const float*, int64_t, int64_t, int64_t, int64_t,
                                   double, float*, float*);
template void attention_fwd<double>(const double*, const double*, const double*, int64_t, int64_t, int64_t,
                                    int64_t, double, double*, double*);
template void attention_bwd<float>(const float*, const float*, const float*, const float*, const float*,
                                   const float*, int64_t, int64_t, int64_t, int64_t, double, float*, float*, float*);
template void attention_bwd<double>(const double*, const double*, const double*, const double*, const double*,
                                    const double*, int64_t, int64_t, int64_t, int64_t, double, double*, double*,
                                    double*);

}  // namespace llmt::cpu
