#pragma once
// The model presets, in one table: the paper's Table 3 models (docs/paper.md), the llama
// family (Meta's Llama 3 configs) and a tiny layer for tests. layer_run's presets
// (runners/presets.hpp), the formulas' ModelSpec (models.hpp), the planner's PlanModel
// (llama_planner.hpp), the benchmarks' default shapes and runners/facts.json (read by the
// Python scripts) are all views of it. Plain data: nothing here depends on the rest of actbench.
#include <cstdint>
#include <string>
#include <vector>

namespace actbench::theory {

struct ModelRow {
  std::string name;
  std::string arch;                          // "gpt" (the paper's layer) | "llama"
  int64_t seq = 0, batch = 0, hidden = 0, heads = 0;  // s, microbatch b, h, a
  int64_t kv_heads = 0;                      // llama's g (0: g = a)
  int64_t ffn_hidden = 0;                    // llama's SwiGLU width F (0: 4h)
  double rope_theta = 0;                     // llama's RoPE base (0: the layer's default)
  int tp = 1;                                // t of the model's own layout
  int layers = 1;                            // L
  int pipeline = 1;                          // p
  int chunks = 1;                            // m, model chunks per pipeline stage (1: plain 1F1B)
  int64_t global_batch = 0;                  // B, sequences per iteration (0: none given)
  int64_t vocab = 0;                         // v
  bool tied_embeddings = false;              // the output layer reuses the word embedding
  bool paper = false;                        // one of Table 3's models
};

// tiny, 22b, 175b, 530b, 1t, llama3-8b, llama3-70b, llama3-405b (this order everywhere).
const std::vector<ModelRow>& model_table();
// "a, b or c": the names of an "(expected ...)" message.
std::string one_of(const std::vector<std::string>& names);

}  // namespace actbench::theory
