// 64 x 64 shared-memory tiles for the chunk-parallel delta-rule kernels (layers-delta.md §6): a chunk of
// at most 64 tokens is one tile's rows; key and value channels are cut into 64-wide column tiles.
// 256 threads per block, each owning 16 elements of a 64 x 64 product (Acc) as 4 rows x 4 columns (Grid16).
// Kernels are written against a layout L (L::row, L::col, L::mma, the reduction slots, L::Operand). Three layouts:
//   Simt  exact fp32 fma on the CUDA cores (KDA, MDN, and GDN / Comba of fp32 models);
//   Tc    the tensor cores on fp32 tiles (the scans of GDN / Comba bf16 models whose key_dim is too large for
//         the Mma scans' shared memory or registers: key_dim > 256): each product rounds both fp32
//         operand tiles to bf16 once, into bf16 shared tiles, and multiplies them with WMMA 16 x 16 x 16
//         bf16 -> fp32 fragments;
//   Mma   the tensor cores on bf16 tiles (every other phase of GDN / Comba bf16 models): the operands are bf16 in
//         shared memory from the moment they are loaded (load_h) or formed (store_acc_h), and mma.sync m16n8k16
//         (with ldmatrix, bf16_mma.cuh) adds every product straight into the register accumulators.
// (Rounding fp32 tiles to bf16 fragment element by fragment element was measured slower than Simt:
// docs/BENCHMARKS.md.) Every product sums its depth in a fixed order (deterministic). Shared tiles are fp32,
// row-major, with a padded leading dimension (65) so that a tile and its transpose are both read with few
// bank conflicts. All functions must be reached by every thread of the block.
#pragma once
#include <cuda_bf16.h>
#include <mma.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/bf16_mma.cuh"
#include "kernels/cuda/common.cuh"

namespace llmt::cuda::tile {

constexpr int kN = 64;                // tile edge
constexpr int kLd = kN + 1;           // padded leading dimension of a shared tile
constexpr int kTileFloats = kN * kLd;
constexpr int kThreads = 256;         // 8 warps, 4 x 4 outputs per thread

/// A thread's 4 x 4 accumulator: v[i][j] is element (L::row(i), L::col(j)) of a 64 x 64 tile, L the layout.
struct Acc {
  float v[4][4];
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) v[i][j] = 0.0f;
  }
};

/// The thread -> accumulator element map of both layouts: thread (ty, tx) = (threadIdx.x / 16, threadIdx.x % 16)
/// owns rows ty + 16 i and columns tx + 16 j.
struct Grid16 {
  __device__ static __forceinline__ int row(int i) { return static_cast<int>(threadIdx.x >> 4) + 16 * i; }
  __device__ static __forceinline__ int col(int j) { return static_cast<int>(threadIdx.x & 15) + 16 * j; }
  /// Which of the 16 threads sharing a row (column) this thread is, for fixed-order reductions.
  __device__ static __forceinline__ int row_slot() { return static_cast<int>(threadIdx.x & 15); }
  __device__ static __forceinline__ int col_slot() { return static_cast<int>(threadIdx.x >> 4); }
};

/// fp32 products on the CUDA cores. Exact fp32 fma in depth order.
struct Simt : Grid16 {
  using Operand = float;  // what the products read their operands as
  /// acc += op(A) op(B) over depth 64: op(A)[r][d] = TA ? A[d][r] : A[r][d], op(B)[d][c] = TB ? B[c][d] : B[d][c];
  /// A, B shared tiles (leading dimension kLd).
  template <bool TA, bool TB>
  __device__ static __forceinline__ void mma(const float* A, const float* B, Acc& acc) {
    const int x = static_cast<int>(threadIdx.x & 15), y = static_cast<int>(threadIdx.x >> 4);
    for (int d = 0; d < kN; ++d) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = TA ? A[d * kLd + y + 16 * i] : A[(y + 16 * i) * kLd + d];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = TB ? B[(x + 16 * j) * kLd + d] : B[d * kLd + x + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc.v[i][j] = fmaf(a[i], b[j], acc.v[i][j]);
    }
  }
};

/// Tensor-core products: bf16 operands, fp32 accumulation. The scratch (static shared memory, one per kernel):
/// the two operands as bf16 tiles (leading dimension kLdB) and the fp32 product tile (leading dimension kLdO).
struct Tc : Grid16 {
  using Operand = __nv_bfloat16;  // what the products read their operands as
  static constexpr int kLdB = 72;  // bf16: a multiple of 8 (WMMA); 16 rows = 2304 bytes (32-byte aligned fragments)
  static constexpr int kLdO = 72;  // floats: a multiple of 4 (WMMA)
  struct alignas(128) Scratch {
    __nv_bfloat16 a[kN * kLdB], b[kN * kLdB];
    float o[kN * kLdO];
  };
  __device__ static __forceinline__ Scratch& scratch() {
    __shared__ __align__(128) unsigned char raw[sizeof(Scratch)];  // raw bytes: no constructor runs
    return *reinterpret_cast<Scratch*>(raw);
  }

