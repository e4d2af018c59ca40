// Mamba-3 per-token scalars and vectors on the GPU (layers-ssm-attn.md §4.3.1, backward §4.5 steps 3–6;
// semantics: src/kernels/cpu/mamba3_prep.h). Elementwise kernels over (token, head) pairs, except the phase
// φ_t = (φ_{t-1} + Δ_t θ_t) mod 2π and its reverse cumsum dψ_t = Σ_{s>=t} dφ_s, scans along the sequence per
// (batch, head, angle), run in parallel over segments of T (phase_kernel, phase_bwd_kernel), SISO's rotation and
// BCNorm backward with the bias gradients' row-range sums, one pass over dk, dq per (row range, group, channel pairs)
// (rot_bcnorm_bwd_kernel), and the per-row sums over contiguous vectors through shared memory (sum_cols). Δ, θ, φ
// and every per-row sum in double; q, k stored in fp32, or in bf16 with bf16 products (Buffers: the core reads them
// only as bf16 operands; the rotation backward recomputes the fp32 values it needs, bit for bit: rotate_pair).
#include <type_traits>

#include "kernels/cuda/mamba3.cuh"
#include "kernels/cuda/side_stream.cuh"

namespace llmt::cuda::m3 {
namespace {

#ifdef LLMT_CUDA_EMU
LLMT_CUDA_EMU_DYNAMIC_SMEM_OF(float, smem);  // the kernels' `extern __shared__ float smem[]` (tests/emu/cuda_emu.h)
#endif

constexpr double kPi = 3.14159265358979323846;

__device__ double softplus_d(double x) { return x > 20.0 ? x : log1p(exp(x)); }
__device__ double softplus_grad_d(double x) { return x > 20.0 ? 1.0 : 1.0 / (1.0 + exp(-x)); }
__device__ double sigmoid_d(double x) { return 1.0 / (1.0 + exp(-x)); }

// Δ = softplus(dd_dt + dt_bias) of head h in raw row rw.
__device__ double delta(const float* rw, int64_t h, const float* dt_bias) {
  return softplus_d(static_cast<double>(rw[h]) + dt_bias[h]);
}

// Consecutive tokens of one (batch, head) per token_kernel thread.
constexpr int kTokRun = 8;

// Per (token, head): Δ, λ, A, the clamp mask, a = A Δ, γ = λ Δ, ε = (1 - λ) Δ and σ = γ + ε_{t+1} (ε_T := 0), all
// [B, T, H] (Δ in double too). One thread per (batch, run of kTokRun tokens, head), heads fastest (coalesced), walking
// its tokens in order: the next token's Δ, λ, ε (for σ) are carried into its next step, so each token's Δ and λ
// (double exp, log1p and division, the kernel's cost) are evaluated once, plus once more for the token after a run.
__global__ void token_kernel(const float* raw, const float* dt_bias, Sizes s, Mamba3Options opt, Buffers buf) {
  const int64_t runs = (s.T + kTokRun - 1) / kTokRun, n = s.B * runs * s.H;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n; idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t h = idx % s.H, run = idx / s.H, b = run / runs, t0 = (run % runs) * kTokRun;
    const int64_t t1 = std::min(s.T, t0 + kTokRun);
    const float* rw = raw + (b * s.T + t0) * s.W;
    double dt = delta(rw, h, dt_bias), lam = sigmoid_d(static_cast<double>(rw[2 * s.H + h])), eps = (1.0 - lam) * dt;
    for (int64_t t = t0; t < t1; ++t, rw += s.W) {
      const int64_t e = (b * s.T + t) * s.H + h;
      const double x = rw[s.H + h];
      const double f = opt.heavy_tail ? (x >= 0 ? 1.0 + x : 1.0 / (1.0 - x)) : softplus_d(x);
      const bool clamped = -f > -opt.A_floor;
      const double A = clamped ? -opt.A_floor : -f;
      double dt1 = 0.0, lam1 = 0.0, eps1 = 0.0;  // token t + 1's
      if (t + 1 < s.T) {
        dt1 = delta(rw + s.W, h, dt_bias);
        lam1 = sigmoid_d(static_cast<double>(rw[s.W + 2 * s.H + h]));
        eps1 = (1.0 - lam1) * dt1;
      }
      buf.dt[e] = static_cast<float>(dt);
      buf.dtd[e] = dt;
      buf.lam[e] = static_cast<float>(lam);
      buf.A[e] = static_cast<float>(A);
      buf.clamped[e] = clamped ? 1.0f : 0.0f;
      buf.a[e] = static_cast<float>(A * dt);
      buf.gam[e] = static_cast<float>(lam * dt);
      buf.eps[e] = static_cast<float>(eps);
      buf.sig[e] = static_cast<float>(lam * dt + eps1);
      dt = dt1;
      lam = lam1;
      eps = eps1;
    }
  }
}

// θ[row, i] = π tanh(angles).   (one thread per (row, i))
__global__ void theta_kernel(const float* raw, Sizes s, double* theta) {
  const int64_t n = s.rows * s.S;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n; idx += int64_t{gridDim.x} * blockDim.x)
    theta[idx] = kPi * tanh(static_cast<double>(raw[(idx / s.S) * s.W + 3 * s.H + idx % s.S]));
}

// fmod(x, 2π), bit for bit, without the library call for |x| < 4π (the phase steps): fmod is exact, and so is
// sign(x) (|x| - 2π) for 2π <= |x| < 4π (Sterbenz's lemma; a zero keeps x's sign, as fmod's); other x (and
// NaN) go to fmod.
// (The fmod call kept out of line: the unrolled scans inline mod_2pi at every step.)
__device__ __noinline__ double fmod_2pi(double x) { return fmod(x, 2.0 * kPi); }
__device__ __forceinline__ double mod_2pi(double x) {
  constexpr double k2Pi = 2.0 * kPi;
  const double ax = fabs(x);
  if (ax < k2Pi) return x;
  if (ax < 2.0 * k2Pi) return copysign(ax - k2Pi, x);
  return fmod_2pi(x);
}

// Steps loaded ahead by the scans along T (phase_kernel, phase_bwd_kernel), so that their loads overlap instead
// of each step waiting for its own.
constexpr int kAhead = 8;

// The scans along T (phase_kernel, phase_bwd_kernel) run per block on kScanLanes consecutive (h, i) pairs of one
// batch row (one warp wide: coalesced), with T cut into kScanSegs segments of ceil(T / kScanSegs) steps, one warp
// per segment: each warp walks its segment, the segment totals are scanned in shared memory, then each warp walks
// its segment again from its carry.
constexpr int kScanLanes = 32, kScanSegs = 16, kScanThreads = kScanLanes * kScanSegs;

// f(t, Δ_t θ_t[i]) for t = tb, ..., te - 1 in order (rows row0 + t, head h, angle i), kAhead steps loaded at once.
template <typename F>
__device__ __forceinline__ void walk_steps(const double* dtd, const double* theta, const Sizes& s, int64_t row0,
                                           int64_t h, int64_t i, int64_t tb, int64_t te, F&& f) {
  const double* pd = dtd + (row0 + tb) * s.H + h;
  const double* pt = theta + (row0 + tb) * s.S + i;
  const int H = static_cast<int>(s.H), S = static_cast<int>(s.S);
  for (int64_t t0 = tb; t0 < te; t0 += kAhead, pd += kAhead * s.H, pt += kAhead * s.S) {
    double step[kAhead];
#pragma unroll
    for (int u = 0; u < kAhead; ++u) step[u] = t0 + u < te ? pd[u * H] * pt[u * S] : 0.0;
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      if (t0 + u >= te) break;
      f(t0 + u, step[u]);
    }
  }
}

// The two representatives in (-2π, 2π) of the angle of c (|c| < 2π): the one >= 0 (sign bit clear) and the one
// < 0 (sign bit set). mod_2pi's result has the sign of its argument, so which one the sequential recursion holds
// depends on its path.
__device__ __forceinline__ double rep_pos(double c) { return signbit(c) ? c + 2.0 * kPi : c; }
__device__ __forceinline__ double rep_neg(double c) { return signbit(c) ? c : c - 2.0 * kPi; }

