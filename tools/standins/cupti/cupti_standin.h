#pragma once
// Hooks of the CUPTI activity stand-in (cupti_standin.cpp) for the code that plays the CUDA
// runtime (the simulator): it reports each runtime/driver API call and each kernel it runs,
// and the stand-in turns them into activity records following CUPTI's rules. The CUPTI
// functions themselves have the toolkit's <cupti.h> interface.
#include <cupti.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// A runtime (CUPTI_ACTIVITY_KIND_RUNTIME) or driver (CUPTI_ACTIVITY_KIND_DRIVER) API call on
// the calling thread, [start_ns, end_ns]. Returns its correlation id (unique, > 0), which the
// kernels it launched must carry. When that API kind is enabled, an API record is emitted,
// preceded, if CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION is enabled, by one external-
// correlation record per external kind whose stack on this thread is not empty.
uint32_t actbench_cupti_standin_api_call(CUpti_ActivityKind api_kind, CUpti_CallbackId cbid, uint64_t start_ns,
                                         uint64_t end_ns);

// A kernel launched by the API call `correlation_id` ran on `stream_id` over [start_ns, end_ns].
// Emitted as CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL when that kind is enabled, else as
// CUPTI_ACTIVITY_KIND_KERNEL when that is, else not at all.
void actbench_cupti_standin_kernel(uint32_t correlation_id, const char* name, uint64_t start_ns, uint64_t end_ns,
                                   uint32_t stream_id, const int32_t grid[3], const int32_t block[3]);

// Back to the initial state (no callbacks, nothing enabled, correlation ids from 1); the
// held buffer, if any, is completed first. For tests.
void actbench_cupti_standin_reset(void);

#ifdef __cplusplus
}
#endif
