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

// A mixture-of-experts preset's experts (theory::MoeSpec's numbers; 0 experts: dense).
struct ExpertsRow {
  int64_t experts = 0, top_k = 0;     // E, k
  int64_t ffn_hidden = 0;             // each expert's width
  int64_t shared_ffn_hidden = 0;      // the shared experts' width (0: none)
  bool sigmoid = false;               // sigmoid scores (else softmax)
  bool normalized = true;             // the top-k weights normalised (softmax: not pre-softmax)
  double scaling = 1;                 // routed_scaling_factor
  int64_t groups = 0, group_top_k = 0;  // device-limited routing (0: none)
  bool expert_bias = false;           // the aux-loss-free score bias
  int first_dense = 0;                // the first layers dense (their MLP ffn_hidden wide)
};

// Multi-latent attention's widths (theory::MlaSpec; kv_lora_rank 0: none).
struct LatentRow {
  int64_t q_lora_rank = 0, kv_lora_rank = 0, qk_head_dim = 0, qk_pos_emb_head_dim = 0, v_head_dim = 0;
};

struct ModelRow {
  std::string name;
  std::string arch;                          // "gpt" (the paper's layer) | "llama" | "moe" (llama's with experts)
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
  // arch "moe": the llama layer (kv_heads, ffn_hidden as the dense layers' width, rope_theta)
  // with these; the published Hugging Face configs' numbers.
  int64_t head_dim = 0;                      // each head's size where it is not h/a (Qwen3)
  bool qk_norm = false;                      // an RMSNorm over each head of q and k (Qwen3)
  double norm_epsilon = 1e-5;
  ExpertsRow moe;
  LatentRow mla;
};

// tiny, 22b, 175b, 530b, 1t, llama3-8b, llama3-70b, llama3-405b, mixtral-8x7b, qwen3-30b-a3b,
// deepseek-v3 (this order everywhere).
const std::vector<ModelRow>& model_table();
// "a, b or c": the names of an "(expected ...)" message.
std::string one_of(const std::vector<std::string>& names);

}  // namespace actbench::theory
