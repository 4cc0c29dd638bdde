#pragma once
// The fixture of the simulator's own tests that read its reports: each test starts with none
// and no pending error, and must end with none unless it took them (reported).
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <string>

#include "cudasim/sim.hpp"

namespace cudasim_tests {

class ReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cudasim::take_reports();
    (void)cudaGetLastError();
  }
  void TearDown() override {
    EXPECT_EQ(cudasim::report_count(), 0u) << cudasim::reports_text();
    cudasim::take_reports();
    (void)cudaGetLastError();
  }
  // Takes the reports; true when one of kind `kind` is among them (their text in *text).
  static bool reported(const std::string& kind, std::string* text = nullptr) {
    bool found = false;
    std::string all;
    for (const cudasim::Report& r : cudasim::take_reports()) {
      found |= r.kind == kind;
      all += "[" + r.kind + "] " + r.message + "\n";
    }
    if (text) *text = all;
    return found;
  }
};

}  // namespace cudasim_tests
