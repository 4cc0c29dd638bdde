// theory: the paper's formulas as CSV tables for the plots, and two planners; a thin command
// line over runners/theory_tables.hpp (the tables) and theory/ (the formulas).
//
//   theory --out DIR [--results PATH]... [--dtype bf16|fp16|fp32]
//          [--optimizer mixed-fp32-grads|mixed-bf16-grads|fp32]
//   theory plan --model 22b|175b|530b|1t [--gpu a100|h100|h200] [--gpu-memory 80GiB] [--tp T] [--pp P]
//          [--interleave M] [--batch b] [--seq s] [--headroom 2GiB] [--csv FILE]
//   theory plan --model NAME | --hf-config FILE --gpus N --global-batch B [--gpu a100|h100|h200|b200] ...
//   theory llama-table --model llama3-8b|llama3-70b|llama3-405b | --hf-config FILE [--tp T] [--seq s]
//
// --results: layer_run CSVs (files, or folders whose *.csv are read; other CSVs skipped) whose
// cuda rows give per-layer times for the Table 5 iteration model beside the paper's Table 4.
// Exit status: 0 ok, 2 bad input (one line on stderr), 1 any other failure. Every file is
// written whole to a temporary name and renamed, so a reader never sees half a table.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "runners/hf_config.hpp"
#include "runners/theory_tables.hpp"
#include "runtime/error.hpp"
#include "theory/config_fit.hpp"
#include "theory/layout_search.hpp"
#include "theory/llama_memory.hpp"
#include "theory/memory_totals.hpp"
#include "theory/models.hpp"

namespace fs = std::filesystem;
using namespace actbench;
using namespace actbench::tables;
using namespace actbench::theory;

namespace {

// "80GiB", "80GB", "141e9" -> bytes.
double parse_bytes(const std::string& s) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (...) {
    throw InvalidArgument("cannot read memory size '" + s + "' (e.g. 80GiB, 141GB)");
  }
  const std::string unit = s.substr(pos);
  const std::map<std::string, double> units = {{"", 1},         {"B", 1},         {"KiB", 1024.0},
                                               {"MiB", 1048576.0}, {"GiB", kGiB},   {"TiB", kGiB * 1024},
                                               {"KB", 1e3},       {"MB", 1e6},     {"GB", 1e9},
                                               {"TB", 1e12}};
  const auto it = units.find(unit);
  if (it == units.end()) throw InvalidArgument("unknown unit in memory size '" + s + "' (use B, KiB, MiB, GiB, KB, MB, GB)");
  if (!(v >= 0)) throw InvalidArgument("memory size '" + s + "' must not be negative");
  return v * it->second;
}

// A model from --model (a llama preset or a paper GPT model) or --hf-config.
PlanModel model_of(const std::string& name, const std::string& hf_config) {
  if (!hf_config.empty()) {
    if (!name.empty()) throw InvalidArgument("give --model or --hf-config, not both");
    const HfModelConfig c = read_hf_config(hf_config);
    return {c.name, true, static_cast<double>(c.max_positions), static_cast<double>(c.hidden),
            static_cast<double>(c.heads), static_cast<double>(c.kv_heads), static_cast<double>(c.ffn_hidden),
            static_cast<double>(c.layers), static_cast<double>(c.vocab)};
  }
  if (name.empty()) throw InvalidArgument("--model or --hf-config is required");
  return plan_model(name);
}

struct LlamaTableArgs {
  std::string model, hf_config;
  int tp = 1;
  double seq = 0, batch = 1;
};

