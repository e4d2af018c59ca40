// Mamba-3 per-token scalars and vectors, CPU reference (layers-ssm-attn.md §4.3.1, §4.5 steps 3–6).
#include "kernels/cpu/mamba3_prep.h"

#include <cmath>
#include <utility>

#include "core/error.h"

namespace llmt::cpu {
namespace {

using Vec = std::vector<double>;
constexpr double kPi = 3.14159265358979323846;

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
// The reference softplus: the identity above 20 (§1.5); its derivative is σ(x), 1 above 20.
double softplus(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }
double softplus_grad(double x) { return x > 20.0 ? 1.0 : sigmoid(x); }

// The rotated pair of angle i: adjacent (2i, 2i + 1) for SISO, (i, i + N/2) for MIMO (§4.3.1).
std::pair<int64_t, int64_t> pair_of(int64_t i, const Mamba3LayerDims& d) {
  return d.rank == 1 ? std::make_pair(2 * i, 2 * i + 1) : std::make_pair(i, i + d.state_dim / 2);
}

void check_dims(const Mamba3LayerDims& d) {
  check(d.groups >= 1 && d.heads % d.groups == 0, "mamba3: n_groups ({}) must divide the number of heads ({})",
        d.groups, d.heads);
  check(d.angles >= 0 && 2 * d.angles <= d.state_dim && (d.rank == 1 || d.state_dim % 2 == 0),
        "mamba3: {} rotation angles do not fit d_state {}", d.angles, d.state_dim);
}

// RMSNorm over N of one row (§1.1, no weight): n = x r, r = 1 / sqrt(mean(x^2) + eps); returns r.
template <typename T>
double normalise(const T* x, int64_t N, double eps, double* n) {
  double ss = 0.0;
  for (int64_t i = 0; i < N; ++i) ss += static_cast<double>(x[i]) * x[i];
  const double r = 1.0 / std::sqrt(ss / static_cast<double>(N) + eps);
  for (int64_t i = 0; i < N; ++i) n[i] = x[i] * r;
  return r;
}

// Rotates pairs of u [N] by φ [S] in place: (u0, u1) -> (u0 cos - u1 sin, u0 sin + u1 cos); sign -1 un-rotates.
void rotate(double* u, const double* phi, const Mamba3LayerDims& d, double sign) {
  for (int64_t i = 0; i < d.angles; ++i) {
    const auto [i0, i1] = pair_of(i, d);
    const double c = std::cos(phi[i]), s = sign * std::sin(phi[i]), u0 = u[i0], u1 = u[i1];
    u[i0] = u0 * c - u1 * s;
    u[i1] = u0 * s + u1 * c;
  }
}

}  // namespace

template <typename T>
Mamba3Prep mamba3_prep_fwd(const T* bc, const T* raw, const Mamba3PrepParams<T>& pr, const Mamba3LayerDims& d,
                           const Mamba3Options& opt, const T* phase0) {
  check_dims(d);
  const int64_t H = d.heads, R = d.rank, N = d.state_dim, G = d.groups, S = d.angles, rows = d.batch * d.seq_len;
  const int64_t RGN = R * G * N, W = 3 * H + S;
  Mamba3Prep p;
  const size_t tok = static_cast<size_t>(rows * H);
  for (Vec* v : {&p.a, &p.gamma, &p.eps, &p.dt, &p.lam, &p.A, &p.clamped}) v->assign(tok, 0.0);
  p.q.assign(tok * R * N, 0.0);
  p.k.assign(tok * R * N, 0.0);
  p.theta.assign(static_cast<size_t>(rows * S), 0.0);
  p.phi.assign(tok * S, 0.0);
  p.nb.assign(static_cast<size_t>(rows * RGN), 0.0);
  p.nc.assign(static_cast<size_t>(rows * RGN), 0.0);
  p.rb.assign(static_cast<size_t>(rows * R * G), 0.0);
  p.rc.assign(static_cast<size_t>(rows * R * G), 0.0);
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t t = 0; t < d.seq_len; ++t) {
      const int64_t row = b * d.seq_len + t;
      const T* rw = raw + row * W;
      for (int64_t i = 0; i < S; ++i) p.theta[row * S + i] = kPi * std::tanh(static_cast<double>(rw[3 * H + i]));
      for (int64_t rg = 0; rg < R * G; ++rg) {
        p.rb[row * R * G + rg] = normalise(bc + row * 2 * RGN + rg * N, N, opt.eps, &p.nb[row * RGN + rg * N]);
        p.rc[row * R * G + rg] = normalise(bc + row * 2 * RGN + RGN + rg * N, N, opt.eps, &p.nc[row * RGN + rg * N]);
      }
      for (int64_t h = 0; h < H; ++h) {
        const int64_t e = row * H + h, g = h / (H / G);
        const double dt = softplus(static_cast<double>(rw[h]) + pr.dt_bias[h]), x = rw[H + h];
        const double f = opt.heavy_tail ? (x >= 0 ? 1.0 + x : 1.0 / (1.0 - x)) : softplus(x);
        const double lam = sigmoid(static_cast<double>(rw[2 * H + h]));
        p.dt[e] = dt;
        p.clamped[e] = -f > -opt.A_floor ? 1.0 : 0.0;
        p.A[e] = p.clamped[e] != 0.0 ? -opt.A_floor : -f;
        p.a[e] = p.A[e] * dt;
        p.lam[e] = lam;
        p.gamma[e] = lam * dt;
        p.eps[e] = (1.0 - lam) * dt;
        double* phi = &p.phi[e * S];
        for (int64_t i = 0; i < S; ++i) {
          const double prev = t > 0                ? p.phi[((row - 1) * H + h) * S + i]
                              : phase0 != nullptr ? static_cast<double>(phase0[(b * H + h) * S + i])
                                                  : 0.0;
          phi[i] = std::fmod(prev + dt * p.theta[row * S + i], 2.0 * kPi);
        }
        for (int64_t r = 0; r < R; ++r) {
          const int64_t src = row * RGN + (r * G + g) * N;
          double* k = &p.k[(e * R + r) * N];
          double* q = &p.q[(e * R + r) * N];
          for (int64_t n = 0; n < N; ++n) {
            k[n] = p.nb[src + n] * pr.B_norm[n] + pr.B_bias[(h * R + r) * N + n];
            q[n] = p.nc[src + n] * pr.C_norm[n] + pr.C_bias[(h * R + r) * N + n];
          }
          rotate(k, phi, d, 1.0);
          rotate(q, phi, d, 1.0);
        }
      }
    }
  return p;
}

