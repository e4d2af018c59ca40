#include "train/hf_export.h"

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/safetensors.h"
#include "kernels/backend.h"
#include "model/config.h"
#include "model/model.h"
#include "train/checkpoint.h"
#include "train/hf_layout.h"
#include "train/optimizer.h"

namespace llmt {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

/// f32 -> bf16 bits, round to nearest even (NaN stays a quiet NaN).
uint16_t to_bf16(float x) {
  uint32_t u = 0;
  std::memcpy(&u, &x, 4);
  if (std::isnan(x)) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

float from_bf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float x = 0;
  std::memcpy(&x, &u, 4);
  return x;
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  check(in.good(), "cannot open {}", path);
  const json j = json::parse(in, nullptr, false);
  check(!j.is_discarded() && j.is_object(), "{}: not a JSON object", path);
  return j;
}

void write_json(const std::string& path, const json& j) { write_file_synced(path, j.dump(2) + "\n"); }

/// Equal as config values: numbers compared numerically (1 == 1.0), everything else exactly.
bool same_value(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  return a == b;
}

/// Every key of `want` (what our config gives) must be in `have` (the directory's config.json) with the
/// same value; `attn` is compared key by key. Throws naming the first key that differs.
void check_hf_config(const json& want, const json& have, const std::string& path, const std::string& where = "") {
  for (const auto& [key, value] : want.items()) {
    const std::string name = where + key;
    if (key == "architectures") continue;  // informational in HF
    check(have.contains(key), "import: {} has no key {}, which the llmtrain config gives as {}", path, name,
          value.dump());
    if (value.is_object() && have[key].is_object()) {
      check_hf_config(value, have[key], path, name + ".");
      continue;
    }
    check(same_value(value, have[key]), "import: {}: {} is {}, but the llmtrain config gives {}", path, name,
          have[key].dump(), value.dump());
  }
}

}  // namespace

void export_hf(const std::string& checkpoint, const std::string& out_dir, DType dtype) {
  check(dtype == DType::f32 || dtype == DType::bf16, "export: dtype must be f32 or bf16");
  const std::string dir = resolve_checkpoint(checkpoint);
  const json resolved = checkpoint_config(dir);
  const Config config = parse_config(resolved);
  const json hf = hf_config(config.model);  // refuses what FLA has no class for, before anything is written

  Model model(config.model);  // the parameter names and shapes (nothing allocated)
  const std::vector<ParamInfo>& params = model.params().infos();
  const SafetensorsFile weights((fs::path(dir) / "model.safetensors").string());
  std::vector<std::vector<float>> f32;
  std::vector<std::vector<uint16_t>> b16;
  std::vector<SafetensorsEntry> entries;
  for (const HfTensor& t : hf_tensors(config.model, params)) {
    std::vector<float> v(static_cast<size_t>(numel(t.shape)));
    const int64_t row_size = numel(t.shape) / t.shape[0];
    for (const HfTensor::Part& part : t.parts)
      weights.read(params[part.param].name, DType::f32, params[part.param].shape, v.data() + part.row * row_size);
    if (dtype == DType::bf16) {
      std::vector<uint16_t> r(v.size());
      for (size_t i = 0; i < v.size(); ++i) r[i] = to_bf16(v[i]);
      b16.push_back(std::move(r));
      entries.push_back({t.name, DType::bf16, t.shape, b16.back().data()});
    } else {
      f32.push_back(std::move(v));
      entries.push_back({t.name, DType::f32, t.shape, f32.back().data()});
    }
  }
  // entries point into the inner vectors' heap buffers, which moving the vectors does not relocate
  fs::create_directories(out_dir);
  write_safetensors((fs::path(out_dir) / "model.safetensors").string(), entries, {{"format", "pt"}});
  write_json((fs::path(out_dir) / "config.json").string(), hf);
  write_json((fs::path(out_dir) / "llmtrain_config.json").string(), resolved);
}

std::string import_hf(const std::string& in_dir, const std::string& config_path, const std::string& out_run) {
  const std::string cfg_path =
      config_path.empty() ? (fs::path(in_dir) / "llmtrain_config.json").string() : config_path;
  check(fs::exists(cfg_path), "import: {} does not exist; give the llmtrain config with --config", cfg_path);
  const fs::path existing = fs::path(out_run) / "checkpoints";
  check(!fs::exists(existing) || fs::is_empty(existing),
        "import: {} already holds checkpoints (resume and eval would pick the newest); give a new --out directory",
        existing.string());
  const Config config = load_config(cfg_path);
  const std::string hf_path = (fs::path(in_dir) / "config.json").string();
  check_hf_config(hf_config(config.model), read_json(hf_path), hf_path);

  const auto backend = make_backend("cpu");
  Model model(config.model);
  ParamStore& store = model.params();
  store.allocate(*backend, DType::f32);
  const std::string st_path = (fs::path(in_dir) / "model.safetensors").string();
  const SafetensorsFile file(st_path);
  std::vector<float> host(static_cast<size_t>(store.total()));
  std::set<std::string> expected;
  const std::vector<ParamInfo>& params = store.infos();
  for (const HfTensor& t : hf_tensors(config.model, params)) {
    expected.insert(t.name);
    const ParamInfo& first = params[t.parts.front().param];
    check(file.contains(t.name), "import: {} has no tensor {} (our {}, shape {})", st_path, t.name, first.name,
          fmt::join(t.shape, "x"));
    const SafetensorsFile::Info& info = file.info(t.name);
    check(info.shape == t.shape, "import: {}: tensor {} has shape {}, expected {}", st_path, t.name,
          fmt::join(info.shape, "x"), fmt::join(t.shape, "x"));
    std::vector<float> v(static_cast<size_t>(numel(t.shape)));
    if (info.dtype == DType::bf16) {
      std::vector<uint16_t> b(v.size());
      file.read(t.name, DType::bf16, t.shape, b.data());
      for (size_t i = 0; i < b.size(); ++i) v[i] = from_bf16(b[i]);
    } else {
      check(info.dtype == DType::f32, "import: {}: tensor {} is {}, expected F32 or BF16", st_path, t.name,
            dtype_name(info.dtype));
      file.read(t.name, DType::f32, t.shape, v.data());
    }
    const int64_t row_size = numel(t.shape) / t.shape[0];
    for (const HfTensor::Part& part : t.parts) {
      const ParamInfo& p = params[part.param];
      std::copy_n(v.data() + part.row * row_size, p.numel, host.data() + p.offset);
    }
  }
  for (const auto& [name, info] : file.tensors())
    check(expected.count(name) != 0, "import: {}: unexpected tensor {} (not a parameter of this {} model)", st_path,
          name, config.model.type);

  backend->upload(host.data(), store.flat_params());
  const AdamW optimizer(store, config.train);
  fs::create_directories(out_run);
  write_json((fs::path(out_run) / "config.json").string(), config.resolved);
  return save_checkpoint(out_run, TrainState{}, store, optimizer, config.resolved, config.train.seed,
                         config.checkpoint.keep);
}

}  // namespace llmt
