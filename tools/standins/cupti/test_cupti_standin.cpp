// The CUPTI activity stand-in: records reach the client through its buffer callbacks, are
// read back with cuptiActivityGetNextRecord, and external correlation follows the documented
// rule (one record per non-empty external stack ahead of each runtime/driver API record),
// copies and sets carry their call's correlation id, and records without buffer space are
// counted as dropped.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "tools/standins/cupti/cupti_standin.h"

namespace {

struct Seen {
  CUpti_ActivityKind kind = CUPTI_ACTIVITY_KIND_INVALID;
  uint32_t correlation = 0;
  uint64_t external = 0, start = 0, end = 0;
  CUpti_ExternalCorrelationKind external_kind = CUPTI_EXTERNAL_CORRELATION_KIND_INVALID;
  std::string name;
  uint32_t stream = 0, device = 0, context = 0, flags = 0, copy_kind = 0, src_kind = 0, dst_kind = 0, value = 0;
  uint64_t bytes = 0;
  int32_t grid[3] = {}, block[3] = {}, dynamic_smem = 0;
};
std::vector<Seen> seen;
int buffers_completed = 0;
size_t buffer_bytes = 4096;
bool decline = false;  // the client gives no buffer

void CUPTIAPI requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  if (decline) {
    *buffer = nullptr;
    *size = 0;
    *max_records = 0;
    return;
  }
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, buffer_bytes));
  *size = buffer_bytes;
  *max_records = 0;
}
void CUPTIAPI completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  ++buffers_completed;
  CUpti_Activity* r = nullptr;
  CUptiResult st;
  while ((st = cuptiActivityGetNextRecord(buffer, valid, &r)) == CUPTI_SUCCESS) {
    Seen s;
    s.kind = r->kind;
    s.correlation = 0;
    if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || r->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(r);
      s.correlation = k->correlationId;
      s.start = k->start;
      s.end = k->end;
      s.name = k->name;
      s.stream = k->streamId;
      s.device = k->deviceId;
      s.context = k->contextId;
      s.grid[0] = k->gridX, s.grid[1] = k->gridY, s.grid[2] = k->gridZ;
      s.block[0] = k->blockX, s.block[1] = k->blockY, s.block[2] = k->blockZ;
      s.dynamic_smem = k->dynamicSharedMemory;
    } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(r);
      s.correlation = m->correlationId;
      EXPECT_EQ(m->runtimeCorrelationId, m->correlationId);
      s.start = m->start;
      s.end = m->end;
      s.stream = m->streamId;
      s.device = m->deviceId;
      s.context = m->contextId;
      s.flags = m->flags;
      s.copy_kind = m->copyKind;
      s.src_kind = m->srcKind;
      s.dst_kind = m->dstKind;
      s.bytes = m->bytes;
    } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(r);
      s.correlation = m->correlationId;
      s.start = m->start;
      s.end = m->end;
      s.stream = m->streamId;
      s.device = m->deviceId;
      s.context = m->contextId;
      s.flags = m->flags;
      s.value = m->value;
      s.bytes = m->bytes;
      s.dst_kind = m->memoryKind;
    } else if (r->kind == CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION) {
      const auto* e = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(r);
      s.correlation = e->correlationId;
      s.external = e->externalId;
      s.external_kind = e->externalKind;
    } else {
      const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(r);
      s.correlation = a->correlationId;
      s.start = a->start;
      s.end = a->end;
    }
    seen.push_back(s);
  }
  EXPECT_EQ(st, CUPTI_ERROR_MAX_LIMIT_REACHED);
  std::free(buffer);
}

class CuptiStandin : public ::testing::Test {
 protected:
  void SetUp() override {
    actbench_cupti_standin_reset();
    seen.clear();
    buffers_completed = 0;
    buffer_bytes = 4096;
    decline = false;
    ASSERT_EQ(cuptiActivityRegisterCallbacks(&requested, &completed), CUPTI_SUCCESS);
  }
  void TearDown() override { actbench_cupti_standin_reset(); }
  // One launch: the runtime call, then its kernel.
  uint32_t launch(const char* name, uint64_t t) {
    const uint32_t c = actbench_cupti_standin_api_call(CUPTI_ACTIVITY_KIND_RUNTIME, 0, t, t + 1);
    const int32_t grid[3] = {4, 1, 1}, block[3] = {128, 1, 1};
    actbench_cupti_standin_kernel(c, name, t + 2, t + 10, 7, grid, block, 256);
    return c;
  }
};