template <typename T>
void mamba3_prep_bwd(const Mamba3Prep& p, const Vec& dq, const Vec& dk, const Vec& da, const Vec& dgamma,
                     const Vec& deps, const T* raw, const Mamba3PrepParams<T>& pr,
                     const Mamba3LayerDims& d, const Mamba3Options& opt, T* dbc, T* draw,
                     const Mamba3PrepGrads<T>& grads) {
  check_dims(d);
  const int64_t H = d.heads, R = d.rank, N = d.state_dim, G = d.groups, S = d.angles, L = d.seq_len;
  const int64_t RGN = R * G * N, W = 3 * H + S;
  Vec dB_bias(H * R * N, 0.0), dC_bias(H * R * N, 0.0), dBn(N, 0.0), dCn(N, 0.0), ddt_bias(H, 0.0);
  Vec dnb(RGN), dnc(RGN), dpsi(H * S), u(N), du(N);
  for (int64_t b = 0; b < d.batch; ++b) {
    std::fill(dpsi.begin(), dpsi.end(), 0.0);  // running Σ_{s>=t} dφ_s per (h, i)
    for (int64_t t = L - 1; t >= 0; --t) {
      const int64_t row = b * L + t;
      const T* rw = raw + row * W;
      T* drw = draw + row * W;
      std::fill(dnb.begin(), dnb.end(), 0.0);
      std::fill(dnc.begin(), dnc.end(), 0.0);
      Vec dtheta(S, 0.0);
      for (int64_t h = 0; h < H; ++h) {
        const int64_t e = row * H + h, g = h / (H / G);
        const double* phi = &p.phi[e * S];
        // Rotation (§4.5 step 3): dφ_i += du_pair · J(u_pair) on the rotated u; dū = Rot(φ)^T du.
        for (int64_t r = 0; r < R; ++r)
          for (int which = 0; which < 2; ++which) {
            const double* rot = which == 0 ? &p.k[(e * R + r) * N] : &p.q[(e * R + r) * N];
            const double* grad = which == 0 ? &dk[(e * R + r) * N] : &dq[(e * R + r) * N];
            for (int64_t i = 0; i < S; ++i) {
              const auto [i0, i1] = pair_of(i, d);
              dpsi[h * S + i] += grad[i0] * -rot[i1] + grad[i1] * rot[i0];
            }
            std::copy(grad, grad + N, du.begin());
            rotate(du.data(), phi, d, -1.0);
            Vec& dbias = which == 0 ? dB_bias : dC_bias;
            Vec& dn = which == 0 ? dnb : dnc;
            for (int64_t n = 0; n < N; ++n) {
              dbias[(h * R + r) * N + n] += du[n];
              dn[(r * G + g) * N + n] += du[n];
            }
          }
        // Angles (§4.5 step 5): dψ_t = Σ_{s>=t} dφ_s; dΔ_t += Σ_i θ_t[i] dψ_t[i]; dθ_t[i] += Δ_t dψ_t[i].
        double ddt = 0.0;
        for (int64_t i = 0; i < S; ++i) {
          ddt += p.theta[row * S + i] * dpsi[h * S + i];
          dtheta[i] += p.dt[e] * dpsi[h * S + i];
        }
        // γ = λΔ, ε = (1 - λ)Δ, a = AΔ (§4.5 steps 4, 6).
        const double lam = p.lam[e], dt = p.dt[e];
        ddt += lam * dgamma[e] + (1.0 - lam) * deps[e] + p.A[e] * da[e];
        const double dlam = dt * (dgamma[e] - deps[e]), dA = dt * da[e];
        drw[2 * H + h] = static_cast<T>(dlam * lam * (1.0 - lam));
        const double x = rw[H + h];
        const double fgrad = opt.heavy_tail ? (x >= 0 ? 1.0 : 1.0 / ((1.0 - x) * (1.0 - x))) : softplus_grad(x);
        drw[H + h] = static_cast<T>(p.clamped[e] != 0.0 ? 0.0 : -dA * fgrad);
        const double ddd = ddt * softplus_grad(static_cast<double>(rw[h]) + pr.dt_bias[h]);
        drw[h] = static_cast<T>(ddd);
        ddt_bias[h] += ddd;
      }
      for (int64_t i = 0; i < S; ++i) {
        const double th = std::tanh(static_cast<double>(rw[3 * H + i]));
        drw[3 * H + i] = static_cast<T>(dtheta[i] * kPi * (1.0 - th * th));
      }
      // BCNorm (§1.1): dw += dn̂ ∘ n; dx = r (g - n mean(g ∘ n)) with g = dn̂ ∘ w.
      for (int which = 0; which < 2; ++which) {
        const Vec& dn = which == 0 ? dnb : dnc;
        const Vec& nrm = which == 0 ? p.nb : p.nc;
        const Vec& rs = which == 0 ? p.rb : p.rc;
        const T* w = which == 0 ? pr.B_norm : pr.C_norm;
        Vec& dw = which == 0 ? dBn : dCn;
        for (int64_t rg = 0; rg < R * G; ++rg) {
          const double* n = &nrm[row * RGN + rg * N];
          double m = 0.0;
          for (int64_t i = 0; i < N; ++i) {
            u[i] = dn[rg * N + i] * w[i];
            dw[i] += dn[rg * N + i] * n[i];
            m += u[i] * n[i];
          }
          m /= static_cast<double>(N);
          T* out = dbc + row * 2 * RGN + which * RGN + rg * N;
          for (int64_t i = 0; i < N; ++i) out[i] = static_cast<T>(rs[row * R * G + rg] * (u[i] - n[i] * m));
        }
      }
    }
  }
  for (int64_t i = 0; i < H * R * N; ++i) {
    grads.B_bias[i] = static_cast<T>(grads.B_bias[i] + dB_bias[i]);
    grads.C_bias[i] = static_cast<T>(grads.C_bias[i] + dC_bias[i]);
  }
  for (int64_t i = 0; i < N; ++i) {
    grads.B_norm[i] = static_cast<T>(grads.B_norm[i] + dBn[i]);
    grads.C_norm[i] = static_cast<T>(grads.C_norm[i] + dCn[i]);
  }
  for (int64_t h = 0; h < H; ++h) grads.dt_bias[h] = static_cast<T>(grads.dt_bias[h] + ddt_bias[h]);
}

#define LLMT_MAMBA3_PREP(T)                                                                                       \
  template Mamba3Prep mamba3_prep_fwd<T>(const T*, const T*, const Mamba3PrepParams<T>&, const Mamba3LayerDims&,  \
                                         const Mamba3Options&, const T*);                                       \
  template void mamba3_prep_bwd<T>(const Mamba3Prep&, const Vec&, const Vec&, const Vec&, const Vec&, const Vec&, \
                                   const T*, const Mamba3PrepParams<T>&, const Mamba3LayerDims&,        \
                                   const Mamba3Options&, T*, T*, const Mamba3PrepGrads<T>&);
LLMT_MAMBA3_PREP(float)
LLMT_MAMBA3_PREP(double)
#undef LLMT_MAMBA3_PREP

}  // namespace llmt::cpu
