#pragma once
// Attributes GPU kernel time to the layer's phases (fwd.*, bwd.*, recompute.*, comm.*).
// CUPTI gives, per kernel, a correlation id and start/end timestamps; an external-correlation
// record ties that correlation id to the id we pushed when the enclosing phase opened. This
// file is the pure part (tested on synthetic records); runtime/cupti_profiler.cpp feeds it.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/timing.hpp"

namespace actbench {

struct KernelRecord {
  uint32_t correlation_id = 0;
  uint64_t start_ns = 0, end_ns = 0;
};
struct ExternalCorrelationRecord {
  uint32_t correlation_id = 0;
  uint64_t external_id = 0;  // a PhaseIds id; 0 = launched outside every phase
};

// Gives each distinct phase name a stable id (1, 2, ...) and keeps the stack of open phases:
// the innermost open phase owns the kernels launched while it is open.
class PhaseIds {
 public:
  uint64_t id_of(const std::string& phase);
  const std::string& name_of(uint64_t id) const;  // "other" for 0 or unknown ids
  size_t size() const { return names_.size(); }

 private:
  std::map<std::string, uint64_t> ids_;
  std::vector<std::string> names_;
};

struct PhaseTime {
  std::string phase;
  int64_t kernels = 0;
  double gpu_ms = 0;  // sum of kernel durations
};

// Sums kernel durations per phase. Kernels whose correlation has no record, or whose
// external id is 0, are "other". Rows sorted by phase name.
std::vector<PhaseTime> attribute_kernels(const std::vector<KernelRecord>& kernels,
                                         const std::vector<ExternalCorrelationRecord>& correlations,
                                         const PhaseIds& ids);

// Figure 8's split: the first component of each phase name ("fwd", "bwd", "recompute",
// "comm", "other") -> milliseconds.
std::map<std::string, double> stage_totals(const std::vector<PhaseTime>& rows);

}  // namespace actbench
