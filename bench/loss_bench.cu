// GPU time of the softmax cross-entropy (src/kernels/cuda/cross_entropy.cu: loss and, in place, the logits'
// gradient) on one LM-head chunk of rows as the trainer runs it (2048 rows: 16,384 tokens a step in 8 chunks),
// for GPT-2's vocabulary (50257, rows padded to the CUDA backend's stride 50304) with bf16 and fp32 logits, and
// Llama 3's (128256) with bf16 logits. Each case: mean milliseconds over `iterations` launches after 3 warm-ups
// (CUDA events; the logits of one call, 206-526 MB, exceed the 50 MiB L2), the bytes it must move at least (every
// logit read once and its gradient written once) and the resulting GB/s. The kernel runs in place, so the calls
// after the first see gradients, not fresh logits: the same work per element.
// Usage: loss_bench [iterations]   (default 20)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "bench_util.cuh"
#include "kernels/cuda/ops.cuh"

namespace {

constexpr int64_t kRows = 2048;

template <typename T>
void run(int iters, int64_t vocab, int64_t ld, const char* tag) {
  T* z = nullptr;
  int32_t* t = nullptr;
  float *loss = nullptr, *correct = nullptr;
  BENCH_CHECK(cudaMalloc(&z, sizeof(T) * kRows * ld));
  BENCH_CHECK(cudaMalloc(&t, sizeof(int32_t) * kRows));
  BENCH_CHECK(cudaMalloc(&loss, sizeof(float) * kRows));
  BENCH_CHECK(cudaMalloc(&correct, sizeof(float) * kRows));
  bench::fill_uniform(z, kRows * ld, 1, -8.f, 8.f);
  BENCH_CHECK(cudaMemset(t, 0, sizeof(int32_t) * kRows));  // target 0 in every row
  const double bytes = 2.0 * sizeof(T) * kRows * vocab;
  const float ms = bench::time_ms(iters, [&] {
    llmt::cuda::cross_entropy(z, t, kRows, vocab, ld, 1.0 / kRows, loss, correct, nullptr);
  });
  std::printf("%-34s %9.4f ms %10.1f MB %8.0f GB/s\n", tag, ms, bytes / 1e6, bytes / (ms * 1e-3) / 1e9);
  for (void* p : {static_cast<void*>(z), static_cast<void*>(t), static_cast<void*>(loss), static_cast<void*>(correct)})
    BENCH_CHECK(cudaFree(p));
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 20;
  std::printf("cross-entropy, %ld rows a call, %d iterations\n", kRows, iters);
  run<__nv_bfloat16>(iters, 50257, 50304, "bf16, vocab 50257 (ld 50304)");
  run<float>(iters, 50257, 50304, "fp32, vocab 50257 (ld 50304)");
  run<__nv_bfloat16>(iters, 128256, 128256, "bf16, vocab 128256");
  run<__nv_bfloat16>(iters, 50257, 50257, "bf16, vocab 50257 (dense rows)");
  return 0;
}
