// The llama family's kernels: RMSNorm (forward, backward with the deterministic column
// reduction for dweight), rotate-half RoPE on all or the first dims of each head (forward and
// its inverse, in place allowed) and SwiGLU (forward, backward). The formulas of the cpu reference (kernels/cpu/cpu_backend.cpp)
// and of tools/numpy_layer.py; fp32 math, one rounding on store. Every kernel moves 16-byte
// packs (packs.cuh) when the row allows, one element per lane otherwise; RMSNorm reads a row once
// into registers and its weight once per block, like LayerNorm (layernorm.cu).
#include "kernels/cuda/column_reduce.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda/packs.cuh"

namespace actbench::cuda {
namespace {

// RMSNorm rows per block: the weight slice is read once per block into registers; the
// backward's fused kernel writes one fp32 dweight partial row per block (column_reduce.cuh's
// layout), read back by the finish kernel. As for LayerNorm (layernorm.cu): 32 rows per block
// forward, 64 backward, one 16-byte pack per thread up to 1024 threads (llama3-8b: h = 4096,
// 512 threads; 8192 rows are 256 / 128 blocks, 1024 rows with sequence parallelism 32 / 16).
constexpr int kFwdRowsPerBlock = 32;
constexpr int kBwdRowsPerBlock = 64;

// rstd = 1 / sqrt(mean(x²) + eps); y = x * rstd * w. A row of x is read once into registers.
template <class T, int VEC, int PACKS>
__global__ void __launch_bounds__(pack::kMaxRowThreads)
    rmsnorm_fwd_kernel(const T* __restrict__ x, const T* __restrict__ w, float eps, T* __restrict__ y,
                       float* __restrict__ rstd, int64_t rows, int64_t cols) {
  __shared__ float scratch[32];
  __shared__ float s_rstd[kFwdRowsPerBlock];
  const int64_t packs = cols / VEC;
  float wv[PACKS][VEC];
#pragma unroll
  for (int k = 0; k < PACKS; ++k) {
    const int64_t p = pack::owned(k);
    if (p < packs) pack::load<T, VEC>(w + p * VEC, wv[k]);
  }
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * kFwdRowsPerBlock; first < rows;
       first += static_cast<int64_t>(gridDim.x) * kFwdRowsPerBlock) {
    const int count = rows - first < kFwdRowsPerBlock ? static_cast<int>(rows - first) : kFwdRowsPerBlock;
    for (int i = 0; i < count; ++i) {
      const int64_t r = first + i;
      float v[PACKS][VEC];
      float ss = 0.f;
#pragma unroll
      for (int k = 0; k < PACKS; ++k) {
        const int64_t p = pack::owned(k);
        if (p < packs) {
          pack::load<T, VEC>(x + r * cols + p * VEC, v[k]);
#pragma unroll
          for (int e = 0; e < VEC; ++e) ss += v[k][e] * v[k][e];
        }
      }
      const float rs = 1.f / sqrtf(block_sum(ss, scratch) / static_cast<float>(cols) + eps);
#pragma unroll
      for (int k = 0; k < PACKS; ++k) {
        const int64_t p = pack::owned(k);
        if (p < packs) {
          float out[VEC];
#pragma unroll
          for (int e = 0; e < VEC; ++e) out[e] = v[k][e] * rs * wv[k][e];
          pack::store<T, VEC>(y + r * cols + p * VEC, out);
        }
      }
      if (threadIdx.x == 0) s_rstd[i] = rs;
    }
    __syncthreads();
    if (static_cast<int>(threadIdx.x) < count) rstd[first + threadIdx.x] = s_rstd[threadIdx.x];
    __syncthreads();  // the store above reads s_rstd before the next rows overwrite it
  }
}

// Block g: rows [g * kBwdRowsPerBlock, ...). dx = rstd * (gw - xhat * mean(gw * xhat)),
// gw = dy * w, xhat = x * rstd; the block's per-column sums of dy * xhat (dweight) accumulate in
// registers in row order and are written as partial row g. dx may alias dy (no __restrict__ on
// either): each thread reads its packs of a row of dy before it writes the same packs of dx.
template <class T, int VEC, int PACKS>
__global__ void __launch_bounds__(pack::kMaxRowThreads)
    rmsnorm_bwd_kernel(const T* dy, const T* __restrict__ x, const T* __restrict__ w, const float* __restrict__ rstd,
                       T* dx, float* __restrict__ part_dw, int64_t rows, int64_t cols) {
  __shared__ float scratch[32];
  __shared__ float s_rstd[kBwdRowsPerBlock];
  const int64_t packs = cols / VEC;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kBwdRowsPerBlock;
  const int count = rows - first < kBwdRowsPerBlock ? static_cast<int>(rows - first) : kBwdRowsPerBlock;
  for (int i = static_cast<int>(threadIdx.x); i < count; i += static_cast<int>(blockDim.x))
    s_rstd[i] = rstd[first + i];  // the block's statistics, one coalesced load
  float wv[PACKS][VEC], acc_dw[PACKS][VEC] = {};
#pragma unroll
  for (int k = 0; k < PACKS; ++k) {
    const int64_t p = pack::owned(k);
    if (p < packs) pack::load<T, VEC>(w + p * VEC, wv[k]);
  }
  __syncthreads();
  for (int i = 0; i < count; ++i) {
    const int64_t r = first + i;
    const float rs = s_rstd[i];
    float gw[PACKS][VEC], xhat[PACKS][VEC];
    float sgx = 0.f;
#pragma unroll
    for (int k = 0; k < PACKS; ++k) {
      const int64_t p = pack::owned(k);
      if (p < packs) {
        float g[VEC];
        pack::load<T, VEC>(dy + r * cols + p * VEC, g);
        pack::load<T, VEC>(x + r * cols + p * VEC, xhat[k]);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          xhat[k][e] *= rs;
          gw[k][e] = g[e] * wv[k][e];
          sgx += gw[k][e] * xhat[k][e];
          acc_dw[k][e] += g[e] * xhat[k][e];
        }
      }
    }
    const float mean_gx = block_sum(sgx, scratch) / static_cast<float>(cols);
#pragma unroll
    for (int k = 0; k < PACKS; ++k) {
      const int64_t p = pack::owned(k);
      if (p < packs) {
        float out[VEC];
#pragma unroll
        for (int e = 0; e < VEC; ++e) out[e] = rs * (gw[k][e] - xhat[k][e] * mean_gx);
        pack::store<T, VEC>(dx + r * cols + p * VEC, out);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < PACKS; ++k) {
    const int64_t p = pack::owned(k);
    if (p < packs) PartialRow<VEC>::store(part_dw + blockIdx.x * cols, packs, p, acc_dw[k]);
  }
}

// Rows longer than 8 packs per thread of a 1024-thread block: one block per row, re-reading
// the row in each pass; dweight from column_reduce.cuh's column sums, launched first.
template <class T, int VEC>
__global__ void rmsnorm_fwd_long_kernel(const T* __restrict__ x, const T* __restrict__ w, float eps,
                                        T* __restrict__ y, float* __restrict__ rstd, int64_t rows, int64_t cols) {
  __shared__ float scratch[32];
  const int64_t packs = cols / VEC;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float ss = 0.f;
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      float v[VEC];
      pack::load<T, VEC>(x + r * cols + p * VEC, v);
#pragma unroll
      for (int e = 0; e < VEC; ++e) ss += v[e] * v[e];
    }
    const float rs = 1.f / sqrtf(block_sum(ss, scratch) / static_cast<float>(cols) + eps);
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      float v[VEC], wv[VEC];
      pack::load<T, VEC>(x + r * cols + p * VEC, v);
      pack::load<T, VEC>(w + p * VEC, wv);
#pragma unroll
      for (int e = 0; e < VEC; ++e) v[e] = v[e] * rs * wv[e];
      pack::store<T, VEC>(y + r * cols + p * VEC, v);
    }
    if (threadIdx.x == 0) rstd[r] = rs;
  }
}

