// Device helpers shared by the chunked delta-rule cores (gdn.cu, comba.cu, kda.cu, mdn.cu; layers-delta.md §6):
// fp32 exponentials of log-decay differences, dot products, the unit-lower-triangular inverse
// 𝒯 = (I + A)^{-1} (§6.1 F2) and its backward (§6.5 B6), the WY backward's X_U, X_W, dv (§6.5 B5), the
// GDN/KDA kernel arguments and the one-block-per-(batch, head) launch.
// Every element is computed by one thread in a fixed order: deterministic. Must be reached by all threads
// of the block (they synchronise).
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace llmt::cuda::delta {

/// e^x in fp32 of a log-decay difference formed in double (the cumsums Γ are doubles, so that Γ_r - Γ_j keeps
/// its relative precision even when |Γ| is large); x <= 0 wherever the cores use it.
__device__ inline float expd(double x) { return expf(static_cast<float>(x)); }

/// Σ_i x[i] y[i] in index order (fp32 fma).
__device__ inline float dotf(const float* x, const float* y, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s = fmaf(x[i], y[i], s);
  return s;
}

/// F2: (I + A) 𝒯 = I by forward substitution, row by row: 𝒯_r,m = -Σ_{m<=j<r} A_rj 𝒯_jm (m < r).
/// sA [n, n] strictly lower; sT [n, n] must hold the identity on entry.
__device__ inline void tril_inverse(const float* sA, float* sT, int n) {
  for (int r = 1; r < n; ++r) {
    for (int m = threadIdx.x; m < r; m += blockDim.x) {
      float s = 0.0f;
      for (int j = m; j < r; ++j) s -= sA[r * n + j] * sT[j * n + m];
      sT[r * n + m] = s;
    }
    __syncthreads();
  }
}

/// B6: from d𝒯 (in sdT on entry, lower part) writes dA = -tril_{j<r}(𝒯^T d𝒯 𝒯^T) into sdT; sM1 [n, n] scratch.
__device__ inline void tril_inverse_bwd(const float* sT, float* sdT, float* sM1, int n) {
  // M1 = 𝒯^T d𝒯 (both factors vanish unless i >= a and i >= b).
  for (int idx = threadIdx.x; idx < n * n; idx += blockDim.x) {
    const int ra = idx / n, cb = idx % n;
    float s = 0.0f;
    for (int i = ra > cb ? ra : cb; i < n; ++i) s += sT[i * n + ra] * sdT[i * n + cb];
    sM1[idx] = s;
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < n * n; idx += blockDim.x) {
    const int r = idx / n, j = idx % n;
    float s = 0.0f;
    if (j < r)
      for (int m = 0; m <= j; ++m) s -= sM1[r * n + m] * sT[j * n + m];
    sdT[idx] = s;
  }
  __syncthreads();
}

/// B5: X_U = 𝒯^T dΔ [n, V], X_W = 𝒯^T dW [n, K], and dv_r = β_r X_U,r written to dv0 + r * dv_stride (row r of
/// the chunk in the [B, T, H, V] gradient). Ends without synchronising: the caller's next phase may read only
/// what it does not write here.
__device__ inline void wy_bwd_x(const float* sT, const float* dD, const float* dW, const float* beta, int n,
                                int64_t K, int64_t V, float* XU, float* XW, float* dv0, int64_t dv_stride) {
  for (int idx = threadIdx.x; idx < n * V; idx += blockDim.x) {
    const int r = static_cast<int>(idx / V);
    const int64_t j = idx % V;
    float s = 0.0f;
    for (int i = r; i < n; ++i) s += sT[i * n + r] * dD[i * V + j];
    XU[idx] = s;
    dv0[r * dv_stride + j] = beta[r] * s;
  }
  for (int idx = threadIdx.x; idx < n * K; idx += blockDim.x) {
    const int r = static_cast<int>(idx / K);
    const int64_t m = idx % K;
    float s = 0.0f;
    for (int i = r; i < n; ++i) s += sT[i * n + r] * dW[i * K + m];
    XW[idx] = s;
  }
}

/// Arguments of a GDN or KDA chunked-core kernel: q, k [B, T, H, K]; v, o, d_o [B, T, H, V]; g [B, T, H] (GDN)
/// or [B, T, H, K] (KDA); beta [B, T, H]; gradients shaped as their inputs; chunks = ceil(T / C); per-block
/// scratch. The forward leaves d_o and the gradients null, the backward o.
struct CoreArgs {
  const float *q, *k, *v, *g, *beta, *d_o;
  int64_t B, T, H, K, V, C, chunks;
  float *o, *dq, *dk, *dv, *dg, *dbeta;
  float* scratch;
};

/// CoreArgs with the inputs, sizes and scratch filled in (outputs and d_o null, for the caller to set).
inline CoreArgs core_args(const float* q, const float* k, const float* v, const float* g, const float* beta,
                          int64_t batch, int64_t seq_len, int64_t heads, int64_t key_dim, int64_t value_dim,
                          int64_t chunk_size, void* scratch) {
  CoreArgs args{};
  args.q = q, args.k = k, args.v = v, args.g = g, args.beta = beta;
  args.B = batch, args.T = seq_len, args.H = heads, args.K = key_dim, args.V = value_dim;
  args.C = chunk_size, args.chunks = ceil_div(seq_len, chunk_size);
  args.scratch = static_cast<float*>(scratch);
  return args;
}

/// Launches kernel<<<B * H blocks, threads, smem>>>(args) after allowing `smem` bytes of dynamic shared memory.
template <typename Kernel, typename Args>
void launch_per_head(Kernel kernel, const Args& args, int threads, size_t smem, cudaStream_t stream) {
  LLMT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<static_cast<unsigned>(args.B * args.H), threads, smem, stream>>>(args);
  LLMT_CUDA_CHECK_LAUNCH();
}

}  // namespace llmt::cuda::delta
