// Causal multi-head softmax attention (layers-ssm-attn.md section 3.3), CPU reference.
// q, k, v, o: [batch, seq_len, heads, head_dim] (the layout the projections produce).
// lse: [batch, heads, seq_len], the per-row log-sum-exp of the scaled, masked scores.
#pragma once
#include <cstdint>

namespace llmt::cpu {

/// o[b,t,h,:] = sum_{s<=t} softmax_s(scale * q[b,t,h,:].k[b,s,h,:]) v[b,s,h,:]; writes o and lse.
/// Softmax statistics in double for any T.
template <typename T>
void attention_fwd(const T* q, const T* k, const T* v, int64_t batch, int64_t seq_len, int64_t heads,
                   int64_t head_dim, double scale, T* o, T* lse);

/// Flash-attention-style backward (section 3.3): P recomputed from lse,
/// dV = P^T dO, dP = dO V^T, Delta = rowsum(dO o O), dS = P o (dP - Delta),
/// dQ = scale dS K, dK = scale dS^T Q. Overwrites dq, dk, dv (same shapes as q, k, v).
template <typename T>
void attention_bwd(const T* q, const T* k, const T* v, const T* o, const T* lse, const T* dout, int64_t batch,
                   int64_t seq_len, int64_t heads, int64_t head_dim, double scale, T* dq, T* dk, T* dv);

/// attention_fwd continuing a sequence through a KV cache (decoding: seq_len 1; a prompt: its length): the new
/// tokens' k, v [batch, seq_len, heads, head_dim] are written into the caches k_cache, v_cache
/// [batch, capacity, heads, head_dim] at positions position .. position + seq_len - 1 (< capacity), then
/// o[b,t,h,:] = Σ_{s<=position+t} softmax_s(scale q[b,t,h,:].k_cache[b,s,h,:]) v_cache[b,s,h,:] with q, o
/// [batch, seq_len, heads, head_dim]. q and k carry their rotary embedding already. Softmax statistics in double.
template <typename T>
void attention_decode(const T* q, const T* k, const T* v, int64_t batch, int64_t seq_len, int64_t heads,
                      int64_t head_dim, int64_t capacity, int64_t position, double scale, T* k_cache, T* v_cache,
                      T* o);

}  // namespace llmt::cpu
