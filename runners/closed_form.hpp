#pragma once
// The closed forms a measured row is compared with: one layer's bytes (theory::layer_bytes,
// the spec's pieces summed) and a stack's under Megatron's --recompute-method.
#include "layers/config.hpp"
#include "runners/experiment.hpp"

namespace actbench {

// An MoE layer's routing as a run measured it (theory::Dims): the rank's routed rows, the rows
// its experts processed, the expert-parallel and expert-tensor-parallel sizes; rows 0:
// balanced routing.
struct MoeRows {
  double routed = 0, expert = 0;
  int ep = 1, etp = 1;
};
double formula_bytes(const LayerDims& d, int tp, LayerPolicy p, DType dtype, int cp = 1, MoeRows moe = {});
// block: N layers keep their input and L - N keep everything; uniform: ceil(L / N) group
// inputs, each what a full layer keeps; none: L layers of the policy. An MoE stack's layers
// are taken to route as `moe` says (layer 0's, as the rows report it).
double stack_formula_bytes(const ExperimentSpec& spec, int tp, MoeRows moe = {});

}  // namespace actbench
