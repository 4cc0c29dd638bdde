// kernels/cuda/async_copy.cuh (cp.async) on the simulator: a double-buffered pipeline is exact
// under every schedule; wait_group completes exactly the groups the PTX ISA says (all but the
// N most recent committed ones, never the open group) and a zero fill writes zeros; each of
// the pipeline's bugs shows under the schedule that lands copies at the end it gets wrong
// (round-robin: at the wait; greedy: at the issue), and in the race variant as a race; bad
// addresses and copies never waited for are reported.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cudasim/sim.hpp"
#include "tests/cuda/sim_test_kernels.hpp"
#include "tests/device_buffer.hpp"
#include "tests/report_test.hpp"

using namespace cudasim_tests;

namespace {

bool operator==(const uint4& a, const uint4& b) { return a.x == b.x && a.y == b.y && a.z == b.z && a.w == b.w; }

// Chunk c of the input: four words that name it.
uint4 chunk(uint32_t c) { return uint4{4 * c, 4 * c + 1, 4 * c + 2, 4 * c + 3}; }
const uint4 kZero{0u, 0u, 0u, 0u};
const uint4 kPoison{~0u, ~0u, ~0u, ~0u};  // unwritten shared memory

class AsyncCopy : public ReportTest {
 protected:
  void SetUp() override {
    saved_ = cudasim::schedule();
    ReportTest::SetUp();
  }
  void TearDown() override {
    cudasim::set_schedule(saved_);
    ReportTest::TearDown();
  }
  static constexpr int kTiles = 5, kChunks = 64 * kTiles;
  // The pipeline with `bug` under `s`: its launch's error, and whether out is what the correct
  // kernel writes.
  static cudaError_t pipeline(int bug, cudasim::Schedule s, bool* exact) {
    cudasim::set_schedule(s, 3);
    std::vector<uint4> in(kChunks);
    for (int c = 0; c < kChunks; ++c) in[c] = chunk(c);
    Dev<uint4> din(in), dout(kChunks);
    const cudaError_t e = async_pipeline(dout.p, din.p, kTiles, bug);
    const std::vector<uint4> out = dout.get();
    *exact = true;
    for (int t = 0; t < kTiles; ++t)
      for (int i = 0; i < 64; ++i) *exact &= out[t * 64 + i] == chunk(t * 64 + 63 - i);
    return e;
  }