template <class T, int VEC>
__global__ void rmsnorm_bwd_dx_long_kernel(const T* dy, const T* __restrict__ x, const T* __restrict__ w,
                                           const float* __restrict__ rstd, T* dx, int64_t rows, int64_t cols) {
  __shared__ float scratch[32];
  const int64_t packs = cols / VEC;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float rs = rstd[r];
    float sgx = 0.f;
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      float g[VEC], xv[VEC], wv[VEC];
      pack::load<T, VEC>(dy + r * cols + p * VEC, g);
      pack::load<T, VEC>(x + r * cols + p * VEC, xv);
      pack::load<T, VEC>(w + p * VEC, wv);
#pragma unroll
      for (int e = 0; e < VEC; ++e) sgx += g[e] * wv[e] * (xv[e] * rs);
    }
    const float mean_gx = block_sum(sgx, scratch) / static_cast<float>(cols);
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      float g[VEC], xv[VEC], wv[VEC];
      pack::load<T, VEC>(dy + r * cols + p * VEC, g);
      pack::load<T, VEC>(x + r * cols + p * VEC, xv);
      pack::load<T, VEC>(w + p * VEC, wv);
#pragma unroll
      for (int e = 0; e < VEC; ++e) g[e] = rs * (g[e] * wv[e] - (xv[e] * rs) * mean_gx);
      pack::store<T, VEC>(dx + r * cols + p * VEC, g);
    }
  }
}

