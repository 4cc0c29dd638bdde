// The CUDA runtime calls actbench makes, on host memory: device memory with canaries and NaN
// poisoning, copies and sets, streams and events (work runs at once, in issue order, so a
// stream is only a validated handle and an event a host timestamp), device properties of the
// simulated device, errors. Every call is reported to cudasim::activity (ApiCall). Definitions match the declarations of the toolkit's
// cuda_runtime_api.h, so code written for the real runtime compiles and links unchanged.
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>

#include "cudasim/activity.hpp"
#include "internal.hpp"
#include "stream_log.hpp"

#if defined(CUDASIM_ASAN)
#include <sanitizer/asan_interface.h>
#endif

namespace cudasim::internal {
namespace {

uint64_t g_next_alloc_id = 1;
size_t g_allocated = 0;
int g_current_device = 0;

struct SimStream {
  unsigned flags;
};
struct SimEvent {
  double ms = 0;
  bool recorded = false;
  unsigned flags = 0;
};
std::set<const void*>& streams() {
  static std::set<const void*> s;
  return s;
}
std::set<const void*>& events() {
  static std::set<const void*> s;
  return s;
}

double host_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

void poison_canaries(const Allocation& a, bool on) {
#if defined(CUDASIM_ASAN)
  char* base = reinterpret_cast<char*>(a.base);
  if (on) {
    __asan_poison_memory_region(base - kFrontCanary, kFrontCanary);
    __asan_poison_memory_region(base + a.size, a.padded - a.size + kBackCanary);
  } else {
    __asan_unpoison_memory_region(base - kFrontCanary, kFrontCanary);
    __asan_unpoison_memory_region(base + a.size, a.padded - a.size + kBackCanary);
  }
#else
  (void)a;
  (void)on;
#endif
}

// Device pointer ranges of a copy or set must lie inside one allocation.
bool device_range_ok(const void* p, size_t n) { return n == 0 || find_allocation(p, n) != nullptr; }

}  // namespace

std::map<uintptr_t, Allocation>& allocations() {
  static std::map<uintptr_t, Allocation> m;
  return m;
}

const Allocation* find_allocation(const void* p, size_t n) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto& m = allocations();
  auto it = m.upper_bound(a);
  if (it == m.begin()) return nullptr;
  --it;
  const Allocation& al = it->second;
  if (a >= al.base && a + n <= al.base + al.size) return &al;
  return nullptr;
}

const Allocation* canary_owner(uintptr_t p) {
  auto& m = allocations();
  auto it = m.upper_bound(p);
  if (it != m.end() && p >= it->second.base - kFrontCanary) return &it->second;  // just before the next
  if (it == m.begin()) return nullptr;
  --it;
  const Allocation& al = it->second;
  if (p >= al.base + al.size && p < al.base + al.padded + kBackCanary) return &al;
  return nullptr;
}

std::string describe_address(uintptr_t p) {
  if (const Allocation* a = find_allocation(reinterpret_cast<const void*>(p)))
    return "byte " + std::to_string(p - a->base) + " of device buffer #" + std::to_string(a->id) + " (" +
           std::to_string(a->size) + " bytes)";
  if (const Allocation* a = canary_owner(p)) {
    if (p < a->base)
      return std::to_string(a->base - p) + " bytes before device buffer #" + std::to_string(a->id) + " (" +
             std::to_string(a->size) + " bytes)";
    return "byte " + std::to_string(p - a->base) + " of device buffer #" + std::to_string(a->id) + ", " +
           std::to_string(p - a->base - a->size) + " bytes past its end (" + std::to_string(a->size) + " bytes)";
  }
  if (p >= running.dynamic_lo && p < running.dynamic_hi)
    return "byte " + std::to_string(p - running.dynamic_lo) + " of dynamic shared memory";
  if (p >= running.dynamic_hi && p < running.dynamic_hi + kBackCanary)
    return std::to_string(p - running.dynamic_hi) + " bytes past the end of dynamic shared memory (" +
           std::to_string(running.dynamic_hi - running.dynamic_lo) + " bytes)";
  if (p >= running.shared_lo && p < running.shared_hi)
    return "byte " + std::to_string(p - running.shared_lo) + " of static shared memory";
  char b[32];
  std::snprintf(b, sizeof b, "%#lx", static_cast<unsigned long>(p));
  return b;
}

