#include "runners/hf_config.hpp"

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "runtime/error.hpp"
#include "runtime/user_file.hpp"

namespace actbench {
namespace {

using json = nlohmann::json;

// Keys that mean a layer the family cannot express (mixture of experts, sliding windows, ...).
const char* const kRefusedKeys[] = {"num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok",
                                    "moe_intermediate_size", "sliding_window", "head_dim_override"};

// A value or message as it may appear in one error line: printable ASCII, and short (a config
// can hold a megabyte-long list where a number belongs).
std::string printable(const std::string& text) {
  constexpr size_t kMaxShown = 60;
  std::string out;
  for (char c : text.substr(0, kMaxShown)) out += c >= 0x20 && c < 0x7f ? c : '?';
  return text.size() > kMaxShown ? out + "..." : out;
}

// One config.json's keys, each taken with its type and bounds checked; every refusal is one
// line naming the file and the key.
class ConfigKeys {
 public:
  ConfigKeys(const std::string& path, json j) : path_(path), j_(std::move(j)) {}

  [[noreturn]] void fail(const std::string& problem) const {
    throw InvalidArgument("--hf-config " + path_ + ": " + problem);
  }
  [[noreturn]] void fail(const char* key, const std::string& problem) const {
    fail(std::string("\"") + key + "\" " + problem);
  }

  // The key's value; nullptr when it is absent or null (the model's default).
  const json* find(const char* key) const {
    const auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }

  // An integer in 1..max; `fallback` when absent (< 1: the key is required).
  int64_t integer(const char* key, int64_t max, int64_t fallback = 0) const {
    const json* v = find(key);
    if (!v) {
      if (fallback < 1) fail(key, "is missing");
      return fallback;
    }
    if (!v->is_number_integer()) fail(key, "must be an integer, got " + printable(v->dump()));
    // nlohmann keeps a non-negative integer unsigned, a negative one signed.
    if (!v->is_number_unsigned() || v->get<uint64_t>() < 1 || v->get<uint64_t>() > static_cast<uint64_t>(max))
      fail(key, "must be in 1.." + std::to_string(max) + ", got " + printable(v->dump()));
    return v->get<int64_t>();
  }

  // A number in [min, max]; `fallback` when absent.
  double real(const char* key, double min, double max, double fallback) const {
    const json* v = find(key);
    if (!v) return fallback;
    if (!v->is_number()) fail(key, "must be a number, got " + printable(v->dump()));
    const double x = v->get<double>();
    if (!(x >= min && x <= max))
      fail(key, "must be in " + real_range_text(min, max) + ", got " + printable(v->dump()));
    return x;
  }

  // A string; `fallback` when absent.
  std::string text(const char* key, const std::string& fallback) const {
    const json* v = find(key);
    if (!v) return fallback;
    if (!v->is_string()) fail(key, "must be a string, got " + printable(v->dump()));
    return v->get<std::string>();
  }

  // true or false; false when absent.
  bool boolean(const char* key) const {
    const json* v = find(key);
    if (!v) return false;
    if (!v->is_boolean()) fail(key, "must be true or false, got " + printable(v->dump()));
    return v->get<bool>();
  }

  bool has(const char* key) const { return find(key) != nullptr; }

 private:
  std::string path_;
  json j_;
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

// model_type names the model in the CSV's model column: a short plain name.
std::string model_type(const ConfigKeys& keys) {
  const std::string type = keys.text("model_type", "hf");
  constexpr size_t kMaxName = 64;
  bool plain = !type.empty() && type.size() <= kMaxName;
  for (char c : type) plain = plain && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-');
  if (!plain) keys.fail("model_type", "must be 1 to 64 letters, digits, '_', '.' or '-', got \"" + printable(type) + "\"");
  return type;
}

// What the family cannot express: another activation, biases, experts, windows.
void refuse_other_layers(const ConfigKeys& keys) {
  const std::string act = keys.text("hidden_act", "silu");
  if (act != "silu" && act != "swish")
    keys.fail("hidden_act", "is \"" + printable(act) + "\", not silu (the family is SwiGLU)");
  for (const char* key : {"attention_bias", "mlp_bias"})
    if (keys.boolean(key)) keys.fail(key, "is set: the family has no biases");
  for (const char* key : kRefusedKeys)
    if (const json* v = keys.find(key); v && !(v->is_number() && v->get<double>() == 0))
      keys.fail(key, "is set: the llama family has no such layer (dense only)");
}

// The shape's own rules: whole heads, key/value heads that divide them.
void check_heads(const ConfigKeys& keys, const HfModelConfig& c) {
  if (keys.has("head_dim") && keys.integer("head_dim", kMaxModelWidth) * c.heads != c.hidden)
    keys.fail("head_dim * num_attention_heads != hidden_size: the family needs head size hidden/heads");
  if (c.hidden % c.heads != 0) keys.fail("hidden_size is not divisible by num_attention_heads");
  if (c.kv_heads > c.heads || c.heads % c.kv_heads != 0) keys.fail("num_key_value_heads must divide num_attention_heads");
}

}  // namespace

std::string real_range_text(double min, double max) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g..%g", min, max);
  return buf;
}

HfModelConfig read_hf_config(const std::string& path) {
  const ConfigKeys keys(path, parse_json(path));
  HfModelConfig c;
  c.hidden = keys.integer("hidden_size", kMaxModelWidth);
  c.heads = keys.integer("num_attention_heads", kMaxModelWidth);
  c.kv_heads = keys.integer("num_key_value_heads", kMaxModelWidth, c.heads);
  c.ffn_hidden = keys.integer("intermediate_size", kMaxModelWidth);
  c.layers = keys.integer("num_hidden_layers", kMaxModelLayers);
  c.vocab = keys.integer("vocab_size", kMaxVocab);
  c.max_positions = keys.integer("max_position_embeddings", kMaxPositions, 2048);
  c.rms_norm_eps = keys.real("rms_norm_eps", kMinNormEps, kMaxNormEps, 1e-5);
  c.rope_theta = keys.real("rope_theta", kMinRopeTheta, kMaxRopeTheta, 10000.0);
  refuse_other_layers(keys);
  check_heads(keys, c);
  c.name = model_type(keys) + ":" + std::filesystem::path(path).parent_path().filename().string();
  if (c.name.back() == ':') c.name += std::filesystem::path(path).filename().string();
  return c;
}

}  // namespace actbench