  /// acc += op(A) op(B) as Simt::mma, with every element of A and B rounded to bf16 (nearest even) and the
  /// products summed in fp32 on the tensor cores (depth in 16-wide steps, in order), then added to acc.
  /// Warp w computes the 16 x 32 block (rows 16 (w / 2), columns 32 (w % 2)) of the product. Two barriers;
  /// A and B are read before the first one (they may be overwritten once it returns).
  template <bool TA, bool TB>
  __device__ static __forceinline__ void mma(const float* A, const float* B, Acc& acc) {
    Scratch& sc = scratch();
    // Both tiles as stored (a transposed operand is a col_major load). A previous call's readers of sc.a/sc.b
    // finished before its second barrier, which every thread has passed.
    for (int it = 0; it < kN * kN / 2 / kThreads; ++it) {
      const int p = static_cast<int>(threadIdx.x) + it * kThreads, r = p >> 5, c = 2 * (p & 31);
      *reinterpret_cast<__nv_bfloat162*>(sc.a + r * kLdB + c) = __floats2bfloat162_rn(A[r * kLd + c], A[r * kLd + c + 1]);
      *reinterpret_cast<__nv_bfloat162*>(sc.b + r * kLdB + c) = __floats2bfloat162_rn(B[r * kLd + c], B[r * kLd + c + 1]);
    }
    __syncthreads();  // (also: a previous call's readers of sc.o are done)
    const int warp = static_cast<int>(threadIdx.x >> 5), r0 = 16 * (warp >> 1), c0 = 32 * (warp & 1);
#ifndef LLMT_CUDA_EMU
    namespace wmma = nvcuda::wmma;
    using LA = typename std::conditional<TA, wmma::col_major, wmma::row_major>::type;
    using LB = typename std::conditional<TB, wmma::col_major, wmma::row_major>::type;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> out[2];
    wmma::fill_fragment(out[0], 0.0f);
    wmma::fill_fragment(out[1], 0.0f);
#pragma unroll
    for (int d = 0; d < kN; d += 16) {
      // Fragment element (i, k) of op(A) is A[r0 + i][d + k] (row_major at sc.a + r0 kLdB + d) or A[d + k][r0 + i]
      // (col_major at sc.a + d kLdB + r0); likewise op(B) (k, j) is B[d + k][c + j] or B[c + j][d + k].
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, LA> fa;
      wmma::load_matrix_sync(fa, TA ? sc.a + d * kLdB + r0 : sc.a + r0 * kLdB + d, kLdB);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, LB> fb;
        const int c = c0 + 16 * j;
        wmma::load_matrix_sync(fb, TB ? sc.b + c * kLdB + d : sc.b + d * kLdB + c, kLdB);
        wmma::mma_sync(out[j], fa, fb, out[j]);
      }
    }
    wmma::store_matrix_sync(sc.o + r0 * kLdO + c0, out[0], kLdO, wmma::mem_row_major);
    wmma::store_matrix_sync(sc.o + r0 * kLdO + c0 + 16, out[1], kLdO, wmma::mem_row_major);
#else
    // The CPU emulator (tests/emu/cuda_emu.h) has no WMMA: the warp's 16 x 32 block from the same bf16 tiles, lane l
    // computing row r0 + l / 2, columns c0 + 16 (l % 2) .. +15, the exact products summed in depth order in fp32.
    {
      const int lane = static_cast<int>(threadIdx.x & 31), r = r0 + (lane >> 1);
      for (int c = c0 + 16 * (lane & 1), ce = c + 16; c < ce; ++c) {
        float o = 0.0f;
        for (int d = 0; d < kN; ++d)
          o += __bfloat162float(TA ? sc.a[d * kLdB + r] : sc.a[r * kLdB + d]) *
               __bfloat162float(TB ? sc.b[c * kLdB + d] : sc.b[d * kLdB + c]);
        sc.o[r * kLdO + c] = o;
      }
    }
#endif
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc.v[i][j] += sc.o[row(i) * kLdO + col(j)];
  }
};

/// Tensor-core products on bf16 operand tiles that stay in shared memory, accumulated in registers (GDN /
/// Comba of bf16 models; tile::Tc only for their scans at a large key_dim). A bf16 tile is 64 x 64 bf16 with
/// leading dimension kLdH (144 bytes: every row 16-byte aligned for ldmatrix, and the 8 rows of an 8 x 8
/// matrix start in 8 different 4-bank groups, so ldmatrix and the bf16x2 stores of an Acc are conflict-free).
/// Operands are rounded to bf16 once, when a kernel loads them (load_h) or writes them (store_acc_h); mma
/// adds op(A) op(B) straight into the fp32 accumulators, so a sum over several tiles (key tiles of Q K^T,
/// W S, Q h) never leaves the registers. Warp w computes rows 32 (w / 4) .. +31, columns 16 (w % 4) .. +15 as
/// 2 x 2 m16n8k16 fragments (bf16_mma.cuh); the fragment elements of a thread are 4 rows x 4 columns, so an
/// Acc is used as with the other layouts (row(i), col(j)):
///   row(i) = 32 (w / 4) + 16 (i / 2) + 8 (i % 2) + l / 4,   col(j) = 16 (w % 4) + 8 (j / 2) + 2 (l % 4) + j % 2
/// (l the lane); acc.v[i][j] is element 2 (i % 2) + j % 2 of fragment (i / 2, j / 2).
constexpr int kLdH = 72;
constexpr int kTileHalves = kN * kLdH;
struct Mma {
  using Operand = __nv_bfloat16;
  __device__ static __forceinline__ int warp() { return static_cast<int>(threadIdx.x >> 5); }
  __device__ static __forceinline__ int lane() { return static_cast<int>(threadIdx.x & 31); }
  __device__ static __forceinline__ int row(int i) {
    return 32 * (warp() >> 2) + 16 * (i >> 1) + 8 * (i & 1) + (lane() >> 2);
  }
  __device__ static __forceinline__ int col(int j) {
    return 16 * (warp() & 3) + 8 * (j >> 1) + 2 * (lane() & 3) + (j & 1);
  }
  /// Which of the 16 threads sharing a row (column) this thread is, for fixed-order reductions.
  __device__ static __forceinline__ int row_slot() { return 4 * (warp() & 3) + (lane() & 3); }
  __device__ static __forceinline__ int col_slot() { return 8 * (warp() >> 2) + (lane() >> 2); }

