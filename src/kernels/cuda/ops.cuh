// CUDA launchers of the ops, one .cu file per family, mirroring src/kernels/cpu/*.h: the
// same shapes, layouts and accumulate-vs-overwrite semantics (those headers are the spec).
// All pointers are device pointers; every launcher enqueues on `stream` and returns without
// synchronising. Reductions accumulate in fp32 or wider. Every kernel is deterministic: the
// same inputs give bit-identical outputs on every run (no floating-point atomics), so a
// resumed GPU run reproduces the uninterrupted one.
// Activations are float or __nv_bfloat16 where a launcher is a template (explicitly
// instantiated for both in its .cu file); arithmetic is fp32 or wider either way.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cpu/mamba3_prep.h"
#include "kernels/mamba3_options.h"
#include "kernels/mdn_gate_options.h"

namespace llmt::cuda {

// elementwise.cu
void add(const float* a, const float* b, int64_t n, float* out, cudaStream_t stream);
/// dst = src rounded to D (float <-> bf16, round to nearest even).
template <typename S, typename D>
void convert(const S* src, int64_t n, D* dst, cudaStream_t stream);
template <typename T>
void swiglu_fwd(const T* gate, const T* up, int64_t n, T* h, cudaStream_t stream);
template <typename T>
void swiglu_bwd(const T* gate, const T* up, const T* dh, int64_t n, T* dgate, T* dup, cudaStream_t stream);

// reduce.cu: sum of squares / sum into *result_device (one double), deterministic two-pass.
void sum_squares(const float* x, int64_t n, double* result_device, cudaStream_t stream);
void sum(const float* x, int64_t n, double* result_device, cudaStream_t stream);

// embedding.cu
void embedding_fwd(const int32_t* ids, int64_t n, const float* table, int64_t vocab, int64_t dim, float* out,
                   cudaStream_t stream);
/// dtable[ids[i]] += dout[i] in a fixed order per row (no atomics). `scratch` must hold
/// embedding_bwd_scratch_bytes(n) bytes.
void embedding_bwd(const int32_t* ids, int64_t n, const float* dout, int64_t dim, float* dtable, void* scratch,
                   cudaStream_t stream);
size_t embedding_bwd_scratch_bytes(int64_t n);

// rmsnorm.cu. rmsnorm_bwd needs scratch of rmsnorm_bwd_scratch_bytes(rows, dim) bytes for
// the per-block partial sums of dw (reduced in a fixed order). The output y is float or bf16.
template <typename Ty>
void rmsnorm_fwd(const float* x, const float* w, int64_t rows, int64_t dim, double eps, Ty* y, float* rstd,
                 cudaStream_t stream);
// add_rmsnorm_fwd: h = x + branch, then rmsnorm_fwd of h (semantics: cpu::add_rmsnorm_fwd); x, branch, h f32.
template <typename Ty>
void add_rmsnorm_fwd(const float* x, const float* branch, const float* w, int64_t rows, int64_t dim, double eps,
                     float* h, Ty* y, float* rstd, cudaStream_t stream);
void rmsnorm_bwd(const float* dy, const float* x, const float* w, const float* rstd, int64_t rows, int64_t dim,
                 float* dx, float* dw, void* scratch, cudaStream_t stream);
size_t rmsnorm_bwd_scratch_bytes(int64_t rows, int64_t dim);

// rope.cu (in place; backward = transpose rotation)
template <typename T>
void rope_fwd(T* x, int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim, double theta,
              cudaStream_t stream);
template <typename T>
void rope_bwd(T* dx, int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim, double theta,
              cudaStream_t stream);

// attention.cu: flash-attention-style, never materialising [T, T] scores in device memory.
void attention_fwd(const float* q, const float* k, const float* v, int64_t batch, int64_t seq_len, int64_t heads,
                   int64_t head_dim, double scale, float* o, float* lse, cudaStream_t stream);
/// Overwrites dq, dk, dv. `scratch` must hold attention_bwd_scratch_bytes(...) bytes.
void attention_bwd(const float* q, const float* k, const float* v, const float* o, const float* lse,
                   const float* dout, int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim, double scale,
                   float* dq, float* dk, float* dv, void* scratch, cudaStream_t stream);
size_t attention_bwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim);

// cross_entropy.cu: losses (fp32) and, in place over the float or bf16 logits,
// grad_scale * (softmax - onehot). Negative targets: loss 0, gradient 0. correct: nullptr, or
// [rows] fp32 receiving 1 where the target's logit is larger than every other logit of the row (a tie is
// wrong), else 0. Row r of logits starts at logits + r * ld (ld >= vocab; rows aligned to sizeof(T), read and
// written in 16-byte pieces where aligned). A target >= vocab gives a NaN loss and gradient row.
template <typename T>
void cross_entropy(T* logits, const int32_t* targets, int64_t rows, int64_t vocab, int64_t ld, double grad_scale,
                   float* losses, float* correct, cudaStream_t stream);

// adamw.cu (semantics: src/kernels/cpu/adamw.h). working: nullptr, or n bf16 values that
// receive the updated params rounded to bf16 (the working copy of mixed precision).
void adamw_step(float* params, const float* grads, float* m, float* v, int64_t n, double lr, double beta1,
                double beta2, double eps, double weight_decay, double grad_scale, int64_t step,
                __nv_bfloat16* working, cudaStream_t stream);

