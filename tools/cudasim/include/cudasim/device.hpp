#pragma once
// What simulated kernel code sees: the thread's coordinates, barriers, warp collectives and
// the launcher that the build-time rewrite puts where `kernel<<<...>>>(args)` was.
// Semantics follow the CUDA C++ Programming Guide for sm_70 and later (independent thread
// scheduling): a barrier completes when every thread of the block that has not exited has
// arrived; a warp collective completes when every lane named in its mask has arrived at a
// collective of the same kind and mask. Every misuse is reported with file:line.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

namespace cudasim {

namespace detail {

// The running simulated thread (null outside kernels).
struct ThreadInfo {
  uint3 tid;
};
extern ThreadInfo* current;
extern uint3 block_idx;
extern dim3 block_dim, grid_dim;

inline const uint3& thread_idx() { return current->tid; }

enum class WarpOp : int {
  shfl, shfl_up, shfl_down, shfl_xor, ballot, any, all, syncwarp, activemask,
  // The tensor-core collectives of kernels/cuda/mma.cuh (below): every lane of the warp, one
  // call site; `value` points at the lane's operands.
  mma_bf16, mma_fp16, ldmatrix, ldmatrix_trans
};
// One lane's part of a warp collective: blocks until it completes and returns the lane's
// result (raw bits, up to 8 bytes).
uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int arg, int width, const char* file, int line);

// ---- tensor cores: what kernels/cuda/mma.cuh calls under the simulator ----
// One lane's part of mma.sync.aligned.m16n8k16.row.col.f32.<in>.<in>.f32 (in: bf16 or fp16):
// a, b, c are the lane's fragments of A (16x16, row-major), B (16x8, column-major) and C
// (16x8, fp32) as the PTX ISA lays them out; d receives its fragment of D = A * B + C (d may
// be c). Blocks until every lane of the warp has arrived at the same call site.
enum class MmaInput : int { bf16, fp16 };
void mma_m16n8k16(MmaInput in, const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4], float (&d)[4],
                  const char* file, int line);
// ldmatrix.sync.aligned.m8n8.x<matrices>{.trans}.shared.b16, in two steps around the lane's
// own read of its row (kernel code, so that the race checker and the counters see it):
// ldmatrix_supplies_row says whether this lane supplies a row address (lanes 0-7 per matrix)
// and checks that address (16-byte aligned, 16 bytes of shared memory); ldmatrix_exchange
// hands the rows' words to the lanes that hold them (every lane of the warp, one call site).
bool ldmatrix_supplies_row(int matrices, const void* row, const char* file, int line);
void ldmatrix_exchange(int matrices, bool trans, const uint32_t (&row)[4], uint32_t* r, const char* file, int line);
// ---- cp.async: what kernels/cuda/async_copy.cuh calls under the simulator ----
// One lane's cp.async.cg.shared.global of 16 bytes from src to dst (reads = false: src-size
// 0, sixteen zero bytes, src neither read nor checked). Checks dst (16 bytes of shared memory,
// 16-byte aligned) and src (16-byte aligned, not shared memory); reads src now; lands at once
// or when a wait completes its group, as the schedule picks. The simulator makes the global
// read and the shared write itself, as accesses of the kernel's line file:line (the race
// checker and the counters see them there).
void cp_async(void* dst, const void* src, bool reads, const char* file, int line);
// cp.async.commit_group: the thread's copies since its last commit become one group.
void cp_async_commit();
// cp.async.wait_group pending: lands the thread's copies of every committed group but the
// `pending` most recent.
void cp_async_wait(int pending);
// atomicAdd on a float: the read-modify-write as one step (simulated threads run one at a
// time), which the race checker sees as an atomic access at `pc` (the kernel's call site):
// atomics of any threads of a launch do not race with each other, but do with plain accesses.
float atomic_add_f32(float* p, float v, const void* pc);
void syncthreads(const char* file, int line);
int syncthreads_count(int pred, const char* file, int line);

// Launches `thunk(ctx)` on every thread of the grid, validating like the driver; the error
// (or cudaSuccess) becomes what cudaGetLastError returns next.
void launch(const void* kernel, const char* kernel_name, const char* file, int line, dim3 grid, dim3 block,
            size_t smem, cudaStream_t stream, void (*thunk)(void*), void* ctx);

// A pointer parameter of the launch being made, for the stream log (src/stream_log.hpp): a
// pointer to const is read, any other may be written.
void launch_pointer(const void* p, bool writable);
template <class T>
void note_param(const T&) {}
template <class T>
void note_param(T* p) {
  launch_pointer(p, !std::is_const_v<T>);
}

template <class T>
uint64_t to_bits(T v) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "warp shuffles move values of at most 8 bytes");
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <class T>
T from_bits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}

}  // namespace detail

// The dynamic shared memory of the running block (`extern __shared__ T name[];`).
void* dynamic_shared();

template <class... P>
struct Launch {
  const char* file;
  int line;
  const char* name;
  void (*kernel)(P...);
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;

  template <class... A>
  void operator()(A&&... args) const {
    static_assert(sizeof...(A) == sizeof...(P), "kernel launched with the wrong number of arguments");
    // The kernel parameters, converted once as a call would; each thread gets its own copy.
    struct Call {
      void (*kernel)(P...);
      std::tuple<std::decay_t<P>...> params;
    } call{kernel, std::tuple<std::decay_t<P>...>(std::forward<A>(args)...)};
    std::apply([](const auto&... p) { (detail::note_param(p), ...); }, call.params);
    detail::launch(reinterpret_cast<const void*>(kernel), name, file, line, grid, block, smem, stream,
                   [](void* c) {
                     Call* cl = static_cast<Call*>(c);
                     std::apply(cl->kernel, cl->params);
                   },
                   &call);
  }
};

template <class... P>
Launch<P...> launcher(const char* file, int line, const char* name, void (*kernel)(P...), dim3 grid, dim3 block,
                      size_t smem = 0, cudaStream_t stream = nullptr) {
  return Launch<P...>{file, line, name, kernel, grid, block, smem, stream};
}

}  // namespace cudasim

// The runtime's C++ overload that cuda_runtime.h declares only under nvcc.
template <class T>
inline cudaError_t cudaFuncSetAttribute(T* func, cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(func), attr, value);
}