  /// acc += op(A) op(B) over depth 64, A and B bf16 tiles (kLdH): op(A)[r][d] = TA ? A[d][r] : A[r][d],
  /// op(B)[d][c] = TB ? B[c][d] : B[d][c]. Products exact, sums in fp32 on the tensor cores, depth in 16-wide
  /// steps in order. No barrier: the caller orders the tiles' writes before the call.
  template <bool TA, bool TB>
  __device__ static __forceinline__ void mma(const __nv_bfloat16* A, const __nv_bfloat16* B, Acc& acc) {
    const int r0 = 32 * (warp() >> 2), c0 = 16 * (warp() & 3);
    const int m = lane() >> 3, i = lane() & 7;  // this lane addresses row i of 8 x 8 matrix m
#pragma unroll
    for (int d = 0; d < kN; d += 16) {
      uint32_t a[2][4], b[4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {  // matrix m of op(A): rows + 8 (m % 2), depth + 8 (m / 2)
        const int rr = r0 + 16 * mt + 8 * (m & 1), dd = d + 8 * (m >> 1);
        if (TA)
          ::llmt::cuda::mma::ldsm_x4_trans(a[mt], A + (dd + i) * kLdH + rr);
        else
          ::llmt::cuda::mma::ldsm_x4(a[mt], A + (rr + i) * kLdH + dd);
      }
      {  // matrix m of op(B): depth + 8 (m % 2), columns + 8 (m / 2); b[2 nt], b[2 nt + 1] feed fragment column nt
        const int dd = d + 8 * (m & 1), cc = c0 + 8 * (m >> 1);
        if (TB)
          ::llmt::cuda::mma::ldsm_x4(b, B + (cc + i) * kLdH + dd);
        else
          ::llmt::cuda::mma::ldsm_x4_trans(b, B + (dd + i) * kLdH + cc);
      }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          float c[4] = {acc.v[2 * mt][2 * nt], acc.v[2 * mt][2 * nt + 1], acc.v[2 * mt + 1][2 * nt],
                        acc.v[2 * mt + 1][2 * nt + 1]};
          ::llmt::cuda::mma::mma_16816(c, a[mt], b[2 * nt], b[2 * nt + 1]);
          acc.v[2 * mt][2 * nt] = c[0], acc.v[2 * mt][2 * nt + 1] = c[1];
          acc.v[2 * mt + 1][2 * nt] = c[2], acc.v[2 * mt + 1][2 * nt + 1] = c[3];
        }
    }
  }
};

/// A thread's share of a 64 x 64 tile as load_h reads it: x[it] = (src[r][c], src[r][c + 1]) for
/// (r, c) = (idx / 32, 2 (idx % 32)), idx = threadIdx.x + it kThreads, as float (0 outside rows x cols).
constexpr int kHPer = kN * kN / 2 / kThreads;
using HRegs = float[kHPer][2];

/// First half of load_h: the thread's 16 elements of src into x (all loads issued together, nothing waits for
/// them here: a caller may keep x in flight across other work and hand it to put_h later).
template <typename E>
__device__ __forceinline__ void fetch_h(HRegs& x, const E* src, int64_t stride, int rows, int cols) {
#pragma unroll
  for (int it = 0; it < kHPer; ++it) {
    const int idx = static_cast<int>(threadIdx.x) + it * kThreads, r = idx >> 5, c = 2 * (idx & 31);
    x[it][0] = r < rows && c < cols ? to_f32(src[r * stride + c]) : 0.0f;
    x[it][1] = r < rows && c + 1 < cols ? to_f32(src[r * stride + c + 1]) : 0.0f;
  }
}

/// Second half of load_h: s[r][c] = bf16(f * x) with f = scale(r) for r < rows, else 0 (bf16x2 stores).
template <typename Scale>
__device__ __forceinline__ void put_h(__nv_bfloat16* s, const HRegs& x, int rows, Scale scale) {
#pragma unroll
  for (int it = 0; it < kHPer; ++it) {
    const int idx = static_cast<int>(threadIdx.x) + it * kThreads, r = idx >> 5, c = 2 * (idx & 31);
    const float f = r < rows ? scale(r) : 0.0f;
    *reinterpret_cast<__nv_bfloat162*>(s + r * kLdH + c) = __floats2bfloat162_rn(f * x[it][0], f * x[it][1]);
  }
}

/// s[r][c] = bf16(scale(r) * src[r * stride + c]) for r < rows, c < cols, else 0: a bf16 tile (kLdH) from
/// float or bf16 (a bf16 source with scale 1 is copied exactly). Each thread handles column pairs (a warp
/// reads one 64-wide row, coalesced; bf16x2 stores); all 16 loads of a thread are issued before the stores.
template <typename E, typename Scale>
__device__ __forceinline__ void load_h(__nv_bfloat16* s, const E* src, int64_t stride, int rows, int cols,
                                       Scale scale) {
  HRegs x;
  fetch_h(x, src, stride, rows, cols);
  put_h(s, x, rows, scale);
}
template <typename E>
__device__ __forceinline__ void load_h(__nv_bfloat16* s, const E* src, int64_t stride, int rows, int cols) {
  load_h(s, src, stride, rows, cols, [](int) { return 1.0f; });
}

