// theory: the paper's formulas as CSV tables for the plots, and two planners; a thin command
// line over runners/theory_options.hpp (the options), runners/theory_tables.hpp (the tables)
// and theory/ (the formulas).
//
//   theory --out DIR [--results PATH]... [--dtype bf16|fp16|fp32]
//          [--optimizer mixed-fp32-grads|mixed-bf16-grads|fp32]
//   theory [--dtype ..] [--optimizer ..] plan --model 22b|175b|530b|1t [--gpu a100|h100|h200]
//          [--gpu-memory 80GiB] [--tp T] [--pp P] [--interleave M] [--batch b] [--seq s] [--headroom 2GiB] [--csv FILE]
//   theory plan --model NAME | --hf-config FILE --gpus N --global-batch B [--gpu a100|h100|h200|b200] ...
//   theory llama-table --model llama3-8b|llama3-70b|llama3-405b | --hf-config FILE [--tp T] [--seq s] [--batch b]
//
// `plan` runs the layout search when --gpus is given, the fit planner otherwise; a flag the
// chosen command does not read is refused. --results: layer_run CSVs (files, or folders whose
// *.csv are read; other CSVs skipped) whose cuda rows give per-layer times for the Table 5
// iteration model beside the paper's Table 4. Exit status: 0 ok, 2 bad input (one line on
// stderr), 1 any other failure. Every input is checked before anything is printed or
// written, and every file is written whole to a temporary name and renamed, so a reader never
// sees half a table.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "runners/hf_config.hpp"
#include "runners/megatron_args.hpp"
#include "runners/memory_table.hpp"
#include "runners/options.hpp"
#include "runners/theory_options.hpp"
#include "runners/theory_tables.hpp"
#include "runtime/error.hpp"
#include "theory/config_fit.hpp"
#include "theory/layer_pieces.hpp"
#include "theory/layout_search.hpp"
#include "theory/llama_memory.hpp"
#include "theory/memory_totals.hpp"
#include "theory/model_table.hpp"
#include "theory/models.hpp"
#include "theory/step_memory.hpp"

namespace fs = std::filesystem;
using namespace actbench;
using namespace actbench::tables;
using namespace actbench::theory;

