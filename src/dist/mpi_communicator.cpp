#include "dist/mpi_communicator.h"

#include <algorithm>
#include <climits>
#include <cstdlib>

#include "core/error.h"

namespace llmt {

namespace {

void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(fmt::format("{} failed: {}", call, std::string(text, static_cast<size_t>(len))));
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
    default: return MPI_SUM;  // average = sum, divided afterwards
  }
}

// MPI counts are int: larger tensors go in pieces of at most this many elements.
constexpr int64_t kMaxCount = INT_MAX / 2;

}  // namespace

MpiCommunicator::MpiCommunicator() {
  int initialized = 0;
  check_mpi(MPI_Initialized(&initialized), "MPI_Initialized");
  if (!initialized) {
    int provided = 0;
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    owns_mpi_ = true;
  }
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &world_), "MPI_Comm_size");
  MPI_Comm node;
  check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
            "MPI_Comm_split_type");
  check_mpi(MPI_Comm_rank(node, &local_rank_), "MPI_Comm_rank (node)");
  MPI_Comm_free(&node);
}

MpiCommunicator::~MpiCommunicator() {
  if (owns_mpi_) MPI_Finalize();
}

void MpiCommunicator::reduce_to(const Tensor& t, int root) {
  const MPI_Datatype type = t.dtype == DType::f32 ? MPI_FLOAT : MPI_DOUBLE;
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; i += kMaxCount) {
    const int count = static_cast<int>(std::min(kMaxCount, n - i));
    void* p = static_cast<char*>(t.data) + i * static_cast<int64_t>(dtype_size(t.dtype));
    check_mpi(MPI_Reduce(rank_ == root ? MPI_IN_PLACE : p, rank_ == root ? p : nullptr, count, type, MPI_SUM, root,
                         MPI_COMM_WORLD),
              "MPI_Reduce");
  }
}

void MpiCommunicator::all_reduce(const Tensor& t, ReduceOp op) {
  check_collective_dtype(t, "all_reduce");
  check(op == ReduceOp::sum || op == ReduceOp::average, "all_reduce: tensors are reduced by sum or average only");
  // Not MPI_Allreduce: it may add the ranks' values in a different order on different ranks (e.g.
  // recursive doubling for more than 2 ranks), and the replicas of the weights would drift apart
  // by rounding. A reduction to rank 0 followed by a broadcast gives every rank the same bits.
  reduce_to(t, 0);
  broadcast_bytes(t.data, t.bytes(), 0);
  const int64_t n = t.numel();
  if (op == ReduceOp::average) {
    if (t.dtype == DType::f32) {
      const float s = 1.0f / static_cast<float>(world_);
      for (float* p = t.as<float>(), *e = p + n; p != e; ++p) *p *= s;
    } else {
      const double s = 1.0 / world_;
      for (double* p = t.as<double>(), *e = p + n; p != e; ++p) *p *= s;
    }
  }
}

void MpiCommunicator::reduce_scatter(const Tensor& t) {
  // One MPI_Reduce per segment, rooted at its owner (not MPI_Reduce_scatter_block, whose summation
  // order is the library's choice): with 2 ranks each element is the same single addition as in
  // all_reduce, so ZeRO-1 reproduces the all-reduce path bit for bit.
  const int64_t c = collective_segment(t, world_, "reduce_scatter");
  for (int r = 0; r < world_; ++r) reduce_to(t.range(r * c, (r + 1) * c), r);
}

void MpiCommunicator::reduce_async(const Tensor& t, int root) {
  check_collective_dtype(t, "reduce_async");
  check(root >= 0 && root < world_, "reduce_async: root {} is not a rank of a world of size {}", root, world_);
  reduce_to(t, root);
}

void MpiCommunicator::all_gather(const Tensor& t) {
  const int64_t c = collective_segment(t, world_, "all_gather");
  for (int r = 0; r < world_; ++r) {
    const Tensor s = t.range(r * c, (r + 1) * c);
    broadcast_bytes(s.data, s.bytes(), r);
  }
}

void MpiCommunicator::broadcast(const Tensor& t, int root) {
  check_collective_dtype(t, "broadcast");
  broadcast_bytes(t.data, t.bytes(), root);
}

void MpiCommunicator::broadcast_bytes(void* data, size_t bytes, int root) {
  check(root >= 0 && root < world_, "broadcast: root {} is not a rank of a world of size {}", root, world_);
  for (size_t i = 0; i < bytes; i += static_cast<size_t>(kMaxCount)) {
    const int count = static_cast<int>(std::min(static_cast<size_t>(kMaxCount), bytes - i));
    check_mpi(MPI_Bcast(static_cast<char*>(data) + i, count, MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
  }
}

double MpiCommunicator::all_reduce_scalar(double value, ReduceOp op) {
  double out = 0;
  check_mpi(MPI_Allreduce(&value, &out, 1, MPI_DOUBLE, mpi_op(op), MPI_COMM_WORLD), "MPI_Allreduce");
  return op == ReduceOp::average ? out / world_ : out;
}

void MpiCommunicator::barrier() { check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

void MpiCommunicator::abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);  // MPI_Abort does not return; this satisfies [[noreturn]]
}

}  // namespace llmt