/// A thread's share of a bf16 64 x 64 tile in put_h's map, as bf16 pairs: p[it] = (src[r][c], src[r][c + 1]) for
/// (r, c) = (idx / 32, 2 (idx % 32)), idx = threadIdx.x + it kThreads (kHPer registers). fetch_pairs issues the
/// 4-byte loads (src and stride even: every pair 4-byte aligned) and nothing waits for them there; put_pairs
/// stores them into a bf16 tile (kLdH): the tile copied exactly, its loads in flight in between.
using HPairs = __nv_bfloat162[kHPer];
__device__ __forceinline__ void fetch_pairs(HPairs& p, const __nv_bfloat16* src, int64_t stride) {
#pragma unroll
  for (int it = 0; it < kHPer; ++it) {
    const int idx = static_cast<int>(threadIdx.x) + it * kThreads, r = idx >> 5, c = 2 * (idx & 31);
    p[it] = *reinterpret_cast<const __nv_bfloat162*>(src + r * stride + c);
  }
}
__device__ __forceinline__ void put_pairs(__nv_bfloat16* s, const HPairs& p) {
#pragma unroll
  for (int it = 0; it < kHPer; ++it) {
    const int idx = static_cast<int>(threadIdx.x) + it * kThreads, r = idx >> 5, c = 2 * (idx & 31);
    *reinterpret_cast<__nv_bfloat162*>(s + r * kLdH + c) = p[it];
  }
}

/// A thread's 16 elements of a 64 x 64 tile in load_h's map (column pairs), held in registers between their
/// global loads (fetch_h) and their store into a bf16 tile (put_h): load_h split in two, so that the loads of
/// a later tile are in flight while the block computes. fetch_h then put_h stores what load_h stores.
struct Frag {
  float x[kN * kN / 2 / kThreads][2];
};
template <typename E>
__device__ __forceinline__ void fetch_h(Frag& f, const E* src, int64_t stride, int rows, int cols) {
  constexpr int kRowsPer = kThreads / 32;  // rows between a thread's elements it and it + 1
  const int r0 = static_cast<int>(threadIdx.x) >> 5, c = 2 * (static_cast<int>(threadIdx.x) & 31);
  const E* p = src + r0 * stride + c;
  const int64_t step = kRowsPer * stride;
#pragma unroll
  for (int it = 0; it < kN * kN / 2 / kThreads; ++it) {
    const int r = r0 + kRowsPer * it;
    f.x[it][0] = r < rows && c < cols ? to_f32(p[it * step]) : 0.0f;
    f.x[it][1] = r < rows && c + 1 < cols ? to_f32(p[it * step + 1]) : 0.0f;
  }
}
template <typename Scale>
__device__ __forceinline__ void put_h(const Frag& f, __nv_bfloat16* s, int rows, Scale scale) {
#pragma unroll
  for (int it = 0; it < kN * kN / 2 / kThreads; ++it) {
    const int idx = static_cast<int>(threadIdx.x) + it * kThreads, r = idx >> 5, c = 2 * (idx & 31);
    const float g = r < rows ? scale(r) : 0.0f;
    *reinterpret_cast<__nv_bfloat162*>(s + r * kLdH + c) = __floats2bfloat162_rn(g * f.x[it][0], g * f.x[it][1]);
  }
}

// ---- cp.async (sm_80+): global -> shared copies that complete in the background ----
// A thread's copies are grouped by cp_async_commit; cp_async_wait<N> returns once all but the newest N of the
// thread's committed groups have landed. Another thread reads them only after that wait and a barrier.
// (Under LLMT_CUDA_EMU, the CPU emulator's: tests/emu/cuda_emu.h.)

/// 16 bytes into shared dst: the first `bytes` (0 .. 16) from global src, the rest zero (src is not read when
/// bytes = 0). dst and src 16-byte aligned. .cg: cached in L2 only.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int bytes) {
#ifdef __CUDA_ARCH__
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(dst))), "l"(src), "r"(bytes) : "memory");
#elif defined(LLMT_CUDA_EMU)
  ::emu::cp_async(dst, src, 16, bytes);
#endif
}
/// 4 bytes from global src into shared dst (both 4-byte aligned; .ca: cached in L1 and L2).
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
#ifdef __CUDA_ARCH__
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(dst))), "l"(src) : "memory");
#elif defined(LLMT_CUDA_EMU)
  ::emu::cp_async(dst, src, 4, 4);
#endif
}
/// Closes the thread's current group of cp.async copies (an empty group is allowed).
__device__ __forceinline__ void cp_async_commit() {
#ifdef __CUDA_ARCH__
  asm volatile("cp.async.commit_group;" ::: "memory");
#elif defined(LLMT_CUDA_EMU)
  ::emu::cp_async_commit();
#endif
}
/// Waits until at most N of the thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#ifdef __CUDA_ARCH__
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#elif defined(LLMT_CUDA_EMU)
  ::emu::cp_async_wait(N);
#endif
}
/// cp_async_wait with a run-time count: waits until at most n of the thread's committed groups are still in flight
/// (n < 0 as 0; n > 7 as 7, which waits for more).
__device__ __forceinline__ void cp_async_wait_n(int n) {
  switch (n < 0 ? 0 : n) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    case 4: cp_async_wait<4>(); break;
    case 5: cp_async_wait<5>(); break;
    case 6: cp_async_wait<6>(); break;
    default: cp_async_wait<7>(); break;
  }
}

