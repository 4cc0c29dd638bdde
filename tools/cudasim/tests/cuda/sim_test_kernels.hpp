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
// out[0] += the n elements of in, one atomicAdd per thread over several blocks; bug 1: a plain
// += (out[0] must be 0 before).
cudaError_t atomic_sum(float* out, const float* in, int n, int bug);

}  // namespace cudasim_tests

// ---- tensor_core.cu: kernels/cuda/mma.cuh's primitives (one warp per block) ----
namespace cudasim_tests {
// ldmatrix of `matrices` (1, 2, 4) 8x8 matrices, `trans` or not, from a shared tile whose
// element (matrix m, row j, column c) is m * 64 + j * 8 + c; the rows lie in shared memory
// in a scrambled order, 32 bytes apart, and lanes that supply no row pass a null address.
// out[32 * 4]: lane l's registers at out[4 * l + m] (the rest left 0).
cudaError_t ldmatrix_layout(uint32_t* out, int matrices, bool trans);
// D = A_s * B_s + ... + A_0 * B_0 + C over `steps` mma.sync.m16n8k16 calls, every fragment
// built from global memory with the documented layouts: a[s * 256 + 16 m + k] (16x16 row-major
// bits of bf16 or fp16), b[s * 128 + 8 k + n], c and d 16x8 row-major fp32.
cudaError_t mma_chain(float* d, const uint16_t* a, const uint16_t* b, const float* c, int steps, bool bf16);
// The demo: D (m x n, fp32, row-major) = A (m x k, row-major) * B (k x n, row-major) for m, n, k
// multiples of 16, 8, 16; one warp per 16x8 tile of D stages 16x16 of A and 16x8 of B in
// shared memory per step of k and loads them with ldmatrix (A) and ldmatrix_trans (B).
cudaError_t tile_gemm(float* d, const uint16_t* a, const uint16_t* b, int m, int n, int k, bool bf16);
// Misuses, each to be reported: 1 lanes 16-31 call mma at another line than lanes 0-15; 2 lanes
// 16-31 return before the mma; 3 lane 3 passes an ldmatrix row address 2 bytes past alignment;
// 4 lane 0 passes a global-memory address; 5 the barrier between another warp's writes of the
// tile and the ldmatrix removed (two warps; the race variant reports it); 6 ldmatrix of a
// shared tile nobody wrote (the race variant reports it). 0: the correct kernel. `scratch`:
// 512 bytes of device memory.
cudaError_t tensor_core_misuse(float* out, uint16_t* scratch, int bug);
}  // namespace cudasim_tests

// ---- async_copy.cu: kernels/cuda/async_copy.cuh's cp.async ----
namespace cudasim_tests {
// One block of 64: `tiles` tiles of 64 chunks of 16 bytes (in[64 t + i]) double-buffered in
// shared memory with cp.async; out[64 t + i] = in[64 t + 63 - i]. Bugs: 1 the wait_group
// removed (a wait_group 0 after the loop); 2 the barrier after the wait removed; 4 the barrier
// after the reads removed (the next copy refills the buffer under them); 5 a destination 4
// bytes past alignment; 6 a destination in global memory; 7 one copy issued at the end and
// never waited for; 8 a source in shared memory. 0: the correct kernel.
cudaError_t async_pipeline(uint4* out, const uint4* in, int tiles, int bug);
// One thread: groups A (slot 0) and B (slots 1, 2: a copy and a zero fill) committed, D (slot 3)
// not; out[0..3] after wait_group 1, out[4..7] after wait_group 0, out[8..11] after D's commit
// and a wait_group 0. Without peek, out[1..3] and out[7] are not written (they would be read
// before their copies are waited for).
cudaError_t async_groups(uint4* out, const uint4* in, bool peek);
}  // namespace cudasim_tests
