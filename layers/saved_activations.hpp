#pragma once
// What one layer keeps from its forward pass for its backward pass. Its bytes by category
// are the *measured* activation memory (the paper's rows; LayerNorm statistics apart).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/tensor.hpp"

namespace actbench {

struct SavedActivations {
  Tensor layer_input;         // full recompute: the only thing stored
  Tensor ln1_input;           // the layer input x
  Tensor ln1_mean, ln1_rstd;  // fp32, not in the paper's count (llama's RMSNorm: rstd only)
  Tensor qkv_input;           // LN1 output; its local sequence shard under SP
  // Multi-latent attention (theory/layer_pieces.hpp's MLA rows), on the norm region's rows:
  Tensor q_latent, q_up_input;     // the q down projection's output, the q latent norm's output [s(/t), b, L_q]
  Tensor kv_latent, kv_up_input;   // the kv latent (a contiguous copy) and its norm's output [s(/t), b, L_kv]
  Tensor k_pos_emb;                // mla_up_proj: k's RoPE part before rotation, all s rows [s, b, d_r]
  Tensor q_latent_norm_mean, q_latent_norm_rstd, kv_latent_norm_mean, kv_latent_norm_rstd;  // fp32
  Tensor q_norm_input, k_norm_input;  // --qk-layernorm: q [b, a/t, s, d] and k [b, g/t, s, d] before their norms
  Tensor q_norm_mean, q_norm_rstd, k_norm_mean, k_norm_rstd;  // their fp32 row statistics (RMSNorm: rstd only)
  Tensor q, k, v;             // [b, a/t, s, d] (k, v: g/t heads), q and k after their norms and RoPE (MLA: v's d_v)
  Tensor softmax_out;         // [b, a/t, s, s]
  Tensor attn_dropout_mask;   // u8
  Tensor attn_dropout_out;    // the probabilities multiplied with V
  Tensor attn_lse;            // fused attention only: fp32 log-sum-exp per row [b, a/t, s]
  Tensor proj_input;          // merged attention context [s, b, h/t]
  Tensor attn_residual_mask;  // u8, [s(/t), b, h]
  Tensor ln2_input;
  Tensor ln2_mean, ln2_rstd;
  Tensor fc1_input;           // LN2 output; local shard under SP
  Tensor gelu_input;          // [s, b, 4h/t]
  Tensor swiglu_input;        // the fc1 output [s, b, 2F/t] = gate | up
  Tensor squared_relu_input;  // the fc1 output [s, b, F/t]
  Tensor fc2_input;           // GeLU output
  Tensor mlp_residual_mask;   // u8
  // An MoE layer in place of fc1_input .. fc2_input (theory/layer_pieces.hpp's MoE rows; T
  // tokens, N routed rows):
  Tensor moe_input;           // norm 2's output [s, b, h]: router, permute and shared experts' input
  Tensor router_scores;       // [T, E]
  Tensor router_topk_index;   // [T, k] i32
  Tensor router_topk_weight;  // [T, k]
  Tensor moe_tokens_per_expert, moe_row_slot, moe_slot_row;  // the dispatch plan (i32), one category
  Tensor moe_expert_counts;   // under EP: the local experts' rows from all ranks (i32, the plan's too)
  Tensor moe_permuted;        // [N, h]
  Tensor moe_act_input;       // the experts' fc1 output [N, γF_e]
  Tensor moe_permuted_probs;  // the rows' routing weights [N, 1], which the activation multiplies in
  Tensor moe_fc2_input;       // [N, F_e]: the weighted activation
  Tensor shared_act_input;    // the shared experts' fc1 output [s, b, γF_s]
  Tensor shared_fc2_input;    // [s, b, F_s]

  using Entry = std::pair<const char*, const Tensor*>;
  // The counted categories in theory::layer_bytes_by_category's order and names (entries of
  // one name, as the dispatch plan's three tensors, are one category).
  std::vector<Entry> paper_categories() const;
  // The norms' fp32 statistics, outside the count as the paper leaves them out.
  std::vector<Entry> extra_categories() const;
  int64_t paper_bytes() const;
  int64_t extra_bytes() const;
  // Bytes by category, defined tensors only (statistics as theory::layer_extra_bytes_by_category
  // names them: "ln1_stats", "q_latent_norm_stats", "kv_latent_norm_stats", "q_norm_stats",
  // "k_norm_stats", "ln2_stats").
  std::vector<std::pair<std::string, int64_t>> bytes_by_category(bool include_extra) const;
  void clear() { *this = SavedActivations{}; }
};

}  // namespace actbench