// φ_t[h, i] = (φ_{t-1} + Δ_t θ_t[i]) mod 2π from φ_{-1} = phase0[b, h, i] (0 when phase0 is null), the sequential
// recursion's values rebuilt in parallel over T (grid (ceil(H S / kScanLanes), B), kScanThreads threads; a warp per
// segment of T, a lane per (h, i)):
//   1. each segment's own recursion from 0 (segment 0: from φ_{-1}, so its end is the exact φ entering segment 1);
//   2. the carries: c_1 = that end, c_{j+1} = (c_j + total_j) mod 2π (equal to the recursion's φ up to rounding,
//      and up to the representative: the recursion's value is rep_pos(c_j) or rep_neg(c_j));
//   3. each segment j >= 1 walks from both representatives of c_j and keeps which sign each ends with;
//   4. the signs chained from segment 0's end pick each segment's representative;
//   5. each segment walks from it, writing φ.
// Segments 0 and 1 repeat the sequential recursion's arithmetic exactly; later ones start from a carry that
// differs from the sequential value by rounding only (a few ulp of 2π in double).
__global__ void __launch_bounds__(kScanThreads, 2)
    phase_kernel(const double* dtd, const double* theta, const float* phase0, Sizes s, float* phi) {
  __shared__ double carry[kScanSegs][kScanLanes];
  __shared__ unsigned char sgn[kScanSegs][kScanLanes];
  const int lane = threadIdx.x % kScanLanes, seg = threadIdx.x / kScanLanes;
  const int64_t HS = s.H * s.S, hi = blockIdx.x * int64_t{kScanLanes} + lane, b = blockIdx.y, row0 = b * s.T;
  const bool valid = hi < HS;
  const int64_t h = valid ? hi / s.S : 0, i = valid ? hi % s.S : 0;
  const int64_t len = (s.T + kScanSegs - 1) / kScanSegs, tb = std::min<int64_t>(s.T, seg * len),
                te = std::min<int64_t>(s.T, tb + len);
  const double start = valid && phase0 != nullptr ? static_cast<double>(phase0[b * HS + hi]) : 0.0;
  double acc = seg == 0 ? start : 0.0;
  if (valid) walk_steps(dtd, theta, s, row0, h, i, tb, te, [&](int64_t, double st) { acc = mod_2pi(acc + st); });
  carry[seg][lane] = acc;
  __syncthreads();
  if (seg == 0) {  // carry[j] = c_j for j >= 1; carry[0] keeps segment 0's end
    double c = carry[0][lane];
    for (int j = 1; j < kScanSegs; ++j) {
      const double total = carry[j][lane];
      carry[j][lane] = c;
      c = mod_2pi(c + total);
    }
  }
  __syncthreads();
  const double c = carry[seg][lane];
  if (seg > 0) {  // the end's sign from each representative: bit 0 from rep_pos, bit 1 from rep_neg
    double from_pos = rep_pos(c), from_neg = rep_neg(c);
    if (valid)
      walk_steps(dtd, theta, s, row0, h, i, tb, te, [&](int64_t, double st) {
        from_pos = mod_2pi(from_pos + st);
        from_neg = mod_2pi(from_neg + st);
      });
    sgn[seg][lane] = static_cast<unsigned char>((signbit(from_pos) ? 1 : 0) | (signbit(from_neg) ? 2 : 0));
  }
  __syncthreads();
  if (seg == 0) {  // sgn[j] = the sign entering segment j (1: negative)
    unsigned neg = signbit(carry[0][lane]) ? 1 : 0;
    for (int j = 1; j < kScanSegs; ++j) {
      const unsigned map = sgn[j][lane];
      sgn[j][lane] = static_cast<unsigned char>(neg);
      neg = (map >> neg) & 1u;
    }
  }
  __syncthreads();
  if (!valid) return;
  acc = seg == 0 ? start : sgn[seg][lane] != 0 ? rep_neg(c) : rep_pos(c);
  walk_steps(dtd, theta, s, row0, h, i, tb, te, [&](int64_t t, double st) {
    acc = mod_2pi(acc + st);
    phi[(row0 + t) * HS + hi] = static_cast<float>(acc);
  });
}

// Threads (= vectors) per block of sum_cols' kernel (scalar_bwd_kernel), and bcnorm_kernel's and bcnorm_dx_kernel's
// threads; the vectors their blocks stage at a time.
constexpr int kColThreads = 128, kBnVecs = 32;

// The per-vector sums of a block over n <= kColThreads vectors of N floats each (vector i of array a at src[a] + i N),
// thread x summing vector x in element order: 32 columns c0 .. c0 + 31 at a time, each warp loading its own 32
// vectors' (load i of a lane: the warp's vector i, column c0 + lane: coalesced), the A x 32 loads issued at once into
// registers, the next chunk's before the sum of the current one (in flight during it); stored into tile[a][v][c - c0]
// (rows padded: no bank conflicts; 0 past n and N), then sum(c0, m) adds the chunk's m columns, thread x reading row
// x of the tiles in order. Its first barrier orders the caller's earlier shared reads before the tiles' writes.
template <int A, typename Sum>
__device__ __forceinline__ void sum_cols(float (*tile)[kColThreads][33], const float* const* src, int n, int N,
                                         Sum sum) {
  const int lane = static_cast<int>(threadIdx.x) % 32, w0 = static_cast<int>(threadIdx.x) - lane;
  const int rows = n - w0;  // the warp's vectors (none where <= 0)
  float v[A][32];
  const auto load = [&](int c0) {
    const bool col = c0 + lane < N;
#pragma unroll
    for (int a = 0; a < A; ++a) {
      const float* q = src[a] + w0 * N + c0 + lane;
      if (rows >= 32) {  // (one predicate for the 32 loads)
#pragma unroll
        for (int i = 0, o = 0; i < 32; ++i, o += N) v[a][i] = col ? q[o] : 0.0f;
      } else {
#pragma unroll
        for (int i = 0, o = 0; i < 32; ++i, o += N) v[a][i] = col && i < rows ? q[o] : 0.0f;
      }
    }
  };
  load(0);
  for (int c0 = 0; c0 < N; c0 += 32) {
    __syncthreads();  // the previous chunk's readers are done
#pragma unroll
    for (int a = 0; a < A; ++a)
#pragma unroll
      for (int i = 0; i < 32; ++i) tile[a][w0 + i][lane] = v[a][i];
    __syncthreads();
    if (c0 + 32 < N) load(c0 + 32);
    sum(c0, std::min(32, N - c0));
  }
}

// RMSNorm_N without weight of each B and C vector: n = x r, r = 1 / sqrt(mean(x^2) + eps). A block takes kBnVecs
// consecutive vectors v = (row, which, r G + g) at a time (contiguous in bc): all its threads stage their x in shared
// memory, xs[j][c] (rows padded: no bank conflicts), a vector row at a time (coalesced; kColThreads columns at once,
// the kBnVecs rows' loads issued together), thread x < kBnVecs adds Σ x^2 of vector v0 + x in element order (double),
// then all of them write n coalesced from the staged x. Dynamic shared memory: bcnorm_smem(N).
__global__ void __launch_bounds__(kColThreads) bcnorm_kernel(const float* bc, Sizes s, double eps, Buffers buf) {
  extern __shared__ float smem[];  // xs [kBnVecs][N + 1]
  __shared__ double rs[kBnVecs];
  __shared__ float* outs[kBnVecs];  // n̂'s row of each vector
  const int64_t RG = s.R * s.G, nv = s.rows * 2 * RG;
  const int x = static_cast<int>(threadIdx.x), N = static_cast<int>(s.N), ld = N + 1;
  for (int64_t v0 = blockIdx.x * int64_t{kBnVecs}; v0 < nv; v0 += int64_t{gridDim.x} * kBnVecs) {
    const int n = static_cast<int>(std::min<int64_t>(kBnVecs, nv - v0));
    const float* src = bc + v0 * s.N;
    for (int c = x; c < N; c += kColThreads) {
      float xv[kBnVecs];
#pragma unroll
      for (int j = 0; j < kBnVecs; ++j) xv[j] = j < n ? src[j * N + c] : 0.0f;
#pragma unroll
      for (int j = 0; j < kBnVecs; ++j) smem[j * ld + c] = xv[j];
    }
    __syncthreads();
    if (x < n) {
      double ss = 0.0;
      for (int c = 0; c < N; ++c) ss += static_cast<double>(smem[x * ld + c]) * smem[x * ld + c];
      const int64_t idx = v0 + x, rg = idx % RG, which = (idx / RG) % 2, row = idx / (2 * RG);
      const double r = 1.0 / sqrt(ss / static_cast<double>(s.N) + eps);
      rs[x] = r;
      outs[x] = (which == 0 ? buf.nb : buf.ncn) + (row * RG + rg) * s.N;
      (which == 0 ? buf.rb : buf.rc)[row * RG + rg] = static_cast<float>(r);
    }
    __syncthreads();
    for (int c = x; c < N; c += kColThreads) {
      float o[kBnVecs];  // (all computed before the stores: a store through outs could alias the staged x)
#pragma unroll
      for (int j = 0; j < kBnVecs; ++j) o[j] = static_cast<float>(smem[j * ld + c] * rs[j]);
#pragma unroll
      for (int j = 0; j < kBnVecs; ++j)
        if (j < n) outs[j][c] = o[j];
    }
    __syncthreads();  // (before the next vectors' staging)
  }
}

