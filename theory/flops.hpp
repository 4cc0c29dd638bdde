#pragma once
// FLOPs per training iteration (docs/paper.md "FLOPs", paper Appendix A) and utilization.
// A multiply-add is 2 FLOPs. B is the global batch: everything is per iteration, all GPUs.
#include <string>

#include "theory/activation_memory.hpp"
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
