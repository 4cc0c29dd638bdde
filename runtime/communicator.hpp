#pragma once
// Group collectives (a tensor- or context-parallel group). Along dim 0 for gather/scatter,
// sum for reductions.
//   local     one rank, collectives are identities
//   mpi       real processes under mpirun; 16-bit data reduced in fp32
//   emulated  one process plays rank 0 of t: shapes and bytes exact, data copied locally
// Every implementation counts the bytes each rank would put on a ring (all-gather and
// reduce-scatter (n-1)/n * S, all-reduce 2(n-1)/n * S, all-to-all (n-1)/n * S, S the whole
// tensor; a send-receive and an all-to-all-v the bytes sent to other ranks), which is what the
// modeled communication time is computed from.
// Tensors on the meta device carry no data: only the byte counts change.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/tensor.hpp"

namespace actbench {

enum class CommMode : uint8_t { none, mpi, nccl, modeled };
const char* comm_mode_name(CommMode m);

// A send-receive started by Communicator::start_send_recv. It holds both tensors until wait()
// (so that neither's memory is handed out again while the exchange may still touch it), and is
// completed by wait() or, at the latest, by its destructor.
class PendingExchange {
 public:
  PendingExchange() = default;
  // `finish` completes the exchange (empty: it has completed already).
  PendingExchange(Tensor send, Tensor recv, std::function<void()> finish);
  ~PendingExchange();
  PendingExchange(PendingExchange&& other) noexcept;
  PendingExchange& operator=(PendingExchange&& other) noexcept;
  PendingExchange(const PendingExchange&) = delete;
  PendingExchange& operator=(const PendingExchange&) = delete;

  // Completes the exchange, releases the send tensor and returns the received one: on the
  // host its data is there; on cuda, for the work enqueued on the backend's stream from now.
  Tensor wait();
  bool pending() const { return static_cast<bool>(finish_); }

 private:
  Tensor send_, recv_;
  std::function<void()> finish_;
};

struct CommStats {
  int64_t all_reduce_calls = 0, all_gather_calls = 0, reduce_scatter_calls = 0;
  int64_t send_recv_calls = 0, all_to_all_calls = 0, all_to_all_v_calls = 0;
  double ring_bytes = 0;  // bytes sent per rank, ring algorithm
  void reset() { *this = CommStats{}; }
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual CommMode mode() const = 0;

  // In-place sum over the group.
  virtual void all_reduce(Tensor& t) = 0;
  // out.dim(0) == size() * in.dim(0); rank r's rows land at [r*n, (r+1)*n).
  virtual void all_gather(const Tensor& in, Tensor& out) = 0;
  // in.dim(0) == size() * out.dim(0); out = sum over ranks of rows [rank*n, (rank+1)*n).
  virtual void reduce_scatter(const Tensor& in, Tensor& out) = 0;
  // A ring step: sends `send` to group rank dst and receives `recv` (same numel and dtype) from
  // group rank src, both at once, so every rank may call it together without deadlock.
  virtual void send_recv(const Tensor& send, int dst, const Tensor& recv, int src) = 0;
  // The same exchange, started: counted and checked as send_recv, completed by the handle's
  // wait(). Until then the caller must not write `send` nor read `recv`; it may compute on
  // anything else meanwhile. Several may be in flight; every rank starts them in the same
  // order. MPI posts non-blocking messages; NCCL enqueues them on a stream of its own, after
  // the work already enqueued on the backend's stream (see comm_nccl.hpp). By default (local,
  // emulated) it is send_recv at start and wait() does nothing.
  virtual PendingExchange start_send_recv(const Tensor& send, int dst, const Tensor& recv, int src);
  // in and out [size()*n, ...] (same shape/dtype): rows [j*n, (j+1)*n) of in go to rank j and
  // land at rows [rank()*n, (rank()+1)*n) of its out.
  virtual void all_to_all(const Tensor& in, const Tensor& out) = 0;
  // The uneven all-to-all (MPI_Alltoallv), in rows along dim 0 (in and out alike past dim 0,
  // same dtype): in's first send_rows[0] rows go to rank 0, the next send_rows[1] to rank 1,
  // ...; out receives recv_rows[j] rows from rank j, rank 0's first, from row 0 on. Rows past
  // the sums are neither sent nor written. Both counts have one entry per rank, and every
  // rank's send_rows[j] must equal rank j's recv_rows[rank()]: no rank can check that alone,
  // and a mismatch may hang the group (MPI) or is undefined (NCCL), so derive both from the
  // same shared counts (as the MoE exchange does). Zero counts are fine: nothing travels.
  virtual void all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows, const Tensor& out,
                            const std::vector<int64_t>& recv_rows) = 0;
  virtual void barrier() = 0;

