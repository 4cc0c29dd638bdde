#pragma once
// Local (t = 1) and emulated (rank 0 of t) communicators that move data with the backend's
// own copy(), so they work on device memory. runtime/'s local and emulated communicators
// std::memcpy tensor data on the host: on the cuda backend that dereferences device
// pointers (SP configurations at t = 1, and every --emulate-tp run, would crash). Same
// semantics, mode and byte counts as those (runtime/communicator.cpp).
#include <memory>

#include "kernels/backend.hpp"
#include "runtime/communicator.hpp"

namespace actbench {

// `backend` must outlive the communicator.
std::unique_ptr<Communicator> make_backend_local_communicator(Backend& backend);
std::unique_ptr<Communicator> make_backend_emulated_communicator(Backend& backend, int size);

}  // namespace actbench
