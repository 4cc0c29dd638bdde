// The simulator itself: exact warp-collective and barrier semantics, coordinates, driver-like
// launch validation, runtime calls; and planted bugs (a removed barrier, a missing bounds
// guard, a lane leaving before a shuffle, a divergent barrier, unwritten shared memory) that
// must each be reported, while the correct copies of the same kernels report nothing.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "cudasim/sim.hpp"
#include "tests/cuda/sim_test_kernels.hpp"
#include "tests/device_buffer.hpp"
#include "tests/report_test.hpp"

using namespace cudasim_tests;

namespace {

bool asan_variant() { return std::string(CUDASIM_TEST_VARIANT) == "asan"; }


class Core : public ReportTest {
 protected:
  void TearDown() override {
    cudasim::set_schedule(cudasim::Schedule::round_robin);
    ReportTest::TearDown();
  }
};

// Expected results of the shuffles per the CUDA C++ Programming Guide (value = 10 * lane).
int expected_xor(int l, int m, int w) {
  const int j = l ^ m;
  return (j >= l / w * w + w) ? 10 * l : 10 * j;  // a later segment: own value
}

TEST_F(Core, ShuffleXorIdxUpDownFollowWidthAndSegments) {
  Dev<int> out(64);
  for (int width : {32, 16, 8, 2})
    for (int m : {1, 4, 8, 16}) {
      ASSERT_EQ(shfl_xor(out.p, 64, m, width), cudaSuccess) << cudasim::reports_text();
      const auto v = out.get();
      for (int t = 0; t < 64; ++t) ASSERT_EQ(v[t], expected_xor(t % 32, m, width) + 320 * (t / 32)) << t << " " << m << " " << width;
    }
  for (int width : {32, 8})
    for (int src : {0, 3, 35, -1}) {
      ASSERT_EQ(shfl_idx(out.p, 64, src, width), cudaSuccess);
      const auto v = out.get();
      for (int t = 0; t < 64; ++t) {
        const int l = t % 32, seg = l / width * width;
        ASSERT_EQ(v[t], 10 * (seg + ((src % width) + width) % width) + 320 * (t / 32)) << t << " src " << src;
      }
    }
  for (int width : {32, 16})
    for (int d : {1, 3}) {
      ASSERT_EQ(shfl_up(out.p, 32, d, width), cudaSuccess);
      auto v = out.get();
      for (int l = 0; l < 32; ++l) ASSERT_EQ(v[l], (l % width) >= d ? 10 * (l - d) : 10 * l) << l;
      ASSERT_EQ(shfl_down(out.p, 32, d, width), cudaSuccess);
      v = out.get();
      for (int l = 0; l < 32; ++l) ASSERT_EQ(v[l], (l % width) + d < width ? 10 * (l + d) : 10 * l) << l;
    }
}

TEST_F(Core, BallotCollectsThePredicateOfEveryLane) {
  Dev<unsigned> out(32);
  ASSERT_EQ(ballot(out.p, 32), cudaSuccess);
  unsigned want = 0;
  for (int l = 0; l < 32; l += 3) want |= 1u << l;
  for (unsigned v : out.get()) EXPECT_EQ(v, want);
}

TEST_F(Core, FullMaskShuffleInAPartialWarpIsReported) {
  Dev<int> out(48);  // warp 1 has lanes 0..15 only; the mask names 32
  EXPECT_EQ(shfl_xor(out.p, 48, 1, 32), cudaErrorLaunchFailure);
  std::string text;
  EXPECT_TRUE(reported("warp", &text)) << text;
  EXPECT_NE(text.find("semantics.cu:"), std::string::npos) << "reports name the kernel source line: " << text;
}

TEST_F(Core, BarriersCountOnlyThreadsThatHaveNotExitedUnderEverySchedule) {
  std::vector<float> in(256);
  double want = 0;
  for (int i = 0; i < 256; ++i) in[i] = 0.25f * static_cast<float>(i % 7) - 0.5f;
  for (int i = 0; i < 200; ++i) want += in[i];
  Dev<float> d_in(in), d_out(1);
  for (auto s : {cudasim::Schedule::round_robin, cudasim::Schedule::greedy, cudasim::Schedule::random}) {
    cudasim::set_schedule(s, 7);
    ASSERT_EQ(block_sum(d_out.p, d_in.p, 256, 200), cudaSuccess) << cudasim::reports_text();
    EXPECT_FLOAT_EQ(d_out.get()[0], static_cast<float>(want)) << cudasim::schedule_name(s);
  }
}

TEST_F(Core, CoordinatesOfEveryThread) {
  const dim3 grid(3, 2), block(5, 3);
  Dev<int> out(4 * 6 * 15);
  ASSERT_EQ(coordinates(out.p, grid, block), cudaSuccess);
  const auto v = out.get();
  for (int by = 0; by < 2; ++by)
    for (int bx = 0; bx < 3; ++bx)
      for (int ty = 0; ty < 3; ++ty)
        for (int tx = 0; tx < 5; ++tx) {
          const int g = (by * 3 + bx) * 15 + ty * 5 + tx;
          EXPECT_EQ(v[4 * g + 0], bx);
          EXPECT_EQ(v[4 * g + 1], by);
          EXPECT_EQ(v[4 * g + 2], tx);
          EXPECT_EQ(v[4 * g + 3], ty);
        }
  EXPECT_EQ(cudasim::last_launch_stats().blocks_run, 6u);
  EXPECT_EQ(cudasim::last_launch_stats().threads_run, 90u);
}

TEST_F(Core, LaunchValidationLikeTheDriver) {
  EXPECT_EQ(launch_config(dim3(1), dim3(1024)), cudaSuccess);
  EXPECT_EQ(launch_config(dim3(1), dim3(1025)), cudaErrorInvalidConfiguration);
  EXPECT_EQ(launch_config(dim3(1), dim3(32, 32, 2)), cudaErrorInvalidConfiguration);
  EXPECT_EQ(launch_config(dim3(1), dim3(1, 1, 65)), cudaErrorInvalidConfiguration);
  EXPECT_EQ(launch_config(dim3(1, 65536), dim3(1)), cudaErrorInvalidConfiguration);
  EXPECT_EQ(launch_config(dim3(0), dim3(1)), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "launch errors are not sticky";
  Dev<float> out(1);
  EXPECT_EQ(dynamic_smem(out.p, 48 * 1024, 0), cudaSuccess);
  EXPECT_EQ(out.get()[0], 48 * 256 - 1);
  EXPECT_EQ(dynamic_smem(out.p, 64 * 1024, 0), cudaErrorInvalidValue) << "above 48 KiB needs the opt-in";
  EXPECT_EQ(dynamic_smem(out.p, 200 * 1024, 200 * 1024), cudaSuccess) << "h100 opts in up to 227 KiB";
  EXPECT_EQ(dynamic_smem(out.p, 64 * 1024, 240 * 1024), cudaErrorInvalidValue);
  cudasim::set_device(cudasim::DeviceModel::a100);
  EXPECT_EQ(dynamic_smem(out.p, 200 * 1024, 200 * 1024), cudaErrorInvalidValue) << "a100: 163 KiB";
  EXPECT_EQ(dynamic_smem(out.p, 160 * 1024, 160 * 1024), cudaSuccess);
  cudasim::set_device(cudasim::DeviceModel::sm86);
  EXPECT_EQ(dynamic_smem(out.p, 100 * 1024, 100 * 1024), cudaErrorInvalidValue) << "sm_86: 99 KiB";
  cudaDeviceProp prop;
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  EXPECT_EQ(prop.sharedMemPerBlockOptin, 99u * 1024);
  EXPECT_EQ(prop.major * 10 + prop.minor, 86);
  cudasim::set_device(cudasim::DeviceModel::h100);
  (void)cudaGetLastError();
}

TEST_F(Core, RuntimeMemoryStreamsEventsAndErrors) {
  float* p = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), 10 * sizeof(float)), cudaSuccess);
  std::vector<float> v(10);
  ASSERT_EQ(cudaMemcpy(v.data(), p, sizeof(float) * 10, cudaMemcpyDeviceToHost), cudaSuccess);
  for (float x : v) EXPECT_TRUE(std::isnan(x)) << "fresh device memory reads as NaN";
  EXPECT_EQ(cudaMemcpy(v.data(), p, sizeof(float) * 11, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemset(p + 1, 0, sizeof(float) * 10), cudaErrorInvalidValue);
  ASSERT_EQ(cudaMemset(p, 0, sizeof(float) * 10), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(v.data(), p, sizeof(float) * 10, cudaMemcpyDeviceToHost), cudaSuccess);
  for (float x : v) EXPECT_EQ(x, 0.f);
  size_t free_before = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
  size_t free_after = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
  EXPECT_EQ(free_after - free_before, 10 * sizeof(float));
  EXPECT_EQ(cudaFree(p), cudaErrorInvalidValue) << "double free";
  (void)cudaGetLastError();

  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  cudaEvent_t a, b;
  ASSERT_EQ(cudaEventCreate(&a), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&b), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(a, s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(b, s), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(b), cudaSuccess);
  float ms = -1;
  ASSERT_EQ(cudaEventElapsedTime(&ms, a, b), cudaSuccess);
  EXPECT_GE(ms, 0.f);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaEventDestroy(a), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(b), cudaSuccess);
  EXPECT_STREQ(cudaGetErrorName(cudaErrorInvalidConfiguration), "cudaErrorInvalidConfiguration");
  EXPECT_STREQ(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory");
  (void)cudaGetLastError();
}

