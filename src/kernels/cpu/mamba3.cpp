// Mamba-3 core, CPU reference (layers-ssm-attn.md §4.3.2–4.3.3, §4.4, §4.5).
// Each (batch, head) is copied into double buffers (q, k [T, R, N], v [T, R, P], a, γ, ε [T]), processed by
// direct loops and written back.
#include "kernels/cpu/mamba3.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

namespace llmt::cpu {
namespace {

using Vec = std::vector<double>;

// Rows [b, t, h, 0:width) of a [B, T, H, width] tensor as a dense [T, width] buffer.
template <typename T>
Vec gather(const T* src, int64_t b, int64_t L, int64_t H, int64_t h, int64_t width) {
  Vec out(static_cast<size_t>(L * width));
  for (int64_t t = 0; t < L; ++t)
    for (int64_t c = 0; c < width; ++c) out[t * width + c] = src[((b * L + t) * H + h) * width + c];
  return out;
}

// Writes a dense [T, width] buffer to the rows [b, t, h, 0:width) of dst.
template <typename T>
void scatter(const Vec& in, int64_t b, int64_t L, int64_t H, int64_t h, int64_t width, T* dst) {
  for (int64_t t = 0; t < L; ++t)
    for (int64_t c = 0; c < width; ++c) dst[((b * L + t) * H + h) * width + c] = static_cast<T>(in[t * width + c]);
}

double dot(const double* a, const double* b, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// One (batch, head) slice: q, k [T, R, N]; v [T, R, P]; a, gamma, eps [T]; D.
struct Head {
  Vec q, k, v, a, gamma, eps;
  double D;
  int64_t R, P, N;
  const double* qr(int64_t t, int64_t r) const { return &q[(t * R + r) * N]; }
  const double* kr(int64_t t, int64_t r) const { return &k[(t * R + r) * N]; }
  const double* vr(int64_t t, int64_t r) const { return &v[(t * R + r) * P]; }
  /// σ_t = γ_t + ε_{t+1} (ε_T := 0), §4.4.1.
  double sigma(int64_t t) const {
    return gamma[t] + (t + 1 < static_cast<int64_t>(gamma.size()) ? eps[t + 1] : 0.0);
  }
};

template <typename T>
Head load(const Mamba3Inputs<T>& in, const Mamba3Dims& d, int64_t b, int64_t h) {
  const int64_t L = d.seq_len, H = d.heads, R = d.rank;
  return {gather(in.q, b, L, H, h, R * d.state_dim),
          gather(in.k, b, L, H, h, R * d.state_dim),
          gather(in.v, b, L, H, h, R * d.head_dim),
          gather(in.a, b, L, H, h, 1),
          gather(in.gamma, b, L, H, h, 1),
          gather(in.eps, b, L, H, h, 1),
          static_cast<double>(in.D[h]),
          R,
          d.head_dim,
          d.state_dim};
}

// Per-head gradients, same shapes as Head.
struct HeadGrads {
  Vec dq, dk, dv, da, dgamma, deps;
  double dD = 0.0;
};

HeadGrads zero_grads(const Mamba3Dims& d) {
  const int64_t L = d.seq_len, R = d.rank;
  return {Vec(L * R * d.state_dim, 0.0), Vec(L * R * d.state_dim, 0.0), Vec(L * R * d.head_dim, 0.0),
          Vec(L, 0.0), Vec(L, 0.0), Vec(L, 0.0)};
}

template <typename T>
void store_grads(const HeadGrads& g, const Mamba3Dims& d, int64_t b, int64_t h, const Mamba3Grads<T>& out) {
  const int64_t L = d.seq_len, H = d.heads, R = d.rank;
  scatter(g.dq, b, L, H, h, R * d.state_dim, out.dq);
  scatter(g.dk, b, L, H, h, R * d.state_dim, out.dk);
  scatter(g.dv, b, L, H, h, R * d.head_dim, out.dv);
  scatter(g.da, b, L, H, h, 1, out.da);
  scatter(g.dgamma, b, L, H, h, 1, out.dgamma);
  scatter(g.deps, b, L, H, h, 1, out.deps);
  out.dD[h] = static_cast<T>(static_cast<double>(out.dD[h]) + g.dD);
}

void check_dims(const Mamba3Dims& d) {
  check(d.batch > 0 && d.seq_len > 0 && d.heads > 0 && d.head_dim > 0 && d.state_dim > 0 && d.rank > 0,
        "mamba3: sizes must be positive (B {}, T {}, H {}, P {}, N {}, R {})", d.batch, d.seq_len, d.heads,
        d.head_dim, d.state_dim, d.rank);
}

void check_chunk_size(int64_t chunk_size) {
  check(chunk_size >= 1, "mamba3 chunk: chunk_size must be >= 1, got {}", chunk_size);
}

// W_t = Σ_r v_{t,r} k_{t,r}^T into W [P, N] (scaled by f, added).
void add_write(const Head& hd, int64_t t, double f, double* W) {
  for (int64_t r = 0; r < hd.R; ++r) {
    const double* v = hd.vr(t, r);
    const double* k = hd.kr(t, r);
    for (int64_t p = 0; p < hd.P; ++p)
      for (int64_t n = 0; n < hd.N; ++n) W[p * hd.N + n] += f * v[p] * k[n];
  }
}

// One token of §4.3.2: H <- α_t H + β_t W_{t-1} + γ_t W_t in place.
void step(const Head& hd, int64_t t, double* S) {
  const int64_t PN = hd.P * hd.N;
  const double alpha = std::exp(hd.a[t]);
  for (int64_t i = 0; i < PN; ++i) S[i] *= alpha;
  if (t > 0) add_write(hd, t - 1, hd.eps[t] * alpha, S);
  add_write(hd, t, hd.gamma[t], S);
}

// Chunk-local inclusive cumsum G of a for positions [c0, c0 + n).
Vec chunk_cumsum(const Head& hd, int64_t c0, int64_t n) {
  Vec G(n);
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) G[i] = acc += hd.a[c0 + i];
  return G;
}

// §4.4.3: S <- e^Γ S + Σ_j e^{Γ-G_j} σ_j W_j, the kernel state leaving the chunk.
void advance_state(const Head& hd, int64_t c0, const Vec& G, Vec& S) {
  const int64_t n = static_cast<int64_t>(G.size());
  const double gam = G[n - 1], eg = std::exp(gam);
  for (double& s : S) s *= eg;
  for (int64_t j = 0; j < n; ++j) add_write(hd, c0 + j, std::exp(gam - G[j]) * hd.sigma(c0 + j), S.data());
}

// §4.5 step 2 for one chunk [c0, c0 + n). dY: the head's [T, R, P] output gradient; Sin: the kernel state
// entering the chunk; dS: on entry the gradient w.r.t. the state leaving the chunk, on return w.r.t. Sin.
// Adds to g.dq, g.dk (diagonal term), g.dv, dkt (gradient w.r.t. k̃ = σ k), g.dgamma (diagonal), g.dD and
// writes the chunk's g.da.
void chunk_bwd(const Head& hd, const Vec& kt, const Vec& dY, int64_t c0, int64_t n, const Vec& Sin, Vec& dS,
               Vec& dkt, HeadGrads& g) {
  const int64_t R = hd.R, P = hd.P, N = hd.N;
  const Vec G = chunk_cumsum(hd, c0, n);
  const double gam = G[n - 1], eg = std::exp(gam);
  auto ktr = [&](int64_t i, int64_t r) { return &kt[((c0 + i) * R + r) * N]; };
  auto dy = [&](int64_t i, int64_t r) { return &dY[((c0 + i) * R + r) * P]; };
  auto dq = [&](int64_t i, int64_t r) { return &g.dq[((c0 + i) * R + r) * N]; };
  auto dk = [&](int64_t i, int64_t r) { return &g.dk[((c0 + i) * R + r) * N]; };
  auto dkk = [&](int64_t i, int64_t r) { return &dkt[((c0 + i) * R + r) * N]; };
  auto dv = [&](int64_t i, int64_t r) { return &g.dv[((c0 + i) * R + r) * P]; };
  Vec dG(n, 0.0), tmp(std::max(P, N));
  for (int64_t i = 0; i < n; ++i) {
    const double ei = std::exp(G[i]), gi = hd.gamma[c0 + i];
    for (int64_t r = 0; r < R; ++r) {
      const double* q = hd.qr(c0 + i, r);
      // Inter-chunk read y += e^{G_i} S_in q: dq += e^{G_i} S_in^T dy; dG_i += e^{G_i} dy·(S_in q).
      for (int64_t m = 0; m < N; ++m) {
        double s = 0.0;
        for (int64_t p = 0; p < P; ++p) s += Sin[p * N + m] * dy(i, r)[p];
        dq(i, r)[m] += ei * s;
        tmp[m] = s;
      }
      dG[i] += ei * dot(tmp.data(), q, N);
      // Intra-chunk, j < i: E = e^{G_i-G_j}, s = q_{i,r}·k̃_{j,r'}, ds = (dy_{i,r}·v_{j,r'}) E.
      for (int64_t j = 0; j < i; ++j) {
        const double E = std::exp(std::min(G[i] - G[j], 0.0));
        for (int64_t r2 = 0; r2 < R; ++r2) {
          const double s = dot(q, ktr(j, r2), N), ds = dot(dy(i, r), hd.vr(c0 + j, r2), P) * E;
          for (int64_t m = 0; m < N; ++m) {
            dq(i, r)[m] += ds * ktr(j, r2)[m];
            dkk(j, r2)[m] += ds * q[m];
          }
          for (int64_t p = 0; p < P; ++p) dv(j, r2)[p] += s * E * dy(i, r)[p];
          dG[i] += ds * s;
          dG[j] -= ds * s;
        }
      }
      // Diagonal γ_i Σ_r' (q_{i,r}·k_{i,r'}) v_{i,r'} (no decay) and the D skip.
      for (int64_t r2 = 0; r2 < R; ++r2) {
        const double* k = hd.kr(c0 + i, r2);
        const double s = dot(q, k, N), ds = dot(dy(i, r), hd.vr(c0 + i, r2), P);
        g.dgamma[c0 + i] += ds * s;
        for (int64_t m = 0; m < N; ++m) {
          dq(i, r)[m] += gi * ds * k[m];
          dk(i, r2)[m] += gi * ds * q[m];
        }
        for (int64_t p = 0; p < P; ++p) dv(i, r2)[p] += gi * s * dy(i, r)[p];
      }
      for (int64_t p = 0; p < P; ++p) dv(i, r)[p] += hd.D * dy(i, r)[p];
      g.dD += dot(hd.vr(c0 + i, r), dy(i, r), P);
    }
  }
  // State write S_out += f v_{j,r} k̃_{j,r}^T, f = e^{Γ-G_j}: dv += f dS k̃, dk̃ += f dS^T v,
  // z = f v^T dS k̃; dG_j -= z, dΓ += z.
  for (int64_t j = 0; j < n; ++j) {
    const double f = std::exp(gam - G[j]);
    for (int64_t r = 0; r < R; ++r) {
      const double* v = hd.vr(c0 + j, r);
      for (int64_t p = 0; p < P; ++p) {
        const double s = f * dot(&dS[p * N], ktr(j, r), N);
        dv(j, r)[p] += s;
        tmp[p] = s;
      }
      const double z = dot(v, tmp.data(), P);
      dG[j] -= z;
      dG[n - 1] += z;
      for (int64_t m = 0; m < N; ++m) {
        double s = 0.0;
        for (int64_t p = 0; p < P; ++p) s += dS[p * N + m] * v[p];
        dkk(j, r)[m] += f * s;
      }
    }
  }
  // State passing S_out += e^Γ S_in: dΓ += e^Γ <dS_out, S_in>; dS_in = e^Γ dS_out + Σ e^{G_i} dy_{i,r} q_{i,r}^T.
  dG[n - 1] += eg * dot(dS.data(), Sin.data(), P * N);
  for (double& s : dS) s *= eg;
  for (int64_t i = 0; i < n; ++i) {
    const double ei = std::exp(G[i]);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t p = 0; p < P; ++p)
        for (int64_t m = 0; m < N; ++m) dS[p * N + m] += ei * dy(i, r)[p] * hd.qr(c0 + i, r)[m];
  }
  // da_k = Σ_{i>=k} dG_i within the chunk.
  double acc = 0.0;
  for (int64_t j = n - 1; j >= 0; --j) g.da[c0 + j] = acc += dG[j];
}

}  // namespace

