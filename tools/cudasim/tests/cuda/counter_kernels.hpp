#pragma once
// Host entry points of the counters' planted kernels (tests/cuda/counters.cu): access patterns
// whose Nsight Compute counts are known exactly (tests/test_counters.cpp says why each is
// what it is). Each returns the cudaGetLastError of its launch; pointers are simulated device
// memory (cudaMalloc: 256-byte aligned).
#include <cuda_runtime_api.h>

#include <cstdint>

namespace cudasim_tests {

// ---- global memory ----
// out[i] = in[i] for i < n, blocks of `block` threads.
cudaError_t copy_f32(float* out, const float* in, int n, int block);
// out[i] = in[2 * i], blocks of 256.
cudaError_t copy_f32_stride2(float* out, const float* in, int n);
// out[i] = in[i + 1], blocks of 256.
cudaError_t copy_f32_offset1(float* out, const float* in, int n);
// out[i] = the bf16 in[i] (2-byte loads) as float, blocks of 256.
cudaError_t load_bf16(float* out, const uint16_t* in, int n);
// out[i] = in[i] as float4 (16-byte loads and stores), i < n4, blocks of 64.
cudaError_t copy_float4(float* out, const float* in, int n4);
// One block of 32: out[t] = the sum of the 8 bf16 of in's t-th 16 bytes, loaded as one uint4
// and unpacked from it (layernorm.cu's load_pack).
cudaError_t sum_packs_bf16(float* out, const uint16_t* in);
// One block of 32: x[t] *= 2 (a load and a store of one address).
cudaError_t scale_in_place(float* x);
// One block of 32: only even threads copy out[t] = in[t].
cudaError_t copy_f32_even_lanes(float* out, const float* in);
// One block of 32: for j < iters (a runtime trip count: one load site), out[32j + t] = in[32j + t].
cudaError_t copy_f32_loop(float* out, const float* in, int iters);
// One block of 256: out[t] = in[t] + in[255 - t] (the same 1 KiB read twice).
cudaError_t sum_read_twice(float* out, const float* in);
// One block of 32: for j < iters, v += in[32j + t] if j > 0 or t is even, then a barrier
// (__syncwarp when warp_sync, else __syncthreads); out[t] = v. One load site.
cudaError_t load_across_barrier(float* out, const float* in, int iters, bool warp_sync);
// One block of 32: v = in[t] on one line, out[t] = v on the next (the per-line table).
cudaError_t copy_two_lines(float* out, const float* in);
int copy_two_lines_load_line();  // the line of the load in counters.cu (the store is the next)

// ---- shared memory (one block of 32) ----
// s[t * stride_words] = in[t]; __syncwarp(); out[t] = s[t * stride_words] (fp32, 4 bytes).
cudaError_t shared_stride(float* out, const float* in, int stride_words);
// Thread 0 writes s[0]; __syncwarp(); every thread reads s[0].
cudaError_t shared_broadcast(float* out, const float* in);
// 8-byte accesses: s[t] = in[t]; __syncwarp(); out[t] = s[t] (double).
cudaError_t shared_f64(double* out, const double* in);
// 16-byte accesses: s[t] = in[t]; __syncwarp(); out[t] = s[t] (float4).
cudaError_t shared_float4(float* out, const float* in);
// cp.async (async_copy.cu): lane t copies in[t] (16 bytes) to s[t * stride] (16-byte units,
// stride 1, 2 or 4), waits, and out[t] = s[t * stride] after a __syncwarp.
cudaError_t async_copy_stride(uint4* out, const uint4* in, int stride);

// ---- occupancy (the kernel report) ----
// `blocks` blocks of 32, each with `smem_bytes` of dynamic shared memory (<= 48 KiB): block b
// stages in[0..31] in it and writes them reversed to out[32b..32b+31].
cudaError_t dynamic_shared_reverse(float* out, const float* in, int blocks, size_t smem_bytes);

}  // namespace cudasim_tests
