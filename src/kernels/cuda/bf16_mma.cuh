// Warp-level bf16 tensor-core instructions (sm_80 and later, so sm_90 too) as small device functions:
// ldmatrix (8 x 8 bf16 matrices from shared memory into registers) and
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (D = A B + C, fp32 accumulators in registers).
// Every function is executed by all 32 lanes of a warp together (.sync.aligned).
//
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16 with floating point type"); lane l,
// g = l / 4, t = l % 4; a 32-bit register holds two bf16, the lower column (or row, for B) in its low half:
//   A (16 x 16, row): a[0] = A(g, 2t..2t+1), a[1] = A(g+8, 2t..2t+1), a[2] = A(g, 2t+8..2t+9), a[3] = A(g+8, 2t+8..2t+9)
//   B (16 x 8, col):  b[0] = B(2t..2t+1, g), b[1] = B(2t+8..2t+9, g)
//   C, D (16 x 8, fp32): c[0] = C(g, 2t), c[1] = C(g, 2t+1), c[2] = C(g+8, 2t), c[3] = C(g+8, 2t+1)
// ldmatrix.x4 (PTX ISA, "ldmatrix"): lanes 8j .. 8j+7 give the addresses of rows 0 .. 7 of 8 x 8 matrix j (16
// contiguous bytes each, 16-byte aligned); register j of lane l receives matrix j's row l/4, columns 2(l%4) and
// 2(l%4)+1; with .trans, matrix j's rows 2(l%4) and 2(l%4)+1 of column l/4 (the transposed matrix's row l/4).
// Under LLMT_CUDA_EMU (a host build for the CPU emulator, tests/emu/cuda_emu.h) the three run there.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace llmt::cuda::mma {

/// r[j] = matrix j (see above); p: this lane's row address (shared memory).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const __nv_bfloat16* p) {
#ifdef __CUDA_ARCH__
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
#elif defined(LLMT_CUDA_EMU)
  ::emu::ldmatrix_x4(r, p, false);
#endif
}

/// As ldsm_x4 with .trans: r[j] = matrix j transposed.
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const __nv_bfloat16* p) {
#ifdef __CUDA_ARCH__
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
#elif defined(LLMT_CUDA_EMU)
  ::emu::ldmatrix_x4(r, p, true);
#endif
}

/// d += A B for one 16 x 8 x 16 step (bf16 operands, fp32 accumulators; layouts above).
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#ifdef __CUDA_ARCH__
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#elif defined(LLMT_CUDA_EMU)
  ::emu::mma_16816(d, a, b0, b1);
#endif
}

}  // namespace llmt::cuda::mma
