#pragma once
// The layout search (`theory plan --gpus N`): for a model (a llama, mixture-of-experts or GPT
// preset, a Hugging Face config or a launch script's model), a GPU type, a number of GPUs, a
// sequence length and a global batch, every layout (t ∈ {1,2,4,8}, context parallel C ∈
// {1,2,4,…} up to max_cp with 2C dividing s, p dividing L, interleaving m, micro-batch b, data
// parallel the rest, and for a mixture of experts the expert-parallel size ep dividing both E
// and t·C·dp, with expert tensor parallelism 1) and every configuration (recompute none |
// selective | full, SP on/off; selective is left out with fused attention where it equals
// none; a mixture of experts adds selective recompute of moe_act, moe and shared_experts, and
// needs SP under t > 1; multi-latent attention adds mla_up_proj and is searched at C = 1,
// its exchange not modelled), with the memory of the first pipeline stage broken down (weights,
// gradients, optimizer, activations in flight, embedding/output extras, the recompute working
// set) and an iteration-time model; the fastest plans that fit come first. (Which
// configuration fits one given layout of a paper model: config_fit.hpp.)
//
// Memory: each candidate's whole training step (step_memory.hpp): bf16 weights, fp32
// gradients, fp32 Adam master + moments (/ dp with the distributed optimizer; the experts'
// over their expert-data-parallel group t·C·dp/ep), the activations in flight on the
// simulated 1F1B or interleaved schedule (an MoE layer's with balanced routing), the
// embedding's and the loss's terms and the working sets, on the stage whose peak is highest.
//
// Time (a model, not a measurement): GEMM and attention FLOPs (flops.hpp's
// spec_layer_forward_flops, recompute adding recompute_forward_flops) at `efficiency` × the
// GPU's dense bf16 peak, tensor-parallel collectives over NVLink, pipeline transfers and the
// data-parallel gradient reduction over the network (not overlapped), the bubble
// (p − 1)/m micro-batch times, and the Adam step at HBM bandwidth. Under context parallelism
// each rank computes s/C of every sequence (attention balanced by the 2C-chunk split), and
// the exchange per layer (cp_exchange_bytes) runs over NVLink while t·C ≤ 8 (one node) and
// over the network beyond: p2p's ring hidden behind the attention it feeds as far as that
// lasts, all_gather's and a2a's collectives not overlapped. Under expert parallelism each MoE
// layer's all-to-alls (ep_exchange_bytes) run over NVLink while ep ≤ 8 (Megatron's expert
// groups are consecutive ranks) and over the network beyond, not overlapped; the experts'
// gradients reduce over their expert-data-parallel group.
#include <string>
#include <vector>

#include "theory/activation_memory.hpp"
#include "theory/models.hpp"
#include "theory/pipeline.hpp"  // first_chunk_microbatches_in_flight
#include "theory/step_memory.hpp"  // DataParallelSharding
#include "theory/transformer_model.hpp"

namespace actbench::theory {

// llama3-8b, llama3-70b, llama3-405b (s 8192, untied embeddings, v 128256).
const std::vector<TransformerModel>& llama_plan_models();
// A llama preset, one of the paper's GPT models (22b, 175b, 530b, 1t) or a mixture-of-experts
// preset (mixtral-8x7b, qwen3-30b-a3b, deepseek-v3); throws std::invalid_argument.
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
  DataParallelSharding sharding;  // Megatron-FSDP (sharding.fsdp) in place of DDP
  Attention attention = Attention::fused;
  double headroom_bytes = 0;
  double efficiency = 0.5;  // achieved fraction of peak FLOP/s
  CpCommType cp_comm = CpCommType::p2p;  // context parallelism's attention exchange
  int max_cp = 64;                       // the largest context-parallel size searched (1: none)
  double moe_expert_load = 1;            // routing imbalance (StepConfig::moe_expert_load): memory only
  // Fine-grained activation offloading on every candidate (StepConfig::offload): memory only,
  // the host transfers assumed hidden behind compute as Megatron-Core schedules them.
  ActivationOffload offload;
};

// Bytes one rank sends per layer for context parallelism's attention (forward and backward,
// and the forward's again when `recompute_attention`), with C ranks of t-way tensor parallelism.
double cp_exchange_bytes(const TransformerModel& m, double s, double b, int t, int C, CpCommType type,
                         bool recompute_attention);

// Bytes one rank sends per MoE layer and micro-batch for expert parallelism's all-to-alls
// (ep ranks, bf16): each exchange sends the rank's T = s·b/(t·C)
// tokens' k choices, h wide, (ep − 1)/ep of them to other ranks under balanced routing; four
// exchanges (dispatch and combine forward, their gradients backward) and the forward's two
// again when `recompute_moe` (the moe module or full recompute reruns the block).
double ep_exchange_bytes(const TransformerModel& m, double s, double b, int t, int C, int ep, bool recompute_moe);
// Bytes one rank sends per MoE layer and micro-batch for expert tensor parallelism over etp
// ranks (Megatron-Core's all-to-all dispatcher after the EP exchange): the rows its experts
// received, T·k under balanced routing, gathered from the other etp − 1 ranks and their partial
// outputs reduce-scattered back, h wide in bf16: T·k·h·2·(etp − 1) per exchange, four
// exchanges and six when `recompute_moe`, as for the all-to-alls; 0 at etp = 1.
double etp_exchange_bytes(const TransformerModel& m, double s, double b, int t, int C, int etp, bool recompute_moe);

struct PlanCandidate {
  int t = 1, cp = 1, p = 1, m = 1, dp = 1;
  int ep = 1;   // expert parallel (1 for a dense model)
  int etp = 1;  // expert tensor parallel: 1 (each expert whole) or t (each split over the TP group)
  double b = 1, microbatches = 1;
  std::string config;  // baseline, sp, selective, selective+sp, full, full+sp
  std::string modules;  // selective recompute's modules ("core_attn", "moe_act", ...); "" otherwise
  int stage = 0;  // the pipeline stage whose peak is highest: every byte below is that stage's
  double params_per_gpu = 0;
  double expert_params_per_gpu = 0;  // of them, the routed experts'
  double weight_bytes = 0, grad_bytes = 0, optimizer_bytes = 0;
  double workspace_bytes = 0;  // library workspaces (step_memory.hpp's library_workspace_bytes)
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
  double a2a_s = 0;  // of iteration_s: expert parallelism's all-to-alls on the slowest stage
};

// Every candidate, the fitting ones first, fastest first; then those that do not fit.
// Throws std::invalid_argument for requests no layout can satisfy the shape of.
std::vector<PlanCandidate> plan_search(const PlanRequest& r);

}  // namespace actbench::theory
