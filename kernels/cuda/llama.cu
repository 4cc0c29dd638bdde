// The llama family's kernels: RMSNorm (forward, backward with the deterministic column
// reduction for dweight), rotate-half RoPE on all or the first dims of each head (forward and
// its inverse, in place allowed) and SwiGLU (forward, backward). The formulas of the cpu reference (kernels/cpu/cpu_backend.cpp)
// and of tools/numpy_layer.py; fp32 math, one rounding on store.
#include "kernels/cuda/column_reduce.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"

namespace actbench::cuda {
namespace {

// One block per row: rstd = 1 / sqrt(mean(x²) + eps); y = x * rstd * w.
template <class T>
__global__ void rmsnorm_fwd_kernel(const T* x, const T* w, float eps, T* y, float* rstd, int64_t rows, int64_t cols) {
  __shared__ float scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    float ss = 0.f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float v = to_float(xr[c]);
      ss += v * v;
    }
    const float rs = 1.f / sqrtf(block_sum(ss, scratch) / static_cast<float>(cols) + eps);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) y[r * cols + c] = from_float<T>(to_float(xr[c]) * rs * to_float(w[c]));
    if (threadIdx.x == 0) rstd[r] = rs;
  }
}

// dx = rstd * (g - xhat * mean(g * xhat)), g = dy * w, xhat = x * rstd. dx may alias dy.
template <class T>
__global__ void rmsnorm_bwd_dx_kernel(const T* dy, const T* x, const T* w, const float* rstd, T* dx, int64_t rows,
                                      int64_t cols) {
  __shared__ float scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float rs = rstd[r];
    float sgx = 0.f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      sgx += to_float(dy[r * cols + c]) * to_float(w[c]) * (to_float(x[r * cols + c]) * rs);
    const float mean_gx = block_sum(sgx, scratch) / static_cast<float>(cols);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float xhat = to_float(x[r * cols + c]) * rs;
      dx[r * cols + c] = from_float<T>(rs * (to_float(dy[r * cols + c]) * to_float(w[c]) - xhat * mean_gx));
    }
  }
}

// x [rows, D], row r at position r % S: pairs (i, i + R/2) of the first R = rotary_dim dims
// rotated by sign * p * theta^(-2i/R). The angle and its sine/cosine in double, like the cpu
// reference (positions reach 10^5 and more). Each row has `half` threads of pairs, then
// `passed` threads that copy dims R..R+passed-1 (passed = 0 in place: nothing to copy).
template <class T>
__global__ void rope_kernel(const T* x, T* y, int64_t rows, int64_t S, int64_t D, int64_t R, int64_t passed,
                            double theta, double sign) {
  const int64_t half = R / 2, per_row = half + passed, n = rows * per_row;
  for (int64_t e = global_thread(); e < n; e += grid_threads()) {
    const int64_t r = e / per_row, i = e % per_row;
    if (i >= half) {
      y[r * D + R + (i - half)] = x[r * D + R + (i - half)];
      continue;
    }
    const double exponent = -2.0 * static_cast<double>(i) / static_cast<double>(R);
    const double angle = static_cast<double>(r % S) * pow(theta, exponent);
    double sn, cs;
    sincos(angle, &sn, &cs);
    const float c = static_cast<float>(cs), s = static_cast<float>(sign * sn);
    const float lo = to_float(x[r * D + i]), hi = to_float(x[r * D + half + i]);
    y[r * D + i] = from_float<T>(lo * c - hi * s);
    y[r * D + half + i] = from_float<T>(hi * c + lo * s);
  }
}

// x [M, 2N] = [gate | up]; y [M, N] = silu(gate) * up.
template <class T>
__global__ void swiglu_fwd_kernel(const T* x, T* y, int64_t M, int64_t N) {
  for (int64_t e = global_thread(); e < M * N; e += grid_threads()) {
    const int64_t r = e / N, j = e % N;
    const float gate = to_float(x[r * 2 * N + j]), up = to_float(x[r * 2 * N + N + j]);
    y[e] = from_float<T>(gate / (1.f + expf(-gate)) * up);
  }
}

