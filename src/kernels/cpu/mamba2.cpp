// Mamba2 SSD core, CPU reference (layers-ssm-attn.md §2.4–2.6).
// Each (batch, head) is copied into double buffers (x [T, P], Δ [T], the group's B, C [T, N], the state
// S [P, N]), processed by direct loops and written back; dB, dC, dA, dD are accumulated over heads.
#include "kernels/cpu/mamba2.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

namespace llmt::cpu {
namespace {

using Vec = std::vector<double>;

// Rows [b, t, m, 0:width) of a [B, T, M, width] tensor as a dense [T, width] buffer.
template <typename T>
Vec gather(const T* src, int64_t b, int64_t L, int64_t M, int64_t m, int64_t width) {
  Vec out(static_cast<size_t>(L * width));
  for (int64_t t = 0; t < L; ++t)
    for (int64_t c = 0; c < width; ++c) out[t * width + c] = src[((b * L + t) * M + m) * width + c];
  return out;
}

// Adds (accumulate) or writes a dense [T, width] buffer to the rows [b, t, m, 0:width) of dst.
template <typename T>
void scatter(const Vec& in, int64_t b, int64_t L, int64_t M, int64_t m, int64_t width, T* dst, bool accumulate) {
  for (int64_t t = 0; t < L; ++t)
    for (int64_t c = 0; c < width; ++c) {
      T& e = dst[((b * L + t) * M + m) * width + c];
      e = static_cast<T>((accumulate ? static_cast<double>(e) : 0.0) + in[t * width + c]);
    }
}

double dot(const double* a, const double* b, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// One (batch, head) slice. x [T, P], dt [T], bm, c [T, N] (the head's group), s0 [P, N] (zeros when absent).
struct Head {
  Vec x, dt, bm, c, s0;
  double A, D;
};

template <typename T>
Head load(const Mamba2Inputs<T>& in, const Mamba2Dims& d, int64_t b, int64_t h) {
  const int64_t g = h / (d.heads / d.groups), PN = d.head_dim * d.state_dim;
  Head hd{gather(in.x, b, d.seq_len, d.heads, h, d.head_dim),
          gather(in.dt, b, d.seq_len, d.heads, h, 1),
          gather(in.Bm, b, d.seq_len, d.groups, g, d.state_dim),
          gather(in.C, b, d.seq_len, d.groups, g, d.state_dim),
          Vec(PN, 0.0),
          static_cast<double>(in.A[h]),
          static_cast<double>(in.D[h])};
  if (in.initial_state != nullptr) {
    const T* s = in.initial_state + (b * d.heads + h) * PN;
    std::copy(s, s + PN, hd.s0.begin());
  }
  return hd;
}

// Per-head gradients: same shapes as Head; dA, dD scalars.
struct HeadGrads {
  Vec dx, ddt, dbm, dc, ds0;
  double dA = 0.0, dD = 0.0;
};

HeadGrads zero_grads(const Mamba2Dims& d) {
  const int64_t L = d.seq_len;
  return {Vec(L * d.head_dim, 0.0), Vec(L, 0.0), Vec(L * d.state_dim, 0.0), Vec(L * d.state_dim, 0.0),
          Vec(d.head_dim * d.state_dim, 0.0)};
}

template <typename T>
void store_state(const Vec& s, const Mamba2Dims& d, int64_t b, int64_t h, T* dst) {
  if (dst == nullptr) return;
  T* out = dst + (b * d.heads + h) * d.head_dim * d.state_dim;
  for (size_t i = 0; i < s.size(); ++i) out[i] = static_cast<T>(s[i]);
}

// Zeroes the accumulated outputs (dB, dC, dA, dD) before the heads add into them.
template <typename T>
void clear_accumulated(const Mamba2Dims& d, const Mamba2Grads<T>& g) {
  const int64_t bc = d.batch * d.seq_len * d.groups * d.state_dim;
  std::fill(g.dB, g.dB + bc, T(0));
  std::fill(g.dC, g.dC + bc, T(0));
  std::fill(g.dA, g.dA + d.heads, T(0));
  std::fill(g.dD, g.dD + d.heads, T(0));
}

template <typename T>
void store_grads(const HeadGrads& g, const Mamba2Dims& d, int64_t b, int64_t h, const Mamba2Grads<T>& out) {
  const int64_t grp = h / (d.heads / d.groups);
  scatter(g.dx, b, d.seq_len, d.heads, h, d.head_dim, out.dx, false);
  scatter(g.ddt, b, d.seq_len, d.heads, h, 1, out.ddt, false);
  scatter(g.dbm, b, d.seq_len, d.groups, grp, d.state_dim, out.dB, true);
  scatter(g.dc, b, d.seq_len, d.groups, grp, d.state_dim, out.dC, true);
  out.dA[h] = static_cast<T>(static_cast<double>(out.dA[h]) + g.dA);
  out.dD[h] = static_cast<T>(static_cast<double>(out.dD[h]) + g.dD);
  store_state(g.ds0, d, b, h, out.d_initial_state);
}

void check_dims(const Mamba2Dims& d) {
  check(d.groups >= 1 && d.heads % d.groups == 0, "mamba2: n_groups ({}) must divide the number of heads ({})",
        d.groups, d.heads);
}

void check_chunk_size(int64_t chunk_size) {
  check(chunk_size >= 1, "mamba2 chunk: chunk_size must be >= 1, got {}", chunk_size);
}

// One token of §2.4, S_{t-1} -> S_t in place: S = α_t S + Δ_t x_t B_t^T.
void step(const Head& hd, int64_t t, int64_t P, int64_t N, double* S) {
  const double dt = hd.dt[t], alpha = std::exp(dt * hd.A);
  const double* x = &hd.x[t * P];
  const double* bm = &hd.bm[t * N];
  for (int64_t p = 0; p < P; ++p)
    for (int64_t n = 0; n < N; ++n) S[p * N + n] = alpha * S[p * N + n] + dt * x[p] * bm[n];
}

// Chunk-local inclusive cumsum G of a = Δ A for tokens [c0, c0 + n) (§2.5 step 1).
Vec chunk_cumsum(const Head& hd, int64_t c0, int64_t n) {
  Vec G(n);
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) G[i] = acc += hd.dt[c0 + i] * hd.A;
  return G;
}

// §2.5 step 3–4: S <- e^{Γ} S + Σ_j e^{Γ-G_j} Δ_j x_j B_j^T, the state leaving the chunk.
void advance_state(const Head& hd, int64_t c0, const Vec& G, int64_t P, int64_t N, Vec& S) {
  const int64_t n = static_cast<int64_t>(G.size());
  const double gam = G[n - 1], eg = std::exp(gam);
  for (double& s : S) s *= eg;
  for (int64_t j = 0; j < n; ++j) {
    const double f = std::exp(gam - G[j]) * hd.dt[c0 + j];
    const double* x = &hd.x[(c0 + j) * P];
    const double* bm = &hd.bm[(c0 + j) * N];
    for (int64_t p = 0; p < P; ++p)
      for (int64_t m = 0; m < N; ++m) S[p * N + m] += f * x[p] * bm[m];
  }
}

// §2.6.3 a–h for one chunk [c0, c0 + n). dY: the head's [T, P] output gradient; Sin: the state entering
// the chunk; dS: on entry dS_out (gradient w.r.t. the state leaving the chunk), on return dS_in.
// Writes the chunk's rows of g.dx, g.ddt, g.dbm, g.dc and adds to g.dA, g.dD.
void chunk_bwd(const Head& hd, const Vec& dY, int64_t c0, int64_t n, const Vec& Sin, int64_t P, int64_t N, Vec& dS,
               HeadGrads& g) {
  const Vec G = chunk_cumsum(hd, c0, n);
  const double gam = G[n - 1], eg = std::exp(gam);
  auto x = [&](int64_t i) { return &hd.x[(c0 + i) * P]; };
  auto bm = [&](int64_t i) { return &hd.bm[(c0 + i) * N]; };
  auto c = [&](int64_t i) { return &hd.c[(c0 + i) * N]; };
  auto dy = [&](int64_t i) { return &dY[(c0 + i) * P]; };
  Vec dG(n, 0.0), tmp(std::max(P, N)), vbar(n * P, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const double ei = std::exp(G[i]);
    // Inter-chunk read y_i += e^{G_i} S_in C_i: dC_i += e^{G_i} S_in^T dy_i; dG_i += e^{G_i} dy_i·(S_in C_i).
    for (int64_t m = 0; m < N; ++m) {
      double s = 0.0;
      for (int64_t p = 0; p < P; ++p) s += Sin[p * N + m] * dy(i)[p];
      g.dc[(c0 + i) * N + m] += ei * s;
      tmp[m] = s;
    }
    dG[i] += ei * dot(tmp.data(), c(i), N);
    // Intra-chunk: with E = e^{G_i-G_j} (j <= i), CB = C_i·B_j, dCB = (dy_i·x_j) Δ_j E (step c);
    // dC_i += dCB B_j, dB_j += dCB C_i, v̄_j += CB E dy_i, dG_i += dCB·CB, dG_j -= dCB·CB.
    for (int64_t j = 0; j <= i; ++j) {
      const double E = std::exp(std::min(G[i] - G[j], 0.0)), cb = dot(c(i), bm(j), N);
      const double dcb = dot(dy(i), x(j), P) * hd.dt[c0 + j] * E;
      for (int64_t m = 0; m < N; ++m) {
        g.dc[(c0 + i) * N + m] += dcb * bm(j)[m];
        g.dbm[(c0 + j) * N + m] += dcb * c(i)[m];
      }
      for (int64_t p = 0; p < P; ++p) vbar[j * P + p] += cb * E * dy(i)[p];
      dG[i] += dcb * cb;
      dG[j] -= dcb * cb;
    }
  }
  // State write S_out += e^{Γ-G_j} Δ_j x_j B_j^T (steps e, f, g): with f = e^{Γ-G_j},
  // v̄_j += f dS_out B_j, dB_j += f Δ_j dS_out^T x_j, z_j = f Δ_j x_j^T dS_out B_j; dG_j -= z_j, dΓ += z_j.
  for (int64_t j = 0; j < n; ++j) {
    const double f = std::exp(gam - G[j]), dtj = hd.dt[c0 + j];
    for (int64_t p = 0; p < P; ++p) {
      const double s = f * dot(&dS[p * N], bm(j), N);
      vbar[j * P + p] += s;
      tmp[p] = s;
    }
    const double z = dtj * dot(x(j), tmp.data(), P);
    dG[j] -= z;
    dG[n - 1] += z;
    for (int64_t m = 0; m < N; ++m) {
      double s = 0.0;
      for (int64_t p = 0; p < P; ++p) s += dS[p * N + m] * x(j)[p];
      g.dbm[(c0 + j) * N + m] += f * dtj * s;
    }
  }
  // State passing S_out += e^Γ S_in (step b): dΓ += e^Γ <dS_out, S_in>.
  dG[n - 1] += eg * dot(dS.data(), Sin.data(), P * N);
  // dS_in = e^Γ dS_out + Σ_i e^{G_i} dy_i C_i^T (steps a, b).
  for (double& s : dS) s *= eg;
  for (int64_t i = 0; i < n; ++i) {
    const double ei = std::exp(G[i]);
    for (int64_t p = 0; p < P; ++p)
      for (int64_t m = 0; m < N; ++m) dS[p * N + m] += ei * dy(i)[p] * c(i)[m];
  }
  // Step f: dx_j = Δ_j v̄_j + D dy_j; dΔ_j = x_j·v̄_j; dD += x_j·dy_j. Step g/h: da_k = Σ_{i>=k} dG_i;
  // dΔ_k += A da_k; dA += Δ_k da_k.
  double acc = 0.0;
  for (int64_t j = n - 1; j >= 0; --j) {
    const double dtj = hd.dt[c0 + j];
    acc += dG[j];
    for (int64_t p = 0; p < P; ++p) g.dx[(c0 + j) * P + p] = dtj * vbar[j * P + p] + hd.D * dy(j)[p];
    g.ddt[c0 + j] = dot(x(j), &vbar[j * P], P) + hd.A * acc;
    g.dA += dtj * acc;
    g.dD += dot(x(j), dy(j), P);
  }
}

}  // namespace

// α_t = exp(Δ_t A); S_t = α_t S_{t-1} + Δ_t x_t B_t^T; y_t = S_t C_t + D x_t   (layers-ssm-attn.md §2.4)
template <typename T>
void mamba2_recurrent_fwd(const Mamba2Inputs<T>& in, const Mamba2Dims& d, T* y, T* final_state) {
  check_dims(d);
  const int64_t P = d.head_dim, N = d.state_dim;
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h) {
      const Head hd = load(in, d, b, h);
      Vec S = hd.s0, out(d.seq_len * P);
      for (int64_t t = 0; t < d.seq_len; ++t) {
        step(hd, t, P, N, S.data());
        for (int64_t p = 0; p < P; ++p) out[t * P + p] = dot(&S[p * N], &hd.c[t * N], N) + hd.D * hd.x[t * P + p];
      }
      scatter(out, b, d.seq_len, d.heads, h, P, y, false);
      store_state(S, d, b, h, final_state);
    }
}

