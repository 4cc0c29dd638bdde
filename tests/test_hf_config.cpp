// --hf-config on the published config.json files of each family (tests/fixtures/hf): where
// every key lands in the whole-model type and its layer spec, and each refusal as one line
// naming the file and the key. Edits of a fixture check one key at a time.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include <unistd.h>

#include "runners/hf_config.hpp"
#include "runtime/error.hpp"

using namespace actbench;
using json = nlohmann::json;

namespace {

std::string fixture(const std::string& model) {
  return std::string(ACTBENCH_HF_FIXTURES) + "/" + model + "/config.json";
}

theory::TransformerModel read(const std::string& model) { return read_hf_config(fixture(model)).model; }

json fixture_json(const std::string& model) { return json::parse(std::ifstream(fixture(model))); }

// The fixture `model` with `changes` merged in (a null value removes the key), written to its
// own folder named `folder`.
std::string edited(const std::string& model, const json& changes, const std::string& folder) {
  json j = fixture_json(model);
  for (const auto& [key, value] : changes.items()) {
    if (value.is_null())
      j.erase(key);
    else
      j[key] = value;
  }
  const auto dir = std::filesystem::temp_directory_path() / ("actbench_hfcfg_" + std::to_string(::getpid())) / folder;
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << j.dump(2);
  return (dir / "config.json").string();
}

theory::TransformerModel read_edited(const std::string& model, const json& changes) {
  return read_hf_config(edited(model, changes, model + "-edited")).model;
}

// The file is refused with one line naming it and every one of `words`.
void refused(const std::string& path, std::initializer_list<std::string> words) {
  try {
    read_hf_config(path);
    ADD_FAILURE() << path << " was read";
  } catch (const InvalidArgument& e) {
    const std::string line = e.what();
    EXPECT_EQ(line.find('\n'), std::string::npos) << line;
    EXPECT_NE(line.find("--hf-config " + path + ": "), std::string::npos) << line;
    for (const std::string& w : words) EXPECT_NE(line.find(w), std::string::npos) << "no '" << w << "' in: " << line;
  }
}

void refused_edit(const std::string& model, const json& changes, std::initializer_list<std::string> words) {
  refused(edited(model, changes, model + "-refused"), words);
}

}  // namespace

// ---- the families read ----

TEST(HfConfigFamilies, Llama31_8B) {
  const theory::TransformerModel m = read("Llama-3.1-8B");  // rope_scaling "llama3": read, changes no byte
  EXPECT_EQ(m.name, "llama:Llama-3.1-8B");
  EXPECT_EQ(m.h, 4096);
  EXPECT_EQ(m.a, 32);
  EXPECT_EQ(m.L, 32);
  EXPECT_EQ(m.vocab, 128256);
  EXPECT_EQ(m.vocab_divisible_by, 128);  // Megatron pads the embedding, as for a preset
  EXPECT_EQ(m.seq, 131072);
  EXPECT_EQ(m.max_positions, 131072);
  EXPECT_FALSE(m.learned_positions);
  EXPECT_FALSE(m.tied_embeddings);
  EXPECT_EQ(m.layer, theory::llama_layer_spec(8, 14336, 500000.0, 1e-5));
}

TEST(HfConfigFamilies, Mistral7Bv03WithoutAWindow) {
  const theory::TransformerModel m = read("Mistral-7B-v0.3");  // "sliding_window": null
  EXPECT_EQ(m.name, "mistral:Mistral-7B-v0.3");
  EXPECT_EQ((std::vector<double>{m.h, m.a, m.L, m.vocab, m.seq}), (std::vector<double>{4096, 32, 32, 32768, 32768}));
  EXPECT_FALSE(m.tied_embeddings);
  EXPECT_EQ(m.layer, theory::llama_layer_spec(8, 14336, 1e6, 1e-5));
}