 private:
  cudasim::Schedule saved_ = cudasim::Schedule::round_robin;
};

TEST_F(AsyncCopy, DoubleBufferedPipelineIsExactUnderEverySchedule) {
  for (auto s : {cudasim::Schedule::round_robin, cudasim::Schedule::greedy, cudasim::Schedule::random}) {
    SCOPED_TRACE(cudasim::schedule_name(s));
    bool exact = false;
    EXPECT_EQ(pipeline(0, s, &exact), cudaSuccess) << cudasim::reports_text();
    EXPECT_TRUE(exact);
  }
}

TEST_F(AsyncCopy, WaitGroupCompletesAllButTheNewestGroupsAndNeverTheOpenOne) {
  cudasim::set_schedule(cudasim::Schedule::round_robin);  // copies land at their wait
  std::vector<uint4> in = {chunk(10), chunk(11), chunk(12), chunk(13)};
  Dev<uint4> din(in), dout(12, kZero);
  ASSERT_EQ(async_groups(dout.p, din.p, false), cudaSuccess) << cudasim::reports_text();
  std::vector<uint4> out = dout.get();
  EXPECT_TRUE(out[0] == chunk(10));  // wait_group 1: A, the older group, has landed
  EXPECT_TRUE(out[4] == chunk(10));  // wait_group 0: A and B (a copy and a zero fill)
  EXPECT_TRUE(out[5] == chunk(11));
  EXPECT_TRUE(out[6] == kZero);
  EXPECT_TRUE(out[8] == chunk(10) && out[9] == chunk(11) && out[10] == kZero);
  EXPECT_TRUE(out[11] == chunk(13));  // D, once committed and waited for

  // Read before their waits: B, its zero fill and the open group's D have not landed. The race
  // variant reports those reads; elsewhere they see shared memory as it was (unwritten).
  ASSERT_EQ(async_groups(dout.p, din.p, true), cudasim::race_checker_enabled() ? cudaErrorLaunchFailure : cudaSuccess);
  std::string text;
  if (cudasim::race_checker_enabled()) {
    EXPECT_TRUE(reported("race", &text)) << text;
    EXPECT_NE(text.find("cp.async not yet waited for"), std::string::npos) << text;
    return;
  }
  out = dout.get();
  EXPECT_TRUE(out[1] == kPoison && out[2] == kPoison && out[3] == kPoison);
  EXPECT_TRUE(out[7] == kPoison);  // wait_group 0 does not wait for uncommitted copies
  EXPECT_TRUE(out[11] == chunk(13));
}

TEST_F(AsyncCopy, UnderGreedyEveryCopyLandsAtItsIssue) {
  cudasim::set_schedule(cudasim::Schedule::greedy);
  std::vector<uint4> in = {chunk(10), chunk(11), chunk(12), chunk(13)};
  Dev<uint4> din(in), dout(12, kZero);
  // Landed at their issue, the copies are the thread's own plain writes by the early reads:
  // not races, even in the race variant (they would be on a GPU; round-robin shows it).
  ASSERT_EQ(async_groups(dout.p, din.p, true), cudaSuccess) << cudasim::reports_text();
  const std::vector<uint4> out = dout.get();
  EXPECT_TRUE(out[1] == chunk(11) && out[2] == kZero && out[3] == chunk(13));
}

// Round-robin lands a copy at its wait: a read with no wait before it sees stale bytes.
TEST_F(AsyncCopy, AMissingWaitIsAWrongResultOrARace) {
  bool exact = true;
  const cudaError_t e = pipeline(1, cudasim::Schedule::round_robin, &exact);
  EXPECT_EQ(e, cudasim::race_checker_enabled() ? cudaErrorLaunchFailure : cudaSuccess);
  EXPECT_FALSE(exact);
  std::string text;
  if (cudasim::race_checker_enabled()) {
    EXPECT_TRUE(reported("race", &text)) << text;
    EXPECT_NE(text.find("cp.async not yet waited for"), std::string::npos) << text;
  }
}

// A thread's wait covers its own copies only: the others' need the barrier.
TEST_F(AsyncCopy, AMissingBarrierAfterTheWaitIsAWrongResultOrARace) {
  for (auto s : {cudasim::Schedule::round_robin, cudasim::Schedule::greedy}) {
    SCOPED_TRACE(cudasim::schedule_name(s));
    bool exact = true;
    const cudaError_t e = pipeline(2, s, &exact);
    EXPECT_FALSE(exact);
    std::string text;
    if (cudasim::race_checker_enabled() && s == cudasim::Schedule::round_robin) {
      EXPECT_EQ(e, cudaErrorLaunchFailure);
      EXPECT_TRUE(reported("race", &text)) << text;
    }
    cudasim::take_reports();
  }
}

// Greedy lands a copy at its issue: the refill of a buffer other threads still read shows.
TEST_F(AsyncCopy, ARefillWithNoBarrierAfterTheReadsIsAWrongResultOrARace) {
  bool exact = true;
  pipeline(4, cudasim::Schedule::greedy, &exact);
  EXPECT_FALSE(exact);
  cudasim::take_reports();
  if (!cudasim::race_checker_enabled()) return;
  EXPECT_EQ(pipeline(4, cudasim::Schedule::round_robin, &exact), cudaErrorLaunchFailure);
  std::string text;
  EXPECT_TRUE(reported("race", &text)) << text;
  EXPECT_NE(text.find("cp.async"), std::string::npos) << text;
}

TEST_F(AsyncCopy, BadAddressesAreReported) {
  const struct {
    int bug;
    const char* says;
  } cases[] = {{5, "destination is not 16-byte aligned"},
               {6, "destination does not hold 16 bytes of shared memory"},
               {8, "source is in shared memory"}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.says);
    bool exact = true;
    EXPECT_EQ(pipeline(c.bug, cudasim::Schedule::round_robin, &exact), cudaErrorLaunchFailure);
    std::string text;
    EXPECT_TRUE(reported("async", &text)) << text;
    EXPECT_NE(text.find(c.says), std::string::npos) << text;
    EXPECT_NE(text.find("async_copy.cu:"), std::string::npos) << text;  // the kernel's line
  }
}

TEST_F(AsyncCopy, ACopyNeverWaitedForIsReportedUnderEverySchedule) {
  for (auto s : {cudasim::Schedule::round_robin, cudasim::Schedule::greedy}) {
    SCOPED_TRACE(cudasim::schedule_name(s));
    bool exact = false;
    EXPECT_EQ(pipeline(7, s, &exact), cudaErrorLaunchFailure);
    std::string text;
    EXPECT_TRUE(reported("async", &text)) << text;
    EXPECT_NE(text.find("never waited for"), std::string::npos) << text;
    EXPECT_NE(text.find("async_copy.cu:"), std::string::npos) << text;
  }
}

}  // namespace
