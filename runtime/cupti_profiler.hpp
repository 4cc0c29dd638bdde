#pragma once
// Kernel activity through CUPTI, attributed to the layer's phases (layer_run --cupti).
// The profiler is a PhaseListener: attach it to the PhaseLog of the timed iterations and
// every kernel launched inside a PhaseRange is tagged with that phase (CUPTI external
// correlation, innermost phase wins). Only one profiler may be active in a process: CUPTI's
// buffer callbacks are plain C functions with no user pointer.
#include <memory>
#include <string>
#include <vector>

#include "runtime/phase_attribution.hpp"
#include "runtime/timing.hpp"

namespace actbench {

class CuptiProfiler : public PhaseListener {
 public:
  // Throws InvalidArgument when this build has no CUPTI (no CUDA toolkit).
  static std::unique_ptr<CuptiProfiler> create();
  ~CuptiProfiler() override = default;
  virtual void start() = 0;  // enable kernel, memcpy/memset, API and external-correlation records
  virtual void stop() = 0;   // flush all records, disable
  // GPU time (kernels, memcpys, memsets) per phase over everything recorded between start() and stop().
  virtual std::vector<PhaseTime> breakdown() const = 0;
  virtual void clear() = 0;
  // Activity records CUPTI dropped for want of buffer space since clear() (0 = complete).
  virtual int64_t dropped_records() const = 0;
};

bool cupti_available();

}  // namespace actbench
