// LayerNorm over the last dim of x [rows, cols], fp32 statistics (two-pass mean then variance,
// like the reference). A block normalizes several rows in turn, each row read once into
// registers (16-byte packs when every row is 16-byte aligned, one element per lane otherwise),
// so every input element is read once and the weights once per block. The backward fuses dx
// with the block's dweight/dbias column sums; a finish kernel adds the blocks' partial rows in
// order (column_reduce.cuh), so the sums are deterministic. Rows longer than 8 packs per thread
// of a 1024-thread block take the long-row kernels, which re-read the row in each pass.
#include "kernels/cuda/column_reduce.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"

namespace actbench::cuda {
namespace {

// Rows per block. Forward: the weight and bias slices are read once per block and kept in
// registers, so they cost 1 / kFwdRowsPerBlock of the row traffic (3 % at 32); mean and rstd of
// the block's rows are written as one coalesced store. Backward: each block also writes one fp32
// partial row of dweight and dbias (8 bytes per column) that the finish kernel reads back: with
// the weight read that is 18 bytes per column and block against 6 per element of dy, x and dx in
// bf16, so 64 rows per block keep it under 5 % (4.5 % counted at the 22B geometry). At the
// 22B shape (cols 6144) that is 256 forward / 128 backward blocks for the 8192 rows without
// sequence parallelism (about one backward block per SM of an H100) and 32 / 16 for the 1024
// rows with it, too few to fill a GPU: there the 5 % bound on the fp32 partials and full
// occupancy conflict (docs/kernel_efficiency.md). One 16-byte pack per thread, up to 1024
// threads a block.
constexpr int kFwdRowsPerBlock = 32;
constexpr int kBwdRowsPerBlock = 64;

// One row of x is read once into registers: the mean, the variance (two-pass, like the
// reference) and y all come from those registers.
template <class T, int VEC, int PACKS>
__global__ void __launch_bounds__(pack::kMaxRowThreads)
    layernorm_fwd_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, float eps,
                         T* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd, int64_t rows,
                         int64_t cols) {
  __shared__ float scratch[32];
  __shared__ float s_mean[kFwdRowsPerBlock], s_rstd[kFwdRowsPerBlock];
  const int64_t packs = cols / VEC;
  const float n = static_cast<float>(cols);
  float wv[PACKS][VEC], bv[PACKS][VEC];
#pragma unroll
  for (int k = 0; k < PACKS; ++k) {
    const int64_t p = pack::owned(k);
    if (p < packs) {
      pack::load<T, VEC>(w + p * VEC, wv[k]);
      pack::load<T, VEC>(b + p * VEC, bv[k]);
    }
  }
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * kFwdRowsPerBlock; first < rows;
       first += static_cast<int64_t>(gridDim.x) * kFwdRowsPerBlock) {
    const int count = rows - first < kFwdRowsPerBlock ? static_cast<int>(rows - first) : kFwdRowsPerBlock;
    for (int i = 0; i < count; ++i) {
      const T* xr = x + (first + i) * cols;
      T* yr = y + (first + i) * cols;
      float v[PACKS][VEC];
      float s = 0.f;
#pragma unroll
      for (int k = 0; k < PACKS; ++k) {
        const int64_t p = pack::owned(k);
        if (p < packs) {
          pack::load<T, VEC>(xr + p * VEC, v[k]);
#pragma unroll
          for (int e = 0; e < VEC; ++e) s += v[k][e];
        }
      }
      const float mu = block_sum(s, scratch) / n;
      float ss = 0.f;
#pragma unroll
      for (int k = 0; k < PACKS; ++k) {
        if (pack::owned(k) < packs) {
#pragma unroll
          for (int e = 0; e < VEC; ++e) ss += (v[k][e] - mu) * (v[k][e] - mu);
        }
      }
      const float rs = 1.f / sqrtf(block_sum(ss, scratch) / n + eps);
#pragma unroll
      for (int k = 0; k < PACKS; ++k) {
        const int64_t p = pack::owned(k);
        if (p < packs) {
          float out[VEC];
#pragma unroll
          for (int e = 0; e < VEC; ++e) out[e] = (v[k][e] - mu) * rs * wv[k][e] + bv[k][e];
          pack::store<T, VEC>(yr + p * VEC, out);
        }
      }
      if (threadIdx.x == 0) {
        s_mean[i] = mu;
        s_rstd[i] = rs;
      }
    }
    __syncthreads();
    if (static_cast<int>(threadIdx.x) < count) {
      mean[first + threadIdx.x] = s_mean[threadIdx.x];
      rstd[first + threadIdx.x] = s_rstd[threadIdx.x];
    }
    __syncthreads();  // the stores above read s_mean before the next rows overwrite it
  }
}

