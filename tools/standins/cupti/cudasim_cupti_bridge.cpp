// The simulator's activity (tools/cudasim/include/cudasim/activity.hpp) as CUPTI activity
// records: each runtime call becomes a CUPTI_ACTIVITY_KIND_RUNTIME call of the CUPTI stand-in
// (cupti_standin.h) with the callback id of cupti_runtime_cbid.h, and the kernels, copies and
// sets it ran carry the correlation id the stand-in gave it. Linked instead of the simulator's
// src/activity_none.cpp.
#include <cupti.h>

#include <chrono>
#include <map>
#include <mutex>
#include <string_view>
#include <unordered_map>

#include "cudasim/activity.hpp"
#include "tools/standins/cupti/cupti_standin.h"

namespace {

// The runtime functions the simulator defines. Where cupti_runtime_cbid.h lists several
// versions of one, the newest: the one the toolkit's header declares under the plain name.
CUpti_CallbackId runtime_cbid(const char* function) {
  static const std::unordered_map<std::string_view, CUpti_CallbackId> ids = {
      {"cudaDeviceGetAttribute", CUPTI_RUNTIME_TRACE_CBID_cudaDeviceGetAttribute_v5000},
      {"cudaDeviceSynchronize", CUPTI_RUNTIME_TRACE_CBID_cudaDeviceSynchronize_v3020},
      {"cudaDriverGetVersion", CUPTI_RUNTIME_TRACE_CBID_cudaDriverGetVersion_v3020},
      {"cudaEventCreate", CUPTI_RUNTIME_TRACE_CBID_cudaEventCreate_v3020},
      {"cudaEventCreateWithFlags", CUPTI_RUNTIME_TRACE_CBID_cudaEventCreateWithFlags_v3020},
      {"cudaEventDestroy", CUPTI_RUNTIME_TRACE_CBID_cudaEventDestroy_v3020},
      {"cudaEventElapsedTime", CUPTI_RUNTIME_TRACE_CBID_cudaEventElapsedTime_v12080},
      {"cudaEventQuery", CUPTI_RUNTIME_TRACE_CBID_cudaEventQuery_v3020},
      {"cudaEventRecord", CUPTI_RUNTIME_TRACE_CBID_cudaEventRecord_v3020},
      {"cudaEventSynchronize", CUPTI_RUNTIME_TRACE_CBID_cudaEventSynchronize_v3020},
      {"cudaFree", CUPTI_RUNTIME_TRACE_CBID_cudaFree_v3020},
      {"cudaFreeHost", CUPTI_RUNTIME_TRACE_CBID_cudaFreeHost_v3020},
      {"cudaFuncSetAttribute", CUPTI_RUNTIME_TRACE_CBID_cudaFuncSetAttribute_v9000},
      {"cudaGetDevice", CUPTI_RUNTIME_TRACE_CBID_cudaGetDevice_v3020},
      {"cudaGetDeviceCount", CUPTI_RUNTIME_TRACE_CBID_cudaGetDeviceCount_v3020},
      {"cudaGetDeviceProperties", CUPTI_RUNTIME_TRACE_CBID_cudaGetDeviceProperties_v12000},
      {"cudaGetErrorName", CUPTI_RUNTIME_TRACE_CBID_cudaGetErrorName_v6050},
      {"cudaGetErrorString", CUPTI_RUNTIME_TRACE_CBID_cudaGetErrorString_v3020},
      {"cudaGetLastError", CUPTI_RUNTIME_TRACE_CBID_cudaGetLastError_v3020},
      {"cudaLaunchKernel", CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000},
      {"cudaMalloc", CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020},
      {"cudaMallocHost", CUPTI_RUNTIME_TRACE_CBID_cudaMallocHost_v3020},
      {"cudaMemGetInfo", CUPTI_RUNTIME_TRACE_CBID_cudaMemGetInfo_v3020},
      {"cudaMemcpy", CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_v3020},
      {"cudaMemcpyAsync", CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020},
      {"cudaMemset", CUPTI_RUNTIME_TRACE_CBID_cudaMemset_v3020},
      {"cudaMemsetAsync", CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_v3020},
      {"cudaPeekAtLastError", CUPTI_RUNTIME_TRACE_CBID_cudaPeekAtLastError_v3020},
      {"cudaProfilerStart", CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000},
      {"cudaProfilerStop", CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000},
      {"cudaRuntimeGetVersion", CUPTI_RUNTIME_TRACE_CBID_cudaRuntimeGetVersion_v3020},
      {"cudaSetDevice", CUPTI_RUNTIME_TRACE_CBID_cudaSetDevice_v3020},
      {"cudaStreamCreate", CUPTI_RUNTIME_TRACE_CBID_cudaStreamCreate_v3020},
      {"cudaStreamCreateWithFlags", CUPTI_RUNTIME_TRACE_CBID_cudaStreamCreateWithFlags_v5000},
      {"cudaStreamDestroy", CUPTI_RUNTIME_TRACE_CBID_cudaStreamDestroy_v5050},
      {"cudaStreamQuery", CUPTI_RUNTIME_TRACE_CBID_cudaStreamQuery_v3020},
      {"cudaStreamSynchronize", CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_v3020},
      {"cudaStreamWaitEvent", CUPTI_RUNTIME_TRACE_CBID_cudaStreamWaitEvent_v3020},
  };
  if (!function) return CUPTI_RUNTIME_TRACE_CBID_INVALID;
  auto it = ids.find(function);
  if (it == ids.end()) return CUPTI_RUNTIME_TRACE_CBID_INVALID;
  return it->second;
}

// Stream ids: 1, 2, ... in the order the streams are first seen. The legacy default stream
// has two handles (0 and cudaStreamLegacy) and one id.
uint32_t stream_id(cudaStream_t stream) {
  static std::mutex mutex;
  static std::map<cudaStream_t, uint32_t> ids;
  if (stream == cudaStreamLegacy) stream = nullptr;
  std::lock_guard<std::mutex> lock(mutex);
  auto [it, fresh] = ids.try_emplace(stream, static_cast<uint32_t>(ids.size() + 1));
  return it->second;
}

// Whether the last call on this thread (correlation id) was an asynchronous one, for the
// ASYNC flag of the copy or set it ran.
thread_local uint32_t t_last_call = 0;
thread_local bool t_last_async = false;
bool issued_async(uint32_t correlation_id) { return t_last_call == correlation_id && t_last_async; }

CUpti_ActivityMemcpyKind copy_kind(cudaMemcpyKind kind) {
  switch (kind) {
    case cudaMemcpyHostToHost: return CUPTI_ACTIVITY_MEMCPY_KIND_HTOH;
    case cudaMemcpyHostToDevice: return CUPTI_ACTIVITY_MEMCPY_KIND_HTOD;
    case cudaMemcpyDeviceToHost: return CUPTI_ACTIVITY_MEMCPY_KIND_DTOH;
    case cudaMemcpyDeviceToDevice: return CUPTI_ACTIVITY_MEMCPY_KIND_DTOD;
    default: return CUPTI_ACTIVITY_MEMCPY_KIND_UNKNOWN;  // the simulator resolves cudaMemcpyDefault
  }
}

}  // namespace

