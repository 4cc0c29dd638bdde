#include "cudasim/cudasim.h"  // first: this file holds a kernel for the simulator
// layer_run --cupti's profiler (runtime/cupti_profiler.cpp, unchanged) on the simulated
// runtime and the CUPTI stand-in: kernels, copies and sets launched inside PhaseRanges are
// attributed to the innermost open phase, work outside every phase to "other", and each
// phase's GPU time lies within the host time of its ranges.

__global__ void add_one(float* y, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) y[i] += 1.0f;
}

// The device built-ins are macros; the CUDA driver headers cupti.h includes use the names.
#undef threadIdx
#undef blockIdx
#undef blockDim
#undef gridDim

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "runtime/cupti_profiler.hpp"
#include "runtime/error.hpp"
#include "runtime/timing.hpp"
#include "tools/standins/cupti/cupti_standin.h"

namespace {

using actbench::CuptiProfiler;
using actbench::PhaseLog;
using actbench::PhaseRange;

void add_one_on(float* y, int n, cudaStream_t stream) {
  ::cudasim::launcher(__FILE__, __LINE__, "add_one", add_one, dim3((n + 63) / 64), dim3(64), 0, stream)(y, n);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(CuptiProfilerOnSim, PhasesGetTheirKernelsCopiesAndSets) {
  actbench_cupti_standin_reset();
  ASSERT_TRUE(actbench::cupti_available());
  constexpr int n = 1000;
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  float *a = nullptr, *b = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&a), n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&b), n * sizeof(float)), cudaSuccess);

  auto profiler = CuptiProfiler::create();
  PhaseLog log;
  log.set_listener(profiler.get());
  profiler->start();
  {
    PhaseRange fwd("fwd.mlp", &log);
    ASSERT_EQ(cudaMemsetAsync(a, 0, n * sizeof(float), stream), cudaSuccess);  // 1 set
    add_one_on(a, n, stream);                                                   // 1 kernel
    {
      PhaseRange inner("recompute.mlp", &log);  // innermost phase wins
      add_one_on(a, n, stream);
      add_one_on(a, n, stream);
    }
    add_one_on(a, n, stream);
  }
  add_one_on(a, n, stream);  // outside every phase
  {
    PhaseRange comm("comm.all_reduce", &log);
    ASSERT_EQ(cudaMemcpyAsync(b, a, n * sizeof(float), cudaMemcpyDeviceToDevice, stream), cudaSuccess);
  }
  profiler->stop();
  log.set_listener(nullptr);

  std::vector<float> host(n);
  ASSERT_EQ(cudaMemcpy(host.data(), b, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  for (int i = 0; i < n; ++i) ASSERT_EQ(host[i], 5.0f) << i;  // every launch ran once

  std::map<std::string, actbench::PhaseTime> rows;
  for (const auto& r : profiler->breakdown()) rows[r.phase] = r;
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows["fwd.mlp"].kernels, 3);  // set, two kernels
  EXPECT_EQ(rows["recompute.mlp"].kernels, 2);
  EXPECT_EQ(rows["other"].kernels, 1);
  EXPECT_EQ(rows["comm.all_reduce"].kernels, 1);  // the copy
  for (const auto& [phase, row] : rows) EXPECT_GT(row.gpu_ms, 0.0) << phase;
  // Work runs inside its phase's range (inner ranges are inside the outer one).
  const auto& host_ms = log.totals();
  EXPECT_LE(rows["fwd.mlp"].gpu_ms + rows["recompute.mlp"].gpu_ms, host_ms.at("fwd.mlp"));
  EXPECT_LE(rows["recompute.mlp"].gpu_ms, host_ms.at("recompute.mlp"));
  EXPECT_LE(rows["comm.all_reduce"].gpu_ms, host_ms.at("comm.all_reduce"));
  EXPECT_EQ(profiler->dropped_records(), 0);

  // Nothing is recorded after stop().
  add_one_on(a, n, stream);
  int64_t total = 0;
  for (const auto& r : profiler->breakdown()) total += r.kernels;
  EXPECT_EQ(total, 7);

  ASSERT_EQ(cudaFree(a), cudaSuccess);
  ASSERT_EQ(cudaFree(b), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  actbench_cupti_standin_reset();
}

}  // namespace
