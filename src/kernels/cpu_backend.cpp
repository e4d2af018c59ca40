// The CPU backend: shape/dtype checks, then the templated kernels of src/kernels/cpu/.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "kernels/backend.h"
#include "kernels/backend_util.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/comba.h"
#include "kernels/cpu/comba_gates.h"
#include "kernels/cpu/delta_gates.h"
#include "kernels/cpu/gated_rmsnorm.h"
#include "kernels/cpu/gdn.h"
#include "kernels/cpu/kda.h"
#include "kernels/cpu/l2norm.h"
#include "kernels/cpu/mamba2.h"
#include "kernels/cpu/mamba3_layer.h"
#include "kernels/cpu/mdn.h"
#include "kernels/cpu/mdn_gates.h"
#include "kernels/cpu/short_conv.h"
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

/// The cores here take their inputs `in` (named `names`) in f32 or f64 only: bf16 inputs (the CUDA backend's, with
/// compute bf16) throw naming the op.
void refuse_bf16(std::initializer_list<const Tensor*> in, const char* names, const char* op) {
  for (const Tensor* t : in)
    check(t->dtype != DType::bf16, "{}: the cpu backend takes {} in f32 or f64, got bf16 (bf16 inputs need the "
          "cuda backend with compute bf16)", op, names);
}
/// refuse_bf16 of the GDN / Comba cores' q, k, v (p).
void refuse_bf16_inputs(std::initializer_list<const Tensor*> in, const char* op) {
  refuse_bf16(in, in.size() == 4 ? "q, k, v, p" : "q, k, v", op);
}

