#include "runners/layer_run_options.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <limits>
#include <utility>

#include "runners/facts_json.hpp"
#include "runners/hf_config.hpp"
#include "runners/layer_spec_options.hpp"
#include "runners/presets.hpp"
#include "runners/result_columns.hpp"
#include "runners/run_args.hpp"
#include "runtime/error.hpp"
#include "runtime/kernel_report.hpp"

namespace actbench {
namespace {

// The names parse_config takes beyond the paper's five (full+sp).
std::string extra_configs_option() {
  std::string text;
  for (const std::string& c : config_names())
    if (std::find(paper_config_names().begin(), paper_config_names().end(), c) == paper_config_names().end())
      text += (text.empty() ? "" : ",") + c;
  return text;
}

// --model's choices: "tiny | 22b | ...", the presets' names.
std::string preset_names_option() {
  std::string text;
  for (const ModelPreset& p : model_presets()) text += (text.empty() ? "" : " | ") + p.name;
  return text;
}

// --config's default: the paper's five.
std::string paper_configs_option() {
  std::string text;
  for (const std::string& c : paper_config_names()) text += (text.empty() ? "" : ",") + c;
  return text;
}
constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
constexpr int64_t kMaxDim = std::numeric_limits<int64_t>::max();

// What the command line says, each value as given (a value option counts when given).
struct Args {
  std::string backend = "cpu", model = "tiny", configs = paper_configs_option(), attention = "unfused", dtype = "bf16";
  std::string hidden, heads, seq, batch, tp, layers = "1", warmup = "2", iters = "10", dropout,
                                                seed = "1234", link_gbps = "450";
  std::string csv, dump, cupti, memory_limit, kernel_report, kernel_report_device;
  std::string arch, hf_config;
  // The spec's flags (layer_spec_options.hpp), Megatron's names first.
  std::string normalization, norm_epsilon, ffn_hidden, num_query_groups, kv_heads, kv_channels, position,
      rotary_percent, rotary_base, attention_dropout, hidden_dropout;
  bool qk_layernorm = false, swiglu = false, squared_relu = false, disable_bias_linear = false, add_qkv_bias = false,
       group_query_attention = false;
  std::string num_experts, moe_topk, moe_ffn_hidden, moe_shared_ffn_hidden, moe_score, moe_scaling, moe_num_groups,
      moe_group_topk, moe_capacity_factor, q_lora_rank, kv_lora_rank, qk_head_dim, qk_pos_emb_head_dim, v_head_dim;
  bool moe_pre_softmax = false, moe_expert_bias = false, multi_latent_attention = false;
  std::string recompute_granularity, recompute_modules, recompute_method, recompute_num_layers;
  bool recompute_activations = false, sequence_parallel = false;
  std::string cp = "1", cp_comm_type = "p2p";
  std::string moe_tokens_per_expert;  // meta's routing of an MoE layer
  std::string ep = "1", etp = "1";
  bool emulate_cp = false, emulate_ep = false;
  bool emulate_tp = false, print_header = false, print_schema = false, list_presets = false, json = false;
};

// The value options in the order --help lists them, each with whether it was given.
using GivenOptions = std::vector<std::pair<std::string, CLI::Option*>>;

// The spec's flags, declared beside the value options (Megatron-LM's names and meanings).
void declare_spec_options(CLI::App& app, Args& a, const std::function<void(const char*, std::string&,
                                                                             const std::string&)>& value) {
  value("--normalization", a.normalization, "LayerNorm | RMSNorm (default: the preset's)");
  value("--norm-epsilon,--norm-eps", a.norm_epsilon, "the norms' epsilon (default 1e-5 or the config's)");
  app.add_flag("--qk-layernorm", a.qk_layernorm, "a norm over each head of q and k, before RoPE (Qwen3, OLMo-2)");
  app.add_flag("--swiglu", a.swiglu, "SwiGLU MLP: fc1 has 2F outputs, gate | up");
  app.add_flag("--squared-relu", a.squared_relu, "squared-ReLU MLP: relu(x)^2");
  value("--ffn-hidden-size,--ffn-hidden", a.ffn_hidden, "F, the MLP's width (default 4 x hidden, or the preset's)");
  app.add_flag("--disable-bias-linear", a.disable_bias_linear, "no bias on any linear (QKV, projection, fc1, fc2)");
  app.add_flag("--add-qkv-bias", a.add_qkv_bias, "a bias on the QKV linear alone (Qwen2)");
  app.add_flag("--group-query-attention", a.group_query_attention,
               "grouped-query attention with --num-query-groups key/value heads (default 1)");
  value("--num-query-groups", a.num_query_groups, "G key/value heads under --group-query-attention (dividing heads)");
  value("--kv-heads", a.kv_heads, "G key/value heads (1 <= G <= heads, dividing heads; G = heads is MHA)");
  value("--kv-channels", a.kv_channels,
        "D, each head's size (Hugging Face's head_dim): QKV has (heads + 2G) x D outputs; 0: hidden / heads");
  value("--position-embedding-type", a.position,
        "rope | learned_absolute | none (learned_absolute is added before the first layer: none inside it)");
  value("--rotary-percent", a.rotary_percent, "the share of each head's dimensions RoPE rotates, (0, 1]");
  value("--rotary-base,--rope-theta", a.rotary_base, "RoPE's base theta (default 10000, the preset's or the config's)");
  value("--attention-dropout", a.attention_dropout, "dropout on the attention probabilities (default: --dropout)");
  value("--hidden-dropout", a.hidden_dropout, "dropout on each block's output (default: --dropout)");
  value("--num-experts", a.num_experts, "E: a mixture of experts in place of the MLP (docs/moe.md)");
  value("--moe-router-topk", a.moe_topk, "k, the experts each token is routed to (default 2)");
  value("--moe-ffn-hidden-size", a.moe_ffn_hidden, "each expert's width (default: the MLP's)");
  value("--moe-shared-expert-intermediate-size", a.moe_shared_ffn_hidden, "the shared experts' width (default: none)");
  value("--moe-router-score-function", a.moe_score, "softmax | sigmoid");
  app.add_flag("--moe-router-pre-softmax", a.moe_pre_softmax, "softmax over all experts, then top-k, not normalised");
  value("--moe-router-topk-scaling-factor", a.moe_scaling, "the routing weights' factor (default 1)");
  value("--moe-router-num-groups", a.moe_num_groups, "device-limited routing: groups of experts");
  value("--moe-router-group-topk", a.moe_group_topk, "the groups each token may use");
  app.add_flag("--moe-router-enable-expert-bias", a.moe_expert_bias, "the aux-loss-free score bias (DeepSeek-V3)");
  value("--moe-expert-capacity-factor", a.moe_capacity_factor, "drop tokens beyond this capacity (default: dropless)");
  app.add_flag("--multi-latent-attention", a.multi_latent_attention,
               "multi-latent attention (DeepSeek-V2/V3) in place of the QKV projection");
  value("--q-lora-rank", a.q_lora_rank, "with --multi-latent-attention: q's latent width (default: none)");
  value("--kv-lora-rank", a.kv_lora_rank, "with --multi-latent-attention: k and v's latent width (default 32)");
  value("--qk-head-dim", a.qk_head_dim, "with --multi-latent-attention: q and k's head width without RoPE (128)");
  value("--qk-pos-emb-head-dim", a.qk_pos_emb_head_dim, "with --multi-latent-attention: their RoPE part (64)");
  value("--v-head-dim", a.v_head_dim, "with --multi-latent-attention: v's head width (128)");
  value("--recompute-granularity", a.recompute_granularity,
        "full | selective: with --sequence-parallel, the one configuration to run (instead of --config)");
  app.add_flag("--recompute-activations", a.recompute_activations, "--recompute-granularity selective");
  app.add_flag("--sequence-parallel", a.sequence_parallel,
               "sequence parallelism: with --recompute-granularity, the one configuration to run (instead of --config)");
  value("--recompute-modules", a.recompute_modules,
        "what selective recompute rebuilds: any of core_attn,mlp,layernorm,moe_act,moe,shared_experts,mla_up_proj "
        "(default core_attn)");
  value("--recompute-method", a.recompute_method,
        "full recompute over --layers: uniform (groups of --recompute-num-layers, each from its input) | block "
        "(the first --recompute-num-layers layers recomputed, the rest keep everything)");
  value("--recompute-num-layers", a.recompute_num_layers, "N for --recompute-method (default 1)");
}

bool is_given(const GivenOptions& given, const char* name) {
  for (const auto& [n, opt] : given)
    if (n == name) return opt->count() > 0;
  return false;
}

// The option's names as a user may have typed them: "--rotary-base/--rope-theta".
std::string all_names(const GivenOptions& given, const char* name) {
  for (const auto& [n, opt] : given)
    if (n == name) {
      std::string names = opt->get_name(false, true);
      std::replace(names.begin(), names.end(), ',', '/');
      return names;
    }
  return name;
}

GivenOptions declare_options(CLI::App& app, Args& a) {
  GivenOptions given;
  // Given under its first name (Megatron's, where an option has an older alias).
  auto value = [&](const char* names, std::string& field, const std::string& help, bool show_default) {
    CLI::Option* opt = app.add_option(names, field, help);
    if (show_default) opt->capture_default_str();
    const std::string all = names;
    given.emplace_back(all.substr(0, all.find(',')), opt);
  };
  value("--backend", a.backend, "cpu | cuda | meta", true);
  value("--model", a.model, preset_names_option() + " (--list-presets shows their shapes)", true);
  value("--hidden", a.hidden, "override the preset's hidden size h", false);
  value("--heads", a.heads, "override the preset's attention heads a", false);
  value("--seq", a.seq, "override the preset's sequence length s", false);
  value("--batch", a.batch, "override the preset's microbatch b", false);
  value("--tp", a.tp, "tensor-parallel size (default: MPI world size; with --emulate-tp the preset's t)", false);
  app.add_flag("--emulate-tp", a.emulate_tp, "one process plays rank 0 of --tp ranks; communication modeled");
  value("--context-parallel-size,--cp", a.cp,
        "context-parallel size C: each rank holds 2 of the sequence's 2C chunks; under mpirun the world is tp x C "
        "ranks (Megatron's order)",
        true);
  value("--cp-comm-type", a.cp_comm_type,
        "context parallelism's attention: p2p (ring; --attention fused) | all_gather | a2a (Ulysses)", true);
  app.add_flag("--emulate-cp", a.emulate_cp, "one process plays rank 0 of --cp ranks; communication modeled");
  value("--expert-model-parallel-size,--ep", a.ep,
        "an MoE layer's experts over this many ranks (under mpirun -np ep): each holds num-experts / ep experts; "
        "the ranks are ep / (tp x cp) data-parallel replicas of the --tp x --cp ranks (--tp default 1, SP under "
        "TP), each replica its own micro-batch, and the tokens travel by all-to-all. With --tp equal to it: the "
        "experts over the tensor-parallel group, the micro-batch shared",
        true);
  value("--expert-tensor-parallel-size,--etp", a.etp,
        "an MoE layer's experts each split over the tensor-parallel group: 1 (each expert whole, as Megatron's "
        "DeepSeek, Qwen and Mixtral recipes set it) or --tp (Megatron's own default): every rank runs 1/tp of every "
        "expert over the routed rows of the whole group (with --expert-model-parallel-size N: of its E/N experts, "
        "under mpirun -np tp x N)",
        true);
  app.add_flag("--emulate-ep", a.emulate_ep,
               "one process plays rank 0 of --expert-model-parallel-size ranks, every rank routing as it does; "
               "communication modeled");
  value("--config", a.configs, "comma-separated: " + paper_configs_option() + "[," + extra_configs_option() + "]", true);
  value("--attention", a.attention,
        "unfused (the paper's) | fused (FlashAttention-style: no probabilities or masks stored)", true);
  value("--dtype", a.dtype, "bf16 | fp16 | fp32", true);
  value("--dropout", a.dropout,
        "dropout probability of the gpt preset's attention and hidden dropout (llama's: 0); any spec with "
        "--attention-dropout / --hidden-dropout",
        false);
  value("--layers", a.layers, "layers in the stack, 1..1024 (times and bytes are reported per layer)", true);
  value("--warmup", a.warmup, "untimed iterations (meta: 0)", true);
  value("--iters", a.iters, "timed iterations (meta: 1)", true);
  value("--seed", a.seed, "seed of parameters, inputs and dropout masks (0..2^64-1)", true);
  value("--csv", a.csv, "results CSV to append to (required)", false);
  app.add_flag("--print-csv-header", a.print_header, "print the CSV header line and exit (for sweep drivers)");
  app.add_flag("--print-csv-schema", a.print_schema,
               "print every CSV column with its unit and meaning (markdown, docs/results_schema.md) and exit");
  app.add_flag("--list-presets", a.list_presets, "print the model presets (--model) with their shapes and exit");
  app.add_flag("--json", a.json,
               "with --list-presets: the presets, configurations and attention modes as JSON (runners/facts.json)");
  value("--dump", a.dump, "write canonical .npy tensors of one layer here (rank 0)", false);
  value("--cupti", a.cupti, "write GPU kernel time per phase (CUPTI) to this CSV (cuda backend; Figure 8's split)",
        false);
  value("--kernel-report", a.kernel_report,
        "write the simulator's memory-access counts per phase and kernel, with a modeled time, to this CSV (the "
        "simulator build, --backend cuda)",
        false);
  value("--kernel-report-device", a.kernel_report_device,
        "the device of --kernel-report's modeled columns: h100 (default) | a100", false);
  value("--memory-limit", a.memory_limit, "emulate a device of this size, e.g. 80GiB (OOM past it)", false);
  value("--moe-tokens-per-expert", a.moe_tokens_per_expert,
        "meta, an MoE layer: the rows each expert processes, comma-separated (e.g. a measured run's histogram); "
        "default: balanced routing",
        false);
  value("--link-gbps", a.link_gbps, "link bandwidth per direction for comm_ms_modeled, GB/s", true);
  value("--arch", a.arch,
        "the preset spec the flags below edit: gpt (the paper's layer) | llama (RMSNorm, GQA, RoPE, SwiGLU, no "
        "biases, no dropout); default: the model's",
        false);
  declare_spec_options(app, a, [&](const char* names, std::string& field, const std::string& help) {
    value(names, field, help, false);
  });
  value("--hf-config", a.hf_config,
        "a Hugging Face config.json of a llama, mistral, qwen2, qwen3 or gemma model: its shape and layer spec "
        "(instead of --model and the flags the file defines)",
        false);
  return given;
}

// "a,b,c": whole numbers >= 0, at least one.
std::vector<int64_t> parse_count_list(const char* option, const std::string& text) {
  std::vector<int64_t> out;
  size_t begin = 0;
  while (true) {
    const size_t comma = text.find(',', begin);
    const std::string word = text.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
    out.push_back(parse_int_option(option, word, 0, kMaxDim));
    if (comma == std::string::npos) return out;
    begin = comma + 1;
  }
}

// The shape, the run's extent and its numbers, each refused with the option's name.
void take_run_values(const Args& a, const GivenOptions& given, LayerRunOptions& o) {
  if (is_given(given, "--hidden")) o.hidden = parse_int_option("--hidden", a.hidden, 1, kMaxDim);
  if (is_given(given, "--heads")) o.heads = parse_int_option("--heads", a.heads, 1, kMaxDim);
  if (is_given(given, "--seq")) o.seq = parse_int_option("--seq", a.seq, 1, kMaxDim);
  if (is_given(given, "--batch")) o.batch = parse_int_option("--batch", a.batch, 1, kMaxDim);
  if (is_given(given, "--tp")) o.tp = static_cast<int>(parse_int_option("--tp", a.tp, 1, kMaxInt));
  o.emulate_tp = a.emulate_tp;
  o.cp = static_cast<int>(parse_int_option("--context-parallel-size", a.cp, 1, kMaxInt));
  o.emulate_cp = a.emulate_cp;
  o.ep = static_cast<int>(parse_int_option("--expert-model-parallel-size", a.ep, 1, kMaxInt));
  o.emulate_ep = a.emulate_ep;
  o.etp = static_cast<int>(parse_int_option("--expert-tensor-parallel-size", a.etp, 1, kMaxInt));
  o.cp_comm_type = a.cp_comm_type;
  (void)parse_cp_comm_type(o.cp_comm_type);  // refused now, with the option's name
  o.layers = static_cast<int>(parse_int_option("--layers", a.layers, 1, kMaxLayers));
  o.warmup = static_cast<int>(parse_int_option("--warmup", a.warmup, 0, kMaxIterations));
  o.iters = static_cast<int>(parse_int_option("--iters", a.iters, 1, kMaxIterations));
  o.warmup_given = is_given(given, "--warmup");
  o.iters_given = is_given(given, "--iters");
  o.seed = parse_uint64_option("--seed", a.seed);
  o.link_gbps = parse_real_option("--link-gbps", a.link_gbps);
  // Outside this a modeled time is no longer a number a row can carry.
  if (!(o.link_gbps >= 1e-3 && o.link_gbps <= 1e6))
    throw InvalidArgument("--link-gbps must be in 0.001..1000000 (GB/s), got " + a.link_gbps);
  if (is_given(given, "--memory-limit")) o.memory_limit = parse_memory_size("--memory-limit", a.memory_limit);
  if (is_given(given, "--moe-tokens-per-expert"))
    o.moe_tokens_per_expert = parse_count_list("--moe-tokens-per-expert", a.moe_tokens_per_expert);
}

// The flags that say what a --hf-config file already defines, with what defines it there.
const std::pair<const char*, const char*> kFlagsTheConfigDefines[] = {
    {"--model", "the model"},
    {"--hidden", "hidden_size"},
    {"--heads", "num_attention_heads"},
    {"--kv-heads", "num_key_value_heads"},
    {"--num-query-groups", "num_key_value_heads"},
    {"--kv-channels", "head_dim"},
    {"--group-query-attention", "num_key_value_heads"},
    {"--ffn-hidden-size", "intermediate_size"},
    {"--rotary-base", "rope_theta"},
    {"--norm-epsilon", "rms_norm_eps"}};

// --hf-config: the model is the file's; a flag that would say it again is refused, not ignored.
void take_hf_config(const GivenOptions& given, LayerRunOptions& o) {
  for (const auto& [flag, what] : kFlagsTheConfigDefines)
    if (is_given(given, flag))
      throw InvalidArgument(all_names(given, flag) + " cannot be combined with --hf-config: the config file defines " +
                            what);
  o.hf = read_hf_config(o.hf_config);
  o.model = o.hf->model.name;
}

// A bounded real flag: the same bounds as the config's key (hf_config.hpp).
double parse_bounded_real(const std::string& option, const std::string& text, double min, double max) {
  const double v = parse_real_option(option, text);
  if (!(v >= min && v <= max))
    throw InvalidArgument(option + " must be in " + real_range_text(min, max) + ", got " + text);
  return v;
}

// A probability flag: [0, 1), as the float32 the layer uses (-0 is 0).
float parse_probability(const std::string& option, const std::string& text) {
  const float p = static_cast<float>(parse_real_option(option, text)) + 0.0f;
  if (!(p >= 0.f && p < 1.f)) throw InvalidArgument(option + " must be in [0, 1), got " + text);
  return p;
}

void take_query_groups(const Args& a, const GivenOptions& given, LayerSpecEdits& e);
void take_moe_values(const Args& a, const GivenOptions& given, LayerSpecEdits& e);

// The spec's flags (--arch, --hf-config and the edits on top of them).
void take_spec_values(const Args& a, const GivenOptions& given, LayerRunOptions& o) {
  LayerSpecEdits& e = o.spec_edits;
  o.arch = a.arch;
  o.hf_config = a.hf_config;
  auto has = [&](const char* name) { return is_given(given, name); };
  if (has("--normalization")) e.normalization = theory::parse_norm(a.normalization);
  if (has("--norm-epsilon"))
    e.norm_epsilon = static_cast<float>(parse_bounded_real("--norm-epsilon", a.norm_epsilon, kMinNormEps, kMaxNormEps));
  e.qk_layernorm = a.qk_layernorm;
  if (a.swiglu && a.squared_relu) throw InvalidArgument("--swiglu and --squared-relu cannot both be given");
  if (a.swiglu) e.activation = theory::Activation::swiglu;
  if (a.squared_relu) e.activation = theory::Activation::squared_relu;
  if (has("--ffn-hidden-size")) e.ffn_hidden = parse_int_option("--ffn-hidden-size", a.ffn_hidden, 1, kMaxDim);
  e.disable_bias_linear = a.disable_bias_linear;
  e.add_qkv_bias = a.add_qkv_bias;
  take_query_groups(a, given, e);
  if (has("--kv-channels")) e.kv_channels = parse_int_option("--kv-channels", a.kv_channels, 0, kMaxDim);
  if (has("--position-embedding-type")) e.position = theory::parse_position(a.position);
  if (has("--rotary-percent")) {
    const double p = parse_real_option("--rotary-percent", a.rotary_percent);
    if (!(p > 0 && p <= 1)) throw InvalidArgument("--rotary-percent must be in (0, 1], got " + a.rotary_percent);
    e.rotary_percent = p;
  }
  if (has("--rotary-base"))
    e.rotary_base = parse_bounded_real("--rotary-base", a.rotary_base, kMinRopeTheta, kMaxRopeTheta);
  if (has("--dropout")) e.attention_dropout = e.hidden_dropout = parse_probability("--dropout", a.dropout);
  if (has("--attention-dropout")) e.attention_dropout = parse_probability("--attention-dropout", a.attention_dropout);
  if (has("--hidden-dropout")) e.hidden_dropout = parse_probability("--hidden-dropout", a.hidden_dropout);
  take_moe_values(a, given, e);
  if (has("--hf-config")) take_hf_config(given, o);
}

// Megatron's MoE and MLA flags, each bounded as --hf-config's keys are.
void take_moe_values(const Args& a, const GivenOptions& given, LayerSpecEdits& e) {
  auto count = [&](const char* name, const std::string& text, int64_t min, int64_t max, std::optional<int64_t>& field) {
    if (is_given(given, name)) field = parse_int_option(name, text, min, max);
  };
  count("--num-experts", a.num_experts, 0, kMaxExperts, e.num_experts);
  count("--moe-router-topk", a.moe_topk, 1, kMaxExperts, e.moe_topk);
  count("--moe-ffn-hidden-size", a.moe_ffn_hidden, 1, kMaxModelWidth, e.moe_ffn_hidden);
  count("--moe-shared-expert-intermediate-size", a.moe_shared_ffn_hidden, 1, kMaxModelWidth, e.moe_shared_ffn_hidden);
  count("--moe-router-num-groups", a.moe_num_groups, 1, kMaxExperts, e.moe_num_groups);
  count("--moe-router-group-topk", a.moe_group_topk, 1, kMaxExperts, e.moe_group_topk);
  if (is_given(given, "--moe-router-score-function")) e.moe_score = theory::parse_moe_score(a.moe_score);
  if (is_given(given, "--moe-router-topk-scaling-factor"))
    e.moe_scaling = parse_bounded_real("--moe-router-topk-scaling-factor", a.moe_scaling, 1e-6, 1e6);
  if (is_given(given, "--moe-expert-capacity-factor"))
    e.moe_capacity_factor = parse_bounded_real("--moe-expert-capacity-factor", a.moe_capacity_factor, 1e-6, 1e6);
  e.moe_pre_softmax = a.moe_pre_softmax;
  e.moe_expert_bias = a.moe_expert_bias;
  e.multi_latent_attention = a.multi_latent_attention;
  count("--q-lora-rank", a.q_lora_rank, 1, kMaxModelWidth, e.q_lora_rank);
  count("--kv-lora-rank", a.kv_lora_rank, 1, kMaxModelWidth, e.kv_lora_rank);
  count("--qk-head-dim", a.qk_head_dim, 1, kMaxModelWidth, e.qk_head_dim);
  count("--qk-pos-emb-head-dim", a.qk_pos_emb_head_dim, 1, kMaxModelWidth, e.qk_pos_emb_head_dim);
  count("--v-head-dim", a.v_head_dim, 1, kMaxModelWidth, e.v_head_dim);
}

// Grouped-query attention, as Megatron-LM spells it (--group-query-attention --num-query-groups
// G, G = 1 when not given) or as G alone (--kv-heads).
void take_query_groups(const Args& a, const GivenOptions& given, LayerSpecEdits& e) {
  const bool groups = is_given(given, "--num-query-groups"), kv = is_given(given, "--kv-heads");
  if (kv && (groups || a.group_query_attention))
    throw InvalidArgument("--kv-heads is --group-query-attention --num-query-groups: give one spelling");
  if (groups && !a.group_query_attention)
    throw InvalidArgument("--num-query-groups needs --group-query-attention (without it Megatron-LM ignores it)");
  if (kv) e.kv_heads = parse_int_option("--kv-heads", a.kv_heads, 1, kMaxDim);
  if (a.group_query_attention)
    e.kv_heads = groups ? parse_int_option("--num-query-groups", a.num_query_groups, 1, kMaxDim) : 1;
}

// Megatron's recompute flags.
void take_recompute_values(const Args& a, const GivenOptions& given, LayerRunOptions& o) {
  RecomputeFlags& r = o.recompute;
  if (is_given(given, "--recompute-granularity")) {
    if (a.recompute_granularity != "full" && a.recompute_granularity != "selective")
      throw InvalidArgument("--recompute-granularity must be full or selective, got '" + a.recompute_granularity + "'");
    r.granularity = a.recompute_granularity == "full" ? Recompute::full : Recompute::selective;
  }
  if (a.recompute_activations) {
    if (r.granularity == Recompute::full)
      throw InvalidArgument("--recompute-activations is --recompute-granularity selective, not full");
    r.granularity = Recompute::selective;
  }
  r.sequence_parallel = a.sequence_parallel;
  if (is_given(given, "--recompute-modules")) r.modules = parse_recompute_modules(a.recompute_modules);
  if (is_given(given, "--recompute-method")) r.stack.method = parse_recompute_method(a.recompute_method);
  if (is_given(given, "--recompute-num-layers")) {
    if (r.stack.method == RecomputeMethod::none)
      throw InvalidArgument("--recompute-num-layers needs --recompute-method uniform or block");
    r.stack.num_layers = parse_int_option("--recompute-num-layers", a.recompute_num_layers, 1, kMaxModelLayers);
  }
  if (r.names_a_configuration() && is_given(given, "--config"))
    throw InvalidArgument("--config cannot be combined with --recompute-granularity, --recompute-activations or "
                          "--sequence-parallel: those name the one configuration to run");
}

// --hf-config's model as a layer: the config's spec, its own default sequence length, one
// sequence per batch.
LayerDims hf_dims(const HfModelConfig& c) {
  const theory::TransformerModel& m = c.model;
  LayerDims dims;
  dims.spec = m.layer;
  dims.spec.norm_epsilon = double(static_cast<float>(m.layer.norm_epsilon));  // the float32 the layers use
  dims.h = static_cast<int64_t>(m.h);
  dims.a = static_cast<int64_t>(m.a);
  dims.s = static_cast<int64_t>(m.seq);
  dims.b = 1;
  return dims;
}

// The spec: the model's preset (or --arch's; a llama model stays llama), then the flags' edits.
// A config file defines its layer: --arch may only name the family it already is.
void apply_spec_options(const LayerRunOptions& o, LayerDims& dims) {
  const bool llama_model = spec_family(dims.spec) == "llama" || dims.spec.moe.enabled();  // MoE presets: llama's attention
  if (!o.arch.empty()) {
    const Arch a = parse_arch(o.arch);
    if (o.hf && spec_family(dims.spec) != arch_name(a))
      throw InvalidArgument("--arch " + o.arch + " cannot be combined with --hf-config " + o.hf_config +
                            ": the config file defines the layer, which is not the " + o.arch + " preset's");
    if (a == Arch::gpt && llama_model) throw InvalidArgument("--arch gpt with a llama model (" + o.model + ")");
    if (a == Arch::llama && !llama_model) dims.spec = theory::llama_layer_spec(0, 0);
  }
  apply_layer_spec_edits(o.spec_edits, dims.spec);
}

bool same_path(const std::string& a, const std::string& b) {
  std::error_code ea, eb;
  const auto ca = std::filesystem::weakly_canonical(a, ea), cb = std::filesystem::weakly_canonical(b, eb);
  return a == b || (!ea && !eb && ca == cb);
}

// --tp: with --emulate-tp the preset's t unless given (a --hf-config file has none); else the
// MPI world's size.
void resolve_tp(LayerRunOptions& o, const ModelPreset* preset, int world) {
  // Expert parallelism over data-parallel replicas: the world (or the emulated group) is its
  // ranks, ep/t replicas of a TP group (t = 1 unless given). Given --tp equal to it, the experts
  // are split over the TP group instead.
  if (o.ep > 1 && !o.experts_over_tp()) {
    if (o.emulate_ep && !o.dump.empty())
      throw InvalidArgument("--dump cannot be combined with --emulate-ep (emulated values are not the layer's)");
    if (o.tp == 0) o.tp = 1;
    return;  // check_run_options words what does not fit
  }
  if (o.emulate_cp) {
    if (world > 1) throw InvalidArgument("--emulate-cp runs in one process; do not launch it with mpirun -np > 1");
    if (!o.dump.empty())
      throw InvalidArgument("--dump cannot be combined with --emulate-cp (emulated values are not the layer's)");
    if (o.cp < 2) throw InvalidArgument("--emulate-cp needs --cp 2 or more");
    if (!o.emulate_tp && o.tp == 0) o.tp = 1;
    if (!o.emulate_tp && o.tp != 1)
      throw InvalidArgument("--emulate-cp with --tp " + std::to_string(o.tp) + " needs --emulate-tp too");
  } else if (o.cp > 1 && !o.emulate_tp) {
    if (o.tp == 0) o.tp = world / o.cp;
    if (o.tp < 1 || o.tp * o.cp != world)
      throw InvalidArgument("--cp " + std::to_string(o.cp) + " x --tp " + std::to_string(o.tp) + " but the MPI world has " +
                            std::to_string(world) + " rank(s): run under mpirun -np " +
                            std::to_string(std::max(o.tp, 1) * o.cp) + " or add --emulate-cp");
    return;
  } else if (o.cp > 1) {
    throw InvalidArgument("--emulate-tp with --cp " + std::to_string(o.cp) + " needs --emulate-cp too");
  }
  if (o.emulate_tp) {
    if (world > 1) throw InvalidArgument("--emulate-tp runs in one process; do not launch it with mpirun -np > 1");
    if (!o.dump.empty())
      throw InvalidArgument("--dump cannot be combined with --emulate-tp (emulated values are not the layer's)");
    if (o.tp == 0 && !preset)
      throw InvalidArgument("--emulate-tp with --hf-config needs --tp: the config file has no tensor-parallel size");
    if (o.tp == 0) o.tp = preset->tp;
    return;
  }
  if (o.tp == 0) o.tp = world;
  if (o.tp != world)
    throw InvalidArgument("--tp " + std::to_string(o.tp) + " but the MPI world has " + std::to_string(world) +
                          " rank(s): run under mpirun -np " + std::to_string(o.tp) + " or add --emulate-tp");
}

// The model's shape (the config file's or the preset's) under the shape and family flags.
LayerDims resolve_dims(LayerRunOptions& o, const ModelPreset* preset) {
  LayerDims dims = preset ? preset->dims : hf_dims(*o.hf);
  if (o.hidden) dims.h = o.hidden;
  if (o.heads) dims.a = o.heads;
  if (o.seq) dims.s = o.seq;
  if (o.batch) dims.b = o.batch;
  apply_spec_options(o, dims);
  return dims;
}

// --config's list, or the one configuration Megatron's flags name; --recompute-modules on
// each selective one.
std::vector<LayerPolicy> resolve_policies(const LayerRunOptions& o) {
  const Attention attention = parse_attention(o.attention);
  const CpCommType cp_comm = parse_cp_comm_type(o.cp_comm_type);
  const RecomputeFlags& r = o.recompute;
  std::vector<LayerPolicy> policies;
  if (r.names_a_configuration())
    policies.push_back({r.granularity.value_or(Recompute::none), r.sequence_parallel, attention, {}});
  else
    for (const std::string& name : o.configs) policies.push_back(parse_config(name));
  bool selective = false;
  for (LayerPolicy& p : policies) {
    p.attention = attention;
    p.cp_comm = cp_comm;
    if (p.recompute == Recompute::selective && r.modules) p.modules = *r.modules;
    selective = selective || p.recompute == Recompute::selective;
  }
  if (r.stack.method != RecomputeMethod::none)
    for (const LayerPolicy& p : policies)
      if (p.recompute != Recompute::full)
        throw InvalidArgument("--recompute-method needs full recompute in every configuration (--recompute-granularity "
                              "full, or full / full+sp in --config), not " + config_name(p));
  if (r.modules && !selective)
    throw InvalidArgument("--recompute-modules needs a selective configuration (--recompute-granularity selective, "
                          "or selective in --config)");
  return policies;
}

// --kernel-report: this build must count kernels (the simulator build), on --backend cuda.
void check_kernel_report_options(const LayerRunOptions& o) {
  if (o.kernel_report.empty()) return;
  const std::string refusal = kernel_report_refusal(o.kernel_report_device);
  if (!refusal.empty()) throw InvalidArgument(refusal);
  if (o.backend != "cuda")
    throw InvalidArgument("--kernel-report counts the simulated cuda kernels: it needs --backend cuda");
}

// What the layer and the backend allow, after the layer's own checks.
void check_run_options(const LayerRunOptions& o, const LayerDims& dims, int world) {
  if (o.experts_over_tp() && o.emulate_ep)
    throw InvalidArgument("--expert-model-parallel-size " + std::to_string(o.ep) + " with --tp " +
                          std::to_string(o.tp) + " splits the experts over the tensor-parallel group: on one "
                          "process it runs with --emulate-tp (not --emulate-ep)");
  if (o.ep > 1 && !o.experts_over_tp() && o.etp > 1 &&
      (world != (o.emulate_ep ? 1 : o.expert_parallel_world()) || o.ep % o.cp != 0 ||
       (o.emulate_tp && !o.emulate_ep) || (o.emulate_cp && !o.emulate_ep)))
    throw InvalidArgument("--expert-model-parallel-size " + std::to_string(o.ep) + " with --expert-tensor-parallel-size " +
                          std::to_string(o.etp) + " runs under mpirun -np " + std::to_string(o.expert_parallel_world()) +
                          " (or --emulate-ep on one process) as ep / cp data-parallel replicas of the --tp x --cp "
                          "ranks (cp " + std::to_string(o.cp) + " must divide it; the MPI world has " +
                          std::to_string(world) + ")");
  if (o.ep > 1 && !o.experts_over_tp() && o.etp == 1 &&
      (world != (o.emulate_ep ? 1 : o.ep) || o.ep % (o.tp * o.cp) != 0 || (o.emulate_tp && !o.emulate_ep) ||
       (o.emulate_cp && !o.emulate_ep)))
    throw InvalidArgument("--expert-model-parallel-size " + std::to_string(o.ep) + " runs under mpirun -np " +
                          std::to_string(o.ep) + " (or --emulate-ep on one process) as ep / (tp x cp) data-parallel "
                          "replicas of the --tp x --cp ranks (tp x cp = " + std::to_string(o.tp * o.cp) +
                          " must divide it; the MPI world has " + std::to_string(world) + ")");
  if (o.emulate_ep && o.ep == 1) throw InvalidArgument("--emulate-ep needs --expert-model-parallel-size > 1");
  if (o.etp > 1 && !dims.spec.moe.enabled())
    throw InvalidArgument("--expert-tensor-parallel-size needs an MoE layer (--num-experts)");
  if (!o.moe_tokens_per_expert.empty()) {
    if (o.backend != "meta")
      throw InvalidArgument("--moe-tokens-per-expert is meta's: cpu and cuda route the tokens themselves");
    if (!dims.spec.moe.enabled()) throw InvalidArgument("--moe-tokens-per-expert needs an MoE layer (--num-experts)");
  }
  if (!o.dump.empty() && o.layers != 1) throw InvalidArgument("--dump writes one layer: use --layers 1");
  if (!o.cupti.empty() && o.backend != "cuda")
    throw InvalidArgument("--cupti records GPU kernels: it needs --backend cuda");
  check_kernel_report_options(o);
  if (world > 1 && o.backend == "cpu") {
    // Host collectives carry one tensor per MPI message, whose count is an int.
    const int64_t widest = std::max(dims.s * dims.b * dims.h, 4 * dims.h * dims.h / o.tp);
    if (widest > std::numeric_limits<int>::max())
      throw InvalidArgument("a tensor of " + std::to_string(widest) +
                            " elements exceeds one MPI message (2^31 - 1) on the cpu backend; use a smaller shape");
  }
}

}  // namespace

void parse_layer_run_options(int argc, char** argv, LayerRunOptions& o) {
  CLI::App app{"layer_run: time and measure one transformer layer in the paper's configurations"};
  Args a;
  const GivenOptions given = declare_options(app, a);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    o.print_only = app.help();
    return;
  } catch (const CLI::ParseError& e) {
    throw InvalidArgument(e.what());
  }
  if (a.json && !a.list_presets) throw InvalidArgument("--json needs --list-presets");
  if (a.list_presets) {
    o.print_only = a.json ? facts_json() : presets_table();
    return;
  }
  if (a.print_header || a.print_schema) {
    o.print_only = a.print_header ? csv_line(column_names(result_columns())) : results_schema_markdown();
    return;
  }
  // An empty value is refused, never read as "use the preset" (--seq '', --dump '').
  for (const auto& [name, opt] : given)
    if (opt->count() && opt->as<std::string>().empty())
      throw InvalidArgument(name + " needs a value (got an empty string)");
  if (a.csv.empty()) throw InvalidArgument("--csv FILE is required");
  o.backend = a.backend;
  o.model = a.model;
  o.attention = a.attention;
  o.dtype = a.dtype;
  o.csv = a.csv;
  o.dump = a.dump;
  o.cupti = a.cupti;
  o.kernel_report = a.kernel_report;
  if (is_given(given, "--kernel-report-device")) {
    if (a.kernel_report.empty()) throw InvalidArgument("--kernel-report-device needs --kernel-report");
    o.kernel_report_device = a.kernel_report_device;
  }
  o.configs = parse_config_list("--config", a.configs);
  take_run_values(a, given, o);
  take_spec_values(a, given, o);
  take_recompute_values(a, given, o);
}

