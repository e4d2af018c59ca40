// The parameter registry: every parameter of a model is a named slice of one flat buffer,
// and its gradient the same slice of a second flat buffer (docs/ARCHITECTURE.md "Parameters", llm.c style). Layers
// register their parameters at construction and read views after allocate().
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/backend.h"

namespace llmt {

/// What a parameter is, for weight-decay exclusion (train.weight_decay_exclude).
enum class ParamKind { weight, bias, norm, embedding, ssm_param };
const char* param_kind_name(ParamKind k);

/// How a parameter is initialised.
///   normal:          N(0, std^2)
///   ones, zeros
///   log_uniform:     log(U(lo, hi))  (GDN/Comba A_log: layers-delta.md section 3.3)
///   dt_bias:         softplus^-1(dt), dt = exp(U(log lo, log hi)) clamped to >= floor
///                    (GDN/Comba dt_bias: layers-delta.md section 3.3; mamba2 dt init)
///   constant:        every element = value (Comba decay, D: layers-delta.md section 3.3)
///   uniform:         U(lo, hi) (Mamba2 out_proj: layers-ssm-attn.md section 2.3.1)
///   log_index:       element i = log(i + 1) (Mamba2 A_log, A = -1..-H: layers-ssm-attn.md section 2.3.1)
struct Init {
  enum Kind { normal, ones, zeros, log_uniform, dt_bias, constant, uniform, log_index } kind = normal;
  double std = 0.02;
  double value = 0;  ///< the value of a constant init
  double lo = 0, hi = 0, floor = 0;
  /// The Philox stream of the draw; -1 = the parameter's own registration index. Another parameter's
  /// index with the same Init repeats its values (MDN mu_bias = dt_bias at init, mdn.md section 3).
  int64_t stream = -1;
};

/// Every parameter starts at a multiple of kParamAlign elements of the flat buffers (zero gaps between them), so
/// that matrix products read 16-byte aligned weights (the bf16 working copy too) whatever the sizes before them
/// (a GDN layer's A_log and dt_bias have num_heads elements): cuBLAS's fast kernels need it.
constexpr int64_t kParamAlign = 64;

struct ParamInfo {
  std::string name;             ///< flash-linear-attention HF name, e.g. model.layers.0.attn.q_proj.weight
  std::vector<int64_t> shape;
  int64_t offset = 0;           ///< in elements, into the flat buffers (a multiple of kParamAlign)
  int64_t numel = 0;
  ParamKind kind = ParamKind::weight;
  Init init;
};

class ParamStore {
 public:
  /// Registers a parameter; returns its index. Must precede allocate(). Names are unique.
  int add(const std::string& name, std::vector<int64_t> shape, ParamKind kind, Init init);

  /// Allocates the flat master-parameter and gradient buffers (dtype f32 or f64) on
  /// `backend`. With compute_dtype bf16 (dtype must then be f32) it also allocates the
  /// working copy: every parameter rounded to bf16, what matrix products read (docs/ARCHITECTURE.md
  /// "Mixed precision"); compute_dtype == dtype means no copy. The parameter and gradient
  /// buffers are padded with zeros to padded_total() = total() rounded up to a multiple of
  /// `pad_multiple` (> 0) elements (ZeRO-1 cuts them into equal segments per rank).
  void allocate(Backend& backend, DType dtype, DType compute_dtype, int64_t pad_multiple = 1);
  void allocate(Backend& backend, DType dtype) { allocate(backend, dtype, dtype); }

  /// Fills every parameter by its Init; parameter i draws from Philox(seed, i) (or Philox(seed,
  /// init.stream)), so a parameter's values depend only on the seed and its registration index. Refreshes the
  /// working copy.
  void initialize(uint64_t seed);
  /// Re-rounds the working copy from the master parameters (after they were written other
  /// than by the optimizer, e.g. a checkpoint load); nothing without a working copy.
  void refresh_working();

  /// The parameter as matrix products read it: the working copy in compute_dtype().
  Tensor param(int i) const { return view(has_working() ? working_ : params_, i, compute_dtype_); }
  /// The master parameter (dtype()): what norms, embeddings, gates and the optimizer use.
  Tensor master(int i) const { return view(params_, i, dtype_); }
  Tensor grad(int i) const { return view(grads_, i, dtype_); }
  /// All master parameters / gradients as one 1-D tensor.
  Tensor flat_params() const { return Tensor(params_.data(), dtype_, {total_}); }
  Tensor flat_grads() const { return Tensor(grads_.data(), dtype_, {total_}); }
  /// The parameter / gradient buffers with their zero padding: 1-D, padded_total() elements.
  Tensor padded_params() const { return Tensor(params_.data(), dtype_, {padded_total_}); }
  Tensor padded_grads() const { return Tensor(grads_.data(), dtype_, {padded_total_}); }
  /// The working copy as one 1-D tensor, or an empty Tensor (data == nullptr) without one.
  Tensor flat_working() const {
    return has_working() ? Tensor(working_.data(), compute_dtype_, {total_}) : Tensor();
  }

  const std::vector<ParamInfo>& infos() const { return infos_; }
  /// The extent of the flat buffers: the last parameter's end (parameters and the zero gaps between them).
  int64_t total() const { return total_; }
  /// The number of parameter elements (the sum of the parameters' numel, without the gaps).
  int64_t count() const { return count_; }
  /// total() rounded up to allocate()'s pad_multiple.
  int64_t padded_total() const { return padded_total_; }
  /// Master parameter, gradient and optimizer-state dtype (f32, or f64 in gradient checks).
  DType dtype() const { return dtype_; }
  /// The dtype of matrix-product operands and of most activations (bf16 or dtype()).
  DType compute_dtype() const { return compute_dtype_; }
  Backend& backend() const { return *backend_; }

 private:
  bool has_working() const { return compute_dtype_ != dtype_; }
  Tensor view(const Buffer& b, int i, DType dtype) const;
  std::vector<ParamInfo> infos_;
  int64_t total_ = 0, padded_total_ = 0, count_ = 0;
  DType dtype_ = DType::f32, compute_dtype_ = DType::f32;
  Backend* backend_ = nullptr;
  Buffer params_, grads_, working_;
};

}  // namespace llmt
