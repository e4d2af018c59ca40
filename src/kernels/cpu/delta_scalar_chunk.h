// The chunked (WY / UT) algorithm of the scalar-decay delta rules, GDN and Comba, for one (batch, head)
// (layers-delta.md §6.1 F1–F7, §6.2, §6.5 B1–B9). GDN is the case without p: its A and W use k_r and the
// inclusive Γ_r where Comba's use p_r and the exclusive γ^ex_r (§6.2 F1', F3'); everything else is shared.
// Internal to src/kernels/cpu.
#pragma once
#include <cstdint>

#include "kernels/cpu/delta_common.h"

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

}  // namespace llmt::cpu::delta
