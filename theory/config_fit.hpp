#pragma once
// Which configuration fits: for one of the paper's models at a given t/p layout and a GPU's
// memory, the memory of the first pipeline stage (the fullest) under each configuration,
// whether it fits, and the cheapest configuration that does (`theory plan --model`).
// The search over layouts themselves is layout_search.hpp's.
#include <map>
#include <string>
#include <vector>

#include "theory/activation_memory.hpp"
#include "theory/models.hpp"

namespace actbench::theory {

struct FitOptions {
  double gpu_memory_bytes = 0;
  double bytes_per_param = 18;  // weights + grads + optimizer (memory_totals.hpp)
  Precision precision{};
  double headroom_bytes = 0;    // kept free: CUDA context, workspaces, fragmentation
  // Layer time of each configuration relative to the baseline (what "cheapest" minimises);
  // empty: Table 4's (paper_table4_layer_times).
  std::map<std::string, double> relative_time;
};

struct FitRow {
  std::string config;
  double params_optimizer_bytes = 0;  // first stage: its layers + word and position embeddings
  double activation_bytes = 0;        // Table 2 × layers in flight on stage 0
  double extra_bytes = 0;             // embedding / output terms (memory_totals.hpp)
  double working_set_bytes = 0;       // one layer's recomputed activations during its backward
  double total_bytes = 0;             // the four above + headroom
  double relative_time = 0;
  bool fits = false;
};

struct FitPlan {
  std::vector<FitRow> rows;  // in config_names() order
  int cheapest = -1;         // index into rows of the fitting config with the least relative time; −1: none fits
};

FitPlan plan_fit(const ModelSpec& m, const FitOptions& opt);

}  // namespace actbench::theory
