// The Mamba-3 layer op, CPU reference (layers-ssm-attn.md §4.3, §4.5 steps 1–7).
#include "kernels/cpu/mamba3_layer.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/mamba3.h"

namespace llmt::cpu {
namespace {

using Vec = std::vector<double>;

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

template <typename T>
void check_params(const Mamba3LayerParams<T>& pr, const Mamba3LayerDims& d, const Mamba3Options& opt) {
  const bool mimo = pr.mimo_x != nullptr && pr.mimo_z != nullptr && pr.mimo_o != nullptr;
  const bool siso = pr.mimo_x == nullptr && pr.mimo_z == nullptr && pr.mimo_o == nullptr;
  check(d.rank == 1 ? siso : mimo, "mamba3: mimo_x, mimo_z, mimo_o must be given exactly when rank > 1 (rank {})",
        d.rank);
  check((pr.norm != nullptr) == opt.outproj_norm,
        "mamba3: the output-norm weight must be given exactly with outproj_norm");
}

// The core's inputs and y in double: v [B, T, H, R, P] = x ∘ mimo_x (x for SISO), y from the chunked core.
struct Forward {
  Mamba3Prep prep;
  Vec v, y, D;
  Mamba3Dims core;
  Mamba3Inputs<double> inputs() const {
    return {prep.q.data(), prep.k.data(), v.data(), prep.a.data(), prep.gamma.data(), prep.eps.data(), D.data()};
  }
};

// The prep (from `phase0`, nullptr: φ_{-1} = 0) and the up-projected v = x ∘ mimo_x of every token; y unset.
template <typename T>
Forward prepare(const T* x, const T* bc, const T* raw, const Mamba3LayerParams<T>& pr, const Mamba3LayerDims& d,
                const Mamba3Options& opt, const T* phase0) {
  check_params(pr, d, opt);
  const int64_t H = d.heads, R = d.rank, P = d.head_dim, rows = d.batch * d.seq_len;
  Forward f{mamba3_prep_fwd(bc, raw, pr.prep, d, opt, phase0), Vec(rows * H * R * P), Vec(rows * H * R * P), Vec(H),
            {d.batch, d.seq_len, H, P, d.state_dim, R}};
  for (int64_t h = 0; h < H; ++h) f.D[h] = pr.D[h];
  for (int64_t e = 0; e < rows * H; ++e)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t p = 0; p < P; ++p) {
        const double scale = pr.mimo_x ? static_cast<double>(pr.mimo_x[((e % H) * R + r) * P + p]) : 1.0;
        f.v[(e * R + r) * P + p] = x[e * P + p] * scale;
      }
  return f;
}

template <typename T>
Forward run_forward(const T* x, const T* bc, const T* raw, const Mamba3LayerParams<T>& pr, const Mamba3LayerDims& d,
                    const Mamba3Options& opt) {
  Forward f = prepare(x, bc, raw, pr, d, opt, static_cast<const T*>(nullptr));
  mamba3_chunk_fwd<double>(f.inputs(), f.core, f.y.data(), opt.chunk_size);
  return f;
}

// Output-side quantities of one (token, head, rank): yn = RMSNorm_P(y) ∘ w (or y), rs its reciprocal RMS,
// n = y rs, zr = z ∘ mimo_z, g = yn ∘ SiLU(zr).
struct Gate {
  Vec yn, n, zr;
  double rs = 1.0;
};

template <typename T>
void gate(const double* y, const T* z, const Mamba3LayerParams<T>& pr, int64_t h, int64_t r, int64_t R, int64_t P,
          double eps, Gate& g) {
  if (pr.norm != nullptr) {
    double ss = 0.0;
    for (int64_t p = 0; p < P; ++p) ss += y[p] * y[p];
    g.rs = 1.0 / std::sqrt(ss / static_cast<double>(P) + eps);
  }
  for (int64_t p = 0; p < P; ++p) {
    g.n[p] = y[p] * g.rs;
    g.yn[p] = pr.norm != nullptr ? g.n[p] * pr.norm[h * P + p] : y[p];
    g.zr[p] = z[p] * (pr.mimo_z ? static_cast<double>(pr.mimo_z[(h * R + r) * P + p]) : 1.0);
  }
}

// out = Σ_r mimo_o[h,r] ∘ gate(y_r) (§4.3.2–4.3.4) from the core output y [rows, H, R, P].
template <typename T>
void write_output(const Vec& y, const T* z, const Mamba3LayerParams<T>& pr, const Mamba3LayerDims& d,
                  const Mamba3Options& opt, T* out) {
  const int64_t H = d.heads, R = d.rank, P = d.head_dim, rows = d.batch * d.seq_len;
  Gate g{Vec(P), Vec(P), Vec(P)};
  Vec o(P);
  for (int64_t e = 0; e < rows * H; ++e) {
    const int64_t h = e % H;
    std::fill(o.begin(), o.end(), 0.0);
    for (int64_t r = 0; r < R; ++r) {
      gate(&y[(e * R + r) * P], z + e * P, pr, h, r, R, P, opt.eps, g);
      for (int64_t p = 0; p < P; ++p)
        o[p] += (pr.mimo_o ? static_cast<double>(pr.mimo_o[(h * R + r) * P + p]) : 1.0) * g.yn[p] * g.zr[p] *
                sigmoid(g.zr[p]);
    }
    for (int64_t p = 0; p < P; ++p) out[e * P + p] = static_cast<T>(o[p]);
  }
}

}  // namespace

