#include "runners/hf_config.hpp"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "runtime/error.hpp"

namespace actbench {
namespace {

using json = nlohmann::json;

// Keys that mean a layer the family cannot express (mixture of experts, sliding windows, ...).
const char* const kRefusedKeys[] = {"num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok",
                                    "moe_intermediate_size", "sliding_window", "head_dim_override"};

}  // namespace

HfModelConfig read_hf_config(const std::string& path) {
  auto fail = [&](const std::string& what) { throw InvalidArgument("--hf-config " + path + ": " + what); };
  std::ifstream in(path);
  if (!in) fail("cannot read the file");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    fail(std::string("not valid JSON (") + e.what() + ")");
  }
  if (!j.is_object()) fail("not a JSON object");
  auto integer = [&](const char* key, bool required, int64_t fallback) -> int64_t {
    if (!j.contains(key) || j[key].is_null()) {
      if (required) fail(std::string("missing \"") + key + "\"");
      return fallback;
    }
    if (!j[key].is_number_integer() || j[key].get<int64_t>() < 1)
      fail(std::string("\"") + key + "\" must be a positive integer");
    return j[key].get<int64_t>();
  };
  auto number = [&](const char* key, double fallback) -> double {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_number() || !(j[key].get<double>() > 0)) fail(std::string("\"") + key + "\" must be a positive number");
    return j[key].get<double>();
  };
  HfModelConfig c;
  c.hidden = integer("hidden_size", true, 0);
  c.heads = integer("num_attention_heads", true, 0);
  c.kv_heads = integer("num_key_value_heads", false, c.heads);
  c.ffn_hidden = integer("intermediate_size", true, 0);
  c.layers = integer("num_hidden_layers", true, 0);
  c.vocab = integer("vocab_size", true, 0);
  c.max_positions = integer("max_position_embeddings", false, 2048);
  c.rms_norm_eps = number("rms_norm_eps", 1e-5);
  c.rope_theta = number("rope_theta", 10000.0);
  const std::string act = j.contains("hidden_act") && j["hidden_act"].is_string() ? j["hidden_act"].get<std::string>()
                                                                                   : "silu";
  if (act != "silu" && act != "swish") fail("hidden_act \"" + act + "\" is not silu (the family is SwiGLU)");
  for (const char* key : {"attention_bias", "mlp_bias"})
    if (j.contains(key) && !j[key].is_null() && (!j[key].is_boolean() || j[key].get<bool>()))
      fail(std::string("\"") + key + "\" is set: the family has no biases");
  for (const char* key : kRefusedKeys)
    if (j.contains(key) && !j[key].is_null() && !(j[key].is_number() && j[key].get<double>() == 0))
      fail(std::string("\"") + key + "\" is set: the llama family has no such layer (dense only)");
  if (j.contains("head_dim") && j["head_dim"].is_number_integer() && j["head_dim"].get<int64_t>() * c.heads != c.hidden)
    fail("head_dim * num_attention_heads != hidden_size: the family needs head size hidden/heads");
  if (c.hidden % c.heads != 0) fail("hidden_size is not divisible by num_attention_heads");
  if (c.kv_heads > c.heads || c.heads % c.kv_heads != 0)
    fail("num_key_value_heads must divide num_attention_heads");
  const std::string type = j.contains("model_type") && j["model_type"].is_string() ? j["model_type"].get<std::string>()
                                                                                     : "hf";
  c.name = type + ":" + std::filesystem::path(path).parent_path().filename().string();
  if (c.name.back() == ':') c.name += std::filesystem::path(path).filename().string();
  return c;
}

}  // namespace actbench
