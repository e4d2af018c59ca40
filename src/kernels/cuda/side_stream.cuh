// Host helpers for launchers that split one op across two streams: the SM count of the current device and a second,
// highest-priority stream per host thread and device with fork / join events. The fork / join pairs
// (cudaEventRecord + cudaStreamWaitEvent) are legal under CUDA graph stream capture, where they become graph edges
// (bench/phases.h captures ops that way).
#pragma once
#include <cuda_runtime.h>

#include <mutex>
#include <vector>

#include "kernels/cuda/common.cuh"

namespace llmt::cuda {

/// The number of SMs of the current device (queried once per process and device).
inline int sm_count() {
  static std::vector<int> counts;  // by device ordinal; 0 = not queried yet
  static std::mutex lock;
  int dev = 0;
  LLMT_CUDA_CHECK(cudaGetDevice(&dev));
  const std::lock_guard<std::mutex> guard(lock);
  if (static_cast<int>(counts.size()) <= dev) counts.resize(dev + 1, 0);
  if (counts[dev] == 0) LLMT_CUDA_CHECK(cudaDeviceGetAttribute(&counts[dev], cudaDevAttrMultiProcessorCount, dev));
  return counts[dev];
}

/// A side stream for the calling host thread on the current device: non-blocking, at the device's greatest
/// priority (its pending blocks are scheduled before those of default-priority streams), created at first use and
/// kept for the thread's lifetime (never destroyed: a thread may outlive the CUDA context's teardown). One per
/// thread, so that concurrent host threads never interleave each other's fork / join events.
class SideStream {
 public:
  /// The calling thread's side stream of the current device.
  static SideStream& current() {
    thread_local std::vector<SideStream> per_device;
    int dev = 0;
    LLMT_CUDA_CHECK(cudaGetDevice(&dev));
    if (static_cast<int>(per_device.size()) <= dev) per_device.resize(dev + 1);
    SideStream& s = per_device[dev];
    if (s.stream_ == nullptr) {
      int least = 0, greatest = 0;
      LLMT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
      LLMT_CUDA_CHECK(cudaStreamCreateWithPriority(&s.stream_, cudaStreamNonBlocking, greatest));
      LLMT_CUDA_CHECK(cudaEventCreateWithFlags(&s.fork_, cudaEventDisableTiming));
      LLMT_CUDA_CHECK(cudaEventCreateWithFlags(&s.join_, cudaEventDisableTiming));
    }
    return s;
  }
  cudaStream_t stream() const { return stream_; }
  /// Work enqueued on the side stream after this call waits for all work enqueued on `main` before it.
  void fork(cudaStream_t main) const {
    LLMT_CUDA_CHECK(cudaEventRecord(fork_, main));
    LLMT_CUDA_CHECK(cudaStreamWaitEvent(stream_, fork_, 0));
  }
  /// Work enqueued on `main` after this call waits for all work enqueued on the side stream before it.
  void join(cudaStream_t main) const {
    LLMT_CUDA_CHECK(cudaEventRecord(join_, stream_));
    LLMT_CUDA_CHECK(cudaStreamWaitEvent(main, join_, 0));
  }

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
};

}  // namespace llmt::cuda
