#pragma once
// A DropoutSpec with every field named at the call, for the kernel tests (cpu and gpu).
#include <cstdint>

#include "kernels/backend.hpp"

namespace actbench::testing {

inline DropoutSpec make_spec(float p, int64_t outer, int64_t mid_local, int64_t mid_global, int64_t mid_offset,
                             int64_t inner, uint32_t site) {
  DropoutSpec s;
  s.p = p;
  s.seed = 0x1234567890abcdefull;
  s.layer = 3;
  s.site = site;
  s.outer = outer;
  s.mid_local = mid_local;
  s.mid_global = mid_global;
  s.mid_offset = mid_offset;
  s.inner = inner;
  return s;
}

}  // namespace actbench::testing
