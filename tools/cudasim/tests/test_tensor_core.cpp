// kernels/cuda/mma.cuh on the simulator: ldmatrix gives every lane the elements the PTX ISA's
// fragment layout names (planted rows, every shape, with and without .trans), mma.m16n8k16
// computes D = A * B + C from the documented fragments in bf16 and fp16, exactly like a scalar
// model that accumulates in the same order, a small GEMM through shared memory (ldmatrix +
// mma) equals the CPU's, and each misuse is reported, naming the kernel, thread and line.
#include <gtest/gtest.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cudasim/sim.hpp"
#include "tests/cuda/sim_test_kernels.hpp"
#include "tests/device_buffer.hpp"
#include "tests/report_test.hpp"

using namespace cudasim_tests;

namespace {


using TensorCore = ReportTest;

// A 16-bit floating-point matrix: its elements' bits (what the kernels take) and values.
struct Matrix16 {
  std::vector<uint16_t> bits;
  std::vector<float> values;
};

uint16_t to_bits(float v, bool bf16) {
  uint16_t b;
  if (bf16) {
    const __nv_bfloat16 h = __float2bfloat16_rn(v);
    std::memcpy(&b, &h, 2);
  } else {
    const __half h = __float2half_rn(v);
    std::memcpy(&b, &h, 2);
  }
  return b;
}
float from_bits(uint16_t b, bool bf16) {
  if (bf16) {
    __nv_bfloat16 h;
    std::memcpy(&h, &b, 2);
    return __bfloat162float(h);
  }
  __half h;
  std::memcpy(&h, &b, 2);
  return __half2float(h);
}

// n values rounded to the type: small integers (every product and sum exact) or uniform in
// [-2, 2) (products exact, sums rounded).
Matrix16 make_matrix(size_t n, bool bf16, bool integers, std::mt19937& rng) {
  Matrix16 m;
  std::uniform_int_distribution<int> small(-8, 8);
  std::uniform_real_distribution<float> real(-2.f, 2.f);
  for (size_t i = 0; i < n; ++i) {
    m.bits.push_back(to_bits(integers ? static_cast<float>(small(rng)) : real(rng), bf16));
    m.values.push_back(from_bits(m.bits.back(), bf16));
  }
  return m;
}

// ---- ldmatrix ----------------------------------------------------------------------------------

// The element (matrix m, row j, column c) of the planted tile.
uint32_t planted(int m, int j, int c) { return static_cast<uint32_t>(m * 64 + j * 8 + c); }

TEST_F(TensorCore, LdmatrixGivesEveryLaneTheDocumentedElements) {
  // PTX ISA, ldmatrix: lane l (groupID g = l / 4, threadID_in_group t = l % 4) holds in its
  // register m row g, columns 2t and 2t + 1 of matrix m (the lower column in the low half);
  // with .trans, of the transposed matrix: rows 2t and 2t + 1, column g.
  for (int matrices : {1, 2, 4})
    for (bool trans : {false, true}) {
      SCOPED_TRACE("x" + std::to_string(matrices) + (trans ? ".trans" : ""));
      Dev<uint32_t> out(32 * 4);
      ASSERT_EQ(ldmatrix_layout(out.p, matrices, trans), cudaSuccess) << cudasim::reports_text();
      const std::vector<uint32_t> r = out.get();
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, t = lane % 4;
        for (int m = 0; m < 4; ++m) {
          uint32_t want = 0;
          if (m < matrices)
            want = trans ? planted(m, 2 * t, g) | planted(m, 2 * t + 1, g) << 16
                         : planted(m, g, 2 * t) | planted(m, g, 2 * t + 1) << 16;
          EXPECT_EQ(r[lane * 4 + m], want) << "lane " << lane << ", register " << m;
        }
      }
    }
}

// ---- mma ---------------------------------------------------------------------------------------

// D = C + sum over steps s and k of A_s[m][k] * B_s[k][n], as the simulator documents its
// order: steps in order, k ascending, one fmaf each.
std::vector<float> scalar_model(const Matrix16& a, const Matrix16& b, const std::vector<float>& c, int steps) {
  std::vector<float> d = c;
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 8; ++n)
      for (int s = 0; s < steps; ++s)
        for (int k = 0; k < 16; ++k)
          d[m * 8 + n] = std::fmaf(a.values[s * 256 + m * 16 + k], b.values[s * 128 + k * 8 + n], d[m * 8 + n]);
  return d;
}

