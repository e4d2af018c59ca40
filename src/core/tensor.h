// Tensor views: a pointer, an element type and a shape (row-major, contiguous).
// A Tensor never owns memory; buffers (parameters, gradients, activations) own it and
// hand out views: parameters, gradients and optimizer moments each live in one flat buffer, and layers hold
// views into them (docs/ARCHITECTURE.md "Parameters").
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/error.h"

namespace llmt {

/// Element types of tensors. f64 is used by the CPU reference in tests; f32 is the CPU
/// training type, the master-weight and gradient type, and the residual stream's type;
/// bf16 (bfloat16: 8 exponent, 7 mantissa bits) is the CUDA backend's compute type for
/// matrix-product operands and most activations (docs/ARCHITECTURE.md "Mixed precision"); i32 holds
/// token ids.
enum class DType : uint8_t { f32, f64, i32, bf16 };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::f64: return 8;
    case DType::bf16: return 2;
    default: return 4;
  }
}
inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::i32: return "i32";
    case DType::bf16: return "bf16";
  }
  return "?";
}

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::i32; }

/// A non-owning, contiguous, row-major view of up to 4 dimensions.
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::f32;
  std::array<int64_t, 4> shape{};
  int ndim = 0;

  Tensor() = default;
  Tensor(void* data_, DType dtype_, std::initializer_list<int64_t> dims) : data(data_), dtype(dtype_) {
    check(dims.size() <= 4, "Tensor: at most 4 dimensions, got {}", dims.size());
    for (int64_t d : dims) shape[ndim++] = d;
  }

  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  int64_t dim(int i) const { return shape[i < 0 ? ndim + i : i]; }

  /// Typed pointer; throws when T does not match the view's dtype.
  template <typename T> T* as() const {
    check(dtype == dtype_of<T>(), "Tensor: accessed as {} but holds {}", dtype_name(dtype_of<T>()),
          dtype_name(dtype));
    return static_cast<T*>(data);
  }

  /// Elements [begin, end) of the (contiguous) view as a 1-D tensor; throws when the range is
  /// not within [0, numel()].
  Tensor range(int64_t begin, int64_t end) const {
    check(0 <= begin && begin <= end && end <= numel(), "Tensor::range: [{}, {}) is not within the {} elements",
          begin, end, numel());
    return Tensor(static_cast<char*>(data) + begin * static_cast<int64_t>(dtype_size(dtype)), dtype, {end - begin});
  }

  /// The same memory with another shape of the same element count.
  Tensor reshape(std::initializer_list<int64_t> dims) const {
    Tensor t(data, dtype, dims);
    check(t.numel() == numel(), "Tensor::reshape: {} elements cannot become {}", numel(), t.numel());
    return t;
  }

  std::string shape_str() const {
    std::string s = "[";
    for (int i = 0; i < ndim; ++i) s += (i ? "," : "") + std::to_string(shape[i]);
    return s + "]";
  }
};

}  // namespace llmt