// bcnorm_kernel's dynamic shared memory for N channels.
size_t bcnorm_smem(int64_t N) { return sizeof(float) * kBnVecs * (N + 1); }

// qk_kernel: threads per block, rotation pairs per thread and row, and the rows per block (as many as fit
// kQkSmemFloats floats of staged n̂_B, n̂_C, at most kQkMaxRows).
constexpr int kQkThreads = 256, kQkPairs = 2, kQkSmemFloats = 8192, kQkMaxRows = 32;
constexpr int kQkAhead = 8;  // rows whose φ a qk_kernel thread loads at once
constexpr int kQkStage = 8;  // staged pieces (qk_stage) of n̂_B and of n̂_C a qk_kernel thread loads at once

// Rows per qk_kernel block for R G N channels of n̂_B and of n̂_C per row.
int64_t qk_rows(int64_t RGN) { return std::clamp<int64_t>(kQkSmemFloats / (2 * RGN), 1, kQkMaxRows); }

// The biased channel of k (or q) before the rotation: n̂ ∘ w + bias.
__device__ __forceinline__ float biased(float n, float w, float bias) { return fmaf(n, w, bias); }

// (r0, r1) = Rot(φ) (u0, u1) (cs = cos φ, sn = sin φ) with its roundings pinned: r0 = fma(u0, cs, -(u1 sn)),
// r1 = fma(u0, sn, u1 cs), the contraction nvcc chose for the plain products, so that the rotation backward
// (rot_bcnorm_bwd_kernel, rot_bwd_kernel) recomputes qk_kernel's fp32 k and q bit for bit.
__device__ __forceinline__ void rotate_pair(float u0, float u1, float cs, float sn, float& r0, float& r1) {
  r0 = __fmaf_rn(u0, cs, -__fmul_rn(u1, sn));
  r1 = __fmaf_rn(u0, sn, __fmul_rn(u1, cs));
}

// One channel, or an adjacent pair (8- or 4-byte aligned), of k or q in its storage type (fp32, or bf16 rounded
// once).
__device__ __forceinline__ void put_qk(float* d, float x) { *d = x; }
__device__ __forceinline__ void put_qk(__nv_bfloat16* d, float x) { *d = __float2bfloat16_rn(x); }
__device__ __forceinline__ void put_qk2(float* d, float x, float y) { *reinterpret_cast<float2*>(d) = make_float2(x, y); }
__device__ __forceinline__ void put_qk2(__nv_bfloat16* d, float x, float y) {
  *reinterpret_cast<__nv_bfloat162*>(d) = __floats2bfloat162_rn(x, y);
}

// qk_kernel's staging: the n pieces V (float, or float4 for 16-byte aligned rows) of gb, gc into sb, sc, kQkStage
// pieces of each per thread loaded at once, then stored.
template <typename V>
__device__ __forceinline__ void qk_stage(const float* gb, const float* gc, float* sb, float* sc, int n) {
  const V *b = reinterpret_cast<const V*>(gb), *c = reinterpret_cast<const V*>(gc);
  V *db = reinterpret_cast<V*>(sb), *dc = reinterpret_cast<V*>(sc);
  for (int j0 = threadIdx.x; j0 < n; j0 += kQkStage * kQkThreads) {
    V vb[kQkStage], vc[kQkStage];
#pragma unroll
    for (int u = 0; u < kQkStage; ++u) {
      const int j = j0 + u * kQkThreads;
      vb[u] = j < n ? b[j] : V{};
      vc[u] = j < n ? c[j] : V{};
    }
#pragma unroll
    for (int u = 0; u < kQkStage; ++u) {
      const int j = j0 + u * kQkThreads;
      if (j < n) {
        db[j] = vb[u];
        dc[j] = vc[u];
      }
    }
  }
}

