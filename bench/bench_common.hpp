#pragma once
// What bench_kernels and bench_layer share: the backend and communicator they run on, the
// shapes they run at, device peaks for "% of peak" counters, and the main() that makes
// Google Benchmark behave under mpirun (rank 0 reports; times are max-reduced over ranks so
// every rank takes the same decisions and runs the same iterations).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "kernels/backend.hpp"
#include "runtime/communicator.hpp"

namespace actbench::bench {

// Label of every benchmark timed on the simulator (Backend::simulated()): its times are host
// time of the CPU simulator, never device time.
inline constexpr const char* kSimulatedLabel = "simulated: CPU simulator time, not device time";

// --shape=paper runs one rank of this preset (runners/presets.hpp) at its own t: the 22B layer
// of Table 4, t = 8.
inline constexpr const char* kPaperShapeModel = "22b";

struct BenchContext {
  std::string backend_name;  // cpu | cuda | meta
  std::string shape;         // small | paper (kPaperShapeModel)
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Communicator> world;  // MPI under mpirun (rank, size), else none
  std::unique_ptr<Communicator> comm;   // the group the layer runs on: NCCL (cuda) or MPI, else local
  bool skipped = false;                // backend unavailable (no GPU): benchmarks skip
  std::string skip_reason;
};
BenchContext& context();

// Published dense peaks of the device (0 when unknown: counters are then left out).
struct DevicePeaks {
  double memory_gbps = 0;  // HBM bandwidth, GB/s
  double bf16_tflops = 0;  // dense tensor-core bf16
};
DevicePeaks device_peaks(const std::string& device_name);

// Times fn once on the backend's stream, max-reduced over ranks, and hands it to Google
// Benchmark as the iteration's manual time. Returns milliseconds.
double time_manual(benchmark::State& state, const std::function<void()>& fn);

// Adds bytes/GB/s (and % of peak) counters for a memory-bound op moving `bytes` per iteration.
void set_bandwidth_counters(benchmark::State& state, double bytes);
// Adds FLOP/TFLOP/s (and % of peak) counters for `flops` per iteration.
void set_flop_counters(benchmark::State& state, double flops);

// Removes every --NAME=VALUE from argv and returns the last VALUE, or `def` when there is none.
std::string take_flag(int& argc, char** argv, const char* name, const std::string& def);
// VALUE of --NAME=VALUE as an integer >= 1; throws InvalidArgument (exit 2) otherwise.
int64_t parse_positive(const char* name, const std::string& value);

// Parses --backend=cpu|cuda|meta, --shape=small|paper and --memory-limit=SIZE (e.g. 64MiB,
// 80GB: the allocator emulates a device of that size, OOM past it; removing them from argv), then
// the binary's own flags through `parse_flags` (after the context's backend and shape are
// set, before Google Benchmark sees argv; InvalidArgument there exits 2), sets up the
// context, registers benchmarks through `register_all`, runs them; rank 0 reports. The
// JSON/console context gets actbench_backend, actbench_shape and actbench_device.
int bench_main(int argc, char** argv, const std::function<void()>& register_all,
               const std::function<void(int& argc, char** argv)>& parse_flags = {});

}  // namespace actbench::bench
