// Gated DeltaNet core, CPU reference (layers-delta.md §4.1, §6.1, §6.3–6.5).
// Each (batch, head) is copied into double buffers (rows t of q, k, v; the state S [K, V]), processed
// by the shared delta-rule steps (delta_recurrence.h, delta_scalar_chunk.h), and written back.
#include "kernels/cpu/gdn.h"

#include "kernels/cpu/delta_common.h"
#include "kernels/cpu/delta_recurrence.h"
#include "kernels/cpu/delta_scalar_chunk.h"
#include "kernels/cpu/delta_scan.h"

namespace llmt::cpu {
namespace {

using namespace delta;

template <typename T>
ScalarHead load(const GdnInputs<T>& in, const DeltaDims& d, int64_t b, int64_t h) {
  return {gather(in.q, d, b, h, d.key_dim),      gather(in.k, d, b, h, d.key_dim), gather(in.v, d, b, h, d.value_dim),
          {},                                    gather(in.g, d, b, h, 1),         gather(in.beta, d, b, h, 1),
          load_state(in.initial_state, d, b, h)};
}

template <typename T>
void store_grads(const ScalarGrads& g, const DeltaDims& d, int64_t b, int64_t h, const GdnGrads<T>& out) {
  scatter(g.dq, d, b, h, d.key_dim, out.dq);
  scatter(g.dk, d, b, h, d.key_dim, out.dk);
  scatter(g.dv, d, b, h, d.value_dim, out.dv);
  scatter(g.dg, d, b, h, 1, out.dg);
  scatter(g.dbeta, d, b, h, 1, out.dbeta);
  store_state(g.ds0, d, b, h, out.d_initial_state);
}

// One token of the recurrence, S_{t-1} -> S_t in place (layers-delta.md §4.1).
void step(const ScalarHead& hd, int64_t t, int64_t K, int64_t V, double* S, Vec& delta) {
  decayed_step(&hd.g[t], 0, hd.beta[t], &hd.k[t * K], &hd.v[t * V], K, V, S, delta.data());
}

}  // namespace

// S̄_t = α_t S_{t-1}; δ_t = β_t (v_t - S̄_t^T k_t); S_t = S̄_t + k_t δ_t^T; o_t = S_t^T q_t   (layers-delta.md §4.1)
template <typename T>
void gdn_recurrent_fwd(const GdnInputs<T>& in, const DeltaDims& d, T* o, T* final_state) {
  const int64_t K = d.key_dim, V = d.value_dim;
  Vec delta(V);
  recurrent_forward(
      d, [&](int64_t b, int64_t h) { return load(in, d, b, h); },
      [&](const ScalarHead& hd, int64_t t, double* St) { step(hd, t, K, V, St, delta); }, o, final_state);
}

// Reverse-time backward (layers-delta.md §6.4), per token t = T..1: decayed_step_bwd with the scalar decay.
template <typename T>
void gdn_recurrent_bwd(const GdnInputs<T>& in, const T* d_o, const T* d_final_state, const DeltaDims& d,
                       const GdnGrads<T>& grads) {
  const int64_t K = d.key_dim, V = d.value_dim;
  Vec delta(V);
  TokenScratch w{Vec(K * V), Vec(V), Vec(V)};
  for_each_head(d, [&](int64_t b, int64_t h) {
    const ScalarHead hd = load(in, d, b, h);
    const Vec dO = gather(d_o, d, b, h, V);
    ScalarGrads g = zero_grads(false, d_final_state, d, b, h);
    recurrent_reverse(
        hd.s0, d.seq_len, K * V, [&](int64_t t, double* S) { step(hd, t, K, V, S, delta); },
        [&](int64_t t, const double* Sprev, const double* St) {
          decayed_step_bwd(&hd.g[t], 0, hd.beta[t], &hd.q[t * K], &hd.k[t * K], &hd.v[t * V], &dO[t * V], Sprev, St,
                           K, V, g.ds0.data(), w,
                           {&g.dq[t * K], &g.dk[t * K], &g.dv[t * V], &g.dbeta[t], &g.dg[t]});
        });
    store_grads(g, d, b, h, grads);
  });
}

// Chunked forward (layers-delta.md §6.1, §6.3), scalar_chunk_fwd per head.
template <typename T>
void gdn_chunk_fwd(const GdnInputs<T>& in, const DeltaDims& d, T* o, T* final_state, int64_t chunk_size) {
  scalar_chunk_fwd_all(
      "gdn", d, [&](int64_t b, int64_t h) { return load(in, d, b, h); }, o, final_state, chunk_size);
}

// Chunked backward (layers-delta.md §6.5), scalar_chunk_bwd per head.
template <typename T>
void gdn_chunk_bwd(const GdnInputs<T>& in, const T* d_o, const T* d_final_state, const DeltaDims& d,
                   const GdnGrads<T>& grads, int64_t chunk_size) {
  scalar_chunk_bwd_all(
      "gdn", d, [&](int64_t b, int64_t h) { return load(in, d, b, h); }, d_o, d_final_state,
      [&](const ScalarGrads& g, int64_t b, int64_t h) { store_grads(g, d, b, h, grads); }, chunk_size);
}

template void gdn_recurrent_fwd<float>(const GdnInputs<float>&, const DeltaDims&, float*, float*);
template void gdn_recurrent_fwd<double>(const GdnInputs<double>&, const DeltaDims&, double*, double*);
template void gdn_recurrent_bwd<float>(const GdnInputs<float>&, const float*, const float*, const DeltaDims&,
                                       const GdnGrads<float>&);
template void gdn_recurrent_bwd<double>(const GdnInputs<double>&, const double*, const double*, const DeltaDims&,
                                        const GdnGrads<double>&);
template void gdn_chunk_fwd<float>(const GdnInputs<float>&, const DeltaDims&, float*, float*, int64_t);
template void gdn_chunk_fwd<double>(const GdnInputs<double>&, const DeltaDims&, double*, double*, int64_t);
template void gdn_chunk_bwd<float>(const GdnInputs<float>&, const float*, const float*, const DeltaDims&,
                                   const GdnGrads<float>&, int64_t);
template void gdn_chunk_bwd<double>(const GdnInputs<double>&, const double*, const double*, const DeltaDims&,
                                    const GdnGrads<double>&, int64_t);

}  // namespace llmt::cpu
