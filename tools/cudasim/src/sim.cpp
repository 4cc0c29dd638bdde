// The simulator's execution engine: each CUDA thread of a block is a fiber with
// its own mmap'd stack (guard page below); a fiber runs until it reaches a
// barrier, a warp collective or its end, then the scheduler picks the next
// runnable one. Blocks run one after another. Context switches are a few
// instructions of x86-64 assembly (callee-saved registers, MXCSR and the x87
// control word): ucontext would make a system call per switch.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cudasim/activity.hpp"
#include "internal.hpp"

#if defined(CUDASIM_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if !defined(__x86_64__)
#error "cudasim's fibers are written for x86-64"
#endif

// void cudasim_switch(void** save_sp, void* next_sp): saves this context's
// stack pointer to *save_sp and continues the one whose stack pointer is
// next_sp. cudasim_fiber_start: first code of a fresh fiber; calls r13(r12)
// (which never returns).
asm(R"(
  .text
  .globl cudasim_switch
  .type cudasim_switch, @function
cudasim_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size cudasim_switch, .-cudasim_switch

  .globl cudasim_fiber_start
  .type cudasim_fiber_start, @function
cudasim_fiber_start:
  movq %r12, %rdi
  callq *%r13
  ud2
  .size cudasim_fiber_start, .-cudasim_fiber_start
)");
extern "C" void cudasim_switch(void** save_sp, void* next_sp);
extern "C" void cudasim_fiber_start();

// Static __shared__ variables (cudasim.h puts them in this section; absent when
// no kernel has any).
extern "C" char __start_cudasim_shared[] __attribute__((weak));
extern "C" char __stop_cudasim_shared[] __attribute__((weak));

namespace cudasim {
namespace detail {
ThreadInfo* current = nullptr;
uint3 block_idx{0, 0, 0};
dim3 block_dim{1, 1, 1}, grid_dim{1, 1, 1};
}  // namespace detail

namespace internal {
RunningBlock running;
}

using namespace internal;

namespace {

constexpr size_t kStackBytes = kFiberStackBytes;

// ---- settings
// -------------------------------------------------------------------------------

#ifndef CUDASIM_PRINT_REPORTS
#define CUDASIM_PRINT_REPORTS 0
#endif

const DeviceLimits kLimits[] = {
    // name, cc, SMs, 48 KiB default, opt-in per block, per SM, memory
    {"cuda-sim (h100 limits)", 9, 0, 132, 48 * 1024, 227 * 1024, 228 * 1024, 80ull << 30},
    {"cuda-sim (a100 limits)", 8, 0, 108, 48 * 1024, 163 * 1024, 164 * 1024, 80ull << 30},
    {"cuda-sim (sm86 limits)", 8, 6, 82, 48 * 1024, 99 * 1024, 100 * 1024, 24ull << 30},
};

struct Settings {
  DeviceModel device = DeviceModel::h100;
  Schedule schedule = Schedule::round_robin;
  uint64_t seed = 1;
  uint64_t block_sample = 1;  // run every block_sample-th block (set_block_sample)
  Settings() {
    if (const char* n = std::getenv("CUDASIM_BLOCK_SAMPLE")) {
      char* end = nullptr;
      errno = 0;
      const unsigned long long v = std::strtoull(n, &end, 10);
      if (!*n || *end || errno || v < 1 || n[0] == '-' || n[0] == '+') {
        std::fprintf(stderr, "cudasim: error: CUDASIM_BLOCK_SAMPLE=%s is not a whole number >= 1\n", n);
        std::exit(2);
      }
      block_sample = v;
    }
    if (const char* d = std::getenv("CUDASIM_DEVICE")) {
      const std::string s = d;
      if (s == "h100")
        device = DeviceModel::h100;
      else if (s == "a100")
        device = DeviceModel::a100;
      else if (s == "sm86")
        device = DeviceModel::sm86;
      else {
        std::fprintf(stderr,
                     "cudasim: error: CUDASIM_DEVICE=%s is not one of h100, "
                     "a100, sm86\n",
                     d);
        std::exit(2);
      }
    }
    if (const char* s = std::getenv("CUDASIM_SCHEDULE")) {
      const std::string v = s;
      if (v == "rr")
        schedule = Schedule::round_robin;
      else if (v == "greedy")
        schedule = Schedule::greedy;
      else if (v.rfind("random", 0) == 0) {
        schedule = Schedule::random;
        if (v.size() > 7 && v[6] == ':') seed = std::strtoull(v.c_str() + 7, nullptr, 10);
      } else {
        std::fprintf(stderr,
                     "cudasim: error: CUDASIM_SCHEDULE=%s is not one of rr, "
                     "greedy, random[:seed]\n",
                     s);
        std::exit(2);
      }
    }
#if !defined(CUDASIM_RACE)
    for (const char* var : {"CUDASIM_COUNTERS", "CUDASIM_KERNEL_REPORT"})
      if (const char* c = std::getenv(var)) {
        std::fprintf(stderr,
                     "cudasim: error: %s=%s: this binary's kernels are not instrumented; the counters "
                     "exist in the race variant (build/cudasim/test_cudasim_*_race)\n",
                     var, c);
        std::exit(2);
      }
#endif
  }
};
Settings& settings() {
  static Settings s;
  return s;
}

std::vector<Report>& report_list() {
  static std::vector<Report> r;
  return r;
}
std::function<bool(uint64_t)>& block_filter() {
  static std::function<bool(uint64_t)> f;
  return f;
}
LaunchStats g_stats;
uint64_t g_launches = 0;
cudaError_t g_last_error = cudaSuccess;
std::map<const void*, int>& kernel_smem() {
  static std::map<const void*, int> m;
  return m;
}

// ---- fibers
// ---------------------------------------------------------------------------------

struct StackPool {
  std::vector<char*> stacks;  // lowest usable byte of each; a PROT_NONE guard page below
  size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  char* get(size_t i) {
    while (stacks.size() <= i) {
      void* m =
          mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (m == MAP_FAILED) {
        std::perror("cudasim: mmap of a fiber stack");
        std::abort();
      }
      mprotect(m, page, PROT_NONE);
      stacks.push_back(static_cast<char*>(m) + page);
    }
    return stacks[i];
  }
};
StackPool& stack_pool() {
  static StackPool p;
  return p;
}

#if !defined(CUDASIM_ASAN)
// A simulated thread that overflows its fiber stack hits the guard page below it: say so (with
// the kernel and thread) instead of dying of a bare SIGSEGV. ASan builds have ASan's handler.
char g_signal_stack[64 * 1024];
struct sigaction g_previous_segv;
void on_segv(int sig, siginfo_t* info, void* uctx) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(info->si_addr);
  for (char* s : stack_pool().stacks) {
    const uintptr_t lo = reinterpret_cast<uintptr_t>(s) - stack_pool().page, hi = reinterpret_cast<uintptr_t>(s);
    if (a >= lo && a < hi && detail::current) {
      const Thread* t = static_cast<const Thread*>(detail::current);
      char msg[512];
      const int n = std::snprintf(msg, sizeof msg,
                                  "cudasim: stack overflow: thread (%u,%u,%u) of block (%u,%u,%u) of %s launched at "
                                  "%s:%d used more than the %zu KiB of a simulated thread's stack\n",
                                  t->tid.x, t->tid.y, t->tid.z, detail::block_idx.x, detail::block_idx.y,
                                  detail::block_idx.z, running.kernel, running.file, running.line, kStackBytes / 1024);
      if (n > 0) (void)!write(2, msg, static_cast<size_t>(n < 512 ? n : 511));
      break;
    }
  }
  sigaction(SIGSEGV, &g_previous_segv, nullptr);  // the fault repeats and ends the process as before
  (void)sig;
  (void)uctx;
}
void install_overflow_handler() {
  static bool done = false;
  if (done) return;
  done = true;
  stack_t ss{};
  ss.ss_sp = g_signal_stack;
  ss.ss_size = sizeof g_signal_stack;
  sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &g_previous_segv);
}
#else
void install_overflow_handler() {}
#endif

