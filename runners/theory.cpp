// theory: the paper's formulas as CSV tables for the plots (DESIGN.md "theory/").
//
//   theory --out DIR [--results PATH]... [--gpu a100|h100|h200] [--dtype bf16|fp16|fp32]
//          [--optimizer mixed-fp32-grads|mixed-bf16-grads|fp32]
//   theory plan --model 22b|175b|530b|1t --gpu-memory 80GiB [--gpu h100] [--tp T] [--pp P]
//          [--interleave M] [--batch b] [--seq s] [--headroom 2GiB] [--csv FILE]
//
// --results: layer_run CSVs (files, or folders whose *.csv are read; other CSVs skipped) whose
// cuda rows give per-layer times for the Table 5 iteration model beside the paper's Table 4.
// Exit status: 0 ok, 2 bad input (one line on stderr), 1 any other failure. Every file is
// written whole to a temporary name and renamed, so a reader never sees half a table.
#include <CLI/CLI.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "theory/activation_memory.hpp"
#include "theory/flops.hpp"
#include "theory/iteration_model.hpp"
#include "theory/layer_cost.hpp"
#include "theory/memory_totals.hpp"
#include "theory/models.hpp"
#include "theory/paper_values.hpp"
#include "theory/pipeline.hpp"
#include "theory/planner.hpp"
#include "theory/llama_memory.hpp"
#include "theory/model_table.hpp"
#include "theory/llama_planner.hpp"
#include "runners/hf_config.hpp"
#include "runtime/error.hpp"

namespace fs = std::filesystem;
using namespace actbench::theory;

namespace {

// Bad input: one line on stderr, exit status 2.
struct UsageError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// ---------------------------------------------------------------- CSV out

std::string fmt(double v, const char* f = "%.6g") {
  if (!std::isfinite(v)) return "";
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}
std::string fmt_bytes(double v) { return fmt(std::round(v), "%.0f"); }
std::string fmt_gib(double bytes) { return fmt(bytes / kGiB, "%.4f"); }
std::string fmt_pct(double v) { return fmt(v, "%.3f"); }
std::string fmt_opt(const std::optional<double>& v, const char* f = "%.6g") { return v ? fmt(*v, f) : ""; }

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

struct Table {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  void add(std::vector<std::string> row) {
    if (row.size() != header.size())
      throw std::logic_error("row of " + std::to_string(row.size()) + " fields for a header of " +
                             std::to_string(header.size()));
    rows.push_back(std::move(row));
  }
};

void write_atomic(const fs::path& path, const Table& t) {
  std::ostringstream os;
  auto line = [&](const std::vector<std::string>& fields) {
    for (size_t i = 0; i < fields.size(); ++i) os << (i ? "," : "") << csv_field(fields[i]);
    os << "\n";
  };
  line(t.header);
  for (const auto& r : t.rows) line(r);
  const fs::path tmp = path.parent_path() / ("." + path.filename().string() + ".tmp." + std::to_string(getpid()));
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw UsageError("cannot write " + tmp.string());
    f << os.str();
    f.flush();
    if (!f) throw UsageError("cannot write " + tmp.string());
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp);
    throw UsageError("cannot rename " + tmp.string() + " to " + path.string() + ": " + ec.message());
  }
}

// ---------------------------------------------------------------- CSV in (layer_run results)

std::vector<std::vector<std::string>> parse_csv(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> row;
  std::string field;
  bool quoted = false, any = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') field += '"', ++i;
      else if (c == '"') quoted = false;
      else field += c;
      continue;
    }
    if (c == '"') quoted = true, any = true;
    else if (c == ',') row.push_back(field), field.clear(), any = true;
    else if (c == '\n' || c == '\r') {
      if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      if (any || !field.empty()) row.push_back(field), rows.push_back(row);
      row.clear(), field.clear(), any = false;
    } else field += c, any = true;
  }
  if (any || !field.empty()) row.push_back(field), rows.push_back(row);
  return rows;
}

