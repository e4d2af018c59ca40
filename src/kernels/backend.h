// The op interface (docs/ARCHITECTURE.md "Ops and backends", in the manner of ggml / llama.cpp: an op is declared
// once and implemented per backend; layers call ops and never branch on the device). Every op takes Tensor views;
// the backend checks shapes and dtypes and dispatches to its kernels. The CPU backend (cpu_backend.cpp) is the
// reference; a CUDA backend implements the same interface.
//
// Conventions: matrices are row-major; a Linear weight is [out, in] and y = x W^T;
// activations are [batch * seq_len, features]; parameter gradients always ACCUMULATE
// (gradient accumulation over micro-batches); activation gradients are overwritten unless
// the op says otherwise.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/tensor.h"
#include "kernels/mamba3_options.h"
#include "kernels/mdn_gate_options.h"

namespace llmt {

/// Hyperparameters of one AdamW update (runs.md section 1).
struct AdamWParams {
  double lr = 0;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // ---- memory ----
  /// Uninitialised device memory of `bytes` bytes (64-byte aligned); released by release().
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* ptr) = 0;
  /// The most bytes held through allocate() at any one time since the backend was made.
  virtual size_t peak_allocated_bytes() const = 0;
  /// The stream the backend queues its work on, as an opaque handle (CUDA: its cudaStream_t), for
  /// a communicator that orders collectives after that work (Communicator::set_compute_stream);
  /// nullptr for a backend that computes synchronously on the calling thread (CPU).
  virtual void* native_stream() const { return nullptr; }
  virtual void fill_zero(const Tensor& t) = 0;
  /// dst = src (same element count and dtype).
  virtual void copy(const Tensor& src, const Tensor& dst) = 0;
  /// dst = src rounded to dst's dtype (same element count; bf16 rounds to nearest even). With
  /// equal dtypes it is copy(). Throws llmt::Error for a pair of dtypes the backend lacks.
  virtual void convert(const Tensor& src, const Tensor& dst) = 0;
  /// Host memory -> tensor and tensor -> host memory (t.bytes() bytes).
  virtual void upload(const void* host, const Tensor& t) = 0;
  virtual void download(const Tensor& t, void* host) = 0;

  // ---- elementwise and reductions ----
  /// out = a + b (same shapes; out may alias a or b).
  virtual void add(const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  /// sum of squares of all elements, accumulated in double.
  virtual double sum_squares(const Tensor& x) = 0;
  /// sum of all elements, accumulated in double.
  virtual double sum(const Tensor& x) = 0;

  // ---- dense ----
  /// c = op(a) op(b) (+ c when accumulate); a, b, c 2-D; op transposes when asked. a and b
  /// share one dtype; c has it too, or is f32 when a and b are bf16 (fp32 accumulation
  /// always; an f32 c keeps the product unrounded, e.g. weight gradients, residual branches).
  void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c, bool accumulate) {
    matmul_strided(a, 0, trans_a, b, trans_b, c, 0, accumulate);
  }
  /// matmul with the row strides of a and c given (elements; 0 = dense): the rows of a (as stored, [a.shape[0],
  /// a.shape[1]]) lie lda >= a.shape[1] elements apart, those of c ldc >= c.shape[1] apart (the LM head's logits,
  /// logits_stride). Throws llmt::Error for a stride shorter than the row.
  virtual void matmul_strided(const Tensor& a, int64_t lda, bool trans_a, const Tensor& b, bool trans_b,
                              const Tensor& c, int64_t ldc, bool accumulate) = 0;

