// The NCCL communicator (see comm_nccl.hpp). Device tensors go through NCCL on the given
// stream; host-side metadata (timings, gathered dumps) through MPI.
#include "kernels/cuda/comm_nccl.hpp"

#include <cuda_runtime.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/cuda_check.hpp"
#include "runtime/error.hpp"

#if ACTBENCH_HAVE_NCCL_COMM
#include <nccl.h>
#include "runtime/mpi_check.hpp"
#endif

namespace actbench {

int select_cuda_device_for_rank(int rank) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    throw InvalidArgument("backend 'cuda': no CUDA device is available for rank " + std::to_string(rank));
  }
  int local = rank;
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* v = std::getenv(var)) {
      local = std::atoi(v);
      break;
    }
  const int device = local % count;
  CUDA_CHECK(cudaSetDevice(device));
  return device;
}

#if ACTBENCH_HAVE_NCCL_COMM

bool nccl_available() { return true; }

namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::bf16: return ncclBfloat16;
    case DType::fp16: return ncclFloat16;
    case DType::fp32: return ncclFloat32;
    case DType::u8: return ncclUint8;
    case DType::i32: return ncclInt32;
  }
  throw InvalidArgument("nccl: unknown dtype");
}

// `comm_` for the tensors, `mpi_` (MPI_COMM_WORLD, or a split the communicator owns) for
// the host-side helpers; both hold the same ranks in the same order.
class NcclCommunicator final : public Communicator {
 public:
  // Over the MPI world, initialising MPI if needed.
  explicit NcclCommunicator(cudaStream_t stream) : stream_(stream) {
    int initialized = 0;
    MPI_CHECK(MPI_Initialized(&initialized));
    if (!initialized) MPI_CHECK(MPI_Init(nullptr, nullptr));
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
    ncclUniqueId id{};
    if (rank_ == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_CHECK(MPI_Bcast(&id, static_cast<int>(sizeof id), MPI_BYTE, 0, MPI_COMM_WORLD));
    NCCL_CHECK(ncclCommInitRank(&comm_, size_, id, rank_));  // on the current device
  }
  // The ranks of `parent` with the same color, ranked by key (ties by parent rank, as both
  // NCCL and MPI order them).
  NcclCommunicator(NcclCommunicator& parent, int color, int key) : stream_(parent.stream_) {
    parent.check_async();
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
    MPI_CHECK(MPI_Comm_split(parent.mpi_, color, key, &mpi_));
    owns_mpi_ = true;
    MPI_CHECK(MPI_Comm_rank(mpi_, &rank_));
    MPI_CHECK(MPI_Comm_size(mpi_, &size_));
    NCCL_CHECK(ncclCommSplit(parent.comm_, color, key, &comm_, nullptr));
#else
    (void)color;
    (void)key;
    throw InvalidArgument("this NCCL (" + std::to_string(NCCL_VERSION_CODE) +
                          ") has no ncclCommSplit: tensor- and context-parallel groups need NCCL 2.18 or newer");
#endif
  }
  ~NcclCommunicator() override {
    if (comm_) {
      cudaStreamSynchronize(stream_);
      if (comm_stream_) cudaStreamSynchronize(comm_stream_);
      ncclCommDestroy(comm_);
    }
    if (comm_stream_) {
      cudaEventDestroy(ready_);
      cudaStreamDestroy(comm_stream_);
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns_mpi_ && !finalized) MPI_Comm_free(&mpi_);
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  CommMode mode() const override { return CommMode::nccl; }

  void all_reduce(Tensor& t) override {
    count_all_reduce(t);
    check_async();
    if (t.is_meta() || !t.numel()) return;
    NCCL_CHECK(ncclAllReduce(t.data(), t.data(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()), ncclSum, comm_,
                             stream_));
  }
  void all_gather(const Tensor& in, Tensor& out) override {
    check_gather_shapes(in, out, size_, "all_gather");
    count_all_gather(out);
    check_async();
    if (in.is_meta() || !in.numel()) return;
    // Contiguous along dim 0: rank r's block lands at r * in.numel(), as the contract wants.
    NCCL_CHECK(ncclAllGather(in.data(), out.data(), static_cast<size_t>(in.numel()), nccl_type(in.dtype()), comm_,
                             stream_));
  }
  void reduce_scatter(const Tensor& in, Tensor& out) override {
    check_gather_shapes(out, in, size_, "reduce_scatter");
    count_reduce_scatter(in);
    check_async();
    if (in.is_meta() || !out.numel()) return;
    NCCL_CHECK(ncclReduceScatter(in.data(), out.data(), static_cast<size_t>(out.numel()), nccl_type(in.dtype()),
                                 ncclSum, comm_, stream_));
  }
  // One grouped send and receive on `stream` (both sides of a peer exchange at once, so neither blocks).
  void enqueue_send_recv(const Tensor& send, int dst, const Tensor& recv, int src, cudaStream_t stream) {
    const auto count = static_cast<size_t>(send.numel());
    const ncclDataType_t type = nccl_type(send.dtype());
    NCCL_CHECK(ncclGroupStart());
    NCCL_CHECK(ncclSend(send.data(), count, type, dst, comm_, stream));
    NCCL_CHECK(ncclRecv(recv.data(), count, type, src, comm_, stream));
    NCCL_CHECK(ncclGroupEnd());
  }
  void send_recv(const Tensor& send, int dst, const Tensor& recv, int src) override {
    check_send_recv(send, dst, recv, src);
    count_send_recv(send, dst);
    check_async();
    if (send.is_meta() || !send.numel()) return;
    if (dst == rank_) {
      CUDA_CHECK(cudaMemcpyAsync(recv.data(), send.data(), send.bytes(), cudaMemcpyDeviceToDevice, stream_));
      return;
    }
    enqueue_send_recv(send, dst, recv, src, stream_);
  }
  // On the communicator's own stream, so that the backend's stream computes meanwhile: that
  // stream waits for the work enqueued on the backend's stream so far (which wrote `send`),
  // the exchange follows, and wait() has the backend's stream wait for its done-event (no
  // host synchronisation). The handle keeps both tensors until then: the allocator frees in
  // the backend's stream order, which is after the exchange only once wait() has run.
  PendingExchange start_send_recv(const Tensor& send, int dst, const Tensor& recv, int src) override {
    check_send_recv(send, dst, recv, src);
    if (send.is_meta() || !send.numel() || dst == rank_) return Communicator::start_send_recv(send, dst, recv, src);
    count_send_recv(send, dst);
    check_async();
    cudaStream_t comm_stream = comm_stream_of_this();
    CUDA_CHECK(cudaEventRecord(ready_, stream_));
    CUDA_CHECK(cudaStreamWaitEvent(comm_stream, ready_, 0));
    enqueue_send_recv(send, dst, recv, src, comm_stream);
    cudaEvent_t done = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(done, comm_stream));
    return PendingExchange(send, recv, [this, done] {
      const cudaError_t waited = cudaStreamWaitEvent(stream_, done, 0);
      cudaEventDestroy(done);  // released once the wait has passed it
      CUDA_CHECK(waited);
    });
  }
  void all_to_all(const Tensor& in, const Tensor& out) override {
    check_all_to_all(in, out);
    count_all_to_all(in);
    check_async();
    if (in.is_meta() || !in.numel()) return;
    // Block j (rows [j*n, (j+1)*n)) to and from rank j: contiguous, numel/size elements each.
    const auto count = static_cast<size_t>(in.numel() / size_);
    const size_t block_bytes = in.bytes() / static_cast<size_t>(size_);
    const ncclDataType_t type = nccl_type(in.dtype());
    const auto* from = static_cast<const char*>(in.data());
    auto* to = static_cast<char*>(out.data());
    NCCL_CHECK(ncclGroupStart());
    for (int j = 0; j < size_; ++j) {
      NCCL_CHECK(ncclSend(from + j * block_bytes, count, type, j, comm_, stream_));
      NCCL_CHECK(ncclRecv(to + j * block_bytes, count, type, j, comm_, stream_));
    }
    NCCL_CHECK(ncclGroupEnd());
  }
  // One grouped send and receive per peer, as all_to_all's, at the prefix-sum offsets; a peer
  // with nothing to send or receive gets no call (NCCL would accept a zero count, but it is
  // no message).
  void all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows, const Tensor& out,
                    const std::vector<int64_t>& recv_rows) override {
    check_all_to_all_v(in, send_rows, out, recv_rows);
    count_all_to_all_v(in, send_rows);
    check_async();
    if (in.is_meta()) return;
    const int64_t row = row_numel(in);
    const size_t row_bytes = static_cast<size_t>(row) * dtype_size(in.dtype());
    const std::vector<int64_t> send_at = row_offsets(send_rows), recv_at = row_offsets(recv_rows);
    const ncclDataType_t type = nccl_type(in.dtype());
    const auto* from = static_cast<const char*>(in.data());
    auto* to = static_cast<char*>(out.data());
    NCCL_CHECK(ncclGroupStart());
    for (size_t j = 0; j < send_rows.size(); ++j) {
      const int peer = static_cast<int>(j);
      if (send_rows[j] > 0)
        NCCL_CHECK(ncclSend(from + static_cast<size_t>(send_at[j]) * row_bytes, static_cast<size_t>(send_rows[j] * row),
                            type, peer, comm_, stream_));
      if (recv_rows[j] > 0)
        NCCL_CHECK(ncclRecv(to + static_cast<size_t>(recv_at[j]) * row_bytes, static_cast<size_t>(recv_rows[j] * row),
                            type, peer, comm_, stream_));
    }
    NCCL_CHECK(ncclGroupEnd());
  }
  void barrier() override {
    // The GPU work enqueued so far is part of what every rank waits for. Waiting by polling,
    // with NCCL's asynchronous error checked in between: a peer that failed (or a network
    // error) would otherwise leave this rank blocked in a stream wait forever (NCCL docs,
    // "Fault tolerance": poll ncclCommGetAsyncError, then ncclCommAbort).
    for (cudaStream_t s : {stream_, comm_stream_}) {
      while (s) {
        const cudaError_t q = cudaStreamQuery(s);
        if (q == cudaSuccess) break;
        if (q != cudaErrorNotReady) CUDA_CHECK(q);
        check_async();
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
    check_async();
    MPI_CHECK(MPI_Barrier(mpi_));
  }
  void max_inplace(std::vector<double>& v) override {
    if (v.empty()) return;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_DOUBLE, MPI_MAX, mpi_));
  }
  std::vector<float> gather_host(const std::vector<float>& local) override {
    std::vector<float> all(local.size() * static_cast<size_t>(size_));
    MPI_CHECK(MPI_Allgather(local.data(), static_cast<int>(local.size()), MPI_FLOAT, all.data(),
                            static_cast<int>(local.size()), MPI_FLOAT, mpi_));
    return all;
  }

