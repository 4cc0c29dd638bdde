#pragma once
// A Hugging Face config.json of a LLaMA-style model, read with nlohmann::json. Only what the
// llama family (--arch llama) can express is accepted; anything else is one clear error
// (InvalidArgument): another activation than SiLU, biases, mixture-of-experts keys, ...
// Every key the reader uses is checked like a flag: its JSON type and the bounds below.
#include <cstdint>
#include <limits>
#include <string>

#include "runners/run_args.hpp"

namespace actbench {

// The bounds of the llama family's numbers, for the config's keys and layer_run's flags alike.
// Each lies far beyond any published model and far below where a count stops fitting 64 bits
// or a loop over it stops ending; outside them a value is a mistake, not a model.
constexpr int64_t kMaxModelWidth = int64_t{1} << 20;      // hidden_size, intermediate_size, heads, head_dim
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
  std::string name;  // model_type and file, for the CSV's model column
  int64_t hidden = 0, heads = 0, kv_heads = 0, ffn_hidden = 0, layers = 0, vocab = 0;
  int64_t max_positions = 0;  // the default sequence length
  double rms_norm_eps = 1e-5, rope_theta = 10000.0;
};

// The file is opened through read_user_file (a folder or a FIFO is refused at once). Throws
// InvalidArgument with one line naming the file, the key and the problem.
HfModelConfig read_hf_config(const std::string& path);

}  // namespace actbench
