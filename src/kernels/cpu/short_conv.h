// ShortConvolution + SiLU (layers-delta.md section 2.1; layers-ssm-attn.md section 1.4): depthwise causal
// 1-D convolution over time, an optional per-channel bias (Mamba2's conv1d; the delta-rule layers have
// none), zero history before the first token of each batch row, then y = silu(pre).
#pragma once
#include <cstdint>

namespace llmt::cpu {

/// x, pre, y: [batch, seq_len, channels]; w: [channels, width] (tap width-1 multiplies the current
/// token, tap i the token width-1-i steps back); bias: [channels] added to pre, or nullptr for none.
/// Writes pre (the convolution, saved for backward) and y = silu(pre). Arithmetic in double for any T.
/// Throws llmt::Error unless width >= 1.
template <typename T>
void short_conv_silu_fwd(const T* x, const T* w, int64_t batch, int64_t seq_len, int64_t channels, int64_t width,
                         T* pre, T* y, const T* bias = nullptr);

/// Backward of short_conv_silu_fwd given its saved pre. dy, x, pre, dx: [batch, seq_len, channels];
/// w, dw: [channels, width]; dbias: [channels] or nullptr (no bias). dx is OVERWRITTEN; dw += d/dw and
/// dbias += d/dbias = Σ_{b,t} dpre (ACCUMULATE).
template <typename T>
void short_conv_silu_bwd(const T* dy, const T* x, const T* w, const T* pre, int64_t batch, int64_t seq_len,
                         int64_t channels, int64_t width, T* dx, T* dw, T* dbias = nullptr);

/// short_conv_silu_fwd continuing a sequence (decoding: seq_len 1; a prompt: its length): x, y
/// [batch, seq_len, channels], the new tokens and y = silu(pre) of them; window [batch, width - 1, channels], the
/// width - 1 inputs before x, oldest first (zeros at the start of a sequence), replaced by the last width - 1
/// inputs of [window; x]. w and bias as in short_conv_silu_fwd. Arithmetic in double. Throws llmt::Error
/// unless width >= 1.
template <typename T>
void short_conv_silu_step(const T* x, const T* w, int64_t batch, int64_t seq_len, int64_t channels, int64_t width,
                          T* window, T* y, const T* bias = nullptr);

}  // namespace llmt::cpu
