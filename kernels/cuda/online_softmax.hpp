#pragma once
// The running (max m, sum s of exp(x - m)) of a stream of scores, one score at a time: what
// each thread of the long-row causal softmax (softmax.cu) keeps. Host and device, so that
// tests/test_cuda_host.cpp checks it without a GPU.
#include <cmath>

#include "runtime/philox.hpp"  // ACTBENCH_HD

namespace actbench::cuda {

// Start from m = -inf, s = 0. A score of -inf adds exp(-inf) = 0 and is skipped: evaluated,
// it would be exp(-inf - (-inf)) = NaN while m is still -inf (a row whose first scores are
// -inf), and that NaN would survive every later rescale. NaN scores still poison the sum, as
// in the CPU reference.
ACTBENCH_HD void online_max_sum_add(float& m, float& s, float x) {
  if (x > m) {
    s = s * expf(m - x) + 1.f;
    m = x;
  } else if (x != -INFINITY) {
    s += expf(x - m);
  }
}

}  // namespace actbench::cuda
