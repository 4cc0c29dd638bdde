#pragma once
// Row-major GemmArgs (kernels/backend.hpp) on cuBLASLt, which is column-major: a row-major
// [r, c] matrix is the column-major [c, r] matrix with ld = c, its transpose, so
//   C = op(A) op(B)  (row-major)  <=>  C^T = op(B)^T op(A)^T  (column-major),
// i.e. cuBLASLt's first operand is our B and its second our A, with the same transpose flags.
// fp32 accumulation always (CUBLAS_COMPUTE_32F: fp32 operands are NOT rounded to TF32).
// Supported: A, B of one dtype; C of that dtype or fp32. Descriptors and the heuristic's
// algorithm are cached per shape/dtype/alignment. When cuBLASLt offers no algorithm (odd
// leading dimensions of 16-bit data, say) the call falls back to cublasGemmStridedBatchedEx.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <string>
#include <tuple>

#include "kernels/backend.hpp"
#include "runtime/dtype.hpp"

namespace actbench::cuda {

class LtGemm {
 public:
  // The workspace (device memory, >= 256-byte aligned) is owned by the caller and must
  // outlive this object; every call runs on the stream it is given.
  LtGemm(void* workspace, size_t workspace_bytes);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  void run(const GemmArgs& g, DType a_dtype, const void* a, DType b_dtype, const void* b, DType c_dtype, void* c,
           cudaStream_t stream);
  // Throws InvalidArgument unless (a, b, c) is a supported dtype combination.
  static void check_dtypes(DType a, DType b, DType c);
  static std::string version();
  // How many calls went to the cuBLAS fallback (tests and curiosity).
  int64_t fallback_calls() const { return fallback_calls_; }

 private:
  struct Key {
    bool trans_a, trans_b;
    int64_t m, n, k, batch;
    DType a, b, c;
    uint32_t align_a, align_b, align_c;
    auto tie() const { return std::tie(trans_a, trans_b, m, n, k, batch, a, b, c, align_a, align_b, align_c); }
    bool operator<(const Key& o) const { return tie() < o.tie(); }
  };
  struct Plan {
    bool use_lt = false;
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t first = nullptr, second = nullptr, out = nullptr;  // our B, our A, C
    cublasLtMatmulAlgo_t algo{};
  };
  Plan& plan_for(const Key& key);
  void run_fallback(const GemmArgs& g, DType a_dtype, const void* a, DType b_dtype, const void* b, DType c_dtype,
                    void* c, cudaStream_t stream);

  cublasLtHandle_t lt_ = nullptr;
  cublasHandle_t blas_ = nullptr;  // created on the first fallback
  void* workspace_;
  size_t workspace_bytes_;
  std::map<Key, Plan> plans_;
  int64_t fallback_calls_ = 0;
};

}  // namespace actbench::cuda
