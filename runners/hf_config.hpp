#pragma once
// A Hugging Face config.json of a decoder model, read with nlohmann::json into the whole-model
// type (theory/transformer_model.hpp). The families read are llama, mistral, qwen2 (Qwen2 and
// Qwen2.5), qwen3 (dense) and gemma, and the mixtures of experts mixtral, qwen2_moe, qwen3_moe
// and deepseek_v3 (with its latent attention and first dense layers), each as transformers
// builds it; what the layer spec (theory/layer_spec.hpp) cannot express is one clear error
// (InvalidArgument) naming the key: another activation than SiLU, experts or latent attention
// in a family without them, router noise, a sliding window in effect, logit soft-capping,
// biases on some linears but not others, another model_type.
// Every key the reader uses is checked like a flag: its JSON type and the bounds below.
#include <cstdint>
#include <limits>
#include <string>

#include "runners/run_args.hpp"
#include "theory/transformer_model.hpp"

namespace actbench {

// The bounds of a model's numbers, for the config's keys and layer_run's flags alike. Each
// lies far beyond any published model and far below where a count stops fitting 64 bits or a
// loop over it stops ending; outside them a value is a mistake, not a model.
constexpr int64_t kMaxModelWidth = int64_t{1} << 20;      // hidden_size, intermediate_size, heads, head_dim
constexpr int64_t kMaxExperts = int64_t{1} << 16;        // num_experts, n_routed_experts, num_local_experts
constexpr int64_t kMaxModelLayers = kMaxLayers;           // num_hidden_layers (run_args.hpp)
constexpr int64_t kMaxVocab = int64_t{1} << 24;           // vocab_size
constexpr int64_t kMaxPositions = int64_t{1} << 24;       // max_position_embeddings
// RMSNorm's epsilon: a normal float (a subnormal one may be flushed to zero on the GPU, and a
// zero row then divides by zero), at most 1 (beyond, it outweighs a unit-scale activation's
// mean square and the norm stops normalizing).
constexpr double kMinNormEps = std::numeric_limits<float>::min(), kMaxNormEps = 1.0;
// RoPE's base: below 1 the rotation frequencies rise with the dimension instead of falling.
constexpr double kMinRopeTheta = 1.0, kMaxRopeTheta = 1e12;

// "min..max" of a real range as an error line writes it (%g).
std::string real_range_text(double min, double max);

struct HfModelConfig {
  // name "model_type:folder" (the CSV's model column); h, a, L, vocab (vocab_divisible_by 1:
  // a converted checkpoint keeps its rows); seq = max_positions = max_position_embeddings;
  // RoPE inside the layer, no learned positions; tied_embeddings from tie_word_embeddings
  // (the family's default when absent); the layer from the family and its keys.
  theory::TransformerModel model;
};

// The file is opened through read_user_file (a folder or a FIFO is refused at once). Throws
// InvalidArgument with one line naming the file, the key and the problem.
HfModelConfig read_hf_config(const std::string& path);

}  // namespace actbench
