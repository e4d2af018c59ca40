// Causal multi-head softmax attention in bf16 on the tensor cores (mma.sync m16n8k16, fp32
// accumulation), forward and deterministic backward. Semantics: layers-ssm-attn.md section 3.3
// and the CPU reference src/kernels/cpu/attention.h; algorithm: FlashAttention-2 (Dao 2023),
// Algorithm 1 (forward) and Algorithm 2 (backward, split into a dK/dV and a dQ kernel so that
// no floating-point atomics are needed).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace llmt::cuda {

/// Forward: o[b,t,h,:] = sum_{s<=t} softmax_s(scale * q[b,t,h,:].k[b,s,h,:]) v[b,s,h,:].
/// q, k, v, o: bf16 [batch, seq_len, heads, head_dim] contiguous, 16-byte aligned device pointers.
/// lse: fp32 [batch, heads, seq_len], the natural-log log-sum-exp of the scaled, causally masked
/// scores of each query row (the statistic the backward recomputes the probabilities from).
/// head_dim must be 64 or 128; any seq_len >= 0 (partial tiles are handled); batch * heads <= 65535;
/// scale > 0.
/// Throws llmt::Error on an unsupported shape, a misaligned pointer or a failed launch.
void flash_attention_fwd(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, int64_t batch,
                         int64_t seq_len, int64_t heads, int64_t head_dim, float scale, __nv_bfloat16* o, float* lse,
                         cudaStream_t stream);

/// Bytes of device scratch flash_attention_bwd needs: two fp32 [batch, heads, seq_len] arrays
/// (Delta = rowsum(dO o O) and lse * log2(e)).
size_t flash_attention_bwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim);

/// Backward of flash_attention_fwd: overwrites dq, dk, dv (bf16, same shape as q) from q, k, v,
/// the forward's o and lse, and dout = dL/do (bf16, same shape as q). `scratch` must hold
/// flash_attention_bwd_scratch_bytes(...) bytes, 4-byte aligned. All sums run in a fixed order
/// (no atomics), so the results are bit-identical from run to run.
/// Throws llmt::Error on an unsupported shape, a misaligned pointer or a failed launch.
void flash_attention_bwd(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                         const __nv_bfloat16* o, const float* lse, const __nv_bfloat16* dout, int64_t batch,
                         int64_t seq_len, int64_t heads, int64_t head_dim, float scale, __nv_bfloat16* dq,
                         __nv_bfloat16* dk, __nv_bfloat16* dv, void* scratch, cudaStream_t stream);

}  // namespace llmt::cuda
