#include "bench/bench_common.hpp"

#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend_comm.hpp"
#include "runtime/error.hpp"
#include "runtime/user_file.hpp"

namespace actbench::bench {

BenchContext& context() {
  static BenchContext ctx;
  return ctx;
}

DevicePeaks device_peaks(const std::string& name) {
  // Vendor datasheets, dense (no sparsity). Used only for "% of peak" counters.
  struct Entry {
    const char* match;
    DevicePeaks peaks;
  };
  static const Entry table[] = {
      {"H200", {4800, 989}},
      {"H100 80GB HBM3", {3350, 989}},  // SXM
      {"H100 PCIe", {2000, 756}},
      {"H100", {3350, 989}},
      {"A100-SXM4-80GB", {2039, 312}},
      {"A100", {1555, 312}},
  };
  for (const Entry& e : table)
    if (name.find(e.match) != std::string::npos) return e.peaks;
  return {};
}

double time_manual(benchmark::State& state, const std::function<void()>& fn) {
  BenchContext& ctx = context();
  const Backend::Mark a = ctx.backend->mark();
  fn();
  const Backend::Mark b = ctx.backend->mark();
  std::vector<double> ms = {ctx.backend->ms_between(a, b)};
  ctx.comm->max_inplace(ms);  // the slowest rank decides, and all ranks agree on it
  state.SetIterationTime(ms[0] / 1e3);
  if (ctx.backend->simulated()) state.SetLabel(kSimulatedLabel);
  return ms[0];
}

void set_bandwidth_counters(benchmark::State& state, double bytes) {
  state.counters["bytes"] = bytes;
  state.counters["GB/s"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  // The reporter derives pct_peak from GB/s and this.
  const DevicePeaks p = device_peaks(context().backend->device_name());
  if (p.memory_gbps > 0) state.counters["peak_GB/s"] = p.memory_gbps;
}

void set_flop_counters(benchmark::State& state, double flops) {
  state.counters["flops"] = flops;
  state.counters["TFLOP/s"] = benchmark::Counter(flops / 1e12, benchmark::Counter::kIsIterationInvariantRate);
  const DevicePeaks p = device_peaks(context().backend->device_name());
  if (p.bf16_tflops > 0) state.counters["peak_TFLOP/s"] = p.bf16_tflops;
}

namespace {

// Discards everything: ranks other than 0 run the benchmarks but print nothing.
class NullReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

// Adds pct_peak, derived from the rate counters, then hands the runs on to the reporter that
// Google Benchmark's own flags chose (--benchmark_format for the display, --benchmark_out_format
// for --benchmark_out), so the standard flags work as users expect (JSON or CSV on stdout).
// Google Benchmark's CSV reporter aborts when a run has a counter its header (written at the
// first run) lacks, and our benchmarks set different counters (GB/s or TFLOP/s): for CSV the
// runs are held to the end and each given every counter name, NaN where it has none.
class PeakReporter : public benchmark::BenchmarkReporter {
 public:
  PeakReporter(benchmark::BenchmarkReporter* inner, bool uniform_counters,
               std::unique_ptr<benchmark::BenchmarkReporter> owned = nullptr)
      : inner_(inner), uniform_(uniform_counters), owned_(std::move(owned)) {}
  bool ReportContext(const Context& context) override {
    // The library sets the streams of the reporter it is given (a file for --benchmark_out):
    // the one that writes must use them.
    inner_->SetOutputStream(&GetOutputStream());
    inner_->SetErrorStream(&GetErrorStream());
    return inner_->ReportContext(context);
  }
  void ReportRuns(const std::vector<Run>& runs) override {
    std::vector<Run> copy = runs;
    for (Run& r : copy) {
      auto rate = [&](const char* c) { return r.counters.count(c) ? static_cast<double>(r.counters.at(c)) : 0.0; };
      // Rate counters are already divided by the (manual) time when runs are reported.
      if (rate("peak_GB/s") > 0 && rate("GB/s") > 0) r.counters["pct_peak"] = 100.0 * rate("GB/s") / rate("peak_GB/s");
      if (rate("peak_TFLOP/s") > 0 && rate("TFLOP/s") > 0)
        r.counters["pct_peak"] = 100.0 * rate("TFLOP/s") / rate("peak_TFLOP/s");
    }
    if (!uniform_) return inner_->ReportRuns(copy);
    held_.insert(held_.end(), copy.begin(), copy.end());
  }
  void Finalize() override {
    if (uniform_ && !held_.empty()) {
      std::set<std::string> names;
      for (const Run& r : held_)
        for (const auto& [name, counter] : r.counters) names.insert(name);
      for (Run& r : held_)
        for (const std::string& name : names)
          if (!r.counters.count(name)) r.counters[name] = benchmark::Counter(std::numeric_limits<double>::quiet_NaN());
      inner_->ReportRuns(held_);
      held_.clear();
    }
    inner_->Finalize();
  }

 private:
  benchmark::BenchmarkReporter* inner_;
  bool uniform_;
  std::unique_ptr<benchmark::BenchmarkReporter> owned_;
  std::vector<Run> held_;
};

// The value of a Google Benchmark flag in argv ("" if absent); argv is left as it is.
std::string peek_flag(int argc, char** argv, const char* name) {
  const std::string prefix = std::string("--") + name + "=";
  std::string value;
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) value = argv[i] + prefix.size();
  return value;
}

// The reporter --benchmark_out writes with, as --benchmark_out_format asks (json by default).
std::unique_ptr<benchmark::BenchmarkReporter> file_reporter_for(const std::string& format) {
  if (format.empty() || format == "json") return std::make_unique<benchmark::JSONReporter>();
  if (format == "csv") {
    // Deprecated upstream but still what --benchmark_out_format=csv means to the library.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    return std::make_unique<benchmark::CSVReporter>();
#pragma GCC diagnostic pop
  }
  if (format == "console") return std::make_unique<benchmark::ConsoleReporter>(benchmark::ConsoleReporter::OO_None);
  throw InvalidArgument("--benchmark_out_format must be json, csv or console (got '" + format + "')");
}

}  // namespace

std::string take_flag(int& argc, char** argv, const char* name, const std::string& def) {
  const std::string prefix = std::string("--") + name + "=";
  std::string value = def;
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0)
      value = argv[i] + prefix.size();
    else
      argv[out++] = argv[i];
  }
  argc = out;
  return value;
}

