#include "model/params.h"

#include <algorithm>
#include <cmath>
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
  ParamInfo info{name, shape, total_, 1, kind, init};
  for (int64_t d : shape) info.numel *= d;
  total_ += info.numel;
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

void ParamStore::initialize(uint64_t seed) {
  check(backend_ != nullptr, "ParamStore::initialize before allocate");
  std::vector<double> host64;
  std::vector<float> host32;
  for (size_t i = 0; i < infos_.size(); ++i) {
    const ParamInfo& p = infos_[i];
    host64.assign(p.numel, 0.0);
    if (p.init.kind == Init::ones) host64.assign(p.numel, 1.0);
    Philox rng(seed, p.init.stream >= 0 ? static_cast<uint64_t>(p.init.stream) : i);
    switch (p.init.kind) {
      case Init::normal:
        for (double& x : host64) x = p.init.std * rng.normal();
        break;
      case Init::log_uniform:
        for (double& x : host64) x = std::log(p.init.lo + (p.init.hi - p.init.lo) * (1.0 - rng.uniform()));
        break;
      case Init::dt_bias:
        for (double& x : host64) {
          const double dt = std::max(
              p.init.floor, std::exp(std::log(p.init.lo) + (std::log(p.init.hi) - std::log(p.init.lo)) * rng.uniform()));
          x = dt + std::log(-std::expm1(-dt));  // softplus^-1(dt) = dt + log(1 - exp(-dt))
        }
        break;
      case Init::constant:
        host64.assign(p.numel, p.init.value);
        break;
      case Init::uniform:
        for (double& x : host64) x = p.init.lo + (p.init.hi - p.init.lo) * rng.uniform();
        break;
      case Init::log_index:
        for (size_t j = 0; j < host64.size(); ++j) host64[j] = std::log(static_cast<double>(j + 1));
        break;
      case Init::ones:
      case Init::zeros:
        break;
    }
    if (dtype_ == DType::f64) {
      backend_->upload(host64.data(), master(static_cast<int>(i)));
    } else {
      host32.assign(host64.begin(), host64.end());
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
