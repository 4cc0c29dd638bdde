#include "runners/layer_spec_options.hpp"

#include "runners/options.hpp"  // float32_text

namespace actbench {

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
          {"--hidden-dropout (or --dropout)", text_of(e.hidden_dropout, f32)}};
}

std::vector<std::pair<std::string, std::string>> recompute_flags_text(const RecomputeFlags& r) {
  return {{"--recompute-granularity", text_of(r.granularity, recompute_name)},
          {"--sequence-parallel", r.sequence_parallel ? "1" : ""},
          {"--recompute-modules", text_of(r.modules, recompute_modules_name)},
          {"--recompute-method", recompute_method_name(r.stack.method)},
          {"--recompute-num-layers", std::to_string(r.stack.num_layers)}};
}

}  // namespace actbench
