// RMSNorm forward and backward (layers-ssm-attn.md §1.1), statistics in double like the
// CPU reference; the forward also fused with the residual add before it (add_rmsnorm_fwd).
// The weight gradient is reduced deterministically: per-chunk partial sums
// over fixed row ranges into scratch, then a fixed-order sum over the chunks.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.cuh"

namespace llmt::cuda {
namespace {

// One row by the whole block: r = 1 / sqrt(mean_j(x_j^2) + eps);  y = x r w. Thread t reads
// xr[j] only for j = t, t + blockDim.x, ...
template <typename Ty>
__device__ void rmsnorm_row(const float* xr, const float* w, int64_t dim, double eps, Ty* yr, float* rstd) {
  double ss = 0.0;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
    const double v = xr[j];
    ss += v * v;
  }
  ss = block_reduce(ss, SumOp{}, 0.0);
  const double rs = 1.0 / sqrt(ss / static_cast<double>(dim) + eps);
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x)
    yr[j] = from_f32<Ty>(static_cast<float>(static_cast<double>(xr[j]) * rs * w[j]));
  if (threadIdx.x == 0) *rstd = static_cast<float>(rs);
}

// (one block per row)
template <typename Ty>
__global__ void rmsnorm_fwd_kernel(const float* x, const float* w, int64_t rows, int64_t dim, double eps, Ty* y,
                                   float* rstd) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) rmsnorm_row(x + r * dim, w, dim, eps, y + r * dim, rstd + r);
}

// h = x + branch (float, as the add kernel), then the row's norm from h: each thread normalises
// the elements it wrote itself, so no barrier is needed between the two.   (one block per row)
template <typename Ty>
__global__ void add_rmsnorm_fwd_kernel(const float* x, const float* branch, const float* w, int64_t rows,
                                       int64_t dim, double eps, float* h, Ty* y, float* rstd) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float* hr = h + r * dim;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) hr[j] = x[r * dim + j] + branch[r * dim + j];
    rmsnorm_row(hr, w, dim, eps, y + r * dim, rstd + r);
  }
}

// g = dy w;  dx += r g - (r^3 / d) (Σ_j g_j x_j) x   (one block per row)
__global__ void rmsnorm_bwd_dx_kernel(const float* dy, const float* x, const float* w, const float* rstd,
                                      int64_t rows, int64_t dim, float* dx) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* dyr = dy + r * dim;
    const float* xr = x + r * dim;
    float* dxr = dx + r * dim;
    double gx = 0.0;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) gx += static_cast<double>(dyr[j]) * w[j] * xr[j];
    gx = block_reduce(gx, SumOp{}, 0.0);
    const double rs = rstd[r];
    const double coef = rs * rs * rs / static_cast<double>(dim) * gx;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
      const double g = static_cast<double>(dyr[j]) * w[j];
      dxr[j] = static_cast<float>(dxr[j] + (rs * g - coef * xr[j]));
    }
  }
}

// dw partials: block (column tile, chunk) sums dy x r over the chunk's rows for 32 columns;
// threadIdx.x picks the column (coalesced), threadIdx.y strides the rows, and the 8 row
// sums are added in y order.
constexpr int kDwCols = 32, kDwRowThreads = 8, kMaxChunks = 256, kMinRowsPerChunk = 32;

int64_t dw_chunks(int64_t rows) { return std::clamp<int64_t>(ceil_div(rows, kMinRowsPerChunk), 1, kMaxChunks); }

__global__ void rmsnorm_bwd_dw_partial_kernel(const float* dy, const float* x, const float* rstd, int64_t rows,
                                              int64_t dim, int64_t rows_per_chunk, double* partial) {
  __shared__ double sums[kDwRowThreads][kDwCols];
  const int64_t c = int64_t{blockIdx.x} * kDwCols + threadIdx.x;
  const int64_t begin = blockIdx.y * rows_per_chunk;
  const int64_t end = begin + rows_per_chunk < rows ? begin + rows_per_chunk : rows;
  double s = 0.0;
  if (c < dim)
    for (int64_t r = begin + threadIdx.y; r < end; r += kDwRowThreads)
      s += static_cast<double>(dy[r * dim + c]) * x[r * dim + c] * rstd[r];
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < dim) {
    for (int k = 1; k < kDwRowThreads; ++k) s += sums[k][threadIdx.x];
    partial[blockIdx.y * dim + c] = s;
  }
}