TEST_F(CuptiStandin, ExternalIdsPrecedeApiRecordsAndKernelsShareTheirCorrelation) {
  for (auto k : {CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                 CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION})
    ASSERT_EQ(cuptiActivityEnable(k), CUPTI_SUCCESS);
  const uint32_t outside = launch("before", 0);
  ASSERT_EQ(cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, 11), CUPTI_SUCCESS);
  const uint32_t in_outer = launch("outer", 100);
  ASSERT_EQ(cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, 22), CUPTI_SUCCESS);
  ASSERT_EQ(cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM1, 99), CUPTI_SUCCESS);
  const uint32_t in_inner = launch("inner", 200);
  uint64_t last = 0;
  ASSERT_EQ(cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM1, &last), CUPTI_SUCCESS);
  EXPECT_EQ(last, 99u);
  ASSERT_EQ(cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &last), CUPTI_SUCCESS);
  EXPECT_EQ(last, 22u);
  const uint32_t back_outer = launch("outer again", 300);
  ASSERT_EQ(cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &last), CUPTI_SUCCESS);
  EXPECT_EQ(last, 11u);
  EXPECT_EQ(cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &last),
            CUPTI_ERROR_QUEUE_EMPTY);
  EXPECT_EQ(buffers_completed, 0);  // nothing is delivered before a flush (the buffer is not full)
  ASSERT_EQ(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), CUPTI_SUCCESS);
  EXPECT_EQ(buffers_completed, 1);

  // Expected stream: [API, K] [X11, API, K] [X22, X99, API, K] [X11, API, K].
  const std::vector<std::pair<CUpti_ActivityKind, uint32_t>> want = {
      {CUPTI_ACTIVITY_KIND_RUNTIME, outside},
      {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, outside},
      {CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION, in_outer},
      {CUPTI_ACTIVITY_KIND_RUNTIME, in_outer},
      {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, in_outer},
      {CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION, in_inner},
      {CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION, in_inner},
      {CUPTI_ACTIVITY_KIND_RUNTIME, in_inner},
      {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, in_inner},
      {CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION, back_outer},
      {CUPTI_ACTIVITY_KIND_RUNTIME, back_outer},
      {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, back_outer}};
  ASSERT_EQ(seen.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(seen[i].kind, want[i].first) << i;
    EXPECT_EQ(seen[i].correlation, want[i].second) << i;
  }
  EXPECT_EQ(seen[2].external, 11u);
  EXPECT_EQ(seen[5].external, 22u);  // the top of CUSTOM0's stack, not the bottom
  EXPECT_EQ(seen[5].external_kind, CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0);
  EXPECT_EQ(seen[6].external, 99u);
  EXPECT_EQ(seen[6].external_kind, CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM1);
  EXPECT_EQ(seen[9].external, 11u);
  EXPECT_EQ(seen[4].name, "outer");
  EXPECT_EQ(seen[4].start, 102u);
  EXPECT_EQ(seen[4].end, 110u);
  EXPECT_EQ(seen[4].stream, 7u);
  EXPECT_EQ(seen[4].device, ACTBENCH_CUPTI_STANDIN_DEVICE_ID);
  EXPECT_EQ(seen[4].context, ACTBENCH_CUPTI_STANDIN_CONTEXT_ID);
  EXPECT_EQ(seen[4].grid[0], 4);
  EXPECT_EQ(seen[4].block[0], 128);
  EXPECT_EQ(seen[4].block[2], 1);
  EXPECT_EQ(seen[4].dynamic_smem, 256);
  EXPECT_NE(outside, in_outer);
}

TEST_F(CuptiStandin, NoExternalRecordsWithoutApiRecords) {
  // External correlation records accompany runtime/driver API records only: with the API
  // kinds disabled, kernels still come, but no external correlation does.
  ASSERT_EQ(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), CUPTI_SUCCESS);
  ASSERT_EQ(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION), CUPTI_SUCCESS);
  ASSERT_EQ(cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, 5), CUPTI_SUCCESS);
  launch("k", 0);
  cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, nullptr);
  ASSERT_EQ(cuptiActivityFlushAll(0), CUPTI_SUCCESS);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].kind, CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
}

