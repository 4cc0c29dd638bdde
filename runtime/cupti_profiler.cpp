#include "runtime/cupti_profiler.hpp"

#include "runtime/error.hpp"

#if ACTBENCH_HAVE_CUPTI
#include <cupti.h>

#include <cstdlib>
#include <mutex>
#endif

namespace actbench {

#if ACTBENCH_HAVE_CUPTI

#define CUPTI_CHECK(call)                                                                     \
  do {                                                                                        \
    CUptiResult status_ = (call);                                                             \
    if (status_ != CUPTI_SUCCESS) {                                                           \
      const char* msg_ = nullptr;                                                             \
      cuptiGetResultString(status_, &msg_);                                                   \
      throw_failure(__FILE__, __LINE__, std::string(#call) + ": " + (msg_ ? msg_ : "?"));     \
    }                                                                                         \
  } while (0)

namespace {

class CuptiProfilerImpl;
CuptiProfilerImpl* g_active = nullptr;  // CUPTI's callbacks carry no user pointer

constexpr size_t kBufferBytes = 8 << 20;

// What is enabled, and why. CUPTI writes an EXTERNAL_CORRELATION record only in front of an
// activity API record, i.e. a RUNTIME or DRIVER record, created inside a pushed external id
// (cupti_activity.h, cuptiActivityPushExternalCorrelationId: "When a CUPTI activity API record
// is created while within an external API region and CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION
// is enabled, the activity API record will be preceded by a CUpti_ActivityExternalCorrelation
// record"; https://docs.nvidia.com/cupti/api/group__CUPTI__ACTIVITY__API.html). Without
// RUNTIME and DRIVER every kernel would be "other". Their records are read past. MEMCPY and
// MEMSET: emulated collectives are device copies and fills are memsets; their correlation id
// is that of the API call that issued them, like a kernel's.
constexpr CUpti_ActivityKind kKinds[] = {
    CUPTI_ACTIVITY_KIND_RUNTIME,        CUPTI_ACTIVITY_KIND_DRIVER, CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION,
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET};

class CuptiProfilerImpl final : public CuptiProfiler {
 public:
  ~CuptiProfilerImpl() override {
    if (running_) {
      try {
        stop();
      } catch (...) {
      }
    }
  }
  void start() override {
    if (g_active && g_active != this) throw RuntimeFailure("another CUPTI profiler is active");
    g_active = this;
    CUPTI_CHECK(cuptiActivityRegisterCallbacks(&buffer_requested, &buffer_completed));
    for (CUpti_ActivityKind kind : kKinds) CUPTI_CHECK(cuptiActivityEnable(kind));
    running_ = true;
  }
  void stop() override {
    if (!running_) return;
    CUPTI_CHECK(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
    for (CUpti_ActivityKind kind : kKinds) CUPTI_CHECK(cuptiActivityDisable(kind));
    // Records CUPTI had no buffer space for (the global queue, where CUPTI puts every record
    // unless per-context buffers are asked for): non-zero means the per-phase sums are short,
    // so the count goes into the CSV. The call resets the count.
    size_t dropped = 0;
    CUPTI_CHECK(cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped));
    dropped_ += static_cast<int64_t>(dropped);
    running_ = false;
    g_active = nullptr;
  }
  int64_t dropped_records() const override { return dropped_; }
  std::vector<PhaseTime> breakdown() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return attribute_kernels(kernels_, correlations_, ids_);
  }
  void clear() override {
    std::lock_guard<std::mutex> lock(mutex_);
    kernels_.clear();
    correlations_.clear();
    dropped_ = 0;
  }
  void enter(const std::string& phase) override {
    uint64_t id;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      id = ids_.id_of(phase);
    }
    CUPTI_CHECK(cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, id));
  }
  void exit() override {
    uint64_t last = 0;
    CUPTI_CHECK(cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &last));
  }

 private:
  static void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
    *size = *buffer ? kBufferBytes : 0;
    *max_records = 0;  // as many as fit
  }
  static void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
    if (g_active) g_active->consume(buffer, valid);
    std::free(buffer);
  }
  void consume(uint8_t* buffer, size_t valid) {
    std::lock_guard<std::mutex> lock(mutex_);
    CUpti_Activity* record = nullptr;
    while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
      if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || record->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        kernels_.push_back({k->correlationId, k->start, k->end});
      } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        kernels_.push_back({m->correlationId, m->start, m->end});
      } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        kernels_.push_back({m->correlationId, m->start, m->end});
      } else if (record->kind == CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION) {
        const auto* e = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(record);
        if (e->externalKind == CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0)
          correlations_.push_back({e->correlationId, e->externalId});
      }
    }
  }

  mutable std::mutex mutex_;  // buffers complete on CUPTI's thread
  PhaseIds ids_;
  std::vector<KernelRecord> kernels_;
  std::vector<ExternalCorrelationRecord> correlations_;
  bool running_ = false;
  int64_t dropped_ = 0;
};

}  // namespace

std::unique_ptr<CuptiProfiler> CuptiProfiler::create() { return std::make_unique<CuptiProfilerImpl>(); }
bool cupti_available() { return true; }

#else

std::unique_ptr<CuptiProfiler> CuptiProfiler::create() {
  throw InvalidArgument("--cupti: this build has no CUPTI (built without the CUDA toolkit)");
}
bool cupti_available() { return false; }

#endif

}  // namespace actbench