struct Block {
  std::vector<Thread> threads;
  std::vector<Warp> warps;
  int live = 0, at_barrier = 0;
  size_t greedy_hint = 0, rr_cursor = 0;
  bool aborted = false;
  bool stacks_dirty = false;  // an aborted block left frames on the stacks
  void (*thunk)(void*) = nullptr;
  void* ctx = nullptr;
  void* sched_sp = nullptr;
  void* sched_fake = nullptr;
  const void* sched_bottom = nullptr;
  size_t sched_size = 0;
  uint64_t rng = 1;
};
Block g_block;
std::vector<unsigned char> g_dynamic;  // dynamic shared memory of the running launch (+ canary)

[[noreturn]] void fiber_exit(Thread* t);

extern "C" void cudasim_fiber_main(void* arg) {
  Thread* t = static_cast<Thread*>(arg);
#if defined(CUDASIM_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &g_block.sched_bottom, &g_block.sched_size);
#endif
  g_block.thunk(g_block.ctx);
  fiber_exit(t);
}

// From a fiber back to the scheduler (the fiber continues here when picked
// again).
void yield(Thread* t, bool dying = false) {
#if defined(CUDASIM_ASAN)
  __sanitizer_start_switch_fiber(dying ? nullptr : &t->fake_stack, g_block.sched_bottom, g_block.sched_size);
#endif
  cudasim_switch(&t->sp, g_block.sched_sp);
#if defined(CUDASIM_ASAN)
  __sanitizer_finish_switch_fiber(t->fake_stack, nullptr, nullptr);
#endif
  (void)dying;
}

void resume(Thread* t) {
  detail::current = t;
  ++g_stats.switches;
#if defined(CUDASIM_ASAN)
  __sanitizer_start_switch_fiber(&g_block.sched_fake, t->stack, kStackBytes);
#endif
  cudasim_switch(&g_block.sched_sp, t->sp);
#if defined(CUDASIM_ASAN)
  __sanitizer_finish_switch_fiber(g_block.sched_fake, nullptr, nullptr);
#endif
  detail::current = nullptr;
}

void init_fiber(Thread& t, char* stack) {
  t.stack = stack;
  char* top = stack + kStackBytes;
#if defined(CUDASIM_ASAN)
  // A fiber that ran to its end leaves only its first frame poisoned; an
  // aborted one, any.
  if (g_block.stacks_dirty)
    __asan_unpoison_memory_region(stack, kStackBytes);
  else
    __asan_unpoison_memory_region(top - 8192, 8192);
#endif
  uint64_t* sp = reinterpret_cast<uint64_t*>(top - 16 - 64);
  sp[0] = 0x1F80ull | (0x037Full << 32);                    // MXCSR default, x87 control word default
  sp[1] = 0;                                                // r15
  sp[2] = 0;                                                // r14
  sp[3] = reinterpret_cast<uint64_t>(&cudasim_fiber_main);  // r13
  sp[4] = reinterpret_cast<uint64_t>(&t);                   // r12
  sp[5] = 0;                                                // rbx
  sp[6] = 0;                                                // rbp
  sp[7] = reinterpret_cast<uint64_t>(&cudasim_fiber_start);
  t.sp = sp;
}

std::string site(const char* file, int line) { return std::string(file ? file : "?") + ":" + std::to_string(line); }