// α_t = e^{a_t}; H_t = α_t H_{t-1} + ε_t α_t W_{t-1} + γ_t W_t; y_{t,r} = H_t q_{t,r} + D v_{t,r}   (§4.3.2-3)
template <typename T>
void mamba3_recurrent_fwd(const Mamba3Inputs<T>& in, const Mamba3Dims& d, T* y) {
  check_dims(d);
  const int64_t P = d.head_dim, N = d.state_dim, R = d.rank;
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h) {
      const Head hd = load(in, d, b, h);
      Vec S(P * N, 0.0), out(d.seq_len * R * P);
      for (int64_t t = 0; t < d.seq_len; ++t) {
        step(hd, t, S.data());
        for (int64_t r = 0; r < R; ++r)
          for (int64_t p = 0; p < P; ++p)
            out[(t * R + r) * P + p] = dot(&S[p * N], hd.qr(t, r), N) + hd.D * hd.vr(t, r)[p];
      }
      scatter(out, b, d.seq_len, d.heads, h, R * P, y);
    }
}

// Reverse-time adjoints (§4.5): dH_t = Σ_r dy_{t,r} q_{t,r}^T + α_{t+1} dH_{t+1}; M_t = γ_t dH_t + β_{t+1} dH_{t+1}
// is the adjoint of W_t: dk_{t,r} = M_t^T v_{t,r}, dv_{t,r} = M_t k_{t,r} + D dy_{t,r}; dq_{t,r} = H_t^T dy_{t,r};
// dγ_t = <dH_t, W_t>, dε_t = α_t <dH_t, W_{t-1}>, da_t = α_t (<dH_t, H_{t-1}> + ε_t <dH_t, W_{t-1}>).
template <typename T>
void mamba3_recurrent_bwd(const Mamba3Inputs<T>& in, const T* d_y, const Mamba3Dims& d,
                          const Mamba3Grads<T>& grads) {
  check_dims(d);
  const int64_t P = d.head_dim, N = d.state_dim, R = d.rank, L = d.seq_len, PN = P * N;
  std::fill(grads.dD, grads.dD + d.heads, T(0));
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h) {
      const Head hd = load(in, d, b, h);
      const Vec dY = gather(d_y, b, L, d.heads, h, R * P);
      HeadGrads g = zero_grads(d);
      Vec states((L + 1) * PN, 0.0);  // states[t + 1] = H_t
      for (int64_t t = 0; t < L; ++t) {
        std::copy(&states[t * PN], &states[(t + 1) * PN], &states[(t + 1) * PN]);
        step(hd, t, &states[(t + 1) * PN]);
      }
      Vec dH(PN), dHnext(PN, 0.0), M(PN), W(PN), Wprev(PN);
      for (int64_t t = L - 1; t >= 0; --t) {
        const double alpha_next = t + 1 < L ? std::exp(hd.a[t + 1]) : 0.0;
        const double beta_next = t + 1 < L ? hd.eps[t + 1] * alpha_next : 0.0;
        for (int64_t i = 0; i < PN; ++i) dH[i] = alpha_next * dHnext[i];
        for (int64_t r = 0; r < R; ++r)
          for (int64_t p = 0; p < P; ++p)
            for (int64_t n = 0; n < N; ++n) dH[p * N + n] += dY[(t * R + r) * P + p] * hd.qr(t, r)[n];
        for (int64_t i = 0; i < PN; ++i) M[i] = hd.gamma[t] * dH[i] + beta_next * dHnext[i];
        const double* Ht = &states[(t + 1) * PN];
        const double* Hprev = &states[t * PN];
        for (int64_t r = 0; r < R; ++r) {
          const double* dy = &dY[(t * R + r) * P];
          const double* v = hd.vr(t, r);
          for (int64_t n = 0; n < N; ++n) {
            double sq = 0.0, sk = 0.0;
            for (int64_t p = 0; p < P; ++p) {
              sq += Ht[p * N + n] * dy[p];
              sk += M[p * N + n] * v[p];
            }
            g.dq[(t * R + r) * N + n] = sq;
            g.dk[(t * R + r) * N + n] = sk;
          }
          for (int64_t p = 0; p < P; ++p) g.dv[(t * R + r) * P + p] = dot(&M[p * N], hd.kr(t, r), N) + hd.D * dy[p];
          g.dD += dot(v, dy, P);
        }
        std::fill(W.begin(), W.end(), 0.0);
        add_write(hd, t, 1.0, W.data());
        std::fill(Wprev.begin(), Wprev.end(), 0.0);
        if (t > 0) add_write(hd, t - 1, 1.0, Wprev.data());
        const double alpha = std::exp(hd.a[t]), hw = dot(dH.data(), Wprev.data(), PN);
        g.dgamma[t] = dot(dH.data(), W.data(), PN);
        g.deps[t] = alpha * hw;
        g.da[t] = alpha * (dot(dH.data(), Hprev, PN) + hd.eps[t] * hw);
        std::swap(dH, dHnext);
      }
      store_grads(g, d, b, h, grads);
    }
}