// delta_blocks.cu (semantics: src/kernels/cpu/{short_conv,l2norm,gated_rmsnorm,delta_gates,comba_gates}.h).
// Overwritten: pre, y, out, dx, rinv, rstd, d_o, dy, dz, g, beta, da, db, q_out, p. Accumulated (fixed-order
// reductions, no atomics): dw, dbias, dA_log, ddt_bias, and the Comba gates' dk, ddecay, dD. The
// *_scratch_bytes functions size `scratch`.
/// The widest short convolution the CUDA kernels take (their taps and windows live in registers).
constexpr int64_t kConvMaxWidth = 8;
/// Short conv + SiLU: x, pre, y, dy, dx [batch, seq_len, channels]; w, dw [channels, width]; bias, dbias
/// [channels] or nullptr (the delta-rule layers' conv has no bias, Mamba2's has, layers-ssm-attn.md §1.4).
/// y is float or __nv_bfloat16 (the fp32 result rounded: the bf16 v a GDN / Comba core takes); dx is float or
/// __nv_bfloat16 (rounded from the fp32 result: what a bf16 matrix product reads); dy is float or __nv_bfloat16
/// (read as fp32: Mamba2's dxbc from its SSD with bf16 inputs).
/// Throws llmt::Error unless 1 <= width <= kConvMaxWidth.
template <typename TY>
void short_conv_silu_fwd(const float* x, const float* w, const float* bias, int64_t batch, int64_t seq_len,
                         int64_t channels, int64_t width, float* pre, TY* y, cudaStream_t stream);
template <typename TD, typename TX>
void short_conv_silu_bwd(const TD* dy, const float* x, const float* w, const float* pre, int64_t batch,
                         int64_t seq_len, int64_t channels, int64_t width, TX* dx, float* dw, float* dbias,
                         void* scratch, cudaStream_t stream);
size_t short_conv_silu_bwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t channels, int64_t width);
/// L2 norm: x, y, dy, dx [rows, dim]; rinv [rows]. y is float or __nv_bfloat16 (the fp32 result rounded: the bf16
/// q̂, k̂, p̂ a GDN / Comba core takes); the backward reads the forward's input x (x̃ = x rinv), not y.
template <typename TY>
void l2norm_fwd(const float* x, int64_t rows, int64_t dim, double eps, double scale, TY* y, float* rinv,
                cudaStream_t stream);
void l2norm_bwd(const float* dy, const float* x, const float* rinv, int64_t rows, int64_t dim, double scale,
                float* dx, cudaStream_t stream);
/// Gated RMSNorm: o, z, y, dy, d_o, dz [rows, dim]; w, dw [dim]; rstd [rows]. y and dz are float or
/// __nv_bfloat16 (rounded from the fp32 result). Throws llmt::Error when dim passes the backward's shared memory
/// (8 dim floats in 227 KiB).
template <typename TY>
void gated_rmsnorm_fwd(const float* o, const float* z, const float* w, int64_t rows, int64_t dim, double eps,
                       bool sigmoid_gate, TY* y, float* rstd, cudaStream_t stream);
template <typename TZ>
void gated_rmsnorm_bwd(const float* dy, const float* o, const float* z, const float* w, const float* rstd,
                       int64_t rows, int64_t dim, bool sigmoid_gate, float* d_o, TZ* dz, float* dw, void* scratch,
                       cudaStream_t stream);
size_t gated_rmsnorm_bwd_scratch_bytes(int64_t rows, int64_t dim);
/// Mamba2's gated RMSNorm with the gate first (cpu::gate_rmsnorm_*, layers-ssm-attn.md §1.2): u = y silu(z),
/// out = u rstd ∘ w. y, z, out, dout, dy, dz [rows, dim]; w, dw [dim]; rstd [rows]. out, dy and dz are float or
/// __nv_bfloat16 (rounded from the fp32 result); y is float or __nv_bfloat16 (TI, read as fp32: the SSD's output with
/// bf16 inputs); the backward recomputes u from y, z. Scratch and dim limit as gated_rmsnorm_bwd's
/// (gated_rmsnorm_bwd_scratch_bytes).
template <typename TI, typename TY>
void gate_rmsnorm_fwd(const TI* y, const float* z, const float* w, int64_t rows, int64_t dim, double eps, TY* out,
                      float* rstd, cudaStream_t stream);
template <typename TI, typename TD, typename TZ>
void gate_rmsnorm_bwd(const float* dout, const TI* y, const float* z, const float* w, const float* rstd,
                      int64_t rows, int64_t dim, TD* dy, TZ* dz, float* dw, void* scratch, cudaStream_t stream);
/// Decay gates (gdn_gates_*: dim 1; kda_gates_*: dim d_k): a, g, da [rows, heads * dim]; b, beta, db
/// [rows, heads]; A_log, dA_log [heads]; dt_bias, ddt_bias [heads * dim]. The backward needs `scratch` of
/// decay_gates_bwd_scratch_bytes (per-channel partial sums of dA_log and ddt_bias over blocks of 64 rows).
void decay_gates_fwd(const float* a, const float* b, const float* A_log, const float* dt_bias, int64_t rows,
                     int64_t heads, int64_t dim, float* g, float* beta, cudaStream_t stream);
void decay_gates_bwd(const float* dg, const float* dbeta, const float* a, const float* b, const float* A_log,
                     const float* dt_bias, int64_t rows, int64_t heads, int64_t dim, float* da, float* db,
                     float* dA_log, float* ddt_bias, void* scratch, cudaStream_t stream);