const char* op_name(detail::WarpOp op) {
  switch (op) {
    case detail::WarpOp::shfl:
      return "__shfl_sync";
    case detail::WarpOp::shfl_up:
      return "__shfl_up_sync";
    case detail::WarpOp::shfl_down:
      return "__shfl_down_sync";
    case detail::WarpOp::shfl_xor:
      return "__shfl_xor_sync";
    case detail::WarpOp::ballot:
      return "__ballot_sync";
    case detail::WarpOp::any:
      return "__any_sync";
    case detail::WarpOp::all:
      return "__all_sync";
    case detail::WarpOp::syncwarp:
      return "__syncwarp";
    case detail::WarpOp::activemask:
      return "__activemask";
    case detail::WarpOp::mma_bf16:
      return "mma.sync.m16n8k16 (bf16)";
    case detail::WarpOp::mma_fp16:
      return "mma.sync.m16n8k16 (fp16)";
    case detail::WarpOp::ldmatrix:
      return "ldmatrix.sync.m8n8";
    case detail::WarpOp::ldmatrix_trans:
      return "ldmatrix.sync.m8n8.trans";
  }
  return "?";
}

// The tensor-core collectives (.sync.aligned): every lane of the warp executes the same
// instruction, so the same call site, not merely the same kind of collective.
bool tensor_core_op(detail::WarpOp op) {
  return op == detail::WarpOp::mma_bf16 || op == detail::WarpOp::mma_fp16 || op == detail::WarpOp::ldmatrix ||
         op == detail::WarpOp::ldmatrix_trans;
}

// Runs a completed tensor-core collective of `warp`: each lane's `value` points at its
// operands (MmaLane, LdmatrixLane), `arg` is the number of matrices of an ldmatrix.
void complete_tensor_core_op(detail::WarpOp op, int warp, int arg) {
  const auto operands = [&](int lane) { return reinterpret_cast<void*>(g_block.threads[warp * 32 + lane].value); };
  if (op == detail::WarpOp::mma_bf16 || op == detail::WarpOp::mma_fp16) {
    MmaLane* lanes[32];
    for (int l = 0; l < 32; ++l) lanes[l] = static_cast<MmaLane*>(operands(l));
    mma_m16n8k16_warp(op == detail::WarpOp::mma_bf16 ? detail::MmaInput::bf16 : detail::MmaInput::fp16, lanes);
  } else {
    LdmatrixLane* lanes[32];
    for (int l = 0; l < 32; ++l) lanes[l] = static_cast<LdmatrixLane*>(operands(l));
    ldmatrix_warp(arg, op == detail::WarpOp::ldmatrix_trans, lanes);
  }
}

std::string where(const Thread& t) {
  switch (t.state) {
    case State::runnable:
      return "is running";
    case State::exited:
      return "has exited";
    case State::barrier:
      return "waits at __syncthreads " + site(t.file, t.line);
    case State::warp:
      return "waits at " + std::string(op_name(t.op)) + " " + site(t.file, t.line);
  }
  return "?";
}

std::string hex(unsigned v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08x", v);
  return b;
}

std::string kernel_header() {
  return std::string(running.kernel) + " launched at " + site(running.file, running.line) + ", block " + block_name();
}

// Stops the block (its fibers are abandoned) and returns to the scheduler.
// Callers make the report first, in a statement of its own, so that no string
// is left alive on the abandoned stack.
[[noreturn]] void abort_block(Thread* t) {
  g_block.aborted = true;
  g_block.stacks_dirty = true;
  for (;;) yield(t);
}

void release_barrier_if_complete() {
  Block& b = g_block;
  if (b.at_barrier == 0 || b.at_barrier != b.live) return;
  // Every live thread waits: they must wait at the same __syncthreads.
  const Thread* first = nullptr;
  std::string diverged;
  int sites = 0;
  for (Thread& t : b.threads) {
    if (t.state != State::barrier) continue;
    if (!first)
      first = &t;
    else if (t.line != first->line || std::strcmp(t.file, first->file) != 0) {
      if (sites++ < 3) diverged += "\n  thread " + thread_name(t) + " waits at __syncthreads " + site(t.file, t.line);
    }
  }
  if (sites > 0) {
    add_report("divergence", "barrier divergence in " + kernel_header() +
                                 ": threads wait at different __syncthreads\n  thread " + thread_name(*first) +
                                 " waits at __syncthreads " + site(first->file, first->line) + diverged);
    b.aborted = true;
    b.stacks_dirty = true;
    return;
  }
  ++running.bar_epoch;
  ++g_stats.barriers;
  counters_flush_block();
  for (Thread& t : b.threads)
    if (t.state == State::barrier) t.state = State::runnable;
  b.at_barrier = 0;
  b.greedy_hint = 0;
}

[[noreturn]] void fiber_exit(Thread* t) {
  Block& b = g_block;
  if (!t->copies.empty()) {
    // Stricter than the hardware, which lands them anyway: nothing can know when they land,
    // so nothing may read them; a kernel that means to drop a copy should not issue it. Once
    // per launch: every thread of the kernel usually does the same.
    static uint64_t reported_launch = 0;
    const AsyncCopy& c = t->copies.back();
    if (reported_launch != running.launch_id)
      add_report("async", "thread " + thread_name(*t) + " of " + kernel_header() + " exits with " +
                              std::to_string(t->copies.size()) + " cp.async copies never waited for (the last issued at " +
                              site(c.file, c.line) + "); other threads may too");
    reported_launch = running.launch_id;
    t->copies.clear();
  }
  t->state = State::exited;
  --b.live;
  Warp& w = b.warps[t->warp];
  const unsigned bit = 1u << t->lane;
  w.live &= ~bit;
  if (w.live == 0) counters_flush_warp(t->warp);
  // A lane that leaves while others of its warp wait for it at a collective:
  // they never complete.
  for (int l = 0; l < 32; ++l) {
    if (!(w.exists & (1u << l))) continue;
    Thread& o = b.threads[t->warp * 32 + l];
    if (o.state == State::warp && (o.mask & bit) && o.op != detail::WarpOp::activemask) {
      add_report("warp", "warp collective with an exited lane in " + kernel_header() + ":\n  thread " + thread_name(o) +
                             " waits at " + op_name(o.op) + " " + site(o.file, o.line) + " (mask " + hex(o.mask) +
                             ") for lane " + std::to_string(t->lane) + ", thread " + thread_name(*t) +
                             ", which has exited");
      b.aborted = true;
      b.stacks_dirty = true;
      break;
    }
  }
  if (!b.aborted) release_barrier_if_complete();
  for (;;) yield(t, true);
}

