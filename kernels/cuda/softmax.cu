// Causal softmax over rows of [batch, R, C]: row r is row r % R of its matrix, at position
// i = positions.at(r % R) < C (the square [batch, S, S]: R = C, row r % S at its own index), and
// sees columns 0..i (its "diagonal" below); the columns after it are never read and are
// written as exact zeros.
// No scaling inside (the scores GEMM applies 1/sqrt(d)). One block per row:
//   S <= 256 * 32: the row's elements stay in registers (one read, one write);
//   longer rows:   an online max/sum pass, then a normalising pass (any S).
// Each thread moves packs of consecutive elements (packs.cuh): 16-byte packs (8 bf16/fp16, 4
// fp32) when S is a multiple of the pack and the tensors 16-byte aligned, so a warp reads and
// writes 512 contiguous bytes per request; single elements otherwise. A pack that holds the
// diagonal is read whole (at most 14 bytes past it) and its columns past the diagonal are
// masked in registers; packs entirely past it are not read. The row's 1 / sum is taken once
// and multiplied, not divided per element; its position is taken once per row.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda/online_softmax.hpp"
#include "kernels/cuda/packs.cuh"

namespace actbench::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxFloats = 32;  // register-cached rows up to kThreads * kMaxFloats columns
constexpr int kLongThreads = 512;

// Where a row's visible columns end: row r is row r % matrix_rows of its matrix.
struct CausalPlace {
  int64_t matrix_rows = 0;
  SeqPositions positions;
  __device__ __forceinline__ int64_t diagonal(int64_t r) const { return positions.at(r % matrix_rows); }
};

// kItems packs of kN elements per thread: pack k of thread t starts at column (t + k * kThreads) * kN.
template <class T, int kN, int kItems>
__global__ void __launch_bounds__(kThreads)
    softmax_fwd_cached(const T* __restrict__ in, T* __restrict__ out, int64_t rows, int64_t cols, CausalPlace place) {
  constexpr bool kWide = kN > 1;
  __shared__ float scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int diag = static_cast<int>(place.diagonal(r));  // < cols <= 8192: 32-bit columns
    const T* row_in = in + r * cols;
    T* row_out = out + r * cols;
    float v[kItems][kN];
    float m = -INFINITY;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int j0 = (static_cast<int>(threadIdx.x) + k * kThreads) * kN;
      if (j0 <= diag) {
        load_pack<T, kN, kWide>(row_in + j0, v[k]);
      } else {
#pragma unroll
        for (int e = 0; e < kN; ++e) v[k][e] = -INFINITY;
      }
#pragma unroll
      for (int e = 0; e < kN; ++e) {
        v[k][e] = j0 + e <= diag ? v[k][e] : -INFINITY;
        m = fmaxf(m, v[k][e]);
      }
    }
    m = block_max(m, scratch);
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int j0 = (static_cast<int>(threadIdx.x) + k * kThreads) * kN;
#pragma unroll
      for (int e = 0; e < kN; ++e) {
        v[k][e] = j0 + e <= diag ? expf(v[k][e] - m) : 0.f;
        s += v[k][e];
      }
    }
    const float inv_total = 1.f / block_sum(s, scratch);
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int j0 = (static_cast<int>(threadIdx.x) + k * kThreads) * kN;
      if (j0 < cols) {
#pragma unroll
        for (int e = 0; e < kN; ++e) v[k][e] = j0 + e <= diag ? v[k][e] * inv_total : 0.f;
        store_pack<T, kN, kWide>(row_out + j0, v[k]);
      }
    }
  }
}

template <class T, int kN>
__global__ void __launch_bounds__(kLongThreads)
    softmax_fwd_long(const T* __restrict__ in, T* __restrict__ out, int64_t rows, int64_t cols, CausalPlace place) {
  constexpr bool kWide = kN > 1;
  __shared__ float scratch[32];
  const int64_t stride = static_cast<int64_t>(blockDim.x) * kN;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t diag = place.diagonal(r);
    const T* row_in = in + r * cols;
    T* row_out = out + r * cols;
    // Online: s is the sum of exp(x - m) over this thread's columns for its running max m.
    float m = -INFINITY, s = 0.f;
    for (int64_t j0 = threadIdx.x * kN; j0 <= diag; j0 += stride) {
      float v[kN];
      load_pack<T, kN, kWide>(row_in + j0, v);
#pragma unroll
      for (int e = 0; e < kN; ++e)
        if (j0 + e <= diag) online_max_sum_add(m, s, v[e]);
    }
    const float row_max = block_max(m, scratch);
    // A thread with no finite score has m = -inf, s = 0 and adds 0 (row_max is finite); NaN in s
    // (a NaN score) reaches total, so the whole row is NaN as in the cached path and the CPU.
    const float inv_total = 1.f / block_sum(s * expf(m - row_max), scratch);
    for (int64_t j0 = threadIdx.x * kN; j0 < cols; j0 += stride) {
      float v[kN];
      if (j0 <= diag) load_pack<T, kN, kWide>(row_in + j0, v);
#pragma unroll
      for (int e = 0; e < kN; ++e) v[e] = j0 + e <= diag ? expf(v[e] - row_max) * inv_total : 0.f;
      store_pack<T, kN, kWide>(row_out + j0, v);
    }
  }
}

