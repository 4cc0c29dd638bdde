#include "theory/memory_totals.hpp"

#include "theory/pipeline.hpp"

#include <algorithm>
#include <stdexcept>

namespace actbench::theory {

double interleave_factor(int p, int m) {
  if (m <= 1) return 1.0;
  return 1.0 + (p - 1.0) / (static_cast<double>(p) * m);
}

double first_stage_layers_in_flight(const ModelSpec& m) {
  // Stage 0 of 1F1B holds min(p, N) microbatches of L/p layers; interleaved it holds
  // min(p·m + p − 1, N·m) chunk-microbatches of L/(p·m) layers (Megatron's warm-up + 1).
  const double n = m.microbatches();
  if (m.m <= 1) return std::min<double>(m.p, n) * m.L / m.p;
  const double chunks = std::min<double>(static_cast<double>(m.p) * m.m + m.p - 1, n * m.m);
  return chunks * m.L / (static_cast<double>(m.p) * m.m);
}

double eq5_first_stage_bytes(const ModelSpec& m) {
  return (m.s * m.b * m.h * m.L / m.t) * (34 + 5 * m.a * m.s / m.h);
}

double eq6_first_stage_bytes(const ModelSpec& m) { return 34 * m.s * m.b * m.h * m.L / m.t; }

double first_stage_activation_bytes(const ModelSpec& m, LayerPolicy c, Precision p) {
  return activation_bytes(m.layer_dims(), c, p) * first_stage_layers_in_flight(m);
}

double full_recompute_total_bytes(const ModelSpec& m, bool distributed, Precision p) {
  return first_stage_activation_bytes(m, {Recompute::full, distributed}, p);
}

int first_chunk_microbatches(const ModelSpec& m) {
  return first_chunk_microbatches_in_flight(m.p, static_cast<int>(m.microbatches()), m.m);
}

double token_id_bytes(const ModelSpec& m) { return 8 * m.s * m.b * first_chunk_microbatches(m); }

double embedding_output_extra_bytes(const ModelSpec& m, LayerPolicy c, Precision p) {
  const double sbh = m.s * m.b * m.h, split = c.sequence_parallel ? m.t : 1.0;
  // The embedding dropout mask of each micro-batch chunk 0 of stage 0 holds: p for 1F1B with
  // N >= p, fewer when N < p, 2p interleaved (the simulated schedule's count).
  double bytes = p.mask * sbh * first_chunk_microbatches(m) / split;
  if (m.p == 1) {
    bytes += p.elem * sbh / split;            // final LayerNorm input
    bytes += p.elem * sbh / split;            // output layer input (SP: its local shard)
    bytes += 4 * m.s * m.b * m.v / m.t;       // fp32 logits for the cross entropy, vocab-parallel
  }
  return bytes;
}

double extras_closed_form(const ModelSpec& m) {
  const double delta = m.p == 1 ? 1.0 : 0.0;
  return (m.s * m.b * m.h * m.L / m.t) * (m.p / m.L + delta * (4 / m.L) * (1 + m.v / m.h));
}

double layer_parameters_per_gpu(const ModelSpec& m) { return 12 * m.h * m.h * (m.L / m.p) / m.t; }

double model_parameters(const ModelSpec& m) {
  return 12 * m.L * m.h * m.h * (1 + 13 / (12 * m.h) + (m.v + m.s) / (12 * m.L * m.h));
}

double average_parameters_per_gpu(const ModelSpec& m) { return model_parameters(m) / (m.t * m.p); }

double first_stage_parameters_per_gpu(const ModelSpec& m) {
  // Per layer: QKV, proj, fc1, fc2 weights and the QKV and fc1 biases split over t (12h² + 7h);
  // the two LayerNorms (4h) and the proj and fc2 biases (2h) replicated on every rank.
  return (m.L / m.p) * ((12 * m.h * m.h + 7 * m.h) / m.t + 6 * m.h) + m.v * m.h / m.t + m.s * m.h;
}

double bytes_per_parameter(OptimizerPrecision o) {
  switch (o) {
    case OptimizerPrecision::mixed_fp32_grads: return 2 + 4 + 4 + 4 + 4;
    case OptimizerPrecision::mixed_bf16_grads: return 2 + 2 + 4 + 4 + 4;
    case OptimizerPrecision::fp32: return 4 + 4 + 4 + 4;
  }
  return 0;
}

double bytes_per_parameter_distributed(OptimizerPrecision o, int dp) {
  const double sharded = o == OptimizerPrecision::fp32 ? 8 : 12;  // the state a ZeRO-1 rank keeps 1/dp of
  return bytes_per_parameter(o) - sharded + sharded / std::max(dp, 1);
}

OptimizerPrecision optimizer_precision_from_name(const std::string& name) {
  if (name == "mixed-fp32-grads") return OptimizerPrecision::mixed_fp32_grads;
  if (name == "mixed-bf16-grads") return OptimizerPrecision::mixed_bf16_grads;
  if (name == "fp32") return OptimizerPrecision::fp32;
  throw std::invalid_argument("unknown optimizer precision '" + name +
                              "' (expected mixed-fp32-grads, mixed-bf16-grads or fp32)");
}

Figure1Bar figure1(const ModelSpec& m, double bytes_per_param, Precision p) {
  Figure1Bar bar;
  bar.params_optimizer_bytes = average_parameters_per_gpu(m) * bytes_per_param;
  bar.params_optimizer_layers_only_bytes = layer_parameters_per_gpu(m) * bytes_per_param;
  bar.activations_baseline_bytes = first_stage_activation_bytes(m, {Recompute::none, false}, p);
  bar.activations_present_bytes = first_stage_activation_bytes(m, {Recompute::selective, true}, p);
  bar.activations_full_bytes = first_stage_activation_bytes(m, {Recompute::full, false}, p);
  return bar;
}

}  // namespace actbench::theory
