// Kernels that pin the simulator's semantics (warp collectives, barriers with exited threads,
// coordinates, launch validation), written as ordinary CUDA: the build rewrites them like
// actbench's kernels.
#include "tests/cuda/sim_test_kernels.hpp"

namespace cudasim_tests {
namespace {

__global__ void shfl_xor_kernel(int* out, int lane_mask, int width) {
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, static_cast<int>(threadIdx.x) * 10, lane_mask, width);
}
__global__ void shfl_idx_kernel(int* out, int src, int width) {
  out[threadIdx.x] = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) * 10, src, width);
}
__global__ void shfl_up_kernel(int* out, int delta, int width) {
  out[threadIdx.x] = __shfl_up_sync(0xffffffffu, static_cast<int>(threadIdx.x) * 10, delta, width);
}
__global__ void shfl_down_kernel(int* out, int delta, int width) {
  out[threadIdx.x] = __shfl_down_sync(0xffffffffu, static_cast<int>(threadIdx.x) * 10, delta, width);
}
__global__ void ballot_kernel(unsigned* out) { out[threadIdx.x] = __ballot_sync(0xffffffffu, threadIdx.x % 3 == 0); }

__global__ void block_sum_kernel(float* out, const float* in, int active) {
  __shared__ float partial[1024];
  const int t = threadIdx.x;
  if (t >= active) return;  // exited threads no longer count at barriers
  partial[t] = in[t];
  __syncthreads();
  for (int stride = 1; stride < active; stride *= 2) {
    float add = 0.f;
    if (t % (2 * stride) == 0 && t + stride < active) add = partial[t + stride];
    __syncthreads();
    partial[t] += add;
    __syncthreads();
  }
  if (t == 0) out[0] = partial[0];
}

__global__ void coordinates_kernel(int* out) {
  const int bx = blockIdx.x, by = blockIdx.y, tx = threadIdx.x, ty = threadIdx.y;
  const int block = by * gridDim.x + bx, thread = ty * blockDim.x + tx;
  int* o = out + 4 * (block * blockDim.x * blockDim.y + thread);
  o[0] = bx;
  o[1] = by;
  o[2] = tx;
  o[3] = ty;
}

__global__ void dynamic_smem_kernel(float* out, int floats) {
  extern __shared__ float buf[];
  for (int i = threadIdx.x; i < floats; i += blockDim.x) buf[i] = static_cast<float>(i);
  __syncthreads();
  if (threadIdx.x == 0) out[0] = buf[floats - 1];
}

__global__ void empty_kernel() {}

}  // namespace

cudaError_t shfl_xor(int* out, int threads, int lane_mask, int width) {
  shfl_xor_kernel<<<1, threads>>>(out, lane_mask, width);
  return cudaGetLastError();
}
cudaError_t shfl_idx(int* out, int threads, int src_lane, int width) {
  shfl_idx_kernel<<<1, threads>>>(out, src_lane, width);
  return cudaGetLastError();
}
cudaError_t shfl_up(int* out, int threads, int delta, int width) {
  shfl_up_kernel<<<1, threads>>>(out, delta, width);
  return cudaGetLastError();
}
cudaError_t shfl_down(int* out, int threads, int delta, int width) {
  shfl_down_kernel<<<1, threads>>>(out, delta, width);
  return cudaGetLastError();
}
cudaError_t ballot(unsigned* out, int threads) {
  ballot_kernel<<<1, threads>>>(out);
  return cudaGetLastError();
}
cudaError_t block_sum(float* out, const float* in, int threads, int active) {
  block_sum_kernel<<<1, threads>>>(out, in, active);
  return cudaGetLastError();
}
cudaError_t coordinates(int* out, dim3 grid, dim3 block) {
  coordinates_kernel<<<grid, block>>>(out);
  return cudaGetLastError();
}
cudaError_t dynamic_smem(float* out, int bytes, int opt_in_bytes) {
  if (opt_in_bytes > 0) {
    const cudaError_t e = cudaFuncSetAttribute(dynamic_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               opt_in_bytes);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();  // the failed call is also the runtime's last error
      return e;
    }
  }
  dynamic_smem_kernel<<<1, 64, bytes>>>(out, bytes / 4);
  return cudaGetLastError();
}
cudaError_t launch_config(dim3 grid, dim3 block) {
  empty_kernel<<<grid, block>>>();
  return cudaGetLastError();
}

}  // namespace cudasim_tests

namespace cudasim_tests {
namespace {
// Recursion deep enough to overflow a simulated thread's stack.
__device__ int deep(int n, volatile int* sink) {
  volatile int pad[256];
  pad[n % 256] = n;
  if (n == 0) return pad[0];
  const int r = deep(n - 1, sink) + pad[n % 256];
  *sink = r;
  return r;
}
__global__ void overflow_kernel(int* out, int depth) {
  volatile int sink = 0;
  out[threadIdx.x] = deep(depth, &sink);
}
}  // namespace
cudaError_t stack_overflow(int* out, int depth) {
  overflow_kernel<<<1, 1>>>(out, depth);
  return cudaGetLastError();
}
}  // namespace cudasim_tests
