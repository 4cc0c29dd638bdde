#include "cudasim/cudasim.h"  // first: this file holds a kernel for the simulator
// The simulated runtime (tools/cudasim) reporting through the bridge to the CUPTI stand-in,
// read with the CUPTI activity API as runtime/cupti_profiler.cpp uses it: every runtime call
// is one API record (a call made inside another is not one of its own), kernels, copies and
// sets carry their call's correlation id and lie within its times, the external correlation
// id pushed around a region precedes each API record made inside it and no other, and a
// launch the runtime rejects is an API call without a kernel.

__global__ void scale_add(float* y, const float* x, float a, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) y[i] = a * x[i] + y[i];
}

// The device built-ins are macros; the CUDA driver headers cupti.h includes use the names.
#undef threadIdx
#undef blockIdx
#undef blockDim
#undef gridDim

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "cudasim/activity.hpp"
#include "tools/standins/cupti/cupti_standin.h"

namespace {

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call
#define CUPTI_OK(call) ASSERT_EQ((call), CUPTI_SUCCESS) << #call

// One record as the client read it.
struct Rec {
  CUpti_ActivityKind kind = CUPTI_ACTIVITY_KIND_INVALID;
  uint32_t correlation = 0, cbid = 0, stream = 0, flags = 0, copy_kind = 0, value = 0;
  uint64_t start = 0, end = 0, bytes = 0, external = 0;
  CUpti_ExternalCorrelationKind external_kind = CUPTI_EXTERNAL_CORRELATION_KIND_INVALID;
  std::string name;
  int32_t grid[3] = {}, block[3] = {};
};
std::vector<Rec> records;

void CUPTIAPI requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  constexpr size_t kBytes = 1 << 16;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBytes));
  *size = *buffer ? kBytes : 0;
  *max_records = 0;
}

void CUPTIAPI completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* r = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
    Rec x;
    x.kind = r->kind;
    switch (r->kind) {
      case CUPTI_ACTIVITY_KIND_RUNTIME:
      case CUPTI_ACTIVITY_KIND_DRIVER: {
        const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(r);
        x.correlation = a->correlationId;
        x.cbid = a->cbid;
        x.start = a->start;
        x.end = a->end;
        break;
      }
      case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
        const auto* e = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(r);
        x.correlation = e->correlationId;
        x.external = e->externalId;
        x.external_kind = e->externalKind;
        break;
      }
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(r);
        x.correlation = k->correlationId;
        x.start = k->start;
        x.end = k->end;
        x.stream = k->streamId;
        x.name = k->name;
        x.grid[0] = k->gridX, x.grid[1] = k->gridY, x.grid[2] = k->gridZ;
        x.block[0] = k->blockX, x.block[1] = k->blockY, x.block[2] = k->blockZ;
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(r);
        x.correlation = m->correlationId;
        x.start = m->start;
        x.end = m->end;
        x.stream = m->streamId;
        x.bytes = m->bytes;
        x.flags = m->flags;
        x.copy_kind = m->copyKind;
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(r);
        x.correlation = m->correlationId;
        x.start = m->start;
        x.end = m->end;
        x.stream = m->streamId;
        x.bytes = m->bytes;
        x.flags = m->flags;
        x.value = m->value;
        break;
      }
      default: break;
    }
    records.push_back(x);
  }
  std::free(buffer);
}

// The kinds runtime/cupti_profiler.cpp enables.
constexpr CUpti_ActivityKind kKinds[] = {
    CUPTI_ACTIVITY_KIND_RUNTIME,           CUPTI_ACTIVITY_KIND_DRIVER, CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION,
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET};

class CudasimCupti : public ::testing::Test {
 protected:
  void SetUp() override {
    actbench_cupti_standin_reset();
    records.clear();
    CUPTI_OK(cuptiActivityRegisterCallbacks(&requested, &completed));
    for (CUpti_ActivityKind k : kKinds) CUPTI_OK(cuptiActivityEnable(k));
  }
  void TearDown() override { actbench_cupti_standin_reset(); }

  // The API record of each correlation id, and the work records.
  const Rec* api(uint32_t correlation) const {
    for (const Rec& r : records)
      if (r.kind == CUPTI_ACTIVITY_KIND_RUNTIME && r.correlation == correlation) return &r;
    return nullptr;
  }
  std::vector<const Rec*> of_kind(CUpti_ActivityKind kind) const {
    std::vector<const Rec*> out;
    for (const Rec& r : records)
      if (r.kind == kind) out.push_back(&r);
    return out;
  }
};

