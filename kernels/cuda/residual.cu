// The residual-path ops: bias + dropout + residual (forward, with or without a bias), bias
// add, bias gradient (deterministic column sums), in-place add and scale.
#include "kernels/cuda/column_reduce.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda/dropout_common.cuh"

namespace actbench::cuda {
namespace {

// out = residual + (keep ? (x + bias) * scale : 0), one rounding at the store. Without kBias
// there is no bias (bias is null, cols unused): a compile-time branch, no cost to the bias case.
template <class T, bool kGroups, bool kBias>
__global__ void bias_dropout_residual_kernel(const T* x, const T* bias,
                                             const T* residual, DropoutSpec spec, uint32_t threshold,
                                             float scale, T* out, uint8_t* mask, int64_t n,
                                             int64_t cols) {
  dropout_for_each<kGroups>(spec, threshold, n, [&](int64_t i, bool keep) {
    float v = to_float(x[i]);
    if constexpr (kBias) v += to_float(bias[i % cols]);
    mask[i] = keep ? 1 : 0;
    out[i] = from_float<T>(to_float(residual[i]) + (keep ? v * scale : 0.f));
  });
}

template <class T>
__global__ void add_bias_kernel(T* y, const T* bias, int64_t n, int64_t cols) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) y[i] = from_float<T>(to_float(y[i]) + to_float(bias[i % cols]));
}

template <class T>
__global__ void add_inplace_kernel(T* dst, const T* src, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) dst[i] = from_float<T>(to_float(dst[i]) + to_float(src[i]));
}

template <class T>
__global__ void scale_inplace_kernel(T* c, float beta, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) c[i] = from_float<T>(beta * to_float(c[i]));
}

template <class T, bool kBias>
void launch_bias_dropout_residual(const T* x, const T* bias, const T* residual, const DropoutSpec& spec, T* out,
                                  uint8_t* mask, int64_t n, int64_t cols, cudaStream_t stream) {
  const uint32_t threshold = dropout_threshold(spec.p);
  if (dropout_groups_of_4(spec))
    bias_dropout_residual_kernel<T, true, kBias><<<elementwise_blocks(n, 4), kElementwiseThreads, 0, stream>>>(
        x, bias, residual, spec, threshold, spec.scale(), out, mask, n, cols);
  else
    bias_dropout_residual_kernel<T, false, kBias><<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(
        x, bias, residual, spec, threshold, spec.scale(), out, mask, n, cols);
  CUDA_CHECK_LAUNCH();
}

// A null bias picks the kernels without one.
template <class T>
void bias_dropout_residual(const T* x, const T* bias, const T* residual, const DropoutSpec& spec, T* out,
                           uint8_t* mask, int64_t n, int64_t cols, cudaStream_t stream) {
  if (bias)
    launch_bias_dropout_residual<T, true>(x, bias, residual, spec, out, mask, n, cols, stream);
  else
    launch_bias_dropout_residual<T, false>(x, bias, residual, spec, out, mask, n, cols, stream);
}

}  // namespace

void bias_dropout_residual_fwd(DType dt, const void* x, const void* bias, const void* residual, const DropoutSpec& spec,
                               void* out, uint8_t* mask, int64_t rows, int64_t cols, cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n == 0) return;
  ACTBENCH_DISPATCH_FLOAT(dt, "bias_dropout_residual_fwd", T,
                          bias_dropout_residual<T>(static_cast<const T*>(x), static_cast<const T*>(bias),
                                                   static_cast<const T*>(residual), spec, static_cast<T*>(out), mask,
                                                   n, cols, stream));
}

void add_bias(DType dt, void* y, const void* bias, int64_t rows, int64_t cols, cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n == 0) return;
  ACTBENCH_DISPATCH_FLOAT(dt, "add_bias", T, {
    add_bias_kernel<T><<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(static_cast<T*>(y),
                                                                                 static_cast<const T*>(bias), n, cols);
    CUDA_CHECK_LAUNCH();
  });
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
  ACTBENCH_DISPATCH_FLOAT(dt, "add_inplace", T, {
    add_inplace_kernel<T><<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(static_cast<T*>(dst),
                                                                                    static_cast<const T*>(src), n);
    CUDA_CHECK_LAUNCH();
  });
}

void scale_inplace(DType dt, void* c, float beta, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (beta == 0.f) {  // BLAS semantics: C is not read when beta is 0 (NaN in C does not survive)
    CUDA_CHECK(cudaMemsetAsync(c, 0, static_cast<size_t>(n) * dtype_size(dt), stream));
    return;
  }
  ACTBENCH_DISPATCH_FLOAT(dt, "scale_inplace", T, {
    scale_inplace_kernel<T><<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(static_cast<T*>(c), beta, n);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace actbench::cuda
