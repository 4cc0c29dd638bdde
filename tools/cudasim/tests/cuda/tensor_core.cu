// Kernels that pin kernels/cuda/mma.cuh on the simulator: planted ldmatrix rows, mma
// fragments built by hand from the PTX ISA's layouts, a small GEMM through shared memory
// (the demo: ldmatrix + mma as a tensor-core kernel uses them) and the misuses the simulator
// must report. Plain CUDA: nvcc compiles this file too (sm_80 and newer).
#include <cstdint>

#include "kernels/cuda/mma.cuh"
#include "tests/cuda/sim_test_kernels.hpp"

namespace cudasim_tests {
namespace {

using actbench::cuda::ldmatrix;
using actbench::cuda::ldmatrix_trans;
using actbench::cuda::mma_m16n8k16_bf16;
using actbench::cuda::mma_m16n8k16_fp16;

// Logical row l of the ldmatrix_layout tile (matrix l / 8, row l % 8) lies at this physical
// row: an odd multiplier mod 32 scrambles the order, so a lane that reads any row but the one
// it was given shows.
__device__ int scrambled_row(int l) { return (l * 13 + 5) % 32; }

template <int N, bool Trans>
__global__ void ldmatrix_layout_kernel(uint32_t* out) {
  alignas(16) __shared__ uint16_t tile[32 * 16];  // 32 rows of 32 bytes: a matrix row, then 0xDEAD
  const int lane = threadIdx.x, p = scrambled_row(lane);
  for (int c = 0; c < 16; ++c) tile[p * 16 + c] = c < 8 ? static_cast<uint16_t>((lane / 8) * 64 + (lane % 8) * 8 + c) : 0xDEAD;
  __syncwarp();
  const void* row = lane < 8 * N ? &tile[p * 16] : nullptr;  // the other lanes' addresses are not used
  uint32_t r[N];
  if constexpr (Trans)
    ldmatrix_trans(r, row);
  else
    ldmatrix(r, row);
  for (int m = 0; m < 4; ++m) out[lane * 4 + m] = m < N ? r[m] : 0u;
}

__device__ uint32_t pack(uint16_t lo, uint16_t hi) { return static_cast<uint32_t>(lo) | static_cast<uint32_t>(hi) << 16; }

template <bool Bf16>
__global__ void mma_chain_kernel(float* d, const uint16_t* a, const uint16_t* b, const float* c, int steps) {
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  float acc[4];
  for (int i = 0; i < 4; ++i) acc[i] = c[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2];
  for (int s = 0; s < steps; ++s) {
    const uint16_t* as = a + s * 256;
    const uint16_t* bs = b + s * 128;
    uint32_t fa[4], fb[2];
    for (int r = 0; r < 4; ++r) {
      const int row = g + 8 * (r % 2), col = 2 * t + 8 * (r / 2);
      fa[r] = pack(as[row * 16 + col], as[row * 16 + col + 1]);
    }
    for (int r = 0; r < 2; ++r) {
      const int k = 2 * t + 8 * r;
      fb[r] = pack(bs[k * 8 + g], bs[(k + 1) * 8 + g]);
    }
    if constexpr (Bf16)
      mma_m16n8k16_bf16(acc, fa, fb, acc);
    else
      mma_m16n8k16_fp16(acc, fa, fb, acc);
  }
  for (int i = 0; i < 4; ++i) d[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = acc[i];
}

// One warp per 16x8 tile of D (blockIdx.x: column tile, blockIdx.y: row tile).
template <bool Bf16>
__global__ void tile_gemm_kernel(float* d, const uint16_t* a, const uint16_t* b, int n, int k) {
  alignas(16) __shared__ uint16_t as[16 * 16];  // rows of 32 bytes: two 8x8 matrices side by side
  alignas(16) __shared__ uint16_t bs[16 * 8];   // rows of 16 bytes
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  const int row0 = blockIdx.y * 16, col0 = blockIdx.x * 8;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int k0 = 0; k0 < k; k0 += 16) {
    for (int i = lane; i < 16 * 16; i += 32) as[i] = a[(row0 + i / 16) * k + k0 + i % 16];
    for (int i = lane; i < 16 * 8; i += 32) bs[i] = b[(k0 + i / 8) * n + col0 + i % 8];
    __syncthreads();
    // A: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15),
    // which are registers a[0..3] of the A fragment. B: k rows 0-7 and 8-15, transposed to the
    // column-major fragment.
    uint32_t fa[4], fb[2];
    ldmatrix(fa, &as[(lane % 16) * 16 + (lane / 16) * 8]);
    ldmatrix_trans(fb, &bs[(lane % 16) * 8]);
    if constexpr (Bf16)
      mma_m16n8k16_bf16(acc, fa, fb, acc);
    else
      mma_m16n8k16_fp16(acc, fa, fb, acc);
    __syncthreads();  // before the next step overwrites the tiles
  }
  for (int i = 0; i < 4; ++i) d[(row0 + g + 8 * (i / 2)) * n + col0 + 2 * t + i % 2] = acc[i];
}

__global__ void misuse_kernel(float* out, uint16_t* scratch, int bug) {
  alignas(16) __shared__ uint16_t tile[16 * 16];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (bug != 6)
    for (int i = threadIdx.x; i < 16 * 16; i += blockDim.x) tile[i] = static_cast<uint16_t>(0x3f80 + i % 7);  // bf16 1.0 and up
  __syncthreads();
  if (warp == 1) {
    if (bug == 5) tile[lane] = 0;  // rows 0 and 1 again, with no barrier before warp 0's ldmatrix
    return;
  }
  const uint16_t* row = &tile[(lane % 16) * 16 + (lane / 16) * 8];
  if (bug == 3 && lane == 3) row += 1;
  if (bug == 4 && lane == 0) row = scratch;
  uint32_t fa[4];
  ldmatrix(fa, row);
  const uint32_t fb[2] = {fa[0], fa[1]};
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  if (bug == 2 && lane >= 16) return;
  if (bug == 1 && lane >= 16) {
    mma_m16n8k16_bf16(acc, fa, fb, acc);  // lanes 16-31: another instruction than lanes 0-15's
  } else {
    mma_m16n8k16_bf16(acc, fa, fb, acc);
  }
  for (int i = 0; i < 4; ++i) out[lane * 4 + i] = acc[i];
}

template <int N>
void launch_layout(uint32_t* out, bool trans) {
  if (trans)
    ldmatrix_layout_kernel<N, true><<<1, 32>>>(out);
  else
    ldmatrix_layout_kernel<N, false><<<1, 32>>>(out);
}

}  // namespace

cudaError_t ldmatrix_layout(uint32_t* out, int matrices, bool trans) {
  if (matrices == 1)
    launch_layout<1>(out, trans);
  else if (matrices == 2)
    launch_layout<2>(out, trans);
  else if (matrices == 4)
    launch_layout<4>(out, trans);
  else
    return cudaErrorInvalidValue;
  return cudaGetLastError();
}

cudaError_t mma_chain(float* d, const uint16_t* a, const uint16_t* b, const float* c, int steps, bool bf16) {
  if (bf16)
    mma_chain_kernel<true><<<1, 32>>>(d, a, b, c, steps);
  else
    mma_chain_kernel<false><<<1, 32>>>(d, a, b, c, steps);
  return cudaGetLastError();
}

cudaError_t tile_gemm(float* d, const uint16_t* a, const uint16_t* b, int m, int n, int k, bool bf16) {
  if (m % 16 || n % 8 || k % 16 || m <= 0 || n <= 0 || k <= 0) return cudaErrorInvalidValue;
  const dim3 grid(n / 8, m / 16);
  if (bf16)
    tile_gemm_kernel<true><<<grid, 32>>>(d, a, b, n, k);
  else
    tile_gemm_kernel<false><<<grid, 32>>>(d, a, b, n, k);
  return cudaGetLastError();
}

cudaError_t tensor_core_misuse(float* out, uint16_t* scratch, int bug) {
  misuse_kernel<<<1, 64>>>(out, scratch, bug);
  return cudaGetLastError();
}

}  // namespace cudasim_tests