// The same in double, and the sum of the terms' magnitudes (for the error bound).
void double_reference(const Matrix16& a, const Matrix16& b, const std::vector<float>& c, int steps,
                      std::vector<double>* d, std::vector<double>* magnitude) {
  d->assign(c.begin(), c.end());
  magnitude->assign(128, 0.0);
  for (int i = 0; i < 128; ++i) (*magnitude)[i] = std::fabs(c[i]);
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 8; ++n)
      for (int s = 0; s < steps; ++s)
        for (int k = 0; k < 16; ++k) {
          const double p = double(a.values[s * 256 + m * 16 + k]) * b.values[s * 128 + k * 8 + n];
          (*d)[m * 8 + n] += p;
          (*magnitude)[m * 8 + n] += std::fabs(p);
        }
}

std::vector<float> run_mma_chain(const Matrix16& a, const Matrix16& b, const std::vector<float>& c, int steps,
                                 bool bf16) {
  Dev<uint16_t> da(a.bits), db(b.bits);
  Dev<float> dc(c), dd(128);
  EXPECT_EQ(mma_chain(dd.p, da.p, db.p, dc.p, steps, bf16), cudaSuccess) << cudasim::reports_text();
  return dd.get();
}

TEST_F(TensorCore, MmaOfSmallIntegersEqualsTheCpuMatmulInBf16AndFp16) {
  std::mt19937 rng(7);
  for (bool bf16 : {true, false}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp16");
    const Matrix16 a = make_matrix(256, bf16, true, rng), b = make_matrix(128, bf16, true, rng);
    for (bool zero_c : {true, false}) {
      std::vector<float> c(128, 0.f);
      if (!zero_c)
        for (int i = 0; i < 128; ++i) c[i] = static_cast<float>(i % 11) - 5.f;
      const std::vector<float> d = run_mma_chain(a, b, c, 1, bf16);
      for (int m = 0; m < 16; ++m)
        for (int n = 0; n < 8; ++n) {
          double want = c[m * 8 + n];
          for (int k = 0; k < 16; ++k) want += double(a.values[m * 16 + k]) * b.values[k * 8 + n];
          EXPECT_EQ(d[m * 8 + n], want) << "D[" << m << "][" << n << "], C " << (zero_c ? "0" : "!= 0");
        }
    }
  }
}

TEST_F(TensorCore, MmaAccumulateChainMatchesTheScalarModelExactly) {
  std::mt19937 rng(11);
  const int steps = 3;
  for (bool bf16 : {true, false}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp16");
    const Matrix16 a = make_matrix(256 * steps, bf16, false, rng), b = make_matrix(128 * steps, bf16, false, rng);
    std::vector<float> c(128);
    std::uniform_real_distribution<float> real(-4.f, 4.f);
    for (float& v : c) v = real(rng);
    const std::vector<float> d = run_mma_chain(a, b, c, steps, bf16);
    const std::vector<float> model = scalar_model(a, b, c, steps);
    std::vector<double> ref, magnitude;
    double_reference(a, b, c, steps, &ref, &magnitude);
    for (int i = 0; i < 128; ++i) {
      EXPECT_EQ(d[i], model[i]) << "element " << i;
      // 16 * steps + 1 roundings of at most 2^-24 of the partial sums, each bounded by the magnitudes.
      EXPECT_NEAR(d[i], ref[i], (16 * steps + 1) * 0x1p-24 * magnitude[i]) << "element " << i;
    }
  }
}

// ---- the demo: a GEMM through shared memory, ldmatrix and mma ----------------------------------

