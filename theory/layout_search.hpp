#pragma once
// The layout search (`theory plan --gpus N`): for a model (a llama preset, a Hugging Face
// config or one of the paper's GPT models), a GPU type, a number of GPUs, a sequence length
// and a global batch, every layout (t ∈ {1,2,4,8}, context parallel C ∈ {1,2,4,…} up to
// max_cp with 2C dividing s, p dividing L, interleaving m, micro-batch b, data parallel the
// rest) and every configuration (recompute none | selective | full, SP
// on/off; selective is left out with fused attention, where it equals none), with the memory
// of the first pipeline stage broken down (weights, gradients, optimizer, activations in
// flight, embedding/output extras, the recompute working set) and an iteration-time model;
// the fastest plans that fit come first. (Which configuration fits one given layout of a
// paper model: config_fit.hpp.)
//
// Memory: each candidate's whole training step (step_memory.hpp): bf16 weights, fp32
// gradients, fp32 Adam master + moments (/ dp with the distributed optimizer), the
// activations in flight on the simulated 1F1B or interleaved schedule, the embedding's and
// the loss's terms and the working sets, on the stage whose peak is highest.
//
// Time (a model, not a measurement): GEMM and attention FLOPs at `efficiency` × the GPU's
// dense bf16 peak, tensor-parallel collectives over NVLink, pipeline transfers and the
// data-parallel gradient reduction over the network (not overlapped), the bubble
// (p − 1)/m micro-batch times, and the Adam step at HBM bandwidth. Under context parallelism
// each rank computes s/C of every sequence (attention balanced by the 2C-chunk split), and
// the exchange per layer (cp_exchange_bytes) runs over NVLink while t·C ≤ 8 (one node) and
// over the network beyond: p2p's ring hidden behind the attention it feeds as far as that
// lasts, all_gather's and a2a's collectives not overlapped.
#include <string>
#include <vector>

#include "theory/activation_memory.hpp"
#include "theory/models.hpp"
#include "theory/pipeline.hpp"  // first_chunk_microbatches_in_flight
#include "theory/transformer_model.hpp"

namespace actbench::theory {

// llama3-8b, llama3-70b, llama3-405b (s 8192, untied embeddings, v 128256).
const std::vector<TransformerModel>& llama_plan_models();
// A llama preset or one of the paper's GPT models (22b, 175b, 530b, 1t); throws std::invalid_argument.
TransformerModel plan_model(const std::string& name);
// a100, h100, h200 (models.hpp) and b200.
const Gpu& plan_gpu(const std::string& name);

// The largest request plan_search takes: more GPUs than any cluster has, more sequences per
// iteration than any run uses. Within them every count stays an int; the search's cost grows
// with the divisors of the GPU count, not with the global batch or the layers.
constexpr int kMaxPlanGpus = 1 << 20;
// The most layers a planned model may have (step_memory counts them as ints).
constexpr double kMaxPlanLayers = 1 << 20;
constexpr double kMaxGlobalBatch = 1 << 24;

struct PlanRequest {
  TransformerModel model;
  Gpu gpu;
  int gpus = 8;
  double seq = 0;           // 0: the model's
  double global_batch = 0;  // sequences per iteration
  bool distributed_optimizer = false;
  Attention attention = Attention::fused;
  double headroom_bytes = 0;
  double efficiency = 0.5;  // achieved fraction of peak FLOP/s
  CpCommType cp_comm = CpCommType::p2p;  // context parallelism's attention exchange
  int max_cp = 64;                       // the largest context-parallel size searched (1: none)
};

// Bytes one rank sends per layer for context parallelism's attention (forward and backward,
// and the forward's again when `recompute_attention`), with C ranks of t-way tensor parallelism.
double cp_exchange_bytes(const TransformerModel& m, double s, double b, int t, int C, CpCommType type,
                         bool recompute_attention);

struct PlanCandidate {
  int t = 1, cp = 1, p = 1, m = 1, dp = 1;
  double b = 1, microbatches = 1;
  std::string config;  // baseline, sp, selective, selective+sp, full, full+sp
  int stage = 0;  // the pipeline stage whose peak is highest: every byte below is that stage's
  double params_per_gpu = 0;
  double weight_bytes = 0, grad_bytes = 0, optimizer_bytes = 0;
  // One layer's saved tensors (norm statistics included) and how many layers' worth the stage
  // holds at its peak.
  double per_layer_activation_bytes = 0, layers_in_flight = 0, activation_bytes = 0;
  double extra_bytes = 0;        // embedding and output/loss terms (step_memory.hpp)
  double working_set_bytes = 0;  // recompute, gradient, loss and embedding-gradient working sets
  double setup_bytes = 0;        // the stage's peak before the first step (step_memory.hpp)
  // total: the stage's peak + headroom, i.e. the larger of setup_bytes and the sum of the
  // terms above, + headroom
  double headroom_bytes = 0, total_bytes = 0;
  bool fits = false;
  double iteration_s = 0, tokens_per_s = 0, mfu_percent = 0;
};

// Every candidate, the fitting ones first, fastest first; then those that do not fit.
// Throws std::invalid_argument for requests no layout can satisfy the shape of.
std::vector<PlanCandidate> plan_search(const PlanRequest& r);

}  // namespace actbench::theory
