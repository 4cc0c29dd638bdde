// The cuBLASLt stand-in against a float64 reference computed here from the documented
// definition D = alpha * op(A) op(B) + beta * C (column-major, leading dimensions, strided
// batches), and every rejection path with the status cuBLASLt documents.
#include <cublasLt.h>
#include <cublas_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tools/standins/common/half_bits.hpp"
#include "tools/standins/cublaslt/gemm_log.hpp"

namespace {

using namespace actbench::standin;

#define LT_OK(call) ASSERT_EQ((call), CUBLAS_STATUS_SUCCESS) << #call

// A typed host buffer holding elements of one cudaDataType as raw bytes.
struct Buffer {
  cudaDataType type;
  std::vector<uint8_t> bytes;
  Buffer(cudaDataType t, size_t n) : type(t), bytes(n * (t == CUDA_R_32F ? 4 : 2)) {}
  size_t size() const { return bytes.size() / (type == CUDA_R_32F ? 4 : 2); }
  void* data() { return bytes.data(); }
  float get(size_t i) const {
    if (type == CUDA_R_32F) return reinterpret_cast<const float*>(bytes.data())[i];
    const uint16_t h = reinterpret_cast<const uint16_t*>(bytes.data())[i];
    return type == CUDA_R_16BF ? bf16_to_float(h) : fp16_to_float(h);
  }
  void set(size_t i, float v) {
    if (type == CUDA_R_32F) {
      reinterpret_cast<float*>(bytes.data())[i] = v;
      return;
    }
    reinterpret_cast<uint16_t*>(bytes.data())[i] = type == CUDA_R_16BF ? float_to_bf16(v) : float_to_fp16(v);
  }
};

void fill_random(Buffer& b, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (size_t i = 0; i < b.size(); ++i) b.set(i, dist(gen));
}

// Relative precision of the output type (unit roundoff), for atol + |ref| * eps.
double output_eps(cudaDataType t) { return t == CUDA_R_32F ? 1e-6 : t == CUDA_R_16BF ? 1.0 / 256 : 1.0 / 2048; }

struct Case {
  cudaDataType ab, cd;
  bool ta, tb;
  int64_t m, n, k, batch;
  float alpha, beta;
  bool in_place;
};

std::string name_of(const Case& c) {
  auto t = [](cudaDataType x) { return x == CUDA_R_32F ? "f32" : x == CUDA_R_16BF ? "bf16" : "f16"; };
  return std::string(t(c.ab)) + "_" + t(c.cd) + (c.ta ? "_T" : "_N") + (c.tb ? "T" : "N") + "_" +
         std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k) + "_b" + std::to_string(c.batch) +
         (c.beta != 0.f ? "_beta" : "") + (c.in_place ? "_inplace" : "");
}

class LtGemmCase : public ::testing::TestWithParam<Case> {};

