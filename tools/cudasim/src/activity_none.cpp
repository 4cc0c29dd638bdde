// The activity functions when nothing records activity (the simulator's own tests): calls
// get no correlation id, so the simulator reports no work either.
#include "cudasim/activity.hpp"

#include <chrono>

namespace cudasim::activity {

uint64_t now_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}
uint32_t api_call(const char*, uint64_t, uint64_t) { return 0; }
void kernel(uint32_t, const char*, uint64_t, uint64_t, cudaStream_t, dim3, dim3, size_t) {}
void memcpy(uint32_t, cudaMemcpyKind, size_t, uint64_t, uint64_t, cudaStream_t) {}
void memset(uint32_t, int, size_t, uint64_t, uint64_t, cudaStream_t) {}

}  // namespace cudasim::activity