// dscores = p * (dp - sum_k p_k dp_k) on and below the diagonal, 0 above.
template <class T, int kN, int kItems>
__global__ void __launch_bounds__(kThreads)
    softmax_bwd_cached(const T* __restrict__ dprobs, const T* __restrict__ probs, T* __restrict__ dscores,
                       int64_t rows, int64_t cols, CausalPlace place) {
  constexpr bool kWide = kN > 1;
  __shared__ float scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int diag = static_cast<int>(place.diagonal(r));  // < cols <= 8192: 32-bit columns
    const int64_t base = r * cols;
    float p[kItems][kN], dp[kItems][kN];
    float dot = 0.f;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int j0 = (static_cast<int>(threadIdx.x) + k * kThreads) * kN;
      if (j0 <= diag) {
        load_pack<T, kN, kWide>(probs + base + j0, p[k]);
        load_pack<T, kN, kWide>(dprobs + base + j0, dp[k]);
      } else {
#pragma unroll
        for (int e = 0; e < kN; ++e) p[k][e] = dp[k][e] = 0.f;
      }
#pragma unroll
      for (int e = 0; e < kN; ++e) {
        p[k][e] = j0 + e <= diag ? p[k][e] : 0.f;
        dp[k][e] = j0 + e <= diag ? dp[k][e] : 0.f;
        dot += p[k][e] * dp[k][e];
      }
    }
    dot = block_sum(dot, scratch);
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int j0 = (static_cast<int>(threadIdx.x) + k * kThreads) * kN;
      if (j0 < cols) {
#pragma unroll
        for (int e = 0; e < kN; ++e) p[k][e] = j0 + e <= diag ? p[k][e] * (dp[k][e] - dot) : 0.f;
        store_pack<T, kN, kWide>(dscores + base + j0, p[k]);
      }
    }
  }
}

template <class T, int kN>
__global__ void __launch_bounds__(kLongThreads)
    softmax_bwd_long(const T* __restrict__ dprobs, const T* __restrict__ probs, T* __restrict__ dscores,
                     int64_t rows, int64_t cols, CausalPlace place) {
  constexpr bool kWide = kN > 1;
  __shared__ float scratch[32];
  const int64_t stride = static_cast<int64_t>(blockDim.x) * kN;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t diag = place.diagonal(r);
    const int64_t base = r * cols;
    float dot = 0.f;
    for (int64_t j0 = threadIdx.x * kN; j0 <= diag; j0 += stride) {
      float p[kN], dp[kN];
      load_pack<T, kN, kWide>(probs + base + j0, p);
      load_pack<T, kN, kWide>(dprobs + base + j0, dp);
#pragma unroll
      for (int e = 0; e < kN; ++e)
        if (j0 + e <= diag) dot += p[e] * dp[e];
    }
    dot = block_sum(dot, scratch);
    for (int64_t j0 = threadIdx.x * kN; j0 < cols; j0 += stride) {
      float p[kN], dp[kN];
      if (j0 <= diag) {
        load_pack<T, kN, kWide>(probs + base + j0, p);
        load_pack<T, kN, kWide>(dprobs + base + j0, dp);
      }
#pragma unroll
      for (int e = 0; e < kN; ++e) p[e] = j0 + e <= diag ? p[e] * (dp[e] - dot) : 0.f;
      store_pack<T, kN, kWide>(dscores + base + j0, p);
    }
  }
}

// Smallest power of two k with kThreads * k >= packs, at most max_items; 0 when the row is
// too long to cache.
int cached_items(int64_t packs, int max_items) {
  for (int k = 1; k <= max_items; k *= 2)
    if (static_cast<int64_t>(kThreads) * k >= packs) return k;
  return 0;
}

