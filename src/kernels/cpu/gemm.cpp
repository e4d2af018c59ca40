// Dense matrix products through OpenBLAS (cblas), row-major.
#include "kernels/cpu/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <climits>

#include "core/error.h"

namespace llmt::cpu {
namespace {

void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha, const float* A, int lda,
               const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, double alpha, const double* A,
               int lda, const double* B, int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace

// C = alpha op(A) op(B) + beta C (BLAS xGEMM definition; gemm.h).
// Row-major leading dimensions: the stored row length of each matrix, or the strides given for A and C.
template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A, const T* B,
          T beta, T* C, int64_t lda, int64_t ldc) {
  check(M >= 0 && N >= 0 && K >= 0 && M <= INT_MAX && N <= INT_MAX && K <= INT_MAX,
        "gemm: M={} N={} K={} must each lie in [0, {}]", M, N, K, INT_MAX);
  const int64_t dense_a = std::max<int64_t>(1, trans_a ? M : K), dense_c = std::max<int64_t>(1, N);
  lda = lda == 0 ? dense_a : lda;
  ldc = ldc == 0 ? dense_c : ldc;
  check(lda >= dense_a && ldc >= dense_c && lda <= INT_MAX && ldc <= INT_MAX,
        "gemm: row strides lda={} ldc={} must be at least the rows' lengths {} and {}", lda, ldc, dense_a, dense_c);
  if (M == 0 || N == 0) return;
  const int ldb = static_cast<int>(std::max<int64_t>(1, trans_b ? K : N));
  blas_gemm(trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(M),
            static_cast<int>(N), static_cast<int>(K), alpha, A, static_cast<int>(lda), B, ldb, beta, C,
            static_cast<int>(ldc));
}

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, const float*, float, float*,
                          int64_t, int64_t);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, const double*, double,
                           double*, int64_t, int64_t);

}  // namespace llmt::cpu