size_t parse_memory_limit(const std::string& s) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (const std::exception&) {
    throw InvalidArgument("--memory-limit: cannot read memory size '" + s + "'");
  }
  const std::string unit = s.substr(pos);
  static const std::pair<const char*, double> units[] = {
      {"", 1},         {"B", 1},     {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0},
      {"KB", 1e3},     {"MB", 1e6},  {"GB", 1e9},     {"TB", 1e12},       {"TiB", 1099511627776.0}};
  for (const auto& [name, mult] : units)
    if (unit == name) {
      if (!(v > 0)) throw InvalidArgument("--memory-limit '" + s + "' must be positive");
      return static_cast<size_t>(v * mult);
    }
  throw InvalidArgument("--memory-limit: unknown unit in '" + s + "' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");
}

int64_t parse_positive(const char* name, const std::string& value) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (value.empty() || used != value.size() || v < 1)
    throw InvalidArgument(std::string("--") + name + " must be an integer >= 1 (got '" + value + "')");
  return static_cast<int64_t>(v);
}

int bench_main(int argc, char** argv, const std::function<void()>& register_all,
               const std::function<void(int& argc, char** argv)>& parse_flags) {
  BenchContext& ctx = context();
  int code = 0;
  try {
    ctx.backend_name = take_flag(argc, argv, "backend", "cpu");
    ctx.shape = take_flag(argc, argv, "shape", "");
    if (!ctx.shape.empty() && ctx.shape != "small" && ctx.shape != "paper")
      throw InvalidArgument("--shape must be small or paper");
    const std::string limit = take_flag(argc, argv, "memory-limit", "");
    const size_t capacity = limit.empty() ? 0 : parse_memory_limit(limit);
    if (parse_flags) parse_flags(argc, argv);
    // Google Benchmark opens --benchmark_out itself, and would wait forever on a FIFO.
    if (const std::string out = peek_flag(argc, argv, "benchmark_out"); !out.empty())
      check_user_file("--benchmark_out " + out, out, false);
    if (mpi_launched()) {
      // One GPU per rank, chosen before MPI_Init (as CUDA-aware MPI and NCCL expect). Without
      // a GPU, make_backend below fails the same way and the cuda benchmarks skip.
      try {
        bind_device_for_rank(ctx.backend_name, mpi_world_rank_from_env());
      } catch (const InvalidArgument&) {
        if (ctx.backend_name != "cuda") throw;
      }
      ctx.world = make_mpi_communicator();
    }
    const int world = ctx.world ? ctx.world->size() : 1;
    try {
      ctx.backend = make_backend(ctx.backend_name, capacity);
    } catch (const InvalidArgument& e) {
      if (ctx.backend_name != "cuda") throw;
      // No GPU: the cuda benchmarks are registered and skip, so the binary still succeeds.
      ctx.skipped = true;
      ctx.skip_reason = e.what();
      ctx.backend = make_backend("meta");
    }
    // The paper's shapes on a GPU; small ones on the cpu and on the simulator.
    if (ctx.shape.empty()) ctx.shape = ctx.backend_name == "cuda" && !ctx.backend->simulated() ? "paper" : "small";
    ctx.comm = world > 1 ? make_world_communicator(*ctx.backend) : make_backend_local_communicator(*ctx.backend);
    benchmark::AddCustomContext("actbench_backend", ctx.skipped ? ctx.backend_name + " (skipped)" : ctx.backend_name);
    benchmark::AddCustomContext("actbench_shape", ctx.shape);
    benchmark::AddCustomContext("actbench_device", ctx.skipped ? "none" : ctx.backend->device_name());
    if (!ctx.skipped && ctx.backend->simulated())
      benchmark::AddCustomContext("actbench_timing", kSimulatedLabel);
    // Only rank 0 reports: the others must not open (and truncate) the --benchmark_out file.
    if (ctx.comm->rank() != 0) {
      take_flag(argc, argv, "benchmark_out", "");
      take_flag(argc, argv, "benchmark_out_format", "");
    }
    const bool to_file = !peek_flag(argc, argv, "benchmark_out").empty();
    const std::string out_format = peek_flag(argc, argv, "benchmark_out_format");
    const std::string display_format = peek_flag(argc, argv, "benchmark_format");
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) throw InvalidArgument("unrecognized arguments");
    register_all();
    if (ctx.comm->rank() == 0) {
      PeakReporter display(benchmark::CreateDefaultDisplayReporter(), display_format == "csv");  // --benchmark_format
      if (to_file) {
        std::unique_ptr<benchmark::BenchmarkReporter> inner = file_reporter_for(out_format);
        benchmark::BenchmarkReporter* raw = inner.get();
        PeakReporter file(raw, out_format == "csv", std::move(inner));
        benchmark::RunSpecifiedBenchmarks(&display, &file);
      } else {
        benchmark::RunSpecifiedBenchmarks(&display);
      }
    } else {
      NullReporter quiet;
      benchmark::RunSpecifiedBenchmarks(&quiet);
    }
    benchmark::Shutdown();
  } catch (const InvalidArgument& e) {
    std::fprintf(stderr, "%s: error: %s\n", argv[0], e.what());
    code = 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: failure: %s\n", argv[0], e.what());
    code = 1;
  }
  ctx.comm.reset();
  ctx.backend.reset();
  ctx.world.reset();
  mpi_finalize_if_initialized();
  return code;
}

}  // namespace actbench::bench
