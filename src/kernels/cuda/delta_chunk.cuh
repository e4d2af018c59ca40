// Per-chunk indexing, accumulator I/O, launching and the Mma backward kernels' common steps, shared by the
// chunk-parallel delta-rule cores (gdn_comba.cu, kda.cu; layers-delta.md §6) on the 64 x 64 tiles of delta_tile.cuh.
// A core's argument struct A provides B, T, H, K, V, C (chunk size <= 64) and NC = ceil(T / C); its token tensors
// are [B, T, H, dim], its per-chunk scratch [B H, T', dim] with T' = NC C, its states [B H, NC, K, V].
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/delta_tile.cuh"

namespace llmt::cuda::tile {

/// One chunk of one (batch, head): token rows t0 .. t0 + n - 1 (n <= 64; rows >= n of a tile are padding).
struct Chunk {
  int64_t b, h, bh, chunk, t0;
  int n;
  template <typename A>
  __device__ Chunk(const A& a, int64_t chunk_, int64_t bh_) : b(bh_ / a.H), h(bh_ % a.H), bh(bh_) {
    seek(a, chunk_);
  }
  /// Chunk c of the same (batch, head), without the constructor's division (a scan's chunks in its loop).
  template <typename A>
  __device__ Chunk at(const A& a, int64_t c) const {
    Chunk x = *this;
    x.seek(a, c);
    return x;
  }
  /// Makes this chunk c of its (batch, head).
  template <typename A>
  __device__ void seek(const A& a, int64_t c) {
    chunk = c;
    t0 = c * a.C;
    n = static_cast<int>(a.T - t0 < a.C ? a.T - t0 : a.C);
  }
  /// Index of token row r of the chunk in a [B, T, H] tensor.
  template <typename A>
  __device__ int64_t gate(const A& a, int r) const { return (b * a.T + t0 + r) * a.H + h; }
  /// Element (row 0, column c0) of the chunk in a [B, T, H, dim] tensor (rows H * dim apart).
  template <typename A, typename P>
  __device__ P* in(const A& a, P* p, int64_t dim, int64_t c0) const { return p + gate(a, 0) * dim + c0; }
  /// Element (row 0, column c0) of the chunk in a [B H, T', dim] scratch tensor (rows dim apart).
  template <typename A, typename P>
  __device__ P* rows(const A& a, P* p, int64_t dim, int64_t c0) const {
    return p + (bh * a.NC * a.C + t0) * dim + c0;
  }
  /// Element (k0, v0) of this chunk's state in a [B H, chunks, K, V] scratch tensor (rows V apart).
  template <typename A, typename P>
  __device__ P* state(const A& a, P* p, int64_t k0, int64_t v0) const {
    return p + ((bh * a.NC + chunk) * a.K + k0) * a.V + v0;
  }
  /// This chunk's 64 x 64 matrix in a [B H, chunks, 64, 64] scratch tensor.
  template <typename A>
  __device__ float* square(const A& a, float* p) const { return p + (bh * a.NC + chunk) * kN * kN; }
};

/// out.v[i][j] = src[r * stride + c] for the thread's elements (r, c) = (L::row(i), L::col(j)) with r < rows,
/// c < cols, else 0; src float or bf16. The 16 loads are independent (issued together).
template <typename L, typename E>
__device__ __forceinline__ void load_acc(Acc& out, const E* src, int64_t stride, int rows, int cols) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = L::row(i), c = L::col(j);
      out.v[i][j] = r < rows && c < cols ? to_f32(src[r * stride + c]) : 0.0f;
    }
}

/// dst[r * stride + c] = f(r, c, acc) for the thread's elements with r < rows, c < cols; dst float or bf16
/// (rounded to nearest even).
template <typename L, typename E, typename F>
__device__ __forceinline__ void store_acc(const Acc& acc, E* dst, int64_t stride, int rows, int cols, F f) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = L::row(i), c = L::col(j);
      if (r < rows && c < cols) dst[r * stride + c] = from_f32<E>(f(r, c, acc.v[i][j]));
    }
}