Thread* pick() {
  Block& b = g_block;
  const size_t n = b.threads.size();
  switch (settings().schedule) {
    case Schedule::greedy:
      for (size_t i = b.greedy_hint; i < n; ++i)
        if (b.threads[i].state == State::runnable) {
          b.greedy_hint = i;
          return &b.threads[i];
        }
      b.greedy_hint = n;
      return nullptr;
    case Schedule::random: {
      size_t count = 0;
      for (const Thread& t : b.threads) count += t.state == State::runnable;
      if (count == 0) return nullptr;
      b.rng ^= b.rng << 13;
      b.rng ^= b.rng >> 7;
      b.rng ^= b.rng << 17;
      size_t k = b.rng % count;
      for (Thread& t : b.threads)
        if (t.state == State::runnable && k-- == 0) return &t;
      return nullptr;
    }
    case Schedule::round_robin:
    default:
      for (size_t k = 0; k < n; ++k) {
        const size_t i = (b.rr_cursor + k) % n;
        if (b.threads[i].state == State::runnable) {
          b.rr_cursor = i + 1;
          return &b.threads[i];
        }
      }
      return nullptr;
  }
}

void report_deadlock() {
  Block& b = g_block;
  std::string msg = "deadlock in " + kernel_header() + ": no thread can continue";
  int lines = 0;
  std::set<std::string> seen;
  for (Thread& t : b.threads) {
    if (t.state != State::warp || lines >= 6) continue;
    const Warp& w = b.warps[t.warp];
    const unsigned missing = t.mask & ~w.arrived;
    std::string line = "\n  thread " + thread_name(t) + " waits at " + op_name(t.op) + " " + site(t.file, t.line) +
                       " (mask " + hex(t.mask) + ")";
    for (int l = 0; l < 32; ++l) {
      if (!(missing & (1u << l))) continue;
      const Thread& o = b.threads[t.warp * 32 + l];
      line += " for lane " + std::to_string(l) + ", thread " + thread_name(o) + ", which " + where(o);
      break;
    }
    const std::string key = site(t.file, t.line) + line.substr(line.find(" (mask"));
    if (seen.insert(key).second) {
      msg += line;
      ++lines;
    }
  }
  std::map<std::string, int> barrier_sites;
  for (Thread& t : b.threads)
    if (t.state == State::barrier) ++barrier_sites[site(t.file, t.line)];
  for (auto& [s, count] : barrier_sites)
    msg += "\n  " + std::to_string(count) + " thread(s) wait at __syncthreads " + s;
  add_report("deadlock", msg);
}

// Block sampling (set_block_sample): of every `n` consecutive blocks the middle one runs; a grid
// of fewer blocks than n/2 runs its last block. Every launch runs at least one block.
bool sampled(uint64_t linear, uint64_t nblocks) {
  const uint64_t n = settings().block_sample;
  if (n <= 1) return true;
  return linear % n == std::min(n / 2, nblocks - 1);
}

bool run_block(uint64_t linear) {
  Block& b = g_block;
  const unsigned bx = detail::block_dim.x, by = detail::block_dim.y;
  const size_t n = static_cast<size_t>(bx) * by * detail::block_dim.z;
  running.linear = linear;
  running.bar_epoch = 0;
  b.threads.assign(n, Thread{});
  b.warps.assign((n + 31) / 32, Warp{});
  running.threads = &b.threads;
  running.warps = &b.warps;
  b.live = static_cast<int>(n);
  b.at_barrier = 0;
  b.greedy_hint = 0;
  b.rr_cursor = 0;
  b.aborted = false;
  for (size_t i = 0; i < n; ++i) {
    Thread& t = b.threads[i];
    t.tid = uint3{static_cast<unsigned>(i % bx), static_cast<unsigned>((i / bx) % by),
                  static_cast<unsigned>(i / (static_cast<size_t>(bx) * by))};
    t.linear = static_cast<int>(i);
    t.lane = static_cast<int>(i % 32);
    t.warp = static_cast<int>(i / 32);
    b.warps[t.warp].exists |= 1u << t.lane;
    b.warps[t.warp].live |= 1u << t.lane;
  }
  const bool dirty = b.stacks_dirty;
  for (size_t i = 0; i < n; ++i) init_fiber(b.threads[i], stack_pool().get(i));
  if (dirty) b.stacks_dirty = false;

  // Shared memory starts as NaN in every block: an element read before any
  // thread wrote it shows.
  if (+__start_cudasim_shared && +__stop_cudasim_shared > +__start_cudasim_shared)
    std::memset(__start_cudasim_shared, kPoisonByte,
                static_cast<size_t>(__stop_cudasim_shared - __start_cudasim_shared));
  const size_t dyn = running.dynamic_hi - running.dynamic_lo;
  std::memset(g_dynamic.data(), kPoisonByte, dyn);
#if defined(CUDASIM_RACE)
  race_begin_block();
#endif
  counters_begin_block();
  ++g_stats.blocks_run;
  g_stats.threads_run += n;

  for (;;) {
    Thread* t = pick();
    if (!t) break;
    resume(t);
    if (b.aborted) break;
  }
  if (!b.aborted && b.live > 0) {
    report_deadlock();
    b.aborted = true;
    b.stacks_dirty = true;
  }
  counters_flush_block();
  // Writes past the end of dynamic shared memory.
#if defined(CUDASIM_ASAN)
  __asan_unpoison_memory_region(g_dynamic.data() + dyn, g_dynamic.size() - dyn);
#endif
  for (size_t i = dyn; i < g_dynamic.size(); ++i) {
    if (g_dynamic[i] != kCanaryByte) {
      add_report("canary", "dynamic shared memory overrun in " + kernel_header() + ": byte " + std::to_string(i - dyn) +
                               " past the " + std::to_string(dyn) + " bytes of the launch was written");
      g_dynamic[i] = kCanaryByte;
      b.aborted = true;
      break;
    }
  }
#if defined(CUDASIM_ASAN)
  __asan_poison_memory_region(g_dynamic.data() + dyn, g_dynamic.size() - dyn);
#endif
  return !b.aborted;
}

}  // namespace

