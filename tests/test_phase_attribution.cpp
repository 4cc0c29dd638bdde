// CUPTI attribution on synthetic records (CI has no GPU), and the phase stream that the
// layer emits to a listener (what the CUPTI profiler tags kernels with).
#include <gtest/gtest.h>

#include <set>

#include "kernels/backend.hpp"
#include "runners/experiment.hpp"
#include "runtime/phase_attribution.hpp"

namespace actbench {
namespace {

TEST(PhaseAttribution, SumsKernelTimePerInnermostPhase) {
  PhaseIds ids;
  const uint64_t fwd_qkv = ids.id_of("fwd.qkv");
  const uint64_t comm = ids.id_of("comm.fwd.all_gather.ln1");
  const uint64_t bwd_fc1 = ids.id_of("bwd.fc1");
  EXPECT_EQ(ids.id_of("fwd.qkv"), fwd_qkv);  // stable ids
  const std::vector<KernelRecord> kernels = {
      {1, 1000, 3000},      // fwd.qkv 2 us
      {2, 3000, 4500},      // fwd.qkv 1.5 us
      {3, 5000, 15000},     // comm inside fwd.qkv's range: 10 us to comm
      {4, 20000, 21000},    // bwd.fc1 1 us
      {5, 30000, 30500},    // no external record: other
      {6, 40000, 41000},    // external id 0: launched outside every phase
  };
  const std::vector<ExternalCorrelationRecord> corr = {{1, fwd_qkv}, {2, fwd_qkv}, {3, comm}, {4, bwd_fc1}, {6, 0}};
  const std::vector<PhaseTime> rows = attribute_kernels(kernels, corr, ids);
  ASSERT_EQ(rows.size(), 4u);
  std::map<std::string, PhaseTime> by;
  for (const auto& r : rows) by[r.phase] = r;
  EXPECT_EQ(by["fwd.qkv"].kernels, 2);
  EXPECT_DOUBLE_EQ(by["fwd.qkv"].gpu_ms, 0.0035);
  EXPECT_EQ(by["comm.fwd.all_gather.ln1"].kernels, 1);
  EXPECT_DOUBLE_EQ(by["comm.fwd.all_gather.ln1"].gpu_ms, 0.010);
  EXPECT_DOUBLE_EQ(by["bwd.fc1"].gpu_ms, 0.001);
  EXPECT_EQ(by["other"].kernels, 2);
  const auto stages = stage_totals(rows);
  EXPECT_DOUBLE_EQ(stages.at("fwd"), 0.0035);
  EXPECT_DOUBLE_EQ(stages.at("comm"), 0.010);
  EXPECT_DOUBLE_EQ(stages.at("bwd"), 0.001);
  EXPECT_DOUBLE_EQ(stages.at("other"), 0.0015);
  EXPECT_EQ(stages.count("recompute"), 0u);
}

// Records what a CUPTI profiler would be told.
class RecordingListener : public PhaseListener {
 public:
  void enter(const std::string& p) override {
    phases.insert(p);
    ++depth;
    max_depth = std::max(max_depth, depth);
  }
  void exit() override { --depth; }
  std::set<std::string> phases;
  int depth = 0, max_depth = 0;
};

std::set<std::string> stages_of(const std::set<std::string>& phases) {
  std::set<std::string> out;
  for (const auto& p : phases) out.insert(p.substr(0, p.find('.')));
  return out;
}

TEST(PhaseAttribution, LayerTellsTheListenerEveryPhaseBalanced) {
  struct Case {
    const char* config;
    std::set<std::string> stages;
  };
  for (const Case& c : {Case{"baseline", {"fwd", "bwd", "comm"}}, Case{"selective+sp", {"fwd", "bwd", "recompute", "comm"}},
                        Case{"full", {"fwd", "bwd", "recompute", "comm"}}}) {
    auto be = make_backend("cpu");
    auto comm = make_emulated_communicator(2);
    ExperimentSpec spec;
    spec.dims = LayerDims{16, 2, 32, 4};
    spec.policy = parse_config(c.config);
    spec.dtype = DType::fp32;
    LayerStackRunner runner(*be, *comm, spec);
    PhaseLog log;
    RecordingListener listener;
    log.set_listener(&listener);
    runner.iteration(false, &log);
    EXPECT_EQ(listener.depth, 0) << c.config;  // every enter has its exit
    EXPECT_EQ(listener.max_depth, 1) << c.config;  // phases do not nest: comm ranges sit between them
    EXPECT_EQ(stages_of(listener.phases), c.stages) << c.config;
    EXPECT_TRUE(listener.phases.count("fwd.core_attn")) << c.config;
    EXPECT_TRUE(listener.phases.count("bwd.qkv")) << c.config;
  }
}

}  // namespace
}  // namespace actbench
