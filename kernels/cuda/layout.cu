// Attention head layout: [S, B, W] activations <-> [B, NH, S, D] heads (columns
// [col_offset, col_offset + NH*D) of W, head-major), and runs of rows between [O, R, W]
// tensors (copy_rows: context parallelism's sequence chunks). Pure data movement, so elements
// are moved as raw bits in units V of 16, 8, 4, 2 or 1 bytes: the widest that divides every
// offset in bytes (D, W, col_offset; copy_rows' row) and both base addresses, so that every
// access is V-aligned.
//
// Geometry, chosen so that no index is divided per element: a block is (x: units of one head
// row, y: heads, z: (s, b) rows), so a thread's head j and unit d are its thread indices and the
// row's s and b are split once per row. Threads in memory order of the (s, b) row: a warp reads
// (split) or writes (merge) contiguous bytes of the [S, B, W] row and the other side in whole
// head rows of D units (contiguous, sector-aligned when D*V is a multiple of 32). At the 22B
// shape (D = 96 bf16 = 12 units of 16 bytes, 8 heads per rank) a row is 96 threads, 3 warps.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"

namespace actbench::cuda {
namespace {

constexpr int kLayoutThreads = 256;

// Sizes in units of V. kSplit: sbw -> heads; else heads -> sbw (the other columns of sbw are
// left as they are).
template <class V, bool kSplit>
__global__ void heads_layout_kernel(const V* __restrict__ src, V* __restrict__ dst, int64_t S, int64_t B, int64_t W,
                                    int NH, int D, int64_t col_offset) {
  const int64_t rows = S * B;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.z + threadIdx.z; row < rows;
       row += static_cast<int64_t>(gridDim.x) * blockDim.z) {
    const int64_t s = row / B, b = row - s * B;  // once per row
    const int64_t sbw_row_start = row * W + col_offset;
    for (int j = threadIdx.y; j < NH; j += blockDim.y) {
      const int64_t head_row = ((b * NH + j) * S + s) * D;
      for (int d = threadIdx.x; d < D; d += blockDim.x) {
        if constexpr (kSplit)
          dst[head_row + d] = src[sbw_row_start + static_cast<int64_t>(j) * D + d];
        else
          dst[sbw_row_start + static_cast<int64_t>(j) * D + d] = src[head_row + d];
      }
    }
  }
}

template <class V>
void launch(bool split, const void* src, void* dst, int64_t S, int64_t B, int64_t W, int64_t NH, int64_t D,
            int64_t col_offset, cudaStream_t stream) {
  const int64_t rows = S * B;
  const unsigned x = static_cast<unsigned>(D < kLayoutThreads ? D : kLayoutThreads);
  const int64_t heads_fit = kLayoutThreads / x;
  const unsigned y = static_cast<unsigned>(NH < heads_fit ? NH : heads_fit);
  const int64_t rows_fit = kLayoutThreads / (x * y);
  const unsigned z = static_cast<unsigned>(rows_fit < 64 ? rows_fit : 64);  // blockDim.z <= 64
  const dim3 block(x, y, z);
  const unsigned grid = row_blocks((rows + z - 1) / z);
  if (split)
    heads_layout_kernel<V, true><<<grid, block, 0, stream>>>(static_cast<const V*>(src), static_cast<V*>(dst), S, B, W,
                                                             static_cast<int>(NH), static_cast<int>(D), col_offset);
  else
    heads_layout_kernel<V, false><<<grid, block, 0, stream>>>(static_cast<const V*>(src), static_cast<V*>(dst), S, B,
                                                              W, static_cast<int>(NH), static_cast<int>(D), col_offset);
  CUDA_CHECK_LAUNCH();
}

void dispatch(bool split, DType dt, const void* src, void* dst, int64_t S, int64_t B, int64_t W, int64_t NH,
              int64_t D, int64_t col_offset, cudaStream_t stream) {
  if (S * B * NH * D == 0) return;
  const int64_t es = dtype_size(dt);
  if (es != 1 && es != 2 && es != 4)
    throw InvalidArgument(std::string(split ? "split_heads" : "merge_heads") + ": unsupported dtype");
  if (NH > (int64_t{1} << 30) || D > (int64_t{1} << 30))
    throw InvalidArgument(std::string(split ? "split_heads" : "merge_heads") + ": head count or size too large");
  // the widest unit every offset is a multiple of
  const uint64_t bits = static_cast<uint64_t>(D * es) | static_cast<uint64_t>(W * es) |
                        static_cast<uint64_t>(col_offset * es) | reinterpret_cast<uintptr_t>(src) |
                        reinterpret_cast<uintptr_t>(dst);
  const int64_t unit = widest_unit(bits);
  auto go = [&](auto tag) {
    using V = decltype(tag);
    launch<V>(split, src, dst, S, B, W * es / unit, NH, D * es / unit, col_offset * es / unit, stream);
  };
  switch (unit) {
    case 16: go(uint4{}); break;
    case 8: go(uint2{}); break;
    case 4: go(uint32_t{}); break;
    case 2: go(uint16_t{}); break;
    default: go(uint8_t{}); break;
  }
}

// copy_rows: block (x: units of the run, y: outer blocks). Each outer block's run of rows is
// contiguous on both sides, so a warp moves 32 consecutive units (512 bytes with 16-byte
// units) with no index divided.
template <class V>
__global__ void copy_rows_kernel(const V* __restrict__ src, V* __restrict__ dst, int64_t src_block, int64_t src_start,
                                 int64_t dst_block, int64_t dst_start, int64_t run, int64_t outer) {
  for (int64_t o = blockIdx.y; o < outer; o += gridDim.y) {
    const V* s = src + o * src_block + src_start;
    V* d = dst + o * dst_block + dst_start;
    for (int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < run;
         u += static_cast<int64_t>(gridDim.x) * blockDim.x)
      d[u] = s[u];
  }
}

template <class V>
void launch_copy_rows(const void* src, int64_t src_rows, int64_t src_row, void* dst, int64_t dst_rows,
                      int64_t dst_row, int64_t rows, int64_t outer, int64_t row_units, cudaStream_t stream) {
  const int64_t run = rows * row_units;
  const int64_t threads = kLayoutThreads;
  const int64_t blocks_x = (run + threads - 1) / threads;
  const dim3 grid(static_cast<unsigned>(blocks_x < 65536 ? blocks_x : 65536),
                  static_cast<unsigned>(outer < 65535 ? outer : 65535));
  copy_rows_kernel<V><<<grid, static_cast<unsigned>(threads), 0, stream>>>(
      static_cast<const V*>(src), static_cast<V*>(dst), src_rows * row_units, src_row * row_units,
      dst_rows * row_units, dst_row * row_units, run, outer);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void split_heads(DType dt, const void* sbw, void* heads, int64_t S, int64_t B, int64_t W, int64_t NH, int64_t D,
                 int64_t col_offset, cudaStream_t stream) {
  dispatch(true, dt, sbw, heads, S, B, W, NH, D, col_offset, stream);
}

void merge_heads(DType dt, const void* heads, void* sbw, int64_t S, int64_t B, int64_t W, int64_t NH, int64_t D,
                 int64_t col_offset, cudaStream_t stream) {
  dispatch(false, dt, heads, sbw, S, B, W, NH, D, col_offset, stream);
}

void copy_rows(const void* src, int64_t src_rows, int64_t src_row, void* dst, int64_t dst_rows, int64_t dst_row,
               int64_t rows, int64_t outer, int64_t row_bytes, cudaStream_t stream) {
  if (rows * outer * row_bytes == 0) return;
  // Every offset is a multiple of row_bytes: the unit divides it and both base addresses.
  const int64_t unit = widest_unit(static_cast<uint64_t>(row_bytes) | reinterpret_cast<uintptr_t>(src) |
                                   reinterpret_cast<uintptr_t>(dst));
  auto go = [&](auto tag) {
    using V = decltype(tag);
    launch_copy_rows<V>(src, src_rows, src_row, dst, dst_rows, dst_row, rows, outer, row_bytes / unit, stream);
  };
  switch (unit) {
    case 16: go(uint4{}); break;
    case 8: go(uint2{}); break;
    case 4: go(uint32_t{}); break;
    case 2: go(uint16_t{}); break;
    default: go(uint8_t{}); break;
  }
}

}  // namespace actbench::cuda
