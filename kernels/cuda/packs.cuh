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

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace actbench::cuda::pack
