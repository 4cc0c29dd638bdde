#include "runners/hf_config.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <vector>
#include <nlohmann/json.hpp>

#include "runtime/error.hpp"
#include "runtime/user_file.hpp"

namespace actbench {
namespace {

using json = nlohmann::json;

// Where a family's experts come from (kNone: a dense family).
enum class Experts { none, mixtral, qwen, deepseek };

// What one family's transformers model builds where its config.json has no key for it.
struct Family {
  const char* type;        // model_type
  bool tied;               // tie_word_embeddings when absent: the config class's default
  const char* activation;  // hidden_act when absent
  bool qkv_bias;           // q, k and v always carry biases, o_proj and the MLP never (Qwen2)
  bool qk_norm;            // an RMSNorm over each head of q and of k, before RoPE (Qwen3)
  bool window_switch;      // "sliding_window" is in effect only with "use_sliding_window": true
  Experts experts = Experts::none;
  bool shared_expert = false;  // qwen: shared_expert_intermediate_size (Qwen2-MoE's, not Qwen3-MoE's)
  bool norm_topk = false;      // norm_topk_prob when absent
};

// transformers' LlamaConfig, MistralConfig, Qwen2Config and Qwen3Config default
// tie_word_embeddings to false, GemmaConfig to true (save_pretrained writes the key only where
// it differs from PretrainedConfig's true, so a Gemma config usually lacks it); GemmaConfig's
// activation defaults to gelu_pytorch_tanh, the others' to silu. Mistral and Mixtral apply
// their sliding_window whenever it is set; the Qwen families only under use_sliding_window.
// Qwen2MoeConfig and Qwen3MoeConfig default norm_topk_prob to false, DeepseekV3Config to true.
const Family kFamilies[] = {
    {"llama", false, "silu", false, false, false},  {"mistral", false, "silu", false, false, false},
    {"qwen2", false, "silu", true, false, true},    {"qwen3", false, "silu", false, true, true},
    {"gemma", true, "gelu_pytorch_tanh", false, false, false},
    {"mixtral", false, "silu", false, false, false, Experts::mixtral},
    {"qwen2_moe", false, "silu", true, false, true, Experts::qwen, true},
    {"qwen3_moe", false, "silu", false, true, true, Experts::qwen},
    {"deepseek_v3", false, "silu", false, false, false, Experts::deepseek, false, true},
};

// Keys of experts and of latent attention: refused in a family that does not build them (set
// unless absent, null or 0).
const std::pair<const char*, const char*> kExpertKeys[] = {
    {"num_local_experts", "a mixture of experts"},
    {"num_experts", "a mixture of experts"},
    {"n_routed_experts", "a mixture of experts"},
    {"num_experts_per_tok", "a mixture of experts"},
    {"moe_intermediate_size", "a mixture of experts"},
    {"n_shared_experts", "a mixture of experts"},
    {"shared_expert_intermediate_size", "a mixture of experts"},
};
const std::pair<const char*, const char*> kLatentKeys[] = {
    {"kv_lora_rank", "multi-head latent attention"},
    {"q_lora_rank", "multi-head latent attention"},
};
// Keys of a layer the spec cannot express, in any family.
const std::pair<const char*, const char*> kRefusedKeys[] = {
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

  // A whole number in 0..max; `fallback` when absent.
  int64_t count(const char* key, int64_t max, int64_t fallback) const {
    const json* v = find(key);
    if (!v) return fallback;
    if (!v->is_number_unsigned() || v->get<uint64_t>() > static_cast<uint64_t>(max))
      fail(key, "must be an integer in 0.." + std::to_string(max) + ", got " + shown(key));
    return v->get<int64_t>();
  }

  // A list of whole numbers in 0..max (empty when absent).
  std::vector<int64_t> counts(const char* key, int64_t max) const {
    const json* v = find(key);
    std::vector<int64_t> out;
    if (!v) return out;
    if (!v->is_array()) fail(key, "must be a list, got " + shown(key));
    for (const json& x : *v) {
      if (!x.is_number_unsigned() || x.get<uint64_t>() > static_cast<uint64_t>(max))
        fail(key, "must hold integers in 0.." + std::to_string(max) + ", got " + printable(x.dump()));
      out.push_back(x.get<int64_t>());
    }
    return out;
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

// Experts and latent attention outside the families that build them, soft-capping anywhere.
template <size_t N>
void refuse_keys(const ConfigKeys& keys, const std::pair<const char*, const char*> (&list)[N], const std::string& why) {
  for (const auto& [key, what] : list)
    if (const json* v = keys.find(key); v && !(v->is_number() && v->get<double>() == 0))
      keys.fail(key, "is " + keys.shown(key) + ": " + what + why);
}

void refuse_other_layers(const ConfigKeys& keys, const Family& f) {
  const std::string family = std::string(", which a ") + f.type + " model does not build";
  if (f.experts == Experts::none) refuse_keys(keys, kExpertKeys, family);
  if (f.experts != Experts::deepseek) refuse_keys(keys, kLatentKeys, family);
  refuse_keys(keys, kRefusedKeys, ", which the layer spec does not express");
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
                     ": --hf-config reads the families " + read);
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
  // Latent attention's heads are its own keys' widths (read_latent_attention), not head_dim.
  if (f.experts != Experts::deepseek) s.kv_channels = kv_channels(keys, h, a);
  s.qk_layernorm = f.qk_norm;
  s.attention_dropout = keys.probability("attention_dropout");
  s.hidden_dropout = 0;
  set_biases(keys, f, s);
  check_activation(keys, f);
  refuse_sliding_windows(keys, f);
  return s;
}

// "every layer" (the canonical empty list) when no layer is dense.
std::vector<bool> moe_pattern(std::vector<bool> moe) {
  for (bool b : moe)
    if (!b) return moe;
  return {};
}

// Qwen2-MoE and Qwen3-MoE: layer i is MoE unless it is in mlp_only_layers, and when
// decoder_sparse_step divides i + 1.
std::vector<bool> qwen_moe_layers(const ConfigKeys& keys, int layers) {
  const int64_t step = keys.integer("decoder_sparse_step", layers, 1);
  std::vector<bool> moe(layers);
  for (int i = 0; i < layers; ++i) moe[i] = (i + 1) % step == 0;
  for (int64_t i : keys.counts("mlp_only_layers", layers - 1)) moe[i] = false;
  return moe_pattern(moe);
}

// DeepSeek-V3: the first first_k_dense_replace layers dense, then every moe_layer_freq-th MoE.
std::vector<bool> deepseek_moe_layers(const ConfigKeys& keys, int layers) {
  const int64_t dense = keys.count("first_k_dense_replace", layers, 3);
  const int64_t freq = keys.integer("moe_layer_freq", layers, 1);
  std::vector<bool> moe(layers);
  for (int i = 0; i < layers; ++i) moe[i] = i >= dense && i % freq == 0;
  return moe_pattern(moe);
}

// DeepSeek-V3's router: sigmoid or softmax scores, routed_scaling_factor, device-limited
// groups, and topk_method noaux_tc's score bias (e_score_correction_bias).
void read_deepseek_router(const ConfigKeys& keys, theory::MoeSpec& e) {
  const std::string score = keys.text("scoring_func", "sigmoid");
  if (score != "sigmoid" && score != "softmax")
    keys.fail("scoring_func", "is \"" + printable(score) + "\": the router scores with softmax or sigmoid");
  e.score = theory::parse_moe_score(score);
  e.scaling = keys.real("routed_scaling_factor", 1e-6, 1e6, 2.5);
  e.num_groups = static_cast<double>(keys.integer("n_group", static_cast<int64_t>(e.num_experts), 8));
  e.group_top_k = static_cast<double>(keys.integer("topk_group", static_cast<int64_t>(e.num_groups), 4));
  if (std::fmod(e.num_experts, e.num_groups) != 0) keys.fail("n_group", "must divide n_routed_experts");
  if (e.group_top_k * (e.num_experts / e.num_groups) < e.top_k)
    keys.fail("topk_group", "leaves fewer experts than num_experts_per_tok in the chosen groups");
  const std::string method = keys.text("topk_method", "noaux_tc");
  if (method != "noaux_tc")
    keys.fail("topk_method", "is \"" + printable(method) + "\": deepseek_v3 routes with noaux_tc (a score bias)");
  e.expert_bias = true;
}

// The weights of the chosen experts: normalised or not (norm_topk_prob; Mixtral always).
void read_topk_normalisation(const ConfigKeys& keys, const Family& f, theory::MoeSpec& e) {
  const bool normalise = f.experts == Experts::mixtral || keys.boolean("norm_topk_prob", f.norm_topk);
  if (e.score == theory::MoeScore::softmax) {
    e.pre_softmax = !normalise;  // softmax over all experts, then top-k, not normalised
  } else if (!normalise && e.top_k > 1) {
    keys.fail("norm_topk_prob", "is false with sigmoid scores: the layer spec's sigmoid router normalises the top-k "
                                "weights (as Megatron-Core does)");
  }
}

// The experts of a mixtral, qwen2_moe, qwen3_moe or deepseek_v3 model, and which layers have them.
void read_experts(const ConfigKeys& keys, const Family& f, theory::TransformerModel& m) {
  theory::MoeSpec& e = m.layer.moe;
  const int layers = static_cast<int>(m.L);
  const char* count_key = f.experts == Experts::mixtral ? "num_local_experts"
                          : f.experts == Experts::qwen  ? "num_experts"
                                                        : "n_routed_experts";
  e.num_experts = static_cast<double>(keys.integer(count_key, kMaxExperts));
  e.top_k = static_cast<double>(keys.integer("num_experts_per_tok", static_cast<int64_t>(e.num_experts)));
  if (f.experts == Experts::mixtral) {
    e.ffn_hidden = m.layer.ffn_hidden;  // Mixtral's intermediate_size is each expert's width
    if (keys.real("router_jitter_noise", 0, 1e6, 0) > 0)
      keys.fail("router_jitter_noise", "is " + keys.shown("router_jitter_noise") +
                                           ": random noise on the router's input, which the layer spec does not express");
  } else {
    e.ffn_hidden = static_cast<double>(keys.integer("moe_intermediate_size", kMaxModelWidth));
  }
  if (f.shared_expert) {  // required, like the other widths (0: none)
    if (!keys.has("shared_expert_intermediate_size")) keys.fail("shared_expert_intermediate_size", "is missing");
    e.shared_ffn_hidden = static_cast<double>(keys.count("shared_expert_intermediate_size", kMaxModelWidth, 0));
    // Qwen2-MoE scales the shared expert's output by sigmoid(x·w), its shared_expert_gate
    // (Megatron's --moe-shared-expert-gate).
    e.megatron.shared_expert_gate = e.shared_ffn_hidden > 0;
  }
  if (f.experts == Experts::qwen) m.moe_layers = qwen_moe_layers(keys, layers);
  if (f.experts == Experts::deepseek) {
    // n_shared_experts experts of moe_intermediate_size each: one MLP of their summed width.
    e.shared_ffn_hidden = e.ffn_hidden * static_cast<double>(keys.count("n_shared_experts", 64, 1));
    read_deepseek_router(keys, e);
    m.moe_layers = deepseek_moe_layers(keys, layers);
  }
  read_topk_normalisation(keys, f, e);
}

// DeepSeek's multi-head latent attention: q through a latent of q_lora_rank (null: from h
// directly), k and v from one of kv_lora_rank, heads of qk_nope_head_dim + qk_rope_head_dim
// for q and k and v_head_dim for v.
void read_latent_attention(const ConfigKeys& keys, theory::LayerSpec& s) {
  theory::MlaSpec& a = s.mla;
  a.enabled = true;
  a.q_lora_rank = static_cast<double>(keys.count("q_lora_rank", kMaxModelWidth, 0));
  a.kv_lora_rank = static_cast<double>(keys.integer("kv_lora_rank", kMaxModelWidth));
  a.qk_head_dim = static_cast<double>(keys.integer("qk_nope_head_dim", kMaxModelWidth));
  a.qk_pos_emb_head_dim = static_cast<double>(keys.integer("qk_rope_head_dim", kMaxModelWidth));
  a.v_head_dim = static_cast<double>(keys.integer("v_head_dim", kMaxModelWidth));
}

}  // namespace

std::string real_range_text(double min, double max) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g..%g", min, max);
  return buf;
}

HfModelConfig read_hf_config(const std::string& path) {
  const ConfigKeys keys(path, parse_json(path));
  const Family& family = family_of(keys);
  refuse_other_layers(keys, family);
  HfModelConfig c;
  c.model.name = model_name(family, path);
  read_shape(keys, family, c.model);
  c.model.layer = read_layer(keys, family, c.model);
  if (family.experts != Experts::none) read_experts(keys, family, c.model);
  if (family.experts == Experts::deepseek) read_latent_attention(keys, c.model.layer);
  return c;
}

}  // namespace actbench
