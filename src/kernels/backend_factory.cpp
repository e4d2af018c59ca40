// Choosing a backend by name; the one place that knows whether CUDA was built.
#include "kernels/backend.h"

#include "core/error.h"
#ifdef LLMT_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace llmt {

int cuda_device_count() {
#ifdef LLMT_HAVE_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

std::unique_ptr<Backend> make_backend(const std::string& name) {
  if (name == "cpu") return make_cpu_backend();
  if (name == "cuda" || name == "auto") {
#ifdef LLMT_HAVE_CUDA
    if (cuda_device_count() > 0) return cuda::make_cuda_backend();
    check(name == "auto", "backend cuda: no CUDA device is visible");
#else
    check(name == "auto", "backend cuda: this build has no CUDA backend (no CUDA toolkit was found at configure time)");
#endif
    return make_cpu_backend();
  }
  throw Error(fmt::format("unknown backend \"{}\"; allowed: auto, cpu, cuda", name));
}

}  // namespace llmt