// ---- device-side entry points
// ------------------------------------------------------------------

namespace detail {

float atomic_add_f32(float* p, float v, const void* pc) {
#if defined(CUDASIM_RACE)
  internal::race_atomic(reinterpret_cast<uintptr_t>(p), sizeof(float), pc);
#else
  (void)pc;
#endif
  const float old = *p;
  *p = old + v;
  return old;
}

void syncthreads(const char* file, int line) {
  Thread* t = current_thread();
  t->state = State::barrier;
  t->file = file;
  t->line = line;
  t->pred = 0;
  ++g_block.at_barrier;
  release_barrier_if_complete();
  if (g_block.aborted)
    for (;;) yield(t);
  if (t->state == State::barrier) yield(t);
}

int syncthreads_count(int pred, const char* file, int line) {
  Thread* t = current_thread();
  // The count is the sum over threads of their predicate at this barrier.
  t->pred = pred != 0;
  t->state = State::barrier;
  t->file = file;
  t->line = line;
  ++g_block.at_barrier;
  static int last_count = 0;
  if (g_block.at_barrier == g_block.live) {
    int c = 0;
    for (Thread& o : g_block.threads)
      if (o.state == State::barrier) c += o.pred;
    last_count = c;
  }
  release_barrier_if_complete();
  if (g_block.aborted)
    for (;;) yield(t);
  if (t->state == State::barrier) yield(t);
  return last_count;
}

uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int arg, int width, const char* file, int line) {
  Thread* t = current_thread();
  Block& b = g_block;
  Warp& w = b.warps[t->warp];
  const unsigned bit = 1u << t->lane;
  if (op == WarpOp::activemask) return w.live;
  auto here = [&] { return std::string(op_name(op)) + " " + site(file, line); };
  if (!(mask & bit)) {
    add_report("warp", "bad warp collective in " + kernel_header() + ": thread " + thread_name(*t) + " calls " +
                           here() + " with mask " + hex(mask) + ", which does not name its own lane " +
                           std::to_string(t->lane));
    abort_block(t);
  }
  if ((op == WarpOp::shfl || op == WarpOp::shfl_up || op == WarpOp::shfl_down || op == WarpOp::shfl_xor) &&
      (width < 1 || width > 32 || (width & (width - 1)) != 0)) {
    add_report("warp", "bad warp collective in " + kernel_header() + ": thread " + thread_name(*t) + " calls " +
                           here() + " with width " + std::to_string(width) + " (a power of two <= 32 is required)");
    abort_block(t);
  }
  const unsigned gone = mask & ~w.live;
  if (gone) {
    int l = __builtin_ctz(gone);
    const bool exists = w.exists & (1u << l);
    {
      add_report("warp", "warp collective with an exited lane in " + kernel_header() + ": thread " + thread_name(*t) +
                             " calls " + here() + " with mask " + hex(mask) + ", but lane " + std::to_string(l) +
                             (exists ? " (thread " + thread_name(b.threads[t->warp * 32 + l]) + ") has exited"
                                     : " does not exist (the block ends before it)"));
      abort_block(t);
    }
  }
  t->state = State::warp;
  t->op = op;
  t->mask = mask;
  t->value = value;
  t->arg = arg;
  t->width = width;
  t->file = file;
  t->line = line;
  w.arrived |= bit;

  if ((w.arrived & mask) == mask) {
    // Everyone named has arrived: same collective and mask, or the warp has
    // diverged.
    for (int l = 0; l < 32; ++l) {
      if (!(mask & (1u << l))) continue;
      Thread& o = b.threads[t->warp * 32 + l];
      const bool same_site = o.line == line && std::strcmp(o.file, file) == 0;
      if (o.op != op || o.mask != mask || (tensor_core_op(op) && (!same_site || o.arg != arg))) {
        add_report("divergence", "warp divergence in " + kernel_header() + ":\n  thread " + thread_name(*t) +
                                     " calls " + here() + " with mask " + hex(mask) + "\n  thread " + thread_name(o) +
                                     " calls " + op_name(o.op) + " " + site(o.file, o.line) + " with mask " +
                                     hex(o.mask));
        abort_block(t);
      }
    }
    if (tensor_core_op(op)) complete_tensor_core_op(op, t->warp, arg);
    uint64_t vote = 0;
    for (int l = 0; l < 32; ++l)
      if ((mask & (1u << l)) && b.threads[t->warp * 32 + l].value) vote |= 1ull << l;
    std::string bad_read;
    for (int l = 0; l < 32; ++l) {
      if (!(mask & (1u << l))) continue;
      Thread& o = b.threads[t->warp * 32 + l];
      int src = l;
      const int wd = o.width, seg = l / wd * wd;
      switch (op) {
        case WarpOp::shfl:
          src = seg + (((o.arg % wd) + wd) % wd);
          break;
        case WarpOp::shfl_up:
          src = (l - seg) >= o.arg ? l - o.arg : l;
          break;
        case WarpOp::shfl_down:
          src = (l - seg) + o.arg < wd ? l + o.arg : l;
          break;
        case WarpOp::shfl_xor: {
          const int j = l ^ o.arg;
          src = (j >= 32 || j >= seg + wd) ? l : j;  // a later segment: the lane keeps its own value
          break;
        }
        default:
          break;
      }
      switch (op) {
        case WarpOp::ballot:
          o.result = vote;
          break;
        case WarpOp::any:
          o.result = vote != 0;
          break;
        case WarpOp::all:
          o.result = vote == mask;
          break;
        case WarpOp::syncwarp:
        case WarpOp::mma_bf16:
        case WarpOp::mma_fp16:
        case WarpOp::ldmatrix:
        case WarpOp::ldmatrix_trans:
          o.result = 0;
          break;
        default:
          if (src < 0 || src >= 32 || !(mask & (1u << src))) {
            if (bad_read.empty())
              bad_read = "thread " + thread_name(o) + " at " + here() + " (mask " + hex(mask) + ") reads lane " +
                         std::to_string(src) + ", which is not in the mask";
            o.result = ~0ull;
          } else {
            o.result = b.threads[t->warp * 32 + src].value;
          }
      }
      o.state = State::runnable;
      if (static_cast<size_t>(o.linear) < b.greedy_hint) b.greedy_hint = o.linear;
    }
    w.arrived &= ~mask;
    if ((mask & w.live) == w.live) {
      ++w.sync_epoch;
      counters_flush_warp(t->warp);
    }
    ++g_stats.warp_collectives;
    if (!bad_read.empty()) {
      add_report("warp", "undefined shuffle in " + kernel_header() + ": " + bad_read);
      bad_read.clear();
      bad_read.shrink_to_fit();  // nothing left on the heap from the abandoned stack
      abort_block(t);
    }
  }
  if (t->state == State::warp) yield(t);
  return t->result;
}

