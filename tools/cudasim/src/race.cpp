// The race checker. Kernel objects of the race variant are compiled with -fsanitize=thread,
// which makes the compiler call __tsan_readN / __tsan_writeN before every memory access; no
// ThreadSanitizer runtime is linked: the hooks are defined here, over a shadow that knows
// CUDA's ordering rules instead of pthreads'. Per byte of device and shared memory it keeps
// the last write and the last read(s): launch, block, thread, the block's barrier epoch and
// the warp's collective epoch at the access. Two accesses to a byte, one of them a write,
// race when they come from different blocks of one launch, or from different threads of a
// block with no __syncthreads between them (nor a full-warp collective, for lanes of one
// warp). Also reported: reads of shared memory no thread of the block has written, and
// accesses that land in the canary zone of a device buffer or past dynamic shared memory.
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <algorithm>
#include <cstdlib>
#include <unordered_map>

#include "internal.hpp"

namespace cudasim::internal {
namespace {

struct Access {
  uint32_t launch = 0;  // 0: none
  uint32_t block = 0;
  uint32_t bar = 0, wsync = 0;
  uint16_t thread = 0;
  uint8_t multi = 0;   // reads: more than one unordered reader
  uint8_t atomic = 0;  // writes: an atomic read-modify-write (atomics do not race each other)
  uint8_t async = 0;   // writes: a cp.async in flight (ordered with nothing until it lands)
  const void* pc = nullptr;
};
struct Cell {
  Access w, r;
};

constexpr size_t kPageBits = 12, kPage = size_t{1} << kPageBits;
std::unordered_map<uintptr_t, std::unique_ptr<Cell[]>> g_shadow;
uintptr_t g_last_page = ~uintptr_t{0};
Cell* g_last_cells = nullptr;
uint32_t g_launch = 0;
int g_reports_this_launch = 0;
std::set<std::pair<const void*, int>> g_reported;  // (pc, kind) per launch

Cell* cell(uintptr_t a) {
  const uintptr_t page = a >> kPageBits;
  if (page != g_last_page) {
    auto& p = g_shadow[page];
    if (!p) p.reset(new Cell[kPage]());
    g_last_page = page;
    g_last_cells = p.get();
  }
  return &g_last_cells[a & (kPage - 1)];
}

enum Kind { kRace, kUninit, kBounds };

std::string who(const Access& a) {
  std::string s = "thread " + std::to_string(a.thread);
  const auto& threads = *running.threads;
  if (a.launch == g_launch && a.block == static_cast<uint32_t>(running.linear) && a.thread < threads.size())
    s = "thread " + thread_name(threads[a.thread]);
  s += a.block == static_cast<uint32_t>(running.linear) ? " of this block" : " of block #" + std::to_string(a.block);
  return s + " at " + symbolize(a.pc);
}

void report(Kind kind, const void* pc, const std::string& msg) {
  if (!g_reported.insert({pc, kind}).second) return;
  if (++g_reports_this_launch > 20) return;
  static const char* kinds[] = {"race", "uninit", "bounds"};
  add_report(kinds[kind], msg);
}

bool ordered(const Access& prev, const Access& now) {
  if (prev.launch != now.launch) return true;  // launches run in stream order
  if (prev.block != now.block) return false;   // blocks of a launch are unordered
  if (prev.async) return false;                // lands at any moment until its thread waits
  if (prev.thread == now.thread && !prev.multi) return true;
  if (prev.bar < now.bar) return true;
  return !prev.multi && prev.thread / 32 == now.thread / 32 && prev.wsync < now.wsync;
}

void access(uintptr_t a, size_t n, bool write, const void* pc, bool atomic = false, bool async = false) {
  Thread* t = current_thread();
  if (!t) return;
  // Which memory: shared (static section or dynamic), device buffer, or out of bounds of one.
  bool shared = false;
  if (a >= running.shared_lo && a < running.shared_hi) {
    shared = true;
  } else if (a >= running.dynamic_lo && a < running.dynamic_hi + kBackCanary) {
    if (a + n > running.dynamic_hi) {
      report(kBounds, pc, std::string("out-of-bounds ") + (write ? "write" : "read") + " of " + std::to_string(n) +
                              " bytes in " + running.kernel + " launched at " + running.file + ":" +
                              std::to_string(running.line) + ", block " + block_name() + ", thread " +
                              thread_name(*t) + " at " + symbolize(pc) + ": " + describe_address(a + n - 1));
      return;
    }
    shared = true;
  } else if (!find_allocation(reinterpret_cast<const void*>(a), n)) {
    const uintptr_t probe = canary_owner(a) ? a : a + n - 1;
    if (canary_owner(probe))
      report(kBounds, pc, std::string("out-of-bounds ") + (write ? "write" : "read") + " of " + std::to_string(n) +
                              " bytes in " + running.kernel + " launched at " + running.file + ":" +
                              std::to_string(running.line) + ", block " + block_name() + ", thread " +
                              thread_name(*t) + " at " + symbolize(pc) + ": " + describe_address(probe));
    return;  // stack, host memory: not tracked
  }
  const auto& warps = *running.warps;
  Access now;
  now.launch = g_launch;
  now.block = static_cast<uint32_t>(running.linear);
  now.thread = static_cast<uint16_t>(t->linear);
  now.bar = running.bar_epoch;
  now.wsync = warps[t->warp].sync_epoch;
  now.pc = pc;
  now.atomic = atomic ? 1 : 0;
  now.async = async ? 1 : 0;
  // Built only for a report: an access that finds nothing wrong costs no string.
  const auto header = [] {
    return std::string(running.kernel) + " launched at " + running.file + ":" + std::to_string(running.line) +
           ", block " + block_name();
  };
  const auto writer = [](const Access& w) {
    return w.async ? "cp.async not yet waited for, issued by " + who(w) : "write by " + who(w);
  };
  const auto this_write = [&] { return std::string(async ? "cp.async issued" : "write") + " by thread "; };
  for (size_t i = 0; i < n; ++i) {
    Cell* c = cell(a + i);
    if (shared) {  // shared memory belongs to one block: other blocks' accesses are another memory
      if (c->w.launch != now.launch || c->w.block != now.block) c->w = Access{};
      if (c->r.launch != now.launch || c->r.block != now.block) c->r = Access{};
    }
    if (write) {
      if (c->w.launch && !(atomic && c->w.atomic) && !ordered(c->w, now)) {
        report(kRace, pc, "write-write race in " + header() + " on " + describe_address(a + i) + ":\n  " +
                              this_write() + thread_name(*t) + " at " + symbolize(pc) + "\n  " + writer(c->w) +
                              (c->w.async ? "" : "\n  with no barrier between"));
        c->w = now;
        return;
      }
      if (c->r.launch && !(c->r.thread == now.thread && c->r.block == now.block && !c->r.multi) &&
          !ordered(c->r, now)) {
        report(kRace, pc, "read-write race in " + header() + " on " + describe_address(a + i) + ":\n  " +
                              this_write() + thread_name(*t) + " at " + symbolize(pc) + "\n  read by " + who(c->r) +
                              (c->r.multi ? " (and others)" : "") + "\n  with no barrier between");
        c->w = now;
        c->r = Access{};
        return;
      }
      c->w = now;
      c->r = Access{};
    } else {
      if (c->w.launch && !ordered(c->w, now)) {
        report(kRace, pc, "read-after-write race in " + header() + " on " + describe_address(a + i) +
                              ":\n  read by thread " + thread_name(*t) + " at " + symbolize(pc) + "\n  " +
                              writer(c->w) + (c->w.async ? "" : "\n  with no barrier between"));
        return;
      }
      if (shared && !c->w.launch) {
        report(kUninit, pc, "read of shared memory that no thread of the block wrote in " + header() + ": " +
                                describe_address(a + i) + ", thread " + thread_name(*t) + " at " + symbolize(pc));
        return;
      }
      if (c->r.launch && !ordered(c->r, now) && !(c->r.thread == now.thread && c->r.block == now.block)) {
        const uint8_t multi = 1;
        c->r = now;
        c->r.multi = multi;
      } else if (!(c->r.launch && c->r.multi && !ordered(c->r, now))) {
        c->r = now;
      }
    }
  }
}

}  // namespace

void race_begin_launch() {
  ++g_launch;
  g_reports_this_launch = 0;
  g_reported.clear();
}
void race_begin_block() {}


// CUDASIM_RACE_CHECKS=0: counting without checking (set_race_checks).
bool& race_checks() {
  static bool on = [] {
    const char* v = std::getenv("CUDASIM_RACE_CHECKS");
    return !(v && std::string(v) == "0");
  }();
  return on;
}
bool race_set_checks(bool on) { return race_checks() = on; }

void race_atomic(uintptr_t a, size_t n, const void* pc) {
  if (race_checks()) access(a, n, true, pc, true);
}

void race_async_issue(uintptr_t a, size_t n, const void* pc) {
  if (race_checks()) access(a, n, true, pc, false, true);
}

void race_async_land(uintptr_t a, size_t n) {
  const Thread* t = current_thread();
  if (!race_checks() || !t) return;
  for (size_t i = 0; i < n; ++i) {
    Cell* c = cell(a + i);
    if (c->w.async && c->w.launch == g_launch && c->w.block == static_cast<uint32_t>(running.linear) &&
        c->w.thread == static_cast<uint16_t>(t->linear))
      c->w = Access{};  // the landing write that follows is a plain write of this thread
  }
}

void race_forget(uintptr_t lo, uintptr_t hi) {
  g_last_page = ~uintptr_t{0};  // the cached page may be erased
  for (uintptr_t page = lo >> kPageBits; page <= (hi - 1) >> kPageBits; ++page) {
    auto it = g_shadow.find(page);
    if (it == g_shadow.end()) continue;
    const uintptr_t first = page << kPageBits, last = first + kPage;
    if (first >= lo && last <= hi) {
      g_shadow.erase(it);
      continue;
    }
    // A page shared with a neighbouring buffer: forget only this buffer's bytes.
    for (uintptr_t a = std::max(first, lo); a < std::min(last, hi); ++a) it->second[a - first] = Cell{};
  }
}

}  // namespace cudasim::internal

