// MDN gates and output correction, forward and backward (mdn.md §4.2, §4.4, §7.4), arithmetic in double.
#include "kernels/cpu/mdn_gates.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace llmt::cpu {

namespace {

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// softplus(x) = max(x, 0) + log1p(e^{-|x|}): never overflows.
double softplus(double x) { return std::max(x, 0.0) + std::log1p(std::exp(-std::abs(x))); }

// η and dη/dz_η for one token (mdn.md §4.4; the 2σ form is the Table 4 ablation).
struct Eta {
  double value, slope;
};
Eta eta_of(double z, const MdnGateOptions& opt) {
  const double u = z / opt.tau;
  if (opt.eta_two_sigmoid) {
    const double s = sigmoid(u);
    return {2.0 * s, 2.0 * s * (1.0 - s) / opt.tau};
  }
  const double t = std::tanh(u);
  return {1.0 + t, (1.0 - t * t) / opt.tau};
}

}  // namespace

template <typename T>
void mdn_gates_fwd(const T* z_alpha, const T* z_beta, const T* z_mu, const T* z_eta, const T* A_log,
                   const T* dt_bias, const T* Mu_log, const T* mu_bias, const T* log_factor, int64_t rows,
                   int64_t heads, const MdnGateOptions& opt, T* log_alpha, T* beta, T* log_mu, T* eta) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t j = r * heads + h;
      const double e = opt.momentum ? eta_of(z_eta[j], opt).value : 1.0;
      const double x = std::exp(static_cast<double>(log_factor[h])) * e, q = 1.0 + x * x;
      const double decay =
          -std::exp(static_cast<double>(A_log[h])) * softplus(static_cast<double>(z_alpha[j]) + dt_bias[h]);
      log_alpha[j] = static_cast<T>(opt.alpha_max ? decay - std::log1p(x * x) : decay);
      beta[j] = static_cast<T>(sigmoid(z_beta[j]) * (opt.beta_max ? x * x / q : 1.0));
      if (opt.momentum) {
        const double m = -std::exp(static_cast<double>(Mu_log[h])) * softplus(static_cast<double>(z_mu[j]) + mu_bias[h]);
        log_mu[j] = static_cast<T>(std::max(m, opt.min_log_mu));
      } else {
        log_mu[j] = -std::numeric_limits<T>::infinity();
      }
      eta[j] = static_cast<T>(e);
    }
  }
}

// x = s η, q = 1 + x²: ∂log α/∂x = -2x/q (0 without alpha_max), ∂β/∂x = σ(z_β) 2x/q², ∂x/∂log_factor = x,
// ∂x/∂η = s (mdn.md §7.4).
template <typename T>
void mdn_gates_bwd(const T* d_log_alpha, const T* d_beta, const T* d_log_mu, const T* d_eta, const T* z_alpha,
                   const T* z_beta, const T* z_mu, const T* z_eta, const T* A_log, const T* dt_bias, const T* Mu_log,
                   const T* mu_bias, const T* log_factor, int64_t rows, int64_t heads, const MdnGateOptions& opt,
                   T* dz_alpha, T* dz_beta, T* dz_mu, T* dz_eta, T* dA_log, T* ddt_bias, T* dMu_log, T* dmu_bias,
                   T* dlog_factor) {
  const auto H = static_cast<size_t>(heads);
  std::vector<double> dA(H, 0.0), ddt(H, 0.0), dMu(H, 0.0), dmub(H, 0.0), dlf(H, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t j = r * heads + h;
      const auto hh = static_cast<size_t>(h);
      const Eta e = opt.momentum ? eta_of(z_eta[j], opt) : Eta{1.0, 0.0};
      const double s = std::exp(static_cast<double>(log_factor[h])), x = s * e.value, q = 1.0 + x * x;
      const double dla = d_log_alpha[j], db = d_beta[j], sb = sigmoid(z_beta[j]);
      // α: log α = -A softplus(u) + log α_max(x) (or -A softplus(u)).
      const double A = std::exp(static_cast<double>(A_log[h])), u = static_cast<double>(z_alpha[j]) + dt_bias[h];
      const double dza = dla * (-A * sigmoid(u));
      dz_alpha[j] = static_cast<T>(dza);
      ddt[hh] += dza;
      dA[hh] += dla * (-A * softplus(u));
      // β = σ(z_β) β_max(x) (or σ(z_β)).
      const double bmax = opt.beta_max ? x * x / q : 1.0;
      dz_beta[j] = static_cast<T>(db * bmax * sb * (1.0 - sb));
      double dx = 0.0;
      if (opt.alpha_max) dx += dla * (-2.0 * x / q);
      if (opt.beta_max) dx += db * sb * 2.0 * x / (q * q);
      dlf[hh] += x * dx;
      if (!opt.momentum) continue;
      dz_eta[j] = static_cast<T>((static_cast<double>(d_eta[j]) + s * dx) * e.slope);
      // μ: log μ = max(-A_μ softplus(u_μ), floor); no gradient where the floor clamps.
      const double Am = std::exp(static_cast<double>(Mu_log[h])), um = static_cast<double>(z_mu[j]) + mu_bias[h];
      const double sp = softplus(um);
      if (-Am * sp < opt.min_log_mu) {
        dz_mu[j] = T(0);
        continue;
      }
      const double dlm = d_log_mu[j], dzm = dlm * (-Am * sigmoid(um));
      dz_mu[j] = static_cast<T>(dzm);
      dmub[hh] += dzm;
      dMu[hh] += dlm * (-Am * sp);
    }
  }
  for (size_t h = 0; h < H; ++h) {
    dA_log[h] = static_cast<T>(dA_log[h] + dA[h]);
    ddt_bias[h] = static_cast<T>(ddt_bias[h] + ddt[h]);
    dlog_factor[h] = static_cast<T>(dlog_factor[h] + dlf[h]);
    if (opt.momentum) {
      dMu_log[h] = static_cast<T>(dMu_log[h] + dMu[h]);
      dmu_bias[h] = static_cast<T>(dmu_bias[h] + dmub[h]);
    }
  }
}

