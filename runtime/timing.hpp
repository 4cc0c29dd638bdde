#pragma once
// Phase ranges and interval timers.
// PhaseRange pushes an NVTX range (visible in nsys) named like "fwd.ln1" and, when a
// PhaseLog is attached, adds the host-clock duration of the range to it.
#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace actbench {

double host_now_ms();

// Median, min, max of a set of samples.
struct Summary {
  double median = 0, min = 0, max = 0;
};
Summary summarize(std::vector<double> samples);

// Told when a phase range opens and closes (innermost last); the CUPTI profiler uses it to
// tag the kernels launched inside each phase.
class PhaseListener {
 public:
  virtual ~PhaseListener() = default;
  virtual void enter(const std::string& phase) = 0;
  virtual void exit() = 0;
};

class PhaseLog {
 public:
  void add(const std::string& phase, double ms) { total_ms_[phase] += ms; }
  const std::map<std::string, double>& totals() const { return total_ms_; }
  void clear() { total_ms_.clear(); }
  void set_listener(PhaseListener* l) { listener_ = l; }
  PhaseListener* listener() const { return listener_; }

 private:
  std::map<std::string, double> total_ms_;
  PhaseListener* listener_ = nullptr;
};

class PhaseRange {
 public:
  PhaseRange(std::string name, PhaseLog* log);
  ~PhaseRange();
  PhaseRange(const PhaseRange&) = delete;
  PhaseRange& operator=(const PhaseRange&) = delete;

 private:
  std::string name_;
  PhaseLog* log_;
  double start_ms_;
};

}  // namespace actbench
