#pragma once
// 16-byte packs of storage elements: the widest global access a lane can make, so that a warp
// request moves 512 bytes (16 sectors, none wasted when the pack is 16-byte aligned) and a
// kernel issues a quarter of the requests of 4-byte lanes, an eighth of those of 2-byte lanes.
// Kernels take the VEC = 16 / sizeof(T) path when every row start is 16-byte aligned and
// VEC = 1 (one element per lane) otherwise, with the same code. The uint4 goes through a local
// so the compiler emits one access and the unpacking happens in registers.
#include <cstdint>

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

// The same packs for the elementwise kernels (softmax, dropout, the residual ops), which name a
// pack by its element count kN and whether it is wide (one 16-byte access) or narrow (kN
// element accesses: rows whose length or start does not allow 16-byte alignment), and move the
// u8 dropout mask of a pack of 8 or 4 elements as one 8- or 4-byte word.
namespace actbench::cuda {

template <class T>
constexpr int kPack = static_cast<int>(16 / sizeof(T));

inline bool aligned_to(const void* p, uintptr_t bytes) { return (reinterpret_cast<uintptr_t>(p) % bytes) == 0; }

template <class T, int kN, bool kWide>
__device__ __forceinline__ void load_pack(const T* __restrict__ p, float (&v)[kN]) {
  if constexpr (kWide) {
    pack::load<T, kN>(p, v);
  } else {
#pragma unroll
    for (int k = 0; k < kN; ++k) v[k] = to_float(p[k]);
  }
}

template <class T, int kN, bool kWide>
__device__ __forceinline__ void store_pack(T* __restrict__ p, const float (&v)[kN]) {
  if constexpr (kWide) {
    pack::store<T, kN>(p, v);
  } else {
#pragma unroll
    for (int k = 0; k < kN; ++k) p[k] = from_float<T>(v[k]);
  }
}

// The u8 word of a wide pack's mask: 8 bytes for 8 elements, 4 for 4.
template <int kN>
struct MaskWordOf;
template <>
struct MaskWordOf<8> {
  using type = uint64_t;
};
template <>
struct MaskWordOf<4> {
  using type = uint32_t;
};

template <int kN, bool kWide>
__device__ __forceinline__ void load_mask(const uint8_t* __restrict__ p, uint8_t (&m)[kN]) {
  if constexpr (kWide) {
    using Word = typename MaskWordOf<kN>::type;
    const Word w = *reinterpret_cast<const Word*>(p);
    const uint8_t* b = reinterpret_cast<const uint8_t*>(&w);
#pragma unroll
    for (int k = 0; k < kN; ++k) m[k] = b[k];
  } else {
#pragma unroll
    for (int k = 0; k < kN; ++k) m[k] = p[k];
  }
}

template <int kN, bool kWide>
__device__ __forceinline__ void store_mask(uint8_t* __restrict__ p, const uint8_t (&m)[kN]) {
  if constexpr (kWide) {
    using Word = typename MaskWordOf<kN>::type;
    Word w;
    uint8_t* b = reinterpret_cast<uint8_t*>(&w);
#pragma unroll
    for (int k = 0; k < kN; ++k) b[k] = m[k];
    *reinterpret_cast<Word*>(p) = w;
  } else {
#pragma unroll
    for (int k = 0; k < kN; ++k) p[k] = m[k];
  }
}

}  // namespace actbench::cuda
