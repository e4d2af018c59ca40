// Token embedding gather and its deterministic gradient. The backward sorts the
// (id, position) pairs by id with a stable radix sort, then one block per run of equal ids
// adds that run's dout rows into dtable in position order: the same additions in the same
// order as the CPU loop, without atomics.
#include <cub/device/device_radix_sort.cuh>

#include <climits>
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.cuh"

namespace llmt::cuda {
namespace {

// out[i, :] = table[ids[i], :]; an id outside [0, vocab) gives a NaN row (a kernel cannot
// throw; the NaN reaches the loss, which the trainer checks).
__global__ void embedding_fwd_kernel(const int32_t* ids, int64_t n, const float* table, int64_t vocab,
                                     int64_t dim, float* out) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const int32_t id = ids[i];
    float* o = out + i * dim;
    if (id < 0 || id >= vocab) {
      for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) o[c] = NAN;
      continue;
    }
    const float* row = table + int64_t{id} * dim;
    for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) o[c] = row[c];
  }
}

__global__ void iota_kernel(int32_t* v, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    v[i] = static_cast<int32_t>(i);
}

// Block (j, y): when sorted position j starts a run of id = sorted_ids[j], for the columns
// of chunk y: dtable[id, c] = (...(dtable[id, c] + dout[p_0, c]) + dout[p_1, c]) ...
// over the run's positions p_0 < p_1 < ... (the stable sort keeps them in order). The rows
// are loaded kBatch at a time so that a long run (a frequent token) is not latency-bound;
// the additions stay in position order.
constexpr int kBatch = 8;

__global__ void embedding_bwd_runs_kernel(const int32_t* sorted_ids, const int32_t* sorted_pos, int64_t n,
                                          const float* dout, int64_t dim, float* dtable) {
  const int64_t j = blockIdx.x;
  const int32_t id = sorted_ids[j];
  if (id < 0 || (j > 0 && sorted_ids[j - 1] == id)) return;
  const int64_t c = int64_t{blockIdx.y} * blockDim.x + threadIdx.x;
  if (c >= dim) return;
  int64_t end = j + 1;
  while (end < n && sorted_ids[end] == id) ++end;
  float* row = dtable + int64_t{id} * dim + c;
  float acc = *row;
  int64_t k = j;
  for (; k + kBatch <= end; k += kBatch) {
    float v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) v[u] = dout[int64_t{sorted_pos[k + u]} * dim + c];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) acc += v[u];
  }
  for (; k < end; ++k) acc += dout[int64_t{sorted_pos[k]} * dim + c];
  *row = acc;
}

// Scratch layout: sorted ids, positions, sorted positions (n int32 each), then CUB's
// temporary storage; every piece starts on a 256-byte boundary.
size_t align256(size_t b) { return (b + 255) / 256 * 256; }

size_t radix_temp_bytes(int n) {
  size_t bytes = 0;
  LLMT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const int32_t*>(nullptr),
                                                  static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                                  static_cast<int32_t*>(nullptr), n));
  return bytes;
}

int checked_count(int64_t n) {
  check(n >= 0 && n <= INT_MAX, "embedding_bwd: {} ids exceed the {} the sort handles", n, INT_MAX);
  return static_cast<int>(n);
}

}  // namespace

void embedding_fwd(const int32_t* ids, int64_t n, const float* table, int64_t vocab, int64_t dim, float* out,
                   cudaStream_t stream) {
  if (n == 0 || dim == 0) return;
  embedding_fwd_kernel<<<static_cast<unsigned>(std::min<int64_t>(n, 65536)), kThreads, 0, stream>>>(
      ids, n, table, vocab, dim, out);
  LLMT_CUDA_CHECK_LAUNCH();
}

size_t embedding_bwd_scratch_bytes(int64_t n) {
  const int count = checked_count(n);
  return 3 * align256(sizeof(int32_t) * static_cast<size_t>(count)) + radix_temp_bytes(count);
}

void embedding_bwd(const int32_t* ids, int64_t n, const float* dout, int64_t dim, float* dtable, void* scratch,
                   cudaStream_t stream) {
  const int count = checked_count(n);
  if (count == 0 || dim == 0) return;
  const size_t piece = align256(sizeof(int32_t) * static_cast<size_t>(count));
  char* base = static_cast<char*>(scratch);
  auto* sorted_ids = reinterpret_cast<int32_t*>(base);
  auto* pos = reinterpret_cast<int32_t*>(base + piece);
  auto* sorted_pos = reinterpret_cast<int32_t*>(base + 2 * piece);
  size_t temp_bytes = radix_temp_bytes(count);
  iota_kernel<<<grid_for(n), kThreads, 0, stream>>>(pos, n);
  LLMT_CUDA_CHECK_LAUNCH();
  LLMT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(base + 3 * piece, temp_bytes, ids, sorted_ids, pos, sorted_pos,
                                                  count, 0, 32, stream));
  const dim3 grid(static_cast<unsigned>(count), static_cast<unsigned>(ceil_div(dim, kThreads)));
  embedding_bwd_runs_kernel<<<grid, kThreads, 0, stream>>>(sorted_ids, sorted_pos, n, dout, dim, dtable);
  LLMT_CUDA_CHECK_LAUNCH();
}

}  // namespace llmt::cuda