// k = Rot(φ) (n̂_B ∘ w_B + B_bias[h, r]), q likewise with C. One-dimensional grid over (row block of `rows` rows,
// column block of kQkThreads kQkPairs pairs), the column blocks of a row block consecutive (launched together:
// they stage the same n̂ rows, so all but the first read them from the L2); a thread owns kQkPairs channel pairs
// (h, r, u) of every row of its block: channels (2u, 2u + 1) for SISO, (u, u + N/2) for MIMO (u < ceil(N / 2); the
// second channel absent for u = (N - 1) / 2, N odd), rotated by φ[h, u] when u < S. Its weights and biases are
// loaded once; the block's rows of n̂_B, n̂_C are staged in shared memory (rows R G N floats each; qk_stage: 16-byte
// pieces where R G N % 4 == 0), φ is read and its sincos taken once per rotated pair, and k, q are written once
// into kout, qout (T: float, or bf16 with bf16 products; SISO with even N: the n̂ pairs read and k, q written as
// pairs; consecutive threads, consecutive pairs).
template <typename T>
__global__ void __launch_bounds__(kQkThreads) qk_kernel(const Mamba3Ptrs p, Sizes s, Buffers buf, int rows, T* kout,
                                                        T* qout) {
  extern __shared__ float smem[];
  const int N = static_cast<int>(s.N), R = static_cast<int>(s.R), H = static_cast<int>(s.H);
  const int S = static_cast<int>(s.S), RGN = static_cast<int>(s.R * s.G * s.N), half = N / 2, U = (N + 1) / 2;
  const int hpg = static_cast<int>(s.H / s.G), per_block = kQkThreads * kQkPairs;
  const int ncol = (H * R * U + per_block - 1) / per_block;  // column blocks per row block
  const int col = static_cast<int>(blockIdx.x % ncol);
  const int64_t row0 = blockIdx.x / ncol * int64_t{rows};
  const int nrows = static_cast<int>(std::min<int64_t>(rows, s.rows - row0));
  float* sb = smem;               // [rows, R G N] n̂_B
  float* sc = smem + rows * RGN;  // [rows, R G N] n̂_C
  if (RGN % 4 == 0)  // (16-byte aligned rows: float4 pieces)
    qk_stage<float4>(buf.nb + row0 * RGN, buf.ncn + row0 * RGN, sb, sc, nrows * RGN / 4);
  else
    qk_stage<float>(buf.nb + row0 * RGN, buf.ncn + row0 * RGN, sb, sc, nrows * RGN);
  // The owned pairs: channels c0, c1 (-1: none) at offset o within a row of k, q (the (h, r) row's start) and
  // src within a row of n̂; φ offset f within a row of φ (-1: not rotated); weights and biases of c0, c1.
  int c0[kQkPairs], c1[kQkPairs], o[kQkPairs], src[kQkPairs], f[kQkPairs];
  float wb0[kQkPairs], wb1[kQkPairs], wc0[kQkPairs], wc1[kQkPairs];
  float bb0[kQkPairs], bb1[kQkPairs], bc0[kQkPairs], bc1[kQkPairs];
#pragma unroll
  for (int k = 0; k < kQkPairs; ++k) {
    const int q = (col * kQkPairs + k) * kQkThreads + threadIdx.x;
    c0[k] = -1;
    if (q >= H * R * U) continue;
    const int u = q % U, hr = q / U, r = hr % R, h = hr / R, g = h / hpg;
    c0[k] = R == 1 ? 2 * u : u < half ? u : N - 1;
    c1[k] = R == 1 ? (2 * u + 1 < N ? 2 * u + 1 : -1) : u < half ? u + half : -1;
    o[k] = hr * N;
    src[k] = (r * static_cast<int>(s.G) + g) * N;
    f[k] = u < S ? h * S + u : -1;
    wb0[k] = p.B_norm[c0[k]];
    wc0[k] = p.C_norm[c0[k]];
    bb0[k] = p.B_bias[o[k] + c0[k]];
    bc0[k] = p.C_bias[o[k] + c0[k]];
    wb1[k] = c1[k] >= 0 ? p.B_norm[c1[k]] : 0.0f;
    wc1[k] = c1[k] >= 0 ? p.C_norm[c1[k]] : 0.0f;
    bb1[k] = c1[k] >= 0 ? p.B_bias[o[k] + c1[k]] : 0.0f;
    bc1[k] = c1[k] >= 0 ? p.C_bias[o[k] + c1[k]] : 0.0f;
  }
  __syncthreads();
  const bool pair2 = R == 1 && N % 2 == 0;  // (c0, c1) adjacent and 8-byte aligned in k, q
  const int64_t HRN = s.H * s.R * s.N, HS = s.H * s.S;
  for (int r0 = 0; r0 < nrows; r0 += kQkAhead) {
    float ph[kQkAhead][kQkPairs];  // φ of the next kQkAhead rows' rotated pairs, loaded together
#pragma unroll
    for (int u = 0; u < kQkAhead; ++u)
#pragma unroll
      for (int k = 0; k < kQkPairs; ++k)
        ph[u][k] = r0 + u < nrows && c0[k] >= 0 && f[k] >= 0 ? buf.phi[(row0 + r0 + u) * HS + f[k]] : 0.0f;
#pragma unroll
    for (int u = 0; u < kQkAhead; ++u) {
      const int rr = r0 + u;
      if (rr >= nrows) break;
      const int64_t row = row0 + rr;
      T* krow = kout + row * HRN;
      T* qrow = qout + row * HRN;
#pragma unroll
      for (int k = 0; k < kQkPairs; ++k) {
        if (c0[k] < 0) continue;
        float sn = 0.0f, cs = 1.0f;
        if (f[k] >= 0) sincosf(ph[u][k], &sn, &cs);
        const float* nb = sb + rr * RGN + src[k];
        const float* nc = sc + rr * RGN + src[k];
        float nb0, nb1 = 0.0f, nc0, nc1 = 0.0f;  // n̂_B, n̂_C at c0, c1
        if (pair2) {  // (adjacent and 8-byte aligned in shared memory too)
          const float2 b2 = *reinterpret_cast<const float2*>(nb + c0[k]);
          const float2 c2 = *reinterpret_cast<const float2*>(nc + c0[k]);
          nb0 = b2.x;
          nb1 = b2.y;
          nc0 = c2.x;
          nc1 = c2.y;
        } else {
          nb0 = nb[c0[k]];
          nc0 = nc[c0[k]];
          if (c1[k] >= 0) {
            nb1 = nb[c1[k]];
            nc1 = nc[c1[k]];
          }
        }
        const float ub = biased(nb0, wb0[k], bb0[k]), uc = biased(nc0, wc0[k], bc0[k]);
        if (c1[k] < 0) {  // a lone unrotated channel
          put_qk(krow + o[k] + c0[k], ub);
          put_qk(qrow + o[k] + c0[k], uc);
          continue;
        }
        const float ubm = biased(nb1, wb1[k], bb1[k]), ucm = biased(nc1, wc1[k], bc1[k]);
        float k0 = ub, k1 = ubm, q0 = uc, q1 = ucm;
        if (f[k] >= 0) {
          rotate_pair(ub, ubm, cs, sn, k0, k1);
          rotate_pair(uc, ucm, cs, sn, q0, q1);
        }
        if (pair2) {
          put_qk2(krow + o[k] + c0[k], k0, k1);
          put_qk2(qrow + o[k] + c0[k], q0, q1);
        } else {
          put_qk(krow + o[k] + c0[k], k0);
          put_qk(krow + o[k] + c1[k], k1);
          put_qk(qrow + o[k] + c0[k], q0);
          put_qk(qrow + o[k] + c1[k], q1);
        }
      }
    }
  }
}

// MIMO: v[e, r, p] = x[e, p] mimo_x[h, r, p], x fp32 or bf16 (A), v fp32.   (one thread per (token, head, r, p);
// SISO's v is x itself)
template <typename A>
__global__ void up_kernel(const A* x, const float* mimo_x, Sizes s, float* v) {
  const int64_t n = s.E * s.R * s.P;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n; idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t p = idx % s.P, r = (idx / s.P) % s.R, e = idx / (s.P * s.R);
    v[idx] = to_f32(x[e * s.P + p]) * mimo_x[((e % s.H) * s.R + r) * s.P + p];
  }
}

// The rotation backward of one channel pair of rotated u (k or q; the pair's values u0, u1) and of its gradient
// (g0, g1) (dk or dq): returns the pair's term of dφ, g0 (-u1) + g1 u0 (double), and un-rotates (g0, g1) in place
// (dū = Rot(φ)^T du; cs, sn: cos φ, sin φ). The roundings pinned: term = fma(g1, u0, -(g0 u1)), dū_0 = fma(g1, sn,
// g0 cs), dū_1 = fma(g1, cs, -(g0 sn)) (the contraction nvcc chose for the plain expressions).
__device__ __forceinline__ double unrotate_pair(float u0, float u1, float& g0, float& g1, float cs, float sn) {
  const double term = __fma_rn(static_cast<double>(g1), static_cast<double>(u0),
                               -__dmul_rn(static_cast<double>(g0), static_cast<double>(u1)));
  const float d0 = __fmaf_rn(g1, sn, __fmul_rn(g0, cs)), d1 = __fmaf_rn(g1, cs, -__fmul_rn(g0, sn));
  g0 = d0;
  g1 = d1;
  return term;
}

// BCNorm backward step 1's outputs at o = (row, r G + g, n) of B (which 0) or C (1) from dn̂ = acc: dnb or dnc, and
// the weight's per-row term dn̂ ∘ n̂ into cbn or ccn (nrm: n̂_B or n̂_C at o, read by the caller before its sum, so
// that the load is in flight during it).
__device__ __forceinline__ float nhat(const Buffers& buf, int which, int64_t o) {
  return (which == 0 ? buf.nb : buf.ncn)[o];
}
__device__ __forceinline__ void put_dn(const Buffers& buf, int which, int64_t o, double acc, float nrm) {
  (which == 0 ? buf.dnb : buf.dnc)[o] = static_cast<float>(acc);
  (which == 0 ? buf.cbn : buf.ccn)[o] = static_cast<float>(acc * nrm);
}

// MIMO rotation backward (§4.5 step 3) per (token, head, angle i): dφ_i = Σ_{k,q} Σ_r (du_i0 (-u_i1) + du_i1 u_i0)
// on the rotated u (recomputed as qk_kernel: from n̂, the weights, the biases and φ); then the pair (i0, i1) =
// (i, i + N/2) of dk, dq un-rotated in place. Reads φ, the pairs of n̂_B, n̂_C, dk, dq; writes those of dk, dq and
// dφ.   (one thread per (token, head, angle))
__global__ void rot_bwd_kernel(const Mamba3Ptrs p, Sizes s, Buffers buf) {
  const int64_t n = s.E * s.S;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n; idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = idx % s.S, e = idx / s.S, i1 = i + s.N / 2, row = e / s.H, h = e % s.H, g = h / (s.H / s.G);
    float sn, cs;
    sincosf(buf.phi[idx], &sn, &cs);
    double acc = 0.0;
    for (int which = 0; which < 2; ++which)
      for (int64_t r = 0; r < s.R; ++r) {
        const float* nrm = (which == 0 ? buf.nb : buf.ncn) + ((row * s.R + r) * s.G + g) * s.N;
        const float* w = which == 0 ? p.B_norm : p.C_norm;
        const float* bias = (which == 0 ? p.B_bias : p.C_bias) + (h * s.R + r) * s.N;
        float u0, u1;
        rotate_pair(biased(nrm[i], w[i], bias[i]), biased(nrm[i1], w[i1], bias[i1]), cs, sn, u0, u1);
        float* du = (which == 0 ? buf.dk : buf.dq) + (e * s.R + r) * s.N;
        acc += unrotate_pair(u0, u1, du[i], du[i1], cs, sn);
      }
    buf.dphi[idx] = static_cast<float>(acc);
  }
}

