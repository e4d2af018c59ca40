// The chunked (WY / UT) algorithm of the scalar-decay delta rules, GDN and Comba, for one (batch, head)
// (layers-delta.md §6.1 F1–F7, §6.2, §6.5 B1–B9). GDN is the case without p: its A and W use k_r and the
// inclusive Γ_r where Comba's use p_r and the exclusive γ^ex_r (§6.2 F1', F3'); everything else is shared.
// Internal to src/kernels/cpu.
#pragma once
#include <cstdint>

#include "kernels/cpu/delta_common.h"
#include "kernels/cpu/delta_scan.h"

namespace llmt::cpu::delta {

/// One (batch, head) slice: q, k [T, K], v [T, V], p [T, K] (Comba; empty for GDN), g, beta [T] (g the
/// per-token log-decay, not a cumsum), s0 [K, V] (zeros when absent).
struct ScalarHead {
  Vec q, k, v, p, g, beta, s0;
  bool comba() const { return !p.empty(); }
};

/// Per-head gradients, same shapes as ScalarHead (dp empty for GDN).
struct ScalarGrads {
  Vec dq, dk, dv, dp, dg, dbeta, ds0;
};

/// Chunked forward of one head (§6.1 / §6.2, kernel order of §6.3), chunks of chunk_size >= 1 tokens:
/// writes o into out [T, V] (zero on entry) and carries S [K, V] from S_0 (on entry) to S_T (on return).
void scalar_chunk_fwd(const ScalarHead& hd, int64_t K, int64_t V, int64_t chunk_size, Vec& out, Vec& S);

/// Chunked backward of one head (§6.5; Comba changes of §6.2): dO [T, V] is dL/do; g.ds0 holds dL/dS_T on
/// entry and dL/dS_0 on return; g.dq, g.dk, g.dp (Comba) must be zero on entry; all rows of g are written.
void scalar_chunk_bwd(const ScalarHead& hd, const Vec& dO, int64_t K, int64_t V, int64_t chunk_size,
                      ScalarGrads& g);

/// Zeroed gradients of head (b, h) (dp only for Comba), with ds0 = dL/dS_T from d_final_state
/// [B, H, K, V] (zeros when null).
template <typename T>
ScalarGrads zero_grads(bool comba, const T* d_final_state, const DeltaDims& d, int64_t b, int64_t h) {
  const int64_t L = d.seq_len, K = d.key_dim, V = d.value_dim;
  return {Vec(L * K, 0.0), Vec(L * K, 0.0), Vec(L * V, 0.0), comba ? Vec(L * K, 0.0) : Vec(), Vec(L, 0.0),
          Vec(L, 0.0),     load_state(d_final_state, d, b, h)};
}

/// The chunked forward of a GDN / Comba call: for every head, load(b, h) -> ScalarHead, then
/// scalar_chunk_fwd; writes o [B, T, H, V] and final_state [B, H, K, V] (when non-null). kernel names the
/// caller in the chunk_size error.
template <typename T, class Load>
void scalar_chunk_fwd_all(const char* kernel, const DeltaDims& d, Load load, T* o, T* final_state,
                          int64_t chunk_size) {
  check_chunk_size(kernel, chunk_size);
  for_each_head(d, [&](int64_t b, int64_t h) {
    const ScalarHead hd = load(b, h);
    Vec S = hd.s0, out(d.seq_len * d.value_dim, 0.0);
    scalar_chunk_fwd(hd, d.key_dim, d.value_dim, chunk_size, out, S);
    scatter(out, d, b, h, d.value_dim, o);
    store_state(S, d, b, h, final_state);
  });
}

/// The chunked backward of a GDN / Comba call: for every head, load(b, h) -> ScalarHead, scalar_chunk_bwd
/// with d_o [B, T, H, V] and d_final_state [B, H, K, V] (or null), then store(g, b, h) writes the gradients.
template <typename T, class Load, class Store>
void scalar_chunk_bwd_all(const char* kernel, const DeltaDims& d, Load load, const T* d_o, const T* d_final_state,
                          Store store, int64_t chunk_size) {
  check_chunk_size(kernel, chunk_size);
  for_each_head(d, [&](int64_t b, int64_t h) {
    const ScalarHead hd = load(b, h);
    ScalarGrads g = zero_grads(hd.comba(), d_final_state, d, b, h);
    scalar_chunk_bwd(hd, gather(d_o, d, b, h, d.value_dim), d.key_dim, d.value_dim, chunk_size, g);
    store(g, b, h);
  });
}

}  // namespace llmt::cpu::delta