/// Whether load_h_async can read tiles of a bf16 tensor starting at p whose rows all start a multiple of `dim`
/// elements after p (and whose tiles start at multiples of 64 columns): every row and 8-column piece 16-byte
/// aligned. (For [B, T, H, dim] tensors pass dim, not the row stride H dim.)
__host__ __device__ __forceinline__ bool async_ok_h(const void* p, int64_t dim) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && dim % 8 == 0;
}
/// As async_ok_h for stage_async and an fp32 tensor (4-column pieces).
__host__ __device__ __forceinline__ bool async_ok_f(const void* p, int64_t dim) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && dim % 4 == 0;
}

/// load_h(s, src, stride, rows, cols) of a bf16 src (scale 1: the same bits) by cp.async: each thread copies two
/// 16-byte pieces (8 columns of a row), rows >= rows and columns >= cols zero-filled. src + c0 with c0 the tile's
/// first column: every tile start and stride 16-byte aligned (async_ok_h). Lands at cp_async_wait.
__device__ __forceinline__ void load_h_async(__nv_bfloat16* s, const __nv_bfloat16* src, int64_t stride, int rows,
                                             int cols) {
#pragma unroll
  for (int it = 0; it < kN * kN / 8 / kThreads; ++it) {
    const int idx = static_cast<int>(threadIdx.x) + it * kThreads, r = idx >> 3, c = 8 * (idx & 7);
    const int m = cols - c < 8 ? (cols - c > 0 ? cols - c : 0) : 8;
    const int bytes = r < rows ? 2 * m : 0;
    cp_async16(s + r * kLdH + c, bytes > 0 ? src + r * stride + c : src, bytes);
  }
}

/// Eight bf16 values (one 16-byte piece) times f: each bf16(f x), x widened to fp32 (the rounding of load_h).
__device__ __forceinline__ uint4 scale8_h(uint4 x, float f) {
  __nv_bfloat162* p = reinterpret_cast<__nv_bfloat162*>(&x);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 y = __bfloat1622float2(p[e]);
    p[e] = __floats2bfloat162_rn(f * y.x, f * y.y);
  }
  return x;
}

/// After the thread's own load_h_async copies into s have landed (its cp_async_wait): s[r][c] = bf16(f x) over
/// exactly those pieces, in place, with f = scale(r) for r < rows, else 0, x the copied value (0 where zero-filled):
/// load_h_async then scale_h_async give the elements and rounding of load_h(s, src, stride, rows, cols, scale). The
/// thread's own pieces only: no barrier between the two (one before other threads read the tile).
template <typename Scale>
__device__ __forceinline__ void scale_h_async(__nv_bfloat16* s, int rows, Scale scale) {
#pragma unroll
  for (int it = 0; it < kN * kN / 8 / kThreads; ++it) {
    const int idx = static_cast<int>(threadIdx.x) + it * kThreads, r = idx >> 3, c = 8 * (idx & 7);
    uint4* q = reinterpret_cast<uint4*>(s + r * kLdH + c);
    *q = scale8_h(*q, r < rows ? scale(r) : 0.0f);
  }
}

/// The fp32 staging tile of stage_async: 64 x 64 floats, rows 64 apart (16 KiB).
constexpr int kStageFloats = kN * kN;

/// Copies an fp32 64 x 64 tile, row r at row(r) (a float pointer to the tile's first column), into the staging
/// tile g by cp.async, rows >= rows and columns >= cols zero-filled: thread t copies the 16-byte pieces
/// idx = t + it kThreads (it < 4), row idx / 16, columns 4 (idx % 16) .. + 3, and put_h_staged reads back exactly
/// these pieces (so the thread's own cp_async_wait suffices; no barrier between). Every row 16-byte aligned
/// (async_ok_f). row is called for r < rows and for r = 0 (the unread source of the zero-filled pieces).
template <typename Row>
__device__ __forceinline__ void stage_async(float* g, Row row, int rows, int cols) {
#pragma unroll
  for (int it = 0; it < kN * kN / 4 / kThreads; ++it) {
    const int idx = static_cast<int>(threadIdx.x) + it * kThreads, r = idx >> 4, c = 4 * (idx & 15);
    const int m = cols - c < 4 ? (cols - c > 0 ? cols - c : 0) : 4;
    const int bytes = r < rows ? 4 * m : 0;
    cp_async16(g + r * kN + c, bytes > 0 ? row(r) + c : row(0), bytes);
  }
}
/// stage_async of the tile at src, rows stride apart.
__device__ __forceinline__ void stage_async(float* g, const float* src, int64_t stride, int rows, int cols) {
  stage_async(g, [=](int r) { return src + r * stride; }, rows, cols);
}

/// Where element (r, c) of a swizzled staging tile lies (stage_async_sw): row r's 16-byte pieces permuted, piece q
/// at q ^ 2 (r % 4). A warp's 8-byte reads of an Acc's column pairs in the Mma map (rows r .. r + 7, four pairs
/// 8 bytes apart in each; load_acc_sw) then hit every bank once per 128 bytes, where the plain tile's rows all
/// start in bank 0 (8-way conflicts).
__device__ __forceinline__ int stage_sw(int r, int c) { return r * kN + (c ^ ((r & 3) << 3)); }

