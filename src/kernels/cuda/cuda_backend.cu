// The CUDA backend: the CPU backend's shape/dtype checks, then the launchers of ops.cuh on
// one stream, and cuBLAS for matmul (fp32 accumulation; fp32 operands without TF32, or bf16
// operands on the tensor cores). Activations of the Transformer's ops are f32 or bf16; the
// delta-rule, Mamba2 and Mamba-3 ops, the residual stream, gradients and optimizer state are f32.
#include "kernels/cuda/cuda_backend.h"

#include <cublas_v2.h>

#include <algorithm>
#include <climits>
#include <string>
#include <utility>

#include "kernels/backend_util.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cuda/ops.cuh"

namespace llmt::cuda {
namespace {

#define LLMT_CUBLAS_CHECK(expr)                                                                         \
  do {                                                                                                  \
    const cublasStatus_t llmt_cublas_status_ = (expr);                                                  \
    if (llmt_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                                   \
      throw ::llmt::Error(fmt::format("cuBLAS error {} in {} at {}:{}",                                 \
                                      cublasGetStatusString(llmt_cublas_status_), #expr, __FILE__, __LINE__)); \
  } while (0)

/// The tensor's f32 data; throws naming the op for any other dtype.
float* f32(const Tensor& t, const char* op) {
  check(t.dtype == DType::f32, "{}: the cuda backend supports f32 only, got {}", op, dtype_name(t.dtype));
  return static_cast<float*>(t.data);
}

/// Calls f(T{}) with T = float or __nv_bfloat16 according to `dtype`; throws naming the op for any other dtype.
template <typename F>
void dispatch(DType dtype, const char* op, F&& f) {
  if (dtype == DType::bf16) return f(__nv_bfloat16{});
  check(dtype == DType::f32, "{}: the cuda backend supports f32 and bf16, got {}", op, dtype_name(dtype));
  f(float{});
}
/// dispatch on the tensor's dtype.
template <typename F>
void dispatch(const Tensor& t, const char* op, F&& f) {
  dispatch(t.dtype, op, std::forward<F>(f));
}

template <typename T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.data);
}

cudaDataType_t cuda_type(DType t) { return t == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F; }

const int32_t* i32(const Tensor& t, const char* op) {
  check(t.dtype == DType::i32, "{}: ids/targets must be i32, got {}", op, dtype_name(t.dtype));
  return static_cast<const int32_t*>(t.data);
}

/// The f32 pointers of a Mamba3Params (nullptr for the absent ones); throws naming the op for another dtype.
Mamba3Ptrs mamba3_ptrs(const Backend::Mamba3Params& p, const char* op) {
  const auto f = [&](const Tensor& t) -> const float* { return t.data ? f32(t, op) : nullptr; };
  return {f(p.dt_bias), f(p.B_bias), f(p.C_bias), f(p.B_norm), f(p.C_norm),
          f(p.D),       f(p.mimo_x), f(p.mimo_z), f(p.mimo_o), f(p.norm)};
}

/// Floats of the CUDA Mamba-3 op's saved set (cuda::mamba3_saved_bytes, rounded up).
int64_t mamba3_saved_floats(const cpu::Mamba3LayerDims& d, const Mamba3Options& opt) {
  return static_cast<int64_t>((cuda::mamba3_saved_bytes(d, opt) + sizeof(float) - 1) / sizeof(float));
}

/// mamba3_fwd / mamba3_bwd's `saved` (none, or [mamba3_saved_numel] f32) as its data, or nullptr for none.
float* mamba3_saved(const Tensor& saved, const cpu::Mamba3LayerDims& d, const Mamba3Options& opt, const char* op) {
  if (saved.data == nullptr) return nullptr;
  const int64_t n = mamba3_saved_floats(d, opt);
  check(saved.numel() == n, "{}: saved has {} elements, the layer's saved set {}", op, saved.numel(), n);
  return f32(saved, op);
}

/// Floats of the CUDA Mamba2 core's saved set with compute type P (cuda::mamba2_ssd_saved_bytes, rounded up).
template <typename P>
int64_t mamba2_saved_floats(const cpu::Mamba2Dims& d) {
  const size_t bytes = cuda::mamba2_ssd_saved_bytes<P>(d.batch, d.seq_len, d.heads, d.head_dim, d.state_dim);
  return static_cast<int64_t>((bytes + sizeof(float) - 1) / sizeof(float));
}

/// mamba2_ssd_fwd / mamba2_ssd_bwd's `saved` (none, or [mamba2_saved_numel] f32: the chunk-entering states in P) as
/// its data, or nullptr for none.
template <typename P>
float* mamba2_saved(const Tensor& saved, const cpu::Mamba2Dims& d, const char* op) {
  if (saved.data == nullptr) return nullptr;
  const int64_t n = mamba2_saved_floats<P>(d);
  check(saved.numel() == n, "{}: saved has {} elements, the core's chunk states {}", op, saved.numel(), n);
  return f32(saved, op);
}

/// Floats of the GDN / Comba cores' saved set (cuda::gdn_saved_floats<P>, with or without h, Δ and W: states) for
/// compute dtype f32 or bf16 (dispatch).
int64_t gdn_saved_floats(int64_t B, int64_t T, int64_t H, int64_t K, int64_t V, int64_t chunk_size, bool states,
                         DType compute, const char* op) {
  int64_t n = 0;
  dispatch(compute, op,
           [&](auto zero) { n = cuda::gdn_saved_floats<decltype(zero)>(B, T, H, K, V, chunk_size, states); });
  return n;
}

/// A delta core's `saved` as its data (nullptr for none) and whether it holds the forward scan's h and Δ too
/// (states; ops.cuh).
struct DeltaSaved {
  float* data;
  bool states;
};

/// `saved` (none, or [with] or [without] f32: a delta core's saved set with or without h and Δ, the layer's
/// save_states) as a DeltaSaved, its size telling the two apart; `what` names the set without h and Δ. Throws
/// llmt::Error for any other size, naming both.
DeltaSaved delta_saved(const Tensor& saved, int64_t with, int64_t without, const char* what, const char* op) {
  if (saved.data == nullptr) return {nullptr, false};
  check(saved.numel() == with || saved.numel() == without,
        "{}: saved has {} elements, the core's saved set {} (with h and Δ) or {} ({} alone)", op, saved.numel(), with,
        without, what);
  return {f32(saved, op), saved.numel() == with};
}

/// gdn_chunk_* / comba_chunk_*'s `saved` (none, or [gdn_saved_numel] f32: the cores' 𝒯, and h, Δ and W or not,
/// ops.cuh) for q [B, T, H, K], v [B, T, H, V] and compute (delta_saved).
DeltaSaved gdn_saved(const Tensor& saved, const Tensor& q, const Tensor& v, int64_t chunk_size, DType compute,
                     const char* op) {
  if (saved.data == nullptr) return {nullptr, false};
  const auto floats = [&](bool states) {
    return gdn_saved_floats(q.shape[0], q.shape[1], q.shape[2], q.shape[3], v.shape[3], chunk_size, states, compute,
                            op);
  };
  return delta_saved(saved, floats(true), floats(false), "𝒯", op);
}

/// kda_chunk_*'s `saved` (none, or [kda_saved_numel] f32: the core's P, 𝒯, and Δ and h or not, ops.cuh)
/// (delta_saved); d the core call's sizes.
DeltaSaved kda_saved(const Tensor& saved, const DeltaCoreDims& d, int64_t chunk_size, const char* op) {
  if (saved.data == nullptr) return {nullptr, false};
  const auto floats = [&](bool states) {
    return cuda::kda_saved_floats(d.batch, d.seq_len, d.heads, d.key_dim, d.value_dim, chunk_size, states);
  };
  return delta_saved(saved, floats(true), floats(false), "P and 𝒯", op);
}

/// "q, k, v, p" (Comba: four inputs) or "q, k, v": the names of a GDN / Comba core call's inputs `in`.
const char* gdn_input_names(std::initializer_list<const Tensor*> in) {
  return in.size() == 4 ? "q, k, v, p" : "q, k, v";
}

/// The one dtype of a core call's inputs `in` that may be bf16 (named `names`: GDN / Comba q, k, v and p, Mamba2 dy
/// and xbc): f32 or bf16. Throws llmt::Error naming the op and the dtypes unless they are all f32 or all bf16.
DType input_dtype(std::initializer_list<const Tensor*> in, const char* names, const char* op) {
  const DType t = (*in.begin())->dtype;
  std::string got;
  bool same = true;
  for (const Tensor* x : in) {
    got += fmt::format("{}{}", got.empty() ? "" : ", ", dtype_name(x->dtype));
    same = same && x->dtype == t;
  }
  check(same && (t == DType::f32 || t == DType::bf16), "{}: {} must be all f32 or all bf16, got {}", op, names, got);
  return t;
}

/// Calls f(P{}, E{}) for a core call whose inputs `in` (named `names`) may be bf16: P the products' operand type from
/// `compute` (as dispatch), E the element type of `in`: float, or __nv_bfloat16 with compute bf16 only. Throws
/// llmt::Error naming the op and the dtypes unless `in` are all f32 or all bf16, and for bf16 inputs with another
/// compute dtype.
template <typename F>
void dispatch_inputs(std::initializer_list<const Tensor*> in, const char* names, DType compute, const char* op,
                     F&& f) {
  if (input_dtype(in, names, op) == DType::f32) return dispatch(compute, op, [&](auto zero) { f(zero, float{}); });
  check(compute == DType::bf16, "{}: bf16 {} need compute bf16, got compute {}", op, names, dtype_name(compute));
  f(__nv_bfloat16{}, __nv_bfloat16{});
}
/// dispatch_inputs for a GDN / Comba core call (gdn_comba.cu): `in` q, k, v (Comba: and p), bf16 FLA's inputs.
template <typename F>
void dispatch_gdn(std::initializer_list<const Tensor*> in, DType compute, const char* op, F&& f) {
  dispatch_inputs(in, gdn_input_names(in), compute, op, std::forward<F>(f));
}

/// Calls f(E{}) with E the element type of a decode call's inputs `in` that may be bf16 (named `names`; input_dtype:
/// float or __nv_bfloat16).
template <typename F>
void with_inputs(std::initializer_list<const Tensor*> in, const char* names, const char* op, F&& f) {
  if (input_dtype(in, names, op) == DType::f32) return f(float{});
  f(__nv_bfloat16{});
}
/// with_inputs of a GDN / Comba decode call's inputs `in` (q, k, v; Comba: and p).
template <typename F>
void with_gdn_inputs(std::initializer_list<const Tensor*> in, const char* op, F&& f) {
  with_inputs(in, gdn_input_names(in), op, std::forward<F>(f));
}

/// t viewed as f32: the shape checks (delta_fwd_dims, delta_bwd_dims, delta_decode_dims, short_conv_decode_width,
/// mamba2_dims) of a call whose GDN / Comba q, k, v (p) or Mamba2 xbc, dy may be bf16 (dispatch_inputs,
/// input_dtype) or whose output may be bf16.
Tensor f32_view(const Tensor& t) {
  Tensor v = t;
  v.dtype = DType::f32;
  return v;
}

class CudaBackend final : public Backend {
 public:
  CudaBackend() {
    try {
      LLMT_CUDA_CHECK(cudaStreamCreate(&stream_));
      LLMT_CUBLAS_CHECK(cublasCreate(&cublas_));
      LLMT_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
      // fp32 products in fp32: no TF32 tensor-op math.
      LLMT_CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
      LLMT_CUDA_CHECK(cudaMalloc(&result_, sizeof(double)));
    } catch (...) {
      destroy();
      throw;
    }
  }
  ~CudaBackend() override { destroy(); }
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override { return "cuda"; }

  void* allocate(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) {
      cudaGetLastError();  // an allocation failure is not sticky: clear it
      size_t free_bytes = 0, total_bytes = 0;
      if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) cudaGetLastError();  // for the message only
      constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
      throw Error(fmt::format(
          "cuda backend: out of memory allocating {} bytes ({:.2f} GiB; {}; {:.2f} of {:.2f} GiB free on the device): "
          "lower train.micro_batch (grad_accum grows to keep train.batch_tokens) or set train.recompute=true",
          bytes, bytes / kGiB, cudaGetErrorString(err), free_bytes / kGiB, total_bytes / kGiB));
    }
    allocations_.allocated(p, bytes);
    return p;
  }
  // Runs from destructors (Buffer), so it must not throw: a failed free means an earlier
  // fault, which is sticky and reported by the next checked call.
  void release(void* ptr) override {
    allocations_.released(ptr);
    cudaFree(ptr);
  }
  size_t peak_allocated_bytes() const override { return allocations_.peak(); }
  void* native_stream() const override { return stream_; }
  void fill_zero(const Tensor& t) override {
    if (t.bytes()) LLMT_CUDA_CHECK(cudaMemsetAsync(t.data, 0, t.bytes(), stream_));
  }
  void copy(const Tensor& src, const Tensor& dst) override {
    check_same(src, dst, "copy");
    if (src.data != dst.data && src.bytes())
      LLMT_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.bytes(), cudaMemcpyDeviceToDevice, stream_));
  }
  void convert(const Tensor& src, const Tensor& dst) override {
    check(src.numel() == dst.numel(), "convert: size mismatch ({} vs {})", src.shape_str(), dst.shape_str());
    if (src.dtype == dst.dtype) return copy(src, dst);
    if (src.dtype == DType::f32 && dst.dtype == DType::bf16)
      return cuda::convert(ptr<float>(src), src.numel(), ptr<__nv_bfloat16>(dst), stream_);
    check(src.dtype == DType::bf16 && dst.dtype == DType::f32, "convert: {} -> {} is not supported (f32 <-> bf16)",
          dtype_name(src.dtype), dtype_name(dst.dtype));
    cuda::convert(ptr<__nv_bfloat16>(src), src.numel(), ptr<float>(dst), stream_);
  }
  void upload(const void* host, const Tensor& t) override {
    if (!t.bytes()) return;
    LLMT_CUDA_CHECK(cudaMemcpyAsync(t.data, host, t.bytes(), cudaMemcpyHostToDevice, stream_));
    LLMT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void download(const Tensor& t, void* host) override {
    if (!t.bytes()) return;
    LLMT_CUDA_CHECK(cudaMemcpyAsync(host, t.data, t.bytes(), cudaMemcpyDeviceToHost, stream_));
    LLMT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void add(const Tensor& a, const Tensor& b, const Tensor& out) override {
    check_same(a, b, "add");
    check_same(a, out, "add");
    cuda::add(f32(a, "add"), f32(b, "add"), a.numel(), f32(out, "add"), stream_);
  }
  double sum_squares(const Tensor& x) override {
    cuda::sum_squares(f32(x, "sum_squares"), x.numel(), result_, stream_);
    return result_to_host();
  }
  double sum(const Tensor& x) override {
    cuda::sum(f32(x, "sum"), x.numel(), result_, stream_);
    return result_to_host();
  }

  // Row-major C[M,N] = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS gets B
  // first, with the row-major storage read as the transposed column-major matrix.
  void matmul_strided(const Tensor& a, int64_t lda, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
                      int64_t ldc, bool accumulate) override {
    const auto [M, N, K] = matmul_dims(a, trans_a, b, trans_b, c);
    check(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX, "gemm: M={} N={} K={} must each lie in [0, {}]", M, N, K,
          INT_MAX);
    const int64_t dense_a = std::max<int64_t>(1, trans_a ? M : K), dense_c = std::max<int64_t>(1, N);
    lda = lda == 0 ? dense_a : lda;
    ldc = ldc == 0 ? dense_c : ldc;
    check(lda >= dense_a && ldc >= dense_c && lda <= INT_MAX && ldc <= INT_MAX,
          "gemm: row strides lda={} ldc={} must be at least the rows' lengths {} and {}", lda, ldc, dense_a, dense_c);
    for (const Tensor* t : {&a, &c})
      check(t->dtype == DType::f32 || t->dtype == DType::bf16, "matmul: the cuda backend supports f32 and bf16, got {}",
            dtype_name(t->dtype));
    if (M == 0 || N == 0) return;
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    const int ldb = static_cast<int>(std::max<int64_t>(1, trans_b ? K : N));
    LLMT_CUBLAS_CHECK(cublasGemmEx(cublas_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha, b.data,
                                   cuda_type(b.dtype), ldb, a.data, cuda_type(a.dtype), static_cast<int>(lda), &beta,
                                   c.data, cuda_type(c.dtype), static_cast<int>(ldc), CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
  }

  void embedding_fwd(const Tensor& ids, const Tensor& table, const Tensor& out) override {
    const int64_t dim = table.dim(-1);
    check(out.numel() == ids.numel() * dim, "embedding_fwd: out {} for {} ids of dim {}", out.shape_str(),
          ids.numel(), dim);
    cuda::embedding_fwd(i32(ids, "embedding_fwd"), ids.numel(), f32(table, "embedding_fwd"), table.shape[0], dim,
                        f32(out, "embedding_fwd"), stream_);
  }
  void embedding_bwd(const Tensor& ids, const Tensor& dout, const Tensor& dtable) override {
    const int64_t dim = dtable.dim(-1);
    check(dout.numel() == ids.numel() * dim, "embedding_bwd: dout {} for {} ids", dout.shape_str(), ids.numel());
    const int32_t* pids = i32(ids, "embedding_bwd");
    const float* pdout = f32(dout, "embedding_bwd");
    float* pdtable = f32(dtable, "embedding_bwd");
    cuda::embedding_bwd(pids, ids.numel(), pdout, dim, pdtable, scratch(embedding_bwd_scratch_bytes(ids.numel())),
                        stream_);
  }

  void rmsnorm_fwd(const Tensor& x, const Tensor& w, double eps, const Tensor& y, const Tensor& rstd) override {
    const int64_t dim = w.numel(), rows = x.numel() / dim;
    check(x.numel() == rows * dim && rstd.numel() == rows && y.numel() == x.numel(),
          "rmsnorm_fwd: x {} w {} y {} rstd {}", x.shape_str(), w.shape_str(), y.shape_str(), rstd.shape_str());
    const char* op = "rmsnorm_fwd";
    const float *px = f32(x, op), *pw = f32(w, op);
    float* prstd = f32(rstd, op);
    dispatch(y, op, [&](auto zero) {
      using T = decltype(zero);
      cuda::rmsnorm_fwd(px, pw, rows, dim, eps, ptr<T>(y), prstd, stream_);
    });
  }
  void add_rmsnorm_fwd(const Tensor& x, const Tensor& branch, const Tensor& w, double eps, const Tensor& h,
                       const Tensor& y, const Tensor& rstd) override {
    const int64_t dim = w.numel(), rows = x.numel() / dim;
    check(x.numel() == rows * dim && rstd.numel() == rows && y.numel() == x.numel(),
          "add_rmsnorm_fwd: x {} w {} y {} rstd {}", x.shape_str(), w.shape_str(), y.shape_str(), rstd.shape_str());
    check_same(x, branch, "add_rmsnorm_fwd");
    check_same(x, h, "add_rmsnorm_fwd");
    const char* op = "add_rmsnorm_fwd";
    const float *px = f32(x, op), *pbranch = f32(branch, op), *pw = f32(w, op);
    float *ph = f32(h, op), *prstd = f32(rstd, op);
    dispatch(y, op, [&](auto zero) {
      using T = decltype(zero);
      cuda::add_rmsnorm_fwd(px, pbranch, pw, rows, dim, eps, ph, ptr<T>(y), prstd, stream_);
    });
  }
  void rmsnorm_bwd(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dx,
                   const Tensor& dw) override {
    const int64_t dim = w.numel(), rows = x.numel() / dim;
    check_same(dy, x, "rmsnorm_bwd");
    check_same(dx, x, "rmsnorm_bwd");
    check_same(dw, w, "rmsnorm_bwd");
    const char* op = "rmsnorm_bwd";
    const float *pdy = f32(dy, op), *px = f32(x, op), *pw = f32(w, op), *prstd = f32(rstd, op);
    float *pdx = f32(dx, op), *pdw = f32(dw, op);
    cuda::rmsnorm_bwd(pdy, px, pw, prstd, rows, dim, pdx, pdw, scratch(rmsnorm_bwd_scratch_bytes(rows, dim)),
                      stream_);
  }

  void rope_fwd(const Tensor& x, double theta) override {
    check_rope(x);
    dispatch(x, "rope", [&](auto zero) {
      cuda::rope_fwd(ptr<decltype(zero)>(x), x.shape[0], x.shape[1], x.shape[2], x.shape[3], theta, stream_);
    });
  }
  void rope_bwd(const Tensor& dx, double theta) override {
    check_rope(dx);
    dispatch(dx, "rope", [&](auto zero) {
      cuda::rope_bwd(ptr<decltype(zero)>(dx), dx.shape[0], dx.shape[1], dx.shape[2], dx.shape[3], theta, stream_);
    });
  }

  void attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, double scale, const Tensor& o,
                     const Tensor& lse) override {
    check(q.ndim == 4, "attention_fwd: q must be [B, T, H, Dh], got {}", q.shape_str());
    check_same(q, k, "attention_fwd");
    check_same(q, v, "attention_fwd");
    check_same(q, o, "attention_fwd");
    check(lse.numel() == q.shape[0] * q.shape[1] * q.shape[2], "attention_fwd: lse {}", lse.shape_str());
    const char* op = "attention_fwd";
    const int64_t B = q.shape[0], T = q.shape[1], H = q.shape[2], Dh = q.shape[3];
    if (q.dtype == DType::bf16 && flash_head_dim(Dh)) {
      cuda::flash_attention_fwd(ptr<__nv_bfloat16>(q), ptr<__nv_bfloat16>(k), ptr<__nv_bfloat16>(v), B, T, H, Dh,
                                static_cast<float>(scale), ptr<__nv_bfloat16>(o), f32(lse, op), stream_);
      return;
    }
    if (q.dtype == DType::bf16) {
      // Other head sizes: bf16 operands through the fp32 kernel, widened copies in scratch.
      const int64_t n = q.numel();
      float* f = static_cast<float*>(scratch(4 * n * sizeof(float)));
      cuda::convert(ptr<__nv_bfloat16>(q), n, f, stream_);
      cuda::convert(ptr<__nv_bfloat16>(k), n, f + n, stream_);
      cuda::convert(ptr<__nv_bfloat16>(v), n, f + 2 * n, stream_);
      cuda::attention_fwd(f, f + n, f + 2 * n, B, T, H, Dh, scale, f + 3 * n, f32(lse, op), stream_);
      cuda::convert(f + 3 * n, n, ptr<__nv_bfloat16>(o), stream_);
      return;
    }
    cuda::attention_fwd(f32(q, op), f32(k, op), f32(v, op), B, T, H, Dh, scale, f32(o, op), f32(lse, op), stream_);
  }
  void attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
                     const Tensor& dout, double scale, const Tensor& dq, const Tensor& dk,
                     const Tensor& dv) override {
    check(q.ndim == 4, "attention_bwd: q must be [B, T, H, Dh], got {}", q.shape_str());
    for (const Tensor* t : {&k, &v, &o, &dout, &dq, &dk, &dv}) check_same(q, *t, "attention_bwd");
    const char* op = "attention_bwd";
    const int64_t B = q.shape[0], T = q.shape[1], H = q.shape[2], Dh = q.shape[3];
    if (q.dtype == DType::bf16 && flash_head_dim(Dh)) {
      cuda::flash_attention_bwd(ptr<__nv_bfloat16>(q), ptr<__nv_bfloat16>(k), ptr<__nv_bfloat16>(v),
                                ptr<__nv_bfloat16>(o), f32(lse, op), ptr<__nv_bfloat16>(dout), B, T, H, Dh,
                                static_cast<float>(scale), ptr<__nv_bfloat16>(dq), ptr<__nv_bfloat16>(dk),
                                ptr<__nv_bfloat16>(dv), scratch(flash_attention_bwd_scratch_bytes(B, T, H, Dh)),
                                stream_);
      return;
    }
    if (q.dtype == DType::bf16) {
      // Other head sizes: bf16 operands through the fp32 kernel, widened copies in scratch.
      const int64_t n = q.numel();
      float* f = static_cast<float*>(scratch(8 * n * sizeof(float) + attention_bwd_scratch_bytes(B, T, H, Dh)));
      const Tensor* in[] = {&q, &k, &v, &o, &dout};
      for (int i = 0; i < 5; ++i) cuda::convert(ptr<__nv_bfloat16>(*in[i]), n, f + i * n, stream_);
      cuda::attention_bwd(f, f + n, f + 2 * n, f + 3 * n, f32(lse, op), f + 4 * n, B, T, H, Dh, scale, f + 5 * n,
                          f + 6 * n, f + 7 * n, f + 8 * n, stream_);
      const Tensor* out[] = {&dq, &dk, &dv};
      for (int i = 0; i < 3; ++i) cuda::convert(f + (5 + i) * n, n, ptr<__nv_bfloat16>(*out[i]), stream_);
      return;
    }
    const float *pq = f32(q, op), *pk = f32(k, op), *pv = f32(v, op), *po = f32(o, op), *plse = f32(lse, op),
                *pdout = f32(dout, op);
    float *pdq = f32(dq, op), *pdk = f32(dk, op), *pdv = f32(dv, op);
    cuda::attention_bwd(pq, pk, pv, po, plse, pdout, B, T, H, Dh, scale, pdq, pdk, pdv,
                        scratch(attention_bwd_scratch_bytes(B, T, H, Dh)), stream_);
  }

  void swiglu_fwd(const Tensor& gate, const Tensor& up, const Tensor& h) override {
    check_same(gate, up, "swiglu_fwd");
    check_same(gate, h, "swiglu_fwd");
    dispatch(gate, "swiglu_fwd", [&](auto zero) {
      using T = decltype(zero);
      cuda::swiglu_fwd(ptr<T>(gate), ptr<T>(up), gate.numel(), ptr<T>(h), stream_);
    });
  }
  void swiglu_bwd(const Tensor& gate, const Tensor& up, const Tensor& dh, const Tensor& dgate,
                  const Tensor& dup) override {
    for (const Tensor* t : {&up, &dh, &dgate, &dup}) check_same(gate, *t, "swiglu_bwd");
    dispatch(gate, "swiglu_bwd", [&](auto zero) {
      using T = decltype(zero);
      cuda::swiglu_bwd(ptr<T>(gate), ptr<T>(up), ptr<T>(dh), gate.numel(), ptr<T>(dgate), ptr<T>(dup), stream_);
    });
  }

  void cross_entropy_strided(const Tensor& logits, int64_t ld, const Tensor& targets, double grad_scale,
                             const Tensor& losses, const Tensor& correct) override {
    check(logits.ndim == 2 && targets.numel() == logits.shape[0] && losses.numel() == logits.shape[0],
          "cross_entropy: logits {} targets {} losses {}", logits.shape_str(), targets.shape_str(),
          losses.shape_str());
    ld = ld == 0 ? logits.shape[1] : ld;
    check(ld >= logits.shape[1], "cross_entropy: row stride {} is shorter than the vocabulary of {}", ld,
          logits.shape[1]);
    const char* op = "cross_entropy";
    const int32_t* pt = i32(targets, op);
    float* pl = f32(losses, op);
    float* pc = nullptr;
    if (correct.data != nullptr) {
      check(correct.numel() == losses.numel(), "cross_entropy: correct {} for losses {}", correct.shape_str(),
            losses.shape_str());
      pc = f32(correct, op);
    }
    dispatch(logits, op, [&](auto zero) {
      cuda::cross_entropy(ptr<decltype(zero)>(logits), pt, logits.shape[0], logits.shape[1], ld, grad_scale, pl, pc,
                          stream_);
    });
  }

  void adamw_step(const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                  const AdamWParams& hp, double grad_scale, int64_t step, const Tensor& working) override {
    for (const Tensor* t : {&grads, &m, &v}) check_same(params, *t, "adamw_step");
    const char* op = "adamw_step";
    if (working.data != nullptr)
      check(working.dtype == DType::bf16 && working.numel() == params.numel(),
            "adamw_step: the working copy must be bf16 of {} elements, got {} {}", params.numel(),
            dtype_name(working.dtype), working.shape_str());
    cuda::adamw_step(f32(params, op), f32(grads, op), f32(m, op), f32(v, op), params.numel(), hp.lr, hp.beta1,
                     hp.beta2, hp.eps, hp.weight_decay, grad_scale, step, ptr<__nv_bfloat16>(working), stream_);
  }

  int64_t head_chunk_rows() const override { return 2048; }
  int64_t logits_stride(int64_t vocab) const override { return ceil_div(vocab, 64) * 64; }

  // ---- delta-rule layers (checks as the CPU backend's) ----
  void short_conv_silu_fwd(const Tensor& x, const Tensor& w, const Tensor& pre, const Tensor& y) override {
    check(x.ndim == 3 && w.ndim == 3 && w.shape[0] == x.shape[2] && w.shape[1] == 1,
          "short_conv_silu_fwd: x must be [B, T, C] and w [C, 1, W], got {} and {}", x.shape_str(), w.shape_str());
    check_same(x, pre, "short_conv_silu_fwd");
    check(y.numel() == x.numel(), "short_conv_silu_fwd: y {} for x {}", y.shape_str(), x.shape_str());
    check(w.shape[2] >= 1, "short_conv: width must be >= 1, got {}", w.shape[2]);
    const char* op = "short_conv_silu_fwd";
    const float *px = f32(x, op), *pw = f32(w, op);
    float* ppre = f32(pre, op);
    dispatch(y, op, [&](auto t) {  // y in f32, or rounded to bf16 for a GDN / Comba core's bf16 v (or Mamba2's xbc)
      cuda::short_conv_silu_fwd(px, pw, nullptr, x.shape[0], x.shape[1], x.shape[2], w.shape[2], ppre,
                                ptr<decltype(t)>(y), stream_);
    });
  }
  void short_conv_silu_bwd(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& pre, const Tensor& dx,
                           const Tensor& dw) override {
    check(x.ndim == 3 && w.ndim == 3 && w.shape[0] == x.shape[2], "short_conv_silu_bwd: x {} w {}", x.shape_str(),
          w.shape_str());
    check_same(x, pre, "short_conv_silu_bwd");
    check(dy.numel() == x.numel(), "short_conv_silu_bwd: dy {} for x {}", dy.shape_str(), x.shape_str());
    check(dx.numel() == x.numel(), "short_conv_silu_bwd: dx {} for x {}", dx.shape_str(), x.shape_str());
    check_same(w, dw, "short_conv_silu_bwd");
    check(w.shape[2] >= 1, "short_conv: width must be >= 1, got {}", w.shape[2]);
    const char* op = "short_conv_silu_bwd";
    const int64_t B = x.shape[0], T = x.shape[1], C = x.shape[2], W = w.shape[2];
    const float *px = f32(x, op), *pw = f32(w, op), *ppre = f32(pre, op);
    float* pdw = f32(dw, op);
    // dy in f32, or bf16 (Mamba2's dxbc from its SSD with bf16 inputs); dx in f32, or rounded to bf16 for the
    // projections' products
    dispatch(dy, op, [&](auto d) {
      dispatch(dx, op, [&](auto t) {
        cuda::short_conv_silu_bwd(ptr<const decltype(d)>(dy), px, pw, ppre, B, T, C, W, ptr<decltype(t)>(dx), pdw,
                                  nullptr, scratch(short_conv_silu_bwd_scratch_bytes(B, T, C, W)), stream_);
      });
    });
  }

  // ---- Mamba2 (checks as the CPU backend's; f32: the layer keeps its activations in the master dtype) ----
  void conv_bias_silu_fwd(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& pre,
                          const Tensor& y) override {
    check(x.ndim == 3 && w.ndim == 3 && w.shape[0] == x.shape[2] && w.shape[1] == 1 && bias.numel() == x.shape[2],
          "conv_bias_silu_fwd: x must be [B, T, C], w [C, 1, W] and bias [C], got {}, {} and {}", x.shape_str(),
          w.shape_str(), bias.shape_str());
    check_same(x, pre, "conv_bias_silu_fwd");
    check(y.numel() == x.numel(), "conv_bias_silu_fwd: y {} for x {}", y.shape_str(), x.shape_str());
    check(w.shape[2] >= 1, "short_conv: width must be >= 1, got {}", w.shape[2]);
    const char* op = "conv_bias_silu_fwd";
    const float *px = f32(x, op), *pw = f32(w, op), *pbias = f32(bias, op);
    float* ppre = f32(pre, op);
    dispatch(y, op, [&](auto t) {  // y in f32, or rounded to bf16 for the SSD's bf16 xbc (mamba2_bf16_inputs)
      cuda::short_conv_silu_fwd(px, pw, pbias, x.shape[0], x.shape[1], x.shape[2], w.shape[2], ppre,
                                ptr<decltype(t)>(y), stream_);
    });
  }
  void conv_bias_silu_bwd(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& pre, const Tensor& dx,
                          const Tensor& dw, const Tensor& dbias) override {
    check(x.ndim == 3 && w.ndim == 3 && w.shape[0] == x.shape[2] && dbias.numel() == x.shape[2],
          "conv_bias_silu_bwd: x {} w {} dbias {}", x.shape_str(), w.shape_str(), dbias.shape_str());
    for (const Tensor* t : {&pre, &dx}) check_same(x, *t, "conv_bias_silu_bwd");
    check(dy.numel() == x.numel(), "conv_bias_silu_bwd: dy {} for x {}", dy.shape_str(), x.shape_str());
    check_same(w, dw, "conv_bias_silu_bwd");
    check(w.shape[2] >= 1, "short_conv: width must be >= 1, got {}", w.shape[2]);
    const char* op = "conv_bias_silu_bwd";
    const int64_t B = x.shape[0], T = x.shape[1], C = x.shape[2], W = w.shape[2];
    const float *px = f32(x, op), *pw = f32(w, op), *ppre = f32(pre, op);
    float *pdx = f32(dx, op), *pdw = f32(dw, op), *pdb = f32(dbias, op);
    dispatch(dy, op, [&](auto d) {  // dy in f32, or bf16: the SSD's dxbc with bf16 inputs (mamba2_bf16_inputs)
      cuda::short_conv_silu_bwd(ptr<const decltype(d)>(dy), px, pw, ppre, B, T, C, W, pdx, pdw, pdb,
                                scratch(short_conv_silu_bwd_scratch_bytes(B, T, C, W)), stream_);
    });
  }
  void gate_rmsnorm_fwd(const Tensor& y, const Tensor& z, const Tensor& w, double eps, const Tensor& out,
                        const Tensor& rstd) override {
    // (y f32, or bf16: the SSD's output with bf16 inputs, mamba2_bf16_inputs; z f32)
    const int64_t dim = w.numel(), rows = gate_norm_rows(f32_view(y), z, w, rstd, "gate_rmsnorm_fwd");
    check(out.numel() == y.numel(), "gate_rmsnorm_fwd: out {} for y {}", out.shape_str(), y.shape_str());
    const char* op = "gate_rmsnorm_fwd";
    const float *pz = f32(z, op), *pw = f32(w, op);
    float* prstd = f32(rstd, op);
    dispatch(y, op, [&](auto i) {
      dispatch(out, op, [&](auto t) {  // out in f32, or rounded to bf16 for out_proj's products
        cuda::gate_rmsnorm_fwd(ptr<const decltype(i)>(y), pz, pw, rows, dim, eps, ptr<decltype(t)>(out), prstd,
                               stream_);
      });
    });
  }
  void gate_rmsnorm_bwd(const Tensor& dout, const Tensor& y, const Tensor& z, const Tensor& w, const Tensor& rstd,
                        const Tensor& dy, const Tensor& dz, const Tensor& dw) override {
    // (y f32, or bf16: the SSD's output with bf16 inputs, mamba2_bf16_inputs; z, dout f32)
    const int64_t dim = w.numel(), rows = gate_norm_rows(f32_view(y), z, w, rstd, "gate_rmsnorm_bwd");
    check_same(f32_view(y), dout, "gate_rmsnorm_bwd");
    for (const Tensor* t : {&dy, &dz})
      check(t->numel() == y.numel(), "gate_rmsnorm_bwd: dy {} and dz {} for y {}", dy.shape_str(), dz.shape_str(),
            y.shape_str());
    check_same(w, dw, "gate_rmsnorm_bwd");
    const char* op = "gate_rmsnorm_bwd";
    const float *pdout = f32(dout, op), *pz = f32(z, op), *pw = f32(w, op), *prstd = f32(rstd, op);
    float* pdw = f32(dw, op);
    // dy in f32, or rounded to bf16 for the Mamba2 SSD's bf16 dy; dz in f32, or rounded to bf16 for in_proj's products
    dispatch(y, op, [&](auto i) {
      dispatch(dy, op, [&](auto d) {
        dispatch(dz, op, [&](auto t) {
          cuda::gate_rmsnorm_bwd(pdout, ptr<const decltype(i)>(y), pz, pw, prstd, rows, dim, ptr<decltype(d)>(dy),
                                 ptr<decltype(t)>(dz), pdw, scratch(gated_rmsnorm_bwd_scratch_bytes(rows, dim)),
                                 stream_);
        });
      });
    });
  }
  bool mamba2_bf16_inputs(DType compute) const override { return compute == DType::bf16; }
  bool mamba3_bf16_activations(DType compute) const override { return compute == DType::bf16; }
  int64_t mamba2_saved_numel(int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim, int64_t d_state,
                             DType compute) const override {
    int64_t n = 0;
    dispatch(compute, "mamba2_saved_numel", [&](auto zero) {
      n = mamba2_saved_floats<decltype(zero)>({batch, seq_len, heads, head_dim, d_state, 1});
    });
    return n;
  }
  void mamba2_ssd_fwd(const Tensor& xbc, const Tensor& dt_raw, const Tensor& dt_bias, const Tensor& A_log,
                      const Tensor& D, int64_t head_dim, int64_t n_groups, int64_t chunk_size, DType compute,
                      const Tensor& y, const Tensor& saved) override {
    const char* op = "mamba2_ssd_fwd";
    const cpu::Mamba2Dims d =
        mamba2_dims(f32_view(xbc), dt_raw, dt_bias, A_log, D, head_dim, n_groups, f32_view(y), op);
    check(chunk_size >= 1, "mamba2 chunk: chunk_size must be >= 1, got {}", chunk_size);
    const float *pdt = f32(dt_raw, op), *pbias = f32(dt_bias, op), *pA = f32(A_log, op), *pD = f32(D, op);
    // P: the products' operand type (mamba2.cu, Precision); E: xbc's, and y's (bf16 rounded once from fp32)
    dispatch_inputs({&xbc, &y}, "xbc, y", compute, op, [&](auto zero, auto e) {
      using P = decltype(zero);
      using E = decltype(e);
      float* sv = mamba2_saved<P>(saved, d, op);
      cuda::mamba2_ssd_fwd<P>(ptr<const E>(xbc), pdt, pbias, pA, pD, d.batch, d.seq_len, d.heads, d.head_dim,
                              d.state_dim, d.groups, ptr<E>(y), sv,
                              scratch(cuda::mamba2_ssd_fwd_scratch_bytes<P>(d.batch, d.seq_len, d.heads, d.head_dim,
                                                                            d.state_dim, sv != nullptr)),
                              stream_);
    });
  }
  void mamba2_ssd_bwd(const Tensor& dy, const Tensor& xbc, const Tensor& dt_raw, const Tensor& dt_bias,
                      const Tensor& A_log, const Tensor& D, const Tensor& saved, int64_t head_dim, int64_t n_groups,
                      int64_t chunk_size, DType compute, const Tensor& dxbc, const Tensor& ddt_raw,
                      const Tensor& ddt_bias, const Tensor& dA_log, const Tensor& dD) override {
    const char* op = "mamba2_ssd_bwd";
    const Tensor fxbc = f32_view(xbc);
    const cpu::Mamba2Dims d = mamba2_dims(fxbc, dt_raw, dt_bias, A_log, D, head_dim, n_groups, f32_view(dy), op);
    check_same(fxbc, f32_view(dxbc), op);
    check_same(dt_raw, ddt_raw, op);
    for (const Tensor* t : {&ddt_bias, &dA_log, &dD}) check_same(D, *t, op);
    check(chunk_size >= 1, "mamba2 chunk: chunk_size must be >= 1, got {}", chunk_size);
    const float *pdt = f32(dt_raw, op), *pbias = f32(dt_bias, op), *pA = f32(A_log, op), *pD = f32(D, op);
    float *pddt = f32(ddt_raw, op), *pdbias = f32(ddt_bias, op), *pdA = f32(dA_log, op), *pdD = f32(dD, op);
    // E: dy's, xbc's and dxbc's (bf16 rounded once from fp32)
    dispatch_inputs({&dy, &xbc, &dxbc}, "dy, xbc, dxbc", compute, op, [&](auto zero, auto e) {
      using P = decltype(zero);
      using E = decltype(e);
      const float* sv = mamba2_saved<P>(saved, d, op);
      cuda::mamba2_ssd_bwd<P>(ptr<const E>(dy), ptr<const E>(xbc), pdt, pbias, pA, pD, d.batch, d.seq_len, d.heads,
                              d.head_dim, d.state_dim, d.groups, sv, ptr<E>(dxbc), pddt, pdbias, pdA, pdD,
                              scratch(cuda::mamba2_ssd_bwd_scratch_bytes<P>(d.batch, d.seq_len, d.heads, d.head_dim,
                                                                            d.state_dim, sv != nullptr)),
                              stream_);
    });
  }
  // ---- Mamba-3 (checks as the CPU backend's; f32 as Mamba2) ----
  int64_t mamba3_saved_numel(int64_t batch, int64_t seq_len, int64_t heads, int64_t d_state, int64_t angles,
                             const Mamba3Options& opt) const override {
    return mamba3_saved_floats({batch, seq_len, heads, opt.head_dim, d_state, opt.n_groups, opt.rank, angles}, opt);
  }
  // x, z, out (dout, dx, dz) f32, or bf16 (mamba3_bf16_activations; dispatch on x's dtype, mamba3_dims checks the
  // others against it); bc, raw, the parameters and the saved set f32.
  void mamba3_fwd(const Tensor& x, const Tensor& z, const Tensor& bc, const Tensor& raw, const Mamba3Params& params,
                  const Mamba3Options& opt, const Tensor& out, const Tensor& saved) override {
    const char* op = "mamba3_fwd";
    const cpu::Mamba3LayerDims d = mamba3_dims(x, z, bc, raw, params, opt, out, op, true);
    float* sv = mamba3_saved(saved, d, opt, op);
    const float *b = f32(bc, op), *r = f32(raw, op);
    dispatch(x, op, [&](auto zero) {
      using A = decltype(zero);
      cuda::mamba3_fwd<A>(ptr<const A>(x), ptr<const A>(z), b, r, mamba3_ptrs(params, op), d, opt, ptr<A>(out), sv,
                          scratch(mamba3_fwd_scratch_bytes(d, opt, sv != nullptr)), stream_);
    });
  }
  void mamba3_bwd(const Tensor& dout, const Tensor& x, const Tensor& z, const Tensor& bc, const Tensor& raw,
                  const Tensor& saved, const Mamba3Params& params, const Mamba3Options& opt, const Tensor& dx,
                  const Tensor& dz, const Tensor& dbc, const Tensor& draw, const Mamba3Params& dparams) override {
    const char* op = "mamba3_bwd";
    const cpu::Mamba3LayerDims d = mamba3_dims(x, z, bc, raw, params, opt, dout, op, true);
    mamba3_dims(dx, dz, dbc, draw, dparams, opt, dout, "mamba3_bwd (gradients)", true);
    check(bc.dtype == dbc.dtype, "{}: bc and dbc dtype mismatch ({} vs {})", op, dtype_name(bc.dtype),
          dtype_name(dbc.dtype));
    const Mamba3Ptrs p = mamba3_ptrs(params, op);
    const float* sv = mamba3_saved(saved, d, opt, op);
    const auto g = [&](const Tensor& t) { return t.data ? f32(t, op) : nullptr; };
    const Mamba3GradPtrs gp{g(dparams.dt_bias), g(dparams.B_bias), g(dparams.C_bias), g(dparams.B_norm),
                            g(dparams.C_norm),  g(dparams.D),      g(dparams.mimo_x), g(dparams.mimo_z),
                            g(dparams.mimo_o),  g(dparams.norm)};
    const float *b = f32(bc, op), *r = f32(raw, op);
    float *db = f32(dbc, op), *dr = f32(draw, op);
    dispatch(x, op, [&](auto zero) {
      using A = decltype(zero);
      cuda::mamba3_bwd<A>(ptr<const A>(dout), ptr<const A>(x), ptr<const A>(z), b, r, sv, p, d, opt, ptr<A>(dx),
                          ptr<A>(dz), db, dr, gp, scratch(mamba3_bwd_scratch_bytes(d, opt, sv != nullptr)), stream_);
    });
  }
  void l2norm_fwd(const Tensor& x, int64_t dim, double eps, double scale, const Tensor& y,
                  const Tensor& rinv) override {
    const int64_t rows = x.numel() / dim;
    check(rows * dim == x.numel() && rinv.numel() == rows, "l2norm_fwd: x {} dim {} rinv {}", x.shape_str(), dim,
          rinv.shape_str());
    check(y.numel() == x.numel(), "l2norm_fwd: y {} for x {}", y.shape_str(), x.shape_str());
    const char* op = "l2norm_fwd";
    const float* px = f32(x, op);
    float* prinv = f32(rinv, op);
    dispatch(y, op, [&](auto t) {  // y in f32, or rounded to bf16 for a GDN / Comba core's bf16 q, k, p
      cuda::l2norm_fwd(px, rows, dim, eps, scale, ptr<decltype(t)>(y), prinv, stream_);
    });
  }
  void l2norm_bwd(const Tensor& dy, const Tensor& x, const Tensor& rinv, int64_t dim, double scale,
                  const Tensor& dx) override {
    const int64_t rows = x.numel() / dim;
    check(rows * dim == x.numel() && rinv.numel() == rows, "l2norm_bwd: x {} dim {} rinv {}", x.shape_str(), dim,
          rinv.shape_str());
    check_same(x, dy, "l2norm_bwd");
    check_same(x, dx, "l2norm_bwd");
    const char* op = "l2norm_bwd";
    cuda::l2norm_bwd(f32(dy, op), f32(x, op), f32(rinv, op), rows, dim, scale, f32(dx, op), stream_);
  }
  void gated_rmsnorm_fwd(const Tensor& o, const Tensor& z, const Tensor& w, double eps, bool sigmoid_gate,
                         const Tensor& y, const Tensor& rstd) override {
    const int64_t dim = w.numel(), rows = o.numel() / dim;
    check(rows * dim == o.numel() && rstd.numel() == rows, "gated_rmsnorm_fwd: o {} w {} rstd {}", o.shape_str(),
          w.shape_str(), rstd.shape_str());
    check_same(o, z, "gated_rmsnorm_fwd");
    check(y.numel() == o.numel(), "gated_rmsnorm_fwd: y {} for o {}", y.shape_str(), o.shape_str());
    const char* op = "gated_rmsnorm_fwd";
    dispatch(y, op, [&](auto t) {  // y in f32, or rounded to bf16 for the output projection's product
      cuda::gated_rmsnorm_fwd(f32(o, op), f32(z, op), f32(w, op), rows, dim, eps, sigmoid_gate, ptr<decltype(t)>(y),
                              f32(rstd, op), stream_);
    });
  }
  void gated_rmsnorm_bwd(const Tensor& dy, const Tensor& o, const Tensor& z, const Tensor& w, const Tensor& rstd,
                         bool sigmoid_gate, const Tensor& d_o, const Tensor& dz, const Tensor& dw) override {
    const int64_t dim = w.numel(), rows = o.numel() / dim;
    check(rows * dim == o.numel() && rstd.numel() == rows, "gated_rmsnorm_bwd: o {} w {}", o.shape_str(),
          w.shape_str());
    for (const Tensor* t : {&dy, &z, &d_o}) check_same(o, *t, "gated_rmsnorm_bwd");
    check(dz.numel() == o.numel(), "gated_rmsnorm_bwd: dz {} for o {}", dz.shape_str(), o.shape_str());
    check_same(w, dw, "gated_rmsnorm_bwd");
    const char* op = "gated_rmsnorm_bwd";
    const float *pdy = f32(dy, op), *po = f32(o, op), *pz = f32(z, op), *pw = f32(w, op), *prstd = f32(rstd, op);
    float *pdo = f32(d_o, op), *pdw = f32(dw, op);
    dispatch(dz, op, [&](auto t) {  // dz in f32, or rounded to bf16 for the gate projection's products
      cuda::gated_rmsnorm_bwd(pdy, po, pz, pw, prstd, rows, dim, sigmoid_gate, pdo, ptr<decltype(t)>(dz), pdw,
                              scratch(gated_rmsnorm_bwd_scratch_bytes(rows, dim)), stream_);
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
  bool delta_core_bf16_inputs(DType compute) const override { return compute == DType::bf16; }
  void gdn_chunk_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                     int64_t chunk_size, DType compute, const Tensor& o, const Tensor& saved) override {
    const char* op = "gdn_chunk_fwd";
    const Tensor fq = f32_view(q), fk = f32_view(k), fv = f32_view(v);
    delta_fwd_dims(fq, {&fk}, fv, g, beta, o, false, op);
    const int64_t B = q.shape[0], T = q.shape[1], H = q.shape[2], K = q.shape[3], V = v.shape[3];
    const float *pg = f32(g, op), *pbeta = f32(beta, op);
    float* po = f32(o, op);
    check(chunk_size >= 1 && chunk_size <= cuda::kGdnMaxChunk,
          "gdn_chunk_fwd: the cuda backend needs chunk_size in [1, {}], got {}", cuda::kGdnMaxChunk, chunk_size);
    const DeltaSaved sv = gdn_saved(saved, q, v, chunk_size, compute, op);
    // P: the products' operand type (gdn_comba.cu, Precision); E: q, k, v's
    dispatch_gdn({&q, &k, &v}, compute, op, [&](auto zero, auto e) {
      using P = decltype(zero);
      using E = decltype(e);
      cuda::gdn_chunk_fwd<P>(ptr<const E>(q), ptr<const E>(k), ptr<const E>(v), pg, pbeta, B, T, H, K, V, chunk_size,
                             po, sv.data, sv.states,
                             scratch(cuda::gdn_chunk_fwd_scratch_bytes<P>(B, T, H, K, V, chunk_size,
                                                                          sv.data != nullptr, sv.states)),
                             stream_);
    });
  }
  void gdn_chunk_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                     const Tensor& d_o, const Tensor& saved, int64_t chunk_size, DType compute, const Tensor& dq,
                     const Tensor& dk, const Tensor& dv, const Tensor& dg, const Tensor& dbeta) override {
    const char* op = "gdn_chunk_bwd";
    const Tensor fq = f32_view(q), fk = f32_view(k), fv = f32_view(v);
    delta_bwd_dims(fq, {&fk, &dq, &dk}, fv, g, beta, d_o, dv, dg, dbeta, false, op);
    const int64_t B = q.shape[0], T = q.shape[1], H = q.shape[2], K = q.shape[3], V = v.shape[3];
    const float *pg = f32(g, op), *pbeta = f32(beta, op), *pdo = f32(d_o, op);
    float *pdq = f32(dq, op), *pdk = f32(dk, op), *pdv = f32(dv, op), *pdg = f32(dg, op), *pdbeta = f32(dbeta, op);
    check(chunk_size >= 1 && chunk_size <= cuda::kGdnMaxChunk,
          "gdn_chunk_bwd: the cuda backend needs chunk_size in [1, {}], got {}", cuda::kGdnMaxChunk, chunk_size);
    const DeltaSaved sv = gdn_saved(saved, q, v, chunk_size, compute, op);
    dispatch_gdn({&q, &k, &v}, compute, op, [&](auto zero, auto e) {
      using P = decltype(zero);
      using E = decltype(e);
      cuda::gdn_chunk_bwd<P>(
          ptr<const E>(q), ptr<const E>(k), ptr<const E>(v), pg, pbeta, pdo, sv.data, sv.states, B, T, H, K, V,
          chunk_size, pdq, pdk, pdv, pdg, pdbeta,
          scratch(cuda::gdn_chunk_bwd_scratch_bytes<P>(B, T, H, K, V, chunk_size, sv.data != nullptr, sv.states)),
          stream_);
    });
  }
  int64_t gdn_saved_numel(int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim, int64_t value_dim,
                          int64_t chunk_size, DType compute, bool states) const override {
    // 0 for a chunk_size the cores refuse (their forward says so; a layer planned only to decode runs none).
    if (chunk_size < 1 || chunk_size > std::min(cuda::kGdnMaxChunk, cuda::kCombaMaxChunk)) return 0;
    return gdn_saved_floats(batch, seq_len, heads, key_dim, value_dim, chunk_size, states, compute,
                            "gdn_saved_numel");
  }
  void comba_gates_fwd(const Tensor& q, const Tensor& k, const Tensor& decay, const Tensor& D, const Tensor& q_out,
                       const Tensor& p) override {
    const int64_t heads = comba_gate_heads(q, decay, D, "comba_gates_fwd");
    for (const Tensor* t : {&k, &q_out, &p}) check_same(q, *t, "comba_gates_fwd");
    const int64_t rows = q.shape[0], dim = q.shape[1] / heads;
    const char* op = "comba_gates_fwd";
    const float *pq = f32(q, op), *pk = f32(k, op), *pdecay = optional_f32(decay, op), *pD = optional_f32(D, op);
    float *pq_out = f32(q_out, op), *pp = f32(p, op);
    cuda::comba_gates_fwd(pq, pk, pdecay, pD, rows, heads, dim, pq_out, pp, stream_);
  }
  void comba_gates_bwd(const Tensor& dq_out, const Tensor& dp, const Tensor& k, const Tensor& decay, const Tensor& D,
                       const Tensor& dk, const Tensor& ddecay, const Tensor& dD) override {
    const int64_t heads = comba_gate_heads(k, decay, D, "comba_gates_bwd");
    for (const Tensor* t : {&dq_out, &dp, &dk}) check_same(k, *t, "comba_gates_bwd");
    if (decay.data != nullptr) check_same(decay, ddecay, "comba_gates_bwd");
    if (D.data != nullptr) check_same(D, dD, "comba_gates_bwd");
    const int64_t rows = k.shape[0], dim = k.shape[1] / heads;
    const char* op = "comba_gates_bwd";
    const float *pdq = f32(dq_out, op), *pdp = f32(dp, op), *pk = f32(k, op), *pdecay = optional_f32(decay, op),
                *pD = optional_f32(D, op);
    float* pdk = f32(dk, op);
    float* pddecay = decay.data != nullptr ? f32(ddecay, op) : nullptr;
    float* pdD = D.data != nullptr ? f32(dD, op) : nullptr;
    cuda::comba_gates_bwd(pdq, pdp, pk, pdecay, pD, rows, heads, dim, pdk, pddecay, pdD,
                          scratch(cuda::comba_gates_bwd_scratch_bytes(rows, heads)), stream_);
  }
  void comba_chunk_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& p, const Tensor& g,
                       const Tensor& beta, int64_t chunk_size, DType compute, const Tensor& o,
                       const Tensor& saved) override {
    const char* op = "comba_chunk_fwd";
    const Tensor fq = f32_view(q), fk = f32_view(k), fv = f32_view(v), fp = f32_view(p);
    delta_fwd_dims(fq, {&fk, &fp}, fv, g, beta, o, false, op);
    const int64_t B = q.shape[0], T = q.shape[1], H = q.shape[2], K = q.shape[3], V = v.shape[3];
    const float *pg = f32(g, op), *pbeta = f32(beta, op);
    float* po = f32(o, op);
    check(chunk_size >= 1 && chunk_size <= cuda::kCombaMaxChunk,
          "comba_chunk_fwd: the cuda backend needs chunk_size in [1, {}], got {}", cuda::kCombaMaxChunk, chunk_size);
    const DeltaSaved sv = gdn_saved(saved, q, v, chunk_size, compute, op);
    dispatch_gdn({&q, &k, &v, &p}, compute, op, [&](auto zero, auto e) {
      using P = decltype(zero);
      using E = decltype(e);
      cuda::comba_chunk_fwd<P>(ptr<const E>(q), ptr<const E>(k), ptr<const E>(v), ptr<const E>(p), pg, pbeta, B, T, H,
                               K, V, chunk_size, po, sv.data, sv.states,
                               scratch(cuda::comba_chunk_fwd_scratch_bytes<P>(B, T, H, K, V, chunk_size,
                                                                              sv.data != nullptr, sv.states)),
                               stream_);
    });
  }
  void comba_chunk_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& p, const Tensor& g,
                       const Tensor& beta, const Tensor& d_o, const Tensor& saved, int64_t chunk_size, DType compute,
                       const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dp, const Tensor& dg,
                       const Tensor& dbeta) override {
    const char* op = "comba_chunk_bwd";
    const Tensor fq = f32_view(q), fk = f32_view(k), fv = f32_view(v), fp = f32_view(p);
    delta_bwd_dims(fq, {&fk, &fp, &dq, &dk, &dp}, fv, g, beta, d_o, dv, dg, dbeta, false, op);
    const int64_t B = q.shape[0], T = q.shape[1], H = q.shape[2], K = q.shape[3], V = v.shape[3];
    const float *pg = f32(g, op), *pbeta = f32(beta, op), *pdo = f32(d_o, op);
    float *pdq = f32(dq, op), *pdk = f32(dk, op), *pdv = f32(dv, op), *pdp = f32(dp, op), *pdg = f32(dg, op),
          *pdbeta = f32(dbeta, op);
    check(chunk_size >= 1 && chunk_size <= cuda::kCombaMaxChunk,
          "comba_chunk_bwd: the cuda backend needs chunk_size in [1, {}], got {}", cuda::kCombaMaxChunk, chunk_size);
    const DeltaSaved sv = gdn_saved(saved, q, v, chunk_size, compute, op);
    dispatch_gdn({&q, &k, &v, &p}, compute, op, [&](auto zero, auto e) {
      using P = decltype(zero);
      using E = decltype(e);
      cuda::comba_chunk_bwd<P>(
          ptr<const E>(q), ptr<const E>(k), ptr<const E>(v), ptr<const E>(p), pg, pbeta, pdo, sv.data, sv.states, B,
          T, H, K, V, chunk_size, pdq, pdk, pdv, pdp, pdg, pdbeta,
          scratch(cuda::comba_chunk_bwd_scratch_bytes<P>(B, T, H, K, V, chunk_size, sv.data != nullptr, sv.states)),
          stream_);
    });
  }

  void kda_chunk_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                     int64_t chunk_size, DType compute, const Tensor& o, const Tensor& saved) override {
    const DeltaCoreDims d = delta_fwd_dims(q, {&k}, v, g, beta, o, true, "kda_chunk_fwd");
    const char* op = "kda_chunk_fwd";
    const float *pq = f32(q, op), *pk = f32(k, op), *pv = f32(v, op), *pg = f32(g, op), *pbeta = f32(beta, op);
    float* po = f32(o, op);
    check(chunk_size >= 1 && chunk_size <= cuda::kKdaMaxChunk,
          "kda_chunk_fwd: the cuda backend needs chunk_size in [1, {}], got {}", cuda::kKdaMaxChunk, chunk_size);
    const DeltaSaved sv = kda_saved(saved, d, chunk_size, op);
    dispatch(compute, op, [&](auto zero) {  // the products' operand type (kda.cu, Precision)
      using P = decltype(zero);
      cuda::kda_chunk_fwd<P>(pq, pk, pv, pg, pbeta, d.batch, d.seq_len, d.heads, d.key_dim, d.value_dim, chunk_size,
                             po, sv.data, sv.states,
                             scratch(cuda::kda_chunk_fwd_scratch_bytes(d.batch, d.seq_len, d.heads, d.key_dim,
                                                                       d.value_dim, chunk_size, sv.data != nullptr,
                                                                       sv.states)),
                             stream_);
    });
  }
  int64_t kda_saved_numel(int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim, int64_t value_dim,
                          int64_t chunk_size, DType /*compute*/, bool states) const override {
    if (chunk_size < 1 || chunk_size > cuda::kKdaMaxChunk) return 0;  // (as gdn_saved_numel)
    return cuda::kda_saved_floats(batch, seq_len, heads, key_dim, value_dim, chunk_size, states);  // (fp32 for either)
  }
  void kda_chunk_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                     const Tensor& d_o, const Tensor& saved, int64_t chunk_size, DType compute, const Tensor& dq,
                     const Tensor& dk, const Tensor& dv, const Tensor& dg, const Tensor& dbeta) override {
    const DeltaCoreDims d = delta_bwd_dims(q, {&k, &dq, &dk}, v, g, beta, d_o, dv, dg, dbeta, true, "kda_chunk_bwd");
    const char* op = "kda_chunk_bwd";
    const float *pq = f32(q, op), *pk = f32(k, op), *pv = f32(v, op), *pg = f32(g, op), *pbeta = f32(beta, op),
                *pdo = f32(d_o, op);
    float *pdq = f32(dq, op), *pdk = f32(dk, op), *pdv = f32(dv, op), *pdg = f32(dg, op), *pdbeta = f32(dbeta, op);
    check(chunk_size >= 1 && chunk_size <= cuda::kKdaMaxChunk,
          "kda_chunk_bwd: the cuda backend needs chunk_size in [1, {}], got {}", cuda::kKdaMaxChunk, chunk_size);
    const DeltaSaved sv = kda_saved(saved, d, chunk_size, op);
    dispatch(compute, op, [&](auto zero) {
      using P = decltype(zero);
      cuda::kda_chunk_bwd<P>(pq, pk, pv, pg, pbeta, pdo, sv.data, sv.states, d.batch, d.seq_len, d.heads, d.key_dim,
                             d.value_dim, chunk_size, pdq, pdk, pdv, pdg, pdbeta,
                             scratch(cuda::kda_chunk_bwd_scratch_bytes(d.batch, d.seq_len, d.heads, d.key_dim,
                                                                       d.value_dim, chunk_size, sv.data != nullptr,
                                                                       sv.states)),
                             stream_);
    });
  }

  // MDN (mdn.md; semantics cpu/mdn_gates.h, cpu/mdn.h): f32 only, like the other delta-rule ops.
  void mdn_gates_fwd(const Tensor& z_alpha, const Tensor& z_beta, const Tensor& z_mu, const Tensor& z_eta,
                     const MdnGateParams& p, const MdnGateOptions& opt, const Tensor& log_alpha, const Tensor& beta,
                     const Tensor& log_mu, const Tensor& eta) override {
    const char* op = "mdn_gates_fwd";
    const int64_t heads = mdn_gate_heads(z_alpha, z_mu, z_eta, p, opt, op);
    for (const Tensor* t : {&z_beta, &log_alpha, &beta, &log_mu, &eta}) check_same(z_alpha, *t, op);
    cuda::mdn_gates_fwd(f32(z_alpha, op), f32(z_beta, op), optional_f32(z_mu, op), optional_f32(z_eta, op),
                        f32(p.A_log, op), f32(p.dt_bias, op), optional_f32(p.Mu_log, op), optional_f32(p.mu_bias, op),
                        f32(p.log_factor, op), z_alpha.shape[0], heads, opt, f32(log_alpha, op), f32(beta, op),
                        f32(log_mu, op), f32(eta, op), stream_);
  }
  void mdn_gates_bwd(const Tensor& d_log_alpha, const Tensor& d_beta, const Tensor& d_log_mu, const Tensor& d_eta,
                     const Tensor& z_alpha, const Tensor& z_beta, const Tensor& z_mu, const Tensor& z_eta,
                     const MdnGateParams& p, const MdnGateOptions& opt, const Tensor& dz_alpha, const Tensor& dz_beta,
                     const Tensor& dz_mu, const Tensor& dz_eta, const MdnGateParams& dp) override {
    const char* op = "mdn_gates_bwd";
    const int64_t heads = mdn_gate_heads(z_alpha, z_mu, z_eta, p, opt, op);
    for (const Tensor* t : {&z_beta, &d_log_alpha, &d_beta, &dz_alpha, &dz_beta}) check_same(z_alpha, *t, op);
    for (auto [a, b] : {std::pair{&p.A_log, &dp.A_log}, {&p.dt_bias, &dp.dt_bias}, {&p.log_factor, &dp.log_factor}})
      check_same(*a, *b, op);
    if (opt.momentum) {
      for (const Tensor* t : {&d_log_mu, &d_eta, &dz_mu, &dz_eta}) check_same(z_alpha, *t, op);
      check_same(p.Mu_log, dp.Mu_log, op);
      check_same(p.mu_bias, dp.mu_bias, op);
    }
    const auto mut = [&](const Tensor& t) { return t.data != nullptr && opt.momentum ? f32(t, op) : nullptr; };
    cuda::mdn_gates_bwd(f32(d_log_alpha, op), f32(d_beta, op), mut(d_log_mu), mut(d_eta), f32(z_alpha, op),
                        f32(z_beta, op), mut(z_mu), mut(z_eta), f32(p.A_log, op), f32(p.dt_bias, op), mut(p.Mu_log),
                        mut(p.mu_bias), f32(p.log_factor, op), z_alpha.shape[0], heads, opt, f32(dz_alpha, op),
                        f32(dz_beta, op), mut(dz_mu), mut(dz_eta), f32(dp.A_log, op), f32(dp.dt_bias, op),
                        mut(dp.Mu_log), mut(dp.mu_bias), f32(dp.log_factor, op),
                        scratch(cuda::mdn_gates_bwd_scratch_bytes(z_alpha.shape[0], heads)), stream_);
  }
  void mdn_correction_fwd(const Tensor& q, const Tensor& k, const Tensor& D_log, const Tensor& q_out) override {
    const char* op = "mdn_correction_fwd";
    const int64_t heads = mdn_correction_heads(q, D_log, op);
    check_same(q, k, op);
    check_same(q, q_out, op);
    cuda::mdn_correction_fwd(f32(q, op), f32(k, op), f32(D_log, op), q.shape[0], heads, q.shape[1] / heads,
                             f32(q_out, op), stream_);
  }
  void mdn_correction_bwd(const Tensor& dq_out, const Tensor& k, const Tensor& D_log, const Tensor& dk,
                          const Tensor& dD_log) override {
    const char* op = "mdn_correction_bwd";
    const int64_t heads = mdn_correction_heads(k, D_log, op);
    check_same(k, dq_out, op);
    check_same(k, dk, op);
    check_same(D_log, dD_log, op);
    void* scr = scratch(cuda::mdn_correction_bwd_scratch_bytes(k.shape[0], heads));
    cuda::mdn_correction_bwd(f32(dq_out, op), f32(k, op), f32(D_log, op), k.shape[0], heads, k.shape[1] / heads,
                             f32(dk, op), f32(dD_log, op), scr, stream_);
  }
  void mdn_chunk_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& log_alpha, const Tensor& beta,
                     const Tensor& log_mu, const Tensor& eta, int64_t chunk_size, DType compute, const Tensor& o,
                     const Tensor& residuals) override {
    const char* op = "mdn_chunk_fwd";
    const DeltaCoreDims d = delta_core_dims(q, v, log_alpha, beta, false, op);
    check_same(v, o, op);
    const bool saved = residuals.data != nullptr;
    if (saved) check_same(v, residuals, op);
    check_same(q, k, op);
    for (const Tensor* t : {&beta, &log_mu, &eta}) check_same(log_alpha, *t, op);
    check(chunk_size >= 1 && chunk_size <= cuda::kMdnMaxChunk,
          "mdn_chunk_fwd: the cuda backend needs chunk_size in [1, {}], got {}", cuda::kMdnMaxChunk, chunk_size);
    void* scr = scratch(cuda::mdn_chunk_fwd_scratch_bytes(d.batch, d.seq_len, d.heads, d.key_dim, d.value_dim,
                                                          chunk_size, saved));
    dispatch(compute, op, [&](auto zero) {  // the products' operand type (mdn.cu, Precision)
      using P = decltype(zero);
      cuda::mdn_chunk_fwd<P>(f32(q, op), f32(k, op), f32(v, op), f32(log_alpha, op), f32(beta, op), f32(log_mu, op),
                             f32(eta, op), d.batch, d.seq_len, d.heads, d.key_dim, d.value_dim, chunk_size, f32(o, op),
                             saved ? f32(residuals, op) : nullptr, scr, stream_);
    });
  }
  void mdn_chunk_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& log_alpha, const Tensor& beta,
                     const Tensor& log_mu, const Tensor& eta, const Tensor& d_o, const Tensor& residuals,
                     int64_t chunk_size, DType compute, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                     const Tensor& dlog_alpha, const Tensor& dbeta, const Tensor& dlog_mu,
                     const Tensor& deta) override {
    const char* op = "mdn_chunk_bwd";
    const DeltaCoreDims d = delta_core_dims(q, v, log_alpha, beta, false, op);
    for (const Tensor* t : {&k, &dq, &dk}) check_same(q, *t, op);
    for (const Tensor* t : {&d_o, &dv}) check_same(v, *t, op);
    const bool saved = residuals.data != nullptr;
    if (saved) check_same(v, residuals, op);
    for (const Tensor* t : {&beta, &log_mu, &eta, &dlog_alpha, &dbeta, &dlog_mu, &deta}) check_same(log_alpha, *t, op);
    check(chunk_size >= 1 && chunk_size <= cuda::kMdnMaxChunk,
          "mdn_chunk_bwd: the cuda backend needs chunk_size in [1, {}], got {}", cuda::kMdnMaxChunk, chunk_size);
    void* scr = scratch(cuda::mdn_chunk_bwd_scratch_bytes(d.batch, d.seq_len, d.heads, d.key_dim, d.value_dim,
                                                          chunk_size, saved));
    dispatch(compute, op, [&](auto zero) {  // the products' operand type (mdn.cu, Precision)
      using P = decltype(zero);
      cuda::mdn_chunk_bwd<P>(f32(q, op), f32(k, op), f32(v, op), f32(log_alpha, op), f32(beta, op), f32(log_mu, op),
                             f32(eta, op), f32(d_o, op), optional_f32(residuals, op), d.batch, d.seq_len, d.heads,
                             d.key_dim, d.value_dim, chunk_size, f32(dq, op), f32(dk, op), f32(dv, op),
                             f32(dlog_alpha, op), f32(dbeta, op), f32(dlog_mu, op), f32(deta, op), scr, stream_);
    });
  }

  // ---- incremental decoding (checks as the CPU backend's, backend_util.h; attention in f32 or bf16, the
  // recurrent ops f32: the layers keep those activations and states in the master dtype) ----
  void rope_fwd_at(const Tensor& x, double theta, int64_t position) override {
    check(x.ndim == 4 && x.shape[3] % 2 == 0 && position >= 0,
          "rope_fwd_at: x must be [B, T, H, Dh] with even Dh and position >= 0, got {} at {}", x.shape_str(), position);
    dispatch(x, "rope_fwd_at", [&](auto zero) {
      using T = decltype(zero);
      cuda::rope_fwd_at(ptr<T>(x), x.shape[0], x.shape[1], x.shape[2], x.shape[3], theta, position, stream_);
    });
  }
  void attention_decode(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& k_cache,
                        const Tensor& v_cache, int64_t position, double scale, const Tensor& o) override {
    check_attention_decode(q, k, v, k_cache, v_cache, position, o);
    dispatch(q, "attention_decode", [&](auto zero) {
      using T = decltype(zero);
      cuda::attention_decode(ptr<T>(q), ptr<T>(k), ptr<T>(v), q.shape[0], q.shape[1], q.shape[2], q.shape[3],
                             k_cache.shape[1], position, scale, ptr<T>(k_cache), ptr<T>(v_cache), ptr<T>(o), stream_);
    });
  }
  void short_conv_silu_decode(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& window,
                              const Tensor& y) override {
    const char* op = "short_conv_silu_decode";
    const int64_t W = short_conv_decode_width(x, w, bias, window, f32_view(y));
    const float *px = f32(x, op), *pw = f32(w, op), *pbias = optional_f32(bias, op);
    float* pwindow = window.numel() ? f32(window, op) : nullptr;
    dispatch(y, op, [&](auto t) {  // y in f32, or rounded to bf16 for gdn_decode / comba_decode's bf16 v (or
                                   // mamba2_ssd_decode's xbc)
      cuda::short_conv_silu_decode(px, pw, pbias, x.shape[0], x.shape[1], x.shape[2], W, pwindow, ptr<decltype(t)>(y),
                                   stream_);
    });
  }
  void gdn_decode(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                  int64_t, const Tensor& state, const Tensor& o) override {
    const char* op = "gdn_decode";
    const DeltaCoreDims d = delta_decode_dims(f32_view(q), f32_view(v), g, beta, state, false, op);
    check_same(f32_view(q), f32_view(k), op);
    check_same(f32_view(v), o, op);
    with_gdn_inputs({&q, &k, &v}, op, [&](auto e) {
      using E = decltype(e);
      cuda::gdn_decode(ptr<const E>(q), ptr<const E>(k), ptr<const E>(v), f32(g, op), f32(beta, op), d.batch,
                       d.seq_len, d.heads, d.key_dim, d.value_dim, f32(state, op), f32(o, op), stream_);
    });
  }
  void kda_decode(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                  int64_t, const Tensor& state, const Tensor& o) override {
    const char* op = "kda_decode";
    const DeltaCoreDims d = delta_decode_dims(q, v, g, beta, state, true, op);
    check_same(q, k, op);
    check_same(v, o, op);
    cuda::kda_decode(f32(q, op), f32(k, op), f32(v, op), f32(g, op), f32(beta, op), d.batch, d.seq_len, d.heads,
                     d.key_dim, d.value_dim, f32(state, op), f32(o, op), stream_);
  }
  void comba_decode(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& p, const Tensor& g,
                    const Tensor& beta, int64_t, const Tensor& state, const Tensor& o) override {
    const char* op = "comba_decode";
    const DeltaCoreDims d = delta_decode_dims(f32_view(q), f32_view(v), g, beta, state, false, op);
    for (const Tensor* t : {&k, &p}) check_same(f32_view(q), f32_view(*t), op);
    check_same(f32_view(v), o, op);
    with_gdn_inputs({&q, &k, &v, &p}, op, [&](auto e) {
      using E = decltype(e);
      cuda::comba_decode(ptr<const E>(q), ptr<const E>(k), ptr<const E>(v), ptr<const E>(p), f32(g, op),
                         f32(beta, op), d.batch, d.seq_len, d.heads, d.key_dim, d.value_dim, f32(state, op),
                         f32(o, op), stream_);
    });
  }
  void mdn_decode(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& log_alpha, const Tensor& beta,
                  const Tensor& log_mu, const Tensor& eta, int64_t, const Tensor& state, const Tensor& momentum,
                  const Tensor& o) override {
    const char* op = "mdn_decode";
    const DeltaCoreDims d = delta_decode_dims(q, v, log_alpha, beta, state, false, op);
    check_same(q, k, op);
    check_same(v, o, op);
    check_same(state, momentum, op);
    for (const Tensor* t : {&log_mu, &eta}) check_same(beta, *t, op);
    cuda::mdn_decode(f32(q, op), f32(k, op), f32(v, op), f32(log_alpha, op), f32(beta, op), f32(log_mu, op),
                     f32(eta, op), d.batch, d.seq_len, d.heads, d.key_dim, d.value_dim, f32(state, op),
                     f32(momentum, op), f32(o, op), stream_);
  }
  void mamba2_ssd_decode(const Tensor& xbc, const Tensor& dt_raw, const Tensor& dt_bias, const Tensor& A_log,
                         const Tensor& D, int64_t head_dim, int64_t n_groups, int64_t, const Tensor& state,
                         const Tensor& y) override {
    const char* op = "mamba2_ssd_decode";
    const cpu::Mamba2Dims d =
        mamba2_dims(f32_view(xbc), dt_raw, dt_bias, A_log, D, head_dim, n_groups, f32_view(y), op);
    check_decode_state(state, d.batch * d.heads * d.head_dim * d.state_dim, dt_raw.dtype, op, "state [B, H, P, N]");
    with_inputs({&xbc, &y}, "xbc, y", op, [&](auto e) {  // xbc and y f32, or bf16 (mamba2_bf16_inputs)
      using E = decltype(e);
      cuda::mamba2_ssd_decode(ptr<const E>(xbc), f32(dt_raw, op), f32(dt_bias, op), f32(A_log, op), f32(D, op),
                              d.batch, d.seq_len, d.heads, d.head_dim, d.state_dim, d.groups, f32(state, op),
                              ptr<E>(y), stream_);
    });
  }
  void mamba3_decode(const Tensor& x, const Tensor& z, const Tensor& bc, const Tensor& raw, const Mamba3Params& params,
                     const Mamba3Options& opt, const Mamba3Carry& carry, const Tensor& out) override {
    const char* op = "mamba3_decode";
    const cpu::Mamba3LayerDims d = mamba3_dims(x, z, bc, raw, params, opt, out, op, true);
    check_mamba3_carry(carry, d, bc.dtype);
    const cuda::Mamba3CarryPtrs c{f32(carry.state, op), f32(carry.k_prev, op), f32(carry.v_prev, op),
                                  carry.phase.numel() ? f32(carry.phase, op) : nullptr};
    const float *b = f32(bc, op), *r = f32(raw, op);
    dispatch(x, op, [&](auto zero) {  // x, z, out f32 or bf16 (mamba3_bf16_activations)
      using A = decltype(zero);
      cuda::mamba3_decode<A>(ptr<const A>(x), ptr<const A>(z), b, r, mamba3_ptrs(params, op), d, opt, c, ptr<A>(out),
                             scratch(mamba3_fwd_scratch_bytes(d, opt, false)), stream_);
    });
  }

 private:
  /// The f32 data of an optional tensor (nullptr for a default-constructed one).
  static const float* optional_f32(const Tensor& t, const char* op) {
    return t.data != nullptr ? f32(t, op) : nullptr;
  }

  /// Heads of a Comba gates call (the CPU backend's check): x [rows, H * K]; decay, D [H] or absent, not both.
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

  /// The decay gates (cpu/delta_gates.h) for gdn_gates_* (dim 1) and kda_gates_* (dim K).
  void gates_fwd(const Tensor& a, const Tensor& b, const Tensor& A_log, const Tensor& dt_bias, const Tensor& g,
                 const Tensor& beta, const char* op) {
    const GateDims gd = gate_dims(a, b, A_log, dt_bias, g, beta, op);
    cuda::decay_gates_fwd(f32(a, op), f32(b, op), f32(A_log, op), f32(dt_bias, op), gd.rows, gd.heads, gd.dim,
                          f32(g, op), f32(beta, op), stream_);
  }
  void gates_bwd(const Tensor& dg, const Tensor& dbeta, const Tensor& a, const Tensor& b, const Tensor& A_log,
                 const Tensor& dt_bias, const Tensor& da, const Tensor& db, const Tensor& dA_log,
                 const Tensor& ddt_bias, const char* op) {
    const GateDims gd = gate_bwd_dims(dg, dbeta, a, b, A_log, dt_bias, da, db, dA_log, ddt_bias, op);
    const float *pdg = f32(dg, op), *pdbeta = f32(dbeta, op), *pa = f32(a, op), *pb = f32(b, op),
                *pA = f32(A_log, op), *pdt = f32(dt_bias, op);
    float *pda = f32(da, op), *pdb = f32(db, op), *pdA = f32(dA_log, op), *pddt = f32(ddt_bias, op);
    cuda::decay_gates_bwd(pdg, pdbeta, pa, pb, pA, pdt, gd.rows, gd.heads, gd.dim, pda, pdb, pdA, pddt,
                          scratch(cuda::decay_gates_bwd_scratch_bytes(gd.rows, gd.heads, gd.dim)), stream_);
  }

  /// Head sizes of the bf16 tensor-core attention (flash_attention.cuh); others take the fp32 kernel.
  static bool flash_head_dim(int64_t head_dim) { return head_dim == 64 || head_dim == 128; }

  static void check_rope(const Tensor& x) {
    check(x.ndim == 4 && x.shape[3] % 2 == 0, "rope: x must be [B, T, H, Dh] with even Dh, got {}", x.shape_str());
  }

  /// The one double an op wrote to result_, after the stream has finished.
  double result_to_host() {
    double host = 0.0;
    LLMT_CUDA_CHECK(cudaMemcpyAsync(&host, result_, sizeof(double), cudaMemcpyDeviceToHost, stream_));
    LLMT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return host;
  }

  /// Scratch of at least `bytes` bytes, shared by the ops (they run in order on one stream);
  /// grown on demand and kept, so steady-state steps allocate nothing.
  void* scratch(size_t bytes) {
    if (bytes > scratch_bytes_) {
      // cudaFree waits for the device, so no queued kernel still reads the old buffer.
      if (scratch_) LLMT_CUDA_CHECK(cudaFree(scratch_));
      scratch_ = nullptr;
      scratch_bytes_ = 0;
      LLMT_CUDA_CHECK(cudaMalloc(&scratch_, bytes));
      scratch_bytes_ = bytes;
    }
    return scratch_;
  }

  void destroy() noexcept {
    if (scratch_) cudaFree(scratch_);
    if (result_) cudaFree(result_);
    if (cublas_) cublasDestroy(cublas_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  double* result_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  AllocationLog allocations_;
};

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the error so later calls do not see it
    return 0;
  }
  return n;
}

std::unique_ptr<Backend> make_cuda_backend() { return std::make_unique<CudaBackend>(); }

}  // namespace llmt::cuda
