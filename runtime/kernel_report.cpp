#include "runtime/kernel_report.hpp"

#include <map>

#include "runtime/error.hpp"

#if ACTBENCH_HAVE_SIM_COUNTERS
#include "cudasim/counters.hpp"
#include "cudasim/kernel_report.hpp"
#endif

namespace actbench {

#if ACTBENCH_HAVE_SIM_COUNTERS

namespace {

class SimKernelReport : public KernelReportRecorder {
 public:
  explicit SimKernelReport(const cudasim::ModelDevice& dev) : dev_(dev) {}
  ~SimKernelReport() override { cudasim::set_counters(false); }

  // The simulator runs a kernel when it is launched, so the launches counted since the last
  // change of phase all belong to the phase open until now.
  void enter(const std::string& phase) override {
    attribute();
    open_.push_back(phase);
  }
  void exit() override {
    attribute();
    if (!open_.empty()) open_.pop_back();
  }
  void start() override {
    cudasim::set_counters(true);
    cudasim::take_counted_launches();
    launches_.clear();
    order_.clear();
  }
  void stop() override {
    attribute();
    cudasim::set_counters(false);
  }
  std::vector<std::string> columns() const override { return cudasim::kernel_report_csv_header(dev_); }
  std::vector<Row> rows() const override {
    std::vector<Row> out;
    for (const std::string& phase : order_)
      for (const cudasim::KernelRow& k : cudasim::kernel_rows(launches_.at(phase), dev_))
        out.push_back({phase, cudasim::kernel_report_csv_fields(k)});
    return out;
  }

 private:
  void attribute() {
    std::vector<cudasim::LaunchCounts> counted = cudasim::take_counted_launches();
    if (counted.empty()) return;
    const std::string phase = open_.empty() ? "other" : open_.back();
    auto [it, fresh] = launches_.try_emplace(phase);
    if (fresh) order_.push_back(phase);
    for (cudasim::LaunchCounts& k : counted) it->second.push_back(std::move(k));
  }

  const cudasim::ModelDevice& dev_;
  std::vector<std::string> open_;  // the open phases, innermost last
  std::map<std::string, std::vector<cudasim::LaunchCounts>> launches_;
  std::vector<std::string> order_;
};

}  // namespace

std::string kernel_report_refusal(const std::string& device) {
  if (!cudasim::find_model_device(device))
    return "--kernel-report-device must be " + cudasim::model_device_names() + ", got '" + device + "'";
  return "";
}

std::unique_ptr<KernelReportRecorder> KernelReportRecorder::create(const std::string& device) {
  const std::string refusal = kernel_report_refusal(device);
  if (!refusal.empty()) throw InvalidArgument(refusal);
  return std::make_unique<SimKernelReport>(*cudasim::find_model_device(device));
}

#else

std::string kernel_report_refusal(const std::string&) {
#if ACTBENCH_CUDA_SIM_BUILD
  return "--kernel-report needs the simulator build's counters: this one was configured with "
         "-DACTBENCH_CUDA_SIM_COUNTERS=OFF";
#else
  return "--kernel-report counts the simulator's kernels: it needs the simulator build "
         "(cmake -DACTBENCH_CUDA_SIM=ON, docs/simulator.md)";
#endif
}

std::unique_ptr<KernelReportRecorder> KernelReportRecorder::create(const std::string& device) {
  throw InvalidArgument(kernel_report_refusal(device));
}

#endif

}  // namespace actbench