TEST_P(LtGemmCase, MatchesFloat64Reference) {
  const Case c = GetParam();
  // Stored shapes (column-major) with padded leading dimensions and a batch stride larger
  // than one matrix, so index mistakes land on padding.
  const int64_t a_rows = c.ta ? c.k : c.m, a_cols = c.ta ? c.m : c.k;
  const int64_t b_rows = c.tb ? c.n : c.k, b_cols = c.tb ? c.k : c.n;
  const int64_t lda = a_rows + 3, ldb = b_rows + 1, ldc = c.m + 2;
  const int64_t stride_a = lda * a_cols + 5, stride_b = ldb * b_cols + 2, stride_c = ldc * c.n + 7;
  Buffer a(c.ab, static_cast<size_t>(stride_a * c.batch)), b(c.ab, static_cast<size_t>(stride_b * c.batch));
  Buffer cin(c.cd, static_cast<size_t>(stride_c * c.batch)), d(c.cd, static_cast<size_t>(stride_c * c.batch));
  fill_random(a, 1);
  fill_random(b, 2);
  fill_random(cin, 3);
  const float sentinel = -96.f;  // exact in every type
  for (size_t i = 0; i < d.size(); ++i) d.set(i, sentinel);
  if (c.in_place) d = cin;
  const Buffer c_before = cin;

  cublasLtHandle_t lt = nullptr;
  LT_OK(cublasLtCreate(&lt));
  cublasLtMatmulDesc_t op = nullptr;
  LT_OK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t opa = c.ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = c.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
  LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
  auto make = [&](cudaDataType t, int64_t rows, int64_t cols, int64_t ld, int64_t stride) {
    cublasLtMatrixLayout_t l = nullptr;
    EXPECT_EQ(cublasLtMatrixLayoutCreate(&l, t, rows, cols, ld), CUBLAS_STATUS_SUCCESS);
    const int32_t count = static_cast<int32_t>(c.batch);
    EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
              CUBLAS_STATUS_SUCCESS);
    return l;
  };
  cublasLtMatrixLayout_t la = make(c.ab, a_rows, a_cols, lda, stride_a), lb = make(c.ab, b_rows, b_cols, ldb, stride_b);
  cublasLtMatrixLayout_t lc = make(c.cd, c.m, c.n, ldc, stride_c);

  cublasLtMatmulPreference_t pref = nullptr;
  LT_OK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws_bytes = 1024;
  LT_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  LT_OK(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &result, &returned));
  ASSERT_EQ(returned, 1);
  EXPECT_EQ(result.state, CUBLAS_STATUS_SUCCESS);
  EXPECT_LE(result.workspaceSize, ws_bytes);
  std::vector<uint8_t> workspace(ws_bytes);

  void* d_ptr = c.in_place ? cin.data() : d.data();
  LT_OK(cublasLtMatmul(lt, op, &c.alpha, a.data(), la, b.data(), lb, &c.beta, cin.data(), lc, d_ptr, lc, &result.algo,
                       workspace.data(), workspace.size(), nullptr));
  const Buffer& out = c.in_place ? cin : d;

  const double eps = output_eps(c.cd);
  for (int64_t p = 0; p < c.batch; ++p)
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        double ref = 0, mag = 0;
        for (int64_t l = 0; l < c.k; ++l) {
          const double x = a.get(p * stride_a + (c.ta ? i * lda + l : l * lda + i));
          const double y = b.get(p * stride_b + (c.tb ? l * ldb + j : j * ldb + l));
          ref += x * y;
          mag += std::fabs(x * y);
        }
        ref *= c.alpha;
        const size_t ci = static_cast<size_t>(p * stride_c + j * ldc + i);
        if (c.beta != 0.f) ref += static_cast<double>(c.beta) * c_before.get(ci);
        // fp32 accumulation error (k * 2^-24 of the magnitude) plus the output's rounding.
        const double atol = 1e-6 + c.k * 6e-8 * mag * std::fabs(c.alpha);
        ASSERT_NEAR(out.get(ci), ref, atol + std::fabs(ref) * eps) << "batch " << p << " (" << i << ", " << j << ")";
      }
  // Padding between columns and batches is never written.
  if (!c.in_place)
    for (size_t idx = 0; idx < d.size(); ++idx) {
      const int64_t in_batch = static_cast<int64_t>(idx) % stride_c;
      const bool inside = static_cast<int64_t>(idx) / stride_c < c.batch && in_batch < ldc * c.n && in_batch % ldc < c.m;
      if (!inside) {
        ASSERT_EQ(d.get(idx), sentinel) << "padding element " << idx << " written";
      }
    }

  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(op);
  LT_OK(cublasLtDestroy(lt));
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  const std::pair<cudaDataType, cudaDataType> types[] = {{CUDA_R_32F, CUDA_R_32F},
                                                         {CUDA_R_16BF, CUDA_R_16BF},
                                                         {CUDA_R_16BF, CUDA_R_32F},
                                                         {CUDA_R_16F, CUDA_R_16F},
                                                         {CUDA_R_16F, CUDA_R_32F}};
  for (auto [ab, cd] : types)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        cases.push_back({ab, cd, ta, tb, 7, 5, 3, 1, 1.f, 0.f, false});
        cases.push_back({ab, cd, ta, tb, 33, 17, 29, 3, 0.75f, -1.25f, false});
        cases.push_back({ab, cd, ta, tb, 1, 9, 1, 2, -2.f, 0.5f, true});
      }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllTypesAndTransposes, LtGemmCase, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& param_info) { return name_of(param_info.param); });

