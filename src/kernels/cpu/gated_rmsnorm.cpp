// FusedRMSNormGated forward and backward (layers-delta.md §2.3; the gate after the norm) and Mamba2's gated RMSNorm
// (layers-ssm-attn.md §1.2; the gate first), statistics in double.
#include "kernels/cpu/gated_rmsnorm.h"

#include <cmath>
#include <vector>

namespace llmt::cpu {

namespace {

struct Gate {
  double phi, dphi;  // phi(z) and phi'(z)
};

// sigmoid: phi = σ(z), phi' = σ(1 - σ);  silu: phi = z σ(z), phi' = σ(1 + z(1 - σ))
Gate gate(double z, bool sigmoid_gate) {
  const double sig = 1.0 / (1.0 + std::exp(-z));
  if (sigmoid_gate) return {sig, sig * (1.0 - sig)};
  return {z * sig, sig * (1.0 + z * (1.0 - sig))};
}

}  // namespace

// rho = (mean_c(o_c^2) + eps)^(-1/2);  ô = o rho;  y = ô ∘ w ∘ phi(z)   (layers-delta.md §2.3)
template <typename T>
void gated_rmsnorm_fwd(const T* o, const T* z, const T* w, int64_t rows, int64_t dim, double eps, bool sigmoid_gate,
                       T* y, T* rstd) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* orow = o + r * dim;
    const T* zrow = z + r * dim;
    T* yrow = y + r * dim;
    double ss = 0.0;
    for (int64_t j = 0; j < dim; ++j) ss += static_cast<double>(orow[j]) * orow[j];
    const double rho = 1.0 / std::sqrt(ss / static_cast<double>(dim) + eps);
    for (int64_t j = 0; j < dim; ++j)
      yrow[j] = static_cast<T>(static_cast<double>(orow[j]) * rho * w[j] * gate(zrow[j], sigmoid_gate).phi);
    rstd[r] = static_cast<T>(rho);
  }
}

// dz = dy ∘ ô ∘ w ∘ phi'(z);  dw += Σ_rows dy ∘ ô ∘ phi(z);  dô = dy ∘ w ∘ phi(z);
// do = rho (dô - ô (1/d_v) Σ_c dô_c ô_c)   (layers-delta.md §2.3)
template <typename T>
void gated_rmsnorm_bwd(const T* dy, const T* o, const T* z, const T* w, const T* rstd, int64_t rows, int64_t dim,
                       bool sigmoid_gate, T* d_o, T* dz, T* dw) {
  std::vector<double> dw_acc(static_cast<size_t>(dim), 0.0);
  std::vector<double> dohat(static_cast<size_t>(dim));
  for (int64_t r = 0; r < rows; ++r) {
    const T* dyr = dy + r * dim;
    const T* orow = o + r * dim;
    const T* zrow = z + r * dim;
    T* dor = d_o + r * dim;
    T* dzr = dz + r * dim;
    const double rho = rstd[r];
    double proj = 0.0;  // Σ_c dô_c ô_c
    for (int64_t j = 0; j < dim; ++j) {
      const double ohat = static_cast<double>(orow[j]) * rho;
      const Gate gt = gate(zrow[j], sigmoid_gate);
      const double d = dyr[j];
      dzr[j] = static_cast<T>(d * ohat * w[j] * gt.dphi);
      dw_acc[static_cast<size_t>(j)] += d * ohat * gt.phi;
      dohat[static_cast<size_t>(j)] = d * w[j] * gt.phi;
      proj += dohat[static_cast<size_t>(j)] * ohat;
    }
    const double mean_proj = proj / static_cast<double>(dim);
    for (int64_t j = 0; j < dim; ++j)
      dor[j] = static_cast<T>(rho * (dohat[static_cast<size_t>(j)] - static_cast<double>(orow[j]) * rho * mean_proj));
  }
  for (int64_t j = 0; j < dim; ++j) dw[j] = static_cast<T>(dw[j] + dw_acc[static_cast<size_t>(j)]);
}

