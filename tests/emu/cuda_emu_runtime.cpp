// The CUDA runtime calls of the kernel files' host launchers, for programs that run kernels in the CPU emulator
// (cuda_emu.h) and link this file instead of libcudart: one device, an H100 / H200 (132 SMs, 227 KiB of shared
// memory per block, 228 KiB per SM); streams and events are handles without work (launches run at their call, in
// issue order: a single stream's order, which honours every event wait). Device pointers are host pointers. A call
// this file does not define fails to link; an attribute it does not know returns cudaErrorNotSupported (which
// LLMT_CUDA_CHECK reports with the call).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>

namespace {

constexpr int kSms = 132;
constexpr int kSmemPerBlock = 227 * 1024;  // opt-in maximum
constexpr int kSmemPerSm = 228 * 1024;
constexpr int kReservedSmemPerBlock = 1024;
constexpr int kThreadsPerSm = 2048, kBlocksPerSm = 32;

thread_local cudaError_t last_error = cudaSuccess;
uintptr_t next_handle = 0x1000;

cudaError_t fail(cudaError_t e) {
  last_error = e;
  return e;
}
template <typename T>
T new_handle() {
  next_handle += 0x10;
  return reinterpret_cast<T>(next_handle);
}

}  // namespace

cudaError_t cudaGetLastError() {
  const cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return last_error; }
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    default: return "cudaError (emulated runtime)";
  }
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorNotSupported: return "not supported by the emulated runtime (tests/emu/cuda_emu_runtime.cpp)";
    default: return "error (emulated runtime)";
  }
}

cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device != 0) return fail(cudaErrorInvalidValue);
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = kSms; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = kSmemPerBlock; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = kSmemPerSm; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; return cudaSuccess;
    case cudaDevAttrWarpSize: *value = 32; return cudaSuccess;
    default: return fail(cudaErrorNotSupported);
  }
}
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  *least = 0, *greatest = -5;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

// Kernel attributes: the static shared memory of a kernel is not known here (reported 0); the dynamic limit is
// checked against the block maximum.
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, const void*) {
  std::memset(attr, 0, sizeof *attr);
  attr->maxThreadsPerBlock = 1024;
  attr->maxDynamicSharedSizeBytes = kSmemPerBlock;
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void*, cudaFuncAttribute attr, int value) {
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize)
    return value < 0 || value > kSmemPerBlock ? fail(cudaErrorInvalidValue) : cudaSuccess;
  return cudaSuccess;
}
/// Blocks per SM from the threads and the shared memory only (the registers are not known here).
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* blocks, const void*, int threads,
                                                                   size_t smem, unsigned int) {
  if (threads <= 0 || smem > static_cast<size_t>(kSmemPerBlock)) {
    *blocks = 0;
    return cudaSuccess;
  }
  const int by_threads = kThreadsPerSm / threads;
  const int by_smem = static_cast<int>(kSmemPerSm / (smem + kReservedSmemPerBlock));
  *blocks = by_threads < by_smem ? by_threads : by_smem;
  if (*blocks > kBlocksPerSm) *blocks = kBlocksPerSm;
  return cudaSuccess;
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, const void* func, int threads, size_t smem) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(blocks, func, threads, smem, 0);
}

// Streams and events: handles only.
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int, int) {
  *stream = new_handle<cudaStream_t>();
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  *stream = new_handle<cudaStream_t>();
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  *stream = new_handle<cudaStream_t>();
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int) { return cudaSuccess; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  *event = new_handle<cudaEvent_t>();
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* event) {
  *event = new_handle<cudaEvent_t>();
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }

// Memory: device pointers are host pointers.
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
  std::memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t) {
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
