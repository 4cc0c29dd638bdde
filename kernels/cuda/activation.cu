// The MLP's elementwise activations, forward and backward (the formulas of the cpu reference,
// kernels/cpu/cpu_backend.cpp, and of tools/numpy_layer.py); fp32 math, one rounding on store:
//   GeLU, tanh approximation: y = x/2 (1 + tanh(c (x + 0.044715 x^3))), c = sqrt(2/pi), and its
//   exact derivative;
//   squared ReLU: y = max(x, 0)^2, dx = 2 max(x, 0) dy.
// Each lane moves 16-byte packs (packs.cuh) in a grid-stride loop, so a warp request is 512
// contiguous bytes; the last n % VEC elements, and every element when a pointer is not 16-byte
// aligned, go one per lane.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda/packs.cuh"

namespace actbench::cuda {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

// max(x, 0), NaN kept like the cpu's (fmaxf would turn a NaN into 0).
__device__ __forceinline__ float relu(float v) { return v < 0.f ? 0.f : v; }

struct GeluFwd {
  __device__ static float apply(float v) { return 0.5f * v * (1.f + tanhf(kSqrt2OverPi * (v + kCubic * v * v * v))); }
};
struct GeluBwd {  // dx = dy * dgelu/dx
  __device__ static float apply(float g, float v) {
    const float t = tanhf(kSqrt2OverPi * (v + kCubic * v * v * v));
    return g * (0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * kSqrt2OverPi * (1.f + 3.f * kCubic * v * v));
  }
};
struct SquaredReluFwd {
  __device__ static float apply(float v) {
    const float r = relu(v);
    return r * r;
  }
};
struct SquaredReluBwd {
  __device__ static float apply(float g, float v) { return 2.f * relu(v) * g; }
};

// y = Op(x) over n elements.
template <class T, int VEC, class Op>
__global__ void activation_fwd_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  const int64_t packs = n / VEC;
  for (int64_t p = global_thread(); p < packs; p += grid_threads()) {
    float v[VEC];
    pack::load<T, VEC>(x + p * VEC, v);
#pragma unroll
    for (int e = 0; e < VEC; ++e) v[e] = Op::apply(v[e]);
    pack::store<T, VEC>(y + p * VEC, v);
  }
  for (int64_t i = packs * VEC + global_thread(); i < n; i += grid_threads()) y[i] = from_float<T>(Op::apply(to_float(x[i])));
}

// dx = Op(dy, x) over n elements.
template <class T, int VEC, class Op>
__global__ void activation_bwd_kernel(const T* __restrict__ dy, const T* __restrict__ x, T* __restrict__ dx,
                                      int64_t n) {
  const int64_t packs = n / VEC;
  for (int64_t p = global_thread(); p < packs; p += grid_threads()) {
    float g[VEC], v[VEC];
    pack::load<T, VEC>(dy + p * VEC, g);
    pack::load<T, VEC>(x + p * VEC, v);
#pragma unroll
    for (int e = 0; e < VEC; ++e) g[e] = Op::apply(g[e], v[e]);
    pack::store<T, VEC>(dx + p * VEC, g);
  }
  for (int64_t i = packs * VEC + global_thread(); i < n; i += grid_threads())
    dx[i] = from_float<T>(Op::apply(to_float(dy[i]), to_float(x[i])));
}

template <class Op>
void fwd(const char* op, DType dt, const void* x, void* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  ACTBENCH_DISPATCH_FLOAT(dt, op, T, {
    constexpr int kVec = 16 / sizeof(T);
    const T* xt = static_cast<const T*>(x);
    T* yt = static_cast<T*>(y);
    if (pack::aligned16(x) && pack::aligned16(y))
      activation_fwd_kernel<T, kVec, Op><<<elementwise_blocks(n, kVec), kElementwiseThreads, 0, stream>>>(xt, yt, n);
    else
      activation_fwd_kernel<T, 1, Op><<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(xt, yt, n);
    CUDA_CHECK_LAUNCH();
  });
}

template <class Op>
void bwd(const char* op, DType dt, const void* dy, const void* x, void* dx, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  ACTBENCH_DISPATCH_FLOAT(dt, op, T, {
    constexpr int kVec = 16 / sizeof(T);
    const T* dyt = static_cast<const T*>(dy);
    const T* xt = static_cast<const T*>(x);
    T* dxt = static_cast<T*>(dx);
    if (pack::aligned16(dy) && pack::aligned16(x) && pack::aligned16(dx))
      activation_bwd_kernel<T, kVec, Op><<<elementwise_blocks(n, kVec), kElementwiseThreads, 0, stream>>>(dyt, xt,
                                                                                                        dxt, n);
    else
      activation_bwd_kernel<T, 1, Op><<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(dyt, xt, dxt, n);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void gelu_fwd(DType dt, const void* x, void* y, int64_t n, cudaStream_t stream) {
  fwd<GeluFwd>("gelu_fwd", dt, x, y, n, stream);
}
void gelu_bwd(DType dt, const void* dy, const void* x, void* dx, int64_t n, cudaStream_t stream) {
  bwd<GeluBwd>("gelu_bwd", dt, dy, x, dx, n, stream);
}
void squared_relu_fwd(DType dt, const void* x, void* y, int64_t n, cudaStream_t stream) {
  fwd<SquaredReluFwd>("squared_relu_fwd", dt, x, y, n, stream);
}
void squared_relu_bwd(DType dt, const void* dy, const void* x, void* dx, int64_t n, cudaStream_t stream) {
  bwd<SquaredReluBwd>("squared_relu_bwd", dt, dy, x, dx, n, stream);
}

}  // namespace actbench::cuda