TEST_F(CudasimCupti, RecordsOfARegionCarryItsExternalIdAndWorkItsCallsCorrelation) {
  constexpr int n = 200;
  constexpr uint64_t kPhase = 42;
  std::vector<float> host_x(n), host_y(n, -1.0f);
  for (int i = 0; i < n; ++i) host_x[i] = 0.5f * static_cast<float>(i) - 7.0f;

  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));  // calls cudaStreamCreate inside
  const uint64_t region_start = cudasim::activity::now_ns();
  CUPTI_OK(cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, kPhase));
  float *x = nullptr, *y = nullptr;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&x), n * sizeof(float)));
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&y), n * sizeof(float)));
  CUDA_OK(cudaMemcpyAsync(x, host_x.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream));
  CUDA_OK(cudaMemsetAsync(y, 0, n * sizeof(float), stream));
  ::cudasim::launcher(__FILE__, __LINE__, "scale_add", scale_add, dim3(4), dim3(64), 0, stream)(y, x, 2.0f, n);
  CUDA_OK(cudaGetLastError());
  // 2048 threads per block: the runtime rejects the launch, nothing runs.
  ::cudasim::launcher(__FILE__, __LINE__, "scale_add", scale_add, dim3(1), dim3(2048), 0, stream)(y, x, 100.0f, n);
  ASSERT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  uint64_t popped = 0;
  CUPTI_OK(cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &popped));
  ASSERT_EQ(popped, kPhase);
  const uint64_t region_end = cudasim::activity::now_ns();
  ::cudasim::launcher(__FILE__, __LINE__, "scale_add", scale_add, dim3(4), dim3(64), 0, stream)(y, x, 1.0f, n);
  CUDA_OK(cudaMemcpy(host_y.data(), y, n * sizeof(float), cudaMemcpyDefault));  // resolved: device to host
  CUDA_OK(cudaFree(x));
  CUDA_OK(cudaFree(y));
  CUDA_OK(cudaStreamDestroy(stream));
  CUPTI_OK(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
  size_t dropped = 1;
  CUPTI_OK(cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped));
  EXPECT_EQ(dropped, 0u);
  for (int i = 0; i < n; ++i) ASSERT_EQ(host_y[i], 3.0f * host_x[i]) << i;  // the two launches that ran

  // Every runtime call is one API record, in call order (no record for the calls made inside
  // cudaStreamCreateWithFlags and cudaMemcpyAsync/cudaMemsetAsync).
  const std::vector<CUpti_CallbackId> want_calls = {
      CUPTI_RUNTIME_TRACE_CBID_cudaStreamCreateWithFlags_v5000, CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020,
      CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020,                CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020,
      CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_v3020,           CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000,
      CUPTI_RUNTIME_TRACE_CBID_cudaGetLastError_v3020,          CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000,
      CUPTI_RUNTIME_TRACE_CBID_cudaGetLastError_v3020,          CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000,
      CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_v3020,                CUPTI_RUNTIME_TRACE_CBID_cudaFree_v3020,
      CUPTI_RUNTIME_TRACE_CBID_cudaFree_v3020,                  CUPTI_RUNTIME_TRACE_CBID_cudaStreamDestroy_v5050};
  const auto calls = of_kind(CUPTI_ACTIVITY_KIND_RUNTIME);
  ASSERT_EQ(calls.size(), want_calls.size());
  for (size_t i = 0; i < calls.size(); ++i) EXPECT_EQ(calls[i]->cbid, want_calls[i]) << "call " << i;
  EXPECT_TRUE(of_kind(CUPTI_ACTIVITY_KIND_DRIVER).empty());  // the simulated runtime makes no driver calls

  // External correlation: exactly the API records made inside the region are preceded by one
  // record of the pushed id, with their correlation id; those outside by none.
  int inside = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    if (records[i].kind != CUPTI_ACTIVITY_KIND_RUNTIME) continue;
    const Rec& call = records[i];
    const bool in_region = call.start >= region_start && call.end <= region_end;
    const bool has_external = i > 0 && records[i - 1].kind == CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
    EXPECT_EQ(has_external, in_region) << "API record " << i << " cbid " << call.cbid;
    if (has_external) {
      EXPECT_EQ(records[i - 1].correlation, call.correlation);
      EXPECT_EQ(records[i - 1].external, kPhase);
      EXPECT_EQ(records[i - 1].external_kind, CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0);
      ++inside;
    }
  }
  EXPECT_EQ(inside, 8);  // cudaMalloc x2, cudaMemcpyAsync, cudaMemsetAsync, 2 launches, 2 cudaGetLastError
  EXPECT_EQ(of_kind(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION).size(), 8u);

  // Work: carries its call's correlation id, lies within the call's times, and follows it.
  auto check_work = [&](const Rec* w, CUpti_CallbackId cbid) {
    const Rec* call = api(w->correlation);
    ASSERT_NE(call, nullptr) << "no API record with correlation " << w->correlation;
    EXPECT_EQ(call->cbid, cbid);
    EXPECT_LE(call->start, w->start);
    EXPECT_LE(w->start, w->end);
    EXPECT_LE(w->end, call->end);
    EXPECT_LT(call - records.data(), w - records.data());
  };
  const auto kernels = of_kind(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  ASSERT_EQ(kernels.size(), 2u);  // the rejected launch has none
  for (const Rec* k : kernels) {
    check_work(k, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000);
    EXPECT_EQ(k->name, "scale_add");
    EXPECT_EQ(k->grid[0], 4);
    EXPECT_EQ(k->grid[1], 1);
    EXPECT_EQ(k->grid[2], 1);
    EXPECT_EQ(k->block[0], 64);
    EXPECT_EQ(k->block[1], 1);
    EXPECT_EQ(k->block[2], 1);
  }
  EXPECT_EQ(kernels[0]->correlation, calls[5]->correlation);
  EXPECT_EQ(kernels[1]->correlation, calls[9]->correlation);
  EXPECT_EQ(kernels[0]->stream, kernels[1]->stream);
  for (const Rec& r : records)  // the rejected launch: its API record (and external id) only
    if (r.correlation == calls[7]->correlation) {
      EXPECT_TRUE(r.kind == CUPTI_ACTIVITY_KIND_RUNTIME || r.kind == CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION)
          << "kind " << r.kind;
    }

  const auto copies = of_kind(CUPTI_ACTIVITY_KIND_MEMCPY);
  ASSERT_EQ(copies.size(), 2u);
  check_work(copies[0], CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020);
  EXPECT_EQ(copies[0]->copy_kind, static_cast<uint32_t>(CUPTI_ACTIVITY_MEMCPY_KIND_HTOD));
  EXPECT_EQ(copies[0]->bytes, n * sizeof(float));
  EXPECT_EQ(copies[0]->flags, static_cast<uint32_t>(CUPTI_ACTIVITY_FLAG_MEMCPY_ASYNC));
  EXPECT_EQ(copies[0]->stream, kernels[0]->stream);
  check_work(copies[1], CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_v3020);
  EXPECT_EQ(copies[1]->copy_kind, static_cast<uint32_t>(CUPTI_ACTIVITY_MEMCPY_KIND_DTOH));
  EXPECT_EQ(copies[1]->flags, 0u);
  EXPECT_NE(copies[1]->stream, kernels[0]->stream);  // the default stream

  const auto sets = of_kind(CUPTI_ACTIVITY_KIND_MEMSET);
  ASSERT_EQ(sets.size(), 1u);
  check_work(sets[0], CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_v3020);
  EXPECT_EQ(sets[0]->bytes, n * sizeof(float));
  EXPECT_EQ(sets[0]->value, 0u);
  EXPECT_EQ(sets[0]->flags, static_cast<uint32_t>(CUPTI_ACTIVITY_FLAG_MEMSET_ASYNC));
  EXPECT_EQ(sets[0]->stream, kernels[0]->stream);

  // Correlation ids are unique per API record.
  for (size_t i = 0; i < calls.size(); ++i)
    for (size_t j = i + 1; j < calls.size(); ++j) EXPECT_NE(calls[i]->correlation, calls[j]->correlation);
}

