// The Mamba-3 decode recurrence (mamba3.cuh step_fwd; layers-ssm-attn.md §4.6; semantics: the core loop of
// cpu::mamba3_layer_step) over tokens prepped by prep_fwd from the carried phases.
#include "kernels/cuda/mamba3.cuh"

namespace llmt::cuda::m3 {
namespace {

#ifdef LLMT_CUDA_EMU
LLMT_CUDA_EMU_DYNAMIC_SMEM_OF(float, smem);  // the kernels' `extern __shared__ float smem[]` (tests/emu/cuda_emu.h)
#endif

// One block per (b, h); the state [P, N] in global memory, element (p, n) owned by one thread; the carried and
// the current k [R, N], v [R, P] (fp32; v from buf.vh, the bf16 x, where set, else buf.v) in shared memory. Per
// token e: α = exp(a), β = ε α,
// H[p, n] = α H + β Σ_r v_prev[r, p] k_prev[r, n] + γ Σ_r v[r, p] k[r, n];  y[r, p] = D v[r, p] + Σ_n H[p, n] q[r, n].
__global__ void step_kernel(const float* D, Sizes s, Buffers buf, float* state, float* k_prev, float* v_prev,
                            float* phase) {
  extern __shared__ float smem[];
  const int64_t R = s.R, P = s.P, N = s.N, h = blockIdx.x, b = blockIdx.y, bh = b * s.H + h;
  float *kp = smem, *vp = kp + R * N, *kc = vp + R * P, *vc = kc + R * N;
  float* Hs = state + bh * P * N;
  for (int64_t i = threadIdx.x; i < R * N; i += blockDim.x) kp[i] = k_prev[bh * R * N + i];
  for (int64_t i = threadIdx.x; i < R * P; i += blockDim.x) vp[i] = v_prev[bh * R * P + i];
  const float Dh = D[h];
  for (int64_t t = 0; t < s.T; ++t) {
    const int64_t e = (b * s.T + t) * s.H + h;
    for (int64_t i = threadIdx.x; i < R * N; i += blockDim.x) kc[i] = buf.k[e * R * N + i];
    if (buf.vh != nullptr)  // (SISO with bf16 activations: v is the bf16 x)
      for (int64_t i = threadIdx.x; i < R * P; i += blockDim.x) vc[i] = to_f32(buf.vh[e * R * P + i]);
    else
      for (int64_t i = threadIdx.x; i < R * P; i += blockDim.x) vc[i] = buf.v[e * R * P + i];
    __syncthreads();
    const float alpha = expf(buf.a[e]), beta = buf.eps[e] * alpha, gamma = buf.gam[e];
    for (int64_t i = threadIdx.x; i < P * N; i += blockDim.x) {
      const int64_t p = i / N, n = i % N;
      float w_prev = 0.0f, w = 0.0f;
      for (int64_t r = 0; r < R; ++r) {
        w_prev += vp[r * P + p] * kp[r * N + n];
        w += vc[r * P + p] * kc[r * N + n];
      }
      Hs[i] = alpha * Hs[i] + beta * w_prev + gamma * w;
    }
    __syncthreads();
    for (int64_t i = threadIdx.x; i < R * P; i += blockDim.x) {
      const int64_t r = i / P, p = i % P;
      const float* q = buf.q + (e * R + r) * N;
      float acc = Dh * vc[i];
      for (int64_t n = 0; n < N; ++n) acc += Hs[p * N + n] * q[n];
      buf.y[e * R * P + i] = acc;
    }
    for (int64_t i = threadIdx.x; i < R * N; i += blockDim.x) kp[i] = kc[i];
    for (int64_t i = threadIdx.x; i < R * P; i += blockDim.x) vp[i] = vc[i];
    __syncthreads();
  }
  for (int64_t i = threadIdx.x; i < R * N; i += blockDim.x) k_prev[bh * R * N + i] = kp[i];
  for (int64_t i = threadIdx.x; i < R * P; i += blockDim.x) v_prev[bh * R * P + i] = vp[i];
  if (s.T > 0)
    for (int64_t i = threadIdx.x; i < s.S; i += blockDim.x)
      phase[bh * s.S + i] = buf.phi[((b * s.T + s.T - 1) * s.H + h) * s.S + i];
}

}  // namespace

void step_fwd(const float* D, const Sizes& s, const Buffers& buf, float* state, float* k_prev, float* v_prev,
              float* phase, cudaStream_t stream) {
  const size_t smem = sizeof(float) * static_cast<size_t>(2 * s.R * (s.N + s.P));
  check(smem <= 48 * 1024, "mamba3_decode: rank {}, d_state {} and head_dim {} need {} bytes of shared memory", s.R,
        s.N, s.P, smem);
  if (s.B * s.H == 0) return;
  step_kernel<<<dim3(static_cast<unsigned>(s.H), static_cast<unsigned>(s.B)), kThreads, smem, stream>>>(
      D, s, buf, state, k_prev, v_prev, phase);
  LLMT_CUDA_CHECK_LAUNCH();
}

}  // namespace llmt::cuda::m3
