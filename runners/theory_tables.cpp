// The paper's tables, and what every table file shares: Table, its cell formats, write_table.
#include "runners/theory_tables.hpp"

#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "runtime/csv.hpp"
#include "runtime/error.hpp"
#include "theory/iteration_model.hpp"
#include "theory/layer_pieces.hpp"
#include "theory/layout_search.hpp"  // plan_model
#include "theory/step_memory.hpp"
#include "theory/memory_totals.hpp"
#include "theory/paper_values.hpp"
#include "theory/pipeline.hpp"

namespace actbench::tables {

using namespace theory;

void Table::add(std::vector<std::string> row) {
  if (row.size() != header.size())
    throw std::logic_error("row of " + std::to_string(row.size()) + " fields for a header of " +
                           std::to_string(header.size()));
  rows.push_back(std::move(row));
}

void write_table(const std::string& path, const Table& t) {
  std::string text = csv_line(t.header);
  for (const auto& row : t.rows) text += csv_line(row);
  write_file_atomic(path, text);
}

std::string fmt(double v, const char* f) {
  if (!std::isfinite(v)) return "";
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}
std::string fmt_bytes(double v) { return fmt(std::round(v), "%.0f"); }
std::string fmt_gib(double bytes) { return fmt(bytes / kGiB, "%.4f"); }
std::string fmt_pct(double v) { return fmt(v, "%.3f"); }
std::string fmt_opt(const std::optional<double>& v, const char* f) { return v ? fmt(*v, f) : ""; }

Precision precision_of(const std::string& dtype) {
  if (dtype == "bf16" || dtype == "fp16") return {2, 1};
  if (dtype == "fp32") return {4, 1};
  throw InvalidArgument("unknown dtype '" + dtype + "' (expected bf16, fp16 or fp32)");
}

Table table2(bool fused) {
  Table t{{"model", "hidden", "heads", "seq", "batch", "tp", "config", "dtype", "elem_bytes", "mask_bytes",
           "act_bytes", "act_bytes_closed_form", "linear_bytes", "attention_bytes", "sbh_multiple",
           "ln_stats_bytes", "recompute_working_set_bytes"},
          {}};
  for (const auto& m : paper_models())
    for (const std::string dtype : {"bf16", "fp32"})
      for (const auto& name : config_names()) {
        const Dims d = m.layer_dims();
        LayerPolicy c = parse_config(name);
        c.attention = fused ? Attention::fused : Attention::unfused;
        const Precision p = precision_of(dtype);
        const ActivationTerms terms = activation_terms(d, c, p);
        const double bytes = activation_bytes(d, c, p);
        t.add({m.name, fmt(m.h), fmt(m.a), fmt(m.s), fmt(m.b), fmt(m.t), name, dtype, fmt(p.elem), fmt(p.mask),
               fmt_bytes(bytes), p.elem == 2 && !fused ? fmt_bytes(table2_closed_form(d, c)) : "", fmt_bytes(terms.linear_bytes),
               fmt_bytes(terms.attention_bytes), fmt(bytes / (d.s * d.b * d.h), "%.6f"),
               fmt_bytes(layernorm_stats_bytes(d, c)), fmt_bytes(recompute_working_set_bytes(d, c, p))});
      }
  return t;
}

Table table2_categories() {
  Table t{{"model", "tp", "config", "dtype", "category", "bytes"}, {}};
  for (const auto& m : paper_models())
    for (const std::string dtype : {"bf16", "fp32"})
      for (const auto& name : config_names())
        for (const auto& [cat, bytes] : activation_bytes_by_category(m.layer_dims(), parse_config(name),
                                                                      precision_of(dtype)))
          t.add({m.name, fmt(m.t), name, dtype, cat, fmt_bytes(bytes)});
  return t;
}

Table totals(const Precision& prec, const std::string& dtype) {
  Table t{{"model", "tp", "pp", "interleave", "microbatches", "config", "dtype", "per_layer_bytes",
           "layers_in_flight_first_stage", "interleave_factor", "first_stage_activation_bytes",
           "first_stage_activation_gib", "extras_bytes", "extras_closed_form_bytes", "extras_percent",
           "eq5_first_stage_bytes", "eq6_first_stage_bytes", "full_recompute_bytes",
           "full_recompute_distributed_bytes", "first_chunk_microbatches", "token_ids_bytes"},
          {}};
  for (const auto& m : paper_models())
    for (const auto& name : config_names()) {
      const LayerPolicy c = parse_config(name);
      const double act = first_stage_activation_bytes(m, c, prec);
      const double extra = embedding_output_extra_bytes(m, c, prec);
      t.add({m.name, fmt(m.t), fmt(m.p), fmt(m.m), fmt(m.microbatches()), name, dtype,
             fmt_bytes(activation_bytes(m.layer_dims(), c, prec)), fmt(first_stage_layers_in_flight(m), "%.4f"),
             fmt(interleave_factor(m.p, m.m), "%.6f"), fmt_bytes(act), fmt_gib(act), fmt_bytes(extra),
             fmt_bytes(extras_closed_form(m)), fmt_pct(100 * extra / act), fmt_bytes(eq5_first_stage_bytes(m)),
             fmt_bytes(eq6_first_stage_bytes(m)), fmt_bytes(full_recompute_total_bytes(m, false, prec)),
             fmt_bytes(full_recompute_total_bytes(m, true, prec)), fmt(first_chunk_microbatches(m)),
             fmt_bytes(token_id_bytes(m))});
    }
  return t;
}

std::optional<paper::Figure1Row> paper_fig1(const std::string& model) {
  for (const auto& r : paper::figure1())
    if (r.model == model) return r;
  return std::nullopt;
}

Table fig1(double bytes_per_param, const Precision& prec) {
  Table t{{"model", "tp", "pp", "interleave", "gpus", "bytes_per_param", "interleave_factor", "params_per_gpu",
           "params_optimizer_gib", "params_optimizer_layers_only_gib", "activations_baseline_gib",
           "activations_present_gib", "activations_full_gib", "paper_params_optimizer_gib",
           "paper_activations_baseline_gib", "paper_activations_present_gib"},
          {}};
  for (const auto& m : paper_models()) {
    const Figure1Bar bar = figure1(m, bytes_per_param, prec);
    const auto paper = paper_fig1(m.name);
    t.add({m.name, fmt(m.t), fmt(m.p), fmt(m.m), fmt(m.gpus()), fmt(bytes_per_param),
           fmt(interleave_factor(m.p, m.m), "%.6f"), fmt_bytes(average_parameters_per_gpu(m)),
           fmt_gib(bar.params_optimizer_bytes), fmt_gib(bar.params_optimizer_layers_only_bytes),
           fmt_gib(bar.activations_baseline_bytes), fmt_gib(bar.activations_present_bytes),
           fmt_gib(bar.activations_full_bytes), paper ? fmt(paper->params_optimizer_gib) : "",
           paper ? fmt(paper->activations_baseline_gib) : "", paper ? fmt(paper->activations_present_gib) : ""});
  }
  return t;
}

Table gpu_table() {
  Table t{{"gpu", "label", "memory_gib", "memory_gb", "peak_tflops", "hbm_tbps", "nvlink_gbps", "network_gbps"}, {}};
  for (const auto& g : gpus())
    t.add({g.name, g.label, fmt(g.memory_bytes / kGiB, "%.2f"), fmt(g.memory_bytes / 1e9, "%.2f"),
           fmt(g.peak_flops / 1e12), fmt(g.hbm_bytes_per_s / 1e12), fmt(g.nvlink_bytes_per_s / 1e9),
           fmt(g.network_bytes_per_s / 1e9)});
  return t;
}

Table fig7() {
  Table t{{"model", "config", "percent_of_tp_baseline", "paper_percent"}, {}};
  for (const auto& m : paper_models()) {
    std::optional<paper::Figure7Row> paper;
    for (const auto& r : paper::figure7())
      if (r.model == m.name) paper = r;
    const std::vector<std::pair<std::string, std::optional<double>>> rows = {
        {"sp", paper ? std::optional(paper->sp) : std::nullopt},
        {"selective", paper ? std::optional(paper->selective) : std::nullopt},
        {"selective+sp", paper ? std::optional(paper->selective_sp) : std::nullopt},
        {"full", paper ? std::optional(paper->full) : std::nullopt},
        {"full+sp", std::nullopt},
    };
    for (const auto& [name, pv] : rows)
      t.add({m.name, name, fmt_pct(percent_of_tp_baseline(m.layer_dims(), parse_config(name))), fmt_opt(pv)});
  }
  return t;
}

Table seqlen() {
  Table t{{"model", "hidden", "heads", "batch", "tp", "seq", "config", "act_bytes", "linear_bytes", "attention_bytes",
           "crossover_seq"},
          {}};
  // Four points per octave from 128 to 128k, on multiples of 8 (so that s/t is whole for t = 8).
  std::vector<double> seqs;
  for (int i = 0; i <= 40; ++i) seqs.push_back(std::round(128 * std::pow(2.0, i / 4.0) / 8) * 8);
  for (const auto& m : paper_models())
    for (double s : seqs)
      for (const auto& name : config_names()) {
        const Dims d{s, 1, m.h, m.a, static_cast<double>(m.t)};
        const ActivationTerms terms = activation_terms(d, parse_config(name));
        t.add({m.name, fmt(m.h), fmt(m.a), "1", fmt(m.t), fmt(s), name,
               fmt_bytes(terms.linear_bytes + terms.attention_bytes), fmt_bytes(terms.linear_bytes),
               fmt_bytes(terms.attention_bytes), fmt(attention_crossover_seq(m.h, m.a), "%.2f")});
      }
  return t;
}

// Beyond the paper: the 22B model (t = 8, b = 1) from 1k to 128k tokens, the paper's attention
// and fused (FlashAttention-style), per layer and for the first pipeline stage with its
// parameters and optimizer state, against each GPU's memory. Full recompute is counted as
// the paper does (2sbh per layer on every rank) and, as full+sp, split over t.
Table longseq(double bytes_per_param) {
  Table t{{"model", "hidden", "heads", "batch", "tp", "seq", "attention", "config", "act_bytes_per_layer",
           "activations_first_stage_gib", "recompute_working_set_gib", "params_optimizer_gib", "total_gib", "fits_a100_80gb", "fits_h100_80gb",
           "fits_h200_141gb"},
          {}};
  ModelSpec m = paper_model("22b");
  m.b = 1;
  const double params_gib = figure1(m, bytes_per_param).params_optimizer_bytes / kGiB;
  for (double s = 1024; s <= 131072; s *= 2)
    for (const bool fused : {false, true})
      for (const auto& name : config_names()) {
        ModelSpec ms = m;
        ms.s = s;
        LayerPolicy c = parse_config(name);
        c.attention = fused ? Attention::fused : Attention::unfused;
        const double per_layer = activation_bytes(ms.layer_dims(), c);
        const double act_gib = first_stage_activation_bytes(ms, c) / kGiB;
        // Recomputation rebuilds one layer's activations during its backward: that must fit too.
        const double work_gib = recompute_working_set_bytes(ms.layer_dims(), c) / kGiB;
        const double total = act_gib + work_gib + params_gib;
        auto fits = [&](const char* g) { return total * kGiB <= gpu(g).memory_bytes ? "1" : "0"; };
        t.add({m.name, fmt(m.h), fmt(m.a), fmt(m.b), fmt(m.t), fmt(s), fused ? "fused" : "unfused", name,
               fmt_bytes(per_layer), fmt(act_gib, "%.4f"), fmt(work_gib, "%.4f"), fmt(params_gib, "%.4f"), fmt(total, "%.4f"), fits("a100"),
               fits("h100"), fits("h200")});
      }
  return t;
}

// Beyond the paper: long context. The 22B model at t = 8, b = 1, one micro-batch per step,
// fused attention with context parallelism's ring (p2p), bf16 with Adam and the distributed
// optimizer (sharded over the C ranks), for s = 32k..1M and C = 1..32: the whole training
// step's peak per GPU (step_memory.hpp) against 80 GB and 141 GB. Rotary positions: a learned
// table of 1M positions would alone be 6.4 billion parameters.
Table longcontext() {
  Table t{{"model", "hidden", "heads", "layers", "tp", "cp", "cp_comm_type", "seq", "attention", "config",
           "act_bytes_per_layer", "activation_gib", "extras_gib", "working_set_gib", "rest_gib", "peak_gib",
           "fits_h100_80gb", "fits_h200_141gb"},
          {}};
  TransformerModel m = plan_model("22b");
  m.learned_positions = false;
  for (double s = 32768; s <= 1048576; s *= 2)
    for (const int C : {1, 2, 4, 8, 16, 32})
      for (const std::string& name : {"baseline", "sp", "selective+sp", "full+sp"}) {
        StepConfig c;
        c.layout.t = 8, c.layout.cp = C;
        c.seq = s, c.micro_batch = 1;
        c.policy = parse_config(name);
        c.policy.attention = Attention::fused;
        c.policy.cp_comm = CpCommType::p2p;
        c.stack = {RecomputeMethod::uniform, 1};
        c.distributed_optimizer = true;
        const StageMemory st = step_memory(m, c).front();
        const Dims d = c.layer_dims(m);
        const double per_layer = layer_bytes(d, m.layer, c.policy) + layer_extra_bytes(d, m.layer, c.policy);
        const double working = st.working_set_bytes();
        auto fits = [&](const char* g) { return st.peak_bytes <= gpu(g).memory_bytes ? "1" : "0"; };
        t.add({m.name, fmt(m.h), fmt(m.a), fmt(m.L), "8", fmt(C), "p2p", fmt(s), "fused", name, fmt_bytes(per_layer),
               fmt(st.activation_bytes / kGiB, "%.4f"), fmt((st.embedding_bytes + st.output_bytes) / kGiB, "%.4f"),
               fmt(working / kGiB, "%.4f"), fmt(st.rest_bytes / kGiB, "%.4f"), fmt(st.peak_bytes / kGiB, "%.4f"),
               fits("h100"), fits("h200")});
      }
  return t;
}

Table pipeline_table(const Precision& prec) {
  Table t{{"model", "schedule", "pp", "interleave", "microbatches", "stage", "max_in_flight_chunks",
           "layers_per_chunk", "in_flight_layers", "activations_present_gib", "activations_baseline_gib",
           "busy_ms", "makespan_ms", "bubble_fraction", "bubble_ratio_analytic"},
          {}};
  for (const auto& m : paper_models()) {
    const LayerTimes lt = scale_layer_times_by_work(paper_table4_layer_times("selective+sp"),
                                                    paper_model("22b").layer_dims(), m.layer_dims(),
                                                    {Recompute::selective, true}, cost_rates(gpu("a100")));
    const int vs = m.p * m.m;
    const double per_chunk = m.L / vs;
    PipelineCosts costs;
    costs.fwd_ms.assign(vs, per_chunk * lt.fwd_ms);
    costs.bwd_ms.assign(vs, per_chunk * lt.bwd_ms);
    const PipelineResult r = simulate_pipeline(m.p, static_cast<int>(m.microbatches()), m.m, costs);
    const double present = activation_bytes(m.layer_dims(), {Recompute::selective, true}, prec);
    const double baseline = activation_bytes(m.layer_dims(), {Recompute::none, false}, prec);
    for (int s = 0; s < m.p; ++s) {
      const double layers = r.max_in_flight_chunks[s] * per_chunk;
      t.add({m.name, m.m > 1 ? "interleaved" : "1f1b", fmt(m.p), fmt(m.m), fmt(m.microbatches()), fmt(s),
             fmt(r.max_in_flight_chunks[s]), fmt(per_chunk), fmt(layers), fmt_gib(layers * present),
             fmt_gib(layers * baseline), fmt(r.busy_ms[s], "%.3f"), fmt(r.makespan_ms, "%.3f"),
             fmt(r.bubble_fraction, "%.6f"), fmt(r.bubble_ratio_analytic, "%.6f")});
    }
  }
  return t;
}

Table paper_table4() {
  Table t{{"config", "fwd_ms", "bwd_ms", "total_ms", "overhead_percent", "model", "tp", "gpu"}, {}};
  for (const auto& r : paper::table4())
    t.add({r.config, fmt(r.fwd_ms), fmt(r.bwd_ms), fmt(r.total_ms), fmt_opt(r.overhead_percent), "22b", "8", "A100"});
  return t;
}

Table paper_fig8() {
  Table t{{"model", "config", "fwd_percent", "bwd_percent", "recompute_percent", "gpu"}, {}};
  for (const auto& r : paper::figure8())
    t.add({r.model, r.config, fmt(r.fwd_percent), fmt(r.bwd_percent), fmt(r.recompute_percent), "A100"});
  return t;
}

Table plan_table(double bytes_per_param, const Precision& prec) {
  Table t{{"model", "gpu", "gpu_memory_gib", "tp", "pp", "interleave", "config", "params_optimizer_gib",
           "activations_gib", "extras_gib", "working_set_gib", "total_gib", "relative_time", "fits", "cheapest"},
          {}};
  for (const auto& m : paper_models())
    for (const auto& g : gpus()) {
      FitOptions opt;
      opt.gpu_memory_bytes = g.memory_bytes;
      opt.bytes_per_param = bytes_per_param;
      opt.precision = prec;
      const FitPlan plan = plan_fit(m, opt);
      for (int i = 0; i < static_cast<int>(plan.rows.size()); ++i) {
        const FitRow& r = plan.rows[i];
        t.add({m.name, g.name, fmt(g.memory_bytes / kGiB, "%.2f"), fmt(m.t), fmt(m.p), fmt(m.m), r.config,
               fmt_gib(r.params_optimizer_bytes), fmt_gib(r.activation_bytes), fmt_gib(r.extra_bytes),
               fmt_gib(r.working_set_bytes), fmt_gib(r.total_bytes), fmt(r.relative_time, "%.4f"),
               r.fits ? "1" : "0", i == plan.cheapest ? "1" : "0"});
      }
    }
  return t;
}

std::vector<std::pair<std::string, Table>> all_tables(const TableSettings& s, const std::vector<MeasuredLayer>& measured) {
  return {
      {"table2.csv", table2()},
      {"table2_fused.csv", table2(true)},
      {"table2_categories.csv", table2_categories()},
      {"totals.csv", totals(s.precision, s.dtype)},
      {"fig1.csv", fig1(s.bytes_per_param, s.precision)},
      {"gpus.csv", gpu_table()},
      {"fig7.csv", fig7()},
      {"seqlen.csv", seqlen()},
      {"longseq.csv", longseq(s.bytes_per_param)},
      {"longcontext.csv", longcontext()},
      {"pipeline.csv", pipeline_table(s.precision)},
      {"table5.csv", table5(measured)},
      {"plan.csv", plan_table(s.bytes_per_param, s.precision)},
      {"paper_table4.csv", paper_table4()},
      {"paper_fig8.csv", paper_fig8()},
      {"llama_table2.csv", llama_table2()},
      {"llama_table2_categories.csv", llama_table2_categories()},
      {"llama_seqlen.csv", llama_seqlen()},
      {"recompute_modules.csv", recompute_modules_categories()},
      {"moe_modules.csv", moe_modules_categories()},
  };
}

Table fit_table(const ModelSpec& m, const FitOptions& opt, const FitPlan& plan) {
  Table t{{"model", "gpu_memory_gib", "tp", "pp", "interleave", "seq", "batch", "config", "params_optimizer_gib",
           "activations_gib", "extras_gib", "working_set_gib", "total_gib", "relative_time", "fits", "cheapest"},
          {}};
  for (int i = 0; i < static_cast<int>(plan.rows.size()); ++i) {
    const FitRow& r = plan.rows[i];
    t.add({m.name, fmt(opt.gpu_memory_bytes / kGiB, "%.2f"), fmt(m.t), fmt(m.p), fmt(m.m), fmt(m.s), fmt(m.b), r.config,
           fmt_gib(r.params_optimizer_bytes), fmt_gib(r.activation_bytes), fmt_gib(r.extra_bytes),
           fmt_gib(r.working_set_bytes), fmt_gib(r.total_bytes), fmt(r.relative_time, "%.4f"), r.fits ? "1" : "0",
           i == plan.cheapest ? "1" : "0"});
  }
  return t;
}

Table search_table(const PlanRequest& r, const std::vector<PlanCandidate>& plans) {
  Table t{{"model", "gpu", "gpus", "seq", "global_batch", "attention", "distributed_optimizer", "tp", "cp", "pp",
           "interleave", "dp", "microbatch", "microbatches", "config", "peak_stage", "params_per_gpu", "weight_bytes",
           "grad_bytes", "optimizer_bytes", "per_layer_activation_bytes", "layers_in_flight", "activation_bytes",
           "extra_bytes", "working_set_bytes", "headroom_bytes", "total_bytes", "fits", "iteration_s",
           "tokens_per_s", "mfu_percent", "cp_comm_type", "ep", "recompute_modules", "a2a_s", "etp", "workspace_bytes"},
          {}};
  const double s = r.seq > 0 ? r.seq : r.model.seq;
  for (const PlanCandidate& k : plans)
    t.add({r.model.name, r.gpu.name, fmt(r.gpus), fmt(s), fmt(r.global_batch), attention_name(r.attention),
           r.distributed_optimizer ? "1" : "0", fmt(k.t), fmt(k.cp), fmt(k.p), fmt(k.m), fmt(k.dp), fmt(k.b),
           fmt(k.microbatches), k.config, fmt(k.stage), fmt_bytes(k.params_per_gpu), fmt_bytes(k.weight_bytes),
           fmt_bytes(k.grad_bytes), fmt_bytes(k.optimizer_bytes), fmt_bytes(k.per_layer_activation_bytes),
           fmt(k.layers_in_flight), fmt_bytes(k.activation_bytes), fmt_bytes(k.extra_bytes),
           fmt_bytes(k.working_set_bytes), fmt_bytes(k.headroom_bytes), fmt_bytes(k.total_bytes),
           k.fits ? "1" : "0", fmt(k.iteration_s, "%.6g"), fmt(k.tokens_per_s, "%.6g"), fmt(k.mfu_percent, "%.4g"),
           k.cp > 1 ? cp_comm_type_name(r.cp_comm) : "", fmt(k.ep), k.modules, fmt(k.a2a_s, "%.6g"), fmt(k.etp),
           fmt_bytes(k.workspace_bytes)});
  return t;
}

}  // namespace actbench::tables