// Reverse-time backward (§2.6.4), per token t = T-1..0 with dS the adjoint of S_t:
// dS += dy_t C_t^T; dC_t = S_t^T dy_t; dB_t = Δ_t dS^T x_t; dx_t = Δ_t dS B_t + D dy_t;
// da_t = α_t <dS, S_{t-1}>; dΔ_t = x_t^T dS B_t + A da_t; dA += Δ_t da_t; dD += x_t·dy_t; dS = α_t dS.
template <typename T>
void mamba2_recurrent_bwd(const Mamba2Inputs<T>& in, const T* d_y, const T* d_final_state, const Mamba2Dims& d,
                          const Mamba2Grads<T>& grads) {
  check_dims(d);
  const int64_t P = d.head_dim, N = d.state_dim, L = d.seq_len, PN = P * N;
  constexpr int64_t kSegment = 64;  // checkpoint spacing of the recomputed states
  const int64_t segments = (L + kSegment - 1) / kSegment;
  Vec states((kSegment + 1) * PN), checkpoints(segments * PN), dSB(P);
  clear_accumulated(d, grads);
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h) {
      const Head hd = load(in, d, b, h);
      const Vec dY = gather(d_y, b, L, d.heads, h, P);
      HeadGrads g = zero_grads(d);
      Vec S = hd.s0;
      for (int64_t t = 0; t < L; ++t) {
        if (t % kSegment == 0) std::copy(S.begin(), S.end(), checkpoints.begin() + (t / kSegment) * PN);
        step(hd, t, P, N, S.data());
      }
      Vec& dS = g.ds0;
      if (d_final_state != nullptr) {
        const T* src = d_final_state + (b * d.heads + h) * PN;
        std::copy(src, src + PN, dS.begin());
      }
      for (int64_t seg = segments - 1; seg >= 0; --seg) {
        const int64_t t0 = seg * kSegment, t1 = std::min(L, t0 + kSegment);
        // states[i] = the state before token t0 + i, i = 0..t1-t0.
        std::copy(checkpoints.begin() + seg * PN, checkpoints.begin() + (seg + 1) * PN, states.begin());
        for (int64_t t = t0; t < t1; ++t) {
          double* next = &states[(t - t0 + 1) * PN];
          std::copy(next - PN, next, next);
          step(hd, t, P, N, next);
        }
        for (int64_t t = t1 - 1; t >= t0; --t) {
          const double* Sprev = &states[(t - t0) * PN];
          const double* St = &states[(t - t0 + 1) * PN];
          const double* x = &hd.x[t * P];
          const double* bm = &hd.bm[t * N];
          const double* c = &hd.c[t * N];
          const double* dy = &dY[t * P];
          const double dt = hd.dt[t], alpha = std::exp(dt * hd.A);
          for (int64_t p = 0; p < P; ++p)
            for (int64_t m = 0; m < N; ++m) dS[p * N + m] += dy[p] * c[m];
          for (int64_t m = 0; m < N; ++m) {
            double sc = 0.0, sb = 0.0;
            for (int64_t p = 0; p < P; ++p) {
              sc += St[p * N + m] * dy[p];
              sb += dS[p * N + m] * x[p];
            }
            g.dc[t * N + m] = sc;
            g.dbm[t * N + m] = dt * sb;
          }
          for (int64_t p = 0; p < P; ++p) {
            dSB[p] = dot(&dS[p * N], bm, N);
            g.dx[t * P + p] = dt * dSB[p] + hd.D * dy[p];
          }
          const double da = alpha * dot(dS.data(), Sprev, PN);
          g.ddt[t] = dot(x, dSB.data(), P) + hd.A * da;
          g.dA += dt * da;
          g.dD += dot(x, dy, P);
          for (double& s : dS) s *= alpha;
        }
      }
      store_grads(g, d, b, h, grads);
    }
}

