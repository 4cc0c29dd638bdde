#pragma once
// theory's command line, taken strictly (runners/options.hpp): every value given is used or
// refused with one line naming the option, and every flag the chosen command does not read
// is refused, naming the command that was chosen. `theory plan` runs the layout search when
// --gpus is given and the fit planner otherwise.
#include <cstdint>
#include <string>
#include <vector>

#include "runners/theory_tables.hpp"  // TableSettings

namespace actbench {

enum class TheoryCommand {
  help,           // --help: printed, nothing else
  tables,         // theory --out DIR
  fit_plan,       // theory plan without --gpus: configurations of one layout of a Table 3 model
  layout_search,  // theory plan --gpus N: every layout and configuration
  llama_table,    // theory llama-table
  memory,         // theory memory: the whole training step's memory, stage by stage
};

// Bounds of the values that no model's shape bounds (the GPU count and the global batch are
// layout_search.hpp's): longer than any model's context, more sequences per micro-batch than
// any memory holds, more plans than the search can find.
constexpr int64_t kMaxTheorySeq = int64_t{1} << 24;
constexpr int64_t kMaxTheoryMicroBatch = int64_t{1} << 16;
constexpr int64_t kMaxTheoryTop = int64_t{1} << 20;

// What one call asks for; a value not given keeps its default here.
struct TheoryOptions {
  TheoryCommand command = TheoryCommand::help;
  int help_status = 0;  // command help: the status --help exits with
  // the tables
  std::string out;
  std::vector<std::string> results;
  tables::TableSettings settings;  // --dtype, --optimizer
  // the model: --model or --hf-config (empty: not given); memory also --megatron-args
  std::string model, hf_config, megatron_args;
  // theory memory: Megatron-LM's flags on the command line, in order (runners/megatron_args.hpp)
  std::vector<std::string> megatron_words;
  double moe_expert_load = 1;  // memory and the layout search: routing imbalance (infinity: max, the dropless bound)
  std::string offload_modules;  // the layout search: --offload-modules (Megatron's names, comma-separated)
  // plan and llama-table
  std::string gpu = "a100", csv, attention = "fused";
  int64_t seq = 0;                     // 0: the model's
  int64_t batch = 0;                   // micro-batch; 0: Table 3's (fit planner), 1 (llama-table)
  int tp = 0, pp = 0, interleave = 0;  // 0: Table 3's (fit planner); llama-table's tp: 1
  uint64_t gpu_memory = 0;             // 0: the --gpu's
  uint64_t headroom = 0;
  int gpus = 0;
  int64_t global_batch = 0;
  bool distributed_optimizer = false;
  double efficiency = 0.5;
  int top = 10;
  std::string fsdp_strategy;  // the layout search's Megatron-FSDP strategy; empty: Megatron's DDP
  std::string cp_comm_type = "p2p";  // the layout search's context-parallel exchange
  int max_cp = 64;                   // and its largest context-parallel size
};

// Parses the command line; InvalidArgument (one line naming the option) for anything it
// refuses. --help prints the help and returns command help.
TheoryOptions parse_theory_options(int argc, char** argv);

}  // namespace actbench
