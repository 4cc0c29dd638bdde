#pragma once
// Host entry points of the simulator's own test kernels (tests/cuda/*.cu). Each returns the
// cudaGetLastError of its launch; pointers are simulated device memory.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace cudasim_tests {

// ---- semantics.cu: what the simulator must get exactly right ----
// out[t] for every thread t of one block of `threads`: the result of the named collective.
cudaError_t shfl_xor(int* out, int threads, int lane_mask, int width);
cudaError_t shfl_idx(int* out, int threads, int src_lane, int width);
cudaError_t shfl_up(int* out, int threads, int delta, int width);
cudaError_t shfl_down(int* out, int threads, int delta, int width);
cudaError_t ballot(unsigned* out, int threads);  // predicate: lane % 3 == 0
// A block sum through shared memory with barriers, for every schedule; threads exit early
// (tid >= active) before the barriers, which sm_70+ allows.
cudaError_t block_sum(float* out, const float* in, int threads, int active);
// Writes blockIdx/threadIdx coordinates: out[4 * global] = {bx, by, tx, ty}.
cudaError_t coordinates(int* out, dim3 grid, dim3 block);
// Dynamic shared memory of `bytes` (a launch-validation probe).
cudaError_t dynamic_smem(float* out, int bytes, int opt_in_bytes);
cudaError_t launch_config(dim3 grid, dim3 block);
// Recursion `depth` deep with 1 KiB frames: overflows a simulated thread's stack when deep.
cudaError_t stack_overflow(int* out, int depth);

// ---- planted.cu: correct kernels and copies of them with one bug each ----
// A tiled transpose through shared memory; `bug`: 0 none, 1 the barrier between the tile
// load and the reads removed.
cudaError_t tile_reverse(float* out, const float* in, int n, int bug);
// The same over float4 elements (n4 of them; 16-byte aggregate copies), in whole tiles:
// out[i] = in[reverse of i in its tile of 64] where that lies below n4.
cudaError_t tile_reverse_vec(float* out, const float* in, int n4, int bug);
// A block reduction (common.cuh's block_sum pattern); bug 1: the first barrier removed.
cudaError_t reduce_rows(float* out, const float* in, int rows, int cols, int bug);
// A grid-stride-free elementwise scale; bug 1: the bounds guard removed.
cudaError_t scale(float* out, const float* in, int n, int bug);
// A warp sum by shuffles; bug 1: lane 5 returns before the shuffles.
cudaError_t warp_sums(float* out, const float* in, int n, int bug);
// A barrier inside a loop whose trip count depends on the thread; bug 1: it diverges.
cudaError_t barrier_in_loop(float* out, int bug);
// Reads a shared scratch slot that no thread wrote; bug 0 writes it first.
cudaError_t unwritten_shared(float* out, int bug);

}  // namespace cudasim_tests