// One timed layer_run row: what the iteration model needs.
struct MeasuredLayer {
  std::string device, model, config, timestamp;
  double hidden = 0, heads = 0, seq = 0, batch = 0, tp = 0;
  LayerTimes times;
};

const std::vector<std::string> kNeededColumns = {"backend", "device", "model", "hidden", "heads", "seq", "batch", "tp",
                                                 "config", "dtype", "fwd_ms", "bwd_ms", "comm_mode",
                                                 "comm_ms_modeled", "status"};

// Returns false when the file is not a layer_run CSV (other header).
bool read_layer_run_csv(const fs::path& path, std::vector<MeasuredLayer>& out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw UsageError("cannot read " + path.string());
  std::stringstream ss;
  ss << f.rdbuf();
  const auto rows = parse_csv(ss.str());
  if (rows.empty()) return false;
  std::map<std::string, size_t> col;
  for (size_t i = 0; i < rows[0].size(); ++i) col[rows[0][i]] = i;
  for (const auto& c : kNeededColumns)
    if (!col.count(c)) return false;
  auto get = [&](const std::vector<std::string>& r, const std::string& c) -> std::string {
    auto it = col.find(c);
    return it != col.end() && it->second < r.size() ? r[it->second] : "";
  };
  auto num = [](const std::string& s) {
    try {
      return s.empty() ? NAN : std::stod(s);
    } catch (...) {
      return static_cast<double>(NAN);
    }
  };
  for (size_t i = 1; i < rows.size(); ++i) {
    const auto& r = rows[i];
    if (get(r, "status") != "ok" || get(r, "backend") != "cuda" || get(r, "dtype") != "bf16") continue;
    MeasuredLayer m;
    m.device = get(r, "device");
    m.model = get(r, "model");
    m.config = get(r, "config");
    m.timestamp = get(r, "timestamp");
    m.hidden = num(get(r, "hidden"));
    m.heads = num(get(r, "heads"));
    m.seq = num(get(r, "seq"));
    m.batch = num(get(r, "batch"));
    m.tp = num(get(r, "tp"));
    m.times.fwd_ms = num(get(r, "fwd_ms"));
    m.times.bwd_ms = num(get(r, "bwd_ms"));
    // Emulated TP: the collectives were replaced by copies; their modeled time is added.
    m.times.comm_ms = get(r, "comm_mode") == "modeled" ? num(get(r, "comm_ms_modeled")) : 0.0;
    if (!std::isfinite(m.times.comm_ms)) m.times.comm_ms = 0;
    if (!(m.times.fwd_ms > 0) || !(m.times.bwd_ms > 0)) continue;
    out.push_back(m);
  }
  return true;
}

std::vector<MeasuredLayer> read_results(const std::vector<std::string>& paths) {
  std::vector<MeasuredLayer> out;
  for (const auto& p : paths) {
    const fs::path path(p);
    if (fs::is_directory(path)) {
      std::vector<fs::path> files;
      for (const auto& e : fs::directory_iterator(path))
        if (e.is_regular_file() && e.path().extension() == ".csv") files.push_back(e.path());
      std::sort(files.begin(), files.end());
      for (const auto& f : files) read_layer_run_csv(f, out);  // other CSVs in a folder are skipped
    } else if (fs::is_regular_file(path)) {
      if (!read_layer_run_csv(path, out))
        throw UsageError(p + " is not a layer_run CSV (its header lacks fwd_ms, ...)");
    } else {
      throw UsageError("--results " + p + ": no such file or folder");
    }
  }
  return out;
}

// The Table 3 model a row measured, if its shape is the preset's.
bool is_preset_shape(const MeasuredLayer& r, const ModelSpec& m) {
  return r.model == m.name && r.hidden == m.h && r.heads == m.a && r.seq == m.s && r.batch == m.b && r.tp == m.t;
}

