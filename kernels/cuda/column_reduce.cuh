#pragma once
// Column sums of a [rows, cols] matrix (bias and LayerNorm weight gradients) in two stages,
// without float atomics, so the result is the same bits on every run:
//   stage 1: block (x: 32 columns, y: 8 row lanes) sums its columns over one chunk of rows
//            into a fp32 workspace [chunks, cols];
//   stage 2: one thread per column adds the chunks in order and rounds once.
#include "kernels/cuda/common.cuh"

namespace actbench::cuda {

constexpr int kColTile = 32, kRowLanes = 8;
constexpr int64_t kMinRowsPerChunk = 64, kMaxChunks = 64;

struct ColumnChunks {
  int64_t rows_per_chunk, chunks;
};
inline ColumnChunks column_chunks(int64_t rows) {
  int64_t chunks = (rows + kMinRowsPerChunk - 1) / kMinRowsPerChunk;
  if (chunks > kMaxChunks) chunks = kMaxChunks;
  if (chunks < 1) chunks = 1;
  int64_t per = (rows + chunks - 1) / chunks;
  if (per < 1) per = 1;
  const int64_t used = (rows + per - 1) / per;  // rounding may leave the last chunks empty
  return {per, used < 1 ? 1 : used};
}

// sum_dy[chunk, c] = sum of dy[r, c]; with kXhat also sum_dy_xhat[chunk, c] = sum of dy * xhat,
// xhat = (x - mean[r]) * rstd[r] exactly as the forward computed it (mean == nullptr: RMSNorm's
// xhat = x * rstd[r]).
template <class T, bool kXhat>
__global__ void __launch_bounds__(kColTile* kRowLanes)
    column_partials(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ mean,
                    const float* __restrict__ rstd, float* __restrict__ sum_dy, float* __restrict__ sum_dy_xhat,
                    int64_t rows, int64_t cols, int64_t rows_per_chunk) {
  __shared__ float s_dy[kRowLanes][kColTile + 1];
  __shared__ float s_dyx[kRowLanes][kColTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTile + tx;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  float acc = 0.f, acc_x = 0.f;
  if (c < cols) {
    for (int64_t r = r0 + ty; r < r1; r += kRowLanes) {
      const float g = to_float(dy[r * cols + c]);
      acc += g;
      if constexpr (kXhat) acc_x += g * ((to_float(x[r * cols + c]) - (mean ? mean[r] : 0.f)) * rstd[r]);
    }
  }
  s_dy[ty][tx] = acc;
  s_dyx[ty][tx] = acc_x;
  __syncthreads();
  if (ty == 0 && c < cols) {
    float a = 0.f, b = 0.f;
    for (int y = 0; y < kRowLanes; ++y) {
      a += s_dy[y][tx];
      b += s_dyx[y][tx];
    }
    sum_dy[blockIdx.y * cols + c] = a;
    if constexpr (kXhat) sum_dy_xhat[blockIdx.y * cols + c] = b;
  }
}

template <class T>
__global__ void column_finish(const float* __restrict__ partial, int64_t chunks, int64_t cols, T* __restrict__ out) {
  for (int64_t c = global_thread(); c < cols; c += grid_threads()) {
    float s = 0.f;
    for (int64_t k = 0; k < chunks; ++k) s += partial[k * cols + c];
    out[c] = from_float<T>(s);
  }
}

// Launches both stages; workspace holds (kXhat ? 2 : 1) * chunks * cols floats. out_dy may be
// nullptr when only the xhat sums are wanted (RMSNorm has no bias).
template <class T, bool kXhat>
void column_sums(const T* dy, const T* x, const float* mean, const float* rstd, T* out_dy, T* out_dy_xhat,
                 float* workspace, int64_t rows, int64_t cols, cudaStream_t stream) {
  const ColumnChunks cc = column_chunks(rows);
  float* part_dy = workspace;
  float* part_dyx = kXhat ? workspace + cc.chunks * cols : nullptr;
  const dim3 block(kColTile, kRowLanes);
  const dim3 grid(static_cast<unsigned>((cols + kColTile - 1) / kColTile), static_cast<unsigned>(cc.chunks));
  column_partials<T, kXhat><<<grid, block, 0, stream>>>(dy, x, mean, rstd, part_dy, part_dyx, rows, cols,
                                                        cc.rows_per_chunk);
  CUDA_CHECK_LAUNCH();
  if (out_dy) {
    column_finish<T><<<elementwise_blocks(cols), kElementwiseThreads, 0, stream>>>(part_dy, cc.chunks, cols, out_dy);
    CUDA_CHECK_LAUNCH();
  }
  if constexpr (kXhat) {
    column_finish<T><<<elementwise_blocks(cols), kElementwiseThreads, 0, stream>>>(part_dyx, cc.chunks, cols,
                                                                                  out_dy_xhat);
    CUDA_CHECK_LAUNCH();
  }
}

inline int64_t column_sums_workspace_floats(int64_t rows, int64_t cols, bool xhat) {
  return (xhat ? 2 : 1) * column_chunks(rows).chunks * cols;
}

}  // namespace actbench::cuda