size_t decay_gates_bwd_scratch_bytes(int64_t rows, int64_t heads, int64_t dim);
/// Comba gates: q, k, q_out, p, dq_out, dp, dk [rows, heads * dim]; decay, D, ddecay, dD [heads] or nullptr
/// (inner decay / output correction off; ddecay / dD are only touched when decay / D are given).
void comba_gates_fwd(const float* q, const float* k, const float* decay, const float* D, int64_t rows,
                     int64_t heads, int64_t dim, float* q_out, float* p, cudaStream_t stream);
void comba_gates_bwd(const float* dq_out, const float* dp, const float* k, const float* decay, const float* D,
                     int64_t rows, int64_t heads, int64_t dim, float* dk, float* ddecay, float* dD, void* scratch,
                     cudaStream_t stream);
size_t comba_gates_bwd_scratch_bytes(int64_t rows, int64_t heads);

// gdn_comba.cu: the chunked GDN core (semantics: src/kernels/cpu/gdn.h, zero initial state), fp32 tensors,
// chunk-parallel (64 x 64 tiles; chunk_size <= 64 tokens per tile). P is the type the tile products read their
// operands as, from the layer's compute dtype (gdn_comba.cu "Precision"; instantiated for both):
//   float          exact fp32 products on the CUDA cores, fp32 scratch (fp32 models; ~1e-6 of the CPU result);
//   __nv_bfloat16  the tensor cores with bf16 operands and fp32 accumulation, bf16 scratch W, U, h, dh, dW
//                  (bf16 models; ~1e-2 of the fp32 result): mma.sync on bf16 tiles in shared memory (tile::Mma),
//                  except a scan whose shared memory would not fit (key_dim > 256, forward and backward),
//                  which runs on tile::Tc (WMMA on fp32 tiles). Its backward refuses key_dim > 448 (shared memory).
// q, k [B, T, H, K]; v, o, d_o, dv [B, T, H, V]; g, beta, dg, dbeta [B, T, H]; gradients overwritten. E, the
// element type of q, k, v (and Comba's p): float, or __nv_bfloat16 with P = __nv_bfloat16 only (FLA's inputs: the
// bf16 operand tiles then hold the inputs' own values; instantiated for <P, E> = <float, float>, <__nv_bfloat16,
// float>, <__nv_bfloat16, __nv_bfloat16>); every other tensor fp32. 1 <= chunk_size <= kGdnMaxChunk. saved:
// nullptr, or gdn_saved_floats<P>(…, states) of memory kept from a forward to the backward of the same inputs,
// chunk_size, P and states (layers-delta.md §6.3, the tensors saved for the backward): the forward writes there the
// fp32 𝒯 = (I + A)^{-1} of every chunk ([B H, chunks, 64, 64]) and with `states` its scan's states h ([B H, chunks,
// K, V]) and Δ = v_new ([B H, chunks x chunk_size, V]) and its W ([B H, chunks x chunk_size, K]; Comba: from p̂),
// h, Δ and W in P (FLA's h, v_new and w); the backward given it without `states` forms W and U from 𝒯 instead of
// forming A and inverting it, and runs the forward scan again (FLA's design), and with `states` reads W, h and Δ
// and runs neither (gradients bit-identical in all three cases). `states` is ignored without saved. `scratch` must
// hold gdn_chunk_fwd_scratch_bytes<P>, gdn_chunk_bwd_scratch_bytes<P> with saved = (saved != nullptr) and the same
// states (the scratch holds W, h and Δ unless saved with states, the backward's also 𝒯 without saved).
constexpr int64_t kGdnMaxChunk = 64;
template <typename P, typename E>
void gdn_chunk_fwd(const E* q, const E* k, const E* v, const float* g, const float* beta, int64_t batch,
                   int64_t seq_len, int64_t heads, int64_t key_dim, int64_t value_dim, int64_t chunk_size, float* o,
                   float* saved, bool states, void* scratch, cudaStream_t stream);
template <typename P>
size_t gdn_chunk_fwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim,
                                   int64_t value_dim, int64_t chunk_size, bool saved, bool states);
template <typename P, typename E>
void gdn_chunk_bwd(const E* q, const E* k, const E* v, const float* g, const float* beta,
                   const float* d_o, const float* saved, bool states, int64_t batch, int64_t seq_len,
                   int64_t heads, int64_t key_dim, int64_t value_dim, int64_t chunk_size, float* dq, float* dk,
                   float* dv, float* dg, float* dbeta, void* scratch, cudaStream_t stream);
template <typename P>
size_t gdn_chunk_bwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim,
                                   int64_t value_dim, int64_t chunk_size, bool saved, bool states);
/// Floats of the GDN and Comba cores' `saved` for operand type P: with NC = ceil(T / chunk_size), B H NC 64² fp32 𝒯,
/// and with `states` + B H NC K V h + B H NC chunk_size V Δ + B H NC chunk_size K W, h, Δ and W in P (bf16: two a
/// float), each region rounded up to whole 16 bytes. Per chunk and (batch, head) at K = V = 128, chunk_size 64:
/// 16 KiB 𝒯 (+ 32 KiB h + 16 KiB Δ + 16 KiB W with states; bf16, fp32: + 64 + 32 + 32 KiB). Throws llmt::Error for
/// a chunk_size outside [1, kGdnMaxChunk].
template <typename P>
int64_t gdn_saved_floats(int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim, int64_t value_dim,
                         int64_t chunk_size, bool states);