TEST_F(CudasimCupti, FailedCallsAreRecordedAndIssueNoWork) {
  float* y = nullptr;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&y), 64));
  std::vector<float> host(32);
  // Past the end of the allocation: rejected, so no copy or set ran.
  EXPECT_EQ(cudaMemcpy(y, host.data(), 128, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemset(y, 0, 128), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpyAsync(y, host.data(), 16, cudaMemcpyHostToDevice, reinterpret_cast<cudaStream_t>(&host)),
            cudaErrorInvalidResourceHandle);  // not a stream
  (void)cudaGetLastError();
  CUDA_OK(cudaFree(y));
  CUPTI_OK(cuptiActivityFlushAll(0));
  EXPECT_EQ(of_kind(CUPTI_ACTIVITY_KIND_RUNTIME).size(), 6u);
  EXPECT_TRUE(of_kind(CUPTI_ACTIVITY_KIND_MEMCPY).empty());
  EXPECT_TRUE(of_kind(CUPTI_ACTIVITY_KIND_MEMSET).empty());
  EXPECT_TRUE(of_kind(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION).empty());  // nothing pushed
}

TEST_F(CudasimCupti, WithoutRuntimeRecordsKernelsStillComeButNoExternalCorrelation) {
  // As CUPTI documents: external-correlation records accompany API records only.
  CUPTI_OK(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_RUNTIME));
  CUPTI_OK(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_DRIVER));
  float* y = nullptr;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&y), 64 * sizeof(float)));
  CUPTI_OK(cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, 7));
  ::cudasim::launcher(__FILE__, __LINE__, "scale_add", scale_add, dim3(1), dim3(64), 0, nullptr)(y, y, 0.0f, 64);
  CUPTI_OK(cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, nullptr));
  CUDA_OK(cudaFree(y));
  CUPTI_OK(cuptiActivityFlushAll(0));
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].kind, CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  EXPECT_GT(records[0].correlation, 0u);
}

}  // namespace