template <class T>
__global__ void swiglu_bwd_kernel(const T* dy, const T* x, T* dx, int64_t M, int64_t N) {
  for (int64_t e = global_thread(); e < M * N; e += grid_threads()) {
    const int64_t r = e / N, j = e % N;
    const float gate = to_float(x[r * 2 * N + j]), up = to_float(x[r * 2 * N + N + j]), g = to_float(dy[e]);
    const float sig = 1.f / (1.f + expf(-gate));
    dx[r * 2 * N + j] = from_float<T>(g * up * sig * (1.f + gate * (1.f - sig)));
    dx[r * 2 * N + N + j] = from_float<T>(g * gate * sig);
  }
}

unsigned row_threads(int64_t cols) {
  int64_t t = (cols + 31) / 32 * 32;
  return static_cast<unsigned>(t < 32 ? 32 : (t > 256 ? 256 : t));
}

}  // namespace

void rmsnorm_fwd(DType dt, const void* x, const void* weight, float eps, void* y, float* rstd, int64_t rows,
                 int64_t cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  ACTBENCH_DISPATCH_FLOAT(dt, "rmsnorm_fwd", T, {
    rmsnorm_fwd_kernel<T><<<row_blocks(rows), row_threads(cols), 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(weight), eps, static_cast<T*>(y), rstd, rows, cols);
    CUDA_CHECK_LAUNCH();
  });
}

int64_t rmsnorm_bwd_workspace_floats(int64_t rows, int64_t cols) { return column_sums_workspace_floats(rows, cols, true); }

void rmsnorm_bwd(DType dt, const void* dy, const void* x, const void* weight, const float* rstd, void* dx,
                 void* dweight, float* workspace, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (cols == 0) return;
  ACTBENCH_DISPATCH_FLOAT(dt, "rmsnorm_bwd", T, {
    const T* g = static_cast<const T*>(dy);
    const T* xv = static_cast<const T*>(x);
    // dweight first: dx may alias dy.
    column_sums<T, true>(g, xv, /*mean=*/nullptr, rstd, /*out_dy=*/nullptr, static_cast<T*>(dweight), workspace, rows,
                         cols, stream);
    if (rows > 0) {
      rmsnorm_bwd_dx_kernel<T><<<row_blocks(rows), row_threads(cols), 0, stream>>>(
          g, xv, static_cast<const T*>(weight), rstd, static_cast<T*>(dx), rows, cols);
      CUDA_CHECK_LAUNCH();
    }
  });
}

void rope(DType dt, const void* x, void* y, int64_t rows, int64_t S, int64_t D, int64_t rotary_dim, double theta,
          bool inverse, cudaStream_t stream) {
  if (rows == 0 || rotary_dim == 0) return;
  const int64_t passed = x == y ? 0 : D - rotary_dim, per_row = rotary_dim / 2 + passed;
  ACTBENCH_DISPATCH_FLOAT(dt, "rope", T, {
    rope_kernel<T><<<elementwise_blocks(rows * per_row), kElementwiseThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<T*>(y), rows, S, D, rotary_dim, passed, theta, inverse ? -1.0 : 1.0);
    CUDA_CHECK_LAUNCH();
  });
}

void swiglu_fwd(DType dt, const void* x, void* y, int64_t M, int64_t N, cudaStream_t stream) {
  if (M * N == 0) return;
  ACTBENCH_DISPATCH_FLOAT(dt, "swiglu_fwd", T, {
    swiglu_fwd_kernel<T><<<elementwise_blocks(M * N), kElementwiseThreads, 0, stream>>>(static_cast<const T*>(x),
                                                                                       static_cast<T*>(y), M, N);
    CUDA_CHECK_LAUNCH();
  });
}

void swiglu_bwd(DType dt, const void* dy, const void* x, void* dx, int64_t M, int64_t N, cudaStream_t stream) {
  if (M * N == 0) return;
  ACTBENCH_DISPATCH_FLOAT(dt, "swiglu_bwd", T, {
    swiglu_bwd_kernel<T><<<elementwise_blocks(M * N), kElementwiseThreads, 0, stream>>>(
        static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<T*>(dx), M, N);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace actbench::cuda
