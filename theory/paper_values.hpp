#pragma once
// The numbers the paper reports (docs/paper.md), as data for the "paper_*" columns of the
// theory CSVs that the plots draw beside ours. Tests do not read these: they type the
// paper's numbers themselves, so that a typo here cannot hide a wrong formula.
#include <optional>
#include <string>
#include <vector>

namespace actbench::theory::paper {

// Table 4: one 22B layer, t = 8, A100 (ms).
struct Table4Row {
  std::string config;  // baseline, sp, full, selective, selective+sp
  double fwd_ms, bwd_ms, total_ms;
  std::optional<double> overhead_percent;  // none for the baseline
};
const std::vector<Table4Row>& table4();
// The Table 4 row of a configuration; full+sp is not in the paper: nullopt.
std::optional<Table4Row> table4_row(const std::string& config);

// Table 5: end-to-end iteration, A100 (312 TFLOP/s).
struct Table5Row {
  std::string model;
  int dp;  // data-parallel replicas (the 2240-GPU 530B run has 8)
  std::optional<double> full_recompute_s;
  double present_s;
  std::optional<double> throughput_gain_percent;
  double mfu_percent;
  std::optional<double> hfu_percent;
  std::optional<double> mfu_full_percent;  // only the 2240-GPU run reports it (42.1%)
};
const std::vector<Table5Row>& table5();

// Figure 1 (GiB, read off the figure).
struct Figure1Row {
  std::string model;
  double params_optimizer_gib, activations_baseline_gib, activations_present_gib;
};
const std::vector<Figure1Row>& figure1();

// Figure 7: percent of the tensor-parallel baseline.
struct Figure7Row {
  std::string model;
  double sp, selective, selective_sp, full;
};
const std::vector<Figure7Row>& figure7();

// Figure 8: per-layer time split as percent of the baseline's time (read off the figure).
struct Figure8Row {
  std::string model, config;  // config: full or selective+sp ("present work")
  double fwd_percent, bwd_percent, recompute_percent;
};
const std::vector<Figure8Row>& figure8();

constexpr double kA100PeakFlops = 312e12;

}  // namespace actbench::theory::paper