void check_canaries(const char* when) {
  for (auto& [base, a] : allocations()) {
    poison_canaries(a, false);
    const unsigned char* p = reinterpret_cast<const unsigned char*>(a.base);
    long bad = -1;
    for (size_t i = 0; i < kFrontCanary && bad < 0; ++i)
      if (p[-static_cast<long>(kFrontCanary) + static_cast<long>(i)] != kCanaryByte)
        bad = -static_cast<long>(kFrontCanary) + static_cast<long>(i);
    for (size_t i = a.size; i < a.padded + kBackCanary && bad < 0; ++i)
      if (p[i] != kCanaryByte) bad = static_cast<long>(i);
    if (bad >= 0) {
      const std::string where = bad < 0 ? std::to_string(-bad) + " bytes before its start"
                                        : "byte " + std::to_string(bad) + ", " + std::to_string(bad - static_cast<long>(a.size)) +
                                              " bytes past its end";
      add_report("canary", std::string("device buffer #") + std::to_string(a.id) + " (" + std::to_string(a.size) +
                               " bytes) was written out of bounds, at " + where + ", by " + when);
      unsigned char* w = reinterpret_cast<unsigned char*>(a.base);
      std::memset(w - kFrontCanary, kCanaryByte, kFrontCanary);
      std::memset(w + a.size, kCanaryByte, a.padded - a.size + kBackCanary);
    }
    poison_canaries(a, true);
  }
}

bool valid_stream(cudaStream_t s) {
  return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread || streams().count(s) != 0;
}

namespace {
enum class Work : uint8_t { none, kernel, memcpy, memset };
// The outermost API call running on this thread and the work it ran.
struct CallState {
  int depth = 0;
  const char* function = nullptr;
  cudaStream_t stream = nullptr;
  uint64_t start_ns = 0;
  Work work = Work::none;
  uint64_t work_start_ns = 0, work_end_ns = 0;
  size_t bytes = 0;
  cudaMemcpyKind copy_kind = cudaMemcpyDefault;
  int value = 0;
  const char* kernel_name = nullptr;
  dim3 grid, block;
  size_t smem = 0;
};
thread_local CallState t_call;
}  // namespace

ApiCall::ApiCall(const char* function, cudaStream_t stream) noexcept : outermost_(t_call.depth++ == 0) {
  if (!outermost_) return;
  t_call.function = function;
  t_call.stream = stream;
  t_call.work = Work::none;
  t_call.start_ns = activity::now_ns();
}

ApiCall::~ApiCall() {
  --t_call.depth;
  if (!outermost_) return;
  stream_log::call_done(t_call.stream, t_call.work == Work::kernel ? t_call.kernel_name : nullptr);
  const uint32_t id = activity::api_call(t_call.function, t_call.start_ns, activity::now_ns());
  if (id == 0) return;  // nothing records activity
  const CallState& c = t_call;
  switch (c.work) {
    case Work::none: break;
    case Work::kernel:
      activity::kernel(id, c.kernel_name, c.work_start_ns, c.work_end_ns, c.stream, c.grid, c.block, c.smem);
      break;
    case Work::memcpy: activity::memcpy(id, c.copy_kind, c.bytes, c.work_start_ns, c.work_end_ns, c.stream); break;
    case Work::memset: activity::memset(id, c.value, c.bytes, c.work_start_ns, c.work_end_ns, c.stream); break;
  }
}

