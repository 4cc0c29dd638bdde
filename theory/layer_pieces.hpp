#pragma once
// Activation bytes one layer of any LayerSpec keeps for its backward pass, per layer and
// tensor-parallel rank, by category, derived piece by piece under Megatron-Core's conventions
// (each op keeps what its backward reads; a tensor two ops read is kept once). Table 2
// (activation_memory.hpp) and the llama family (llama_memory.hpp) are two presets of it;
// docs/theory.md ("One layer, piece by piece") derives each row.
//
// e bytes per element, m per dropout-mask element, r = t under SP (else 1), g key/value heads,
// d the head size (kv_channels; h/a unless given, so a·d = h), F the MLP width; "unless" names
// the recompute module (selective) that frees the piece.
//
//   category            kept by                                  bytes        kept when
//   ln1_input           norm 1 (also layernorm's checkpoint)      e·sbh/r
//   qkv_input           the QKV GEMM (norm 1's output)            e·sbh/r      unless layernorm
//   q_norm_input        the q norm                                e·sbad/t     qk_layernorm
//   k_norm_input        the k norm                                e·sbgd/t     qk_layernorm
//   q, k                scores GEMM / fused attention (after RoPE) e·sbad/t, e·sbgd/t
//   attn_lse            fused attention: fp32 per row             4·asb/t      fused, unless core_attn
//   softmax_out         softmax (and ·V when no dropout)          e·as²b/t     unfused, unless core_attn
//   attn_dropout_mask   attention dropout                         m·as²b/t     same, attention_dropout > 0
//   attn_dropout_out    ·V                                        e·as²b/t     same, attention_dropout > 0
//   v                   ·V / fused attention                      e·sbgd/t
//   proj_input          the output projection                     e·sbad/t
//   attn_residual_mask  hidden dropout after attention           m·sbh/r      hidden_dropout > 0
//   ln2_input           norm 2                                    e·sbh/r
//   fc1_input           fc1 (norm 2's output; mlp's checkpoint)   e·sbh/r      unless layernorm
//   gelu_input          GeLU: fc1's output (+ bias)               e·sbF/t      gelu, unless mlp
//   swiglu_input        SwiGLU: fc1's output gate | up            2e·sbF/t     swiglu, unless mlp
//   squared_relu_input  squared ReLU: one tensor of fc1's width   e·sbF/t      squared_relu, unless mlp
//   fc2_input           fc2 (the activation's output)             e·sbF/t      unless mlp
//   mlp_residual_mask   hidden dropout after the MLP              m·sbh/r      hidden_dropout > 0
//   layer_input         full recompute: the only tensor           e·sbh/r      full only
//
// An MoE layer (spec.moe, docs/moe.md) keeps, in place of fc1_input .. fc2_input, with T =
// sb/(rC) this rank's tokens, N its routed rows (moe_routed_rows), N_e the rows its experts
// processed (under expert parallelism, from every rank; under expert tensor parallelism, the
// etp ranks' together; N otherwise), F_e the expert width on the rank (split over etp), F_s the
// shared experts' (split over t, on all sb/C rows like the MLP), γ = 2 for SwiGLU else 1. The
// routing weights multiply the experts' activation (Megatron-Core from 0.13), so the combine
// is a plain sum that keeps nothing:
//   moe_input           norm 2's output: router, permute, shared  e·Th         unless layernorm
//   router_scores       the score function's output               e·TE         unless moe
//   router_topk_index   the choice (i32)                          4·Tk         unless moe
//   router_topk_weight  the router's top-k weights                e·Tk         unless moe
//   moe_dispatch_plan   tokens_per_expert, row_slot, slot_row     4·(E + 2Tk)  unless moe
//                       (+ 4·E/ep under EP or ETP: the local experts' received rows)
//   moe_permuted        the experts' fc1 input                    e·N_e·h      unless moe
//   moe_act_input       the experts' fc1 output                   γe·N_e·F_e   unless moe
//   moe_permuted_probs  the rows' weights, for the activation     e·N_e        unless moe
//   moe_fc2_input       the weighted activation output            e·N_e·F_e    unless moe, moe_act
//   shared_act_input    the shared experts' fc1 output            γe·(sb/C)·F_s/t  unless moe, shared_experts
//   shared_fc2_input    the shared experts' activation output     e·(sb/C)·F_s/t   unless moe, shared_experts
//
// A multi-latent attention layer (spec.mla, docs/theory.md "Multi-latent attention") keeps,
// in place of qkv_input .. proj_input, with L_q = q_lora_rank, L_kv = kv_lora_rank, d_qk =
// qk_head_dim + qk_pos_emb_head_dim (each head's q and k), d_r = qk_pos_emb_head_dim, d_v =
// v_head_dim (the down projections are not split over t: their outputs are on sb/r rows):
//   qkv_input           norm 1's output: both down projections' input  e·sbh/r     unless layernorm
//   q_latent            the q down projection's output (q norm's input) e·sb·L_q/r  L_q > 0
//   q_up_input          the q norm's output (q up projection's input)   e·sb·L_q/r  L_q > 0, unless mla_up_proj
//   kv_latent           the kv down projection's first L_kv columns     e·sb·L_kv/r
//   kv_up_input         the kv norm's output (kv up projection's input) e·sb·L_kv/r unless mla_up_proj
//   k_pos_emb           k's RoPE part before rotation, whole rows       e·sb·d_r    mla_up_proj only
//   q, k                core attention's inputs (k's RoPE part in each head) e·sb·a·d_qk/t each, unless mla_up_proj
//   v                   core attention's input                        e·sb·a·d_v/t  unless mla_up_proj
//   proj_input          the attention output                          e·sb·a·d_v/t
// with ln1_input, attn_lse / softmax_out / the attention dropout's pair and attn_residual_mask
// as above (all / C under context parallelism). The latent norms' statistics are extras.
//
// Biases (add_bias_linear, add_qkv_bias), RoPE and rotary_percent keep nothing: a bias's
// gradient is a sum of the output's gradient, and RoPE is a fixed rotation whose backward is
// the inverse rotation. The head size d changes only the head tensors: the a·s² tensors and
// the per-row statistics count heads and rows, not d.
#include <string>
#include <utility>
#include <vector>