std::optional<Gpu> gpu_of_device(const std::string& device) {
  std::string d = device;
  std::transform(d.begin(), d.end(), d.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const auto& g : gpus())
    if (d.find(g.name) != std::string::npos) return g;
  return std::nullopt;
}

// ---------------------------------------------------------------- the tables

Precision precision_of(const std::string& dtype) {
  if (dtype == "bf16" || dtype == "fp16") return {2, 1};
  if (dtype == "fp32") return {4, 1};
  throw UsageError("unknown dtype '" + dtype + "' (expected bf16, fp16 or fp32)");
}

// fused: the same rows with FlashAttention-style attention (beyond the paper; no closed form).
Table table2(bool fused = false) {
  Table t{{"model", "hidden", "heads", "seq", "batch", "tp", "config", "dtype", "elem_bytes", "mask_bytes",
           "act_bytes", "act_bytes_closed_form", "linear_bytes", "attention_bytes", "sbh_multiple",
           "ln_stats_bytes", "recompute_working_set_bytes"},
          {}};
  for (const auto& m : paper_models())
    for (const std::string dtype : {"bf16", "fp32"})
      for (const auto& name : config_names()) {
        const Dims d = m.layer_dims();
        Config c = config_from_name(name);
        c.fused_attention = fused;
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
        for (const auto& [cat, bytes] : activation_bytes_by_category(m.layer_dims(), config_from_name(name),
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
      const Config c = config_from_name(name);
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
      t.add({m.name, name, fmt_pct(percent_of_tp_baseline(m.layer_dims(), config_from_name(name))), fmt_opt(pv)});
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
        const ActivationTerms terms = activation_terms(d, config_from_name(name));
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
        Config c = config_from_name(name);
        c.fused_attention = fused;
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

// Per-layer times for the iteration model: one source = one set of times for every model.
struct TimeSource {
  std::string source;  // table4-a100-scaled | measured | scaled-from-<model>
  std::string device;
  Gpu gpu;
  std::map<std::string, std::optional<LayerTimes>> present, full;  // by model
};

std::vector<TimeSource> time_sources(const std::vector<MeasuredLayer>& measured) {
  std::vector<TimeSource> out;
  // Table 4's 22B layer carried to each model's shape (theory/layer_cost.hpp).
  TimeSource paper_src{"table4-a100-scaled", "A100 (paper Table 4)", gpu("a100"), {}, {}};
  const CostRates a100 = cost_rates(gpu("a100"));
  const Dims ref = paper_model("22b").layer_dims();
  for (const auto& m : paper_models()) {
    paper_src.present[m.name] = scale_layer_times_by_work(paper_table4_layer_times("selective+sp"), ref,
                                                          m.layer_dims(), {Recompute::selective, true}, a100);
    paper_src.full[m.name] = scale_layer_times_by_work(paper_table4_layer_times("full"), ref, m.layer_dims(),
                                                       {Recompute::full, false}, a100);
  }
  out.push_back(paper_src);

  std::vector<std::string> devices;
  for (const auto& r : measured)
    if (std::find(devices.begin(), devices.end(), r.device) == devices.end()) devices.push_back(r.device);
  for (const auto& dev : devices) {
    const auto g = gpu_of_device(dev);
    if (!g) {
      std::fprintf(stderr, "theory: note: no peak FLOP/s known for device '%s'; its rows are not modeled\n",
                   dev.c_str());
      continue;
    }
    // The latest row of each (model at its preset shape, config) on this device.
    auto latest = [&](const ModelSpec& m, const std::string& config) -> std::optional<LayerTimes> {
      const MeasuredLayer* best = nullptr;
      for (const auto& r : measured)
        if (r.device == dev && r.config == config && is_preset_shape(r, m) && (!best || r.timestamp >= best->timestamp))
          best = &r;
      return best ? std::optional(best->times) : std::nullopt;
    };
    TimeSource src{"measured", dev, *g, {}, {}};
    std::optional<ModelSpec> reference;  // a model measured in both configs: others are scaled from it
    for (const auto& m : paper_models()) {
      src.present[m.name] = latest(m, "selective+sp");
      src.full[m.name] = latest(m, "full");
      if (!reference && src.present[m.name] && src.full[m.name]) reference = m;
    }
    bool any = false;
    for (const auto& m : paper_models()) any = any || src.present[m.name] || src.full[m.name];
    if (!any) continue;
    out.push_back(src);
    if (reference) {
      TimeSource scaled{"scaled-from-" + reference->name, dev, *g, {}, {}};
      for (const auto& m : paper_models()) {
        if (src.present[m.name] && src.full[m.name]) continue;  // measured: no need to scale
        const CostRates rates = cost_rates(*g);
        scaled.present[m.name] = scale_layer_times_by_work(*src.present[reference->name], reference->layer_dims(),
                                                           m.layer_dims(), {Recompute::selective, true}, rates);
        scaled.full[m.name] = scale_layer_times_by_work(*src.full[reference->name], reference->layer_dims(),
                                                        m.layer_dims(), {Recompute::full, false}, rates);
      }
      out.push_back(scaled);
    }
  }
  return out;
}

Table table5(const std::vector<MeasuredLayer>& measured) {
  Table t{{"model", "dp", "gpus", "tp", "pp", "interleave", "global_batch", "microbatch", "microbatches",
           "model_flops", "hardware_flops_eq8", "hardware_flops_selective_exact", "hardware_flops_full",
           "model_flops_causal", "paper_full_s", "paper_present_s", "paper_gain_percent", "paper_mfu_percent",
           "paper_hfu_percent", "paper_mfu_full_percent", "mfu_percent", "hfu_percent", "hfu_exact_percent",
           "mfu_causal_percent", "mfu_full_percent", "hfu_full_percent", "source", "device", "peak_tflops",
           "layer_fwd_ms_present", "layer_bwd_ms_present", "layer_fwd_ms_full", "layer_bwd_ms_full",
           "modeled_present_s", "modeled_full_s", "modeled_gain_percent", "modeled_mfu_percent",
           "modeled_hfu_percent", "modeled_mfu_full_percent", "modeled_hfu_full_percent",
           "modeled_bubble_percent"},
          {}};
  const auto sources = time_sources(measured);
  for (const auto& row : paper::table5()) {
    ModelSpec m = paper_model(row.model);
    m.dp = row.dp;
    m.B *= row.dp;  // the 2240-GPU run keeps B = 280 per replica
    const double a100 = paper::kA100PeakFlops;
    const double f_model = model_flops_eq7(m), f_eq8 = hardware_flops_eq8(m);
    const double f_exact = hardware_flops_selective_exact(m), f_full = hardware_flops_full_recompute(m);
    const double f_causal = model_flops_causal(m);
    auto util = [&](double flops, std::optional<double> s) {
      return s ? fmt_pct(utilization_percent(flops, *s, m.gpus(), a100)) : std::string();
    };
    // The 2240-GPU run reports only MFU with full recompute: its time follows from it.
    std::optional<double> full_s = row.full_recompute_s;
    if (!full_s && row.mfu_full_percent)
      full_s = f_model / (*row.mfu_full_percent / 100 * m.gpus() * a100);
    for (const auto& src : sources) {
      std::vector<std::string> r = {
          m.name, fmt(m.dp), fmt(m.gpus()), fmt(m.t), fmt(m.p), fmt(m.m), fmt(m.B), fmt(m.b), fmt(m.microbatches()),
          decimal(flops_exact(m, FlopFormula::eq7)), decimal(flops_exact(m, FlopFormula::eq8)),
          decimal(flops_exact(m, FlopFormula::selective_exact)), decimal(flops_exact(m, FlopFormula::full_recompute)),
          decimal(flops_exact(m, FlopFormula::model_causal)),
          fmt_opt(row.full_recompute_s), fmt(row.present_s), fmt_opt(row.throughput_gain_percent),
          fmt(row.mfu_percent), fmt_opt(row.hfu_percent), fmt_opt(row.mfu_full_percent),
          util(f_model, row.present_s), util(f_eq8, row.present_s), util(f_exact, row.present_s),
          util(f_causal, row.present_s), util(f_model, full_s), util(f_full, full_s), src.source, src.device,
          fmt(src.gpu.peak_flops / 1e12)};
      IterationOptions opt;
      opt.gpu = src.gpu;
      std::optional<IterationEstimate> present, full;
      const auto p_it = src.present.find(m.name), f_it = src.full.find(m.name);
      const auto p_times = p_it != src.present.end() ? p_it->second : std::nullopt;
      const auto f_times = f_it != src.full.end() ? f_it->second : std::nullopt;
      if (!p_times && !f_times) continue;  // this source has nothing for this model
      if (p_times) present = estimate_iteration(m, {Recompute::selective, true}, *p_times, opt);
      if (f_times) full = estimate_iteration(m, {Recompute::full, false}, *f_times, opt);
      r.push_back(p_times ? fmt(p_times->fwd_ms + p_times->comm_ms / 2, "%.4f") : "");
      r.push_back(p_times ? fmt(p_times->bwd_ms + p_times->comm_ms / 2, "%.4f") : "");
      r.push_back(f_times ? fmt(f_times->fwd_ms + f_times->comm_ms / 2, "%.4f") : "");
      r.push_back(f_times ? fmt(f_times->bwd_ms + f_times->comm_ms / 2, "%.4f") : "");
      r.push_back(present ? fmt(present->iteration_s, "%.4f") : "");
      r.push_back(full ? fmt(full->iteration_s, "%.4f") : "");
      r.push_back(present && full ? fmt_pct(100 * (full->iteration_s / present->iteration_s - 1)) : "");
      r.push_back(present ? fmt_pct(present->mfu_percent) : "");
      r.push_back(present ? fmt_pct(present->hfu_percent) : "");
      r.push_back(full ? fmt_pct(full->mfu_percent) : "");
      r.push_back(full ? fmt_pct(full->hfu_percent) : "");
      r.push_back(present ? fmt_pct(100 * present->pipeline.bubble_fraction) : "");
      t.add(r);
    }
  }
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

// ---------------------------------------------------------------- CLI

// "80GiB", "80GB", "141e9" -> bytes.
double parse_bytes(const std::string& s) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (...) {
    throw UsageError("cannot read memory size '" + s + "' (e.g. 80GiB, 141GB)");
  }
  const std::string unit = s.substr(pos);
  const std::map<std::string, double> units = {{"", 1},         {"B", 1},         {"KiB", 1024.0},
                                               {"MiB", 1048576.0}, {"GiB", kGiB},   {"TiB", kGiB * 1024},
                                               {"KB", 1e3},       {"MB", 1e6},     {"GB", 1e9},
                                               {"TB", 1e12}};
  const auto it = units.find(unit);
  if (it == units.end()) throw UsageError("unknown unit in memory size '" + s + "' (use B, KiB, MiB, GiB, KB, MB, GB)");
  if (!(v >= 0)) throw UsageError("memory size '" + s + "' must not be negative");
  return v * it->second;
}

// ---------------------------------------------------------------- the llama family

// The LLaMA-3 presets at their tensor-parallel size (layer_run's presets), s = 8192, b = 1.
struct LlamaRow {
  PlanModel model;
  int t;
};
std::vector<LlamaRow> llama_rows() {
  std::vector<LlamaRow> rows;
  for (const ModelRow& r : model_table())
    if (r.arch == "llama") rows.push_back({plan_model(r.name), r.tp});
  return rows;
}

LlamaDims llama_dims(const PlanModel& m, double s, double b, double t) { return {s, b, m.h, m.a, m.g, m.F, t}; }

// Table 2 for the llama family: bytes per layer and rank by configuration, unfused and fused.
Table llama_table2() {
  Table t{{"model", "tp", "seq", "kv_heads", "ffn_hidden", "config", "attention", "bytes", "closed_form_bytes",
           "norm_stats_bytes", "gib"},
          {}};
  for (const auto& [m, tp] : llama_rows())
    for (bool fused : {false, true})
      for (const auto& name : config_names()) {
        Config c = config_from_name(name);
        c.fused_attention = fused;
        const LlamaDims d = llama_dims(m, m.s, 1, tp);
        const double bytes = llama_activation_bytes(d, c);
        t.add({m.name, fmt(tp), fmt(m.s), fmt(m.g), fmt(m.F), name, fused ? "fused" : "unfused", fmt_bytes(bytes),
               fmt_bytes(llama_closed_form(d, c)), fmt_bytes(llama_norm_stats_bytes(d, c)), fmt_gib(bytes)});
      }
  return t;
}

Table llama_table2_categories() {
  Table t{{"model", "tp", "config", "attention", "category", "bytes"}, {}};
  for (const auto& [m, tp] : llama_rows())
    for (bool fused : {false, true})
      for (const auto& name : config_names()) {
        Config c = config_from_name(name);
        c.fused_attention = fused;
        for (const auto& [cat, bytes] : llama_activation_bytes_by_category(llama_dims(m, m.s, 1, tp), c))
          t.add({m.name, fmt(tp), name, fused ? "fused" : "unfused", cat, fmt_bytes(bytes)});
      }
  return t;
}

// Memory vs sequence length for llama3-70b at t = 8 with its 8 key/value heads and with
// multi-head attention (g = a): what grouped-query attention saves, by configuration.
Table llama_seqlen() {
  Table t{{"model", "tp", "kv_heads", "seq", "config", "attention", "bytes", "gib"}, {}};
  const PlanModel m = plan_model("llama3-70b");
  for (double g : {m.g, m.a})
    for (double s = 1024; s <= 131072; s *= 2)
      for (bool fused : {false, true})
        for (const char* name : {"baseline", "selective+sp", "full"}) {
          Config c = config_from_name(name);
          c.fused_attention = fused;
          LlamaDims d = llama_dims(m, s, 1, 8);
          d.g = g;
          const double bytes = llama_activation_bytes(d, c);
          t.add({m.name, "8", fmt(g), fmt(s), name, fused ? "fused" : "unfused", fmt_bytes(bytes), fmt_gib(bytes)});
        }
  return t;
}

// A model from --model (a llama preset or a paper GPT model) or --hf-config.
PlanModel model_of(const std::string& name, const std::string& hf_config) {
  if (!hf_config.empty()) {
    if (!name.empty()) throw UsageError("give --model or --hf-config, not both");
    try {
      const actbench::HfModelConfig c = actbench::read_hf_config(hf_config);
      return {c.name, true, static_cast<double>(c.max_positions), static_cast<double>(c.hidden),
              static_cast<double>(c.heads), static_cast<double>(c.kv_heads), static_cast<double>(c.ffn_hidden),
              static_cast<double>(c.layers), static_cast<double>(c.vocab)};
    } catch (const actbench::InvalidArgument& e) {
      throw UsageError(e.what());
    }
  }
  if (name.empty()) throw UsageError("--model or --hf-config is required");
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
  if (!m.llama) throw UsageError(m.name + " is a GPT model: its table is table2.csv");
  const double s = a.seq > 0 ? a.seq : m.s;
  if (a.tp < 1 || std::fmod(m.a, a.tp) != 0 || std::fmod(m.g > 0 ? m.g : m.a, a.tp) != 0)
    throw UsageError("--tp must divide the heads and the key/value heads");
  const LlamaDims d = llama_dims(m, s, a.batch, a.tp);
  std::printf("%s: s=%g b=%g h=%g a=%g g=%g F=%g t=%d, bytes per layer and rank (bf16)\n", m.name.c_str(), s,
              a.batch, m.h, m.a, d.groups(), d.ffn(), a.tp);
  std::vector<std::pair<std::string, Config>> cols;
  for (bool fused : {false, true})
    for (const auto& name : config_names()) {
      Config c = config_from_name(name);
      c.fused_attention = fused;
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

// theory plan --gpus N: the search over layouts and configurations (llama_planner.hpp).
int run_plan_search(const std::string& model_name, const SearchArgs& a, const std::string& gpu_name, double seq,
                    const std::string& headroom, const std::string& csv) {
  PlanRequest r;
  r.model = model_of(model_name, a.hf_config);
  r.gpu = plan_gpu(gpu_name);
  r.gpus = a.gpus;
  r.seq = seq;
  if (a.global_batch <= 0) throw UsageError("--global-batch B (sequences per iteration) is required with --gpus");
  r.global_batch = a.global_batch;
  r.distributed_optimizer = a.distributed_optimizer;
  if (a.attention != "fused" && a.attention != "unfused") throw UsageError("--attention must be fused or unfused");
  r.fused_attention = a.attention == "fused";
  r.headroom_bytes = parse_bytes(headroom);
  r.efficiency = a.efficiency;
  int top = 0;
  try {
    top = std::stoi(a.top);
  } catch (...) {
    throw UsageError("--top must be a number");
  }
  if (top < 1) throw UsageError("--top must be >= 1");
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
  if (!csv.empty()) {
    Table t{{"model", "gpu", "gpus", "seq", "global_batch", "attention", "distributed_optimizer", "tp", "pp",
             "interleave", "dp", "microbatch", "microbatches", "config", "params_per_gpu", "weight_bytes",
             "grad_bytes", "optimizer_bytes", "per_layer_activation_bytes", "layers_in_flight", "activation_bytes",
             "extra_bytes", "working_set_bytes", "headroom_bytes", "total_bytes", "fits", "iteration_s",
             "tokens_per_s", "mfu_percent"},
            {}};
    for (const PlanCandidate& k : plans)
      t.add({r.model.name, r.gpu.name, fmt(r.gpus), fmt(s), fmt(r.global_batch), a.attention,
             r.distributed_optimizer ? "1" : "0", fmt(k.t), fmt(k.p), fmt(k.m), fmt(k.dp), fmt(k.b),
             fmt(k.microbatches), k.config, fmt_bytes(k.params_per_gpu), fmt_bytes(k.weight_bytes),
             fmt_bytes(k.grad_bytes), fmt_bytes(k.optimizer_bytes), fmt_bytes(k.per_layer_activation_bytes),
             fmt(k.layers_in_flight), fmt_bytes(k.activation_bytes), fmt_bytes(k.extra_bytes),
             fmt_bytes(k.working_set_bytes), fmt_bytes(k.headroom_bytes), fmt_bytes(k.total_bytes),
             k.fits ? "1" : "0", fmt(k.iteration_s, "%.6g"), fmt(k.tokens_per_s, "%.6g"), fmt(k.mfu_percent, "%.4g")});
    write_atomic(csv, t);
  }
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
  if (!(opt.gpu_memory_bytes > 0)) throw UsageError("--gpu-memory must be positive");
  opt.bytes_per_param = bytes_per_param;
  opt.precision = prec;
  opt.headroom_bytes = parse_bytes(a.headroom);
  const FitPlan plan = plan_fit(m, opt);
  std::printf("%s: s=%g b=%g h=%g a=%g L=%g, t=%d p=%d m=%d, %.1f GiB per GPU, %g bytes/parameter\n", m.name.c_str(),
              m.s, m.b, m.h, m.a, m.L, m.t, m.p, m.m, opt.gpu_memory_bytes / kGiB, bytes_per_param);
  std::printf("%-13s %9s %9s %8s %9s %9s %7s  %s\n", "config", "params+opt", "activ.", "extras", "recompute",
              "total", "time", "fits");
  Table t{{"model", "gpu_memory_gib", "tp", "pp", "interleave", "seq", "batch", "config", "params_optimizer_gib",
           "activations_gib", "extras_gib", "working_set_gib", "total_gib", "relative_time", "fits", "cheapest"},
          {}};
  for (int i = 0; i < static_cast<int>(plan.rows.size()); ++i) {
    const FitRow& r = plan.rows[i];
    std::printf("%-13s %8.1fG %8.1fG %7.2fG %8.2fG %8.1fG %7.3f  %s%s\n", r.config.c_str(),
                r.params_optimizer_bytes / kGiB, r.activation_bytes / kGiB, r.extra_bytes / kGiB,
                r.working_set_bytes / kGiB, r.total_bytes / kGiB, r.relative_time, r.fits ? "yes" : "no",
                i == plan.cheapest ? "  <- cheapest that fits" : "");
    t.add({m.name, fmt(opt.gpu_memory_bytes / kGiB, "%.2f"), fmt(m.t), fmt(m.p), fmt(m.m), fmt(m.s), fmt(m.b), r.config,
           fmt_gib(r.params_optimizer_bytes), fmt_gib(r.activation_bytes), fmt_gib(r.extra_bytes),
           fmt_gib(r.working_set_bytes), fmt_gib(r.total_bytes), fmt(r.relative_time, "%.4f"), r.fits ? "1" : "0",
           i == plan.cheapest ? "1" : "0"});
  }
  if (plan.cheapest < 0) std::printf("nothing fits: raise t or p, or lower b\n");
  if (!a.csv.empty()) write_atomic(a.csv, t);
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
    throw UsageError(what);
  }
  const Precision prec = precision_of(dtype);
  const double bytes_per_param = bytes_per_parameter(optimizer_precision_from_name(optimizer));
  if (ltable_cmd->parsed()) return run_llama_table(ltable);
  if (plan_cmd->parsed() && (search.gpus != 0 || !search.hf_config.empty())) {
    if (search.gpus < 1) throw UsageError("--gpus N (>= 1) is required to plan a --hf-config model");
    return run_plan_search(plan.model, search, plan.gpu, plan.seq, plan.headroom, plan.csv);
  }
  if (plan_cmd->parsed()) {
    if (plan.model.empty()) throw UsageError("--model is required");
    gpu(plan.gpu);  // validate the name
    return run_plan(plan, bytes_per_param, prec);
  }
  if (out.empty()) throw UsageError("--out DIR is required (or use the plan subcommand)");
  const std::vector<MeasuredLayer> measured = read_results(results);
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec || !fs::is_directory(out)) throw UsageError("cannot create output folder " + out);
  const fs::path dir(out);
  const std::vector<std::pair<std::string, Table>> tables = {
      {"table2.csv", table2()},
      {"table2_fused.csv", table2(true)},
      {"table2_categories.csv", table2_categories()},
      {"totals.csv", totals(prec, dtype)},
      {"fig1.csv", fig1(bytes_per_param, prec)},
      {"gpus.csv", gpu_table()},
      {"fig7.csv", fig7()},
      {"seqlen.csv", seqlen()},
      {"longseq.csv", longseq(bytes_per_param)},
      {"pipeline.csv", pipeline_table(prec)},
      {"table5.csv", table5(measured)},
      {"plan.csv", plan_table(bytes_per_param, prec)},
      {"paper_table4.csv", paper_table4()},
      {"paper_fig8.csv", paper_fig8()},
      {"llama_table2.csv", llama_table2()},
      {"llama_table2_categories.csv", llama_table2_categories()},
      {"llama_seqlen.csv", llama_seqlen()},
  };
  for (const auto& [name, table] : tables) write_atomic(dir / name, table);
  std::printf("theory: wrote %zu tables to %s (%zu measured layer rows used)\n", tables.size(), out.c_str(),
              measured.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::invalid_argument& e) {  // UsageError and the formulas' own checks
    std::fprintf(stderr, "theory: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "theory: failure: %s\n", e.what());
    return 1;
  }
}