// gdn_comba.cu: the chunked Comba core (semantics: src/kernels/cpu/comba.h, zero initial state), the GDN
// kernels with Comba's A and W (layers-delta.md §6.2), same P, precision and limits.
// q, k, p, dq, dk, dp [B, T, H, K]; v, o, d_o, dv [B, T, H, V]; g, beta, dg, dbeta [B, T, H]; gradients
// overwritten. 1 <= chunk_size <= kCombaMaxChunk. E (q, k, v, p), saved (nullptr, or gdn_saved_floats<P>), states
// and `scratch` as for the GDN core (comba_chunk_{fwd,bwd}_scratch_bytes<P>).
constexpr int64_t kCombaMaxChunk = 64;
template <typename P, typename E>
void comba_chunk_fwd(const E* q, const E* k, const E* v, const E* p, const float* g,
                     const float* beta, int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim,
                     int64_t value_dim, int64_t chunk_size, float* o, float* saved, bool states, void* scratch,
                     cudaStream_t stream);
template <typename P>
size_t comba_chunk_fwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim,
                                     int64_t value_dim, int64_t chunk_size, bool saved, bool states);
template <typename P, typename E>
void comba_chunk_bwd(const E* q, const E* k, const E* v, const E* p, const float* g,
                     const float* beta, const float* d_o, const float* saved, bool states, int64_t batch,
                     int64_t seq_len, int64_t heads, int64_t key_dim, int64_t value_dim, int64_t chunk_size,
                     float* dq, float* dk, float* dv, float* dp, float* dg, float* dbeta, void* scratch,
                     cudaStream_t stream);
template <typename P>
size_t comba_chunk_bwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim,
                                     int64_t value_dim, int64_t chunk_size, bool saved, bool states);

// kda.cu: the chunked KDA core (semantics: src/kernels/cpu/kda.h, zero initial state), fp32 tensors,
// chunk-parallel (the phases of gdn_comba.cu, chunk_size <= 64 tokens per tile). P is the type the scan /
// output products read their operands as, from the layer's compute dtype (kda.cu "Precision"; both instantiated):
//   float          exact fp32 products on the CUDA cores (fp32 models; ~1e-6 of the CPU result);
//   __nv_bfloat16  the forward's tile products (A and P off their diagonal sub-blocks, W, U, the scan, the
//                  output), dΔ = P^T dO and the backward scan on the tensor cores (bf16 operands, fp32
//                  accumulation; bf16 models, ~1e-2 of the fp32 result); the diagonal sub-blocks and the
//                  backward's dqk / wy phases stay fp32. The scratch is fp32 either way.
// q, k, g, dq, dk, dg [B, T, H, K] (g: per-channel log-decay); v, o, d_o, dv [B, T, H, V]; beta, dbeta [B, T, H];
// gradients overwritten. 1 <= chunk_size <= kKdaMaxChunk. saved: nullptr, or kda_saved_floats(…, states) of memory
// kept from a forward to the backward of the same inputs, chunk_size, P and states (layers-delta.md §6.3, the tensors
// saved for the backward): the forward writes there the fp32 P and 𝒯 = (I + A)^{-1} of every chunk (each [B H,
// chunks, 64, 64]) and with `states` Δ (v_new, [B H, chunks x chunk_size, V]) and the states entering the chunks h
// ([B H, chunks, K, V]), in that order, each region 16-byte aligned; the backward given it forms only W, Q^g, K^g,
// e^{Γ_C} (without `states` also U; 𝒯 from there) instead of forming A and P and inverting A, and with `states`
// reads h and Δ instead of running the forward scan again (without: FLA's design, the scan recomputes them;
// gradients bit-identical in all three cases). `states` is ignored without saved. `scratch` must hold
// kda_chunk_{fwd,bwd}_scratch_bytes with saved = (saved != nullptr) and the same states (the scratch holds P
// without saved, h and Δ unless saved with states, the backward's also 𝒯 without saved).
constexpr int64_t kKdaMaxChunk = 64;
template <typename P>
void kda_chunk_fwd(const float* q, const float* k, const float* v, const float* g, const float* beta, int64_t batch,
                   int64_t seq_len, int64_t heads, int64_t key_dim, int64_t value_dim, int64_t chunk_size, float* o,
                   float* saved, bool states, void* scratch, cudaStream_t stream);
size_t kda_chunk_fwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim,
                                   int64_t value_dim, int64_t chunk_size, bool saved, bool states);
template <typename P>
void kda_chunk_bwd(const float* q, const float* k, const float* v, const float* g, const float* beta,
                   const float* d_o, const float* saved, bool states, int64_t batch, int64_t seq_len, int64_t heads,
                   int64_t key_dim, int64_t value_dim, int64_t chunk_size, float* dq, float* dk, float* dv, float* dg,
                   float* dbeta, void* scratch, cudaStream_t stream);
size_t kda_chunk_bwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim,
                                   int64_t value_dim, int64_t chunk_size, bool saved, bool states);
/// Floats of the KDA core's `saved` (all fp32, whichever P): per (batch, head) and chunk 2 x 64² (P and 𝒯, 32 KiB),
/// and with `states` chunk_size x value_dim (Δ) and key_dim x value_dim (h), each region rounded up to a multiple of
/// 4 floats. Throws llmt::Error for a chunk_size outside [1, kKdaMaxChunk].
int64_t kda_saved_floats(int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim, int64_t value_dim,
                         int64_t chunk_size, bool states);

