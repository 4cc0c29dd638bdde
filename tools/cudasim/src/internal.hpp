#pragma once
// State shared by the simulator's translation units (not installed for kernels).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cudasim/counters.hpp"
#include "cudasim/device.hpp"
#include "cudasim/sim.hpp"

#if defined(__SANITIZE_ADDRESS__)
#define CUDASIM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CUDASIM_ASAN 1
#endif
#endif

namespace cudasim::internal {

// Device memory: [base - kFrontCanary, base) and [base + size, base + padded + kBackCanary)
// hold a pattern that is checked after every launch.
constexpr size_t kFrontCanary = 256, kBackCanary = 256;
constexpr unsigned char kCanaryByte = 0xCB;
constexpr unsigned char kPoisonByte = 0xFF;  // every float/bf16/fp16 made of it is a NaN
struct Allocation {
  uintptr_t base;
  size_t size;    // bytes asked for
  size_t padded;  // size rounded up to 256 (the rest is canary too)
  uint64_t id;
  void* raw;
};
std::map<uintptr_t, Allocation>& allocations();
// The allocation holding [p, p + n), or null.
const Allocation* find_allocation(const void* p, size_t n = 1);
// The allocation whose canaries or padding hold p (an out-of-bounds access), or null.
const Allocation* canary_owner(uintptr_t p);
std::string describe_address(uintptr_t p);

void add_report(const std::string& kind, const std::string& message);
void set_error(cudaError_t e);  // what the next cudaGetLastError returns
cudaError_t peek_error();
cudaError_t take_error();
bool valid_stream(cudaStream_t s);
int kernel_max_dynamic_smem(const void* kernel);
cudaError_t set_kernel_max_dynamic_smem(const void* kernel, int bytes);
void check_canaries(const char* when);

// ---- activity (cudasim/activity.hpp) ----
// One runtime API call, from entry to return: the outermost one on this thread is reported
// when it returns (a call made inside another, e.g. cudaMemcpy inside cudaMemcpyAsync, is
// part of that one), followed by the work it ran, which carries its correlation id. Costs two
// clock reads and one call of the activity functions per API call.
class ApiCall {
 public:
  explicit ApiCall(const char* function, cudaStream_t stream = nullptr) noexcept;
  ~ApiCall();
  ApiCall(const ApiCall&) = delete;
  ApiCall& operator=(const ApiCall&) = delete;
  // The work of the outermost call on this thread (only one piece per call). `kind` of a copy
  // is its direction (cudaMemcpyDefault resolved).
  static void kernel(const char* name, uint64_t start_ns, uint64_t end_ns, dim3 grid, dim3 block, size_t smem);
  static void memcpy(cudaMemcpyKind kind, size_t bytes, uint64_t start_ns, uint64_t end_ns);
  static void memset(int value, size_t bytes, uint64_t start_ns, uint64_t end_ns);

