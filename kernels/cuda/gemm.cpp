#include "kernels/cuda/gemm.hpp"

#include <climits>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_ops.hpp"
#include "runtime/error.hpp"

namespace actbench::cuda {
namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::bf16: return CUDA_R_16BF;
    case DType::fp16: return CUDA_R_16F;
    case DType::fp32: return CUDA_R_32F;
    default: break;
  }
  throw InvalidArgument(std::string("gemm: dtype ") + dtype_name(t) + " is not a float type");
}

// Largest power of two (<= 256) dividing the address of every matrix of the batch: what
// cuBLASLt may assume (the batch stride is folded in, to be safe with odd strides).
uint32_t alignment(const void* p, int64_t batch, int64_t stride_elems, DType t) {
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (batch > 1) a |= static_cast<uintptr_t>(stride_elems) * dtype_size(t);
  uint32_t align = 256;
  while (align > 1 && (a % align) != 0) align /= 2;
  return align;
}

// Stored (pre-op) shapes in column-major terms; see gemm.hpp for the swap.
struct ColMajor {
  uint64_t rows, cols;
  int64_t ld, stride;
};
ColMajor first_operand(const GemmArgs& g) {  // our B
  return g.trans_b ? ColMajor{static_cast<uint64_t>(g.k), static_cast<uint64_t>(g.n), g.k, g.n * g.k}
                   : ColMajor{static_cast<uint64_t>(g.n), static_cast<uint64_t>(g.k), g.n, g.n * g.k};
}
ColMajor second_operand(const GemmArgs& g) {  // our A
  return g.trans_a ? ColMajor{static_cast<uint64_t>(g.m), static_cast<uint64_t>(g.k), g.m, g.m * g.k}
                   : ColMajor{static_cast<uint64_t>(g.k), static_cast<uint64_t>(g.m), g.k, g.m * g.k};
}
ColMajor output(const GemmArgs& g) {
  return ColMajor{static_cast<uint64_t>(g.n), static_cast<uint64_t>(g.m), g.n, g.m * g.n};
}

// Owns one cuBLASLt descriptor until it is handed over with release(): a throw anywhere
// between creation and hand-over destroys it instead of leaking it.
template <class Handle, cublasStatus_t (*Destroy)(Handle)>
class LtOwned {
 public:
  LtOwned() = default;
  ~LtOwned() {
    if (h_) (void)Destroy(h_);
  }
  LtOwned(const LtOwned&) = delete;
  LtOwned& operator=(const LtOwned&) = delete;
  Handle* out() { return &h_; }
  Handle get() const { return h_; }
  Handle release() {
    Handle h = h_;
    h_ = nullptr;
    return h;
  }

 private:
  Handle h_ = nullptr;
};
using OwnedLayout = LtOwned<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using OwnedMatmulDesc = LtOwned<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using OwnedPreference = LtOwned<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

void make_layout(DType t, const ColMajor& s, int64_t batch, OwnedLayout& layout) {
  const cudaDataType_t type = cuda_type(t);
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(layout.out(), type, s.rows, s.cols, s.ld));
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(layout.get(), CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
    CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout.get(), CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &s.stride,
                                                  sizeof s.stride));
  }
}

std::string version_string(size_t v) {  // major * 10000 + minor * 100 + patch
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

}  // namespace

LtGemm::LtGemm(void* workspace, size_t workspace_bytes) : workspace_(workspace), workspace_bytes_(workspace_bytes) {
  CUBLAS_CHECK(cublasLtCreate(&lt_));
}

LtGemm::~LtGemm() {
  // Destructors must not throw: statuses are ignored here.
  for (auto& [key, p] : plans_) {
    if (p.first) cublasLtMatrixLayoutDestroy(p.first);
    if (p.second) cublasLtMatrixLayoutDestroy(p.second);
    if (p.out) cublasLtMatrixLayoutDestroy(p.out);
    if (p.op) cublasLtMatmulDescDestroy(p.op);
  }
  if (blas_) cublasDestroy(blas_);
  if (lt_) cublasLtDestroy(lt_);
}

void LtGemm::check_dtypes(DType a, DType b, DType c) {
  const bool floats = a != DType::u8 && b != DType::u8 && c != DType::u8;
  if (!floats || a != b || (c != a && c != DType::fp32))
    throw InvalidArgument(std::string("gemm: the cuda backend takes A and B of one float dtype and C of that dtype or "
                                      "fp32; got A ") +
                          dtype_name(a) + ", B " + dtype_name(b) + ", C " + dtype_name(c));
}

std::string LtGemm::version() { return version_string(cublasLtGetVersion()); }