// Launches the cached kernel of `items` packs per thread (a power of two with items * kN <=
// kMaxFloats), trying kItems = 1, 2, 4, ...
template <class T, int kN, int kItems = 1>
void fwd_cached(int items, const T* in, T* out, int64_t rows, int64_t cols, const CausalPlace& place,
                cudaStream_t stream) {
  if constexpr (kItems * kN <= kMaxFloats) {
    if (items != kItems) return fwd_cached<T, kN, kItems * 2>(items, in, out, rows, cols, place, stream);
    softmax_fwd_cached<T, kN, kItems><<<row_blocks(rows), kThreads, 0, stream>>>(in, out, rows, cols, place);
  }
}

template <class T, int kN, int kItems = 1>
void bwd_cached(int items, const T* dprobs, const T* probs, T* dscores, int64_t rows, int64_t cols,
                const CausalPlace& place, cudaStream_t stream) {
  if constexpr (kItems * kN <= kMaxFloats) {
    if (items != kItems) return bwd_cached<T, kN, kItems * 2>(items, dprobs, probs, dscores, rows, cols, place, stream);
    softmax_bwd_cached<T, kN, kItems><<<row_blocks(rows), kThreads, 0, stream>>>(dprobs, probs, dscores, rows, cols,
                                                                                 place);
  }
}

template <class T, int kN>
void fwd_packs(const T* in, T* out, int64_t rows, int64_t cols, const CausalPlace& place, cudaStream_t stream) {
  if (const int items = cached_items(cols / kN, kMaxFloats / kN))
    fwd_cached<T, kN>(items, in, out, rows, cols, place, stream);
  else
    softmax_fwd_long<T, kN><<<row_blocks(rows), kLongThreads, 0, stream>>>(in, out, rows, cols, place);
  CUDA_CHECK_LAUNCH();
}

template <class T, int kN>
void bwd_packs(const T* dprobs, const T* probs, T* dscores, int64_t rows, int64_t cols, const CausalPlace& place,
               cudaStream_t stream) {
  if (const int items = cached_items(cols / kN, kMaxFloats / kN))
    bwd_cached<T, kN>(items, dprobs, probs, dscores, rows, cols, place, stream);
  else
    softmax_bwd_long<T, kN><<<row_blocks(rows), kLongThreads, 0, stream>>>(dprobs, probs, dscores, rows, cols, place);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void fwd(const T* in, T* out, int64_t rows, int64_t cols, const CausalPlace& place, cudaStream_t stream) {
  if (cols % kPack<T> == 0 && aligned_to(in, 16) && aligned_to(out, 16))
    fwd_packs<T, kPack<T>>(in, out, rows, cols, place, stream);
  else
    fwd_packs<T, 1>(in, out, rows, cols, place, stream);
}

template <class T>
void bwd(const T* dprobs, const T* probs, T* dscores, int64_t rows, int64_t cols, const CausalPlace& place,
         cudaStream_t stream) {
  if (cols % kPack<T> == 0 && aligned_to(dprobs, 16) && aligned_to(probs, 16) && aligned_to(dscores, 16))
    bwd_packs<T, kPack<T>>(dprobs, probs, dscores, rows, cols, place, stream);
  else
    bwd_packs<T, 1>(dprobs, probs, dscores, rows, cols, place, stream);
}

}  // namespace

void softmax_causal_fwd(DType dt, const void* scores, void* probs, int64_t rows, int64_t matrix_rows, int64_t cols,
                        const SeqPositions& positions, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const CausalPlace place{matrix_rows, positions};
  ACTBENCH_DISPATCH_FLOAT(dt, "softmax_causal_fwd", T,
                          fwd<T>(static_cast<const T*>(scores), static_cast<T*>(probs), rows, cols, place, stream));
}

void softmax_causal_bwd(DType dt, const void* dprobs, const void* probs, void* dscores, int64_t rows,
                        int64_t matrix_rows, int64_t cols, const SeqPositions& positions, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const CausalPlace place{matrix_rows, positions};
  ACTBENCH_DISPATCH_FLOAT(dt, "softmax_causal_bwd", T,
                          bwd<T>(static_cast<const T*>(dprobs), static_cast<const T*>(probs),
                                 static_cast<T*>(dscores), rows, cols, place, stream));
}

}  // namespace actbench::cuda
