// Pieces shared by the backends' implementations: argument checks with the messages every
// backend gives, and the bookkeeping behind Backend::peak_allocated_bytes().
#pragma once
#include <algorithm>
#include <cstddef>
#include <unordered_map>

#include "core/error.h"
#include "core/tensor.h"

namespace llmt {

/// Throws llmt::Error naming `op` unless a and b have the same dtype and element count.
inline void check_same(const Tensor& a, const Tensor& b, const char* op) {
  check(a.dtype == b.dtype, "{}: dtype mismatch ({} vs {})", op, dtype_name(a.dtype), dtype_name(b.dtype));
  check(a.numel() == b.numel(), "{}: size mismatch ({} vs {})", op, a.shape_str(), b.shape_str());
}

/// The sizes of c = op(a) op(b): op(a) is [M, K], op(b) is [K, N]. Throws llmt::Error naming
/// the shapes unless a, b, c are 2-D of one dtype with agreeing sizes.
struct GemmDims {
  int64_t M, N, K;
};
inline GemmDims matmul_dims(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c) {
  check(a.ndim == 2 && b.ndim == 2 && c.ndim == 2, "matmul: needs 2-D tensors, got {} {} {}", a.shape_str(),
        b.shape_str(), c.shape_str());
  const int64_t M = trans_a ? a.shape[1] : a.shape[0], K = trans_a ? a.shape[0] : a.shape[1];
  const int64_t Kb = trans_b ? b.shape[1] : b.shape[0], N = trans_b ? b.shape[0] : b.shape[1];
  check(K == Kb && c.shape[0] == M && c.shape[1] == N, "matmul: shapes {}{} x {}{} -> {} do not agree",
        a.shape_str(), trans_a ? "^T" : "", b.shape_str(), trans_b ? "^T" : "", c.shape_str());
  check(a.dtype == b.dtype && (c.dtype == a.dtype || (a.dtype == DType::bf16 && c.dtype == DType::f32)),
        "matmul: dtypes ({}, {}) -> {} are not supported: a and b share one dtype, c has it too or is f32 "
        "for bf16 a and b",
        dtype_name(a.dtype), dtype_name(b.dtype), dtype_name(c.dtype));
  return {M, N, K};
}

/// Bytes currently held through a backend's allocate(), and the most ever held.
class AllocationLog {
 public:
  void allocated(void* p, size_t bytes) {
    sizes_[p] = bytes;
    held_ += bytes;
    peak_ = std::max(peak_, held_);
  }
  void released(void* p) {
    auto it = sizes_.find(p);
    if (it == sizes_.end()) return;
    held_ -= it->second;
    sizes_.erase(it);
  }
  size_t peak() const { return peak_; }

 private:
  std::unordered_map<void*, size_t> sizes_;
  size_t held_ = 0, peak_ = 0;
};

}  // namespace llmt