/// load_acc<Mma> and store_acc<Mma> of an fp32 tensor by column pairs (Mma::col(2 p), + 1): one 8-byte access
/// per pair, each warp access 8 whole 32-byte sectors. The same elements and values as load_acc / store_acc where
/// src / dst is 8-byte aligned and stride and cols are even (a pair is inside cols or outside it as a whole);
/// stride fits an int.
__device__ __forceinline__ void load_acc_pairs(Acc& out, const float* src, int stride, int rows, int cols) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = Mma::row(i);
    const float* p = src + r * stride;
#pragma unroll
    for (int j = 0; j < 4; j += 2) {
      const int c = Mma::col(j);
      const float2 x = r < rows && c < cols ? *reinterpret_cast<const float2*>(p + c) : make_float2(0.0f, 0.0f);
      out.v[i][j] = x.x, out.v[i][j + 1] = x.y;
    }
  }
}
template <typename F>
__device__ __forceinline__ void store_acc_pairs(const Acc& acc, float* dst, int stride, int rows, int cols, F f) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = Mma::row(i);
    float* p = dst + r * stride;
#pragma unroll
    for (int j = 0; j < 4; j += 2) {
      const int c = Mma::col(j);
      if (r < rows && c < cols)
        *reinterpret_cast<float2*>(p + c) = make_float2(f(r, c, acc.v[i][j]), f(r, c + 1, acc.v[i][j + 1]));
    }
  }
}

/// load_acc<Mma>(out, g, kN, kN, kN) of a swizzled staging tile (stage_async_sw, delta_tile.cuh): 8-byte reads of
/// the thread's column pairs, without bank conflicts (the tile holds zeros outside what was staged).
__device__ __forceinline__ void load_acc_sw(Acc& out, const float* g) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; j += 2) {
      const float2 x = *reinterpret_cast<const float2*>(g + stage_sw(Mma::row(i), Mma::col(j)));
      out.v[i][j] = x.x, out.v[i][j + 1] = x.y;
    }
}

/// load_acc<Mma>(out, s, kLdH, kN, kN) of a bf16 tile (kLdH; e.g. an operand tile): 4-byte reads of the thread's
/// column pairs, without bank conflicts (a warp's rows kLdH / 2 = 36 words apart), each element widened to fp32.
__device__ __forceinline__ void load_acc_h(Acc& out, const __nv_bfloat16* s) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; j += 2) {
      const float2 x =
          __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(s + Mma::row(i) * kLdH + Mma::col(j)));
      out.v[i][j] = x.x, out.v[i][j + 1] = x.y;
    }
}

/// An Acc parked in shared memory, thread-major (element (i, j) of thread t at g[(4 i + j) kThreads + t]: 16 KiB
/// for the block, conflict-free): park_acc stores it, unpark_acc reads it back. Only the owner reads its elements,
/// so no barrier is needed between the two.
__device__ __forceinline__ void park_acc(const Acc& acc, float* g) {
#pragma unroll
  for (int e = 0; e < 16; ++e) g[e * kThreads + threadIdx.x] = acc.v[e >> 2][e & 3];
}
__device__ __forceinline__ void unpark_acc(Acc& acc, const float* g) {
#pragma unroll
  for (int e = 0; e < 16; ++e) acc.v[e >> 2][e & 3] = g[e * kThreads + threadIdx.x];
}

/// Identity element function for store_acc.
struct Same {
  __device__ float operator()(int, int, float x) const { return x; }
};

/// store_acc<Mma>(x, dst, stride, rows, cols, Same{}) into a bf16 dst (the bits of store_acc_h then store_h,
/// straight from registers): with dst 4-byte aligned and stride and cols even by column pairs (one bf16x2 store of
/// j = 0, 1 and of j = 2, 3 per row where r < rows, c < cols; the same rounding), else element by element (store_acc).
__device__ __forceinline__ void store_acc_bf16(const Acc& x, __nv_bfloat16* dst, int64_t stride, int rows, int cols) {
  if (reinterpret_cast<uintptr_t>(dst) % 4 == 0 && stride % 2 == 0 && cols % 2 == 0) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; j += 2) {
        const int r = Mma::row(i), c = Mma::col(j);
        if (r < rows && c < cols)
          *reinterpret_cast<__nv_bfloat162*>(dst + r * stride + c) = __floats2bfloat162_rn(x.v[i][j], x.v[i][j + 1]);
      }
    return;
  }
  store_acc<Mma>(x, dst, stride, rows, cols, Same{});
}

