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

ncclDataType_t nccl_type(const Tensor& t) { return t.dtype == DType::f32 ? ncclFloat32 : ncclFloat64; }

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
  check_cuda(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  check_cuda(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
}

NcclCommunicator::~NcclCommunicator() {
  if (done_) cudaEventDestroy(done_);
  if (ready_) cudaEventDestroy(ready_);
  if (stream_) cudaStreamDestroy(stream_);
  if (comm_) ncclCommDestroy(comm_);
}

void NcclCommunicator::all_reduce(const Tensor& t, ReduceOp op) {
  check_collective_dtype(t, "all_reduce");
  check(op == ReduceOp::sum || op == ReduceOp::average, "all_reduce: tensors are reduced by sum or average only");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  check_nccl(ncclAllReduce(t.data, t.data, static_cast<size_t>(t.numel()),
                           nccl_type(t), op == ReduceOp::sum ? ncclSum : ncclAvg,
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
                           nccl_type(t), root, comm_, stream_),
             "ncclBroadcast");
  check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

void NcclCommunicator::reduce_scatter(const Tensor& t) {
  const int64_t c = collective_segment(t, world_size(), "reduce_scatter");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  // In place: NCCL's in-place form has recvbuff = sendbuff + rank * recvcount.
  const Tensor own = t.range(rank() * c, (rank() + 1) * c);
  check_nccl(ncclReduceScatter(t.data, own.data, static_cast<size_t>(c), nccl_type(t), ncclSum, comm_, stream_),
             "ncclReduceScatter");
  check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

void NcclCommunicator::all_gather(const Tensor& t) {
  const int64_t c = collective_segment(t, world_size(), "all_gather");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  // In place: sendbuff = recvbuff + rank * sendcount.
  const Tensor own = t.range(rank() * c, (rank() + 1) * c);
  check_nccl(ncclAllGather(own.data, t.data, static_cast<size_t>(c), nccl_type(t), comm_, stream_),
             "ncclAllGather");
  check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

void NcclCommunicator::begin_async() {
  if (!compute_) {
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    return;
  }
  // The communication stream starts once the compute stream's work queued so far (the kernels
  // that wrote this bucket's gradients) is done; the compute stream runs on meanwhile.
  check_cuda(cudaEventRecord(ready_, compute_), "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(stream_, ready_, 0), "cudaStreamWaitEvent");
}

void NcclCommunicator::end_async() {
  if (compute_) {
    pending_ = true;
  } else {
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");  // no compute stream: synchronous
  }
}

void NcclCommunicator::all_reduce_async(const Tensor& t) {
  check_collective_dtype(t, "all_reduce_async");
  begin_async();
  check_nccl(ncclAllReduce(t.data, t.data, static_cast<size_t>(t.numel()), nccl_type(t), ncclSum, comm_, stream_),
             "ncclAllReduce");
  end_async();
}

void NcclCommunicator::reduce_async(const Tensor& t, int root) {
  check_collective_dtype(t, "reduce_async");
  check(root >= 0 && root < world_size(), "reduce_async: root {} is not a rank of a world of size {}", root,
        world_size());
  begin_async();
  check_nccl(ncclReduce(t.data, t.data, static_cast<size_t>(t.numel()), nccl_type(t), ncclSum, root, comm_, stream_),
             "ncclReduce");
  end_async();
}

void NcclCommunicator::wait_all() {
  if (!pending_) return;
  check_cuda(cudaEventRecord(done_, stream_), "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(compute_, done_, 0), "cudaStreamWaitEvent");
  pending_ = false;
}

void NcclCommunicator::set_compute_stream(void* stream) {
  wait_all();
  compute_ = static_cast<cudaStream_t>(stream);
}

void NcclCommunicator::abort(int code) {
  if (comm_) ncclCommAbort(comm_);
  comm_ = nullptr;
  host_->abort(code);
  std::exit(code);  // not reached (a virtual call does not carry [[noreturn]] for the compiler)
}

}  // namespace llmt