// mamba2.cu: Mamba2's SSD step (semantics: src/kernels/cpu/mamba2.h mamba2_ssd_fwd/bwd, zero initial
// state; layers-ssm-attn.md §2.5, §2.6), fp32 tensors (xbc, dy, y, dxbc: E below). P is the type the tile products read
// their operands as, from the layer's compute dtype (mamba2.cu "Precision"; instantiated for both):
//   float          exact fp32 products on the CUDA cores, fp32 stored states (fp32 models; ~1e-6 of the CPU);
//   __nv_bfloat16  the tensor cores (tile::Mma) with bf16 operands and fp32 accumulation, bf16 stored states and
//                  state adjoints (bf16 models; ~1e-2 of the fp32 result).
// xbc, dxbc [B, T, H P + 2 G N] (rows [x | B | C]); dt_raw, ddt_raw [B, T, H]; dt_bias, A_log, D, ddt_bias,
// dA_log, dD [H]; y, dy [B, T, H P]. Overwritten: y, dxbc, ddt_raw; accumulated (fixed-order sums, no
// atomics): ddt_bias, dA_log, dD. The kernels chunk the sequence into 64 tokens whatever the layer's
// chunk_size (the result does not depend on it beyond rounding). G must divide H. `scratch` must hold
// mamba2_ssd_{fwd,bwd}_scratch_bytes<P>(..., saved != nullptr, scan_segments) (O(B H (T/64) P N) elements of P: the
// chunk states; without saved, the entering states among them; with segmented scans also fp32 segment end states).
// saved: nullptr, or mamba2_ssd_saved_bytes<P> of memory (16-byte aligned for the bf16 kernels' cp.async copies,
// else they load synchronously) kept from a mamba2_ssd_fwd to the mamba2_ssd_bwd of the same inputs: the forward
// writes the states entering each chunk [B, H, ceil(T / 64), P, N] (element type P) there instead of into its
// scratch, and the backward reads them instead of recomputing them (it scans only the state adjoints): the same
// kernels' values, so the gradients are bit-identical to the backward without saved.
// E: the element type of xbc and dy, and of the outputs y and dxbc: float, or __nv_bfloat16 with P = __nv_bfloat16
// only (the official kernels' inputs and outputs, FLA's bf16 o and dq / dk / dv; instantiated: <float, float>,
// <bf16, float>, <bf16, bf16>): the bf16 operand tiles are then copied as they are (cp.async where every row is
// 16-byte aligned) and the D skip reads the bf16 x, dy; y and dxbc are each rounded once from the fp32 values the
// kernels form (y and dx as column pairs of the tile accumulators, 16-byte pieces where the rows allow; dB, dC from
// the fp32 group sums), so they are the fp32 outputs of fp32 inputs holding the same values, rounded to bf16 once
// (every other output bit-identical to those). Every other tensor (dt_raw, the parameters, ddt_raw, the parameter
// gradients) fp32 either way.
// scan_segments (bf16 compute; ignored with fp32): how many segments of the sequence each chunk-state scan walks in
// parallel before a fix-up adds the states entering them (mamba2.cu Segments): 0 (the default) picks it from the
// SM count and the shape (more than 1 only where B H ceil(P / 64) ceil(N / 64) <= SMs and ceil(T / 64) >= 16);
// > 0 forces it (tests, benchmarks; at most ceil(T / 64)). It changes the stored states' rounding, not the math: pass
// the same value to the scratch sizes and to the forward and backward of one step (the saved set's states are then
// the recompute's bits).
template <typename P, typename E>
void mamba2_ssd_fwd(const E* xbc, const float* dt_raw, const float* dt_bias, const float* A_log, const float* D,
                    int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim, int64_t state_dim,
                    int64_t groups, E* y, void* saved, void* scratch, cudaStream_t stream, int scan_segments = 0);
template <typename P>
size_t mamba2_ssd_fwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim,
                                    int64_t state_dim, bool saved, int scan_segments = 0);
template <typename P, typename E>
void mamba2_ssd_bwd(const E* dy, const E* xbc, const float* dt_raw, const float* dt_bias, const float* A_log,
                    const float* D, int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim,
                    int64_t state_dim, int64_t groups, const void* saved, E* dxbc, float* ddt_raw,
                    float* ddt_bias, float* dA_log, float* dD, void* scratch, cudaStream_t stream,
                    int scan_segments = 0);
template <typename P>
size_t mamba2_ssd_bwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim,
                                    int64_t state_dim, bool saved, int scan_segments = 0);
/// Bytes of mamba2_ssd_fwd / mamba2_ssd_bwd's saved set: sizeof(P) B H ceil(T / 64) P N (bf16 at B = 4, T = 4096,
/// H = 16, P = N = 128: 128 MiB; fp32 twice that).
template <typename P>
size_t mamba2_ssd_saved_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim, int64_t state_dim);