TEST(HfConfigFamilies, Qwen25_7BHasQkvBiases) {
  const theory::TransformerModel m = read("Qwen2.5-7B");  // sliding_window 131072, use_sliding_window false
  EXPECT_EQ(m.name, "qwen2:Qwen2.5-7B");
  EXPECT_EQ((std::vector<double>{m.h, m.a, m.L, m.vocab, m.seq}), (std::vector<double>{3584, 28, 28, 152064, 131072}));
  EXPECT_FALSE(m.tied_embeddings);
  theory::LayerSpec qwen2 = theory::llama_layer_spec(4, 18944, 1e6, 1e-6);
  qwen2.add_qkv_bias = true;  // q, k, v only: o_proj and the MLP have none
  EXPECT_EQ(m.layer, qwen2);
  EXPECT_FALSE(m.layer.add_bias_linear);
}

TEST(HfConfigFamilies, Qwen3_8BHasQkNorm) {
  const theory::TransformerModel m = read("Qwen3-8B");
  EXPECT_EQ(m.name, "qwen3:Qwen3-8B");
  EXPECT_EQ((std::vector<double>{m.h, m.a, m.L, m.vocab, m.seq}), (std::vector<double>{4096, 32, 36, 151936, 40960}));
  EXPECT_FALSE(m.tied_embeddings);
  theory::LayerSpec qwen3 = theory::llama_layer_spec(8, 12288, 1e6, 1e-6);
  qwen3.qk_layernorm = true;  // head_dim 128 = 4096 / 32: kv_channels stays 0
  EXPECT_EQ(m.layer, qwen3);
}

TEST(HfConfigFamilies, Qwen3_06BHasAWiderHeadAndTiedEmbeddings) {
  const theory::TransformerModel m = read("Qwen3-0.6B");
  EXPECT_EQ((std::vector<double>{m.h, m.a, m.L, m.vocab}), (std::vector<double>{1024, 16, 28, 151936}));
  EXPECT_EQ(m.layer.kv_channels, 128);  // not 1024 / 16 = 64
  EXPECT_EQ(m.layer.head_dim(m.dims(m.seq, 1, 1)), 128);
  EXPECT_TRUE(m.layer.qk_layernorm);
  EXPECT_EQ(m.layer.kv_heads, 8);
  EXPECT_TRUE(m.tied_embeddings);
}

TEST(HfConfigFamilies, GemmaWithSiluIsRead) {
  // Gemma's own activation is refused (below); with SiLU its layer is the spec's.
  const theory::TransformerModel m = read_edited("gemma-2b", {{"hidden_act", "silu"}, {"hidden_activation", "silu"}});
  EXPECT_EQ(m.name, "gemma:gemma-2b-edited");
  EXPECT_TRUE(m.tied_embeddings);  // no tie_word_embeddings key: GemmaConfig's default
  EXPECT_EQ(m.layer, theory::llama_layer_spec(1, 16384, 10000.0, 1e-6));  // head_dim 256 = 2048 / 8
}

TEST(HfConfigFamilies, TiedEmbeddingsFollowTheFamilyDefaultWhenAbsent) {
  EXPECT_FALSE(read_edited("Llama-3.1-8B", {{"tie_word_embeddings", nullptr}}).tied_embeddings);
  EXPECT_FALSE(read_edited("Qwen3-8B", {{"tie_word_embeddings", nullptr}}).tied_embeddings);
  EXPECT_FALSE(read_edited("Qwen2.5-7B", {{"tie_word_embeddings", nullptr}}).tied_embeddings);
  EXPECT_FALSE(read_edited("Mistral-7B-v0.3", {{"tie_word_embeddings", nullptr}}).tied_embeddings);
  EXPECT_TRUE(read_edited("Llama-3.1-8B", {{"tie_word_embeddings", true}}).tied_embeddings);
  EXPECT_FALSE(read_edited("gemma-2b", {{"hidden_activation", "silu"}, {"hidden_act", "silu"},
                                        {"tie_word_embeddings", false}})
                   .tied_embeddings);
}

