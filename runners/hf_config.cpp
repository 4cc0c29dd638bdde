#include "runners/hf_config.hpp"

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "runtime/error.hpp"
#include "runtime/user_file.hpp"

namespace actbench {
namespace {

using json = nlohmann::json;

// What one family's transformers model builds where its config.json has no key for it.
struct Family {
  const char* type;        // model_type
  bool tied;               // tie_word_embeddings when absent: the config class's default
  const char* activation;  // hidden_act when absent
  bool qkv_bias;           // q, k and v always carry biases, o_proj and the MLP never (Qwen2)
  bool qk_norm;            // an RMSNorm over each head of q and of k, before RoPE (Qwen3)
  bool window_switch;      // "sliding_window" is in effect only with "use_sliding_window": true
};

// transformers' LlamaConfig, MistralConfig, Qwen2Config and Qwen3Config default
// tie_word_embeddings to false, GemmaConfig to true (save_pretrained writes the key only where
// it differs from PretrainedConfig's true, so a Gemma config usually lacks it); GemmaConfig's
// activation defaults to gelu_pytorch_tanh, the others' to silu. Mistral applies its
// sliding_window whenever it is set; Qwen2 and Qwen3 only under use_sliding_window.
const Family kFamilies[] = {
    {"llama", false, "silu", false, false, false},  {"mistral", false, "silu", false, false, false},
    {"qwen2", false, "silu", true, false, true},    {"qwen3", false, "silu", false, true, true},
    {"gemma", true, "gelu_pytorch_tanh", false, false, false},
};

// Keys of a layer the dense spec cannot express, in any family (read before model_type, so
// that an MoE model is refused for its experts): set unless absent, null or 0.
const std::pair<const char*, const char*> kRefusedKeys[] = {
    {"num_local_experts", "a mixture of experts"},
    {"num_experts", "a mixture of experts"},
    {"n_routed_experts", "a mixture of experts"},
    {"num_experts_per_tok", "a mixture of experts"},
    {"moe_intermediate_size", "a mixture of experts"},
    {"n_shared_experts", "a mixture of experts"},
    {"shared_expert_intermediate_size", "a mixture of experts"},
    {"kv_lora_rank", "multi-head latent attention"},
    {"q_lora_rank", "multi-head latent attention"},
    {"attn_logit_softcapping", "tanh soft-capping of the attention scores"},
    {"final_logit_softcapping", "tanh soft-capping of the output logits"},
    {"sliding_window_pattern", "local attention in some layers"},
};

// A value or message as it may appear in one error line: printable ASCII, and short (a config
// can hold a megabyte-long list where a number belongs).
std::string printable(const std::string& text) {
  constexpr size_t kMaxShown = 60;
  std::string out;
  for (char c : text.substr(0, kMaxShown)) out += c >= 0x20 && c < 0x7f ? c : '?';
  return text.size() > kMaxShown ? out + "..." : out;
}

// One config.json's keys (or one object inside it, its keys named "object.key"), each taken
// with its type and bounds checked; every refusal is one line naming the file and the key.
class ConfigKeys {
 public:
  ConfigKeys(const std::string& path, json j, std::string prefix = "")
      : path_(path), j_(std::move(j)), prefix_(std::move(prefix)) {}

  [[noreturn]] void fail(const std::string& problem) const {
    throw InvalidArgument("--hf-config " + path_ + ": " + problem);
  }
  [[noreturn]] void fail(const char* key, const std::string& problem) const {
    fail("\"" + prefix_ + key + "\" " + problem);
  }