// Chunked forward, per chunk: G = cumsum(Δ A); y_i = Σ_{j<=i} (C_i·B_j) e^{G_i-G_j} Δ_j x_j
// + e^{G_i} S_in C_i + D x_i; S_out = e^Γ S_in + Σ_j e^{Γ-G_j} Δ_j x_j B_j^T   (§2.5)
template <typename T>
void mamba2_chunk_fwd(const Mamba2Inputs<T>& in, const Mamba2Dims& d, T* y, T* final_state, int64_t chunk_size) {
  check_dims(d);
  check_chunk_size(chunk_size);
  const int64_t P = d.head_dim, N = d.state_dim;
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h) {
      const Head hd = load(in, d, b, h);
      Vec S = hd.s0, out(d.seq_len * P, 0.0);
      for (int64_t c0 = 0; c0 < d.seq_len; c0 += chunk_size) {
        const int64_t n = std::min(chunk_size, d.seq_len - c0);
        const Vec G = chunk_cumsum(hd, c0, n);
        for (int64_t i = 0; i < n; ++i) {
          double* yrow = &out[(c0 + i) * P];
          const double* c = &hd.c[(c0 + i) * N];
          const double ei = std::exp(G[i]);
          for (int64_t p = 0; p < P; ++p) yrow[p] = ei * dot(&S[p * N], c, N) + hd.D * hd.x[(c0 + i) * P + p];
          for (int64_t j = 0; j <= i; ++j) {
            const double w = dot(c, &hd.bm[(c0 + j) * N], N) * std::exp(std::min(G[i] - G[j], 0.0)) * hd.dt[c0 + j];
            for (int64_t p = 0; p < P; ++p) yrow[p] += w * hd.x[(c0 + j) * P + p];
          }
        }
        advance_state(hd, c0, G, P, N, S);
      }
      scatter(out, b, d.seq_len, d.heads, h, P, y, false);
      store_state(S, d, b, h, final_state);
    }
}