// SISO's rotation backward, BCNorm backward step 1 and the row-range sums of the B, C bias gradients in one pass over
// dk, dq (rot_bwd_kernel's, bcnorm_dn_kernel's and colsums' arithmetic for R = 1). Channel pair u = (2u, 2u + 1) (the
// last channel alone when N is odd). Per (row, head h, u): where u < S, dφ[row, h, u] = Σ_{k,q} (du_0 (-u_1) + du_1
// u_0) with the rotated pair u of k, q recomputed as qk_kernel (from n̂, the weights, the head's biases and φ) and the
// pair of dk, dq un-rotated (dū; not stored). Per (row, g, u): dn̂ = Σ_{h of group g} dū as the sum over the group's
// slices of kRotHeads consecutive heads in slice order of each slice's sum in head order; dnb, dnc, cbn, ccn of the
// pair (put_dn). Per (h, channel): the sum of dū over the rows of this block's row range in row order into pk (k) and
// pq (q) [ranges, H N] (colsums' partials of dB_bias, dC_bias). Grid (rs.blocks pair blocks, G, ranges), block
// rs.threads() threads; block (b, g, sp): rows [rows sp / ranges, rows (sp + 1) / ranges) of group g, pairs in
// rs.chunks chunks of rs.width consecutive pairs, its chunk c the pairs (c rs.blocks + b) rs.width + l (l < rs.width;
// past (N + 1) / 2: none), so that the rotated pairs (u < S, the first chunks) spread over the blocks (at the
// benchmark's shape one rotated chunk per block). Thread x = (c rs.slices + slice) rs.width + l takes pair l of chunk c
// for the slice's heads (a warp: rs.width consecutive pairs of 32 / rs.width slices; at the benchmark's shape 8 pairs x
// 4 slices, 64-byte pieces of dk, dq per head) and walks the rows kRotRows at a time: the dk, dq pairs of its heads, φ
// and the n̂_B, n̂_C pairs of the kRotRows rows loaded at once, in flight together (the next rows' issued before the
// dn̂ sums of the current ones: in flight during them); per row its dφ stored, the dū added into its row-range sums
// (double, in registers) and its slice's sums of dū (double) stored into shared memory [kRotRows][slices][which][pair]
// as (channel 2u, 2u + 1) pieces; after the barrier, thread (row, which, pair, channel) adds its dn̂ over the slices
// (kRotSumAhead terms read at once). The rows' groups alternate between two such buffers: one barrier per group (a
// buffer is written again only after the next group's barrier, which every reader of it has passed). The pair's weights
// in registers, its heads' biases in shared memory (read back by the thread only): 128 registers, 2 blocks/SM. At the
// benchmark's shape (H = 64, G = 1, N = 128, S = 32): blocks of 16 slices x 2 chunks, grid (4, 1, 66) (rot_ranges):
// 264 blocks, one wave on 132 SMs.
constexpr int kRotRows = 2, kRotSumAhead = 4;
// Heads per thread (a slice), and the most pairs of one chunk (8 pairs: a 64-byte piece of a dk, dq row).
constexpr int kRotHeads = 4, kRotWidth = 8;
// The most heads per group: at most kThreads slices of kRotHeads heads.
constexpr int kRotMaxHeads = kRotHeads * kThreads;

// rot_bcnorm_bwd_kernel's layout: slices of kRotHeads heads per group, pairs per chunk, chunks per block, pair
// blocks.
struct RotShape {
  int slices, width, chunks, blocks;
  // the threads with a (chunk, slice, pair), and the block's threads (whole warps)
  __host__ __device__ int items() const { return chunks * slices * width; }
  int threads() const { return (items() + 31) / 32 * 32; }
  // the bytes of its two dū buffers and its biases (at most 48 KiB: slices chunks width <= kThreads)
  size_t smem() const { return (sizeof(double) * 2 * kRotRows * 4 + sizeof(float4) * kRotHeads) * items(); }
};
RotShape rot_shape(const Sizes& s) {
  const int hpg = static_cast<int>(s.H / s.G), U = static_cast<int>((s.N + 1) / 2);
  const int slices = static_cast<int>(ceil_div(hpg, kRotHeads));
  const int width = std::max(1, std::min({kRotWidth, kThreads / slices, U}));
  const int all = static_cast<int>(ceil_div(U, width)), chunks = std::clamp(kThreads / (slices * width), 1, all);
  return {slices, width, chunks, static_cast<int>(ceil_div(all, chunks))};
}