/// store_acc_bf16(x, dst, stride, rows, cols) by 16-byte pieces (the same elements and rounding): the 4 lanes of a
/// quad (lane / 4 alike) hold the column pairs 2 q, + 1 and 8 + 2 q, + 1 (q = lane % 4, relative to the warp's 16
/// columns) of the same 4 rows; two butterflies over the quad (shuffles with lane ^ 2, then lane ^ 1) hand lane q
/// the 8 columns 8 (q % 2) .. + 7 of row Mma::row(2 g + q / 2) for g = 0, 1, which it stores where r < rows and the
/// piece starts before cols: as one 16-byte store where dst is 16-byte aligned and stride and cols are multiples of
/// 8 (lanes 2 m, 2 m + 1 of a quad then write one row's 32 contiguous bytes), else element by element (c < cols).
/// Reached by whole warps (the shuffles).
__device__ __forceinline__ void store_acc_bf16x8(const Acc& x, __nv_bfloat16* dst, int64_t stride, int rows,
                                                 int cols) {
  const auto pack = [](float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
    return *reinterpret_cast<const uint32_t*>(&v);
  };
  const bool whole = reinterpret_cast<uintptr_t>(dst) % 16 == 0 && stride % 8 == 0 && cols % 8 == 0;
  const int q = Mma::lane() & 3, hi = q >> 1, lo = q & 1;
#pragma unroll
  for (int g = 0; g < 2; ++g) {
    // u[p]: row Mma::row(2 g + p / 2), the pair at 8 (p % 2) + 2 q. Lane q's piece is p = q, its word m from lane m.
    uint32_t u[4];
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const int i = 2 * g + (p >> 1), j = 2 * (p & 1);
      u[p] = pack(x.v[i][j], x.v[i][j + 1]);
    }
    // Lanes q, q ^ 2 swap halves: lane q keeps p = 2 hi, 2 hi + 1, its own words (k) and those of q ^ 2 (r).
    const uint32_t k0 = hi ? u[2] : u[0], k1 = hi ? u[3] : u[1];
    const uint32_t r0 = __shfl_xor_sync(0xffffffffu, hi ? u[0] : u[2], 2);
    const uint32_t r1 = __shfl_xor_sync(0xffffffffu, hi ? u[1] : u[3], 2);
    // Lanes q, q ^ 1 swap: lane q keeps p = q (own: its word, o2: q ^ 2's), receives q ^ 1's (t0) and q ^ 3's (t1).
    const uint32_t t0 = __shfl_xor_sync(0xffffffffu, lo ? k0 : k1, 1);
    const uint32_t t1 = __shfl_xor_sync(0xffffffffu, lo ? r0 : r1, 1);
    const uint32_t own = lo ? k1 : k0, o2 = lo ? r1 : r0;
    // In lane order: lanes 2 hi, 2 hi + 1 gave (own, t0) (swapped where lo), the other two (o2, t1).
    const uint32_t a0 = lo ? t0 : own, a1 = lo ? own : t0, b0 = lo ? t1 : o2, b1 = lo ? o2 : t1;
    const uint32_t w[4] = {hi ? b0 : a0, hi ? b1 : a1, hi ? a0 : b0, hi ? a1 : b1};
    const int r = Mma::row(2 * g + hi), c = 16 * (Mma::warp() & 3) + 8 * lo;
    if (r >= rows || c >= cols) continue;
    if (whole) {
      *reinterpret_cast<uint4*>(dst + r * stride + c) = make_uint4(w[0], w[1], w[2], w[3]);
    } else {
#pragma unroll
      for (int m = 0; m < 8; ++m)
        if (c + m < cols)
          dst[r * stride + c + m] = __ushort_as_bfloat16(static_cast<unsigned short>(w[m >> 1] >> (16 * (m & 1))));
    }
  }
}

/// Zeroes nkt bf16 tiles (kLdH) at hS: the bf16 copy of an Mma scan's running state before its first chunk.
__device__ __forceinline__ void clear_h(__nv_bfloat16* hS, int nkt) {
  for (int idx = static_cast<int>(threadIdx.x); idx < kTileHalves * nkt; idx += kThreads)
    hS[idx] = __float2bfloat16_rn(0.0f);
}

