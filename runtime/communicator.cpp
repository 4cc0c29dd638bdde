#include "runtime/communicator.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <utility>

#include "runtime/error.hpp"

namespace actbench {

const char* comm_mode_name(CommMode m) {
  switch (m) {
    case CommMode::none: return "none";
    case CommMode::mpi: return "mpi";
    case CommMode::nccl: return "nccl";
    case CommMode::modeled: return "modeled";
  }
  return "?";
}

PendingExchange::PendingExchange(Tensor send, Tensor recv, std::function<void()> finish)
    : send_(std::move(send)), recv_(std::move(recv)), finish_(std::move(finish)) {}

PendingExchange::~PendingExchange() {
  // An exchange still in flight may read or write both tensors: complete it before they go.
  if (!finish_) return;
  try {
    finish_();
  } catch (...) {  // it also runs while an exception unwinds, so it must not throw
  }
}

PendingExchange::PendingExchange(PendingExchange&& other) noexcept
    : send_(std::move(other.send_)), recv_(std::move(other.recv_)), finish_(std::exchange(other.finish_, nullptr)) {}

PendingExchange& PendingExchange::operator=(PendingExchange&& other) noexcept {
  if (this != &other) {
    PendingExchange old(std::move(*this));  // completes what this held
    send_ = std::move(other.send_);
    recv_ = std::move(other.recv_);
    finish_ = std::exchange(other.finish_, nullptr);
  }
  return *this;
}

Tensor PendingExchange::wait() {
  if (finish_) std::exchange(finish_, nullptr)();
  send_ = Tensor();
  return std::move(recv_);
}

PendingExchange Communicator::start_send_recv(const Tensor& send, int dst, const Tensor& recv, int src) {
  send_recv(send, dst, recv, src);
  return PendingExchange(Tensor(), recv, nullptr);
}

// Ring algorithm bytes per rank: all-gather / reduce-scatter / all-to-all (n-1)/n * S,
// all-reduce 2(n-1)/n * S; a send-receive sends its tensor once (nothing to itself).
void Communicator::count_all_reduce(const Tensor& t) {
  int n = size();
  stats_.all_reduce_calls++;
  stats_.ring_bytes += 2.0 * (n - 1) / n * static_cast<double>(t.bytes());
}
void Communicator::count_all_gather(const Tensor& out) {
  int n = size();
  stats_.all_gather_calls++;
  stats_.ring_bytes += static_cast<double>(n - 1) / n * static_cast<double>(out.bytes());
}
void Communicator::count_reduce_scatter(const Tensor& in) {
  int n = size();
  stats_.reduce_scatter_calls++;
  stats_.ring_bytes += static_cast<double>(n - 1) / n * static_cast<double>(in.bytes());
}

void Communicator::count_send_recv(const Tensor& send, int dst) {
  stats_.send_recv_calls++;
  if (dst != rank()) stats_.ring_bytes += static_cast<double>(send.bytes());
}
void Communicator::count_all_to_all(const Tensor& in) {
  int n = size();
  stats_.all_to_all_calls++;
  stats_.ring_bytes += static_cast<double>(n - 1) / n * static_cast<double>(in.bytes());
}

void Communicator::count_all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows) {
  stats_.all_to_all_v_calls++;
  const int64_t rows = std::accumulate(send_rows.begin(), send_rows.end(), int64_t{0}) -
                       send_rows[static_cast<size_t>(rank())];
  stats_.ring_bytes += static_cast<double>(rows * row_numel(in)) * static_cast<double>(dtype_size(in.dtype()));
}

std::vector<int64_t> Communicator::row_offsets(const std::vector<int64_t>& rows) {
  std::vector<int64_t> offsets(rows.size() + 1, 0);
  std::partial_sum(rows.begin(), rows.end(), offsets.begin() + 1);
  return offsets;
}

int64_t Communicator::row_numel(const Tensor& t) {
  int64_t n = 1;
  for (int i = 1; i < t.ndim(); ++i) n *= t.dim(i);
  return n;
}

void Communicator::check_gather_shapes(const Tensor& small, const Tensor& big, int n, const char* op) {
  bool ok = small.ndim() >= 1 && small.ndim() == big.ndim() && big.dim(0) == n * small.dim(0) &&
            small.dtype() == big.dtype();
  for (int i = 1; ok && i < small.ndim(); ++i) ok = small.dim(i) == big.dim(i);
  if (!ok)
    throw InvalidArgument(std::string(op) + ": shapes " + shape_str(small.shape()) + " and " + shape_str(big.shape()) +
                          " do not differ by a factor " + std::to_string(n) + " in dim 0");
}

namespace {

std::string describe(const Tensor& t) { return shape_str(t.shape()) + " " + dtype_name(t.dtype()); }

// Whether two tensors' bytes overlap: a real transfer (MPI, NCCL) reads its input while the
// peers' data arrives, so input and output must be apart on every communicator alike.
bool overlap(const Tensor& a, const Tensor& b) {
  if (a.is_meta() || b.is_meta() || !a.bytes() || !b.bytes()) return false;
  const auto* pa = static_cast<const char*>(a.data());
  const auto* pb = static_cast<const char*>(b.data());
  return pa < pb + b.bytes() && pb < pa + a.bytes();
}

}  // namespace