template <typename T>
void mamba3_layer_fwd(const T* x, const T* z, const T* bc, const T* raw, const Mamba3LayerParams<T>& pr,
                      const Mamba3LayerDims& d, const Mamba3Options& opt, T* out) {
  write_output(run_forward(x, bc, raw, pr, d, opt).y, z, pr, d, opt, out);
}

// §4.6 per token: H = α H + ε α W_prev + γ W; y_r = H q_r + D v_r; then k, v and φ of the token are carried.
template <typename T>
void mamba3_layer_step(const T* x, const T* z, const T* bc, const T* raw, const Mamba3LayerParams<T>& pr,
                       const Mamba3LayerDims& d, const Mamba3Options& opt, const Mamba3Carry<T>& carry, T* out) {
  Forward f = prepare(x, bc, raw, pr, d, opt, carry.phase);
  const int64_t H = d.heads, R = d.rank, P = d.head_dim, N = d.state_dim, S = d.angles;
  for (int64_t bh = 0; bh < d.batch * H; ++bh)  // the carry of (b, h)
    for (int64_t t = 0; t < d.seq_len; ++t) {
      const int64_t e = ((bh / H) * d.seq_len + t) * H + bh % H;  // token t of (b, h)
      const double alpha = std::exp(f.prep.a[e]), beta = f.prep.eps[e] * alpha, gamma = f.prep.gamma[e];
      T* Hs = carry.state + bh * P * N;
      T* kp = carry.k_prev + bh * R * N;
      T* vp = carry.v_prev + bh * R * P;
      const double* k = &f.prep.k[e * R * N];
      const double* v = &f.v[e * R * P];
      for (int64_t p = 0; p < P; ++p)
        for (int64_t n = 0; n < N; ++n) {
          double w_prev = 0.0, w = 0.0;
          for (int64_t r = 0; r < R; ++r) {
            w_prev += static_cast<double>(vp[r * P + p]) * kp[r * N + n];
            w += v[r * P + p] * k[r * N + n];
          }
          Hs[p * N + n] = static_cast<T>(alpha * Hs[p * N + n] + beta * w_prev + gamma * w);
        }
      for (int64_t r = 0; r < R; ++r)
        for (int64_t p = 0; p < P; ++p) {
          double acc = f.D[e % H] * v[r * P + p];
          for (int64_t n = 0; n < N; ++n) acc += static_cast<double>(Hs[p * N + n]) * f.prep.q[(e * R + r) * N + n];
          f.y[(e * R + r) * P + p] = acc;
        }
      for (int64_t i = 0; i < R * N; ++i) kp[i] = static_cast<T>(k[i]);
      for (int64_t i = 0; i < R * P; ++i) vp[i] = static_cast<T>(v[i]);
      for (int64_t i = 0; i < S; ++i) carry.phase[bh * S + i] = static_cast<T>(f.prep.phi[e * S + i]);
    }
  write_output(f.y, z, pr, d, opt, out);
}