// Chunked backward: recompute the chunk-entry states, then §2.6.3 a–h chunk by chunk in reverse,
// carrying dS   (§2.6.3)
template <typename T>
void mamba2_chunk_bwd(const Mamba2Inputs<T>& in, const T* d_y, const T* d_final_state, const Mamba2Dims& d,
                      const Mamba2Grads<T>& grads, int64_t chunk_size) {
  check_dims(d);
  check_chunk_size(chunk_size);
  const int64_t P = d.head_dim, N = d.state_dim, L = d.seq_len, PN = P * N;
  const int64_t chunks = (L + chunk_size - 1) / chunk_size;
  Vec starts(chunks * PN);
  clear_accumulated(d, grads);
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h) {
      const Head hd = load(in, d, b, h);
      const Vec dY = gather(d_y, b, L, d.heads, h, P);
      HeadGrads g = zero_grads(d);
      Vec S = hd.s0;
      for (int64_t k = 0; k < chunks; ++k) {
        const int64_t c0 = k * chunk_size;
        std::copy(S.begin(), S.end(), starts.begin() + k * PN);
        advance_state(hd, c0, chunk_cumsum(hd, c0, std::min(chunk_size, L - c0)), P, N, S);
      }
      Vec& dS = g.ds0;
      if (d_final_state != nullptr) {
        const T* src = d_final_state + (b * d.heads + h) * PN;
        std::copy(src, src + PN, dS.begin());
      }
      for (int64_t k = chunks - 1; k >= 0; --k) {
        const int64_t c0 = k * chunk_size;
        const Vec Sin(starts.begin() + k * PN, starts.begin() + (k + 1) * PN);
        chunk_bwd(hd, dY, c0, std::min(chunk_size, L - c0), Sin, P, N, dS, g);
      }
      store_grads(g, d, b, h, grads);
    }
}

