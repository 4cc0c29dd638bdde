#pragma once
// The closed forms a measured row is compared with: one layer's bytes (theory::layer_bytes,
// the spec's pieces summed) and a stack's under Megatron's --recompute-method.
#include "layers/config.hpp"
#include "runners/experiment.hpp"

namespace actbench {

double formula_bytes(const LayerDims& d, int tp, LayerPolicy p, DType dtype, int cp = 1);
// block: N layers keep their input and L - N keep everything; uniform: ceil(L / N) group
// inputs, each what a full layer keeps; none: L layers of the policy.
double stack_formula_bytes(const ExperimentSpec& spec, int tp);

}  // namespace actbench
