#pragma once
// 16-byte packs of storage elements: the widest global access a lane can make, so that a warp
// request moves 512 bytes (16 sectors, none wasted when the pack is 16-byte aligned). Kernels
// take the VEC = 16 / sizeof(T) path when every row start is 16-byte aligned and VEC = 1 (one
// element per lane) otherwise, with the same code. (Its own namespace: pack::load, pack::store,
// pack::aligned16 do not meet a kernel file's local helpers.)
#include "kernels/cuda/common.cuh"

namespace actbench::cuda::pack {

// VEC storage elements as floats: one 16-byte access when VEC > 1 (p must be 16-byte aligned).
template <class T, int VEC>
__device__ __forceinline__ void load(const T* p, float (&v)[VEC]) {
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
__device__ __forceinline__ void store(T* p, const float (&v)[VEC]) {
  if constexpr (VEC == 1) {
    *p = from_float<T>(v[0]);
  } else {
    static_assert(sizeof(T) * VEC == 16, "a pack is 16 bytes");
    uint4 raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int k = 0; k < VEC; ++k) e[k] = from_float<T>(v[k]);
    *reinterpret_cast<uint4*>(p) = raw;
  }
}

// VEC elements copied as raw bits (NaN payloads kept).
template <class T, int VEC>
__device__ __forceinline__ void copy(T* dst, const T* src) {
  if constexpr (VEC == 1)
    *dst = *src;
  else
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }


// Row kernels that keep a whole row in registers: a block of up to kMaxRowThreads threads,
// each owning PACKS packs of the row.
constexpr int kMaxRowThreads = 1024;

// The packs a thread owns: p = threadIdx.x + k * blockDim.x for k < PACKS (a warp's k-th packs
// are 32 consecutive 16-byte packs: 512 contiguous bytes per request). The same columns in every
// row of the block, so weights and column partials stay in registers.
__device__ __forceinline__ int64_t owned(int k) { return threadIdx.x + static_cast<int64_t>(k) * blockDim.x; }

// Threads for a row of `packs` packs at `per_thread` packs each: whole warps, at least one.
inline unsigned row_threads(int64_t packs, int per_thread) {
  const int64_t t = ((packs + per_thread - 1) / per_thread + 31) / 32 * 32;
  return static_cast<unsigned>(t < 32 ? 32 : t);
}
// Packs per thread so that a row fits one block of at most kMaxRowThreads: 1, 2, 4 or 8; 0 when
// the row is longer (the long-row kernels).
inline int per_thread(int64_t packs) {
  for (int per : {1, 2, 4, 8})
    if (packs <= static_cast<int64_t>(per) * kMaxRowThreads) return per;
  return 0;
}
}  // namespace actbench::cuda::pack