template <typename T>
void mdn_correction_fwd(const T* q, const T* k, const T* D_log, int64_t rows, int64_t heads, int64_t dim,
                        T* q_out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h) {
      const double d = std::exp(static_cast<double>(D_log[h]));
      const int64_t base = (r * heads + h) * dim;
      for (int64_t c = 0; c < dim; ++c)
        q_out[base + c] = static_cast<T>(static_cast<double>(q[base + c]) - d * static_cast<double>(k[base + c]));
    }
}

template <typename T>
void mdn_correction_bwd(const T* dq_out, const T* k, const T* D_log, int64_t rows, int64_t heads, int64_t dim, T* dk,
                        T* dD_log) {
  std::vector<double> acc(static_cast<size_t>(heads), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h) {
      const double d = std::exp(static_cast<double>(D_log[h]));
      const int64_t base = (r * heads + h) * dim;
      double dot = 0.0;
      for (int64_t c = 0; c < dim; ++c) {
        const double g = dq_out[base + c];
        dot += g * static_cast<double>(k[base + c]);
        dk[base + c] = static_cast<T>(static_cast<double>(dk[base + c]) - d * g);
      }
      acc[static_cast<size_t>(h)] += -d * dot;
    }
  for (int64_t h = 0; h < heads; ++h) dD_log[h] = static_cast<T>(dD_log[h] + acc[static_cast<size_t>(h)]);
}

#define LLMT_MDN_GATES(T)                                                                                            \
  template void mdn_gates_fwd<T>(const T*, const T*, const T*, const T*, const T*, const T*, const T*, const T*,     \
                                 const T*, int64_t, int64_t, const MdnGateOptions&, T*, T*, T*, T*);                 \
  template void mdn_gates_bwd<T>(const T*, const T*, const T*, const T*, const T*, const T*, const T*, const T*,     \
                                 const T*, const T*, const T*, const T*, const T*, int64_t, int64_t,                 \
                                 const MdnGateOptions&, T*, T*, T*, T*, T*, T*, T*, T*, T*);                         \
  template void mdn_correction_fwd<T>(const T*, const T*, const T*, int64_t, int64_t, int64_t, T*);                  \
  template void mdn_correction_bwd<T>(const T*, const T*, const T*, int64_t, int64_t, int64_t, T*, T*);
LLMT_MDN_GATES(float)
LLMT_MDN_GATES(double)
#undef LLMT_MDN_GATES

}  // namespace llmt::cpu
