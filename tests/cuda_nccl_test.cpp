// The NCCL communicator at world size 1 (issue 8; label "gpu"; built with CUDA and NCCL):
// started without a launcher it needs no MPI, selects GPU 0, its device collectives leave the
// data unchanged, and a cuda training run through it (every gradient bucket goes through
// ncclAllReduce) reproduces the single-process run bit for bit.
#include <catch2/catch.hpp>

#include <filesystem>
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

Config train_config(const fs::path& cache) {
  nlohmann::json j = {
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
  all_reduce_in_buckets(comm, *t, 3);
  comm.all_reduce(*t, ReduceOp::average);
  comm.broadcast(*t, 0);
  std::vector<float> back(host.size());
  be->download(*t, back.data());
  CHECK(back == host);
  CHECK(comm.all_reduce_scalar(2.5, ReduceOp::sum) == 2.5);
  comm.barrier();
}

TEST_CASE("nccl communicator: a cuda run through it equals the single-process run bit for bit", "[gpu][nccl]") {
  const llmt::test::TempDir tmp;
  const Config config = train_config(tmp.path / "cache");
  Trainer(config, (tmp.path / "single").string(), false).run();
  Trainer(config, (tmp.path / "nccl").string(), false, nccl()).run();
  const auto a = read_metrics(tmp.path / "single"), b = read_metrics(tmp.path / "nccl");
  REQUIRE(a.size() == 11);
  REQUIRE(b.size() == a.size());
  for (size_t i = 1; i < a.size(); ++i) {
    INFO("step " << i);
    CHECK(a[i]["loss"].get<double>() == b[i]["loss"].get<double>());
    CHECK(a[i]["grad_norm"].get<double>() == b[i]["grad_norm"].get<double>());
  }
}
