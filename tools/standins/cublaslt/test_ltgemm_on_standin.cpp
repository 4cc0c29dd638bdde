// kernels/cuda/gemm.cpp (actbench::cuda::LtGemm, unchanged) linked against the cuBLASLt
// stand-in instead of libcublasLt: the row-major -> column-major operand swap, the layouts,
// batch strides, the heuristic and the fallback decision run on the CPU and are checked
// against a float64 row-major reference. Host memory plays device memory.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda/gemm.hpp"
#include "runtime/dtype.hpp"
#include "runtime/error.hpp"

// Test-only host version of the one CUDA kernel gemm.cpp launches (k == 0: C *= beta, or
// zeros when beta == 0), so this test needs no simulator. Documented in cuda_ops.hpp.
namespace actbench::cuda {
void scale_inplace(DType dt, void* c, float beta, int64_t n, cudaStream_t) {
  for (int64_t i = 0; i < n; ++i)
    store_from_float(c, dt, static_cast<size_t>(i), beta == 0.f ? 0.f : beta * load_as_float(c, dt, static_cast<size_t>(i)));
}
}  // namespace actbench::cuda

namespace {

using actbench::DType;
using actbench::GemmArgs;

struct Case {
  DType ab, c;
  bool ta, tb;
  int64_t m, n, k, batch;
  float alpha, beta;
};

std::vector<uint8_t> random_buffer(DType t, int64_t n, uint32_t seed) {
  std::vector<uint8_t> b(static_cast<size_t>(n) * actbench::dtype_size(t));
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (int64_t i = 0; i < n; ++i) actbench::store_from_float(b.data(), t, static_cast<size_t>(i), dist(gen));
  return b;
}

double eps_of(DType t) { return t == DType::fp32 ? 1e-6 : t == DType::bf16 ? 1.0 / 256 : 1.0 / 2048; }

class LtGemmOnStandin : public ::testing::TestWithParam<Case> {};

TEST_P(LtGemmOnStandin, RowMajorGemmMatchesFloat64Reference) {
  const Case cs = GetParam();
  // Row-major, as GemmArgs documents: A is [m, k] ([k, m] when trans_a), B [k, n] ([n, k]).
  const int64_t a_n = cs.m * cs.k, b_n = cs.k * cs.n, c_n = cs.m * cs.n;
  auto a = random_buffer(cs.ab, a_n * cs.batch, 11), b = random_buffer(cs.ab, b_n * cs.batch, 12);
  auto c = random_buffer(cs.c, c_n * cs.batch, 13);
  const auto c_before = c;
  std::vector<uint8_t> workspace(1 << 16);
  actbench::cuda::LtGemm gemm(workspace.data(), workspace.size());
  GemmArgs g = actbench::gemm_args(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.batch, cs.alpha, cs.beta);
  gemm.run(g, cs.ab, a.data(), cs.ab, b.data(), cs.c, c.data(), nullptr);
  EXPECT_EQ(gemm.fallback_calls(), 0);  // the stand-in's heuristic admits every valid problem
  for (int64_t p = 0; p < cs.batch; ++p)
    for (int64_t i = 0; i < cs.m; ++i)
      for (int64_t j = 0; j < cs.n; ++j) {
        double ref = 0, mag = 0;
        for (int64_t l = 0; l < cs.k; ++l) {
          const double x = actbench::load_as_float(a.data(), cs.ab, p * a_n + (cs.ta ? l * cs.m + i : i * cs.k + l));
          const double y = actbench::load_as_float(b.data(), cs.ab, p * b_n + (cs.tb ? j * cs.k + l : l * cs.n + j));
          ref += x * y;
          mag += std::fabs(x * y);
        }
        const size_t ci = static_cast<size_t>(p * c_n + i * cs.n + j);
        ref = cs.alpha * ref + static_cast<double>(cs.beta) * actbench::load_as_float(c_before.data(), cs.c, ci);
        const double atol = 1e-6 + cs.k * 6e-8 * mag * std::fabs(cs.alpha);
        ASSERT_NEAR(actbench::load_as_float(c.data(), cs.c, ci), ref, atol + std::fabs(ref) * eps_of(cs.c))
            << "batch " << p << " (" << i << ", " << j << ")";
      }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  const std::pair<DType, DType> types[] = {
      {DType::fp32, DType::fp32}, {DType::bf16, DType::bf16}, {DType::bf16, DType::fp32}, {DType::fp16, DType::fp16}};
  for (auto [ab, c] : types)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        out.push_back({ab, c, ta, tb, 5, 7, 3, 1, 1.f, 0.f});
        out.push_back({ab, c, ta, tb, 9, 4, 13, 3, 0.5f, 1.f});
      }
  return out;
}

INSTANTIATE_TEST_SUITE_P(AllTypesAndTransposes, LtGemmOnStandin, ::testing::ValuesIn(cases()));

TEST(LtGemmOnStandinEdges, KZeroScalesCAndVersionComesFromTheLibrary) {
  std::vector<uint8_t> workspace(1024);
  actbench::cuda::LtGemm gemm(workspace.data(), workspace.size());
  std::vector<float> c(6, 2.f);
  gemm.run(actbench::gemm_args(false, false, 2, 3, 0, 1, 1.f, 0.5f), DType::fp32, nullptr, DType::fp32, nullptr,
           DType::fp32, c.data(), nullptr);
  for (float v : c) EXPECT_EQ(v, 1.f);
  EXPECT_EQ(actbench::cuda::LtGemm::version(), std::to_string(CUBLAS_VER_MAJOR) + "." +
                                                   std::to_string(CUBLAS_VER_MINOR) + "." +
                                                   std::to_string(CUBLAS_VER_PATCH));
  EXPECT_THROW(actbench::cuda::LtGemm::check_dtypes(DType::bf16, DType::fp16, DType::fp32), actbench::InvalidArgument);
}

}  // namespace
