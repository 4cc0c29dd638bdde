#pragma once
// Packs: kN consecutive elements a thread loads, converts and stores together. A wide pack is
// 16 bytes (kPack<T>: 8 bf16/fp16 or 4 fp32) moved by one uint4 access, the widest a thread
// can make: a warp's request then carries 512 contiguous bytes in 16 sectors, so a kernel
// issues a quarter of the requests of 4-byte lanes and an eighth of those of 2-byte lanes,
// and keeps more bytes in flight per instruction. A narrow pack (kWide false) reads and
// writes element by element: the path for rows whose length or start does not allow 16-byte
// alignment. The uint4 goes through a local so the compiler emits one access and the
// unpacking happens in registers. The u8 masks that go with a pack of 8 or 4 elements move
// as one 8- or 4-byte word.
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace actbench::cuda {

template <class T>
constexpr int kPack = static_cast<int>(16 / sizeof(T));

inline bool aligned_to(const void* p, uintptr_t bytes) { return (reinterpret_cast<uintptr_t>(p) % bytes) == 0; }

template <class T, int kN, bool kWide>
__device__ __forceinline__ void load_pack(const T* __restrict__ p, float (&v)[kN]) {
  if constexpr (kWide) {
    static_assert(kN == kPack<T>, "a wide pack is 16 bytes");
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int k = 0; k < kN; ++k) v[k] = to_float(e[k]);
  } else {
#pragma unroll
    for (int k = 0; k < kN; ++k) v[k] = to_float(p[k]);
  }
}

template <class T, int kN, bool kWide>
__device__ __forceinline__ void store_pack(T* __restrict__ p, const float (&v)[kN]) {
  if constexpr (kWide) {
    static_assert(kN == kPack<T>, "a wide pack is 16 bytes");
    uint4 raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int k = 0; k < kN; ++k) e[k] = from_float<T>(v[k]);
    *reinterpret_cast<uint4*>(p) = raw;
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
