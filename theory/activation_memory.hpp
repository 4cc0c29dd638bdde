#pragma once
// Table 2 of Korthikanti et al.: activation bytes one transformer layer stores for the
// backward pass, per tensor-parallel rank, by category (PAPER.md, "What one layer stores").
// Pure functions of the shape; nothing here looks at a tensor.
#include <string>
#include <utility>
#include <vector>

namespace actbench::theory {

enum class Recompute { none, selective, full };

struct Config {
  Recompute recompute = Recompute::none;
  bool sequence_parallel = false;
};

struct Dims {
  double s = 0, b = 0, h = 0, a = 0;  // sequence, microbatch, hidden, heads
  double t = 1;                       // tensor-parallel size
};

// e: bytes per activation element (2 for bf16/fp16, 4 for fp32); mask: bytes per dropout-mask element.
struct Precision {
  double elem = 2, mask = 1;
};

// (category, bytes) in the order of PAPER.md's table; categories a configuration does not
// store are left out. Category names match layers/saved_activations.hpp.
std::vector<std::pair<std::string, double>> activation_bytes_by_category(const Dims& d, Config c, Precision p = {});
// Their sum: Table 2's row for this configuration (for any precision).
double activation_bytes(const Dims& d, Config c, Precision p = {});
// The closed forms as printed in Table 2 (16-bit activations, 1-byte masks), for cross-checks.
double table2_closed_form(const Dims& d, Config c);
// LayerNorm mean and rstd (fp32, two per row, two LayerNorms): not in the paper's count.
double layernorm_stats_bytes(const Dims& d, Config c);

}  // namespace actbench::theory