TEST_F(CuptiStandin, KernelKindFallsBackAndDisabledKindsEmitNothing) {
  launch("nothing enabled", 0);
  ASSERT_EQ(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_KERNEL), CUPTI_SUCCESS);
  launch("serial", 10);
  ASSERT_EQ(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_KERNEL), CUPTI_SUCCESS);
  launch("disabled again", 20);
  ASSERT_EQ(cuptiActivityFlushAll(0), CUPTI_SUCCESS);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].kind, CUPTI_ACTIVITY_KIND_KERNEL);
  EXPECT_EQ(seen[0].name, "serial");
}

TEST_F(CuptiStandin, FullBuffersAreCompletedAndNoRecordIsLost) {
  buffer_bytes = 3 * sizeof(CUpti_ActivityKernel10) + 8;  // three kernel records per buffer
  ASSERT_EQ(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), CUPTI_SUCCESS);
  for (int i = 0; i < 10; ++i) launch("k", 100 * i);
  EXPECT_EQ(buffers_completed, 3);  // 9 records in three full buffers, the tenth held
  ASSERT_EQ(cuptiActivityFlushAll(0), CUPTI_SUCCESS);
  EXPECT_EQ(buffers_completed, 4);
  ASSERT_EQ(seen.size(), 10u);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(seen[i].start, 100u * i + 2);
}

TEST_F(CuptiStandin, RejectsInvalidArguments) {
  EXPECT_EQ(cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_INVALID, 1),
            CUPTI_ERROR_INVALID_PARAMETER);
  EXPECT_EQ(cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2, nullptr),
            CUPTI_ERROR_QUEUE_EMPTY);
  EXPECT_EQ(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_INVALID), CUPTI_ERROR_INVALID_KIND);
  EXPECT_EQ(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY2), CUPTI_ERROR_NOT_SUPPORTED);  // peer copies
  EXPECT_EQ(cuptiActivityGetNumDroppedRecords(nullptr, 0, nullptr), CUPTI_ERROR_INVALID_PARAMETER);
  EXPECT_EQ(cuptiActivityRegisterCallbacks(nullptr, &completed), CUPTI_ERROR_INVALID_PARAMETER);
  const char* str = nullptr;
  EXPECT_EQ(cuptiGetResultString(CUPTI_ERROR_QUEUE_EMPTY, &str), CUPTI_SUCCESS);
  EXPECT_STREQ(str, "CUPTI_ERROR_QUEUE_EMPTY");
  CUpti_Activity* r = nullptr;
  uint8_t dummy[8] = {};
  EXPECT_EQ(cuptiActivityGetNextRecord(dummy, 0, &r), CUPTI_ERROR_MAX_LIMIT_REACHED);
}