// Per chunk: y_{i,r} = e^{G_i} S_in q_{i,r} + Σ_{j<i} e^{G_i-G_j} σ_j Σ_r' (q_{i,r}·k_{j,r'}) v_{j,r'}
// + γ_i Σ_r' (q_{i,r}·k_{i,r'}) v_{i,r'} + D v_{i,r}; S_out = e^Γ S_in + Σ_j e^{Γ-G_j} σ_j W_j   (§4.4.3-4)
template <typename T>
void mamba3_chunk_fwd(const Mamba3Inputs<T>& in, const Mamba3Dims& d, T* y, int64_t chunk_size) {
  check_dims(d);
  check_chunk_size(chunk_size);
  const int64_t P = d.head_dim, N = d.state_dim, R = d.rank;
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h) {
      const Head hd = load(in, d, b, h);
      Vec S(P * N, 0.0), out(d.seq_len * R * P, 0.0);
      for (int64_t c0 = 0; c0 < d.seq_len; c0 += chunk_size) {
        const int64_t n = std::min(chunk_size, d.seq_len - c0);
        const Vec G = chunk_cumsum(hd, c0, n);
        for (int64_t i = 0; i < n; ++i) {
          const double ei = std::exp(G[i]);
          for (int64_t r = 0; r < R; ++r) {
            double* yrow = &out[((c0 + i) * R + r) * P];
            const double* q = hd.qr(c0 + i, r);
            for (int64_t p = 0; p < P; ++p) yrow[p] = ei * dot(&S[p * N], q, N) + hd.D * hd.vr(c0 + i, r)[p];
            for (int64_t j = 0; j <= i; ++j) {
              const double f = j < i ? std::exp(std::min(G[i] - G[j], 0.0)) * hd.sigma(c0 + j) : hd.gamma[c0 + i];
              for (int64_t r2 = 0; r2 < R; ++r2) {
                const double w = f * dot(q, hd.kr(c0 + j, r2), N);
                const double* v = hd.vr(c0 + j, r2);
                for (int64_t p = 0; p < P; ++p) yrow[p] += w * v[p];
              }
            }
          }
        }
        advance_state(hd, c0, G, S);
      }
      scatter(out, b, d.seq_len, d.heads, h, R * P, y);
    }
}

