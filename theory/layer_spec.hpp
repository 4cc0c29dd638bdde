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

enum class MoeScore { softmax, sigmoid };  // --moe-router-score-function

// How Megatron-Core's router and token dispatcher implement the routing, where that changes
// what they keep for backward but no value: theory memory's whole-step model reads it
// (layer_pieces.hpp, Bookkeeping::megatron); the measured layer keeps its own bookkeeping and
// never reads it (docs/moe.md, "Megatron-Core's routing bookkeeping").
struct MegatronRouting {
  double router_bytes = 0;      // --moe-router-dtype fp32: 4, fp64: 8; 0: the activations' type
  bool aux_loss = false;        // a load-balancing loss in training (its coefficient > 0)
  bool z_loss = false;          // --moe-z-loss-coeff given (Megatron computes it at 0 too)
  bool permute_fusion = false;  // --moe-permute-fusion: Transformer Engine's permutation
  // --moe-router-load-balancing-type sinkhorn: the choice made without gradient (Sinkhorn's
  // balanced scores), the weights the sigmoid (k = 1) or fp32 softmax of the logits, masked
  bool sinkhorn = false;
  // --moe-shared-expert-gate (Qwen2-MoE's shared_expert_gate): the shared experts' output
  // scaled by sigmoid(x·w), w one h-vector per layer
  bool shared_expert_gate = false;
  // The experts' weighted activation act(fc1)·weight runs unfused (anything but SwiGLU with
  // Megatron's bias-SwiGLU fusion): the product keeps the activation's output too.
  bool unfused_weighted_activation = false;
  bool operator==(const MegatronRouting&) const = default;
};

// A mixture-of-experts MLP in place of the dense one (Megatron-Core's MoELayer): a router
// (linear h -> E, no bias) picks top_k experts per token, the tokens are permuted by expert,
// run through the experts' MLPs (the spec's activation, width ffn_hidden each) as grouped
// GEMMs and combined with the routing weights; shared experts (one dense MLP of width
// shared_ffn_hidden) run on every token beside them. docs/moe.md says how each option routes.
// Which layers of a stack are MoE (--moe-layer-freq, first-k-dense) is the model's, not the layer's.
struct MoeSpec {
  double num_experts = 0;        // E (--num-experts); 0: the layer's MLP is dense
  double top_k = 2;              // k (--moe-router-topk)
  double ffn_hidden = 0;         // each expert's width (--moe-ffn-hidden-size); 0: the spec's ffn_hidden
  double shared_ffn_hidden = 0;  // the shared experts' width (--moe-shared-expert-intermediate-size); 0: none
  MoeScore score = MoeScore::softmax;
  // --moe-router-pre-softmax: softmax over all E experts, then top-k, weights not normalised
  // (Qwen2-MoE); without it a softmax router's weights are the softmax over the chosen
  // logits (normalised). A sigmoid router normalises whenever k > 1, as Megatron-Core does.
  bool pre_softmax = false;
  double scaling = 1;          // --moe-router-topk-scaling-factor (DeepSeek-V3's routed_scaling_factor)
  double num_groups = 0;       // --moe-router-num-groups (device-limited routing); 0: none
  double group_top_k = 0;      // --moe-router-group-topk
  bool expert_bias = false;    // --moe-router-enable-expert-bias (aux-loss-free balancing)
  double capacity_factor = 0;  // --moe-expert-capacity-factor; 0: dropless
  MegatronRouting megatron;    // Megatron-Core's bookkeeping (theory memory only)
  bool operator==(const MoeSpec&) const = default;

  bool enabled() const { return num_experts > 0; }
  // Whether the top-k weights are divided by their sum (see pre_softmax).
  bool normalizes() const { return score == MoeScore::sigmoid ? top_k > 1 : !pre_softmax; }
};

// Multi-latent attention (DeepSeek-V2/V3, Megatron-Core's MLASelfAttention) in place of the
// QKV projection: q through a low-rank latent (q_lora_rank, with its norm) or directly, k and
// v from one shared latent of kv_lora_rank (with its norm) plus a RoPE part of
// qk_pos_emb_head_dim per token shared by all heads; each head's q and k are
// qk_head_dim + qk_pos_emb_head_dim wide, its v v_head_dim.
struct MlaSpec {
  bool enabled = false;             // --multi-latent-attention
  double q_lora_rank = 0;           // --q-lora-rank; 0: q projected from h directly
  double kv_lora_rank = 512;        // --kv-lora-rank
  double qk_head_dim = 128;         // --qk-head-dim (HF qk_nope_head_dim)
  double qk_pos_emb_head_dim = 64;  // --qk-pos-emb-head-dim (HF qk_rope_head_dim)
  double v_head_dim = 128;          // --v-head-dim
  // A norm on each latent before its up projection (DeepSeek's q_a_layernorm, kv_a_layernorm);
  // Megatron-Core builds them only with --qk-layernorm.
  bool latent_norms = true;
  bool operator==(const MlaSpec&) const = default;
};

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
  MoeSpec moe = {};                // a mixture of experts in place of the MLP when moe.num_experts > 0
  MlaSpec mla = {};                // multi-latent attention in place of the QKV projection when mla.enabled
  // Megatron-Core's local attention without its fused masked softmax (--no-masked-softmax-fusion),
  // the softmax in fp32: on 16-bit activations torch's softmax keeps its fp32 output. Only
  // theory memory's whole-step model reads it (layer_pieces.hpp, Bookkeeping::megatron).
  bool megatron_fp32_torch_softmax = false;
  bool operator==(const LayerSpec&) const = default;

  double groups(const Dims& d) const { return kv_heads > 0 ? kv_heads : d.a; }
  double ffn(const Dims& d) const { return ffn_hidden > 0 ? ffn_hidden : 4 * d.h; }
  double head_dim(const Dims& d) const { return kv_channels > 0 ? kv_channels : d.h / d.a; }
  bool qkv_bias() const { return add_bias_linear || add_qkv_bias; }
  double expert_ffn(const Dims& d) const { return moe.ffn_hidden > 0 ? moe.ffn_hidden : ffn(d); }
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
// (0, 1], F >= 0, kv_channels a whole number >= 0; with MoE or MLA, their rules below.
void check_layer_spec(const Dims& d, const LayerSpec& spec);
// The MoE options alone (check_layer_spec calls it when moe.num_experts > 0).
void check_moe_spec(const MoeSpec& m);
// The MLA options (check_layer_spec calls it when mla.enabled): the ranks whole numbers,
// q_lora_rank >= 0 and kv_lora_rank > 0, the three head dims whole and above 0, and no
// qk_layernorm (MLA's norms are its latent norms). t divides a is the spec's own rule.
void check_mla_spec(const LayerSpec& spec);
// Throws InvalidArgument(what) unless ok: the one-line refusal the spec and the step checks share.
void require(bool ok, const std::string& what);

const char* norm_name(Norm n);                // "LayerNorm" | "RMSNorm" (Megatron's spelling)
const char* activation_name(Activation a);    // "gelu" | "swiglu" | "squared_relu"
const char* position_name(PositionEmbedding p);  // "rope" | "none"
const char* moe_score_name(MoeScore s);          // "softmax" | "sigmoid"
MoeScore parse_moe_score(const std::string& name);  // "softmax" | "sigmoid"; throws InvalidArgument
Norm parse_norm(const std::string& name);     // "LayerNorm" | "RMSNorm"; throws InvalidArgument
// Megatron's --position-embedding-type: rope, none, or learned_absolute (added to the
// embeddings before the first layer, so inside a layer it is none).
PositionEmbedding parse_position(const std::string& name);

}  // namespace actbench::theory
