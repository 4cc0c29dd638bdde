// Megatron-Core's selective recompute modules, table by category: what each module set keeps
// for two presets, so a figure can show which bytes each module frees (docs/theory.md, "What
// each recompute module frees, and why").
#include <stdexcept>

#include "runners/theory_tables.hpp"
#include "theory/layer_pieces.hpp"
#include "theory/model_table.hpp"

namespace actbench::tables {

using namespace theory;

namespace {

// The paper's 22B layer at its own layout, and llama3-8b's layer at t = 8 (its preset runs
// at t = 1, where sequence parallelism splits nothing), both with SP as the paper's best.
struct RecomputeShape {
  const char* model;
  int t;
};
constexpr RecomputeShape kShapes[] = {{"22b", 8}, {"llama3-8b", 8}};

// Every subset of the modules, the empty one being no recompute; full recompute last.
std::vector<LayerPolicy> module_set_policies(Attention attention) {
  std::vector<LayerPolicy> out{{Recompute::none, true, attention, {}}};
  for (const char* list : {"core_attn", "mlp", "layernorm", "core_attn,mlp", "core_attn,layernorm", "mlp,layernorm",
                           "core_attn,mlp,layernorm"})
    out.push_back({Recompute::selective, true, attention, parse_recompute_modules(list)});
  out.push_back({Recompute::full, true, attention, {}});
  return out;
}

const ModelRow& model_row(const std::string& name) {
  for (const ModelRow& r : model_table())
    if (r.name == name) return r;
  throw std::logic_error("no preset " + name);
}

}  // namespace

Table recompute_modules_categories() {
  Table t{{"model", "arch", "hidden", "heads", "kv_heads", "ffn_hidden", "seq", "batch", "tp", "dtype", "config",
           "attention_dropout", "hidden_dropout", "attention", "recompute", "sequence_parallel", "recompute_modules",
           "category", "bytes"},
          {}};
  const Precision bf16 = precision_of("bf16");
  for (const RecomputeShape& shape : kShapes) {
    const ModelRow& m = model_row(shape.model);
    const Dims d{double(m.seq), double(m.batch), double(m.hidden), double(m.heads), double(shape.t)};
    const LayerSpec spec = preset_layer_spec(m);
    for (Attention attention : {Attention::unfused, Attention::fused})
      for (const LayerPolicy& c : module_set_policies(attention))
        for (const auto& [cat, bytes] : layer_bytes_by_category(d, spec, c, bf16))
          t.add({m.name, m.arch, fmt(d.h), fmt(d.a), fmt(spec.groups(d)), fmt(spec.ffn(d)), fmt(d.s), fmt(d.b),
                 fmt(d.t), "bf16", config_name(c), fmt(spec.attention_dropout), fmt(spec.hidden_dropout),
                 attention_name(attention), recompute_name(c.recompute), "1", recomputed_modules_text(c), cat,
                 fmt_bytes(bytes)});
  }
  return t;
}

namespace {

// The MoE presets' layers at t = 2 with SP (expert tensor parallelism 1: each rank routes its own
// s/2 rows to whole experts), balanced routing; DeepSeek-V3's with its latent attention.
constexpr RecomputeShape kMoeShapes[] = {{"mixtral-8x7b", 2}, {"qwen3-30b-a3b", 2}, {"deepseek-v3", 2}};

// No recompute, then the module sets an MoE layer reads (shared_experts only where there are
// shared experts, mla_up_proj only with latent attention), then full recompute; all with SP.
std::vector<LayerPolicy> moe_module_policies(const LayerSpec& spec, Attention attention) {
  std::vector<std::string> lists = {"core_attn", "core_attn,moe_act", "core_attn,layernorm,moe_act", "core_attn,moe",
                                    "core_attn,layernorm,moe"};
  if (spec.moe.shared_ffn_hidden > 0) lists.insert(lists.begin() + 2, "core_attn,moe_act,shared_experts");
  if (spec.mla.enabled) {
    lists.push_back("core_attn,mla_up_proj,moe_act");
    lists.push_back("core_attn,layernorm,mla_up_proj,moe");
  }
  std::vector<LayerPolicy> out{{Recompute::none, true, attention, {}}};
  for (const std::string& list : lists)
    out.push_back({Recompute::selective, true, attention, parse_recompute_modules(list)});
  out.push_back({Recompute::full, true, attention, {}});
  return out;
}

}  // namespace

Table moe_modules_categories() {
  Table t{{"model", "arch", "hidden", "heads", "kv_heads", "kv_channels", "ffn_hidden", "num_experts", "top_k",
           "moe_ffn_hidden",
           "moe_shared_ffn_hidden", "seq", "batch", "tp", "dtype", "config", "attention_dropout", "hidden_dropout",
           "attention", "recompute", "sequence_parallel", "recompute_modules", "category", "bytes"},
          {}};
  const Precision bf16 = precision_of("bf16");
  for (const RecomputeShape& shape : kMoeShapes) {
    const ModelRow& m = model_row(shape.model);
    const Dims d{double(m.seq), double(m.batch), double(m.hidden), double(m.heads), double(shape.t)};
    const LayerSpec spec = preset_layer_spec(m);
    for (Attention attention : {Attention::unfused, Attention::fused})
      for (const LayerPolicy& c : moe_module_policies(spec, attention))
        for (const auto& [cat, bytes] : layer_bytes_by_category(d, spec, c, bf16))
          t.add({m.name, m.arch, fmt(d.h), fmt(d.a), fmt(spec.groups(d)), fmt(spec.head_dim(d)), fmt(spec.ffn(d)),
                 fmt(spec.moe.num_experts),
                 fmt(spec.moe.top_k), fmt(spec.expert_ffn(d)), fmt(spec.moe.shared_ffn_hidden), fmt(d.s), fmt(d.b),
                 fmt(d.t), "bf16", config_name(c), fmt(spec.attention_dropout), fmt(spec.hidden_dropout),
                 attention_name(attention), recompute_name(c.recompute), "1", recomputed_modules_text(c), cat,
                 fmt_bytes(bytes)});
  }
  return t;
}

}  // namespace actbench::tables
