#include "model/params.h"

#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/rng.h"

namespace llmt {

const char* param_kind_name(ParamKind k) {
  switch (k) {
    case ParamKind::weight: return "weight";
    case ParamKind::bias: return "bias";
    case ParamKind::norm: return "norm";
    case ParamKind::embedding: return "embedding";
    case ParamKind::ssm_param: return "ssm_param";
  }
  return "?";
}

int ParamStore::add(const std::string& name, std::vector<int64_t> shape, ParamKind kind, Init init) {
  check(!backend_, "ParamStore::add({}) after allocate()", name);
  for (const auto& p : infos_) check(p.name != name, "ParamStore: duplicate parameter name {}", name);
  check(!shape.empty() && shape.size() <= 4, "ParamStore: {} needs 1 to 4 dimensions", name);
  ParamInfo info{name, shape, (total_ + kParamAlign - 1) / kParamAlign * kParamAlign, 1, kind, init};
  for (int64_t d : shape) info.numel *= d;
  total_ = info.offset + info.numel;
  count_ += info.numel;
  infos_.push_back(info);
  return static_cast<int>(infos_.size()) - 1;
}

void ParamStore::allocate(Backend& backend, DType dtype, DType compute_dtype, int64_t pad_multiple) {
  check(pad_multiple > 0, "ParamStore: pad_multiple must be positive, got {}", pad_multiple);
  check(dtype == DType::f32 || dtype == DType::f64, "ParamStore: parameters are f32 or f64");
  check(compute_dtype == dtype || (dtype == DType::f32 && compute_dtype == DType::bf16),
        "ParamStore: compute dtype {} with parameters in {} (supported: the same, or bf16 with f32)",
        dtype_name(compute_dtype), dtype_name(dtype));
  backend_ = &backend;
  dtype_ = dtype;
  compute_dtype_ = compute_dtype;
  padded_total_ = (total_ + pad_multiple - 1) / pad_multiple * pad_multiple;
  params_ = Buffer(backend, static_cast<size_t>(padded_total_) * dtype_size(dtype));
  grads_ = Buffer(backend, static_cast<size_t>(padded_total_) * dtype_size(dtype));
  working_ = has_working() ? Buffer(backend, static_cast<size_t>(total_) * dtype_size(compute_dtype)) : Buffer();
  backend.fill_zero(padded_params());
  backend.fill_zero(padded_grads());
  refresh_working();
}

void ParamStore::refresh_working() {
  if (has_working()) backend_->convert(flat_params(), flat_working());
}

namespace {

// 32-bit words of the parameter's Philox stream that one element consumes (uniform() 2, normal() 4).
uint64_t words_per_element(Init::Kind kind) {
  switch (kind) {
    case Init::normal: return 4;
    case Init::log_uniform:
    case Init::dt_bias:
    case Init::uniform: return 2;
    default: return 0;
  }
}

// Elements [begin, end) of a parameter initialised by `init` from its stream `rng` (element j takes
// words [j w, (j + 1) w) of the stream, so any split of the range gives the sequential values).
void fill_init(const Init& init, Philox rng, int64_t begin, int64_t end, double* out) {
  rng.skip_to(static_cast<uint64_t>(begin) * words_per_element(init.kind));
  for (int64_t j = begin; j < end; ++j) {
    double& x = out[j];
    switch (init.kind) {
      case Init::normal: x = init.std * rng.normal(); break;
      case Init::log_uniform: x = std::log(init.lo + (init.hi - init.lo) * (1.0 - rng.uniform())); break;
      case Init::dt_bias: {
        const double dt = std::max(
            init.floor, std::exp(std::log(init.lo) + (std::log(init.hi) - std::log(init.lo)) * rng.uniform()));
        x = dt + std::log(-std::expm1(-dt));  // softplus^-1(dt) = dt + log(1 - exp(-dt))
        break;
      }
      case Init::constant: x = init.value; break;
      case Init::uniform: x = init.lo + (init.hi - init.lo) * rng.uniform(); break;
      case Init::log_index: x = std::log(static_cast<double>(j + 1)); break;
      case Init::ones: x = 1.0; break;
      case Init::zeros: x = 0.0; break;
    }
  }
}

// Runs fn(begin, end) over [0, n) split into contiguous ranges, on up to hardware_concurrency threads.
template <class Fn>
void parallel_ranges(int64_t n, Fn fn) {
  constexpr int64_t kGrain = int64_t{1} << 18;
  const int64_t threads =
      std::min<int64_t>(std::max(1u, std::thread::hardware_concurrency()), (n + kGrain - 1) / kGrain);
  if (threads <= 1) return fn(int64_t{0}, n);
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < threads; ++t) pool.emplace_back(fn, n * t / threads, n * (t + 1) / threads);
  for (auto& th : pool) th.join();
}

}  // namespace

void ParamStore::initialize(uint64_t seed) {
  check(backend_ != nullptr, "ParamStore::initialize before allocate");
  std::vector<double> host64;
  std::vector<float> host32;
  for (size_t i = 0; i < infos_.size(); ++i) {
    const ParamInfo& p = infos_[i];
    host64.resize(static_cast<size_t>(p.numel));
    const Philox rng(seed, p.init.stream >= 0 ? static_cast<uint64_t>(p.init.stream) : i);
    if (dtype_ == DType::f64) {
      parallel_ranges(p.numel, [&](int64_t b, int64_t e) { fill_init(p.init, rng, b, e, host64.data()); });
      backend_->upload(host64.data(), master(static_cast<int>(i)));
    } else {
      host32.resize(static_cast<size_t>(p.numel));
      parallel_ranges(p.numel, [&](int64_t b, int64_t e) {
        fill_init(p.init, rng, b, e, host64.data());
        std::copy(host64.begin() + b, host64.begin() + e, host32.begin() + b);
      });
      backend_->upload(host32.data(), master(static_cast<int>(i)));
    }
  }
  refresh_working();
}

Tensor ParamStore::view(const Buffer& b, int i, DType dtype) const {
  const ParamInfo& p = infos_.at(i);
  Tensor t(static_cast<char*>(b.data()) + p.offset * dtype_size(dtype), dtype, {});
  for (int64_t d : p.shape) t.shape[t.ndim++] = d;
  return t;
}

}  // namespace llmt