LayerRunPlan plan_layer_run(LayerRunOptions& o, int world) {
  const ModelPreset* preset = o.hf ? nullptr : &find_preset(o.model);
  resolve_tp(o, preset, world);
  LayerRunPlan plan;
  plan.dims = resolve_dims(o, preset);
  plan.policies = resolve_policies(o);
  for (LayerPolicy p : plan.policies) validate_layer(plan.dims, o.tp, p, o.cp, o.ep, o.etp);
  check_layer_extent(plan.dims, o.layers);
  plan.dtype = parse_dtype(o.dtype);
  check_run_options(o, plan.dims, world);
  return plan;
}

void check_outputs(const LayerRunOptions& o, const std::vector<LayerPolicy>& policies, const CsvAppender& csv,
                   const CsvAppender* cupti_csv, const CsvAppender* kernel_report_csv) {
  csv.check();
  if (cupti_csv) {
    if (same_path(o.cupti, o.csv)) throw InvalidArgument("--cupti '" + o.cupti + "' is the --csv file; give it its own");
    cupti_csv->check();
  }
  if (kernel_report_csv) {
    for (const auto& [flag, file] : {std::pair<const char*, const std::string&>{"--csv", o.csv}, {"--cupti", o.cupti}})
      if (!file.empty() && same_path(o.kernel_report, file))
        throw InvalidArgument("--kernel-report '" + o.kernel_report + "' is the " + flag + " file; give it its own");
    kernel_report_csv->check();
  }
  if (o.dump.empty()) return;
  for (LayerPolicy p : policies) {
    const std::string dir = dump_dir(o, policies.size(), p);
    check_output_dir("--dump", dir);
    for (const std::string& file : {o.csv, o.cupti, o.kernel_report})
      if (!file.empty() && same_path(file, dir))
        throw InvalidArgument("--dump folder '" + dir + "' is the file '" + file + "'");
  }
}

std::string dump_dir(const LayerRunOptions& o, size_t configurations, LayerPolicy p) {
  return configurations == 1 ? o.dump : o.dump + "/" + config_name(p);
}

}  // namespace actbench