TEST_F(TensorCore, TileGemmThroughSharedMemoryEqualsTheCpu) {
  std::mt19937 rng(13);
  const int m = 32, n = 24, k = 48;
  for (bool bf16 : {true, false}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp16");
    const Matrix16 a = make_matrix(m * k, bf16, false, rng), b = make_matrix(k * n, bf16, false, rng);
    Dev<uint16_t> da(a.bits), db(b.bits);
    Dev<float> dd(m * n);
    ASSERT_EQ(tile_gemm(dd.p, da.p, db.p, m, n, k, bf16), cudaSuccess) << cudasim::reports_text();
    const std::vector<float> d = dd.get();
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) {
        float model = 0.f;
        double ref = 0.0, magnitude = 0.0;
        for (int q = 0; q < k; ++q) {
          model = std::fmaf(a.values[i * k + q], b.values[q * n + j], model);
          ref += double(a.values[i * k + q]) * b.values[q * n + j];
          magnitude += std::fabs(double(a.values[i * k + q]) * b.values[q * n + j]);
        }
        EXPECT_EQ(d[i * n + j], model) << "D[" << i << "][" << j << "]";
        EXPECT_NEAR(d[i * n + j], ref, k * 0x1p-24 * magnitude) << "D[" << i << "][" << j << "]";
      }
  }
}

// ---- misuses -----------------------------------------------------------------------------------

struct TensorCoreMisuse : TensorCore {
  Dev<float> out{64 * 4};
  Dev<uint16_t> scratch{256};
  // Runs misuse `bug`; true when it failed with a report of kind `kind` (whose text is `text`).
  bool fails_with(int bug, const std::string& kind, std::string* text) {
    EXPECT_EQ(tensor_core_misuse(out.p, scratch.p, bug), cudaErrorLaunchFailure);
    return reported(kind, text);
  }
};

TEST_F(TensorCoreMisuse, TheCorrectKernelReportsNothing) {
  ASSERT_EQ(tensor_core_misuse(out.p, scratch.p, 0), cudaSuccess) << cudasim::reports_text();
}

TEST_F(TensorCoreMisuse, LanesAtDifferentMmaCallSitesAreADivergence) {
  std::string text;
  EXPECT_TRUE(fails_with(1, "divergence", &text)) << text;
  EXPECT_NE(text.find("mma.sync.m16n8k16 (bf16)"), std::string::npos) << text;
  EXPECT_NE(text.find("misuse_kernel launched at"), std::string::npos) << text;
  EXPECT_NE(text.find("tensor_core.cu:"), std::string::npos) << text;
}

TEST_F(TensorCoreMisuse, AnMmaWithExitedLanesIsReported) {
  std::string text;
  EXPECT_TRUE(fails_with(2, "warp", &text)) << text;
  EXPECT_NE(text.find("has exited"), std::string::npos) << text;
  EXPECT_NE(text.find("tensor_core.cu:"), std::string::npos) << text;
}

TEST_F(TensorCoreMisuse, AMisalignedLdmatrixRowIsReported) {
  std::string text;
  EXPECT_TRUE(fails_with(3, "warp", &text)) << text;
  EXPECT_NE(text.find("thread (3,0,0) (lane 3)"), std::string::npos) << text;
  EXPECT_NE(text.find("not 16-byte aligned"), std::string::npos) << text;
  EXPECT_NE(text.find("tensor_core.cu:"), std::string::npos) << text;
}

TEST_F(TensorCoreMisuse, AnLdmatrixRowOutsideSharedMemoryIsReported) {
  std::string text;
  EXPECT_TRUE(fails_with(4, "warp", &text)) << text;
  EXPECT_NE(text.find("thread (0,0,0) (lane 0)"), std::string::npos) << text;
  EXPECT_NE(text.find("does not hold 16 bytes of shared memory"), std::string::npos) << text;
}

// The race checker sees ldmatrix's reads: the rows' 16-byte loads of the lanes that supply them.
TEST_F(TensorCoreMisuse, TheRaceCheckerSeesLdmatrixReads) {
  if (!cudasim::race_checker_enabled()) {
    EXPECT_EQ(tensor_core_misuse(out.p, scratch.p, 5), cudaSuccess) << cudasim::reports_text();
    EXPECT_EQ(tensor_core_misuse(out.p, scratch.p, 6), cudaSuccess) << cudasim::reports_text();
    return;
  }
  std::string text;
  EXPECT_TRUE(fails_with(5, "race", &text)) << text;
  EXPECT_NE(text.find("mma.cuh:"), std::string::npos) << text;
  EXPECT_TRUE(fails_with(6, "uninit", &text)) << text;
  EXPECT_NE(text.find("mma.cuh:"), std::string::npos) << text;
}

}  // namespace
