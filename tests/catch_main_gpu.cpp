// main() of the GPU tests: skip (exit 77, which CTest reports as "skipped") with a message
// when no CUDA device is visible, so the suite runs unchanged on machines without a GPU.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include "kernels/backend.h"

int main(int argc, char** argv) {
  if (llmt::cuda_device_count() == 0) {
    std::printf("no CUDA device visible: GPU test skipped\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