// mamba3.cu, mamba3_prep.cu, mamba3_core.cu: the Mamba-3 layer op between in_proj and out_proj (semantics:
// src/kernels/cpu/mamba3_layer.h mamba3_layer_fwd/bwd; layers-ssm-attn.md §4.3–4.5), zero initial state, fp32
// state and products (Δ, the phases, the chunk-local cumsum and the parameter sums in double).
// x, z, out, dout, dx, dz [B, T, H P] of element type A (the activations); bc, dbc [B, T, 2 R G N]; raw, draw
// [B, T, 3 H + S] and the parameters fp32. A: float, or __nv_bfloat16 (the official kernels' activations; bf16
// models: Backend::mamba3_bf16_activations), instantiated for both: bf16 x, z, dout are read as their fp32 values
// (SISO's core copies the bf16 x rows into its operand tiles as they are), out, dx, dz rounded to bf16 once on their
// store from the same fp32 results, so that every other output is bit-identical to fp32 activations holding the same
// values. bf16 activations need opt.bf16_products in mamba3_fwd / mamba3_bwd (the fp32 core reads fp32 v only; throws
// llmt::Error naming the op otherwise); mamba3_decode takes either whatever the products. The parameters as
// Backend::Mamba3Params (mimo_* nullptr for R = 1, norm nullptr without opt.outproj_norm). The backward
// OVERWRITES dx, dz, dbc, draw and ACCUMULATES the parameter gradients (fixed-order sums, no atomics). The core
// is chunked in 64 / R tokens whatever opt.chunk_size. `scratch` must hold mamba3_{fwd,bwd}_scratch_bytes
// (O(B T H R (N + P)) floats for q, k, v, y and O(B H (T R / 64) P N) for the chunk states). Throws
// llmt::Error when R > 64, G does not divide H, 2 S > N, or the core's shared memory (about
// 4 (2 (N + 1) + 4 (P + 1) + 3 65) 64 bytes in the backward) exceeds the device's.
// saved (model.mamba3.save_states), nullptr or mamba3_saved_bytes of memory (64-byte aligned) kept from a
// mamba3_fwd to the mamba3_bwd of the same inputs: the forward writes its chunk-local cumsum G [B H nc 64/R]
// (double), the states entering each chunk [B H nc P N], the core output y [B T H R P], BCNorm's normalised B, C
// [B T R G N] and their reciprocal RMS [B T R G], the phases φ [B T H S] and the rotated q, k [B T H R N] (fp32;
// the states, y, q, k bf16 with opt.bf16_products: the core's operand types) there instead of into the scratch, and
// the backward reads them instead of recomputing them (it still recomputes the per-token scalars, θ and MIMO's v):
// the same kernels' values, so the gradients are bit-identical to the backward without `saved`. With saved the
// scratch is mamba3_{fwd,bwd}_scratch_bytes(..., true), smaller by the saved set's arrays.
struct Mamba3Ptrs {
  const float *dt_bias, *B_bias, *C_bias, *B_norm, *C_norm, *D, *mimo_x, *mimo_z, *mimo_o, *norm;
};
struct Mamba3GradPtrs {
  float *dt_bias, *B_bias, *C_bias, *B_norm, *C_norm, *D, *mimo_x, *mimo_z, *mimo_o, *norm;
};
/// The forward: out (A) overwritten from x, z (A), bc, raw (fp32).
template <typename A>
void mamba3_fwd(const A* x, const A* z, const float* bc, const float* raw, const Mamba3Ptrs& params,
                const cpu::Mamba3LayerDims& dims, const Mamba3Options& opt, A* out, float* saved, void* scratch,
                cudaStream_t stream);
size_t mamba3_fwd_scratch_bytes(const cpu::Mamba3LayerDims& dims, const Mamba3Options& opt, bool saved);
/// The backward: dx, dz (A), dbc, draw (fp32) overwritten from dout, x, z (A), bc, raw (fp32); the parameter
/// gradients (fp32) accumulated.
template <typename A>
void mamba3_bwd(const A* dout, const A* x, const A* z, const float* bc, const float* raw, const float* saved,
                const Mamba3Ptrs& params, const cpu::Mamba3LayerDims& dims, const Mamba3Options& opt, A* dx, A* dz,
                float* dbc, float* draw, const Mamba3GradPtrs& grads, void* scratch, cudaStream_t stream);
size_t mamba3_bwd_scratch_bytes(const cpu::Mamba3LayerDims& dims, const Mamba3Options& opt, bool saved);
/// Bytes of mamba3_fwd / mamba3_bwd's saved set for these sizes (S included) and opt.bf16_products: 8 B H nc Lc +
/// e B H nc P N + e B T H R P + 2 x 4 B T R G N + 2 x 4 B T R G + 4 B T H S + 2 x e B T H R N (each rounded up to
/// 256), e = 2 with bf16 products, else 4; Lc = 64 / R (at least 1), nc = ceil(T / Lc).
size_t mamba3_saved_bytes(const cpu::Mamba3LayerDims& dims, const Mamba3Options& opt);
/// The Mamba-3 carry between decode steps (Backend::Mamba3Carry): state [B, H, P, N], k_prev [B, H, R, N],
/// v_prev [B, H, R, P], phase [B, H, S] (nullptr when S = 0).
struct Mamba3CarryPtrs {
  float *state, *k_prev, *v_prev, *phase;
};
/// mamba3_fwd continuing `carry` by the recurrence of §4.6 (semantics: cpu::mamba3_layer_step; the prep from the
/// carried phases, the step kernel of mamba3_decode.cu token by token, the gate), the carry updated in place.
/// `scratch` must hold mamba3_fwd_scratch_bytes. Throws as mamba3_fwd, and when 2 R (N + P) floats exceed
/// 48 KiB of shared memory. x, z, out: A (fp32 or bf16, with or without opt.bf16_products); bc, raw and the carry
/// fp32 (a bf16 x is carried as its fp32 values).
template <typename A>
void mamba3_decode(const A* x, const A* z, const float* bc, const float* raw, const Mamba3Ptrs& params,
                   const cpu::Mamba3LayerDims& dims, const Mamba3Options& opt, const Mamba3CarryPtrs& carry, A* out,
                   void* scratch, cudaStream_t stream);

