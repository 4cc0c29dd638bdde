#pragma once
// Megatron's conjugate communication ops around a tensor-parallel region, on [s, b, h]
// tensors (dim 0 = sequence). Each names its forward and its backward plainly.
//
//   f   (enter, TP):  forward identity        backward all-reduce
//   f̄   (leave, TP):  forward all-reduce      backward identity
//   g   (enter, SP):  forward all-gather      backward reduce-scatter
//   ḡ   (leave, SP):  forward reduce-scatter  backward all-gather
//
// RegionEntry and RegionExit pick f/f̄ or g/ḡ from the policy, so the layer reads the same
// with and without sequence parallelism.
#include <string>

#include "kernels/backend.hpp"
#include "runtime/communicator.hpp"
#include "runtime/timing.hpp"

namespace actbench {

struct CommContext {
  Backend& backend;
  Communicator& communicator;
  bool sequence_parallel;
  PhaseLog* log;
  std::string stage;  // "fwd" | "bwd" | "recompute": the phase prefix
};

// Into a column-parallel linear. Forward: x [s/t or s, b, h] -> full-sequence input.
Tensor region_entry_fwd(const CommContext& c, const Tensor& x, const char* what);
// Backward: partial gradient of the full-sequence input -> gradient of x (summed over ranks).
Tensor region_entry_bwd(const CommContext& c, Tensor d_full, const char* what);
// Out of a row-parallel linear. Forward: partial sums [s, b, h] -> reduced output (local rows under SP).
Tensor region_exit_fwd(const CommContext& c, Tensor partial, const char* what);
// Backward: gradient of the reduced output -> gradient of every rank's partial (full sequence).
Tensor region_exit_bwd(const CommContext& c, const Tensor& dout, const char* what);

}  // namespace actbench
