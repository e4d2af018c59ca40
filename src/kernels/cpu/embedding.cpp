// Token embedding lookup and its gradient.
#include "kernels/cpu/embedding.h"

#include <algorithm>

#include "core/error.h"

namespace llmt::cpu {

// out[i, :] = table[ids[i], :]   (embedding.h)
template <typename T>
void embedding_fwd(const int32_t* ids, int64_t n, const T* table, int64_t vocab, int64_t dim, T* out) {
  for (int64_t i = 0; i < n; ++i) {
    check(ids[i] >= 0 && ids[i] < vocab, "embedding: token id {} at position {} is outside [0, {})", ids[i], i,
          vocab);
    const T* row = table + static_cast<int64_t>(ids[i]) * dim;
    std::copy(row, row + dim, out + i * dim);
  }
}

// dtable[ids[i], :] += dout[i, :]   (embedding.h; the transpose of the gather)
template <typename T>
void embedding_bwd(const int32_t* ids, int64_t n, const T* dout, int64_t dim, T* dtable) {
  for (int64_t i = 0; i < n; ++i) {
    T* row = dtable + static_cast<int64_t>(ids[i]) * dim;
    const T* d = dout + i * dim;
    for (int64_t j = 0; j < dim; ++j) row[j] += d[j];
  }
}

template void embedding_fwd<float>(const int32_t*, int64_t, const float*, int64_t, int64_t, float*);
template void embedding_fwd<double>(const int32_t*, int64_t, const double*, int64_t, int64_t, double*);
template void embedding_bwd<float>(const int32_t*, int64_t, const float*, int64_t, float*);
template void embedding_bwd<double>(const int32_t*, int64_t, const double*, int64_t, double*);

}  // namespace llmt::cpu
