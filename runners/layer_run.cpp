// layer_run: one experiment -> one CSV row per configuration (DESIGN.md, "Contracts").
// Exit status: 0 ok, 2 bad input (one line on stderr, no row), 3 out of memory (row with
// status=oom), 1 any other failure.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>

#include "kernels/backend.hpp"
#include "kernels/backend_comm.hpp"
#include "runners/experiment.hpp"
#include "runners/presets.hpp"
#include "runtime/communicator.hpp"
#include "runtime/csv.hpp"
#include "runtime/cupti_profiler.hpp"
#include "runtime/error.hpp"
#include "runtime/provenance.hpp"
#include "theory/activation_memory.hpp"

using namespace actbench;

namespace {

constexpr const char* kAllPaperConfigs = "baseline,sp,full,selective,selective+sp";

const std::vector<std::string> kCsvHeader = {
    "backend", "device", "model", "hidden", "heads", "seq", "batch", "tp", "emulated", "config", "attention",
    "recompute", "sequence_parallel", "dtype", "dropout", "layers", "warmup", "iters", "fwd_ms", "bwd_ms", "total_ms",
    "fwd_ms_min", "fwd_ms_max", "bwd_ms_min", "bwd_ms_max", "act_bytes", "act_extra_bytes", "act_bytes_formula",
    "fwd_retained_bytes", "peak_allocated_bytes", "peak_reserved_bytes", "memory_limit_bytes", "comm_mode",
    "comm_bytes", "link_gbps", "comm_ms_modeled", "comm_ms_emulated", "status", "message", "seed", "git_sha",
    "driver_version", "cuda_runtime_version", "cublas_version", "nccl_version", "sm_clock_mhz_start",
    "sm_clock_mhz_end", "mem_clock_mhz_start", "mem_clock_mhz_end", "power_limit_w", "throttle_reasons_start",
    "throttle_reasons_end", "hostname", "timestamp", "command"};

// layer_run --cupti FILE: GPU kernel time per phase, per layer and timed iteration.
const std::vector<std::string> kCuptiHeader = {
    "backend", "device", "model", "hidden", "heads", "seq", "batch", "tp", "emulated", "config", "dtype", "dropout",
    "layers", "iters", "phase", "stage", "kernels", "gpu_ms", "dropped_records", "git_sha", "timestamp"};

struct Options {
  std::string backend = "cpu", model = "tiny", configs = kAllPaperConfigs, dtype = "bf16", csv, dump, cupti;
  std::string memory_limit, attention = "unfused";
  int64_t hidden = 0, heads = 0, seq = 0, batch = 0;
  int tp = 0, layers = 1, warmup = 2, iters = 10;
  bool emulate_tp = false;
  float dropout = 0.1f;
  uint64_t seed = 1234;
  double link_gbps = 450.0;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

// "80GiB", "80GB", "512MiB", "1e9" -> bytes.
size_t parse_bytes(const std::string& s) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (...) {
    throw InvalidArgument("cannot read memory size '" + s + "'");
  }
  std::string unit = s.substr(pos);
  double mult = 1;
  if (unit == "" || unit == "B") mult = 1;
  else if (unit == "KiB") mult = 1024.0;
  else if (unit == "MiB") mult = 1024.0 * 1024;
  else if (unit == "GiB") mult = 1024.0 * 1024 * 1024;
  else if (unit == "TiB") mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "KB") mult = 1e3;
  else if (unit == "MB") mult = 1e6;
  else if (unit == "GB") mult = 1e9;
  else if (unit == "TB") mult = 1e12;
  else throw InvalidArgument("unknown unit in memory size '" + s + "' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");
  if (!(v > 0)) throw InvalidArgument("memory size '" + s + "' must be positive");
  return static_cast<size_t>(v * mult);
}

