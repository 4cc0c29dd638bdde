// A CPU stand-in for the subset of cuBLASLt (and the cuBLAS GEMM fallback) that actbench's
// CUDA backend calls, written from the cuBLAS documentation. Types and enums come from the
// toolkit's own <cublasLt.h>/<cublas_api.h>; every function here is our definition, and the
// library links no NVIDIA library. "Device" pointers are host pointers (the simulator's
// device memory is host memory); streams are ignored: a call completes before it returns.
//
// Semantics implemented (cuBLAS docs, cuBLASLt API): D = alpha * op(A) op(B) + beta * C,
// column-major (or row-major, CUBLASLT_ORDER_ROW) layouts with leading dimensions, strided
// batches, A/B/C/D of CUDA_R_16BF, CUDA_R_16F or CUDA_R_32F with CUBLAS_COMPUTE_32F
// (fp32 accumulation, fp32 operands not rounded to TF32) and CUDA_R_32F alpha/beta in host
// memory; beta == 0 does not read C. See tools/standins/README.md for what is rejected.
#include <cublasLt.h>
#include <cublas_api.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "tools/standins/common/half_bits.hpp"
#include "tools/standins/cublaslt/gemm_log.hpp"

using actbench::standin::bf16_to_float;
using actbench::standin::float_to_bf16;
using actbench::standin::float_to_fp16;
using actbench::standin::fp16_to_float;

// The opaque handle types are ours to define.
struct cublasLtContext {
  uint32_t magic = 0x4c74486e;  // "LtHn": catches a destroyed or foreign handle in tests
};
struct cublasContext {
  uint32_t magic = 0x426c486e;
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  cublasMath_t math = CUBLAS_DEFAULT_MATH;
};

