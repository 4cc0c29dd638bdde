#include "runtime/kernel_report.hpp"

#include <algorithm>
#include <map>

#include "runtime/error.hpp"

#if ACTBENCH_HAVE_SIM_COUNTERS
#include "cudasim/counters.hpp"
#include "cudasim/kernel_report.hpp"
#include "tools/standins/cublaslt/gemm_log.hpp"
#endif

namespace actbench {

#if ACTBENCH_HAVE_SIM_COUNTERS

namespace {

class SimKernelReport : public KernelReportRecorder {
 public:
  explicit SimKernelReport(const cudasim::ModelDevice& dev) : dev_(dev) {}
  ~SimKernelReport() override {
    cudasim::set_counters(false);
    standin::set_gemm_log(false);
  }

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
    standin::set_gemm_log(true);
    standin::take_gemm_calls();
    launches_.clear();
    gemms_.clear();
    order_.clear();
  }
  void stop() override {
    attribute();
    cudasim::set_counters(false);
    standin::set_gemm_log(false);
  }
  std::vector<std::string> columns() const override { return cudasim::kernel_report_csv_header(dev_); }
  std::vector<Row> rows() const override {
    std::vector<Row> out;
    for (const std::string& phase : order_) {
      if (auto it = launches_.find(phase); it != launches_.end())
        for (const cudasim::KernelRow& k : cudasim::kernel_rows(it->second, dev_))
          out.push_back({phase, cudasim::kernel_report_csv_fields(k)});
      if (auto it = gemms_.find(phase); it != gemms_.end())
        for (const cudasim::KernelRow& g : gemm_rows(it->second))
          out.push_back({phase, cudasim::kernel_report_csv_fields(g)});
    }
    return out;
  }

 private:
  void attribute() {
    std::vector<cudasim::LaunchCounts> counted = cudasim::take_counted_launches();
    std::vector<standin::GemmCall> gemms = standin::take_gemm_calls();
    if (counted.empty() && gemms.empty()) return;
    const std::string phase = open_.empty() ? "other" : open_.back();
    if (std::find(order_.begin(), order_.end(), phase) == order_.end()) order_.push_back(phase);
    for (cudasim::LaunchCounts& k : counted) launches_[phase].push_back(std::move(k));
    for (const standin::GemmCall& g : gemms) gemms_[phase].push_back(g);
  }

  // One row per GEMM shape (m, n, k, batch, types, whether C is read), its calls summed.
  std::vector<cudasim::KernelRow> gemm_rows(const std::vector<standin::GemmCall>& calls) const {
    std::vector<std::string> order;
    std::map<std::string, std::vector<standin::GemmCall>> by_shape;
    for (const standin::GemmCall& g : calls) {
      const std::string name = g.describe();
      if (by_shape.find(name) == by_shape.end()) order.push_back(name);
      by_shape[name].push_back(g);
    }
    std::vector<cudasim::KernelRow> rows;
    for (const std::string& name : order) {
      const std::vector<standin::GemmCall>& same = by_shape.at(name);
      rows.push_back(cudasim::gemm_row(name, same.size(), same.front().flops() * static_cast<double>(same.size()),
                                       same.front().min_bytes() * same.size(), same.front().tensor_cores(), dev_));
    }
    return rows;
  }

  const cudasim::ModelDevice& dev_;
  std::vector<std::string> open_;  // the open phases, innermost last
  std::map<std::string, std::vector<cudasim::LaunchCounts>> launches_;
  std::map<std::string, std::vector<standin::GemmCall>> gemms_;  // the cuBLASLt stand-in's calls
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
