// Rotary position embedding, GPT-NeoX "rotate-half" convention over the full head dim
// (layers-ssm-attn.md section 3.3): with x0 = x[:Dh/2], x1 = x[Dh/2:],
// x0' = x0 cos(phi) - x1 sin(phi), x1' = x0 sin(phi) + x1 cos(phi),
// phi[pos, i] = pos * theta^(-2i/Dh), positions 0..seq_len-1 restarting for every row.
#pragma once
#include <cstdint>

namespace llmt::cpu {

/// In place on x: [batch, seq_len, heads, head_dim] (head_dim even). Angles in double.
template <typename T>
void rope_fwd(T* x, int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim, double theta);

/// rope_fwd at absolute positions position0 .. position0 + seq_len - 1 (decode: the position of the new
/// token in its sequence, seq_len 1).
template <typename T>
void rope_fwd_at(T* x, int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim, double theta,
                 int64_t position0);

/// Backward of rope_fwd, in place on dx (the transpose rotation: sin -> -sin).
template <typename T>
void rope_bwd(T* dx, int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim, double theta);

}  // namespace llmt::cpu
