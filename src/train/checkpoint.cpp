#include "train/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <vector>

#include "core/error.h"
#include "core/safetensors.h"

namespace llmt {
namespace fs = std::filesystem;

namespace {

constexpr const char* kPrefix = "step_";

/// The flat buffer `t` copied to host memory.
std::vector<uint8_t> to_host(Backend& be, const Tensor& t) {
  std::vector<uint8_t> host(t.bytes());
  be.download(t, host.data());
  return host;
}

std::vector<SafetensorsEntry> entries(const ParamStore& p, const std::vector<uint8_t>& host, const std::string& prefix) {
  std::vector<SafetensorsEntry> out;
  for (const ParamInfo& info : p.infos())
    out.push_back({prefix + info.name, p.dtype(), info.shape, host.data() + info.offset * dtype_size(p.dtype())});
  return out;
}

/// The full-length moment `moment` (m or v) of `optimizer` in host memory on rank 0 (total()
/// elements; empty on the other ranks). A ZeRO-1 shard is first all-gathered from every rank into
/// a temporary padded buffer (a collective).
std::vector<uint8_t> moment_on_rank0(const ParamStore& p, const AdamW& optimizer, const Tensor& moment,
                                     Communicator& comm) {
  Backend& be = p.backend();
  if (optimizer.covers_all())
    return comm.rank() == 0 ? to_host(be, moment.range(0, p.total())) : std::vector<uint8_t>();
  const OwnedTensor full(be, p.dtype(), {p.padded_total()});
  const int64_t c = collective_segment(*full, comm.world_size(), "checkpoint: moments");
  check(optimizer.shard_begin() == comm.rank() * c && optimizer.shard_end() == optimizer.shard_begin() + c,
        "checkpoint: the optimizer shard [{}, {}) is not rank {}'s segment of {} elements", optimizer.shard_begin(),
        optimizer.shard_end(), comm.rank(), c);
  be.copy(moment, full->range(comm.rank() * c, (comm.rank() + 1) * c));
  comm.all_gather(*full);
  return comm.rank() == 0 ? to_host(be, full->range(0, p.total())) : std::vector<uint8_t>();
}

void read_all(const SafetensorsFile& f, const ParamStore& p, std::vector<uint8_t>& host, const std::string& prefix) {
  for (const ParamInfo& info : p.infos())
    f.read(prefix + info.name, p.dtype(), info.shape, host.data() + info.offset * dtype_size(p.dtype()));
}

}  // namespace

std::string save_checkpoint(const std::string& run_dir, const TrainState& state, const ParamStore& params,
                            const AdamW& optimizer, const nlohmann::json& resolved_config, uint64_t seed,
                            int64_t keep, Communicator& comm) {
  const auto m = moment_on_rank0(params, optimizer, optimizer.m(), comm);
  const auto v = moment_on_rank0(params, optimizer, optimizer.v(), comm);
  if (comm.rank() != 0) return "";
  const fs::path root = fs::path(run_dir) / "checkpoints";
  fs::create_directories(root);
  const std::string name = fmt::format("{}{:08d}", kPrefix, state.step);
  const fs::path tmp = root / (".tmp-" + name), final_dir = root / name;
  fs::remove_all(tmp);
  fs::create_directories(tmp);

  Backend& be = params.backend();
  const auto weights = to_host(be, params.flat_params());
  write_safetensors((tmp / "model.safetensors").string(), entries(params, weights, ""),
                    {{"format", "pt"}, {"step", std::to_string(state.step)}});
  auto moments = entries(params, m, "exp_avg.");
  for (auto& e : entries(params, v, "exp_avg_sq.")) moments.push_back(e);
  write_safetensors((tmp / "optimizer.safetensors").string(), moments);

  const nlohmann::json st = {
      {"step", state.step},
      {"tokens", state.tokens},
      {"skipped_steps", state.skipped_steps},
      {"optimizer_steps", optimizer.steps_taken()},
      {"loader", {{"epoch", state.loader.epoch}, {"index", state.loader.index}}},
      {"seed", seed},
      {"source_revision", LLMT_GIT_REVISION},
      {"config", resolved_config},
  };
  write_file_synced((tmp / "state.json").string(), st.dump(2) + "\n");
  fsync_directory(tmp.string());

  fs::remove_all(final_dir);  // a checkpoint of the same step from an interrupted earlier run
  fs::rename(tmp, final_dir);
  fsync_directory(root.string());

  std::vector<fs::path> all;
  for (const auto& e : fs::directory_iterator(root))
    if (e.is_directory() && e.path().filename().string().rfind(kPrefix, 0) == 0) all.push_back(e.path());
  std::sort(all.begin(), all.end());
  for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i) fs::remove_all(all[i]);
  return final_dir.string();
}

std::string latest_checkpoint(const std::string& run_dir) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  if (!fs::is_directory(root)) return "";
  std::string best;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string n = e.path().filename().string();
    if (e.is_directory() && n.rfind(kPrefix, 0) == 0 && fs::exists(e.path() / "state.json") &&
        (best.empty() || n > fs::path(best).filename().string()))
      best = e.path().string();
  }
  return best;
}