__global__ void __launch_bounds__(kThreads, 2)
    rot_bcnorm_bwd_kernel(const Mamba3Ptrs p, Sizes s, Buffers buf, RotShape rs, int64_t ranges, double* pk,
                          double* pq) {
  // dū sums [2][kRotRows][slices][which][PU] double2 (channels 2u, 2u + 1), then the biases [slices][kRotHeads][PU]
  extern __shared__ float smem[];
  const int N = static_cast<int>(s.N), S = static_cast<int>(s.S), H = static_cast<int>(s.H), U = (N + 1) / 2;
  const int hpg = H / static_cast<int>(s.G), g = static_cast<int>(blockIdx.y), x = static_cast<int>(threadIdx.x);
  const int W = rs.width, PU = rs.chunks * W, nblk = static_cast<int>(gridDim.x), b = static_cast<int>(blockIdx.x);
  const int l = x % W, sl = x / W % rs.slices, pl = x / (W * rs.slices) * W + l;  // pair l of chunk pl / W
  const int u = (pl / W * nblk + b) * W + l, h0 = g * hpg + sl * kRotHeads;
  const int left = hpg - sl * kRotHeads, nh = left < kRotHeads ? left : kRotHeads;  // heads h0 .. h0 + nh - 1
  // (2 S <= N: a lone channel is never rotated)
  const bool live = x < rs.items() && u < U, pair = 2 * u + 1 < N, rot = live && u < S;
  const int64_t sp = blockIdx.z, r_begin = s.rows * sp / ranges, r_end = s.rows * (sp + 1) / ranges;
  const int i0 = live ? 2 * u : 0, i1 = pair ? i0 + 1 : i0;
  // The weights of the pair in registers and the biases of its heads (B i0, B i1, C i0, C i1) in shared memory,
  // read back by this thread only (rotated pairs only: the recomputed k, q)
  float4* bias = reinterpret_cast<float4*>(reinterpret_cast<double*>(smem) + 2 * kRotRows * rs.slices * 4 * PU) +
                 sl * kRotHeads * PU + pl;
  float wk[2] = {}, wq[2] = {};
  if (rot) {
    wk[0] = p.B_norm[i0];
    wk[1] = p.B_norm[i1];
    wq[0] = p.C_norm[i0];
    wq[1] = p.C_norm[i1];
#pragma unroll
    for (int j = 0; j < kRotHeads; ++j) {
      if (j >= nh) break;
      const int o = (h0 + j) * N;
      bias[j * PU] = make_float4(p.B_bias[o + i0], p.B_bias[o + i1], p.C_bias[o + i0], p.C_bias[o + i1]);
    }
  }
  double sum[kRotHeads][4] = {};  // the row-range sums of dū (k i0, k i1, q i0, q i1) per head
  const int HN = H * N, HS = H * S, GN = static_cast<int>(s.G) * N;
  const bool vec = N % 2 == 0;  // every pair whole and 8-byte aligned in dk, dq, n̂: loaded as float2
  // The nr rows from row r0: the dk, dq pairs of the slice's heads and, where rotated, their φ and the n̂_B, n̂_C
  // pairs (row rr, head h0 + j: element offset rr H N + j N of dk, dq, rr H S + j S of φ, rr G N of n̂), all
  // loaded before any use.
  float d[kRotRows][kRotHeads][4], ph[kRotRows][kRotHeads], nb[kRotRows][2], nc[kRotRows][2];
  const auto load = [&](int64_t r0, int nr) {
    const int64_t e0 = r0 * H + h0;
    const float *dk = buf.dk + e0 * N + i0, *dq = buf.dq + e0 * N + i0, *phi_r = buf.phi + e0 * S + u;
    const float *nbr = buf.nb + (r0 * s.G + g) * N + i0, *ncr = buf.ncn + (r0 * s.G + g) * N + i0;
#pragma unroll
    for (int rr = 0; rr < kRotRows; ++rr) {
      if (rr >= nr) break;
#pragma unroll
      for (int j = 0; j < kRotHeads; ++j) {
        if (j >= nh) break;
        const int ok = rr * HN + j * N;
        if (vec) {
          const float2 k2 = *reinterpret_cast<const float2*>(dk + ok);
          const float2 q2 = *reinterpret_cast<const float2*>(dq + ok);
          d[rr][j][0] = k2.x;
          d[rr][j][1] = k2.y;
          d[rr][j][2] = q2.x;
          d[rr][j][3] = q2.y;
        } else {
          d[rr][j][0] = dk[ok];
          d[rr][j][1] = pair ? dk[ok + 1] : 0.0f;
          d[rr][j][2] = dq[ok];
          d[rr][j][3] = pair ? dq[ok + 1] : 0.0f;
        }
        ph[rr][j] = rot ? phi_r[rr * HS + j * S] : 0.0f;
      }
      const int on = rr * GN;
      if (rot && vec) {
        const float2 b2 = *reinterpret_cast<const float2*>(nbr + on);
        const float2 c2 = *reinterpret_cast<const float2*>(ncr + on);
        nb[rr][0] = b2.x;
        nb[rr][1] = b2.y;
        nc[rr][0] = c2.x;
        nc[rr][1] = c2.y;
      } else {
        nb[rr][0] = rot ? nbr[on] : 0.0f;
        nb[rr][1] = rot ? nbr[on + 1] : 0.0f;
        nc[rr][0] = rot ? ncr[on] : 0.0f;
        nc[rr][1] = rot ? ncr[on + 1] : 0.0f;
      }
    }
  };
  int64_t r0 = r_begin;
  int nr = static_cast<int>(std::min<int64_t>(kRotRows, r_end - r0));
  if (r0 < r_end && live) load(r0, nr);
  for (int64_t grp = 0; r0 < r_end; ++grp) {
    double* du = reinterpret_cast<double*>(smem) + grp % 2 * (kRotRows * rs.slices * 2 * PU * 2);
    if (live) {
      float* dphi_r = buf.dphi + (r0 * H + h0) * S + u;
#pragma unroll
      for (int rr = 0; rr < kRotRows; ++rr) {
        if (rr >= nr) break;
        double part[4] = {};  // the slice's sums of dū, in head order
#pragma unroll
        for (int j = 0; j < kRotHeads; ++j) {
          if (j >= nh) break;
          if (rot) {
            float sn, cs, k0, k1, q0, q1;
            sincosf(ph[rr][j], &sn, &cs);
            const float4 bj = bias[j * PU];
            rotate_pair(biased(nb[rr][0], wk[0], bj.x), biased(nb[rr][1], wk[1], bj.y), cs, sn, k0, k1);
            rotate_pair(biased(nc[rr][0], wq[0], bj.z), biased(nc[rr][1], wq[1], bj.w), cs, sn, q0, q1);
            double acc = 0.0;
            acc += unrotate_pair(k0, k1, d[rr][j][0], d[rr][j][1], cs, sn);
            acc += unrotate_pair(q0, q1, d[rr][j][2], d[rr][j][3], cs, sn);
            dphi_r[rr * HS + j * S] = static_cast<float>(acc);
          }
#pragma unroll
          for (int v = 0; v < 4; ++v) {
            const double t = d[rr][j][v];  // (converted once: the terms of both sums)
            sum[j][v] += t;
            part[v] += t;
          }
        }
        double2* dd = reinterpret_cast<double2*>(du) + (rr * rs.slices + sl) * 2 * PU + pl;
        dd[0] = make_double2(part[0], part[1]);
        dd[PU] = make_double2(part[2], part[3]);
      }
    }
    __syncthreads();
    const int64_t r1 = r0 + kRotRows;
    const int nr1 = static_cast<int>(std::min<int64_t>(kRotRows, r_end - r1));
    if (r1 < r_end && live) load(r1, nr1);  // in flight during the dn̂ sums below
    for (int q = x; q < nr * 4 * PU; q += static_cast<int>(blockDim.x)) {  // (row rr, which, pair, channel)
      const int ch = q % 2, qp = q / 2 % PU, which = q / (2 * PU) % 2, rr = q / (4 * PU);
      const int i = 2 * ((qp / W * nblk + b) * W + qp % W) + ch;
      if (i >= N) continue;
      const int64_t o = ((r0 + rr) * s.G + g) * N + i;
      const float nrm = nhat(buf, which, o);
      // Σ over the slices in order, kRotSumAhead terms read from shared memory at once
      const double* col = du + ((rr * rs.slices * 2 + which) * PU + qp) * 2 + ch;
      const int stride = 4 * PU;
      double acc = 0.0;
      int c0 = 0;
      for (; c0 + kRotSumAhead <= rs.slices; c0 += kRotSumAhead) {
        double t[kRotSumAhead];
#pragma unroll
        for (int k = 0; k < kRotSumAhead; ++k) t[k] = col[(c0 + k) * stride];
#pragma unroll
        for (int k = 0; k < kRotSumAhead; ++k) acc += t[k];
      }
      for (; c0 < rs.slices; ++c0) acc += col[c0 * stride];
      put_dn(buf, which, o, acc, nrm);
    }
    r0 = r1;
    nr = nr1;
  }
  if (!live) return;
#pragma unroll
  for (int j = 0; j < kRotHeads; ++j) {
    if (j >= nh) break;
    const int64_t o = sp * s.H * N + (h0 + j) * N + i0;
    pk[o] = sum[j][0];
    pq[o] = sum[j][2];
    if (pair) {
      pk[o + 1] = sum[j][1];
      pq[o + 1] = sum[j][3];
    }
  }
}

// rot_bcnorm_bwd_kernel's row ranges: enough for its blocks (rs.blocks G per range) to fill one wave of the GPU
// (its blocks per SM x the SMs), at most kSplits and at most one per kRotMinRows rows (each range writes H N partials
// of each side, and walks kRotMinRows / kRotRows row groups at least): at the benchmark's shape 66 (264 blocks at 2
// per SM on 132 SMs), at 440M's (32 heads, rows 8192) 128 (256 blocks; colsum_ranges would give 32: 64 blocks).
constexpr int64_t kRotMinRows = 8;
int64_t rot_ranges(const Sizes& s, const RotShape& rs) {
  int per_sm = 0;
  LLMT_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, rot_bcnorm_bwd_kernel, rs.threads(), rs.smem()));
  const int64_t wave = static_cast<int64_t>(std::max(per_sm, 1)) * sm_count();
  return std::clamp<int64_t>(ceil_div(wave, rs.blocks * s.G), 1,
                             std::min<int64_t>(kSplits, std::max<int64_t>(1, s.rows / kRotMinRows)));
}

// dψ_t = Σ_{s>=t} dφ_s in place (double sums), in parallel over T as phase_kernel (grid (ceil(H S /
// kScanLanes), B), kScanThreads threads): each segment's total, the totals of the later segments summed from the
// last one, then each segment's reverse cumsum from that carry. The last segment repeats the sequential sum
// exactly; the others group the same double sum differently.
__global__ void __launch_bounds__(kScanThreads, 2) phase_bwd_kernel(Sizes s, float* dphi) {
  __shared__ double carry[kScanSegs][kScanLanes];
  const int lane = threadIdx.x % kScanLanes, seg = threadIdx.x / kScanLanes;
  const int64_t HS = s.H * s.S, hi = blockIdx.x * int64_t{kScanLanes} + lane, row0 = blockIdx.y * s.T;
  const bool valid = hi < HS;
  const int64_t len = (s.T + kScanSegs - 1) / kScanSegs, tb = std::min<int64_t>(s.T, seg * len),
                te = std::min<int64_t>(s.T, tb + len);
  // f(t, dφ_t) for t = te - 1, ..., tb (kAhead loaded at once)
  const auto walk = [&](auto&& f) {
    for (int64_t t0 = te - 1; t0 >= tb; t0 -= kAhead) {
      float d[kAhead];
#pragma unroll
      for (int u = 0; u < kAhead; ++u) d[u] = t0 - u >= tb ? dphi[(row0 + t0 - u) * HS + hi] : 0.0f;
#pragma unroll
      for (int u = 0; u < kAhead; ++u) {
        if (t0 - u < tb) break;
        f(t0 - u, d[u]);
      }
    }
  };
  double acc = 0.0;
  if (valid) walk([&](int64_t, float d) { acc += d; });
  carry[seg][lane] = acc;
  __syncthreads();
  if (seg == 0) {  // carry[j] = Σ of the totals of segments j + 1, ...
    double c = 0.0;
    for (int j = kScanSegs - 1; j >= 0; --j) {
      const double total = carry[j][lane];
      carry[j][lane] = c;
      c += total;
    }
  }
  __syncthreads();
  if (!valid) return;
  acc = carry[seg][lane];
  walk([&](int64_t t, float d) {
    acc += d;
    dphi[(row0 + t) * HS + hi] = static_cast<float>(acc);
  });
}