// ---- the -fsanitize=thread instrumentation interface -------------------------------------------
// Every access of instrumented kernel code goes to the counters (counters.cpp: a no-op unless
// they are on) and to the race checker. Accesses of 1, 2, 4, 8 or 16 bytes are single loads
// or stores as clang emitted them; ranges and the mem* calls below are block copies.

namespace {

using cudasim::internal::access;

// Set while a hook runs: the hooks' own std::string and container code calls memcpy, which
// must not come back in as a kernel access.
bool g_in_hook = false;

void on_access(void* p, size_t n, bool write, const void* pc) {
  const cudasim::internal::Thread* t = cudasim::internal::current_thread();
  if (t && cudasim::internal::on_own_stack(t, reinterpret_cast<uintptr_t>(p))) return;
  g_in_hook = true;
  cudasim::internal::count_access(reinterpret_cast<uintptr_t>(p), n, write, pc);
  if (cudasim::internal::race_checks()) access(reinterpret_cast<uintptr_t>(p), n, write, pc);
  g_in_hook = false;
}
void on_block_copy(const void* p, size_t n, bool write, const void* pc) {
  if (n == 0) return;
  const cudasim::internal::Thread* t = cudasim::internal::current_thread();
  if (t && cudasim::internal::on_own_stack(t, reinterpret_cast<uintptr_t>(p))) return;
  g_in_hook = true;
  cudasim::internal::count_block_copy(reinterpret_cast<uintptr_t>(p), n, write, pc);
  if (cudasim::internal::race_checks()) access(reinterpret_cast<uintptr_t>(p), n, write, pc);
  g_in_hook = false;
}
bool in_kernel() { return cudasim::detail::current && !g_in_hook; }

}  // namespace

