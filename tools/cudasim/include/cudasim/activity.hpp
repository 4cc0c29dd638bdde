#pragma once
// What the simulated runtime did, for a profiler: every runtime API call it served, and the
// kernels, copies and sets that call ran. The simulator calls these functions; which
// definitions it links decides where the events go:
//   src/activity_none.cpp                        nowhere (the simulator's own tests)
//   tools/standins/cupti/cudasim_cupti_bridge.cpp  the CUPTI activity stand-in, which turns
//                                                them into CUPTI activity records
// Times are nanoseconds of one monotonic host clock (cudasim::activity::now_ns). Work runs
// inside the API call that issued it, so a kernel's [start, end] lies within its call's.
// Order on a thread: a call is reported when it returns (a runtime function called inside
// another, e.g. cudaMemcpy by cudaMemcpyAsync, is part of the outer call, not a call of its
// own); the work it ran (at most one kernel, copy or set) is reported right after it.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace cudasim::activity {

uint64_t now_ns();

// A runtime API call `function` (its name, e.g. "cudaMemcpyAsync", "cudaLaunchKernel") on the
// calling thread over [start_ns, end_ns]. Returns the call's correlation id (> 0), which the
// work it issued carries, or 0 when nothing records activity.
uint32_t api_call(const char* function, uint64_t start_ns, uint64_t end_ns);

// A kernel launched by the call `correlation_id` ran on `stream` over [start_ns, end_ns].
void kernel(uint32_t correlation_id, const char* name, uint64_t start_ns, uint64_t end_ns, cudaStream_t stream,
            dim3 grid, dim3 block, size_t dynamic_smem_bytes);
// A copy or set of `bytes` issued by the call `correlation_id`.
void memcpy(uint32_t correlation_id, cudaMemcpyKind kind, size_t bytes, uint64_t start_ns, uint64_t end_ns,
            cudaStream_t stream);
void memset(uint32_t correlation_id, int value, size_t bytes, uint64_t start_ns, uint64_t end_ns, cudaStream_t stream);

}  // namespace cudasim::activity
