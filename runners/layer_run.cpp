// layer_run: one experiment -> one CSV row per configuration (docs/results_schema.md).
// Exit status: 0 ok, 2 bad input (one line on stderr, no row), 3 out of memory (row with
// status=oom), 1 any other failure. Under mpirun every check is agreed by all ranks
// (rank_agreement.hpp), so that all stop together with one line and the same status.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <memory>

#include "kernels/backend.hpp"
#include "kernels/backend_comm.hpp"
#include "runners/closed_form.hpp"
#include "runners/experiment.hpp"
#include "runners/layer_run_options.hpp"
#include "runners/rank_agreement.hpp"
#include "runners/result_columns.hpp"
#include "runners/result_row.hpp"
#include "runners/run_args.hpp"
#include "runtime/communicator.hpp"
#include "runtime/csv.hpp"
#include "runtime/cupti_profiler.hpp"
#include "runtime/error.hpp"
#include "runtime/kernel_report.hpp"
#include "runtime/provenance.hpp"

using namespace actbench;

namespace {

// What one call runs on, made once every check has passed.
struct Setup {
  LayerRunPlan plan;
  std::unique_ptr<Backend> be;
  std::unique_ptr<CuptiProfiler> profiler;
  std::unique_ptr<CsvAppender> cupti_csv;  // rank 0, with --cupti
  std::unique_ptr<KernelReportRecorder> kernel_report;
  std::unique_ptr<CsvAppender> kernel_report_csv;  // rank 0, with --kernel-report
  Communicator* cp_group = nullptr;                  // with --cp C > 1
  Communicator* ep_group = nullptr;                  // with --expert-model-parallel-size > 1 (not --tp)
  Communicator* dp_group = nullptr;                  // the data-parallel replicas the EP group spans
};

// --kernel-report's file: the configuration and the phase, then the simulator's kernel columns.
std::vector<std::string> kernel_report_header(const KernelReportRecorder& r) {
  std::vector<std::string> head = {"config", "phase"};
  for (const std::string& c : r.columns()) head.push_back(c);
  return head;
}
std::vector<std::string> kernel_report_row(const std::string& config, const KernelReportRecorder::Row& k) {
  std::vector<std::string> row = {config, k.phase};
  row.insert(row.end(), k.fields.begin(), k.fields.end());
  return row;
}

// The backend and what depends on it: meta and the simulator default to one iteration; the
// cpu backend refuses a stack the host cannot hold.
void make_backend_for(LayerRunOptions& o, Setup& s, bool rank0) {
  s.be = make_backend(o.backend, static_cast<size_t>(o.memory_limit));
  if (!s.be->computes() && !o.dump.empty())
    throw InvalidArgument("--dump writes tensor values: it needs --backend cpu or cuda, not meta");
  // Timing means nothing on meta or on the CPU simulator: one iteration gives the memory
  // schedule (and, on the simulator, the values), unless asked for more.
  if (!s.be->computes() || s.be->simulated()) {
    if (!o.warmup_given) o.warmup = 0;
    if (!o.iters_given) o.iters = 1;
  }
  if (s.be->simulated() && rank0)
    std::fprintf(stderr, "layer_run: %s: the cuda backend runs on the CPU simulator; values and bytes are "
                         "results, time columns stay empty\n", s.be->device_name().c_str());
  if (o.backend == "cpu") {
    double activations = 0;  // per layer and rank, the largest configuration's
    for (LayerPolicy p : s.plan.policies)
      activations = std::max(activations, formula_bytes(s.plan.dims, o.tp, p, s.plan.dtype, o.cp));
    check_host_memory(s.plan.dims, o.tp, o.layers, s.plan.dtype, activations, o.memory_limit);
  }
  if (!o.cupti.empty()) s.profiler = CuptiProfiler::create();
}

// Everything that can be refused is refused here, on every rank, before the first row.
void prepare(LayerRunOptions& o, Setup& s, const CsvAppender& csv, int world, bool rank0) {
  s.plan = plan_layer_run(o, world);
  if (!o.kernel_report.empty()) s.kernel_report = KernelReportRecorder::create(o.kernel_report_device);
  if (rank0) {
    if (!o.cupti.empty()) s.cupti_csv = std::make_unique<CsvAppender>(o.cupti, column_names(cupti_columns()));
    if (s.kernel_report) s.kernel_report_csv = std::make_unique<CsvAppender>(o.kernel_report, kernel_report_header(*s.kernel_report));
    check_outputs(o, s.plan.policies, csv, s.cupti_csv.get(), s.kernel_report_csv.get());
  }
  make_backend_for(o, s, rank0);
}

// The run's tensor-parallel group and, under --cp, its context-parallel group, or under
// expert parallelism over data-parallel replicas its expert-parallel group and the replicas
// (emulated, or the world split in Megatron's order under mpirun).
struct Groups {
  std::unique_ptr<Communicator> world, tp, cp, ep, dp;
  Communicator* experts = nullptr;   // the expert-parallel group: the world (etp 1), a TP rank's peers (etp = t)
  Communicator* replicas = nullptr;  // the data-parallel replicas: dp (null: one), or at t = C = 1 the EP group
};
// Expert parallelism over data-parallel replicas, in Megatron-Core's order: with etp 1 the
// world (ep ranks: ep/(t·C) replicas of the t x C grid) is the expert-parallel group; with
// etp = t the world is t·ep ranks (ep/C replicas) and the EP group is each TP rank's ep peers
// (its C CP ranks in each replica).
Groups make_expert_parallel_groups(const LayerRunOptions& o, Backend& be) {
  Groups g;
  const bool etp = o.etp > 1;
  const int replicas = o.ep / (etp ? o.cp : o.tp * o.cp);
  if (o.emulate_ep) {
    g.ep = make_backend_emulated_communicator(be, o.ep);
    g.tp = o.tp > 1 ? make_backend_emulated_communicator(be, o.tp) : make_backend_local_communicator(be);
    if (o.cp > 1) g.cp = make_backend_emulated_communicator(be, o.cp);
    if (replicas > 1) g.dp = make_backend_emulated_communicator(be, replicas);
    g.experts = g.ep.get();
  } else if (o.tp * o.cp == 1) {  // the world is the EP group and the replicas
    g.ep = make_world_communicator(be);
    g.tp = make_backend_local_communicator(be);
    g.experts = g.ep.get();
    g.replicas = g.ep.get();
    return g;
  } else {
    // With etp = t at C = 1 the TP rank's peers are its replicas: the DP group serves both.
    ParallelGroups split = make_data_parallel_groups(be, o.tp, o.cp, replicas, etp && o.cp > 1);
    g.world = std::move(split.world);
    g.tp = std::move(split.tp);
    if (o.cp > 1) g.cp = std::move(split.cp);
    if (replicas > 1) g.dp = std::move(split.dp);
    g.ep = std::move(split.tp_peers);
    g.experts = !etp ? g.world.get() : g.ep ? g.ep.get() : g.dp.get();
  }
  g.replicas = g.dp.get();
  return g;
}

Groups make_groups(const LayerRunOptions& o, Backend& be, int world) {
  if (o.ep > 1 && !o.experts_over_tp()) return make_expert_parallel_groups(o, be);
  Groups g;
  if (world > 1 && o.cp > 1) {
    ParallelGroups split = make_parallel_groups(be, o.tp, o.cp);
    g.world = std::move(split.world);
    g.tp = std::move(split.tp);
    g.cp = std::move(split.cp);
    return g;
  }
  if (o.emulate_tp) g.tp = make_backend_emulated_communicator(be, o.tp);
  else if (world > 1) g.tp = make_world_communicator(be);
  else g.tp = make_backend_local_communicator(be);
  if (o.cp > 1) g.cp = make_backend_emulated_communicator(be, o.cp);  // --emulate-cp
  return g;
}

ExperimentSpec experiment_spec(const LayerRunOptions& o, const Setup& s, LayerPolicy policy) {
  ExperimentSpec spec;
  spec.dims = s.plan.dims;
  spec.policy = policy;
  spec.dtype = s.plan.dtype;
  spec.layers = o.layers;
  spec.stack = o.recompute.stack;
  spec.warmup = o.warmup;
  spec.iters = o.iters;
  spec.seed = o.seed;
  spec.link_gbps = o.link_gbps;
  spec.profiler = s.profiler.get();
  spec.kernel_report = s.kernel_report.get();
  spec.cp_group = s.cp_group;
  spec.ep_group = s.ep_group;
  spec.dp_group = s.dp_group;
  spec.experts_over_tp = o.experts_over_tp();
  spec.expert_tensor_parallel = o.etp > 1;
  spec.moe_tokens_per_expert = o.moe_tokens_per_expert;
  return spec;
}

// One configuration: measured on every rank, written by rank 0. Returns its exit status.
int run_configuration(const RunContext& run, Setup& s, Communicator& comm, Verdicts& verdicts, LayerPolicy policy,
                      const CsvAppender& csv, bool rank0) {
  const LayerRunOptions& o = run.options;
  Measurement m{experiment_spec(o, s, policy), {}, {}, {}};
  m.start = s.be->gpu_state();
  m.result = run_experiment(*s.be, comm, m.spec);
  m.end = s.be->gpu_state();
  verdicts.same_status(m.result);
  if (!o.dump.empty() && m.result.status == "ok")
    dump_layer(*s.be, comm, m.spec, dump_dir(o, s.plan.policies.size(), policy));
  const std::vector<std::string> row = result_row(run, m);
  // Rank 0 writes; every rank learns whether that worked before the next configuration.
  verdicts.check([&] {
    if (!rank0) return;
    if (s.cupti_csv && m.result.status == "ok")
      for (const std::vector<std::string>& cupti_row : cupti_rows(run, m)) s.cupti_csv->append(cupti_row);
    if (s.kernel_report_csv && m.result.status == "ok")
      for (const KernelReportRecorder::Row& k : m.result.kernel_report)
        s.kernel_report_csv->append(kernel_report_row(config_name(policy), k));
    csv.append(row);
    std::printf("%s", console_line(run, m).c_str());
  });
  return m.result.status == "oom" ? 3 : 0;
}

int run(int argc, char** argv, std::unique_ptr<Communicator>& world_comm) {
  LayerRunOptions o;
  std::exception_ptr parse_error;
  try {
    parse_layer_run_options(argc, argv, o);
    // The command line is a column of every row: refused now if no row could hold it.
    check_csv_field("the command line (the rows' command column)", joined_command_line(argc, argv));
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
  const bool rank0 = !world_comm || world_comm->rank() == 0;
  const CsvAppender csv(o.csv, column_names(result_columns()));
  Setup s;
  verdicts.check([&] { prepare(o, s, csv, world, rank0); });
  const Groups groups = make_groups(o, *s.be, world);
  s.cp_group = groups.cp.get();
  s.ep_group = groups.experts;
  s.dp_group = groups.replicas;
  const Communicator* other = groups.cp ? groups.cp.get() : groups.experts;  // the group that talks when TP does not
  const CommMode mode = groups.tp->mode() != CommMode::none || !other ? groups.tp->mode() : other->mode();
  const RunContext context{*s.be, mode, o, joined_command_line(argc, argv), s.be->versions()};
  int exit_code = 0;
  for (LayerPolicy policy : s.plan.policies)
    exit_code = std::max(exit_code, run_configuration(context, s, *groups.tp, verdicts, policy, csv, rank0));
  return verdicts.exit_code(exit_code);
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