void cudasim::internal::kernel_access(uintptr_t a, size_t n, bool write, const void* pc) {
  on_access(reinterpret_cast<void*>(a), n, write, pc);
}

#define CUDASIM_TSAN_RW(N)                                                                                     \
  extern "C" void __tsan_read##N(void* p) { on_access(p, N, false, __builtin_return_address(0)); }            \
  extern "C" void __tsan_write##N(void* p) { on_access(p, N, true, __builtin_return_address(0)); }            \
  extern "C" void __tsan_unaligned_read##N(void* p) { on_access(p, N, false, __builtin_return_address(0)); }  \
  extern "C" void __tsan_unaligned_write##N(void* p) { on_access(p, N, true, __builtin_return_address(0)); }
CUDASIM_TSAN_RW(1)
CUDASIM_TSAN_RW(2)
CUDASIM_TSAN_RW(4)
CUDASIM_TSAN_RW(8)
CUDASIM_TSAN_RW(16)
#undef CUDASIM_TSAN_RW

extern "C" {
void __tsan_read_range(void* p, unsigned long n) { on_block_copy(p, n, false, __builtin_return_address(0)); }
void __tsan_write_range(void* p, unsigned long n) { on_block_copy(p, n, true, __builtin_return_address(0)); }
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
void __tsan_init() {}
void __tsan_vptr_update(void**, void*) {}
void __tsan_vptr_read(void**) {}
void __tsan_ignore_thread_begin() {}
void __tsan_ignore_thread_end() {}

// -fsanitize=thread turns the llvm.memcpy/memmove/memset intrinsics (aggregate copies such as
// `uint4 v = *p;`, zeroed arrays) into calls of memcpy, memmove and memset, which TSan's
// runtime intercepts. Here the race variant links with -Wl,--wrap=memcpy (and memmove,
// memset): calls made while a simulated thread runs are kernel accesses.
void* __real_memcpy(void* d, const void* s, size_t n);
void* __real_memmove(void* d, const void* s, size_t n);
void* __real_memset(void* d, int c, size_t n);
void* __wrap_memcpy(void* d, const void* s, size_t n) {
  if (in_kernel()) {
    on_block_copy(s, n, false, __builtin_return_address(0));
    on_block_copy(d, n, true, __builtin_return_address(0));
  }
  return __real_memcpy(d, s, n);
}
void* __wrap_memmove(void* d, const void* s, size_t n) {
  if (in_kernel()) {
    on_block_copy(s, n, false, __builtin_return_address(0));
    on_block_copy(d, n, true, __builtin_return_address(0));
  }
  return __real_memmove(d, s, n);
}
void* __wrap_memset(void* d, int c, size_t n) {
  if (in_kernel()) on_block_copy(d, n, true, __builtin_return_address(0));
  return __real_memset(d, c, n);
}
}
