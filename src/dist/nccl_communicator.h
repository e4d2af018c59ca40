// The NCCL communicator (CUDA backend; issue 8): tensor collectives on device memory with NCCL,
// scalars and barriers over MPI. Bootstrap: MPI gives rank, world size and local rank; the local
// rank selects the GPU (cudaSetDevice(local_rank % device count)); rank 0's ncclUniqueId is
// broadcast with MPI. A process started without a launcher (launch_env.h: world size 1) uses
// NCCL alone, without initialising MPI. Built when CMake finds CUDA and NCCL; several ranks also
// need MPI in the build (without it, a launch of several ranks is refused with a message).
//
// Collectives run on the communicator's own stream. all_reduce, broadcast, reduce_scatter and
// all_gather are synchronous: the device is synchronised before (so the gradients of every kernel
// already queued are complete) and the stream after. all_reduce_async and reduce_async (the
// gradient buckets overlapped with backward) record an event on the compute stream, make the
// communication stream wait for it and queue ncclAllReduce / ncclReduce there, without blocking
// the host; wait_all makes the compute stream wait for the communication stream.
#pragma once
#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>

#include "dist/communicator.h"

namespace llmt {

class MpiCommunicator;

class NcclCommunicator final : public Communicator {
 public:
  /// Initialises MPI (when launched with several ranks), selects this node's GPU
  /// local_rank % device count, and
  /// creates the NCCL communicator over all ranks. Throws llmt::Error (with NCCL's or CUDA's
  /// message) when there is no GPU or NCCL cannot initialise.
  NcclCommunicator();
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  std::string name() const override { return "nccl"; }
  int rank() const override { return host_->rank(); }
  int world_size() const override { return host_->world_size(); }
  int local_rank() const override { return host_->local_rank(); }
  /// The CUDA device this rank uses.
  int device() const { return device_; }
  void all_reduce(const Tensor& t, ReduceOp op) override;
  void broadcast(const Tensor& t, int root) override;
  void reduce_scatter(const Tensor& t) override;
  void all_gather(const Tensor& t) override;
  void all_reduce_async(const Tensor& t) override;
  void reduce_async(const Tensor& t, int root) override;
  void wait_all() override;
  /// Orders the previous compute stream after pending collectives (wait_all) first.
  void set_compute_stream(void* stream) override;
  double all_reduce_scalar(double value, ReduceOp op) override { return host_->all_reduce_scalar(value, op); }
  void barrier() override { host_->barrier(); }
  [[noreturn]] void abort(int code) override;

 private:
  /// Before an asynchronous collective: the communication stream waits for the work queued on
  /// the compute stream (without a compute stream: the device is synchronised).
  void begin_async();
  /// After queueing it: pending until wait_all (without a compute stream: the stream is synchronised).
  void end_async();
  std::unique_ptr<Communicator> host_;  // MpiCommunicator, or SingleProcessCommunicator at world size 1
  MpiCommunicator* mpi_ = nullptr;      // host_ when it is MPI
  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;   // communication stream
  cudaStream_t compute_ = nullptr;  // the backend's stream (set_compute_stream)
  cudaEvent_t ready_ = nullptr;     // compute work queued before an all_reduce_async
  cudaEvent_t done_ = nullptr;      // communication queued before wait_all
  bool pending_ = false;            // an asynchronous collective since the last wait_all
};

}  // namespace llmt
