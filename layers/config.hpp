#pragma once
// What a layer is (its shape) and how it is run (the paper's five configurations).
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/dtype.hpp"

namespace actbench {

// gpt: the paper's layer (LayerNorm, MHA, GeLU MLP, biases, dropout).
// llama: RMSNorm, grouped-query attention with RoPE, SwiGLU MLP, no biases, no dropout.
enum class Arch { gpt, llama };
const char* arch_name(Arch a);
Arch parse_arch(const std::string& name);  // "gpt" | "llama"; throws InvalidArgument

struct LayerDims {
  int64_t s = 0, b = 0, h = 0, a = 0;  // sequence, microbatch, hidden, heads (whole model)
  // The family and its own shape; gpt ignores the rest.
  Arch arch = Arch::gpt;
  int64_t kv_heads = 0;    // g, key/value heads (0: g = a)
  int64_t ffn_hidden = 0;  // F, SwiGLU width: fc1 has 2F outputs, fc2 F inputs (0: 4h)
  double rope_theta = 10000.0;
  float norm_eps = 1e-5f;  // RMSNorm epsilon
  int64_t groups() const { return kv_heads > 0 ? kv_heads : a; }
  int64_t ffn() const { return ffn_hidden > 0 ? ffn_hidden : 4 * h; }
};

enum class Recompute { none, selective, full };

// unfused: the paper's core attention (scores, softmax, dropout mask stored or recomputed);
// fused: FlashAttention-style, only the output and a per-row log-sum-exp are kept.
enum class Attention { unfused, fused };

struct LayerPolicy {
  Recompute recompute = Recompute::none;
  bool sequence_parallel = false;
  Attention attention = Attention::unfused;
  bool operator==(const LayerPolicy&) const = default;
};

// The paper's rows: baseline, sp, full, selective, selective+sp; also full+sp (the input
// checkpoint stored as its sequence shard), which the paper does not measure.
LayerPolicy parse_config(const std::string& name);  // throws InvalidArgument
std::string config_name(LayerPolicy p);
// The paper's five in the canonical order (layer_run's default), then every name parse_config takes.
const std::vector<std::string>& paper_config_names();
const std::vector<std::string>& config_names();
const char* recompute_name(Recompute r);
const char* attention_name(Attention a);
Attention parse_attention(const std::string& name);  // "unfused" | "fused"; throws InvalidArgument

struct LayerOptions {
  LayerDims dims;
  LayerPolicy policy;
  DType dtype = DType::bf16;
  float dropout = 0.1f;
  uint64_t seed = 1234;
  uint32_t layer_index = 0;
  float ln_eps = 1e-5f;
};

// Throws InvalidArgument with one clear line when the shape cannot be split t ways.
void validate_layer(const LayerDims& d, int t, LayerPolicy p);

}  // namespace actbench
