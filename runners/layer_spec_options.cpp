#include "runners/layer_spec_options.hpp"

#include "runners/options.hpp"  // float32_text
#include "runtime/error.hpp"

namespace actbench {

bool LayerSpecEdits::edits_experts() const {
  return moe_topk || moe_ffn_hidden || moe_shared_ffn_hidden || moe_num_groups || moe_group_topk || moe_score ||
         moe_scaling || moe_capacity_factor || moe_pre_softmax || moe_expert_bias;
}

bool LayerSpecEdits::edits_latent_attention() const {
  return q_lora_rank || kv_lora_rank || qk_head_dim || qk_pos_emb_head_dim || v_head_dim;
}

namespace {

void apply_moe_edits(const LayerSpecEdits& e, theory::MoeSpec& m) {
  if (e.num_experts) m.num_experts = static_cast<double>(*e.num_experts);
  if (!m.enabled()) {
    if (e.edits_experts()) throw InvalidArgument("the --moe-* flags need a mixture of experts: add --num-experts E");
    return;
  }
  auto set = [](const std::optional<int64_t>& v, double& field) {
    if (v) field = static_cast<double>(*v);
  };
  set(e.moe_topk, m.top_k);
  set(e.moe_ffn_hidden, m.ffn_hidden);
  set(e.moe_shared_ffn_hidden, m.shared_ffn_hidden);
  set(e.moe_num_groups, m.num_groups);
  set(e.moe_group_topk, m.group_top_k);
  if (e.moe_score) m.score = *e.moe_score;
  if (e.moe_scaling) m.scaling = *e.moe_scaling;
  if (e.moe_capacity_factor) m.capacity_factor = *e.moe_capacity_factor;
  if (e.moe_pre_softmax) m.pre_softmax = true;
  if (e.moe_expert_bias) m.expert_bias = true;
}

void apply_mla_edits(const LayerSpecEdits& e, theory::MlaSpec& m) {
  if (e.multi_latent_attention && !m.enabled) {
    m = {};
    m.enabled = true;
    m.kv_lora_rank = 32;  // Megatron-LM's --kv-lora-rank default
  }
  if (!m.enabled) {
    if (e.edits_latent_attention())
      throw InvalidArgument("--q-lora-rank, --kv-lora-rank and the head widths need --multi-latent-attention");
    return;
  }
  for (const auto& [v, field] : {std::pair{&e.q_lora_rank, &m.q_lora_rank}, std::pair{&e.kv_lora_rank, &m.kv_lora_rank},
                                 std::pair{&e.qk_head_dim, &m.qk_head_dim},
                                 std::pair{&e.qk_pos_emb_head_dim, &m.qk_pos_emb_head_dim},
                                 std::pair{&e.v_head_dim, &m.v_head_dim}})
    if (*v) *field = static_cast<double>(**v);
}

}  // namespace

void apply_layer_spec_edits(const LayerSpecEdits& e, theory::LayerSpec& spec) {
  if (e.normalization) spec.normalization = *e.normalization;
  if (e.norm_epsilon) spec.norm_epsilon = *e.norm_epsilon;
  if (e.qk_layernorm) spec.qk_layernorm = true;
  if (e.activation) spec.activation = *e.activation;
  if (e.ffn_hidden) spec.ffn_hidden = static_cast<double>(*e.ffn_hidden);
  if (e.disable_bias_linear) spec.add_bias_linear = false;
  if (e.add_qkv_bias) spec.add_qkv_bias = true;
  if (e.kv_heads) spec.kv_heads = static_cast<double>(*e.kv_heads);
  if (e.kv_channels) spec.kv_channels = static_cast<double>(*e.kv_channels);
  if (e.position) spec.position = *e.position;
  if (e.rotary_percent) spec.rotary_percent = *e.rotary_percent;
  if (e.rotary_base) spec.rotary_base = *e.rotary_base;
  if (e.attention_dropout) spec.attention_dropout = *e.attention_dropout;
  if (e.hidden_dropout) spec.hidden_dropout = *e.hidden_dropout;
  apply_moe_edits(e, spec.moe);
  apply_mla_edits(e, spec.mla);
}

namespace {

template <class T, class F>
std::string text_of(const std::optional<T>& v, F name) {
  return v ? name(*v) : "";
}
std::string exact(double v) {
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", v);
  return text;
}

}  // namespace

// Each edit under the flag names a user may have typed for it (an error names them all).
std::vector<std::pair<std::string, std::string>> layer_spec_edits_text(const LayerSpecEdits& e) {
  auto i64 = [](int64_t v) { return std::to_string(v); };
  auto f32 = [](float v) { return float32_text(v); };
  return {{"--normalization", text_of(e.normalization, theory::norm_name)},
          {"--norm-epsilon (or --norm-eps)", text_of(e.norm_epsilon, exact)},
          {"--qk-layernorm", e.qk_layernorm ? "1" : ""},
          {"--swiglu/--squared-relu", text_of(e.activation, theory::activation_name)},
          {"--ffn-hidden-size (or --ffn-hidden)", text_of(e.ffn_hidden, i64)},
          {"--disable-bias-linear", e.disable_bias_linear ? "1" : ""},
          {"--add-qkv-bias", e.add_qkv_bias ? "1" : ""},
          {"--num-query-groups (or --kv-heads)", text_of(e.kv_heads, i64)},
          {"--kv-channels", text_of(e.kv_channels, i64)},
          {"--position-embedding-type", text_of(e.position, theory::position_name)},
          {"--rotary-percent", text_of(e.rotary_percent, exact)},
          {"--rotary-base (or --rope-theta)", text_of(e.rotary_base, exact)},
          {"--attention-dropout (or --dropout)", text_of(e.attention_dropout, f32)},
          {"--hidden-dropout (or --dropout)", text_of(e.hidden_dropout, f32)},
          {"--num-experts", text_of(e.num_experts, i64)},
          {"--moe-router-topk", text_of(e.moe_topk, i64)},
          {"--moe-ffn-hidden-size", text_of(e.moe_ffn_hidden, i64)},
          {"--moe-shared-expert-intermediate-size", text_of(e.moe_shared_ffn_hidden, i64)},
          {"--moe-router-num-groups", text_of(e.moe_num_groups, i64)},
          {"--moe-router-group-topk", text_of(e.moe_group_topk, i64)},
          {"--moe-router-score-function", text_of(e.moe_score, theory::moe_score_name)},
          {"--moe-router-topk-scaling-factor", text_of(e.moe_scaling, exact)},
          {"--moe-expert-capacity-factor", text_of(e.moe_capacity_factor, exact)},
          {"--moe-router-pre-softmax", e.moe_pre_softmax ? "1" : ""},
          {"--moe-router-enable-expert-bias", e.moe_expert_bias ? "1" : ""},
          {"--multi-latent-attention", e.multi_latent_attention ? "1" : ""},
          {"--q-lora-rank", text_of(e.q_lora_rank, i64)},
          {"--kv-lora-rank", text_of(e.kv_lora_rank, i64)},
          {"--qk-head-dim", text_of(e.qk_head_dim, i64)},
          {"--qk-pos-emb-head-dim", text_of(e.qk_pos_emb_head_dim, i64)},
          {"--v-head-dim", text_of(e.v_head_dim, i64)}};
}

std::vector<std::pair<std::string, std::string>> recompute_flags_text(const RecomputeFlags& r) {
  return {{"--recompute-granularity", text_of(r.granularity, recompute_name)},
          {"--sequence-parallel", r.sequence_parallel ? "1" : ""},
          {"--recompute-modules", text_of(r.modules, recompute_modules_name)},
          {"--recompute-method", recompute_method_name(r.stack.method)},
          {"--recompute-num-layers", std::to_string(r.stack.num_layers)}};
}

}  // namespace actbench
