#include "runners/theory_options.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <deque>
#include <limits>
#include <stdexcept>

#include "runners/megatron_args.hpp"  // parse_dp_shard
#include "runners/options.hpp"
#include "runtime/error.hpp"
#include "runtime/user_file.hpp"
#include "theory/layout_search.hpp"
#include "theory/memory_totals.hpp"

namespace actbench {
namespace {

// The commands that read an option (a bit each).
enum Reader : unsigned { kTables = 1, kFit = 2, kSearch = 4, kLlamaTable = 8, kMemory = 16 };

constexpr const char* kExpertLoadHelp =
    "routing imbalance: the rows the busiest rank's experts process, as a multiple of balanced routing's (1 "
    "balanced; max: every token's choices on that rank's experts, the dropless bound)";

// --moe-expert-load's value: at least 1, or max (infinity: theory caps it at the dropless bound).
double expert_load(const std::string& text) {
  const double v = text == "max" ? std::numeric_limits<double>::infinity() : parse_real_option("--moe-expert-load", text);
  if (!(v >= 1)) throw InvalidArgument("--moe-expert-load must be at least 1 (1: balanced routing) or max, got " + text);
  return v;
}

std::string command_words(unsigned reader) {
  switch (reader) {
    case kTables:
      return "the tables (theory --out DIR)";
    case kFit:
      return "the fit planner (theory plan without --gpus)";
    case kSearch:
      return "the layout search (theory plan --gpus N)";
    case kLlamaTable:
      return "theory llama-table";
    default:
      return "theory memory";
  }
}

Reader reader_of(TheoryCommand c) {
  switch (c) {
    case TheoryCommand::fit_plan:
      return kFit;
    case TheoryCommand::layout_search:
      return kSearch;
    case TheoryCommand::llama_table:
      return kLlamaTable;
    case TheoryCommand::memory:
      return kMemory;
    default:
      return kTables;
  }
}

// One option as declared: which app it belongs to, who reads it, and its text (the value as
// given, or its default) when it takes one.
struct Declared {
  const CLI::App* app = nullptr;
  std::string name;
  unsigned readers = 0;
  std::string text;
  CLI::Option* option = nullptr;
  bool takes_text = false;
  bool given() const { return option->count() > 0; }
};

class Options {
 public:
  // A value option taken as text (parsed below, so the messages are ours).
  void value(CLI::App& app, const std::string& name, unsigned readers, const std::string& help,
             const std::string& default_text = "") {
    Declared& d = all_.emplace_back(Declared{&app, name, readers, default_text});
    d.option = app.add_option(name, d.text, help);
    if (!default_text.empty()) d.option->capture_default_str();
    d.takes_text = true;
  }
  // An option CLI11 stores itself (a flag, a list).
  void track(const CLI::App& app, CLI::Option* option, unsigned readers) {
    all_.push_back(Declared{&app, option->get_name(), readers, "", option});
  }

  const Declared& get(const CLI::App* app, const std::string& name) const {
    for (const Declared& d : all_)
      if (d.app == app && d.name == name) return d;
    throw std::logic_error("theory: no option " + name);
  }
  bool given(const CLI::App* app, const std::string& name) const { return get(app, name).given(); }
  const std::string& text(const CLI::App* app, const std::string& name) const { return get(app, name).text; }

  // Every given option is read by the chosen command and, when it takes a value, has one.
  void check_given(TheoryCommand command) const {
    const unsigned chosen = reader_of(command);
    for (const Declared& d : all_) {
      if (!d.given()) continue;
      if (!(d.readers & chosen))
        throw InvalidArgument(d.name + " is not used by " + command_words(chosen) + "; only by " +
                              readers_words(d.readers));
      if (d.takes_text && d.text.empty()) throw InvalidArgument(d.name + " needs a value (got an empty string)");
    }
  }

 private:
  static std::string readers_words(unsigned readers) {
    std::string words;
    for (unsigned r : {kTables, kFit, kSearch, kLlamaTable, kMemory})
      if (readers & r) words += (words.empty() ? "" : " and ") + command_words(r);
    return words;
  }

