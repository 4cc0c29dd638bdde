#pragma once
// Force-included (-include cudasim/cudasim.h) before every CUDA source compiled for the
// simulator. The CUDA execution-space keywords become host C++; the toolkit's own headers
// are then included in host mode (dim3, uint4, cudaError_t, NVIDIA's bf16/fp16 conversions),
// and the device built-ins (threadIdx, __syncthreads, warp shuffles, ...) are bound to the
// simulator's running thread. Static __shared__ arrays go to one linker section, which the
// simulator poisons at the start of every block (this needs clang: GCC drops the section of
// static locals in templates).
#if defined(__CUDACC__)
#error "cudasim.h is for host compilers; nvcc builds the real kernels"
#endif

// Kernel code that must differ under the simulator (kernels/cuda/mma.cuh: inline PTX for nvcc,
// the simulator's warp collectives here) tests this.
#define CUDASIM_KERNEL_CODE 1

#define __global__
#define __device__
#define __host__
#define __constant__
#define __shared__ static __attribute__((section("cudasim_shared"), aligned(16)))
#define __launch_bounds__(...)

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <math.h>

#include "cudasim/device.hpp"

// ---- device built-ins bound to the running simulated thread ----
#define threadIdx (::cudasim::detail::thread_idx())
#define blockIdx (static_cast<const uint3&>(::cudasim::detail::block_idx))
#define blockDim (static_cast<const dim3&>(::cudasim::detail::block_dim))
#define gridDim (static_cast<const dim3&>(::cudasim::detail::grid_dim))
#define warpSize 32

inline void __syncthreads(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  ::cudasim::detail::syncthreads(file, line);
}
inline int __syncthreads_count(int pred, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return ::cudasim::detail::syncthreads_count(pred, file, line);
}
inline int __syncthreads_or(int pred, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return ::cudasim::detail::syncthreads_count(pred != 0, file, line) != 0;
}
inline int __syncthreads_and(int pred, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  const int n = static_cast<int>(blockDim.x * blockDim.y * blockDim.z);
  return ::cudasim::detail::syncthreads_count(pred != 0, file, line) == n;
}
inline void __syncwarp(unsigned mask = 0xffffffffu, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  ::cudasim::detail::warp_collective(::cudasim::detail::WarpOp::syncwarp, mask, 0, 0, 32, file, line);
}
inline unsigned __activemask(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return static_cast<unsigned>(
      ::cudasim::detail::warp_collective(::cudasim::detail::WarpOp::activemask, 0, 0, 0, 32, file, line));
}
inline unsigned __ballot_sync(unsigned mask, int pred, const char* file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
  return static_cast<unsigned>(
      ::cudasim::detail::warp_collective(::cudasim::detail::WarpOp::ballot, mask, pred != 0, 0, 32, file, line));
}
inline int __any_sync(unsigned mask, int pred, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return static_cast<int>(
      ::cudasim::detail::warp_collective(::cudasim::detail::WarpOp::any, mask, pred != 0, 0, 32, file, line));
}
inline int __all_sync(unsigned mask, int pred, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return static_cast<int>(
      ::cudasim::detail::warp_collective(::cudasim::detail::WarpOp::all, mask, pred != 0, 0, 32, file, line));
}
template <class T>
inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32, const char* file = __builtin_FILE(),
                     int line = __builtin_LINE()) {
  return ::cudasim::detail::from_bits<T>(::cudasim::detail::warp_collective(
      ::cudasim::detail::WarpOp::shfl, mask, ::cudasim::detail::to_bits(var), src_lane, width, file, line));
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32, const char* file = __builtin_FILE(),
                        int line = __builtin_LINE()) {
  return ::cudasim::detail::from_bits<T>(::cudasim::detail::warp_collective(
      ::cudasim::detail::WarpOp::shfl_up, mask, ::cudasim::detail::to_bits(var), static_cast<int>(delta), width, file,
      line));
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32, const char* file = __builtin_FILE(),
                          int line = __builtin_LINE()) {
  return ::cudasim::detail::from_bits<T>(::cudasim::detail::warp_collective(
      ::cudasim::detail::WarpOp::shfl_down, mask, ::cudasim::detail::to_bits(var), static_cast<int>(delta), width,
      file, line));
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32, const char* file = __builtin_FILE(),
                         int line = __builtin_LINE()) {
  return ::cudasim::detail::from_bits<T>(::cudasim::detail::warp_collective(
      ::cudasim::detail::WarpOp::shfl_xor, mask, ::cudasim::detail::to_bits(var), lane_mask, width, file, line));
}

// Inlined always, so that the return address atomic_add_f32 takes is the kernel's call site.
__attribute__((always_inline)) inline float atomicAdd(float* address, float val) {
  return ::cudasim::detail::atomic_add_f32(address, val, __builtin_return_address(0));
}

// Device math that has no host namesake.
inline float rsqrtf(float x) { return 1.f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
inline void __threadfence() {}
inline void __threadfence_block() {}