// Chunk-entry states by a forward pass, then the chunks in reverse (§4.5 step 2); finally the k̃ = σ k split:
// dσ_j = Σ_r k_{j,r}·dk̃_{j,r}, dk_{j,r} += σ_j dk̃_{j,r}, dγ_j += dσ_j, dε_{j+1} += dσ_j   (§4.5 steps 3-4)
template <typename T>
void mamba3_chunk_bwd(const Mamba3Inputs<T>& in, const T* d_y, const Mamba3Dims& d, const Mamba3Grads<T>& grads,
                      int64_t chunk_size) {
  check_dims(d);
  check_chunk_size(chunk_size);
  const int64_t P = d.head_dim, N = d.state_dim, R = d.rank, L = d.seq_len, PN = P * N;
  const int64_t chunks = (L + chunk_size - 1) / chunk_size;
  Vec starts(chunks * PN);
  std::fill(grads.dD, grads.dD + d.heads, T(0));
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h) {
      const Head hd = load(in, d, b, h);
      const Vec dY = gather(d_y, b, L, d.heads, h, R * P);
      Vec kt(hd.k.size()), dkt(hd.k.size(), 0.0);
      for (int64_t t = 0; t < L; ++t)
        for (int64_t i = 0; i < R * N; ++i) kt[t * R * N + i] = hd.sigma(t) * hd.k[t * R * N + i];
      HeadGrads g = zero_grads(d);
      Vec S(PN, 0.0), dS(PN, 0.0);
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t c0 = c * chunk_size;
        std::copy(S.begin(), S.end(), starts.begin() + c * PN);
        advance_state(hd, c0, chunk_cumsum(hd, c0, std::min(chunk_size, L - c0)), S);
      }
      for (int64_t c = chunks - 1; c >= 0; --c) {
        const int64_t c0 = c * chunk_size;
        const Vec Sin(starts.begin() + c * PN, starts.begin() + (c + 1) * PN);
        chunk_bwd(hd, kt, dY, c0, std::min(chunk_size, L - c0), Sin, dS, dkt, g);
      }
      for (int64_t t = 0; t < L; ++t) {
        const double* k = &hd.k[t * R * N];
        const double* dk_t = &dkt[t * R * N];
        const double ds = dot(k, dk_t, R * N), sig = hd.sigma(t);
        for (int64_t i = 0; i < R * N; ++i) g.dk[t * R * N + i] += sig * dk_t[i];
        g.dgamma[t] += ds;
        if (t + 1 < L) g.deps[t + 1] += ds;
      }
      store_grads(g, d, b, h, grads);
    }
}

template void mamba3_recurrent_fwd<float>(const Mamba3Inputs<float>&, const Mamba3Dims&, float*);
template void mamba3_recurrent_fwd<double>(const Mamba3Inputs<double>&, const Mamba3Dims&, double*);
template void mamba3_recurrent_bwd<float>(const Mamba3Inputs<float>&, const float*, const Mamba3Dims&,
                                          const Mamba3Grads<float>&);
template void mamba3_recurrent_bwd<double>(const Mamba3Inputs<double>&, const double*, const Mamba3Dims&,
                                           const Mamba3Grads<double>&);
template void mamba3_chunk_fwd<float>(const Mamba3Inputs<float>&, const Mamba3Dims&, float*, int64_t);
template void mamba3_chunk_fwd<double>(const Mamba3Inputs<double>&, const Mamba3Dims&, double*, int64_t);
template void mamba3_chunk_bwd<float>(const Mamba3Inputs<float>&, const float*, const Mamba3Dims&,
                                      const Mamba3Grads<float>&, int64_t);
template void mamba3_chunk_bwd<double>(const Mamba3Inputs<double>&, const double*, const Mamba3Dims&,
                                       const Mamba3Grads<double>&, int64_t);

}  // namespace llmt::cpu
