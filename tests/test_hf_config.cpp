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
#include "theory/model_table.hpp"

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
}

TEST(HfConfigRefusals, OtherModelTypesNameTheFamiliesRead) {
  for (const char* type : {"deepseek_v2", "dbrx", "gemma2", "gemma3", "phi3"})
    refused_edit("Llama-3.1-8B", {{"model_type", type}},
                 {"\"model_type\" is \"" + std::string(type) + "\"",
                  "llama, mistral, qwen2, qwen3, gemma, mixtral, qwen2_moe, qwen3_moe, deepseek_v3"});
  refused_edit("Llama-3.1-8B", {{"model_type", nullptr}}, {"\"model_type\" is missing"});
}

TEST(HfConfigRefusals, EachKeyTheSpecCannotExpress) {
  refused_edit("Llama-3.1-8B", {{"n_routed_experts", 256}}, {"\"n_routed_experts\"", "a llama model does not build"});
  refused_edit("Qwen3-30B-A3B", {{"kv_lora_rank", 512}}, {"\"kv_lora_rank\"", "a qwen3_moe model does not build"});
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

// ---- mixtures of experts and latent attention ----

namespace {

// The family's dense layer with the experts `moe` in place of its MLP.
theory::LayerSpec with_experts(theory::LayerSpec s, const theory::MoeSpec& moe) {
  s.moe = moe;
  return s;
}

theory::MoeSpec experts(double e, double k, double width) {
  theory::MoeSpec m;
  m.num_experts = e;
  m.top_k = k;
  m.ffn_hidden = width;
  return m;
}

}  // namespace

TEST(HfConfigExperts, Mixtral8x7B) {
  const theory::TransformerModel m = read("Mixtral-8x7B-v0.1");
  EXPECT_EQ(m.name, "mixtral:Mixtral-8x7B-v0.1");
  EXPECT_EQ((std::vector<double>{m.h, m.a, m.L, m.vocab, m.seq}), (std::vector<double>{4096, 32, 32, 32000, 32768}));
  // intermediate_size is each expert's width; top-2 of a softmax, normalised
  EXPECT_EQ(m.layer, with_experts(theory::llama_layer_spec(8, 14336, 1e6, 1e-5), experts(8, 2, 14336)));
  EXPECT_TRUE(m.layer.moe.normalizes());
  EXPECT_TRUE(m.moe_layers.empty());
  EXPECT_EQ(m.moe_layer_count(), 32);
  // router_aux_loss_coef and output_router_logits change no byte; jitter noise changes the routing
  EXPECT_EQ(read_edited("Mixtral-8x7B-v0.1", {{"router_jitter_noise", 0.0}}).layer, m.layer);
  refused_edit("Mixtral-8x7B-v0.1", {{"router_jitter_noise", 0.01}}, {"\"router_jitter_noise\" is 0.01", "noise"});
}

TEST(HfConfigExperts, Qwen3_30B_A3B) {
  const theory::TransformerModel m = read("Qwen3-30B-A3B");
  EXPECT_EQ(m.name, "qwen3_moe:Qwen3-30B-A3B");
  EXPECT_EQ((std::vector<double>{m.h, m.a, m.L, m.vocab}), (std::vector<double>{2048, 32, 48, 151936}));
  theory::LayerSpec dense = theory::llama_layer_spec(4, 6144, 1e6, 1e-6);
  dense.qk_layernorm = true;
  dense.kv_channels = 128;  // head_dim 128, not 2048 / 32
  EXPECT_EQ(m.layer, with_experts(dense, experts(128, 8, 768)));  // norm_topk_prob true: not pre-softmax
  EXPECT_TRUE(m.moe_layers.empty());  // decoder_sparse_step 1, no mlp_only_layers
  EXPECT_EQ(m.layer_spec(0), m.layer);
  // norm_topk_prob false (Qwen3MoeConfig's default): softmax over all experts, not normalised
  EXPECT_TRUE(read_edited("Qwen3-30B-A3B", {{"norm_topk_prob", false}}).layer.moe.pre_softmax);
  EXPECT_TRUE(read_edited("Qwen3-30B-A3B", {{"norm_topk_prob", nullptr}}).layer.moe.pre_softmax);
}

TEST(HfConfigExperts, Qwen2MoeHasASharedExpertAndDenseLayers) {
  const theory::TransformerModel m = read("Qwen1.5-MoE-A2.7B");
  EXPECT_EQ(m.name, "qwen2_moe:Qwen1.5-MoE-A2.7B");
  theory::LayerSpec dense = theory::llama_layer_spec(16, 5632, 1e6, 1e-6);
  dense.add_qkv_bias = true;
  theory::MoeSpec moe = experts(60, 4, 1408);
  moe.shared_ffn_hidden = 5632;
  moe.pre_softmax = true;  // norm_topk_prob false
  moe.megatron.shared_expert_gate = true;
  EXPECT_EQ(m.layer, with_experts(dense, moe));
  EXPECT_FALSE(m.layer.moe.normalizes());
  // decoder_sparse_step 2: layers 1, 3, 5, ... are MoE; mlp_only_layers makes some dense
  const theory::TransformerModel sparse =
      read_edited("Qwen1.5-MoE-A2.7B", {{"decoder_sparse_step", 2}, {"mlp_only_layers", json::array({3, 0})}});
  EXPECT_EQ(sparse.moe_layer_count(), 11);  // 12 odd layers, 3 made dense
  EXPECT_FALSE(sparse.is_moe_layer(0));
  EXPECT_TRUE(sparse.is_moe_layer(1));
  EXPECT_FALSE(sparse.is_moe_layer(3));
  EXPECT_EQ(sparse.layer_spec(2), dense);  // a dense layer: the family's MLP of intermediate_size
  const theory::TransformerModel unshared = read_edited("Qwen1.5-MoE-A2.7B", {{"shared_expert_intermediate_size", 0}});
  EXPECT_EQ(unshared.layer.moe.shared_ffn_hidden, 0);
  EXPECT_TRUE(m.layer.moe.megatron.shared_expert_gate);  // Qwen2-MoE gates its shared expert
  EXPECT_FALSE(unshared.layer.moe.megatron.shared_expert_gate);
}

TEST(HfConfigExperts, DeepSeekV3) {
  const theory::TransformerModel m = read("DeepSeek-V3");
  EXPECT_EQ(m.name, "deepseek_v3:DeepSeek-V3");
  EXPECT_EQ((std::vector<double>{m.h, m.a, m.L, m.vocab, m.seq}), (std::vector<double>{7168, 128, 61, 129280, 163840}));
  EXPECT_FALSE(m.tied_embeddings);
  theory::LayerSpec dense = theory::llama_layer_spec(128, 18432, 10000, 1e-6);  // rope_scaling yarn: no byte
  dense.mla.enabled = true;
  dense.mla.q_lora_rank = 1536;
  dense.mla.kv_lora_rank = 512;
  dense.mla.qk_head_dim = 128;
  dense.mla.qk_pos_emb_head_dim = 64;
  dense.mla.v_head_dim = 128;
  theory::MoeSpec moe = experts(256, 8, 2048);
  moe.shared_ffn_hidden = 2048;  // one shared expert of moe_intermediate_size
  moe.score = theory::MoeScore::sigmoid;
  moe.scaling = 2.5;
  moe.num_groups = 8;
  moe.group_top_k = 4;
  moe.expert_bias = true;  // noaux_tc
  EXPECT_EQ(m.layer, with_experts(dense, moe));
  // first_k_dense_replace 3: layers 0, 1, 2 dense (intermediate_size 18432), the 58 others MoE
  EXPECT_EQ(m.moe_layer_count(), 58);
  for (int i = 0; i < 61; ++i) EXPECT_EQ(m.is_moe_layer(i), i >= 3) << i;
  EXPECT_EQ(m.layer_spec(2), dense);
  EXPECT_EQ(m.layer_spec(3), m.layer);
  // q_lora_rank null: q projected from h directly (DeepSeek-V2-Lite)
  EXPECT_EQ(read_edited("DeepSeek-V3", {{"q_lora_rank", nullptr}}).layer.mla.q_lora_rank, 0);
  EXPECT_EQ(read_edited("DeepSeek-V3", {{"n_shared_experts", 2}}).layer.moe.shared_ffn_hidden, 4096);
  EXPECT_EQ(read_edited("DeepSeek-V3", {{"first_k_dense_replace", 0}}).moe_layer_count(), 61);
  EXPECT_EQ(read_edited("DeepSeek-V3", {{"moe_layer_freq", 2}}).moe_layer_count(), 29);  // 4, 6, ..., 60
  const theory::TransformerModel softmax = read_edited("DeepSeek-V3", {{"scoring_func", "softmax"}, {"norm_topk_prob", false}});
  EXPECT_EQ(softmax.layer.moe.score, theory::MoeScore::softmax);
  EXPECT_TRUE(softmax.layer.moe.pre_softmax);
}

TEST(HfConfigExperts, EachExpertKeyHasItsTypeAndBounds) {
  refused_edit("Mixtral-8x7B-v0.1", {{"num_local_experts", nullptr}}, {"\"num_local_experts\" is missing"});
  refused_edit("Mixtral-8x7B-v0.1", {{"num_experts_per_tok", 9}}, {"\"num_experts_per_tok\" must be in 1..8"});
  refused_edit("Mixtral-8x7B-v0.1", {{"num_local_experts", 8.0}}, {"\"num_local_experts\" must be an integer"});
  refused_edit("Qwen3-30B-A3B", {{"num_experts", 0}}, {"\"num_experts\" must be in 1.."});
  refused_edit("Qwen3-30B-A3B", {{"moe_intermediate_size", -1}}, {"\"moe_intermediate_size\""});
  refused_edit("Qwen3-30B-A3B", {{"norm_topk_prob", 1}}, {"\"norm_topk_prob\" must be true or false"});
  refused_edit("Qwen3-30B-A3B", {{"decoder_sparse_step", 0}}, {"\"decoder_sparse_step\" must be in 1..48"});
  refused_edit("Qwen3-30B-A3B", {{"mlp_only_layers", json::array({48})}}, {"\"mlp_only_layers\" must hold integers in 0..47"});
  refused_edit("Qwen3-30B-A3B", {{"mlp_only_layers", 3}}, {"\"mlp_only_layers\" must be a list"});
  refused_edit("Qwen1.5-MoE-A2.7B", {{"shared_expert_intermediate_size", "5632"}}, {"\"shared_expert_intermediate_size\""});
  refused_edit("Qwen1.5-MoE-A2.7B", {{"shared_expert_intermediate_size", nullptr}},
               {"\"shared_expert_intermediate_size\" is missing"});
  refused_edit("DeepSeek-V3", {{"scoring_func", "relu"}}, {"\"scoring_func\" is \"relu\""});
  refused_edit("DeepSeek-V3", {{"topk_method", "greedy"}}, {"\"topk_method\" is \"greedy\"", "noaux_tc"});
  refused_edit("DeepSeek-V3", {{"n_group", 7}}, {"\"n_group\" must divide"});
  refused_edit("DeepSeek-V3", {{"topk_group", 9}}, {"\"topk_group\" must be in 1..8"});
  refused_edit("DeepSeek-V3", {{"n_group", 64}, {"topk_group", 1}}, {"\"topk_group\" leaves fewer experts"});  // 1 group of 4
  refused_edit("DeepSeek-V3", {{"routed_scaling_factor", 0}}, {"\"routed_scaling_factor\" must be in"});
  refused_edit("DeepSeek-V3", {{"norm_topk_prob", false}}, {"\"norm_topk_prob\" is false with sigmoid"});
  refused_edit("DeepSeek-V3", {{"first_k_dense_replace", 62}}, {"\"first_k_dense_replace\" must be an integer in 0..61"});
  refused_edit("DeepSeek-V3", {{"kv_lora_rank", nullptr}}, {"\"kv_lora_rank\" is missing"});
  refused_edit("DeepSeek-V3", {{"qk_rope_head_dim", 0}}, {"\"qk_rope_head_dim\" must be in 1.."});
  refused_edit("DeepSeek-V3", {{"q_lora_rank", -5}}, {"\"q_lora_rank\" must be an integer in 0.."});
  refused_edit("DeepSeek-V3", {{"n_shared_experts", 1.5}}, {"\"n_shared_experts\""});
}

// The MoE presets (theory/model_table.cpp, typed in from the published numbers) are the models
// their published configs describe: shape, layer spec, experts, dense layers.
TEST(HfConfigExperts, ThePresetsAreTheirPublishedConfigs) {
  const std::pair<const char*, const char*> presets[] = {
      {"mixtral-8x7b", "Mixtral-8x7B-v0.1"}, {"qwen3-30b-a3b", "Qwen3-30B-A3B"}, {"deepseek-v3", "DeepSeek-V3"}};
  for (const auto& [name, folder] : presets) {
    SCOPED_TRACE(name);
    const theory::ModelRow* row = nullptr;
    for (const theory::ModelRow& r : theory::model_table())
      if (r.name == name) row = &r;
    ASSERT_NE(row, nullptr);
    const theory::TransformerModel preset = theory::preset_model(*row), config = read(folder);
    EXPECT_EQ((std::vector<double>{preset.h, preset.a, preset.L, preset.vocab}),
              (std::vector<double>{config.h, config.a, config.L, config.vocab}));
    EXPECT_EQ(preset.tied_embeddings, config.tied_embeddings);
    EXPECT_FALSE(preset.learned_positions);
    EXPECT_EQ(preset.layer, config.layer);
    EXPECT_EQ(preset.moe_layers, config.moe_layers);
  }
}