// §4.5 step 1 (gate, output norm, MIMO down/up-projections), step 2 (core), steps 3–7 (prep backward).
template <typename T>
void mamba3_layer_bwd(const T* dout, const T* x, const T* z, const T* bc, const T* raw,
                      const Mamba3LayerParams<T>& pr, const Mamba3LayerDims& d, const Mamba3Options& opt, T* dx,
                      T* dz, T* dbc, T* draw, const Mamba3LayerGrads<T>& gr) {
  const Forward f = run_forward(x, bc, raw, pr, d, opt);
  const int64_t H = d.heads, R = d.rank, P = d.head_dim, rows = d.batch * d.seq_len;
  Vec dy(f.y.size()), dmx(H * R * P, 0.0), dmz(H * R * P, 0.0), dmo(H * R * P, 0.0), dnorm(H * P, 0.0);
  Gate g{Vec(P), Vec(P), Vec(P)};
  Vec dzh(P);
  for (int64_t e = 0; e < rows * H; ++e) {
    const int64_t h = e % H;
    std::fill(dzh.begin(), dzh.end(), 0.0);
    for (int64_t r = 0; r < R; ++r) {
      const int64_t hr = (h * R + r) * P;
      gate(&f.y[(e * R + r) * P], z + e * P, pr, h, r, R, P, opt.eps, g);
      double* dyr = &dy[(e * R + r) * P];
      double m = 0.0;
      for (int64_t p = 0; p < P; ++p) {
        const double s = sigmoid(g.zr[p]), silu = g.zr[p] * s, dop = dout[e * P + p];
        const double dg = dop * (pr.mimo_o ? static_cast<double>(pr.mimo_o[hr + p]) : 1.0);
        dmo[hr + p] += dop * g.yn[p] * silu;
        const double dzr = dg * g.yn[p] * s * (1.0 + g.zr[p] * (1.0 - s));
        dzh[p] += dzr * (pr.mimo_z ? static_cast<double>(pr.mimo_z[hr + p]) : 1.0);
        dmz[hr + p] += dzr * z[e * P + p];
        dyr[p] = dg * silu;  // dL/dyn
        if (pr.norm != nullptr) {
          dnorm[h * P + p] += dyr[p] * g.n[p];
          dyr[p] *= pr.norm[h * P + p];
          m += dyr[p] * g.n[p];
        }
      }
      if (pr.norm != nullptr)  // RMSNorm_P backward (§1.1): dy = rs (u - n mean(u ∘ n)), u = dyn ∘ w
        for (int64_t p = 0; p < P; ++p) dyr[p] = g.rs * (dyr[p] - g.n[p] * m / static_cast<double>(P));
    }
    for (int64_t p = 0; p < P; ++p) dz[e * P + p] = static_cast<T>(dzh[p]);
  }
  const size_t qk = f.prep.q.size(), tok = f.prep.a.size();
  Vec dq(qk), dk(qk), dv(f.v.size()), da(tok), dgamma(tok), deps(tok), dD(H);
  mamba3_chunk_bwd<double>(f.inputs(), dy.data(), f.core,
                           {dq.data(), dk.data(), dv.data(), da.data(), dgamma.data(), deps.data(), dD.data()},
                           opt.chunk_size);
  for (int64_t e = 0; e < rows * H; ++e) {
    const int64_t h = e % H;
    for (int64_t p = 0; p < P; ++p) {
      double s = 0.0;
      for (int64_t r = 0; r < R; ++r) {
        const double dvp = dv[(e * R + r) * P + p];
        s += dvp * (pr.mimo_x ? static_cast<double>(pr.mimo_x[(h * R + r) * P + p]) : 1.0);
        dmx[(h * R + r) * P + p] += dvp * x[e * P + p];
      }
      dx[e * P + p] = static_cast<T>(s);
    }
  }
  mamba3_prep_bwd(f.prep, dq, dk, da, dgamma, deps, raw, pr.prep, d, opt, dbc, draw, gr.prep);
  for (int64_t h = 0; h < H; ++h) gr.D[h] = static_cast<T>(gr.D[h] + dD[h]);
  if (pr.mimo_x != nullptr)
    for (int64_t i = 0; i < H * R * P; ++i) {
      gr.mimo_x[i] = static_cast<T>(gr.mimo_x[i] + dmx[i]);
      gr.mimo_z[i] = static_cast<T>(gr.mimo_z[i] + dmz[i]);
      gr.mimo_o[i] = static_cast<T>(gr.mimo_o[i] + dmo[i]);
    }
  if (pr.norm != nullptr)
    for (int64_t i = 0; i < H * P; ++i) gr.norm[i] = static_cast<T>(gr.norm[i] + dnorm[i]);
}

#define LLMT_MAMBA3_LAYER(T)                                                                                      \
  template void mamba3_layer_fwd<T>(const T*, const T*, const T*, const T*, const Mamba3LayerParams<T>&,          \
                                    const Mamba3LayerDims&, const Mamba3Options&, T*);                            \
  template void mamba3_layer_step<T>(const T*, const T*, const T*, const T*, const Mamba3LayerParams<T>&,         \
                                     const Mamba3LayerDims&, const Mamba3Options&, const Mamba3Carry<T>&, T*);     \
  template void mamba3_layer_bwd<T>(const T*, const T*, const T*, const T*, const T*, const Mamba3LayerParams<T>&, \
                                    const Mamba3LayerDims&, const Mamba3Options&, T*, T*, T*, T*,                 \
                                    const Mamba3LayerGrads<T>&);
LLMT_MAMBA3_LAYER(float)
LLMT_MAMBA3_LAYER(double)
#undef LLMT_MAMBA3_LAYER

}  // namespace llmt::cpu
