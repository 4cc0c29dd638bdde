#pragma once
// DropoutCursor: a local element index of a DropoutSpec in the spec's own digits,
// local = (o * mid_local + m) * inner + col, each digit below its radix. Adding a fixed step
// (itself in digits) digit by digit with carries gives the next element of a grid-stride or
// row-stride loop and its canonical index, ((outer_offset + o) * mid_global + mid_offset + m) *
// inner_canonical + inner_positions.at(col), with no division: the dropout kernels divide once per thread,
// where it starts and to split its step. The inner digit is local, so the jump of the inner
// elements' position at their split (context parallelism's two chunks) is one compare where
// the canonical index is formed. Host and device (test_cuda_host checks it against
// canonical_index).
#include <cstdint>

#include "kernels/backend.hpp"

namespace actbench {

struct DropoutCursor {
  int64_t col = 0, m = 0, o = 0;

  ACTBENCH_HD static DropoutCursor at(const DropoutSpec& s, int64_t local) {
    const int64_t rest = local / s.inner;
    return DropoutCursor{local - rest * s.inner, rest % s.mid_local, rest / s.mid_local};
  }
  // this += step: each digit's sum is below twice its radix, so one carry each.
  ACTBENCH_HD void advance(const DropoutSpec& s, const DropoutCursor& step) {
    col += step.col;
    const int64_t carry_col = col >= s.inner ? 1 : 0;
    col -= carry_col * s.inner;
    m += step.m + carry_col;
    const int64_t carry_m = m >= s.mid_local ? 1 : 0;
    m -= carry_m * s.mid_local;
    o += step.o + carry_m;
  }
  ACTBENCH_HD uint64_t canonical(const DropoutSpec& s) const {
    return static_cast<uint64_t>(((s.outer_offset + o) * s.mid_global + s.mid_offset + m) * s.inner_canonical() +
                                 s.inner_positions.at(col));
  }
};

// Whether every group of n consecutive local elements from a multiple of n (n dividing inner)
// is n consecutive canonical indices from a multiple of n: the inner elements' runs of
// positions start at multiples of n and no group straddles their split. The dropout kernels'
// packs and Philox groups of four rely on it.
ACTBENCH_HD bool dropout_groups_of(const DropoutSpec& s, int64_t n) {
  const SeqPositions& p = s.inner_positions;
  const bool split_inside = p.split < s.inner;
  return s.inner % n == 0 && s.inner_canonical() % n == 0 && p.first % n == 0 &&
         (!split_inside || (p.split % n == 0 && p.second % n == 0));
}

}  // namespace actbench
