// Measured activation bytes (the SavedActivations struct, and independently the allocator's
// requested-bytes delta across forward) against Table 2, on meta and cpu.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "runners/experiment.hpp"
#include "runners/presets.hpp"
#include "layers/theory_dims.hpp"

using namespace actbench;

namespace {

ExperimentResult measure(const std::string& backend, const LayerDims& d, int t, LayerPolicy p, DType dtype,
                         int layers = 1) {
  auto be = make_backend(backend);
  auto comm = t == 1 ? make_local_communicator() : make_emulated_communicator(t);
  ExperimentSpec spec;
  spec.dims = d;
  spec.policy = p;
  spec.dtype = dtype;
  spec.layers = layers;
  spec.warmup = 0;
  spec.iters = 1;
  return run_experiment(*be, *comm, spec);
}

const std::vector<LayerDims> kShapes = {
    {32, 2, 64, 4},   // the tiny preset
    {24, 3, 48, 4},   // nothing a power of two but the heads
    {40, 1, 120, 12}, // a/h != 1/16, s not a multiple of 16
};

void expect_matches_table2(const ExperimentResult& r, const LayerDims& d, int t, LayerPolicy p, DType dtype,
                           const std::string& what) {
  ASSERT_EQ(r.status, "ok") << what << ": " << r.message;
  const theory::Dims td = theory_dims(d, t);
  const theory::Precision prec{static_cast<double>(dtype_size(dtype)), 1.0};
  EXPECT_EQ(static_cast<double>(r.act_bytes), theory::activation_bytes(td, p, prec)) << what;
  if (dtype_size(dtype) == 2) {
    EXPECT_EQ(static_cast<double>(r.act_bytes), theory::table2_closed_form(td, p)) << what;
  }
  EXPECT_EQ(static_cast<double>(r.act_extra_bytes), theory::layernorm_stats_bytes(td, p)) << what;
  // The allocator agrees with the struct: nothing else survives forward.
  EXPECT_EQ(r.fwd_retained_bytes, r.act_bytes + r.act_extra_bytes) << what;
  // Category by category, as docs/paper.md lists them.
  std::map<std::string, int64_t> measured(r.act_by_category.begin(), r.act_by_category.end());
  for (const auto& [name, bytes] : theory::activation_bytes_by_category(td, p, prec))
    EXPECT_EQ(static_cast<double>(measured[name]), bytes) << what << " category " << name;
}

}  // namespace

class Table2 : public ::testing::TestWithParam<std::tuple<std::string, int, std::string>> {};

TEST_P(Table2, MeasuredBytesEqualFormulaForEveryShape) {
  const auto& [backend, t, config] = GetParam();
  const LayerPolicy p = parse_config(config);
  for (const LayerDims& d : kShapes) {
    const std::string what = backend + " t=" + std::to_string(t) + " " + config + " s=" + std::to_string(d.s) +
                             " h=" + std::to_string(d.h);
    expect_matches_table2(measure(backend, d, t, p, DType::bf16), d, t, p, DType::bf16, what);
  }
}

INSTANTIATE_TEST_SUITE_P(AllConfigs, Table2,
                         ::testing::Combine(::testing::Values("meta", "cpu"), ::testing::Values(1, 2, 4),
                                            ::testing::Values("baseline", "sp", "full", "selective", "selective+sp",
                                                              "full+sp")),
                         [](const auto& param_info) {
                           std::string c = std::get<2>(param_info.param);
                           for (char& ch : c)
                             if (ch == '+') ch = '_';
                           return std::get<0>(param_info.param) + "_t" + std::to_string(std::get<1>(param_info.param)) + "_" + c;
                         });

TEST(Table2Precision, Fp32StorageDoublesActivationsNotMasks) {
  const LayerDims d = kShapes[1];
  for (const std::string& config : config_names()) {
    LayerPolicy p = parse_config(config);
    expect_matches_table2(measure("cpu", d, 2, p, DType::fp32), d, 2, p, DType::fp32, "fp32 " + config);
  }
}

TEST(Table2Stack, PerLayerBytesHoldForAStackOfLayers) {
  const LayerDims d = kShapes[0];
  for (const char* config : {"baseline", "selective+sp", "full"}) {
    LayerPolicy p = parse_config(config);
    expect_matches_table2(measure("meta", d, 4, p, DType::bf16, 3), d, 4, p, DType::bf16, std::string("3 layers ") + config);
  }
}

// Figure 7 of the paper, computed from the bytes the meta backend measures at the four
// models' per-rank shapes (t = 8 emulated). docs/paper.md's table, +-0.1 percentage points.
TEST(Figure7, MetaAtPaperModelsReproducesPercentages) {
  const std::map<std::string, std::map<std::string, double>> paper = {
      {"22b", {{"sp", 66.8}, {"selective", 49.4}, {"selective+sp", 16.1}, {"full", 7.6}}},
      {"175b", {{"sp", 62.0}, {"selective", 56.5}, {"selective+sp", 18.5}, {"full", 8.7}}},
      {"530b", {{"sp", 58.3}, {"selective", 61.9}, {"selective+sp", 20.2}, {"full", 9.5}}},
      {"1t", {{"sp", 58.3}, {"selective", 61.9}, {"selective+sp", 20.2}, {"full", 9.5}}},
  };
  for (const auto& [model, rows] : paper) {
    const ModelPreset& m = find_preset(model);
    const ExperimentResult base = measure("meta", m.dims, m.tp, parse_config("baseline"), DType::bf16);
    ASSERT_EQ(base.status, "ok");
    EXPECT_EQ(base.fwd_retained_bytes, base.act_bytes + base.act_extra_bytes) << model;
    for (const auto& [config, percent] : rows) {
      const ExperimentResult r = measure("meta", m.dims, m.tp, parse_config(config), DType::bf16);
      ASSERT_EQ(r.status, "ok");
      EXPECT_EQ(r.fwd_retained_bytes, r.act_bytes + r.act_extra_bytes) << model << " " << config;
      const double measured = 100.0 * static_cast<double>(r.act_bytes) / static_cast<double>(base.act_bytes);
      EXPECT_NEAR(measured, percent, 0.1) << model << " " << config;
    }
  }
}

TEST(MemoryLimit, OverCapacityIsReportedAsOom) {
  auto be = make_meta_backend(size_t(1) << 30);  // a 1 GiB device cannot hold a 22B layer
  auto comm = make_emulated_communicator(8);
  ExperimentSpec spec;
  spec.dims = find_preset("22b").dims;
  spec.policy = parse_config("baseline");
  spec.warmup = 0;
  spec.iters = 1;
  ExperimentResult r = run_experiment(*be, *comm, spec);
  EXPECT_EQ(r.status, "oom");
  EXPECT_NE(r.message.find("out of memory"), std::string::npos) << r.message;
  EXPECT_LE(r.peak_reserved_bytes, int64_t(1) << 30);
}

TEST(Peak, RecomputeLowersThePeakOfAStack) {
  // With many layers the stored activations dominate: full < selective < baseline.
  const LayerDims d = {256, 2, 128, 8};
  auto peak = [&](const char* config) {
    return measure("meta", d, 2, parse_config(config), DType::bf16, 8).peak_allocated_bytes;
  };
  const int64_t base = peak("baseline"), sel = peak("selective"), full = peak("full");
  EXPECT_LT(full, sel);
  EXPECT_LT(sel, base);
}