/// load_h(s, src, stride, rows, cols, scale) from the thread's own pieces of a staging tile filled by
/// stage_async (same src, rows, cols): s[r][c] = bf16(f x) with f = scale(r) for r < rows, else 0, x the staged
/// value (0 outside rows x cols): the elements and rounding of load_h, another thread -> element map. kSw: from a
/// swizzled staging tile (stage_async_sw; put_h_staged_sw).
template <bool kSw = false, typename Scale>
__device__ __forceinline__ void put_h_staged(__nv_bfloat16* s, const float* g, int rows, Scale scale) {
#pragma unroll
  for (int it = 0; it < kN * kN / 4 / kThreads; ++it) {
    const int idx = static_cast<int>(threadIdx.x) + it * kThreads, r = idx >> 4, c = 4 * (idx & 15);
    const float4 x = *reinterpret_cast<const float4*>(g + (kSw ? stage_sw(r, c) : r * kN + c));
    const float f = r < rows ? scale(r) : 0.0f;
    *reinterpret_cast<__nv_bfloat162*>(s + r * kLdH + c) = __floats2bfloat162_rn(f * x.x, f * x.y);
    *reinterpret_cast<__nv_bfloat162*>(s + r * kLdH + c + 2) = __floats2bfloat162_rn(f * x.z, f * x.w);
  }
}
__device__ __forceinline__ void put_h_staged(__nv_bfloat16* s, const float* g, int rows) {
  put_h_staged(s, g, rows, [](int) { return 1.0f; });
}

/// stage_async(g, src, stride, rows, cols) into a swizzled staging tile (stage_sw): the same pieces per thread
/// (thread t: row t / 16 + 16 it, columns 4 (t % 16) ..), its source row pointer formed once.
__device__ __forceinline__ void stage_async_sw(float* g, const float* src, int64_t stride, int rows, int cols) {
  const int r0 = static_cast<int>(threadIdx.x) >> 4, c = 4 * (static_cast<int>(threadIdx.x) & 15);
  const int m = cols - c < 4 ? (cols - c > 0 ? cols - c : 0) : 4;
  const float* p = src + r0 * stride + c;
  float* d = g + stage_sw(r0, c);  // (r0 + 16 it) % 4 = r0 % 4: the same permutation in every row of the thread
#pragma unroll
  for (int it = 0; it < kN * kN / 4 / kThreads; ++it) {
    const int bytes = r0 + 16 * it < rows ? 4 * m : 0;
    cp_async16(d + 16 * kN * it, bytes > 0 ? p + 16 * it * stride : src, bytes);
  }
}

/// put_h_staged from a swizzled staging tile (stage_async_sw; the thread's own pieces): the same elements and
/// rounding.
template <typename Scale>
__device__ __forceinline__ void put_h_staged_sw(__nv_bfloat16* s, const float* g, int rows, Scale scale) {
  put_h_staged<true>(s, g, rows, scale);
}
__device__ __forceinline__ void put_h_staged_sw(__nv_bfloat16* s, const float* g, int rows) {
  put_h_staged<true>(s, g, rows, [](int) { return 1.0f; });
}

/// Where piece `it` (< 4) of thread t of an fp32 staging tile lies (stage_async's: row t / 16 + 16 it, columns
/// 4 (t % 16) ..), in floats from the tile's start.
__device__ __forceinline__ int stage_piece(int t, int it) { return ((t >> 4) + 16 * it) * kN + 4 * (t & 15); }

/// stage_async of a bf16 tensor: thread t copies the 16-byte pieces of load_h_async (idx = t + it kThreads, it < 2:
/// row idx / 8, columns 8 (idx % 8) .. + 7) as they are, piece it to the place of its own fp32 piece it
/// (stage_piece), rows >= rows and columns >= cols zero-filled. A thread so owns the same bytes of a staging tile
/// whether it holds an fp32 or a bf16 tile, and a tile's copies may be issued into it once the thread has read its
/// own pieces of the tile before, whatever their types. src + c0 with c0 the tile's first column; every tile start
/// and stride 16-byte aligned (async_ok_h).
__device__ __forceinline__ void stage_async_h(float* g, const __nv_bfloat16* src, int64_t stride, int rows,
                                              int cols) {
  const int t = static_cast<int>(threadIdx.x);
#pragma unroll
  for (int it = 0; it < kN * kN / 8 / kThreads; ++it) {
    const int idx = t + it * kThreads, r = idx >> 3, c = 8 * (idx & 7);
    const int m = cols - c < 8 ? (cols - c > 0 ? cols - c : 0) : 8;
    const int bytes = r < rows ? 2 * m : 0;
    cp_async16(g + stage_piece(t, it), bytes > 0 ? src + r * stride + c : src, bytes);
  }
}

/// put_h_staged from a bf16 staging tile (stage_async_h; the thread's own pieces): s[r][c] = bf16(f x) with
/// f = scale(r) for r < rows, else 0, x the staged value (0 outside what was staged): the elements and rounding of
/// load_h(s, src, stride, rows, cols, scale) of the bf16 source (scale 1: its bits).
template <typename Scale>
__device__ __forceinline__ void put_h_staged_h(__nv_bfloat16* s, const float* g, int rows, Scale scale) {
  const int t = static_cast<int>(threadIdx.x);
#pragma unroll
  for (int it = 0; it < kN * kN / 8 / kThreads; ++it) {
    const int idx = t + it * kThreads, r = idx >> 3, c = 8 * (idx & 7);
    *reinterpret_cast<uint4*>(s + r * kLdH + c) =
        scale8_h(*reinterpret_cast<const uint4*>(g + stage_piece(t, it)), r < rows ? scale(r) : 0.0f);
  }
}

