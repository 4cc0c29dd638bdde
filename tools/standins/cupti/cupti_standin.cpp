// A stand-in for the CUPTI activity API subset runtime/cupti_profiler.cpp calls, written from
// the CUPTI documentation (cupti_activity.h): buffers come from the client's request callback
// and go back through its completion callback, records are read with
// cuptiActivityGetNextRecord, and external correlation ids are per-thread stacks whose top
// is reported, in a CUpti_ActivityExternalCorrelation record, ahead of each runtime/driver
// API record made inside the region. Records come from the hooks in cupti_standin.h. All go
// to CUPTI's global queue (the stand-in has no per-context buffers); a record the client
// gives no buffer for is dropped and counted (cuptiActivityGetNumDroppedRecords).
#include "tools/standins/cupti/cupti_standin.h"

#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace {

constexpr int kExternalKinds = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2 + 1;

struct State {
  std::mutex mutex;
  CUpti_BuffersCallbackRequestFunc request = nullptr;
  CUpti_BuffersCallbackCompleteFunc complete = nullptr;
  std::vector<bool> enabled = std::vector<bool>(CUPTI_ACTIVITY_KIND_COUNT, false);
  uint8_t* buffer = nullptr;  // the buffer being filled
  size_t size = 0, used = 0, max_records = 0, records = 0;
  uint32_t next_correlation = 1;
  int64_t next_grid_id = 1;
  size_t dropped = 0;  // records of the global queue without buffer space, since the last query
  std::set<std::string> names;  // kernel names outlive the records pointing at them
};

State& state() {
  static State s;
  return s;
}

thread_local std::vector<uint64_t> external_stacks[kExternalKinds];

size_t record_bytes(CUpti_ActivityKind kind) {
  size_t n = 0;
  switch (kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: n = sizeof(CUpti_ActivityKernel10); break;
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER: n = sizeof(CUpti_ActivityAPI); break;
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: n = sizeof(CUpti_ActivityExternalCorrelation); break;
    case CUPTI_ACTIVITY_KIND_MEMCPY: n = sizeof(CUpti_ActivityMemcpy6); break;
    case CUPTI_ACTIVITY_KIND_MEMSET: n = sizeof(CUpti_ActivityMemset4); break;
    default: return 0;
  }
  return (n + 7) / 8 * 8;  // records are 8-byte aligned in a buffer
}

bool supported_kind(CUpti_ActivityKind kind) { return record_bytes(kind) != 0; }

// Hands the held buffer back to the client. Caller holds the mutex.
void complete_buffer(State& s) {
  if (!s.buffer) return;
  uint8_t* b = s.buffer;
  const size_t size = s.size, used = s.used;
  s.buffer = nullptr;
  s.size = s.used = s.records = 0;
  if (s.complete) s.complete(nullptr, 0, b, size, used);
}

// Space for one record of `bytes`, or null when the client gives no buffer of sufficient
// size (the record is dropped and counted).
uint8_t* reserve(State& s, size_t bytes) {
  const bool full = s.buffer && (s.used + bytes > s.size || (s.max_records && s.records >= s.max_records));
  if (full) complete_buffer(s);
  if (!s.buffer) {
    uint8_t* b = nullptr;
    size_t size = 0, max_records = 0;
    if (s.request) s.request(&b, &size, &max_records);
    if (!b || size < bytes) {
      ++s.dropped;
      if (b && s.complete) s.complete(nullptr, 0, b, size, 0);  // too small: back, empty, to be freed
      return nullptr;
    }
    s.buffer = b;
    s.size = size;
    s.max_records = max_records;
  }
  uint8_t* at = s.buffer + s.used;
  std::memset(at, 0, bytes);
  s.used += bytes;
  ++s.records;
  return at;
}

// A zeroed record of device work (kernel, copy, set) with the fields all three carry: what it
// is, when it ran, where, and the API call that issued it. Null when the record is dropped.
template <class Record>
Record* new_work_record(State& s, CUpti_ActivityKind kind, uint32_t correlation_id, uint64_t start_ns,
                        uint64_t end_ns, uint32_t stream_id) {
  auto* r = reinterpret_cast<Record*>(reserve(s, record_bytes(kind)));
  if (!r) return nullptr;
  r->kind = kind;
  r->correlationId = correlation_id;
  r->start = start_ns;
  r->end = end_ns;
  r->deviceId = ACTBENCH_CUPTI_STANDIN_DEVICE_ID;
  r->contextId = ACTBENCH_CUPTI_STANDIN_CONTEXT_ID;
  r->streamId = stream_id;
  return r;
}

}  // namespace

