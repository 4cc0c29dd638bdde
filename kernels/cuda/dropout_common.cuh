#pragma once
// The dropout decision of every local element, shared by dropout.cu and residual.cu:
// keep(i) = philox_word(seed, layer, site, spec.canonical_index(i)) >= threshold, exactly
// DropoutSpec::keep, found without a division per element:
//   - DropoutCursor (dropout_cursor.hpp) walks the local index in the spec's own digits and
//     adds a fixed step with carries, so a grid-stride or row-stride loop knows each group's
//     canonical index; the 64-bit divisions happen once per thread, where it starts.
//   - A thread owns kN = 1, 4 or 8 consecutive elements. When dropout_groups_of(spec, kN)
//     (dropout_cursor.hpp: inner, inner_canonical and the inner runs of positions are multiples
//     of kN) and the first local index is a multiple of kN, they are kN consecutive canonical
//     indices from a multiple of kN, so one Philox call serves each 4 of them
//     (philox_groups.hpp).
#include "kernels/backend.hpp"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dropout_cursor.hpp"
#include "kernels/cuda/philox_groups.hpp"

namespace actbench::cuda {

// keep[k] for the kN elements from canonical index `first` (a multiple of kN when kN > 1).
template <int kN>
__device__ __forceinline__ void dropout_keep(const DropoutSpec& spec, uint32_t threshold, uint64_t first,
                                             uint8_t (&keep)[kN]) {
  if (threshold == 0) {  // p == 0: every word is >= 0, no need to draw them
#pragma unroll
    for (int k = 0; k < kN; ++k) keep[k] = 1;
    return;
  }
  if constexpr (kN == 1) {
    keep[0] = philox_word(spec.seed, spec.layer, spec.site, first) >= threshold ? 1 : 0;
  } else {
    static_assert(kN % 4 == 0, "groups of four canonical indices");
#pragma unroll
    for (int g = 0; g < kN / 4; ++g) {
      const Philox4 words = philox_words4(spec.seed, spec.layer, spec.site, (first >> 2) + g);
#pragma unroll
      for (int k = 0; k < 4; ++k) keep[4 * g + k] = words.v[k] >= threshold ? 1 : 0;
    }
  }
}

// Calls op(i, keep) for every group of kN consecutive local elements i .. i + kN - 1
// (grid-stride; n is a multiple of kN and dropout_groups_of(spec, kN) when kN > 1). The cursor starts at
// the thread's first group and steps by the grid's kN * threads, so the loop divides nothing.
template <int kN, class Op>
__device__ __forceinline__ void dropout_for_each(const DropoutSpec& spec, uint32_t threshold, int64_t n, Op op) {
  const int64_t groups = n / kN, stride = grid_threads();
  int64_t g = global_thread();
  if (g >= groups) return;
  DropoutCursor at = DropoutCursor::at(spec, g * kN);
  const DropoutCursor step = DropoutCursor::at(spec, stride * kN);
  for (; g < groups; g += stride, at.advance(spec, step)) {
    uint8_t keep[kN];
    dropout_keep<kN>(spec, threshold, at.canonical(spec), keep);
    op(g * kN, keep);
  }
}

}  // namespace actbench::cuda
