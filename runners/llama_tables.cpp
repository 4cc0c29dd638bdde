// The llama family's tables: Table 2's analogue (theory/llama_memory.hpp) for the LLaMA-3 presets.
#include "runners/theory_tables.hpp"
#include "theory/llama_memory.hpp"
#include "theory/model_table.hpp"

namespace actbench::tables {

using namespace theory;

namespace {

// The LLaMA-3 presets at their tensor-parallel size (layer_run's presets), s = 8192, b = 1.
struct LlamaRow {
  TransformerModel model;
  int t;
};
std::vector<LlamaRow> llama_rows() {
  std::vector<LlamaRow> rows;
  for (const ModelRow& r : model_table())
    if (r.arch == "llama") rows.push_back({plan_model(r.name), r.tp});
  return rows;
}

}  // namespace

LlamaDims llama_dims(const TransformerModel& m, double s, double b, double t) {
  return {s, b, m.h, m.a, m.layer.kv_heads, m.layer.ffn_hidden, t};
}

// Table 2 for the llama family: bytes per layer and rank by configuration, unfused and fused.
Table llama_table2() {
  Table t{{"model", "tp", "seq", "kv_heads", "ffn_hidden", "config", "attention", "bytes", "closed_form_bytes",
           "norm_stats_bytes", "gib"},
          {}};
  for (const auto& [m, tp] : llama_rows())
    for (bool fused : {false, true})
      for (const auto& name : config_names()) {
        LayerPolicy c = parse_config(name);
        c.attention = fused ? Attention::fused : Attention::unfused;
        const LlamaDims d = llama_dims(m, m.seq, 1, tp);
        const double bytes = llama_activation_bytes(d, c);
        t.add({m.name, fmt(tp), fmt(m.seq), fmt(m.layer.kv_heads), fmt(m.layer.ffn_hidden), name, fused ? "fused" : "unfused", fmt_bytes(bytes),
               fmt_bytes(llama_closed_form(d, c)), fmt_bytes(llama_norm_stats_bytes(d, c)), fmt_gib(bytes)});
      }
  return t;
}

Table llama_table2_categories() {
  Table t{{"model", "tp", "config", "attention", "category", "bytes"}, {}};
  for (const auto& [m, tp] : llama_rows())
    for (bool fused : {false, true})
      for (const auto& name : config_names()) {
        LayerPolicy c = parse_config(name);
        c.attention = fused ? Attention::fused : Attention::unfused;
        for (const auto& [cat, bytes] : llama_activation_bytes_by_category(llama_dims(m, m.seq, 1, tp), c))
          t.add({m.name, fmt(tp), name, fused ? "fused" : "unfused", cat, fmt_bytes(bytes)});
      }
  return t;
}

// Memory vs sequence length for llama3-70b at t = 8 with its 8 key/value heads and with
// multi-head attention (g = a): what grouped-query attention saves, by configuration.
Table llama_seqlen() {
  Table t{{"model", "tp", "kv_heads", "seq", "config", "attention", "bytes", "gib"}, {}};
  const TransformerModel m = plan_model("llama3-70b");
  for (double g : {m.layer.kv_heads, m.a})
    for (double s = 1024; s <= 131072; s *= 2)
      for (bool fused : {false, true})
        for (const char* name : {"baseline", "selective+sp", "full"}) {
          LayerPolicy c = parse_config(name);
          c.attention = fused ? Attention::fused : Attention::unfused;
          LlamaDims d = llama_dims(m, s, 1, 8);
          d.g = g;
          const double bytes = llama_activation_bytes(d, c);
          t.add({m.name, "8", fmt(g), fmt(s), name, fused ? "fused" : "unfused", fmt_bytes(bytes), fmt_gib(bytes)});
        }
  return t;
}


}  // namespace actbench::tables
