// Planted kernels for the memory-access counters: each is one access pattern whose requests,
// sectors, wavefronts and bank conflicts are known exactly (tests/test_counters.cpp).
#include "tests/cuda/counter_kernels.hpp"

namespace cudasim_tests {
namespace {

__global__ void copy_f32_kernel(float* out, const float* in, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i];
}
__global__ void copy_f32_stride2_kernel(float* out, const float* in, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[2 * i];
}
__global__ void copy_f32_offset1_kernel(float* out, const float* in, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i + 1];
}
__global__ void load_bf16_kernel(float* out, const __nv_bfloat16* in, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __bfloat162float(in[i]);
}
__global__ void copy_float4_kernel(float4* out, const float4* in, int n4) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n4) out[i] = in[i];
}
// layernorm.cu's load_pack: one 16-byte load, its eight bf16 then read from the register copy.
__global__ void sum_packs_bf16_kernel(float* out, const __nv_bfloat16* in) {
  const int t = threadIdx.x;
  const uint4 raw = reinterpret_cast<const uint4*>(in)[t];
  const __nv_bfloat16* e = reinterpret_cast<const __nv_bfloat16*>(&raw);
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < 8; ++k) s += __bfloat162float(e[k]);
  out[t] = s;
}
__global__ void scale_in_place_kernel(float* x) {
  const int t = threadIdx.x;
  x[t] *= 2.f;
}
__global__ void copy_f32_even_lanes_kernel(float* out, const float* in) {
  const int t = threadIdx.x;
  if (t % 2 == 0) out[t] = in[t];
}
__global__ void copy_f32_loop_kernel(float* out, const float* in, int iters) {
  const int t = threadIdx.x;
  for (int j = 0; j < iters; ++j) out[32 * j + t] = in[32 * j + t];
}
__global__ void sum_read_twice_kernel(float* out, const float* in) {
  const int t = threadIdx.x;
  out[t] = in[t] + in[255 - t];
}
__global__ void load_across_barrier_kernel(float* out, const float* in, int iters, bool warp_sync) {
  const int t = threadIdx.x;
  float v = 0.f;
  for (int j = 0; j < iters; ++j) {
    if (j > 0 || t % 2 == 0) v += in[32 * j + t];
    if (warp_sync)
      __syncwarp();
    else
      __syncthreads();
  }
  out[t] = v;
}
constexpr int kTwoLinesLoad = __LINE__ + 3;
__global__ void copy_two_lines_kernel(float* out, const float* in) {
  const int t = threadIdx.x;
  const float v = in[t];  static_assert(__LINE__ == kTwoLinesLoad, "kTwoLinesLoad names the load's line");
  out[t] = v * 2.f;
}

__global__ void shared_stride_kernel(float* out, const float* in, int stride_words) {
  __shared__ float s[32 * 32];
  const int t = threadIdx.x;
  s[t * stride_words] = in[t];
  __syncwarp();
  out[t] = s[t * stride_words];
}
__global__ void shared_broadcast_kernel(float* out, const float* in) {
  __shared__ float s[1];
  const int t = threadIdx.x;
  if (t == 0) s[0] = in[0];
  __syncwarp();
  out[t] = s[0];
}
__global__ void shared_f64_kernel(double* out, const double* in) {
  __shared__ double s[32];
  const int t = threadIdx.x;
  s[t] = in[t];
  __syncwarp();
  out[t] = s[t];
}
__global__ void shared_float4_kernel(float4* out, const float4* in) {
  __shared__ float4 s[32];
  const int t = threadIdx.x;
  s[t] = in[t];
  __syncwarp();
  out[t] = s[t];
}
// Each block of 32 stages its 32 floats of `in` (the same for every block) in dynamic shared
// memory and writes them reversed to its own 32 of `out`.
__global__ void dynamic_shared_reverse_kernel(float* out, const float* in) {
  extern __shared__ float staged[];
  const int t = threadIdx.x;
  staged[t] = in[t];
  __syncwarp();
  out[blockIdx.x * 32 + t] = staged[31 - t];
}