/// Element (r, c) of a bf16 staging tile (stage_async_h; any thread's piece, after a barrier), as float.
__device__ __forceinline__ float staged_h_at(const float* g, int r, int c) {
  const int idx = r * (kN / 8) + (c >> 3);
  return __bfloat162float(
      reinterpret_cast<const __nv_bfloat16*>(g + stage_piece(idx % kThreads, idx / kThreads))[c & 7]);
}

/// s[r][c] = bf16(f(r, c, acc element)) for the thread's elements (Mma map): an Acc into a bf16 tile (bf16x2
/// stores of column pairs j = 0, 1 and 2, 3).
template <typename F>
__device__ __forceinline__ void store_acc_h(const Acc& acc, __nv_bfloat16* s, F f) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; j += 2) {
      const int r = Mma::row(i), c = Mma::col(j);
      *reinterpret_cast<__nv_bfloat162*>(s + r * kLdH + c) =
          __floats2bfloat162_rn(f(r, c, acc.v[i][j]), f(r, c + 1, acc.v[i][j + 1]));
    }
}

/// dst[r * stride + c] = s[r][c] for r < rows, c < cols: a bf16 tile to a bf16 tensor. Where dst is 16-byte
/// aligned and stride, cols are multiples of 8, by 16-byte pieces (8 columns; piece idx = t + it kThreads: row
/// idx / 8, columns 8 (idx % 8) ..; a warp stores 4 whole rows), else element by element.
__device__ __forceinline__ void store_h(const __nv_bfloat16* s, __nv_bfloat16* dst, int64_t stride, int rows,
                                        int cols) {
  if ((reinterpret_cast<uintptr_t>(dst) & 15) == 0 && (stride & 7) == 0 && (cols & 7) == 0) {
    const int r0 = static_cast<int>(threadIdx.x) >> 3, c = 8 * (static_cast<int>(threadIdx.x) & 7);
#pragma unroll
    for (int it = 0; it < kN * kN / 8 / kThreads; ++it) {
      const int r = r0 + it * (kThreads / 8);
      if (r < rows && c < cols)
        *reinterpret_cast<uint4*>(dst + r * stride + c) = *reinterpret_cast<const uint4*>(s + r * kLdH + c);
    }
    return;
  }
  for (int idx = threadIdx.x; idx < kN * kN; idx += kThreads) {
    const int r = idx >> 6, c = idx & 63;
    if (r < rows && c < cols) dst[r * stride + c] = s[r * kLdH + c];
  }
}

/// s[r][c] = scale(r, c) * src[r * stride + c] for r < rows, c < cols, else 0 (coalesced along c). src: float
/// or bf16. All 16 loads of a thread are issued before the first shared store, so they overlap.
template <typename E, typename Scale>
__device__ __forceinline__ void load_rc(float* s, const E* src, int64_t stride, int rows, int cols, Scale scale) {
  constexpr int kPer = kN * kN / kThreads;
  float x[kPer];
#pragma unroll
  for (int it = 0; it < kPer; ++it) {
    const int idx = static_cast<int>(threadIdx.x) + it * kThreads, r = idx >> 6, c = idx & 63;
    x[it] = r < rows && c < cols ? to_f32(src[r * stride + c]) : 0.0f;
  }
#pragma unroll
  for (int it = 0; it < kPer; ++it) {
    const int idx = static_cast<int>(threadIdx.x) + it * kThreads, r = idx >> 6, c = idx & 63;
    s[r * kLd + c] = r < rows && c < cols ? scale(r, c) * x[it] : 0.0f;
  }
}
/// s[r][c] = scale(r) * src[r * stride + c] for r < rows, c < cols, else 0 (load_rc with a row scale).
template <typename E, typename Scale>
__device__ __forceinline__ void load(float* s, const E* src, int64_t stride, int rows, int cols, Scale scale) {
  load_rc(s, src, stride, rows, cols, [&](int r, int) { return scale(r); });
}
template <typename E>
__device__ __forceinline__ void load(float* s, const E* src, int64_t stride, int rows, int cols) {
  load(s, src, stride, rows, cols, [](int) { return 1.0f; });
}

/// dst[r * stride + c] = s[r][c] for r < rows, c < cols; dst float or bf16 (rounded to nearest even).
template <typename E>
__device__ __forceinline__ void store(const float* s, E* dst, int64_t stride, int rows, int cols) {
  for (int idx = threadIdx.x; idx < kN * kN; idx += kThreads) {
    const int r = idx >> 6, c = idx & 63;
    if (r < rows && c < cols) dst[r * stride + c] = from_f32<E>(s[r * kLd + c]);
  }
}

/// s[r][c] = 0 for the whole tile.
__device__ __forceinline__ void clear(float* s) {
  for (int idx = threadIdx.x; idx < kN * kLd; idx += kThreads) s[idx] = 0.0f;
}

