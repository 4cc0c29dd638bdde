#pragma once
// What the tests of the counters, the kernel report and the kernel bounds share: a device buffer
// filled on the host (device_buffer.hpp), and a fixture that turns counting on (and back as it was), starts from no
// counted launch and no report, and fails the test on any simulator report.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <vector>

#include "cudasim/counters.hpp"
#include "cudasim/sim.hpp"
#include "tests/device_buffer.hpp"  // Dev

namespace cudasim_tests {

class CountingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cudasim::counters_available());
    was_on_ = cudasim::counters_enabled();
    ASSERT_TRUE(cudasim::set_counters(true));
    cudasim::take_counted_launches();
    cudasim::take_reports();
    (void)cudaGetLastError();
  }
  void TearDown() override {
    cudasim::set_counters(was_on_);
    EXPECT_EQ(cudasim::report_count(), 0u) << cudasim::reports_text();
    cudasim::take_reports();
  }

 private:
  bool was_on_ = false;
};

}  // namespace cudasim_tests