void Communicator::check_send_recv(const Tensor& send, int dst, const Tensor& recv, int src) const {
  const int n = size(), me = rank();
  for (const auto& [what, peer] : {std::pair{"dst", dst}, std::pair{"src", src}})
    if (peer < 0 || peer >= n)
      throw InvalidArgument(std::string("send_recv: ") + what + " " + std::to_string(peer) +
                            " is not a rank of this group of " + std::to_string(n));
  if (!send.defined() || !recv.defined() || send.numel() != recv.numel() || send.dtype() != recv.dtype())
    throw InvalidArgument("send_recv: send " + describe(send) + " and recv " + describe(recv) +
                          " differ in element count or dtype");
  if ((dst == me) != (src == me))
    throw InvalidArgument("send_recv: rank " + std::to_string(me) + " sends to " + std::to_string(dst) +
                          " but receives from " + std::to_string(src) +
                          " (a rank that sends to itself must also receive from itself)");
  if (overlap(send, recv)) throw InvalidArgument("send_recv: send and recv share memory (use two buffers)");
}

void Communicator::check_all_to_all(const Tensor& in, const Tensor& out) const {
  if (!in.defined() || !out.defined() || in.ndim() < 1 || in.shape() != out.shape() || in.dtype() != out.dtype())
    throw InvalidArgument("all_to_all: in " + describe(in) + " and out " + describe(out) +
                          " differ in shape or dtype (or have no dim 0)");
  if (in.dim(0) % size() != 0)
    throw InvalidArgument("all_to_all: dim 0 of " + shape_str(in.shape()) + " is not divisible by the group size " +
                          std::to_string(size()));
  if (overlap(in, out)) throw InvalidArgument("all_to_all: in and out share memory (use two buffers)");
}

namespace {

std::string counts_str(const std::vector<int64_t>& rows) {
  std::string s = "{";
  for (size_t i = 0; i < rows.size(); ++i) s += (i ? ", " : "") + std::to_string(rows[i]);
  return s + "}";
}

// Empty when the counts fit a tensor of `rows` rows, else why not.
std::string misfit(const std::vector<int64_t>& counts, int64_t rows, const char* what, const char* tensor) {
  const std::string named = std::string(what) + " rows " + counts_str(counts);
  if (std::any_of(counts.begin(), counts.end(), [](int64_t r) { return r < 0; }))
    return named + " include a negative count";
  const int64_t sum = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  if (sum <= rows) return "";
  return named + " sum to " + std::to_string(sum) + ", more than " + tensor + "'s " + std::to_string(rows);
}

}  // namespace

void Communicator::check_all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows, const Tensor& out,
                                      const std::vector<int64_t>& recv_rows) const {
  const int n = size(), me = rank();
  const std::string op = "all_to_all_v: ";
  if (send_rows.size() != static_cast<size_t>(n) || recv_rows.size() != static_cast<size_t>(n))
    throw InvalidArgument(op + std::to_string(send_rows.size()) + " send and " + std::to_string(recv_rows.size()) +
                          " receive counts for a group of " + std::to_string(n) + " (one per rank)");
  bool rows_alike = in.defined() && out.defined() && in.ndim() >= 1 && in.ndim() == out.ndim() &&
                    in.dtype() == out.dtype();
  for (int i = 1; rows_alike && i < in.ndim(); ++i) rows_alike = in.dim(i) == out.dim(i);
  if (!rows_alike)
    throw InvalidArgument(op + "in " + describe(in) + " and out " + describe(out) +
                          " differ in row shape or dtype (or have no dim 0)");
  for (const std::string& why :
       {misfit(send_rows, in.dim(0), "send", "in"), misfit(recv_rows, out.dim(0), "receive", "out")})
    if (!why.empty()) throw InvalidArgument(op + why);
  const auto self = static_cast<size_t>(me);
  if (send_rows[self] != recv_rows[self])
    throw InvalidArgument(op + "rank " + std::to_string(me) + " sends itself " + std::to_string(send_rows[self]) +
                          " rows but receives " + std::to_string(recv_rows[self]) + " from itself");
  if (overlap(in, out)) throw InvalidArgument(op + "in and out share memory (use two buffers)");
}

