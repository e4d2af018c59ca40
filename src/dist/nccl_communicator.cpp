#include "dist/nccl_communicator.h"

#include <cstdlib>

#include "core/error.h"
#include "dist/launch_env.h"
#ifdef LLMT_HAVE_MPI
#include "dist/mpi_communicator.h"
#endif

namespace llmt {

namespace {

void check_nccl(ncclResult_t rc, const char* call) {
  check(rc == ncclSuccess, "{} failed: {}", call, ncclGetErrorString(rc));
}

void check_cuda(cudaError_t rc, const char* call) {
  check(rc == cudaSuccess, "{} failed: {}", call, cudaGetErrorString(rc));
}

}  // namespace

NcclCommunicator::NcclCommunicator() {
  const LaunchEnv env = detect_launch_env();
  if (env.world_size > 1) {
#ifdef LLMT_HAVE_MPI
    auto mpi = std::make_unique<MpiCommunicator>();
    mpi_ = mpi.get();
    host_ = std::move(mpi);
#else
    throw Error(fmt::format("launched as rank {} of {} ({}): NCCL needs MPI to share its unique id, and this build "
                            "has no MPI (install libopenmpi-dev and rebuild; see docs/DISTRIBUTED.md)",
                            env.rank, env.world_size, env.source));
#endif
  } else {
    host_ = std::make_unique<SingleProcessCommunicator>();
  }
  int devices = 0;
  check_cuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  check(devices > 0, "NCCL communicator: rank {} sees no CUDA device", rank());
  device_ = local_rank() % devices;
  check_cuda(cudaSetDevice(device_), "cudaSetDevice");
  ncclUniqueId id;
  if (rank() == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
#ifdef LLMT_HAVE_MPI
  if (mpi_) mpi_->broadcast_bytes(&id, sizeof(id), 0);
#endif
  check_nccl(ncclCommInitRank(&comm_, world_size(), id, rank()), "ncclCommInitRank");
  check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
}

NcclCommunicator::~NcclCommunicator() {
  if (stream_) cudaStreamDestroy(stream_);
  if (comm_) ncclCommDestroy(comm_);
}

void NcclCommunicator::all_reduce(const Tensor& t, ReduceOp op) {
  check_collective_dtype(t, "all_reduce");
  check(op == ReduceOp::sum || op == ReduceOp::average, "all_reduce: tensors are reduced by sum or average only");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  check_nccl(ncclAllReduce(t.data, t.data, static_cast<size_t>(t.numel()),
                           t.dtype == DType::f32 ? ncclFloat32 : ncclFloat64, op == ReduceOp::sum ? ncclSum : ncclAvg,
                           comm_, stream_),
             "ncclAllReduce");
  check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

void NcclCommunicator::broadcast(const Tensor& t, int root) {
  check_collective_dtype(t, "broadcast");
  check(root >= 0 && root < world_size(), "broadcast: root {} is not a rank of a world of size {}", root,
        world_size());
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  check_nccl(ncclBroadcast(t.data, t.data, static_cast<size_t>(t.numel()),
                           t.dtype == DType::f32 ? ncclFloat32 : ncclFloat64, root, comm_, stream_),
             "ncclBroadcast");
  check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

void NcclCommunicator::abort(int code) {
  if (comm_) ncclCommAbort(comm_);
  comm_ = nullptr;
  host_->abort(code);
  std::exit(code);  // not reached (a virtual call does not carry [[noreturn]] for the compiler)
}

}  // namespace llmt
