#pragma once
// Memory-access counters per kernel launch and per source line, named after the Nsight Compute
// metrics they stand for (host code; not for kernels). Only in binaries whose kernels are
// instrumented (the race variant: counters_available()); elsewhere these functions do not exist.
//
// Model (tools/cudasim/README.md, "Counters"): the k-th execution of one memory access site
// (a load or store call site in the kernel's code, as clang emits it) by the lanes of a warp,
// between two points where the warp is known to be converged (a __syncthreads, a warp
// collective whose mask names every live lane, the end of the warp), is one request.
//   global memory: sectors = the distinct 32-byte sectors its lanes touch;
//   shared memory: split in phases (accesses of up to 4 bytes: the whole warp; 8 bytes: half
//     warps; 16 bytes: quarter warps); a phase takes as many wavefronts as the largest number
//     of distinct 4-byte words that fall in one of the 32 banks (lanes reading the same word
//     share it: a broadcast); bank conflicts = wavefronts - 1 per phase.
// Per launch also: the distinct bytes of device memory read and written (a lower bound on DRAM
// traffic: no cache is modelled) and the minimum the caller declared (declare_min_bytes).
//
// Environment: CUDASIM_COUNTERS=FILE turns the counters on and writes FILE (rewritten by each
// process) as CSV: one row per launch and source line, the columns of counter_columns().
#include <cstdint>
#include <string>
#include <vector>

namespace cudasim {

// Counts of one source line, or of a whole launch.
struct AccessCounts {
  uint64_t global_ld_requests = 0, global_ld_sectors = 0, global_ld_bytes = 0;
  uint64_t global_st_requests = 0, global_st_sectors = 0, global_st_bytes = 0;
  // The fewest sectors that could hold what each request asked for: per request, its distinct
  // bytes (lanes asking for the same byte count it once) / 32, rounded up. sectors - ideal is
  // the excess a better access pattern could save.
  uint64_t global_ld_ideal_sectors = 0, global_st_ideal_sectors = 0;
  uint64_t shared_ld_requests = 0, shared_ld_wavefronts = 0, shared_ld_bank_conflicts = 0;
  uint64_t shared_st_requests = 0, shared_st_wavefronts = 0, shared_st_bank_conflicts = 0;
  AccessCounts& operator+=(const AccessCounts& o);
  // 0 when there was no request.
  double global_ld_sectors_per_request() const;
  double global_st_sectors_per_request() const;
};

struct LineCounts {
  std::string file;  // relative to the source tree where it lies inside it
  int line = 0;      // 0: unknown (file then names the code address)
  AccessCounts counts;
};

struct Dim {
  unsigned x = 1, y = 1, z = 1;
};

struct LaunchCounts {
  uint64_t launch = 0;       // launch_count() of this launch: the process's n-th launch
  std::string kernel;        // as written before <<<...>>>
  std::string function;      // as instantiated, e.g. "ns::softmax_fwd_cached<float, 1>(...)"; empty if unknown
  std::string launched_at;   // file:line of the launch
  Dim grid, block;
  uint64_t dynamic_smem_bytes = 0;
  uint64_t blocks_run = 0;    // blocks executed (fewer than the grid under a block filter or sample)
  uint64_t block_sample = 1;  // the block sample in effect (set_block_sample): 1 = every block
  // The static __shared__ variables the launch touched, their declared sizes summed (a variable
  // no thread of the launch accessed is not counted: a lower bound on the kernel's static
  // shared memory; exact for kernels that touch every variable they declare).
  uint64_t static_smem_bytes = 0;
  uint64_t unique_global_bytes_read = 0, unique_global_bytes_written = 0;
  uint64_t min_bytes = 0;    // declared with declare_min_bytes before the launch; 0: none
  AccessCounts total;        // the sum of `lines`
  std::vector<LineCounts> lines;  // ordered by file, then line
  // The line whose "file:line" ends with `suffix` (e.g. "counters.cu:42"), or null.
  const LineCounts* find_line(const std::string& suffix) const;
};

// Whether this binary's kernels are instrumented, so that counting is possible.
bool counters_available();
// Turns counting on or off for the following launches; returns whether it is on (false when
// unavailable). On by default when CUDASIM_COUNTERS is set.
bool set_counters(bool on);
bool counters_enabled();
// The least number of bytes of device memory the next counted launch must read and write,
// as its caller computes it (e.g. each input read once, each output written once). Reported
// as that launch's min_bytes, beside its unique bytes; then reset to 0.
void declare_min_bytes(uint64_t bytes);
// Every counted launch so far (oldest first); take_ empties the list.
const std::vector<LaunchCounts>& counted_launches();
std::vector<LaunchCounts> take_counted_launches();

// The CSV's columns, declared once: name (Nsight Compute's metric name where the count is
// the one it defines), unit and meaning. counters_csv_* write them.
struct CounterColumn {
  const char* name;
  const char* unit;
  const char* meaning;
};
const std::vector<CounterColumn>& counter_columns();
std::string counters_csv_header();
std::string counters_csv_rows(const LaunchCounts& launch);

}  // namespace cudasim