/// Zeroes the running state of an Mma scan before its first chunk: the fp32 slab of nkt key tiles, thread-major
/// (the thread's 16 elements of each key tile kThreads apart from S[threadIdx.x]), and its bf16 copy (nkt tiles).
__device__ __forceinline__ void clear_state(float* S, __nv_bfloat16* hS, int nkt) {
  const int tid = static_cast<int>(threadIdx.x);
  for (int e = 0; e < 16 * nkt; ++e) S[e * kThreads + tid] = 0.0f;
  clear_h(hS, nkt);
}

/// An Mma scan's Δ = U - W S (kAdd = false) or dΔ = P^T dO + K^g dS (kAdd = true) at the thread's elements: d
/// (loaded from dst) minus or plus the product acc in the first rows × cols, 0 outside; as the next products'
/// operand to the bf16 tile h only (a bf16 dst may then take h's tile by store_h once a barrier completes it: the
/// bits of delta_out's store).
template <bool kAdd>
__device__ __forceinline__ void delta_h(Acc& d, const Acc& acc, int rows, int cols, __nv_bfloat16* h) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = Mma::row(i), c = Mma::col(j);
      d.v[i][j] = r < rows && c < cols ? (kAdd ? d.v[i][j] + acc.v[i][j] : d.v[i][j] - acc.v[i][j]) : 0.0f;
    }
  store_acc_h(d, h, Same{});
}

/// delta_h, and d stored back to dst (rows stride apart) from the registers.
template <bool kAdd, typename E>
__device__ __forceinline__ void delta_out(Acc& d, const Acc& acc, E* dst, int64_t stride, int rows, int cols,
                                          __nv_bfloat16* h) {
  delta_h<kAdd>(d, acc, rows, cols, h);
  store_acc<Mma>(d, dst, stride, rows, cols, Same{});
}

/// Asks the L2 cache for `rows` rows of `row_bytes` bytes each, `stride_bytes` apart, starting at p
/// (prefetch.global.L2; no effect on any result). The scans call it for the next chunk's operands so that their
/// loads wait for the L2, not for memory. Line i of the rows ceil(row_bytes / 128) lines each (byte
/// 128 (i % per_row) of row i / per_row) goes to thread i % kThreads: each thread walks its lines
/// i = t, t + kThreads, ... with the row and line index stepped by (kThreads / per_row, kThreads % per_row), so the
/// loop body is one prefetch and a few 32-bit adds (no division per line, not unrolled: small code).
__device__ __forceinline__ void prefetch_l2(const void* p, int64_t stride_bytes, int rows, int64_t row_bytes) {
#ifdef __CUDA_ARCH__
  const unsigned per_row = static_cast<unsigned>((row_bytes + 127) >> 7), t = threadIdx.x;
  if (per_row == 0) return;
  const unsigned dr = kThreads / per_row, dl = kThreads - dr * per_row;  // (dl < per_row)
  unsigned r = t / per_row, l = t - r * per_row;
  const char* row = static_cast<const char*>(p) + static_cast<int64_t>(r) * stride_bytes;
  const int64_t step = static_cast<int64_t>(dr) * stride_bytes;
#pragma unroll 1
  while (static_cast<int>(r) < rows) {
    const char* line = row + 128 * l;
    asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
    r += dr, l += dl, row += step;
    if (l >= per_row) l -= per_row, ++r, row += stride_bytes;
  }
#endif
}

/// Columns of the 64-wide tile starting at column c0 of a dim-wide matrix.
__device__ __forceinline__ int tile_cols(int64_t dim, int64_t c0) {
  return static_cast<int>(dim - c0 < kN ? dim - c0 : kN);
}

/// dp += dO Δ^T over the value tiles (B3 of an Mma bwd_dqk kernel): dO (a.d_o, token rows) and Δ (a.U, scratch
/// rows) of each value tile through the bf16 tiles hO, hD. Ends with a barrier.
template <typename A>
__device__ __forceinline__ void acc_dO_delta(const A& a, const Chunk& ch, __nv_bfloat16* hO, __nv_bfloat16* hD,
                                             Acc& dp) {
  for (int64_t v0 = 0; v0 < a.V; v0 += kN) {
    load_h(hO, ch.in(a, a.d_o, a.V, v0), a.H * a.V, ch.n, tile_cols(a.V, v0));
    load_h(hD, ch.rows(a, a.U, a.V, v0), a.V, ch.n, tile_cols(a.V, v0));
    __syncthreads();
    Mma::mma<false, true>(hO, hD, dp);
    __syncthreads();
  }
}

