// Attention head layout: [S, B, W] activations <-> [B, NH, S, D] heads (columns
// [col_offset, col_offset + NH*D) of W, head-major). Pure data movement, so elements are moved
// as raw bits in units V of 16, 8, 4, 2 or 1 bytes: the widest that divides D, W, col_offset
// (in bytes) and both base addresses, so that every access is V-aligned.
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
  int64_t unit = 16;
  while (unit > 1 && (bits & static_cast<uint64_t>(unit - 1)) != 0) unit /= 2;
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

}  // namespace

void split_heads(DType dt, const void* sbw, void* heads, int64_t S, int64_t B, int64_t W, int64_t NH, int64_t D,
                 int64_t col_offset, cudaStream_t stream) {
  dispatch(true, dt, sbw, heads, S, B, W, NH, D, col_offset, stream);
}

void merge_heads(DType dt, const void* heads, void* sbw, int64_t S, int64_t B, int64_t W, int64_t NH, int64_t D,
                 int64_t col_offset, cudaStream_t stream) {
  dispatch(false, dt, heads, sbw, S, B, W, NH, D, col_offset, stream);
}

}  // namespace actbench::cuda
