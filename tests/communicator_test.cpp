// The launch environment (rank, world size, local rank from mpirun / srun / PMI variables) and
// the single-process communicator; the MPI collectives themselves are tested under mpirun in
// mpi_data_parallel_test.cpp.
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "dist/launch_env.h"
#include "train/step.h"
#include "test_util.h"

using namespace llmt;
using Catch::Matchers::Contains;

namespace {

LaunchEnv detect(const std::map<std::string, std::string>& vars) {
  return detect_launch_env([&](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

}  // namespace

TEST_CASE("launch env: mpirun, srun and PMI variables, with Open MPI first", "[dist]") {
  const LaunchEnv none = detect({});
  CHECK(none.world_size == 1);
  CHECK(none.rank == 0);
  CHECK(none.source.empty());

  const LaunchEnv ompi = detect({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "8"},
                                 {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"SLURM_PROCID", "0"},
                                 {"SLURM_STEP_NUM_TASKS", "2"}});
  CHECK(ompi.source == "openmpi");
  CHECK(ompi.rank == 3);
  CHECK(ompi.world_size == 8);
  CHECK(ompi.local_rank == 1);

  const LaunchEnv slurm = detect({{"SLURM_PROCID", "5"}, {"SLURM_STEP_NUM_TASKS", "16"}, {"SLURM_LOCALID", "5"}});
  CHECK(slurm.source == "slurm");
  CHECK(slurm.rank == 5);
  CHECK(slurm.world_size == 16);
  CHECK(slurm.local_rank == 5);

  // A batch script's own shell (SLURM_NTASKS but no job step) is one process, not a rank.
  CHECK(detect({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "16"}}).world_size == 1);

  const LaunchEnv pmi = detect({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}});
  CHECK(pmi.source == "pmi");
  CHECK(pmi.rank == 1);
  CHECK(pmi.local_rank == 0);
}

TEST_CASE("launch env: malformed values are refused, naming the variable", "[dist]") {
  CHECK_THROWS_WITH(detect({{"OMPI_COMM_WORLD_RANK", "x1"}, {"OMPI_COMM_WORLD_SIZE", "2"}}),
                    Contains("OMPI_COMM_WORLD_RANK") && Contains("x1"));
  CHECK_THROWS_WITH(detect({{"SLURM_PROCID", "4"}, {"SLURM_STEP_NUM_TASKS", "4"}}),
                    Contains("SLURM_PROCID=4") && Contains("outside"));
  CHECK_THROWS_WITH(detect({{"PMI_RANK", "0"}, {"PMI_SIZE", "-2"}}), Contains("PMI_SIZE"));
}

TEST_CASE("single-process communicator: rank 0 of 1, collectives are the identity", "[dist]") {
  Communicator& comm = single_process_communicator();
  CHECK(comm.rank() == 0);
  CHECK(comm.world_size() == 1);
  CHECK(comm.local_rank() == 0);
  std::vector<float> x = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f};
  const std::vector<float> before = x;
  comm.all_reduce(Tensor(x.data(), DType::f32, {5}), ReduceOp::average);
  comm.all_reduce_async(Tensor(x.data(), DType::f32, {5}));
  comm.reduce_async(Tensor(x.data(), DType::f32, {5}), 0);
  comm.wait_all();
  comm.broadcast(Tensor(x.data(), DType::f32, {5}), 0);
  comm.reduce_scatter(Tensor(x.data(), DType::f32, {5}));
  comm.all_gather(Tensor(x.data(), DType::f32, {5}));
  CHECK(x == before);
  CHECK(comm.all_reduce_scalar(2.5, ReduceOp::sum) == 2.5);
  CHECK(comm.all_reduce_scalar(-1.0, ReduceOp::max) == -1.0);
  comm.barrier();

  std::vector<int32_t> ids(3);
  CHECK_THROWS_WITH(comm.all_reduce(Tensor(ids.data(), DType::i32, {3}), ReduceOp::sum), Contains("f32 or f64"));
  CHECK_THROWS_WITH(comm.broadcast(Tensor(x.data(), DType::f32, {5}), 1), Contains("root 1"));
  CHECK_THROWS_WITH(comm.reduce_scatter(Tensor(ids.data(), DType::i32, {3})), Contains("f32 or f64"));
}

TEST_CASE("make_communicator: a plain start is one process", "[dist]") {
  // ctest starts this test without a launcher, so there are no rank variables.
  REQUIRE(detect_launch_env().world_size == 1);
  CHECK(make_communicator("cpu")->name() == "single");
}
