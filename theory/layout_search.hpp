#pragma once
// The layout search (`theory plan --gpus N`): for a model (a llama preset, a Hugging Face
// config or one of the paper's GPT models), a GPU type, a number of GPUs, a sequence length
// and a global batch, every layout (t ∈ {1,2,4,8}, p dividing L, interleaving m, micro-batch
// b, data parallel the rest) and every configuration (recompute none | selective | full, SP
// on/off; selective is left out with fused attention, where it equals none), with the memory
// of the first pipeline stage broken down (weights, gradients, optimizer, activations in
// flight, embedding/output extras, the recompute working set) and an iteration-time model;
// the fastest plans that fit come first. (Which configuration fits one given layout of a
// paper model: config_fit.hpp.)
//
// Memory: bf16 weights (2 B/param), fp32 gradients (4), fp32 Adam master + m + v (12, or
// 12/dp with the distributed optimizer). Replicated parameters (norms, GPT's row-parallel
// biases) are not divided by t. Activations: the per-layer closed forms (llama_memory.hpp,
// activation_memory.hpp) × the layers in flight on stage 0, counted on the simulated 1F1B or
// interleaved schedule (pipeline.hpp). Extras: token ids (8 bytes per token) and, for GPT, the
// embedding dropout mask for each micro-batch in flight on chunk 0 of stage 0 (from the same
// schedule); with p = 1 also the final norm's and the output layer's inputs and the fp32
// logits (vocab-parallel).
//
// Time (a model, not a measurement): GEMM and attention FLOPs at `efficiency` × the GPU's
// dense bf16 peak, tensor-parallel collectives over NVLink, pipeline transfers and the
// data-parallel gradient reduction over the network (not overlapped), the bubble
// (p − 1)/m micro-batch times, and the Adam step at HBM bandwidth.
#include <string>
#include <vector>

#include "theory/activation_memory.hpp"
#include "theory/models.hpp"
#include "theory/pipeline.hpp"  // first_chunk_microbatches_in_flight

namespace actbench::theory {

struct PlanModel {
  std::string name;
  bool llama = true;                         // false: the paper's GPT layer
  double s = 2048;                           // default sequence length
  double h = 0, a = 0, g = 0, F = 0, L = 0, v = 0;  // g, F: llama only (0: a, 4h)
  bool tied_embeddings = false;              // GPT: the output layer reuses the word embedding
};

// llama3-8b, llama3-70b, llama3-405b (s 8192, untied embeddings, v 128256).
const std::vector<PlanModel>& llama_plan_models();
// A llama preset or one of the paper's GPT models (22b, 175b, 530b, 1t); throws std::invalid_argument.
PlanModel plan_model(const std::string& name);
// a100, h100, h200 (models.hpp) and b200.
const Gpu& plan_gpu(const std::string& name);

// The largest request plan_search takes: more GPUs than any cluster has, more sequences per
// iteration than any run uses. Within them every count stays an int; the search's cost grows
// with the divisors of the GPU count, not with the global batch or the layers.
constexpr int kMaxPlanGpus = 1 << 20;
constexpr double kMaxGlobalBatch = 1 << 24;

struct PlanRequest {
  PlanModel model;
  Gpu gpu;
  int gpus = 8;
  double seq = 0;           // 0: the model's
  double global_batch = 0;  // sequences per iteration
  bool distributed_optimizer = false;
  Attention attention = Attention::fused;
  double headroom_bytes = 0;
  double efficiency = 0.5;  // achieved fraction of peak FLOP/s
};

struct PlanCandidate {
  int t = 1, p = 1, m = 1, dp = 1;
  double b = 1, microbatches = 1;
  std::string config;  // baseline, sp, selective, selective+sp, full, full+sp
  double params_per_gpu = 0;
  double weight_bytes = 0, grad_bytes = 0, optimizer_bytes = 0;
  double per_layer_activation_bytes = 0, layers_in_flight = 0, activation_bytes = 0;
  double extra_bytes = 0, working_set_bytes = 0, headroom_bytes = 0, total_bytes = 0;
  bool fits = false;
  double iteration_s = 0, tokens_per_s = 0, mfu_percent = 0;
};

// Every candidate, the fitting ones first, fastest first; then those that do not fit.
// Throws std::invalid_argument for requests no layout can satisfy the shape of.
std::vector<PlanCandidate> plan_search(const PlanRequest& r);

}  // namespace actbench::theory
