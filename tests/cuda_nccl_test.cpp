// The NCCL communicator (issue 8; label "gpu"; built with CUDA and NCCL). Run plainly (world size 1:
// no MPI needed, GPU 0) and, on a machine with several GPUs, under `mpirun -np W` too:
//   - every device collective (all-reduce sum and average, broadcast, reduce-scatter, all-gather,
//     the asynchronous all-reduce and reduce on NCCL's own stream) gives the sums over the ranks of
//     rank-dependent data (exact: small integers and halves), which at world size 1 is the identity;
//   - cuda training through it is bitwise the same in every dist mode: every gradient bucket through
//     ncclAllReduce, overlapped with backward (many buckets) or after it, and ZeRO-1 (ncclReduce of
//     the buckets overlapped with backward, or ncclReduceScatter after it; AdamW on the shard,
//     ncclAllGather, the bf16 working copy re-rounded from the gathered weights); at world size 1 also
//     the same as the single-process run.
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

TEST_CASE("nccl communicator: device collectives sum over the ranks", "[gpu][nccl]") {
  NcclCommunicator& comm = nccl();
  const int world = comm.world_size(), rank = comm.rank();
  CHECK(comm.name() == "nccl");
  REQUIRE(rank >= 0);
  REQUIRE(rank < world);
  CHECK(comm.device() == (world == 1 ? 0 : comm.local_rank()));  // one GPU per rank here
  const std::unique_ptr<Backend> be = make_backend("cuda");
  // Element i of rank r: base[i % 8] * (r + 1) + r. Sums over ranks of such values are exact in f32.
  const std::vector<float> base = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 0.5f, -8.5f, 4.0f};
  const int64_t n = 8 * static_cast<int64_t>(world);
  const auto value = [&](int64_t i, int r) { return base[i % 8] * static_cast<float>(r + 1) + static_cast<float>(r); };
  std::vector<float> mine(n), sum(n, 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    mine[i] = value(i, rank);
    for (int r = 0; r < world; ++r) sum[i] += value(i, r);
  }
  OwnedTensor t(*be, DType::f32, {n});
  std::vector<float> back(n);
  const auto fetch = [&] { be->download(*t, back.data()); };

  be->upload(mine.data(), *t);
  comm.all_reduce(*t, ReduceOp::sum);
  fetch();
  CHECK(back == sum);

  be->upload(mine.data(), *t);
  comm.all_reduce(*t, ReduceOp::average);
  fetch();
  for (int64_t i = 0; i < n; ++i) CHECK(back[i] == Approx(sum[i] / static_cast<float>(world)).epsilon(1e-6));

  be->upload(mine.data(), *t);
  comm.broadcast(*t, world - 1);
  fetch();
  for (int64_t i = 0; i < n; ++i) CHECK(back[i] == value(i, world - 1));

  // reduce_scatter leaves the summed segment `rank`; all_gather then spreads every rank's segment.
  be->upload(mine.data(), *t);
  comm.reduce_scatter(*t);
  fetch();
  for (int64_t i = 8 * rank; i < 8 * (rank + 1); ++i) CHECK(back[i] == sum[i]);
  comm.all_gather(*t);
  fetch();
  CHECK(back == sum);

  // Asynchronous: an all-reduce of the first 3 elements, a reduce of the next 5 to the last rank.
  be->upload(mine.data(), *t);
  comm.set_compute_stream(be->native_stream());
  comm.all_reduce_async(Tensor(t->data, DType::f32, {3}));
  comm.reduce_async(Tensor(static_cast<float*>(t->data) + 3, DType::f32, {5}), world - 1);
  comm.wait_all();
  comm.set_compute_stream(nullptr);
  fetch();
  for (int64_t i = 0; i < 3; ++i) CHECK(back[i] == sum[i]);
  if (rank == world - 1)
    for (int64_t i = 3; i < 8; ++i) CHECK(back[i] == sum[i]);
  for (int64_t i = 8; i < n; ++i) CHECK(back[i] == mine[i]);  // untouched

  CHECK(comm.all_reduce_scalar(rank + 1.0, ReduceOp::sum) == world * (world + 1) / 2.0);
  CHECK(comm.all_reduce_scalar(rank + 1.0, ReduceOp::max) == world);
  comm.barrier();
}

TEST_CASE("nccl communicator: cuda runs through it equal the single-process run bit for bit", "[gpu][nccl]") {
  const llmt::test::TempDir tmp;
  const fs::path cache = tmp.path / "cache";
  NcclCommunicator& comm = nccl();
  // At world size 1 the reference is the single-process run; with several ranks it is the first
  // NCCL run (the micro-batches' gradients are then summed across ranks, not in one buffer, so the
  // bits differ from one process after the first update; tests/mpi_* compare those within 1e-6).
  if (comm.world_size() == 1) Trainer(train_config(cache), (tmp.path / "reference").string(), false).run();
  // 1e-3 MiB = 262 elements per bucket: one bucket per block, overlapped with the backward.
  const std::pair<const char*, nlohmann::json> runs[] = {
      {"nccl", nlohmann::json::object()},
      {"nccl_many_buckets", {{"bucket_mb", 1e-3}}},
      {"nccl_after_backward", {{"bucket_mb", 1e-3}, {"overlap", false}}},
      {"nccl_zero1", {{"zero1", true}}},
      {"nccl_zero1_many_buckets", {{"zero1", true}, {"bucket_mb", 1e-3}}},
      {"nccl_zero1_after_backward", {{"zero1", true}, {"overlap", false}}},
  };
  for (const auto& [name, dist] : runs) {
    const fs::path dir = tmp.path / (comm.world_size() > 1 && std::string(name) == "nccl" ? "reference" : name);
    Trainer(train_config(cache, dist), dir.string(), false, comm).run();
    if (comm.rank() != 0) continue;  // only rank 0 writes metrics
    const auto a = read_metrics(tmp.path / "reference");
    REQUIRE(a.size() == 11);
    const auto b = read_metrics(dir);
    REQUIRE(b.size() == a.size());
    for (size_t i = 1; i < a.size(); ++i) {
      INFO(name << ", step " << i);
      CHECK(a[i]["loss"].get<double>() == b[i]["loss"].get<double>());
      CHECK(a[i]["grad_norm"].get<double>() == b[i]["grad_norm"].get<double>());
    }
  }
}
