#pragma once
// What one dense transformer layer computes: the options of Megatron-Core's TransformerConfig
// that change what a layer computes or keeps for its backward pass. The shape (s, b, h, a, t)
// is theory::Dims; how the layer is run (recompute, its modules, SP, fused attention) is
// LayerPolicy. The paper's layer and the llama family are two presets of this one spec;
// theory/layer_pieces.hpp says what each option keeps. It lives in theory/ so that the layers
// (which link theory) can build the same spec.
#include <string>

#include "theory/activation_memory.hpp"  // Dims
#include "theory/policy.hpp"

namespace actbench::theory {

enum class Norm { layernorm, rmsnorm };                  // --normalization LayerNorm | RMSNorm
enum class Activation { gelu, swiglu, squared_relu };   // GeLU (tanh) | --swiglu | --squared-relu
enum class PositionEmbedding { rope, none };             // inside the layer: RoPE on q and k, or nothing

struct LayerSpec {
  Norm normalization = Norm::layernorm;
  double norm_epsilon = 1e-5;
  bool qk_layernorm = false;  // a norm (of `normalization`'s kind) over each head of q and of k, before RoPE
  Activation activation = Activation::gelu;
  double ffn_hidden = 0;       // F: fc2's inputs; fc1 has F outputs (2F = gate | up for SwiGLU). 0: 4h
  bool add_bias_linear = true;  // a bias on every linear (QKV, projection, fc1, fc2)
  bool add_qkv_bias = false;    // a bias on QKV alone (Qwen2); implied by add_bias_linear
  double kv_heads = 0;          // g, key/value heads (--num-query-groups); 0: g = a (MHA)
  double kv_channels = 0;       // d, each head's size (--kv-channels, HF head_dim); 0: h/a
  PositionEmbedding position = PositionEmbedding::none;
  double rotary_percent = 1.0;  // the share of each head's dimensions RoPE rotates
  double rotary_base = 10000;   // RoPE's theta
  double attention_dropout = 0.1;  // on the attention probabilities
  double hidden_dropout = 0.1;     // on each block's output before its residual add
  bool operator==(const LayerSpec&) const = default;

  double groups(const Dims& d) const { return kv_heads > 0 ? kv_heads : d.a; }
  double ffn(const Dims& d) const { return ffn_hidden > 0 ? ffn_hidden : 4 * d.h; }
  double head_dim(const Dims& d) const { return kv_channels > 0 ? kv_channels : d.h / d.a; }
  bool qkv_bias() const { return add_bias_linear || add_qkv_bias; }
};

// The paper's layer: LayerNorm, MHA without position embedding in the layer, GeLU MLP of 4h,
// biases on every linear, dropout 0.1 on the probabilities and on both block outputs.
LayerSpec gpt_layer_spec();
// The llama family: RMSNorm, grouped-query attention (g; 0 = MHA) with RoPE, SwiGLU MLP of
// width F (0: 4h), no biases, no dropout.
LayerSpec llama_layer_spec(double kv_heads, double ffn_hidden, double rope_theta = 10000, double norm_epsilon = 1e-5);
struct ModelRow;
// A preset's layer (model_table.hpp): the llama rows' spec with their g, F and RoPE base, the
// paper's layer for the others.
LayerSpec preset_layer_spec(const ModelRow& row);

// One line (InvalidArgument) naming the option when the spec cannot be built at this shape:
// g must divide a, t must divide a and g, epsilon > 0, dropouts in [0, 1), rotary_percent in
// (0, 1], F >= 0, kv_channels a whole number >= 0.
void check_layer_spec(const Dims& d, const LayerSpec& spec);
// Throws InvalidArgument(what) unless ok: the one-line refusal the spec and the step checks share.
void require(bool ok, const std::string& what);

const char* norm_name(Norm n);                // "LayerNorm" | "RMSNorm" (Megatron's spelling)
const char* activation_name(Activation a);    // "gelu" | "swiglu" | "squared_relu"
const char* position_name(PositionEmbedding p);  // "rope" | "none"
Norm parse_norm(const std::string& name);     // "LayerNorm" | "RMSNorm"; throws InvalidArgument
// Megatron's --position-embedding-type: rope, none, or learned_absolute (added to the
// embeddings before the first layer, so inside a layer it is none).
PositionEmbedding parse_position(const std::string& name);

}  // namespace actbench::theory