void mma_m16n8k16(MmaInput in, const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4], float (&d)[4],
                  const char* file, int line) {
  MmaLane lane;
  std::memcpy(lane.a, a, sizeof lane.a);
  std::memcpy(lane.b, b, sizeof lane.b);
  std::memcpy(lane.c, c, sizeof lane.c);
  warp_collective(in == MmaInput::bf16 ? WarpOp::mma_bf16 : WarpOp::mma_fp16, 0xffffffffu, to_bits(&lane), 0, 32, file,
                  line);
  std::memcpy(d, lane.d, sizeof lane.d);  // after the collective: d may be c
}

// cp.async (kernels/cuda/async_copy.cuh). The hardware lands a copy at some moment between
// its issue and the cp.async.wait_group that completes its group; the schedules take the two
// ends, so that a kernel that reads a copy too early (round-robin: at the wait, stale bytes
// until then) or issues one over bytes still being read (greedy: at the issue, over them)
// computes a wrong result; random picks either, per copy. In flight, its bytes are marked
// for the race checker (race variant), which reports any access to them before the landing.
static bool shared_range(uintptr_t a, size_t n) {
  return (a >= running.shared_lo && a + n <= running.shared_hi) ||
         (a >= running.dynamic_lo && a + n <= running.dynamic_hi);
}

// Reports a bad cp.async (and stops the block) or returns.
void check_cp_async(const void* dst, const void* src, bool reads, const char* file, int line) {
  Thread* t = current_thread();
  const uintptr_t d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
  const char* problem = d % 16 != 0                   ? "its shared-memory destination is not 16-byte aligned"
                        : !shared_range(d, 16)        ? "its destination does not hold 16 bytes of shared memory"
                        : reads && s % 16 != 0        ? "its global source is not 16-byte aligned"
                        : reads && shared_range(s, 1) ? "its source is in shared memory, not global memory"
                                                      : nullptr;
  if (!problem) return;
  char addresses[64];
  std::snprintf(addresses, sizeof addresses, "dst %#lx, src %#lx", static_cast<unsigned long>(d),
                static_cast<unsigned long>(s));
  add_report("async", "bad cp.async in " + kernel_header() + ": thread " + thread_name(*t) +
                          " at cp.async.cg.shared.global " + site(file, line) + " (" + addresses + "): " + problem);
  abort_block(t);
}

// The code address a cp.async's accesses are attributed to: its kernel line (race variant;
// elsewhere nothing reads it).
const void* copy_site(const char* file, int line) {
#if defined(CUDASIM_RACE)
  return source_site(file, line);
#else
  (void)file;
  (void)line;
  return nullptr;
#endif
}

// 16 bytes as the kernel's access at pc (field by field: no memcpy call, which the race
// variant would take for one of kernel code).
uint4 read16(uintptr_t a, const void* pc) {
#if defined(CUDASIM_RACE)
  kernel_access(a, 16, false, pc);
#else
  (void)pc;
#endif
  const uint4* p = reinterpret_cast<const uint4*>(a);
  return uint4{p->x, p->y, p->z, p->w};
}
void write16(uintptr_t a, const uint4& v, const void* pc) {
#if defined(CUDASIM_RACE)
  kernel_access(a, 16, true, pc);
#else
  (void)pc;
#endif
  uint4* p = reinterpret_cast<uint4*>(a);
  p->x = v.x;
  p->y = v.y;
  p->z = v.z;
  p->w = v.w;
}

