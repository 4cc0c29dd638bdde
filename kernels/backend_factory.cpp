#include "kernels/backend.hpp"
#include "kernels/backend_comm.hpp"
#include "runtime/error.hpp"

#if ACTBENCH_HAVE_CUDA_BACKEND
#include "kernels/cuda/comm_nccl.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#endif

namespace actbench {

#if ACTBENCH_HAVE_CUDA_BACKEND
std::unique_ptr<Backend> make_cuda_backend(size_t capacity_bytes);
#endif

std::unique_ptr<Backend> make_backend(const std::string& name, size_t capacity_bytes) {
  if (name == "cpu") return make_cpu_backend(capacity_bytes);
  if (name == "meta") return make_meta_backend(capacity_bytes);
  if (name == "cuda") {
#if ACTBENCH_HAVE_CUDA_BACKEND
    return make_cuda_backend(capacity_bytes);
#else
    throw InvalidArgument("backend 'cuda' is not available: this build has no CUDA backend (no GPU run possible)");
#endif
  }
  throw InvalidArgument("unknown backend '" + name + "' (expected cpu, cuda or meta)");
}

void bind_device_for_rank(const std::string& backend_name, int rank) {
#if ACTBENCH_HAVE_CUDA_BACKEND
  if (backend_name == "cuda") select_cuda_device_for_rank(rank);
#else
  (void)backend_name;
  (void)rank;
#endif
}

std::unique_ptr<Communicator> make_world_communicator(Backend& backend) {
  if (std::string(backend.name()) == "cuda") {
#if ACTBENCH_HAVE_CUDA_BACKEND
    return make_nccl_communicator(cuda_stream_of(backend));
#else
    throw InvalidArgument("backend 'cuda' is not available in this build");
#endif
  }
  return make_mpi_communicator();
}

}  // namespace actbench