namespace {

// The core's inputs in double, split out of the layer's packed tensors (§2.2 steps 3–4).
struct Unpacked {
  Vec x, dt, A, bm, c, D;
  Mamba2Inputs<double> inputs() const { return {x.data(), dt.data(), A.data(), bm.data(), c.data(), D.data(), nullptr}; }
};

double softplus(double v) { return v > 20.0 ? v : std::log1p(std::exp(v)); }

template <typename T>
Unpacked unpack(const T* xbc, const T* dt_raw, const T* dt_bias, const T* A_log, const T* D, const Mamba2Dims& d) {
  const int64_t rows = d.batch * d.seq_len, H = d.heads, XD = H * d.head_dim, GN = d.groups * d.state_dim;
  const int64_t width = XD + 2 * GN;
  Unpacked u{Vec(rows * XD), Vec(rows * H), Vec(H), Vec(rows * GN), Vec(rows * GN), Vec(H)};
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = xbc + r * width;
    std::copy(row, row + XD, &u.x[r * XD]);
    std::copy(row + XD, row + XD + GN, &u.bm[r * GN]);
    std::copy(row + XD + GN, row + width, &u.c[r * GN]);
    for (int64_t h = 0; h < H; ++h) u.dt[r * H + h] = softplus(static_cast<double>(dt_raw[r * H + h]) + dt_bias[h]);
  }
  for (int64_t h = 0; h < H; ++h) {
    u.A[h] = -std::exp(static_cast<double>(A_log[h]));
    u.D[h] = D[h];
  }
  return u;
}

}  // namespace