TEST_F(Core, StackOverflowOfASimulatedThreadIsNamed) {
  Dev<int> out(1);
  ASSERT_EQ(stack_overflow(out.p, 8), cudaSuccess) << "a few KiB of stack are fine";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(stack_overflow(out.p, 1000), asan_variant() ? "AddressSanitizer" : "stack overflow: thread \\(0,0,0\\)");
}

// ---- planted bugs --------------------------------------------------------------------------

std::vector<float> iota_values(int n) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = 0.5f * static_cast<float>(i % 97) - 3.f;
  return v;
}

TEST_F(Core, PlantedRemovedBarrierAfterATileLoad) {
  const int n = 300;
  const std::vector<float> in = iota_values(n);
  Dev<float> d_in(in), d_out(n);
  ASSERT_EQ(tile_reverse(d_out.p, d_in.p, n, 0), cudaSuccess) << cudasim::reports_text();
  const auto good = d_out.get();
  for (int i = 0; i < n; ++i) {
    const int base = i / 64 * 64, r = base + 63 - i % 64;
    ASSERT_EQ(good[i], r < n ? in[r] : 0.f) << i;
  }
  const cudaError_t e = tile_reverse(d_out.p, d_in.p, n, 1);
  std::string text;
  const bool race = reported("race", &text);
  const auto bad = d_out.get();
  bool wrong = false;
  for (int i = 0; i < n; ++i) wrong |= !(bad[i] == good[i]);
  if (cudasim::race_checker_enabled()) {
    EXPECT_TRUE(race) << "the race checker names the missing barrier: " << text;
    EXPECT_EQ(e, cudaErrorLaunchFailure);
  }
  EXPECT_TRUE(race || wrong) << "the removed barrier shows (NaN from unwritten shared memory)";
}