/// The state products of an Mma bwd_dqk kernel for key tile k0 (kc rows), over the value tiles: dqs = dO h^T,
/// dks = Δ dh^T, dws = dΔ h^T (zeroed first). Per value tile v0 (vc columns): dO, h, Δ, dh, dΔ into the bf16 tiles
/// hO, hH, hD, hG, hE (h, dh: the chunk's states in a.h, a.dh), a barrier, the three products, per_tile(v0, vc)
/// (the kernel's own use of the tile: its Σ h ⊙ dh share) and a barrier.
template <typename A, typename F>
__device__ __forceinline__ void state_products(const A& a, const Chunk& ch, int64_t k0, int kc, __nv_bfloat16* hO,
                                               __nv_bfloat16* hH, __nv_bfloat16* hD, __nv_bfloat16* hG,
                                               __nv_bfloat16* hE, Acc& dqs, Acc& dks, Acc& dws, F per_tile) {
  const int64_t V = a.V;
  dqs.zero();
  dks.zero();
  dws.zero();
  for (int64_t v0 = 0; v0 < V; v0 += kN) {
    const int vc = tile_cols(V, v0);
    load_h(hO, ch.in(a, a.d_o, V, v0), a.H * V, ch.n, vc);
    load_h(hH, ch.state(a, a.h, k0, v0), V, kc, vc);
    load_h(hD, ch.rows(a, a.U, V, v0), V, ch.n, vc);
    load_h(hG, ch.state(a, a.dh, k0, v0), V, kc, vc);
    load_h(hE, ch.rows(a, a.dD, V, v0), V, ch.n, vc);
    __syncthreads();
    Mma::mma<false, true>(hO, hH, dqs);
    Mma::mma<false, true>(hD, hG, dks);
    Mma::mma<false, true>(hE, hH, dws);
    per_tile(v0, vc);
    __syncthreads();
  }
}

/// The bf16 operand tiles of a value tile of wy_u_side: dΔ (z) and v (y).
struct UTiles {
  __nv_bfloat16 *z, *y;
};