namespace cudasim::activity {

uint64_t now_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

uint32_t api_call(const char* function, uint64_t start_ns, uint64_t end_ns) {
  const uint32_t id =
      actbench_cupti_standin_api_call(CUPTI_ACTIVITY_KIND_RUNTIME, runtime_cbid(function), start_ns, end_ns);
  const std::string_view name = function ? function : "";
  t_last_call = id;
  t_last_async = name.size() > 5 && name.substr(name.size() - 5) == "Async";
  return id;
}

void kernel(uint32_t correlation_id, const char* name, uint64_t start_ns, uint64_t end_ns, cudaStream_t stream,
            dim3 grid, dim3 block, size_t dynamic_smem_bytes) {
  const int32_t g[3] = {static_cast<int32_t>(grid.x), static_cast<int32_t>(grid.y), static_cast<int32_t>(grid.z)};
  const int32_t b[3] = {static_cast<int32_t>(block.x), static_cast<int32_t>(block.y), static_cast<int32_t>(block.z)};
  actbench_cupti_standin_kernel(correlation_id, name, start_ns, end_ns, stream_id(stream), g, b,
                                static_cast<int32_t>(dynamic_smem_bytes));
}

// The simulator does not know whether host memory is pinned, so the host side of a copy is
// CUPTI_ACTIVITY_MEMORY_KIND_UNKNOWN; device memory is DEVICE.
void memcpy(uint32_t correlation_id, cudaMemcpyKind kind, size_t bytes, uint64_t start_ns, uint64_t end_ns,
            cudaStream_t stream) {
  const bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  const bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  actbench_cupti_standin_memcpy(correlation_id, copy_kind(kind),
                                src_device ? CUPTI_ACTIVITY_MEMORY_KIND_DEVICE : CUPTI_ACTIVITY_MEMORY_KIND_UNKNOWN,
                                dst_device ? CUPTI_ACTIVITY_MEMORY_KIND_DEVICE : CUPTI_ACTIVITY_MEMORY_KIND_UNKNOWN,
                                bytes, start_ns, end_ns, stream_id(stream), issued_async(correlation_id));
}

void memset(uint32_t correlation_id, int value, size_t bytes, uint64_t start_ns, uint64_t end_ns,
            cudaStream_t stream) {
  // cudaMemset sets each byte to the low 8 bits of value.
  actbench_cupti_standin_memset(correlation_id, static_cast<uint32_t>(value & 0xff), bytes, start_ns, end_ns,
                                stream_id(stream), issued_async(correlation_id));
}

}  // namespace cudasim::activity