TEST_F(Core, PlantedRemovedBarrierAfterA16ByteTileLoad) {
  const int n4 = 128;  // two whole tiles of 64 float4
  const std::vector<float> in = iota_values(4 * n4);
  Dev<float> d_in(in), d_out(4 * n4);
  ASSERT_EQ(tile_reverse_vec(d_out.p, d_in.p, n4, 0), cudaSuccess) << cudasim::reports_text();
  const auto good = d_out.get();
  for (int i = 0; i < n4; ++i) {
    const int r = i / 64 * 64 + 63 - i % 64;
    for (int k = 0; k < 4; ++k) ASSERT_EQ(good[4 * i + k], in[4 * r + k]) << i;
  }
  const cudaError_t e = tile_reverse_vec(d_out.p, d_in.p, n4, 1);
  std::string text;
  const bool race = reported("race", &text);
  const auto bad = d_out.get();
  bool wrong = false;
  for (int i = 0; i < 4 * n4; ++i) wrong |= !(bad[i] == good[i]);
  if (cudasim::race_checker_enabled()) {
    EXPECT_TRUE(race) << "the race checker sees 16-byte aggregate copies: " << text;
    EXPECT_EQ(e, cudaErrorLaunchFailure);
  }
  EXPECT_TRUE(race || wrong) << "the removed barrier shows (NaN from unwritten shared memory)";
}

// atomicAdd on a float in global memory: the sum over 5 blocks is exact (small integers) and no
// race is reported; the same sum with a plain += is a race between the blocks.
TEST_F(Core, PlantedPlainAddInsteadOfAtomicAdd) {
  const int n = 300;
  Dev<float> d_in(iota_values(n)), d_out(std::vector<float>{0.f});
  ASSERT_EQ(atomic_sum(d_out.p, d_in.p, n, 0), cudaSuccess) << cudasim::reports_text();
  EXPECT_FALSE(reported("race")) << cudasim::reports_text();
  double sum = 0;
  for (float v : iota_values(n)) sum += v;
  EXPECT_EQ(d_out.get()[0], static_cast<float>(sum));
  const cudaError_t e = atomic_sum(d_out.p, d_in.p, n, 1);
  std::string text;
  const bool race = reported("race", &text);
  if (cudasim::race_checker_enabled()) {
    EXPECT_TRUE(race) << "the race checker sees the plain read-modify-write: " << text;
    EXPECT_EQ(e, cudaErrorLaunchFailure);
  }
}

