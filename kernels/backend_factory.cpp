#include "kernels/backend.hpp"
#include "runtime/error.hpp"

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

}  // namespace actbench
