#include "runtime/communicator.hpp"

#include <cstring>

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

// Ring algorithm bytes per rank: all-gather / reduce-scatter (n-1)/n * S, all-reduce 2(n-1)/n * S.
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

void Communicator::check_gather_shapes(const Tensor& small, const Tensor& big, int n, const char* op) {
  bool ok = small.ndim() >= 1 && small.ndim() == big.ndim() && big.dim(0) == n * small.dim(0) &&
            small.dtype() == big.dtype();
  for (int i = 1; ok && i < small.ndim(); ++i) ok = small.dim(i) == big.dim(i);
  if (!ok)
    throw InvalidArgument(std::string(op) + ": shapes " + shape_str(small.shape()) + " and " + shape_str(big.shape()) +
                          " do not differ by a factor " + std::to_string(n) + " in dim 0");
}

namespace {

// These communicators copy with memcpy: host (or meta) tensors only. Device tensors go
// through the backend's communicators (kernels/backend_comm.hpp), which copy on the stream.
void require_host(const Tensor& t, const char* op) {
  if (t.defined() && t.device() == Device::cuda)
    throw InvalidArgument(std::string(op) + ": a device tensor needs the backend's communicator "
                          "(make_backend_local_communicator / make_backend_emulated_communicator)");
}

class LocalCommunicator final : public Communicator {
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
    require_host(in, op);
    require_host(out, op);
    if (!in.is_meta() && in.bytes() && in.data() != out.data()) std::memcpy(out.data(), in.data(), in.bytes());
  }
};

// Rank 0 of `n` ranks, alone. The data it produces is what rank 0 would hold if every
// rank held rank 0's values: all-gather replicates the local shard, reduce-scatter keeps
// rank 0's rows unreduced, all-reduce leaves the partial sum. Shapes and bytes are exact;
// values are not the real layer's (emulation measures time and memory, not numerics).
class EmulatedCommunicator final : public Communicator {
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
