// Causal softmax over rows of [batch, S, S]: row r is query position i = r % S and sees
// columns 0..i; columns above the diagonal are never read and are written as exact zeros.
// No scaling inside (the scores GEMM applies 1/sqrt(d)). One block per row:
//   S <= 256 * 32: the row's elements stay in registers (one read, one write);
//   longer rows:   an online max/sum pass, then a normalising pass (any S).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda/online_softmax.hpp"

namespace actbench::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxItems = 32;  // register-cached rows up to kThreads * kMaxItems columns
constexpr int kLongThreads = 512;

template <class T, int kItems>
__global__ void __launch_bounds__(kThreads)
    softmax_fwd_cached(const T* in, T* out, int64_t rows, int64_t cols) {
  __shared__ float scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t diag = r % cols;
    const T* row_in = in + r * cols;
    T* row_out = out + r * cols;
    float v[kItems];
    float m = -INFINITY;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t j = threadIdx.x + static_cast<int64_t>(k) * kThreads;
      v[k] = j <= diag ? to_float(row_in[j]) : -INFINITY;
      m = fmaxf(m, v[k]);
    }
    m = block_max(m, scratch);
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t j = threadIdx.x + static_cast<int64_t>(k) * kThreads;
      v[k] = j <= diag ? expf(v[k] - m) : 0.f;
      s += v[k];
    }
    const float total = block_sum(s, scratch);
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t j = threadIdx.x + static_cast<int64_t>(k) * kThreads;
      if (j < cols) row_out[j] = from_float<T>(j <= diag ? v[k] / total : 0.f);
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kLongThreads)
    softmax_fwd_long(const T* in, T* out, int64_t rows, int64_t cols) {
  __shared__ float scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t diag = r % cols;
    const T* row_in = in + r * cols;
    T* row_out = out + r * cols;
    // Online: s is the sum of exp(x - m) over this thread's columns for its running max m.
    float m = -INFINITY, s = 0.f;
    for (int64_t j = threadIdx.x; j <= diag; j += blockDim.x) online_max_sum_add(m, s, to_float(row_in[j]));
    const float row_max = block_max(m, scratch);
    // A thread with no finite score has m = -inf, s = 0 and adds 0 (row_max is finite); NaN in s
    // (a NaN score) reaches total, so the whole row is NaN as in the cached path and the CPU.
    const float total = block_sum(s * expf(m - row_max), scratch);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      row_out[j] = from_float<T>(j <= diag ? expf(to_float(row_in[j]) - row_max) / total : 0.f);
  }
}

// dscores = p * (dp - sum_k p_k dp_k) on and below the diagonal, 0 above.
template <class T, int kItems>
__global__ void __launch_bounds__(kThreads)
    softmax_bwd_cached(const T* dprobs, const T* probs, T* dscores,
                       int64_t rows, int64_t cols) {
  __shared__ float scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t diag = r % cols;
    const int64_t base = r * cols;
    float p[kItems], dp[kItems];
    float dot = 0.f;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t j = threadIdx.x + static_cast<int64_t>(k) * kThreads;
      const bool live = j <= diag;
      p[k] = live ? to_float(probs[base + j]) : 0.f;
      dp[k] = live ? to_float(dprobs[base + j]) : 0.f;
      dot += p[k] * dp[k];
    }
    dot = block_sum(dot, scratch);
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t j = threadIdx.x + static_cast<int64_t>(k) * kThreads;
      if (j < cols) dscores[base + j] = from_float<T>(j <= diag ? p[k] * (dp[k] - dot) : 0.f);
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kLongThreads)
    softmax_bwd_long(const T* dprobs, const T* probs, T* dscores, int64_t rows,
                     int64_t cols) {
  __shared__ float scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t diag = r % cols;
    const int64_t base = r * cols;
    float dot = 0.f;
    for (int64_t j = threadIdx.x; j <= diag; j += blockDim.x)
      dot += to_float(probs[base + j]) * to_float(dprobs[base + j]);
    dot = block_sum(dot, scratch);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      dscores[base + j] =
          from_float<T>(j <= diag ? to_float(probs[base + j]) * (to_float(dprobs[base + j]) - dot) : 0.f);
  }
}

// Smallest power of two k with kThreads * k >= cols; 0 when the row is too long to cache.
int cached_items(int64_t cols) {
  for (int k = 1; k <= kMaxItems; k *= 2)
    if (static_cast<int64_t>(kThreads) * k >= cols) return k;
  return 0;
}

template <class T>
void fwd(const T* in, T* out, int64_t rows, int64_t cols, cudaStream_t stream) {
  const unsigned grid = row_blocks(rows);
  switch (cached_items(cols)) {
    case 1: softmax_fwd_cached<T, 1><<<grid, kThreads, 0, stream>>>(in, out, rows, cols); break;
    case 2: softmax_fwd_cached<T, 2><<<grid, kThreads, 0, stream>>>(in, out, rows, cols); break;
    case 4: softmax_fwd_cached<T, 4><<<grid, kThreads, 0, stream>>>(in, out, rows, cols); break;
    case 8: softmax_fwd_cached<T, 8><<<grid, kThreads, 0, stream>>>(in, out, rows, cols); break;
    case 16: softmax_fwd_cached<T, 16><<<grid, kThreads, 0, stream>>>(in, out, rows, cols); break;
    case 32: softmax_fwd_cached<T, 32><<<grid, kThreads, 0, stream>>>(in, out, rows, cols); break;
    default: softmax_fwd_long<T><<<grid, kLongThreads, 0, stream>>>(in, out, rows, cols); break;
  }
  CUDA_CHECK_LAUNCH();
}

template <class T>
void bwd(const T* dprobs, const T* probs, T* dscores, int64_t rows, int64_t cols, cudaStream_t stream) {
  const unsigned grid = row_blocks(rows);
  switch (cached_items(cols)) {
    case 1: softmax_bwd_cached<T, 1><<<grid, kThreads, 0, stream>>>(dprobs, probs, dscores, rows, cols); break;
    case 2: softmax_bwd_cached<T, 2><<<grid, kThreads, 0, stream>>>(dprobs, probs, dscores, rows, cols); break;
    case 4: softmax_bwd_cached<T, 4><<<grid, kThreads, 0, stream>>>(dprobs, probs, dscores, rows, cols); break;
    case 8: softmax_bwd_cached<T, 8><<<grid, kThreads, 0, stream>>>(dprobs, probs, dscores, rows, cols); break;
    case 16: softmax_bwd_cached<T, 16><<<grid, kThreads, 0, stream>>>(dprobs, probs, dscores, rows, cols); break;
    case 32: softmax_bwd_cached<T, 32><<<grid, kThreads, 0, stream>>>(dprobs, probs, dscores, rows, cols); break;
    default: softmax_bwd_long<T><<<grid, kLongThreads, 0, stream>>>(dprobs, probs, dscores, rows, cols); break;
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void softmax_causal_fwd(DType dt, const void* scores, void* probs, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  ACTBENCH_DISPATCH_FLOAT(dt, "softmax_causal_fwd", T,
                          fwd<T>(static_cast<const T*>(scores), static_cast<T*>(probs), rows, cols, stream));
}

void softmax_causal_bwd(DType dt, const void* dprobs, const void* probs, void* dscores, int64_t rows, int64_t cols,
                        cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  ACTBENCH_DISPATCH_FLOAT(dt, "softmax_causal_bwd", T,
                          bwd<T>(static_cast<const T*>(dprobs), static_cast<const T*>(probs),
                                 static_cast<T*>(dscores), rows, cols, stream));
}

}  // namespace actbench::cuda
