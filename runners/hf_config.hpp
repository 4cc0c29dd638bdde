#pragma once
// A Hugging Face config.json of a LLaMA-style model, read with nlohmann::json. Only what the
// llama family (--arch llama) can express is accepted; anything else is one clear error
// (InvalidArgument): another activation than SiLU, biases, mixture-of-experts keys, ...
#include <cstdint>
#include <string>

namespace actbench {

struct HfModelConfig {
  std::string name;  // model_type and file, for the CSV's model column
  int64_t hidden = 0, heads = 0, kv_heads = 0, ffn_hidden = 0, layers = 0, vocab = 0;
  int64_t max_positions = 0;  // the default sequence length
  double rms_norm_eps = 1e-5, rope_theta = 10000.0;
};

// Throws InvalidArgument with one line naming the file and the problem.
HfModelConfig read_hf_config(const std::string& path);

}  // namespace actbench
