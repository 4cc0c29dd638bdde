#pragma once
// The dropout decision of every local element, shared by dropout.cu and residual.cu:
// keep(i) = philox_word(seed, layer, site, spec.canonical_index(i)) >= threshold, exactly
// DropoutSpec::keep. When spec.inner % 4 == 0, four consecutive local elements starting at a
// multiple of 4 are four consecutive canonical indices starting at a multiple of 4 (the
// canonical index is a multiple of inner plus i % inner), so one Philox call serves them.
#include "kernels/backend.hpp"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/philox_groups.hpp"

namespace actbench::cuda {

inline bool dropout_groups_of_4(const DropoutSpec& spec) { return spec.inner % 4 == 0; }

// Calls op(i, keep) once for every i < n (grid-stride).
template <bool kGroups, class Op>
__device__ __forceinline__ void dropout_for_each(const DropoutSpec& spec, uint32_t threshold, int64_t n, Op op) {
  if (threshold == 0) {  // p == 0: every word is >= 0, no need to draw them
    for (int64_t i = global_thread(); i < n; i += grid_threads()) op(i, true);
    return;
  }
  if constexpr (kGroups) {
    const int64_t groups = n / 4;
    for (int64_t g = global_thread(); g < groups; g += grid_threads()) {
      const int64_t i0 = g * 4;
      const uint64_t canonical = static_cast<uint64_t>(spec.canonical_index(i0));
      const Philox4 words = philox_words4(spec.seed, spec.layer, spec.site, canonical >> 2);
#pragma unroll
      for (int k = 0; k < 4; ++k) op(i0 + k, words.v[k] >= threshold);
    }
  } else {
    for (int64_t i = global_thread(); i < n; i += grid_threads())
      op(i, philox_word(spec.seed, spec.layer, spec.site, static_cast<uint64_t>(spec.canonical_index(i))) >= threshold);
  }
}

}  // namespace actbench::cuda
