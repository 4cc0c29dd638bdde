#include <cstdint>
#include <string>

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

namespace {

// The ranks of `world` with the same color, ranked by key: of the same kind as world.
std::unique_ptr<Communicator> split_world(Backend& backend, Communicator& world, int color, int key) {
  if (std::string(backend.name()) == "cuda") {
#if ACTBENCH_HAVE_CUDA_BACKEND
    return split_nccl_communicator(world, color, key);
#else
    (void)world;
    throw InvalidArgument("backend 'cuda' is not available in this build");
#endif
  }
  return make_mpi_split_communicator(color, key);
}

}  // namespace

ParallelGroups make_data_parallel_groups(Backend& backend, int tp, int cp, int dp, bool with_tp_peers) {
  if (tp < 1 || cp < 1 || dp < 1)
    throw InvalidArgument("parallel groups: the tensor-, context- and data-parallel sizes (" + std::to_string(tp) +
                          ", " + std::to_string(cp) + ", " + std::to_string(dp) + ") must be >= 1");
  ParallelGroups groups;
  groups.world = make_world_communicator(backend);
  const int r = groups.world->rank(), n = groups.world->size();
  if (static_cast<int64_t>(tp) * cp * dp != n)
    throw InvalidArgument("parallel groups: tp x cp x dp = " + std::to_string(tp) + " x " + std::to_string(cp) +
                          " x " + std::to_string(dp) + " ranks, but the MPI world has " + std::to_string(n));
  // Megatron-Core's order: tp fastest, then cp, then dp. Colors are unique per group kind.
  const int tp_rank = r % tp, cp_rank = (r / tp) % cp, dp_rank = r / (tp * cp);
  groups.tp = split_world(backend, *groups.world, r / tp, tp_rank);
  groups.cp = split_world(backend, *groups.world, dp_rank * tp + tp_rank, cp_rank);
  groups.dp = split_world(backend, *groups.world, cp_rank * tp + tp_rank, dp_rank);
  if (with_tp_peers) groups.tp_peers = split_world(backend, *groups.world, tp_rank, r / tp);
  return groups;
}

ParallelGroups make_parallel_groups(Backend& backend, int tp, int cp) {
  if (tp < 1 || cp < 1)
    throw InvalidArgument("parallel groups: the tensor-parallel size (" + std::to_string(tp) +
                          ") and the context-parallel size (" + std::to_string(cp) + ") must be >= 1");
  ParallelGroups groups;
  groups.world = make_world_communicator(backend);
  const int r = groups.world->rank(), n = groups.world->size();
  if (static_cast<int64_t>(tp) * cp != n)
    throw InvalidArgument("parallel groups: tensor-parallel size " + std::to_string(tp) + " x context-parallel size " +
                          std::to_string(cp) + " is " + std::to_string(static_cast<int64_t>(tp) * cp) +
                          " ranks, but the MPI world has " + std::to_string(n));
  // Megatron-Core's order: tp_rank = r % tp, cp_rank = r / tp.
  groups.tp = split_world(backend, *groups.world, r / tp, r % tp);
  groups.cp = split_world(backend, *groups.world, r % tp, r / tp);
  return groups;
}

}  // namespace actbench
