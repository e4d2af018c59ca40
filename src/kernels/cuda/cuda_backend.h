// The CUDA backend (plain C++ header: no CUDA types leak out of src/kernels/cuda/).
#pragma once
#include <memory>

#include "kernels/backend.h"

namespace llmt::cuda {

/// Number of visible CUDA devices (0 when the driver reports none or an error).
int device_count();

/// A backend on the current CUDA device: cudaMalloc memory, one stream, cuBLAS for matmul
/// (fp32 compute, no TF32, in this increment), the kernels of ops.cuh for the rest.
std::unique_ptr<Backend> make_cuda_backend();

}  // namespace llmt::cuda