#include "theory/activation_memory.hpp"  // Dims, Precision
#include "theory/layer_spec.hpp"
#include "theory/policy.hpp"

namespace actbench::theory {

using ByteCategories = std::vector<std::pair<std::string, double>>;

// Whose routing bookkeeping an MoE layer keeps: the measured layer's (router_scores,
// router_topk_index, router_topk_weight, moe_dispatch_plan above), or Megatron-Core's router
// and token dispatcher's, with MoeSpec::megatron's router type, losses and permutation
// (theory memory; docs/moe.md "Megatron-Core's routing bookkeeping"):
//   router_scores       the score function's fp32 output            4·TE (sigmoid, pre-softmax), else 4·Tk
//                       (+ r·TE: sigmoid with the expert bias, the cast gather reads, unless r = 4)
//   router_topk_index   the choice (int64: topk, gather, scatter)   8·Tk
//   router_topk_weight  sigmoid's normalisation: chosen scores, sum r·T(k+1)        sigmoid, k > 1
//   router_group_mask   device-limited routing's expert mask        TE           groups, unless sigmoid + bias
//   router_capacity_mask  the dropped pairs' mask                   TE           capacity factor
//   router_aux_scores   the load-balancing loss's fp32 scores       4·TE (+4·T sigmoid)   aux loss
//   router_z_loss       logsumexp's input and output                r·T(E + 1)   z-loss
//   moe_permute_map     unfused: int64 row indices, the transposed weights and map   8N + (r+1)·TE
//                       fused (TE 2.6+): int32 row map, and under EP/ETP two chunk-sort maps
//                                                                   4·T(2E+1) (+ 8·N_e)
//   moe_permuted_probs  the rows' weights in the router's type      r·N_e
// r is --moe-router-dtype's bytes (else e). With LayerSpec::megatron_fp32_torch_softmax (Megatron's
// local attention, unfused softmax in fp32) Megatron-Core also keeps, in place of softmax_out:
//   softmax_fp32_out    torch's fp32 softmax output                  4·b·a·s²/(t·C)
//   softmax_out         its 16-bit copy, V's input                   without attention dropout only
// Every other piece is the same under both.
enum class Bookkeeping { actbench, megatron };

// (category, bytes) in the order of the table above; categories this layer does not keep are
// left out. Names match layers/saved_activations.hpp and the two presets' functions.
ByteCategories layer_bytes_by_category(const Dims& d, const LayerSpec& spec, LayerPolicy c, Precision p = {},
                                       Bookkeeping b = Bookkeeping::actbench);
double layer_bytes(const Dims& d, const LayerSpec& spec, LayerPolicy c, Precision p = {},
                   Bookkeeping b = Bookkeeping::actbench);

// Bytes per element of Megatron-Core's router logits and routing weights: --moe-router-dtype's,
// else the activations' (e).
double megatron_router_bytes(const MoeSpec& moe, double e);

// An MoE layer's routed rows on one rank: d.moe_routed_rows when given (a measured
// histogram's sum), else balanced routing of the rank's own T = s·b/(tC) tokens: all T·k
// choices dropless, or at most E·ceil(T·k/E · cf) with a capacity factor.
double moe_routed_rows(const Dims& d, const LayerSpec& spec);

// The multiple of balanced routing's rows this rank's experts process: d.moe_expert_load,
// at most min(k, E/ep)·ep/k (every token of the expert-parallel group routing as many of its
// k choices as it can to this rank's E/ep experts); 1 with a capacity factor (its rows are
// already each expert's capacity) or with d.moe_routed_rows / d.moe_expert_rows given.
double moe_expert_load(const Dims& d, const LayerSpec& spec);

// Outside the count, as the paper leaves LayerNorm's statistics out: each norm's fp32 row
// statistics (LayerNorm mean and rstd, RMSNorm rstd) — "ln1_stats", MLA's
// "q_latent_norm_stats" and "kv_latent_norm_stats" (sb/r rows each; none under mla_up_proj),
// "q_norm_stats", "k_norm_stats", "ln2_stats". None under full recompute, and none for the
// two block norms under the layernorm module (they run without autograd in forward).
ByteCategories layer_extra_bytes_by_category(const Dims& d, const LayerSpec& spec, LayerPolicy c);
double layer_extra_bytes(const Dims& d, const LayerSpec& spec, LayerPolicy c);

}  // namespace actbench::theory
