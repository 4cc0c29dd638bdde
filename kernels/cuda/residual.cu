// The residual-path ops: bias + dropout + residual (forward, with or without a bias), bias
// add, bias gradient (deterministic column sums), in-place add and scale.
//
// Every kernel moves packs of consecutive elements (packs.cuh): 16-byte packs when rows and
// pointers allow, single elements otherwise. The ops with a bias run on column bands: a
// thread owns one pack of columns, loads its bias once into registers and walks
// kRowsPerBand rows, so the bias is read once per band instead of once per element (and
// its column needs no 64-bit modulo); the dropout's canonical index advances by one row per
// step with carries (DropoutCursor), no division in the loop.
#include <algorithm>

#include "kernels/cuda/column_reduce.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda/dropout_common.cuh"
#include "kernels/cuda/packs.cuh"

namespace actbench::cuda {
namespace {

// Rows per band: the bias is re-read once per band, 1/8 of an element's other traffic (x,
// residual, out, mask) spread over 8 rows: under 4 % in every dtype, while 8192 rows of the
// 22B model's h = 6144 still make 3 x 1024 blocks of 256 threads.
constexpr int64_t kRowsPerBand = 8;

struct Bands {
  dim3 grid;
  unsigned threads = 0;
  int64_t rows_per_band = 0;
};
// blockIdx.x * blockDim.x + threadIdx.x: the column pack; blockIdx.y: the band of rows.
Bands column_bands(int64_t rows, int64_t packs_per_row) {
  Bands b;
  const int64_t threads = std::min<int64_t>(kElementwiseThreads, (packs_per_row + 31) / 32 * 32);
  b.threads = static_cast<unsigned>(threads);
  b.rows_per_band = std::max<int64_t>(kRowsPerBand, (rows + 65534) / 65535);  // grid.y <= 65535
  b.grid = dim3(static_cast<unsigned>((packs_per_row + threads - 1) / threads),
                static_cast<unsigned>((rows + b.rows_per_band - 1) / b.rows_per_band));
  return b;
}

// The rows [first, end) of this block's band and the first column of this thread's pack
// (false: the thread has no pack).
struct BandPlace {
  int64_t first = 0, end = 0, col = 0;
};
__device__ __forceinline__ bool band_place(int64_t rows, int64_t cols, int64_t rows_per_band, int kN, BandPlace& at) {
  at.col = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kN;
  at.first = static_cast<int64_t>(blockIdx.y) * rows_per_band;
  at.end = at.first + rows_per_band < rows ? at.first + rows_per_band : rows;
  return at.col < cols;
}

// out = residual + (keep ? (x + bias) * scale : 0), one rounding at the store. Without kBias
// there is no bias (bias is null): a compile-time branch, no cost to the bias case. cols and
// spec.inner are multiples of kN, so a pack is kN consecutive canonical indices.
template <class T, int kN, bool kWide, bool kBias>
__global__ void bias_dropout_residual_kernel(const T* __restrict__ x, const T* __restrict__ bias,
                                             const T* __restrict__ residual, DropoutSpec spec, uint32_t threshold,
                                             float scale, T* __restrict__ out, uint8_t* __restrict__ mask,
                                             int64_t rows, int64_t cols, int64_t rows_per_band) {
  BandPlace band;
  if (!band_place(rows, cols, rows_per_band, kN, band)) return;
  float b[kN];
  if constexpr (kBias) load_pack<T, kN, kWide>(bias + band.col, b);
  DropoutCursor at = DropoutCursor::at(spec, band.first * cols + band.col);
  const DropoutCursor next_row = DropoutCursor::at(spec, cols);
  for (int64_t r = band.first; r < band.end; ++r, at.advance(spec, next_row)) {
    const int64_t i = r * cols + band.col;
    float v[kN], res[kN];
    uint8_t keep[kN];
    load_pack<T, kN, kWide>(x + i, v);
    load_pack<T, kN, kWide>(residual + i, res);
    dropout_keep<kN>(spec, threshold, at.canonical(spec), keep);
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      if constexpr (kBias) v[k] += b[k];
      v[k] = res[k] + (keep[k] ? v[k] * scale : 0.f);
    }
    store_pack<T, kN, kWide>(out + i, v);
    store_mask<kN, kWide>(mask + i, keep);
  }
}

template <class T, int kN, bool kWide>
__global__ void add_bias_kernel(T* __restrict__ y, const T* __restrict__ bias, int64_t rows, int64_t cols,
                                int64_t rows_per_band) {
  BandPlace band;
  if (!band_place(rows, cols, rows_per_band, kN, band)) return;
  float b[kN];
  load_pack<T, kN, kWide>(bias + band.col, b);
  for (int64_t r = band.first; r < band.end; ++r) {
    T* yr = y + r * cols + band.col;
    float v[kN];
    load_pack<T, kN, kWide>(yr, v);
#pragma unroll
    for (int k = 0; k < kN; ++k) v[k] += b[k];
    store_pack<T, kN, kWide>(yr, v);
  }
}

// Flat ops: packs of kN elements grid-stride, then the n % kN elements left, one per thread.
template <class T, int kN, bool kWide>
__global__ void add_inplace_kernel(T* __restrict__ dst, const T* __restrict__ src, int64_t n) {
  const int64_t packs = n / kN;
  for (int64_t p = global_thread(); p < packs; p += grid_threads()) {
    float d[kN], s[kN];
    load_pack<T, kN, kWide>(dst + p * kN, d);
    load_pack<T, kN, kWide>(src + p * kN, s);
#pragma unroll
    for (int k = 0; k < kN; ++k) d[k] += s[k];
    store_pack<T, kN, kWide>(dst + p * kN, d);
  }
  const int64_t i = packs * kN + global_thread();
  if (i < n) dst[i] = from_float<T>(to_float(dst[i]) + to_float(src[i]));
}

template <class T, int kN, bool kWide>
__global__ void scale_inplace_kernel(T* __restrict__ c, float beta, int64_t n) {
  const int64_t packs = n / kN;
  for (int64_t p = global_thread(); p < packs; p += grid_threads()) {
    float v[kN];
    load_pack<T, kN, kWide>(c + p * kN, v);
#pragma unroll
    for (int k = 0; k < kN; ++k) v[k] *= beta;
    store_pack<T, kN, kWide>(c + p * kN, v);
  }
  const int64_t i = packs * kN + global_thread();
  if (i < n) c[i] = from_float<T>(beta * to_float(c[i]));
}

template <class T, int kN, bool kWide, bool kBias>
void launch_bias_dropout_residual(const T* x, const T* bias, const T* residual, const DropoutSpec& spec, T* out,
                                  uint8_t* mask, int64_t rows, int64_t cols, cudaStream_t stream) {
  const Bands b = column_bands(rows, cols / kN);
  bias_dropout_residual_kernel<T, kN, kWide, kBias><<<b.grid, b.threads, 0, stream>>>(
      x, bias, residual, spec, dropout_threshold(spec.p), spec.scale(), out, mask, rows, cols, b.rows_per_band);
  CUDA_CHECK_LAUNCH();
}

// The widest pack the shape and the pointers allow: 16 bytes when cols and the spec's inner
// runs are multiples of it (a pack stays in one row and one Philox-aligned run of canonical
// indices: dropout_groups_of);
// else 4 elements (Philox groups, element accesses) or 1.
template <class T, bool kBias>
void bias_dropout_residual(const T* x, const T* bias, const T* residual, const DropoutSpec& spec, T* out,
                           uint8_t* mask, int64_t rows, int64_t cols, cudaStream_t stream) {
  constexpr int kW = kPack<T>;
  const bool aligned = aligned_to(x, 16) && aligned_to(residual, 16) && aligned_to(out, 16) &&
                       aligned_to(mask, kW) && (!kBias || aligned_to(bias, 16));
  if (cols % kW == 0 && dropout_groups_of(spec, kW) && aligned)
    launch_bias_dropout_residual<T, kW, true, kBias>(x, bias, residual, spec, out, mask, rows, cols, stream);
  else if (cols % 4 == 0 && dropout_groups_of(spec, 4))
    launch_bias_dropout_residual<T, 4, false, kBias>(x, bias, residual, spec, out, mask, rows, cols, stream);
  else
    launch_bias_dropout_residual<T, 1, false, kBias>(x, bias, residual, spec, out, mask, rows, cols, stream);
}

template <class T>
void launch_add_bias(T* y, const T* bias, int64_t rows, int64_t cols, cudaStream_t stream) {
  constexpr int kW = kPack<T>;
  if (cols % kW == 0 && aligned_to(y, 16) && aligned_to(bias, 16)) {
    const Bands b = column_bands(rows, cols / kW);
    add_bias_kernel<T, kW, true><<<b.grid, b.threads, 0, stream>>>(y, bias, rows, cols, b.rows_per_band);
  } else {
    const Bands b = column_bands(rows, cols);
    add_bias_kernel<T, 1, false><<<b.grid, b.threads, 0, stream>>>(y, bias, rows, cols, b.rows_per_band);
  }
  CUDA_CHECK_LAUNCH();
}

template <class T>
void launch_add_inplace(T* dst, const T* src, int64_t n, cudaStream_t stream) {
  constexpr int kW = kPack<T>;
  if (aligned_to(dst, 16) && aligned_to(src, 16))
    add_inplace_kernel<T, kW, true><<<elementwise_blocks(n, kW), kElementwiseThreads, 0, stream>>>(dst, src, n);
  else
    add_inplace_kernel<T, 1, false><<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(dst, src, n);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void launch_scale_inplace(T* c, float beta, int64_t n, cudaStream_t stream) {
  constexpr int kW = kPack<T>;
  if (aligned_to(c, 16))
    scale_inplace_kernel<T, kW, true><<<elementwise_blocks(n, kW), kElementwiseThreads, 0, stream>>>(c, beta, n);
  else
    scale_inplace_kernel<T, 1, false><<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(c, beta, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void bias_dropout_residual_fwd(DType dt, const void* x, const void* bias, const void* residual, const DropoutSpec& spec,
                               void* out, uint8_t* mask, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows * cols == 0) return;
  // Without a bias the elements have no columns of their own: rows of spec.inner, so that
  // packs never cross a run of consecutive canonical indices.
  if (!bias) {
    rows = rows * cols / spec.inner;
    cols = spec.inner;
  }
  ACTBENCH_DISPATCH_FLOAT(dt, "bias_dropout_residual_fwd", T, {
    const T* b = static_cast<const T*>(bias);
    if (b)
      bias_dropout_residual<T, true>(static_cast<const T*>(x), b, static_cast<const T*>(residual), spec,
                                     static_cast<T*>(out), mask, rows, cols, stream);
    else
      bias_dropout_residual<T, false>(static_cast<const T*>(x), b, static_cast<const T*>(residual), spec,
                                      static_cast<T*>(out), mask, rows, cols, stream);
  });
}

void add_bias(DType dt, void* y, const void* bias, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows * cols == 0) return;
  ACTBENCH_DISPATCH_FLOAT(dt, "add_bias", T,
                          launch_add_bias<T>(static_cast<T*>(y), static_cast<const T*>(bias), rows, cols, stream));
}

int64_t bias_grad_workspace_floats(int64_t rows, int64_t cols) { return column_sums_workspace_floats(rows, cols, false); }

void bias_grad(DType dt, const void* dy, void* db, float* workspace, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (cols == 0) return;
  ACTBENCH_DISPATCH_FLOAT(dt, "bias_grad", T,
                          column_sums<T, false>(static_cast<const T*>(dy), nullptr, nullptr, nullptr,
                                                static_cast<T*>(db), nullptr, workspace, rows, cols, stream));
}

void add_inplace(DType dt, void* dst, const void* src, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  ACTBENCH_DISPATCH_FLOAT(dt, "add_inplace", T,
                          launch_add_inplace<T>(static_cast<T*>(dst), static_cast<const T*>(src), n, stream));
}

void scale_inplace(DType dt, void* c, float beta, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (beta == 0.f) {  // BLAS semantics: C is not read when beta is 0 (NaN in C does not survive)
    CUDA_CHECK(cudaMemsetAsync(c, 0, static_cast<size_t>(n) * dtype_size(dt), stream));
    return;
  }
  ACTBENCH_DISPATCH_FLOAT(dt, "scale_inplace", T, launch_scale_inplace<T>(static_cast<T*>(c), beta, n, stream));
}

}  // namespace actbench::cuda
