// The three recompute modes compute the same layer: same output, same gradients, because
// recomputation regenerates the dropout masks from the Philox counter.
#include <gtest/gtest.h>

#include "layer_harness.hpp"

using namespace actbench;
using namespace actbench::testing;

namespace {
const LayerDims kDims = {12, 3, 30, 5};  // head size 6, nothing a power of two

std::vector<CanonicalTensor> run(const std::string& config, DType dtype, float dropout) {
  auto be = make_cpu_backend();
  auto comm = make_local_communicator();
  return run_layer_canonical(*be, *comm, small_spec(config, dtype, dropout, kDims));
}
}  // namespace

TEST(RecomputeModes, AgreeWithBaselineFp32WithDropout) {
  const auto base = run("baseline", DType::fp32, 0.1f);
  for (const char* config : {"selective", "full", "sp", "selective+sp", "full+sp"})
    expect_same_tensors(run(config, DType::fp32, 0.1f), base, 1e-6, 1e-6, config);
}

TEST(RecomputeModes, AgreeWithBaselineBf16) {
  const auto base = run("baseline", DType::bf16, 0.1f);
  for (const char* config : {"selective", "full"}) expect_same_tensors(run(config, DType::bf16, 0.1f), base, 1e-6, 1e-6, config);
}

// The agreement above is not vacuous: dropout changes the result, and every gradient is live.
TEST(RecomputeModes, DropoutMattersAndGradientsAreNonZero) {
  const auto with = run("baseline", DType::fp32, 0.1f);
  const auto without = run("baseline", DType::fp32, 0.0f);
  EXPECT_GT(worst_ratio(with[1].data, without[1].data, 1e-3, 0), 1.0) << "y must depend on dropout";
  for (const auto& t : with) EXPECT_GT(max_abs(t.data), 0.0) << t.name;
}