// Scalars backward (§4.5 steps 4–6) per (token, head): dΔ = Σ_i θ_i dψ_i + λ dγ + (1 - λ) dε + A da with dε_t =
// dσ_{t-1}; draw's dd_dt, dd_A (0 where clamped) and trap columns. A block takes kColThreads consecutive pairs at a
// time (thread x: pair e0 + x); their dψ rows pass through shared memory 32 angles at a time (sum_cols), so that
// each thread's Σ_i θ_i dψ_i still runs in angle order.
__global__ void __launch_bounds__(kColThreads) scalar_bwd_kernel(const float* raw, const float* dt_bias, Sizes s,
                                                                 Mamba3Options opt, Buffers buf, float* draw) {
  __shared__ float dpsi[1][kColThreads][33];  // [pair - e0][angle - i0]
  const int x = static_cast<int>(threadIdx.x);
  for (int64_t e0 = blockIdx.x * int64_t{kColThreads}; e0 < s.E; e0 += int64_t{gridDim.x} * kColThreads) {
    const int64_t e = e0 + x, row = e / s.H, h = e % s.H, t = row % s.T;
    const int n = static_cast<int>(std::min<int64_t>(kColThreads, s.E - e0));
    const float* src = buf.dphi + e0 * s.S;
    double ddt = 0.0;
    sum_cols<1>(dpsi, &src, n, static_cast<int>(s.S), [&](int i0, int m) {
      if (x < n)
        for (int c = 0; c < m; ++c) ddt += buf.theta[row * s.S + i0 + c] * dpsi[0][x][c];
    });
    if (x >= n) continue;
    const float* rw = raw + row * s.W;
    const double lam = sigmoid_d(static_cast<double>(rw[2 * s.H + h])), dt = buf.dtd[e];
    const double dgam = buf.dgam[e], deps = t > 0 ? static_cast<double>(buf.dsig[e - s.H]) : 0.0;
    const double da = buf.da[e];
    ddt += lam * dgam + (1.0 - lam) * deps + static_cast<double>(buf.A[e]) * da;
    float* drw = draw + row * s.W;
    drw[2 * s.H + h] = static_cast<float>(dt * (dgam - deps) * lam * (1.0 - lam));
    const double xa = rw[s.H + h];
    const double fgrad = opt.heavy_tail ? (xa >= 0 ? 1.0 : 1.0 / ((1.0 - xa) * (1.0 - xa))) : softplus_grad_d(xa);
    drw[s.H + h] = static_cast<float>(buf.clamped[e] != 0.0f ? 0.0 : -dt * da * fgrad);
    drw[h] = static_cast<float>(ddt * softplus_grad_d(static_cast<double>(rw[h]) + dt_bias[h]));
  }
}

// Angles backward: draw[3 H + i] = π (1 - tanh^2) Σ_h Δ_h dψ_h,i.   (one thread per (row, i))
__global__ void angle_bwd_kernel(const float* raw, const double* dtd, Sizes s, const float* dpsi, float* draw) {
  const int64_t n = s.rows * s.S;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n; idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = idx % s.S, row = idx / s.S;
    double acc = 0.0;
    for (int64_t h = 0; h < s.H; ++h) acc += dtd[row * s.H + h] * dpsi[(row * s.H + h) * s.S + i];
    const double th = tanh(static_cast<double>(raw[row * s.W + 3 * s.H + i]));
    draw[row * s.W + 3 * s.H + i] = static_cast<float>(acc * kPi * (1.0 - th * th));
  }
}

// MIMO BCNorm backward (§1.1), step 1 per (row, which, r G + g, n): dn̂ = Σ_{h of group g} dū[h, r] into dnb / dnc
// and the weight's per-row term dn̂ ∘ n̂ into cbn / ccn (put_dn). Reads dk, dq, n̂_B, n̂_C; writes dnb, dnc, cbn, ccn.
__global__ void bcnorm_dn_kernel(Sizes s, Buffers buf) {
  const int64_t RGN = s.R * s.G * s.N, n_all = s.rows * 2 * RGN, hpg = s.H / s.G;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n_all;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = idx % RGN, which = (idx / RGN) % 2, row = idx / (2 * RGN);
    const int64_t n = j % s.N, g = (j / s.N) % s.G, r = j / (s.N * s.G), o = row * RGN + j;
    const float* du = which == 0 ? buf.dk : buf.dq;
    const float nrm = nhat(buf, static_cast<int>(which), o);
    double acc = 0.0;
    for (int64_t h = g * hpg; h < (g + 1) * hpg; ++h) acc += du[((row * s.H + h) * s.R + r) * s.N + n];
    put_dn(buf, static_cast<int>(which), o, acc, nrm);
  }
}

// Vector rows of dn̂ and of n̂ a bcnorm_dx_kernel thread loads at once.
constexpr int kBnLoad = 16;

// Steps 2 and 3 per (row, which, r G + g): m = mean(u ∘ n̂) with u = dn̂ ∘ w (double, in element order, then
// rounded to fp32), dbc = r (u - n̂ m) (fp32). A block takes kBnVecs consecutive vectors j = row R G + r G + g of one
// side (B: dnb, nb, rb, B_norm; C: dnc, ncn, rc, C_norm) at a time: all its threads stage their dn̂ and n̂ in shared
// memory (as bcnorm_kernel: a vector row at a time, coalesced, kBnLoad rows of each loaded at once; rows padded),
// thread x < kBnVecs adds vector j0 + x's m, then all of them write dbc a vector row at a time (coalesced) from the
// staged values. Dynamic shared memory: 2 bcnorm_smem(N).
__global__ void __launch_bounds__(kColThreads) bcnorm_dx_kernel(const Mamba3Ptrs p, Sizes s, Buffers buf, float* dbc) {
  extern __shared__ float smem[];  // dn̂ [kBnVecs][N + 1], then n̂ [kBnVecs][N + 1]
  __shared__ float ms[kBnVecs], rs[kBnVecs];  // each vector's m and r
  __shared__ int64_t vs[kBnVecs];             // and its vector (row, which, r G + g) of dbc
  const int64_t RG = s.R * s.G, J = s.rows * RG, nb = (J + kBnVecs - 1) / kBnVecs;
  const int x = static_cast<int>(threadIdx.x), N = static_cast<int>(s.N), ld = N + 1;
  float* dn = smem;
  float* nn = smem + kBnVecs * ld;
  for (int64_t u = blockIdx.x; u < 2 * nb; u += gridDim.x) {
    const int which = static_cast<int>(u / nb);
    const int64_t j0 = (u % nb) * kBnVecs;
    const int n = static_cast<int>(std::min<int64_t>(kBnVecs, J - j0));
    const float* gd = (which == 0 ? buf.dnb : buf.dnc) + j0 * s.N;
    const float* gn = (which == 0 ? buf.nb : buf.ncn) + j0 * s.N;
    const float* w = which == 0 ? p.B_norm : p.C_norm;
    for (int c = x; c < N; c += kColThreads)
#pragma unroll 1
      for (int i0 = 0; i0 < kBnVecs; i0 += kBnLoad) {
        float vd[kBnLoad], vn[kBnLoad];
#pragma unroll
        for (int k = 0; k < kBnLoad; ++k) {
          vd[k] = i0 + k < n ? gd[(i0 + k) * N + c] : 0.0f;
          vn[k] = i0 + k < n ? gn[(i0 + k) * N + c] : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < kBnLoad; ++k) {
          dn[(i0 + k) * ld + c] = vd[k];
          nn[(i0 + k) * ld + c] = vn[k];
        }
      }
    __syncthreads();
    if (x < n) {
      const int64_t j = j0 + x;
      double m = 0.0;
      for (int c = 0; c < N; ++c) m += static_cast<double>(dn[x * ld + c]) * w[c] * nn[x * ld + c];
      ms[x] = static_cast<float>(m / static_cast<double>(s.N));
      rs[x] = (which == 0 ? buf.rb : buf.rc)[j];
      vs[x] = (j / RG * 2 + which) * RG + j % RG;
    }
    __syncthreads();
    for (int i = 0; i < n; ++i) {
      float* out = dbc + vs[i] * s.N;
      const float r = rs[i], m = ms[i];
      for (int c = x; c < N; c += kColThreads) out[c] = r * (dn[i * ld + c] * w[c] - nn[i * ld + c] * m);
    }
    __syncthreads();  // (before the next vectors' staging)
  }
}

