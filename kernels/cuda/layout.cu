// Attention head layout: [S, B, W] activations <-> [B, NH, S, D] heads (columns
// [col_offset, col_offset + NH*D) of W, head-major). Pure data movement, so elements are
// moved as raw bits of their size and any dtype works. Writes are coalesced: each kernel
// walks its destination in memory order (reads are contiguous along D).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"

namespace actbench::cuda {
namespace {

template <class Bits>
__global__ void split_heads_kernel(const Bits* sbw, Bits* heads, int64_t S, int64_t B, int64_t W, int64_t NH,
                                   int64_t D, int64_t col_offset, int64_t n) {
  for (int64_t idx = global_thread(); idx < n; idx += grid_threads()) {
    const int64_t d = idx % D;
    int64_t t = idx / D;
    const int64_t s = t % S;
    t /= S;
    const int64_t j = t % NH;
    const int64_t b = t / NH;
    heads[idx] = sbw[(s * B + b) * W + col_offset + j * D + d];
  }
}

// Walks the [S, B, NH*D] window of sbw; the other columns of sbw are left as they are.
template <class Bits>
__global__ void merge_heads_kernel(const Bits* heads, Bits* sbw, int64_t S, int64_t B, int64_t W, int64_t NH,
                                   int64_t D, int64_t col_offset, int64_t n) {
  const int64_t width = NH * D;
  for (int64_t idx = global_thread(); idx < n; idx += grid_threads()) {
    const int64_t c = idx % width;
    const int64_t row = idx / width;  // s * B + b
    const int64_t b = row % B, s = row / B;
    const int64_t j = c / D, d = c % D;
    sbw[row * W + col_offset + c] = heads[((b * NH + j) * S + s) * D + d];
  }
}

template <class Bits>
void launch(bool split, const void* src, void* dst, int64_t S, int64_t B, int64_t W, int64_t NH, int64_t D,
            int64_t col_offset, cudaStream_t stream) {
  const int64_t n = S * B * NH * D;
  if (split)
    split_heads_kernel<Bits><<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(
        static_cast<const Bits*>(src), static_cast<Bits*>(dst), S, B, W, NH, D, col_offset, n);
  else
    merge_heads_kernel<Bits><<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(
        static_cast<const Bits*>(src), static_cast<Bits*>(dst), S, B, W, NH, D, col_offset, n);
  CUDA_CHECK_LAUNCH();
}

void dispatch(bool split, DType dt, const void* src, void* dst, int64_t S, int64_t B, int64_t W, int64_t NH,
              int64_t D, int64_t col_offset, cudaStream_t stream) {
  if (S * B * NH * D == 0) return;
  switch (dtype_size(dt)) {
    case 1: launch<uint8_t>(split, src, dst, S, B, W, NH, D, col_offset, stream); break;
    case 2: launch<uint16_t>(split, src, dst, S, B, W, NH, D, col_offset, stream); break;
    case 4: launch<uint32_t>(split, src, dst, S, B, W, NH, D, col_offset, stream); break;
    default: throw InvalidArgument(std::string(split ? "split_heads" : "merge_heads") + ": unsupported dtype");
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
