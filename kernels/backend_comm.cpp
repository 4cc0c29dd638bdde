#include "kernels/backend_comm.hpp"

#include <algorithm>
#include <utility>
#include <vector>

#include "runtime/error.hpp"

namespace actbench {
namespace {

// all_to_all_v of one process whose peers hold its data (local: none; emulated: rank 0 of n),
// as runtime/'s: its own block lands in every received block, as much as each count takes.
void copy_own_block(Backend& be, const Tensor& in, int64_t own_row, int64_t own_rows, const Tensor& out,
                    const std::vector<int64_t>& recv_rows, const std::vector<int64_t>& recv_at) {
  for (size_t j = 0; j < recv_rows.size(); ++j) {
    const int64_t n = std::min(recv_rows[j], own_rows);
    if (n > 0) be.copy(in.rows(own_row, own_row + n), out.rows(recv_at[j], recv_at[j] + n));
  }
}

class BackendLocalCommunicator final : public Communicator {
 public:
  explicit BackendLocalCommunicator(Backend& be) : be_(be) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  CommMode mode() const override { return CommMode::none; }
  void all_reduce(Tensor&) override {}
  void all_gather(const Tensor& in, Tensor& out) override {
    check_gather_shapes(in, out, 1, "all_gather");
    be_.copy(in, out);
  }
  void reduce_scatter(const Tensor& in, Tensor& out) override {
    check_gather_shapes(out, in, 1, "reduce_scatter");
    be_.copy(in, out);
  }
  void send_recv(const Tensor& send, int dst, const Tensor& recv, int src) override {
    check_send_recv(send, dst, recv, src);
    count_send_recv(send, dst);
    be_.copy(send, recv);
  }
  void all_to_all(const Tensor& in, const Tensor& out) override {
    check_all_to_all(in, out);
    count_all_to_all(in);
    be_.copy(in, out);
  }
  void all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows, const Tensor& out,
                    const std::vector<int64_t>& recv_rows) override {
    check_all_to_all_v(in, send_rows, out, recv_rows);
    count_all_to_all_v(in, send_rows);
    copy_own_block(be_, in, 0, send_rows[0], out, recv_rows, row_offsets(recv_rows));
  }
  void barrier() override {}
  void max_inplace(std::vector<double>&) override {}
  std::vector<float> gather_host(const std::vector<float>& local) override { return local; }

 private:
  Backend& be_;
};

// As runtime/'s emulated communicator: all-gather replicates the local shard, reduce-scatter
// keeps rank 0's rows unreduced, all-reduce leaves the partial sum, send-receive and
// all-to-all copy their input to their output, all-to-all-v rank 0's own block into every
// block it receives; bytes counted for n ranks.
class BackendEmulatedCommunicator final : public Communicator {
 public:
  BackendEmulatedCommunicator(Backend& be, int n) : be_(be), n_(n) {
    if (n < 1) throw InvalidArgument("emulated communicator needs a size >= 1");
  }
  int rank() const override { return 0; }
  int size() const override { return n_; }
  CommMode mode() const override { return CommMode::modeled; }
  void all_reduce(Tensor& t) override { count_all_reduce(t); }
  void all_gather(const Tensor& in, Tensor& out) override {
    check_gather_shapes(in, out, n_, "all_gather");
    count_all_gather(out);
    const int64_t rows = in.dim(0);
    Timed timed(*this);
    for (int r = 0; r < n_; ++r) be_.copy(in, out.rows(r * rows, (r + 1) * rows));
  }
  void reduce_scatter(const Tensor& in, Tensor& out) override {
    check_gather_shapes(out, in, n_, "reduce_scatter");
    count_reduce_scatter(in);
    Timed timed(*this);
    be_.copy(in.rows(0, out.dim(0)), out);
  }
  void send_recv(const Tensor& send, int dst, const Tensor& recv, int src) override {
    check_send_recv(send, dst, recv, src);
    count_send_recv(send, dst);
    Timed timed(*this);
    be_.copy(send, recv);
  }
  void all_to_all(const Tensor& in, const Tensor& out) override {
    check_all_to_all(in, out);
    count_all_to_all(in);
    Timed timed(*this);
    be_.copy(in, out);
  }
  void all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows, const Tensor& out,
                    const std::vector<int64_t>& recv_rows) override {
    check_all_to_all_v(in, send_rows, out, recv_rows);
    count_all_to_all_v(in, send_rows);
    Timed timed(*this);
    copy_own_block(be_, in, 0, send_rows[0], out, recv_rows, row_offsets(recv_rows));
  }
  void open_emulated_window() override { windows_.emplace_back(); }
  std::vector<double> take_emulated_ms() override {
    std::vector<double> ms;
    for (const auto& window : windows_) {
      double sum = 0;
      for (const auto& [begin, end] : window) sum += be_.ms_between(begin, end);
      ms.push_back(sum);
    }
    windows_.clear();
    return ms;
  }
  void barrier() override {}
  void max_inplace(std::vector<double>&) override {}
  std::vector<float> gather_host(const std::vector<float>& local) override {
    std::vector<float> all;
    for (int r = 0; r < n_; ++r) all.insert(all.end(), local.begin(), local.end());
    return all;
  }

 private:
  // Marks around a collective's copies, kept in the open window. Marks are stream-ordered
  // (CUDA events) and read only in take_emulated_ms(), so timing adds no host wait.
  class Timed {
   public:
    explicit Timed(BackendEmulatedCommunicator& c) : c_(c), on_(!c.windows_.empty()) {
      if (on_) begin_ = c_.be_.mark();
    }
    ~Timed() {
      if (on_) c_.windows_.back().emplace_back(begin_, c_.be_.mark());
    }

   private:
    BackendEmulatedCommunicator& c_;
    bool on_;
    Backend::Mark begin_;
  };
  Backend& be_;
  int n_;
  std::vector<std::vector<std::pair<Backend::Mark, Backend::Mark>>> windows_;
};

}  // namespace

std::unique_ptr<Communicator> make_backend_local_communicator(Backend& backend) {
  return std::make_unique<BackendLocalCommunicator>(backend);
}
std::unique_ptr<Communicator> make_backend_emulated_communicator(Backend& backend, int size) {
  return std::make_unique<BackendEmulatedCommunicator>(backend, size);
}

}  // namespace actbench
