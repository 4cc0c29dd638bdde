// Dropout: y = keep ? x / (1 - p) : 0 with the Philox mask of the CPU reference (u8, 1 = kept).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda/dropout_common.cuh"

namespace actbench::cuda {
namespace {

template <class T, bool kGroups>
__global__ void dropout_fwd_kernel(const T* x, DropoutSpec spec, uint32_t threshold, float scale,
                                   T* y, uint8_t* mask, int64_t n) {
  dropout_for_each<kGroups>(spec, threshold, n, [&](int64_t i, bool keep) {
    mask[i] = keep ? 1 : 0;
    y[i] = from_float<T>(keep ? to_float(x[i]) * scale : 0.f);
  });
}

template <class T>
__global__ void dropout_bwd_kernel(const T* dy, const uint8_t* mask, float scale,
                                   T* dx, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads())
    dx[i] = from_float<T>(mask[i] ? to_float(dy[i]) * scale : 0.f);
}

template <class T>
void fwd(const T* x, const DropoutSpec& spec, T* y, uint8_t* mask, cudaStream_t stream) {
  const int64_t n = spec.numel();
  const uint32_t threshold = dropout_threshold(spec.p);
  if (dropout_groups_of_4(spec))
    dropout_fwd_kernel<T, true><<<elementwise_blocks(n, 4), kElementwiseThreads, 0, stream>>>(x, spec, threshold,
                                                                                             spec.scale(), y, mask, n);
  else
    dropout_fwd_kernel<T, false><<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(x, spec, threshold,
                                                                                           spec.scale(), y, mask, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void dropout_fwd(DType dt, const void* x, const DropoutSpec& spec, void* y, uint8_t* mask, cudaStream_t stream) {
  if (spec.numel() == 0) return;
  ACTBENCH_DISPATCH_FLOAT(dt, "dropout_fwd", T,
                          fwd<T>(static_cast<const T*>(x), spec, static_cast<T*>(y), mask, stream));
}

void dropout_bwd(DType dt, const void* dy, const uint8_t* mask, float scale, void* dx, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  ACTBENCH_DISPATCH_FLOAT(dt, "dropout_bwd", T, {
    dropout_bwd_kernel<T><<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(static_cast<const T*>(dy), mask,
                                                                                    scale, static_cast<T*>(dx), n);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace actbench::cuda