  // ---- layers' building blocks (semantics: src/kernels/cpu/*.h) ----
  /// out[n, D] = table[ids[n], :]; ids i32 [n].
  virtual void embedding_fwd(const Tensor& ids, const Tensor& table, const Tensor& out) = 0;
  /// dtable[ids[n], :] += dout[n, :].
  virtual void embedding_bwd(const Tensor& ids, const Tensor& dout, const Tensor& dtable) = 0;
  /// y = rmsnorm(x) * w, x/y [rows, D], w [D], rstd [rows] saved for the backward.
  virtual void rmsnorm_fwd(const Tensor& x, const Tensor& w, double eps, const Tensor& y, const Tensor& rstd) = 0;
  /// The residual add fused with the following norm: h = x + branch, y = rmsnorm(h) * w, rstd
  /// [rows], in one pass; equal to add(x, branch, h) then rmsnorm_fwd(h, w, eps, y, rstd). x,
  /// branch, h [rows, D] in the master dtype (the residual stream), y as rmsnorm_fwd's. The
  /// backward is rmsnorm_bwd into the residual-stream gradient (the add passes it unchanged to
  /// x and branch).
  virtual void add_rmsnorm_fwd(const Tensor& x, const Tensor& branch, const Tensor& w, double eps, const Tensor& h,
                               const Tensor& y, const Tensor& rstd) = 0;
  /// dx += dL/dx, dw += dL/dw.
  virtual void rmsnorm_bwd(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                           const Tensor& dx, const Tensor& dw) = 0;
  /// Rotary embedding in place on x [B, T, H, Dh] (rotate-half, positions 0..T-1).
  virtual void rope_fwd(const Tensor& x, double theta) = 0;
  virtual void rope_bwd(const Tensor& dx, double theta) = 0;
  /// Causal softmax attention; q, k, v, o [B, T, H, Dh]; lse [B, H, T].
  virtual void attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, double scale, const Tensor& o,
                             const Tensor& lse) = 0;
  virtual void attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                             const Tensor& lse, const Tensor& dout, double scale, const Tensor& dq,
                             const Tensor& dk, const Tensor& dv) = 0;
  /// h = silu(gate) * up and its backward (overwrites dgate, dup).
  virtual void swiglu_fwd(const Tensor& gate, const Tensor& up, const Tensor& h) = 0;
  virtual void swiglu_bwd(const Tensor& gate, const Tensor& up, const Tensor& dh, const Tensor& dgate,
                          const Tensor& dup) = 0;
  /// Softmax cross-entropy of logits [rows, V] (f32, f64 or bf16; statistics in fp32/double)
  /// against targets i32 [rows] (negative = no label); logits are overwritten by
  /// grad_scale * dloss/dlogits; losses [rows] (f32 or f64) receive the per-row losses.
  /// When `correct` has data ([rows], the losses' dtype) it receives 1 where the target is an argmax of
  /// the row's logits (ties count as correct), else 0 (0 for rows without a label).
  /// Does not synchronise: sum() the losses afterwards.
  void cross_entropy(const Tensor& logits, const Tensor& targets, double grad_scale, const Tensor& losses,
                     const Tensor& correct) {
    cross_entropy_strided(logits, 0, targets, grad_scale, losses, correct);
  }
  /// cross_entropy over logits whose rows lie ld >= V elements apart (0 = dense; logits_stride).
  virtual void cross_entropy_strided(const Tensor& logits, int64_t ld, const Tensor& targets, double grad_scale,
                                     const Tensor& losses, const Tensor& correct) = 0;
  /// One AdamW update of params from grads * grad_scale; m, v are the moments; step is the
  /// 1-based count of updates taken. params, grads, m, v share one dtype. When `working` has
  /// data (same element count, another dtype, e.g. the bf16 copy of fp32 master weights), it
  /// receives the updated params rounded to its dtype in the same pass.
  virtual void adamw_step(const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                          const AdamWParams& hp, double grad_scale, int64_t step, const Tensor& working) = 0;

  /// Rows of the LM head and loss that the model processes at once: the [rows x vocab]
  /// logits of one chunk are the only ones held (CPU: small, cache-sized; CUDA: large enough
  /// to keep the tensor cores busy).
  virtual int64_t head_chunk_rows() const { return 256; }
  /// The row stride (elements) the model gives its logits buffer for a vocabulary of `vocab`: vocab here; the CUDA
  /// backend rounds it up to a multiple of 64, so that the LM head's GEMMs see 16-byte aligned rows (an odd vocab
  /// such as GPT-2's 50257 otherwise sends cuBLAS to its slow unaligned kernels).
  virtual int64_t logits_stride(int64_t vocab) const { return vocab; }

  // ---- delta-rule layers (GDN, Comba, KDA, MDN) ----
  // Semantics: src/kernels/cpu/{short_conv,l2norm,gated_rmsnorm,delta_gates,gdn,comba_gates,comba,kda,
  // mdn_gates,mdn}.h. A backend
  // that does not implement one yet throws llmt::Error naming the op and itself.

  /// Depthwise causal conv + SiLU: x, pre, y [B, T, C]; w [C, 1, W]. dx overwritten, dw accumulated. dx may be
  /// bf16 where the backend computes in bf16 (CUDA: rounded from its fp32 result, for a bf16 matrix product); y may
  /// be bf16 where delta_core_bf16_inputs (rounded from the fp32 result: a GDN / Comba core's v) or
  /// mamba2_bf16_inputs (a Mamba2 SSD's xbc); dy may be bf16 where mamba2_bf16_inputs (the SSD's dxbc; read as
  /// fp32).
  virtual void short_conv_silu_fwd(const Tensor& x, const Tensor& w, const Tensor& pre, const Tensor& y);
  virtual void short_conv_silu_bwd(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& pre,
                                   const Tensor& dx, const Tensor& dw);
  /// y = scale * x / sqrt(sum x^2 + eps) over rows of `dim`; rinv [rows]. y may be bf16 where
  /// delta_core_bf16_inputs (rounded from the fp32 result: a GDN / Comba core's q̂, k̂, p̂). The backward reads the
  /// forward's input x (in dy's and dx's dtype) and rinv (x / |x| = x rinv; never y, which may be rounded); dx
  /// overwritten.
  virtual void l2norm_fwd(const Tensor& x, int64_t dim, double eps, double scale, const Tensor& y, const Tensor& rinv);
  virtual void l2norm_bwd(const Tensor& dy, const Tensor& x, const Tensor& rinv, int64_t dim, double scale,
                          const Tensor& dx);
  /// y = rmsnorm(o) * w * phi(z) per row of w.numel() (phi = sigmoid or silu); rstd [rows].
  /// d_o, dz overwritten; dw accumulated. y and dz may be bf16 where the backend computes in bf16 (CUDA: rounded
  /// from its fp32 results, for bf16 matrix products).
  virtual void gated_rmsnorm_fwd(const Tensor& o, const Tensor& z, const Tensor& w, double eps, bool sigmoid_gate,
                                 const Tensor& y, const Tensor& rstd);
  virtual void gated_rmsnorm_bwd(const Tensor& dy, const Tensor& o, const Tensor& z, const Tensor& w,
                                 const Tensor& rstd, bool sigmoid_gate, const Tensor& d_o, const Tensor& dz,
                                 const Tensor& dw);
  /// GDN gates: a, b, g, beta [rows, H]; A_log, dt_bias [H]. da, db overwritten; dA_log, ddt_bias accumulated.
  virtual void gdn_gates_fwd(const Tensor& a, const Tensor& b, const Tensor& A_log, const Tensor& dt_bias,
                             const Tensor& g, const Tensor& beta);
  virtual void gdn_gates_bwd(const Tensor& dg, const Tensor& dbeta, const Tensor& a, const Tensor& b,
                             const Tensor& A_log, const Tensor& dt_bias, const Tensor& da, const Tensor& db,
                             const Tensor& dA_log, const Tensor& ddt_bias);
  /// Whether this backend's GDN and Comba cores take bf16 q̂, k̂, v (and p̂) at the layer's compute dtype
  /// `compute` (gdn_chunk_fwd's input dtypes; also gdn_decode / comba_decode), so that a layer hands them its bf16
  /// activations: l2norm_fwd's y, short_conv_silu_fwd's / short_conv_silu_decode's y written in bf16 (FLA's inputs;
  /// the core's tile products round them to bf16 anyway). The gradients dq, dk, dv (dp) stay in the master dtype.
  /// Default false (the CPU backend); CUDA: true for compute bf16. KDA and MDN cores take the master dtype only.
  virtual bool delta_core_bf16_inputs(DType /*compute*/) const { return false; }
  /// GDN core, chunked (zero initial state): q, k [B, T, H, K]; v, o [B, T, H, V]; g, beta [B, T, H].
  /// Gradients overwritten. `compute` is the layer's compute dtype (ParamStore::compute_dtype): the CUDA
  /// backend runs the core's tile products in exact fp32 for f32 and on the tensor cores with bf16 operands
  /// and fp32 accumulation for bf16 (kernels/cuda/gdn_comba.cu, "Precision"); the CPU backend computes in the
  /// tensors' dtype for either.
  /// Input dtypes: every tensor in one dtype (CPU: f32 or f64; CUDA: f32), or on the CUDA backend with compute bf16
  /// only, q, k, v bf16 (FLA's inputs: the tile products' bf16 operands are then their own values) with every other
  /// tensor (g, beta, d_o, o, the gradients, saved) f32. Anything else throws llmt::Error naming the op and the dtypes
  /// (q, k, v neither all f32 nor all bf16; bf16 q, k, v with compute f32; bf16 q, k, v on the CPU backend).
  /// saved: default-constructed (none), or [gdn_saved_numel] in g's dtype (states true or false), kept by the layer
  /// from this forward to the gdn_chunk_bwd of the same inputs, chunk_size and compute (layers-delta.md §6.3, the
  /// tensors saved for the backward): the forward writes there what the backward would otherwise recompute, and the
  /// backward given the same tensor reads it (CUDA: the fp32 𝒯 = (I + A)^{-1} of every chunk, so that the backward
  /// does not invert again, and with states (model.gdn / model.comba save_states) the forward's W and its scan's
  /// chunk-entering states h and v_new Δ, so that it runs neither wu nor the forward scan; without them, FLA's design,
  /// it forms W and U from 𝒯 and recomputes h and Δ.
  /// The CUDA backend tells the two sets apart by saved's size and throws llmt::Error for any other, naming both
  /// sizes. Gradients bit-identical to the recompute either way).
  virtual void gdn_chunk_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                             int64_t chunk_size, DType compute, const Tensor& o, const Tensor& saved);
  virtual void gdn_chunk_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                             const Tensor& d_o, const Tensor& saved, int64_t chunk_size, DType compute,
                             const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dg,
                             const Tensor& dbeta);
  /// The elements of gdn_chunk_fwd's and comba_chunk_fwd's `saved` (f32) for a layer of these sizes (key_dim,
  /// value_dim: per head), compute dtype and states (whether the set holds the forward's W and its scan's h and Δ:
  /// the layer's save_states), or 0 when this backend keeps nothing from the forward (its backward recomputes
  /// everything and ignores `saved`: the CPU reference, which recomputes in double). CUDA (cuda::gdn_saved_floats):
  /// per chunk and (batch, head) the fp32 64² 𝒯, and with states the K x V state h, the chunk's chunk_size x V Δ and
  /// its chunk_size x K W, h, Δ and W in the compute dtype (bf16: two a float), each region 16-byte aligned. At B T =
  /// 16384 tokens, 16 heads, K = V = 128, chunk 64: 320 MiB for bf16 (64 𝒯 + 128 h + 64 Δ + 64 W), 576 MiB for f32,
  /// 64 MiB without states; at the 400M GDN (configs/mdn-paper/400m/gdn.json: 6 heads, K 128, V 256) with 4 x 4096
  /// tokens: 192 MiB a layer for bf16 (24 + 96 + 48 + 24), 24 MiB without states. 0 for a chunk_size its cores
  /// refuse; throws llmt::Error for a compute dtype other than f32 and bf16.
  virtual int64_t gdn_saved_numel(int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim, int64_t value_dim,
                                  int64_t chunk_size, DType compute, bool states) const;
  /// KDA channel-wise gates (layers-delta.md §4.3 steps 2-3, §5; cpu/delta_gates.h with dim = K):
  /// f, g [rows, H * K]; b, beta [rows, H]; A_log [H]; dt_bias [H * K]; g = -exp(A_log_h) softplus(f + dt_bias),
  /// beta = sigmoid(b). df, db overwritten; dA_log, ddt_bias accumulated.
  virtual void kda_gates_fwd(const Tensor& f, const Tensor& b, const Tensor& A_log, const Tensor& dt_bias,
                             const Tensor& g, const Tensor& beta);
  virtual void kda_gates_bwd(const Tensor& dg, const Tensor& dbeta, const Tensor& f, const Tensor& b,
                             const Tensor& A_log, const Tensor& dt_bias, const Tensor& df, const Tensor& db,
                             const Tensor& dA_log, const Tensor& ddt_bias);
  /// KDA core, chunked (zero initial state; layers-delta.md §4.3, §6.1, §6.5): q = q̂, k = k̂, g (per-channel
  /// log-decay) [B, T, H, K]; v, o [B, T, H, V]; beta [B, T, H]. Recurrence S̄_t = Diag(e^{g_t}) S_{t-1},
  /// δ_t = β_t (v_t - S̄_t^T k̂_t), S_t = S̄_t + k̂_t δ_t^T, o_t = S_t^T q̂_t. Gradients dq, dk, dv, dg, dbeta overwritten.
  /// `compute` as for gdn_chunk_fwd: the CUDA backend runs the forward's tile products and the backward's scans
  /// on the tensor cores for bf16 and everything in exact fp32 for f32 (kernels/cuda/kda.cu, "Precision").
  /// saved: default-constructed (none), or [kda_saved_numel] in g's dtype (states true or false), kept by the layer
  /// from this forward to the kda_chunk_bwd of the same inputs, chunk_size and compute (as gdn_chunk_fwd's; CUDA:
  /// the fp32 P and 𝒯 = (I + A)^{-1} of every chunk, so that the backward forms neither A, P nor the inverse again,
  /// and with states (model.kda.save_states) Δ (v_new) and the states entering the chunks h, so that it runs no
  /// forward scan either; told apart by size as gdn_chunk_fwd's; gradients bit-identical to the recompute).
  virtual void kda_chunk_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                             int64_t chunk_size, DType compute, const Tensor& o, const Tensor& saved);
  virtual void kda_chunk_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                             const Tensor& d_o, const Tensor& saved, int64_t chunk_size, DType compute,
                             const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dg,
                             const Tensor& dbeta);
  /// The elements of kda_chunk_fwd's `saved` for a layer of these sizes (key_dim K, value_dim V per head; compute
  /// as kda_chunk_fwd's) and states (as gdn_saved_numel's), or 0 when this backend keeps nothing from the forward
  /// (as gdn_saved_numel; the CPU backend: 0). CUDA, fp32 for either compute dtype (kernels/cuda/ops.cuh
  /// kda_saved_floats): per chunk and head 2 x 64² (P, 𝒯), and with states chunk_size V (Δ) and K V (h) floats,
  /// each tensor padded to 16 bytes: 128 KiB per chunk and head at K = V = 128 and chunk 64 (32 KiB without states);
  /// at B T = 16384 tokens (B = 4, T = 4096), 16 heads: 512 MiB (128 MiB without); the 400M KDA
  /// (configs/mdn-paper/400m/kda.json: 8 heads, micro_batch 4, seq_len 4096): 256 MiB per layer, 6 GiB over its 24
  /// layers (64 MiB, 1.5 GiB without). 0 for a chunk_size its core refuses.
  virtual int64_t kda_saved_numel(int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim, int64_t value_dim,
                                  int64_t chunk_size, DType compute, bool states) const;
  /// Comba inner decay + output correction before the L2 norm (layers-delta.md §4.2 steps 2-3), per head h:
  /// s = sigmoid(decay_h), p = s k, q_out = q - D_h s k. q, k, q_out, p [rows, H * K]; decay, D [H], or a
  /// default-constructed Tensor (data == nullptr) when the inner decay (s = 1) / output correction (q_out = q)
  /// is off. Backward (§5): dq_out is dq' (also the gradient of q, so none is written); dk, ddecay, dD are
  /// ACCUMULATED: dk += s dp - D s dq', ddecay += s(1-s) sum(k dp - D k dq'), dD += -s sum(k dq').
  virtual void comba_gates_fwd(const Tensor& q, const Tensor& k, const Tensor& decay, const Tensor& D,
                               const Tensor& q_out, const Tensor& p);
  virtual void comba_gates_bwd(const Tensor& dq_out, const Tensor& dp, const Tensor& k, const Tensor& decay,
                               const Tensor& D, const Tensor& dk, const Tensor& ddecay, const Tensor& dD);
  /// Comba core, chunked (zero initial state; layers-delta.md §4.2, §6.2): q = q̂ (corrected, normalised,
  /// scaled), k = k̂, p = p̂ [B, T, H, K]; v, o [B, T, H, V]; g (log-decay), beta [B, T, H]. Recurrence
  /// r_t = v_t - S_{t-1}^T p̂_t, S_t = alpha_t S_{t-1} + beta_t k̂_t r_t^T, o_t = S_t^T q̂_t.
  /// Gradients dq, dk, dv, dp, dg, dbeta overwritten. `compute`, the input dtypes (q, k, v and p all bf16 or not)
  /// and `saved` (none or [gdn_saved_numel]) as for gdn_chunk_fwd / gdn_chunk_bwd.
  virtual void comba_chunk_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& p, const Tensor& g,
                               const Tensor& beta, int64_t chunk_size, DType compute, const Tensor& o,
                               const Tensor& saved);
  virtual void comba_chunk_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& p, const Tensor& g,
                               const Tensor& beta, const Tensor& d_o, const Tensor& saved, int64_t chunk_size,
                               DType compute, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dp,
                               const Tensor& dg, const Tensor& dbeta);

  // ---- Mamba2 (layers-ssm-attn.md §1.2, §1.4, §2) ----
  // Semantics: src/kernels/cpu/{short_conv,gated_rmsnorm,mamba2}.h.
  /// Depthwise causal conv with a per-channel bias + SiLU (§1.4): x, pre, y [B, T, C]; w [C, 1, W]; bias [C].
  /// dx overwritten; dw, dbias accumulated. y may be bf16 where mamba2_bf16_inputs (rounded from the fp32 result:
  /// the SSD's xbc), and so may dy (the SSD's dxbc, read as fp32); the backward reads x and pre, never y.
  virtual void conv_bias_silu_fwd(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& pre,
                                  const Tensor& y);
  virtual void conv_bias_silu_bwd(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& pre,
                                  const Tensor& dx, const Tensor& dw, const Tensor& dbias);
  /// Mamba2's gated RMSNorm, the gate first (norm_before_gate = False; §1.2, §2.2 step 6, one group per row of
  /// w.numel() = Di): u = y ∘ silu(z), out = u (mean_c(u_c^2) + eps)^(-1/2) ∘ w; rstd [rows] receives the
  /// (mean + eps)^(-1/2). z [rows, Di] and w [Di] in the master dtype; y [rows, Di] in it too, or bf16 where
  /// mamba2_bf16_inputs (the SSD's output, read as fp32); out [rows, Di] in the master dtype, or bf16 where the
  /// backend computes in bf16 (CUDA: rounded from its fp32 result, out_proj's operand). Equal to swiglu_fwd(z, y, u)
  /// then rmsnorm_fwd(u, w, eps, out, rstd) without storing u (cpu::gate_rmsnorm_fwd).
  virtual void gate_rmsnorm_fwd(const Tensor& y, const Tensor& z, const Tensor& w, double eps, const Tensor& out,
                                const Tensor& rstd);
  /// Backward of gate_rmsnorm_fwd from its y (as the forward's: bf16 where mamba2_bf16_inputs), z and rstd (u
  /// recomputed; cpu::gate_rmsnorm_bwd): dout [rows, Di] in the master dtype; dy [rows, Di] in it too, or bf16 where
  /// mamba2_bf16_inputs (CUDA: rounded from its fp32 result,
  /// the SSD's dy); dz [rows, Di] in the master dtype, or bf16 where the backend computes in bf16 (CUDA: rounded from
  /// its fp32 result, in_proj's operand). dy, dz overwritten; dw [Di] accumulated.
  virtual void gate_rmsnorm_bwd(const Tensor& dout, const Tensor& y, const Tensor& z, const Tensor& w,
                                const Tensor& rstd, const Tensor& dy, const Tensor& dz, const Tensor& dw);
  /// Whether this backend's Mamba2 SSD (mamba2_ssd_fwd / bwd, mamba2_ssd_decode) takes bf16 xbc and dy at the
  /// layer's compute dtype `compute`, so that the layer hands it the conv output written in bf16 (short_conv_silu_fwd,
  /// conv_bias_silu_fwd, short_conv_silu_decode) and its dy written in bf16 (gate_rmsnorm_bwd); the SSD then writes
  /// its output y (read by gate_rmsnorm_fwd / bwd) and its gradient dxbc (read by the conv's backward) in bf16 too
  /// (the official kernels' outputs); its other gradients stay in the master dtype. Default false (the CPU backend);
  /// CUDA: true for compute bf16.
  virtual bool mamba2_bf16_inputs(DType /*compute*/) const { return false; }
  /// Mamba2's SSD step (§2.2 steps 3–5, chunked §2.5, zero initial state): xbc [B, T, H P + 2 G N] (rows
  /// [x | B | C], the conv output), dt_raw [B, T, H], dt_bias, A_log, D [H], y [B, T, H P];
  /// Δ = softplus(dt_raw + dt_bias), A = -exp(A_log), y = SSD(x, Δ, A, B, C) + D x. H is dt_raw's last
  /// dimension; N follows from xbc's width. Backward (§2.6): dxbc, ddt_raw overwritten; ddt_bias, dA_log, dD
  /// accumulated. `compute` is the layer's compute dtype (ParamStore::compute_dtype): the CUDA backend runs the
  /// core's tile products in exact fp32 for f32 and on the tensor cores with bf16 operands and fp32
  /// accumulation for bf16 (kernels/cuda/mamba2.cu, "Precision"); the CPU backend computes in the tensors'
  /// dtype for either.
  /// Dtypes: every tensor in one dtype (CPU: f32 or f64; CUDA: f32), or on the CUDA backend with compute bf16 only,
  /// xbc (and the backward's dy) bf16 (the official kernels' inputs: the tile products' bf16 operands are then their
  /// own values, copied as they are; the D skip reads them too) with y and dxbc bf16 too (the official kernels'
  /// outputs: each rounded once from the fp32 value the f32 inputs of the same values give) and every other tensor
  /// (dt_raw, the parameters, the gradients ddt_raw, ..., saved) f32. Anything else throws llmt::Error naming the op
  /// and the dtypes (xbc, y or dy, xbc, dxbc neither all f32 nor all bf16; bf16 ones with compute f32, or on the CPU
  /// backend).
  /// saved: default-constructed (none), or [mamba2_saved_numel] in dt_raw's dtype, kept by the layer from this forward
  /// to the mamba2_ssd_bwd of the same inputs and compute: the forward writes there what the backward would
  /// otherwise recompute, and the backward given the same tensor reads it (CUDA: the states entering every 64-token
  /// chunk, in the compute dtype; the backward then scans only their adjoints; gradients bit-identical to the
  /// recompute).
  virtual void mamba2_ssd_fwd(const Tensor& xbc, const Tensor& dt_raw, const Tensor& dt_bias, const Tensor& A_log,
                              const Tensor& D, int64_t head_dim, int64_t n_groups, int64_t chunk_size, DType compute,
                              const Tensor& y, const Tensor& saved);
  virtual void mamba2_ssd_bwd(const Tensor& dy, const Tensor& xbc, const Tensor& dt_raw, const Tensor& dt_bias,
                              const Tensor& A_log, const Tensor& D, const Tensor& saved, int64_t head_dim,
                              int64_t n_groups, int64_t chunk_size, DType compute, const Tensor& dxbc,
                              const Tensor& ddt_raw, const Tensor& ddt_bias, const Tensor& dA_log, const Tensor& dD);
  /// The elements of mamba2_ssd_fwd's `saved` for a layer of these sizes (B, T, H, P, N) and compute dtype, or 0
  /// when this backend keeps nothing from the forward (its backward recomputes everything and ignores `saved`: the
  /// CPU reference, which recomputes in double). CUDA: B H ceil(T / 64) P N elements of the compute dtype, as
  /// floats (bf16: half as many): at B = 4, T = 4096, 16 heads x 128, d_state 128 (mamba2_bench) 128 MiB with bf16
  /// compute (256 MiB fp32); configs/mdn-paper/400m/mamba2.json (32 heads x 64, d_state 128) at micro_batch 4,
  /// seq_len 4096 also 128 MiB per layer (6 GiB over its 48 layers).
  virtual int64_t mamba2_saved_numel(int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim,
                                     int64_t d_state, DType compute) const;
  // ---- Mamba-3 (layers-ssm-attn.md §4; semantics: src/kernels/cpu/{mamba3_layer,mamba3_prep,mamba3}.h) ----
  /// The Mamba-3 layer parameters (§4.2): dt_bias, D [H]; B_bias, C_bias [H, R, N]; B_norm, C_norm [N];
  /// mimo_x, mimo_z, mimo_o [H, R, P] (default-constructed for SISO, R = 1); norm [H P] (default-constructed
  /// without opt.outproj_norm). The same struct carries their gradients.
  struct Mamba3Params {
    Tensor dt_bias, B_bias, C_bias, B_norm, C_norm, D, mimo_x, mimo_z, mimo_o, norm;
  };
  /// Whether this backend's Mamba-3 op (mamba3_fwd / mamba3_bwd / mamba3_decode) takes bf16 activations x, z, dout
  /// and writes bf16 out, dx, dz at the layer's compute dtype `compute` (with bc, raw, dbc, draw, the parameters and
  /// the carry in the master dtype f32), so that the layer keeps them in bf16: in_proj writes z, x in bf16 and
  /// out_proj reads out as it is. Default false (the CPU backend); CUDA: true for compute bf16 (its chunked op then
  /// needs opt.bf16_products, which the layer sets for bf16 compute).
  virtual bool mamba3_bf16_activations(DType /*compute*/) const { return false; }
  /// The Mamba-3 layer between in_proj and out_proj (§4.3.1–4.3.4, chunked core §4.4, zero initial state):
  /// x, z, out [B, T, H P]; bc [B, T, 2 R G N] ([B | C], column r G N + g N + n); raw [B, T, 3 H + S]
  /// ([dd_dt | dd_A | trap | angles]). H = x's width / opt.head_dim, N from bc's width, S from raw's width;
  /// all tensors in one dtype, except that x, z, out (and in the backward dout, dx, dz) may be bf16 with everything
  /// else f32 where mamba3_bf16_activations. Throws llmt::Error for inconsistent shapes or dtypes.
  /// saved: default-constructed (none), or [mamba3_saved_numel] in x's dtype, kept by the layer from this forward
  /// to the mamba3_bwd of the same inputs (model.mamba3.save_states): the forward writes the intermediates the
  /// backward would otherwise recompute there, and the backward given the same tensor reads them (CUDA: the
  /// core's G, chunk-entering states and y, BCNorm's normalised B, C and 1 / RMS, the phases φ and the rotated
  /// q, k, kernels/cuda/mamba3.cu; gradients bit-identical to the recompute).
  virtual void mamba3_fwd(const Tensor& x, const Tensor& z, const Tensor& bc, const Tensor& raw,
                          const Mamba3Params& params, const Mamba3Options& opt, const Tensor& out,
                          const Tensor& saved);
  /// Backward of mamba3_fwd (§4.5) given dout [B, T, H P] and the forward's `saved` (or none: everything is
  /// recomputed from the inputs): dx, dz, dbc, draw OVERWRITTEN (shapes of x, z, bc, raw); the gradients in
  /// `dparams` (same shapes as `params`) ACCUMULATED.
  virtual void mamba3_bwd(const Tensor& dout, const Tensor& x, const Tensor& z, const Tensor& bc, const Tensor& raw,
                          const Tensor& saved, const Mamba3Params& params, const Mamba3Options& opt,
                          const Tensor& dx, const Tensor& dz, const Tensor& dbc, const Tensor& draw,
                          const Mamba3Params& dparams);
  /// The elements of mamba3_fwd's `saved` for a layer of these sizes (B, T, H, N, S = angles and opt), or 0 when
  /// this backend keeps nothing from the forward (its backward recomputes everything and ignores `saved`: the CPU
  /// reference, which recomputes in double). CUDA: 2 B H nc Lc + B H nc P N + B T H R P + 2 B T R G N + 2 B T R G
  /// + B T H S floats and q, k's 2 B T H R N, each of the states, y, q, k in bf16 (half the bytes) with
  /// opt.bf16_products (and 256-byte alignment), Lc = 64 / R, nc = ceil(T / Lc): at 64 heads x 64, d_state 128,
  /// 32 angles, SISO, B T = 16384 tokens 1048 MiB with bf16 products (fp32: 1944 MiB).
  virtual int64_t mamba3_saved_numel(int64_t batch, int64_t seq_len, int64_t heads, int64_t d_state,
                                     int64_t angles, const Mamba3Options& opt) const;
  /// The per-head parameters of the MDN gates (mdn.md §3, §4.4), each [H]; Mu_log and mu_bias are
  /// default-constructed (data == nullptr) without momentum. The same struct carries their gradients.
  struct MdnGateParams {
    Tensor A_log, dt_bias, Mu_log, mu_bias, log_factor;
  };
  /// MDN gates (mdn.md §4.4; semantics cpu/mdn_gates.h): from the gate projections z_alpha, z_beta, z_mu,
  /// z_eta [rows, H] (z_mu, z_eta default-constructed without momentum) writes log_alpha, beta, log_mu
  /// (-inf without momentum), eta (1 without momentum) [rows, H], all in the dtype of z_alpha.
  virtual void mdn_gates_fwd(const Tensor& z_alpha, const Tensor& z_beta, const Tensor& z_mu, const Tensor& z_eta,
                             const MdnGateParams& params, const MdnGateOptions& opt, const Tensor& log_alpha,
                             const Tensor& beta, const Tensor& log_mu, const Tensor& eta);
  /// Backward of mdn_gates_fwd (mdn.md §7.4): dz_* [rows, H] OVERWRITTEN (dz_mu, dz_eta only with momentum),
  /// the parameter gradients in `dparams` ACCUMULATED.
  virtual void mdn_gates_bwd(const Tensor& d_log_alpha, const Tensor& d_beta, const Tensor& d_log_mu,
                             const Tensor& d_eta, const Tensor& z_alpha, const Tensor& z_beta, const Tensor& z_mu,
                             const Tensor& z_eta, const MdnGateParams& params, const MdnGateOptions& opt,
                             const Tensor& dz_alpha, const Tensor& dz_beta, const Tensor& dz_mu, const Tensor& dz_eta,
                             const MdnGateParams& dparams);
  /// MDN output correction before the L2 norm (mdn.md §4.2): q, k, q_out [rows, H * K]; D_log [H];
  /// q_out = q - exp(D_log_h) k. Backward: dq_out is also dL/dq; dk += -exp(D_log) dq_out and
  /// dD_log += -exp(D_log) Σ dq_out ⊙ k (both ACCUMULATED).
  virtual void mdn_correction_fwd(const Tensor& q, const Tensor& k, const Tensor& D_log, const Tensor& q_out);
  virtual void mdn_correction_bwd(const Tensor& dq_out, const Tensor& k, const Tensor& D_log, const Tensor& dk,
                                  const Tensor& dD_log);
  /// MDN core, chunked (zero initial states; mdn.md §5, §6; semantics cpu/mdn.h): q (normalised, scaled),
  /// k (= k_n, normalised) [B, T, H, K]; v, o [B, T, H, V]; log_alpha, beta, log_mu, eta [B, T, H].
  /// residuals: [B, T, H, V] (v's dtype) or default-constructed (none) — the corrected values Ṽ of mdn.md §6.2
  /// kept from the forward for the backward (§7.1; model.mdn.save_residuals): the forward writes them, the
  /// backward given the same tensor reads them instead of recomputing them (CUDA: gradients bit-identical to
  /// the recompute; the CPU reference writes them but its backward always recomputes in double).
  /// Backward: dq, dk (through both p = α k_n and k̂ = η k_n), dv, dlog_alpha, dbeta, dlog_mu, deta OVERWRITTEN.
  /// `compute` as for gdn_chunk_fwd: the CUDA backend's tile products in exact fp32 (f32) or on the tensor cores
  /// with bf16 operands and fp32 accumulation (bf16; kernels/cuda/mdn.cu, "Precision"); the CPU backend computes
  /// in the tensors' dtype for either.
  virtual void mdn_chunk_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& log_alpha,
                             const Tensor& beta, const Tensor& log_mu, const Tensor& eta, int64_t chunk_size,
                             DType compute, const Tensor& o, const Tensor& residuals);
  virtual void mdn_chunk_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& log_alpha,
                             const Tensor& beta, const Tensor& log_mu, const Tensor& eta, const Tensor& d_o,
                             const Tensor& residuals, int64_t chunk_size, DType compute, const Tensor& dq,
                             const Tensor& dk,
                             const Tensor& dv, const Tensor& dlog_alpha, const Tensor& dbeta, const Tensor& dlog_mu,
                             const Tensor& deta);

  // ---- incremental decoding (Mixer::decode, model/mixer.h): T new tokens per batch row (decode: T = 1; a
  // prompt's prefill: its length), continuing the state the mixer carries (all zero at the start of a
  // sequence; updated in place to the state after the T tokens). Tensors have the layouts of the training
  // ops. Semantics: the named src/kernels/cpu functions. A backend that does not implement one throws
  // llmt::Error naming the op and itself (the CPU and CUDA backends implement all of them). ----

  /// Rotary embedding in place on x [B, T, H, Dh] at absolute positions position .. position + T - 1
  /// (cpu::rope_fwd_at; rope_fwd is position 0).
  virtual void rope_fwd_at(const Tensor& x, double theta, int64_t position);
  /// Causal attention through a KV cache (cpu::attention_decode): q, k, v, o [B, T, H, Dh] (q, k rotated);
  /// k, v are stored into k_cache, v_cache [B, capacity, H, Dh] at positions position .. position + T - 1
  /// (< capacity), then query t attends over cache positions 0 .. position + t with the given scale.
  virtual void attention_decode(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& k_cache,
                                const Tensor& v_cache, int64_t position, double scale, const Tensor& o);
  /// The causal conv + SiLU continuing from `window` (cpu::short_conv_silu_step): x, y [B, T, C]; w [C, 1, W];
  /// bias [C] or default-constructed (none); window [B, W - 1, C], the last W - 1 inputs, advanced in place. y may be
  /// bf16 where delta_core_bf16_inputs or mamba2_bf16_inputs (rounded from the fp32 result).
  virtual void short_conv_silu_decode(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& window,
                                      const Tensor& y);
  /// gdn_chunk_fwd / kda_chunk_fwd / comba_chunk_fwd continuing from state [B, H, K, V] (S_0 in, S_T out;
  /// cpu::*_chunk_fwd with initial_state and final_state). GDN's and Comba's q, k, v (p) may be bf16 (all or none)
  /// where delta_core_bf16_inputs(bf16); every other tensor in the master dtype.
  virtual void gdn_decode(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                          int64_t chunk_size, const Tensor& state, const Tensor& o);
  virtual void kda_decode(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                          int64_t chunk_size, const Tensor& state, const Tensor& o);
  virtual void comba_decode(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& p, const Tensor& g,
                            const Tensor& beta, int64_t chunk_size, const Tensor& state, const Tensor& o);
  /// mdn_chunk_fwd continuing from the memory `state` and the `momentum` [B, H, K, V] (S_0, M_0 in; S_T, M_T
  /// out; mdn.md §5, §6).
  virtual void mdn_decode(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& log_alpha,
                          const Tensor& beta, const Tensor& log_mu, const Tensor& eta, int64_t chunk_size,
                          const Tensor& state, const Tensor& momentum, const Tensor& o);
  /// mamba2_ssd_fwd continuing from state [B, H, P, N] (layers-ssm-attn.md §2.8; cpu::mamba2_ssd_fwd with a state).
  /// xbc and y may be bf16 (both or neither) where mamba2_bf16_inputs (xbc read as fp32, y rounded from the fp32
  /// result); every other tensor (the state too) in the master dtype.
  virtual void mamba2_ssd_decode(const Tensor& xbc, const Tensor& dt_raw, const Tensor& dt_bias, const Tensor& A_log,
                                 const Tensor& D, int64_t head_dim, int64_t n_groups, int64_t chunk_size,
                                 const Tensor& state, const Tensor& y);
  /// What a Mamba-3 layer carries between decode steps (layers-ssm-attn.md §4.6; cpu::Mamba3Carry):
  /// state [B, H, P, N]; k_prev [B, H, R, N]; v_prev [B, H, R, P]; phase [B, H, S].
  struct Mamba3Carry {
    Tensor state, k_prev, v_prev, phase;
  };
  /// mamba3_fwd continuing from `carry` by the recurrence (cpu::mamba3_layer_step; no chunked form with a
  /// carried state yet): the same tensors (x, z, out bf16 where mamba3_bf16_activations; the carry in bc's dtype).
  virtual void mamba3_decode(const Tensor& x, const Tensor& z, const Tensor& bc, const Tensor& raw,
                             const Mamba3Params& params, const Mamba3Options& opt, const Mamba3Carry& carry,
                             const Tensor& out);
};

