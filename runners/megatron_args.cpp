#include "runners/megatron_args.hpp"

#include <algorithm>
#include <cmath>
#include <regex>
#include <sstream>
#include <string_view>

#include "runners/hf_config.hpp"  // kMaxModelWidth, kMaxVocab, kMaxPositions
#include "runners/options.hpp"
#include "runners/pipeline_layout.hpp"
#include "runtime/error.hpp"
#include "runtime/user_file.hpp"
#include "theory/layout_search.hpp"  // kMaxPlanGpus, kMaxGlobalBatch

namespace actbench {
namespace {

enum class Kind { on_off, value, list };
// read: the model reads it; refuse: a layer or layout the model cannot express;
// unmodelled: changes memory in a way the model leaves out (one warning line names them);
// partial: the model reads it and counts part of what it changes (the warning line names it
// with `why`, the part left out); presence: only whether it is given counts (its value, a
// path, may be a shell variable).
enum class Use { read, refuse, unmodelled, partial, presence };

struct Flag {
  const char* name;
  Kind kind;
  Use use;
  const char* why = "";  // refuse: what it is; partial: what is not modelled
};

// Every flag the reader knows; any other is ignored (it changes no memory the model counts).
const std::vector<Flag>& flag_table() {
  static const std::vector<Flag> table = {
      // the model
      {"num-layers", Kind::value, Use::read},
      {"hidden-size", Kind::value, Use::read},
      {"ffn-hidden-size", Kind::value, Use::read},
      {"num-attention-heads", Kind::value, Use::read},
      {"kv-channels", Kind::value, Use::read},
      {"group-query-attention", Kind::on_off, Use::read},
      {"num-query-groups", Kind::value, Use::read},
      {"max-position-embeddings", Kind::value, Use::read},
      {"position-embedding-type", Kind::value, Use::read},
      {"use-rotary-position-embeddings", Kind::on_off, Use::read},
      {"no-position-embedding", Kind::on_off, Use::read},
      {"rotary-percent", Kind::value, Use::read},
      {"rotary-base", Kind::value, Use::read},
      {"normalization", Kind::value, Use::read},
      {"norm-epsilon", Kind::value, Use::read},
      {"layernorm-epsilon", Kind::value, Use::read},
      {"qk-layernorm", Kind::on_off, Use::read},
      {"swiglu", Kind::on_off, Use::read},
      {"squared-relu", Kind::on_off, Use::read},
      {"disable-bias-linear", Kind::on_off, Use::read},
      {"add-qkv-bias", Kind::on_off, Use::read},
      {"attention-dropout", Kind::value, Use::read},
      {"hidden-dropout", Kind::value, Use::read},
      {"untie-embeddings-and-output-weights", Kind::on_off, Use::read},
      {"vocab-size", Kind::value, Use::read},
      {"tokenizer-type", Kind::value, Use::read},
      {"make-vocab-size-divisible-by", Kind::value, Use::read},
      {"vocab-file", Kind::value, Use::presence},  // with --merge-file and no --tokenizer-type: GPT-2's BPE
      {"merge-file", Kind::value, Use::presence},
      // mixture of experts (docs/moe.md)
      {"num-experts", Kind::value, Use::read},
      {"moe-router-topk", Kind::value, Use::read},
      {"moe-ffn-hidden-size", Kind::value, Use::read},
      {"moe-shared-expert-intermediate-size", Kind::value, Use::read},
      {"moe-router-score-function", Kind::value, Use::read},
      {"moe-router-pre-softmax", Kind::on_off, Use::read},
      {"moe-router-topk-scaling-factor", Kind::value, Use::read},
      {"moe-router-num-groups", Kind::value, Use::read},
      {"moe-router-group-topk", Kind::value, Use::read},
      {"moe-router-enable-expert-bias", Kind::on_off, Use::read},
      {"moe-expert-capacity-factor", Kind::value, Use::read},
      {"moe-layer-freq", Kind::value, Use::read},
      {"moe-grouped-gemm", Kind::on_off, Use::read},
      {"moe-token-dispatcher-type", Kind::value, Use::read},
      // how Megatron-Core's router and dispatcher keep their bookkeeping (docs/moe.md)
      {"moe-router-dtype", Kind::value, Use::read},
      {"moe-router-load-balancing-type", Kind::list, Use::read},
      {"moe-aux-loss-coeff", Kind::list, Use::read},
      {"moe-z-loss-coeff", Kind::value, Use::read},
      {"moe-permute-fusion", Kind::on_off, Use::read},
      {"moe-shared-expert-gate", Kind::on_off, Use::read},
      {"no-bias-swiglu-fusion", Kind::on_off, Use::read},
      // read and checked; they change which tokens drop, when the bias moves, which stream
      // the shared experts run on, what is logged: no byte counted here
      {"moe-token-drop-policy", Kind::value, Use::read},
      {"moe-router-bias-update-rate", Kind::value, Use::read},
      {"moe-shared-expert-overlap", Kind::on_off, Use::read},
      {"moe-per-layer-logging", Kind::on_off, Use::read},
      // multi-token prediction (DeepSeek-V3's), on the last stage
      {"mtp-num-layers", Kind::value, Use::read},
      {"mtp-loss-scaling-factor", Kind::value, Use::read},
      {"mtp-use-repeated-layer", Kind::on_off, Use::refuse, "one MTP layer's weights applied to every MTP depth"},
      // multi-latent attention
      {"multi-latent-attention", Kind::on_off, Use::read},
      {"q-lora-rank", Kind::value, Use::read},
      {"kv-lora-rank", Kind::value, Use::read},
      {"qk-head-dim", Kind::value, Use::read},
      {"qk-pos-emb-head-dim", Kind::value, Use::read},
      {"v-head-dim", Kind::value, Use::read},
      // layout and batch
      {"tensor-model-parallel-size", Kind::value, Use::read},
      {"pipeline-model-parallel-size", Kind::value, Use::read},
      {"num-layers-per-virtual-pipeline-stage", Kind::value, Use::read},
      {"pipeline-model-parallel-layout", Kind::value, Use::read},
      {"microbatch-group-size-per-virtual-pipeline-stage", Kind::value, Use::read},
      {"num-virtual-stages-per-pipeline-rank", Kind::value, Use::read},
      {"decoder-first-pipeline-num-layers", Kind::value, Use::read},
      {"decoder-last-pipeline-num-layers", Kind::value, Use::read},
      {"account-for-embedding-in-pipeline-split", Kind::on_off, Use::read},
      {"account-for-loss-in-pipeline-split", Kind::on_off, Use::read},
      {"sequence-parallel", Kind::on_off, Use::read},
      {"context-parallel-size", Kind::value, Use::read},
      {"expert-model-parallel-size", Kind::value, Use::read},
      {"expert-tensor-parallel-size", Kind::value, Use::read},
      {"cp-comm-type", Kind::list, Use::read},
      {"world-size", Kind::value, Use::read},
      {"seq-length", Kind::value, Use::read},
      {"micro-batch-size", Kind::value, Use::read},
      {"global-batch-size", Kind::value, Use::read},
      // recompute
      {"recompute-granularity", Kind::value, Use::read},
      {"recompute-activations", Kind::on_off, Use::read},
      {"recompute-method", Kind::value, Use::read},
      {"recompute-num-layers", Kind::value, Use::read},
      {"recompute-modules", Kind::list, Use::read},
      {"distribute-saved-activations", Kind::on_off, Use::read},
      {"fine-grained-activation-offloading", Kind::on_off, Use::read},
      {"offload-modules", Kind::list, Use::read},
      {"min-offloaded-tensor-size", Kind::value, Use::read},
      {"defer-embedding-wgrad-compute", Kind::on_off, Use::read},
      {"wgrad-deferral-limit", Kind::value, Use::read},
      // precision, optimizer, attention kernel
      {"bf16", Kind::on_off, Use::read},
      {"no-masked-softmax-fusion", Kind::on_off, Use::read},
      {"attention-softmax-in-fp32", Kind::on_off, Use::read},
      {"apply-query-key-layer-scaling", Kind::on_off, Use::read},
      {"fp16", Kind::on_off, Use::read},
      {"accumulate-allreduce-grads-in-fp32", Kind::on_off, Use::read},
      {"use-distributed-optimizer", Kind::on_off, Use::read},
      {"num-distributed-optimizer-instances", Kind::value, Use::read},
      {"grad-reduce-in-bf16", Kind::on_off, Use::read},
      // Megatron-FSDP (docs/step_memory.md, "What each stage holds")
      {"use-megatron-fsdp", Kind::on_off, Use::read},
      {"use-custom-fsdp", Kind::on_off, Use::read},  // its old name
      {"data-parallel-sharding-strategy", Kind::value, Use::read},
      {"outer-dp-sharding-strategy", Kind::value, Use::read},
      {"expert-outer-dp-sharding-strategy", Kind::value, Use::read},
      {"megatron-fsdp-main-params-dtype", Kind::value, Use::read},
      {"megatron-fsdp-main-grads-dtype", Kind::value, Use::read},
      {"megatron-fsdp-version", Kind::value, Use::read},
      {"fsdp-double-buffer", Kind::on_off, Use::unmodelled},
      {"use-nccl-ub", Kind::on_off, Use::unmodelled},
      {"optimizer", Kind::value, Use::read},
      {"sgd-momentum", Kind::value, Use::read},
      {"use-precision-aware-optimizer", Kind::on_off, Use::read},
      {"main-params-dtype", Kind::value, Use::read},
      {"main-grads-dtype", Kind::value, Use::read},
      {"exp-avg-dtype", Kind::value, Use::read},
      {"exp-avg-sq-dtype", Kind::value, Use::read},
      {"no-gradient-accumulation-fusion", Kind::on_off, Use::read},
      {"transformer-impl", Kind::value, Use::read},
      {"attention-backend", Kind::value, Use::read},
      {"use-flash-attn", Kind::on_off, Use::read},
      // what the model cannot express
      {"moe-pad-expert-input-to-capacity", Kind::on_off, Use::refuse, "padding each expert's tokens to its capacity"},
      {"moe-layer-recompute", Kind::on_off, Use::refuse, "the old MoE recompute (give --recompute-modules moe)"},
      {"moe-extended-tp", Kind::on_off, Use::refuse, "extended tensor parallelism of the experts"},
      {"hierarchical-context-parallel-sizes", Kind::list, Use::refuse,
       "hierarchical context parallelism (--cp-comm-type a2a+p2p)"},
      {"experimental-attention-variant", Kind::value, Use::refuse,
       "an attention other than softmax attention (gated delta net, ...)"},
      {"use-torch-fsdp2", Kind::on_off, Use::refuse, "PyTorch FSDP2's sharding (Megatron-FSDP's is modelled)"},
      // changes memory, not modelled
      {"fp8-format", Kind::value, Use::partial, "its activations, counted in 16 bits, and Megatron-FSDP's FP8 weights"},
      {"fp8-param-gather", Kind::on_off, Use::read},
      {"cross-entropy-loss-fusion", Kind::on_off, Use::read},
      {"cross-entropy-fusion-impl", Kind::value, Use::read},
      {"fp16-lm-cross-entropy", Kind::on_off, Use::unmodelled},
      {"cpu-offloading", Kind::on_off, Use::unmodelled},
      {"tp-comm-overlap", Kind::on_off, Use::unmodelled},
      {"moe-router-fusion", Kind::on_off, Use::unmodelled},
      {"moe-input-jitter-eps", Kind::value, Use::unmodelled},
      {"rampup-batch-size", Kind::list, Use::unmodelled},
      {"enable-cuda-graph", Kind::on_off, Use::unmodelled},
      {"external-cuda-graph", Kind::on_off, Use::unmodelled},
      {"optimizer-cpu-offload", Kind::on_off, Use::unmodelled},
      {"attention-output-gate", Kind::on_off, Use::unmodelled},
      {"overlap-moe-expert-parallel-comm", Kind::on_off, Use::partial,
       "combined 1F1B's paired forward counted as its first layer; the rest of its transients not"},
      {"delay-wgrad-compute", Kind::on_off, Use::unmodelled},
      {"cuda-graph-impl", Kind::value, Use::unmodelled},
      {"fp8-recipe", Kind::value, Use::read},
      // torchrun's, for the world size
      {"nproc_per_node", Kind::value, Use::read},
      {"nproc-per-node", Kind::value, Use::read},
      {"nnodes", Kind::value, Use::read},
  };
  return table;
}

const Flag* find_flag(const std::string& name) {
  for (const Flag& f : flag_table())
    if (name == f.name) return &f;
  return nullptr;
}

bool is_flag(const std::string& word) { return word.size() > 2 && word.compare(0, 2, "--") == 0; }

// A word that can be a flag's value: not a flag, not a bash array's bracket.
bool is_value(const std::string& word) { return !is_flag(word) && word != ")" && word != "(" && word != "\\"; }

[[noreturn]] void fail(const std::string& where, const std::string& problem) {
  throw InvalidArgument(where + ": " + problem);
}

// A list flag's words (apply_megatron_words joins them with commas).
std::vector<std::string> list_words(const std::string& list) {
  std::vector<std::string> words;
  for (size_t begin = 0;;) {
    const size_t comma = list.find(',', begin);
    words.push_back(list.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin));
    if (comma == std::string::npos) return words;
    begin = comma + 1;
  }
}

// A list's words joined by single commas, as a Python list written in a configuration also
// comes: "[a b]", "[a, b]" and "a b" are all "a,b".
// An environment assignment the launcher's words carry (a script's `export`, a test
// configuration's ENV_VARS), read for the library workspaces' size.
constexpr std::string_view kCublasWorkspaceConfig = "CUBLAS_WORKSPACE_CONFIG=";

std::string list_text(const std::string& joined) {
  std::string out, word;
  for (char c : joined + ",") {
    if (c == ',' || c == ' ') {
      if (!word.empty()) out += (out.empty() ? "" : ",") + word;
      word.clear();
    } else if (c != '[' && c != ']') {
      word += c;
    }
  }
  return out;
}

// One number of a list flag, within [min, max], the error naming the flag.
double real_value(const std::string& flag, const std::string& text, double min, double max) {
  const double v = parse_real_option(flag, text);
  if (!(v >= min && v <= max)) throw InvalidArgument(flag + " must lie in " + real_range_text(min, max) + ", got " + text);
  return v;
}

}  // namespace