extern "C" {

CUptiResult CUPTIAPI cuptiGetResultString(CUptiResult result, const char** str) {
  if (!str) return CUPTI_ERROR_INVALID_PARAMETER;
  switch (result) {
    case CUPTI_SUCCESS: *str = "CUPTI_SUCCESS"; break;
    case CUPTI_ERROR_INVALID_PARAMETER: *str = "CUPTI_ERROR_INVALID_PARAMETER"; break;
    case CUPTI_ERROR_INVALID_KIND: *str = "CUPTI_ERROR_INVALID_KIND"; break;
    case CUPTI_ERROR_MAX_LIMIT_REACHED: *str = "CUPTI_ERROR_MAX_LIMIT_REACHED"; break;
    case CUPTI_ERROR_QUEUE_EMPTY: *str = "CUPTI_ERROR_QUEUE_EMPTY"; break;
    case CUPTI_ERROR_NOT_SUPPORTED: *str = "CUPTI_ERROR_NOT_SUPPORTED"; break;
    default: *str = "CUPTI_ERROR_UNKNOWN (CUPTI stand-in)"; return CUPTI_ERROR_INVALID_PARAMETER;
  }
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc funcBufferRequested,
                                                    CUpti_BuffersCallbackCompleteFunc funcBufferCompleted) {
  if (!funcBufferRequested || !funcBufferCompleted) return CUPTI_ERROR_INVALID_PARAMETER;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.request = funcBufferRequested;
  s.complete = funcBufferCompleted;
  return CUPTI_SUCCESS;
}

// Only the kinds the stand-in can produce; others are CUPTI_ERROR_NOT_SUPPORTED.
CUptiResult CUPTIAPI cuptiActivityEnable(CUpti_ActivityKind kind) {
  if (kind <= CUPTI_ACTIVITY_KIND_INVALID || kind >= CUPTI_ACTIVITY_KIND_COUNT) return CUPTI_ERROR_INVALID_KIND;
  if (!supported_kind(kind)) return CUPTI_ERROR_NOT_SUPPORTED;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.enabled[kind] = true;
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityDisable(CUpti_ActivityKind kind) {
  if (kind <= CUPTI_ACTIVITY_KIND_INVALID || kind >= CUPTI_ACTIVITY_KIND_COUNT) return CUPTI_ERROR_INVALID_KIND;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.enabled[kind] = false;
  return CUPTI_SUCCESS;
}

// Every record is complete as soon as it is written, so a flush returns the held buffer.
CUptiResult CUPTIAPI cuptiActivityFlushAll(uint32_t flag) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  complete_buffer(s);
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityGetNextRecord(uint8_t* buffer, size_t validBufferSizeBytes, CUpti_Activity** record) {
  if (!buffer || !record) return CUPTI_ERROR_INVALID_PARAMETER;
  size_t offset = 0;
  if (*record) {
    const size_t bytes = record_bytes((*record)->kind);
    if (bytes == 0) return CUPTI_ERROR_INVALID_KIND;
    offset = static_cast<size_t>(reinterpret_cast<uint8_t*>(*record) - buffer) + bytes;
  }
  if (offset >= validBufferSizeBytes) return CUPTI_ERROR_MAX_LIMIT_REACHED;
  *record = reinterpret_cast<CUpti_Activity*>(buffer + offset);
  return CUPTI_SUCCESS;
}

// The stand-in fills only the global queue (context NULL); a context's own queue is never
// used, so its count is 0. Either count is reset by the query, as documented.
CUptiResult CUPTIAPI cuptiActivityGetNumDroppedRecords(CUcontext context, uint32_t streamId, size_t* dropped) {
  if (!dropped) return CUPTI_ERROR_INVALID_PARAMETER;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  *dropped = 0;
  if (!context) {
    *dropped = s.dropped;
    s.dropped = 0;
  }
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityPushExternalCorrelationId(CUpti_ExternalCorrelationKind kind, uint64_t id) {
  if (kind <= CUPTI_EXTERNAL_CORRELATION_KIND_INVALID || kind >= kExternalKinds) return CUPTI_ERROR_INVALID_PARAMETER;
  external_stacks[kind].push_back(id);
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityPopExternalCorrelationId(CUpti_ExternalCorrelationKind kind, uint64_t* lastId) {
  if (kind <= CUPTI_EXTERNAL_CORRELATION_KIND_INVALID || kind >= kExternalKinds) return CUPTI_ERROR_INVALID_PARAMETER;
  auto& stack = external_stacks[kind];
  if (stack.empty()) return CUPTI_ERROR_QUEUE_EMPTY;
  if (lastId) *lastId = stack.back();
  stack.pop_back();
  return CUPTI_SUCCESS;
}

// ---- hooks -----------------------------------------------------------------------------

uint32_t actbench_cupti_standin_api_call(CUpti_ActivityKind api_kind, CUpti_CallbackId cbid, uint64_t start_ns,
                                         uint64_t end_ns) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  const uint32_t correlation = s.next_correlation++;
  const bool api = api_kind == CUPTI_ACTIVITY_KIND_RUNTIME || api_kind == CUPTI_ACTIVITY_KIND_DRIVER;
  if (!api || !s.enabled[api_kind]) return correlation;  // no API record, so no external one either
  if (s.enabled[CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION])
    for (int kind = CUPTI_EXTERNAL_CORRELATION_KIND_UNKNOWN; kind < kExternalKinds; ++kind) {
      const auto& stack = external_stacks[kind];
      if (stack.empty()) continue;
      auto* e = reinterpret_cast<CUpti_ActivityExternalCorrelation*>(
          reserve(s, record_bytes(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION)));
      if (!e) continue;
      e->kind = CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
      e->externalKind = static_cast<CUpti_ExternalCorrelationKind>(kind);
      e->externalId = stack.back();
      e->correlationId = correlation;
    }
  if (auto* a = reinterpret_cast<CUpti_ActivityAPI*>(reserve(s, record_bytes(api_kind)))) {
    a->kind = api_kind;
    a->cbid = cbid;
    a->start = start_ns;
    a->end = end_ns;
    a->correlationId = correlation;
  }
  return correlation;
}

void actbench_cupti_standin_kernel(uint32_t correlation_id, const char* name, uint64_t start_ns, uint64_t end_ns,
                                   uint32_t stream_id, const int32_t grid[3], const int32_t block[3],
                                   int32_t dynamic_shared_bytes) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  CUpti_ActivityKind kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
  if (!s.enabled[kind]) kind = CUPTI_ACTIVITY_KIND_KERNEL;
  if (!s.enabled[kind]) return;
  const int64_t grid_id = s.next_grid_id++;
  auto* k = new_work_record<CUpti_ActivityKernel10>(s, kind, correlation_id, start_ns, end_ns, stream_id);
  if (!k) return;
  k->completed = end_ns;  // no child kernels
  k->queued = k->submitted = CUPTI_TIMESTAMP_UNKNOWN;  // latency timestamps are not enabled
  k->gridId = grid_id;
  k->dynamicSharedMemory = dynamic_shared_bytes;
  k->name = s.names.insert(name ? name : "").first->c_str();
  if (grid) {
    k->gridX = grid[0];
    k->gridY = grid[1];
    k->gridZ = grid[2];
  }
  if (block) {
    k->blockX = block[0];
    k->blockY = block[1];
    k->blockZ = block[2];
  }
}

void actbench_cupti_standin_memcpy(uint32_t correlation_id, CUpti_ActivityMemcpyKind copy_kind,
                                   CUpti_ActivityMemoryKind src_kind, CUpti_ActivityMemoryKind dst_kind, uint64_t bytes,
                                   uint64_t start_ns, uint64_t end_ns, uint32_t stream_id, int async) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.enabled[CUPTI_ACTIVITY_KIND_MEMCPY]) return;
  auto* m = new_work_record<CUpti_ActivityMemcpy6>(s, CUPTI_ACTIVITY_KIND_MEMCPY, correlation_id, start_ns, end_ns,
                                                   stream_id);
  if (!m) return;
  m->copyKind = static_cast<uint8_t>(copy_kind);
  m->srcKind = static_cast<uint8_t>(src_kind);
  m->dstKind = static_cast<uint8_t>(dst_kind);
  m->flags = async ? CUPTI_ACTIVITY_FLAG_MEMCPY_ASYNC : 0;
  m->bytes = bytes;
  m->runtimeCorrelationId = correlation_id;  // correlationId too: the runtime call, no driver call
  m->copyCount = 1;
}

void actbench_cupti_standin_memset(uint32_t correlation_id, uint32_t value, uint64_t bytes, uint64_t start_ns,
                                   uint64_t end_ns, uint32_t stream_id, int async) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.enabled[CUPTI_ACTIVITY_KIND_MEMSET]) return;
  auto* m = new_work_record<CUpti_ActivityMemset4>(s, CUPTI_ACTIVITY_KIND_MEMSET, correlation_id, start_ns, end_ns,
                                                   stream_id);
  if (!m) return;
  m->value = value;
  m->bytes = bytes;
  m->flags = async ? CUPTI_ACTIVITY_FLAG_MEMSET_ASYNC : 0;
  m->memoryKind = CUPTI_ACTIVITY_MEMORY_KIND_DEVICE;
}

void actbench_cupti_standin_reset(void) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  complete_buffer(s);
  s.request = nullptr;
  s.complete = nullptr;
  s.enabled.assign(CUPTI_ACTIVITY_KIND_COUNT, false);
  s.next_correlation = 1;
  s.next_grid_id = 1;
  s.dropped = 0;
  for (auto& stack : external_stacks) stack.clear();
}

}  // extern "C"
