#pragma once
// layer_run --kernel-report: the simulator's memory-access counters of every kernel launched
// inside each phase of the layer (fwd.*, bwd.*, recompute.*; the innermost open phase owns a
// launch, "other" outside every phase), one row per phase and kernel function with the
// simulator's kernel-report columns (tools/cudasim/include/cudasim/kernel_report.hpp). Only
// the simulator build with counters (ACTBENCH_CUDA_SIM=ON, ACTBENCH_CUDA_SIM_COUNTERS=ON) can
// count; elsewhere create() is refused with one line.
#include <memory>
#include <string>
#include <vector>

#include "runtime/timing.hpp"

namespace actbench {

// Why this build cannot report kernels on the modeled `device` (h100 | a100); empty: it can.
std::string kernel_report_refusal(const std::string& device);

class KernelReportRecorder : public PhaseListener {
 public:
  // Throws InvalidArgument with kernel_report_refusal's line when this build cannot count.
  static std::unique_ptr<KernelReportRecorder> create(const std::string& device);
  ~KernelReportRecorder() override = default;
  virtual void start() = 0;  // count the launches from here on (forgetting earlier ones)
  virtual void stop() = 0;   // stop counting; the launches so far are attributed
  // The kernel columns (the modeled ones named for the device).
  virtual std::vector<std::string> columns() const = 0;
  struct Row {
    std::string phase;
    std::vector<std::string> fields;  // one per columns()
  };
  // Since start(): per phase (in the order phases first launched a kernel), one row per
  // kernel function, its launches summed.
  virtual std::vector<Row> rows() const = 0;
};

}  // namespace actbench