std::vector<std::string> shell_words(const std::string& text, const std::string& where) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\\' && i + 1 < text.size()) {  // an escaped character; backslash-newline joins lines
      if (text[i + 1] != '\n') word += text[i + 1], in_word = true;
      ++i;
    } else if (c == '\'' || c == '"') {
      const size_t end = text.find(c, i + 1);
      if (end == std::string::npos) fail(where, std::string("unterminated ") + c + " quote");
      word += text.substr(i + 1, end - i - 1);
      in_word = true;
      i = end;
    } else if (c == '#' && !in_word) {  // a comment, to the end of the line
      while (i + 1 < text.size() && text[i + 1] != '\n') ++i;
    } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ';') {
      if (in_word) words.push_back(word), word.clear(), in_word = false;
    } else {
      word += c, in_word = true;
    }
  }
  if (in_word) words.push_back(word);
  return words;
}

void apply_megatron_words(const std::vector<std::string>& words, bool strict, const std::string& where,
                          MegatronFlags& flags) {
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string& word = words[i];
    if (word.rfind(kCublasWorkspaceConfig, 0) == 0) {  // the environment's, before the launcher
      flags.cublas_workspace_config = word.substr(kCublasWorkspaceConfig.size());
      continue;
    }
    if (!is_flag(word)) {
      if (strict) fail(where, "unexpected word '" + printable(word) + "' (flags are --name [value])");
      continue;  // the launcher, the script, a bash array's name and brackets
    }
    std::string name = word.substr(2), value;
    bool inline_value = false;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1), name = name.substr(0, eq), inline_value = true;
    }
    const Flag* flag = find_flag(name);
    if (!flag) {
      if (strict) fail(where, "unknown flag --" + printable(name));
      if (!inline_value && i + 1 < words.size() && is_value(words[i + 1])) ++i;  // its value, if any
      continue;
    }
    const std::string shown = "--" + name;
    if (flag->kind == Kind::on_off) {
      if (inline_value) fail(where, shown + " takes no value");
      value = "1";
    } else if (flag->kind == Kind::value && !inline_value) {
      if (i + 1 >= words.size() || !is_value(words[i + 1])) fail(where, shown + " needs a value");
      value = words[++i];
    } else if (flag->kind == Kind::list && !inline_value) {
      while (i + 1 < words.size() && is_value(words[i + 1])) value += (value.empty() ? "" : ",") + words[++i];
    }
    if (flag->kind == Kind::list) value = list_text(value);
    if (flag->use == Use::presence) value = "1";
    // A shell variable ($TP) is an error only if nothing later (the command line) gives the value.
    if (value.find('$') != std::string::npos && flag->use != Use::unmodelled)
      flags.unresolved[name] = where + ": " + shown + " is '" + printable(value) +
                               "', a shell variable: give its value (" + shown + " VALUE on the command line)";
    else
      flags.unresolved.erase(name);
    if (flag->use == Use::unmodelled || flag->use == Use::partial) {
      const std::string named = flag->use == Use::partial ? shown + " (" + flag->why + ")" : shown;
      if (std::find(flags.unmodelled.begin(), flags.unmodelled.end(), named) == flags.unmodelled.end())
        flags.unmodelled.push_back(named);
      if (flag->use == Use::unmodelled) continue;
    }
    flags.values[name] = value;
  }
}

