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
    check(name == "auto", "backend cuda: this build has no CUDA backend (configured with LLMT_CUDA=OFF, or no CUDA "
          "compiler was found); reconfigure with the CUDA toolkit installed (cmake -DLLMT_CUDA=ON fails when it is "
          "not found) to use a GPU, or choose the cpu backend");
#endif
    return make_cpu_backend();
  }
  throw Error(fmt::format("unknown backend \"{}\"; allowed: auto, cpu, cuda", name));
}

DType compute_dtype_for(const std::string& precision, const Backend& backend, const std::string& key) {
  const bool cuda = backend.name() == "cuda";
  // a command-line option reads "--precision fp32", a config key "train.precision = fp32"
  const std::string set = key.rfind("--", 0) == 0 ? key + " " : key + " = ";
  if (precision == "auto") return cuda ? DType::bf16 : DType::f32;
  if (precision == "fp32") return DType::f32;
  if (precision == "bf16") {
    check(cuda, "{}bf16 needs the cuda backend (the {} backend computes in fp32); use {}fp32 or auto", set,
          backend.name(), set);
    return DType::bf16;
  }
  throw Error(fmt::format("{}: unknown value \"{}\"; allowed: auto, fp32, bf16", key, precision));
}

}  // namespace llmt
