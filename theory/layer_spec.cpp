#include "theory/layer_spec.hpp"

#include <cmath>
#include <cstdio>
#include <utility>

#include "runtime/error.hpp"  // InvalidArgument: header only
#include "theory/model_table.hpp"

namespace actbench::theory {

LayerSpec gpt_layer_spec() { return LayerSpec{}; }

LayerSpec llama_layer_spec(double kv_heads, double ffn_hidden, double rope_theta, double norm_epsilon) {
  LayerSpec spec;
  spec.normalization = Norm::rmsnorm;
  spec.norm_epsilon = norm_epsilon;
  spec.activation = Activation::swiglu;
  spec.ffn_hidden = ffn_hidden;
  spec.add_bias_linear = false;
  spec.kv_heads = kv_heads;
  spec.position = PositionEmbedding::rope;
  spec.rotary_base = rope_theta;
  spec.attention_dropout = 0;
  spec.hidden_dropout = 0;
  return spec;
}

namespace {

// An MoE preset's experts and latent attention (model_table.hpp's rows).
void add_experts(const ModelRow& row, LayerSpec& spec) {
  const ExpertsRow& e = row.moe;
  MoeSpec& m = spec.moe;
  m.num_experts = double(e.experts), m.top_k = double(e.top_k);
  m.ffn_hidden = double(e.ffn_hidden), m.shared_ffn_hidden = double(e.shared_ffn_hidden);
  m.score = e.sigmoid ? MoeScore::sigmoid : MoeScore::softmax;
  m.pre_softmax = !e.sigmoid && !e.normalized;
  m.scaling = e.scaling;
  m.num_groups = double(e.groups), m.group_top_k = double(e.group_top_k);
  m.expert_bias = e.expert_bias;
  if (row.mla.kv_lora_rank == 0) return;
  const LatentRow& l = row.mla;
  spec.mla = {true, double(l.q_lora_rank), double(l.kv_lora_rank), double(l.qk_head_dim), double(l.qk_pos_emb_head_dim),
              double(l.v_head_dim)};
}

}  // namespace

LayerSpec preset_layer_spec(const ModelRow& row) {
  if (row.arch != "llama" && row.arch != "moe") return gpt_layer_spec();
  LayerSpec spec = llama_layer_spec(double(row.kv_heads), double(row.ffn_hidden), row.rope_theta > 0 ? row.rope_theta : 10000,
                                    row.arch == "moe" ? row.norm_epsilon : 1e-5);
  if (row.arch != "moe") return spec;
  spec.kv_channels = double(row.head_dim);
  spec.qk_layernorm = row.qk_norm;
  add_experts(row, spec);
  return spec;
}

namespace {

bool divides(double divisor, double n) { return divisor > 0 && std::fmod(n, divisor) == 0; }

std::string number(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", x);
  return text;
}

}  // namespace

void require(bool ok, const std::string& what) {
  if (!ok) throw InvalidArgument(what);
}

void check_layer_spec(const Dims& d, const LayerSpec& spec) {
  const double g = spec.groups(d);
  const std::string heads = " the heads (" + number(d.a) + ")";
  require(spec.kv_heads >= 0 && divides(g, d.a), "num-query-groups " + number(g) + " must divide" + heads);
  require(divides(d.t, d.a) && divides(d.t, g), "the tensor-parallel size " + number(d.t) + " must divide" + heads +
                                                    " and the query groups (" + number(g) + ")");
  require(spec.ffn_hidden >= 0, "ffn-hidden-size must not be negative");
  require(std::isfinite(spec.kv_channels) && spec.kv_channels >= 0 && std::floor(spec.kv_channels) == spec.kv_channels,
          "kv-channels " + number(spec.kv_channels) + " must be a whole number of channels per head, or 0 for hidden / heads");
  require(spec.norm_epsilon > 0, "norm-epsilon must be above 0");
  require(spec.attention_dropout >= 0 && spec.attention_dropout < 1, "attention-dropout must lie in [0, 1)");
  require(spec.hidden_dropout >= 0 && spec.hidden_dropout < 1, "hidden-dropout must lie in [0, 1)");
  require(spec.rotary_percent > 0 && spec.rotary_percent <= 1, "rotary-percent must lie in (0, 1]");
  if (spec.moe.enabled()) check_moe_spec(spec.moe);
  if (spec.mla.enabled) check_mla_spec(spec);
}

void check_mla_spec(const LayerSpec& spec) {
  auto whole = [](double v) { return std::isfinite(v) && std::floor(v) == v; };
  const MlaSpec& m = spec.mla;
  require(whole(m.q_lora_rank) && m.q_lora_rank >= 0, "q-lora-rank " + number(m.q_lora_rank) +
                                                          " must be a whole number >= 0 (0: q projected directly)");
  require(whole(m.kv_lora_rank) && m.kv_lora_rank > 0, "kv-lora-rank " + number(m.kv_lora_rank) + " must be a whole number above 0");
  const std::pair<double, const char*> dims[] = {
      {m.qk_head_dim, "qk-head-dim"}, {m.qk_pos_emb_head_dim, "qk-pos-emb-head-dim"}, {m.v_head_dim, "v-head-dim"}};
  for (const auto& [value, flag] : dims)
    require(whole(value) && value > 0, std::string(flag) + " " + number(value) + " must be a whole number above 0");
  // MLA's own norms are the two latent norms; a per-head q/k norm has no place in it.
  require(!spec.qk_layernorm, "qk-layernorm (a norm over each head of q and k) does not apply to multi-latent attention, "
                              "whose q and kv latent norms are always on");
}

void check_moe_spec(const MoeSpec& m) {
  auto whole = [](double v) { return std::isfinite(v) && std::floor(v) == v; };
  const double e = m.num_experts, k = m.top_k;
  require(whole(e) && e >= 1, "num-experts " + number(e) + " must be a whole number of experts");
  require(whole(k) && k >= 1 && k <= e, "moe-router-topk " + number(k) + " must lie in [1, num-experts]");
  require(whole(m.ffn_hidden) && m.ffn_hidden >= 0, "moe-ffn-hidden-size must be a whole number >= 0");
  require(whole(m.shared_ffn_hidden) && m.shared_ffn_hidden >= 0,
          "moe-shared-expert-intermediate-size must be a whole number >= 0");
  require(std::isfinite(m.scaling) && m.scaling > 0, "moe-router-topk-scaling-factor must be above 0");
  require(std::isfinite(m.capacity_factor) && m.capacity_factor >= 0,
          "moe-expert-capacity-factor must be above 0 (or 0: dropless)");
  if (m.num_groups > 0) {
    const double g = m.num_groups;
    require(whole(g) && divides(g, e), "moe-router-num-groups " + number(g) + " must divide num-experts");
    require(whole(m.group_top_k) && m.group_top_k >= 1 && m.group_top_k <= g,
            "moe-router-group-topk must lie in [1, moe-router-num-groups]");
    require(m.group_top_k * (e / g) >= k, "moe-router-group-topk's groups hold fewer experts than moe-router-topk");
  }
}

const char* moe_score_name(MoeScore s) { return s == MoeScore::sigmoid ? "sigmoid" : "softmax"; }

MoeScore parse_moe_score(const std::string& name) {
  if (name == "softmax") return MoeScore::softmax;
  if (name == "sigmoid") return MoeScore::sigmoid;
  throw InvalidArgument("unknown moe-router-score-function '" + name + "' (expected softmax or sigmoid)");
}

const char* norm_name(Norm n) { return n == Norm::rmsnorm ? "RMSNorm" : "LayerNorm"; }

const char* activation_name(Activation a) {
  switch (a) {
    case Activation::gelu: return "gelu";
    case Activation::swiglu: return "swiglu";
    case Activation::squared_relu: return "squared_relu";
  }
  return "?";
}

const char* position_name(PositionEmbedding p) { return p == PositionEmbedding::rope ? "rope" : "none"; }

Norm parse_norm(const std::string& name) {
  if (name == "LayerNorm") return Norm::layernorm;
  if (name == "RMSNorm") return Norm::rmsnorm;
  throw InvalidArgument("unknown normalization '" + name + "' (expected LayerNorm or RMSNorm)");
}

PositionEmbedding parse_position(const std::string& name) {
  if (name == "rope") return PositionEmbedding::rope;
  if (name == "none" || name == "learned_absolute") return PositionEmbedding::none;
  throw InvalidArgument("unknown position embedding type '" + name + "' (expected rope, learned_absolute or none)");
}

}  // namespace actbench::theory