std::string resolve_checkpoint(const std::string& path) {
  if (fs::exists(fs::path(path) / "state.json")) return path;
  const std::string latest = latest_checkpoint(path);
  check(!latest.empty(), "{}: neither a checkpoint directory (with state.json) nor a run directory with checkpoints",
        path);
  return latest;
}

nlohmann::json checkpoint_config(const std::string& dir) {
  const std::string state_path = (fs::path(dir) / "state.json").string();
  std::ifstream in(state_path);
  check(in.good(), "cannot open {}", state_path);
  const nlohmann::json st = nlohmann::json::parse(in, nullptr, false);
  check(!st.is_discarded(), "{}: not valid JSON", state_path);
  check(st.is_object() && st.contains("config") && st["config"].is_object(), "{}: missing key config", state_path);
  return st["config"];
}

void check_resume_config(const std::string& dir, const nlohmann::json& resolved_config) {
  // What defines the run must not change under a resume: the model, the optimisation and the
  // data. Eval, checkpoint and log cadences may, and so may the backend and the precision
  // (checkpoints hold the fp32 master weights either way), the shard cache location and
  // model.mdn.save_residuals and model.{mamba3,gdn,comba,kda}.save_states (memory/speed trades with the same
  // gradients; absent from older checkpoints).
  // Compare the flattened key paths.
  const nlohmann::json saved = checkpoint_config(dir);
  // Keys added to the schema later: a checkpoint written before one existed resumes when the config has the
  // value that reproduces the old behaviour.
  const std::map<std::string, nlohmann::json> added_later = {{"data.source", "tokens"},
                                                              {"model.mdn.alpha_max", true}};
  // Keys that may change under a resume (the same run): where it executes and in which precision, and the memory /
  // recompute trade-offs of the layers (the same gradients either way).
  static const std::set<std::string> may_change = {
      "train.backend",          "train.precision",          "data.cache_dir",
      "model.mdn.save_residuals", "model.mamba2.save_states", "model.mamba3.save_states",
      "model.gdn.save_states",  "model.comba.save_states",  "model.kda.save_states"};
  for (const char* section : {"model", "train", "data"}) {
    const nlohmann::json now = resolved_config.at(section).flatten(), then = saved.at(section).flatten();
    for (const auto& [key, value] : now.items()) {
      const std::string name = section + key;  // flatten() gives "/a/b"
      std::string dotted = name;
      for (char& ch : dotted) ch = ch == '/' ? '.' : ch;
      if (may_change.count(dotted) != 0) continue;  // same run
      const auto later = added_later.find(dotted);
      if (!then.contains(key) && later != added_later.end() && later->second == value) continue;
      check(then.contains(key) && then.at(key) == value,
            "resume: {} is {} in the config but {} in the checkpoint {}; resume with the run's own config "
            "(saved as config.json in the run directory) or start a new run with --out",
            dotted, value.dump(), then.contains(key) ? then.at(key).dump() : "absent", dir);
    }
  }
}

void load_weights(const std::string& dir, ParamStore& params) {
  std::vector<uint8_t> host(params.flat_params().bytes());
  read_all(SafetensorsFile((fs::path(dir) / "model.safetensors").string()), params, host, "");
  params.backend().upload(host.data(), params.flat_params());
  params.refresh_working();
}

TrainState load_checkpoint(const std::string& dir, ParamStore& params, AdamW& optimizer,
                           const nlohmann::json& resolved_config) {
  const fs::path d(dir);
  const std::string state_path = (d / "state.json").string();
  std::ifstream in(state_path);
  check(in.good(), "cannot open {}", state_path);
  nlohmann::json st;
  try {
    st = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: not valid JSON: {}", state_path, e.what()));
  }
  check_resume_config(dir, resolved_config);
  load_weights(dir, params);
  Backend& be = params.backend();
  std::vector<uint8_t> host(params.flat_params().bytes());
  const SafetensorsFile opt((d / "optimizer.safetensors").string());
  // The optimizer's shard of the full-length moments (its padding, past total(), stays zero).
  const int64_t begin = optimizer.shard_begin(), n = std::min(optimizer.shard_end(), params.total()) - begin;
  const size_t es = dtype_size(params.dtype());
  const auto upload_shard = [&](const Tensor& moment) {
    if (n > 0) be.upload(host.data() + begin * es, moment.range(0, n));
  };
  read_all(opt, params, host, "exp_avg.");
  upload_shard(optimizer.m());
  read_all(opt, params, host, "exp_avg_sq.");
  upload_shard(optimizer.v());

  TrainState s;
  try {
    s.step = st.at("step").get<int64_t>();
    s.tokens = st.at("tokens").get<int64_t>();
    s.skipped_steps = st.at("skipped_steps").get<int64_t>();
    s.loader.epoch = st.at("loader").at("epoch").get<uint64_t>();
    s.loader.index = st.at("loader").at("index").get<uint64_t>();
    optimizer.set_steps_taken(st.at("optimizer_steps").get<int64_t>());
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: {}", state_path, e.what()));
  }
  return s;
}

}  // namespace llmt
