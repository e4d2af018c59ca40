// The CUDA backend: the CPU backend's shape/dtype checks, then the launchers of ops.cuh on
// one stream, and cuBLAS (fp32 compute, no TF32) for matmul. This increment runs f32 only.
#include "kernels/cuda/cuda_backend.h"

#include <cublas_v2.h>

#include <algorithm>
#include <climits>

#include "kernels/backend_util.h"
#include "kernels/cuda/common.cuh"
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

const int32_t* i32(const Tensor& t, const char* op) {
  check(t.dtype == DType::i32, "{}: ids/targets must be i32, got {}", op, dtype_name(t.dtype));
  return static_cast<const int32_t*>(t.data);
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
      throw Error(fmt::format("cuda backend: out of memory allocating {} bytes ({})", bytes,
                              cudaGetErrorString(err)));
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
  void fill_zero(const Tensor& t) override {
    if (t.bytes()) LLMT_CUDA_CHECK(cudaMemsetAsync(t.data, 0, t.bytes(), stream_));
  }
  void copy(const Tensor& src, const Tensor& dst) override {
    check_same(src, dst, "copy");
    if (src.data != dst.data && src.bytes())
      LLMT_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.bytes(), cudaMemcpyDeviceToDevice, stream_));
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

  // Row-major C[M,N] = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS gets B
  // first, with the row-major storage read as the transposed column-major matrix.
  void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
              bool accumulate) override {
    const auto [M, N, K] = matmul_dims(a, trans_a, b, trans_b, c);
    check(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX, "gemm: M={} N={} K={} must each lie in [0, {}]", M, N, K,
          INT_MAX);
    const float* pa = f32(a, "matmul");
    const float* pb = f32(b, "matmul");
    float* pc = f32(c, "matmul");
    if (M == 0 || N == 0) return;
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    const int lda = static_cast<int>(std::max<int64_t>(1, trans_a ? M : K));
    const int ldb = static_cast<int>(std::max<int64_t>(1, trans_b ? K : N));
    LLMT_CUBLAS_CHECK(cublasGemmEx(cublas_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha, pb,
                                   CUDA_R_32F, ldb, pa, CUDA_R_32F, lda, &beta, pc, CUDA_R_32F, static_cast<int>(N),
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
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
    check(x.numel() == rows * dim && rstd.numel() == rows, "rmsnorm_fwd: x {} w {} rstd {}", x.shape_str(),
          w.shape_str(), rstd.shape_str());
    check_same(x, y, "rmsnorm_fwd");
    cuda::rmsnorm_fwd(f32(x, "rmsnorm_fwd"), f32(w, "rmsnorm_fwd"), rows, dim, eps, f32(y, "rmsnorm_fwd"),
                      f32(rstd, "rmsnorm_fwd"), stream_);
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
    cuda::rope_fwd(f32(x, "rope"), x.shape[0], x.shape[1], x.shape[2], x.shape[3], theta, stream_);
  }
  void rope_bwd(const Tensor& dx, double theta) override {
    check_rope(dx);
    cuda::rope_bwd(f32(dx, "rope"), dx.shape[0], dx.shape[1], dx.shape[2], dx.shape[3], theta, stream_);
  }

  void attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, double scale, const Tensor& o,
                     const Tensor& lse) override {
    check(q.ndim == 4, "attention_fwd: q must be [B, T, H, Dh], got {}", q.shape_str());
    check_same(q, k, "attention_fwd");
    check_same(q, v, "attention_fwd");
    check_same(q, o, "attention_fwd");
    check(lse.numel() == q.shape[0] * q.shape[1] * q.shape[2], "attention_fwd: lse {}", lse.shape_str());
    const char* op = "attention_fwd";
    cuda::attention_fwd(f32(q, op), f32(k, op), f32(v, op), q.shape[0], q.shape[1], q.shape[2], q.shape[3], scale,
                        f32(o, op), f32(lse, op), stream_);
  }
  void attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
                     const Tensor& dout, double scale, const Tensor& dq, const Tensor& dk,
                     const Tensor& dv) override {
    check(q.ndim == 4, "attention_bwd: q must be [B, T, H, Dh], got {}", q.shape_str());
    for (const Tensor* t : {&k, &v, &o, &dout, &dq, &dk, &dv}) check_same(q, *t, "attention_bwd");
    const char* op = "attention_bwd";
    const int64_t B = q.shape[0], T = q.shape[1], H = q.shape[2], Dh = q.shape[3];
    const float *pq = f32(q, op), *pk = f32(k, op), *pv = f32(v, op), *po = f32(o, op), *plse = f32(lse, op),
                *pdout = f32(dout, op);
    float *pdq = f32(dq, op), *pdk = f32(dk, op), *pdv = f32(dv, op);
    cuda::attention_bwd(pq, pk, pv, po, plse, pdout, B, T, H, Dh, scale, pdq, pdk, pdv,
                        scratch(attention_bwd_scratch_bytes(B, T, H, Dh)), stream_);
  }

  void swiglu_fwd(const Tensor& gate, const Tensor& up, const Tensor& h) override {
    check_same(gate, up, "swiglu_fwd");
    check_same(gate, h, "swiglu_fwd");
    const char* op = "swiglu_fwd";
    cuda::swiglu_fwd(f32(gate, op), f32(up, op), gate.numel(), f32(h, op), stream_);
  }
  void swiglu_bwd(const Tensor& gate, const Tensor& up, const Tensor& dh, const Tensor& dgate,
                  const Tensor& dup) override {
    for (const Tensor* t : {&up, &dh, &dgate, &dup}) check_same(gate, *t, "swiglu_bwd");
    const char* op = "swiglu_bwd";
    cuda::swiglu_bwd(f32(gate, op), f32(up, op), f32(dh, op), gate.numel(), f32(dgate, op), f32(dup, op), stream_);
  }

  double cross_entropy(const Tensor& logits, const Tensor& targets, double grad_scale,
                       const Tensor& losses) override {
    check(logits.ndim == 2 && targets.numel() == logits.shape[0] && losses.numel() == logits.shape[0],
          "cross_entropy: logits {} targets {} losses {}", logits.shape_str(), targets.shape_str(),
          losses.shape_str());
    const char* op = "cross_entropy";
    cuda::cross_entropy(f32(logits, op), i32(targets, op), logits.shape[0], logits.shape[1], grad_scale,
                        f32(losses, op), result_, stream_);
    return result_to_host();
  }

  void adamw_step(const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                  const AdamWParams& hp, double grad_scale, int64_t step) override {
    for (const Tensor* t : {&grads, &m, &v}) check_same(params, *t, "adamw_step");
    const char* op = "adamw_step";
    cuda::adamw_step(f32(params, op), f32(grads, op), f32(m, op), f32(v, op), params.numel(), hp.lr, hp.beta1,
                     hp.beta2, hp.eps, hp.weight_decay, grad_scale, step, stream_);
  }

 private:
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