// x [rows, D], row r at position positions.at(r % S): pairs (i, i + R/2) of the first R = rotary_dim dims
// rotated by sign * p * theta^(-2i/R). The angle and its sine/cosine in double, like the cpu
// reference (positions reach 10^5 and more). A thread takes a pack of VEC pairs (16 bytes of the
// low half and 16 of the high half) or, past the R/2 / VEC pair packs, a pack of dims
// R.. R + passed - 1 to copy (passed = 0 in place: nothing to copy). Block (x: packs of a row,
// y: rows), so the position is taken once per row and a warp covers whole rows (llama3-8b's
// D = 128 bf16: 8 threads per row, 4 rows per warp, 128 contiguous bytes per half and row).
// y may be x: a thread reads both halves of its pairs before writing them.
template <class T, int VEC>
__global__ void rope_kernel(const T* x, T* y, int64_t rows, int64_t S, int64_t D, int64_t R, int64_t passed,
                            double theta, double sign, SeqPositions positions) {
  const int64_t half = R / 2;
  const int pair_packs = static_cast<int>(half / VEC), per_row = pair_packs + static_cast<int>(passed / VEC);
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; r < rows;
       r += static_cast<int64_t>(gridDim.x) * blockDim.y) {
    const double pos = static_cast<double>(positions.at(r % S));  // once per row
    const T* xr = x + r * D;
    T* yr = y + r * D;
    for (int i = static_cast<int>(threadIdx.x); i < per_row; i += static_cast<int>(blockDim.x)) {
      if (i >= pair_packs) {
        const int64_t c = R + static_cast<int64_t>(i - pair_packs) * VEC;
        pack::copy<T, VEC>(yr + c, xr + c);
        continue;
      }
      const int64_t i0 = static_cast<int64_t>(i) * VEC;
      float lo[VEC], hi[VEC], out_lo[VEC], out_hi[VEC];
      pack::load<T, VEC>(xr + i0, lo);
      pack::load<T, VEC>(xr + half + i0, hi);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const double exponent = -2.0 * static_cast<double>(i0 + e) / static_cast<double>(R);
        const double angle = pos * pow(theta, exponent);
        double sn, cs;
        sincos(angle, &sn, &cs);
        const float c = static_cast<float>(cs), s = static_cast<float>(sign * sn);
        out_lo[e] = lo[e] * c - hi[e] * s;
        out_hi[e] = hi[e] * c + lo[e] * s;
      }
      pack::store<T, VEC>(yr + i0, out_lo);
      pack::store<T, VEC>(yr + half + i0, out_hi);
    }
  }
}