// Block g: rows [g * kBwdRowsPerBlock, ...). Per row, dy and x are read once into registers:
//   dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)), gw = dy * w, xhat = (x - mean) * rstd;
// per column, the block's sums of dy (dbias) and dy * xhat (dweight) accumulate in registers
// in row order and are written as partial row g of part_db / part_dw (PartialRow layout).
template <class T, int VEC, int PACKS>
__global__ void __launch_bounds__(pack::kMaxRowThreads)
    layernorm_bwd_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
                         const float* __restrict__ mean, const float* __restrict__ rstd, T* __restrict__ dx,
                         float* __restrict__ part_db, float* __restrict__ part_dw, int64_t rows, int64_t cols) {
  __shared__ float scratch[32];
  __shared__ float s_mean[kBwdRowsPerBlock], s_rstd[kBwdRowsPerBlock];
  const int64_t packs = cols / VEC;
  const float n = static_cast<float>(cols);
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kBwdRowsPerBlock;
  const int count = rows - first < kBwdRowsPerBlock ? static_cast<int>(rows - first) : kBwdRowsPerBlock;
  for (int i = static_cast<int>(threadIdx.x); i < count; i += static_cast<int>(blockDim.x)) {  // the block's statistics, one coalesced load
    s_mean[i] = mean[first + i];
    s_rstd[i] = rstd[first + i];
  }
  float wv[PACKS][VEC], acc_db[PACKS][VEC] = {}, acc_dw[PACKS][VEC] = {};
#pragma unroll
  for (int k = 0; k < PACKS; ++k) {
    const int64_t p = pack::owned(k);
    if (p < packs) pack::load<T, VEC>(w + p * VEC, wv[k]);
  }
  __syncthreads();
  for (int i = 0; i < count; ++i) {
    const int64_t r = first + i;
    const float mu = s_mean[i], rs = s_rstd[i];
    float gw[PACKS][VEC], xhat[PACKS][VEC];
    float sg = 0.f, sgx = 0.f;
#pragma unroll
    for (int k = 0; k < PACKS; ++k) {
      const int64_t p = pack::owned(k);
      if (p < packs) {
        float g[VEC];
        pack::load<T, VEC>(dy + r * cols + p * VEC, g);
        pack::load<T, VEC>(x + r * cols + p * VEC, xhat[k]);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          xhat[k][e] = (xhat[k][e] - mu) * rs;
          gw[k][e] = g[e] * wv[k][e];
          sg += gw[k][e];
          sgx += gw[k][e] * xhat[k][e];
          acc_db[k][e] += g[e];
          acc_dw[k][e] += g[e] * xhat[k][e];
        }
      }
    }
    const float mean_g = block_sum(sg, scratch) / n;
    const float mean_gx = block_sum(sgx, scratch) / n;
#pragma unroll
    for (int k = 0; k < PACKS; ++k) {
      const int64_t p = pack::owned(k);
      if (p < packs) {
        float out[VEC];
#pragma unroll
        for (int e = 0; e < VEC; ++e) out[e] = rs * (gw[k][e] - mean_g - xhat[k][e] * mean_gx);
        pack::store<T, VEC>(dx + r * cols + p * VEC, out);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < PACKS; ++k) {
    const int64_t p = pack::owned(k);
    if (p < packs) {
      PartialRow<VEC>::store(part_db + blockIdx.x * cols, packs, p, acc_db[k]);
      PartialRow<VEC>::store(part_dw + blockIdx.x * cols, packs, p, acc_dw[k]);
    }
  }
}

// Rows longer than pack::kMaxRowThreads * 8 packs: one block per row, x (fwd) or dy and x (bwd) read
// again in each pass, and the column sums of column_reduce.cuh.
template <class T, int VEC>
__global__ void layernorm_fwd_long_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                          float eps, T* __restrict__ y, float* __restrict__ mean,
                                          float* __restrict__ rstd, int64_t rows, int64_t cols) {
  __shared__ float scratch[32];
  const int64_t packs = cols / VEC;
  const float n = static_cast<float>(cols);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    float s = 0.f;
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      float v[VEC];
      pack::load<T, VEC>(xr + p * VEC, v);
#pragma unroll
      for (int k = 0; k < VEC; ++k) s += v[k];
    }
    const float mu = block_sum(s, scratch) / n;
    float ss = 0.f;
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      float v[VEC];
      pack::load<T, VEC>(xr + p * VEC, v);
