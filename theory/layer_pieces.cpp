#include "theory/layer_pieces.hpp"

#include <algorithm>
#include <cmath>

namespace actbench::theory {

namespace {

// Elements per rank of each kind of tensor a layer keeps.
struct Extents {
  double region;  // s·b·h split along s under SP: norm inputs/outputs, residual masks
  double heads;   // s·b·a·d/t: a/t heads of d (q, the attention output)
  double groups;  // s·b·g·d/t: g/t key/value heads
  double ffn;     // s·b·F/t: one tensor of the MLP's width
  double scores;  // a·s²·b/t: one a·s² tensor of a/t heads
  double rows;    // a·s·b/t: one value per row of each head
};

// Under context parallelism (C ranks) every tensor keeps s/C of the sequence's rows: a scores
// tensor s/C rows of s keys (all-gather's queries against every key, or a2a's a/(tC) heads of
// the whole s × s), so it shrinks by C, not C² as at s/C.
Extents extents_of(const Dims& d, const LayerSpec& spec, LayerPolicy c) {
  const double sb = d.s * d.b, t = d.t, C = d.cp, r = c.sequence_parallel ? t : 1.0, head = spec.head_dim(d);
  const double query_width = spec.kv_channels > 0 ? d.a * head : d.h;  // a·d, which is h when d = h/a
  // Each term multiplied out before dividing so that integer shapes give exact integers.
  return {.region = sb * d.h / (r * C),
          .heads = sb * query_width / (t * C),
          .groups = sb * spec.groups(d) * head / (t * C),
          .ffn = sb * spec.ffn(d) / (t * C),
          .scores = d.a * d.s * sb / (t * C),
          .rows = d.a * sb / (t * C)};
}

// What the selective modules rebuild; nothing outside selective recompute.
RecomputeModules recomputed(LayerPolicy c) {
  return c.recompute == Recompute::selective ? c.modules : RecomputeModules{false, false, false};
}

// What core attention keeps inside its own checkpoint (core_attn frees it): the fused
// kernel's log-sum-exp, or the unfused softmax output and the attention dropout's pair.
void core_attention_pieces(const Extents& x, const LayerSpec& spec, LayerPolicy c, Precision p, Bookkeeping b,
                           ByteCategories& out) {
  if (recomputed(c).core_attn) return;
  if (c.attention == Attention::fused) {
    out.push_back({"attn_lse", 4.0 * x.rows});  // fp32 whatever the activation type
    return;
  }
  if (b == Bookkeeping::megatron && spec.megatron_fp32_torch_softmax && p.elem < 4) {
    // torch's softmax keeps its fp32 output; the 16-bit copy of it is kept only as V's input
    out.push_back({"softmax_fp32_out", 4.0 * x.scores});
    if (spec.attention_dropout == 0) out.push_back({"softmax_out", p.elem * x.scores});
  } else {
    out.push_back({"softmax_out", p.elem * x.scores});  // without dropout also ·V's input
  }
  if (spec.attention_dropout > 0) {
    out.push_back({"attn_dropout_mask", p.mask * x.scores});
    out.push_back({"attn_dropout_out", p.elem * x.scores});
  }
}

// Norm 1, QKV, the optional q/k norms, core attention, the projection, the residual dropout.
void attention_block(const Extents& x, const LayerSpec& spec, LayerPolicy c, Precision p, Bookkeeping b,
                     ByteCategories& out) {
  const double e = p.elem, m = p.mask;
  const RecomputeModules rebuilt = recomputed(c);
  out.push_back({"ln1_input", e * x.region});  // also the layernorm checkpoint's input: one tensor
  // The layernorm module frees norm 1's output once the QKV GEMM has run; backward rebuilds it.
  if (!rebuilt.layernorm) out.push_back({"qkv_input", e * x.region});
  if (spec.qk_layernorm) {  // outside core_attn's checkpoint, so no module frees them
    out.push_back({"q_norm_input", e * x.heads});
    out.push_back({"k_norm_input", e * x.groups});
  }
  // q, k (after RoPE) and v are core attention's inputs: kept by its GEMMs, by the fused
  // kernel, or as core_attn's checkpoint inputs alike.
  out.push_back({"q", e * x.heads});
  out.push_back({"k", e * x.groups});
  core_attention_pieces(x, spec, c, p, b, out);
  out.push_back({"v", e * x.groups});
  out.push_back({"proj_input", e * x.heads});  // the attention output, outside core_attn's checkpoint
  if (spec.hidden_dropout > 0) out.push_back({"attn_residual_mask", m * x.region});
}

// Multi-latent attention (spec.mla; docs/theory.md "Multi-latent attention") in place of
// attention_block, as Megatron-Core's MLASelfAttention with Transformer Engine's modules: the
// down projections (h -> q_lora_rank, h -> kv_lora_rank + the RoPE part) are not split over t
// and run on the norm region's s·b/(rC) rows; each latent norm is fused into its up
// projection (column-parallel, a/t heads); the RoPE part of k is gathered over the sequence
// under SP and expanded over the heads when k is concatenated.
void mla_attention_block(const Dims& d, const Extents& x, const LayerSpec& spec, LayerPolicy c, Precision p,
                         Bookkeeping b, ByteCategories& out) {
  const double e = p.elem, m = p.mask;
  const RecomputeModules rebuilt = recomputed(c);
  const MlaSpec& mla = spec.mla;
  const double sb = d.s * d.b, r = c.sequence_parallel ? d.t : 1.0;
  auto latent = [&](double width) { return e * sb * width / (r * d.cp); };   // s·b/(rC) rows of width
  auto heads = [&](double width) { return e * sb * d.a * width / (d.t * d.cp); };  // a/t heads on s·b/C rows
  const double qk_width = mla.qk_head_dim + mla.qk_pos_emb_head_dim;  // each head's q and k
  const bool q_latent = mla.q_lora_rank > 0;
  out.push_back({"ln1_input", e * x.region});
  // Norm 1's output is read by the kv down projection and by the q down projection (or, at
  // q_lora_rank 0, the column-parallel q projection): one tensor, freed by layernorm.
  if (!rebuilt.layernorm) out.push_back({"qkv_input", e * x.region});
  // Each latent (the fused norm's input; mla_up_proj's checkpoint input) is kept either way;
  // the norm's output (the up projection's input) unless mla_up_proj rebuilds it.
  // Without latent norms the up projection reads the latent itself.
  const bool normed = mla.latent_norms && !rebuilt.mla_up_proj;
  if (q_latent) {
    out.push_back({"q_latent", latent(mla.q_lora_rank)});
    if (normed) out.push_back({"q_up_input", latent(mla.q_lora_rank)});
  }
  out.push_back({"kv_latent", latent(mla.kv_lora_rank)});
  if (normed) out.push_back({"kv_up_input", latent(mla.kv_lora_rank)});
  // mla_up_proj's checkpoint also keeps its third input, k's RoPE part before rotation: whole
  // rows on every rank (gathered under SP before the checkpoint).
  if (rebuilt.mla_up_proj) out.push_back({"k_pos_emb", e * sb * mla.qk_pos_emb_head_dim / d.cp});
  // q and k (RoPE applied, k's RoPE part copied into every head) and v: core attention's
  // inputs; mla_up_proj drops them once core attention has run and rebuilds them in backward.
  if (!rebuilt.mla_up_proj) {
    out.push_back({"q", heads(qk_width)});
    out.push_back({"k", heads(qk_width)});
  }
  core_attention_pieces(x, spec, c, p, b, out);  // they count heads and rows, not head widths
  if (!rebuilt.mla_up_proj) out.push_back({"v", heads(mla.v_head_dim)});
  out.push_back({"proj_input", heads(mla.v_head_dim)});  // a/t heads of v_head_dim
  if (spec.hidden_dropout > 0) out.push_back({"attn_residual_mask", m * x.region});
}

// Norm 2, fc1, the activation, fc2, the residual dropout.
void mlp_block(const Extents& x, const LayerSpec& spec, LayerPolicy c, Precision p, ByteCategories& out) {
  const double e = p.elem, m = p.mask;
  const RecomputeModules rebuilt = recomputed(c);
  out.push_back({"ln2_input", e * x.region});
  // fc1's input is also the mlp checkpoint's input; the layernorm module frees it either way.
  if (!rebuilt.layernorm) out.push_back({"fc1_input", e * x.region});
  if (!rebuilt.mlp) {
    switch (spec.activation) {
      case Activation::gelu: out.push_back({"gelu_input", e * x.ffn}); break;
      case Activation::swiglu: out.push_back({"swiglu_input", 2 * e * x.ffn}); break;
      case Activation::squared_relu: out.push_back({"squared_relu_input", e * x.ffn}); break;
    }
    out.push_back({"fc2_input", e * x.ffn});
  }
  if (spec.hidden_dropout > 0) out.push_back({"mlp_residual_mask", m * x.region});
}

double router_elem(const MoeSpec& moe, double e, Bookkeeping b) {
  return b == Bookkeeping::megatron ? megatron_router_bytes(moe, e) : e;
}

// The permutation's bookkeeping under Megatron-Core's all-to-all dispatcher (0.13 to 0.15).
// Unfused: index_select (and the unpermute's scatter_add) keep the N rows' int64 token
// indices, and masked_select of the weights keeps its input, the transposed weights [E, T]
// in the router's type r, and its mask, the transposed routing map (E·T booleans). Fused
// (Transformer Engine's moe_permute_with_probs, TE 2.6+): one int32 row map [T, 2E + 1],
// which the unpermute reuses; under EP or ETP the received rows are sorted by local expert
// (more than one on the rank) by TE's chunk sort twice, each keeping an int32 map of the
// N_e rows (the unfused sort is a split and a cat, which keep nothing).
double megatron_permute_map_bytes(const Dims& d, const MoeSpec& moe, double tokens, double N, double N_e, double r) {
  const double E = moe.num_experts;
  if (!moe.megatron.permute_fusion) return 8 * N + (r + 1) * E * tokens;
  const bool sorted = (d.ep > 1 || d.etp > 1) && E / d.ep > 1;
  return 4 * tokens * (2 * E + 1) + (sorted ? 2 * 4 * N_e : 0);
}

// The top-k router's choice (TopKRouter): its score function, the int64 choice, the
// sigmoid's normalisation, device-limited routing's mask. r the router's bytes per element.
void megatron_topk_choice(const MoeSpec& moe, double tokens, double r, ByteCategories& out) {
  const double E = moe.num_experts, k = moe.top_k, fp32 = 4, i64 = 8;
  const bool sigmoid = moe.score == MoeScore::sigmoid;
  // The score function, computed in fp32 whatever the router's type: softmax over all E
  // (--moe-router-pre-softmax) or the sigmoid, or softmax over the k chosen logits. With the
  // expert bias the sigmoid's weights are gathered from its output cast to the router's type,
  // which gather keeps: a second [T, E] unless the router is fp32 (the cast is then the same
  // tensor).
  double scores = fp32 * tokens * (sigmoid || moe.pre_softmax ? E : k);
  if (sigmoid && moe.expert_bias && r != fp32) scores += r * tokens * E;
  out.push_back({"router_scores", scores});
  out.push_back({"router_topk_index", i64 * tokens * k});
  // The sigmoid's weights are normalised by a division (k > 1), which keeps the chosen
  // scores and their sum in the router's type.
  if (sigmoid && k > 1) out.push_back({"router_topk_weight", r * tokens * (k + 1)});
  // Device-limited routing masks the experts outside the chosen groups; the top-k over the
  // masked scores keeps the mask unless the scores it picks from are the biased ones, whose
  // values are dropped.
  if (moe.num_groups > 1 && !(sigmoid && moe.expert_bias)) out.push_back({"router_group_mask", tokens * E});
}

// Sinkhorn's choice is made without gradient (from Sinkhorn-balanced fp32 scores): nothing
// of it is kept. The weights are the sigmoid (k = 1, in the router's type) or the fp32 softmax
// of the logits, times the routing map, a product that keeps its boolean [T, E] mask.
void megatron_sinkhorn_choice(const MoeSpec& moe, double tokens, double r, ByteCategories& out) {
  const double E = moe.num_experts, fp32 = 4;
  out.push_back({"router_scores", (moe.top_k == 1 ? r : fp32) * tokens * E});
  out.push_back({"router_routing_mask", tokens * E});
}

// What Megatron-Core's router and token dispatcher keep for backward (docs/moe.md,
// "Megatron-Core's routing bookkeeping"), in place of the layer's router_* and plan pieces:
// the T tokens of the rank, N routed rows, N_e rows its experts process, r the router's bytes
// per element. torch ops keep what their backward reads: softmax and sigmoid their output,
// topk / gather / scatter the int64 index (one tensor for all three), gather also its input,
// a division both operands, masked_select its input and mask, masked_fill its mask,
// logsumexp its input and output, index_select its index.
void megatron_routing(const Dims& d, const MoeSpec& moe, double tokens, double N, double N_e, double e,
                      ByteCategories& out) {
  const double E = moe.num_experts, fp32 = 4;
  const double r = router_elem(moe, e, Bookkeeping::megatron);
  const bool sigmoid = moe.score == MoeScore::sigmoid;
  if (moe.megatron.sinkhorn)
    megatron_sinkhorn_choice(moe, tokens, r, out);
  else
    megatron_topk_choice(moe, tokens, r, out);
  // With a capacity, the dropped pairs are masked out of the weights (a product that keeps
  // its boolean [T, E] mask).
  if (moe.capacity_factor > 0) out.push_back({"router_capacity_mask", tokens * E});
  // The load-balancing loss's own scores: fp32 softmax, or the sigmoid and its row sums.
  if (moe.megatron.aux_loss) out.push_back({"router_aux_scores", fp32 * tokens * (E + (sigmoid ? 1 : 0))});
  // The z-loss's logsumexp keeps the logits and its result (which the square reads too).
  if (moe.megatron.z_loss) out.push_back({"router_z_loss", r * tokens * (E + 1)});
  out.push_back({"moe_permute_map", megatron_permute_map_bytes(d, moe, tokens, N, N_e, r)});
}

// Norm 2, then the MoE block in place of the MLP (docs/moe.md's block): the router, its
// routing and dispatch plan, the experts' grouped GEMMs and the combine, the shared experts,
// the residual dropout. Tokens are this rank's rows (s·b/(r·C)); the routed rows N those its
// experts process (moe_routed_rows).
void moe_block(const Dims& d, const Extents& x, const LayerSpec& spec, LayerPolicy c, Precision p, Bookkeeping b,
               ByteCategories& out) {
  const double e = p.elem, m = p.mask, i32 = 4;
  const RecomputeModules rebuilt = recomputed(c);
  const MoeSpec& moe = spec.moe;
  // Each rank routes its own rows (T = s·b/(tC) under SP); the shared experts are split over t
  // like the dense MLP, over all s·b/C rows. The experts' tensors hold the rows they process
  // (N_e): the rank's own routed rows N with whole experts, the rows received from the
  // expert-parallel group under EP, and every row of the group's t ranks, F_e/etp wide, under
  // expert tensor parallelism. The combine's input holds the rank's own routed rows (N).
  const double tokens = x.region / d.h, E = moe.num_experts, k = moe.top_k, N = moe_routed_rows(d, spec);
  const double N_e = d.moe_expert_rows > 0 ? d.moe_expert_rows : N * d.etp * moe_expert_load(d, spec);
  const double gated = spec.activation == Activation::swiglu ? 2 : 1;  // fc1's outputs per unit of width
  const double width = spec.expert_ffn(d) / d.etp;
  const double shared_rows = d.s * d.b / d.cp, shared = moe.shared_ffn_hidden / d.t;
  out.push_back({"ln2_input", e * x.region});
  // Norm 2's output: the router's, the permute's and the shared experts' input, and the moe
  // checkpoint's; the layernorm module frees it as for the dense MLP.
  if (!rebuilt.layernorm) out.push_back({"moe_input", e * x.region});
  if (!rebuilt.moe) {
    if (b == Bookkeeping::megatron) {
      megatron_routing(d, moe, tokens, N, N_e, e, out);
    } else {
      out.push_back({"router_scores", e * tokens * E});         // the score function's output, read by its backward
      out.push_back({"router_topk_index", i32 * tokens * k});   // the choice
      out.push_back({"router_topk_weight", e * tokens * k});    // the combine's weights
      // tokens_per_expert, row_slot, slot_row; under EP or ETP also the rows the local experts
      // received per expert
      const bool received = d.ep > 1 || d.etp > 1;
      out.push_back({"moe_dispatch_plan", i32 * (E + 2 * tokens * k + (received ? E / d.ep : 0))});
    }
    out.push_back({"moe_permuted", e * N_e * d.h});             // fc1's input, grouped by expert
    out.push_back({"moe_act_input", gated * e * N_e * width});  // fc1's output (moe_act's checkpoint input)
    // The rows' routing weights, which the activation multiplies in (Megatron-Core from 0.13):
    // moe_act's checkpoint input too, in the router's type. The combine is then a plain sum
    // and keeps nothing.
    out.push_back({"moe_permuted_probs", router_elem(moe, e, b) * N_e});
    if (!rebuilt.moe_act) out.push_back({"moe_fc2_input", e * N_e * width});
    // Megatron-Core's unfused weighted activation: act(fc1) (SwiGLU: silu(gate) and the GLU
    // product both), which the multiplication by the weights keeps; inside moe_act's checkpoint
    // nothing is kept.
    if (b == Bookkeeping::megatron && moe.megatron.unfused_weighted_activation && !rebuilt.moe_act)
      out.push_back({"moe_act_output", gated * e * N_e * width});
    if (moe.shared_ffn_hidden > 0 && !rebuilt.shared_experts) {
      out.push_back({"shared_act_input", gated * e * shared_rows * shared});
      out.push_back({"shared_fc2_input", e * shared_rows * shared});
      // Megatron-Core's gate multiplies the shared experts' output (the rank's rows after fc2)
      // by the sigmoid of one logit per row: the product keeps both, the sigmoid its output.
      if (b == Bookkeeping::megatron && moe.megatron.shared_expert_gate)
        out.push_back({"shared_gate", e * tokens * (d.h + 1)});
    }
  }
  if (spec.hidden_dropout > 0) out.push_back({"mlp_residual_mask", m * x.region});
}

double sum_of(const ByteCategories& categories) {
  double sum = 0;
  for (const auto& [name, bytes] : categories) sum += bytes;
  return sum;
}

}  // namespace

double megatron_router_bytes(const MoeSpec& moe, double e) {
  return moe.megatron.router_bytes > 0 ? moe.megatron.router_bytes : e;
}

ByteCategories layer_bytes_by_category(const Dims& d, const LayerSpec& spec, LayerPolicy c, Precision p,
                                       Bookkeeping b) {
  const Extents x = extents_of(d, spec, c);
  if (c.recompute == Recompute::full) return {{"layer_input", p.elem * x.region}};
  ByteCategories out;
  if (spec.mla.enabled)
    mla_attention_block(d, x, spec, c, p, b, out);
  else
    attention_block(x, spec, c, p, b, out);
  if (spec.moe.enabled())
    moe_block(d, x, spec, c, p, b, out);
  else
    mlp_block(x, spec, c, p, out);
  return out;
}

double moe_routed_rows(const Dims& d, const LayerSpec& spec) {
  if (d.moe_routed_rows > 0) return d.moe_routed_rows;
  const MoeSpec& moe = spec.moe;
  // Expert tensor parallelism 1: each rank routes its own s·b/(tC) rows (SP splits them under
  // TP, as Megatron-Core requires) and keeps each expert's capacity of them.
  const double tokens = d.s * d.b / (d.t * d.cp), pairs = tokens * moe.top_k;
  if (moe.capacity_factor <= 0) return pairs;
  return std::min(pairs, moe.num_experts * std::ceil(pairs / moe.num_experts * moe.capacity_factor));
}

double moe_expert_load(const Dims& d, const LayerSpec& spec) {
  const MoeSpec& moe = spec.moe;
  if (moe.capacity_factor > 0 || d.moe_routed_rows > 0 || d.moe_expert_rows > 0) return 1;
  const double local_experts = moe.num_experts / d.ep;
  return std::min(d.moe_expert_load, std::min(moe.top_k, local_experts) * d.ep / moe.top_k);
}

double layer_bytes(const Dims& d, const LayerSpec& spec, LayerPolicy c, Precision p, Bookkeeping b) {
  return sum_of(layer_bytes_by_category(d, spec, c, p, b));
}

ByteCategories layer_extra_bytes_by_category(const Dims& d, const LayerSpec& spec, LayerPolicy c) {
  if (c.recompute == Recompute::full) return {};
  const Extents x = extents_of(d, spec, c);
  const double per_row = 4.0 /*fp32*/ * (spec.normalization == Norm::layernorm ? 2 /*mean, rstd*/ : 1 /*rstd*/);
  const double sb = d.s * d.b, rows = sb / ((c.sequence_parallel ? d.t : 1.0) * d.cp);  // the block norms' rows
  const double q_rows = x.rows, k_rows = sb * spec.groups(d) / (d.t * d.cp);             // one per head and row
  const bool block_norms = !recomputed(c).layernorm;
  ByteCategories out;
  if (block_norms) out.push_back({"ln1_stats", per_row * rows});
  // MLA's latent norms: one row per token on the norm region's rows; inside mla_up_proj's
  // checkpoint they run without autograd in forward and keep nothing.
  if (spec.mla.enabled && spec.mla.latent_norms && !recomputed(c).mla_up_proj) {
    if (spec.mla.q_lora_rank > 0) out.push_back({"q_latent_norm_stats", per_row * rows});
    out.push_back({"kv_latent_norm_stats", per_row * rows});
  }
  if (spec.qk_layernorm) {
    out.push_back({"q_norm_stats", per_row * q_rows});
    out.push_back({"k_norm_stats", per_row * k_rows});
  }
  if (block_norms) out.push_back({"ln2_stats", per_row * rows});
  return out;
}

double layer_extra_bytes(const Dims& d, const LayerSpec& spec, LayerPolicy c) {
  return sum_of(layer_extra_bytes_by_category(d, spec, c));
}

}  // namespace actbench::theory
