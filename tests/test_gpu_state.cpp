// runtime/gpu_state: NVML loaded at run time. Run twice by ctest: against tests/fake_nvml.c
// (ACTBENCH_EXPECT_FAKE_NVML=1: its readings come back formatted) and against a library that
// does not exist (every field empty, nothing thrown).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "runtime/gpu_state.hpp"

using namespace actbench;

namespace {
bool expect_fake() {
  const char* v = std::getenv("ACTBENCH_EXPECT_FAKE_NVML");
  return v && std::string(v) == "1";
}
}  // namespace

TEST(GpuState, ReadsThroughTheLoadedLibraryOrLeavesFieldsEmpty) {
  const GpuState s = read_gpu_state("00000000:01:00.0");
  if (expect_fake()) {
    EXPECT_EQ(s.sm_clock_mhz, "1980");
    EXPECT_EQ(s.mem_clock_mhz, "2619");
    EXPECT_EQ(s.power_limit_w, "700.0");
    EXPECT_EQ(s.throttle_reasons, "0x4");
  } else {
    EXPECT_EQ(s.sm_clock_mhz, "");
    EXPECT_EQ(s.mem_clock_mhz, "");
    EXPECT_EQ(s.power_limit_w, "");
    EXPECT_EQ(s.throttle_reasons, "");
  }
}

TEST(GpuState, UnknownDeviceGivesEmptyFields) {
  const GpuState s = read_gpu_state("00000000:99:00.0");
  EXPECT_EQ(s.sm_clock_mhz, "");
  EXPECT_EQ(s.throttle_reasons, "");
  EXPECT_EQ(read_gpu_state("").power_limit_w, "");
}
