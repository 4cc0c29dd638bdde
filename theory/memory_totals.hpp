#pragma once
// Whole-model memory per GPU: activation totals on the first pipeline stage (docs/paper.md
// "Totals, pipeline, extras", Eq. 5 / Eq. 6), the embedding/output extras, full
// recompute, parameters + optimizer state, and Figure 1's bars.
#include "theory/activation_memory.hpp"
#include "theory/models.hpp"

namespace actbench::theory {

// ---- pipeline in-flight factor ----

// Layers' worth of activations the first stage holds, divided by L: 1 for plain 1F1B
// (p microbatches × L/p layers) and 1 + (p−1)/(p·m) for the interleaved schedule with m
// chunks per stage (docs/paper.md; 1.2917 for 175B, 1.3238 for 530B). m = 1 means plain 1F1B.
double interleave_factor(int p, int m);
// Layers' worth of activations stage 0 holds at its peak, counting fewer microbatches than
// the schedule's warm-up when the iteration has fewer (N < p): L · factor at N ≥ p.
double first_stage_layers_in_flight(const ModelSpec& m);

// ---- activation totals, first pipeline stage ----

// docs/paper.md Eq. 5: (sbhL/t)(34 + 5as/h) — TP + SP, no recompute, 1F1B, 16-bit.
double eq5_first_stage_bytes(const ModelSpec& m);
// docs/paper.md Eq. 6: 34·sbhL/t — TP + SP + selective recompute, 1F1B, 16-bit.
double eq6_first_stage_bytes(const ModelSpec& m);
// Table 2's row for c × the layers in flight on stage 0 (interleaving included), any precision.
double first_stage_activation_bytes(const ModelSpec& m, LayerPolicy c, Precision p = {});
// Full recompute: 2sbh per layer checkpoint × L (× interleave factor). The paper keeps the
// whole checkpoint on every TP rank (distributed = false, "2sbhL"); Megatron's
// --distribute-saved-activations (or SP) splits it over t.
double full_recompute_total_bytes(const ModelSpec& m, bool distributed, Precision p = {});

// Micro-batches whose embedding output is alive on chunk 0 of stage 0 at the peak, from the
// simulated schedule (pipeline.hpp): min(p, N) for 1F1B, 2p interleaved (N >= 2p).
int first_chunk_microbatches(const ModelSpec& m);
// Token ids (int64, 8 bytes per token) of those micro-batches: not in the paper's extras.
double token_id_bytes(const ModelSpec& m);
// The terms outside the transformer layers (docs/paper.md "Extras"): embedding dropout mask for
// the microbatches in flight on chunk 0 of stage 0 (first_chunk_microbatches: the paper's p
// for 1F1B with N >= p); with p = 1 also the final LayerNorm input, the output
// layer's input and the fp32 logits. With SP the 16-bit terms are split over t, as in the
// paper's (sbhL/t)(p/L + δ(p=1)·(4/L)(1 + v/h)); without SP only the logits are.
double embedding_output_extra_bytes(const ModelSpec& m, LayerPolicy c, Precision p = {});
// docs/paper.md's closed form of the extras (SP, 16-bit): (sbhL/t)(p/L + δ(p=1)·(4/L)(1 + v/h)).
double extras_closed_form(const ModelSpec& m);

// ---- parameters and optimizer state ----

// Transformer-layer parameters on one GPU as docs/paper.md's Figure 1 note writes it: 12h²·(L/p)/t.
double layer_parameters_per_gpu(const ModelSpec& m);
// Whole-model parameters, Narayanan et al. 2021: 12Lh²(1 + 13/(12h) + (v + s)/(12Lh))
// (layers with biases and LayerNorms, word and position embeddings, output tied).
double model_parameters(const ModelSpec& m);
// The model's parameters spread evenly over the t·p model-parallel GPUs: what Figure 1
// draws (it matches all four bars within 0.1 GiB; see the README of results/).
double average_parameters_per_gpu(const ModelSpec& m);
// The first stage exactly: its L/p layers (12h² + 7h each split over t, the LayerNorms and
// the row-parallel biases, 6h, replicated), the word embedding split over t (vocab-parallel)
// and the position embedding on every rank.
double first_stage_parameters_per_gpu(const ModelSpec& m);

// Bytes per parameter of weights + gradients + optimizer state.
enum class OptimizerPrecision {
  mixed_fp32_grads,  // 18: bf16 weights 2, fp32 grads 4, fp32 master 4, Adam m 4, v 4 (the paper's)
  mixed_bf16_grads,  // 16: bf16 weights 2, bf16 grads 2, fp32 master 4, m 4, v 4
  fp32,              // 16: fp32 weights 4, grads 4, m 4, v 4
};
double bytes_per_parameter(OptimizerPrecision o);
// With the optimizer state (master, m, v: 12 bytes) sharded over dp data-parallel ranks
// (ZeRO-1 / Megatron's distributed optimizer): 6 + 12/dp for mixed_fp32_grads.
double bytes_per_parameter_distributed(OptimizerPrecision o, int dp);
// Throws std::invalid_argument; names: mixed-fp32-grads (18), mixed-bf16-grads (16), fp32 (16).
OptimizerPrecision optimizer_precision_from_name(const std::string& name);

// ---- Figure 1 ----
struct Figure1Bar {
  double params_optimizer_bytes = 0;              // average_parameters_per_gpu × bytes/param
  double params_optimizer_layers_only_bytes = 0;  // 12h²(L/p)/t × bytes/param (docs/paper.md's note)
  double activations_baseline_bytes = 0;         // TP baseline (Table 2 row 2) × L × factor
  double activations_present_bytes = 0;          // TP + SP + selective (Eq. 6) × factor
  double activations_full_bytes = 0;             // full recompute, 2sbhL × factor
};
Figure1Bar figure1(const ModelSpec& m, double bytes_per_param = 18, Precision p = {});

}  // namespace actbench::theory