TEST(HfConfigFamilies, TheOtherKeysLandInTheSpec) {
  // attention_bias with mlp_bias: a bias on every linear (Megatron's add_bias_linear)
  const theory::TransformerModel biased = read_edited("Llama-3.1-8B", {{"attention_bias", true}, {"mlp_bias", true}});
  EXPECT_TRUE(biased.layer.add_bias_linear);
  EXPECT_FALSE(biased.layer.add_qkv_bias);
  EXPECT_EQ(read_edited("Llama-3.1-8B", {{"partial_rotary_factor", 0.5}}).layer.rotary_percent, 0.5);
  EXPECT_EQ(read_edited("Qwen3-8B", {{"attention_dropout", 0.1}}).layer.attention_dropout, 0.1);
  EXPECT_EQ(read_edited("Qwen3-8B", {{"attention_dropout", 0.1}}).layer.hidden_dropout, 0);
  // a head size that does not split hidden_size evenly is read with head_dim
  EXPECT_EQ(read_edited("Qwen3-8B", {{"hidden_size", 4001}}).layer.kv_channels, 128);
  // transformers 5 keeps RoPE's keys in rope_parameters
  const json rope_parameters = {{"rope_theta", 250000.0}, {"rope_type", "default"}, {"partial_rotary_factor", 0.25}};
  const theory::TransformerModel v5 = read_edited(
      "Llama-3.1-8B", {{"rope_theta", nullptr}, {"rope_scaling", nullptr}, {"rope_parameters", rope_parameters}});
  EXPECT_EQ(v5.layer.rotary_base, 250000.0);
  EXPECT_EQ(v5.layer.rotary_percent, 0.25);
  // every kind of rope_scaling is read (it changes no byte)
  for (const char* kind : {"yarn", "linear", "dynamic"})
    EXPECT_EQ(read_edited("Qwen3-8B", {{"rope_scaling", {{"rope_type", kind}, {"factor", 4.0}}}}).layer,
              read("Qwen3-8B").layer);
  // a window that is not in effect
  EXPECT_EQ(read_edited("Qwen3-8B", {{"sliding_window", 4096}}).layer, read("Qwen3-8B").layer);
  EXPECT_EQ(read_edited("Qwen3-8B", {{"layer_types", json::array({"full_attention", "full_attention"})}}).layer,
            read("Qwen3-8B").layer);
  EXPECT_EQ(read_edited("Qwen3-8B", {{"final_logit_softcapping", nullptr}, {"num_experts", 0}}).layer,
            read("Qwen3-8B").layer);  // null or 0: not set
}

// ---- what the layer spec cannot express ----

TEST(HfConfigRefusals, ThePublishedConfigsTheSpecCannotExpress) {
  refused(fixture("Mistral-7B-v0.1"), {"\"sliding_window\" is 4096"});
  refused(fixture("gemma-2b"), {"\"hidden_activation\" is \"gelu_pytorch_tanh\""});
  refused(fixture("Qwen3-30B-A3B"), {"\"num_experts\" is 128", "mixture of experts"});
  refused(fixture("Mixtral-8x7B-v0.1"), {"\"num_local_experts\" is 8", "mixture of experts"});
}

TEST(HfConfigRefusals, OtherModelTypesNameTheFamiliesRead) {
  for (const char* type : {"qwen2_moe", "qwen3_moe", "mixtral", "deepseek_v3", "gemma2", "gemma3", "phi3"})
    refused_edit("Llama-3.1-8B", {{"model_type", type}},
                 {"\"model_type\" is \"" + std::string(type) + "\"", "llama, mistral, qwen2, qwen3, gemma"});
  refused_edit("Llama-3.1-8B", {{"model_type", nullptr}}, {"\"model_type\" is missing"});
}