void ApiCall::kernel(const char* name, uint64_t start_ns, uint64_t end_ns, dim3 grid, dim3 block, size_t smem) {
  t_call.work = Work::kernel;
  t_call.kernel_name = name;
  t_call.work_start_ns = start_ns;
  t_call.work_end_ns = end_ns;
  t_call.grid = grid;
  t_call.block = block;
  t_call.smem = smem;
}
void ApiCall::memcpy(cudaMemcpyKind kind, size_t bytes, uint64_t start_ns, uint64_t end_ns) {
  t_call.work = Work::memcpy;
  t_call.copy_kind = kind;
  t_call.bytes = bytes;
  t_call.work_start_ns = start_ns;
  t_call.work_end_ns = end_ns;
}
void ApiCall::memset(int value, size_t bytes, uint64_t start_ns, uint64_t end_ns) {
  t_call.work = Work::memset;
  t_call.value = value;
  t_call.bytes = bytes;
  t_call.work_start_ns = start_ns;
  t_call.work_end_ns = end_ns;
}

}  // namespace cudasim::internal

using namespace cudasim;
using namespace cudasim::internal;

namespace {
cudaError_t ret(cudaError_t e) {
  if (e != cudaSuccess) set_error(e);
  return e;
}
bool known_event(cudaEvent_t e) { return e && events().count(e) != 0; }
}  // namespace