/// The CPU reference backend (OpenBLAS for matmul).
std::unique_ptr<Backend> make_cpu_backend();

/// The backend named by train.backend: "cpu", "cuda", or "auto" (cuda when this build has
/// the CUDA backend and a GPU is visible, else cpu). Throws llmt::Error for "cuda" when the
/// build has no CUDA backend or no GPU is visible, and for an unknown name.
std::unique_ptr<Backend> make_backend(const std::string& name);

/// The compute dtype that a precision name ("auto", "fp32", "bf16") means on `backend`: "auto" =
/// bf16 on cuda and f32 on cpu; "fp32" = f32; "bf16" = bf16, which only the cuda backend has
/// (llmt::Error on cpu, naming `key` and what to use instead). Throws for an unknown name.
/// `key` is where the name came from, for the message: a config key ("train.precision") or a
/// command-line option ("--precision").
DType compute_dtype_for(const std::string& precision, const Backend& backend,
                        const std::string& key = "train.precision");

/// Number of visible CUDA devices; 0 in a build without the CUDA backend.
int cuda_device_count();

/// Backend memory owned by one object (RAII), viewed through Tensors.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend& backend, size_t bytes) : backend_(&backend), bytes_(bytes) {
    ptr_ = bytes ? backend.allocate(bytes) : nullptr;
  }
  ~Buffer() { reset(); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept : backend_(o.backend_), ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      reset();
      backend_ = o.backend_;
      ptr_ = o.ptr_;
      bytes_ = o.bytes_;
      o.ptr_ = nullptr;
    }
    return *this;
  }
  void reset() {
    if (ptr_) backend_->release(ptr_);
    ptr_ = nullptr;
  }
  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  Backend* backend_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

/// A Buffer holding exactly one tensor of the given dtype and shape.
class OwnedTensor {
 public:
  OwnedTensor() = default;
  OwnedTensor(Backend& backend, DType dtype, std::initializer_list<int64_t> dims)
      : view_(nullptr, dtype, dims), buffer_(backend, view_.bytes()) {
    view_.data = buffer_.data();
  }
  const Tensor& operator*() const { return view_; }
  const Tensor* operator->() const { return &view_; }

 private:
  Tensor view_;
  Buffer buffer_;
};

}  // namespace llmt