// theory llama-table: the category table of one model, like Table 2, for every configuration.
int run_llama_table(const LlamaTableArgs& a) {
  const PlanModel m = model_of(a.model, a.hf_config);
  if (!m.llama) throw InvalidArgument(m.name + " is a GPT model: its table is table2.csv");
  const double s = a.seq > 0 ? a.seq : m.s;
  if (a.tp < 1 || std::fmod(m.a, a.tp) != 0 || std::fmod(m.g > 0 ? m.g : m.a, a.tp) != 0)
    throw InvalidArgument("--tp must divide the heads and the key/value heads");
  const LlamaDims d = llama_dims(m, s, a.batch, a.tp);
  std::printf("%s: s=%g b=%g h=%g a=%g g=%g F=%g t=%d, bytes per layer and rank (bf16)\n", m.name.c_str(), s,
              a.batch, m.h, m.a, d.groups(), d.ffn(), a.tp);
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

struct SearchArgs {
  std::string hf_config, attention = "fused", top = "10";
  int gpus = 0;
  double global_batch = 0, efficiency = 0.5;
  bool distributed_optimizer = false;
};

// theory plan --gpus N: the search over layouts and configurations (theory/layout_search.hpp).
int run_plan_search(const std::string& model_name, const SearchArgs& a, const std::string& gpu_name, double seq,
                    const std::string& headroom, const std::string& csv) {
  PlanRequest r;
  r.model = model_of(model_name, a.hf_config);
  r.gpu = plan_gpu(gpu_name);
  r.gpus = a.gpus;
  r.seq = seq;
  if (a.global_batch <= 0) throw InvalidArgument("--global-batch B (sequences per iteration) is required with --gpus");
  r.global_batch = a.global_batch;
  r.distributed_optimizer = a.distributed_optimizer;
  if (a.attention != "fused" && a.attention != "unfused") throw InvalidArgument("--attention must be fused or unfused");
  r.attention = parse_attention(a.attention);
  r.headroom_bytes = parse_bytes(headroom);
  r.efficiency = a.efficiency;
  int top = 0;
  try {
    top = std::stoi(a.top);
  } catch (...) {
    throw InvalidArgument("--top must be a number");
  }
  if (top < 1) throw InvalidArgument("--top must be >= 1");
  const std::vector<PlanCandidate> plans = plan_search(r);
  const double s = seq > 0 ? seq : r.model.s;
  std::printf("%s on %d x %s (%.1f GiB), s=%g, global batch %g sequences, %s attention, %s optimizer, "
              "%.0f%% of peak FLOP/s\n",
              r.model.name.c_str(), r.gpus, r.gpu.label.c_str(), r.gpu.memory_bytes / kGiB, s, r.global_batch,
              a.attention.c_str(), r.distributed_optimizer ? "distributed" : "replicated", 100 * r.efficiency);
  std::printf("%3s %3s %2s %4s %2s %-13s %8s %8s %8s %8s %7s %7s %8s %9s %10s %6s\n", "t", "p", "m", "dp", "b",
              "config", "weights", "grads", "optim", "activ.", "extras", "recomp", "total", "iter_s", "tokens/s",
              "MFU%");
  int shown = 0;
  for (const PlanCandidate& k : plans) {
    if (!k.fits || shown == top) break;
    ++shown;
    std::printf("%3d %3d %2d %4d %2g %-13s %7.2fG %7.2fG %7.2fG %7.2fG %6.2fG %6.2fG %7.2fG %9.3f %10.0f %6.1f\n",
                k.t, k.p, k.m, k.dp, k.b, k.config.c_str(), k.weight_bytes / kGiB, k.grad_bytes / kGiB,
                k.optimizer_bytes / kGiB, k.activation_bytes / kGiB, k.extra_bytes / kGiB, k.working_set_bytes / kGiB,
                k.total_bytes / kGiB, k.iteration_s, k.tokens_per_s, k.mfu_percent);
  }
  if (shown == 0) std::printf("nothing fits: more GPUs, a shorter sequence or a GPU with more memory\n");
  if (!csv.empty()) write_table(csv, search_table(r, plans));
  return 0;
}

struct PlanArgs {
  std::string model, gpu_memory, gpu = "a100", headroom = "0", csv;
  int tp = 0, pp = 0, interleave = 0, dp = 1;
  double batch = 0, seq = 0;
};

int run_plan(const PlanArgs& a, double bytes_per_param, const Precision& prec) {
  ModelSpec m = paper_model(a.model);
  if (a.tp) m.t = a.tp;
  if (a.pp) {
    m.p = a.pp;
    if (!a.interleave) m.m = 1;
  }
  if (a.interleave) m.m = a.interleave;
  if (a.batch) m.b = a.batch;
  if (a.seq) m.s = a.seq;
  m.dp = a.dp;
  m.B = std::max(m.B, m.b * m.p) * m.dp;  // enough microbatches to fill the pipeline
  validate(m);
  FitOptions opt;
  opt.gpu_memory_bytes = a.gpu_memory.empty() ? gpu(a.gpu).memory_bytes : parse_bytes(a.gpu_memory);
  if (!(opt.gpu_memory_bytes > 0)) throw InvalidArgument("--gpu-memory must be positive");
  opt.bytes_per_param = bytes_per_param;
  opt.precision = prec;
  opt.headroom_bytes = parse_bytes(a.headroom);
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

int run(int argc, char** argv) {
  CLI::App app{"theory: the paper's formulas (Table 2, Eq. 5/6, Figures 1 and 7, FLOPs, pipeline, Table 5) as CSV"};
  app.require_subcommand(0, 1);
  std::string out, dtype = "bf16", optimizer = "mixed-fp32-grads", gpu_name = "a100";
  std::vector<std::string> results;
  app.add_option("--out", out, "folder to write the CSV tables to (created if missing)");
  app.add_option("--results", results, "layer_run CSV(s) or folder(s) of them: measured layer times for Table 5");
  app.add_option("--dtype", dtype, "activation element type for the byte tables: bf16 | fp16 | fp32")
      ->capture_default_str();
  app.add_option("--optimizer", optimizer, "mixed-fp32-grads (18 B/param) | mixed-bf16-grads (16) | fp32 (16)")
      ->capture_default_str();
  PlanArgs plan;
  CLI::App* plan_cmd = app.add_subcommand("plan", "which configurations fit a GPU, and the cheapest that does");
  plan_cmd->add_option("--model", plan.model,
                       "22b | 175b | 530b | 1t; with --gpus also llama3-8b | llama3-70b | llama3-405b");
  SearchArgs search;
  plan_cmd->add_option("--hf-config", search.hf_config, "a Hugging Face config.json of a LLaMA-style model (with --gpus)");
  plan_cmd->add_option("--gpus", search.gpus,
                       "search every layout of this many GPUs (t, p, interleaving, micro-batch, recompute, SP)");
  plan_cmd->add_option("--global-batch", search.global_batch, "with --gpus: sequences per iteration");
  plan_cmd->add_flag("--distributed-optimizer", search.distributed_optimizer,
                     "with --gpus: Adam state sharded over data-parallel ranks");
  plan_cmd->add_option("--attention", search.attention, "with --gpus: fused | unfused")->capture_default_str();
  plan_cmd->add_option("--efficiency", search.efficiency, "with --gpus: achieved fraction of peak FLOP/s")
      ->capture_default_str();
  plan_cmd->add_option("--top", search.top, "with --gpus: plans to print")->capture_default_str();
  LlamaTableArgs ltable;
  CLI::App* ltable_cmd = app.add_subcommand("llama-table", "the llama family's Table 2: bytes per category and configuration");
  ltable_cmd->add_option("--model", ltable.model, "llama3-8b | llama3-70b | llama3-405b");
  ltable_cmd->add_option("--hf-config", ltable.hf_config, "a Hugging Face config.json of a LLaMA-style model");
  ltable_cmd->add_option("--tp", ltable.tp, "tensor-parallel size")->capture_default_str();
  ltable_cmd->add_option("--seq", ltable.seq, "sequence length (default: the model's)");
  ltable_cmd->add_option("--batch", ltable.batch, "micro-batch")->capture_default_str();
  plan_cmd->add_option("--gpu-memory", plan.gpu_memory, "device memory, e.g. 80GiB (default: the --gpu's)");
  plan_cmd->add_option("--gpu", plan.gpu, "a100 | h100 | h200 (| b200 with --gpus)")->capture_default_str();
  plan_cmd->add_option("--tp", plan.tp, "tensor-parallel size (default: Table 3's)");
  plan_cmd->add_option("--pp", plan.pp, "pipeline-parallel size (default: Table 3's)");
  plan_cmd->add_option("--interleave", plan.interleave, "model chunks per stage m (default: Table 3's)");
  plan_cmd->add_option("--batch", plan.batch, "microbatch b (default: Table 3's)");
  plan_cmd->add_option("--seq", plan.seq, "sequence length s (default 2048)");
  plan_cmd->add_option("--headroom", plan.headroom, "memory kept free, e.g. 2GiB")->capture_default_str();
  plan_cmd->add_option("--csv", plan.csv, "also write the plan to this CSV");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string what = e.what();
    std::replace(what.begin(), what.end(), '\n', ' ');
    throw InvalidArgument(what);
  }
  const Precision prec = precision_of(dtype);
  const double bytes_per_param = bytes_per_parameter(optimizer_precision_from_name(optimizer));
  if (ltable_cmd->parsed()) return run_llama_table(ltable);
  if (plan_cmd->parsed() && (search.gpus != 0 || !search.hf_config.empty())) {
    if (search.gpus < 1) throw InvalidArgument("--gpus N (>= 1) is required to plan a --hf-config model");
    return run_plan_search(plan.model, search, plan.gpu, plan.seq, plan.headroom, plan.csv);
  }
  if (plan_cmd->parsed()) {
    if (plan.model.empty()) throw InvalidArgument("--model is required");
    gpu(plan.gpu);  // validate the name
    return run_plan(plan, bytes_per_param, prec);
  }
  if (out.empty()) throw InvalidArgument("--out DIR is required (or use the plan subcommand)");
  const std::vector<MeasuredLayer> measured = read_measured_layers(results);
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec || !fs::is_directory(out)) throw InvalidArgument("cannot create output folder " + out);
  const auto tables = all_tables({prec, dtype, bytes_per_param}, measured);
  for (const auto& [name, table] : tables) write_table((fs::path(out) / name).string(), table);
  std::printf("theory: wrote %zu tables to %s (%zu measured layer rows used)\n", tables.size(), out.c_str(),
              measured.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const actbench::InvalidArgument& e) {  // bad input
    std::fprintf(stderr, "theory: error: %s\n", e.what());
    return 2;
  } catch (const std::invalid_argument& e) {  // the formulas' own checks of what they are given
    std::fprintf(stderr, "theory: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "theory: failure: %s\n", e.what());
    return 1;
  }
}
