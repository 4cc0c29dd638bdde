// Kernels that pin kernels/cuda/async_copy.cuh (cp.async) on the simulator: a double-buffered
// tile pipeline as a kernel uses it, its bugs (a wait removed, a barrier removed on either
// side of the reads), wait_group's group arithmetic and the zero fill, and the misuses the
// simulator must report. Plain CUDA: nvcc compiles this file too (sm_80 and newer).
#include <cstdint>

#include "kernels/cuda/async_copy.cuh"
#include "tests/cuda/sim_test_kernels.hpp"

namespace cudasim_tests {
namespace {

using actbench::cuda::cp_async_16;
using actbench::cuda::cp_async_commit;
using actbench::cuda::cp_async_wait;

constexpr int kPipeThreads = 64;  // one 16-byte chunk of every tile per thread

// Tile t (64 chunks of 16 bytes) to out, chunk order reversed: thread i writes the chunk
// thread 63 - i copied, so a copy is read by another thread than the one that issued it.
__global__ void pipeline_kernel(uint4* out, const uint4* in, int tiles, int bug) {
  alignas(16) __shared__ uint4 buf[2][kPipeThreads];
  __shared__ uint4 scratch_shared;
  const int i = threadIdx.x;
  if (bug == 5) cp_async_16(reinterpret_cast<char*>(&buf[0][i]) + 4, in + i, true);  // dst 4 bytes off
  if (bug == 6) cp_async_16(out + i, in + i, true);                                    // dst in global memory
  if (bug == 8) cp_async_16(&buf[0][i], &scratch_shared, true);                        // src in shared memory
  cp_async_16(&buf[0][i], in + i, true);
  cp_async_commit();
  for (int t = 0; t < tiles; ++t) {
    if (t + 1 < tiles) cp_async_16(&buf[(t + 1) % 2][i], in + (t + 1) * kPipeThreads + i, true);
    cp_async_commit();
    if (bug != 1) cp_async_wait<1>();  // tile t's group has landed; t + 1's may fly
    if (bug != 2) __syncthreads();     // and every thread's copy of it is visible
    out[t * kPipeThreads + i] = buf[t % 2][kPipeThreads - 1 - i];
    if (bug != 4) __syncthreads();  // every thread has read buf[t % 2] before it is refilled
  }
  if (bug == 1) cp_async_wait<0>();
  if (bug == 7) cp_async_16(&buf[0][i], in + i, true);  // issued, never waited for
}

// One thread, four 16-byte slots of shared memory: group A (slot 0), group B (slot 1), a zero
// fill (slot 2) in B's group, and D (slot 3) left uncommitted. out[0..3] after wait_group 1
// (peek: read while B and D may still fly), out[4..7] after wait_group 0, out[8..11] after
// D's commit and wait_group 0.
__global__ void groups_kernel(uint4* out, const uint4* in, bool peek) {
  alignas(16) __shared__ uint4 slot[4];
  cp_async_16(&slot[0], in + 0, true);
  cp_async_commit();
  cp_async_16(&slot[1], in + 1, true);
  cp_async_16(&slot[2], in + 2, false);  // src-size 0: sixteen zero bytes, nothing read
  cp_async_commit();
  cp_async_16(&slot[3], in + 3, true);
  cp_async_wait<1>();
  out[0] = slot[0];
  if (peek)
    for (int s = 1; s < 4; ++s) out[s] = slot[s];
  cp_async_wait<0>();
  for (int s = 0; s < 3; ++s) out[4 + s] = slot[s];
  if (peek) out[7] = slot[3];
  cp_async_commit();
  cp_async_wait<0>();
  for (int s = 0; s < 4; ++s) out[8 + s] = slot[s];
}

// One warp: lane t copies in[t] to s[t * stride] with cp.async, waits, and reads it back.
__global__ void async_stride_kernel(uint4* out, const uint4* in, int stride) {
  alignas(16) __shared__ uint4 s[32 * 4];
  const int t = threadIdx.x;
  cp_async_16(&s[t * stride], in + t, true);
  cp_async_commit();
  cp_async_wait<0>();
  __syncwarp();
  out[t] = s[t * stride];
}

}  // namespace

cudaError_t async_copy_stride(uint4* out, const uint4* in, int stride) {
  async_stride_kernel<<<1, 32>>>(out, in, stride);
  return cudaGetLastError();
}

cudaError_t async_pipeline(uint4* out, const uint4* in, int tiles, int bug) {
  pipeline_kernel<<<1, kPipeThreads>>>(out, in, tiles, bug);
  return cudaGetLastError();
}

cudaError_t async_groups(uint4* out, const uint4* in, bool peek) {
  groups_kernel<<<1, 1>>>(out, in, peek);
  return cudaGetLastError();
}

}  // namespace cudasim_tests
