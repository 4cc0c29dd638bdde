#pragma once
// The MoE tests' one way to write a routing (kernels/backend.hpp's MoeRouting) in a line.
#include <cstdint>

#include "kernels/backend.hpp"

namespace actbench::testing {

inline MoeRouting moe_routing(MoeRouting::Score score, int64_t top_k, bool normalize = false, float scaling = 1.f,
                              int64_t groups = 1, int64_t group_top_k = 1) {
  MoeRouting r;
  r.score = score;
  r.top_k = top_k;
  r.normalize = normalize;
  r.scaling = scaling;
  r.num_groups = groups;
  r.group_top_k = group_top_k;
  return r;
}

}  // namespace actbench::testing