#pragma unroll
      for (int k = 0; k < VEC; ++k) ss += (v[k] - mu) * (v[k] - mu);
    }
    const float rs = 1.f / sqrtf(block_sum(ss, scratch) / n + eps);
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      float v[VEC], wv[VEC], bv[VEC], out[VEC];
      pack::load<T, VEC>(xr + p * VEC, v);
      pack::load<T, VEC>(w + p * VEC, wv);
      pack::load<T, VEC>(b + p * VEC, bv);
#pragma unroll
      for (int k = 0; k < VEC; ++k) out[k] = (v[k] - mu) * rs * wv[k] + bv[k];
      pack::store<T, VEC>(y + r * cols + p * VEC, out);
    }
    if (threadIdx.x == 0) {
      mean[r] = mu;
      rstd[r] = rs;
    }
  }
}

template <class T, int VEC>
__global__ void layernorm_bwd_dx_long_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                             const T* __restrict__ w, const float* __restrict__ mean,
                                             const float* __restrict__ rstd, T* __restrict__ dx, int64_t rows,
                                             int64_t cols) {
  __shared__ float scratch[32];
  const int64_t packs = cols / VEC;
  const float n = static_cast<float>(cols);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* dyr = dy + r * cols;
    const T* xr = x + r * cols;
    const float mu = mean[r], rs = rstd[r];
    float sg = 0.f, sgx = 0.f;
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      float g[VEC], xv[VEC], wv[VEC];
      pack::load<T, VEC>(dyr + p * VEC, g);
      pack::load<T, VEC>(xr + p * VEC, xv);
      pack::load<T, VEC>(w + p * VEC, wv);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const float gk = g[k] * wv[k];
        sg += gk;
        sgx += gk * ((xv[k] - mu) * rs);
      }
    }
    const float mean_g = block_sum(sg, scratch) / n;
    const float mean_gx = block_sum(sgx, scratch) / n;
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      float g[VEC], xv[VEC], wv[VEC], out[VEC];
      pack::load<T, VEC>(dyr + p * VEC, g);
      pack::load<T, VEC>(xr + p * VEC, xv);
      pack::load<T, VEC>(w + p * VEC, wv);
#pragma unroll
      for (int k = 0; k < VEC; ++k) out[k] = rs * (g[k] * wv[k] - mean_g - ((xv[k] - mu) * rs) * mean_gx);
      pack::store<T, VEC>(dx + r * cols + p * VEC, out);
    }
  }
}

unsigned blocks_for(int64_t rows, int rows_per_block) { return row_blocks((rows + rows_per_block - 1) / rows_per_block); }

template <class T, int VEC>
void fwd_vec(const T* x, const T* w, const T* b, float eps, T* y, float* mean, float* rstd, int64_t rows,
             int64_t cols, cudaStream_t stream) {
  const int64_t packs = cols / VEC;
  const int per = pack::per_thread(packs);
  const unsigned grid = blocks_for(rows, kFwdRowsPerBlock), threads = pack::row_threads(packs, per ? per : 8);
  switch (per) {
    case 1: layernorm_fwd_kernel<T, VEC, 1><<<grid, threads, 0, stream>>>(x, w, b, eps, y, mean, rstd, rows, cols); break;
    case 2: layernorm_fwd_kernel<T, VEC, 2><<<grid, threads, 0, stream>>>(x, w, b, eps, y, mean, rstd, rows, cols); break;
    case 4: layernorm_fwd_kernel<T, VEC, 4><<<grid, threads, 0, stream>>>(x, w, b, eps, y, mean, rstd, rows, cols); break;
    case 8: layernorm_fwd_kernel<T, VEC, 8><<<grid, threads, 0, stream>>>(x, w, b, eps, y, mean, rstd, rows, cols); break;
    default:
      layernorm_fwd_long_kernel<T, VEC><<<row_blocks(rows), 256, 0, stream>>>(x, w, b, eps, y, mean, rstd, rows, cols);
  }
  CUDA_CHECK_LAUNCH();
}

template <class T>
void fwd(const T* x, const T* w, const T* b, float eps, T* y, float* mean, float* rstd, int64_t rows, int64_t cols,
         cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  if (cols % kVec == 0 && pack::aligned16(x) && pack::aligned16(w) && pack::aligned16(b) && pack::aligned16(y))
    fwd_vec<T, kVec>(x, w, b, eps, y, mean, rstd, rows, cols, stream);
  else
    fwd_vec<T, 1>(x, w, b, eps, y, mean, rstd, rows, cols, stream);
}

