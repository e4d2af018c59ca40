// The CPU backend: shape/dtype checks, then the templated kernels of src/kernels/cpu/.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "kernels/backend.h"
#include "kernels/backend_util.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"

namespace llmt {
namespace {

void check_float(const Tensor& t, const char* op) {
  check(t.dtype == DType::f32 || t.dtype == DType::f64, "{}: needs f32 or f64, got {}", op, dtype_name(t.dtype));
}

/// Calls f(T{}) with T = float or double according to the tensor's dtype.
template <typename F>
decltype(auto) dispatch(const Tensor& t, const char* op, F&& f) {
  check_float(t, op);
  if (t.dtype == DType::f64) return f(double{});
  return f(float{});
}

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }

  void* allocate(size_t bytes) override {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    check(p != nullptr, "cpu backend: out of memory allocating {} bytes", bytes);
    allocations_.allocated(p, bytes);
    return p;
  }
  void release(void* ptr) override {
    allocations_.released(ptr);
    std::free(ptr);
  }
  size_t peak_allocated_bytes() const override { return allocations_.peak(); }
  void fill_zero(const Tensor& t) override { std::memset(t.data, 0, t.bytes()); }
  void copy(const Tensor& src, const Tensor& dst) override {
    check_same(src, dst, "copy");
    if (src.data != dst.data) std::memcpy(dst.data, src.data, src.bytes());
  }
  void upload(const void* host, const Tensor& t) override { std::memcpy(t.data, host, t.bytes()); }
  void download(const Tensor& t, void* host) override { std::memcpy(host, t.data, t.bytes()); }

  void add(const Tensor& a, const Tensor& b, const Tensor& out) override {
    check_same(a, b, "add");
    check_same(a, out, "add");
    dispatch(a, "add", [&](auto zero) {
      using T = decltype(zero);
      const T* pa = a.as<T>();
      const T* pb = b.as<T>();
      T* po = out.as<T>();
      for (int64_t i = 0, n = a.numel(); i < n; ++i) po[i] = pa[i] + pb[i];
    });
  }
  double sum_squares(const Tensor& x) override {
    return dispatch(x, "sum_squares", [&](auto zero) {
      using T = decltype(zero);
      return cpu::sum_squares(x.as<T>(), x.numel());
    });
  }