/// out[t] = sum_j rows[t][j] + sum_i cols[i][t] for t < 64, where each thread contributes its micro-tile row
/// partials row_part[i] (to row L::row(i)) and column partials col_part[j] (to column L::col(j)); the 16
/// partials of a row (column) are added in slot order. red: 2 * 64 * 16 floats of shared scratch.
/// out may be read after the call (ends with a barrier).
template <typename L>
__device__ __forceinline__ void reduce_rows_cols(const float row_part[4], const float col_part[4], float* red,
                                                 float* out) {
#pragma unroll
  for (int i = 0; i < 4; ++i) red[L::row(i) * 16 + L::row_slot()] = row_part[i];
#pragma unroll
  for (int j = 0; j < 4; ++j) red[kN * 16 + L::col(j) * 16 + L::col_slot()] = col_part[j];
  __syncthreads();
  if (threadIdx.x < kN) {
    float s = 0.0f;
    for (int p = 0; p < 16; ++p) s += red[threadIdx.x * 16 + p];
    for (int p = 0; p < 16; ++p) s += red[kN * 16 + threadIdx.x * 16 + p];
    out[threadIdx.x] = s;
  }
  __syncthreads();
}

/// out[t] = sum_j rows[t][j] for t < 64: reduce_rows_cols without column partials (red: 64 * 16 floats; the 16
/// partials of a row added in slot order). out may be read after the call (ends with a barrier).
template <typename L>
__device__ __forceinline__ void reduce_rows(const float row_part[4], float* red, float* out) {
#pragma unroll
  for (int i = 0; i < 4; ++i) red[L::row(i) * 16 + L::row_slot()] = row_part[i];
  __syncthreads();
  if (threadIdx.x < kN) {
    float s = 0.0f;
    for (int p = 0; p < 16; ++p) s += red[threadIdx.x * 16 + p];
    out[threadIdx.x] = s;
  }
  __syncthreads();
}

/// (I + A) 𝒯 = I (layers-delta.md §6.1 F2), blocked in 16 x 16 blocks (L = I + A, block rows i > j:
/// 𝒯_ij = -𝒯_ii Σ_{j<=k<i} A_ik 𝒯_kj). A strictly lower (zero rows >= n; its strictly upper triangle is used as
/// scratch: clobbered), 𝒯 the identity on entry (rows >= n stay identity); both shared tiles.
///   1. thread m < 64 solves column m of its diagonal block in registers by forward substitution, row by row:
///      𝒯_rm = -Σ_{m<=j<r} A_rj 𝒯_jm as four partial sums by j mod 4, combined in a fixed order;
///   2. block rows i = 1, 2, 3: thread (rl, q) = (tid / 16, tid % 16) forms row 16 i + rl, columns q + 16 j
///      (j < i) of X = Σ_k A_ik 𝒯_kj with unrolled loops (X^T into A's upper triangle), then 𝒯_ij = -𝒯_ii X.
/// Fixed summation orders (deterministic). Ends with a barrier.
__device__ __forceinline__ void tril_inverse_fast(float* A, float* Tm, int n) {
  const int tid = static_cast<int>(threadIdx.x);
  if (tid < kN) {
    const int m = tid, b0 = m & ~15, mm = m & 15;
    float t[16];
#pragma unroll
    for (int rl = 0; rl < 16; ++rl) {
      const int r = b0 + rl;
      float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int jl = 0; jl < rl; ++jl) s[jl & 3] += A[r * kLd + b0 + jl] * t[jl];
      const float tot = (m & 1) ? (s[1] + s[2]) + (s[3] + s[0]) : (s[0] + s[1]) + (s[2] + s[3]);
      t[rl] = rl < mm ? 0.0f : rl == mm ? 1.0f : r < n ? -tot : 0.0f;
      if (rl > mm) Tm[r * kLd + m] = t[rl];
    }
  }
  __syncthreads();
  const int rl = tid >> 4, q = tid & 15;
#pragma unroll
  for (int i = 1; i < 4; ++i) {
    const int r0 = 16 * i, r = r0 + rl;
    float x[3] = {0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int kb = 0; kb < i; ++kb)
#pragma unroll
      for (int kk = 0; kk < 16; ++kk) {  // X_rc = Σ_{c<=k<r0} A_rk 𝒯_kc (𝒯_kc = 0 for k < c)
        const int k = 16 * kb + kk;
        const float av = A[r * kLd + k];
#pragma unroll
        for (int j = 0; j <= kb; ++j) x[j] += av * Tm[k * kLd + q + 16 * j];
      }
#pragma unroll
    for (int j = 0; j < i; ++j) A[(q + 16 * j) * kLd + r] = x[j];
    __syncthreads();
    float y[3] = {0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int l = 0; l < 16; ++l) {  // 𝒯_rc = -Σ_{r0<=l<=r} 𝒯_rl X_lc (𝒯_rl = 0 for l > r)
      const float tv = Tm[r * kLd + r0 + l];
#pragma unroll
      for (int j = 0; j < i; ++j) y[j] -= tv * A[(q + 16 * j) * kLd + r0 + l];
    }
#pragma unroll
    for (int j = 0; j < i; ++j) Tm[r * kLd + q + 16 * j] = y[j];
    __syncthreads();
  }
}

/// Carves consecutive shared-memory regions out of the dynamic shared buffer (16-byte aligned).
struct Carve {
  char* p;
  template <typename T>
  __device__ T* take(int64_t n) {
    T* r = reinterpret_cast<T*>(p);
    p += (static_cast<int64_t>(sizeof(T)) * n + 15) / 16 * 16;
    return r;
  }
  __device__ float* tile() { return take<float>(kTileFloats); }
};

/// Bytes that `tiles` tiles plus `extra` bytes of small arrays need (to size the dynamic shared memory).
constexpr size_t smem_bytes(int tiles, size_t extra) {
  return static_cast<size_t>(tiles) * ((sizeof(float) * kTileFloats + 15) / 16 * 16) + extra;
}

}  // namespace llmt::cuda::tile