namespace {

// A line's text without its trailing "# comment" (a # that starts a word) and outer blanks.
std::string yaml_value_text(const std::string& line) {
  std::string text = line;
  for (size_t i = 0; i < text.size(); ++i)
    if (text[i] == '#' && (i == 0 || text[i - 1] == ' ' || text[i - 1] == '\t')) text.resize(i);
  const size_t first = text.find_first_not_of(" \t\r"), last = text.find_last_not_of(" \t\r");
  return first == std::string::npos ? "" : text.substr(first, last - first + 1);
}

bool is_yaml_model_config(const std::string& text) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);)
    if (yaml_value_text(line) == "MODEL_ARGS:" && line.rfind("MODEL_ARGS:", 0) == 0) return true;
  return false;
}

// Megatron-LM's test configuration (model_config.yaml): the `--flag: value` entries of its
// MODEL_ARGS map become the words its launcher passes: `true` the bare flag, `false` (or
// null) nothing, any other value split into shell words. Other top-level keys are skipped.
std::vector<std::string> yaml_model_args_words(const std::string& text, const std::string& where) {
  std::vector<std::string> words;
  std::istringstream lines(text);
  bool in_model_args = false, in_env_vars = false;
  int line_number = 0;
  for (std::string line; std::getline(lines, line);) {
    ++line_number;
    const std::string entry = yaml_value_text(line);
    if (entry.empty()) continue;
    const bool indented = line[0] == ' ' || line[0] == '\t';
    if (!indented) {
      in_model_args = entry == "MODEL_ARGS:";
      in_env_vars = entry == "ENV_VARS:";
      continue;
    }
    if (in_env_vars && entry.rfind("CUBLAS_WORKSPACE_CONFIG:", 0) == 0)  // as the launcher exports it
      words.push_back(std::string(kCublasWorkspaceConfig) + yaml_value_text(entry.substr(entry.find(':') + 1)));
    if (!in_model_args) continue;
    const size_t colon = entry.find(':');
    const std::string here = where + " line " + std::to_string(line_number);
    if (entry.rfind("--", 0) != 0 || colon == std::string::npos)
      fail(here, "a MODEL_ARGS entry is '--flag: value', got '" + printable(entry) + "'");
    const std::string flag = entry.substr(0, colon), value = yaml_value_text(entry.substr(colon + 1));
    if (value == "false" || value == "False" || value == "null" || value == "~") continue;
    words.push_back(flag);
    if (value == "true" || value == "True" || value.empty()) continue;
    for (const std::string& word : shell_words(value, here)) words.push_back(word);
  }
  return words;
}

// The world size Megatron-LM's test names carry (`gpt3_..._1N8G_...`: 1 node of 8 GPUs) in
// any folder of the path; 0 when none says it.
int64_t world_size_in_test_name(const std::string& path) {
  static const std::regex nodes_by_gpus("(^|[_/])([0-9]{1,3})N([0-9]{1,2})G([_/]|$)");
  std::smatch m;
  if (!std::regex_search(path, m, nodes_by_gpus)) return 0;
  return std::stoll(m[2].str()) * std::stoll(m[3].str());
}

}  // namespace

MegatronFlags read_megatron_args(const std::string& path) {
  const std::string where = "--megatron-args " + path;
  const std::string text = read_user_file(where, path);
  MegatronFlags flags;
  if (is_yaml_model_config(text)) {
    apply_megatron_words(yaml_model_args_words(text, where), false, where, flags);
    const int64_t gpus = world_size_in_test_name(path);
    if (gpus > 0 && !flags.has("world-size")) flags.values["world-size"] = std::to_string(gpus);
  } else
    apply_megatron_words(shell_words(text, where), false, where, flags);
  return flags;
}

const std::vector<std::string>& megatron_model_flags() {
  static const std::vector<std::string> names = {"num-layers", "hidden-size", "num-attention-heads",
                                                 "max-position-embeddings", "vocab-size", "tokenizer-type"};
  return names;
}

namespace {

// The flags' values, each parsed with its bounds, the error naming the flag.
class Values {
 public:
  explicit Values(const MegatronFlags& f) : f_(f) {}
  bool has(const std::string& name) const { return f_.has(name); }
  bool on(const std::string& name) const { return f_.has(name); }
  const std::string& text(const std::string& name) const { return f_.values.at(name); }
  std::string text(const std::string& name, const std::string& fallback) const {
    return has(name) ? text(name) : fallback;
  }
  int64_t integer(const std::string& name, int64_t min, int64_t max, int64_t fallback) const {
    return has(name) ? parse_int_option("--" + name, text(name), min, max) : fallback;
  }
  int64_t required(const std::string& name, int64_t min, int64_t max) const {
    if (!has(name)) throw InvalidArgument("--" + name + " is required (the launch script does not give it)");
    return integer(name, min, max, 0);
  }
  double real(const std::string& name, double min, double max, double fallback) const {
    return has(name) ? real_value("--" + name, text(name), min, max) : fallback;
  }