LtGemm::Plan& LtGemm::plan_for(const Key& key) {
  auto found = plans_.find(key);
  if (found != plans_.end()) return found->second;
  GemmArgs g;
  g.trans_a = key.trans_a;
  g.trans_b = key.trans_b;
  g.m = key.m;
  g.n = key.n;
  g.k = key.k;
  g.batch = key.batch;

  OwnedMatmulDesc op;
  OwnedLayout first, second, out;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(op.out(), CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_first = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op.get(), CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof op_first));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op.get(), CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof op_second));
  make_layout(key.b, first_operand(g), key.batch, first);
  make_layout(key.a, second_operand(g), key.batch, second);
  make_layout(key.c, output(g), key.batch, out);

  OwnedPreference pref;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(pref.out()));
  const uint64_t ws = workspace_bytes_;
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  cublasStatus_t st =
      cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  // Alignment preferences: the default (256 bytes) would let the heuristic pick kernels our
  // pointers do not satisfy.
  const uint32_t aligns[4] = {key.align_b, key.align_a, key.align_c, key.align_c};
  const cublasLtMatmulPreferenceAttributes_t which[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; ++i)
    st = cublasLtMatmulPreferenceSetAttribute(pref.get(), which[i], &aligns[i], sizeof aligns[i]);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(lt_, op.get(), first.get(), second.get(), out.get(), out.get(), pref.get(), 1,
                                        &result, &returned);
  // NOT_SUPPORTED (or no result) means "no Lt kernel for this problem": use the fallback.
  // Any other status throws here; the owners free what was made.
  if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED) CUBLAS_CHECK(st);
  Plan p;
  p.use_lt = st == CUBLAS_STATUS_SUCCESS && returned > 0 && result.state == CUBLAS_STATUS_SUCCESS;
  if (p.use_lt) p.algo = result.algo;
  auto placed = plans_.emplace(key, p).first;  // may throw bad_alloc: the owners still hold
  placed->second.op = op.release();
  placed->second.first = first.release();
  placed->second.second = second.release();
  placed->second.out = out.release();
  return placed->second;
}

void LtGemm::run(const GemmArgs& g, DType a_dtype, const void* a, DType b_dtype, const void* b, DType c_dtype, void* c,
                 cudaStream_t stream) {
  check_dtypes(a_dtype, b_dtype, c_dtype);
  if (g.m < 0 || g.n < 0 || g.k < 0 || g.batch < 0) throw InvalidArgument("gemm: negative dimension");
  if (g.batch > INT32_MAX) throw InvalidArgument("gemm: batch " + std::to_string(g.batch) + " exceeds 2^31 - 1");
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  if (g.k == 0) {  // C = beta * C: nothing to multiply
    scale_inplace(c_dtype, c, g.beta, g.batch * g.m * g.n, stream);
    return;
  }
  const Key key{g.trans_a,
                g.trans_b,
                g.m,
                g.n,
                g.k,
                g.batch,
                a_dtype,
                b_dtype,
                c_dtype,
                alignment(a, g.batch, g.m * g.k, a_dtype),
                alignment(b, g.batch, g.k * g.n, b_dtype),
                alignment(c, g.batch, g.m * g.n, c_dtype)};
  Plan& p = plan_for(key);
  if (!p.use_lt) {
    run_fallback(g, a_dtype, a, b_dtype, b, c_dtype, c, stream);
    return;
  }
  const float alpha = g.alpha, beta = g.beta;  // host scalars (the default pointer mode)
  CUBLAS_CHECK(cublasLtMatmul(lt_, p.op, &alpha, b, p.first, a, p.second, &beta, c, p.out, c, p.out, &p.algo,
                              workspace_, workspace_bytes_, stream));
}

void LtGemm::run_fallback(const GemmArgs& g, DType a_dtype, const void* a, DType b_dtype, const void* b, DType c_dtype,
                          void* c, cudaStream_t stream) {
  if (!blas_) {
    CUBLAS_CHECK(cublasCreate(&blas_));
    // The default math mode with CUBLAS_COMPUTE_32F keeps fp32 GEMMs in full fp32 (no TF32).
    CUBLAS_CHECK(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH));
  }
  ++fallback_calls_;
  CUBLAS_CHECK(cublasSetStream(blas_, stream));
  // After the stream (cublasSetStream resets the workspace): our workspace, so cuBLAS
  // allocates nothing behind the caching allocator's back.
  CUBLAS_CHECK(cublasSetWorkspace(blas_, workspace_, workspace_bytes_));
  const ColMajor first = first_operand(g), second = second_operand(g), out = output(g);
  const float alpha = g.alpha, beta = g.beta;
  CUBLAS_CHECK(cublasGemmStridedBatchedEx_64(
      blas_, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, g.n, g.m, g.k, &alpha, b,
      cuda_type(b_dtype), first.ld, first.stride, a, cuda_type(a_dtype), second.ld, second.stride, &beta, c,
      cuda_type(c_dtype), out.ld, out.stride, g.batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace actbench::cuda
