// SwiGLU activation (layers-ssm-attn.md section 1.3): h = silu(gate) * up, silu(a) = a sigmoid(a).
#pragma once
#include <cstdint>

namespace llmt::cpu {

/// gate, up, h: [n] (any shape flattened). Writes h.
template <typename T>
void swiglu_fwd(const T* gate, const T* up, int64_t n, T* h);

/// Given dh, overwrites dgate and dup.
template <typename T>
void swiglu_bwd(const T* gate, const T* up, const T* dh, int64_t n, T* dgate, T* dup);

}  // namespace llmt::cpu
