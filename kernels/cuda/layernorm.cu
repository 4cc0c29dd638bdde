// LayerNorm over the last dim of x [rows, cols]: one block per row, fp32 statistics
// (two-pass mean then variance, like the reference), 16-byte loads when every row is
// 16-byte aligned. dweight/dbias: the deterministic two-stage column reduction.
#include "kernels/cuda/column_reduce.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"

namespace actbench::cuda {
namespace {

// VEC consecutive elements as floats: one 16-byte transaction when VEC > 1.
template <class T, int VEC>
__device__ __forceinline__ void load_pack(const T* p, float (&v)[VEC]) {
  if constexpr (VEC == 1) {
    v[0] = to_float(*p);
  } else {
    static_assert(sizeof(T) * VEC == 16, "a pack is 16 bytes");
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[k] = to_float(e[k]);
  }
}
template <class T, int VEC>
__device__ __forceinline__ void store_pack(T* p, const float (&v)[VEC]) {
  if constexpr (VEC == 1) {
    *p = from_float<T>(v[0]);
  } else {
    uint4 raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int k = 0; k < VEC; ++k) e[k] = from_float<T>(v[k]);
    *reinterpret_cast<uint4*>(p) = raw;
  }
}

template <class T, int VEC>
__global__ void layernorm_fwd_kernel(const T* x, const T* w, const T* b,
                                     float eps, T* y, float* mean,
                                     float* rstd, int64_t rows, int64_t cols) {
  __shared__ float scratch[32];
  const int64_t packs = cols / VEC;
  const float n = static_cast<float>(cols);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    float s = 0.f;
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      float v[VEC];
      load_pack<T, VEC>(xr + p * VEC, v);
#pragma unroll
      for (int k = 0; k < VEC; ++k) s += v[k];
    }
    const float mu = block_sum(s, scratch) / n;
    float ss = 0.f;
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      float v[VEC];
      load_pack<T, VEC>(xr + p * VEC, v);
#pragma unroll
      for (int k = 0; k < VEC; ++k) ss += (v[k] - mu) * (v[k] - mu);
    }
    const float rs = 1.f / sqrtf(block_sum(ss, scratch) / n + eps);
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      float v[VEC], wv[VEC], bv[VEC], out[VEC];
      load_pack<T, VEC>(xr + p * VEC, v);
      load_pack<T, VEC>(w + p * VEC, wv);
      load_pack<T, VEC>(b + p * VEC, bv);
#pragma unroll
      for (int k = 0; k < VEC; ++k) out[k] = (v[k] - mu) * rs * wv[k] + bv[k];
      store_pack<T, VEC>(y + r * cols + p * VEC, out);
    }
    if (threadIdx.x == 0) {
      mean[r] = mu;
      rstd[r] = rs;
    }
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w, per row.
template <class T, int VEC>
__global__ void layernorm_bwd_dx_kernel(const T* dy, const T* x, const T* w,
                                        const float* mean, const float* rstd,
                                        T* dx, int64_t rows, int64_t cols) {
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
      load_pack<T, VEC>(dyr + p * VEC, g);
      load_pack<T, VEC>(xr + p * VEC, xv);
      load_pack<T, VEC>(w + p * VEC, wv);
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
      load_pack<T, VEC>(dyr + p * VEC, g);
      load_pack<T, VEC>(xr + p * VEC, xv);
      load_pack<T, VEC>(w + p * VEC, wv);
#pragma unroll
      for (int k = 0; k < VEC; ++k) out[k] = rs * (g[k] * wv[k] - mean_g - ((xv[k] - mu) * rs) * mean_gx);
      store_pack<T, VEC>(dx + r * cols + p * VEC, out);
    }
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// One warp per 32 packs up to 256 threads: short rows do not idle most of a block.
unsigned row_threads(int64_t packs) {
  int64_t t = (packs + 31) / 32 * 32;
  return static_cast<unsigned>(t < 32 ? 32 : (t > 256 ? 256 : t));
}

template <class T>
void fwd(const T* x, const T* w, const T* b, float eps, T* y, float* mean, float* rstd, int64_t rows, int64_t cols,
         cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  if (cols % kVec == 0 && aligned16(x) && aligned16(w) && aligned16(b) && aligned16(y)) {
    layernorm_fwd_kernel<T, kVec><<<row_blocks(rows), row_threads(cols / kVec), 0, stream>>>(x, w, b, eps, y, mean,
                                                                                             rstd, rows, cols);
  } else {
    layernorm_fwd_kernel<T, 1><<<row_blocks(rows), row_threads(cols), 0, stream>>>(x, w, b, eps, y, mean, rstd, rows,
                                                                                   cols);
  }
  CUDA_CHECK_LAUNCH();
}

template <class T>
void bwd(const T* dy, const T* x, const T* w, const float* mean, const float* rstd, T* dx, T* dw, T* db,
         float* workspace, int64_t rows, int64_t cols, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  if (rows > 0) {
    if (cols % kVec == 0 && aligned16(dy) && aligned16(x) && aligned16(w) && aligned16(dx)) {
      layernorm_bwd_dx_kernel<T, kVec><<<row_blocks(rows), row_threads(cols / kVec), 0, stream>>>(dy, x, w, mean, rstd,
                                                                                                  dx, rows, cols);
    } else {
      layernorm_bwd_dx_kernel<T, 1><<<row_blocks(rows), row_threads(cols), 0, stream>>>(dy, x, w, mean, rstd, dx, rows,
                                                                                        cols);
    }
    CUDA_CHECK_LAUNCH();
  }
  column_sums<T, true>(dy, x, mean, rstd, db, dw, workspace, rows, cols, stream);
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
  return column_sums_workspace_floats(rows, cols, true);
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
