#include "theory/config_fit.hpp"

#include <stdexcept>

#include "theory/iteration_model.hpp"
#include "theory/memory_totals.hpp"

namespace actbench::theory {

FitPlan plan_fit(const ModelSpec& m, const FitOptions& opt) {
  validate(m);
  if (!(opt.gpu_memory_bytes > 0)) throw std::invalid_argument("GPU memory must be positive");
  const LayerTimes base = paper_table4_layer_times("baseline");
  FitPlan plan;
  for (const std::string& name : config_names()) {
    const LayerPolicy c = parse_config(name);
    FitRow row;
    row.config = name;
    row.params_optimizer_bytes = first_stage_parameters_per_gpu(m) * opt.bytes_per_param;
    row.activation_bytes = first_stage_activation_bytes(m, c, opt.precision);
    row.extra_bytes = embedding_output_extra_bytes(m, c, opt.precision);
    row.working_set_bytes = recompute_working_set_bytes(m.layer_dims(), c, opt.precision);
    row.total_bytes = row.params_optimizer_bytes + row.activation_bytes + row.extra_bytes + row.working_set_bytes +
                      opt.headroom_bytes;
    if (auto it = opt.relative_time.find(name); it != opt.relative_time.end()) {
      row.relative_time = it->second;
    } else {
      const LayerTimes lt = paper_table4_layer_times(name);
      row.relative_time = (lt.fwd_ms + lt.bwd_ms) / (base.fwd_ms + base.bwd_ms);
    }
    row.fits = row.total_bytes <= opt.gpu_memory_bytes;
    plan.rows.push_back(row);
  }
  for (int i = 0; i < static_cast<int>(plan.rows.size()); ++i) {
    const FitRow& r = plan.rows[i];
    if (!r.fits) continue;
    if (plan.cheapest < 0) {
      plan.cheapest = i;
      continue;
    }
    const FitRow& best = plan.rows[plan.cheapest];
    if (r.relative_time < best.relative_time ||
        (r.relative_time == best.relative_time && r.total_bytes < best.total_bytes))
      plan.cheapest = i;
  }
  return plan;
}

}  // namespace actbench::theory
