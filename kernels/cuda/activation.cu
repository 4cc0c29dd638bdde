// The MLP's elementwise activations, forward and backward (the formulas of the cpu reference,
// kernels/cpu/cpu_backend.cpp, and of tools/numpy_layer.py); fp32 math, one rounding on store:
//   GeLU, tanh approximation: y = x/2 (1 + tanh(c (x + 0.044715 x^3))), c = sqrt(2/pi), and its
//   exact derivative;
//   squared ReLU: y = max(x, 0)^2, dx = 2 max(x, 0) dy.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"

namespace actbench::cuda {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

template <class T>
__global__ void gelu_fwd_kernel(const T* x, T* y, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    const float v = to_float(x[i]);
    y[i] = from_float<T>(0.5f * v * (1.f + tanhf(kSqrt2OverPi * (v + kCubic * v * v * v))));
  }
}

template <class T>
__global__ void gelu_bwd_kernel(const T* dy, const T* x, T* dx, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    const float v = to_float(x[i]);
    const float t = tanhf(kSqrt2OverPi * (v + kCubic * v * v * v));
    const float grad = 0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * kSqrt2OverPi * (1.f + 3.f * kCubic * v * v);
    dx[i] = from_float<T>(to_float(dy[i]) * grad);
  }
}

// max(x, 0), NaN kept like the cpu's (fmaxf would turn a NaN into 0).
__device__ __forceinline__ float relu(float v) { return v < 0.f ? 0.f : v; }

template <class T>
__global__ void squared_relu_fwd_kernel(const T* x, T* y, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    const float r = relu(to_float(x[i]));
    y[i] = from_float<T>(r * r);
  }
}

template <class T>
__global__ void squared_relu_bwd_kernel(const T* dy, const T* x, T* dx, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads())
    dx[i] = from_float<T>(2.f * relu(to_float(x[i])) * to_float(dy[i]));
}

}  // namespace

void gelu_fwd(DType dt, const void* x, void* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  ACTBENCH_DISPATCH_FLOAT(dt, "gelu_fwd", T, {
    gelu_fwd_kernel<T><<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(static_cast<const T*>(x),
                                                                                 static_cast<T*>(y), n);
    CUDA_CHECK_LAUNCH();
  });
}

void gelu_bwd(DType dt, const void* dy, const void* x, void* dx, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  ACTBENCH_DISPATCH_FLOAT(dt, "gelu_bwd", T, {
    gelu_bwd_kernel<T><<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(
        static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<T*>(dx), n);
    CUDA_CHECK_LAUNCH();
  });
}

void squared_relu_fwd(DType dt, const void* x, void* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  ACTBENCH_DISPATCH_FLOAT(dt, "squared_relu_fwd", T, {
    squared_relu_fwd_kernel<T><<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(static_cast<const T*>(x),
                                                                                         static_cast<T*>(y), n);
    CUDA_CHECK_LAUNCH();
  });
}

void squared_relu_bwd(DType dt, const void* dy, const void* x, void* dx, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  ACTBENCH_DISPATCH_FLOAT(dt, "squared_relu_bwd", T, {
    squared_relu_bwd_kernel<T><<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(
        static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<T*>(dx), n);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace actbench::cuda