extern "C" {

// ---- memory ---------------------------------------------------------------------------------------

cudaError_t cudaMalloc(void** dev_ptr, size_t size) {
  ApiCall call("cudaMalloc");
  if (!dev_ptr) return ret(cudaErrorInvalidValue);
  *dev_ptr = nullptr;
  if (size == 0) return cudaSuccess;
  const DeviceLimits& lim = device_limits();
  if (size > lim.global_mem || g_allocated + size > lim.global_mem) return ret(cudaErrorMemoryAllocation);
  const size_t padded = (size + 255) / 256 * 256;
  const size_t total = kFrontCanary + padded + kBackCanary;
  void* raw = std::aligned_alloc(256, total);
  if (!raw) return ret(cudaErrorMemoryAllocation);
  unsigned char* base = static_cast<unsigned char*>(raw) + kFrontCanary;
  std::memset(raw, kCanaryByte, total);
  std::memset(base, kPoisonByte, size);  // fresh memory reads as NaN
  Allocation a{reinterpret_cast<uintptr_t>(base), size, padded, g_next_alloc_id++, raw};
  allocations()[a.base] = a;
  poison_canaries(a, true);
  g_allocated += size;
  *dev_ptr = base;
  return cudaSuccess;
}

cudaError_t cudaFree(void* dev_ptr) {
  ApiCall call("cudaFree");
  if (!dev_ptr) return cudaSuccess;
  auto it = allocations().find(reinterpret_cast<uintptr_t>(dev_ptr));
  if (it == allocations().end()) return ret(cudaErrorInvalidValue);
  check_canaries("a kernel (found when the buffer was freed)");
  poison_canaries(it->second, false);
#if defined(CUDASIM_RACE)
  race_forget(it->second.base - kFrontCanary, it->second.base + it->second.padded + kBackCanary);
#endif
  g_allocated -= it->second.size;
  std::free(it->second.raw);
  allocations().erase(it);
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  ApiCall call("cudaMallocHost");
  if (!ptr) return ret(cudaErrorInvalidValue);
  *ptr = size ? std::malloc(size) : nullptr;
  return size && !*ptr ? ret(cudaErrorMemoryAllocation) : cudaSuccess;
}
cudaError_t cudaFreeHost(void* ptr) {
  ApiCall call("cudaFreeHost");
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  ApiCall call("cudaMemGetInfo");
  const size_t total = device_limits().global_mem;
  if (free_bytes) *free_bytes = total - g_allocated;
  if (total_bytes) *total_bytes = total;
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  ApiCall call("cudaMemcpy");
  if (count == 0) return cudaSuccess;
  if (!dst || !src) return ret(cudaErrorInvalidValue);
  const bool dst_dev = find_allocation(dst, 1) != nullptr, src_dev = find_allocation(src, 1) != nullptr;
  bool ok = true;
  switch (kind) {
    case cudaMemcpyHostToHost: break;
    case cudaMemcpyHostToDevice: ok = device_range_ok(dst, count); break;
    case cudaMemcpyDeviceToHost: ok = device_range_ok(src, count); break;
    case cudaMemcpyDeviceToDevice: ok = device_range_ok(dst, count) && device_range_ok(src, count); break;
    case cudaMemcpyDefault:
      ok = (!dst_dev || device_range_ok(dst, count)) && (!src_dev || device_range_ok(src, count));
      break;
    default: return ret(cudaErrorInvalidMemcpyDirection);
  }
  if (!ok) return ret(cudaErrorInvalidValue);
  if (kind == cudaMemcpyDefault)  // the direction the pointers say (unified addressing)
    kind = src_dev ? (dst_dev ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost)
                   : (dst_dev ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost);
  const uint64_t start_ns = activity::now_ns();
  std::memmove(dst, src, count);
  ApiCall::memcpy(kind, count, start_ns, activity::now_ns());
  stream_log::copy(t_call.stream, dst, src, count, std::strcmp(t_call.function, "cudaMemcpy") == 0);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream) {
  ApiCall call("cudaMemcpyAsync", stream);
  if (!valid_stream(stream)) return ret(cudaErrorInvalidResourceHandle);
  return cudaMemcpy(dst, src, count, kind);
}
cudaError_t cudaMemset(void* dev_ptr, int value, size_t count) {
  ApiCall call("cudaMemset");
  if (count == 0) return cudaSuccess;
  if (!device_range_ok(dev_ptr, count)) return ret(cudaErrorInvalidValue);
  const uint64_t start_ns = activity::now_ns();
  std::memset(dev_ptr, value, count);
  ApiCall::memset(value, count, start_ns, activity::now_ns());
  stream_log::set(t_call.stream, dev_ptr, count);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* dev_ptr, int value, size_t count, cudaStream_t stream) {
  ApiCall call("cudaMemsetAsync", stream);
  if (!valid_stream(stream)) return ret(cudaErrorInvalidResourceHandle);
  return cudaMemset(dev_ptr, value, count);
}

// ---- streams and events ------------------------------------------------------------------------------

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  ApiCall call("cudaStreamCreate");
  if (!stream) return ret(cudaErrorInvalidValue);
  *stream = reinterpret_cast<cudaStream_t>(new SimStream{0});
  streams().insert(*stream);
  stream_log::stream_created(*stream, 0);
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  ApiCall call("cudaStreamCreateWithFlags");
  const cudaError_t e = cudaStreamCreate(stream);
  if (e == cudaSuccess) reinterpret_cast<SimStream*>(*stream)->flags = flags;
  if (e == cudaSuccess) stream_log::stream_created(*stream, flags);
  return e;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  ApiCall call("cudaStreamDestroy", stream);
  if (!stream || !streams().erase(stream)) return ret(cudaErrorInvalidResourceHandle);
  delete reinterpret_cast<SimStream*>(stream);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  ApiCall call("cudaStreamSynchronize", stream);
  if (!valid_stream(stream)) return ret(cudaErrorInvalidResourceHandle);
  stream_log::sync_stream(stream);
  return peek_error() == cudaErrorLaunchFailure ? cudaErrorLaunchFailure : cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  ApiCall call("cudaStreamQuery", stream);
  if (!valid_stream(stream)) return ret(cudaErrorInvalidResourceHandle);
  stream_log::sync_stream(stream);  // its work is done, and the host knows it
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  ApiCall call("cudaStreamWaitEvent", stream);
  if (!valid_stream(stream) || !known_event(event)) return ret(cudaErrorInvalidResourceHandle);
  stream_log::wait(stream, event);
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
  ApiCall call("cudaDeviceSynchronize");
  stream_log::sync_device();
  return peek_error() == cudaErrorLaunchFailure ? cudaErrorLaunchFailure : cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  ApiCall call("cudaEventCreate");
  if (!event) return ret(cudaErrorInvalidValue);
  *event = reinterpret_cast<cudaEvent_t>(new SimEvent{});
  events().insert(*event);
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  ApiCall call("cudaEventCreateWithFlags");
  const cudaError_t e = cudaEventCreate(event);
  if (e == cudaSuccess) reinterpret_cast<SimEvent*>(*event)->flags = flags;
  return e;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  ApiCall call("cudaEventDestroy");
  if (!known_event(event)) return ret(cudaErrorInvalidResourceHandle);
  events().erase(event);
  delete reinterpret_cast<SimEvent*>(event);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  ApiCall call("cudaEventRecord", stream);
  if (!known_event(event) || !valid_stream(stream)) return ret(cudaErrorInvalidResourceHandle);
  SimEvent* e = reinterpret_cast<SimEvent*>(event);
  e->ms = host_ms();  // work before it has already run
  e->recorded = true;
  stream_log::record(stream, event);
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  ApiCall call("cudaEventSynchronize");
  if (!known_event(event)) return ret(cudaErrorInvalidResourceHandle);
  stream_log::sync_event(event);
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t event) {
  ApiCall call("cudaEventQuery");
  if (!known_event(event)) return ret(cudaErrorInvalidResourceHandle);
  stream_log::sync_event(event);  // complete, and the host knows it
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  ApiCall call("cudaEventElapsedTime");
  if (!ms) return ret(cudaErrorInvalidValue);
  if (!known_event(start) || !known_event(end)) return ret(cudaErrorInvalidResourceHandle);
  const SimEvent* a = reinterpret_cast<SimEvent*>(start);
  const SimEvent* b = reinterpret_cast<SimEvent*>(end);
  if ((a->flags & cudaEventDisableTiming) || (b->flags & cudaEventDisableTiming)) return ret(cudaErrorInvalidResourceHandle);
  if (!a->recorded || !b->recorded) return ret(cudaErrorInvalidResourceHandle);
  *ms = static_cast<float>(b->ms - a->ms);
  return cudaSuccess;
}

