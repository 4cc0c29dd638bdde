#include "theory/layer_spec.hpp"

#include <cmath>
#include <cstdio>

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

LayerSpec preset_layer_spec(const ModelRow& row) {
  if (row.arch != "llama") return gpt_layer_spec();
  return llama_layer_spec(double(row.kv_heads), double(row.ffn_hidden), row.rope_theta > 0 ? row.rope_theta : 10000);
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
