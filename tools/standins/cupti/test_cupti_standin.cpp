// The CUPTI activity stand-in: records reach the client through its buffer callbacks, are
// read back with cuptiActivityGetNextRecord, and external correlation follows the documented
// rule (one record per non-empty external stack ahead of each runtime/driver API record).
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "tools/standins/cupti/cupti_standin.h"

namespace {

struct Seen {
  CUpti_ActivityKind kind = CUPTI_ACTIVITY_KIND_INVALID;
  uint32_t correlation = 0;
  uint64_t external = 0, start = 0, end = 0;
  CUpti_ExternalCorrelationKind external_kind = CUPTI_EXTERNAL_CORRELATION_KIND_INVALID;
  std::string name;
};
std::vector<Seen> seen;
int buffers_completed = 0;
size_t buffer_bytes = 4096;

void CUPTIAPI requested(uint8_t** buffer, size_t* size, size_t* max_records) {
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
    ASSERT_EQ(cuptiActivityRegisterCallbacks(&requested, &completed), CUPTI_SUCCESS);
  }
  void TearDown() override { actbench_cupti_standin_reset(); }
  // One launch: the runtime call, then its kernel.
  uint32_t launch(const char* name, uint64_t t) {
    const uint32_t c = actbench_cupti_standin_api_call(CUPTI_ACTIVITY_KIND_RUNTIME, 0, t, t + 1);
    const int32_t grid[3] = {4, 1, 1}, block[3] = {128, 1, 1};
    actbench_cupti_standin_kernel(c, name, t + 2, t + 10, 7, grid, block);
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
  EXPECT_EQ(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), CUPTI_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(cuptiActivityRegisterCallbacks(nullptr, &completed), CUPTI_ERROR_INVALID_PARAMETER);
  const char* str = nullptr;
  EXPECT_EQ(cuptiGetResultString(CUPTI_ERROR_QUEUE_EMPTY, &str), CUPTI_SUCCESS);
  EXPECT_STREQ(str, "CUPTI_ERROR_QUEUE_EMPTY");
  CUpti_Activity* r = nullptr;
  uint8_t dummy[8] = {};
  EXPECT_EQ(cuptiActivityGetNextRecord(dummy, 0, &r), CUPTI_ERROR_MAX_LIMIT_REACHED);
}

}  // namespace