// ---- device ------------------------------------------------------------------------------------------

cudaError_t cudaGetDeviceCount(int* count) {
  ApiCall call("cudaGetDeviceCount");
  if (!count) return ret(cudaErrorInvalidValue);
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  ApiCall call("cudaSetDevice");
  if (device != 0) return ret(cudaErrorInvalidDevice);
  g_current_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  ApiCall call("cudaGetDevice");
  if (!device) return ret(cudaErrorInvalidValue);
  *device = g_current_device;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  ApiCall call("cudaGetDeviceProperties");
  if (!prop) return ret(cudaErrorInvalidValue);
  if (device != 0) return ret(cudaErrorInvalidDevice);
  const DeviceLimits& l = device_limits();
  std::memset(prop, 0, sizeof *prop);
  std::snprintf(prop->name, sizeof prop->name, "%s", l.name);
  prop->totalGlobalMem = l.global_mem;
  prop->sharedMemPerBlock = l.smem_per_block;
  prop->sharedMemPerBlockOptin = l.smem_per_block_optin;
  prop->sharedMemPerMultiprocessor = l.smem_per_sm;
  prop->regsPerBlock = 65536;
  prop->regsPerMultiprocessor = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 2147483647;
  prop->maxGridSize[1] = 65535;
  prop->maxGridSize[2] = 65535;
  prop->major = l.major;
  prop->minor = l.minor;
  prop->multiProcessorCount = l.sm_count;
  prop->maxThreadsPerMultiProcessor = l.major == 8 && l.minor == 6 ? 1536 : 2048;
  prop->l2CacheSize = 50 * 1024 * 1024;
  prop->totalConstMem = 65536;
  prop->memoryBusWidth = 5120;
  prop->concurrentKernels = 1;
  prop->unifiedAddressing = 1;
  return cudaSuccess;
}
// A simulated device sits on no PCI bus: callers that look the device up elsewhere (NVML) find
// nothing to look up.
cudaError_t cudaDeviceGetPCIBusId(char* pci_bus_id, int len, int device) {
  if (!pci_bus_id || len <= 0) return ret(cudaErrorInvalidValue);
  if (device != 0) return ret(cudaErrorInvalidDevice);
  return ret(cudaErrorNotSupported);
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  ApiCall call("cudaDeviceGetAttribute");
  if (!value) return ret(cudaErrorInvalidValue);
  if (device != 0) return ret(cudaErrorInvalidDevice);
  const DeviceLimits& l = device_limits();
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = static_cast<int>(l.smem_per_block); break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = static_cast<int>(l.smem_per_block_optin); break;
    case cudaDevAttrMultiProcessorCount: *value = l.sm_count; break;
    case cudaDevAttrComputeCapabilityMajor: *value = l.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = l.minor; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    default: return ret(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
  ApiCall call("cudaRuntimeGetVersion");
  if (!v) return ret(cudaErrorInvalidValue);
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
  ApiCall call("cudaDriverGetVersion");
  if (!v) return ret(cudaErrorInvalidValue);
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  ApiCall call("cudaFuncSetAttribute");
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) return ret(set_kernel_max_dynamic_smem(func, value));
  if (attr == cudaFuncAttributePreferredSharedMemoryCarveout)
    return value >= -1 && value <= 100 ? cudaSuccess : ret(cudaErrorInvalidValue);
  return ret(cudaErrorInvalidValue);
}
cudaError_t cudaProfilerStart(void) {
  ApiCall call("cudaProfilerStart");
  return cudaSuccess;
}
cudaError_t cudaProfilerStop(void) {
  ApiCall call("cudaProfilerStop");
  return cudaSuccess;
}