// Δ = softplus(dt_raw + dt_bias), A = -exp(A_log), y = SSD(x, Δ, A, B, C) + D x   (§2.2 steps 3–5)
template <typename T>
void mamba2_ssd_fwd(const T* xbc, const T* dt_raw, const T* dt_bias, const T* A_log, const T* D, const Mamba2Dims& d,
                    int64_t chunk_size, T* y, T* state) {
  check_dims(d);
  const Unpacked u = unpack(xbc, dt_raw, dt_bias, A_log, D, d);
  Vec out(u.x.size()), carried;
  Mamba2Inputs<double> in = u.inputs();
  if (state != nullptr) {
    carried.assign(state, state + d.batch * d.heads * d.head_dim * d.state_dim);
    in.initial_state = carried.data();
  }
  mamba2_chunk_fwd<double>(in, d, out.data(), state != nullptr ? carried.data() : nullptr, chunk_size);
  std::copy(out.begin(), out.end(), y);
  if (state != nullptr) std::copy(carried.begin(), carried.end(), state);
}

// §2.6.2 steps 3–5: the core's gradients, d(dt_raw) = dΔ σ(dt_raw + dt_bias), d dt_bias = Σ d(dt_raw),
// dA_log = dA · A, repacked as [dx | dB | dC].
template <typename T>
void mamba2_ssd_bwd(const T* dy, const T* xbc, const T* dt_raw, const T* dt_bias, const T* A_log, const T* D,
                    const Mamba2Dims& d, int64_t chunk_size, T* dxbc, T* ddt_raw, T* ddt_bias, T* dA_log, T* dD) {
  check_dims(d);
  const Unpacked u = unpack(xbc, dt_raw, dt_bias, A_log, D, d);
  const int64_t rows = d.batch * d.seq_len, H = d.heads, XD = H * d.head_dim, GN = d.groups * d.state_dim;
  const int64_t width = XD + 2 * GN;
  const Vec dyv(dy, dy + rows * XD);
  Vec dx(u.x.size()), ddt(u.dt.size()), dA(H), dB(u.bm.size()), dC(u.c.size()), dDv(H);
  mamba2_chunk_bwd<double>(u.inputs(), dyv.data(), nullptr, d,
                           {dx.data(), ddt.data(), dA.data(), dB.data(), dC.data(), dDv.data(), nullptr}, chunk_size);
  Vec dbias(H, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    T* row = dxbc + r * width;
    for (int64_t i = 0; i < XD; ++i) row[i] = static_cast<T>(dx[r * XD + i]);
    for (int64_t i = 0; i < GN; ++i) {
      row[XD + i] = static_cast<T>(dB[r * GN + i]);
      row[XD + GN + i] = static_cast<T>(dC[r * GN + i]);
    }
    for (int64_t h = 0; h < H; ++h) {
      const double v = static_cast<double>(dt_raw[r * H + h]) + dt_bias[h];
      const double g = ddt[r * H + h] * (v > 20.0 ? 1.0 : 1.0 / (1.0 + std::exp(-v)));
      ddt_raw[r * H + h] = static_cast<T>(g);
      dbias[h] += g;
    }
  }
  for (int64_t h = 0; h < H; ++h) {
    ddt_bias[h] = static_cast<T>(ddt_bias[h] + dbias[h]);
    dA_log[h] = static_cast<T>(dA_log[h] + dA[h] * u.A[h]);
    dD[h] = static_cast<T>(dD[h] + dDv[h]);
  }
}