 private:
  bool outermost_;
};

// ---- tensor cores (tensor_core.cpp) ----
// One lane's operands and results of a tensor-core collective; the lane that completes the
// collective computes the warp's result over all 32 lanes (indexed by lane).
struct MmaLane {
  uint32_t a[4], b[2];
  float c[4], d[4];
};
struct LdmatrixLane {
  uint32_t row[4];  // the 16 bytes of the row this lane supplied (if it supplies one)
  uint32_t r[4];    // its destination registers, one per matrix
};
void mma_m16n8k16_warp(detail::MmaInput in, MmaLane* const (&lanes)[32]);
void ldmatrix_warp(int matrices, bool trans, LdmatrixLane* const (&lanes)[32]);

// ---- the running thread, for the race checker ----
enum class State : uint8_t { runnable, barrier, warp, exited };
// A cp.async not yet waited for (async_copy.cuh): group = the thread's commits before it (the
// group its next commit closes), complete at the wait_group that completes that group; landed:
// its bytes were written at its issue (the schedule's choice), else they are at that wait.
struct AsyncCopy {
  uintptr_t dst;
  uint4 data;
  uint32_t group;
  bool landed;
  const char* file;
  int line;
};
struct Thread : detail::ThreadInfo {
  int linear = 0, lane = 0, warp = 0;
  void* sp = nullptr;
  State state = State::runnable;
  const char* file = nullptr;  // where it waits
  int line = 0;
  detail::WarpOp op{};
  unsigned mask = 0;
  uint64_t value = 0, result = 0;
  int arg = 0, width = 32;
  int pred = 0;
  std::vector<AsyncCopy> copies;  // issued cp.async copies not yet waited for, in issue order
  uint32_t commits = 0;           // cp.async groups committed
  char* stack = nullptr;  // lowest usable byte
  void* fake_stack = nullptr;
};
struct Warp {
  uint32_t sync_epoch = 0;  // collectives completed by every live lane
  unsigned live = 0, exists = 0, arrived = 0;
};
struct RunningBlock {
  uint64_t launch_id = 0, linear = 0;
  uint32_t bar_epoch = 0;
  const char* kernel = "";
  const char* file = "";
  int line = 0;
  std::vector<Thread>* threads = nullptr;
  std::vector<Warp>* warps = nullptr;
  uintptr_t shared_lo = 0, shared_hi = 0;    // static __shared__ section
  uintptr_t dynamic_lo = 0, dynamic_hi = 0;  // dynamic shared memory [lo, hi), canary after
};
extern RunningBlock running;
inline Thread* current_thread() { return static_cast<Thread*>(detail::current); }

// Each simulated thread's own stack (its locals: every one an instrumented access at -O0).
#if defined(CUDASIM_ASAN)
constexpr size_t kFiberStackBytes = 256 * 1024;
#else
constexpr size_t kFiberStackBytes = 64 * 1024;
#endif
// Whether `a` lies on the running thread's stack: the hooks' fast path (neither device nor
// shared memory, so neither checked nor counted).
inline bool on_own_stack(const Thread* t, uintptr_t a) {
  return a - reinterpret_cast<uintptr_t>(t->stack) < kFiberStackBytes;
}
std::string thread_name(const Thread& t);
std::string block_name();

// Race checker (race.cpp; only in binaries built with the race checker).
void race_begin_launch();
void race_begin_block();
// Drops the shadow of [lo, hi) (a freed buffer with its canaries): 64 bytes of shadow per byte
// touched would otherwise outlive every buffer of a long run.
void race_forget(uintptr_t lo, uintptr_t hi);
// An atomic read-modify-write of [a, a + n) at pc (atomic_add_f32): checked against the plain
// accesses of other threads like a write, never against other atomics.
void race_atomic(uintptr_t a, size_t n, const void* pc);
// An access the simulator makes for kernel code (a cp.async's read and landing write), as the
// instrumentation hooks see one of kernel code: counted and race-checked at pc.
void kernel_access(uintptr_t a, size_t n, bool write, const void* pc);
// A cp.async's write of [a, a + n), in flight from its issue (at pc) until it lands: checked
// like a write when issued, and until race_async_land (called just before the landing write
// itself) every access of any thread to those bytes races with it, barriers or not.
void race_async_issue(uintptr_t a, size_t n, const void* pc);
void race_async_land(uintptr_t a, size_t n);
// cudasim::set_race_checks.
bool race_set_checks(bool on);

// Source "file:line" of a code address (symbolize.cpp; addr2line, cached). symbolize_all
// fills the cache for many addresses at once.
std::string symbolize(const void* pc);
void symbolize_all(const std::vector<const void*>& pcs);
// A stand-in code address for the source line file:line (one per line), which symbolize
// answers with "file:line": what the simulator's own accesses on behalf of kernel code (cp.async)
// are attributed to in reports and the counters' per-line table.
const void* source_site(const char* file, int line);
// The name of the function at `fn` (templates instantiated, from the symbol table); empty when
// unknown.
std::string function_name(const void* fn);
// The static __shared__ variables of the running binary, from its symbol table (nm): address
// in this process and declared size, ordered by address; empty when it cannot be read.
struct SharedVariable {
  uintptr_t address;
  size_t size;
};
const std::vector<SharedVariable>& static_shared_variables();

// A CSV field, quoted when it holds a comma, a quote or a newline (counters.cpp).
std::string csv_field(const std::string& s);

// Memory-access counters (counters.cpp, cudasim/counters.hpp): fed by the instrumentation
// hooks, so only in binaries whose kernels are instrumented (the race variant); elsewhere the
// engine's calls are no-ops. count_access: one load or store as emitted; count_block_copy: a
// memcpy/memset range, split as a GPU compiler would. The engine ends a warp's stretch of
// converged execution (flush_warp: a collective naming every live lane completed, or its last
// lane exited) or every warp's (flush_block: a barrier released, the block ended).
#if defined(CUDASIM_RACE)
void count_access(uintptr_t a, size_t n, bool write, const void* pc);
void count_block_copy(uintptr_t a, size_t n, bool write, const void* pc);
void counters_begin_launch();
void counters_begin_block();
void counters_flush_warp(int warp);
void counters_flush_block();
void counters_end_launch(const void* kernel, dim3 grid, dim3 block, size_t smem, uint64_t blocks_run,
                         uint64_t sample);
// CUDASIM_KERNEL_REPORT (kernel_report.cpp): open_ checks the variables and the file (one line
// and exit 2 when refused) and returns whether the report is asked for; add_ sums a launch.
bool open_env_kernel_report();
void add_to_env_kernel_report(const ::cudasim::LaunchCounts& launch);
#else
inline void counters_begin_launch() {}
inline void counters_begin_block() {}
inline void counters_flush_warp(int) {}
inline void counters_flush_block() {}
inline void counters_end_launch(const void*, dim3, dim3, size_t, uint64_t, uint64_t) {}
#endif

}  // namespace cudasim::internal
