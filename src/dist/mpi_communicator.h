// The MPI communicator (CPU backend; issue 8): collectives on host memory over MPI_COMM_WORLD;
// tensor sums are bitwise identical on every rank (reduce to rank 0, then broadcast); reduce-scatter
// reduces each segment to its owner, all-gather broadcasts each segment from its owner.
// Rank and world size come from MPI; the local rank from MPI_Comm_split_type(SHARED), i.e. the
// processes of this node. Built when CMake finds MPI (LLMT_MPI).
#pragma once
#include <mpi.h>

#include "dist/communicator.h"

namespace llmt {

class MpiCommunicator final : public Communicator {
 public:
  /// Initialises MPI (thread level FUNNELED) unless the process already did; throws llmt::Error
  /// when MPI cannot be initialised.
  MpiCommunicator();
  /// Finalises MPI when this object initialised it.
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  std::string name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  int local_rank() const override { return local_rank_; }
  void all_reduce(const Tensor& t, ReduceOp op) override;
  void broadcast(const Tensor& t, int root) override;
  void reduce_scatter(const Tensor& t) override;
  void all_gather(const Tensor& t) override;
  /// No asynchronous forms here: all_reduce_async is the synchronous all_reduce and reduce_async
  /// the synchronous MPI_Reduce (the CPU backend computes on the calling thread, so there is
  /// nothing to overlap with).
  void reduce_async(const Tensor& t, int root) override;
  double all_reduce_scalar(double value, ReduceOp op) override;
  void barrier() override;
  [[noreturn]] void abort(int code) override;

  /// Broadcasts `bytes` bytes of host memory from `root` (used by NCCL to share its unique id).
  void broadcast_bytes(void* data, size_t bytes, int root);

 private:
  /// Sums `t` (f32 or f64) over all ranks into rank `root`'s `t` (MPI_Reduce, in pieces of int counts).
  void reduce_to(const Tensor& t, int root);
  bool owns_mpi_ = false;
  int rank_ = 0, world_ = 1, local_rank_ = 0;
};

}  // namespace llmt
