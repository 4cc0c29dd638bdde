#pragma once
// Device helpers shared by the kernels: storage <-> fp32 conversion, dtype dispatch,
// deterministic block reductions, launch geometry. Only included by .cu files.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/cuda/cuda_check.hpp"
#include "runtime/dtype.hpp"
#include "runtime/error.hpp"

namespace actbench::cuda {

// Storage -> fp32 (exact) and fp32 -> storage (round to nearest even, as the CPU does).
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

template <class T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

// Runs BODY with T bound to the storage type of `dtype`; u8 or anything else is an error.
#define ACTBENCH_DISPATCH_FLOAT(dtype, op_name, T, ...)                                                      \
  switch (dtype) {                                                                                           \
    case ::actbench::DType::fp32: {                                                                          \
      using T = float;                                                                                       \
      __VA_ARGS__;                                                                                           \
      break;                                                                                                 \
    }                                                                                                        \
    case ::actbench::DType::bf16: {                                                                          \
      using T = __nv_bfloat16;                                                                               \
      __VA_ARGS__;                                                                                           \
      break;                                                                                                 \
    }                                                                                                        \
    case ::actbench::DType::fp16: {                                                                          \
      using T = __half;                                                                                      \
      __VA_ARGS__;                                                                                           \
      break;                                                                                                 \
    }                                                                                                        \
    default:                                                                                                 \
      throw ::actbench::InvalidArgument(std::string(op_name) + ": dtype " + ::actbench::dtype_name(dtype) + \
                                        " is not a float type");                                             \
  }

// Block-wide sum / max of one value per thread; every thread gets the result. blockDim.x
// must be a multiple of 32 (<= 1024) and `scratch` hold 32 floats. The order of the
// additions depends only on blockDim, so results are reproducible run to run.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // the previous reduction's readers are done with scratch
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.f;
  return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

// Elementwise kernels use grid-stride loops: enough blocks to fill any GPU, capped so the
// grid size stays a small int whatever n is.
constexpr int kElementwiseThreads = 256;
inline unsigned elementwise_blocks(int64_t n, int64_t per_thread = 1) {
  const int64_t threads = (n + per_thread - 1) / per_thread;
  int64_t blocks = (threads + kElementwiseThreads - 1) / kElementwiseThreads;
  if (blocks > 65536) blocks = 65536;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks);
}
// Grids indexed by rows: gridDim.x < 2^31; kernels loop when rows exceed it.
inline unsigned row_blocks(int64_t rows) {
  const int64_t cap = 1 << 30;
  return static_cast<unsigned>(rows < 1 ? 1 : (rows > cap ? cap : rows));
}

// Raw data movement (layout.cu, moe.cu) in the widest unit of 16, 8, 4, 2, 1 bytes that
// divides every offset and base address (bits: their OR), so every access is aligned.
inline int64_t widest_unit(uint64_t bits) {
  int64_t unit = 16;
  while (unit > 1 && (bits & static_cast<uint64_t>(unit - 1)) != 0) unit /= 2;
  return unit;
}

__device__ __forceinline__ int64_t global_thread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_threads() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

}  // namespace actbench::cuda