 private:
  const MegatronFlags& f_;
};

void refuse_what_is_not_modelled(const MegatronFlags& flags) {
  if (!flags.unresolved.empty()) throw InvalidArgument(flags.unresolved.begin()->second);
  for (const Flag& f : flag_table()) {
    if (f.use != Use::refuse || !flags.has(f.name)) continue;
    const std::string& v = flags.values.at(f.name);
    // A size of 1 is the plain layout.
    if (f.kind == Kind::value && v == "1") continue;
    throw InvalidArgument("--" + std::string(f.name) + " " + printable(v) + ": " + f.why +
                          " is not modelled by theory memory");
  }
}

// The tokenizer's vocabulary, before Megatron pads it.
double vocab_of(const Values& v) {
  // Megatron's training scripts name GPT-2's BPE by its vocabulary and merges files alone.
  const bool bpe_files = v.has("vocab-file") && v.has("merge-file");
  const std::string tokenizer = v.text("tokenizer-type", bpe_files ? "GPT2BPETokenizer" : "");
  if (tokenizer == "GPT2BPETokenizer") return 50257;
  if (v.has("vocab-size")) {
    const double size = static_cast<double>(v.integer("vocab-size", 1, kMaxVocab, 0));
    return tokenizer == "NullTokenizer" ? size + 1 : size;  // NullTokenizer adds its end-of-document id
  }
  throw InvalidArgument("the vocabulary size: " +
                        (tokenizer.empty() ? std::string("no --tokenizer-type") : "--tokenizer-type " + printable(tokenizer)) +
                        " and no --vocab-size; add --vocab-size V (the tokenizer's size)");
}

// The model's shape from the flags alone (Megatron's defaults where absent).
theory::TransformerModel model_from_flags(const Values& v) {
  theory::TransformerModel m;
  m.name = "megatron";
  m.L = static_cast<double>(v.required("num-layers", 1, kMaxModelLayers));
  m.h = static_cast<double>(v.required("hidden-size", 1, kMaxModelWidth));
  m.a = static_cast<double>(v.required("num-attention-heads", 1, kMaxModelWidth));
  m.vocab = vocab_of(v);
  m.learned_positions = true;  // Megatron's default position embedding: learned_absolute
  m.layer = theory::gpt_layer_spec();
  return m;
}

// Megatron-Core's router precision and losses, and its permutation (what they keep:
// docs/moe.md, "Megatron-Core's routing bookkeeping"). A load-balancing loss runs in training
// when its type is listed with a coefficient above 0: one coefficient for one type, or the
// i-th coefficient for the i-th type (Megatron's TopKRouter.get_aux_loss_coeff).
theory::MegatronRouting megatron_routing_of(const Values& v) {
  theory::MegatronRouting r;
  if (v.has("moe-router-dtype")) {
    const std::string& dtype = v.text("moe-router-dtype");
    if (dtype != "fp32" && dtype != "fp64")
      throw InvalidArgument("--moe-router-dtype must be fp32 or fp64, got '" + printable(dtype) + "'");
    r.router_bytes = dtype == "fp32" ? 4 : 8;
  }
  const std::vector<std::string> types = list_words(v.text("moe-router-load-balancing-type", "aux_loss"));
  const std::vector<std::string> coeffs = list_words(v.text("moe-aux-loss-coeff", "0"));
  // Megatron-Core routes by Sinkhorn only when it is the one type given (no aux loss with it).
  if (types.size() == 1 && types[0] == "sinkhorn") {
    for (const std::string& coeff : coeffs)
      if (real_value("--moe-aux-loss-coeff", coeff, 0, 1e6) != 0)
        throw InvalidArgument("--moe-router-load-balancing-type sinkhorn takes no aux loss: --moe-aux-loss-coeff must be 0");
    r.sinkhorn = true;
  }
  for (size_t i = 0; i < types.size() && !r.sinkhorn; ++i) {
    const std::string& type = types[i];
    if (type == "sinkhorn")
      throw InvalidArgument("--moe-router-load-balancing-type sinkhorn is a routing of its own: give it alone");
    if (type != "aux_loss" && type != "seq_aux_loss" && type != "global_aux_loss" && type != "none")
      throw InvalidArgument("--moe-router-load-balancing-type must be aux_loss, seq_aux_loss, global_aux_loss or none, "
                            "got '" + printable(type) + "'");
    const double coeff = i < coeffs.size() ? real_value("--moe-aux-loss-coeff", coeffs[i], 0, 1e6) : 0;
    if (type != "none" && coeff > 0) r.aux_loss = true;
  }
  for (size_t i = types.size(); i < coeffs.size() && !r.sinkhorn; ++i) real_value("--moe-aux-loss-coeff", coeffs[i], 0, 1e6);
  // Megatron computes the z-loss whenever a coefficient is given, 0 included.
  if (v.has("moe-z-loss-coeff")) {
    v.real("moe-z-loss-coeff", 0, 1e6, 0);
    r.z_loss = true;
  }
  r.permute_fusion = v.on("moe-permute-fusion");
  r.shared_expert_gate = v.on("moe-shared-expert-gate");
  return r;
}

// Megatron's MoE flags as edits of the layer's experts (a base model's, or none); without
// experts (--num-experts absent or 0) Megatron ignores them, as here once checked.
void apply_moe_flags(const Values& v, theory::TransformerModel& m) {
  theory::MoeSpec& e = m.layer.moe;
  if (v.has("num-experts")) e.num_experts = static_cast<double>(v.integer("num-experts", 0, kMaxExperts, 0));
  if (!e.enabled()) {
    e = {};
    m.moe_layers.clear();
    return;
  }
  e.top_k = static_cast<double>(v.integer("moe-router-topk", 1, kMaxExperts, static_cast<int64_t>(e.top_k)));
  auto width = [&](const char* flag, double fallback) {
    return static_cast<double>(v.integer(flag, 1, kMaxModelWidth, static_cast<int64_t>(fallback)));
  };
  e.ffn_hidden = width("moe-ffn-hidden-size", e.ffn_hidden);
  e.shared_ffn_hidden = width("moe-shared-expert-intermediate-size", e.shared_ffn_hidden);
  if (v.has("moe-router-score-function")) e.score = theory::parse_moe_score(v.text("moe-router-score-function"));
  if (v.on("moe-router-pre-softmax")) e.pre_softmax = true;
  e.scaling = v.real("moe-router-topk-scaling-factor", 1e-6, 1e6, e.scaling);
  e.num_groups = static_cast<double>(v.integer("moe-router-num-groups", 1, kMaxExperts, static_cast<int64_t>(e.num_groups)));
  e.group_top_k = static_cast<double>(v.integer("moe-router-group-topk", 1, kMaxExperts, static_cast<int64_t>(e.group_top_k)));
  if (v.on("moe-router-enable-expert-bias")) e.expert_bias = true;
  e.capacity_factor = v.real("moe-expert-capacity-factor", 1e-6, 1e6, e.capacity_factor);
  if (v.has("moe-layer-freq"))
    m.moe_layers = theory::moe_layer_pattern(v.text("moe-layer-freq"), static_cast<int>(m.L), "--moe-layer-freq");
  e.megatron = megatron_routing_of(v);
  // Megatron-Core fuses the weighted activation for SwiGLU alone (its bias-SwiGLU kernel);
  // any other activation is act(fc1) times the weights.
  e.megatron.unfused_weighted_activation =
      m.layer.activation != theory::Activation::swiglu || v.on("no-bias-swiglu-fusion");
  if (e.megatron.shared_expert_gate && e.shared_ffn_hidden == 0)
    throw InvalidArgument("--moe-shared-expert-gate gates the shared experts: it needs --moe-shared-expert-intermediate-size");
  theory::check_moe_spec(e);
}

// --multi-latent-attention with Megatron-LM's defaults (q from h directly, kv_lora_rank 32,
// heads of 128 + 64 for q and k, 128 for v), or the base model's latent attention, each edited
// by the rank and head flags given. Megatron-Core's --qk-layernorm is, with latent attention,
// the latents' norms (its q_layernorm and kv_layernorm): without it there are none.
void apply_mla_flags(const Values& v, theory::LayerSpec& s) {
  theory::MlaSpec& a = s.mla;
  if (v.on("multi-latent-attention") && !a.enabled) {
    a = {};
    a.enabled = true;
    a.kv_lora_rank = 32;
    a.latent_norms = v.on("qk-layernorm");
  }
  if (!a.enabled) return;
  s.qk_layernorm = false;
  auto width = [&](const char* flag, double fallback) {
    return static_cast<double>(v.integer(flag, 1, kMaxModelWidth, static_cast<int64_t>(fallback)));
  };
  a.q_lora_rank = width("q-lora-rank", a.q_lora_rank);
  a.kv_lora_rank = width("kv-lora-rank", a.kv_lora_rank);
  a.qk_head_dim = width("qk-head-dim", a.qk_head_dim);
  a.qk_pos_emb_head_dim = width("qk-pos-emb-head-dim", a.qk_pos_emb_head_dim);
  a.v_head_dim = width("v-head-dim", a.v_head_dim);
}

// --cross-entropy-loss-fusion with --cross-entropy-fusion-impl native (Megatron's default) or te.
theory::CrossEntropyFusion cross_entropy_of(const Values& v) {
  const std::string impl = v.text("cross-entropy-fusion-impl", "native");
  if (impl != "native" && impl != "te")
    throw InvalidArgument("--cross-entropy-fusion-impl must be native or te, got '" + printable(impl) + "'");
  if (!v.on("cross-entropy-loss-fusion")) return theory::CrossEntropyFusion::none;
  return impl == "te" ? theory::CrossEntropyFusion::te : theory::CrossEntropyFusion::native;
}

// --fp8-format e4m3|hybrid with --fp8-recipe delayed (Megatron's default), tensorwise, blockwise
// or mxfp8: the recipe whose FP8 weight caches Transformer Engine keeps; none without the format.
theory::Fp8Recipe fp8_of(const Values& v) {
  const std::string recipe = v.text("fp8-recipe", "delayed");
  const std::optional<theory::Fp8Recipe> chosen = theory::find_fp8_recipe(recipe);
  if (!chosen)
    throw InvalidArgument("--fp8-recipe must be delayed, tensorwise, blockwise or mxfp8, got '" + printable(recipe) + "'");
  if (!v.has("fp8-format")) return theory::Fp8Recipe::none;
  const std::string format = v.text("fp8-format");
  if (format != "e4m3" && format != "hybrid")
    throw InvalidArgument("--fp8-format must be e4m3 or hybrid, got '" + printable(format) + "'");
  return *chosen;
}

// Megatron-Core's own (local) attention: --transformer-impl local without flash attention.
bool local_attention(const Values& v) {
  return v.text("transformer-impl", "transformer_engine") == "local" && !v.on("use-flash-attn");
}

bool unfused_backend(const Values& v) {
  const std::string backend = v.text("attention-backend", "auto");
  return backend == "unfused" || backend == "local";
}

// Without --no-masked-softmax-fusion the local attention's fused kernel keeps the 16-bit
// probabilities; with it torch's softmax runs, in fp32 when asked (query-key layer scaling
// implies it; on fp32 activations the pieces count nothing more). Transformer Engine's unfused
// attention has its own switch.
bool fp32_torch_softmax(const Values& v) {
  const bool fp32_softmax = v.on("attention-softmax-in-fp32") || v.on("apply-query-key-layer-scaling");
  return local_attention(v) && v.on("no-masked-softmax-fusion") && fp32_softmax;
}

// The layer flags as edits of the model's spec.
void apply_layer_flags(const Values& v, theory::TransformerModel& m) {
  theory::LayerSpec& s = m.layer;
  if (v.has("normalization")) s.normalization = theory::parse_norm(v.text("normalization"));
  for (const char* eps : {"layernorm-epsilon", "norm-epsilon"})
    if (v.has(eps)) s.norm_epsilon = v.real(eps, 1e-30, 1, s.norm_epsilon);
  if (v.on("qk-layernorm")) s.qk_layernorm = true;
  if (v.on("swiglu") && v.on("squared-relu")) throw InvalidArgument("--swiglu and --squared-relu: give one");
  if (v.on("swiglu")) s.activation = theory::Activation::swiglu;
  if (v.on("squared-relu")) s.activation = theory::Activation::squared_relu;
  if (v.has("ffn-hidden-size")) {
    s.ffn_hidden = static_cast<double>(v.integer("ffn-hidden-size", 1, kMaxModelWidth, 0));
  } else if (v.on("swiglu")) {  // Megatron's default SwiGLU width: 2/3 of 4h, down to a multiple of 64
    s.ffn_hidden = std::floor(4 * m.h * 2 / 3 / 64) * 64;
  }
  if (v.on("disable-bias-linear")) s.add_bias_linear = false;
  if (v.on("add-qkv-bias")) s.add_qkv_bias = true;
  if (v.on("group-query-attention"))
    s.kv_heads = static_cast<double>(v.integer("num-query-groups", 1, kMaxModelWidth, 1));
  if (v.has("kv-channels")) s.kv_channels = static_cast<double>(v.integer("kv-channels", 1, kMaxModelWidth, 0));
  if (v.on("use-rotary-position-embeddings")) s.position = theory::PositionEmbedding::rope;
  if (v.has("position-embedding-type")) {
    const std::string type = v.text("position-embedding-type");
    s.position = theory::parse_position(type);
    m.learned_positions = type == "learned_absolute";
  } else if (v.on("use-rotary-position-embeddings") || v.on("no-position-embedding")) {
    m.learned_positions = false;
  }
  if (v.on("no-position-embedding")) s.position = theory::PositionEmbedding::none;
  s.rotary_percent = v.real("rotary-percent", 1e-9, 1, s.rotary_percent);
  s.rotary_base = v.real("rotary-base", 1, 1e12, s.rotary_base);
  s.attention_dropout = v.real("attention-dropout", 0, 0.999999, s.attention_dropout);
  s.hidden_dropout = v.real("hidden-dropout", 0, 0.999999, s.hidden_dropout);
  if (v.on("untie-embeddings-and-output-weights")) m.tied_embeddings = false;
  if (v.has("make-vocab-size-divisible-by"))
    m.vocab_divisible_by = static_cast<double>(v.integer("make-vocab-size-divisible-by", 1, kMaxVocab, 128));
  if (v.has("seq-length")) m.seq = static_cast<double>(v.integer("seq-length", 1, kMaxPositions, 0));
  if (v.has("max-position-embeddings"))
    m.max_positions = static_cast<double>(v.integer("max-position-embeddings", 1, kMaxPositions, 0));
  s.megatron_fp32_torch_softmax = fp32_torch_softmax(v);
  apply_moe_flags(v, m);
  apply_mla_flags(v, s);
  if (v.has("mtp-num-layers")) m.mtp_layers = static_cast<int>(v.integer("mtp-num-layers", 0, kMaxModelLayers, 0));
  if (v.has("mtp-loss-scaling-factor")) v.real("mtp-loss-scaling-factor", 0, 1e6, 0.1);
}

double dtype_bytes(const std::string& flag, const std::string& name) {
  if (name == "fp32") return 4;
  if (name == "bf16" || name == "fp16") return 2;
  if (name == "fp8" || name == "uint8") return 1;
  throw InvalidArgument("--" + flag + " must be fp32, bf16, fp16, fp8 or uint8, got '" + printable(name) + "'");
}

theory::TrainingPrecision precision_of(const Values& v) {
  if (v.on("bf16") && v.on("fp16")) throw InvalidArgument("--bf16 and --fp16: give one");
  theory::TrainingPrecision p;
  if (!v.on("bf16") && !v.on("fp16")) {  // fp32 training: no master copy
    p.activation = p.weight = p.grad = 4;
    p.master = 0;
  } else if (v.on("fp16") && !v.on("accumulate-allreduce-grads-in-fp32")) {
    p.grad = 2;  // fp16's gradients stay fp16 unless asked (bf16's are always fp32)
  }
  const std::string optimizer = v.text("optimizer", "adam");
  const bool aware = v.on("use-precision-aware-optimizer");
  if (optimizer == "adam") {
    p.optimizer_state = aware ? dtype_bytes("exp-avg-dtype", v.text("exp-avg-dtype", "fp32")) +
                                    dtype_bytes("exp-avg-sq-dtype", v.text("exp-avg-sq-dtype", "fp32"))
                              : 8;
  } else if (optimizer == "sgd") {
    p.optimizer_state = v.real("sgd-momentum", 0, 1e6, 0.9) != 0 ? 4 : 0;
  } else {
    throw InvalidArgument("--optimizer must be adam or sgd, got '" + printable(optimizer) + "'");
  }
  if (aware && p.master > 0) p.master = dtype_bytes("main-params-dtype", v.text("main-params-dtype", "fp32"));
  if (aware && v.has("main-grads-dtype")) p.grad = dtype_bytes("main-grads-dtype", v.text("main-grads-dtype"));
  if (v.on("grad-reduce-in-bf16")) p.grad = 2;
  if (v.on("use-megatron-fsdp") || v.on("use-custom-fsdp")) {
    // Megatron-FSDP's own buffers: its main weights (the optimizer's copy) and main gradients.
    if (p.master > 0 && v.has("megatron-fsdp-main-params-dtype"))
      p.master = dtype_bytes("megatron-fsdp-main-params-dtype", v.text("megatron-fsdp-main-params-dtype"));
    const std::string grads = v.text("megatron-fsdp-main-grads-dtype", "auto");
    if (grads != "auto") p.grad = dtype_bytes("megatron-fsdp-main-grads-dtype", grads);
  }
  return p;
}

theory::DpShard dp_shard_of(const Values& v, const char* flag, const char* fallback) {
  return parse_dp_shard(std::string("--") + flag, v.text(flag, fallback));
}

// An outer strategy: no_shard, or optim (the optimizer state sharded across the replicas too).
bool outer_optimizer_of(const Values& v, const char* flag) {
  const theory::DpShard s = dp_shard_of(v, flag, "no_shard");
  if (s != theory::DpShard::none && s != theory::DpShard::optimizer)
    throw InvalidArgument("--" + std::string(flag) + " must be no_shard or optim (the replicas hold whole "
                          "gradients and weights)");
  return s == theory::DpShard::optimizer;
}

theory::DataParallelSharding sharding_of(const Values& v) {
  theory::DataParallelSharding z;
  z.instances = static_cast<int>(v.integer("num-distributed-optimizer-instances", 1, theory::kMaxPlanGpus, 1));
  z.fsdp = v.on("use-megatron-fsdp") || v.on("use-custom-fsdp");
  if (v.has("megatron-fsdp-version")) v.integer("megatron-fsdp-version", 1, 2, 1);
  z.level = dp_shard_of(v, "data-parallel-sharding-strategy", "no_shard");
  z.outer_optimizer = outer_optimizer_of(v, "outer-dp-sharding-strategy");
  z.expert_outer_optimizer = outer_optimizer_of(v, "expert-outer-dp-sharding-strategy");
  return z;
}

// Megatron's --cp-comm-type: one type, or one per layer; the model takes one for every layer.
CpCommType cp_comm_of(const Values& v) {
  const std::string list = v.text("cp-comm-type", "p2p");
  const std::vector<std::string> types = list_words(list);
  std::string why;
  for (const std::string& type : types) {
    if (type == "a2a+p2p") why = "hierarchical context parallelism (a2a+p2p) is not modelled by theory memory";
    if (type != types.front()) why = "a type per layer is not modelled; give one for all layers";
  }
  if (why.empty()) {
    for (CpCommType c : {CpCommType::p2p, CpCommType::all_gather, CpCommType::a2a})
      if (types.front() == cp_comm_type_name(c)) return c;
    why = "expected p2p, all_gather or a2a";
  }
  std::string message = "--cp-comm-type ";
  message.append(printable(list)).append(": ").append(why);
  throw InvalidArgument(message);
}

// CUBLAS_WORKSPACE_CONFIG's bytes: ":SIZE:COUNT" pairs in KiB (":4096:8" is 32 MiB); 0 unset.
double cublas_workspace_config_bytes(const std::string& text) {
  if (text.empty()) return 0;
  const std::string bad = "CUBLAS_WORKSPACE_CONFIG must be :SIZE:COUNT pairs in KiB (:4096:8), got '" +
                          printable(text) + "'";
  static const std::regex pairs("(:[0-9]{1,9}:[0-9]{1,6})+");
  if (!std::regex_match(text, pairs)) throw InvalidArgument(bad);
  std::vector<double> numbers;  // size, count, size, count, ...
  std::istringstream in(text.substr(1));
  for (std::string n; std::getline(in, n, ':');) numbers.push_back(std::stod(n));
  double bytes = 0;
  for (size_t i = 0; i + 1 < numbers.size(); i += 2) bytes += 1024.0 * numbers[i] * numbers[i + 1];
  return bytes;
}

// The run's library workspaces: Transformer Engine's (the default --transformer-impl) and its
// grouped GEMM's (--moe-grouped-gemm on an MoE model) besides PyTorch's, at the GPU's sizes
// (Hopper's when none is named).
double workspace_bytes_of(const Values& v, const MegatronFlags& flags, const theory::TransformerModel& m,
                          const theory::Gpu* gpu) {
  const bool te = v.text("transformer-impl", "transformer_engine") == "transformer_engine";
  const theory::LibraryWorkspaces sizes =
      theory::library_workspaces(gpu ? gpu->compute_major : 9, cublas_workspace_config_bytes(flags.cublas_workspace_config));
  return theory::library_workspace_bytes(te, te && v.on("moe-grouped-gemm") && m.layer.moe.enabled(), sizes);
}

// parallel_state's global memory buffer: one tensor of the activations' type per name, kept for
// the run and grown to the largest request. Its users all ask under one name: Megatron-Core's
// local attention for its [b·a/t, s, s] scores (baddbmm's input), the local linears for their
// sequence-parallel gathers ([s, b, h]), and the allgather token dispatcher for the tokens it
// gathers over the expert tensor- and expert-parallel ranks ([s·b/(r·C)·etp·ep, h]).
double global_memory_buffer_bytes(const Values& v, const theory::TransformerModel& m, const theory::StepConfig& c) {
  const theory::StepLayout& l = c.layout;
  const double t = l.t, s = c.seq, b = c.micro_batch, r = c.policy.sequence_parallel ? t : 1.0;
  double elements = 0;
  if (local_attention(v)) {
    elements = std::max(elements, b * (m.a / t) * s * s);
    if (c.policy.sequence_parallel) elements = std::max(elements, s * b * m.h);  // QKV's and fc1's whole input
  }
  const double ep = l.ep, etp = l.etp > 0 ? l.etp : l.t;
  const bool allgather = v.text("moe-token-dispatcher-type", "allgather") == "allgather";
  if (m.layer.moe.enabled() && allgather && ep * etp > 1) elements = std::max(elements, s * b / (r * l.cp) * etp * ep * m.h);
  return c.precision.activation * elements;
}

// --offload-modules (Megatron's choices, each once) and --min-offloaded-tensor-size, read with
// --fine-grained-activation-offloading (Megatron ignores them without it), which Megatron runs
// under Transformer Engine only and with attn_proj only beside core_attn.
theory::ActivationOffload offload_of(const Values& v) {
  theory::ActivationOffload o = theory::parse_offload_modules(v.text("offload-modules", ""));
  o.min_tensor_elements = static_cast<double>(v.integer("min-offloaded-tensor-size", 0, int64_t{1} << 50, 1 << 20));
  if (!v.on("fine-grained-activation-offloading")) return {};
  if (!o.enabled()) throw InvalidArgument("--fine-grained-activation-offloading needs --offload-modules");
  if (v.text("transformer-impl", "transformer_engine") != "transformer_engine")
    throw InvalidArgument("--fine-grained-activation-offloading runs under --transformer-impl transformer_engine only");
  return o;
}

LayerPolicy policy_of(const Values& v, int t, StackRecompute& stack) {
  LayerPolicy c;
  c.sequence_parallel = v.on("sequence-parallel") && t > 1;  // Megatron turns SP off at t = 1
  c.cp_comm = cp_comm_of(v);
  c.attention = local_attention(v) || unfused_backend(v) ? Attention::unfused : Attention::fused;
  std::string granularity = v.text("recompute-granularity", v.on("recompute-activations") ? "selective" : "");
  if (granularity == "full") {
    c.recompute = Recompute::full;
    if (!v.has("recompute-method"))
      throw InvalidArgument("--recompute-granularity full needs --recompute-method uniform or block");
    stack.method = parse_recompute_method(v.text("recompute-method"));
    stack.num_layers = static_cast<int>(v.required("recompute-num-layers", 1, kMaxModelLayers));
  } else if (granularity == "selective") {
    c.recompute = Recompute::selective;
    if (v.has("recompute-modules")) c.modules = parse_recompute_modules(v.text("recompute-modules"));
  } else if (!granularity.empty()) {
    throw InvalidArgument("--recompute-granularity must be full or selective, got '" + printable(granularity) + "'");
  }
  return c;
}

// --pipeline-model-parallel-layout: its stages give vp (stages / p) and each one's layers, its
// m's the model's MTP layers; the other ways of splitting the layers are Megatron's alternatives.
void apply_pipeline_layout(const Values& v, int mtp_layers, theory::StepLayout& l) {
  const std::string& text = v.text("pipeline-model-parallel-layout");
  for (const char* other : {"num-layers-per-virtual-pipeline-stage", "decoder-first-pipeline-num-layers",
                            "decoder-last-pipeline-num-layers", "account-for-embedding-in-pipeline-split",
                            "account-for-loss-in-pipeline-split"})
    if (v.has(other))
      throw InvalidArgument("--pipeline-model-parallel-layout and --" + std::string(other) + ": give one");
  const PipelineLayout layout = parse_pipeline_layout(text);
  if (layout.mtp_layers != mtp_layers)
    throw InvalidArgument("--pipeline-model-parallel-layout places " + std::to_string(layout.mtp_layers) +
                          " MTP layers (m), --mtp-num-layers gives " + std::to_string(mtp_layers));
  const int stages = static_cast<int>(layout.stage_layers.size());
  if (stages % l.p != 0)
    throw InvalidArgument("--pipeline-model-parallel-layout " + printable(text) + " has " + std::to_string(stages) +
                          " stages: not a multiple of --pipeline-model-parallel-size (" + std::to_string(l.p) + ")");
  if (v.has("num-virtual-stages-per-pipeline-rank") && l.vp != stages / l.p)
    throw InvalidArgument("--num-virtual-stages-per-pipeline-rank " + std::to_string(l.vp) + " disagrees with the " +
                          std::to_string(stages / l.p) + " the pipeline layout's stages give");
  l.vp = stages / l.p;
  l.stage_layers = layout.stage_layers;
}

theory::StepLayout layout_of(const Values& v, int mtp_layers) {
  const int64_t max = theory::kMaxPlanGpus;
  theory::StepLayout l;
  l.t = static_cast<int>(v.integer("tensor-model-parallel-size", 1, max, 1));
  l.p = static_cast<int>(v.integer("pipeline-model-parallel-size", 1, max, 1));
  l.cp = static_cast<int>(v.integer("context-parallel-size", 1, max, 1));
  l.ep = static_cast<int>(v.integer("expert-model-parallel-size", 1, max, 1));
  l.etp = static_cast<int>(v.integer("expert-tensor-parallel-size", 1, max, l.t));  // Megatron: t when absent
  if (v.has("num-layers-per-virtual-pipeline-stage") && v.has("num-virtual-stages-per-pipeline-rank"))
    throw InvalidArgument("--num-layers-per-virtual-pipeline-stage and --num-virtual-stages-per-pipeline-rank: give one");
  l.vp = static_cast<int>(v.integer("num-virtual-stages-per-pipeline-rank", 1, max, 1));
  l.first_stage_layers = static_cast<int>(v.integer("decoder-first-pipeline-num-layers", 1, kMaxModelLayers, 0));
  l.last_stage_layers = static_cast<int>(v.integer("decoder-last-pipeline-num-layers", 1, kMaxModelLayers, 0));
  l.embedding_in_split = v.on("account-for-embedding-in-pipeline-split");
  l.loss_in_split = v.on("account-for-loss-in-pipeline-split");
  if (v.has("pipeline-model-parallel-layout")) apply_pipeline_layout(v, mtp_layers, l);
  l.vp_group = static_cast<int>(v.integer("microbatch-group-size-per-virtual-pipeline-stage", 1, 1 << 24, 0));
  return l;
}

// Megatron's --num-layers-per-virtual-pipeline-stage N: vp = layers per rank / N.
int virtual_stages_from_layers(const Values& v, const theory::TransformerModel& m, int p) {
  const int64_t per_chunk = v.integer("num-layers-per-virtual-pipeline-stage", 1, kMaxModelLayers, 0);
  const double per_rank = m.L / p;
  if (std::fmod(per_rank, static_cast<double>(per_chunk)) != 0)
    throw InvalidArgument("--num-layers-per-virtual-pipeline-stage " + std::to_string(per_chunk) +
                          " must divide the layers per pipeline stage (" + std::to_string(static_cast<int64_t>(per_rank)) + ")");
  return static_cast<int>(per_rank / per_chunk);
}

int world_size_of(const Values& v, int gpus) {
  if (gpus > 0) return gpus;
  if (v.has("world-size")) return static_cast<int>(v.integer("world-size", 1, theory::kMaxPlanGpus, 0));
  const bool launcher = v.has("nproc_per_node") || v.has("nproc-per-node");
  if (!launcher) return 0;
  const int64_t per_node = v.has("nproc_per_node") ? v.integer("nproc_per_node", 1, 1 << 16, 1)
                                                   : v.integer("nproc-per-node", 1, 1 << 16, 1);
  const int64_t nodes = v.integer("nnodes", 1, theory::kMaxPlanGpus, 1);
  if (per_node * nodes > theory::kMaxPlanGpus) throw InvalidArgument("--nproc_per_node x --nnodes is too large");
  return static_cast<int>(per_node * nodes);
}

// Values read only under another flag (Megatron ignores them otherwise) are still checked when
// given: a value given is used or refused, never silently dropped.
void check_conditional_values(const Values& v) {
  if (v.has("num-query-groups")) v.integer("num-query-groups", 1, kMaxModelWidth, 1);
  if (v.has("recompute-num-layers")) v.integer("recompute-num-layers", 1, kMaxModelLayers, 1);
  if (v.has("recompute-modules")) parse_recompute_modules(v.text("recompute-modules"));
  if (v.has("recompute-method")) parse_recompute_method(v.text("recompute-method"));
  if (v.has("sgd-momentum")) v.real("sgd-momentum", 0, 1e6, 0);
  for (const char* flag : {"main-params-dtype", "main-grads-dtype", "exp-avg-dtype", "exp-avg-sq-dtype"})
    if (v.has(flag)) dtype_bytes(flag, v.text(flag));
  // the MoE and latent-attention values, read only with experts / --multi-latent-attention
  for (const char* flag : {"moe-router-topk", "moe-router-num-groups", "moe-router-group-topk"})
    if (v.has(flag)) v.integer(flag, 1, kMaxExperts, 1);
  for (const char* flag : {"moe-ffn-hidden-size", "moe-shared-expert-intermediate-size", "q-lora-rank", "kv-lora-rank",
                           "qk-head-dim", "qk-pos-emb-head-dim", "v-head-dim"})
    if (v.has(flag)) v.integer(flag, 1, kMaxModelWidth, 1);
  if (v.has("moe-router-score-function")) theory::parse_moe_score(v.text("moe-router-score-function"));
  if (v.has("moe-router-topk-scaling-factor")) v.real("moe-router-topk-scaling-factor", 1e-6, 1e6, 1);
  if (v.has("moe-expert-capacity-factor")) v.real("moe-expert-capacity-factor", 1e-6, 1e6, 1);
  megatron_routing_of(v);
  cross_entropy_of(v);
  fp8_of(v);
  offload_of(v);
  if (v.has("wgrad-deferral-limit")) v.integer("wgrad-deferral-limit", 0, 1 << 30, 0);
  if (v.has("moe-router-bias-update-rate")) v.real("moe-router-bias-update-rate", 0, 1e6, 0);
  const std::string drop = v.text("moe-token-drop-policy", "probs");
  if (drop != "probs" && drop != "position")
    throw InvalidArgument("--moe-token-drop-policy must be probs or position, got '" + printable(drop) + "'");
  // The dispatcher moves tokens between expert-parallel ranks; what each expert keeps is the same.
  const std::string dispatcher = v.text("moe-token-dispatcher-type", "allgather");
  if (dispatcher != "allgather" && dispatcher != "alltoall" && dispatcher != "flex")
    throw InvalidArgument("--moe-token-dispatcher-type must be allgather, alltoall or flex, got '" +
                          printable(dispatcher) + "'");
}

}  // namespace