namespace {

// These communicators copy with memcpy: host (or meta) tensors only. Device tensors go
// through the backend's communicators (kernels/backend_comm.hpp), which copy on the stream.
void require_host(const Tensor& t, const char* op) {
  if (t.defined() && t.device() == Device::cuda)
    throw InvalidArgument(std::string(op) + ": a device tensor needs the backend's communicator "
                          "(make_backend_local_communicator / make_backend_emulated_communicator)");
}

void require_host(const Tensor& a, const Tensor& b, const char* op) {
  require_host(a, op);
  require_host(b, op);
}

// src's bytes into dst (same byte size; checked by the caller): nothing for meta tensors.
void host_copy(const Tensor& src, const Tensor& dst) {
  if (!src.is_meta() && src.bytes() && src.data() != dst.data()) std::memcpy(dst.data(), src.data(), src.bytes());
}

void host_copy_rows(const Tensor& src, int64_t src_row, const Tensor& dst, int64_t dst_row, int64_t rows) {
  if (rows > 0) host_copy(src.rows(src_row, src_row + rows), dst.rows(dst_row, dst_row + rows));
}

// The local and emulated communicators: a process alone, whose exchanges with its peers are
// copies. Local (one rank) sends only to itself; emulated stands for rank 0 of n ranks that
// all hold the same data, so what its peers send it equals what it sends them.
class HostCopyCommunicator : public Communicator {
 public:
  void send_recv(const Tensor& send, int dst, const Tensor& recv, int src) final {
    check_send_recv(send, dst, recv, src);
    require_host(send, recv, "send_recv");
    count_send_recv(send, dst);
    host_copy(send, recv);
  }
  void all_to_all(const Tensor& in, const Tensor& out) final {
    check_all_to_all(in, out);
    require_host(in, out, "all_to_all");
    count_all_to_all(in);
    host_copy(in, out);
  }
  // Every peer holds this rank's data, so each sends it what it sends itself: its own block
  // lands in every received block (as much of it as the receive count takes).
  void all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows, const Tensor& out,
                    const std::vector<int64_t>& recv_rows) final {
    check_all_to_all_v(in, send_rows, out, recv_rows);
    require_host(in, out, "all_to_all_v");
    count_all_to_all_v(in, send_rows);
    const auto me = static_cast<size_t>(rank());
    const int64_t own = row_offsets(send_rows)[me];
    const std::vector<int64_t> at = row_offsets(recv_rows);
    for (size_t j = 0; j < recv_rows.size(); ++j)
      host_copy_rows(in, own, out, at[j], std::min(recv_rows[j], send_rows[me]));
  }
};

class LocalCommunicator final : public HostCopyCommunicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  CommMode mode() const override { return CommMode::none; }
  void all_reduce(Tensor&) override {}
  void all_gather(const Tensor& in, Tensor& out) override { copy_rows(in, out, "all_gather"); }
  void reduce_scatter(const Tensor& in, Tensor& out) override { copy_rows(in, out, "reduce_scatter"); }
  void barrier() override {}
  void max_inplace(std::vector<double>&) override {}
  std::vector<float> gather_host(const std::vector<float>& local) override { return local; }

 private:
  static void copy_rows(const Tensor& in, Tensor& out, const char* op) {
    check_gather_shapes(in, out, 1, op);
    require_host(in, out, op);
    host_copy(in, out);
  }
};

// Rank 0 of `n` ranks, alone. The data it produces is what rank 0 would hold if every
// rank held rank 0's values: all-gather replicates the local shard, reduce-scatter keeps
// rank 0's rows unreduced, all-reduce leaves the partial sum, send-receive and all-to-all
// copy their input to their output (every peer sent the same), all-to-all-v copies rank 0's
// own block into every block it receives. Shapes and bytes are exact;
// values are not the real layer's (emulation measures time and memory, not numerics).
class EmulatedCommunicator final : public HostCopyCommunicator {
 public:
  explicit EmulatedCommunicator(int n) : n_(n) {
    if (n < 1) throw InvalidArgument("emulated communicator needs a size >= 1");
  }
  int rank() const override { return 0; }
  int size() const override { return n_; }
  CommMode mode() const override { return CommMode::modeled; }
  void all_reduce(Tensor& t) override { count_all_reduce(t); }
  void all_gather(const Tensor& in, Tensor& out) override {
    check_gather_shapes(in, out, n_, "all_gather");
    require_host(in, "all_gather");
    require_host(out, "all_gather");
    count_all_gather(out);
    if (in.is_meta() || !in.bytes()) return;
    for (int r = 0; r < n_; ++r) std::memcpy(static_cast<char*>(out.data()) + r * in.bytes(), in.data(), in.bytes());
  }
  void reduce_scatter(const Tensor& in, Tensor& out) override {
    check_gather_shapes(out, in, n_, "reduce_scatter");
    require_host(in, "reduce_scatter");
    require_host(out, "reduce_scatter");
    count_reduce_scatter(in);
    if (in.is_meta() || !out.bytes()) return;
    std::memcpy(out.data(), in.data(), out.bytes());
  }
  void barrier() override {}
  void max_inplace(std::vector<double>&) override {}
  std::vector<float> gather_host(const std::vector<float>& local) override {
    std::vector<float> all;
    for (int r = 0; r < n_; ++r) all.insert(all.end(), local.begin(), local.end());
    return all;
  }

 private:
  int n_;
};

}  // namespace

std::unique_ptr<Communicator> make_local_communicator() { return std::make_unique<LocalCommunicator>(); }
std::unique_ptr<Communicator> make_emulated_communicator(int size) { return std::make_unique<EmulatedCommunicator>(size); }

}  // namespace actbench
