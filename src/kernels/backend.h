// The op interface (DESIGN.md "ggml / llama.cpp": an op is declared once and implemented per
// backend; layers call ops and never branch on the device). Every op takes Tensor views; the
// backend checks shapes and dtypes and dispatches to its kernels. The CPU backend
// (cpu_backend.cpp) is the reference; a CUDA backend implements the same interface.
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
  virtual void fill_zero(const Tensor& t) = 0;
  /// dst = src (same element count and dtype).
  virtual void copy(const Tensor& src, const Tensor& dst) = 0;
  /// Host memory -> tensor and tensor -> host memory (t.bytes() bytes).
  virtual void upload(const void* host, const Tensor& t) = 0;
  virtual void download(const Tensor& t, void* host) = 0;

  // ---- elementwise and reductions ----
  /// out = a + b (same shapes; out may alias a or b).
  virtual void add(const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  /// sum of squares of all elements, accumulated in double.
  virtual double sum_squares(const Tensor& x) = 0;

  // ---- dense ----
  /// c = op(a) op(b) (+ c when accumulate); a, b, c 2-D; op transposes when asked.
  virtual void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
                      bool accumulate) = 0;

  // ---- layers' building blocks (semantics: src/kernels/cpu/*.h) ----
  /// out[n, D] = table[ids[n], :]; ids i32 [n].
  virtual void embedding_fwd(const Tensor& ids, const Tensor& table, const Tensor& out) = 0;
  /// dtable[ids[n], :] += dout[n, :].
  virtual void embedding_bwd(const Tensor& ids, const Tensor& dout, const Tensor& dtable) = 0;
  /// y = rmsnorm(x) * w, x/y [rows, D], w [D], rstd [rows] saved for the backward.
  virtual void rmsnorm_fwd(const Tensor& x, const Tensor& w, double eps, const Tensor& y, const Tensor& rstd) = 0;
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
  /// Softmax cross-entropy of logits [rows, V] against targets i32 [rows] (negative = no
  /// label); logits are overwritten by grad_scale * dloss/dlogits; losses [rows].
  /// Returns the sum of the losses.
  virtual double cross_entropy(const Tensor& logits, const Tensor& targets, double grad_scale,
                               const Tensor& losses) = 0;
  /// One AdamW update of params from grads * grad_scale; m, v are the moments; step is the
  /// 1-based count of updates taken.
  virtual void adamw_step(const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                          const AdamWParams& hp, double grad_scale, int64_t step) = 0;
};

/// The CPU reference backend (OpenBLAS for matmul).
std::unique_ptr<Backend> make_cpu_backend();

/// The backend named by train.backend: "cpu", "cuda", or "auto" (cuda when this build has
/// the CUDA backend and a GPU is visible, else cpu). Throws llmt::Error for "cuda" when the
/// build has no CUDA backend or no GPU is visible, and for an unknown name.
std::unique_ptr<Backend> make_backend(const std::string& name);

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