int64_t fused_bwd_blocks(int64_t rows) { return rows < 1 ? 1 : (rows + kBwdRowsPerBlock - 1) / kBwdRowsPerBlock; }

template <class T, int VEC>
void bwd_vec(const T* dy, const T* x, const T* w, const float* mean, const float* rstd, T* dx, T* dw, T* db,
             float* workspace, int64_t rows, int64_t cols, cudaStream_t stream) {
  const int64_t packs = cols / VEC;
  const int per = pack::per_thread(packs);
  if (per == 0) {
    if (rows > 0) {
      layernorm_bwd_dx_long_kernel<T, VEC><<<row_blocks(rows), 256, 0, stream>>>(dy, x, w, mean, rstd, dx, rows, cols);
      CUDA_CHECK_LAUNCH();
    }
    column_sums_vec<T, VEC, true>(dy, x, mean, rstd, db, dw, workspace, rows, cols, stream);
    return;
  }
  const int64_t blocks = fused_bwd_blocks(rows);
  float* part_db = workspace;
  float* part_dw = workspace + blocks * cols;
  const unsigned grid = static_cast<unsigned>(blocks), threads = pack::row_threads(packs, per);
  switch (per) {
    case 1: layernorm_bwd_kernel<T, VEC, 1><<<grid, threads, 0, stream>>>(dy, x, w, mean, rstd, dx, part_db, part_dw, rows, cols); break;
    case 2: layernorm_bwd_kernel<T, VEC, 2><<<grid, threads, 0, stream>>>(dy, x, w, mean, rstd, dx, part_db, part_dw, rows, cols); break;
    case 4: layernorm_bwd_kernel<T, VEC, 4><<<grid, threads, 0, stream>>>(dy, x, w, mean, rstd, dx, part_db, part_dw, rows, cols); break;
    default: layernorm_bwd_kernel<T, VEC, 8><<<grid, threads, 0, stream>>>(dy, x, w, mean, rstd, dx, part_db, part_dw, rows, cols);
  }
  CUDA_CHECK_LAUNCH();
  launch_column_finish<T, VEC>(part_db, db, part_dw, dw, blocks, cols, stream);
}

template <class T>
void bwd(const T* dy, const T* x, const T* w, const float* mean, const float* rstd, T* dx, T* dw, T* db,
         float* workspace, int64_t rows, int64_t cols, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  if (cols % kVec == 0 && pack::aligned16(dy) && pack::aligned16(x) && pack::aligned16(w) && pack::aligned16(dx) && pack::aligned16(dw) &&
      pack::aligned16(db) && pack::aligned16(workspace))
    bwd_vec<T, kVec>(dy, x, w, mean, rstd, dx, dw, db, workspace, rows, cols, stream);
  else
    bwd_vec<T, 1>(dy, x, w, mean, rstd, dx, dw, db, workspace, rows, cols, stream);
}

}  // namespace

void layernorm_fwd(DType dt, const void* x, const void* weight, const void* bias, float eps, void* y, float* mean,
                   float* rstd, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  ACTBENCH_DISPATCH_FLOAT(dt, "layernorm_fwd", T,
                          fwd<T>(static_cast<const T*>(x), static_cast<const T*>(weight), static_cast<const T*>(bias),
                                 eps, static_cast<T*>(y), mean, rstd, rows, cols, stream));
}

int64_t layernorm_bwd_workspace_floats(int64_t rows, int64_t cols) {
  // the fused kernel's partial rows (one per block), or the long rows' column chunks
  const int64_t fused = 2 * fused_bwd_blocks(rows) * cols, chunked = column_sums_workspace_floats(rows, cols, true);
  return fused > chunked ? fused : chunked;
}

void layernorm_bwd(DType dt, const void* dy, const void* x, const void* weight, const float* mean, const float* rstd,
                   void* dx, void* dweight, void* dbias, float* workspace, int64_t rows, int64_t cols,
                   cudaStream_t stream) {
  if (cols == 0) return;
  ACTBENCH_DISPATCH_FLOAT(dt, "layernorm_bwd", T,
                          bwd<T>(static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(weight),
                                 mean, rstd, static_cast<T*>(dx), static_cast<T*>(dweight), static_cast<T*>(dbias),
                                 workspace, rows, cols, stream));
}

}  // namespace actbench::cuda
