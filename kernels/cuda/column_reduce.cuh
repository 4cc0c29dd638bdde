#pragma once
// Column sums of a [rows, cols] matrix (bias and LayerNorm/RMSNorm weight gradients) in two
// stages, without float atomics, so the result is the same bits on every run:
//   stage 1: each block sums its columns over one chunk of rows into one fp32 partial row;
//   stage 2: one thread per pack of columns adds the partial rows in order and rounds once.
// The order of every addition depends only on (rows, cols) and the launch geometry.
//
// Memory traffic (the bound of tools/cudasim/tests/test_kernel_bounds.cpp): dy is read once in
// 16-byte lanes; the fp32 partial rows are written and read back once, 8 bytes per column and
// chunk against 2 bytes per element of a bf16 dy, so a chunk has at least kMinRowsPerChunk = 128
// rows and the round trip costs at most 4 / 128 ~ 3 % of dy (kMaxChunks keeps stage 2 short).
// At the 22B shape (cols 6144): 8192 rows are 64 chunks x 24 column tiles of blocks; 1024 rows
// (sequence parallel) 8 chunks.
//
// A partial row is stored pack-major (PartialRow below): with 16-byte packs of VEC columns a
// lane's VEC floats are VEC/4 float4 "planes", plane j of pack p at float4 index j * packs + p,
// so that a warp's stores and loads of one plane are 512 contiguous bytes. The fused
// LayerNorm/RMSNorm backward kernels write the same layout, one partial row per block.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/packs.cuh"

namespace actbench::cuda {

constexpr int kColTile = 32, kRowLanes = 8;
constexpr int64_t kMinRowsPerChunk = 128, kMaxChunks = 64;

struct ColumnChunks {
  int64_t rows_per_chunk, chunks;
};
inline ColumnChunks column_chunks(int64_t rows) {
  int64_t chunks = rows / kMinRowsPerChunk;
  if (chunks > kMaxChunks) chunks = kMaxChunks;
  if (chunks < 1) chunks = 1;
  int64_t per = (rows + chunks - 1) / chunks;
  if (per < 1) per = 1;
  const int64_t used = (rows + per - 1) / per;  // rounding may leave the last chunks empty
  return {per, used < 1 ? 1 : used};
}

// One fp32 partial row of `packs` packs of VEC columns, pack-major (see the header).
template <int VEC>
struct PartialRow {
  static_assert(VEC == 1 || VEC % 4 == 0, "packs are one float or whole float4 planes");
  __device__ static void store(float* __restrict__ row, int64_t packs, int64_t p, const float (&v)[VEC]) {
    if constexpr (VEC == 1) {
      row[p] = v[0];
    } else {
#pragma unroll
      for (int j = 0; j < VEC / 4; ++j)
        reinterpret_cast<float4*>(row)[j * packs + p] = make_float4(v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]);
    }
  }
  __device__ static void add(const float* __restrict__ row, int64_t packs, int64_t p, float (&acc)[VEC]) {
    if constexpr (VEC == 1) {
      acc[0] += row[p];
    } else {
#pragma unroll
      for (int j = 0; j < VEC / 4; ++j) {
        const float4 f = reinterpret_cast<const float4*>(row)[j * packs + p];
        acc[4 * j] += f.x;
        acc[4 * j + 1] += f.y;
        acc[4 * j + 2] += f.z;
        acc[4 * j + 3] += f.w;
      }
    }
  }
};

// Stage 1. Block (x: kColTile packs, y: kRowLanes row lanes) sums its kColTile * VEC columns
// over rows [chunk * rows_per_chunk, ...): sum_dy = sum of dy; with kXhat also sum_dy_xhat = sum
// of dy * xhat, xhat = (x - mean[r]) * rstd[r] exactly as the forward computed it (mean ==
// nullptr: RMSNorm's xhat = x * rstd[r]). The row lanes meet in shared memory ([lane][k][x]:
// no bank conflicts) and the first warp writes the chunk's partial row.
template <class T, int VEC, bool kXhat>
__global__ void __launch_bounds__(kColTile* kRowLanes)
    column_partials(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ mean,
                    const float* __restrict__ rstd, float* __restrict__ sum_dy, float* __restrict__ sum_dy_xhat,
                    int64_t rows, int64_t cols, int64_t rows_per_chunk) {
  __shared__ float s_dy[kRowLanes][VEC][kColTile];
  __shared__ float s_dyx[kXhat ? kRowLanes : 1][VEC][kColTile];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t packs = cols / VEC;
  const int64_t p = static_cast<int64_t>(blockIdx.x) * kColTile + tx;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  float acc[VEC] = {}, acc_x[VEC] = {};
  if (p < packs) {
    for (int64_t r = r0 + ty; r < r1; r += kRowLanes) {
      float g[VEC];
      pack::load<T, VEC>(dy + r * cols + p * VEC, g);
#pragma unroll
      for (int k = 0; k < VEC; ++k) acc[k] += g[k];
      if constexpr (kXhat) {
        float xv[VEC];
        pack::load<T, VEC>(x + r * cols + p * VEC, xv);
        const float mu = mean ? mean[r] : 0.f, rs = rstd[r];
#pragma unroll
        for (int k = 0; k < VEC; ++k) acc_x[k] += g[k] * ((xv[k] - mu) * rs);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    s_dy[ty][k][tx] = acc[k];
    if constexpr (kXhat) s_dyx[ty][k][tx] = acc_x[k];
  }
  __syncthreads();
  if (ty == 0 && p < packs) {
    float a[VEC] = {}, b[VEC] = {};
    for (int y = 0; y < kRowLanes; ++y) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        a[k] += s_dy[y][k][tx];
        if constexpr (kXhat) b[k] += s_dyx[y][k][tx];
      }
    }
    PartialRow<VEC>::store(sum_dy + blockIdx.y * cols, packs, p, a);
    if constexpr (kXhat) PartialRow<VEC>::store(sum_dy_xhat + blockIdx.y * cols, packs, p, b);
  }
}