// mdn_gates.cu (semantics: src/kernels/cpu/mdn_gates.h, mdn.md §4.2, §4.4, §7.4), fp32 storage, arithmetic in
// double. z_*, log_alpha, beta, log_mu, eta, dz_* [rows, heads]; A_log, dt_bias, Mu_log, mu_bias, log_factor and
// their gradients [heads]. Without momentum (opt.momentum false) z_mu, z_eta, d_log_mu, d_eta, dz_mu, dz_eta,
// Mu_log, mu_bias and their gradients are nullptr; log_mu is -inf and eta 1. The backward OVERWRITES dz_* and
// ACCUMULATES the parameter gradients (fixed-order reductions, no atomics) and needs `scratch` of
// mdn_gates_bwd_scratch_bytes (per-(row range, head) partial sums).
void mdn_gates_fwd(const float* z_alpha, const float* z_beta, const float* z_mu, const float* z_eta,
                   const float* A_log, const float* dt_bias, const float* Mu_log, const float* mu_bias,
                   const float* log_factor, int64_t rows, int64_t heads, const MdnGateOptions& opt, float* log_alpha,
                   float* beta, float* log_mu, float* eta, cudaStream_t stream);
void mdn_gates_bwd(const float* d_log_alpha, const float* d_beta, const float* d_log_mu, const float* d_eta,
                   const float* z_alpha, const float* z_beta, const float* z_mu, const float* z_eta,
                   const float* A_log, const float* dt_bias, const float* Mu_log, const float* mu_bias,
                   const float* log_factor, int64_t rows, int64_t heads, const MdnGateOptions& opt, float* dz_alpha,
                   float* dz_beta, float* dz_mu, float* dz_eta, float* dA_log, float* ddt_bias, float* dMu_log,
                   float* dmu_bias, float* dlog_factor, void* scratch, cudaStream_t stream);
size_t mdn_gates_bwd_scratch_bytes(int64_t rows, int64_t heads);
/// Output correction: q, k, q_out, dq_out, dk [rows, heads * dim]; D_log, dD_log [heads]. q_out = q - e^{D_log} k;
/// backward dk += -e^{D_log} dq_out, dD_log += -e^{D_log} Σ dq_out ⊙ k (both ACCUMULATED, fixed order; `scratch` of
/// mdn_correction_bwd_scratch_bytes).
void mdn_correction_fwd(const float* q, const float* k, const float* D_log, int64_t rows, int64_t heads,
                        int64_t dim, float* q_out, cudaStream_t stream);
void mdn_correction_bwd(const float* dq_out, const float* k, const float* D_log, int64_t rows, int64_t heads,
                        int64_t dim, float* dk, float* dD_log, void* scratch, cudaStream_t stream);
size_t mdn_correction_bwd_scratch_bytes(int64_t rows, int64_t heads);

// mdn.cu: the chunked MDN core (semantics: src/kernels/cpu/mdn.h mdn_chunk_fwd / mdn_chunk_bwd, zero initial
// states), fp32 tensors. P is the type the tile products read their operands as, from the layer's compute dtype
// (mdn.cu "Precision"; instantiated for both): float: exact fp32 products on the CUDA cores (fp32 models; ~1e-6
// of the CPU result); __nv_bfloat16: the tensor cores (mma.sync) with bf16 operands and fp32 accumulation
// (bf16 models; ~1e-2 of the fp32 result). Same scratch, same shared-memory limits (below) for both. q, k, dq, dk [B, T, H, K] (k = k_n, the L2-normalised key; dk through both p = α k and
// k̂ = η k); v, o, d_o, dv [B, T, H, V]; log_alpha, beta, log_mu (-inf allowed), eta and their gradients
// [B, T, H]; gradients overwritten. 1 <= chunk_size <= kMdnMaxChunk, else llmt::Error. Chunk-parallel (see
// mdn.cu). residuals [B, T, H, V] or nullptr (mdn.md §7.1, model.mdn.save_residuals): when given, the forward
// writes the corrected values Ṽ there (cpu mdn_chunk_fwd's vt_out) and the backward reads them instead of
// solving for them again (it still recomputes the chunk coefficients and the chunk-start states); the gradients
// are bit-identical either way. `scratch` must hold mdn_chunk_{fwd,bwd}_scratch_bytes with saved_residuals =
// (residuals != nullptr): per chunk per (batch, head) the chunk's coefficients (6 C² + 8 C floats) and both
// entering states (2 K V), plus Ṽ (B T H V floats) unless saved_residuals; the backward adds both exit state
// gradients (2 K V), 11 C K and 2 64² floats. Shared memory per block: the value-tile scans hold 2 ceil(K / 64)
// fp32 state tiles of 64 x 65 floats, 10 C floats and 5 operand tiles (fp32: 64 x 65 floats; bf16: 5 + 2 of 64 x 72
// bf16): 214 KB fp32, 196 KB bf16 at K = 256, C = 64; a larger key_dim is refused with llmt::Error on both paths;
// the per-chunk backward kernel 11 C² + 13 C floats (183 KB at C = 64).
constexpr int64_t kMdnMaxChunk = 64;
template <typename P>
void mdn_chunk_fwd(const float* q, const float* k, const float* v, const float* log_alpha, const float* beta,
                   const float* log_mu, const float* eta, int64_t batch, int64_t seq_len, int64_t heads,
                   int64_t key_dim, int64_t value_dim, int64_t chunk_size, float* o, float* residuals,
                   void* scratch, cudaStream_t stream);
