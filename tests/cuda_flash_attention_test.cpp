// GPU tests of the bf16 tensor-core flash attention (src/kernels/cuda/flash_attention.cuh): o, lse,
// dq, dk, dv against the CPU reference (src/kernels/cpu/attention.h) run in double on the same
// bf16-rounded inputs, over head dims 64 and 128 and sequence lengths with partial tiles; the
// outputs must be finite, fully overwritten, and bit-identical from run to run.
#include <catch2/catch.hpp>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/rng.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/flash_attention.cuh"

namespace {

// bf16 bits of x, rounded to nearest even (inputs here are finite).
uint16_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
double bf16_value(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

/// A bf16 host array: its bits (what the GPU gets) and their exact values (what the CPU gets).
struct Bf16Host {
  std::vector<uint16_t> bits;
  std::vector<double> values;
};
Bf16Host to_bf16(const std::vector<double>& x) {
  Bf16Host h;
  h.bits.resize(x.size());
  h.values.resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    h.bits[i] = bf16_bits(static_cast<float>(x[i]));
    h.values[i] = bf16_value(h.bits[i]);
  }
  return h;
}
// n normal values times `scale` from Philox stream `stream`, rounded to bf16.
Bf16Host random_bf16(size_t n, uint64_t stream, double scale) {
  llmt::Philox rng(20241129, stream);
  std::vector<double> x(n);
  for (double& e : x) e = scale * rng.normal();
  return to_bf16(x);
}

/// A device allocation of `bytes`, filled with the byte `fill` (0xff: bf16 and fp32 NaN, so
/// any element a kernel fails to write shows up as non-finite).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes, int fill = 0xff) : bytes_(bytes) {
    REQUIRE(cudaMalloc(&ptr_, std::max<size_t>(bytes, 16)) == cudaSuccess);
    REQUIRE(cudaMemset(ptr_, fill, std::max<size_t>(bytes, 16)) == cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  __nv_bfloat16* bf16() const { return static_cast<__nv_bfloat16*>(ptr_); }
  float* f32() const { return static_cast<float*>(ptr_); }
  void* raw() const { return ptr_; }

  template <typename T>
  void upload(const std::vector<T>& host) {
    REQUIRE(host.size() * sizeof(T) == bytes_);
    REQUIRE(cudaMemcpy(ptr_, host.data(), bytes_, cudaMemcpyHostToDevice) == cudaSuccess);
  }
  template <typename T>
  std::vector<T> download() const {
    std::vector<T> host(bytes_ / sizeof(T));
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    REQUIRE(cudaMemcpy(host.data(), ptr_, bytes_, cudaMemcpyDeviceToHost) == cudaSuccess);
    return host;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

std::vector<double> values_of(const std::vector<uint16_t>& bits) {
  std::vector<double> v(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) v[i] = bf16_value(bits[i]);
  return v;
}

/// Every element of the GPU result is finite and ||gpu - ref|| / max(||ref||, floor) <= tol.
/// `floor` stands in for the size of the terms where the exact result (nearly) vanishes.
void require_rel_close(const std::vector<double>& gpu, const std::vector<double>& ref, const char* what,
                       double tol, double floor) {
  INFO(what);
  REQUIRE(gpu.size() == ref.size());
  size_t non_finite = 0;
  double err2 = 0.0, ref2 = 0.0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    if (!std::isfinite(gpu[i])) ++non_finite;
    err2 += (gpu[i] - ref[i]) * (gpu[i] - ref[i]);
    ref2 += ref[i] * ref[i];
  }
  REQUIRE(non_finite == 0);
  const double rel = std::sqrt(err2) / std::max(std::sqrt(ref2), floor);
  INFO("||gpu - ref|| = " << std::sqrt(err2) << ", ||ref|| = " << std::sqrt(ref2) << ", relative " << rel);
  CHECK(rel <= tol);
}

constexpr double kRelTol = 1e-2;  // bf16 outputs, bf16 P and dS in the products
constexpr double kLseTol = 1e-3;  // absolute, natural-log units

struct Shape {
  int64_t B, T, H, D;
  double q_scale;  // spread of q: larger makes the softmax peakier
};

}  // namespace

TEST_CASE("cuda: bf16 flash attention forward and backward match the double CPU reference", "[cuda]") {
  const Shape shapes[] = {{1, 1, 1, 64, 1.0},   {1, 1, 2, 128, 1.0},   {1, 17, 2, 128, 1.0},
                          {2, 64, 3, 64, 1.0},  {1, 64, 1, 128, 3.0},  {2, 200, 3, 128, 1.0},
                          {1, 200, 2, 64, 3.0}, {2, 129, 2, 64, 1.0},  {1, 1024, 2, 128, 1.0},
                          {1, 1024, 1, 64, 2.0}, {1, 1000, 1, 128, 2.0}};
  uint64_t stream = 0;
  for (const Shape& s : shapes) {
    INFO("B " << s.B << " T " << s.T << " H " << s.H << " Dh " << s.D << " q scale " << s.q_scale);
    const size_t n = static_cast<size_t>(s.B * s.T * s.H * s.D);
    const size_t rows = static_cast<size_t>(s.B * s.H * s.T);
    const size_t bytes = n * sizeof(uint16_t);
    const double scale = 1.0 / std::sqrt(static_cast<double>(s.D));
    const Bf16Host q = random_bf16(n, ++stream, s.q_scale), k = random_bf16(n, ++stream, 1.0);
    const Bf16Host v = random_bf16(n, ++stream, 1.0), dout = random_bf16(n, ++stream, 1.0);

    DeviceBuffer q_d(bytes), k_d(bytes), v_d(bytes), o_d(bytes), lse_d(rows * sizeof(float));
    q_d.upload(q.bits);
    k_d.upload(k.bits);
    v_d.upload(v.bits);

    // Forward.
    llmt::cuda::flash_attention_fwd(q_d.bf16(), k_d.bf16(), v_d.bf16(), s.B, s.T, s.H, s.D,
                                    static_cast<float>(scale), o_d.bf16(), lse_d.f32(), nullptr);
    const std::vector<uint16_t> o_bits = o_d.download<uint16_t>();
    const std::vector<float> lse_gpu = lse_d.download<float>();
    std::vector<double> o_ref(n), lse_ref(rows);
    llmt::cpu::attention_fwd(q.values.data(), k.values.data(), v.values.data(), s.B, s.T, s.H, s.D, scale,
                             o_ref.data(), lse_ref.data());
    require_rel_close(values_of(o_bits), o_ref, "o", kRelTol, 0.0);
    {
      INFO("lse");
      size_t non_finite = 0;
      double max_err = 0.0;
      for (size_t i = 0; i < rows; ++i) {
        if (!std::isfinite(lse_gpu[i])) ++non_finite;
        max_err = std::max(max_err, std::abs(lse_gpu[i] - lse_ref[i]));
      }
      REQUIRE(non_finite == 0);
      INFO("max |lse gpu - lse ref| = " << max_err);
      CHECK(max_err <= kLseTol);
    }
    {
      DeviceBuffer o2_d(bytes), lse2_d(rows * sizeof(float));
      llmt::cuda::flash_attention_fwd(q_d.bf16(), k_d.bf16(), v_d.bf16(), s.B, s.T, s.H, s.D,
                                      static_cast<float>(scale), o2_d.bf16(), lse2_d.f32(), nullptr);
      INFO("flash_attention_fwd: two runs differ");
      REQUIRE(o2_d.download<uint16_t>() == o_bits);
      REQUIRE(std::memcmp(lse2_d.download<float>().data(), lse_gpu.data(), rows * sizeof(float)) == 0);
    }

    // Backward from the reference forward's o (rounded to bf16) and lse (rounded to fp32), given
    // identically to both sides so that the comparison isolates the backward.
    const Bf16Host o_in = to_bf16(o_ref);
    std::vector<float> lse_in(rows);
    std::vector<double> lse_in_values(rows);
    for (size_t i = 0; i < rows; ++i) {
      lse_in[i] = static_cast<float>(lse_ref[i]);
      lse_in_values[i] = lse_in[i];
    }
    DeviceBuffer o_in_d(bytes), lse_in_d(rows * sizeof(float)), dout_d(bytes);
    o_in_d.upload(o_in.bits);
    lse_in_d.upload(lse_in);
    dout_d.upload(dout.bits);
    DeviceBuffer scratch(llmt::cuda::flash_attention_bwd_scratch_bytes(s.B, s.T, s.H, s.D));
    DeviceBuffer dq_d(bytes), dk_d(bytes), dv_d(bytes);  // NaN-filled: must be overwritten
    llmt::cuda::flash_attention_bwd(q_d.bf16(), k_d.bf16(), v_d.bf16(), o_in_d.bf16(), lse_in_d.f32(),
                                    dout_d.bf16(), s.B, s.T, s.H, s.D, static_cast<float>(scale), dq_d.bf16(),
                                    dk_d.bf16(), dv_d.bf16(), scratch.raw(), nullptr);
    const std::vector<uint16_t> dq_bits = dq_d.download<uint16_t>();
    const std::vector<uint16_t> dk_bits = dk_d.download<uint16_t>();
    const std::vector<uint16_t> dv_bits = dv_d.download<uint16_t>();

    std::vector<double> dq_ref(n), dk_ref(n), dv_ref(n);
    llmt::cpu::attention_bwd(q.values.data(), k.values.data(), v.values.data(), o_in.values.data(),
                             lse_in_values.data(), dout.values.data(), s.B, s.T, s.H, s.D, scale, dq_ref.data(),
                             dk_ref.data(), dv_ref.data());
    // At T = 1, dq and dk vanish exactly (dS = P (dO.v - dO.o) with o = v): the floor, the norm
    // of a vector of 1e-3 entries, keeps the check meaningful against the unit-size terms.
    const double floor = 1e-3 * std::sqrt(static_cast<double>(n));
    require_rel_close(values_of(dq_bits), dq_ref, "dq", kRelTol, floor);
    require_rel_close(values_of(dk_bits), dk_ref, "dk", kRelTol, floor);
    require_rel_close(values_of(dv_bits), dv_ref, "dv", kRelTol, floor);

    // Determinism: a second run into buffers with other stale contents gives the same bits.
    DeviceBuffer dq2_d(bytes, 0x3f), dk2_d(bytes, 0x3f), dv2_d(bytes, 0x3f);
    DeviceBuffer scratch2(llmt::cuda::flash_attention_bwd_scratch_bytes(s.B, s.T, s.H, s.D), 0x3f);
    llmt::cuda::flash_attention_bwd(q_d.bf16(), k_d.bf16(), v_d.bf16(), o_in_d.bf16(), lse_in_d.f32(),
                                    dout_d.bf16(), s.B, s.T, s.H, s.D, static_cast<float>(scale), dq2_d.bf16(),
                                    dk2_d.bf16(), dv2_d.bf16(), scratch2.raw(), nullptr);
    INFO("flash_attention_bwd: two runs differ");
    REQUIRE(dq2_d.download<uint16_t>() == dq_bits);
    REQUIRE(dk2_d.download<uint16_t>() == dk_bits);
    REQUIRE(dv2_d.download<uint16_t>() == dv_bits);
  }
}

TEST_CASE("cuda: bf16 flash attention rejects unsupported head dims", "[cuda]") {
  DeviceBuffer buf(4 * 32 * sizeof(uint16_t)), lse(4 * sizeof(float));
  CHECK_THROWS(llmt::cuda::flash_attention_fwd(buf.bf16(), buf.bf16(), buf.bf16(), 1, 4, 1, 32, 0.1f, buf.bf16(),
                                               lse.f32(), nullptr));
}