// Lets kernel take smem bytes of dynamic shared memory (opting in above the default 48 KiB); a clear error where the
// device has less (the BCNorm kernels stage 32 vectors of N floats, qk_kernel rows of R G N: large d_state or rank).
template <typename K>
void allow_smem(K kernel, size_t smem, const Sizes& s, const char* name) {
  if (smem <= 48 * 1024) return;
  int dev = 0, optin = 0;
  LLMT_CUDA_CHECK(cudaGetDevice(&dev));
  LLMT_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  check(smem <= static_cast<size_t>(optin),
        "mamba3 (cuda): {} needs {} bytes of shared memory per block for d_state {} and mimo_rank {}; the device "
        "has {}",
        name, smem, s.N, s.R, optin);
  LLMT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
}

}  // namespace

template <typename A>
void prep_fwd(const A* x, const float* bc, const float* raw, const Mamba3Ptrs& p, const Sizes& s,
              const Mamba3Options& opt, const Buffers& buf, cudaStream_t stream, const float* phase0, bool saved) {
  token_kernel<<<grid_for(s.B * ceil_div(s.T, kTokRun) * s.H), kThreads, 0, stream>>>(raw, p.dt_bias, s, opt, buf);
  LLMT_CUDA_CHECK_LAUNCH();
  if (s.S > 0) {
    theta_kernel<<<grid_for(s.rows * s.S), kThreads, 0, stream>>>(raw, s, buf.theta);
    LLMT_CUDA_CHECK_LAUNCH();
    if (!saved) {
      const dim3 scan_grid(static_cast<unsigned>(ceil_div(s.H * s.S, kScanLanes)), static_cast<unsigned>(s.B));
      phase_kernel<<<scan_grid, kScanThreads, 0, stream>>>(buf.dtd, buf.theta, phase0, s, buf.phi);
      LLMT_CUDA_CHECK_LAUNCH();
    }
  }
  if (!saved) {
    const size_t bn_smem = bcnorm_smem(s.N);
    allow_smem(bcnorm_kernel, bn_smem, s, "bcnorm_kernel");
    bcnorm_kernel<<<grid_for(s.rows * 2 * s.R * s.G, kBnVecs), kColThreads, bn_smem, stream>>>(bc, s, opt.eps, buf);
    LLMT_CUDA_CHECK_LAUNCH();
    const int64_t RGN = s.R * s.G * s.N, qk_r = qk_rows(RGN);
    const size_t qk_smem = static_cast<size_t>(2 * qk_r * RGN) * sizeof(float);
    // (row block, column block), the column blocks of a row block adjacent (they stage the same n̂ rows)
    const unsigned qk_grid = static_cast<unsigned>(
        ceil_div(s.rows, qk_r) * ceil_div(s.H * s.R * ((s.N + 1) / 2), kQkThreads * kQkPairs));
    const auto qk = [&](auto* kout, auto* qout) {  // k, q into kout, qout (fp32 or bf16: Buffers)
      const auto kernel = qk_kernel<std::remove_pointer_t<decltype(kout)>>;
      allow_smem(kernel, qk_smem, s, "qk_kernel");
      kernel<<<qk_grid, kQkThreads, qk_smem, stream>>>(p, s, buf, static_cast<int>(qk_r), kout, qout);
      LLMT_CUDA_CHECK_LAUNCH();
    };
    if (buf.kh != nullptr)
      qk(buf.kh, buf.qh);
    else
      qk(buf.k, buf.q);
  }
  if (p.mimo_x != nullptr) {
    up_kernel<A><<<grid_for(s.E * s.R * s.P), kThreads, 0, stream>>>(x, p.mimo_x, s, buf.v);
    LLMT_CUDA_CHECK_LAUNCH();
  }
}

void prep_bwd(const float* raw, const Mamba3Ptrs& p, const Sizes& s, const Mamba3Options& opt, const Buffers& buf,
              float* dbc, float* draw, const Mamba3GradPtrs& g, cudaStream_t stream) {
  const int64_t bc_all = s.rows * 2 * s.R * s.G;
  const int64_t RN = s.H * s.R * s.N, RG = s.rows * s.R * s.G;
  int64_t ranges = 0;  // SISO: the row ranges of dB_bias's and dC_bias's sums (rot_bcnorm_bwd_kernel's)
  if (s.R == 1) {  // (dB_bias's and dC_bias's range sums from here: the first two of the colsums below)
    check(s.H / s.G <= kRotMaxHeads, "mamba3 (cuda): {} heads per group (at most {})", s.H / s.G, kRotMaxHeads);
    const RotShape rs = rot_shape(s);
    ranges = rot_ranges(s, rs);
    const dim3 grid(static_cast<unsigned>(rs.blocks), static_cast<unsigned>(s.G), static_cast<unsigned>(ranges));
    rot_bcnorm_bwd_kernel<<<grid, rs.threads(), rs.smem(), stream>>>(p, s, buf, rs, ranges, buf.partial,
                                                                     buf.partial + ranges * RN);
    LLMT_CUDA_CHECK_LAUNCH();
  } else {
    if (s.S > 0) {
      rot_bwd_kernel<<<grid_for(s.E * s.S), kThreads, 0, stream>>>(p, s, buf);
      LLMT_CUDA_CHECK_LAUNCH();
    }
    bcnorm_dn_kernel<<<grid_for(bc_all * s.N), kThreads, 0, stream>>>(s, buf);
    LLMT_CUDA_CHECK_LAUNCH();
  }
  if (s.S > 0) {
    const dim3 scan_grid(static_cast<unsigned>(ceil_div(s.H * s.S, kScanLanes)), static_cast<unsigned>(s.B));
    phase_bwd_kernel<<<scan_grid, kScanThreads, 0, stream>>>(s, buf.dphi);
    LLMT_CUDA_CHECK_LAUNCH();
    angle_bwd_kernel<<<grid_for(s.rows * s.S), kThreads, 0, stream>>>(raw, buf.dtd, s, buf.dphi, draw);
    LLMT_CUDA_CHECK_LAUNCH();
  }
  scalar_bwd_kernel<<<grid_for(s.E, kColThreads), kColThreads, 0, stream>>>(raw, p.dt_bias, s, opt, buf, draw);
  LLMT_CUDA_CHECK_LAUNCH();
  const size_t bn_smem = 2 * bcnorm_smem(s.N);
  allow_smem(bcnorm_dx_kernel, bn_smem, s, "bcnorm_dx_kernel");
  const unsigned bn_grid = grid_for(2 * ceil_div(RG, int64_t{kBnVecs}), 1);  // (side, kBnVecs vectors)
  bcnorm_dx_kernel<<<bn_grid, kColThreads, bn_smem, stream>>>(p, s, buf, dbc);
  LLMT_CUDA_CHECK_LAUNCH();
  const bool siso = s.R == 1;
  const ColSum sums[] = {{siso ? nullptr : buf.dk, s.rows, RN, RN, g.B_bias, ranges},
                         {siso ? nullptr : buf.dq, s.rows, RN, RN, g.C_bias, ranges},
                         {buf.cbn, RG, s.N, s.N, g.B_norm},
                         {buf.ccn, RG, s.N, s.N, g.C_norm},
                         {draw, s.rows, s.H, s.W, g.dt_bias}};
  colsums(sums, 5, buf, stream, &s, buf.dDp, g.D);
}

template void prep_fwd<float>(const float*, const float*, const float*, const Mamba3Ptrs&, const Sizes&,
                              const Mamba3Options&, const Buffers&, cudaStream_t, const float*, bool);
template void prep_fwd<__nv_bfloat16>(const __nv_bfloat16*, const float*, const float*, const Mamba3Ptrs&,
                                      const Sizes&, const Mamba3Options&, const Buffers&, cudaStream_t, const float*,
                                      bool);

}  // namespace llmt::cuda::m3
