// Host helpers for the launchers of the chunked delta-rule cores (mdn.cu, gdn_comba.cu) whose sequential scans run
// one block per (value tile, (batch, head) pair): the pairs whose scan blocks fill one wave of the GPU, and by_waves,
// which runs the launches of a phase sequence as two groups of pairs on two streams when the scan's blocks span
// more than one wave but not a whole number of waves.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/side_stream.cuh"

namespace llmt::cuda {

/// Pairs of (batch, head) whose blocks fill one wave of the GPU when each pair takes `blocks_per_pair` (>= 1) blocks
/// of `kernel` with `threads` threads and `smem` bytes of dynamic shared memory: the kernel's blocks per SM
/// (occupancy) x sm_count() / blocks_per_pair, at least 1. Sets the kernel's dynamic shared memory limit to `smem`
/// (as its launch does); where `smem` is more than a block may have, 1 (the kernel's launch then refuses it).
template <typename Kernel>
int64_t wave_pairs(Kernel kernel, int threads, size_t smem, int64_t blocks_per_pair) {
  const cudaError_t fits =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (fits == cudaErrorInvalidValue) {
    (void)cudaGetLastError();  // (not left for the next launch's check)
    return 1;
  }
  LLMT_CUDA_CHECK(fits);
  int per_sm = 0;
  LLMT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  const int64_t pairs = static_cast<int64_t>(per_sm) * sm_count() / blocks_per_pair;
  return pairs > 0 ? pairs : 1;
}

/// Runs `part(g, s)` (the launches of one phase sequence for the pairs of g, on stream s) for the (batch, head)
/// pairs of a: Args is a kernel-argument struct whose bh0, nbh give the pairs a.bh0 .. a.bh0 + a.nbh - 1 that a
/// launch covers (grid row y is pair bh0 + y). A part starts with a sequential scan whose blocks take `wave` pairs
/// per wave of the GPU (wave_pairs). When the pairs fill more than one wave but not a whole number of waves, the
/// scan's last wave would leave SMs idle while it runs; so the pairs of the whole waves run as one group on `stream`
/// and the rest as a second group on the calling thread's side stream (greatest priority: its scan blocks take SMs
/// before the first group's later kernels), and the first group's later kernels run on the SMs the second group's
/// scan leaves free. Launched first group first (its scan takes the SMs), forked after what `stream` holds, joined
/// back into `stream`. Each kernel computes the same values whichever group runs it: the results are the same bits
/// either way.
template <typename Args, typename Part>
void by_waves(const Args& a, int64_t wave, cudaStream_t stream, Part part) {
  const int64_t pairs = a.nbh, rest = pairs % wave;
  if (pairs <= wave || rest == 0) {
    part(a, stream);
    return;
  }
  const SideStream& side = SideStream::current();
  side.fork(stream);
  Args first = a, second = a;
  first.nbh = pairs - rest;
  second.bh0 = a.bh0 + pairs - rest, second.nbh = rest;
  part(first, stream);
  part(second, side.stream());
  side.join(stream);
}

}  // namespace llmt::cuda
