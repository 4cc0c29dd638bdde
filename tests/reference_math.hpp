#pragma once
// What the op tests share when they check an op against a double-precision reference: random
// inputs, an element-wise comparison with a tolerance, and gradients by central differences.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

namespace actbench::testing {

using Vec = std::vector<double>;

// |got − ref| ≤ atol + rtol·|ref| for every element.
struct Tol {
  double atol, rtol;
};

inline Vec random_vec(int64_t n, uint32_t seed, double lo = -1, double hi = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  Vec v(static_cast<size_t>(n));
  for (double& x : v) x = u(rng);
  return v;
}

// Element-wise comparison (NaN fails); the message names the worst element.
inline ::testing::AssertionResult close(const Vec& got, const Vec& ref, Tol tol) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs reference " << ref.size();
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - ref[i]) / (tol.atol + tol.rtol * std::fabs(ref[i]));
    if (std::isnan(err) || err > worst) {
      worst = std::isnan(err) ? INFINITY : err;
      at = i;
      if (std::isnan(err)) break;
    }
  }
  if (worst <= 1.0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "element " << at << ": got " << got[at] << ", reference " << ref[at]
                                       << " (" << worst << "x the tolerance atol " << tol.atol << " rtol " << tol.rtol
                                       << ")";
}

// d/dx_i of sum_j f(x)_j g_j by central differences, for every i.
inline Vec finite_difference(const std::function<Vec(const Vec&)>& f, const Vec& x, const Vec& g, double h = 1e-5) {
  Vec grad(x.size()), xp = x;
  for (size_t i = 0; i < x.size(); ++i) {
    xp[i] = x[i] + h;
    const Vec fp = f(xp);
    xp[i] = x[i] - h;
    const Vec fm = f(xp);
    xp[i] = x[i];
    double d = 0;
    for (size_t j = 0; j < g.size(); ++j) d += (fp[j] - fm[j]) * g[j];
    grad[i] = d / (2 * h);
  }
  return grad;
}

}  // namespace actbench::testing