std::string fmt_ms(double v, bool have) {
  if (!have) return "";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4f", v);
  return buf;
}
std::string fmt_num(double v, const char* f = "%.0f") {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

theory::Config theory_config(LayerPolicy p) {
  theory::Config c;
  c.recompute = p.recompute == Recompute::none        ? theory::Recompute::none
                : p.recompute == Recompute::selective ? theory::Recompute::selective
                                                      : theory::Recompute::full;
  c.sequence_parallel = p.sequence_parallel;
  c.fused_attention = p.attention == Attention::fused;
  return c;
}

int run(int argc, char** argv) {
  CLI::App app{"layer_run: time and measure one transformer layer in the paper's configurations"};
  Options o;
  app.add_option("--backend", o.backend, "cpu | cuda | meta")->capture_default_str();
  app.add_option("--model", o.model, "tiny | 22b | 175b | 530b | 1t")->capture_default_str();
  app.add_option("--hidden", o.hidden, "override the preset's hidden size h");
  app.add_option("--heads", o.heads, "override the preset's attention heads a");
  app.add_option("--seq", o.seq, "override the preset's sequence length s");
  app.add_option("--batch", o.batch, "override the preset's microbatch b");
  app.add_option("--tp", o.tp, "tensor-parallel size (default: MPI world size; with --emulate-tp the preset's t)");
  app.add_flag("--emulate-tp", o.emulate_tp, "one process plays rank 0 of --tp ranks; communication modeled");
  app.add_option("--config", o.configs, "comma-separated: baseline,sp,full,selective,selective+sp[,full+sp]")
      ->capture_default_str();
  app.add_option("--attention", o.attention,
                 "unfused (the paper's) | fused (FlashAttention-style: no probabilities or masks stored)")
      ->capture_default_str();
  app.add_option("--dtype", o.dtype, "bf16 | fp16 | fp32")->capture_default_str();
  app.add_option("--dropout", o.dropout, "dropout probability")->capture_default_str();
  app.add_option("--layers", o.layers, "layers in the stack (times and bytes are reported per layer)")
      ->capture_default_str();
  auto* warmup_opt = app.add_option("--warmup", o.warmup, "untimed iterations")->capture_default_str();
  auto* iters_opt = app.add_option("--iters", o.iters, "timed iterations")->capture_default_str();
  app.add_option("--seed", o.seed, "seed of parameters, inputs and dropout masks")->capture_default_str();
  app.add_option("--csv", o.csv, "results CSV to append to (required)");
  bool print_header = false;
  app.add_flag("--print-csv-header", print_header, "print the CSV header line and exit (for sweep drivers)");
  app.add_option("--dump", o.dump, "write canonical .npy tensors of one layer here (rank 0)");
  app.add_option("--cupti", o.cupti,
                 "write GPU kernel time per phase (CUPTI) to this CSV (cuda backend; Figure 8's split)");
  app.add_option("--memory-limit", o.memory_limit, "emulate a device of this size, e.g. 80GiB (OOM past it)");
  app.add_option("--link-gbps", o.link_gbps, "link bandwidth per direction for comm_ms_modeled, GB/s")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string what = e.what();
    throw InvalidArgument(what);
  }
  if (print_header) {
    std::printf("%s", csv_line(kCsvHeader).c_str());
    return 0;
  }
  if (o.csv.empty()) throw InvalidArgument("--csv FILE is required");

  // ---- where we run: real ranks, or one process emulating rank 0 of t ----
  // Under mpirun the MPI world exists first (rank, size; host-side agreement); the run's
  // tensor-parallel group is made once the backend exists (NCCL on its stream for cuda).
  std::unique_ptr<Communicator> world_comm;
  if (mpi_launched()) {
    bind_device_for_rank(o.backend, mpi_world_rank_from_env());  // one GPU per rank, before MPI_Init
    world_comm = make_mpi_communicator();
  }
  const int world = world_comm ? world_comm->size() : 1;
  const int world_rank = world_comm ? world_comm->rank() : 0;
  const bool rank0 = world_rank == 0;
  const ModelPreset& preset = find_preset(o.model);
  if (o.emulate_tp) {
    if (world > 1) throw InvalidArgument("--emulate-tp runs in one process; do not launch it with mpirun -np > 1");
    if (!o.dump.empty()) throw InvalidArgument("--dump cannot be combined with --emulate-tp (emulated values are not the layer's)");
    if (o.tp == 0) o.tp = preset.tp;
    if (o.tp < 1) throw InvalidArgument("--tp must be >= 1");
  } else {
    if (o.tp == 0) o.tp = world;
    if (o.tp != world)
      throw InvalidArgument("--tp " + std::to_string(o.tp) + " but the MPI world has " + std::to_string(world) +
                            " rank(s): run under mpirun -np " + std::to_string(o.tp) + " or add --emulate-tp");
  }

  // ---- what we run ----
  LayerDims dims = preset.dims;
  if (o.hidden) dims.h = o.hidden;
  if (o.heads) dims.a = o.heads;
  if (o.seq) dims.s = o.seq;
  if (o.batch) dims.b = o.batch;
  std::vector<LayerPolicy> policies;
  const Attention attention = parse_attention(o.attention);
  for (const std::string& name : split_list(o.configs)) {
    policies.push_back(parse_config(name));
    policies.back().attention = attention;
  }
  if (policies.empty()) throw InvalidArgument("--config lists no configuration");
  for (LayerPolicy p : policies) validate_layer(dims, o.tp, p);
  const DType dtype = parse_dtype(o.dtype);
  if (o.layers < 1) throw InvalidArgument("--layers must be >= 1");
  if (!(o.dropout >= 0.f && o.dropout < 1.f)) throw InvalidArgument("--dropout must be in [0, 1)");
  if (!o.dump.empty() && o.layers != 1) throw InvalidArgument("--dump writes one layer: use --layers 1");
  if (!(o.link_gbps > 0)) throw InvalidArgument("--link-gbps must be positive");
  const size_t limit = o.memory_limit.empty() ? 0 : parse_bytes(o.memory_limit);
  std::unique_ptr<Backend> be = make_backend(o.backend, limit);
  std::unique_ptr<Communicator> comm;
  if (o.emulate_tp) comm = make_backend_emulated_communicator(*be, o.tp);
  else if (world > 1) comm = make_world_communicator(*be);
  else comm = make_backend_local_communicator(*be);
  if (!be->computes()) {  // meta: timing means nothing; one iteration gives the memory schedule
    if (!warmup_opt->count()) o.warmup = 0;
    if (!iters_opt->count()) o.iters = 1;
  }
  if (o.iters < 1) throw InvalidArgument("--iters must be >= 1");
  if (o.warmup < 0) throw InvalidArgument("--warmup must be >= 0");
  CsvAppender csv(o.csv, kCsvHeader);
  if (rank0) csv.check();
  std::unique_ptr<CuptiProfiler> profiler;
  std::unique_ptr<CsvAppender> cupti_csv;
  if (!o.cupti.empty()) {
    if (o.backend != "cuda") throw InvalidArgument("--cupti records GPU kernels: it needs --backend cuda");
    profiler = CuptiProfiler::create();
    cupti_csv = std::make_unique<CsvAppender>(o.cupti, kCuptiHeader);
    if (rank0) cupti_csv->check();
  }

  const std::string command = joined_command_line(argc, argv);
  const Backend::Versions versions = be->versions();
  int exit_code = 0;
  for (LayerPolicy policy : policies) {
    ExperimentSpec spec;
    spec.dims = dims;
    spec.policy = policy;
    spec.dtype = dtype;
    spec.dropout = o.dropout;
    spec.layers = o.layers;
    spec.warmup = o.warmup;
    spec.iters = o.iters;
    spec.seed = o.seed;
    spec.link_gbps = o.link_gbps;
    spec.profiler = profiler.get();
    const GpuState state_start = be->gpu_state();
    ExperimentResult r = run_experiment(*be, *comm, spec);
    const GpuState state_end = be->gpu_state();
    if (r.status == "oom") exit_code = 3;
    if (!o.dump.empty() && r.status == "ok")
      dump_layer(*be, *comm, spec, policies.size() == 1 ? o.dump : o.dump + "/" + config_name(policy));

    theory::Dims td{static_cast<double>(dims.s), static_cast<double>(dims.b), static_cast<double>(dims.h),
                    static_cast<double>(dims.a), static_cast<double>(o.tp)};
    const double formula =
        theory::activation_bytes(td, theory_config(policy), {static_cast<double>(dtype_size(dtype)), 1.0});
    const bool have_time = be->computes() && r.status == "ok";
    const bool ok = r.status == "ok";
    std::vector<std::string> row = {
        be->name(), be->device_name(), o.model, std::to_string(dims.h), std::to_string(dims.a), std::to_string(dims.s),
        std::to_string(dims.b), std::to_string(o.tp), o.emulate_tp ? "1" : "0", config_name(policy),
        attention_name(policy.attention), recompute_name(policy.recompute), policy.sequence_parallel ? "1" : "0", dtype_name(dtype),
        fmt_num(o.dropout, "%g"), std::to_string(o.layers), std::to_string(o.warmup), std::to_string(o.iters),
        fmt_ms(r.fwd_ms.median, have_time), fmt_ms(r.bwd_ms.median, have_time), fmt_ms(r.total_ms.median, have_time),
        fmt_ms(r.fwd_ms.min, have_time), fmt_ms(r.fwd_ms.max, have_time), fmt_ms(r.bwd_ms.min, have_time),
        fmt_ms(r.bwd_ms.max, have_time), ok ? std::to_string(r.act_bytes) : "",
        ok ? std::to_string(r.act_extra_bytes) : "", fmt_num(formula), ok ? std::to_string(r.fwd_retained_bytes) : "",
        std::to_string(r.peak_allocated_bytes), std::to_string(r.peak_reserved_bytes), std::to_string(limit),
        comm_mode_name(comm->mode()), ok ? fmt_num(r.comm_bytes) : "", fmt_num(o.link_gbps, "%g"),
        ok ? fmt_num(r.comm_ms_modeled, "%.4f") : "",
        fmt_ms(r.comm_ms_emulated.median, have_time && comm->mode() == CommMode::modeled), r.status, r.message,
        std::to_string(o.seed), build_git_sha(), versions.driver, versions.cuda_runtime, versions.cublas, versions.nccl,
        state_start.sm_clock_mhz, state_end.sm_clock_mhz, state_start.mem_clock_mhz, state_end.mem_clock_mhz,
        state_start.power_limit_w, state_start.throttle_reasons, state_end.throttle_reasons, hostname(),
        utc_timestamp(), command};
    if (rank0 && cupti_csv && r.status == "ok") {
      // Per layer and timed iteration, so that it reads like fwd_ms/bwd_ms.
      const double per = static_cast<double>(o.iters) * o.layers;
      for (const PhaseTime& p : r.kernel_phases)
        cupti_csv->append({be->name(), be->device_name(), o.model, std::to_string(dims.h), std::to_string(dims.a),
                           std::to_string(dims.s), std::to_string(dims.b), std::to_string(o.tp),
                           o.emulate_tp ? "1" : "0", config_name(policy), dtype_name(dtype), fmt_num(o.dropout, "%g"),
                           std::to_string(o.layers), std::to_string(o.iters), p.phase,
                           p.phase.substr(0, p.phase.find('.')), fmt_num(static_cast<double>(p.kernels) / per, "%.2f"),
                           fmt_num(p.gpu_ms / per, "%.5f"), std::to_string(r.cupti_dropped_records), build_git_sha(),
                           utc_timestamp()});
    }
    if (rank0) {
      csv.append(row);
      std::printf("%-13s %-5s act %s (formula %s)%s%s\n", config_name(policy).c_str(), r.status.c_str(),
                  format_bytes(r.act_bytes).c_str(), format_bytes(static_cast<int64_t>(formula)).c_str(),
                  have_time ? (" fwd " + fmt_ms(r.fwd_ms.median, true) + " ms bwd " + fmt_ms(r.bwd_ms.median, true) +
                               " ms").c_str()
                            : "",
                  ok ? "" : (" " + r.message).c_str());
    }
  }
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  int code = 1;
  bool rank0 = true;
  if (const char* r = std::getenv("OMPI_COMM_WORLD_RANK")) rank0 = std::atoi(r) == 0;
  try {
    code = run(argc, argv);
  } catch (const InvalidArgument& e) {
    if (rank0) std::fprintf(stderr, "layer_run: error: %s\n", e.what());
    code = 2;
  } catch (const OutOfMemory& e) {
    if (rank0) std::fprintf(stderr, "layer_run: out of memory outside a measurement: %s\n", e.what());
    code = 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "layer_run: failure: %s\n", e.what());
    std::fflush(stderr);
    mpi_abort_if_initialized(1);
    code = 1;
  }
  std::fflush(stdout);
  mpi_finalize_if_initialized();
  return code;
}