/// B5, U side of an Mma bwd_wy kernel, over the value tiles: X_U = 𝒯^T dΔ (𝒯 in the bf16 tile hT, dΔ from a.dD),
/// dV = β X_U into a.dv, dtv += dΔ V^T and db_part[i] += Σ_j X_U ⊙ v at the thread's elements (row Mma::row(i);
/// v in fp32 from a.v, as the bf16 operand through t.y; dΔ through t.z, t = tiles(vt) for value tile vt).
/// operands(v0, vc, vv, t) brings the value tile at column v0 (vc columns) in: dΔ into t.z, v into t.y and vv (v
/// at the thread's elements, 0 outside ch.n x vc), ending with a barrier after which t.z and t.y are complete.
/// store_dv(xu, f, v0, vc) stores f(r, c, X_U) (dV) at the thread's elements of the value tile. Expects hT
/// complete. With close, every value tile ends with a barrier (its tiles may be the next one's); without, the next
/// value tile's operands must not overwrite this one's tiles before their barrier (tiles alternating, say).
template <typename A, typename Tiles, typename Operands, typename StoreDv>
__device__ __forceinline__ void wy_u_side(const A& a, const Chunk& ch, const float* beta, const __nv_bfloat16* hT,
                                          Tiles tiles, Acc& dtv, float (&db_part)[4], Operands operands,
                                          StoreDv store_dv, bool close) {
  const int64_t V = a.V;
  for (int64_t v0 = 0; v0 < V; v0 += kN) {
    const int vc = tile_cols(V, v0);
    const UTiles t = tiles(static_cast<int>(v0 / kN));
    Acc vv;
    operands(v0, vc, vv, t);
    Acc xu;
    xu.zero();
    Mma::mma<true, false>(hT, t.z, xu);
    Mma::mma<false, true>(t.z, t.y, dtv);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) db_part[i] += xu.v[i][j] * vv.v[i][j];
    store_dv(xu, [&](int r, int, float y) { return beta[r] * y; }, v0, vc);
    if (close) __syncthreads();
  }
}
/// wy_u_side through the bf16 tiles hZ (dΔ) and hY (v), dV stored element by element (store_acc); operands(v0, vc,
/// vv) brings the value tile into hZ, hY and vv. Ends with a barrier.
template <typename A, typename Operands>
__device__ __forceinline__ void wy_u_side(const A& a, const Chunk& ch, const float* beta, const __nv_bfloat16* hT,
                                          __nv_bfloat16* hZ, __nv_bfloat16* hY, Acc& dtv, float (&db_part)[4],
                                          Operands operands) {
  wy_u_side(
      a, ch, beta, hT, [=](int) { return UTiles{hZ, hY}; }, dtv, db_part,
      [&](int64_t v0, int vc, Acc& vv, UTiles) { operands(v0, vc, vv); },
      [&](const Acc& xu, auto f, int64_t v0, int vc) {
        store_acc<Mma>(xu, ch.in(a, a.dv, a.V, v0), a.H * a.V, ch.n, vc, f);
      },
      true);
}
/// wy_u_side with the operands loaded from global memory in the step (load_h, load_acc).
template <typename A>
__device__ __forceinline__ void wy_u_side(const A& a, const Chunk& ch, const float* beta, const __nv_bfloat16* hT,
                                          __nv_bfloat16* hZ, __nv_bfloat16* hY, Acc& dtv, float (&db_part)[4]) {
  const int64_t V = a.V;
  wy_u_side(a, ch, beta, hT, hZ, hY, dtv, db_part, [&](int64_t v0, int vc, Acc& vv) {
    load_h(hZ, ch.rows(a, a.dD, V, v0), V, ch.n, vc);
    load_h(hY, ch.in(a, a.v, V, v0), a.H * V, ch.n, vc);
    load_acc<Mma>(vv, ch.in(a, a.v, V, v0), a.H * V, ch.n, vc);
    __syncthreads();
  });
}

/// m = M1 𝒯^T with M1 = 𝒯^T d𝒯 (B7 of an Mma bwd_wy kernel, before dA's sign, mask and factors): d𝒯 (the
/// accumulator dT) rounded into the bf16 tile hdT, M1 into hM; 𝒯 in the bf16 tile hT. Expects hT complete and
/// hdT, hM free; ends without a barrier (hM is read by the last product).
__device__ __forceinline__ void wy_m1(const Acc& dT, const __nv_bfloat16* hT, __nv_bfloat16* hdT, __nv_bfloat16* hM,
                                      Acc& m) {
  store_acc_h(dT, hdT, Same{});
  __syncthreads();
  m.zero();
  Mma::mma<true, false>(hT, hdT, m);  // M1 = 𝒯^T d𝒯
  store_acc_h(m, hM, Same{});
  __syncthreads();  // hM complete; hdT is read
  m.zero();
  Mma::mma<false, true>(hM, hT, m);  // M1 𝒯^T
}

/// kernel<<<grid, kThreads, smem, stream>>>(args...) after allowing `smem` bytes of dynamic shared memory;
/// refuses (llmt::Error naming `what` and key_dim) when they and the kernel's static shared memory (e.g. the
/// tensor-core scratch of tile::Tc) exceed the 227 KiB a block may have.
template <typename Kernel, typename... Args>
void launch(const char* what, int64_t key_dim, Kernel kernel, dim3 grid, size_t smem, cudaStream_t stream,
            const Args&... args) {
  cudaFuncAttributes attr{};
  LLMT_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  const size_t total = smem + attr.sharedSizeBytes;
  check(total <= 227 * 1024, "{} (cuda): key_dim {} needs {} bytes of shared memory per block (limit 227 KiB)", what,
        key_dim, total);
  LLMT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
#ifdef LLMT_CUDA_EMU
  ::emu::launch(kernel, grid, dim3(kThreads), smem, stream, args...);  // the CPU emulator (tests/emu/cuda_emu.h)
#else
  kernel<<<grid, kThreads, smem, stream>>>(args...);
#endif
  LLMT_CUDA_CHECK_LAUNCH();
}

}  // namespace llmt::cuda::tile
