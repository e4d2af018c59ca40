#include "dist/communicator.h"

#include <cstdlib>

#include "core/error.h"
#include "dist/launch_env.h"
#include "kernels/backend.h"
#ifdef LLMT_HAVE_MPI
#include "dist/mpi_communicator.h"
#endif
#ifdef LLMT_HAVE_NCCL
#include "dist/nccl_communicator.h"
#endif

namespace llmt {

void check_collective_dtype(const Tensor& t, const char* what) {
  check(t.dtype == DType::f32 || t.dtype == DType::f64, "{}: collectives carry f32 or f64 tensors, got {}", what,
        dtype_name(t.dtype));
}

int64_t collective_segment(const Tensor& t, int world, const char* what) {
  check_collective_dtype(t, what);
  check(t.numel() % world == 0, "{}: {} elements do not divide into {} equal segments (pad the buffer)", what,
        t.numel(), world);
  return t.numel() / world;
}

void SingleProcessCommunicator::all_reduce(const Tensor& t, ReduceOp op) {
  check_collective_dtype(t, "all_reduce");
  check(op == ReduceOp::sum || op == ReduceOp::average, "all_reduce: tensors are reduced by sum or average only");
}

void SingleProcessCommunicator::broadcast(const Tensor& t, int root) {
  check_collective_dtype(t, "broadcast");
  check(root == 0, "broadcast: root {} is not a rank of a world of size 1", root);
}

void SingleProcessCommunicator::reduce_scatter(const Tensor& t) { collective_segment(t, 1, "reduce_scatter"); }

void SingleProcessCommunicator::all_gather(const Tensor& t) { collective_segment(t, 1, "all_gather"); }

void SingleProcessCommunicator::reduce_async(const Tensor& t, int root) {
  check_collective_dtype(t, "reduce_async");
  check(root == 0, "reduce_async: root {} is not a rank of a world of size 1", root);
}

double SingleProcessCommunicator::all_reduce_scalar(double value, ReduceOp) { return value; }

void SingleProcessCommunicator::abort(int code) { std::exit(code); }

Communicator& single_process_communicator() {
  static SingleProcessCommunicator comm;
  return comm;
}

std::unique_ptr<Communicator> make_communicator(const std::string& backend) {
  const LaunchEnv env = detect_launch_env();
  if (env.world_size == 1) return std::make_unique<SingleProcessCommunicator>();
  const bool cuda = backend == "cuda" || (backend == "auto" && cuda_device_count() > 0);
  if (cuda) {
#ifdef LLMT_HAVE_NCCL
    return std::make_unique<NcclCommunicator>();
#else
    throw Error(fmt::format("launched as rank {} of {} ({}) on the cuda backend, but this build has no NCCL "
                            "(install NCCL and MPI and rebuild; see docs/DISTRIBUTED.md)",
                            env.rank, env.world_size, env.source));
#endif
  }
  check(backend == "cpu" || backend == "auto", "unknown backend \"{}\"; allowed: auto, cpu, cuda", backend);
#ifdef LLMT_HAVE_MPI
  return std::make_unique<MpiCommunicator>();
#else
  throw Error(fmt::format("launched as rank {} of {} ({}), but this build has no MPI (install libopenmpi-dev and "
                          "rebuild; see docs/DISTRIBUTED.md)",
                          env.rank, env.world_size, env.source));
#endif
}

}  // namespace llmt
