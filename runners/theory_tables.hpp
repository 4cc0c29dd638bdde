#pragma once
// The tables `theory` writes: the formulas of theory/ evaluated over the paper's models (and
// the llama family), one builder per CSV file. A builder returns the whole table;
// write_table writes it through runtime/csv, atomically.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "theory/activation_memory.hpp"
#include "theory/config_fit.hpp"
#include "theory/layer_cost.hpp"
#include "theory/layout_search.hpp"
#include "theory/llama_memory.hpp"
#include "theory/models.hpp"

namespace actbench::tables {

struct Table {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  void add(std::vector<std::string> row);  // throws std::logic_error when its width is not the header's
};

// Whole, to a temporary name renamed over `path`: a reader never sees half a table.
void write_table(const std::string& path, const Table& t);

// Cell formats; a value that is not finite is an empty cell.
std::string fmt(double v, const char* f = "%.6g");
std::string fmt_bytes(double v);   // whole bytes
std::string fmt_gib(double bytes); // GiB, 4 decimals
std::string fmt_pct(double v);     // 3 decimals
std::string fmt_opt(const std::optional<double>& v, const char* f = "%.6g");

// bf16 | fp16 (2-byte elements) | fp32 (4); 1-byte masks. Throws InvalidArgument.
theory::Precision precision_of(const std::string& dtype);

// ---- layer_run results (table5.cpp) ----

// One timed layer_run row: what the iteration model needs.
struct MeasuredLayer {
  std::string device, model, config, timestamp;
  double hidden = 0, heads = 0, seq = 0, batch = 0, tp = 0;
  theory::LayerTimes times;
};
// The ok bf16 cuda rows of layer_run CSVs: files, or folders whose *.csv are read (other CSVs
// in a folder are skipped; a file named on its own must be a layer_run CSV). Throws InvalidArgument.
std::vector<MeasuredLayer> read_measured_layers(const std::vector<std::string>& paths);

// Table 5: the paper's rows, its FLOP counts and utilizations, and the iteration model on
// Table 4's times scaled to each model and on each measured device's times.
Table table5(const std::vector<MeasuredLayer>& measured);

// ---- the paper's models (theory_tables.cpp) ----

// Table 2 for every model, dtype and configuration; fused: FlashAttention-style attention
// (beyond the paper; no closed form).
Table table2(bool fused = false);
Table table2_categories();
// Eq. 5/6 and the first pipeline stage's activations with their extras.
Table totals(const theory::Precision& prec, const std::string& dtype);
Table fig1(double bytes_per_param, const theory::Precision& prec);
Table gpu_table();
Table fig7();
// Bytes against sequence length, the linear and the attention term.
Table seqlen();
// The 22B model from 1k to 128k tokens against each GPU's memory.
Table longseq(double bytes_per_param);
// Long context: the 22B model (t = 8) from 32k to 1M tokens with context parallelism C = 1..32,
// each configuration's whole training step on one GPU (theory/step_memory.hpp).
Table longcontext();
// The simulated 1F1B / interleaved schedules: in-flight layers and the bubble per stage.
Table pipeline_table(const theory::Precision& prec);
Table paper_table4();
Table paper_fig8();
// What fits each GPU at Table 3's layouts (theory/config_fit.hpp).
Table plan_table(double bytes_per_param, const theory::Precision& prec);

// ---- the llama family (llama_tables.cpp) ----

// The LLaMA-3 presets' Table 2, unfused and fused, and its categories.
Table llama_table2();
Table llama_table2_categories();
// llama3-70b at t = 8 with its 8 key/value heads and with multi-head attention.
Table llama_seqlen();
theory::LlamaDims llama_dims(const theory::TransformerModel& m, double s, double b, double t);

// ---- Megatron-Core's recompute modules (recompute_tables.cpp) ----

// Bytes by category for every --recompute-modules set (and none, and full) with SP, unfused
// and fused, for the 22B layer and llama3-8b's at t = 8.
Table recompute_modules_categories();
// The same for the MoE presets (mixtral-8x7b, qwen3-30b-a3b, deepseek-v3) at t = 2 with SP, over
// the module sets an MoE layer reads (moe_act, moe, shared_experts, mla_up_proj).
Table moe_modules_categories();

// ---- everything `theory --out` writes ----

struct TableSettings {
  theory::Precision precision;
  std::string dtype;  // precision's name
  double bytes_per_param = 18;
};
// (file name, table) in the order they are written.
std::vector<std::pair<std::string, Table>> all_tables(const TableSettings& s, const std::vector<MeasuredLayer>& measured);

// ---- the plan subcommand's --csv ----

// One layout of a paper model: each configuration's memory, time and fit.
Table fit_table(const theory::ModelSpec& m, const theory::FitOptions& opt, const theory::FitPlan& plan);
// The layout search: every candidate, in plan_search's order.
Table search_table(const theory::PlanRequest& r, const std::vector<theory::PlanCandidate>& plans);

}  // namespace actbench::tables