 private:
  // Throws (after aborting the communicator, so that no rank waits on it) when NCCL reports an
  // asynchronous error; collectives return before their errors are known.
  void check_async() {
    if (!comm_) throw RuntimeFailure("NCCL communicator was aborted after an earlier error");
    ncclResult_t async = ncclSuccess;
    NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
    if (async == ncclSuccess || async == ncclInProgress) return;
    ncclCommAbort(comm_);
    comm_ = nullptr;
    throw_failure(__FILE__, __LINE__, std::string("NCCL asynchronous error: ") + ncclGetErrorString(async));
  }

  // The stream of start_send_recv (created at its first use, as is the event that orders it
  // after the backend's stream): non-blocking, so the legacy default stream never waits on it.
  cudaStream_t comm_stream_of_this() {
    if (!comm_stream_) {
      CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
      CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    }
    return comm_stream_;
  }

  cudaStream_t stream_;
  cudaStream_t comm_stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  ncclComm_t comm_ = nullptr;
  MPI_Comm mpi_ = MPI_COMM_WORLD;
  bool owns_mpi_ = false;
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(cudaStream_t stream) {
  return std::make_unique<NcclCommunicator>(stream);
}

std::unique_ptr<Communicator> split_nccl_communicator(Communicator& world, int color, int key) {
  auto* parent = dynamic_cast<NcclCommunicator*>(&world);
  if (!parent) throw InvalidArgument("split_nccl_communicator: the world communicator is not an NCCL one");
  return std::make_unique<NcclCommunicator>(*parent, color, key);
}

#else

bool nccl_available() { return false; }
std::unique_ptr<Communicator> make_nccl_communicator(cudaStream_t) {
  throw InvalidArgument("this build has no NCCL communicator (it needs CUDA, NCCL and MPI)");
}
std::unique_ptr<Communicator> split_nccl_communicator(Communicator&, int, int) {
  return make_nccl_communicator(nullptr);
}

#endif

}  // namespace actbench