size_t mdn_chunk_fwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim,
                                   int64_t value_dim, int64_t chunk_size, bool saved_residuals);
template <typename P>
void mdn_chunk_bwd(const float* q, const float* k, const float* v, const float* log_alpha, const float* beta,
                   const float* log_mu, const float* eta, const float* d_o, const float* residuals, int64_t batch,
                   int64_t seq_len, int64_t heads, int64_t key_dim, int64_t value_dim, int64_t chunk_size,
                   float* dq, float* dk, float* dv, float* dlog_alpha, float* dbeta, float* dlog_mu, float* deta,
                   void* scratch, cudaStream_t stream);
size_t mdn_chunk_bwd_scratch_bytes(int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim,
                                   int64_t value_dim, int64_t chunk_size, bool saved_residuals);

// decode.cu, decode_attention.cu: incremental decoding (semantics: the CPU backend's *_decode ops,
// kernels/backend.h): T new tokens per batch row continuing a carried state, updated in place. The recurrent
// ops run the one-token update T times in one launch (one block per (batch, head) or (value tile, head, batch),
// the state on chip between tokens); fp32 states and arithmetic.
/// cpu::short_conv_silu_step: x, y [B, T, C]; w [C, W]; bias [C] or nullptr; window [B, W - 1, C]. y is float or
/// __nv_bfloat16 (the fp32 result rounded: the bf16 v of gdn_decode / comba_decode).
template <typename TY>
void short_conv_silu_decode(const float* x, const float* w, const float* bias, int64_t batch, int64_t seq_len,
                            int64_t channels, int64_t width, float* window, TY* y, cudaStream_t stream);
/// The delta-rule recurrences (cpu::{gdn,kda,comba,mdn}_recurrent_fwd from a state): q, k, p [B, T, H, K];
/// v, o [B, T, H, V]; g, log_alpha, beta, log_mu, eta [B, T, H] (KDA's g [B, T, H, K]); state, momentum
/// [B, H, K, V]. Throws llmt::Error when (K 16 (1 or 2 for MDN) + 3 K + 272) floats exceed 48 KiB. GDN's and
/// Comba's E (q, k, v, p): float or __nv_bfloat16 (read as fp32; what the layers hand the bf16 chunked cores).
template <typename E>
void gdn_decode(const E* q, const E* k, const E* v, const float* g, const float* beta, int64_t batch, int64_t seq_len,
                int64_t heads, int64_t key_dim, int64_t value_dim, float* state, float* o, cudaStream_t stream);
void kda_decode(const float* q, const float* k, const float* v, const float* g, const float* beta, int64_t batch,
                int64_t seq_len, int64_t heads, int64_t key_dim, int64_t value_dim, float* state, float* o,
                cudaStream_t stream);
template <typename E>
void comba_decode(const E* q, const E* k, const E* v, const E* p, const float* g, const float* beta, int64_t batch,
                  int64_t seq_len, int64_t heads, int64_t key_dim, int64_t value_dim, float* state, float* o,
                  cudaStream_t stream);
void mdn_decode(const float* q, const float* k, const float* v, const float* log_alpha, const float* beta,
                const float* log_mu, const float* eta, int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim,
                int64_t value_dim, float* state, float* momentum, float* o, cudaStream_t stream);
/// cpu::mamba2_ssd_fwd with a state: xbc [B, T, H P + 2 G N] (E: float, or __nv_bfloat16 as mamba2_ssd_fwd's bf16
/// inputs, read as fp32); dt_raw [B, T, H]; dt_bias, A_log, D [H]; state [B, H, P, N] (fp32); y [B, T, H P] (E, as
/// mamba2_ssd_fwd's: bf16 rounded once from the fp32 result).
template <typename E>
void mamba2_ssd_decode(const E* xbc, const float* dt_raw, const float* dt_bias, const float* A_log, const float* D,
                       int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim, int64_t state_dim,
                       int64_t groups, float* state, E* y, cudaStream_t stream);
/// cpu::rope_fwd_at: rope_fwd of x [B, T, H, Dh] at positions position .. position + T - 1 (rope.cu).
template <typename T>
void rope_fwd_at(T* x, int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim, double theta,
                 int64_t position, cudaStream_t stream);
/// cpu::attention_decode: q, k, v, o [B, T, H, Dh] (float or bf16); k_cache, v_cache [B, capacity, H, Dh];
/// k, v stored at positions position .. position + T - 1, then one block per (b, t, h) runs an online softmax
/// over cache positions 0 .. position + t (fp32 arithmetic).
template <typename T>
void attention_decode(const T* q, const T* k, const T* v, int64_t batch, int64_t seq_len, int64_t heads,
                      int64_t head_dim, int64_t capacity, int64_t position, double scale, T* k_cache, T* v_cache,
                      T* o, cudaStream_t stream);

}  // namespace llmt::cuda
