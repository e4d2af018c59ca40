// Scratch memory shared by all layers: temporaries that live only inside one layer's forward
// or backward call (backward products such as dq, dk, dv; a block's branch output). Every
// layer carves its temporaries from the same buffer, so their memory is paid once per model
// instead of once per layer.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>

#include "core/tensor.h"
#include "kernels/backend.h"

namespace llmt {

/// Hands out consecutive, 256-byte-aligned tensor views of a buffer. With a null base it
/// only counts (the views' data pointers are then not usable), so one function both sizes
/// and binds a layer's scratch.
class ScratchCarver {
 public:
  explicit ScratchCarver(void* base) : base_(static_cast<char*>(base)) {}
  Tensor take(DType dtype, std::initializer_list<int64_t> dims) {
    Tensor t(base_ ? base_ + used_ : nullptr, dtype, dims);
    used_ += (t.bytes() + 255) / 256 * 256;
    return t;
  }
  size_t used() const { return used_; }

 private:
  char* base_;
  size_t used_ = 0;
};

/// `t` as a matrix product wants it: t itself when `space` is empty (data == nullptr: the
/// compute dtype is t's own) or t already has space's dtype (a kernel wrote it so), else t
/// rounded into `space`'s memory and dtype (space must hold at least t.numel() elements),
/// shaped like t. Mixed precision: the layers keep an empty `space` when compute and master
/// dtypes agree.
inline Tensor converted(Backend& backend, const Tensor& t, const Tensor& space) {
  if (space.data == nullptr || t.dtype == space.dtype) return t;
  check(space.numel() >= t.numel(), "converted: {} elements do not fit in {}", t.numel(), space.shape_str());
  Tensor out = t;
  out.data = space.data;
  out.dtype = space.dtype;
  backend.convert(t, out);
  return out;
}

/// Calls bind(nullptr) to learn the bytes needed, allocates them on `backend`, then calls
/// bind(base) so the layers take their views; returns the buffer (keep it alive as long as
/// the views are used). `bind` returns the bytes it carved.
inline Buffer bind_scratch(Backend& backend, const std::function<size_t(void* base)>& bind) {
  Buffer buffer(backend, bind(nullptr));
  bind(buffer.data());
  return buffer;
}

}  // namespace llmt
