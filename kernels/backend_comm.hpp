#pragma once
// Communicators for a run on a backend.
// - Local (t = 1) and emulated (rank 0 of t) communicators that move data with the backend's
//   own copy(), so they work on device memory too (runtime/'s versions memcpy on the host).
//   Same semantics, mode and byte counts as those (runtime/communicator.cpp).
// - Under mpirun: bind_device_for_rank() before the backend exists, then
//   make_world_communicator(): NCCL on the backend's stream for cuda, MPI otherwise.
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

}  // namespace actbench