// Whether a copy issued now lands now: greedy always, round-robin never, random by a coin.
bool lands_at_issue() {
  if (settings().schedule != Schedule::random) return settings().schedule == Schedule::greedy;
  Block& b = g_block;
  b.rng ^= b.rng << 13;
  b.rng ^= b.rng >> 7;
  b.rng ^= b.rng << 17;
  return b.rng & 1;
}

void cp_async(void* dst, const void* src, bool reads, const char* file, int line) {
  check_cp_async(dst, src, reads, file, line);
  Thread* t = current_thread();
  const void* pc = copy_site(file, line);
  const uintptr_t d = reinterpret_cast<uintptr_t>(dst);
  const uint4 data = reads ? read16(reinterpret_cast<uintptr_t>(src), pc) : uint4{0u, 0u, 0u, 0u};
  const bool now = lands_at_issue();
  if (now) {
    write16(d, data, pc);
  } else {
#if defined(CUDASIM_RACE)
    race_async_issue(d, 16, pc);
#endif
  }
  // Queued either way: the wait that completes it and a thread's exit before it count it.
  t->copies.push_back(AsyncCopy{d, data, t->commits, now, file, line});
}

void cp_async_commit() { ++current_thread()->commits; }

void cp_async_wait(int pending) {
  Thread* t = current_thread();
  // Groups 0 .. commits - 1 are committed; the `pending` most recent may stay in flight, the
  // open group (copies not yet committed) is not waited for.
  const int64_t done_below = static_cast<int64_t>(t->commits) - pending;
  size_t n = 0;
  for (; n < t->copies.size() && static_cast<int64_t>(t->copies[n].group) < done_below; ++n) {
    const AsyncCopy& c = t->copies[n];
    if (c.landed) continue;
#if defined(CUDASIM_RACE)
    race_async_land(c.dst, 16);
#endif
    write16(c.dst, c.data, copy_site(c.file, c.line));
  }
  t->copies.erase(t->copies.begin(), t->copies.begin() + static_cast<std::ptrdiff_t>(n));
}

bool ldmatrix_supplies_row(int matrices, const void* row, const char* file, int line) {
  Thread* t = current_thread();
  if (t->lane >= 8 * matrices) return false;  // its address is not used
  const uintptr_t a = reinterpret_cast<uintptr_t>(row);
  const char* problem = a % 16 != 0            ? "is not 16-byte aligned"
                        : !shared_range(a, 16) ? "does not hold 16 bytes of shared memory"
                                    : nullptr;
  if (!problem) return true;
  char address[32];
  std::snprintf(address, sizeof address, "%#lx", static_cast<unsigned long>(a));
  add_report("warp", "bad ldmatrix in " + kernel_header() + ": thread " + thread_name(*t) + " (lane " +
                         std::to_string(t->lane) + ") at ldmatrix.sync.m8n8.x" + std::to_string(matrices) + " " +
                         site(file, line) + " supplies row address " + address + ", which " + problem);
  abort_block(t);
}

void ldmatrix_exchange(int matrices, bool trans, const uint32_t (&row)[4], uint32_t* r, const char* file, int line) {
  LdmatrixLane lane{};
  std::memcpy(lane.row, row, sizeof lane.row);
  warp_collective(trans ? WarpOp::ldmatrix_trans : WarpOp::ldmatrix, 0xffffffffu, to_bits(&lane), matrices, 32, file,
                  line);
  std::memcpy(r, lane.r, sizeof(uint32_t) * static_cast<size_t>(matrices));
}

void launch(const void* kernel, const char* kernel_name, const char* file, int line, dim3 grid, dim3 block, size_t smem,
            cudaStream_t stream, void (*thunk)(void*), void* ctx) {
  // The launch is one cudaLaunchKernel call; a rejected one reports the call and no kernel.
  ApiCall call("cudaLaunchKernel", stream);
  ++g_launches;
  g_stats = LaunchStats{};
  if (current) {
    add_report("launch", std::string("kernel ") + kernel_name + " launched from device code at " + site(file, line) +
                             " (dynamic parallelism is not simulated)");
    set_error(cudaErrorNotSupported);
    return;
  }
  install_overflow_handler();
  if (!valid_stream(stream)) {
    set_error(cudaErrorInvalidResourceHandle);
    return;
  }
  const uint64_t threads = static_cast<uint64_t>(block.x) * block.y * block.z;
  if (block.x == 0 || block.y == 0 || block.z == 0 || block.x > 1024 || block.y > 1024 || block.z > 64 ||
      threads > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 ||
      grid.z > 65535) {
    set_error(cudaErrorInvalidConfiguration);
    return;
  }
  const size_t limit = static_cast<size_t>(kernel_max_dynamic_smem(kernel));
  if (smem > limit) {
    set_error(cudaErrorInvalidValue);
    return;
  }

  running.launch_id = g_launches;
  running.kernel = kernel_name;
  running.file = file;
  running.line = line;
  detail::grid_dim = grid;
  detail::block_dim = block;
  g_block.thunk = thunk;
  g_block.ctx = ctx;
  g_dynamic.assign(smem + kBackCanary, kCanaryByte);
  running.dynamic_lo = reinterpret_cast<uintptr_t>(g_dynamic.data());
  running.dynamic_hi = running.dynamic_lo + smem;
  running.shared_lo = reinterpret_cast<uintptr_t>(__start_cudasim_shared);
  running.shared_hi = reinterpret_cast<uintptr_t>(__stop_cudasim_shared);
#if defined(CUDASIM_ASAN)
  __asan_poison_memory_region(g_dynamic.data() + smem, kBackCanary);
#endif
#if defined(CUDASIM_RACE)
  race_begin_launch();
#endif
  counters_begin_launch();

  const uint64_t kernel_start_ns = activity::now_ns();
  const uint64_t nblocks = static_cast<uint64_t>(grid.x) * grid.y * grid.z;
  std::vector<uint64_t> order;
  if (settings().schedule == Schedule::random) {
    order.resize(nblocks);
    for (uint64_t i = 0; i < nblocks; ++i) order[i] = i;
    uint64_t r = settings().seed * 0x9E3779B97F4A7C15ull + g_launches;
    for (uint64_t i = nblocks; i > 1; --i) {
      r ^= r << 13;
      r ^= r >> 7;
      r ^= r << 17;
      std::swap(order[i - 1], order[r % i]);
    }
  }
  g_block.rng = settings().seed * 0x2545F4914F6CDD1Dull + g_launches;
  const size_t reports_before = report_list().size();
  bool ok = true;
  for (uint64_t k = 0; k < nblocks && ok; ++k) {
    const uint64_t linear = order.empty() ? k : order[k];
    if (block_filter() && !block_filter()(linear)) continue;
    if (!sampled(linear, nblocks)) continue;
    detail::block_idx = uint3{static_cast<unsigned>(linear % grid.x), static_cast<unsigned>((linear / grid.x) % grid.y),
                              static_cast<unsigned>(linear / (static_cast<uint64_t>(grid.x) * grid.y))};
    ok = run_block(linear);
  }
#if defined(CUDASIM_ASAN)
  __asan_unpoison_memory_region(g_dynamic.data() + smem, kBackCanary);
#endif
  ApiCall::kernel(kernel_name, kernel_start_ns, activity::now_ns(), grid, block, smem);
  check_canaries(kernel_name);
  counters_end_launch(kernel, grid, block, smem, g_stats.blocks_run, settings().block_sample);
  running.kernel = "";
  if (report_list().size() != reports_before) set_error(cudaErrorLaunchFailure);
}

}  // namespace detail

