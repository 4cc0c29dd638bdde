// Correct kernels and, selected by `bug`, copies with one planted bug each: the simulator must
// report every bug (tests/test_core.cpp) and none of the correct versions.
#include "tests/cuda/sim_test_kernels.hpp"

namespace cudasim_tests {
namespace {

constexpr int kTile = 64;

template <int kBug>
__global__ void tile_reverse_kernel(float* out, const float* in, int n) {
  __shared__ float tile[kTile];
  const int base = blockIdx.x * kTile, t = threadIdx.x;
  tile[t] = base + t < n ? in[base + t] : 0.f;
  if constexpr (kBug != 1) __syncthreads();  // bug 1: removed
  const int r = kTile - 1 - t;
  if (base + t < n) out[base + t] = tile[r];
}

// The same with 16-byte elements: the tile copies are aggregate copies (memcpy calls under
// -fsanitize=thread), which the race checker must see too.
template <int kBug>
__global__ void tile_reverse_vec_kernel(float4* out, const float4* in, int n4) {
  __shared__ float4 tile[kTile];
  const int base = blockIdx.x * kTile, t = threadIdx.x;
  if (base + t < n4) tile[t] = in[base + t];
  if constexpr (kBug != 1) __syncthreads();  // bug 1: removed
  const int r = kTile - 1 - t;
  if (base + t < n4 && base + r < n4) out[base + t] = tile[r];
}

template <int kBug>
__global__ void reduce_rows_kernel(float* out, const float* in, int cols) {
  __shared__ float scratch[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  float v = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) v += in[blockIdx.x * cols + c];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (lane == 0) scratch[warp] = v;
  if constexpr (kBug != 1) __syncthreads();  // bug 1: removed
  v = lane < warps ? scratch[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x == 0) out[blockIdx.x] = v;
}

template <int kBug>
__global__ void scale_kernel(float* out, const float* in, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (kBug == 1 || i < n) out[i] = 2.f * in[i];  // bug 1: no bounds guard
}

template <int kBug>
__global__ void warp_sums_kernel(float* out, const float* in, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  float v = i < n ? in[i] : 0.f;
  if (kBug == 1 && threadIdx.x % 32 == 5) return;  // bug 1: a lane leaves before the shuffles
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) out[i / 32] = v;
}

template <int kBug>
__global__ void barrier_in_loop_kernel(float* out) {
  __shared__ float acc[64];
  acc[threadIdx.x] = 0.f;
  __syncthreads();
  const int trips = kBug == 1 ? 1 + threadIdx.x % 2 : 2;  // bug 1: odd threads loop once more
  for (int k = 0; k < trips; ++k) {
    acc[threadIdx.x] += 1.f;
    __syncthreads();
  }
  const float mine = acc[threadIdx.x];
  __syncthreads();  // even threads arrive here while odd ones wait in the loop
  out[threadIdx.x] = mine + acc[63 - threadIdx.x];
}

template <int kBug>
__global__ void unwritten_shared_kernel(float* out) {
  __shared__ float slot[64];
  if (kBug == 0 || threadIdx.x != 7) slot[threadIdx.x] = static_cast<float>(threadIdx.x);  // bug 1: slot 7 unset
  __syncthreads();
  out[threadIdx.x] = slot[63 - threadIdx.x];
}

// Every thread of every block adds its element into out[0]; bug 1: a plain += instead of the
// atomic (a race between the blocks).
template <int kBug>
__global__ void atomic_sum_kernel(float* out, const float* in, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  if (kBug == 1)
    out[0] += in[i];
  else
    atomicAdd(out, in[i]);
}

}  // namespace

cudaError_t atomic_sum(float* out, const float* in, int n, int bug) {
  const unsigned blocks = static_cast<unsigned>((n + 63) / 64);
  if (bug) atomic_sum_kernel<1><<<blocks, 64>>>(out, in, n);
  else atomic_sum_kernel<0><<<blocks, 64>>>(out, in, n);
  return cudaGetLastError();
}
cudaError_t tile_reverse(float* out, const float* in, int n, int bug) {
  const unsigned blocks = static_cast<unsigned>((n + kTile - 1) / kTile);
  if (bug) tile_reverse_kernel<1><<<blocks, kTile>>>(out, in, n);
  else tile_reverse_kernel<0><<<blocks, kTile>>>(out, in, n);
  return cudaGetLastError();
}
cudaError_t tile_reverse_vec(float* out, const float* in, int n4, int bug) {
  const unsigned blocks = static_cast<unsigned>((n4 + kTile - 1) / kTile);
  float4* o = reinterpret_cast<float4*>(out);
  const float4* i = reinterpret_cast<const float4*>(in);
  if (bug) tile_reverse_vec_kernel<1><<<blocks, kTile>>>(o, i, n4);
  else tile_reverse_vec_kernel<0><<<blocks, kTile>>>(o, i, n4);
  return cudaGetLastError();
}
cudaError_t reduce_rows(float* out, const float* in, int rows, int cols, int bug) {
  if (bug) reduce_rows_kernel<1><<<rows, 256>>>(out, in, cols);
  else reduce_rows_kernel<0><<<rows, 256>>>(out, in, cols);
  return cudaGetLastError();
}
cudaError_t scale(float* out, const float* in, int n, int bug) {
  const unsigned blocks = static_cast<unsigned>((n + 127) / 128);
  if (bug) scale_kernel<1><<<blocks, 128>>>(out, in, n);
  else scale_kernel<0><<<blocks, 128>>>(out, in, n);
  return cudaGetLastError();
}
cudaError_t warp_sums(float* out, const float* in, int n, int bug) {
  const unsigned blocks = static_cast<unsigned>((n + 127) / 128);
  if (bug) warp_sums_kernel<1><<<blocks, 128>>>(out, in, n);
  else warp_sums_kernel<0><<<blocks, 128>>>(out, in, n);
  return cudaGetLastError();
}
cudaError_t barrier_in_loop(float* out, int bug) {
  if (bug) barrier_in_loop_kernel<1><<<1, 64>>>(out);
  else barrier_in_loop_kernel<0><<<1, 64>>>(out);
  return cudaGetLastError();
}
cudaError_t unwritten_shared(float* out, int bug) {
  if (bug) unwritten_shared_kernel<1><<<1, 64>>>(out);
  else unwritten_shared_kernel<0><<<1, 64>>>(out);
  return cudaGetLastError();
}

}  // namespace cudasim_tests