TEST(HfConfigRefusals, EachKeyTheSpecCannotExpress) {
  refused_edit("Llama-3.1-8B", {{"n_routed_experts", 256}}, {"\"n_routed_experts\""});
  refused_edit("Llama-3.1-8B", {{"moe_intermediate_size", 768}}, {"\"moe_intermediate_size\""});
  refused_edit("Llama-3.1-8B", {{"kv_lora_rank", 512}}, {"\"kv_lora_rank\"", "latent attention"});
  refused_edit("Llama-3.1-8B", {{"q_lora_rank", 1536}}, {"\"q_lora_rank\"", "latent attention"});
  refused_edit("Qwen2.5-7B", {{"use_sliding_window", true}}, {"\"use_sliding_window\" is true", "131072"});
  refused_edit("Llama-3.1-8B", {{"sliding_window", 4096}}, {"\"sliding_window\" is 4096"});
  refused_edit("Qwen3-8B", {{"layer_types", json::array({"sliding_attention", "full_attention"})}},
               {"\"layer_types\"", "sliding_attention"});
  refused_edit("gemma-2b", {{"hidden_activation", "silu"}, {"hidden_act", "silu"}, {"sliding_window_pattern", 6}},
               {"\"sliding_window_pattern\""});
  refused_edit("gemma-2b", {{"hidden_activation", "silu"}, {"hidden_act", "silu"}, {"attn_logit_softcapping", 50.0}},
               {"\"attn_logit_softcapping\"", "soft-capping"});
  refused_edit("gemma-2b", {{"hidden_activation", "silu"}, {"hidden_act", "silu"}, {"final_logit_softcapping", 30.0}},
               {"\"final_logit_softcapping\"", "soft-capping"});
  // Gemma reads hidden_activation; both keys must say SiLU, and without either its default is GeGLU
  refused_edit("gemma-2b", {{"hidden_activation", "silu"}}, {"\"hidden_act\" is \"gelu\""});
  refused_edit("gemma-2b", {{"hidden_activation", nullptr}, {"hidden_act", nullptr}},
               {"\"hidden_act\" is missing", "gelu_pytorch_tanh"});
  refused_edit("Qwen3-8B", {{"hidden_act", "gelu_pytorch_tanh"}}, {"\"hidden_act\" is \"gelu_pytorch_tanh\""});
  // biases on some linears but not the others
  refused_edit("Llama-3.1-8B", {{"attention_bias", true}}, {"\"attention_bias\" is true", "o_proj"});
  refused_edit("Qwen3-8B", {{"attention_bias", true}}, {"\"attention_bias\" is true"});
  refused_edit("Llama-3.1-8B", {{"mlp_bias", true}}, {"\"mlp_bias\" is true"});
}

TEST(HfConfigRefusals, TheNewKeysHaveTheirTypesAndBounds) {
  refused_edit("Qwen3-8B", {{"attention_dropout", 1.0}}, {"\"attention_dropout\" must be in [0, 1)"});
  refused_edit("Qwen3-8B", {{"attention_dropout", 0.99999999}}, {"\"attention_dropout\" must be in [0, 1)"});
  refused_edit("Qwen3-8B", {{"attention_dropout", -0.1}}, {"\"attention_dropout\""});
  refused_edit("Qwen3-8B", {{"attention_dropout", "0"}}, {"\"attention_dropout\" must be a number"});
  refused_edit("Llama-3.1-8B", {{"partial_rotary_factor", 0}}, {"\"partial_rotary_factor\" must be in (0, 1]"});
  refused_edit("Llama-3.1-8B", {{"partial_rotary_factor", 1.5}}, {"\"partial_rotary_factor\" must be in (0, 1]"});
  refused_edit("Llama-3.1-8B", {{"rope_scaling", "llama3"}}, {"\"rope_scaling\" must be an object or null"});
  refused_edit("Llama-3.1-8B", {{"rope_theta", nullptr}, {"rope_parameters", {{"rope_theta", -1}}}},
               {"\"rope_parameters.rope_theta\" must be in"});
  refused_edit("Llama-3.1-8B", {{"rope_parameters", 5}}, {"\"rope_parameters\" must be an object or null"});
  refused_edit("Qwen2.5-7B", {{"use_sliding_window", "yes"}}, {"\"use_sliding_window\" must be true or false"});
  refused_edit("Qwen3-8B", {{"layer_types", "full_attention"}}, {"\"layer_types\" must be a list"});
  refused_edit("Qwen3-8B", {{"tie_word_embeddings", 1}}, {"\"tie_word_embeddings\" must be true or false"});
  refused_edit("Qwen3-8B", {{"head_dim", 0}}, {"\"head_dim\" must be in 1.."});
  refused_edit("Qwen3-8B", {{"hidden_size", 4001}, {"head_dim", nullptr}}, {"hidden_size is not divisible"});
  refused_edit("Qwen3-8B", {{"hidden_activation", 5}}, {"\"hidden_activation\" must be a string"});
}