void* dynamic_shared() { return reinterpret_cast<void*>(running.dynamic_lo); }

// ---- internal helpers
// ---------------------------------------------------------------------------

namespace internal {

std::string thread_name(const Thread& t) {
  return "(" + std::to_string(t.tid.x) + "," + std::to_string(t.tid.y) + "," + std::to_string(t.tid.z) + ")";
}
std::string block_name() {
  const uint3 b = detail::block_idx;
  return "(" + std::to_string(b.x) + "," + std::to_string(b.y) + "," + std::to_string(b.z) + ")";
}

void add_report(const std::string& kind, const std::string& message) {
  report_list().push_back({kind, message});
  // The backend's simulator build prints every finding (a user's run has no test to ask).
  static const bool print = CUDASIM_PRINT_REPORTS || std::getenv("CUDASIM_VERBOSE");
  if (print) std::fprintf(stderr, "cudasim: %s: %s\n", kind.c_str(), message.c_str());
}

void set_error(cudaError_t e) { g_last_error = e; }
cudaError_t peek_error() { return g_last_error; }
cudaError_t take_error() {
  const cudaError_t e = g_last_error;
  g_last_error = cudaSuccess;
  return e;
}

int kernel_max_dynamic_smem(const void* kernel) {
  auto it = kernel_smem().find(kernel);
  return it == kernel_smem().end() ? static_cast<int>(device_limits().smem_per_block) : it->second;
}
cudaError_t set_kernel_max_dynamic_smem(const void* kernel, int bytes) {
  if (!kernel) return cudaErrorInvalidDeviceFunction;
  if (bytes < 0 || static_cast<size_t>(bytes) > device_limits().smem_per_block_optin) return cudaErrorInvalidValue;
  kernel_smem()[kernel] = bytes;
  return cudaSuccess;
}

}  // namespace internal

// ---- public controls
// ----------------------------------------------------------------------------

const DeviceLimits& device_limits() { return kLimits[static_cast<int>(settings().device)]; }
void set_device(DeviceModel model) {
  settings().device = model;
  kernel_smem().clear();  // attributes belong to the previous device's context
}
DeviceModel device() { return settings().device; }
const char* device_name(DeviceModel model) {
  switch (model) {
    case DeviceModel::h100:
      return "h100";
    case DeviceModel::a100:
      return "a100";
    case DeviceModel::sm86:
      return "sm86";
  }
  return "?";
}
void set_schedule(Schedule s, uint64_t seed) {
  settings().schedule = s;
  settings().seed = seed;
}
Schedule schedule() { return settings().schedule; }
const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::round_robin:
      return "rr";
    case Schedule::greedy:
      return "greedy";
    case Schedule::random:
      return "random";
  }
  return "?";
}
const std::vector<Report>& reports() { return report_list(); }
std::vector<Report> take_reports() {
  std::vector<Report> r;
  r.swap(report_list());
  return r;
}
size_t report_count() { return report_list().size(); }
std::string reports_text() {
  std::string s;
  for (const Report& r : report_list()) s += "[" + r.kind + "] " + r.message + "\n";
  return s;
}
bool race_checker_enabled() {
#if defined(CUDASIM_RACE)
  return true;
#else
  return false;
#endif
}
bool set_race_checks(bool on) {
#if defined(CUDASIM_RACE)
  return race_set_checks(on);
#else
  (void)on;
  return false;
#endif
}
void set_block_filter(std::function<bool(uint64_t)> pred) { block_filter() = std::move(pred); }
void set_block_sample(uint64_t every) { settings().block_sample = every < 1 ? 1 : every; }
uint64_t block_sample() { return settings().block_sample; }
LaunchStats last_launch_stats() { return g_stats; }
uint64_t launch_count() { return g_launches; }

}  // namespace cudasim
