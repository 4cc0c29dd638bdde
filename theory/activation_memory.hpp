#pragma once
// Table 2 of Korthikanti et al.: activation bytes one transformer layer stores for the
// backward pass, per tensor-parallel rank, by category (docs/paper.md, "What one layer stores").
// Pure functions of the shape; nothing here looks at a tensor.
#include <string>
#include <utility>
#include <vector>

#include "theory/policy.hpp"

namespace actbench::theory {

struct Dims {
  double s = 0, b = 0, h = 0, a = 0;  // sequence, microbatch, hidden, heads
  double t = 1;                       // tensor-parallel size
  double cp = 1;                      // context-parallel size C: each rank keeps s/C rows
  // An MoE layer's routed rows on this rank: the (token, choice) pairs its experts process,
  // as a measured tokens-per-expert histogram sums them; 0: balanced routing
  // (theory::moe_routed_rows).
  double moe_routed_rows = 0;
  // Expert parallelism (an MoE layer's experts over ep ranks): the rows this rank's experts
  // processed, from every rank (0: moe_routed_rows, as balanced routing gives).
  double ep = 1;
  double moe_expert_rows = 0;
  // Expert tensor parallelism (Megatron's --expert-tensor-parallel-size): each expert's width
  // split over etp ranks (the TP group), which gather every one of their routed rows; 1: each
  // expert whole on its rank.
  double etp = 1;
  // Routing imbalance (dropless routing): the rows this rank's experts process, as a multiple
  // of balanced routing's (1: balanced), capped where every token's choices land on this
  // rank's experts (theory::moe_expert_load). Not used with a capacity factor or given rows.
  double moe_expert_load = 1;
};

// e: bytes per activation element (2 for bf16/fp16, 4 for fp32); mask: bytes per dropout-mask element.
struct Precision {
  double elem = 2, mask = 1;
};

// (category, bytes) in the order of docs/paper.md's table; categories a configuration does not
// store are left out. Category names match layers/saved_activations.hpp.
// Beyond the paper: fused (FlashAttention-style) attention stores no a·s² tensors (scores,
// probabilities, mask); it keeps an fp32 log-sum-exp per row of each head instead
// ("attn_lse", 4·a·s·b/t bytes), which selective recompute (Megatron's core_attn module, the
// only one Table 2 knows) drops too: the kernel runs forward again in backward for it.
std::vector<std::pair<std::string, double>> activation_bytes_by_category(const Dims& d, LayerPolicy c, Precision p = {});
// Their sum: Table 2's row for this configuration (for any precision).
double activation_bytes(const Dims& d, LayerPolicy c, Precision p = {});
// The closed forms as printed in Table 2 (16-bit activations, 1-byte masks), for cross-checks.
double table2_closed_form(const Dims& d, LayerPolicy c);
// LayerNorm mean and rstd (fp32, two per row, two LayerNorms): not in the paper's count.
double layernorm_stats_bytes(const Dims& d, LayerPolicy c);

// ---- additions: the two terms of Table 2, Figure 7 ----

// Table 2 split into the term linear in s (the "34" part: sbh·(…)) and the attention term
// quadratic in s (5as²b/(t) part). Their sum is activation_bytes().
struct ActivationTerms {
  double linear_bytes = 0;     // grows as s·b·h
  double attention_bytes = 0;  // grows as a·s²·b (softmax, its dropout mask and output)
};
ActivationTerms activation_terms(const Dims& d, LayerPolicy c, Precision p = {});
// Sequence length at which the attention term equals the linear term of the unsplit layer
// (no recompute, t = 1; also TP+SP, where both are divided by t): 34 = 5as/h for 16-bit,
// s = 34h/(5a); GPT-3 175B gives ≈ 870.
double attention_crossover_seq(double h, double a, Precision p = {});

// Figure 7: bytes of configuration c as a percentage of the tensor-parallel baseline
// (Table 2 row 2) at the same shape.
double percent_of_tp_baseline(const Dims& d, LayerPolicy c, Precision p = {});

// What recomputation rebuilds for the one layer whose backward is running: the layer's
// no-recompute bytes minus what c stored. Not in Table 2 (the paper counts stored bytes)
// but it is memory the device must have at the backward of each layer.
double recompute_working_set_bytes(const Dims& d, LayerPolicy c, Precision p = {});

}  // namespace actbench::theory