// x [M, 2N] = [gate | up]; y [M, N] = silu(gate) * up. Block (x: packs of a row, y: rows): the
// row is split from the column once per row, and a warp's requests are whole 16-byte packs.
template <class T, int VEC>
__global__ void swiglu_fwd_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t M, int64_t N) {
  const int64_t packs = N / VEC;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; r < M;
       r += static_cast<int64_t>(gridDim.x) * blockDim.y) {
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      float gate[VEC], up[VEC];
      pack::load<T, VEC>(x + r * 2 * N + p * VEC, gate);
      pack::load<T, VEC>(x + r * 2 * N + N + p * VEC, up);
#pragma unroll
      for (int e = 0; e < VEC; ++e) up[e] = gate[e] / (1.f + expf(-gate[e])) * up[e];
      pack::store<T, VEC>(y + r * N + p * VEC, up);
    }
  }
}

template <class T, int VEC>
__global__ void swiglu_bwd_kernel(const T* __restrict__ dy, const T* __restrict__ x, T* __restrict__ dx, int64_t M,
                                  int64_t N) {
  const int64_t packs = N / VEC;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; r < M;
       r += static_cast<int64_t>(gridDim.x) * blockDim.y) {
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      float gate[VEC], up[VEC], g[VEC], d_gate[VEC], d_up[VEC];
      pack::load<T, VEC>(x + r * 2 * N + p * VEC, gate);
      pack::load<T, VEC>(x + r * 2 * N + N + p * VEC, up);
      pack::load<T, VEC>(dy + r * N + p * VEC, g);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const float sig = 1.f / (1.f + expf(-gate[e]));
        d_gate[e] = g[e] * up[e] * sig * (1.f + gate[e] * (1.f - sig));
        d_up[e] = g[e] * gate[e] * sig;
      }
      pack::store<T, VEC>(dx + r * 2 * N + p * VEC, d_gate);
      pack::store<T, VEC>(dx + r * 2 * N + N + p * VEC, d_up);
    }
  }
}

// A block of about 256 threads: x = the packs of a row (whole warps up to 256), y = rows.
dim3 rows_block(int64_t per_row) {
  const int64_t x = per_row >= 256 ? 256 : per_row < 1 ? 1 : per_row;
  const int64_t y = 256 / x;
  return dim3(static_cast<unsigned>(x), static_cast<unsigned>(y < 1 ? 1 : y));
}
unsigned rows_grid(int64_t rows, const dim3& block) { return row_blocks((rows + block.y - 1) / block.y); }
int64_t fused_bwd_blocks(int64_t rows) { return rows < 1 ? 1 : (rows + kBwdRowsPerBlock - 1) / kBwdRowsPerBlock; }

template <class T, int VEC>
void rmsnorm_fwd_vec(const T* x, const T* w, float eps, T* y, float* rstd, int64_t rows, int64_t cols,
                     cudaStream_t stream) {
  const int64_t packs = cols / VEC;
  const int per = pack::per_thread(packs);
  const unsigned grid = row_blocks((rows + kFwdRowsPerBlock - 1) / kFwdRowsPerBlock);
  const unsigned threads = pack::row_threads(packs, per ? per : 8);
  switch (per) {
    case 1: rmsnorm_fwd_kernel<T, VEC, 1><<<grid, threads, 0, stream>>>(x, w, eps, y, rstd, rows, cols); break;
    case 2: rmsnorm_fwd_kernel<T, VEC, 2><<<grid, threads, 0, stream>>>(x, w, eps, y, rstd, rows, cols); break;
    case 4: rmsnorm_fwd_kernel<T, VEC, 4><<<grid, threads, 0, stream>>>(x, w, eps, y, rstd, rows, cols); break;
    case 8: rmsnorm_fwd_kernel<T, VEC, 8><<<grid, threads, 0, stream>>>(x, w, eps, y, rstd, rows, cols); break;
    default: rmsnorm_fwd_long_kernel<T, VEC><<<row_blocks(rows), 256, 0, stream>>>(x, w, eps, y, rstd, rows, cols);
  }
  CUDA_CHECK_LAUNCH();
}

