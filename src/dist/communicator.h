// The communicator of data-parallel training (docs/ARCHITECTURE.md "Data parallelism", docs/DISTRIBUTED.md): one
// process per rank, started by an existing launcher (mpirun, srun). The trainer reduces its gradients, agrees on
// scalars (loss, non-finite skip, gradient norm) and synchronises checkpoints through it.
//
// Implementations:
//   SingleProcessCommunicator  world size 1, no dependency: every collective is the identity.
//   MpiCommunicator            CPU backend: MPI_Reduce + MPI_Bcast on host memory
//                              (src/dist/mpi_communicator.h, built when MPI is found).
//   NcclCommunicator           CUDA backend: NCCL on device memory, bootstrapped over MPI
//                              (src/dist/nccl_communicator.h, built with CUDA + NCCL + MPI).
#pragma once
#include <memory>
#include <string>

#include "core/tensor.h"

namespace llmt {

enum class ReduceOp { sum, average, max, min };

class Communicator {
 public:
  virtual ~Communicator() = default;
  /// "single", "mpi" or "nccl".
  virtual std::string name() const = 0;
  /// This process's rank in [0, world_size()).
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  /// The rank among the processes of this node (selects the GPU).
  virtual int local_rank() const = 0;

  /// Reduces a contiguous f32 or f64 tensor element-wise over all ranks, in place (ReduceOp sum or
  /// average). The memory is where the communicator's backend keeps tensors (host for MPI, device
  /// for NCCL). Every rank must call it with the same dtype and element count.
  virtual void all_reduce(const Tensor& t, ReduceOp op) = 0;
  /// Copies rank `root`'s contents of `t` (f32 or f64) into every rank's `t`.
  virtual void broadcast(const Tensor& t, int root) = 0;
  /// ZeRO-1's gradient reduction: `t` (f32 or f64, numel a multiple of the world size W) is cut
  /// into W equal segments of c = numel / W elements; afterwards segment r = [r c, (r+1) c) of
  /// rank r holds the element-wise SUM over all ranks (bitwise the same as all_reduce's sum of
  /// those elements); the other segments are left undefined. In place.
  virtual void reduce_scatter(const Tensor& t) = 0;
  /// The inverse of reduce_scatter: segment r of rank r's `t` (same segmentation) is copied into
  /// segment r of every rank's `t`. In place; a pure copy.
  virtual void all_gather(const Tensor& t) = 0;
  /// all_reduce(t, sum) that may return before the sum is complete (overlap with backward).
  /// The result is ready, for the backend's later work, after wait_all(); `t` must not be touched
  /// before that. Every rank must launch the same sequence. This default runs it synchronously.
  virtual void all_reduce_async(const Tensor& t) { all_reduce(t, ReduceOp::sum); }
  /// The element-wise SUM of `t` (f32 or f64) over all ranks into rank `root`'s `t` (the other
  /// ranks' `t` is left undefined), asynchronous like all_reduce_async (ZeRO-1's buckets: each
  /// piece of a bucket goes to the rank whose shard holds it). Bitwise the same sums as
  /// reduce_scatter for 2 ranks.
  virtual void reduce_async(const Tensor& t, int root) = 0;
  /// Orders all work the backend queues from now on after every asynchronous collective launched
  /// so far (NCCL: the compute stream waits for the communication stream; the host does not wait).
  virtual void wait_all() {}
  /// The stream (a cudaStream_t, as the backend's Backend::native_stream gives it) on which the
  /// backend computes the tensors that are reduced; all_reduce_async orders itself after the
  /// work queued there. nullptr (the default, and on the CPU backend): host-synchronous. The
  /// stream must outlive its use here: set nullptr before destroying it.
  virtual void set_compute_stream(void* stream) { (void)stream; }
  /// The reduction of one host double over all ranks; the same value is returned on every rank.
  virtual double all_reduce_scalar(double value, ReduceOp op) = 0;
  /// Returns once every rank has entered it.
  virtual void barrier() = 0;
  /// Ends the processes of every rank with `code` after a fatal error on this one, so that no
  /// rank waits forever in a collective. Does not return.
  [[noreturn]] virtual void abort(int code) = 0;
};

/// World size 1: rank 0, every collective leaves its argument unchanged.
class SingleProcessCommunicator final : public Communicator {
 public:
  std::string name() const override { return "single"; }
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  int local_rank() const override { return 0; }
  void all_reduce(const Tensor& t, ReduceOp op) override;
  void broadcast(const Tensor& t, int root) override;
  void reduce_scatter(const Tensor& t) override;
  void all_gather(const Tensor& t) override;
  void reduce_async(const Tensor& t, int root) override;
  double all_reduce_scalar(double value, ReduceOp op) override;
  void barrier() override {}
  [[noreturn]] void abort(int code) override;
};

/// A process-wide SingleProcessCommunicator (the default of the trainer and the step runner).
Communicator& single_process_communicator();

/// The communicator for training on `backend` ("cpu", "cuda" or "auto", resolved as make_backend
/// does) in this process's launch environment (launch_env.h): SingleProcessCommunicator when the
/// launcher started one process (or none), otherwise MpiCommunicator for the CPU backend and
/// NcclCommunicator (which also selects the GPU of the local rank) for CUDA. Throws llmt::Error
/// when the launch needs MPI or NCCL and this build has none.
std::unique_ptr<Communicator> make_communicator(const std::string& backend);

/// Throws llmt::Error unless `t` is f32 or f64 (the dtypes the collectives carry).
void check_collective_dtype(const Tensor& t, const char* what);

/// The segment length of reduce_scatter / all_gather on `t` over `world` ranks: t.numel() / world.
/// Throws llmt::Error (naming `what`) for another dtype than f32 / f64 or a numel that `world`
/// does not divide.
int64_t collective_segment(const Tensor& t, int world, const char* what);

}  // namespace llmt