  // The key's value; nullptr when it is absent or null (the model's default).
  const json* find(const char* key) const {
    const auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  bool has(const char* key) const { return find(key) != nullptr; }
  // The value as an error line shows it.
  std::string shown(const char* key) const { return printable(find(key)->dump()); }

  // An integer in 1..max; `fallback` when absent (< 1: the key is required).
  int64_t integer(const char* key, int64_t max, int64_t fallback = 0) const {
    const json* v = find(key);
    if (!v) {
      if (fallback < 1) fail(key, "is missing");
      return fallback;
    }
    if (!v->is_number_integer()) fail(key, "must be an integer, got " + shown(key));
    // nlohmann keeps a non-negative integer unsigned, a negative one signed.
    if (!v->is_number_unsigned() || v->get<uint64_t>() < 1 || v->get<uint64_t>() > static_cast<uint64_t>(max))
      fail(key, "must be in 1.." + std::to_string(max) + ", got " + shown(key));
    return v->get<int64_t>();
  }

  // A number in [min, max]; `fallback` when absent.
  double real(const char* key, double min, double max, double fallback) const {
    const double x = number(key, fallback);
    if (!(x >= min && x <= max)) fail(key, "must be in " + real_range_text(min, max) + ", got " + shown(key));
    return x;
  }

  // A share in (0, 1]; `fallback` when absent.
  double fraction(const char* key, double fallback) const {
    const double x = number(key, fallback);
    if (!(x > 0 && x <= 1)) fail(key, "must be in (0, 1], got " + shown(key));
    return x;
  }

  // A probability in [0, 1), also as the float32 the layer draws with; 0 when absent.
  double probability(const char* key) const {
    const double p = number(key, 0.0);
    if (!(p >= 0 && static_cast<float>(p) < 1.f)) fail(key, "must be in [0, 1), got " + shown(key));
    return p;
  }

  // A string; `fallback` when absent.
  std::string text(const char* key, const std::string& fallback) const {
    const json* v = find(key);
    if (!v) return fallback;
    if (!v->is_string()) fail(key, "must be a string, got " + shown(key));
    return v->get<std::string>();
  }

  // true or false; `fallback` when absent.
  bool boolean(const char* key, bool fallback = false) const {
    const json* v = find(key);
    if (!v) return fallback;
    if (!v->is_boolean()) fail(key, "must be true or false, got " + shown(key));
    return v->get<bool>();
  }

  // The keys of an object (empty when absent).
  ConfigKeys object(const char* key) const {
    const json* v = find(key);
    if (v && !v->is_object()) fail(key, "must be an object or null, got " + shown(key));
    return ConfigKeys(path_, v ? *v : json::object(), prefix_ + key + ".");
  }

 private:
  double number(const char* key, double fallback) const {
    const json* v = find(key);
    if (!v) return fallback;
    if (!v->is_number()) fail(key, "must be a number, got " + shown(key));
    return v->get<double>();
  }

  std::string path_;
  json j_;
  std::string prefix_;
};

json parse_json(const std::string& path) {
  const std::string text = read_user_file("--hf-config " + path, path);
  try {
    json j = json::parse(text);
    if (!j.is_object()) throw InvalidArgument("--hf-config " + path + ": not a JSON object");
    return j;
  } catch (const json::exception& e) {
    throw InvalidArgument("--hf-config " + path + ": not valid JSON (" + printable(e.what()) + ")");
  }
}

// Experts, latent attention, soft-capping: refused whatever the family.
void refuse_other_layers(const ConfigKeys& keys) {
  for (const auto& [key, what] : kRefusedKeys)
    if (const json* v = keys.find(key); v && !(v->is_number() && v->get<double>() == 0))
      keys.fail(key, "is " + keys.shown(key) + ": " + what + ", which the dense layer spec does not express");
}

// model_type: one of the families read (it also names the model in the CSV's model column).
const Family& family_of(const ConfigKeys& keys) {
  const char* const key = "model_type";
  const std::string type = keys.text(key, "");
  for (const Family& f : kFamilies)
    if (type == f.type) return f;
  std::string read;
  for (const Family& f : kFamilies) read += std::string(read.empty() ? "" : ", ") + f.type;
  keys.fail(key, (keys.has(key) ? "is " + keys.shown(key) : std::string("is missing")) +
                     ": --hf-config reads the dense families " + read);
}

// "model_type:folder" (or "model_type:file" for a file with no folder).
std::string model_name(const Family& f, const std::string& path) {
  const std::filesystem::path p(path);
  const std::string folder = p.parent_path().filename().string();
  return std::string(f.type) + ":" + (folder.empty() ? p.filename().string() : folder);
}

// The activation of the gated MLP: SiLU (SwiGLU) is the only one the spec gates with. Gemma's
// transformers model reads hidden_activation, the others hidden_act: both must say SiLU.
void check_activation(const ConfigKeys& keys, const Family& f) {
  bool given = false;
  for (const char* key : {"hidden_activation", "hidden_act"}) {
    if (!keys.has(key)) continue;
    given = true;
    const std::string act = keys.text(key, "");
    if (act != "silu" && act != "swish")
      keys.fail(key, "is \"" + printable(act) + "\": the layer spec's gated MLP is SwiGLU (silu) alone");
  }
  if (!given && std::string(f.activation) != "silu")
    keys.fail("hidden_act", std::string("is missing: a ") + f.type + " model then uses " + f.activation +
                                ", and the layer spec's gated MLP is SwiGLU (silu) alone");
}

// Attention over a window of the last tokens in some or all layers (Mistral v0.1, Qwen2 with
// use_sliding_window, layer_types other than full attention).
void refuse_sliding_windows(const ConfigKeys& keys, const Family& f) {
  const char* const key = "sliding_window";
  if (const json* w = keys.find(key); w && !(w->is_number() && w->get<double>() == 0)) {
    const std::string window = "attention over the last " + keys.shown(key) + " tokens only";
    const std::string unexpressed = ", which the layer spec does not express";
    if (!f.window_switch) keys.fail(key, "is " + keys.shown(key) + ": " + window + unexpressed);
    if (keys.boolean("use_sliding_window"))
      keys.fail("use_sliding_window", "is true: " + window + " (\"sliding_window\")" + unexpressed);
  }
  if (const json* types = keys.find("layer_types")) {
    if (!types->is_array()) keys.fail("layer_types", "must be a list, got " + keys.shown("layer_types"));
    for (const json& t : *types)
      if (t != "full_attention")
        keys.fail("layer_types", "holds " + printable(t.dump()) + ": the layer spec expresses full attention alone");
  }
}

// Megatron biases every linear (add_bias_linear) or QKV alone (add_qkv_bias); transformers'
// attention_bias biases q, k, v and o_proj, mlp_bias the MLP's three, and Qwen2 q, k, v always.
void set_biases(const ConfigKeys& keys, const Family& f, theory::LayerSpec& s) {
  const bool attention = keys.boolean("attention_bias"), mlp = keys.boolean("mlp_bias");
  s.add_bias_linear = attention && mlp;
  s.add_qkv_bias = f.qkv_bias && !s.add_bias_linear;
  if (attention && !mlp)
    keys.fail("attention_bias", "is true: biases on q, k, v and o_proj but not on the MLP, which the layer spec does "
                                "not express (it biases QKV alone or every linear)");
  if (mlp && !attention)
    keys.fail("mlp_bias", "is true: biases on the MLP but not on attention, which the layer spec does not express");
}

// A RoPE key at the top (transformers 4) or inside rope_parameters (transformers 5).
ConfigKeys rope_key_holder(const ConfigKeys& keys, const char* key) {
  const ConfigKeys nested = keys.object("rope_parameters");
  return keys.has(key) || !nested.has(key) ? keys : nested;
}

// head_dim: the spec's kv_channels where it is not h/a (Qwen3-0.6B: 128 at h 1024, a 16); 0
// (h/a) otherwise. Without head_dim the heads must split h evenly.
double kv_channels(const ConfigKeys& keys, int64_t h, int64_t a) {
  if (!keys.has("head_dim")) {
    if (h % a != 0) keys.fail("hidden_size is not divisible by num_attention_heads (and there is no head_dim)");
    return 0;
  }
  const int64_t d = keys.integer("head_dim", kMaxModelWidth);
  return d * a == h ? 0 : static_cast<double>(d);
}

void read_shape(const ConfigKeys& keys, const Family& f, theory::TransformerModel& m) {
  m.h = static_cast<double>(keys.integer("hidden_size", kMaxModelWidth));
  m.a = static_cast<double>(keys.integer("num_attention_heads", kMaxModelWidth));
  m.L = static_cast<double>(keys.integer("num_hidden_layers", kMaxModelLayers));
  m.vocab = static_cast<double>(keys.integer("vocab_size", kMaxVocab));
  // vocab_divisible_by stays Megatron's default (128): a run pads the embedding to a multiple
  // of 128·t; theory memory --make-vocab-size-divisible-by 1 keeps the config's rows.
  m.seq = m.max_positions = static_cast<double>(keys.integer("max_position_embeddings", kMaxPositions, 2048));
  m.learned_positions = false;
  m.tied_embeddings = keys.boolean("tie_word_embeddings", f.tied);
}

theory::LayerSpec read_layer(const ConfigKeys& keys, const Family& f, const theory::TransformerModel& m) {
  const auto h = static_cast<int64_t>(m.h), a = static_cast<int64_t>(m.a);
  const int64_t g = keys.integer("num_key_value_heads", kMaxModelWidth, a);
  if (g > a || a % g != 0) keys.fail("num_key_value_heads must divide num_attention_heads");
  const double ffn = static_cast<double>(keys.integer("intermediate_size", kMaxModelWidth));
  const double eps = keys.real("rms_norm_eps", kMinNormEps, kMaxNormEps, 1e-5);
  const double theta = rope_key_holder(keys, "rope_theta").real("rope_theta", kMinRopeTheta, kMaxRopeTheta, 10000.0);
  theory::LayerSpec s = theory::llama_layer_spec(static_cast<double>(g), ffn, theta, eps);  // RMSNorm, RoPE, SwiGLU
  keys.object("rope_scaling");  // Llama 3.1's, YaRN, linear: it changes no byte, so any kind is read
  s.rotary_percent = rope_key_holder(keys, "partial_rotary_factor").fraction("partial_rotary_factor", 1.0);
  s.kv_channels = kv_channels(keys, h, a);
  s.qk_layernorm = f.qk_norm;
  s.attention_dropout = keys.probability("attention_dropout");
  s.hidden_dropout = 0;
  set_biases(keys, f, s);
  check_activation(keys, f);
  refuse_sliding_windows(keys, f);
  return s;
}

}  // namespace

std::string real_range_text(double min, double max) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g..%g", min, max);
  return buf;
}

HfModelConfig read_hf_config(const std::string& path) {
  const ConfigKeys keys(path, parse_json(path));
  refuse_other_layers(keys);
  const Family& family = family_of(keys);
  HfModelConfig c;
  c.model.name = model_name(family, path);
  read_shape(keys, family, c.model);
  c.model.layer = read_layer(keys, family, c.model);
  return c;
}

}  // namespace actbench
