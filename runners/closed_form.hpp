#pragma once
// The closed forms a measured row is compared with: one layer's bytes (theory::layer_bytes,
// the spec's pieces summed) and a stack's under Megatron's --recompute-method.
#include "layers/config.hpp"
#include "runners/experiment.hpp"

namespace actbench {

// moe_routed_rows: an MoE layer's routed rows as a run measured them (theory::Dims); 0: balanced.
double formula_bytes(const LayerDims& d, int tp, LayerPolicy p, DType dtype, int cp = 1, double moe_routed_rows = 0);
// block: N layers keep their input and L - N keep everything; uniform: ceil(L / N) group
// inputs, each what a full layer keeps; none: L layers of the policy. An MoE stack's layers
// are taken to route moe_routed_rows rows each (layer 0's, as the rows report it).
double stack_formula_bytes(const ExperimentSpec& spec, int tp, double moe_routed_rows = 0);

}  // namespace actbench
