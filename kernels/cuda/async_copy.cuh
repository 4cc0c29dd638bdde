#pragma once
// Asynchronous copies from global to shared memory (cp.async, sm_80 and newer): a tile's loads
// are issued and the thread goes on computing while they fly, without registers to stage them
// in, which is what lets a kernel prefetch the next tile beside a large accumulator.
//
//   cp_async_16(dst, src, reads)  cp.async.cg.shared.global [dst], [src], 16, reads ? 16 : 0:
//                                 16 bytes, both addresses 16-byte aligned, dst in shared
//                                 memory; reads = false writes 16 zero bytes and reads nothing
//                                 (src must still be a valid pointer, never dereferenced)
//   cp_async_commit()             cp.async.commit_group: the copies issued since the last
//                                 commit become one group
//   cp_async_wait<N>()            cp.async.wait_group N: every committed group but the N most
//                                 recent has landed (for this thread's copies only: other
//                                 threads see them after a barrier, as any store)
//
// Under nvcc these are the PTX instructions. Under the simulator (tools/cudasim, cudasim.h
// force-included) they are its own: the copy's global read is made at the issue, and the copy
// lands at its issue or at the wait that completes its group, whichever end the schedule
// picks; the race checker and the counters see the read and the write as accesses of the
// caller's line, and until the landing any access to those bytes is a race. A thread that
// exits with copies it never waited for is reported. Semantics and checks:
// tools/cudasim/README.md, "cp.async".
#include <cstdint>

#if defined(__CUDACC__)
#include <cuda_runtime.h>
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "kernels/cuda/async_copy.cuh: cp.async needs sm_80 or newer"
#endif
#elif !defined(CUDASIM_KERNEL_CODE)
#error "kernels/cuda/async_copy.cuh is for nvcc or the simulator (tools/cudasim)"
#endif

namespace actbench::cuda {

#if defined(__CUDACC__)

__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool reads) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  // .cg: through L2 only (a tile is read once per block; L1 would only be evicted by it).
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(reads ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

#else  // the simulator: tools/cudasim/src/sim.cpp

inline void cp_async_16(void* dst, const void* src, bool reads, const char* file = __builtin_FILE(),
                        int line = __builtin_LINE()) {
  ::cudasim::detail::cp_async(dst, src, reads, file, line);
}
inline void cp_async_commit() { ::cudasim::detail::cp_async_commit(); }
template <int N>
inline void cp_async_wait() {
  static_assert(N >= 0, "wait_group takes a count of groups");
  ::cudasim::detail::cp_async_wait(N);
}

#endif

}  // namespace actbench::cuda
