// The NCCL communicator at world size 1 (issue 8; label "gpu"; built with CUDA and NCCL):
// started without a launcher it needs no MPI, selects GPU 0, its device collectives (also
// reduce-scatter, all-gather and the asynchronous all-reduce on its own stream) leave the data
// unchanged, and cuda training runs through it reproduce the single-process run bit for bit:
// every gradient bucket through ncclAllReduce, overlapped with backward (many buckets) or after
// it, and ZeRO-1 (ncclReduce of the buckets overlapped with backward, or ncclReduceScatter after
// it; AdamW on the shard, ncclAllGather, the bf16 working copy re-rounded from the gathered
// weights).
#include <catch2/catch.hpp>

#include <filesystem>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "dist/nccl_communicator.h"
#include "kernels/backend.h"
#include "model/config.h"
#include "test_util.h"
#include "train/trainer.h"

using namespace llmt;
namespace fs = std::filesystem;
using llmt::test::read_metrics;

namespace {

NcclCommunicator& nccl() {
  static NcclCommunicator comm;
  return comm;
}

Config train_config(const fs::path& cache, const nlohmann::json& dist = nlohmann::json::object()) {
  nlohmann::json j = {
      {"dist", dist},
      {"run_name", "cuda-nccl-test"},
      {"model",
       {{"type", "transformer"}, {"d_model", 64}, {"n_layers", 2}, {"vocab_size", 50257},
        {"mlp", {{"intermediate_size", 96}}}, {"attn", {{"num_heads", 2}, {"head_dim", 32}}}}},
      {"train",
       {{"tokens", 2560}, {"batch_tokens", 256}, {"seq_len", 32}, {"micro_batch", 4}, {"lr", 3e-3},
        {"min_lr", 3e-4}, {"warmup_tokens", 512}, {"backend", "cuda"}}},
      {"data", {{"text", "data/fineweb-edu-sample10BT-head.part1.txt"}, {"cache_dir", cache.string()}}},
      {"eval", {{"interval_steps", 5}, {"tokens", 128}}},
      {"checkpoint", {{"interval_steps", 0}, {"keep", 1}}},
      {"log", {{"interval_steps", 100}}},
  };
  return parse_config(j);
}

}  // namespace

TEST_CASE("nccl communicator: world size 1, device collectives are the identity", "[gpu][nccl]") {
  NcclCommunicator& comm = nccl();
  CHECK(comm.name() == "nccl");
  CHECK(comm.rank() == 0);
  CHECK(comm.world_size() == 1);
  CHECK(comm.device() == 0);
  const std::unique_ptr<Backend> be = make_backend("cuda");
  const std::vector<float> host = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 1e-3f, -8.5f};
  OwnedTensor t(*be, DType::f32, {7});
  be->upload(host.data(), *t);
  comm.all_reduce(*t, ReduceOp::average);
  comm.broadcast(*t, 0);
  comm.reduce_scatter(*t);
  comm.all_gather(*t);
  comm.set_compute_stream(be->native_stream());
  comm.all_reduce_async(Tensor(t->data, DType::f32, {3}));
  comm.reduce_async(Tensor(static_cast<float*>(t->data) + 3, DType::f32, {4}), 0);
  comm.wait_all();
  comm.set_compute_stream(nullptr);
  std::vector<float> back(host.size());
  be->download(*t, back.data());
  CHECK(back == host);
  CHECK(comm.all_reduce_scalar(2.5, ReduceOp::sum) == 2.5);
  comm.barrier();
}

TEST_CASE("nccl communicator: cuda runs through it equal the single-process run bit for bit", "[gpu][nccl]") {
  const llmt::test::TempDir tmp;
  const fs::path cache = tmp.path / "cache";
  Trainer(train_config(cache), (tmp.path / "single").string(), false).run();
  // 1e-3 MiB = 262 elements per bucket: one bucket per block, overlapped with the backward.
  const std::pair<const char*, nlohmann::json> runs[] = {
      {"nccl", nlohmann::json::object()},
      {"nccl_many_buckets", {{"bucket_mb", 1e-3}}},
      {"nccl_after_backward", {{"bucket_mb", 1e-3}, {"overlap", false}}},
      {"nccl_zero1", {{"zero1", true}}},
      {"nccl_zero1_many_buckets", {{"zero1", true}, {"bucket_mb", 1e-3}}},
      {"nccl_zero1_after_backward", {{"zero1", true}, {"overlap", false}}},
  };
  const auto a = read_metrics(tmp.path / "single");
  REQUIRE(a.size() == 11);
  for (const auto& [name, dist] : runs) {
    Trainer(train_config(cache, dist), (tmp.path / name).string(), false, nccl()).run();
    const auto b = read_metrics(tmp.path / name);
    REQUIRE(b.size() == a.size());
    for (size_t i = 1; i < a.size(); ++i) {
      INFO(name << ", step " << i);
      CHECK(a[i]["loss"].get<double>() == b[i]["loss"].get<double>());
      CHECK(a[i]["grad_norm"].get<double>() == b[i]["grad_norm"].get<double>());
    }
  }
}
