#pragma once
// One configuration's measurement as rows, built by column name (result_columns.hpp): the
// results CSV row, the CUPTI rows and the console line, with the formula they compare against.
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "runners/experiment.hpp"
#include "runners/layer_run_options.hpp"
#include "runtime/communicator.hpp"
#include "runtime/gpu_state.hpp"

namespace actbench {

// What every row of one layer_run call shares.
struct RunContext {
  const Backend& be;
  CommMode comm_mode;
  const LayerRunOptions& options;  // as resolved: o.tp is the group's size, o.model what ran
  std::string command;
  Backend::Versions versions;
};

// One configuration's measurement.
struct Measurement {
  ExperimentSpec spec;
  ExperimentResult result;
  GpuState start, end;  // the GPU's state before and after the configuration ran
};

std::vector<std::string> result_row(const RunContext& run, const Measurement& m);
// GPU kernel time per phase (the result's kernel_phases), per layer and timed iteration.
std::vector<std::vector<std::string>> cupti_rows(const RunContext& run, const Measurement& m);
// "selective+sp  ok    act 68.00 KiB (formula 68.00 KiB) fwd ... ms bwd ... ms"
std::string console_line(const RunContext& run, const Measurement& m);

}  // namespace actbench