  // Host-side helpers for metadata (timings, status, dumps); not counted in CommStats.
  virtual void max_inplace(std::vector<double>& v) = 0;
  // Concatenation of every rank's vector (all the same length), in rank order.
  virtual std::vector<float> gather_host(const std::vector<float>& local) = 0;

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_.reset(); }

  // Emulated collectives are local copies standing in for the real ones; their time is kept
  // apart from the layer's (comm_ms_emulated) so that fwd/bwd compare like with like across
  // configurations. open_emulated_window() starts a new window (the previous one closes);
  // take_emulated_ms() waits for the copies, returns the milliseconds they took per window
  // since the first open, and closes all. Communicators that copy nothing return {}.
  virtual void open_emulated_window() {}
  virtual std::vector<double> take_emulated_ms() { return {}; }

 protected:
  void count_all_reduce(const Tensor& t);
  void count_all_gather(const Tensor& out);
  void count_reduce_scatter(const Tensor& in);
  // The bytes of `send`, none when dst is this rank (a self exchange is a local copy).
  void count_send_recv(const Tensor& send, int dst);
  void count_all_to_all(const Tensor& in);
  // The bytes of the rows sent to other ranks (not those to itself).
  void count_all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows);
  static void check_gather_shapes(const Tensor& small, const Tensor& big, int n, const char* op);
  // Throw InvalidArgument (one line) unless the arguments fit this group (see send_recv and
  // all_to_all above); a self exchange must be one both ways (dst is this rank iff src is),
  // and input and output must not share memory.
  void check_send_recv(const Tensor& send, int dst, const Tensor& recv, int src) const;
  void check_all_to_all(const Tensor& in, const Tensor& out) const;
  // As all_to_all_v above asks, and this rank sends itself what it receives from itself.
  void check_all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows, const Tensor& out,
                          const std::vector<int64_t>& recv_rows) const;
  // The first row of each rank's block: the prefix sums of `rows` (one more entry, the total).
  static std::vector<int64_t> row_offsets(const std::vector<int64_t>& rows);
  // Elements in one row along dim 0 (the product of the other dims).
  static int64_t row_numel(const Tensor& t);
  CommStats stats_;
};

std::unique_ptr<Communicator> make_local_communicator();
// Plays rank 0 of `size` ranks without other processes.
std::unique_ptr<Communicator> make_emulated_communicator(int size);

// MPI: only available when built with MPI. mpi_launched() tells whether this process was
// started by mpirun (so that a plain run never initialises MPI).
bool mpi_available();
bool mpi_launched();
// Initialises MPI (idempotent); the communicator spans MPI_COMM_WORLD.
std::unique_ptr<Communicator> make_mpi_communicator();
// Initialises MPI (idempotent); the communicator spans the world ranks that pass the same
// `color`, ranked by `key` (MPI_Comm_split of MPI_COMM_WORLD: every world rank calls it
// together).
std::unique_ptr<Communicator> make_mpi_split_communicator(int color, int key);
void mpi_finalize_if_initialized();
// A rank that fails alone would leave the others waiting in a collective forever: abort all.
void mpi_abort_if_initialized(int code);

// Verdicts among all MPI ranks (is every check passed? were all given the same arguments?).
// They travel on a communicator of their own, duplicated when MPI starts, so an agreement
// never matches a data collective: a rank that fails mid-run can offer its verdict while a
// peer sits in an all-reduce. Every rank offers kAgreeSlots values and gets the element-wise
// max. timeout_s < 0 waits for every rank; otherwise returns false when not every rank has
// joined by then (a peer is stuck elsewhere; the caller then aborts). Without MPI (or before
// make_mpi_communicator) the values come back as they are.
constexpr int kAgreeSlots = 64;
bool mpi_agree_max(int64_t* values, double timeout_s = -1);
int mpi_world_size_from_env();
// This process's rank as the launcher tells it, before MPI_Init (0 when not launched by one):
// the GPU of a rank is chosen before MPI_Init, as CUDA-aware MPI and NCCL expect.
int mpi_world_rank_from_env();

}  // namespace actbench
