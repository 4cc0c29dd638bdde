// Dropout: y = keep ? x / (1 - p) : 0 with the Philox mask of the CPU reference (u8, 1 = kept).
// Each thread owns a pack of consecutive elements (packs.cuh): with 16-byte packs (8 bf16/fp16
// or 4 fp32; spec.inner and its runs of positions multiples of the pack, 16-byte aligned tensors) a pack is one 16-byte
// load of x, one 16-byte store of y and one 8- or 4-byte store of the mask, and its Philox
// words come from one call per 4 elements at a canonical index the thread carries from pack
// to pack (dropout_common.cuh), so the loop divides nothing. Other shapes take narrow packs of
// 4 (dropout_groups_of(spec, 4)) or 1 element.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda/dropout_common.cuh"
#include "kernels/cuda/packs.cuh"

namespace actbench::cuda {
namespace {

template <class T, int kN, bool kWide>
__global__ void dropout_fwd_kernel(const T* __restrict__ x, DropoutSpec spec, uint32_t threshold, float scale,
                                   T* __restrict__ y, uint8_t* __restrict__ mask, int64_t n) {
  dropout_for_each<kN>(spec, threshold, n, [&](int64_t i, const uint8_t(&keep)[kN]) {
    float v[kN];
    load_pack<T, kN, kWide>(x + i, v);
#pragma unroll
    for (int k = 0; k < kN; ++k) v[k] = keep[k] ? v[k] * scale : 0.f;
    store_pack<T, kN, kWide>(y + i, v);
    store_mask<kN, kWide>(mask + i, keep);
  });
}

// Packs of kN elements, then the n % kN elements left, one per thread.
template <class T, int kN, bool kWide>
__global__ void dropout_bwd_kernel(const T* __restrict__ dy, const uint8_t* __restrict__ mask, float scale,
                                   T* __restrict__ dx, int64_t n) {
  const int64_t packs = n / kN;
  for (int64_t p = global_thread(); p < packs; p += grid_threads()) {
    const int64_t i = p * kN;
    float g[kN];
    uint8_t m[kN];
    load_pack<T, kN, kWide>(dy + i, g);
    load_mask<kN, kWide>(mask + i, m);
#pragma unroll
    for (int k = 0; k < kN; ++k) g[k] = m[k] ? g[k] * scale : 0.f;
    store_pack<T, kN, kWide>(dx + i, g);
  }
  const int64_t i = packs * kN + global_thread();
  if (i < n) dx[i] = from_float<T>(mask[i] ? to_float(dy[i]) * scale : 0.f);
}

template <class T, int kN, bool kWide>
void launch_fwd(const T* x, const DropoutSpec& spec, T* y, uint8_t* mask, cudaStream_t stream) {
  const int64_t n = spec.numel();
  dropout_fwd_kernel<T, kN, kWide><<<elementwise_blocks(n, kN), kElementwiseThreads, 0, stream>>>(
      x, spec, dropout_threshold(spec.p), spec.scale(), y, mask, n);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void fwd(const T* x, const DropoutSpec& spec, T* y, uint8_t* mask, cudaStream_t stream) {
  constexpr int kW = kPack<T>;
  if (dropout_groups_of(spec, kW) && aligned_to(x, 16) && aligned_to(y, 16) && aligned_to(mask, kW))
    launch_fwd<T, kW, true>(x, spec, y, mask, stream);
  else if (dropout_groups_of(spec, 4))
    launch_fwd<T, 4, false>(x, spec, y, mask, stream);
  else
    launch_fwd<T, 1, false>(x, spec, y, mask, stream);
}

template <class T>
void bwd(const T* dy, const uint8_t* mask, float scale, T* dx, int64_t n, cudaStream_t stream) {
  constexpr int kW = kPack<T>;
  if (aligned_to(dy, 16) && aligned_to(dx, 16) && aligned_to(mask, kW))
    dropout_bwd_kernel<T, kW, true><<<elementwise_blocks(n, kW), kElementwiseThreads, 0, stream>>>(dy, mask, scale,
                                                                                                  dx, n);
  else
    dropout_bwd_kernel<T, 1, false><<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(dy, mask, scale, dx, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void dropout_fwd(DType dt, const void* x, const DropoutSpec& spec, void* y, uint8_t* mask, cudaStream_t stream) {
  if (spec.numel() == 0) return;
  ACTBENCH_DISPATCH_FLOAT(dt, "dropout_fwd", T,
                          fwd<T>(static_cast<const T*>(x), spec, static_cast<T*>(y), mask, stream));
}

void dropout_bwd(DType dt, const void* dy, const uint8_t* mask, float scale, void* dx, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  ACTBENCH_DISPATCH_FLOAT(dt, "dropout_bwd", T,
                          bwd<T>(static_cast<const T*>(dy), mask, scale, static_cast<T*>(dx), n, stream));
}

}  // namespace actbench::cuda
