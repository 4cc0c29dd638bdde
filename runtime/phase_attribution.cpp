#include "runtime/phase_attribution.hpp"

#include <unordered_map>

namespace actbench {

uint64_t PhaseIds::id_of(const std::string& phase) {
  auto [it, inserted] = ids_.try_emplace(phase, names_.size() + 1);
  if (inserted) names_.push_back(phase);
  return it->second;
}

const std::string& PhaseIds::name_of(uint64_t id) const {
  static const std::string other = "other";
  return id >= 1 && id <= names_.size() ? names_[id - 1] : other;
}

std::vector<PhaseTime> attribute_kernels(const std::vector<KernelRecord>& kernels,
                                         const std::vector<ExternalCorrelationRecord>& correlations,
                                         const PhaseIds& ids) {
  // A correlation id can carry several external records when phases nest; the record
  // CUPTI emits is for the innermost id on the stack, which is what we keep (last wins).
  std::unordered_map<uint32_t, uint64_t> phase_of;
  for (const auto& c : correlations) phase_of[c.correlation_id] = c.external_id;
  std::map<std::string, PhaseTime> by_phase;
  for (const auto& k : kernels) {
    auto it = phase_of.find(k.correlation_id);
    const std::string& name = ids.name_of(it == phase_of.end() ? 0 : it->second);
    PhaseTime& row = by_phase[name];
    row.phase = name;
    row.kernels += 1;
    row.gpu_ms += k.end_ns > k.start_ns ? static_cast<double>(k.end_ns - k.start_ns) * 1e-6 : 0.0;
  }
  std::vector<PhaseTime> out;
  for (auto& [name, row] : by_phase) out.push_back(row);
  return out;
}

std::map<std::string, double> stage_totals(const std::vector<PhaseTime>& rows) {
  std::map<std::string, double> out;
  for (const auto& r : rows) out[r.phase.substr(0, r.phase.find('.'))] += r.gpu_ms;
  return out;
}

}  // namespace actbench
