#pragma once
// Communicators for a run on a backend.
// - Local (t = 1) and emulated (rank 0 of t) communicators that move data with the backend's
//   own copy(), so they work on device memory too (runtime/'s versions memcpy on the host).
//   Same semantics, mode and byte counts as those (runtime/communicator.cpp).
// - Under mpirun: bind_device_for_rank() before the backend exists, then
//   make_world_communicator() (one tensor-parallel group: NCCL on the backend's stream for
//   cuda, MPI otherwise), or make_parallel_groups() for tensor- and context-parallel groups.
#include <memory>
#include <string>

#include "kernels/backend.hpp"
#include "runtime/communicator.hpp"

namespace actbench {

// `backend` must outlive the communicator.
std::unique_ptr<Communicator> make_backend_local_communicator(Backend& backend);
std::unique_ptr<Communicator> make_backend_emulated_communicator(Backend& backend, int size);

// Under mpirun, before make_backend(name): gives this rank its own GPU for cuda (local rank
// modulo the device count); nothing for cpu and meta.
void bind_device_for_rank(const std::string& backend_name, int rank);
// The tensor-parallel group over the MPI world for `backend`: NCCL (on the backend's stream)
// for cuda, the MPI communicator for cpu and meta. Throws InvalidArgument when the build
// cannot provide it (e.g. cuda without NCCL).
std::unique_ptr<Communicator> make_world_communicator(Backend& backend);

struct ParallelGroups {
  std::unique_ptr<Communicator> world, tp, cp;  // world: every rank (metadata, agreement, dumps)
  std::unique_ptr<Communicator> dp;             // make_data_parallel_groups only
  std::unique_ptr<Communicator> tp_peers;       // with_tp_peers: the ranks of one tp_rank, by r / tp
};
// Under mpirun: the world split into tensor- and context-parallel groups for `backend` (NCCL for
// cuda, MPI otherwise). Throws InvalidArgument (one line) unless tp >= 1, cp >= 1 and tp*cp is
// the world size.
// Megatron-Core's rank order: world rank r has tp_rank = r % tp and cp_rank = r / tp; a TP
// group is the tp consecutive ranks with the same r / tp, a CP group the cp ranks with the same
// r % tp, ordered by cp_rank. Every rank calls it together (it splits collectively).
ParallelGroups make_parallel_groups(Backend& backend, int tp, int cp);
// The same with dp data-parallel replicas of the tp x cp grid (world = tp*cp*dp): rank r has
// tp_rank = r % tp, cp_rank = (r / tp) % cp, dp_rank = r / (tp*cp); the DP group is the dp
// ranks of one (tp_rank, cp_rank), ordered by dp_rank. with_tp_peers adds the cp*dp ranks of
// one tp_rank, ordered by r / tp (Megatron-Core's expert-parallel group under expert tensor
// parallelism = tp).
ParallelGroups make_data_parallel_groups(Backend& backend, int tp, int cp, int dp, bool with_tp_peers = false);

}  // namespace actbench