// dw_c += Σ_chunks partial[chunk, c]   (chunk order)
__global__ void rmsnorm_bwd_dw_final_kernel(const double* partial, int64_t chunks, int64_t dim, float* dw) {
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < dim; c += int64_t{gridDim.x} * blockDim.x) {
    double s = 0.0;
    for (int64_t k = 0; k < chunks; ++k) s += partial[k * dim + c];
    dw[c] = static_cast<float>(dw[c] + s);
  }
}

unsigned row_blocks(int64_t rows) { return static_cast<unsigned>(std::min<int64_t>(rows, 65536)); }

}  // namespace

template <typename Ty>
void rmsnorm_fwd(const float* x, const float* w, int64_t rows, int64_t dim, double eps, Ty* y, float* rstd,
                 cudaStream_t stream) {
  if (rows == 0) return;
  rmsnorm_fwd_kernel<<<row_blocks(rows), kThreads, 0, stream>>>(x, w, rows, dim, eps, y, rstd);
  LLMT_CUDA_CHECK_LAUNCH();
}
template void rmsnorm_fwd(const float*, const float*, int64_t, int64_t, double, float*, float*, cudaStream_t);
template void rmsnorm_fwd(const float*, const float*, int64_t, int64_t, double, __nv_bfloat16*, float*,
                          cudaStream_t);

template <typename Ty>
void add_rmsnorm_fwd(const float* x, const float* branch, const float* w, int64_t rows, int64_t dim, double eps,
                     float* h, Ty* y, float* rstd, cudaStream_t stream) {
  if (rows == 0) return;
  add_rmsnorm_fwd_kernel<<<row_blocks(rows), kThreads, 0, stream>>>(x, branch, w, rows, dim, eps, h, y, rstd);
  LLMT_CUDA_CHECK_LAUNCH();
}
template void add_rmsnorm_fwd(const float*, const float*, const float*, int64_t, int64_t, double, float*, float*,
                              float*, cudaStream_t);
template void add_rmsnorm_fwd(const float*, const float*, const float*, int64_t, int64_t, double, float*,
                              __nv_bfloat16*, float*, cudaStream_t);

size_t rmsnorm_bwd_scratch_bytes(int64_t rows, int64_t dim) {
  return sizeof(double) * static_cast<size_t>(dw_chunks(rows) * dim);
}

void rmsnorm_bwd(const float* dy, const float* x, const float* w, const float* rstd, int64_t rows, int64_t dim,
                 float* dx, float* dw, void* scratch, cudaStream_t stream) {
  if (rows == 0 || dim == 0) return;
  rmsnorm_bwd_dx_kernel<<<row_blocks(rows), kThreads, 0, stream>>>(dy, x, w, rstd, rows, dim, dx);
  LLMT_CUDA_CHECK_LAUNCH();
  const int64_t chunks = dw_chunks(rows), rows_per_chunk = ceil_div(rows, chunks);
  auto* partial = static_cast<double*>(scratch);
  const dim3 grid(static_cast<unsigned>(ceil_div(dim, kDwCols)), static_cast<unsigned>(chunks));
  rmsnorm_bwd_dw_partial_kernel<<<grid, dim3(kDwCols, kDwRowThreads), 0, stream>>>(dy, x, rstd, rows, dim,
                                                                                    rows_per_chunk, partial);
  LLMT_CUDA_CHECK_LAUNCH();
  rmsnorm_bwd_dw_final_kernel<<<grid_for(dim), kThreads, 0, stream>>>(partial, chunks, dim, dw);
  LLMT_CUDA_CHECK_LAUNCH();
}

}  // namespace llmt::cuda
