#pragma once
// FLOPs per training iteration (docs/paper.md "FLOPs", paper Appendix A) and utilization.
// A multiply-add is 2 FLOPs. B is the global batch: everything is per iteration, all GPUs.
#include <string>

#include "theory/activation_memory.hpp"
#include "theory/layer_spec.hpp"
#include "theory/models.hpp"

namespace actbench::theory {

// Whether QKᵀ and ·V are counted over the whole s×s score matrix (the paper) or over the
// causal half of it (current Megatron).
enum class AttentionSpan { full, causal };

// Forward of one layer for `batch` sequences: 24·batch·s·h² (the GEMMs) + 4·batch·s²·h
// (QKᵀ and ·V); the causal count halves the second term.
double layer_forward_flops(double batch, double s, double h, AttentionSpan att = AttentionSpan::full);
// QKᵀ and ·V alone: 4·batch·s²·h (halved for causal) — what selective recompute reruns.
double core_attention_forward_flops(double batch, double s, double h, AttentionSpan att = AttentionSpan::full);
// The output layer (logits): 2·batch·s·h·v.
double logits_forward_flops(double batch, double s, double h, double v);

// ---- any layer spec, piece by piece (the layout search's time model) ----
// Forward FLOPs of one layer of `spec` (model width h, a query heads) for `batch` sequences of
// s tokens, T = batch·s, all ranks together; d the head size, g the key/value heads, γ = 2 for
// SwiGLU (fc1 has gate | up) else 1. Only GEMMs and attention count: norms, activations,
// softmax, RoPE, the router's score function and the permutes are elementwise and left out.
// An MoE layer counts balanced, dropless routing: every token's k choices are computed.
// Multi-latent attention (spec.mla; L_q, L_kv the latent ranks, d_r the RoPE part, d_qk =
// qk_head_dim + d_r, d_v = v_head_dim) has in place of QKV the down projections
// 2T·h·(L_q + L_kv + d_r), the up projections 2T·a·(L_q·d_qk + L_kv·(qk_head_dim + d_v))
// (at L_q = 0 q is projected from h: 2T·h·a·d_qk), the output projection 2T·a·d_v·h, and
// core attention 2·batch·s²·a·(d_qk + d_v) (causal: half).
struct LayerFlops {
  double attention_linear = 0;  // QKV 2T·h·(a + 2g)·d, the output projection 2T·a·d·h
  double latent_up = 0;         // of attention_linear, MLA's q and kv up projections (q's at L_q = 0)
  double core_attention = 0;    // QKᵀ and ·V: 4·batch·s²·a·d (causal: half)
  double mlp = 0;               // a dense layer's fc1 and fc2: 2T·h·(γ + 1)·F
  double router = 0;            // an MoE layer's router GEMM: 2T·h·E
  double experts = 0;           // its k chosen experts per token: 2T·k·h·(γ + 1)·F_e
  double shared_experts = 0;    // its shared experts (width F_s): 2T·h·(γ + 1)·F_s
  double moe() const { return router + experts + shared_experts; }
  double total() const { return attention_linear + core_attention + mlp + moe(); }
};
LayerFlops spec_layer_forward_flops(const LayerSpec& spec, double h, double a, double batch, double s,
                                    AttentionSpan att);
// The forward FLOPs recomputation runs again in backward for one layer: all of them under
// full recompute; under selective, each module's: core_attn the scores again (QKᵀ, half of
// core_attention unfused: the probabilities are rebuilt from them) or the whole fused kernel,
// mlp a dense layer's MLP, moe the router, experts and shared experts, shared_experts the
// shared experts alone, mla_up_proj latent_up; moe_act and layernorm rerun elementwise ops
// only (0 here).
double recompute_forward_flops(const LayerFlops& f, const LayerPolicy& c);

// ---- closed forms, as printed ----
// Eq. 7, model FLOPs: 72·B·L·s·h²·(1 + s/(6h) + v/(12hL)).
double model_flops_eq7(const ModelSpec& m);
// Eq. 8, hardware FLOPs with selective recompute, the paper's accounting: 72BLsh²(1 + s/(3h) + v/(12hL)).
double hardware_flops_eq8(const ModelSpec& m);
// The appendix's own count (+4Bs²h per layer): 72BLsh²(1 + 2s/(9h) + v/(12hL)).
double hardware_flops_selective_exact(const ModelSpec& m);
// Full recompute (Narayanan et al. 2021): 96BLsh²(1 + s/(6h) + v/(16hL)).
double hardware_flops_full_recompute(const ModelSpec& m);
// Causal-halved attention: model 72BsLh²(1 + s/(12h) + v/(12hL)); selective 1 + s/(9h);
// full recompute 96BLsh²(1 + s/(12h) + v/(16hL)).
double model_flops_causal(const ModelSpec& m);
double hardware_flops_selective_causal(const ModelSpec& m);
double hardware_flops_full_recompute_causal(const ModelSpec& m);

// ---- counted op by op ----
enum class FlopAccounting {
  paper,   // Eq. 7 / Eq. 8 / the 96 formula: what Table 5's MFU and HFU columns use
  exact,   // selective recompute adds exactly the core-attention forward (1 + 2s/(9h))
  causal,  // exact, with the causal half of the attention matrices
};
// Model FLOPs of one iteration (forward + backward = 3 × forward, no recomputation).
double model_flops(const ModelSpec& m, FlopAccounting acc = FlopAccounting::paper);
// Hardware FLOPs of one iteration: model FLOPs plus what recomputation reruns
// (none: nothing; selective: core attention; full: every layer's forward, logits excluded).
double hardware_flops(const ModelSpec& m, Recompute r, FlopAccounting acc = FlopAccounting::paper);

// 100 · flops / (seconds · gpus · peak): MFU with model FLOPs, HFU with hardware FLOPs.
double utilization_percent(double flops, double seconds, int gpus, double peak_flops_per_gpu);

// ---- exact integers (table5.csv): every closed form above multiplied out, in 128-bit ----
// Eq. 7 = 72BLsh² + 12BLs²h + 6Bshv; Eq. 8 = 72BLsh² + 24BLs²h + 6Bshv; selective exact =
// 72BLsh² + 16BLs²h + 6Bshv; full = 96BLsh² + 16BLs²h + 6Bshv; causal = 72BLsh² + 6BLs²h + 6Bshv.
enum class FlopFormula { eq7, eq8, selective_exact, full_recompute, model_causal };
__extension__ typedef unsigned __int128 uint128;  // GCC and Clang: 1T's FLOPs exceed 2^64
// Throws std::invalid_argument when B, L, s, h or v is not a whole number.
uint128 flops_exact(const ModelSpec& m, FlopFormula f);
std::string decimal(uint128 v);

}  // namespace actbench::theory