// Stage 2: out[c] = sum over the partial rows, in order; two independent sums per launch
// (out_b == nullptr: only the first). One thread per pack: one 16-byte store of VEC columns.
template <class T, int VEC>
__global__ void column_finish(const float* __restrict__ partial_a, T* __restrict__ out_a,
                              const float* __restrict__ partial_b, T* __restrict__ out_b, int64_t chunks,
                              int64_t cols) {
  const int64_t packs = cols / VEC;
  for (int64_t p = global_thread(); p < packs; p += grid_threads()) {
    float a[VEC] = {}, b[VEC] = {};
    for (int64_t k = 0; k < chunks; ++k) PartialRow<VEC>::add(partial_a + k * cols, packs, p, a);
    pack::store<T, VEC>(out_a + p * VEC, a);
    if (out_b) {
      for (int64_t k = 0; k < chunks; ++k) PartialRow<VEC>::add(partial_b + k * cols, packs, p, b);
      pack::store<T, VEC>(out_b + p * VEC, b);
    }
  }
}

// Stage 2 for partial rows of VEC-column packs: out_a (or, when null, out_b alone) and out_b.
template <class T, int VEC>
void launch_column_finish(const float* partial_a, T* out_a, const float* partial_b, T* out_b, int64_t chunks,
                          int64_t cols, cudaStream_t stream) {
  if (!out_a) {
    partial_a = partial_b;
    out_a = out_b;
    partial_b = nullptr;
    out_b = nullptr;
  }
  if (!out_a) return;
  column_finish<T, VEC><<<elementwise_blocks(cols / VEC), kElementwiseThreads, 0, stream>>>(partial_a, out_a,
                                                                                           partial_b, out_b, chunks,
                                                                                           cols);
  CUDA_CHECK_LAUNCH();
}

template <class T, int VEC, bool kXhat>
void column_sums_vec(const T* dy, const T* x, const float* mean, const float* rstd, T* out_dy, T* out_dy_xhat,
                     float* workspace, int64_t rows, int64_t cols, cudaStream_t stream) {
  const ColumnChunks cc = column_chunks(rows);
  float* part_dy = workspace;
  float* part_dyx = kXhat ? workspace + cc.chunks * cols : nullptr;
  const dim3 block(kColTile, kRowLanes);
  const dim3 grid(static_cast<unsigned>((cols / VEC + kColTile - 1) / kColTile), static_cast<unsigned>(cc.chunks));
  column_partials<T, VEC, kXhat><<<grid, block, 0, stream>>>(dy, x, mean, rstd, part_dy, part_dyx, rows, cols,
                                                             cc.rows_per_chunk);
  CUDA_CHECK_LAUNCH();
  launch_column_finish<T, VEC>(part_dy, out_dy, part_dyx, kXhat ? out_dy_xhat : nullptr, cc.chunks, cols, stream);
}

// Launches both stages; workspace holds (kXhat ? 2 : 1) * chunks * cols floats. out_dy may be
// nullptr when only the xhat sums are wanted (RMSNorm has no bias). 16-byte packs when every
// row starts 16-byte aligned, one column per lane otherwise.
template <class T, bool kXhat>
void column_sums(const T* dy, const T* x, const float* mean, const float* rstd, T* out_dy, T* out_dy_xhat,
                 float* workspace, int64_t rows, int64_t cols, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const bool vec = cols % kVec == 0 && pack::aligned16(dy) && (!kXhat || pack::aligned16(x)) && (!out_dy || pack::aligned16(out_dy)) &&
                   (!out_dy_xhat || pack::aligned16(out_dy_xhat)) && pack::aligned16(workspace);
  if (vec)
    column_sums_vec<T, kVec, kXhat>(dy, x, mean, rstd, out_dy, out_dy_xhat, workspace, rows, cols, stream);
  else
    column_sums_vec<T, 1, kXhat>(dy, x, mean, rstd, out_dy, out_dy_xhat, workspace, rows, cols, stream);
}

inline int64_t column_sums_workspace_floats(int64_t rows, int64_t cols, bool xhat) {
  return (xhat ? 2 : 1) * column_chunks(rows).chunks * cols;
}

}  // namespace actbench::cuda
