// Helpers shared by the GPU tests: the two backends, host arrays uploaded to both, and the comparison of the
// CUDA result against the CPU reference (tolerances, Philox inputs and the host comparison: cuda_test_host.h).
#pragma once
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "cuda_test_host.h"
#include "kernels/backend.h"

namespace llmt::test {

Backend& gpu() {
  static const std::unique_ptr<Backend> b = make_backend("cuda");
  return *b;
}
Backend& cpu() {
  static const std::unique_ptr<Backend> b = make_cpu_backend();
  return *b;
}

// n ids in [0, vocab) from Philox stream `stream`.
std::vector<int32_t> rand_ids(size_t n, int64_t vocab, uint64_t stream) {
  Philox rng(20240611, stream);
  std::vector<int32_t> ids(n);
  for (int32_t& id : ids) id = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
  return ids;
}

/// One host array uploaded to a tensor of each backend.
struct Pair {
  OwnedTensor g, c;
};
template <typename T>
Pair both(const std::vector<T>& host, std::initializer_list<int64_t> dims) {
  Pair p{OwnedTensor(gpu(), dtype_of<T>(), dims), OwnedTensor(cpu(), dtype_of<T>(), dims)};
  REQUIRE(static_cast<size_t>(p.g->numel()) == host.size());
  gpu().upload(host.data(), *p.g);
  cpu().upload(host.data(), *p.c);
  return p;
}
template <typename T>
OwnedTensor on(Backend& b, const std::vector<T>& host, std::initializer_list<int64_t> dims) {
  OwnedTensor t(b, dtype_of<T>(), dims);
  REQUIRE(static_cast<size_t>(t->numel()) == host.size());
  b.upload(host.data(), *t);
  return t;
}

template <typename T = float>
std::vector<T> get(Backend& b, const Tensor& t) {
  std::vector<T> h(static_cast<size_t>(t.numel()));
  b.download(t, h.data());
  return h;
}

void require_close(const Pair& p, const std::string& what, double tol = kTol, double floor = 1e-30) {
  require_close(get(gpu(), *p.g), get(cpu(), *p.c), what, tol, floor);
}

/// A bf16 GPU tensor holding round_bf16(host).
inline OwnedTensor on_bf16(const std::vector<float>& host, std::initializer_list<int64_t> dims) {
  OwnedTensor t(gpu(), DType::bf16, dims);
  REQUIRE(static_cast<size_t>(t->numel()) == host.size());
  std::vector<uint16_t> bits(host.size());
  for (size_t i = 0; i < host.size(); ++i) bits[i] = bf16_bits(host[i]);
  gpu().upload(bits.data(), *t);
  return t;
}
/// A bf16 GPU tensor's values as floats.
inline std::vector<float> get_bf16(const Tensor& t) {
  std::vector<uint16_t> bits(static_cast<size_t>(t.numel()));
  gpu().download(t, bits.data());
  std::vector<float> x(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) x[i] = bf16_value(bits[i]);
  return x;
}

template <typename T>
void require_bit_identical(const std::vector<T>& a, const std::vector<T>& b, const std::string& what) {
  INFO(what << ": two GPU runs differ");
  REQUIRE(a.size() == b.size());
  REQUIRE(std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

}  // namespace llmt::test