TEST_F(Core, PlantedRemovedFirstBarrierOfABlockReduction) {
  const int rows = 5, cols = 1000;
  const std::vector<float> in = iota_values(rows * cols);
  Dev<float> d_in(in), d_out(rows);
  ASSERT_EQ(reduce_rows(d_out.p, d_in.p, rows, cols, 0), cudaSuccess) << cudasim::reports_text();
  const auto good = d_out.get();
  for (int r = 0; r < rows; ++r) {
    double s = 0;
    for (int c = 0; c < cols; ++c) s += in[r * cols + c];
    EXPECT_NEAR(good[r], s, 1e-3);
  }
  const cudaError_t e = reduce_rows(d_out.p, d_in.p, rows, cols, 1);
  std::string text;
  const bool race = reported("race", &text);
  const auto bad = d_out.get();
  bool wrong = false;
  for (int r = 0; r < rows; ++r) wrong |= !(bad[r] == good[r]);
  if (cudasim::race_checker_enabled()) {
    EXPECT_TRUE(race) << text;
    EXPECT_EQ(e, cudaErrorLaunchFailure);
  }
  EXPECT_TRUE(race || wrong);
}

TEST_F(Core, PlantedMissingBoundsGuard) {
  const int n = 100;  // 128 threads: 28 write past the end
  Dev<float> d_in(iota_values(n)), d_out(n);
  ASSERT_EQ(scale(d_out.p, d_in.p, n, 0), cudaSuccess) << cudasim::reports_text();
  if (asan_variant()) {
    // AddressSanitizer stops the process at the first out-of-bounds read (device buffers'
    // canaries are poisoned for it).
    GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process: no fibers inherited
    EXPECT_DEATH(scale(d_out.p, d_in.p, n, 1), "AddressSanitizer");
    return;
  }
  EXPECT_EQ(scale(d_out.p, d_in.p, n, 1), cudaErrorLaunchFailure);
  std::string text;
  const bool bounds = reported(cudasim::race_checker_enabled() ? "bounds" : "canary", &text);
  EXPECT_TRUE(bounds) << text;
  EXPECT_NE(text.find("past its end"), std::string::npos) << text;
}

TEST_F(Core, PlantedEarlyReturnBeforeAShuffle) {
  const int n = 256;
  Dev<float> d_in(iota_values(n)), d_out(n / 32);
  ASSERT_EQ(warp_sums(d_out.p, d_in.p, n, 0), cudaSuccess) << cudasim::reports_text();
  for (auto s : {cudasim::Schedule::round_robin, cudasim::Schedule::greedy}) {
    cudasim::set_schedule(s);
    EXPECT_EQ(warp_sums(d_out.p, d_in.p, n, 1), cudaErrorLaunchFailure);
    std::string text;
    EXPECT_TRUE(reported("warp", &text)) << text;
    EXPECT_NE(text.find("exited"), std::string::npos) << text;
    EXPECT_NE(text.find("planted.cu:"), std::string::npos) << text;
  }
}

TEST_F(Core, PlantedDivergentBarrier) {
  Dev<float> d_out(64);
  ASSERT_EQ(barrier_in_loop(d_out.p, 0), cudaSuccess) << cudasim::reports_text();
  for (float v : d_out.get()) EXPECT_EQ(v, 4.f);
  EXPECT_EQ(barrier_in_loop(d_out.p, 1), cudaErrorLaunchFailure);
  std::string text;
  EXPECT_TRUE(reported("divergence", &text)) << text;
}

TEST_F(Core, PlantedReadOfUnwrittenSharedMemory) {
  Dev<float> d_out(64);
  ASSERT_EQ(unwritten_shared(d_out.p, 0), cudaSuccess) << cudasim::reports_text();
  const cudaError_t e = unwritten_shared(d_out.p, 1);
  std::string text;
  const bool uninit = reported("uninit", &text);
  const auto v = d_out.get();
  EXPECT_TRUE(std::isnan(v[63 - 7])) << "shared memory starts as NaN in every block";
  if (cudasim::race_checker_enabled()) {
    EXPECT_TRUE(uninit) << text;
    EXPECT_EQ(e, cudaErrorLaunchFailure);
  }
}

}  // namespace
