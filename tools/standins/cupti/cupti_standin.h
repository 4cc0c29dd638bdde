#pragma once
// Hooks of the CUPTI activity stand-in (cupti_standin.cpp) for the code that plays the CUDA
// runtime (the simulator): it reports each runtime/driver API call and the kernels, copies
// and sets the call ran, and the stand-in turns them into activity records following CUPTI's
// rules. The CUPTI functions themselves have the toolkit's <cupti.h> interface.
#include <cupti.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// A runtime (CUPTI_ACTIVITY_KIND_RUNTIME) or driver (CUPTI_ACTIVITY_KIND_DRIVER) API call on
// the calling thread, [start_ns, end_ns]. Returns its correlation id (unique, > 0), which the
// work it issued must carry. When that API kind is enabled, an API record is emitted,
// preceded, if CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION is enabled, by one external-
// correlation record per external kind whose stack on this thread is not empty.
uint32_t actbench_cupti_standin_api_call(CUpti_ActivityKind api_kind, CUpti_CallbackId cbid, uint64_t start_ns,
                                         uint64_t end_ns);

// The simulated device and its one context, as the records name them (deviceId, contextId).
#define ACTBENCH_CUPTI_STANDIN_DEVICE_ID 0u
#define ACTBENCH_CUPTI_STANDIN_CONTEXT_ID 1u

// Work an API call issued carries that call's correlation id (`correlation_id`, from
// actbench_cupti_standin_api_call). The simulated runtime makes no driver calls, so the
// runtime call is the API record that launched the work.
//
// A kernel ran on `stream_id` over [start_ns, end_ns]. Emitted as
// CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL when that kind is enabled, else as
// CUPTI_ACTIVITY_KIND_KERNEL when that is, else not at all.
void actbench_cupti_standin_kernel(uint32_t correlation_id, const char* name, uint64_t start_ns, uint64_t end_ns,
                                   uint32_t stream_id, const int32_t grid[3], const int32_t block[3],
                                   int32_t dynamic_shared_bytes);

// A copy of `bytes` (CUpti_ActivityMemcpy6, kind CUPTI_ACTIVITY_KIND_MEMCPY when enabled).
// `async`: issued by an asynchronous call (CUPTI_ACTIVITY_FLAG_MEMCPY_ASYNC).
void actbench_cupti_standin_memcpy(uint32_t correlation_id, CUpti_ActivityMemcpyKind copy_kind,
                                   CUpti_ActivityMemoryKind src_kind, CUpti_ActivityMemoryKind dst_kind, uint64_t bytes,
                                   uint64_t start_ns, uint64_t end_ns, uint32_t stream_id, int async);

// A set of `bytes` of device memory to `value` (CUpti_ActivityMemset4, kind
// CUPTI_ACTIVITY_KIND_MEMSET when enabled). `async`: CUPTI_ACTIVITY_FLAG_MEMSET_ASYNC.
void actbench_cupti_standin_memset(uint32_t correlation_id, uint32_t value, uint64_t bytes, uint64_t start_ns,
                                   uint64_t end_ns, uint32_t stream_id, int async);

// Back to the initial state (no callbacks, nothing enabled, correlation ids from 1, no
// dropped records); the held buffer, if any, is completed first. For tests.
void actbench_cupti_standin_reset(void);

#ifdef __cplusplus
}
#endif