namespace {

struct Layout {
  uint32_t magic = 0x4c61794f;
  uint32_t type;  // cudaDataType
  int32_t order = CUBLASLT_ORDER_COL;
  uint64_t rows, cols;
  int64_t ld;
  int32_t batch_count = 1;
  int64_t batch_stride = 0;  // elements
  int64_t plane_offset = 0;
};

struct Desc {
  uint32_t magic = 0x44657363;
  int32_t compute;  // cublasComputeType_t
  int32_t scale;    // cudaDataType
  int32_t pointer_mode = CUBLASLT_POINTER_MODE_HOST;
  int32_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N, trans_c = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
};

struct Preference {
  uint32_t magic = 0x50726566;
  uint32_t search_mode = 0;
  uint64_t max_workspace = 0;
  uint32_t align[4] = {256, 256, 256, 256};
};

// Marks an algorithm handed out by our heuristic (cublasLtMatmulAlgo_t::data[0]).
constexpr uint64_t kAlgoTag = 0x616374625374616eull;

Layout* layout_of(cublasLtMatrixLayout_t p) {
  auto* l = reinterpret_cast<Layout*>(p);
  return (l && l->magic == 0x4c61794f) ? l : nullptr;
}
Desc* desc_of(cublasLtMatmulDesc_t p) {
  auto* d = reinterpret_cast<Desc*>(p);
  return (d && d->magic == 0x44657363) ? d : nullptr;
}
Preference* pref_of(cublasLtMatmulPreference_t p) {
  auto* q = reinterpret_cast<Preference*>(p);
  return (q && q->magic == 0x50726566) ? q : nullptr;
}
bool valid_handle(cublasLtHandle_t h) { return h && h->magic == 0x4c74486e; }

template <class T>
cublasStatus_t set_value(T& field, const void* buf, size_t size) {
  if (!buf || size != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(&field, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}
template <class T>
cublasStatus_t get_value(const T& field, void* buf, size_t size, size_t* written) {
  if (size == 0 && written) {  // size query (documented: buf ignored when sizeInBytes is 0)
    *written = sizeof(T);
    return CUBLAS_STATUS_SUCCESS;
  }
  if (!buf || size < sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(buf, &field, sizeof(T));
  if (written) *written = sizeof(T);
  return CUBLAS_STATUS_SUCCESS;
}

bool is_float_type(uint32_t t) { return t == CUDA_R_16BF || t == CUDA_R_16F || t == CUDA_R_32F; }
size_t type_bytes(uint32_t t) { return t == CUDA_R_32F ? 4 : 2; }

float load(uint32_t type, const void* base, int64_t index) {
  switch (type) {
    case CUDA_R_32F: return static_cast<const float*>(base)[index];
    case CUDA_R_16BF: return bf16_to_float(static_cast<const uint16_t*>(base)[index]);
    default: return fp16_to_float(static_cast<const uint16_t*>(base)[index]);
  }
}
void store(uint32_t type, void* base, int64_t index, float v) {
  switch (type) {
    case CUDA_R_32F: static_cast<float*>(base)[index] = v; break;
    case CUDA_R_16BF: static_cast<uint16_t*>(base)[index] = float_to_bf16(v); break;
    default: static_cast<uint16_t*>(base)[index] = float_to_fp16(v); break;
  }
}

// Element (i, j) of one matrix of a layout, in elements from the batch's base.
int64_t offset(const Layout& l, int64_t i, int64_t j) {
  return l.order == CUBLASLT_ORDER_ROW ? i * l.ld + j : j * l.ld + i;
}

// One problem after validation: everything the kernel needs.
struct Problem {
  Layout a, b, c, d;
  bool trans_a, trans_b;
  int64_t m, n, k, batch;
};

cublasStatus_t check_layout(const Layout& l) {
  if (l.order != CUBLASLT_ORDER_COL && l.order != CUBLASLT_ORDER_ROW) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (l.plane_offset != 0) return CUBLAS_STATUS_NOT_SUPPORTED;  // planar complex
  // The leading dimension must keep columns (rows, for ORDER_ROW) from overlapping.
  const uint64_t min_ld = l.order == CUBLASLT_ORDER_COL ? l.rows : l.cols;
  if (l.ld < 1 || static_cast<uint64_t>(l.ld) < min_ld) return CUBLAS_STATUS_INVALID_VALUE;
  if (l.batch_count < 1) return CUBLAS_STATUS_INVALID_VALUE;
  if (l.rows > INT64_MAX / 2 || l.cols > INT64_MAX / 2) return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}

// The checks cublasLtMatmul and the heuristic share (no pointers involved).
cublasStatus_t validate(cublasLtMatmulDesc_t desc_h, cublasLtMatrixLayout_t a_h, cublasLtMatrixLayout_t b_h,
                        cublasLtMatrixLayout_t c_h, cublasLtMatrixLayout_t d_h, Problem& p) {
  const Desc* desc = desc_of(desc_h);
  const Layout *a = layout_of(a_h), *b = layout_of(b_h), *c = layout_of(c_h), *d = layout_of(d_h);
  if (!desc || !a || !b || !c || !d) return CUBLAS_STATUS_INVALID_VALUE;
  // Only what is implemented: fp32 compute and scale, host scalars, no epilogue, C not transposed.
  if (desc->compute != CUBLAS_COMPUTE_32F && desc->compute != CUBLAS_COMPUTE_32F_PEDANTIC)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (desc->scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (desc->pointer_mode != CUBLASLT_POINTER_MODE_HOST) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (desc->epilogue != CUBLASLT_EPILOGUE_DEFAULT) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (desc->trans_c != CUBLAS_OP_N) return CUBLAS_STATUS_NOT_SUPPORTED;  // documented: only N
  for (int32_t t : {desc->trans_a, desc->trans_b})
    if (t != CUBLAS_OP_N && t != CUBLAS_OP_T && t != CUBLAS_OP_C) return CUBLAS_STATUS_INVALID_VALUE;
  // Type combinations of the documented table for CUBLAS_COMPUTE_32F / CUDA_R_32F scale that
  // involve only real 16BF/16F/32F: A and B alike; C and D alike, equal to A's type or 32F
  // (32F A/B only with 32F C/D).
  if (!is_float_type(a->type) || a->type != b->type || c->type != d->type) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (c->type != a->type && c->type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  for (const Layout* l : {a, b, c, d}) {
    const cublasStatus_t st = check_layout(*l);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
  }
  // Real data: conjugate-transpose is transpose.
  p.trans_a = desc->trans_a != CUBLAS_OP_N;
  p.trans_b = desc->trans_b != CUBLAS_OP_N;
  const uint64_t m = p.trans_a ? a->cols : a->rows, k = p.trans_a ? a->rows : a->cols;
  const uint64_t kb = p.trans_b ? b->cols : b->rows, n = p.trans_b ? b->rows : b->cols;
  if (k != kb || c->rows != m || c->cols != n || d->rows != m || d->cols != n) return CUBLAS_STATUS_INVALID_VALUE;
  // C and D share the layout's shape; the batch count must agree across all four.
  if (a->batch_count != d->batch_count || b->batch_count != d->batch_count || c->batch_count != d->batch_count)
    return CUBLAS_STATUS_INVALID_VALUE;
  p.a = *a;
  p.b = *b;
  p.c = *c;
  p.d = *d;
  p.m = static_cast<int64_t>(m);
  p.n = static_cast<int64_t>(n);
  p.k = static_cast<int64_t>(k);
  p.batch = d->batch_count;
  return CUBLAS_STATUS_SUCCESS;
}

// ACTBENCH_STANDIN_GEMM=skip: every call is checked as always but computes nothing (D keeps
// what it held). For counting runs of the simulator at a real model's shape, whose GEMMs would
// take hours on the CPU and whose kernels' memory accesses do not depend on the values.
bool skip_compute() {
  const char* v = std::getenv("ACTBENCH_STANDIN_GEMM");
  return v && std::strcmp(v, "skip") == 0;
}

// D = alpha * op(A) op(B) + beta * C. Products summed in fp32 in k order (CUBLAS_COMPUTE_32F);
// C is not read when beta == 0. D may alias C (in place): each element of C is read before
// the same element of D is written and no other element is touched in between.
struct GemmLog {
  bool on = false;
  std::vector<actbench::standin::GemmCall> calls;
};
GemmLog& gemm_log() {
  static GemmLog log;
  return log;
}

void compute(const Problem& p, float alpha, const void* A, const void* B, float beta, const void* C, void* D) {
  if (gemm_log().on) gemm_log().calls.push_back({p.m, p.n, p.k, p.batch, static_cast<int>(p.a.type),
                                                 static_cast<int>(p.d.type), beta != 0.f});
  if (skip_compute()) return;
  std::vector<float> a_row(static_cast<size_t>(p.k));
  for (int64_t batch = 0; batch < p.batch; ++batch) {
    const int64_t a0 = batch * p.a.batch_stride, b0 = batch * p.b.batch_stride;
    const int64_t c0 = batch * p.c.batch_stride, d0 = batch * p.d.batch_stride;
    for (int64_t i = 0; i < p.m; ++i) {
      for (int64_t l = 0; l < p.k; ++l)  // op(A)(i, l)
        a_row[static_cast<size_t>(l)] =
            load(p.a.type, A, a0 + (p.trans_a ? offset(p.a, l, i) : offset(p.a, i, l)));
      for (int64_t j = 0; j < p.n; ++j) {
        float acc = 0.f;
        for (int64_t l = 0; l < p.k; ++l)  // op(B)(l, j)
          acc += a_row[static_cast<size_t>(l)] *
                 load(p.b.type, B, b0 + (p.trans_b ? offset(p.b, j, l) : offset(p.b, l, j)));
        float out = alpha * acc;
        if (beta != 0.f) out += beta * load(p.c.type, C, c0 + offset(p.c, i, j));
        store(p.d.type, D, d0 + offset(p.d, i, j), out);
      }
    }
  }
}

bool same_storage(const Layout& x, const Layout& y) {
  return x.type == y.type && x.order == y.order && x.rows == y.rows && x.cols == y.cols && x.ld == y.ld &&
         x.batch_count == y.batch_count && x.batch_stride == y.batch_stride;
}

}  // namespace

extern "C" {

// ---- status and version ----------------------------------------------------------------

const char* CUBLASWINAPI cublasLtGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "<unknown>";
}

const char* CUBLASWINAPI cublasLtGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized (cuBLASLt stand-in)";
    case CUBLAS_STATUS_ALLOC_FAILED: return "resource allocation failed (cuBLASLt stand-in)";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid value was used as an argument (cuBLASLt stand-in)";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported (cuBLASLt stand-in)";
    default: return "cuBLAS error (cuBLASLt stand-in)";
  }
}

// The version of the headers it was built against: the stand-in has the same interface.
size_t CUBLASWINAPI cublasLtGetVersion(void) { return CUBLAS_VERSION; }

// ---- handle ----------------------------------------------------------------------------

cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t* handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new (std::nothrow) cublasLtContext;
  return *handle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t handle) {
  if (!valid_handle(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->magic = 0;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

// ---- matrix layouts --------------------------------------------------------------------

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                                       uint64_t rows, uint64_t cols, int64_t ld) {
  if (!layout) return CUBLAS_STATUS_INVALID_VALUE;
  auto* l = new (std::nothrow) Layout;
  if (!l) return CUBLAS_STATUS_ALLOC_FAILED;
  l->type = static_cast<uint32_t>(type);
  l->rows = rows;
  l->cols = cols;
  l->ld = ld;
  *layout = reinterpret_cast<cublasLtMatrixLayout_t>(l);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutDestroy(const cublasLtMatrixLayout_t layout) {
  Layout* l = layout_of(layout);
  if (!l) return layout ? CUBLAS_STATUS_INVALID_VALUE : CUBLAS_STATUS_SUCCESS;
  l->magic = 0;
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout,
                                                             cublasLtMatrixLayoutAttribute_t attr, const void* buf,
                                                             size_t sizeInBytes) {
  Layout* l = layout_of(layout);
  if (!l) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: return set_value(l->type, buf, sizeInBytes);
    case CUBLASLT_MATRIX_LAYOUT_ORDER: return set_value(l->order, buf, sizeInBytes);
    case CUBLASLT_MATRIX_LAYOUT_ROWS: return set_value(l->rows, buf, sizeInBytes);
    case CUBLASLT_MATRIX_LAYOUT_COLS: return set_value(l->cols, buf, sizeInBytes);
    case CUBLASLT_MATRIX_LAYOUT_LD: return set_value(l->ld, buf, sizeInBytes);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return set_value(l->batch_count, buf, sizeInBytes);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return set_value(l->batch_stride, buf, sizeInBytes);
    case CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET: return set_value(l->plane_offset, buf, sizeInBytes);
    default: return CUBLAS_STATUS_INVALID_VALUE;
  }
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t layout,
                                                             cublasLtMatrixLayoutAttribute_t attr, void* buf,
                                                             size_t sizeInBytes, size_t* sizeWritten) {
  const Layout* l = layout_of(layout);
  if (!l) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: return get_value(l->type, buf, sizeInBytes, sizeWritten);
    case CUBLASLT_MATRIX_LAYOUT_ORDER: return get_value(l->order, buf, sizeInBytes, sizeWritten);
    case CUBLASLT_MATRIX_LAYOUT_ROWS: return get_value(l->rows, buf, sizeInBytes, sizeWritten);
    case CUBLASLT_MATRIX_LAYOUT_COLS: return get_value(l->cols, buf, sizeInBytes, sizeWritten);
    case CUBLASLT_MATRIX_LAYOUT_LD: return get_value(l->ld, buf, sizeInBytes, sizeWritten);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return get_value(l->batch_count, buf, sizeInBytes, sizeWritten);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
      return get_value(l->batch_stride, buf, sizeInBytes, sizeWritten);
    case CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET: return get_value(l->plane_offset, buf, sizeInBytes, sizeWritten);
    default: return CUBLAS_STATUS_INVALID_VALUE;
  }
}

// ---- matmul descriptor -----------------------------------------------------------------

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc,
                                                     cublasComputeType_t computeType, cudaDataType_t scaleType) {
  if (!matmulDesc) return CUBLAS_STATUS_INVALID_VALUE;
  auto* d = new (std::nothrow) Desc;
  if (!d) return CUBLAS_STATUS_ALLOC_FAILED;
  d->compute = computeType;
  d->scale = scaleType;
  *matmulDesc = reinterpret_cast<cublasLtMatmulDesc_t>(d);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescDestroy(const cublasLtMatmulDesc_t matmulDesc) {
  Desc* d = desc_of(matmulDesc);
  if (!d) return matmulDesc ? CUBLAS_STATUS_INVALID_VALUE : CUBLAS_STATUS_SUCCESS;
  d->magic = 0;
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}

// Attributes outside this list are rejected with NOT_SUPPORTED: the stand-in does not model
// them, and silently ignoring one (a bias epilogue, say) would compute the wrong thing.
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                           cublasLtMatmulDescAttributes_t attr, const void* buf,
                                                           size_t sizeInBytes) {
  Desc* d = desc_of(matmulDesc);
  if (!d) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return set_value(d->compute, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return set_value(d->scale, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: return set_value(d->pointer_mode, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_TRANSA: return set_value(d->trans_a, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_TRANSB: return set_value(d->trans_b, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_TRANSC: return set_value(d->trans_c, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return set_value(d->epilogue, buf, sizeInBytes);
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                           cublasLtMatmulDescAttributes_t attr, void* buf,
                                                           size_t sizeInBytes, size_t* sizeWritten) {
  const Desc* d = desc_of(matmulDesc);
  if (!d) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return get_value(d->compute, buf, sizeInBytes, sizeWritten);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return get_value(d->scale, buf, sizeInBytes, sizeWritten);
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: return get_value(d->pointer_mode, buf, sizeInBytes, sizeWritten);
    case CUBLASLT_MATMUL_DESC_TRANSA: return get_value(d->trans_a, buf, sizeInBytes, sizeWritten);
    case CUBLASLT_MATMUL_DESC_TRANSB: return get_value(d->trans_b, buf, sizeInBytes, sizeWritten);
    case CUBLASLT_MATMUL_DESC_TRANSC: return get_value(d->trans_c, buf, sizeInBytes, sizeWritten);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return get_value(d->epilogue, buf, sizeInBytes, sizeWritten);
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

// ---- preference and heuristic ----------------------------------------------------------

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
  auto* q = new (std::nothrow) Preference;
  if (!q) return CUBLAS_STATUS_ALLOC_FAILED;
  *pref = reinterpret_cast<cublasLtMatmulPreference_t>(q);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(const cublasLtMatmulPreference_t pref) {
  Preference* q = pref_of(pref);
  if (!q) return pref ? CUBLAS_STATUS_INVALID_VALUE : CUBLAS_STATUS_SUCCESS;
  q->magic = 0;
  delete q;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                                 cublasLtMatmulPreferenceAttributes_t attr,
                                                                 const void* buf, size_t sizeInBytes) {
  Preference* q = pref_of(pref);
  if (!q) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE: return set_value(q->search_mode, buf, sizeInBytes);
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return set_value(q->max_workspace, buf, sizeInBytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return set_value(q->align[0], buf, sizeInBytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return set_value(q->align[1], buf, sizeInBytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return set_value(q->align[2], buf, sizeInBytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return set_value(q->align[3], buf, sizeInBytes);
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

// One algorithm (the CPU loop) for every valid problem; it needs no workspace and no
// alignment, so every preference admits it. Invalid problems report what cublasLtMatmul would.
cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle,
                                                           cublasLtMatmulDesc_t operationDesc,
                                                           cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                                           cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                                           cublasLtMatmulPreference_t preference,
                                                           int requestedAlgoCount,
                                                           cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                                           int* returnAlgoCount) {
  if (!valid_handle(lightHandle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!pref_of(preference) || requestedAlgoCount < 1 || !heuristicResultsArray || !returnAlgoCount)
    return CUBLAS_STATUS_INVALID_VALUE;
  Problem p;
  const cublasStatus_t st = validate(operationDesc, Adesc, Bdesc, Cdesc, Ddesc, p);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  cublasLtMatmulHeuristicResult_t& r = heuristicResultsArray[0];
  std::memset(&r, 0, sizeof r);
  r.algo.data[0] = kAlgoTag;
  r.workspaceSize = 0;
  r.state = CUBLAS_STATUS_SUCCESS;
  r.wavesCount = 1.f;
  *returnAlgoCount = 1;
  return CUBLAS_STATUS_SUCCESS;
}

// ---- matmul ----------------------------------------------------------------------------

cublasStatus_t CUBLASWINAPI cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                                           const void* alpha, const void* A, cublasLtMatrixLayout_t Adesc,
                                           const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta,
                                           const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                                           cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo,
                                           void* workspace, size_t workspaceSizeInBytes, cudaStream_t stream) {
  if (!valid_handle(lightHandle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  Problem p;
  const cublasStatus_t st = validate(computeDesc, Adesc, Bdesc, Cdesc, Ddesc, p);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
  if (algo && algo->data[0] != kAlgoTag) return CUBLAS_STATUS_INVALID_VALUE;  // not one of ours
  if (workspaceSizeInBytes > 0 && !workspace) return CUBLAS_STATUS_INVALID_VALUE;
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  const bool empty = p.m == 0 || p.n == 0;
  if (!empty && (!D || (p.k > 0 && (!A || !B)) || (b != 0.f && !C))) return CUBLAS_STATUS_INVALID_VALUE;
  // In place (C == D) requires C and D to describe the same storage.
  if (C && C == D && !same_storage(p.c, p.d)) return CUBLAS_STATUS_INVALID_VALUE;
  if (empty) return CUBLAS_STATUS_SUCCESS;
  compute(p, a, A, B, b, C, D);
  return CUBLAS_STATUS_SUCCESS;
}

// ---- the cuBLAS calls of the fallback path ---------------------------------------------

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t* handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new (std::nothrow) cublasContext;
  return *handle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle) {
  if (!handle || handle->magic != 0x426c486e) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->magic = 0;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (!handle || handle->magic != 0x426c486e) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->math = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId) {
  if (!handle || handle->magic != 0x426c486e) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = streamId;
  handle->workspace = nullptr;  // documented: setting the stream resets the user workspace
  handle->workspace_bytes = 0;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace,
                                                  size_t workspaceSizeInBytes) {
  if (!handle || handle->magic != 0x426c486e) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (workspaceSizeInBytes > 0 && !workspace) return CUBLAS_STATUS_INVALID_VALUE;
  handle->workspace = workspace;
  handle->workspace_bytes = workspaceSizeInBytes;
  return CUBLAS_STATUS_SUCCESS;
}

// cublasGemmStridedBatchedEx_64: C = alpha op(A) op(B) + beta C, column-major, the same
// type table as cuBLASLt for CUBLAS_COMPUTE_32F (the stand-in runs it on the same loop).
cublasStatus_t CUBLASWINAPI cublasGemmStridedBatchedEx_64(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int64_t m, int64_t n, int64_t k,
    const void* alpha, const void* A, cudaDataType Atype, int64_t lda, long long int strideA, const void* B,
    cudaDataType Btype, int64_t ldb, long long int strideB, const void* beta, void* C, cudaDataType Ctype,
    int64_t ldc, long long int strideC, int64_t batchCount, cublasComputeType_t computeType,
    cublasGemmAlgo_t algo) {
  if (!handle || handle->magic != 0x426c486e) return CUBLAS_STATUS_NOT_INITIALIZED;
  for (cublasOperation_t t : {transa, transb})
    if (t != CUBLAS_OP_N && t != CUBLAS_OP_T && t != CUBLAS_OP_C) return CUBLAS_STATUS_INVALID_VALUE;
  // Documented argument checks of cublas<t>gemm: sizes >= 0, lda >= max(1, rows of stored A), ...
  const int64_t a_rows = transa == CUBLAS_OP_N ? m : k, b_rows = transb == CUBLAS_OP_N ? k : n;
  if (m < 0 || n < 0 || k < 0 || batchCount < 0) return CUBLAS_STATUS_INVALID_VALUE;
  if (lda < (a_rows > 1 ? a_rows : 1) || ldb < (b_rows > 1 ? b_rows : 1) || ldc < (m > 1 ? m : 1))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (computeType != CUBLAS_COMPUTE_32F && computeType != CUBLAS_COMPUTE_32F_PEDANTIC)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (!is_float_type(Atype) || Atype != Btype || (Ctype != Atype && Ctype != CUDA_R_32F))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
  if (m == 0 || n == 0 || batchCount == 0) return CUBLAS_STATUS_SUCCESS;
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  if (!C || (k > 0 && (!A || !B))) return CUBLAS_STATUS_INVALID_VALUE;
  Problem p;
  p.trans_a = transa != CUBLAS_OP_N;
  p.trans_b = transb != CUBLAS_OP_N;
  p.m = m;
  p.n = n;
  p.k = k;
  p.batch = batchCount;
  auto layout = [](cudaDataType t, int64_t rows, int64_t cols, int64_t ld, long long stride) {
    Layout l;
    l.type = t;
    l.rows = static_cast<uint64_t>(rows);
    l.cols = static_cast<uint64_t>(cols);
    l.ld = ld;
    l.batch_stride = stride;
    return l;
  };
  p.a = layout(Atype, a_rows, p.trans_a ? m : k, lda, strideA);
  p.b = layout(Btype, b_rows, p.trans_b ? k : n, ldb, strideB);
  p.c = layout(Ctype, m, n, ldc, strideC);
  p.d = p.c;
  compute(p, a, A, B, b, C, C);
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"

// ---- the GEMM log (gemm_log.hpp) -----------------------------------------------------------

namespace actbench::standin {

uint64_t GemmCall::min_bytes() const {
  const uint64_t ab = ab_type == CUDA_R_32F ? 4 : 2, cd = cd_type == CUDA_R_32F ? 4 : 2;
  const uint64_t m_ = static_cast<uint64_t>(m), n_ = static_cast<uint64_t>(n), k_ = static_cast<uint64_t>(k);
  return static_cast<uint64_t>(batch) * ((m_ * k_ + k_ * n_) * ab + m_ * n_ * cd * (reads_c ? 2 : 1));
}

bool GemmCall::tensor_cores() const { return ab_type != CUDA_R_32F; }

std::string GemmCall::describe() const {
  auto type = [](int t) { return t == CUDA_R_32F ? "fp32" : t == CUDA_R_16BF ? "bf16" : "fp16"; };
  return "m " + std::to_string(m) + " n " + std::to_string(n) + " k " + std::to_string(k) + " batch " +
         std::to_string(batch) + ", " + type(ab_type) + " -> " + type(cd_type) + (reads_c ? ", + C" : "");
}

void set_gemm_log(bool on) { gemm_log().on = on; }

std::vector<GemmCall> take_gemm_calls() {
  std::vector<GemmCall> calls;
  calls.swap(gemm_log().calls);
  return calls;
}

}  // namespace actbench::standin