// A fixture holding a valid fp32 problem (m=4, n=3, k=2) that each rejection test breaks once.
class LtReject : public ::testing::Test {
 protected:
  void SetUp() override {
    LT_OK(cublasLtCreate(&lt));
    LT_OK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_OK(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, 4, 2, 4));
    LT_OK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, 2, 3, 2));
    LT_OK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, 4, 3, 4));
    LT_OK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, 4, 3, 4));
    LT_OK(cublasLtMatmulPreferenceCreate(&pref));
  }
  void TearDown() override {
    for (auto* l : {la, lb, lc, ld}) cublasLtMatrixLayoutDestroy(l);
    cublasLtMatmulDescDestroy(op);
    cublasLtMatmulPreferenceDestroy(pref);
    if (lt) cublasLtDestroy(lt);
  }
  cublasStatus_t matmul(cublasLtHandle_t handle, const float* alpha_p = nullptr, void* ws = nullptr,
                        size_t ws_bytes = 0, void* d_ptr = nullptr, cublasLtMatrixLayout_t d_layout = nullptr) {
    return cublasLtMatmul(handle, op, alpha_p ? alpha_p : &alpha, A.data(), la, B.data(), lb, &beta, C.data(), lc,
                          d_ptr ? d_ptr : D.data(), d_layout ? d_layout : ld, nullptr, ws, ws_bytes, nullptr);
  }
  cublasStatus_t heuristic(cublasLtHandle_t handle) {
    cublasLtMatmulHeuristicResult_t r{};
    int n = 0;
    return cublasLtMatmulAlgoGetHeuristic(handle, op, la, lb, lc, ld, pref, 1, &r, &n);
  }
  void expect_both(cublasStatus_t want) {
    EXPECT_EQ(matmul(lt), want);
    EXPECT_EQ(heuristic(lt), want);
  }
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr, ld = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  float alpha = 1.f, beta = 1.f;
  std::vector<float> A = std::vector<float>(8, 1.f), B = std::vector<float>(6, 1.f), C = std::vector<float>(12, 1.f),
                     D = std::vector<float>(12, 0.f);
};

