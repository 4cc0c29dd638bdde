#pragma once
// DropoutCursor: a local element index of a DropoutSpec in the spec's own digits,
// local = (o * mid_local + m) * inner + col, each digit below its radix. Adding a fixed step
// (itself in digits) digit by digit with carries gives the next element of a grid-stride or
// row-stride loop and its canonical index, (o * mid_global + mid_offset + m) * inner + col,
// with no division: the dropout kernels divide once per thread, where it starts and to
// split its step. Host and device (test_cuda_host checks it against canonical_index).
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
    return static_cast<uint64_t>((o * s.mid_global + s.mid_offset + m) * s.inner + col);
  }
};

}  // namespace actbench
