#pragma once
// What a layer is (its shape and the options it is composed from) and what it is built with;
// how it is run (LayerPolicy, the paper's configurations and Megatron-Core's recompute
// modules) is theory/policy.hpp's, shared with the formulas.
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/dtype.hpp"
#include "theory/layer_spec.hpp"  // LayerSpec: norms, activation, biases, GQA, RoPE, dropouts
#include "theory/policy.hpp"      // Recompute, Attention, LayerPolicy and their names

namespace actbench {

// The two presets of the spec that --arch names: gpt (the paper's layer: LayerNorm, MHA, GeLU
// MLP, biases, dropout) and llama (RMSNorm, grouped-query attention with RoPE, SwiGLU MLP, no
// biases, no dropout).
enum class Arch { gpt, llama };
const char* arch_name(Arch a);
Arch parse_arch(const std::string& name);  // "gpt" | "llama"; throws InvalidArgument

struct LayerDims {
  int64_t s = 0, b = 0, h = 0, a = 0;  // sequence, microbatch, hidden, heads (whole model)
  theory::LayerSpec spec = theory::gpt_layer_spec();
  int64_t groups() const { return spec.kv_heads > 0 ? static_cast<int64_t>(spec.kv_heads) : a; }
  int64_t ffn() const { return spec.ffn_hidden > 0 ? static_cast<int64_t>(spec.ffn_hidden) : 4 * h; }
  // An MoE layer's expert width F_e: --moe-ffn-hidden-size, else ffn().
  int64_t expert_ffn() const { return spec.moe.ffn_hidden > 0 ? static_cast<int64_t>(spec.moe.ffn_hidden) : ffn(); }
  // The spec's d (the CSV's and layer.json's kv_channels): --kv-channels when given (a·d need
  // not be h), else h/a.
  int64_t kv_channels() const { return spec.kv_channels > 0 ? static_cast<int64_t>(spec.kv_channels) : h / a; }
  // Each head's size of q and k: kv_channels(), or under multi-latent attention qk_head_dim +
  // qk_pos_emb_head_dim.
  int64_t head_dim() const;
  // Each head's size of v and of the attention output: d, or MLA's v_head_dim.
  int64_t v_head_dim() const;
  // RoPE's rotated dimensions of each head: Megatron's int(head_dim * rotary_percent); 0 without
  // RoPE; MLA's qk_pos_emb_head_dim (its RoPE part, all of it rotated).
  int64_t rotary_dim() const;
};

// The spec's family for the arch column and tables: "moe" for an MoE layer, "gpt" or "llama"
// when the spec is that preset (whatever its dropouts, widths, groups, theta and epsilon), else
// "custom".
std::string spec_family(const theory::LayerSpec& spec);

struct LayerOptions {
  LayerDims dims;
  LayerPolicy policy;
  DType dtype = DType::bf16;
  uint64_t seed = 1234;
  uint32_t layer_index = 0;
  // An MoE layer on a backend that holds no data (meta): the tokens each expert processes,
  // as a measured run's histogram gives them (E counts); empty: balanced routing. A backend
  // that computes routes the tokens itself and ignores it.
  std::vector<int64_t> moe_tokens_per_expert;
  // An MoE layer's experts each split over the tensor-parallel group (Megatron's
  // --expert-tensor-parallel-size equal to --tp): every rank holds all E experts, 1/t of each
  // one's width, and runs them over the routed rows of every rank of the group. false: expert
  // tensor parallelism 1, each expert whole on its rank.
  bool expert_tensor_parallel = false;
};

// Throws InvalidArgument with one clear line when the shape cannot be split t ways (and C ways
// for context parallelism: 2C chunks of the sequence, each split t ways under SP; an MoE
// layer's experts ep ways, and each expert's width etp ways) or the spec cannot be built at
// this shape.
void validate_layer(const LayerDims& d, int t, LayerPolicy p, int cp = 1, int ep = 1, int etp = 1);

}  // namespace actbench