int blocks_for(int n, int block) { return (n + block - 1) / block; }

}  // namespace

cudaError_t copy_f32(float* out, const float* in, int n, int block) {
  copy_f32_kernel<<<blocks_for(n, block), block>>>(out, in, n);
  return cudaGetLastError();
}
cudaError_t copy_f32_stride2(float* out, const float* in, int n) {
  copy_f32_stride2_kernel<<<blocks_for(n, 256), 256>>>(out, in, n);
  return cudaGetLastError();
}
cudaError_t copy_f32_offset1(float* out, const float* in, int n) {
  copy_f32_offset1_kernel<<<blocks_for(n, 256), 256>>>(out, in, n);
  return cudaGetLastError();
}
cudaError_t load_bf16(float* out, const uint16_t* in, int n) {
  load_bf16_kernel<<<blocks_for(n, 256), 256>>>(out, reinterpret_cast<const __nv_bfloat16*>(in), n);
  return cudaGetLastError();
}
cudaError_t copy_float4(float* out, const float* in, int n4) {
  copy_float4_kernel<<<blocks_for(n4, 64), 64>>>(reinterpret_cast<float4*>(out), reinterpret_cast<const float4*>(in),
                                                 n4);
  return cudaGetLastError();
}
cudaError_t sum_packs_bf16(float* out, const uint16_t* in) {
  sum_packs_bf16_kernel<<<1, 32>>>(out, reinterpret_cast<const __nv_bfloat16*>(in));
  return cudaGetLastError();
}
cudaError_t scale_in_place(float* x) {
  scale_in_place_kernel<<<1, 32>>>(x);
  return cudaGetLastError();
}
cudaError_t copy_f32_even_lanes(float* out, const float* in) {
  copy_f32_even_lanes_kernel<<<1, 32>>>(out, in);
  return cudaGetLastError();
}
cudaError_t copy_f32_loop(float* out, const float* in, int iters) {
  copy_f32_loop_kernel<<<1, 32>>>(out, in, iters);
  return cudaGetLastError();
}
cudaError_t sum_read_twice(float* out, const float* in) {
  sum_read_twice_kernel<<<1, 256>>>(out, in);
  return cudaGetLastError();
}
cudaError_t load_across_barrier(float* out, const float* in, int iters, bool warp_sync) {
  load_across_barrier_kernel<<<1, 32>>>(out, in, iters, warp_sync);
  return cudaGetLastError();
}
cudaError_t copy_two_lines(float* out, const float* in) {
  copy_two_lines_kernel<<<1, 32>>>(out, in);
  return cudaGetLastError();
}
int copy_two_lines_load_line() { return kTwoLinesLoad; }
cudaError_t shared_stride(float* out, const float* in, int stride_words) {
  shared_stride_kernel<<<1, 32>>>(out, in, stride_words);
  return cudaGetLastError();
}
cudaError_t shared_broadcast(float* out, const float* in) {
  shared_broadcast_kernel<<<1, 32>>>(out, in);
  return cudaGetLastError();
}
cudaError_t shared_f64(double* out, const double* in) {
  shared_f64_kernel<<<1, 32>>>(out, in);
  return cudaGetLastError();
}
cudaError_t shared_float4(float* out, const float* in) {
  shared_float4_kernel<<<1, 32>>>(reinterpret_cast<float4*>(out), reinterpret_cast<const float4*>(in));
  return cudaGetLastError();
}
cudaError_t dynamic_shared_reverse(float* out, const float* in, int blocks, size_t smem_bytes) {
  dynamic_shared_reverse_kernel<<<blocks, 32, smem_bytes>>>(out, in);
  return cudaGetLastError();
}

}  // namespace cudasim_tests
