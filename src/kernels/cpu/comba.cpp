// Comba core, CPU reference (layers-delta.md §4.2, §6.2, §6.4–6.5).
// Same structure as the GDN core (kernels/cpu/gdn.cpp): each (batch, head) is copied into double
// buffers (rows t of q, k, v, p; the state S [K, V]); the chunked form is the shared delta_scalar_chunk.h.
#include "kernels/cpu/comba.h"

#include <cmath>

#include "kernels/cpu/delta_common.h"
#include "kernels/cpu/delta_scalar_chunk.h"
#include "kernels/cpu/delta_scan.h"

namespace llmt::cpu {
namespace {

using namespace delta;

template <typename T>
ScalarHead load(const CombaInputs<T>& in, const DeltaDims& d, int64_t b, int64_t h) {
  return {gather(in.q, d, b, h, d.key_dim), gather(in.k, d, b, h, d.key_dim), gather(in.v, d, b, h, d.value_dim),
          gather(in.p, d, b, h, d.key_dim), gather(in.g, d, b, h, 1),         gather(in.beta, d, b, h, 1),
          load_state(in.initial_state, d, b, h)};
}

template <typename T>
void store_grads(const ScalarGrads& g, const DeltaDims& d, int64_t b, int64_t h, const CombaGrads<T>& out) {
  scatter(g.dq, d, b, h, d.key_dim, out.dq);
  scatter(g.dk, d, b, h, d.key_dim, out.dk);
  scatter(g.dv, d, b, h, d.value_dim, out.dv);
  scatter(g.dp, d, b, h, d.key_dim, out.dp);
  scatter(g.dg, d, b, h, 1, out.dg);
  scatter(g.dbeta, d, b, h, 1, out.dbeta);
  store_state(g.ds0, d, b, h, out.d_initial_state);
}

// One token of the recurrence, S_{t-1} -> S_t in place (layers-delta.md §4.2):
// r = v_t - S^T p_t (undecayed S);  S = alpha_t S + beta_t k_t r^T.
void step(const ScalarHead& hd, int64_t t, int64_t K, int64_t V, double* S, Vec& r) {
  const double alpha = std::exp(hd.g[t]), beta = hd.beta[t];
  const double* k = &hd.k[t * K];
  const double* p = &hd.p[t * K];
  for (int64_t j = 0; j < V; ++j) {
    double sp = 0.0;
    for (int64_t c = 0; c < K; ++c) sp += S[c * V + j] * p[c];
    r[j] = hd.v[t * V + j] - sp;
  }
  for (int64_t c = 0; c < K; ++c)
    for (int64_t j = 0; j < V; ++j) S[c * V + j] = alpha * S[c * V + j] + beta * k[c] * r[j];
}

// Backward of step and of o_t = S_t^T q_t for token t (layers-delta.md §6.4, Comba), S_{t-1} = Sprev, S_t = St:
// dS += q_t do_t^T; dq_t = S_t do_t; e = dS^T k_t; dβ_t = e·r_t; dv_t = β_t e; dk_t = β_t dS r_t;
// dp_t = -β_t S_{t-1} e; dg_t = α_t Σ S_{t-1} ⊙ dS; dS = α_t dS - β_t p_t e^T.
void step_bwd(const ScalarHead& hd, const Vec& dO, int64_t t, const double* Sprev, const double* St, int64_t K,
              int64_t V, Vec& r, Vec& e, ScalarGrads& g) {
  const double* q = &hd.q[t * K];
  const double* k = &hd.k[t * K];
  const double* p = &hd.p[t * K];
  const double* dout = &dO[t * V];
  const double alpha = std::exp(hd.g[t]), beta = hd.beta[t];
  Vec& dS = g.ds0;
  for (int64_t m = 0; m < K; ++m) {
    for (int64_t j = 0; j < V; ++j) dS[m * V + j] += q[m] * dout[j];
    g.dq[t * K + m] = dot(&St[m * V], dout, V);
  }
  for (int64_t j = 0; j < V; ++j) {
    double sp = 0.0, ek = 0.0;
    for (int64_t m = 0; m < K; ++m) {
      sp += Sprev[m * V + j] * p[m];
      ek += dS[m * V + j] * k[m];
    }
    r[j] = hd.v[t * V + j] - sp;
    e[j] = ek;
  }
  g.dbeta[t] = dot(e.data(), r.data(), V);
  for (int64_t j = 0; j < V; ++j) g.dv[t * V + j] = beta * e[j];
  for (int64_t m = 0; m < K; ++m) {
    g.dk[t * K + m] = beta * dot(&dS[m * V], r.data(), V);
    g.dp[t * K + m] = -beta * dot(&Sprev[m * V], e.data(), V);
  }
  g.dg[t] = alpha * dot(Sprev, dS.data(), K * V);
  for (int64_t m = 0; m < K; ++m)
    for (int64_t j = 0; j < V; ++j) dS[m * V + j] = alpha * dS[m * V + j] - beta * p[m] * e[j];
}

}  // namespace

// r_t = v_t - S_{t-1}^T p_t; S_t = α_t S_{t-1} + β_t k_t r_t^T; o_t = S_t^T q_t   (layers-delta.md §4.2)
template <typename T>
void comba_recurrent_fwd(const CombaInputs<T>& in, const DeltaDims& d, T* o, T* final_state) {
  const int64_t K = d.key_dim, V = d.value_dim;
  Vec r(V);
  recurrent_forward(
      d, [&](int64_t b, int64_t h) { return load(in, d, b, h); },
      [&](const ScalarHead& hd, int64_t t, double* St) { step(hd, t, K, V, St, r); }, o, final_state);
}

// Reverse-time backward (layers-delta.md §6.4, Comba): step_bwd for t = T..1 on recomputed states.
template <typename T>
void comba_recurrent_bwd(const CombaInputs<T>& in, const T* d_o, const T* d_final_state, const DeltaDims& d,
                         const CombaGrads<T>& grads) {
  const int64_t K = d.key_dim, V = d.value_dim;
  Vec r(V), e(V);
  for_each_head(d, [&](int64_t b, int64_t h) {
    const ScalarHead hd = load(in, d, b, h);
    const Vec dO = gather(d_o, d, b, h, V);
    ScalarGrads g = zero_grads(true, d_final_state, d, b, h);
    recurrent_reverse(
        hd.s0, d.seq_len, K * V, [&](int64_t t, double* S) { step(hd, t, K, V, S, r); },
        [&](int64_t t, const double* Sprev, const double* St) { step_bwd(hd, dO, t, Sprev, St, K, V, r, e, g); });
    store_grads(g, d, b, h, grads);
  });
}

// Chunked forward (layers-delta.md §6.1, §6.2), scalar_chunk_fwd per head.
template <typename T>
void comba_chunk_fwd(const CombaInputs<T>& in, const DeltaDims& d, T* o, T* final_state, int64_t chunk_size) {
  scalar_chunk_fwd_all(
      "comba", d, [&](int64_t b, int64_t h) { return load(in, d, b, h); }, o, final_state, chunk_size);
}

// Chunked backward (layers-delta.md §6.5), scalar_chunk_bwd per head.
template <typename T>
void comba_chunk_bwd(const CombaInputs<T>& in, const T* d_o, const T* d_final_state, const DeltaDims& d,
                     const CombaGrads<T>& grads, int64_t chunk_size) {
  scalar_chunk_bwd_all(
      "comba", d, [&](int64_t b, int64_t h) { return load(in, d, b, h); }, d_o, d_final_state,
      [&](const ScalarGrads& g, int64_t b, int64_t h) { store_grads(g, d, b, h, grads); }, chunk_size);
}

template void comba_recurrent_fwd<float>(const CombaInputs<float>&, const DeltaDims&, float*, float*);
template void comba_recurrent_fwd<double>(const CombaInputs<double>&, const DeltaDims&, double*, double*);
template void comba_recurrent_bwd<float>(const CombaInputs<float>&, const float*, const float*, const DeltaDims&,
                                         const CombaGrads<float>&);
template void comba_recurrent_bwd<double>(const CombaInputs<double>&, const double*, const double*,
                                          const DeltaDims&, const CombaGrads<double>&);
template void comba_chunk_fwd<float>(const CombaInputs<float>&, const DeltaDims&, float*, float*, int64_t);
template void comba_chunk_fwd<double>(const CombaInputs<double>&, const DeltaDims&, double*, double*, int64_t);
template void comba_chunk_bwd<float>(const CombaInputs<float>&, const float*, const float*, const DeltaDims&,
                                     const CombaGrads<float>&, int64_t);
template void comba_chunk_bwd<double>(const CombaInputs<double>&, const double*, const double*, const DeltaDims&,
                                      const CombaGrads<double>&, int64_t);

}  // namespace llmt::cpu