theory::DpShard parse_dp_shard(const std::string& flag, const std::string& name) {
  if (const std::optional<theory::DpShard> s = theory::find_dp_shard(name)) return *s;
  throw InvalidArgument(flag + " must be no_shard, optim, optim_grads or optim_grads_params, got '" + printable(name) +
                        "'");
}

theory::TransformerModel megatron_model(const MegatronFlags& flags) {
  refuse_what_is_not_modelled(flags);
  check_conditional_values(Values(flags));
  const Values v(flags);
  theory::TransformerModel m = model_from_flags(v);
  apply_layer_flags(v, m);
  return m;
}

MegatronRun megatron_run(const MegatronFlags& flags, const std::optional<theory::TransformerModel>& base, int gpus,
                         const theory::Gpu* gpu) {
  refuse_what_is_not_modelled(flags);
  const Values v(flags);
  check_conditional_values(v);
  MegatronRun run;
  run.model = base ? *base : model_from_flags(v);
  apply_layer_flags(v, run.model);
  theory::StepConfig& c = run.step;
  c.layout = layout_of(v, run.model.mtp_layers);
  if (v.has("num-layers-per-virtual-pipeline-stage")) c.layout.vp = virtual_stages_from_layers(v, run.model, c.layout.p);
  c.policy = policy_of(v, c.layout.t, c.stack);
  c.distribute_saved_activations = v.on("distribute-saved-activations");
  c.distributed_optimizer = v.on("use-distributed-optimizer");
  c.sharding = sharding_of(v);
  c.gradient_accumulation_fusion = !v.on("no-gradient-accumulation-fusion");
  c.cross_entropy = cross_entropy_of(v);
  c.fp8 = fp8_of(v);
  c.fp8_param_gather = c.fp8 != theory::Fp8Recipe::none && v.on("fp8-param-gather");
  c.offload = offload_of(v);
  c.defer_embedding_wgrad = v.on("defer-embedding-wgrad-compute");
  c.overlap_moe_ep_comm = v.on("overlap-moe-expert-parallel-comm");
  c.wgrad_deferral_limit = static_cast<int>(v.integer("wgrad-deferral-limit", 0, 1 << 30, 0));
  c.precision = precision_of(v);
  c.seq = run.model.seq;
  c.micro_batch = static_cast<double>(v.integer("micro-batch-size", 1, 1 << 16, 1));
  c.workspace_bytes = workspace_bytes_of(v, flags, run.model, gpu) + global_memory_buffer_bytes(v, run.model, c);
  run.world_size = world_size_of(v, gpus);
  const int64_t model_parallel = int64_t{c.layout.t} * c.layout.p * c.layout.cp;
  if (run.world_size == 0)
    throw InvalidArgument("the GPU count: give --gpus N (no --world-size or launcher --nproc_per_node to read it from)");
  if (run.world_size % model_parallel != 0)
    throw InvalidArgument("the world size (" + std::to_string(run.world_size) + " GPUs) must be a multiple of "
                          "tensor x pipeline x context parallel (" + std::to_string(model_parallel) + ")");
  c.layout.dp = static_cast<int>(run.world_size / model_parallel);
  theory::check_expert_layout(run.model, c.layout);
  c.global_batch = static_cast<double>(
      v.integer("global-batch-size", 1, static_cast<int64_t>(theory::kMaxGlobalBatch), 0));
  return run;
}

}  // namespace actbench
