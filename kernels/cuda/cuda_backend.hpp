#pragma once
// The CUDA backend: kernels/cuda/*.cu + cuBLASLt, everything on one non-default stream that
// the backend owns, memory from the caching allocator over cudaMalloc. Created through
// make_backend("cuda"); this header is for code that needs the stream (NCCL) or the device.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>

#include "kernels/backend.hpp"

namespace actbench {

// Throws InvalidArgument("backend 'cuda': no CUDA device is available (...)") without a
// device; uses the current device (cudaSetDevice before, one device per MPI rank).
std::unique_ptr<Backend> make_cuda_backend(size_t capacity_bytes = 0);

// The stream every op of a cuda backend runs on. Throws InvalidArgument for other backends.
cudaStream_t cuda_stream_of(Backend& backend);

// Number of CUDA devices; 0 when there is none or the driver cannot be reached.
int cuda_device_count();

}  // namespace actbench