/// The typed pointers of a Mamba3Params (nullptr for the absent ones) as Out = cpu::Mamba3LayerParams<T>
/// (parameters) or cpu::Mamba3LayerGrads<T> (their gradients).
template <typename Out, typename T>
Out mamba3_ptrs(const Backend::Mamba3Params& p) {
  const auto ptr = [](const Tensor& t) { return t.data ? t.as<T>() : static_cast<T*>(nullptr); };
  return {{ptr(p.dt_bias), ptr(p.B_bias), ptr(p.C_bias), ptr(p.B_norm), ptr(p.C_norm)},
          ptr(p.D), ptr(p.mimo_x), ptr(p.mimo_z), ptr(p.mimo_o), ptr(p.norm)};
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
  void convert(const Tensor& src, const Tensor& dst) override {
    check(src.numel() == dst.numel(), "convert: size mismatch ({} vs {})", src.shape_str(), dst.shape_str());
    if (src.dtype == dst.dtype) return copy(src, dst);
    dispatch(src, "convert", [&](auto zero_src) {
      dispatch(dst, "convert", [&](auto zero_dst) {
        using S = decltype(zero_src);
        using D = decltype(zero_dst);
        const S* ps = src.as<S>();
        D* pd = dst.as<D>();
        for (int64_t i = 0, n = src.numel(); i < n; ++i) pd[i] = static_cast<D>(ps[i]);
      });
    });
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

  double sum(const Tensor& x) override {
    return dispatch(x, "sum", [&](auto zero) {
      using T = decltype(zero);
      const T* p = x.as<T>();
      double s = 0.0;
      for (int64_t i = 0, n = x.numel(); i < n; ++i) s += static_cast<double>(p[i]);
      return s;
    });
  }

  void matmul_strided(const Tensor& a, int64_t lda, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
                      int64_t ldc, bool accumulate) override {
    const GemmDims d = matmul_dims(a, trans_a, b, trans_b, c);
    dispatch(a, "matmul", [&](auto zero) {
      using T = decltype(zero);
      cpu::gemm<T>(trans_a, trans_b, d.M, d.N, d.K, T(1), a.as<T>(), b.as<T>(), accumulate ? T(1) : T(0), c.as<T>(),
                   lda, ldc);
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
  void add_rmsnorm_fwd(const Tensor& x, const Tensor& branch, const Tensor& w, double eps, const Tensor& h,
                       const Tensor& y, const Tensor& rstd) override {
    const int64_t dim = w.numel(), rows = x.numel() / dim;
    check(x.numel() == rows * dim && rstd.numel() == rows, "add_rmsnorm_fwd: x {} w {} rstd {}", x.shape_str(),
          w.shape_str(), rstd.shape_str());
    for (const Tensor* t : {&branch, &h, &y}) check_same(x, *t, "add_rmsnorm_fwd");
    dispatch(x, "add_rmsnorm_fwd", [&](auto zero) {
      using T = decltype(zero);
      cpu::add_rmsnorm_fwd<T>(x.as<T>(), branch.as<T>(), w.as<T>(), rows, dim, eps, h.as<T>(), y.as<T>(),
                              rstd.as<T>());
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

  void cross_entropy_strided(const Tensor& logits, int64_t ld, const Tensor& targets, double grad_scale,
                             const Tensor& losses, const Tensor& correct) override {
    check(logits.ndim == 2 && targets.numel() == logits.shape[0] && losses.numel() == logits.shape[0],
          "cross_entropy: logits {} targets {} losses {}", logits.shape_str(), targets.shape_str(),
          losses.shape_str());
    check(losses.dtype == logits.dtype, "cross_entropy: losses {} for logits {}", dtype_name(losses.dtype),
          dtype_name(logits.dtype));
    if (correct.data != nullptr)
      check(correct.dtype == losses.dtype && correct.numel() == losses.numel(), "cross_entropy: correct {} {} for losses {} {}",
            dtype_name(correct.dtype), correct.shape_str(), dtype_name(losses.dtype), losses.shape_str());
    dispatch(logits, "cross_entropy", [&](auto zero) {
      using T = decltype(zero);
      cpu::cross_entropy_fwd_bwd<T>(logits.as<T>(), targets.as<int32_t>(), logits.shape[0], logits.shape[1],
                                    grad_scale, losses.as<T>(), correct.data != nullptr ? correct.as<T>() : nullptr, ld);
    });
  }

  void adamw_step(const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                  const AdamWParams& hp, double grad_scale, int64_t step, const Tensor& working) override {
    for (const Tensor* t : {&grads, &m, &v}) check_same(params, *t, "adamw_step");
    dispatch(params, "adamw_step", [&](auto zero) {
      using T = decltype(zero);
      cpu::adamw_step<T>(params.as<T>(), grads.as<T>(), m.as<T>(), v.as<T>(), params.numel(), hp.lr, hp.beta1,
                         hp.beta2, hp.eps, hp.weight_decay, grad_scale, step);
    });
    if (working.data != nullptr) convert(params, working);
  }

  // ---- delta-rule layers ----
  void short_conv_silu_fwd(const Tensor& x, const Tensor& w, const Tensor& pre, const Tensor& y) override {
    check(x.ndim == 3 && w.ndim == 3 && w.shape[0] == x.shape[2] && w.shape[1] == 1,
          "short_conv_silu_fwd: x must be [B, T, C] and w [C, 1, W], got {} and {}", x.shape_str(), w.shape_str());
    check_same(x, pre, "short_conv_silu_fwd");
    check_same(x, y, "short_conv_silu_fwd");
    dispatch(x, "short_conv_silu_fwd", [&](auto zero) {
      using T = decltype(zero);
      cpu::short_conv_silu_fwd<T>(x.as<T>(), w.as<T>(), x.shape[0], x.shape[1], x.shape[2], w.shape[2], pre.as<T>(),
                                  y.as<T>());
    });
  }
  void short_conv_silu_bwd(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& pre, const Tensor& dx,
                           const Tensor& dw) override {
    check(x.ndim == 3 && w.ndim == 3 && w.shape[0] == x.shape[2], "short_conv_silu_bwd: x {} w {}", x.shape_str(),
          w.shape_str());
    for (const Tensor* t : {&dy, &pre, &dx}) check_same(x, *t, "short_conv_silu_bwd");
    check_same(w, dw, "short_conv_silu_bwd");
    dispatch(x, "short_conv_silu_bwd", [&](auto zero) {
      using T = decltype(zero);
      cpu::short_conv_silu_bwd<T>(dy.as<T>(), x.as<T>(), w.as<T>(), pre.as<T>(), x.shape[0], x.shape[1], x.shape[2],
                                  w.shape[2], dx.as<T>(), dw.as<T>());
    });
  }
  // ---- Mamba2 ----
  void conv_bias_silu_fwd(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& pre,
                          const Tensor& y) override {
    check(x.ndim == 3 && w.ndim == 3 && w.shape[0] == x.shape[2] && w.shape[1] == 1 && bias.numel() == x.shape[2],
          "conv_bias_silu_fwd: x must be [B, T, C], w [C, 1, W] and bias [C], got {}, {} and {}", x.shape_str(),
          w.shape_str(), bias.shape_str());
    check_same(x, pre, "conv_bias_silu_fwd");
    check_same(x, y, "conv_bias_silu_fwd");
    dispatch(x, "conv_bias_silu_fwd", [&](auto zero) {
      using T = decltype(zero);
      cpu::short_conv_silu_fwd<T>(x.as<T>(), w.as<T>(), x.shape[0], x.shape[1], x.shape[2], w.shape[2], pre.as<T>(),
                                  y.as<T>(), bias.as<T>());
    });
  }
  void conv_bias_silu_bwd(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& pre, const Tensor& dx,
                          const Tensor& dw, const Tensor& dbias) override {
    check(x.ndim == 3 && w.ndim == 3 && w.shape[0] == x.shape[2] && dbias.numel() == x.shape[2],
          "conv_bias_silu_bwd: x {} w {} dbias {}", x.shape_str(), w.shape_str(), dbias.shape_str());
    for (const Tensor* t : {&dy, &pre, &dx}) check_same(x, *t, "conv_bias_silu_bwd");
    check_same(w, dw, "conv_bias_silu_bwd");
    dispatch(x, "conv_bias_silu_bwd", [&](auto zero) {
      using T = decltype(zero);
      cpu::short_conv_silu_bwd<T>(dy.as<T>(), x.as<T>(), w.as<T>(), pre.as<T>(), x.shape[0], x.shape[1], x.shape[2],
                                  w.shape[2], dx.as<T>(), dw.as<T>(), dbias.as<T>());
    });
  }
  void gate_rmsnorm_fwd(const Tensor& y, const Tensor& z, const Tensor& w, double eps, const Tensor& out,
                        const Tensor& rstd) override {
    const int64_t dim = w.numel(), rows = gate_norm_rows(y, z, w, rstd, "gate_rmsnorm_fwd");
    check_same(y, out, "gate_rmsnorm_fwd");
    dispatch(y, "gate_rmsnorm_fwd", [&](auto zero) {
      using T = decltype(zero);
      cpu::gate_rmsnorm_fwd<T>(y.as<T>(), z.as<T>(), w.as<T>(), rows, dim, eps, out.as<T>(), rstd.as<T>());
    });
  }
  void gate_rmsnorm_bwd(const Tensor& dout, const Tensor& y, const Tensor& z, const Tensor& w, const Tensor& rstd,
                        const Tensor& dy, const Tensor& dz, const Tensor& dw) override {
    const int64_t dim = w.numel(), rows = gate_norm_rows(y, z, w, rstd, "gate_rmsnorm_bwd");
    for (const Tensor* t : {&dout, &dy, &dz}) check_same(y, *t, "gate_rmsnorm_bwd");
    check_same(w, dw, "gate_rmsnorm_bwd");
    dispatch(y, "gate_rmsnorm_bwd", [&](auto zero) {
      using T = decltype(zero);
      cpu::gate_rmsnorm_bwd<T>(dout.as<T>(), y.as<T>(), z.as<T>(), w.as<T>(), rstd.as<T>(), rows, dim, dy.as<T>(),
                               dz.as<T>(), dw.as<T>());
    });
  }
  // `saved` is ignored: this backend keeps nothing from the forward (mamba2_saved_numel 0; the backward recomputes
  // in double).
  void mamba2_ssd_fwd(const Tensor& xbc, const Tensor& dt_raw, const Tensor& dt_bias, const Tensor& A_log,
                      const Tensor& D, int64_t head_dim, int64_t n_groups, int64_t chunk_size, DType, const Tensor& y,
                      const Tensor&) override {
    refuse_bf16({&xbc}, "xbc", "mamba2_ssd_fwd");
    const cpu::Mamba2Dims d = mamba2_dims(xbc, dt_raw, dt_bias, A_log, D, head_dim, n_groups, y, "mamba2_ssd_fwd");
    dispatch(xbc, "mamba2_ssd_fwd", [&](auto zero) {
      using T = decltype(zero);
      cpu::mamba2_ssd_fwd<T>(xbc.as<T>(), dt_raw.as<T>(), dt_bias.as<T>(), A_log.as<T>(), D.as<T>(), d, chunk_size,
                             y.as<T>());
    });
  }
  void mamba2_ssd_bwd(const Tensor& dy, const Tensor& xbc, const Tensor& dt_raw, const Tensor& dt_bias,
                      const Tensor& A_log, const Tensor& D, const Tensor&, int64_t head_dim, int64_t n_groups,
                      int64_t chunk_size, DType, const Tensor& dxbc, const Tensor& ddt_raw, const Tensor& ddt_bias,
                      const Tensor& dA_log, const Tensor& dD) override {
    refuse_bf16({&dy, &xbc}, "dy, xbc", "mamba2_ssd_bwd");
    const cpu::Mamba2Dims d = mamba2_dims(xbc, dt_raw, dt_bias, A_log, D, head_dim, n_groups, dy, "mamba2_ssd_bwd");
    check_same(xbc, dxbc, "mamba2_ssd_bwd");
    check_same(dt_raw, ddt_raw, "mamba2_ssd_bwd");
    for (const Tensor* t : {&ddt_bias, &dA_log, &dD}) check_same(D, *t, "mamba2_ssd_bwd");
    dispatch(xbc, "mamba2_ssd_bwd", [&](auto zero) {
      using T = decltype(zero);
      cpu::mamba2_ssd_bwd<T>(dy.as<T>(), xbc.as<T>(), dt_raw.as<T>(), dt_bias.as<T>(), A_log.as<T>(), D.as<T>(), d,
                             chunk_size, dxbc.as<T>(), ddt_raw.as<T>(), ddt_bias.as<T>(), dA_log.as<T>(), dD.as<T>());
    });
  }

  // `saved` is ignored: this backend keeps nothing from the forward (mamba3_saved_numel 0; the backward recomputes
  // in double).
  void mamba3_fwd(const Tensor& x, const Tensor& z, const Tensor& bc, const Tensor& raw, const Mamba3Params& params,
                  const Mamba3Options& opt, const Tensor& out, const Tensor&) override {
    const cpu::Mamba3LayerDims d = mamba3_dims(x, z, bc, raw, params, opt, out, "mamba3_fwd");
    dispatch(x, "mamba3_fwd", [&](auto zero) {
      using T = decltype(zero);
      const auto prm = mamba3_ptrs<cpu::Mamba3LayerParams<T>, T>(params);
      cpu::mamba3_layer_fwd<T>(x.as<T>(), z.as<T>(), bc.as<T>(), raw.as<T>(), prm, d, opt, out.as<T>());
    });
  }
  void mamba3_bwd(const Tensor& dout, const Tensor& x, const Tensor& z, const Tensor& bc, const Tensor& raw,
                  const Tensor&, const Mamba3Params& params, const Mamba3Options& opt, const Tensor& dx,
                  const Tensor& dz, const Tensor& dbc, const Tensor& draw, const Mamba3Params& dparams) override {
    const cpu::Mamba3LayerDims d = mamba3_dims(x, z, bc, raw, params, opt, dout, "mamba3_bwd");
    mamba3_dims(dx, dz, dbc, draw, dparams, opt, dout, "mamba3_bwd (gradients)");
    dispatch(x, "mamba3_bwd", [&](auto zero) {
      using T = decltype(zero);
      const auto prm = mamba3_ptrs<cpu::Mamba3LayerParams<T>, T>(params);
      const auto grd = mamba3_ptrs<cpu::Mamba3LayerGrads<T>, T>(dparams);
      cpu::mamba3_layer_bwd<T>(dout.as<T>(), x.as<T>(), z.as<T>(), bc.as<T>(), raw.as<T>(), prm, d, opt, dx.as<T>(),
                               dz.as<T>(), dbc.as<T>(), draw.as<T>(), grd);
    });
  }

  void l2norm_fwd(const Tensor& x, int64_t dim, double eps, double scale, const Tensor& y,
                  const Tensor& rinv) override {
    const int64_t rows = x.numel() / dim;
    check(rows * dim == x.numel() && rinv.numel() == rows, "l2norm_fwd: x {} dim {} rinv {}", x.shape_str(), dim,
          rinv.shape_str());
    check_same(x, y, "l2norm_fwd");
    dispatch(x, "l2norm_fwd", [&](auto zero) {
      using T = decltype(zero);
      cpu::l2norm_fwd<T>(x.as<T>(), rows, dim, eps, scale, y.as<T>(), rinv.as<T>());
    });
  }
  void l2norm_bwd(const Tensor& dy, const Tensor& x, const Tensor& rinv, int64_t dim, double scale,
                  const Tensor& dx) override {
    const int64_t rows = x.numel() / dim;
    check(rows * dim == x.numel() && rinv.numel() == rows, "l2norm_bwd: x {} dim {} rinv {}", x.shape_str(), dim,
          rinv.shape_str());
    check_same(x, dy, "l2norm_bwd");
    check_same(x, dx, "l2norm_bwd");
    dispatch(x, "l2norm_bwd", [&](auto zero) {
      using T = decltype(zero);
      cpu::l2norm_bwd<T>(dy.as<T>(), x.as<T>(), rinv.as<T>(), rows, dim, scale, dx.as<T>());
    });
  }
  void gated_rmsnorm_fwd(const Tensor& o, const Tensor& z, const Tensor& w, double eps, bool sigmoid_gate,
                         const Tensor& y, const Tensor& rstd) override {
    const int64_t dim = w.numel(), rows = o.numel() / dim;
    check(rows * dim == o.numel() && rstd.numel() == rows, "gated_rmsnorm_fwd: o {} w {} rstd {}", o.shape_str(),
          w.shape_str(), rstd.shape_str());
    check_same(o, z, "gated_rmsnorm_fwd");
    check_same(o, y, "gated_rmsnorm_fwd");
    dispatch(o, "gated_rmsnorm_fwd", [&](auto zero) {
      using T = decltype(zero);
      cpu::gated_rmsnorm_fwd<T>(o.as<T>(), z.as<T>(), w.as<T>(), rows, dim, eps, sigmoid_gate, y.as<T>(),
                                rstd.as<T>());
    });
  }
  void gated_rmsnorm_bwd(const Tensor& dy, const Tensor& o, const Tensor& z, const Tensor& w, const Tensor& rstd,
                         bool sigmoid_gate, const Tensor& d_o, const Tensor& dz, const Tensor& dw) override {
    const int64_t dim = w.numel(), rows = o.numel() / dim;
    check(rows * dim == o.numel() && rstd.numel() == rows, "gated_rmsnorm_bwd: o {} w {}", o.shape_str(),
          w.shape_str());
    for (const Tensor* t : {&dy, &z, &d_o, &dz}) check_same(o, *t, "gated_rmsnorm_bwd");
    check_same(w, dw, "gated_rmsnorm_bwd");
    dispatch(o, "gated_rmsnorm_bwd", [&](auto zero) {
      using T = decltype(zero);
      cpu::gated_rmsnorm_bwd<T>(dy.as<T>(), o.as<T>(), z.as<T>(), w.as<T>(), rstd.as<T>(), rows, dim, sigmoid_gate,
                                d_o.as<T>(), dz.as<T>(), dw.as<T>());
    });
  }
  void gdn_gates_fwd(const Tensor& a, const Tensor& b, const Tensor& A_log, const Tensor& dt_bias, const Tensor& g,
                     const Tensor& beta) override {
    gates_fwd(a, b, A_log, dt_bias, g, beta, "gdn_gates_fwd");
  }
  void gdn_gates_bwd(const Tensor& dg, const Tensor& dbeta, const Tensor& a, const Tensor& b, const Tensor& A_log,
                     const Tensor& dt_bias, const Tensor& da, const Tensor& db, const Tensor& dA_log,
                     const Tensor& ddt_bias) override {
    gates_bwd(dg, dbeta, a, b, A_log, dt_bias, da, db, dA_log, ddt_bias, "gdn_gates_bwd");
  }
  void kda_gates_fwd(const Tensor& f, const Tensor& b, const Tensor& A_log, const Tensor& dt_bias, const Tensor& g,
                     const Tensor& beta) override {
    gates_fwd(f, b, A_log, dt_bias, g, beta, "kda_gates_fwd");
  }
  void kda_gates_bwd(const Tensor& dg, const Tensor& dbeta, const Tensor& f, const Tensor& b, const Tensor& A_log,
                     const Tensor& dt_bias, const Tensor& df, const Tensor& db, const Tensor& dA_log,
                     const Tensor& ddt_bias) override {
    gates_bwd(dg, dbeta, f, b, A_log, dt_bias, df, db, dA_log, ddt_bias, "kda_gates_bwd");
  }
  // `saved` is ignored: this backend keeps nothing from the forward (gdn_saved_numel 0; the backward recomputes in
  // double). The same for comba_chunk_fwd / bwd.
  void gdn_chunk_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                     int64_t chunk_size, DType /*compute*/, const Tensor& o, const Tensor& /*saved*/) override {
    refuse_bf16_inputs({&q, &k, &v}, "gdn_chunk_fwd");
    const cpu::DeltaDims d = cpu_dims(delta_fwd_dims(q, {&k}, v, g, beta, o, false, "gdn_chunk_fwd"));
    dispatch(q, "gdn_chunk_fwd", [&](auto zero) {
      using T = decltype(zero);
      const cpu::GdnInputs<T> in{q.as<T>(), k.as<T>(), v.as<T>(), g.as<T>(), beta.as<T>(), nullptr};
      cpu::gdn_chunk_fwd<T>(in, d, o.as<T>(), nullptr, chunk_size);
    });
  }
  void gdn_chunk_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                     const Tensor& d_o, const Tensor& /*saved*/, int64_t chunk_size, DType /*compute*/,
                     const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dg,
                     const Tensor& dbeta) override {
    refuse_bf16_inputs({&q, &k, &v}, "gdn_chunk_bwd");
    const cpu::DeltaDims d =
        cpu_dims(delta_bwd_dims(q, {&k, &dq, &dk}, v, g, beta, d_o, dv, dg, dbeta, false, "gdn_chunk_bwd"));
    dispatch(q, "gdn_chunk_bwd", [&](auto zero) {
      using T = decltype(zero);
      const cpu::GdnInputs<T> in{q.as<T>(), k.as<T>(), v.as<T>(), g.as<T>(), beta.as<T>(), nullptr};
      const cpu::GdnGrads<T> grads{dq.as<T>(), dk.as<T>(), dv.as<T>(), dg.as<T>(), dbeta.as<T>(), nullptr};
      cpu::gdn_chunk_bwd<T>(in, d_o.as<T>(), nullptr, d, grads, chunk_size);
    });
  }
  void comba_gates_fwd(const Tensor& q, const Tensor& k, const Tensor& decay, const Tensor& D, const Tensor& q_out,
                       const Tensor& p) override {
    const int64_t heads = comba_gate_heads(q, decay, D, "comba_gates_fwd");
    for (const Tensor* t : {&k, &q_out, &p}) check_same(q, *t, "comba_gates_fwd");
    const int64_t rows = q.shape[0], dim = q.shape[1] / heads;
    dispatch(q, "comba_gates_fwd", [&](auto zero) {
      using T = decltype(zero);
      cpu::comba_gates_fwd<T>(q.as<T>(), k.as<T>(), optional<T>(decay), optional<T>(D), rows, heads, dim,
                              q_out.as<T>(), p.as<T>());
    });
  }
  void comba_gates_bwd(const Tensor& dq_out, const Tensor& dp, const Tensor& k, const Tensor& decay, const Tensor& D,
                       const Tensor& dk, const Tensor& ddecay, const Tensor& dD) override {
    const int64_t heads = comba_gate_heads(k, decay, D, "comba_gates_bwd");
    for (const Tensor* t : {&dq_out, &dp, &dk}) check_same(k, *t, "comba_gates_bwd");
    if (decay.data != nullptr) check_same(decay, ddecay, "comba_gates_bwd");
    if (D.data != nullptr) check_same(D, dD, "comba_gates_bwd");
    const int64_t rows = k.shape[0], dim = k.shape[1] / heads;
    dispatch(k, "comba_gates_bwd", [&](auto zero) {
      using T = decltype(zero);
      cpu::comba_gates_bwd<T>(dq_out.as<T>(), dp.as<T>(), k.as<T>(), optional<T>(decay), optional<T>(D), rows, heads,
                              dim, dk.as<T>(), decay.data != nullptr ? ddecay.as<T>() : nullptr,
                              D.data != nullptr ? dD.as<T>() : nullptr);
    });
  }
  void comba_chunk_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& p, const Tensor& g,
                       const Tensor& beta, int64_t chunk_size, DType /*compute*/, const Tensor& o,
                       const Tensor& /*saved*/) override {
    refuse_bf16_inputs({&q, &k, &v, &p}, "comba_chunk_fwd");
    const cpu::DeltaDims d = cpu_dims(delta_fwd_dims(q, {&k, &p}, v, g, beta, o, false, "comba_chunk_fwd"));
    dispatch(q, "comba_chunk_fwd", [&](auto zero) {
      using T = decltype(zero);
      const cpu::CombaInputs<T> in{q.as<T>(), k.as<T>(), v.as<T>(), p.as<T>(), g.as<T>(), beta.as<T>(), nullptr};
      cpu::comba_chunk_fwd<T>(in, d, o.as<T>(), nullptr, chunk_size);
    });
  }
  void comba_chunk_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& p, const Tensor& g,
                       const Tensor& beta, const Tensor& d_o, const Tensor& /*saved*/, int64_t chunk_size,
                       DType /*compute*/, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dp,
                       const Tensor& dg, const Tensor& dbeta) override {
    refuse_bf16_inputs({&q, &k, &v, &p}, "comba_chunk_bwd");
    const cpu::DeltaDims d =
        cpu_dims(delta_bwd_dims(q, {&k, &p, &dq, &dk, &dp}, v, g, beta, d_o, dv, dg, dbeta, false, "comba_chunk_bwd"));
    dispatch(q, "comba_chunk_bwd", [&](auto zero) {
      using T = decltype(zero);
      const cpu::CombaInputs<T> in{q.as<T>(), k.as<T>(), v.as<T>(), p.as<T>(), g.as<T>(), beta.as<T>(), nullptr};
      const cpu::CombaGrads<T> grads{dq.as<T>(), dk.as<T>(), dv.as<T>(), dp.as<T>(), dg.as<T>(), dbeta.as<T>(),
                                     nullptr};
      cpu::comba_chunk_bwd<T>(in, d_o.as<T>(), nullptr, d, grads, chunk_size);
    });
  }

  // `saved` is ignored, as gdn_chunk_fwd's (kda_saved_numel 0).
  void kda_chunk_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                     int64_t chunk_size, DType /*compute*/, const Tensor& o, const Tensor& /*saved*/) override {
    const cpu::DeltaDims d = cpu_dims(delta_fwd_dims(q, {&k}, v, g, beta, o, true, "kda_chunk_fwd"));
    dispatch(q, "kda_chunk_fwd", [&](auto zero) {
      using T = decltype(zero);
      const cpu::KdaInputs<T> in{q.as<T>(), k.as<T>(), v.as<T>(), g.as<T>(), beta.as<T>(), nullptr};
      cpu::kda_chunk_fwd<T>(in, d, o.as<T>(), nullptr, chunk_size);
    });
  }
  void kda_chunk_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                     const Tensor& d_o, const Tensor& /*saved*/, int64_t chunk_size, DType /*compute*/, const Tensor& dq,
                     const Tensor& dk, const Tensor& dv, const Tensor& dg, const Tensor& dbeta) override {
    const cpu::DeltaDims d =
        cpu_dims(delta_bwd_dims(q, {&k, &dq, &dk}, v, g, beta, d_o, dv, dg, dbeta, true, "kda_chunk_bwd"));
    dispatch(q, "kda_chunk_bwd", [&](auto zero) {
      using T = decltype(zero);
      const cpu::KdaInputs<T> in{q.as<T>(), k.as<T>(), v.as<T>(), g.as<T>(), beta.as<T>(), nullptr};
      const cpu::KdaGrads<T> grads{dq.as<T>(), dk.as<T>(), dv.as<T>(), dg.as<T>(), dbeta.as<T>(), nullptr};
      cpu::kda_chunk_bwd<T>(in, d_o.as<T>(), nullptr, d, grads, chunk_size);
    });
  }

  void mdn_gates_fwd(const Tensor& z_alpha, const Tensor& z_beta, const Tensor& z_mu, const Tensor& z_eta,
                     const MdnGateParams& p, const MdnGateOptions& opt, const Tensor& log_alpha, const Tensor& beta,
                     const Tensor& log_mu, const Tensor& eta) override {
    const int64_t heads = mdn_gate_heads(z_alpha, z_mu, z_eta, p, opt, "mdn_gates_fwd");
    for (const Tensor* t : {&z_beta, &log_alpha, &beta, &log_mu, &eta}) check_same(z_alpha, *t, "mdn_gates_fwd");
    dispatch(z_alpha, "mdn_gates_fwd", [&](auto zero) {
      using T = decltype(zero);
      cpu::mdn_gates_fwd<T>(z_alpha.as<T>(), z_beta.as<T>(), optional<T>(z_mu), optional<T>(z_eta), p.A_log.as<T>(),
                            p.dt_bias.as<T>(), optional<T>(p.Mu_log), optional<T>(p.mu_bias), p.log_factor.as<T>(),
                            z_alpha.shape[0], heads, opt, log_alpha.as<T>(), beta.as<T>(), log_mu.as<T>(),
                            eta.as<T>());
    });
  }
  void mdn_gates_bwd(const Tensor& d_log_alpha, const Tensor& d_beta, const Tensor& d_log_mu, const Tensor& d_eta,
                     const Tensor& z_alpha, const Tensor& z_beta, const Tensor& z_mu, const Tensor& z_eta,
                     const MdnGateParams& p, const MdnGateOptions& opt, const Tensor& dz_alpha, const Tensor& dz_beta,
                     const Tensor& dz_mu, const Tensor& dz_eta, const MdnGateParams& dp) override {
    const int64_t heads = mdn_gate_heads(z_alpha, z_mu, z_eta, p, opt, "mdn_gates_bwd");
    for (const Tensor* t : {&z_beta, &d_log_alpha, &d_beta, &dz_alpha, &dz_beta}) check_same(z_alpha, *t, "mdn_gates_bwd");
    for (auto [a, b] : {std::pair{&p.A_log, &dp.A_log}, {&p.dt_bias, &dp.dt_bias}, {&p.log_factor, &dp.log_factor}})
      check_same(*a, *b, "mdn_gates_bwd");
    if (opt.momentum) {
      for (const Tensor* t : {&d_log_mu, &d_eta, &dz_mu, &dz_eta}) check_same(z_alpha, *t, "mdn_gates_bwd");
      check_same(p.Mu_log, dp.Mu_log, "mdn_gates_bwd");
      check_same(p.mu_bias, dp.mu_bias, "mdn_gates_bwd");
    }
    dispatch(z_alpha, "mdn_gates_bwd", [&](auto zero) {
      using T = decltype(zero);
      cpu::mdn_gates_bwd<T>(d_log_alpha.as<T>(), d_beta.as<T>(), optional<T>(d_log_mu), optional<T>(d_eta),
                            z_alpha.as<T>(), z_beta.as<T>(), optional<T>(z_mu), optional<T>(z_eta), p.A_log.as<T>(),
                            p.dt_bias.as<T>(), optional<T>(p.Mu_log), optional<T>(p.mu_bias), p.log_factor.as<T>(),
                            z_alpha.shape[0], heads, opt, dz_alpha.as<T>(), dz_beta.as<T>(), mutable_or_null<T>(dz_mu),
                            mutable_or_null<T>(dz_eta), dp.A_log.as<T>(), dp.dt_bias.as<T>(),
                            mutable_or_null<T>(dp.Mu_log), mutable_or_null<T>(dp.mu_bias), dp.log_factor.as<T>());
    });
  }
  void mdn_correction_fwd(const Tensor& q, const Tensor& k, const Tensor& D_log, const Tensor& q_out) override {
    const int64_t heads = mdn_correction_heads(q, D_log, "mdn_correction_fwd");
    check_same(q, k, "mdn_correction_fwd");
    check_same(q, q_out, "mdn_correction_fwd");
    dispatch(q, "mdn_correction_fwd", [&](auto zero) {
      using T = decltype(zero);
      cpu::mdn_correction_fwd<T>(q.as<T>(), k.as<T>(), D_log.as<T>(), q.shape[0], heads, q.shape[1] / heads,
                                 q_out.as<T>());
    });
  }
  void mdn_correction_bwd(const Tensor& dq_out, const Tensor& k, const Tensor& D_log, const Tensor& dk,
                          const Tensor& dD_log) override {
    const int64_t heads = mdn_correction_heads(k, D_log, "mdn_correction_bwd");
    check_same(k, dq_out, "mdn_correction_bwd");
    check_same(k, dk, "mdn_correction_bwd");
    check_same(D_log, dD_log, "mdn_correction_bwd");
    dispatch(k, "mdn_correction_bwd", [&](auto zero) {
      using T = decltype(zero);
      cpu::mdn_correction_bwd<T>(dq_out.as<T>(), k.as<T>(), D_log.as<T>(), k.shape[0], heads, k.shape[1] / heads,
                                 dk.as<T>(), dD_log.as<T>());
    });
  }
  void mdn_chunk_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& log_alpha, const Tensor& beta,
                     const Tensor& log_mu, const Tensor& eta, int64_t chunk_size, DType, const Tensor& o,
                     const Tensor& residuals) override {
    const cpu::DeltaDims d = delta_dims(q, v, log_alpha, beta, false, "mdn_chunk_fwd");
    check_same(v, o, "mdn_chunk_fwd");
    if (residuals.data != nullptr) check_same(v, residuals, "mdn_chunk_fwd");
    check_same(q, k, "mdn_chunk_fwd");
    for (const Tensor* t : {&beta, &log_mu, &eta}) check_same(log_alpha, *t, "mdn_chunk_fwd");
    dispatch(q, "mdn_chunk_fwd", [&](auto zero) {
      using T = decltype(zero);
      const cpu::MdnInputs<T> in{q.as<T>(),    k.as<T>(),      v.as<T>(),   log_alpha.as<T>(), beta.as<T>(),
                                 log_mu.as<T>(), eta.as<T>(), nullptr,     nullptr};
      cpu::mdn_chunk_fwd<T>(in, d, o.as<T>(), nullptr, nullptr, chunk_size,
                            residuals.data != nullptr ? residuals.as<T>() : nullptr);
    });
  }
  // The reference recomputes Ṽ in double whether or not `residuals` holds the forward's (backend.h).
  void mdn_chunk_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& log_alpha, const Tensor& beta,
                     const Tensor& log_mu, const Tensor& eta, const Tensor& d_o, const Tensor& residuals,
                     int64_t chunk_size, DType, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                     const Tensor& dlog_alpha, const Tensor& dbeta, const Tensor& dlog_mu,
                     const Tensor& deta) override {
    const cpu::DeltaDims d = delta_dims(q, v, log_alpha, beta, false, "mdn_chunk_bwd");
    for (const Tensor* t : {&k, &dq, &dk}) check_same(q, *t, "mdn_chunk_bwd");
    for (const Tensor* t : {&d_o, &dv}) check_same(v, *t, "mdn_chunk_bwd");
    if (residuals.data != nullptr) check_same(v, residuals, "mdn_chunk_bwd");
    for (const Tensor* t : {&beta, &log_mu, &eta, &dlog_alpha, &dbeta, &dlog_mu, &deta})
      check_same(log_alpha, *t, "mdn_chunk_bwd");
    dispatch(q, "mdn_chunk_bwd", [&](auto zero) {
      using T = decltype(zero);
      const cpu::MdnInputs<T> in{q.as<T>(),    k.as<T>(),      v.as<T>(),   log_alpha.as<T>(), beta.as<T>(),
                                 log_mu.as<T>(), eta.as<T>(), nullptr,     nullptr};
      const cpu::MdnGrads<T> grads{dq.as<T>(),    dk.as<T>(),      dv.as<T>(), dlog_alpha.as<T>(), dbeta.as<T>(),
                                   dlog_mu.as<T>(), deta.as<T>(), nullptr,    nullptr};
      cpu::mdn_chunk_bwd<T>(in, d_o.as<T>(), nullptr, nullptr, d, grads, chunk_size);
    });
  }

  // ---- incremental decoding (backend.h) ----
  void rope_fwd_at(const Tensor& x, double theta, int64_t position) override {
    check(x.ndim == 4 && x.shape[3] % 2 == 0 && position >= 0,
          "rope_fwd_at: x must be [B, T, H, Dh] with even Dh and position >= 0, got {} at {}", x.shape_str(), position);
    dispatch(x, "rope_fwd_at", [&](auto zero) {
      using T = decltype(zero);
      cpu::rope_fwd_at<T>(x.as<T>(), x.shape[0], x.shape[1], x.shape[2], x.shape[3], theta, position);
    });
  }
  void attention_decode(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& k_cache,
                        const Tensor& v_cache, int64_t position, double scale, const Tensor& o) override {
    check_attention_decode(q, k, v, k_cache, v_cache, position, o);
    dispatch(q, "attention_decode", [&](auto zero) {
      using T = decltype(zero);
      cpu::attention_decode<T>(q.as<T>(), k.as<T>(), v.as<T>(), q.shape[0], q.shape[1], q.shape[2], q.shape[3],
                               k_cache.shape[1], position, scale, k_cache.as<T>(), v_cache.as<T>(), o.as<T>());
    });
  }
  void short_conv_silu_decode(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& window,
                              const Tensor& y) override {
    const int64_t W = short_conv_decode_width(x, w, bias, window, y), B = x.shape[0], C = x.shape[2];
    dispatch(x, "short_conv_silu_decode", [&](auto zero) {
      using T = decltype(zero);
      cpu::short_conv_silu_step<T>(x.as<T>(), w.as<T>(), B, x.shape[1], C, W, mutable_or_null<T>(window), y.as<T>(),
                                   optional<T>(bias));
    });
  }
  void gdn_decode(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                  int64_t chunk_size, const Tensor& state, const Tensor& o) override {
    const cpu::DeltaDims d = decode_dims(q, v, g, beta, state, false, "gdn_decode");
    check_same(q, k, "gdn_decode");
    check_same(v, o, "gdn_decode");
    dispatch(q, "gdn_decode", [&](auto zero) {
      using T = decltype(zero);
      const cpu::GdnInputs<T> in{q.as<T>(), k.as<T>(), v.as<T>(), g.as<T>(), beta.as<T>(), state.as<T>()};
      cpu::gdn_chunk_fwd<T>(in, d, o.as<T>(), state.as<T>(), chunk_size);
    });
  }
  void kda_decode(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                  int64_t chunk_size, const Tensor& state, const Tensor& o) override {
    const cpu::DeltaDims d = decode_dims(q, v, g, beta, state, true, "kda_decode");
    check_same(q, k, "kda_decode");
    check_same(v, o, "kda_decode");
    dispatch(q, "kda_decode", [&](auto zero) {
      using T = decltype(zero);
      const cpu::KdaInputs<T> in{q.as<T>(), k.as<T>(), v.as<T>(), g.as<T>(), beta.as<T>(), state.as<T>()};
      cpu::kda_chunk_fwd<T>(in, d, o.as<T>(), state.as<T>(), chunk_size);
    });
  }
  void comba_decode(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& p, const Tensor& g,
                    const Tensor& beta, int64_t chunk_size, const Tensor& state, const Tensor& o) override {
    const cpu::DeltaDims d = decode_dims(q, v, g, beta, state, false, "comba_decode");
    for (const Tensor* t : {&k, &p}) check_same(q, *t, "comba_decode");
    check_same(v, o, "comba_decode");
    dispatch(q, "comba_decode", [&](auto zero) {
      using T = decltype(zero);
      const cpu::CombaInputs<T> in{q.as<T>(), k.as<T>(), v.as<T>(), p.as<T>(), g.as<T>(), beta.as<T>(), state.as<T>()};
      cpu::comba_chunk_fwd<T>(in, d, o.as<T>(), state.as<T>(), chunk_size);
    });
  }
  void mdn_decode(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& log_alpha, const Tensor& beta,
                  const Tensor& log_mu, const Tensor& eta, int64_t chunk_size, const Tensor& state,
                  const Tensor& momentum, const Tensor& o) override {
    const cpu::DeltaDims d = decode_dims(q, v, log_alpha, beta, state, false, "mdn_decode");
    check_same(q, k, "mdn_decode");
    check_same(v, o, "mdn_decode");
    check_same(state, momentum, "mdn_decode");
    for (const Tensor* t : {&log_mu, &eta}) check_same(beta, *t, "mdn_decode");
    dispatch(q, "mdn_decode", [&](auto zero) {
      using T = decltype(zero);
      const cpu::MdnInputs<T> in{q.as<T>(),      k.as<T>(),   v.as<T>(),     log_alpha.as<T>(), beta.as<T>(),
                                 log_mu.as<T>(), eta.as<T>(), state.as<T>(), momentum.as<T>()};
      cpu::mdn_chunk_fwd<T>(in, d, o.as<T>(), state.as<T>(), momentum.as<T>(), chunk_size);
    });
  }
  void mamba2_ssd_decode(const Tensor& xbc, const Tensor& dt_raw, const Tensor& dt_bias, const Tensor& A_log,
                         const Tensor& D, int64_t head_dim, int64_t n_groups, int64_t chunk_size, const Tensor& state,
                         const Tensor& y) override {
    refuse_bf16({&xbc}, "xbc", "mamba2_ssd_decode");
    const cpu::Mamba2Dims d = mamba2_dims(xbc, dt_raw, dt_bias, A_log, D, head_dim, n_groups, y, "mamba2_ssd_decode");
    check_decode_state(state, d.batch * d.heads * d.head_dim * d.state_dim, xbc.dtype, "mamba2_ssd_decode",
                       "state [B, H, P, N]");
    dispatch(xbc, "mamba2_ssd_decode", [&](auto zero) {
      using T = decltype(zero);
      cpu::mamba2_ssd_fwd<T>(xbc.as<T>(), dt_raw.as<T>(), dt_bias.as<T>(), A_log.as<T>(), D.as<T>(), d, chunk_size,
                             y.as<T>(), state.as<T>());
    });
  }
  void mamba3_decode(const Tensor& x, const Tensor& z, const Tensor& bc, const Tensor& raw, const Mamba3Params& params,
                     const Mamba3Options& opt, const Mamba3Carry& carry, const Tensor& out) override {
    const cpu::Mamba3LayerDims d = mamba3_dims(x, z, bc, raw, params, opt, out, "mamba3_decode");
    check_mamba3_carry(carry, d, x.dtype);
    dispatch(x, "mamba3_decode", [&](auto zero) {
      using T = decltype(zero);
      const auto prm = mamba3_ptrs<cpu::Mamba3LayerParams<T>, T>(params);
      const cpu::Mamba3Carry<T> c{carry.state.as<T>(), carry.k_prev.as<T>(), carry.v_prev.as<T>(),
                                  mutable_or_null<T>(carry.phase)};
      cpu::mamba3_layer_step<T>(x.as<T>(), z.as<T>(), bc.as<T>(), raw.as<T>(), prm, d, opt, c, out.as<T>());
    });
  }

 private:
  AllocationLog allocations_;

  /// Sizes of a delta-rule decode call (backend_util.h delta_decode_dims) as the CPU kernels take them.
  static cpu::DeltaDims decode_dims(const Tensor& q, const Tensor& v, const Tensor& g, const Tensor& beta,
                                    const Tensor& state, bool per_channel, const char* op) {
    const DeltaCoreDims d = delta_decode_dims(q, v, g, beta, state, per_channel, op);
    return {d.batch, d.seq_len, d.heads, d.key_dim, d.value_dim};
  }

  /// A typed mutable pointer to an optional tensor (nullptr for a default-constructed one).
  template <typename T>
  static T* mutable_or_null(const Tensor& t) {
    return t.data != nullptr ? t.as<T>() : nullptr;
  }

  /// A typed pointer to an optional tensor (nullptr for a default-constructed one).
  template <typename T>
  static const T* optional(const Tensor& t) {
    return t.data != nullptr ? t.as<T>() : nullptr;
  }

  /// Heads of a comba_gates call: x [rows, H * K]; decay and D [H] when given (at least one sets H).
  static int64_t comba_gate_heads(const Tensor& x, const Tensor& decay, const Tensor& D, const char* op) {
    check(x.ndim == 2, "{}: q/k must be [rows, H * K], got {}", op, x.shape_str());
    check(decay.data != nullptr || D.data != nullptr, "{}: neither decay nor D given (nothing to do)", op);
    const int64_t heads = decay.data != nullptr ? decay.numel() : D.numel();
    check(heads > 0 && x.shape[1] % heads == 0, "{}: q/k {} not divisible into {} heads", op, x.shape_str(), heads);
    if (decay.data != nullptr) check(decay.dtype == x.dtype, "{}: decay dtype mismatch", op);
    if (D.data != nullptr)
      check(D.dtype == x.dtype && D.numel() == heads, "{}: D {} must be [H] of the dtype of q", op, D.shape_str());
    return heads;
  }

  /// The sizes of a delta-rule core call (backend_util.h) as the CPU kernels take them.
  static cpu::DeltaDims cpu_dims(const DeltaCoreDims& d) {
    return {d.batch, d.seq_len, d.heads, d.key_dim, d.value_dim};
  }

  /// Sizes of a delta-rule core call (backend_util.h delta_core_dims) as the CPU kernels take them.
  static cpu::DeltaDims delta_dims(const Tensor& q, const Tensor& v, const Tensor& g, const Tensor& beta,
                                   bool per_channel, const char* op) {
    return cpu_dims(delta_core_dims(q, v, g, beta, per_channel, op));
  }

  /// The decay gates (cpu/delta_gates.h) for gdn_gates_* (dim 1) and kda_gates_* (dim K).
  void gates_fwd(const Tensor& a, const Tensor& b, const Tensor& A_log, const Tensor& dt_bias, const Tensor& g,
                 const Tensor& beta, const char* op) {
    const GateDims gd = gate_dims(a, b, A_log, dt_bias, g, beta, op);
    dispatch(a, op, [&](auto zero) {
      using T = decltype(zero);
      cpu::delta_gates_fwd<T>(a.as<T>(), b.as<T>(), A_log.as<T>(), dt_bias.as<T>(), gd.rows, gd.heads, gd.dim,
                              g.as<T>(), beta.as<T>());
    });
  }
  void gates_bwd(const Tensor& dg, const Tensor& dbeta, const Tensor& a, const Tensor& b, const Tensor& A_log,
                 const Tensor& dt_bias, const Tensor& da, const Tensor& db, const Tensor& dA_log,
                 const Tensor& ddt_bias, const char* op) {
    const GateDims gd = gate_bwd_dims(dg, dbeta, a, b, A_log, dt_bias, da, db, dA_log, ddt_bias, op);
    dispatch(a, op, [&](auto zero) {
      using T = decltype(zero);
      cpu::delta_gates_bwd<T>(dg.as<T>(), dbeta.as<T>(), a.as<T>(), b.as<T>(), A_log.as<T>(), dt_bias.as<T>(),
                              gd.rows, gd.heads, gd.dim, da.as<T>(), db.as<T>(), dA_log.as<T>(), ddt_bias.as<T>());
    });
  }

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
