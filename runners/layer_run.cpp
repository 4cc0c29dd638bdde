// layer_run: one experiment -> one CSV row per configuration (DESIGN.md, "Contracts").
// Exit status: 0 ok, 2 bad input (one line on stderr, no row), 3 out of memory (row with
// status=oom), 1 any other failure. Under mpirun every check is agreed by all ranks (see
// Verdicts), so that all stop together with one line and the same status.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <limits>
#include <memory>

#include "kernels/backend.hpp"
#include "kernels/backend_comm.hpp"
#include "runners/experiment.hpp"
#include "runners/hf_config.hpp"
#include "runners/presets.hpp"
#include "runners/run_args.hpp"
#include "runtime/communicator.hpp"
#include "runtime/csv.hpp"
#include "runtime/cupti_profiler.hpp"
#include "runtime/error.hpp"
#include "runtime/provenance.hpp"
#include "theory/activation_memory.hpp"
#include "theory/llama_memory.hpp"

using namespace actbench;

namespace {

// --config's default: the paper's five.
std::string paper_configs_option() {
  std::string text;
  for (const std::string& c : paper_config_names()) text += (text.empty() ? "" : ",") + c;
  return text;
}

const std::vector<std::string> kCsvHeader = {
    "backend", "device", "model", "hidden", "heads", "seq", "batch", "tp", "emulated", "config", "attention",
    "recompute", "sequence_parallel", "dtype", "dropout", "layers", "warmup", "iters", "fwd_ms", "bwd_ms", "total_ms",
    "fwd_ms_min", "fwd_ms_max", "bwd_ms_min", "bwd_ms_max", "act_bytes", "act_extra_bytes", "act_bytes_formula",
    "fwd_retained_bytes", "peak_allocated_bytes", "peak_reserved_bytes", "memory_limit_bytes", "comm_mode",
    "comm_bytes", "link_gbps", "comm_ms_modeled", "comm_ms_emulated", "status", "message", "seed", "git_sha",
    "driver_version", "cuda_runtime_version", "cublas_version", "nccl_version", "sm_clock_mhz_start",
    "sm_clock_mhz_end", "mem_clock_mhz_start", "mem_clock_mhz_end", "power_limit_w", "throttle_reasons_start",
    "throttle_reasons_end", "hostname", "timestamp", "command", "arch", "kv_heads", "ffn_hidden"};

// layer_run --cupti FILE: GPU kernel time per phase, per layer and timed iteration.
const std::vector<std::string> kCuptiHeader = {
    "backend", "device", "model", "hidden", "heads", "seq", "batch", "tp", "emulated", "config", "dtype", "dropout",
    "layers", "iters", "phase", "stage", "kernels", "gpu_ms", "dropped_records", "git_sha", "timestamp"};

// What the command line says, each value as given (a value option counts when given).
struct Args {
  std::string backend = "cpu", model = "tiny", configs = paper_configs_option(), attention = "unfused", dtype = "bf16";
  std::string hidden, heads, seq, batch, tp, layers = "1", warmup = "2", iters = "10", dropout = "0.1",
                                                seed = "1234", link_gbps = "450";
  std::string csv, dump, cupti, memory_limit;
  std::string arch, kv_heads, ffn_hidden, rope_theta, norm_eps, hf_config;
  bool emulate_tp = false;
};

// The arguments taken strictly (run_args.hpp): a given value is used or refused.
struct Options {
  std::string backend, model, attention, dtype, csv, dump, cupti;
  std::vector<std::string> configs;
  int64_t hidden = 0, heads = 0, seq = 0, batch = 0;  // 0: not given, the preset's
  int tp = 0;                                          // 0: not given
  int layers = 1, warmup = 2, iters = 10;
  bool warmup_given = false, iters_given = false, emulate_tp = false;
  float dropout = 0.1f;
  uint64_t seed = 1234;
  double link_gbps = 450.0;
  uint64_t memory_limit = 0;  // 0: none
  std::string print_only;     // --help or --print-csv-header: print this, run nothing
  // --arch llama and its shape (0 or empty: the preset's or the config's)
  std::string arch, hf_config;
  int64_t kv_heads = 0, ffn_hidden = 0;
  double rope_theta = 0;
  float norm_eps = 0;
  bool dropout_given = false;
};

// The layer family's flags on top of the preset: --hf-config, --arch, --kv-heads, --ffn-hidden,
// --rope-theta, --norm-eps. Dropout defaults to 0 for llama (which has none).
void apply_arch_options(Options& o, LayerDims& dims, bool seq_given) {
  if (!o.hf_config.empty()) {
    const HfModelConfig c = read_hf_config(o.hf_config);
    dims.arch = Arch::llama;
    dims.h = c.hidden;
    dims.a = c.heads;
    dims.kv_heads = c.kv_heads;
    dims.ffn_hidden = c.ffn_hidden;
    dims.rope_theta = c.rope_theta;
    dims.norm_eps = static_cast<float>(c.rms_norm_eps);
    if (!seq_given) dims.s = c.max_positions;
    dims.b = 1;
    o.model = c.name;
  }
  if (!o.arch.empty()) {
    const Arch a = parse_arch(o.arch);
    if (a == Arch::gpt && dims.arch == Arch::llama)
      throw InvalidArgument("--arch gpt with a llama model (" + o.model + ")");
    dims.arch = a;
  }
  if (dims.arch == Arch::gpt) {
    if (o.kv_heads || o.ffn_hidden || o.rope_theta != 0 || o.norm_eps != 0)
      throw InvalidArgument("--kv-heads, --ffn-hidden, --rope-theta and --norm-eps need --arch llama");
    return;
  }
  if (o.kv_heads) dims.kv_heads = o.kv_heads;
  if (o.ffn_hidden) dims.ffn_hidden = o.ffn_hidden;
  if (o.rope_theta != 0) dims.rope_theta = o.rope_theta;
  if (o.norm_eps != 0) dims.norm_eps = o.norm_eps;
  if (!o.dropout_given) o.dropout = 0.f;
  if (o.dropout != 0.f) throw InvalidArgument("--arch llama has no dropout: --dropout must be 0");
}

// Each option as a canonical string: ranks compare these (0.1 and 0.10 are the same value).
std::vector<std::pair<std::string, std::string>> normalized(const Options& o) {
  auto given = [](int64_t v) { return v ? std::to_string(v) : std::string("preset"); };
  auto real = [](double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%a", v);
    return std::string(buf);
  };
  std::string configs;
  for (const std::string& c : o.configs) configs += (configs.empty() ? "" : ",") + c;
  return {{"layer_run build (git sha)", build_git_sha()},
          {"--help/--print-csv-header", o.print_only},
          {"--backend", o.backend},
          {"--model", o.model},
          {"--hidden", given(o.hidden)},
          {"--heads", given(o.heads)},
          {"--seq", given(o.seq)},
          {"--batch", given(o.batch)},
          {"--tp", given(o.tp)},
          {"--emulate-tp", o.emulate_tp ? "1" : "0"},
          {"--config", configs},
          {"--attention", o.attention},
          {"--dtype", o.dtype},
          {"--dropout", real(o.dropout)},
          {"--layers", std::to_string(o.layers)},
          {"--warmup", o.warmup_given ? std::to_string(o.warmup) : "default"},
          {"--iters", o.iters_given ? std::to_string(o.iters) : "default"},
          {"--seed", std::to_string(o.seed)},
          {"--link-gbps", real(o.link_gbps)},
          {"--memory-limit", std::to_string(o.memory_limit)},
          {"--csv", o.csv},
          {"--dump", o.dump},
          {"--cupti", o.cupti},
          {"--arch", o.arch},
          {"--kv-heads", given(o.kv_heads)},
          {"--ffn-hidden", given(o.ffn_hidden)},
          {"--rope-theta", real(o.rope_theta)},
          {"--norm-eps", real(o.norm_eps)},
          {"--hf-config", o.hf_config}};
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

theory::Dims theory_dims(const LayerDims& d, int tp) {
  return {static_cast<double>(d.s), static_cast<double>(d.b), static_cast<double>(d.h), static_cast<double>(d.a),
          static_cast<double>(tp)};
}

theory::Config theory_config(LayerPolicy p);

// Table 2's bytes (or the llama family's closed form) for this layer and configuration.
double formula_bytes(const LayerDims& d, int tp, LayerPolicy p, DType dtype) {
  const theory::Dims td = theory_dims(d, tp);
  const theory::Precision precision{static_cast<double>(dtype_size(dtype)), 1.0};
  if (d.arch == Arch::llama)
    return theory::llama_activation_bytes(
        {td.s, td.b, td.h, td.a, static_cast<double>(d.groups()), static_cast<double>(d.ffn()), td.t},
        theory_config(p), precision);
  return theory::activation_bytes(td, theory_config(p), precision);
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

// Parses the command line into `o` (o.print_only set for --help and --print-csv-header).
void parse_options(int argc, char** argv, Options& o) {
  CLI::App app{"layer_run: time and measure one transformer layer in the paper's configurations"};
  Args a;
  std::vector<std::pair<std::string, CLI::Option*>> given;
  auto value = [&](const char* name, std::string& field, const char* help, bool show_default) {
    CLI::Option* opt = app.add_option(name, field, help);
    if (show_default) opt->capture_default_str();
    given.emplace_back(name, opt);
  };
  value("--backend", a.backend, "cpu | cuda | meta", true);
  value("--model", a.model, "tiny | 22b | 175b | 530b | 1t", true);
  value("--hidden", a.hidden, "override the preset's hidden size h", false);
  value("--heads", a.heads, "override the preset's attention heads a", false);
  value("--seq", a.seq, "override the preset's sequence length s", false);
  value("--batch", a.batch, "override the preset's microbatch b", false);
  value("--tp", a.tp, "tensor-parallel size (default: MPI world size; with --emulate-tp the preset's t)", false);
  app.add_flag("--emulate-tp", a.emulate_tp, "one process plays rank 0 of --tp ranks; communication modeled");
  value("--config", a.configs, "comma-separated: baseline,sp,full,selective,selective+sp[,full+sp]", true);
  value("--attention", a.attention,
        "unfused (the paper's) | fused (FlashAttention-style: no probabilities or masks stored)", true);
  value("--dtype", a.dtype, "bf16 | fp16 | fp32", true);
  value("--dropout", a.dropout, "dropout probability (gpt; llama has none)", true);
  value("--layers", a.layers, "layers in the stack, 1..1024 (times and bytes are reported per layer)", true);
  value("--warmup", a.warmup, "untimed iterations (meta: 0)", true);
  value("--iters", a.iters, "timed iterations (meta: 1)", true);
  value("--seed", a.seed, "seed of parameters, inputs and dropout masks (0..2^64-1)", true);
  value("--csv", a.csv, "results CSV to append to (required)", false);
  bool print_header = false;
  app.add_flag("--print-csv-header", print_header, "print the CSV header line and exit (for sweep drivers)");
  value("--dump", a.dump, "write canonical .npy tensors of one layer here (rank 0)", false);
  value("--cupti", a.cupti, "write GPU kernel time per phase (CUPTI) to this CSV (cuda backend; Figure 8's split)",
        false);
  value("--memory-limit", a.memory_limit, "emulate a device of this size, e.g. 80GiB (OOM past it)", false);
  value("--link-gbps", a.link_gbps, "link bandwidth per direction for comm_ms_modeled, GB/s", true);
  value("--arch", a.arch, "gpt (the paper's layer) | llama (RMSNorm, GQA, RoPE, SwiGLU; default: the preset's)",
        false);
  value("--kv-heads", a.kv_heads, "llama: key/value heads g (1 <= g <= heads, dividing heads; default heads)", false);
  value("--ffn-hidden", a.ffn_hidden, "llama: SwiGLU width F (fc1 has 2F outputs; default 4 x hidden)", false);
  value("--rope-theta", a.rope_theta, "llama: RoPE base theta (default 10000, the preset's or the config's)", false);
  value("--norm-eps", a.norm_eps, "llama: RMSNorm epsilon (default 1e-5 or the config's)", false);
  value("--hf-config", a.hf_config, "a Hugging Face config.json of a LLaMA-style model (sets --arch llama)", false);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    o.print_only = app.help();
    return;
  } catch (const CLI::ParseError& e) {
    throw InvalidArgument(e.what());
  }
  if (print_header) {
    o.print_only = csv_line(kCsvHeader);
    return;
  }
  // An empty value is refused, never read as "use the preset" (--seq '', --dump '').
  for (const auto& [name, opt] : given)
    if (opt->count() && opt->as<std::string>().empty())
      throw InvalidArgument(name + " needs a value (got an empty string)");
  if (a.csv.empty()) throw InvalidArgument("--csv FILE is required");
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  constexpr int64_t kMaxDim = std::numeric_limits<int64_t>::max();
  auto is_given = [&](const char* name) {
    for (const auto& [n, opt] : given)
      if (n == name) return opt->count() > 0;
    return false;
  };
  o.backend = a.backend;
  o.model = a.model;
  o.attention = a.attention;
  o.dtype = a.dtype;
  o.csv = a.csv;
  o.dump = a.dump;
  o.cupti = a.cupti;
  o.configs = parse_config_list("--config", a.configs);
  if (is_given("--hidden")) o.hidden = parse_int_option("--hidden", a.hidden, 1, kMaxDim);
  if (is_given("--heads")) o.heads = parse_int_option("--heads", a.heads, 1, kMaxDim);
  if (is_given("--seq")) o.seq = parse_int_option("--seq", a.seq, 1, kMaxDim);
  if (is_given("--batch")) o.batch = parse_int_option("--batch", a.batch, 1, kMaxDim);
  if (is_given("--tp")) o.tp = static_cast<int>(parse_int_option("--tp", a.tp, 1, kMaxInt));
  o.emulate_tp = a.emulate_tp;
  o.layers = static_cast<int>(parse_int_option("--layers", a.layers, 1, kMaxLayers));
  o.warmup = static_cast<int>(parse_int_option("--warmup", a.warmup, 0, kMaxIterations));
  o.iters = static_cast<int>(parse_int_option("--iters", a.iters, 1, kMaxIterations));
  o.warmup_given = is_given("--warmup");
  o.iters_given = is_given("--iters");
  o.dropout = static_cast<float>(parse_real_option("--dropout", a.dropout)) + 0.0f;  // -0 is 0
  if (!(o.dropout >= 0.f && o.dropout < 1.f)) throw InvalidArgument("--dropout must be in [0, 1), got " + a.dropout);
  o.seed = parse_uint64_option("--seed", a.seed);
  o.link_gbps = parse_real_option("--link-gbps", a.link_gbps);
  // Outside this a modeled time is no longer a number a row can carry.
  if (!(o.link_gbps >= 1e-3 && o.link_gbps <= 1e6))
    throw InvalidArgument("--link-gbps must be in 0.001..1000000 (GB/s), got " + a.link_gbps);
  if (is_given("--memory-limit")) o.memory_limit = parse_memory_size("--memory-limit", a.memory_limit);
  o.dropout_given = is_given("--dropout");
  o.arch = a.arch;
  o.hf_config = a.hf_config;
  if (is_given("--kv-heads")) o.kv_heads = parse_int_option("--kv-heads", a.kv_heads, 1, kMaxDim);
  if (is_given("--ffn-hidden")) o.ffn_hidden = parse_int_option("--ffn-hidden", a.ffn_hidden, 1, kMaxDim);
  if (is_given("--rope-theta")) {
    o.rope_theta = parse_real_option("--rope-theta", a.rope_theta);
    if (!(o.rope_theta > 0)) throw InvalidArgument("--rope-theta must be positive, got " + a.rope_theta);
  }
  if (is_given("--norm-eps")) {
    o.norm_eps = static_cast<float>(parse_real_option("--norm-eps", a.norm_eps));
    if (!(o.norm_eps > 0 && std::isfinite(o.norm_eps)))
      throw InvalidArgument("--norm-eps must be a positive float, got " + a.norm_eps);
  }
}

// How a failure is reported: its exit status and its one line.
struct Failure {
  int code = 0;  // 0: none
  std::string line;
};

Failure current_failure() {
  auto one_line = [](std::string s) {
    for (char& c : s)
      if (c == '\n' || c == '\r') c = ' ';
    while (!s.empty() && s.back() == ' ') s.pop_back();
    return s;
  };
  try {
    throw;
  } catch (const InvalidArgument& e) {
    return {2, "layer_run: error: " + one_line(e.what())};
  } catch (const OutOfMemory& e) {
    return {3, "layer_run: out of memory outside a measurement: " + one_line(e.what())};
  } catch (const std::exception& e) {
    return {1, "layer_run: failure: " + one_line(e.what())};
  } catch (...) {
    return {1, "layer_run: failure: unknown exception"};
  }
}

void say(const Failure& f) {
  std::fprintf(stderr, "%s\n", f.line.c_str());
  std::fflush(stderr);
}

// How long a rank that failed alone waits for its peers to take its verdict before it ends
// the job: peers that failed at the same point arrive within moments (an allocation that
// fails on one rank fails on all, perhaps one operation later on a slower rank).
constexpr double kFailureWaitSeconds = 3.0, kOutOfMemoryWaitSeconds = 10.0;

// Every rank has agreed to stop with this status; the one line is already printed.
struct AgreedExit {
  int code;
};

// Offers this rank's failure (if any) to every rank; slot 0 of `slots` carries the verdict,
// the rest any payload. When some rank failed, the lowest failing rank prints its line and
// every rank throws AgreedExit with that rank's status. Returns false (nothing thrown) when
// the peers did not all join within timeout_s (< 0: wait).
bool agree(Communicator& world, const Failure& mine, int64_t* slots, double timeout_s = -1) {
  const int64_t n = world.size(), rank = world.rank();
  // The max picks the lowest failing rank; its status rides in the low byte.
  slots[0] = mine.code ? ((n - rank) << 8) | mine.code : 0;
  if (!mpi_agree_max(slots, timeout_s)) return false;
  if (slots[0] == 0) return true;
  const int64_t speaker = n - (slots[0] >> 8);
  if (speaker == rank) say(mine);
  throw AgreedExit{static_cast<int>(slots[0] & 0xff)};
}

// The verdicts of one run: under mpirun every check is collective, so that ranks stop
// together, with one line, whatever rank found the problem. One process: checks just run.
class Verdicts {
 public:
  explicit Verdicts(Communicator* world) : world_(world) {}

  // Runs `check` on this rank, then every rank learns whether it failed anywhere.
  template <class F>
  void check(F&& check) {
    if (!world_) return check();
    Failure mine;
    try {
      check();
    } catch (...) {
      mine = current_failure();
    }
    int64_t slots[kAgreeSlots] = {};
    agree(*world_, mine, slots);
  }

  // Ranks given different arguments would run different collectives and wait for each
  // other forever: compare every option, name the first that differs.
  void same_arguments(const std::vector<std::pair<std::string, std::string>>& options) {
    if (!world_) return;
    if (1 + 2 * options.size() > static_cast<size_t>(kAgreeSlots)) throw RuntimeFailure("too many options to compare");
    int64_t slots[kAgreeSlots] = {};
    for (size_t i = 0; i < options.size(); ++i) {
      const int64_t h = argument_hash(options[i].second);
      slots[1 + 2 * i] = h;
      slots[2 + 2 * i] = -h;
    }
    agree(*world_, {}, slots);
    for (size_t i = 0; i < options.size(); ++i)
      if (slots[1 + 2 * i] != -slots[2 + 2 * i]) {
        if (world_->rank() == 0)
          say({2, "layer_run: error: the ranks were given different " + options[i].first +
                      " (every rank must get the same arguments)"});
        throw AgreedExit{2};
      }
  }

  // Out of memory is recorded in the row when every rank ran out at the same point (the
  // ranks are alike, so they do). A rank that ran out alone has left peers waiting in a
  // collective: it offers its verdict for a few seconds, then ends the job.
  void same_status(ExperimentResult& r) {
    if (!world_) return;
    const bool oom = r.status == "oom";
    int64_t slots[kAgreeSlots] = {};
    slots[1] = oom ? world_->size() - world_->rank() : 0;  // the lowest rank out of memory
    if (!agree(*world_, {}, slots, oom ? kOutOfMemoryWaitSeconds : -1)) {
      say({3, "layer_run: out of memory on rank " + std::to_string(world_->rank()) +
                  " alone (the other ranks cannot go on): " + r.message});
      mpi_abort_if_initialized(3);
    }
    if (slots[1] && !oom) {
      r = ExperimentResult{};
      r.status = "oom";
      r.message = "out of memory on rank " + std::to_string(world_->size() - slots[1]);
    }
  }

  // The run's exit status, the same on every rank.
  int exit_code(int mine) {
    if (!world_) return mine;
    int64_t slots[kAgreeSlots] = {};
    slots[1] = mine;
    agree(*world_, {}, slots);
    return static_cast<int>(slots[1]);
  }

 private:
  Communicator* world_;
};

int run(int argc, char** argv, std::unique_ptr<Communicator>& world_comm) {
  Options o;
  std::exception_ptr parse_error;
  try {
    parse_options(argc, argv, o);
  } catch (...) {
    parse_error = std::current_exception();
  }
  // Under mpirun the MPI world exists first, so that every check below is agreed by all
  // ranks; the run's tensor-parallel group is made once the backend exists (NCCL on its
  // stream for cuda).
  if (mpi_launched()) {
    bind_device_for_rank(o.backend, mpi_world_rank_from_env());  // one GPU per rank, before MPI_Init
    world_comm = make_mpi_communicator();
  }
  Verdicts verdicts(world_comm.get());
  verdicts.check([&] {
    if (parse_error) std::rethrow_exception(parse_error);
  });
  verdicts.same_arguments(normalized(o));
  if (!o.print_only.empty()) {
    if (!world_comm || world_comm->rank() == 0) std::printf("%s", o.print_only.c_str());
    return verdicts.exit_code(0);
  }

  const int world = world_comm ? world_comm->size() : 1;
  const int world_rank = world_comm ? world_comm->rank() : 0;
  const bool rank0 = world_rank == 0;
  LayerDims dims;
  std::vector<LayerPolicy> policies;
  DType dtype = DType::bf16;
  CsvAppender csv(o.csv, kCsvHeader);
  std::unique_ptr<CsvAppender> cupti_csv;
  std::unique_ptr<Backend> be;
  std::unique_ptr<CuptiProfiler> profiler;
  auto dump_dir = [&](LayerPolicy p) { return policies.size() == 1 ? o.dump : o.dump + "/" + config_name(p); };
  // Everything that can be refused is refused here, on every rank, before the first row.
  verdicts.check([&] {
    const ModelPreset& preset = find_preset(o.model);
    if (o.emulate_tp) {
      if (world > 1) throw InvalidArgument("--emulate-tp runs in one process; do not launch it with mpirun -np > 1");
      if (!o.dump.empty())
        throw InvalidArgument("--dump cannot be combined with --emulate-tp (emulated values are not the layer's)");
      if (o.tp == 0) o.tp = preset.tp;
    } else {
      if (o.tp == 0) o.tp = world;
      if (o.tp != world)
        throw InvalidArgument("--tp " + std::to_string(o.tp) + " but the MPI world has " + std::to_string(world) +
                              " rank(s): run under mpirun -np " + std::to_string(o.tp) + " or add --emulate-tp");
    }
    dims = preset.dims;
    if (o.hidden) dims.h = o.hidden;
    if (o.heads) dims.a = o.heads;
    if (o.seq) dims.s = o.seq;
    if (o.batch) dims.b = o.batch;
    apply_arch_options(o, dims, o.seq != 0);
    const Attention attention = parse_attention(o.attention);
    for (const std::string& name : o.configs) {
      policies.push_back(parse_config(name));
      policies.back().attention = attention;
    }
    for (LayerPolicy p : policies) validate_layer(dims, o.tp, p);
    check_layer_extent(dims, o.layers);
    dtype = parse_dtype(o.dtype);
    if (!o.dump.empty() && o.layers != 1) throw InvalidArgument("--dump writes one layer: use --layers 1");
    if (!o.cupti.empty() && o.backend != "cuda")
      throw InvalidArgument("--cupti records GPU kernels: it needs --backend cuda");
    if (world > 1 && o.backend == "cpu") {
      // Host collectives carry one tensor per MPI message, whose count is an int.
      const int64_t widest = std::max(dims.s * dims.b * dims.h, 4 * dims.h * dims.h / o.tp);
      if (widest > std::numeric_limits<int>::max())
        throw InvalidArgument("a tensor of " + std::to_string(widest) +
                              " elements exceeds one MPI message (2^31 - 1) on the cpu backend; use a smaller shape");
    }
    // Every output, before anything runs (rank 0 writes them all).
    if (rank0) {
      csv.check();
      auto same_path = [](const std::string& a, const std::string& b) {
        std::error_code ea, eb;
        const auto ca = std::filesystem::weakly_canonical(a, ea), cb = std::filesystem::weakly_canonical(b, eb);
        return a == b || (!ea && !eb && ca == cb);
      };
      if (!o.cupti.empty()) {
        if (same_path(o.cupti, o.csv)) throw InvalidArgument("--cupti '" + o.cupti + "' is the --csv file; give it its own");
        cupti_csv = std::make_unique<CsvAppender>(o.cupti, kCuptiHeader);
        cupti_csv->check();
      }
      if (!o.dump.empty())
        for (LayerPolicy p : policies) {
          check_output_dir("--dump", dump_dir(p));
          for (const std::string& file : {o.csv, o.cupti})
            if (!file.empty() && same_path(file, dump_dir(p)))
              throw InvalidArgument("--dump folder '" + dump_dir(p) + "' is the file '" + file + "'");
        }
    }
    be = make_backend(o.backend, static_cast<size_t>(o.memory_limit));
    if (!be->computes() && !o.dump.empty())
      throw InvalidArgument("--dump writes tensor values: it needs --backend cpu or cuda, not meta");
    // Timing means nothing on meta or on the CPU simulator: one iteration gives the memory
    // schedule (and, on the simulator, the values), unless asked for more.
    if (!be->computes() || be->simulated()) {
      if (!o.warmup_given) o.warmup = 0;
      if (!o.iters_given) o.iters = 1;
    }
    if (be->simulated() && rank0)
      std::fprintf(stderr, "layer_run: %s: the cuda backend runs on the CPU simulator; values and bytes are "
                           "results, time columns stay empty\n", be->device_name().c_str());
    if (o.backend == "cpu") {
      double activations = 0;  // per layer and rank, the largest configuration's
      for (LayerPolicy p : policies)
        activations = std::max(activations, formula_bytes(dims, o.tp, p, dtype));
      check_host_memory(dims, o.tp, o.layers, dtype, activations, o.memory_limit);
    }
    if (!o.cupti.empty()) profiler = CuptiProfiler::create();
  });
  std::unique_ptr<Communicator> comm;
  if (o.emulate_tp) comm = make_backend_emulated_communicator(*be, o.tp);
  else if (world > 1) comm = make_world_communicator(*be);
  else comm = make_backend_local_communicator(*be);

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
    verdicts.same_status(r);
    if (r.status == "oom") exit_code = 3;
    if (!o.dump.empty() && r.status == "ok") dump_layer(*be, *comm, spec, dump_dir(policy));

    const double formula = formula_bytes(dims, o.tp, policy, dtype);
    const bool have_time = be->computes() && !be->simulated() && r.status == "ok";
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
        std::to_string(r.peak_allocated_bytes), std::to_string(r.peak_reserved_bytes), std::to_string(o.memory_limit),
        comm_mode_name(comm->mode()), ok ? fmt_num(r.comm_bytes) : "", fmt_num(o.link_gbps, "%g"),
        ok ? fmt_num(r.comm_ms_modeled, "%.4f") : "",
        fmt_ms(r.comm_ms_emulated.median, have_time && comm->mode() == CommMode::modeled), r.status, r.message,
        std::to_string(o.seed), build_git_sha(), versions.driver, versions.cuda_runtime, versions.cublas, versions.nccl,
        state_start.sm_clock_mhz, state_end.sm_clock_mhz, state_start.mem_clock_mhz, state_end.mem_clock_mhz,
        state_start.power_limit_w, state_start.throttle_reasons, state_end.throttle_reasons, hostname(),
        utc_timestamp(), command, arch_name(dims.arch),
        dims.arch == Arch::llama ? std::to_string(dims.groups()) : "",
        dims.arch == Arch::llama ? std::to_string(dims.ffn()) : ""};
    // Rank 0 writes; every rank learns whether that worked before the next configuration.
    verdicts.check([&] {
      if (!rank0) return;
      if (cupti_csv && r.status == "ok") {
        // Per layer and timed iteration, so that it reads like fwd_ms/bwd_ms.
        const double per = static_cast<double>(o.iters) * o.layers;
        for (const PhaseTime& p : r.kernel_phases)
          cupti_csv->append({be->name(), be->device_name(), o.model, std::to_string(dims.h), std::to_string(dims.a),
                             std::to_string(dims.s), std::to_string(dims.b), std::to_string(o.tp),
                             o.emulate_tp ? "1" : "0", config_name(policy), dtype_name(dtype), fmt_num(o.dropout, "%g"),
                             std::to_string(o.layers), std::to_string(o.iters), p.phase,
                             p.phase.substr(0, p.phase.find('.')), fmt_num(static_cast<double>(p.kernels) / per, "%.2f"),
                             be->simulated() ? "" : fmt_num(p.gpu_ms / per, "%.5f"), std::to_string(r.cupti_dropped_records),
                             build_git_sha(), utc_timestamp()});
      }
      csv.append(row);
      std::printf("%-13s %-5s act %s (formula %s)%s%s\n", config_name(policy).c_str(), r.status.c_str(),
                  format_bytes(r.act_bytes).c_str(), format_bytes(static_cast<int64_t>(formula)).c_str(),
                  have_time ? (" fwd " + fmt_ms(r.fwd_ms.median, true) + " ms bwd " + fmt_ms(r.bwd_ms.median, true) +
                               " ms").c_str()
                            : "",
                  ok ? "" : (" " + r.message).c_str());
    });
  }
  return verdicts.exit_code(exit_code);
}

// A failure outside an agreed check: under mpirun the peers may be waiting in a collective
// for this rank. Offer the verdict for a few seconds (peers that failed at the same point,
// or are at their next check, take it and all stop cleanly); else end every rank.
int fail(Communicator* world) {
  const Failure mine = current_failure();
  if (world && world->size() > 1) {
    int64_t slots[kAgreeSlots] = {};
    try {
      if (agree(*world, mine, slots, kFailureWaitSeconds)) return mine.code;  // not reached: a failure throws
    } catch (const AgreedExit& e) {
      return e.code;
    } catch (...) {  // MPI itself failed: nothing left to agree with
    }
    say(mine);
    mpi_abort_if_initialized(mine.code);
    return mine.code;
  }
  say(mine);
  return mine.code;
}

}  // namespace

int main(int argc, char** argv) {
  std::unique_ptr<Communicator> world;
  int code = 1;
  try {
    code = run(argc, argv, world);
  } catch (const AgreedExit& e) {
    code = e.code;
  } catch (...) {
    code = fail(world.get());
  }
  std::fflush(stdout);
  world.reset();
  mpi_finalize_if_initialized();
  return code;
}
