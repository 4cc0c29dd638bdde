#pragma once
// A Megatron-LM launch script's arguments, read as pretrain_gpt.py takes them: the model
// (layers, widths, heads, GQA, norms, activation, biases, position embedding, vocabulary and
// its padding, tied or untied output layer), the parallel layout (tensor, pipeline, virtual
// stages, uneven first/last stages, sequence and context parallelism with its
// --cp-comm-type, data parallel from the world size),
// micro and global batch, sequence length, precision, optimizer and recompute, with
// Megatron's own defaults where a flag is absent (docs/step_memory.md lists every flag).
//
// The file holds the flags as a script passes them: shell words, quotes, comments and
// line continuations; a bash array's parentheses, the launcher (torchrun, python, the .py
// script) and any word that is not a flag or a flag's value are skipped, and torchrun's
// --nproc_per_node × --nnodes give the world size. Flags that change no memory are ignored;
// flags that change memory but are not modelled are collected for one warning line; flags
// the model cannot express (hierarchical context parallelism, PyTorch FSDP2, ...)
// are refused. A value the reader needs that is a shell variable ($TP) is refused naming it,
// unless the command line gives it.
//
// The file may instead be Megatron-LM's own test configuration (a model_config.yaml with a
// MODEL_ARGS map of `--flag: value`): its entries are read as the words its launcher passes,
// and a test folder named as Megatron names them (`..._1N8G_...`: nodes × GPUs per node) gives
// the world size when the file has none.
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "theory/models.hpp"  // Gpu
#include "theory/step_memory.hpp"
#include "theory/transformer_model.hpp"

namespace actbench {

// The flags as given, later ones replacing earlier ones: name without dashes → value ("1" for
// a switch, a list's words joined by commas).
struct MegatronFlags {
  std::map<std::string, std::string> values;
  std::vector<std::string> unmodelled;  // flags given that change memory but are not modelled
  // flags whose value is still a shell variable ($TP) → the error line, unless a later word gives it
  std::map<std::string, std::string> unresolved;
  // CUBLAS_WORKSPACE_CONFIG as the run's environment sets it (a script's `export`, a test
  // configuration's ENV_VARS); empty: not set.
  std::string cublas_workspace_config;
  bool has(const std::string& name) const { return values.count(name) > 0; }
};

// Shell words of a script (quotes, backslash-newline, # comments). Throws InvalidArgument
// naming `where` for an unterminated quote.
std::vector<std::string> shell_words(const std::string& text, const std::string& where);

// Applies the words onto `flags`. strict (theory's own command line): an unknown flag, or a
// word that is neither a flag nor its value, is an error; otherwise both are skipped.
// Throws InvalidArgument with one line naming `where` and the flag.
void apply_megatron_words(const std::vector<std::string>& words, bool strict, const std::string& where,
                          MegatronFlags& flags);

// --megatron-args FILE: the file's flags (read through read_user_file).
MegatronFlags read_megatron_args(const std::string& path);

// The flags that describe the model's shape: refused when the model comes from elsewhere.
const std::vector<std::string>& megatron_model_flags();

struct MegatronRun {
  theory::TransformerModel model;
  theory::StepConfig step;
  int world_size = 0;  // --world-size or the launcher's process count (0: not given)
};

// What the flags make of a training run. The model is `base` (a preset or a Hugging Face
// config) with the layer flags as edits, or, without a base, built from the flags alone.
// The data-parallel size is world_size / (t·p·C); world_size is `gpus` when given (> 0), else
// the flags' world size. Throws InvalidArgument (one line naming the flag).
MegatronRun megatron_run(const MegatronFlags& flags, const std::optional<theory::TransformerModel>& base, int gpus,
                         const theory::Gpu* gpu = nullptr);

// The model alone (its shape, layer, vocabulary and default sequence length): what the layout
// search reads from a script. Throws InvalidArgument like megatron_run.
theory::TransformerModel megatron_model(const MegatronFlags& flags);

// A Megatron-FSDP sharding strategy by its Megatron name (no_shard, optim, optim_grads,
// optim_grads_params); InvalidArgument naming `flag` and the choices otherwise.
theory::DpShard parse_dp_shard(const std::string& flag, const std::string& name);

}  // namespace actbench