// ---- errors ------------------------------------------------------------------------------------------

cudaError_t cudaGetLastError(void) {
  ApiCall call("cudaGetLastError");
  return take_error();
}
cudaError_t cudaPeekAtLastError(void) {
  ApiCall call("cudaPeekAtLastError");
  return peek_error();
}

#define CUDASIM_ERRORS(X)                                                       \
  X(cudaSuccess, "no error")                                                    \
  X(cudaErrorInvalidValue, "invalid argument")                                  \
  X(cudaErrorMemoryAllocation, "out of memory")                                 \
  X(cudaErrorInitializationError, "initialization error")                       \
  X(cudaErrorCudartUnloading, "driver shutting down")                           \
  X(cudaErrorInvalidConfiguration, "invalid configuration argument")            \
  X(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy")       \
  X(cudaErrorInvalidDeviceFunction, "invalid device function")                  \
  X(cudaErrorNoDevice, "no CUDA-capable device is detected")                    \
  X(cudaErrorInvalidDevice, "invalid device ordinal")                           \
  X(cudaErrorInvalidResourceHandle, "invalid resource handle")                  \
  X(cudaErrorNotReady, "device not ready")                                      \
  X(cudaErrorIllegalAddress, "an illegal memory access was encountered")        \
  X(cudaErrorLaunchOutOfResources, "too many resources requested for launch")   \
  X(cudaErrorLaunchFailure, "unspecified launch failure")                       \
  X(cudaErrorNotSupported, "operation not supported")

const char* cudaGetErrorName(cudaError_t error) {
  ApiCall call("cudaGetErrorName");
#define CUDASIM_NAME(e, s) \
  if (error == e) return #e;
  CUDASIM_ERRORS(CUDASIM_NAME)
#undef CUDASIM_NAME
  return "cudaErrorUnknown";
}
const char* cudaGetErrorString(cudaError_t error) {
  ApiCall call("cudaGetErrorString");
#define CUDASIM_STRING(e, s) \
  if (error == e) return s;
  CUDASIM_ERRORS(CUDASIM_STRING)
#undef CUDASIM_STRING
  return "unknown error";
}

}  // extern "C"