template <class T, int VEC>
void rmsnorm_bwd_vec(const T* dy, const T* x, const T* w, const float* rstd, T* dx, T* dw, float* workspace,
                     int64_t rows, int64_t cols, cudaStream_t stream) {
  const int64_t packs = cols / VEC;
  const int per = pack::per_thread(packs);
  if (per == 0) {
    // dweight first: dx may alias dy.
    column_sums_vec<T, VEC, true>(dy, x, /*mean=*/nullptr, rstd, /*out_dy=*/nullptr, dw, workspace, rows, cols, stream);
    if (rows > 0) {
      rmsnorm_bwd_dx_long_kernel<T, VEC><<<row_blocks(rows), 256, 0, stream>>>(dy, x, w, rstd, dx, rows, cols);
      CUDA_CHECK_LAUNCH();
    }
    return;
  }
  const int64_t blocks = fused_bwd_blocks(rows);
  const unsigned grid = static_cast<unsigned>(blocks), threads = pack::row_threads(packs, per);
  switch (per) {
    case 1: rmsnorm_bwd_kernel<T, VEC, 1><<<grid, threads, 0, stream>>>(dy, x, w, rstd, dx, workspace, rows, cols); break;
    case 2: rmsnorm_bwd_kernel<T, VEC, 2><<<grid, threads, 0, stream>>>(dy, x, w, rstd, dx, workspace, rows, cols); break;
    case 4: rmsnorm_bwd_kernel<T, VEC, 4><<<grid, threads, 0, stream>>>(dy, x, w, rstd, dx, workspace, rows, cols); break;
    default: rmsnorm_bwd_kernel<T, VEC, 8><<<grid, threads, 0, stream>>>(dy, x, w, rstd, dx, workspace, rows, cols);
  }
  CUDA_CHECK_LAUNCH();
  launch_column_finish<T, VEC>(workspace, dw, nullptr, nullptr, blocks, cols, stream);
}

}  // namespace

void rmsnorm_fwd(DType dt, const void* x, const void* weight, float eps, void* y, float* rstd, int64_t rows,
                 int64_t cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  ACTBENCH_DISPATCH_FLOAT(dt, "rmsnorm_fwd", T, {
    constexpr int kVec = 16 / sizeof(T);
    const T* xt = static_cast<const T*>(x);
    const T* wt = static_cast<const T*>(weight);
    T* yt = static_cast<T*>(y);
    if (cols % kVec == 0 && pack::aligned16(x) && pack::aligned16(weight) && pack::aligned16(y))
      rmsnorm_fwd_vec<T, kVec>(xt, wt, eps, yt, rstd, rows, cols, stream);
    else
      rmsnorm_fwd_vec<T, 1>(xt, wt, eps, yt, rstd, rows, cols, stream);
  });
}

int64_t rmsnorm_bwd_workspace_floats(int64_t rows, int64_t cols) {
  // the fused kernel's partial rows (one per block), or the long rows' column chunks
  const int64_t fused = fused_bwd_blocks(rows) * cols, chunked = column_sums_workspace_floats(rows, cols, true);
  return fused > chunked ? fused : chunked;
}

void rmsnorm_bwd(DType dt, const void* dy, const void* x, const void* weight, const float* rstd, void* dx,
                 void* dweight, float* workspace, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (cols == 0) return;
  ACTBENCH_DISPATCH_FLOAT(dt, "rmsnorm_bwd", T, {
    constexpr int kVec = 16 / sizeof(T);
    const T* g = static_cast<const T*>(dy);
    const T* xt = static_cast<const T*>(x);
    const T* wt = static_cast<const T*>(weight);
    T* dxt = static_cast<T*>(dx);
    T* dwt = static_cast<T*>(dweight);
    if (cols % kVec == 0 && pack::aligned16(dy) && pack::aligned16(x) && pack::aligned16(weight) &&
        pack::aligned16(dx) && pack::aligned16(dweight) && pack::aligned16(workspace))
      rmsnorm_bwd_vec<T, kVec>(g, xt, wt, rstd, dxt, dwt, workspace, rows, cols, stream);
    else
      rmsnorm_bwd_vec<T, 1>(g, xt, wt, rstd, dxt, dwt, workspace, rows, cols, stream);
  });
}

