#pragma once
// Helpers for comparing whole-layer runs tensor by tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "runners/experiment.hpp"

namespace actbench::testing {

// One iteration of one layer at t (emulated when t > 1): the memory schedule, no timing.
inline ExperimentResult measure_once(Backend& be, const LayerDims& d, int t, LayerPolicy p, DType dtype) {
  auto comm = t == 1 ? make_local_communicator() : make_emulated_communicator(t);
  ExperimentSpec spec;
  spec.dims = d;
  spec.policy = p;
  spec.dtype = dtype;
  spec.warmup = 0;
  spec.iters = 1;
  return run_experiment(be, *comm, spec);
}

inline ExperimentSpec small_spec(const std::string& config, DType dtype, float dropout, LayerDims d) {
  ExperimentSpec spec;
  spec.dims = d;
  spec.policy = parse_config(config);
  spec.dtype = dtype;
  spec.dims.spec.attention_dropout = spec.dims.spec.hidden_dropout = dropout;
  spec.seed = 2024;
  return spec;
}

// max |a - b| / (atol + |b| * rtol) over the tensor; <= 1 passes. NaN never passes.
inline double worst_ratio(const std::vector<float>& a, const std::vector<float>& b, double atol, double rtol) {
  if (a.size() != b.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double err = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (std::isnan(err)) return INFINITY;
    worst = std::max(worst, err / (atol + std::fabs(static_cast<double>(b[i])) * rtol));
  }
  return worst;
}

inline void expect_same_tensors(const std::vector<CanonicalTensor>& got, const std::vector<CanonicalTensor>& ref,
                                double atol, double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].name, ref[i].name);
    EXPECT_EQ(got[i].shape, ref[i].shape) << what << " " << got[i].name;
    EXPECT_LE(worst_ratio(got[i].data, ref[i].data, atol, rtol), 1.0) << what << " tensor " << got[i].name;
  }
}

inline double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

}  // namespace actbench::testing
