// Table 5 of the paper beside the iteration model (theory/iteration_model.hpp), on Table 4's
// layer times and on the times of layer_run CSVs (their ok bf16 cuda rows).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>

#include "runners/theory_tables.hpp"
#include "runtime/csv.hpp"
#include "runtime/error.hpp"
#include "runtime/user_file.hpp"
#include "theory/flops.hpp"
#include "theory/iteration_model.hpp"
#include "theory/paper_values.hpp"

namespace fs = std::filesystem;

namespace actbench::tables {

using namespace theory;

namespace {

const std::vector<std::string> kNeededColumns = {"backend", "device", "model", "hidden", "heads", "seq", "batch", "tp",
                                                 "config", "dtype", "fwd_ms", "bwd_ms", "comm_mode",
                                                 "comm_ms_modeled", "status"};

// Table 4's layer: unfused attention, the gpt layer, selective recompute of core attention
// alone (a column absent: a CSV from before it, when every row was that layer). Rows of other
// layers at the same shape time another thing.
bool is_papers_layer(const std::string& attention, const std::string& arch, const std::string& modules) {
  return (attention.empty() || attention == "unfused") && (arch.empty() || arch == "gpt") &&
         (modules.empty() || modules == "core_attn");
}

// Returns false when the file is not a layer_run CSV (other header). Opened through
// read_user_file: a FIFO or device refused, never waited on.
bool read_layer_run_csv(const fs::path& path, std::vector<MeasuredLayer>& out) {
  std::string text = read_user_file("--results " + path.string(), path.string());
  // A row is whole once its "\n" is written: what follows the last one is still being written,
  // or its writer was killed, and is no measurement.
  if (const size_t whole = csv_whole_rows_end(text); whole < text.size()) {
    std::fprintf(stderr, "theory: note: %s: an unfinished last row (being written, or its writer was killed) is "
                         "not read\n", path.string().c_str());
    text.resize(whole);
  }
  const auto rows = csv_parse(text);
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
    if (!is_papers_layer(get(r, "attention"), get(r, "arch"), get(r, "recompute_modules"))) continue;
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

}  // namespace

std::vector<MeasuredLayer> read_measured_layers(const std::vector<std::string>& paths) {
  std::vector<MeasuredLayer> out;
  for (const auto& p : paths) {
    const fs::path path(p);
    std::error_code ec;
    if (fs::is_directory(path, ec)) {
      // Its regular *.csv files; other CSVs, and anything that is not a regular file, skipped.
      std::vector<fs::path> files;
      for (const auto& e : fs::directory_iterator(path, ec))
        if (e.is_regular_file(ec) && e.path().extension() == ".csv") files.push_back(e.path());
      if (ec) throw InvalidArgument("--results " + p + ": cannot list the folder (" + ec.message() + ")");
      std::sort(files.begin(), files.end());
      for (const auto& f : files) read_layer_run_csv(f, out);
    } else if (!read_layer_run_csv(path, out)) {
      throw InvalidArgument("--results " + p + " is not a layer_run CSV (its header lacks fwd_ms, ...)");
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


}  // namespace actbench::tables