TEST_F(CuptiStandin, CopiesAndSetsCarryTheirCallsCorrelation) {
  for (auto k : {CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET,
                 CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION})
    ASSERT_EQ(cuptiActivityEnable(k), CUPTI_SUCCESS);
  ASSERT_EQ(cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, 3), CUPTI_SUCCESS);
  const uint32_t copy = actbench_cupti_standin_api_call(CUPTI_ACTIVITY_KIND_RUNTIME, 41, 10, 20);
  actbench_cupti_standin_memcpy(copy, CUPTI_ACTIVITY_MEMCPY_KIND_HTOD, CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE,
                                CUPTI_ACTIVITY_MEMORY_KIND_DEVICE, 4096, 12, 18, 5, 1);
  const uint32_t set = actbench_cupti_standin_api_call(CUPTI_ACTIVITY_KIND_RUNTIME, 49, 30, 40);
  actbench_cupti_standin_memset(set, 0xAB, 512, 31, 39, 1, 0);
  cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, nullptr);
  ASSERT_EQ(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMSET), CUPTI_SUCCESS);
  const uint32_t unseen = actbench_cupti_standin_api_call(CUPTI_ACTIVITY_KIND_RUNTIME, 49, 50, 60);
  actbench_cupti_standin_memset(unseen, 0, 8, 51, 59, 1, 0);
  ASSERT_EQ(cuptiActivityFlushAll(0), CUPTI_SUCCESS);

  // [X3, API copy, MEMCPY] [X3, API set, MEMSET] [API] (the last set's kind disabled)
  const std::vector<CUpti_ActivityKind> kinds = {
      CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION, CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_MEMCPY,
      CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION, CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_MEMSET,
      CUPTI_ACTIVITY_KIND_RUNTIME};
  ASSERT_EQ(seen.size(), kinds.size());
  for (size_t i = 0; i < kinds.size(); ++i) EXPECT_EQ(seen[i].kind, kinds[i]) << i;
  const Seen& c = seen[2];
  EXPECT_EQ(c.correlation, copy);
  EXPECT_EQ(c.bytes, 4096u);
  EXPECT_EQ(c.copy_kind, static_cast<uint32_t>(CUPTI_ACTIVITY_MEMCPY_KIND_HTOD));
  EXPECT_EQ(c.src_kind, static_cast<uint32_t>(CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE));
  EXPECT_EQ(c.dst_kind, static_cast<uint32_t>(CUPTI_ACTIVITY_MEMORY_KIND_DEVICE));
  EXPECT_EQ(c.flags, static_cast<uint32_t>(CUPTI_ACTIVITY_FLAG_MEMCPY_ASYNC));
  EXPECT_EQ(c.start, 12u);
  EXPECT_EQ(c.end, 18u);
  EXPECT_EQ(c.stream, 5u);
  EXPECT_EQ(c.context, ACTBENCH_CUPTI_STANDIN_CONTEXT_ID);
  const Seen& m = seen[5];
  EXPECT_EQ(m.correlation, set);
  EXPECT_EQ(seen[3].correlation, set);
  EXPECT_EQ(m.value, 0xABu);
  EXPECT_EQ(m.bytes, 512u);
  EXPECT_EQ(m.flags, 0u);  // synchronous
  EXPECT_EQ(m.dst_kind, static_cast<uint32_t>(CUPTI_ACTIVITY_MEMORY_KIND_DEVICE));
  EXPECT_EQ(m.start, 31u);
  EXPECT_EQ(m.stream, 1u);
  EXPECT_EQ(seen[6].correlation, unseen);
}

TEST_F(CuptiStandin, RecordsWithoutBufferAreDroppedAndCounted) {
  ASSERT_EQ(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME), CUPTI_SUCCESS);
  ASSERT_EQ(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), CUPTI_SUCCESS);
  size_t dropped = 99;
  ASSERT_EQ(cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped), CUPTI_SUCCESS);
  EXPECT_EQ(dropped, 0u);
  decline = true;
  launch("lost", 0);  // an API record and a kernel record, both without a buffer
  launch("lost too", 100);
  decline = false;
  launch("kept", 200);
  ASSERT_EQ(cuptiActivityFlushAll(0), CUPTI_SUCCESS);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1].name, "kept");
  // The stand-in has only the global queue: a context's own queue never drops anything.
  int some_context = 0;
  ASSERT_EQ(cuptiActivityGetNumDroppedRecords(reinterpret_cast<CUcontext>(&some_context), 0, &dropped),
            CUPTI_SUCCESS);
  EXPECT_EQ(dropped, 0u);
  ASSERT_EQ(cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped), CUPTI_SUCCESS);
  EXPECT_EQ(dropped, 4u);
  ASSERT_EQ(cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped), CUPTI_SUCCESS);
  EXPECT_EQ(dropped, 0u);  // the query resets the count

  // A buffer too small for the record: dropped too, and the buffer goes back empty.
  buffer_bytes = 16;
  launch("too big", 300);
  EXPECT_EQ(seen.size(), 2u);
  ASSERT_EQ(cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped), CUPTI_SUCCESS);
  EXPECT_EQ(dropped, 2u);
  // Disabled kinds are not dropped records: nothing was to be recorded.
  ASSERT_EQ(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_RUNTIME), CUPTI_SUCCESS);
  ASSERT_EQ(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), CUPTI_SUCCESS);
  decline = true;
  launch("not recorded", 400);
  ASSERT_EQ(cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped), CUPTI_SUCCESS);
  EXPECT_EQ(dropped, 0u);
}

}  // namespace
