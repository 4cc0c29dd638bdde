#pragma once
// Tensor-core primitives: mma.sync m16n8k16 (bf16 or fp16 in, fp32 accumulate) and ldmatrix
// .m8n8 (one, two or four 8x8 matrices of 16-bit elements, optionally transposed). Under nvcc
// they are the PTX instructions (sm_80 and newer). Under the simulator (tools/cudasim,
// cudasim.h force-included) they are warp collectives that give every lane the elements the
// PTX ISA's fragment layouts give it, and check what the hardware leaves undefined: the whole
// warp at one call site, ldmatrix row addresses 16-byte aligned in shared memory. Layouts,
// checks and the simulator's accumulation order: tools/cudasim/README.md, "Tensor cores".
//
// Fragments, per lane (groupID g = lane / 4, t = lane % 4; a 32-bit register holds two
// elements, the lower-numbered in its low half):
//   A (16x16, row-major)    uint32_t a[4]: a[r] = row g + 8 * (r % 2), columns 2t + 8 * (r / 2) + {0, 1}
//   B (16x8, column-major)  uint32_t b[2]: b[r] = rows 2t + 8r + {0, 1}, column g
//   C, D (16x8, fp32)       float c[4]:    c[i] = row g + 8 * (i / 2), column 2t + i % 2
//   ldmatrix                uint32_t r[N]: r[m] = row g, columns 2t + {0, 1} of matrix m, whose
//                           row j starts at the address lane 8m + j passes (lanes 0-7, 0-15 or
//                           0-31 for N = 1, 2, 4; the other lanes' addresses are not used);
//                           ldmatrix_trans: rows 2t + {0, 1}, column g of matrix m instead.
#include <cstdint>

#if defined(__CUDACC__)
#include <cuda_runtime.h>
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "kernels/cuda/mma.cuh: mma.sync.m16n8k16 with bf16 inputs needs sm_80 or newer"
#endif
#elif !defined(CUDASIM_KERNEL_CODE)
#error "kernels/cuda/mma.cuh is for nvcc or the simulator (tools/cudasim)"
#endif

namespace actbench::cuda {

#if defined(__CUDACC__)

// D = A * B + C; d may be c (the instruction reads every operand before it writes).
__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                                  const float (&c)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}
__device__ __forceinline__ void mma_m16n8k16_fp16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                                  const float (&c)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

namespace mma_detail {
// The "memory" clobber keeps the compiler from moving this thread's own stores to the rows
// past the load (the asm reads memory the compiler does not see).
template <bool Trans, int N>
__device__ __forceinline__ void ldmatrix(uint32_t (&r)[N], const void* row) {
  static_assert(N == 1 || N == 2 || N == 4, "ldmatrix loads 1, 2 or 4 matrices");
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  if constexpr (N == 1 && !Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(a) : "memory");
  else if constexpr (N == 1)
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(a) : "memory");
  else if constexpr (N == 2 && !Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(a)
                 : "memory");
  else if constexpr (N == 2)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(a)
                 : "memory");
  else if constexpr (!Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}
}  // namespace mma_detail

// N (1, 2 or 4) 8x8 matrices of 16-bit elements from shared memory; `row`: this lane's row
// address (16-byte aligned), used from lanes 0 to 8N - 1.
template <int N>
__device__ __forceinline__ void ldmatrix(uint32_t (&r)[N], const void* row) {
  mma_detail::ldmatrix<false>(r, row);
}
template <int N>
__device__ __forceinline__ void ldmatrix_trans(uint32_t (&r)[N], const void* row) {
  mma_detail::ldmatrix<true>(r, row);
}

#else  // the simulator: warp collectives (tools/cudasim/src/tensor_core.cpp)

inline void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4],
                              const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  ::cudasim::detail::mma_m16n8k16(::cudasim::detail::MmaInput::bf16, a, b, c, d, file, line);
}
inline void mma_m16n8k16_fp16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4],
                              const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  ::cudasim::detail::mma_m16n8k16(::cudasim::detail::MmaInput::fp16, a, b, c, d, file, line);
}

namespace mma_detail {
// Each lane that supplies a row reads it here, one 16-byte shared-memory load in kernel code,
// so that the race checker and the counters see the reads as the hardware makes them (8 rows
// of 16 bytes per matrix); the collective then hands every lane its elements.
template <int N>
inline void ldmatrix(uint32_t (&r)[N], const void* row, bool trans, const char* file, int line) {
  static_assert(N == 1 || N == 2 || N == 4, "ldmatrix loads 1, 2 or 4 matrices");
  uint32_t words[4] = {0, 0, 0, 0};
  if (::cudasim::detail::ldmatrix_supplies_row(N, row, file, line)) {
    const uint4 v = *static_cast<const uint4*>(row);
    words[0] = v.x;
    words[1] = v.y;
    words[2] = v.z;
    words[3] = v.w;
  }
  ::cudasim::detail::ldmatrix_exchange(N, trans, words, r, file, line);
}
}  // namespace mma_detail

template <int N>
inline void ldmatrix(uint32_t (&r)[N], const void* row, const char* file = __builtin_FILE(),
                     int line = __builtin_LINE()) {
  mma_detail::ldmatrix(r, row, false, file, line);
}
template <int N>
inline void ldmatrix_trans(uint32_t (&r)[N], const void* row, const char* file = __builtin_FILE(),
                           int line = __builtin_LINE()) {
  mma_detail::ldmatrix(r, row, true, file, line);
}

#endif

}  // namespace actbench::cuda
