// Token embedding lookup.
#pragma once
#include <cstdint>

namespace llmt::cpu {

/// out[i, :] = table[ids[i], :] for i < n; table: [vocab, dim]; ids in [0, vocab) (throws
/// llmt::Error naming the position and id otherwise).
template <typename T>
void embedding_fwd(const int32_t* ids, int64_t n, const T* table, int64_t vocab, int64_t dim, T* out);

/// dtable[ids[i], :] += dout[i, :] (accumulates).
template <typename T>
void embedding_bwd(const int32_t* ids, int64_t n, const T* dout, int64_t dim, T* dtable);

}  // namespace llmt::cpu