template void mamba2_recurrent_fwd<float>(const Mamba2Inputs<float>&, const Mamba2Dims&, float*, float*);
template void mamba2_recurrent_fwd<double>(const Mamba2Inputs<double>&, const Mamba2Dims&, double*, double*);
template void mamba2_recurrent_bwd<float>(const Mamba2Inputs<float>&, const float*, const float*, const Mamba2Dims&,
                                          const Mamba2Grads<float>&);
template void mamba2_recurrent_bwd<double>(const Mamba2Inputs<double>&, const double*, const double*,
                                           const Mamba2Dims&, const Mamba2Grads<double>&);
template void mamba2_chunk_fwd<float>(const Mamba2Inputs<float>&, const Mamba2Dims&, float*, float*, int64_t);
template void mamba2_chunk_fwd<double>(const Mamba2Inputs<double>&, const Mamba2Dims&, double*, double*, int64_t);
template void mamba2_chunk_bwd<float>(const Mamba2Inputs<float>&, const float*, const float*, const Mamba2Dims&,
                                      const Mamba2Grads<float>&, int64_t);
template void mamba2_chunk_bwd<double>(const Mamba2Inputs<double>&, const double*, const double*, const Mamba2Dims&,
                                       const Mamba2Grads<double>&, int64_t);

template void mamba2_ssd_fwd<float>(const float*, const float*, const float*, const float*, const float*,
                                    const Mamba2Dims&, int64_t, float*, float*);
template void mamba2_ssd_fwd<double>(const double*, const double*, const double*, const double*, const double*,
                                     const Mamba2Dims&, int64_t, double*, double*);
template void mamba2_ssd_bwd<float>(const float*, const float*, const float*, const float*, const float*, const float*,
                                    const Mamba2Dims&, int64_t, float*, float*, float*, float*, float*);
template void mamba2_ssd_bwd<double>(const double*, const double*, const double*, const double*, const double*,
                                     const double*, const Mamba2Dims&, int64_t, double*, double*, double*, double*,
                                     double*);

}  // namespace llmt::cpu