  std::deque<Declared> all_;  // stable addresses: CLI11 writes into each text
};

struct Apps {
  CLI::App* top = nullptr;
  CLI::App* plan = nullptr;
  CLI::App* llama_table = nullptr;
  CLI::App* memory = nullptr;
};

Apps declare(CLI::App& app, Options& opts, std::vector<std::string>& results, bool& distributed_optimizer) {
  Apps apps{&app, nullptr, nullptr, nullptr};
  app.require_subcommand(0, 1);
  opts.value(app, "--out", kTables, "folder to write the CSV tables to (created if missing)");
  opts.track(
      app,
      app.add_option("--results", results, "layer_run CSV(s) or folder(s) of them: measured layer times for Table 5"),
      kTables);
  opts.value(app, "--dtype", kTables | kFit,
             "activation element type for the byte tables and the fit planner: bf16 | fp16 | fp32", "bf16");
  opts.value(app, "--optimizer", kTables | kFit,
             "mixed-fp32-grads (18 B/param) | mixed-bf16-grads (16) | fp32 (16); the tables and the fit planner",
             "mixed-fp32-grads");
  CLI::App& plan =
      *app.add_subcommand("plan", "which configurations fit: one layout (fit planner) or every layout (--gpus)");
  apps.plan = &plan;
  const unsigned both = kFit | kSearch;
  const std::string gpus = std::to_string(theory::kMaxPlanGpus);
  opts.value(plan, "--model", both, "22b | 175b | 530b | 1t; with --gpus also llama3-8b | llama3-70b | llama3-405b");
  opts.value(plan, "--hf-config", kSearch, "with --gpus: a Hugging Face config.json (docs/hf_config.md)");
  opts.value(plan, "--megatron-args", kSearch,
             "with --gpus: the model of a Megatron-LM launch script (its --seq-length and --global-batch-size "
             "unless given)");
  opts.value(plan, "--gpus", kSearch,
             "search every layout of this many GPUs, 1.." + gpus + " (chooses the layout search)");
  opts.value(
      plan, "--global-batch", kSearch,
      "with --gpus: sequences per iteration, 1.." + std::to_string(static_cast<int64_t>(theory::kMaxGlobalBatch)));
  opts.track(plan,
             plan.add_flag("--distributed-optimizer", distributed_optimizer,
                           "with --gpus: Adam state sharded over data-parallel ranks"),
             kSearch);
  opts.value(plan, "--data-parallel-sharding-strategy", kSearch,
             "with --gpus: Megatron-FSDP in place of DDP, no_shard | optim | optim_grads | optim_grads_params");
  opts.value(plan, "--attention", kSearch, "with --gpus: fused | unfused", "fused");
  opts.value(plan, "--efficiency", kSearch, "with --gpus: achieved fraction of peak FLOP/s, in (0, 1]", "0.5");
  opts.value(plan, "--top", kSearch, "with --gpus: plans to print", "10");
  opts.value(plan, "--cp-comm-type", kSearch, "with --gpus: context parallelism's exchange, p2p | all_gather | a2a",
             "p2p");
  opts.value(plan, "--max-cp", kSearch, "with --gpus: the largest context-parallel size searched (1: none)", "64");
  opts.value(plan, "--moe-expert-load", kSearch, std::string("with --gpus: ") + kExpertLoadHelp, "1");
  opts.value(plan, "--offload-modules", kSearch,
             "with --gpus: fine-grained activation offloading of these modules on every plan (Megatron's names: "
             "attn_norm,qkv_linear,core_attn,attn_proj,mlp_norm,expert_fc1,moe_act)");
  opts.value(plan, "--gpu-memory", kFit, "without --gpus: device memory, e.g. 80GiB (default: the --gpu's)");
  opts.value(plan, "--gpu", both, "a100 | h100 | h200 (| b200 with --gpus)", "a100");
  opts.value(plan, "--tp", kFit, "without --gpus: tensor-parallel size (default: Table 3's)");
  opts.value(plan, "--pp", kFit, "without --gpus: pipeline-parallel size (default: Table 3's)");
  opts.value(plan, "--interleave", kFit, "without --gpus: model chunks per stage m (default: Table 3's)");
  opts.value(plan, "--batch", kFit, "without --gpus: micro-batch b (default: Table 3's)");
  opts.value(plan, "--seq", both, "sequence length s, 1.." + std::to_string(kMaxTheorySeq) + " (default: the model's)");
  opts.value(plan, "--headroom", both, "memory kept free, e.g. 2GiB", "0");
  opts.value(plan, "--csv", both, "also write the plan to this CSV");
  CLI::App& table =
      *app.add_subcommand("llama-table", "the llama family's Table 2: bytes per category and configuration");
  apps.llama_table = &table;
  opts.value(table, "--model", kLlamaTable, "llama3-8b | llama3-70b | llama3-405b");
  opts.value(table, "--hf-config", kLlamaTable, "a Hugging Face config.json of a llama-layer model (docs/hf_config.md)");
  opts.value(table, "--tp", kLlamaTable, "tensor-parallel size", "1");
  opts.value(table, "--seq", kLlamaTable,
             "sequence length, 1.." + std::to_string(kMaxTheorySeq) + " (default: the model's)");
  opts.value(table, "--batch", kLlamaTable, "micro-batch, 1.." + std::to_string(kMaxTheoryMicroBatch), "1");
  CLI::App& memory = *app.add_subcommand(
      "memory",
      "the whole training step's memory on every pipeline stage, at rest and at its peak; any other flag is "
      "Megatron-LM's (--tensor-model-parallel-size 4 --sequence-parallel --recompute-granularity selective ...)");
  memory.allow_extras();
  apps.memory = &memory;
  opts.value(memory, "--model", kMemory, "a preset: 22b | 175b | 530b | 1t | llama3-8b | llama3-70b | llama3-405b | mixtral-8x7b | "
             "qwen3-30b-a3b | deepseek-v3");
  opts.value(memory, "--hf-config", kMemory, "a Hugging Face config.json");
  opts.value(memory, "--megatron-args", kMemory, "a file with a Megatron-LM launch script's arguments");
  opts.value(memory, "--gpus", kMemory, "GPUs in the run, 1.." + gpus + " (default: the script's world size)");
  opts.value(memory, "--gpu", kMemory, "a100 | h100 | h200 | b200: say whether each stage fits its memory, and size the library workspaces as on it (default: Hopper's)");
  opts.value(memory, "--csv", kMemory, "also write one row per pipeline stage to this CSV");
  opts.value(memory, "--moe-expert-load", kMemory, kExpertLoadHelp, "1");
  return apps;
}

// An integer option's value in [min, max]; `absent` when it is not given.
int64_t int_value(const Options& opts, const CLI::App* app, const std::string& name, int64_t min, int64_t max,
                  int64_t absent) {
  return opts.given(app, name) ? parse_int_option(name, opts.text(app, name), min, max) : absent;
}

void take_settings(const Options& opts, const CLI::App* top, TheoryOptions& o) {
  const std::string& dtype = opts.text(top, "--dtype");
  o.settings.precision = named("--dtype", [&] { return tables::precision_of(dtype); });
  o.settings.dtype = dtype;
  const std::string& optimizer = opts.text(top, "--optimizer");
  o.settings.bytes_per_param = theory::bytes_per_parameter(
      named("--optimizer", [&] { return theory::optimizer_precision_from_name(optimizer); }));
}

void take_tables(const Options& opts, const CLI::App* top, TheoryOptions& o) {
  if (!opts.given(top, "--out")) throw InvalidArgument("--out DIR is required (or use the plan subcommand)");
  o.out = opts.text(top, "--out");
  check_output_dir("--out", o.out);
  for (const std::string& path : o.results)
    if (path.empty()) throw InvalidArgument("--results needs a value (got an empty string)");
}

void take_model(const Options& opts, const CLI::App* app, TheoryOptions& o) {
  o.model = opts.text(app, "--model");
  o.hf_config = opts.given(app, "--hf-config") ? opts.text(app, "--hf-config") : "";
  const bool script = o.command == TheoryCommand::layout_search && opts.given(app, "--megatron-args");
  o.megatron_args = script ? opts.text(app, "--megatron-args") : "";
  // A FIFO or folder refused here, before the reader opens it.
  if (!o.hf_config.empty()) check_user_file("--hf-config " + o.hf_config, o.hf_config);
  if (!o.megatron_args.empty()) check_user_file("--megatron-args " + o.megatron_args, o.megatron_args);
  const int sources = !o.model.empty() + !o.hf_config.empty() + !o.megatron_args.empty();
  const std::string names = o.command == TheoryCommand::layout_search ? "--model, --hf-config or --megatron-args"
                                                                      : "--model or --hf-config";
  if (sources > 1) throw InvalidArgument("give one of " + names + ", not several");
  if (sources == 0)
    throw InvalidArgument(o.command == TheoryCommand::fit_plan ? "--model is required (22b, 175b, 530b or 1t)"
                                                               : names + " is required");
}

// theory plan: the options both planners read, then the chosen one's.
void take_plan(const Options& opts, const CLI::App* plan, TheoryOptions& o) {
  take_model(opts, plan, o);
  o.gpu = opts.text(plan, "--gpu");
  o.seq = int_value(opts, plan, "--seq", 1, kMaxTheorySeq, 0);
  o.headroom = parse_memory_size("--headroom", opts.text(plan, "--headroom"), 0);
  if (opts.given(plan, "--csv")) {
    o.csv = opts.text(plan, "--csv");
    check_output_file("--csv", o.csv);
  }
  if (o.command == TheoryCommand::fit_plan) {
    o.tp = static_cast<int>(int_value(opts, plan, "--tp", 1, theory::kMaxPlanGpus, 0));
    o.pp = static_cast<int>(int_value(opts, plan, "--pp", 1, theory::kMaxPlanGpus, 0));
    o.interleave = static_cast<int>(int_value(opts, plan, "--interleave", 1, theory::kMaxPlanGpus, 0));
    o.batch = int_value(opts, plan, "--batch", 1, kMaxTheoryMicroBatch, 0);
    if (opts.given(plan, "--gpu-memory"))
      o.gpu_memory = parse_memory_size("--gpu-memory", opts.text(plan, "--gpu-memory"));
    return;
  }
  o.gpus = static_cast<int>(int_value(opts, plan, "--gpus", 1, theory::kMaxPlanGpus, 0));
  if (!opts.given(plan, "--global-batch") && o.megatron_args.empty())
    throw InvalidArgument("--global-batch B (sequences per iteration) is required with --gpus");
  o.global_batch = int_value(opts, plan, "--global-batch", 1, static_cast<int64_t>(theory::kMaxGlobalBatch), 0);
  o.attention = opts.text(plan, "--attention");
  if (o.attention != "fused" && o.attention != "unfused")
    throw InvalidArgument("--attention must be fused or unfused, got '" + o.attention + "'");
  o.efficiency = parse_real_option("--efficiency", opts.text(plan, "--efficiency"));
  if (!(o.efficiency > 0 && o.efficiency <= 1))
    throw InvalidArgument("--efficiency must be in (0, 1], got " + opts.text(plan, "--efficiency"));
  o.top = static_cast<int>(parse_int_option("--top", opts.text(plan, "--top"), 1, kMaxTheoryTop));
  if (opts.given(plan, "--data-parallel-sharding-strategy")) {
    o.fsdp_strategy = opts.text(plan, "--data-parallel-sharding-strategy");
    parse_dp_shard("--data-parallel-sharding-strategy", o.fsdp_strategy);  // refused here, before any search
  }
  o.cp_comm_type = opts.text(plan, "--cp-comm-type");
  parse_cp_comm_type(o.cp_comm_type);  // refused here, in one line, before any search
  o.max_cp = static_cast<int>(parse_int_option("--max-cp", opts.text(plan, "--max-cp"), 1, theory::kMaxPlanGpus));
  o.moe_expert_load = expert_load(opts.text(plan, "--moe-expert-load"));
  if (opts.given(plan, "--offload-modules")) {
    o.offload_modules = opts.text(plan, "--offload-modules");
    // refused here, in one line, before any search
    if (!theory::parse_offload_modules(o.offload_modules).enabled())
      throw InvalidArgument("--offload-modules needs at least one module");
  }
}

void take_memory(const Options& opts, const CLI::App* memory, TheoryOptions& o) {
  o.model = opts.text(memory, "--model");
  o.hf_config = opts.given(memory, "--hf-config") ? opts.text(memory, "--hf-config") : "";
  o.megatron_args = opts.given(memory, "--megatron-args") ? opts.text(memory, "--megatron-args") : "";
  const int sources = !o.model.empty() + !o.hf_config.empty() + !o.megatron_args.empty();
  if (sources != 1) throw InvalidArgument("give one of --model, --hf-config or --megatron-args");
  for (const std::string* path : {&o.hf_config, &o.megatron_args})
    if (!path->empty()) check_user_file(std::string(path == &o.hf_config ? "--hf-config " : "--megatron-args ") + *path, *path);
  o.gpus = static_cast<int>(int_value(opts, memory, "--gpus", 1, theory::kMaxPlanGpus, 0));
  o.gpu = opts.given(memory, "--gpu") ? opts.text(memory, "--gpu") : "";
  if (opts.given(memory, "--csv")) {
    o.csv = opts.text(memory, "--csv");
    check_output_file("--csv", o.csv);
  }
  o.moe_expert_load = expert_load(opts.text(memory, "--moe-expert-load"));
  o.megatron_words = memory->remaining();
}

void take_llama_table(const Options& opts, const CLI::App* table, TheoryOptions& o) {
  take_model(opts, table, o);
  o.tp = static_cast<int>(parse_int_option("--tp", opts.text(table, "--tp"), 1, theory::kMaxPlanGpus));
  o.seq = int_value(opts, table, "--seq", 1, kMaxTheorySeq, 0);
  o.batch = parse_int_option("--batch", opts.text(table, "--batch"), 1, kMaxTheoryMicroBatch);
}

}  // namespace

TheoryOptions parse_theory_options(int argc, char** argv) {
  TheoryOptions o;
  CLI::App app{"theory: the paper's formulas (Table 2, Eq. 5/6, Figures 1 and 7, FLOPs, pipeline, Table 5) as CSV"};
  Options opts;
  const Apps apps = declare(app, opts, o.results, o.distributed_optimizer);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    o.help_status = app.exit(e);
    return o;
  } catch (const CLI::CallForAllHelp& e) {
    o.help_status = app.exit(e);
    return o;
  } catch (const CLI::ParseError& e) {
    std::string what = e.what();
    std::replace(what.begin(), what.end(), '\n', ' ');
    throw InvalidArgument(what);
  }
  if (apps.memory->parsed())
    o.command = TheoryCommand::memory;
  else if (apps.llama_table->parsed())
    o.command = TheoryCommand::llama_table;
  else if (apps.plan->parsed())
    o.command = opts.given(apps.plan, "--gpus") ? TheoryCommand::layout_search : TheoryCommand::fit_plan;
  else
    o.command = TheoryCommand::tables;
  opts.check_given(o.command);
  take_settings(opts, apps.top, o);
  if (o.command == TheoryCommand::tables)
    take_tables(opts, apps.top, o);
  else if (o.command == TheoryCommand::llama_table)
    take_llama_table(opts, apps.llama_table, o);
  else if (o.command == TheoryCommand::memory)
    take_memory(opts, apps.memory, o);
  else
    take_plan(opts, apps.plan, o);
  return o;
}

}  // namespace actbench
