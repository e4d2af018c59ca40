// Dense matrix products on the CPU through OpenBLAS (cblas).
#pragma once
#include <cstdint>

namespace llmt::cpu {

/// C = alpha * op(A) * op(B) + beta * C, all row-major.
/// op(A) is [M, K]: A is stored [M, K] (trans_a = false) or [K, M] (trans_a = true).
/// op(B) is [K, N]: B is stored [K, N] (trans_b = false) or [N, K] (trans_b = true).
/// C is [M, N]. T = float (cblas_sgemm) or double (cblas_dgemm).
/// lda, ldc: the row strides (elements) of A and C as stored, at least their stored row lengths; 0 = dense.
template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A, const T* B,
          T beta, T* C, int64_t lda = 0, int64_t ldc = 0);

}  // namespace llmt::cpu