  void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
              bool accumulate) override {
    const GemmDims d = matmul_dims(a, trans_a, b, trans_b, c);
    dispatch(a, "matmul", [&](auto zero) {
      using T = decltype(zero);
      cpu::gemm<T>(trans_a, trans_b, d.M, d.N, d.K, T(1), a.as<T>(), b.as<T>(), accumulate ? T(1) : T(0), c.as<T>());
    });
  }

  void embedding_fwd(const Tensor& ids, const Tensor& table, const Tensor& out) override {
    const int64_t dim = table.dim(-1);
    check(out.numel() == ids.numel() * dim, "embedding_fwd: out {} for {} ids of dim {}", out.shape_str(),
          ids.numel(), dim);
    dispatch(table, "embedding_fwd", [&](auto zero) {
      using T = decltype(zero);
      cpu::embedding_fwd<T>(ids.as<int32_t>(), ids.numel(), table.as<T>(), table.shape[0], dim, out.as<T>());
    });
  }
  void embedding_bwd(const Tensor& ids, const Tensor& dout, const Tensor& dtable) override {
    const int64_t dim = dtable.dim(-1);
    check(dout.numel() == ids.numel() * dim, "embedding_bwd: dout {} for {} ids", dout.shape_str(), ids.numel());
    dispatch(dtable, "embedding_bwd", [&](auto zero) {
      using T = decltype(zero);
      cpu::embedding_bwd<T>(ids.as<int32_t>(), ids.numel(), dout.as<T>(), dim, dtable.as<T>());
    });
  }

  void rmsnorm_fwd(const Tensor& x, const Tensor& w, double eps, const Tensor& y, const Tensor& rstd) override {
    const int64_t dim = w.numel(), rows = x.numel() / dim;
    check(x.numel() == rows * dim && rstd.numel() == rows, "rmsnorm_fwd: x {} w {} rstd {}", x.shape_str(),
          w.shape_str(), rstd.shape_str());
    check_same(x, y, "rmsnorm_fwd");
    dispatch(x, "rmsnorm_fwd", [&](auto zero) {
      using T = decltype(zero);
      cpu::rmsnorm_fwd<T>(x.as<T>(), w.as<T>(), rows, dim, eps, y.as<T>(), rstd.as<T>());
    });
  }
  void rmsnorm_bwd(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dx,
                   const Tensor& dw) override {
    const int64_t dim = w.numel(), rows = x.numel() / dim;
    check_same(dy, x, "rmsnorm_bwd");
    check_same(dx, x, "rmsnorm_bwd");
    check_same(dw, w, "rmsnorm_bwd");
    dispatch(x, "rmsnorm_bwd", [&](auto zero) {
      using T = decltype(zero);
      cpu::rmsnorm_bwd<T>(dy.as<T>(), x.as<T>(), w.as<T>(), rstd.as<T>(), rows, dim, dx.as<T>(), dw.as<T>());
    });
  }

  void rope_fwd(const Tensor& x, double theta) override { rope(x, theta, false); }
  void rope_bwd(const Tensor& dx, double theta) override { rope(dx, theta, true); }

  void attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, double scale, const Tensor& o,
                     const Tensor& lse) override {
    check(q.ndim == 4, "attention_fwd: q must be [B, T, H, Dh], got {}", q.shape_str());
    check_same(q, k, "attention_fwd");
    check_same(q, v, "attention_fwd");
    check_same(q, o, "attention_fwd");
    check(lse.numel() == q.shape[0] * q.shape[1] * q.shape[2], "attention_fwd: lse {}", lse.shape_str());
    dispatch(q, "attention_fwd", [&](auto zero) {
      using T = decltype(zero);
      cpu::attention_fwd<T>(q.as<T>(), k.as<T>(), v.as<T>(), q.shape[0], q.shape[1], q.shape[2], q.shape[3], scale,
                            o.as<T>(), lse.as<T>());
    });
  }
  void attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
                     const Tensor& dout, double scale, const Tensor& dq, const Tensor& dk,
                     const Tensor& dv) override {
    check(q.ndim == 4, "attention_bwd: q must be [B, T, H, Dh], got {}", q.shape_str());
    for (const Tensor* t : {&k, &v, &o, &dout, &dq, &dk, &dv}) check_same(q, *t, "attention_bwd");
    dispatch(q, "attention_bwd", [&](auto zero) {
      using T = decltype(zero);
      cpu::attention_bwd<T>(q.as<T>(), k.as<T>(), v.as<T>(), o.as<T>(), lse.as<T>(), dout.as<T>(), q.shape[0],
                            q.shape[1], q.shape[2], q.shape[3], scale, dq.as<T>(), dk.as<T>(), dv.as<T>());
    });
  }

  void swiglu_fwd(const Tensor& gate, const Tensor& up, const Tensor& h) override {
    check_same(gate, up, "swiglu_fwd");
    check_same(gate, h, "swiglu_fwd");
    dispatch(gate, "swiglu_fwd", [&](auto zero) {
      using T = decltype(zero);
      cpu::swiglu_fwd<T>(gate.as<T>(), up.as<T>(), gate.numel(), h.as<T>());
    });
  }
  void swiglu_bwd(const Tensor& gate, const Tensor& up, const Tensor& dh, const Tensor& dgate,
                  const Tensor& dup) override {
    for (const Tensor* t : {&up, &dh, &dgate, &dup}) check_same(gate, *t, "swiglu_bwd");
    dispatch(gate, "swiglu_bwd", [&](auto zero) {
      using T = decltype(zero);
      cpu::swiglu_bwd<T>(gate.as<T>(), up.as<T>(), dh.as<T>(), gate.numel(), dgate.as<T>(), dup.as<T>());
    });
  }

  double cross_entropy(const Tensor& logits, const Tensor& targets, double grad_scale,
                       const Tensor& losses) override {
    check(logits.ndim == 2 && targets.numel() == logits.shape[0] && losses.numel() == logits.shape[0],
          "cross_entropy: logits {} targets {} losses {}", logits.shape_str(), targets.shape_str(),
          losses.shape_str());
    return dispatch(logits, "cross_entropy", [&](auto zero) {
      using T = decltype(zero);
      return cpu::cross_entropy_fwd_bwd<T>(logits.as<T>(), targets.as<int32_t>(), logits.shape[0], logits.shape[1],
                                           grad_scale, losses.as<T>());
    });
  }

  void adamw_step(const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                  const AdamWParams& hp, double grad_scale, int64_t step) override {
    for (const Tensor* t : {&grads, &m, &v}) check_same(params, *t, "adamw_step");
    dispatch(params, "adamw_step", [&](auto zero) {
      using T = decltype(zero);
      cpu::adamw_step<T>(params.as<T>(), grads.as<T>(), m.as<T>(), v.as<T>(), params.numel(), hp.lr, hp.beta1,
                         hp.beta2, hp.eps, hp.weight_decay, grad_scale, step);
    });
  }

 private:
  AllocationLog allocations_;

  void rope(const Tensor& x, double theta, bool backward) {
    check(x.ndim == 4 && x.shape[3] % 2 == 0, "rope: x must be [B, T, H, Dh] with even Dh, got {}", x.shape_str());
    dispatch(x, "rope", [&](auto zero) {
      using T = decltype(zero);
      auto* fn = backward ? &cpu::rope_bwd<T> : &cpu::rope_fwd<T>;
      fn(x.as<T>(), x.shape[0], x.shape[1], x.shape[2], x.shape[3], theta);
    });
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace llmt