namespace {

// llama-table's closed forms are the llama layer's (theory/llama_memory.hpp): a config whose
// layer is another (Qwen's QKV biases or q/k norms, a head_dim other than h/a, biases,
// attention dropout) is refused rather than tabled as llama.
void require_llama_layer(const TransformerModel& m, const std::string& hf_config) {
  const LayerSpec& s = m.layer;
  const std::string other = s.moe.enabled()           ? "a mixture of experts"
                            : s.mla.enabled           ? "multi-latent attention"
                            : s.qk_layernorm          ? "q/k RMSNorm (model_type qwen3)"
                            : s.add_qkv_bias          ? "QKV biases (model_type qwen2)"
                            : s.add_bias_linear       ? "biases (attention_bias, mlp_bias)"
                            : s.kv_channels > 0       ? "a head_dim other than hidden_size / num_attention_heads"
                            : s.attention_dropout > 0 ? "attention_dropout"
                                                      : "";
  if (!other.empty())
    throw InvalidArgument("--hf-config " + hf_config + " (" + m.name + "): llama-table does not yet model " + other +
                          (s.moe.enabled() || s.mla.enabled ? "; theory memory does" : "; theory plan and theory memory do"));
}

// A model from --model (a llama preset or a paper GPT model) or --hf-config (one of them is
// given: theory_options.cpp).
TransformerModel model_of(const std::string& name, const std::string& hf_config) {
  if (!hf_config.empty()) return read_hf_config(hf_config).model;
  return named("--model", [&] { return plan_model(name); });
}

// theory llama-table: the category table of one model, like Table 2, for every configuration.
int run_llama_table(const TheoryOptions& a) {
  const TransformerModel m = model_of(a.model, a.hf_config);
  if (!a.hf_config.empty()) require_llama_layer(m, a.hf_config);
  if (m.learned_positions) throw InvalidArgument("--model " + m.name + " is a GPT model: its table is table2.csv (theory --out)");
  const double s = a.seq > 0 ? static_cast<double>(a.seq) : m.seq, batch = static_cast<double>(a.batch);
  if (std::fmod(m.a, a.tp) != 0 || std::fmod(m.layer.kv_heads > 0 ? m.layer.kv_heads : m.a, a.tp) != 0)
    throw InvalidArgument("--tp must divide the heads and the key/value heads");
  const LlamaDims d = llama_dims(m, s, batch, a.tp);
  std::printf("%s: s=%g b=%g h=%g a=%g g=%g F=%g t=%d, bytes per layer and rank (bf16)\n", m.name.c_str(), s, batch,
              m.h, m.a, d.groups(), d.ffn(), a.tp);
  std::vector<std::pair<std::string, LayerPolicy>> cols;
  for (bool fused : {false, true})
    for (const auto& name : config_names()) {
      LayerPolicy c = parse_config(name);
      c.attention = fused ? Attention::fused : Attention::unfused;
      cols.push_back({name + (fused ? "/fused" : ""), c});
    }
  std::printf("%-14s", "category");
  for (const auto& [label, c] : cols) std::printf(" %18s", label.c_str());
  std::printf("\n");
  for (const char* cat : {"layer_input", "ln1_input", "qkv_input", "q", "k", "softmax_out", "attn_lse", "v",
                          "proj_input", "ln2_input", "fc1_input", "swiglu_input", "fc2_input"}) {
    std::printf("%-14s", cat);
    for (const auto& [label, c] : cols) {
      double bytes = 0;
      for (const auto& [name, b] : llama_activation_bytes_by_category(d, c))
        if (name == cat) bytes = b;
      std::printf(" %18s", bytes ? fmt_bytes(bytes).c_str() : "-");
    }
    std::printf("\n");
  }
  std::printf("%-14s", "total");
  for (const auto& [label, c] : cols) std::printf(" %18s", fmt_bytes(llama_activation_bytes(d, c)).c_str());
  std::printf("\n%-14s", "closed form");
  for (const auto& [label, c] : cols) std::printf(" %18s", fmt_bytes(llama_closed_form(d, c)).c_str());
  std::printf("\n%-14s", "rstd (extra)");
  for (const auto& [label, c] : cols) std::printf(" %18s", fmt_bytes(llama_norm_stats_bytes(d, c)).c_str());
  std::printf("\n");
  return 0;
}

// theory plan --gpus N: the search over layouts and configurations (theory/layout_search.hpp).
int run_plan_search(const TheoryOptions& a) {
  PlanRequest r;
  r.gpu = named("--gpu", [&] { return plan_gpu(a.gpu); });
  r.gpus = a.gpus;
  r.seq = static_cast<double>(a.seq);
  r.global_batch = static_cast<double>(a.global_batch);
  if (a.megatron_args.empty()) {
    r.model = model_of(a.model, a.hf_config);
  } else {  // the script's model, and its batch unless the command line gives one
    const MegatronFlags flags = read_megatron_args(a.megatron_args);
    r.model = megatron_model(flags);
    r.model.name = "megatron:" + fs::path(a.megatron_args).filename().string();
    if (r.global_batch == 0) {
      if (!flags.has("global-batch-size"))
        throw InvalidArgument("--global-batch B is required: " + a.megatron_args + " has no --global-batch-size");
      r.global_batch = static_cast<double>(
          parse_int_option("--global-batch-size", flags.values.at("global-batch-size"), 1,
                           static_cast<int64_t>(kMaxGlobalBatch)));
    }
  }
  r.distributed_optimizer = a.distributed_optimizer;
  if (!a.fsdp_strategy.empty())
    r.sharding.fsdp = true, r.sharding.level = parse_dp_shard("--data-parallel-sharding-strategy", a.fsdp_strategy);
  r.attention = parse_attention(a.attention);
  r.headroom_bytes = static_cast<double>(a.headroom);
  r.efficiency = a.efficiency;
  r.cp_comm = parse_cp_comm_type(a.cp_comm_type);
  r.max_cp = a.max_cp;
  // Before the search: step_memory refuses it too, but only for a layout the search reaches.
  if (a.moe_expert_load != 1 && !r.model.layer.moe.enabled())
    throw InvalidArgument("--moe-expert-load: " + r.model.name + " has no experts");
  r.moe_expert_load = a.moe_expert_load;
  r.offload = parse_offload_modules(a.offload_modules);
  const int top = a.top;
  const std::vector<PlanCandidate> plans = plan_search(r);
  const double s = r.seq > 0 ? r.seq : r.model.seq;
  std::printf("%s on %d x %s (%.1f GiB), s=%.0f, global batch %g sequences, %s attention, %s optimizer, "
              "%.0f%% of peak FLOP/s\n",
              r.model.name.c_str(), r.gpus, r.gpu.label.c_str(), r.gpu.memory_bytes / kGiB, s, r.global_batch,
              a.attention.c_str(),
              r.sharding.fsdp ? ("Megatron-FSDP " + a.fsdp_strategy).c_str()
                              : (r.distributed_optimizer ? "distributed" : "replicated"),
              100 * r.efficiency);
  if (r.moe_expert_load != 1)
    std::printf("memory with the busiest rank's experts at %s; times at balanced routing\n",
                std::isinf(r.moe_expert_load)
                    ? "the dropless bound (--moe-expert-load max)"
                    : (fmt(r.moe_expert_load) + "x balanced rows (--moe-expert-load; at most the dropless bound)").c_str());
  if (r.offload.enabled())
    std::printf("memory with fine-grained activation offloading of %s; times without the host transfers\n",
                offload_modules_text(r.offload).c_str());
  // A mixture of experts adds the expert-parallel sizes, the recompute modules and the
  // all-to-alls' share of the iteration; a dense model's table is as it was.
  const bool moe = r.model.layer.moe.enabled();
  if (moe) std::printf("%3s %3s %-22s ", "ep", "etp", "modules");
  std::printf("%3s %3s %3s %2s %4s %2s %-13s %5s %8s %8s %8s %6s %8s %7s %7s %8s %9s %10s %6s%s\n", "t", "cp", "p", "m", "dp",
              "b", "config", "stage", "weights", "grads", "optim", "libs", "activ.", "extras", "workset", "peak", "iter_s",
              "tokens/s", "MFU%", moe ? "    a2a_s" : "");
  int shown = 0;
  for (const PlanCandidate& k : plans) {
    if (!k.fits || shown == top) break;
    ++shown;
    if (moe) std::printf("%3d %3d %-22s ", k.ep, k.etp, k.modules.empty() ? "-" : k.modules.c_str());
    std::printf("%3d %3d %3d %2d %4d %2g %-13s %5d %7.2fG %7.2fG %7.2fG %5.2fG %7.2fG %6.2fG %6.2fG %7.2fG %9.3f %10.0f %6.1f",
                k.t, k.cp, k.p, k.m, k.dp, k.b, k.config.c_str(), k.stage, k.weight_bytes / kGiB, k.grad_bytes / kGiB,
                k.optimizer_bytes / kGiB, k.workspace_bytes / kGiB, k.activation_bytes / kGiB, k.extra_bytes / kGiB, k.working_set_bytes / kGiB,
                k.total_bytes / kGiB, k.iteration_s, k.tokens_per_s, k.mfu_percent);
    if (moe) std::printf(" %9.3f", k.a2a_s);
    std::printf("\n");
  }
  if (shown == 0) std::printf("nothing fits: more GPUs, a shorter sequence or a GPU with more memory\n");
  if (!a.csv.empty()) write_table(a.csv, search_table(r, plans));
  return 0;
}

// The fit planner's model: one of Table 3's (the llama family is planned by the layout search).
ModelSpec fit_model(const std::string& name) {
  try {
    return paper_model(name);
  } catch (const std::invalid_argument& e) {
    for (const TransformerModel& m : llama_plan_models())
      if (m.name == name)
        throw InvalidArgument("--model " + name +
                              ": the fit planner (theory plan without --gpus) takes 22b, 175b, 530b "
                              "or 1t; give --gpus N and --global-batch B to search the layouts of " +
                              name);
    throw InvalidArgument(std::string("--model: ") + e.what());
  }
}

// The layout the flags make of a Table 3 model, each mismatch with its shape named by its
// flags (validate() would say it in the formulas' words).
void check_fit_layout(const ModelSpec& m) {
  auto text = [](double v) { return fmt(v); };
  if (std::fmod(m.a, m.t) != 0)
    throw InvalidArgument("--tp " + text(m.t) + " must divide the heads (" + text(m.a) + ") of " + m.name);
  if (m.m > 1 && m.p == 1) throw InvalidArgument("--interleave " + text(m.m) + " needs a pipeline (--pp > 1)");
  if (std::fmod(m.L, static_cast<double>(m.p) * m.m) != 0)
    throw InvalidArgument("--pp x --interleave (" + text(m.p) + " x " + text(m.m) + ") must divide the layers (" +
                          text(m.L) + ") of " + m.name);
  if (std::fmod(m.B, m.b * m.dp) != 0)
    throw InvalidArgument("--batch " + text(m.b) + " must divide the global batch (" + text(m.B) + ") of " + m.name);
  if (m.m > 1 && std::fmod(m.microbatches(), m.p) != 0)
    throw InvalidArgument("--interleave " + text(m.m) + " needs the micro-batches (" + text(m.microbatches()) +
                          ") to be a multiple of --pp (" + text(m.p) + ")");
}

// The fit planner's GPU: a100, h100 or h200 (b200 is the layout search's).
const Gpu& fit_gpu(const std::string& name) {
  for (const Gpu& g : gpus())
    if (g.name == name) return g;
  named("--gpu", [&] { return plan_gpu(name); });  // unknown to both planners: its own message
  throw InvalidArgument("--gpu " + name + " is known to the layout search only (theory plan --gpus N)");
}

// theory plan without --gpus: which configurations fit one layout of a Table 3 model.
int run_plan(const TheoryOptions& a) {
  ModelSpec m = fit_model(a.model);
  const Gpu& device = fit_gpu(a.gpu);
  if (a.tp) m.t = a.tp;
  if (a.pp) {
    m.p = a.pp;
    if (!a.interleave) m.m = 1;
  }
  if (a.interleave) m.m = a.interleave;
  if (a.batch) m.b = static_cast<double>(a.batch);
  if (a.seq) m.s = static_cast<double>(a.seq);
  m.dp = 1;
  m.B = std::max(m.B, m.b * m.p) * m.dp;  // enough microbatches to fill the pipeline
  check_fit_layout(m);
  validate(m);
  FitOptions opt;
  opt.gpu_memory_bytes = a.gpu_memory ? static_cast<double>(a.gpu_memory) : device.memory_bytes;
  opt.bytes_per_param = a.settings.bytes_per_param;
  opt.precision = a.settings.precision;
  opt.headroom_bytes = static_cast<double>(a.headroom);
  const double bytes_per_param = opt.bytes_per_param;
  const FitPlan plan = plan_fit(m, opt);
  std::printf("%s: s=%g b=%g h=%g a=%g L=%g, t=%d p=%d m=%d, %.1f GiB per GPU, %g bytes/parameter\n", m.name.c_str(),
              m.s, m.b, m.h, m.a, m.L, m.t, m.p, m.m, opt.gpu_memory_bytes / kGiB, bytes_per_param);
  std::printf("%-13s %9s %9s %8s %9s %9s %7s  %s\n", "config", "params+opt", "activ.", "extras", "recompute",
              "total", "time", "fits");
  for (int i = 0; i < static_cast<int>(plan.rows.size()); ++i) {
    const FitRow& r = plan.rows[i];
    std::printf("%-13s %8.1fG %8.1fG %7.2fG %8.2fG %8.1fG %7.3f  %s%s\n", r.config.c_str(),
                r.params_optimizer_bytes / kGiB, r.activation_bytes / kGiB, r.extra_bytes / kGiB,
                r.working_set_bytes / kGiB, r.total_bytes / kGiB, r.relative_time, r.fits ? "yes" : "no",
                i == plan.cheapest ? "  <- cheapest that fits" : "");
  }
  if (plan.cheapest < 0) std::printf("nothing fits: raise t or p, or lower b\n");
  if (!a.csv.empty()) write_table(a.csv, fit_table(m, opt, plan));
  return 0;
}

// A preset's own layout and batch, as the Megatron flags the user's override.
std::vector<std::string> preset_words(const ModelRow& row) {
  std::vector<std::string> words = {"--tensor-model-parallel-size", std::to_string(row.tp),
                                    "--pipeline-model-parallel-size", std::to_string(row.pipeline),
                                    "--micro-batch-size", std::to_string(row.batch),
                                    "--seq-length", std::to_string(row.seq), "--bf16"};
  if (row.chunks > 1) words.insert(words.end(), {"--num-virtual-stages-per-pipeline-rank", std::to_string(row.chunks)});
  if (row.global_batch > 0) words.insert(words.end(), {"--global-batch-size", std::to_string(row.global_batch)});
  return words;
}

const ModelRow& preset_row(const std::string& name) {
  std::vector<std::string> names;
  for (const ModelRow& r : model_table()) {
    if (r.name == name) return r;
    names.push_back(r.name);
  }
  throw InvalidArgument("--model: unknown model '" + name + "' (expected " + one_of(names) + ")");
}

// The flags and the model `theory memory` was given: the preset's layout, the HF config's
// shape (16-bit) or the launch script's flags, then the command line's Megatron flags; the
// GPU, when named, sizes the library workspaces.
MegatronRun memory_run(const TheoryOptions& a, const Gpu* device) {
  MegatronFlags flags;
  std::optional<TransformerModel> base;
  const std::string here = "theory memory";
  if (!a.model.empty()) {
    const ModelRow& row = preset_row(a.model);
    base = preset_model(row);
    apply_megatron_words(preset_words(row), true, here, flags);
  } else if (!a.hf_config.empty()) {
    base = read_hf_config(a.hf_config).model;
    apply_megatron_words({"--bf16", "--seq-length", fmt(base->seq)}, true, here, flags);
  } else {
    flags = read_megatron_args(a.megatron_args);
  }
  apply_megatron_words(a.megatron_words, true, here, flags);
  if (base)
    for (const std::string& name : megatron_model_flags())
      if (flags.has(name))
        throw InvalidArgument("--" + name + ": the model's shape comes from " + (a.model.empty() ? "--hf-config" : "--model"));
  if (!flags.unmodelled.empty()) {
    std::string names;
    for (const std::string& f : flags.unmodelled) names += (names.empty() ? "" : ", ") + f;
    std::fprintf(stderr, "theory: warning: not modelled (they change memory): %s\n", names.c_str());
  }
  MegatronRun run = megatron_run(flags, base, a.gpus, device);
  if (!base) run.model.name = "megatron:" + fs::path(a.megatron_args).filename().string();
  run.step.moe_expert_load = a.moe_expert_load;  // step_memory refuses it for a model without experts
  return run;
}

// How the data-parallel group shares the state: ", distributed optimizer", ", Megatron-FSDP
// optim_grads_params over 2 replicas (outer optim)", or nothing when every rank holds all.
std::string sharding_text(const StepConfig& c) {
  const DataParallelSharding& z = c.sharding;
  std::string out;
  if (z.fsdp) out = std::string(", Megatron-FSDP ") + dp_shard_name(z.level);
  else if (c.distributed_optimizer) out = ", distributed optimizer";
  if (z.instances > 1) {
    out += " over " + std::to_string(z.instances) + " replicas";
    if (z.fsdp && (z.outer_optimizer || z.expert_outer_optimizer))
      out += z.outer_optimizer && z.expert_outer_optimizer ? " (outer optim)"
             : z.outer_optimizer                          ? " (outer optim, experts no_shard)"
                                                          : " (experts' outer optim)";
  }
  return out;
}

// ", FP8 tensorwise (GEMM weights cached)" with --fp8-format, or nothing.
std::string fp8_text(Fp8Recipe r) {
  if (r == Fp8Recipe::none) return "";
  return std::string(", FP8 ") + fp8_recipe_name(r) + " (GEMM weights cached)";
}

// What else the step's schedule keeps or moves: offloading, deferred wgrads, combined 1F1B.
std::string schedule_text(const StepConfig& c) {
  std::string out;
  if (c.offload.enabled()) out += ", offloading " + offload_modules_text(c.offload);
  if (c.defer_embedding_wgrad)
    out += ", embedding wgrad deferred (" +
           (c.wgrad_deferral_limit > 0 ? std::to_string(c.wgrad_deferral_limit) + " micro-batches" : std::string("all")) +
           ")";
  if (c.overlap_moe_ep_comm) out += ", combined 1F1B";
  return out;
}

// ", busiest experts 1.5x balanced rows" (--moe-expert-load), or nothing under balanced routing.
std::string expert_load_text(const TransformerModel& m, const StepConfig& c) {
  if (c.moe_expert_load == 1) return "";
  if (m.layer.moe.capacity_factor > 0) return ", --moe-expert-load not applied: each expert's capacity bounds its rows";
  const double load = moe_expert_load(c.layer_dims(m), m.layer);
  char text[120];
  std::snprintf(text, sizeof text, ", busiest rank's experts %.3gx balanced rows%s", load,
                load < c.moe_expert_load ? " (the dropless bound)" : "");
  return text;
}

std::string run_text(const MegatronRun& r) {
  const TransformerModel& m = r.model;
  const StepConfig& c = r.step;
  const Dims d = m.dims(c.seq, c.micro_batch, c.layout.t);
  std::string options;
  if (m.layer.qk_layernorm) options += " +qk-layernorm";
  if (m.layer.add_bias_linear) options += " +biases";
  else if (m.layer.add_qkv_bias) options += " +qkv-bias";
  if (m.layer.attention_dropout > 0 || m.layer.hidden_dropout > 0) options += " +dropout";
  if (m.layer.moe.enabled()) {
    const MoeSpec& e = m.layer.moe;
    char moe[200];
    std::snprintf(moe, sizeof moe, " +experts E=%g k=%g F_e=%g shared=%g (%d of %g layers, ep=%d etp=%d)",
                  e.num_experts, e.top_k, m.layer.expert_ffn(d), e.shared_ffn_hidden, m.moe_layer_count(), m.L,
                  c.layout.ep, c.layout.expert_tp());
    options += moe;
    options += expert_load_text(m, c);
  }
  if (m.layer.mla.enabled) {
    const MlaSpec& l = m.layer.mla;
    char mla[160];
    std::snprintf(mla, sizeof mla, " +mla (q_lora %g, kv_lora %g, q/k heads %g+%g, v heads %g)", l.q_lora_rank,
                  l.kv_lora_rank, l.qk_head_dim, l.qk_pos_emb_head_dim, l.v_head_dim);
    options += mla;
  }
  if (m.mtp_layers > 0) options += " +mtp " + std::to_string(m.mtp_layers) + " (last stage)";
  const std::string cp_text = c.layout.cp > 1 ? " cp=" + std::to_string(c.layout.cp) + " (" +
                                                    cp_comm_type_name(c.policy.cp_comm) + ")"
                                              : "";
  char text[960];
  std::snprintf(text, sizeof text,
                "%s: L=%g h=%g a=%g g=%g d=%g F=%g %s %s%s, vocab %g (padded %g), %s embeddings%s\n"
                "%d GPUs: t=%d p=%d vp=%d dp=%d%s%s, s=%.0f b=%g, %g micro-batches per step, %s%s%s, %s attention, "
                "%g/%g/%g+%g bytes per parameter (weight/grad/master+state)%s",
                m.name.c_str(), m.L, m.h, m.a, m.layer.groups(d), m.layer.head_dim(d), m.layer.ffn(d),
                norm_name(m.layer.normalization), activation_name(m.layer.activation), options.c_str(), m.vocab,
                padded_vocab(m, c.layout.t),
                m.tied_embeddings ? "tied" : "untied", m.learned_positions ? ", learned positions" : "", r.world_size,
                c.layout.t, c.layout.p, c.layout.vp, c.layout.dp, cp_text.c_str(), c.policy.sequence_parallel ? " +SP" : "", c.seq,
                c.micro_batch, c.microbatches(), recompute_name(c.policy.recompute),
                c.policy.recompute == Recompute::selective ? (" (" + recompute_modules_name(c.policy.modules) + ")").c_str() : "",
                c.stack.method != RecomputeMethod::none
                    ? (std::string(" ") + recompute_method_name(c.stack.method) + " " + std::to_string(c.stack.num_layers)).c_str()
                    : "",
                attention_name(c.policy.attention), c.precision.weight, c.precision.grad, c.precision.master,
                c.precision.optimizer_state, (sharding_text(c) + fp8_text(c.fp8) + schedule_text(c)).c_str());
  return text;
}

// theory memory: the whole step's memory, stage by stage (theory/step_memory.hpp).
int run_memory(const TheoryOptions& a) {
  const Gpu* device = a.gpu.empty() ? nullptr : &named("--gpu", [&]() -> const Gpu& { return plan_gpu(a.gpu); });
  const MegatronRun r = memory_run(a, device);
  const std::vector<StageMemory> stages = step_memory(r.model, r.step);
  std::printf("%s\n", run_text(r).c_str());
  // With FP8 a column for the weights' FP8 caches, so that the columns before REST add up to it.
  const bool fp8 = r.step.fp8 != Fp8Recipe::none;
  std::printf("%5s %6s %4s %9s%s %9s %9s %9s %9s %9s %9s %9s %9s%s  %s\n", "stage", "layers", "mbs", "weights",
              fp8 ? "    fp8 w" : "", "grads", "optim", "libs", "REST", "activ.", "emb+out", "workset", "PEAK",
              device ? "  fits" : "", "peak at");
  for (const StageMemory& s : stages) {
    const double workset = s.working_set_bytes();
    char fp8_text[16] = "";
    if (fp8) std::snprintf(fp8_text, sizeof fp8_text, " %8.2fG", s.fp8_weight_bytes / kGiB);
    std::printf("%5d %6d %4d %8.2fG%s %8.2fG %8.2fG %8.2fG %8.2fG %8.2fG %8.2fG %8.2fG %8.2fG%s  %s\n", s.stage,
                s.layers, s.microbatches_in_flight, s.weight_bytes / kGiB, fp8_text, s.grad_bytes / kGiB,
                s.optimizer_bytes / kGiB, s.workspace_bytes / kGiB, s.rest_bytes / kGiB, s.activation_bytes / kGiB,
                (s.embedding_bytes + s.output_bytes) / kGiB, workset / kGiB, s.peak_bytes / kGiB,
                device ? (s.peak_bytes <= device->memory_bytes ? "   yes" : "    no") : "", s.peak_at.c_str());
  }
  std::printf("GiB per GPU, as torch.cuda.memory_stats() counts allocated bytes; libs: cuBLAS and Transformer "
              "Engine workspaces (modelled sizes)%s; not modelled: NCCL buffers, allocator rounding and fragmentation "
              "(reserved > allocated)\n",
              fp8 ? "; fp8 w: Transformer Engine's FP8 copies of the GEMM weights" : "");
  if (!a.csv.empty()) write_table(a.csv, memory_table(stages));
  return 0;
}

// theory --out DIR: every table, with the measured layer times of --results.
int run_tables(const TheoryOptions& a) {
  const std::vector<MeasuredLayer> measured = read_measured_layers(a.results);
  std::error_code ec;
  fs::create_directories(a.out, ec);
  if (ec || !fs::is_directory(a.out)) throw InvalidArgument("--out: cannot create the folder " + a.out);
  const auto tables = all_tables(a.settings, measured);
  for (const auto& [name, table] : tables) write_table((fs::path(a.out) / name).string(), table);
  std::printf("theory: wrote %zu tables to %s (%zu measured layer rows used)\n", tables.size(), a.out.c_str(),
              measured.size());
  return 0;
}

int run(int argc, char** argv) {
  const TheoryOptions a = parse_theory_options(argc, argv);
  switch (a.command) {
    case TheoryCommand::help: return a.help_status;
    case TheoryCommand::tables: return run_tables(a);
    case TheoryCommand::fit_plan: return run_plan(a);
    case TheoryCommand::layout_search: return run_plan_search(a);
    case TheoryCommand::llama_table: return run_llama_table(a);
    case TheoryCommand::memory: return run_memory(a);
  }
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  // Every message is one line, whatever the user's text it quotes.
  try {
    return run(argc, argv);
  } catch (const actbench::InvalidArgument& e) {  // bad input
    std::fprintf(stderr, "theory: error: %s\n", printable(e.what()).c_str());
    return 2;
  } catch (const std::invalid_argument& e) {  // the formulas' own checks of what they are given
    std::fprintf(stderr, "theory: error: %s\n", printable(e.what()).c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "theory: failure: %s\n", printable(e.what()).c_str());
    return 1;
  }
}