// u = y silu(z);  rho = (mean_c(u_c^2) + eps)^(-1/2);  out = u rho ∘ w   (layers-ssm-attn.md §1.2, Mamba2)
template <typename T>
void gate_rmsnorm_fwd(const T* y, const T* z, const T* w, int64_t rows, int64_t dim, double eps, T* out, T* rstd) {
  std::vector<double> u(static_cast<size_t>(dim));
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0.0;
    for (int64_t j = 0; j < dim; ++j) {
      const size_t e = static_cast<size_t>(r * dim + j);
      u[static_cast<size_t>(j)] = static_cast<double>(y[e]) * gate(z[e], false).phi;
      ss += u[static_cast<size_t>(j)] * u[static_cast<size_t>(j)];
    }
    const double rho = 1.0 / std::sqrt(ss / static_cast<double>(dim) + eps);
    for (int64_t j = 0; j < dim; ++j) out[r * dim + j] = static_cast<T>(u[static_cast<size_t>(j)] * rho * w[j]);
    rstd[r] = static_cast<T>(rho);
  }
}

// û = u rho, dû = dout ∘ w;  du = rho (dû - û (1/dim) Σ_c dû_c û_c);  dy = du silu(z);  dz = du y silu'(z);
// dw += Σ_rows dout ∘ û   (layers-ssm-attn.md §1.1 on u, then §1.2)
template <typename T>
void gate_rmsnorm_bwd(const T* dout, const T* y, const T* z, const T* w, const T* rstd, int64_t rows, int64_t dim,
                      T* dy, T* dz, T* dw) {
  std::vector<double> dw_acc(static_cast<size_t>(dim), 0.0), uhat(static_cast<size_t>(dim)),
      duhat(static_cast<size_t>(dim));
  for (int64_t r = 0; r < rows; ++r) {
    const double rho = rstd[r];
    double proj = 0.0;  // Σ_c dû_c û_c
    for (int64_t j = 0; j < dim; ++j) {
      const size_t e = static_cast<size_t>(r * dim + j), c = static_cast<size_t>(j);
      uhat[c] = static_cast<double>(y[e]) * gate(z[e], false).phi * rho;
      duhat[c] = static_cast<double>(dout[e]) * w[j];
      dw_acc[c] += static_cast<double>(dout[e]) * uhat[c];
      proj += duhat[c] * uhat[c];
    }
    const double mean_proj = proj / static_cast<double>(dim);
    for (int64_t j = 0; j < dim; ++j) {
      const size_t e = static_cast<size_t>(r * dim + j), c = static_cast<size_t>(j);
      const double du = rho * (duhat[c] - uhat[c] * mean_proj);
      const Gate gt = gate(z[e], false);
      dy[e] = static_cast<T>(du * gt.phi);
      dz[e] = static_cast<T>(du * static_cast<double>(y[e]) * gt.dphi);
    }
  }
  for (int64_t j = 0; j < dim; ++j) dw[j] = static_cast<T>(dw[j] + dw_acc[static_cast<size_t>(j)]);
}

template void gate_rmsnorm_fwd<float>(const float*, const float*, const float*, int64_t, int64_t, double, float*,
                                      float*);
template void gate_rmsnorm_fwd<double>(const double*, const double*, const double*, int64_t, int64_t, double,
                                       double*, double*);
template void gate_rmsnorm_bwd<float>(const float*, const float*, const float*, const float*, const float*, int64_t,
                                      int64_t, float*, float*, float*);
template void gate_rmsnorm_bwd<double>(const double*, const double*, const double*, const double*, const double*,
                                       int64_t, int64_t, double*, double*, double*);
template void gated_rmsnorm_fwd<float>(const float*, const float*, const float*, int64_t, int64_t, double, bool,
                                       float*, float*);
template void gated_rmsnorm_fwd<double>(const double*, const double*, const double*, int64_t, int64_t, double, bool,
                                        double*, double*);
template void gated_rmsnorm_bwd<float>(const float*, const float*, const float*, const float*, const float*, int64_t,
                                       int64_t, bool, float*, float*, float*);
template void gated_rmsnorm_bwd<double>(const double*, const double*, const double*, const double*, const double*,
                                        int64_t, int64_t, bool, double*, double*, double*);

}  // namespace llmt::cpu