TEST_F(LtReject, ValidProblemSucceeds) {
  expect_both(CUBLAS_STATUS_SUCCESS);
  for (float v : D) EXPECT_EQ(v, 3.f);  // 1*1 + 1*1 + beta * 1
}
TEST_F(LtReject, NullHandleIsNotInitialized) {
  EXPECT_EQ(matmul(nullptr), CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(heuristic(nullptr), CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(cublasLtDestroy(nullptr), CUBLAS_STATUS_NOT_INITIALIZED);
}
TEST_F(LtReject, LeadingDimensionBelowRowsIsInvalid) {
  const int64_t bad = 3;  // A has 4 rows
  LT_OK(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_LD, &bad, sizeof bad));
  expect_both(CUBLAS_STATUS_INVALID_VALUE);
}
TEST_F(LtReject, RowOrderLeadingDimensionBelowColsIsInvalid) {
  const int32_t row = CUBLASLT_ORDER_ROW;
  LT_OK(cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_ORDER, &row, sizeof row));
  LT_OK(cublasLtMatrixLayoutSetAttribute(ld, CUBLASLT_MATRIX_LAYOUT_ORDER, &row, sizeof row));
  const int64_t three = 3, two = 2;  // 4 x 3 row-major needs ld >= 3
  LT_OK(cublasLtMatrixLayoutSetAttribute(ld, CUBLASLT_MATRIX_LAYOUT_LD, &three, sizeof three));
  LT_OK(cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_LD, &three, sizeof three));
  EXPECT_EQ(matmul(lt), CUBLAS_STATUS_SUCCESS);
  for (float v : D) EXPECT_EQ(v, 3.f);
  LT_OK(cublasLtMatrixLayoutSetAttribute(ld, CUBLASLT_MATRIX_LAYOUT_LD, &two, sizeof two));
  expect_both(CUBLAS_STATUS_INVALID_VALUE);
}
TEST_F(LtReject, MismatchedShapesAreInvalid) {
  const uint64_t rows = 3;  // op(B) must have k = 2 rows
  LT_OK(cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows, sizeof rows));
  expect_both(CUBLAS_STATUS_INVALID_VALUE);
}
TEST_F(LtReject, MixedInputTypesAreNotSupported) {
  const uint32_t bf16 = CUDA_R_16BF, f16 = CUDA_R_16F;
  LT_OK(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_TYPE, &bf16, sizeof bf16));
  LT_OK(cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_TYPE, &f16, sizeof f16));
  expect_both(CUBLAS_STATUS_NOT_SUPPORTED);
}
TEST_F(LtReject, Fp32InputsWith16BitOutputAreNotSupported) {
  const uint32_t bf16 = CUDA_R_16BF;
  LT_OK(cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_TYPE, &bf16, sizeof bf16));
  LT_OK(cublasLtMatrixLayoutSetAttribute(ld, CUBLASLT_MATRIX_LAYOUT_TYPE, &bf16, sizeof bf16));
  expect_both(CUBLAS_STATUS_NOT_SUPPORTED);
}
TEST_F(LtReject, CAndDOfDifferentTypesAreNotSupported) {
  const uint32_t bf16 = CUDA_R_16BF;
  LT_OK(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_TYPE, &bf16, sizeof bf16));
  LT_OK(cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_TYPE, &bf16, sizeof bf16));
  LT_OK(cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_TYPE, &bf16, sizeof bf16));
  expect_both(CUBLAS_STATUS_NOT_SUPPORTED);  // D stays fp32
}
TEST_F(LtReject, IntegerTypesAreNotSupported) {
  const uint32_t i8 = CUDA_R_8I;
  LT_OK(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_TYPE, &i8, sizeof i8));
  LT_OK(cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_TYPE, &i8, sizeof i8));
  expect_both(CUBLAS_STATUS_NOT_SUPPORTED);
}
TEST_F(LtReject, OtherComputeOrScaleTypesAreNotSupported) {
  const int32_t c16 = CUBLAS_COMPUTE_16F, c32 = CUBLAS_COMPUTE_32F, s16 = CUDA_R_16F;
  LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, &c16, sizeof c16));
  expect_both(CUBLAS_STATUS_NOT_SUPPORTED);
  LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, &c32, sizeof c32));
  LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_SCALE_TYPE, &s16, sizeof s16));
  expect_both(CUBLAS_STATUS_NOT_SUPPORTED);
}
TEST_F(LtReject, TransposedCIsNotSupported) {
  const int32_t t = CUBLAS_OP_T;
  LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSC, &t, sizeof t));
  expect_both(CUBLAS_STATUS_NOT_SUPPORTED);
}
TEST_F(LtReject, EpiloguesAndUnmodelledAttributesAreNotSupported) {
  const uint32_t relu = CUBLASLT_EPILOGUE_RELU;
  LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &relu, sizeof relu));
  expect_both(CUBLAS_STATUS_NOT_SUPPORTED);
  const void* bias = C.data();
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
            CUBLAS_STATUS_NOT_SUPPORTED);
}
TEST_F(LtReject, BatchCountMismatchIsInvalid) {
  const int32_t two = 2;
  LT_OK(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &two, sizeof two));
  expect_both(CUBLAS_STATUS_INVALID_VALUE);
}
TEST_F(LtReject, AttributeOfWrongSizeIsInvalid) {
  const int64_t count = 2;  // BATCH_COUNT is int32_t
  EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count),
            CUBLAS_STATUS_INVALID_VALUE);
  const int64_t t = CUBLAS_OP_T;  // TRANSA is int32_t
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t), CUBLAS_STATUS_INVALID_VALUE);
  const uint32_t ws = 1;  // MAX_WORKSPACE_BYTES is uint64_t
  EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_LD, nullptr, sizeof(int64_t)),
            CUBLAS_STATUS_INVALID_VALUE);
}
TEST_F(LtReject, WorkspaceSizeWithoutWorkspaceIsInvalid) {
  EXPECT_EQ(matmul(lt, nullptr, nullptr, 64), CUBLAS_STATUS_INVALID_VALUE);
}
TEST_F(LtReject, InPlaceWithDifferentLayoutsIsInvalid) {
  cublasLtMatrixLayout_t wide = nullptr;
  LT_OK(cublasLtMatrixLayoutCreate(&wide, CUDA_R_32F, 4, 3, 5));
  std::vector<float> big(15, 1.f);
  C = big;
  // C == D but their descriptors disagree on ld.
  EXPECT_EQ(cublasLtMatmul(lt, op, &alpha, A.data(), la, B.data(), lb, &beta, C.data(), lc, C.data(), wide, nullptr,
                           nullptr, 0, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
  cublasLtMatrixLayoutDestroy(wide);
}
TEST_F(LtReject, NullScalarsAndBadHeuristicArgumentsAreInvalid) {
  EXPECT_EQ(cublasLtMatmul(lt, op, nullptr, A.data(), la, B.data(), lb, &beta, C.data(), lc, D.data(), ld, nullptr,
                           nullptr, 0, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
  cublasLtMatmulHeuristicResult_t r{};
  int n = 0;
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, ld, pref, 0, &r, &n), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, ld, nullptr, 1, &r, &n), CUBLAS_STATUS_INVALID_VALUE);
  cublasLtMatmulAlgo_t foreign{};
  EXPECT_EQ(cublasLtMatmul(lt, op, &alpha, A.data(), la, B.data(), lb, &beta, C.data(), lc, D.data(), ld, &foreign,
                           nullptr, 0, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
}
TEST_F(LtReject, BetaZeroDoesNotReadC) {
  beta = 0.f;
  for (float& v : C) v = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(matmul(lt), CUBLAS_STATUS_SUCCESS);
  for (float v : D) EXPECT_EQ(v, 2.f);
  // C may even be null then.
  EXPECT_EQ(cublasLtMatmul(lt, op, &alpha, A.data(), la, B.data(), lb, &beta, nullptr, lc, D.data(), ld, nullptr,
                           nullptr, 0, nullptr),
            CUBLAS_STATUS_SUCCESS);
}
TEST_F(LtReject, StatusStringsNameTheStatus) {
  EXPECT_STREQ(cublasLtGetStatusName(CUBLAS_STATUS_INVALID_VALUE), "CUBLAS_STATUS_INVALID_VALUE");
  EXPECT_NE(std::string(cublasLtGetStatusString(CUBLAS_STATUS_NOT_SUPPORTED)).find("not supported"), std::string::npos);
  EXPECT_EQ(cublasLtGetVersion(), static_cast<size_t>(CUBLAS_VERSION));
}

// The cuBLAS fallback entry point on the same loop: values and its documented ld checks.
// ACTBENCH_STANDIN_GEMM=skip: checked as always, nothing computed (D keeps its values).
TEST_F(LtReject, SkipModeChecksButComputesNothing) {
  setenv("ACTBENCH_STANDIN_GEMM", "skip", 1);
  const cublasStatus_t ok = matmul(lt);
  const std::vector<float> after = D;
  const cublasStatus_t unknown_handle = matmul(nullptr);
  unsetenv("ACTBENCH_STANDIN_GEMM");
  EXPECT_EQ(ok, CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(after, std::vector<float>(12, 0.f));  // computing would give 1 * 2 + 1 * 1 = 3
  EXPECT_EQ(unknown_handle, CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(matmul(lt), CUBLAS_STATUS_SUCCESS);   // and without the variable it computes
  EXPECT_EQ(D, std::vector<float>(12, 3.f));
}

// The GEMM log: each call that passes its checks, with its FLOPs and least bytes.
TEST_F(LtReject, GemmLogRecordsCallsThatPassTheirChecks) {
  set_gemm_log(true);
  EXPECT_EQ(matmul(lt), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(matmul(nullptr), CUBLAS_STATUS_NOT_INITIALIZED);  // refused: not recorded
  set_gemm_log(false);
  EXPECT_EQ(matmul(lt), CUBLAS_STATUS_SUCCESS);  // the log is off: not recorded
  const std::vector<GemmCall> calls = take_gemm_calls();
  ASSERT_EQ(calls.size(), 1u);
  const GemmCall& c = calls[0];
  EXPECT_EQ(c.m, 4);
  EXPECT_EQ(c.n, 3);
  EXPECT_EQ(c.k, 2);
  EXPECT_EQ(c.batch, 1);
  EXPECT_TRUE(c.reads_c);                 // beta = 1
  EXPECT_DOUBLE_EQ(c.flops(), 48.0);      // 2 m n k
  EXPECT_EQ(c.min_bytes(), 56u + 96u);    // fp32 A (4x2) and B (2x3) read; C read and D written (4x3 each)
  EXPECT_TRUE(take_gemm_calls().empty());
}

TEST(CublasFallback, StridedBatchedExMatchesReferenceAndChecksLd) {
  cublasHandle_t h = nullptr;
  LT_OK(cublasCreate_v2(&h));
  LT_OK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
  LT_OK(cublasSetStream_v2(h, nullptr));
  std::vector<uint8_t> ws(256);
  LT_OK(cublasSetWorkspace_v2(h, ws.data(), ws.size()));
  // C (2x2, two batches) = A^T B with A stored 3x2 (lda 3), B stored 3x2 (ldb 4).
  const int64_t m = 2, n = 2, k = 3, batch = 2;
  Buffer a(CUDA_R_16BF, 6 * batch), b(CUDA_R_16BF, 8 * batch), c(CUDA_R_32F, 4 * batch);
  fill_random(a, 7);
  fill_random(b, 8);
  const float alpha = 2.f, beta = 0.f;
  LT_OK(cublasGemmStridedBatchedEx_64(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, a.data(), CUDA_R_16BF, 3, 6,
                                      b.data(), CUDA_R_16BF, 4, 8, &beta, c.data(), CUDA_R_32F, 2, 4, batch,
                                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  for (int64_t p = 0; p < batch; ++p)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double ref = 0;
        for (int64_t l = 0; l < k; ++l) ref += double(a.get(p * 6 + i * 3 + l)) * b.get(p * 8 + j * 4 + l);
        EXPECT_NEAR(c.get(p * 4 + j * 2 + i), alpha * ref, 1e-5 + 1e-6 * std::fabs(ref));
      }
  EXPECT_EQ(cublasGemmStridedBatchedEx_64(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, a.data(), CUDA_R_16BF, 2, 6,
                                          b.data(), CUDA_R_16BF, 4, 8, &beta, c.data(), CUDA_R_32F, 2, 4, batch,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_INVALID_VALUE);  // lda 2 < k = 3 rows of stored A
  EXPECT_EQ(cublasGemmStridedBatchedEx_64(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, a.data(), CUDA_R_16BF, 3, 6,
                                          b.data(), CUDA_R_16F, 4, 8, &beta, c.data(), CUDA_R_32F, 2, 4, batch,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_NOT_SUPPORTED);
  LT_OK(cublasDestroy_v2(h));
  EXPECT_EQ(cublasDestroy_v2(nullptr), CUBLAS_STATUS_NOT_INITIALIZED);
}

}  // namespace
