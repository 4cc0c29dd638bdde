// The MPI communicator: real processes under mpirun, host tensors. 16-bit data is reduced
// in fp32 (widened, reduced, rounded once), as the CPU reference does all its math.
#include <cstdlib>
#include <cstring>
#include <string>

#include "runtime/communicator.hpp"
#include "runtime/error.hpp"

#if ACTBENCH_HAVE_MPI
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>
#define MPI_CHECK(call)                                                                     \
  do {                                                                                      \
    int rc_ = (call);                                                                       \
    if (rc_ != MPI_SUCCESS) {                                                               \
      char msg_[MPI_MAX_ERROR_STRING];                                                      \
      int len_ = 0;                                                                         \
      MPI_Error_string(rc_, msg_, &len_);                                                   \
      ::actbench::throw_failure(__FILE__, __LINE__, std::string(#call) + ": " + msg_);      \
    }                                                                                       \
  } while (0)
#endif

namespace actbench {

int mpi_world_size_from_env() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MV2_COMM_WORLD_SIZE"})
    if (const char* v = std::getenv(var)) return std::atoi(v);
  return 0;
}

int mpi_world_rank_from_env() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK"})
    if (const char* v = std::getenv(var)) return std::atoi(v);
  return 0;
}

bool mpi_launched() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK") || std::getenv("PMI_RANK") ||
         std::getenv("MV2_COMM_WORLD_RANK");
}

#if ACTBENCH_HAVE_MPI

bool mpi_available() { return true; }

namespace {

std::vector<float> widen(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = load_as_float(t.data(), t.dtype(), i);
  return v;
}
void narrow(const std::vector<float>& v, Tensor& t) {
  for (size_t i = 0; i < v.size(); ++i) store_from_float(t.data(), t.dtype(), i, v[i]);
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  CommMode mode() const override { return CommMode::mpi; }

  void all_reduce(Tensor& t) override {
    count_all_reduce(t);
    if (t.is_meta() || !t.numel()) return;
    if (t.dtype() == DType::fp32) {
      MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, t.data(), static_cast<int>(t.numel()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
      return;
    }
    std::vector<float> v = widen(t);
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
    narrow(v, t);
  }

  void all_gather(const Tensor& in, Tensor& out) override {
    check_gather_shapes(in, out, size_, "all_gather");
    count_all_gather(out);
    if (in.is_meta() || !in.bytes()) return;
    MPI_CHECK(MPI_Allgather(in.data(), static_cast<int>(in.bytes()), MPI_BYTE, out.data(), static_cast<int>(in.bytes()),
                            MPI_BYTE, MPI_COMM_WORLD));
  }

  void reduce_scatter(const Tensor& in, Tensor& out) override {
    check_gather_shapes(out, in, size_, "reduce_scatter");
    count_reduce_scatter(in);
    if (in.is_meta() || !out.numel()) return;
    int count = static_cast<int>(out.numel());
    if (in.dtype() == DType::fp32) {
      MPI_CHECK(MPI_Reduce_scatter_block(in.data(), out.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
      return;
    }
    std::vector<float> src = widen(in), dst(static_cast<size_t>(count));
    MPI_CHECK(MPI_Reduce_scatter_block(src.data(), dst.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
    narrow(dst, out);
  }

  void barrier() override { MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD)); }

  void max_inplace(std::vector<double>& v) override {
    if (v.empty()) return;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  }

  std::vector<float> gather_host(const std::vector<float>& local) override {
    std::vector<float> all(local.size() * static_cast<size_t>(size_));
    MPI_CHECK(MPI_Allgather(local.data(), static_cast<int>(local.size()), MPI_FLOAT, all.data(),
                            static_cast<int>(local.size()), MPI_FLOAT, MPI_COMM_WORLD));
    return all;
  }

 private:
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator() {
  int initialized = 0;
  MPI_CHECK(MPI_Initialized(&initialized));
  if (!initialized) MPI_CHECK(MPI_Init(nullptr, nullptr));
  return std::make_unique<MpiCommunicator>();
}

void mpi_finalize_if_initialized() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Finalize();
}

void mpi_abort_if_initialized(int code) {
  int initialized = 0, finalized = 0, size = 1;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size > 1) MPI_Abort(MPI_COMM_WORLD, code);
}

#else

bool mpi_available() { return false; }
std::unique_ptr<Communicator> make_mpi_communicator() {
  throw InvalidArgument("this build has no MPI support (install libopenmpi-dev and rebuild)");
}
void mpi_finalize_if_initialized() {}
void mpi_abort_if_initialized(int) {}

#endif

}  // namespace actbench
