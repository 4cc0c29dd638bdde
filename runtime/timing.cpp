#include "runtime/timing.hpp"

#include <algorithm>

#if ACTBENCH_HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace actbench {

double host_now_ms() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double, std::milli>(clock::now().time_since_epoch()).count();
}

Summary summarize(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  s.min = v.front();
  s.max = v.back();
  s.median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  return s;
}

PhaseRange::PhaseRange(std::string name, PhaseLog* log) : name_(std::move(name)), log_(log), start_ms_(log ? host_now_ms() : 0) {
#if ACTBENCH_HAVE_NVTX
  nvtxRangePushA(name_.c_str());
#endif
  if (log_ && log_->listener()) log_->listener()->enter(name_);
}

PhaseRange::~PhaseRange() {
  if (log_ && log_->listener()) log_->listener()->exit();
#if ACTBENCH_HAVE_NVTX
  nvtxRangePop();
#endif
  if (log_) log_->add(name_, host_now_ms() - start_ms_);
}

}  // namespace actbench