void rope(DType dt, const void* x, void* y, int64_t rows, int64_t S, int64_t D, int64_t rotary_dim, double theta,
          bool inverse, const SeqPositions& positions, cudaStream_t stream) {
  if (rows == 0 || rotary_dim == 0) return;
  const int64_t passed = x == y ? 0 : D - rotary_dim, half = rotary_dim / 2;
  if (half + passed > (int64_t{1} << 30)) throw InvalidArgument("rope: head size too large");
  const double sign = inverse ? -1.0 : 1.0;
  ACTBENCH_DISPATCH_FLOAT(dt, "rope", T, {
    constexpr int kVec = 16 / sizeof(T);
    const T* xt = static_cast<const T*>(x);
    T* yt = static_cast<T*>(y);
    if (half % kVec == 0 && passed % kVec == 0 && D % kVec == 0 && pack::aligned16(x) && pack::aligned16(y)) {
      const dim3 block = rows_block((half + passed) / kVec);
      rope_kernel<T, kVec><<<rows_grid(rows, block), block, 0, stream>>>(xt, yt, rows, S, D, rotary_dim, passed,
                                                                          theta, sign, positions);
    } else {
      const dim3 block = rows_block(half + passed);
      rope_kernel<T, 1><<<rows_grid(rows, block), block, 0, stream>>>(xt, yt, rows, S, D, rotary_dim, passed, theta,
                                                                       sign, positions);
    }
    CUDA_CHECK_LAUNCH();
  });
}

void swiglu_fwd(DType dt, const void* x, void* y, int64_t M, int64_t N, cudaStream_t stream) {
  if (M * N == 0) return;
  ACTBENCH_DISPATCH_FLOAT(dt, "swiglu_fwd", T, {
    constexpr int kVec = 16 / sizeof(T);
    const T* xt = static_cast<const T*>(x);
    T* yt = static_cast<T*>(y);
    if (N % kVec == 0 && pack::aligned16(x) && pack::aligned16(y)) {
      const dim3 block = rows_block(N / kVec);
      swiglu_fwd_kernel<T, kVec><<<rows_grid(M, block), block, 0, stream>>>(xt, yt, M, N);
    } else {
      const dim3 block = rows_block(N);
      swiglu_fwd_kernel<T, 1><<<rows_grid(M, block), block, 0, stream>>>(xt, yt, M, N);
    }
    CUDA_CHECK_LAUNCH();
  });
}

void swiglu_bwd(DType dt, const void* dy, const void* x, void* dx, int64_t M, int64_t N, cudaStream_t stream) {
  if (M * N == 0) return;
  ACTBENCH_DISPATCH_FLOAT(dt, "swiglu_bwd", T, {
    constexpr int kVec = 16 / sizeof(T);
    const T* dyt = static_cast<const T*>(dy);
    const T* xt = static_cast<const T*>(x);
    T* dxt = static_cast<T*>(dx);
    if (N % kVec == 0 && pack::aligned16(dy) && pack::aligned16(x) && pack::aligned16(dx)) {
      const dim3 block = rows_block(N / kVec);
      swiglu_bwd_kernel<T, kVec><<<rows_grid(M, block), block, 0, stream>>>(dyt, xt, dxt, M, N);
    } else {
      const dim3 block = rows_block(N);
      swiglu_bwd_kernel<T, 1><<<rows_grid(M, block), block, 0, stream>>>(dyt, xt, dxt, M, N);
    }
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace actbench::cuda
