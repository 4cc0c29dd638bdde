#pragma once
// The simulator's controls and findings, for tests and tools (host code; not for kernels).
//
// Environment (read at start-up, overridable here):
//   CUDASIM_DEVICE    h100 (default) | a100 | sm86   limits the launcher validates against
//   CUDASIM_SCHEDULE  rr (default) | greedy | random[:seed]   order threads (and blocks) run in
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace cudasim {

enum class Schedule { round_robin, greedy, random };
enum class DeviceModel { h100, a100, sm86 };

struct DeviceLimits {
  const char* name;
  int major, minor;
  int sm_count;
  size_t smem_per_block;        // default dynamic + static limit (48 KiB)
  size_t smem_per_block_optin;  // cudaFuncAttributeMaxDynamicSharedMemorySize ceiling
  size_t smem_per_sm;
  size_t global_mem;
};
const DeviceLimits& device_limits();

void set_device(DeviceModel model);
DeviceModel device();
const char* device_name(DeviceModel model);
void set_schedule(Schedule s, uint64_t seed = 1);
Schedule schedule();
const char* schedule_name(Schedule s);

// A finding: a race, deadlock, barrier divergence, bad warp collective, out-of-bounds or
// canary hit, unwritten shared memory read. Each one also makes the next cudaGetLastError /
// cudaDeviceSynchronize return cudaErrorLaunchFailure.
struct Report {
  std::string kind;     // "race", "deadlock", "divergence", "warp", "bounds", "canary", "uninit", "launch", "async"
  std::string message;  // one or more lines naming kernel, block, thread, file:line
};
const std::vector<Report>& reports();
std::vector<Report> take_reports();
size_t report_count();
// Every report so far as text (empty when none).
std::string reports_text();
// Whether the race checker is compiled into this binary (the kernel objects built with
// -fsanitize=thread and the hooks of race.cpp linked).
bool race_checker_enabled();
// Turns the race checker's work off (or back on) for the following accesses of a race-variant
// binary, leaving the counters (cudasim/counters.hpp) as they are: counting alone needs none
// of the checker's shadow (64 bytes per device byte touched). CUDASIM_RACE_CHECKS=0 starts
// with it off. Returns whether it is on (always false where it is not compiled in).
bool set_race_checks(bool on);

// Runs only blocks whose linear index satisfies `pred` in the following launches (null: all).
// Lets a test execute a few rows of a very large grid; skipped blocks write nothing.
void set_block_filter(std::function<bool(uint64_t linear_block)> pred);
// Block sampling, for counting launches too large to run whole: of every `every` consecutive
// blocks of a launch only the middle one runs (a grid smaller than every / 2 runs its last
// block); the counters record the launch's blocks_run and sample, and the kernel report scales
// its counts by blocks / blocks_run. Results are those of the blocks that ran only. 1 (the
// default) runs every block; CUDASIM_BLOCK_SAMPLE=N sets it at start.
void set_block_sample(uint64_t every);
uint64_t block_sample();

// Statistics of the last launch (for tests of the simulator itself).
struct LaunchStats {
  uint64_t blocks_run = 0, threads_run = 0, switches = 0, barriers = 0, warp_collectives = 0;
};
LaunchStats last_launch_stats();
uint64_t launch_count();

}  // namespace cudasim
