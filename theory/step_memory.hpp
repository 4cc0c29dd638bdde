#pragma once
// The whole training step's memory on each pipeline stage, as PyTorch's caching allocator
// counts it in a Megatron-LM run (torch.cuda.memory_stats(): allocated_bytes.all.current
// after a step, allocated_bytes.all.peak during one). docs/step_memory.md derives each term.
//
// At rest, between steps: the stage's parameters as weights (bf16/fp16: 2 bytes, fp32: 4),
// Megatron's main_grad buffer (fp32 with bf16 training; the distributed optimizer reduce-
// scatters in place, so every rank keeps all of it), and the optimizer's state (fp32 master
// copy unless the weights are fp32, Adam's two moments), divided by the data-parallel size
// with the distributed optimizer. Megatron-FSDP (DataParallelSharding) shards the state, the
// gradients and the weights as its strategy says, and holds unsharded copies during the step.
//
// Under context parallelism (C ranks, StepLayout::cp) every sequence-dependent term is the
// rank's s/C rows: the layers' saved tensors (layer_pieces.hpp with Dims::cp), the token ids,
// the output and loss terms, the working sets, plus the attention exchange's buffers (the
// key/value blocks a ring holds, or the gathered keys and values). Parameters and gradients
// do not shrink; the distributed optimizer's state is divided by dp·C.
//
// Mixture-of-experts layers (TransformerModel::moe_layers, LayerSpec::moe) hold a router, the
// shared experts and their E/ep routed experts split over etp; the distributed optimizer
// shards the experts' state over the expert-data-parallel group t·C·dp/(ep·etp), the rest's
// over dp·C. Their saved tensors are layer_pieces.hpp's for the MoE spec with balanced routing.
//
// During the step the stage's ops run in Megatron's pipeline order (pipeline.hpp). Each
// forward adds what its chunk keeps for backward for one micro-batch: its layers' saved
// tensors (theory/layer_pieces.hpp, the closed forms the meta backend measures, with the
// norms' fp32 statistics), under full recompute the checkpoints of --recompute-method; on
// the first chunk the token ids and the embedding's dropout mask; on the last the final norm,
// the output layer's input and the loss's fp32 softmax. Each backward frees them. The peak is
// the largest of, over the ops: the live bytes after a forward (plus, at the loss, the bf16
// logits beside their fp32 copy), at the start of a backward the live bytes plus the working
// set of its first layer (what recompute rebuilds, the gradients it holds), and at the end of
// the first chunk's backward the embedding's dense weight gradient. Before the first step the
// distributed optimizer's setup can peak higher (setup_peak_bytes). Fine-grained activation
// offloading (activation_offload.hpp) takes its groups' bytes off the GPU between a layer's
// forward and backward except a chunk's last layer when its backward runs next; deferred
// embedding weight gradients stay to the step's end; under combined 1F1B a backward's first
// layer meets the paired forward's first layer.
//
// Library workspaces are StepConfig::workspace_bytes. Not modelled (a real run adds them):
// NCCL's buffers (outside PyTorch's allocator), the allocator's rounding of each tensor to 512 bytes, the distributed optimizer's buffer
// padding (≤ 64 elements per parameter), transients inside a forward op.
#include <optional>
#include <string>
#include <vector>

#include "theory/activation_offload.hpp"
#include "theory/policy.hpp"
#include "theory/transformer_model.hpp"

namespace actbench::theory {

// Bytes per element of each kind of state.
struct TrainingPrecision {
  double activation = 2;       // bf16 / fp16: 2, fp32: 4
  double weight = 2;           // the model's parameters
  double grad = 4;             // main_grad (fp32 with bf16: Megatron accumulates and reduces in fp32)
  double master = 4;           // the optimizer's fp32 copy of 16-bit weights; 0 for fp32 weights
  double optimizer_state = 8;  // Adam's exp_avg + exp_avg_sq (SGD with momentum: 4)
};

struct StepLayout {
  int t = 1, p = 1, vp = 1, dp = 1;  // tensor, pipeline, virtual stages per rank, data parallel
  // Context parallel (Megatron's --context-parallel-size): C ranks each hold s/C of every
  // sequence. The world is t·C·p·dp; the distributed optimizer shards over dp·C (Megatron's
  // data-parallel group with context parallelism), the gradients are reduced over it.
  int cp = 1;
  // Megatron's --decoder-first/last-pipeline-num-layers (0: the even split), and
  // --account-for-embedding/loss-in-pipeline-split (each counts as one layer of the split).
  int first_stage_layers = 0, last_stage_layers = 0;
  bool embedding_in_split = false, loss_in_split = false;
  // Megatron's --pipeline-model-parallel-layout: the layers of each virtual stage, index
  // chunk·p + stage, p·vp of them (empty: the splits above). A stage may hold none.
  std::vector<int> stage_layers;
  // The interleaved schedule's micro-batch group (Megatron's
  // --microbatch-group-size-per-virtual-pipeline-stage; 0: p), pipeline.hpp.
  int vp_group = 0;
  // Expert parallelism (Megatron's --expert-model-parallel-size, --expert-tensor-parallel-size):
  // an MoE layer's experts are split over ep ranks (whole experts each) and each expert's
  // weights over etp (0: t, Megatron's default). ep·etp must divide t·C·dp; the experts'
  // data-parallel group (which the distributed optimizer shards their state over) is
  // t·C·dp / (ep·etp) ranks, as Megatron's expert-data-parallel group.
  int ep = 1, etp = 0;
  int expert_tp() const { return etp > 0 ? etp : t; }
  int expert_dp() const { return t * cp * dp / (ep * expert_tp()); }
};

// What the data-parallel group shards besides the optimizer state: Megatron-FSDP's
// --data-parallel-sharding-strategy, ZeRO's stages 1-3 (docs/step_memory.md, "What each stage holds").
enum class DpShard { none, optimizer, gradients, parameters };  // no_shard, optim, optim_grads, optim_grads_params
const char* dp_shard_name(DpShard s);  // Megatron's names
std::optional<DpShard> find_dp_shard(const std::string& name);  // by Megatron's name

struct DataParallelSharding {
  // Megatron-FSDP (--use-megatron-fsdp): the level below, each transformer layer one unit its
  // weights are all-gathered for and its gradients reduce-scattered from. false: Megatron's
  // DDP, whose distributed optimizer (StepConfig::distributed_optimizer) shards the state alone.
  bool fsdp = false;
  DpShard level = DpShard::parameters;
  // --num-distributed-optimizer-instances: the data-parallel group split into this many
  // replicas (hybrid sharding); the levels shard within one replica of dp·C/instances ranks
  // (the experts' within expert_dp()/instances).
  int instances = 1;
  // --outer-dp-sharding-strategy optim (and --expert-outer-dp-sharding-strategy optim for the
  // experts): the optimizer state sharded across the replicas too.
  bool outer_optimizer = false, expert_outer_optimizer = false;
};

// What is sharded: Megatron-FSDP's level, else the distributed optimizer's state or nothing.
DpShard sharded_level(const DataParallelSharding& z, bool distributed_optimizer);

// How the loss over the vocabulary shard runs (docs/step_memory.md, "The loss"):
//   none    Megatron-Core's VocabParallelCrossEntropy: keeps the fp32 softmax; the 16-bit
//           logits live beside it while it is computed and again as its gradient
//   native  --cross-entropy-loss-fusion (--cross-entropy-fusion-impl native): the same tensors,
//           plus one fp32 logits-sized copy at the loss, forward and backward, which the
//           compiled in-place steps materialise (every Megatron-LM commit measured here)
//   te      --cross-entropy-fusion-impl te: Transformer Engine's kernel keeps the 16-bit logits
//           themselves (overwritten by their gradient) and per-row statistics; no copy
enum class CrossEntropyFusion { none, native, te };

// Transformer Engine's FP8 recipe (--fp8-format with Megatron's --fp8-recipe). Each module
// keeps FP8 copies of its GEMM weights from step to step (its weight workspaces): the rowwise
// data and the columnwise (transposed) data the backward's GEMMs read, one byte per element
// each, with the recipe's scales (mxfp8: one byte per 32 elements each way; blockwise: an fp32
// per 128 x 128 block each way; delayed and tensorwise: one per tensor).
enum class Fp8Recipe { none, delayed, tensorwise, blockwise, mxfp8 };
double fp8_weight_cache_bytes_per_parameter(Fp8Recipe r);
const char* fp8_recipe_name(Fp8Recipe r);                         // Megatron's --fp8-recipe names
std::optional<Fp8Recipe> find_fp8_recipe(const std::string& name);  // by that name (none has none)

struct StepConfig {
  StepLayout layout;
  double seq = 0;           // s
  double micro_batch = 1;   // b
  double global_batch = 0;  // sequences per step (0: micro_batch · dp, one micro-batch)
  LayerPolicy policy;       // recompute, SP, attention, recompute modules
  StackRecompute stack;     // full recompute's --recompute-method / --recompute-num-layers
  bool distribute_saved_activations = false;  // full recompute's checkpoints split over t without SP
  bool distributed_optimizer = false;
  DataParallelSharding sharding;              // Megatron-FSDP and hybrid replicas
  bool gradient_accumulation_fusion = true;   // weight gradients go straight into main_grad
  CrossEntropyFusion cross_entropy = CrossEntropyFusion::none;
  Fp8Recipe fp8 = Fp8Recipe::none;  // FP8 GEMM weights' caches (activations stay in 16 bits here)
  // --fp8-param-gather: the GEMM weights are FP8 parameters (data and transpose, 1 byte each:
  // the 2 bytes of weight_bytes), gathered in FP8; no 16-bit copy to cache beside them.
  bool fp8_param_gather = false;
  // Routing imbalance: the rows the busiest rank's experts process, as a multiple of balanced
  // routing's, in every MoE layer (Dims::moe_expert_load; 1: balanced).
  double moe_expert_load = 1;
  // Fine-grained activation offloading: the groups whose saved tensors wait in host memory
  // between a layer's forward and its backward (activation_offload.hpp; the pipeline decides
  // which chunk-micro-batches keep their last layer's groups on the GPU, docs/step_memory.md).
  ActivationOffload offload;
  // --defer-embedding-wgrad-compute with --wgrad-deferral-limit (0: every micro-batch): the
  // output layer's weight gradient of the step's first micro-batches waits for the pipeline
  // flush, so the last stage keeps each one's output-layer input (from its forward) and logits'
  // gradient (from its backward) until the step's end.
  bool defer_embedding_wgrad = false;
  int wgrad_deferral_limit = 0;
  // --overlap-moe-expert-parallel-comm: Megatron-Core's combined 1F1B runs each steady-state
  // backward beside a forward, layer by layer (pp = 1: micro-batch k's backward with k + 1's
  // forward; interleaved: the pair the schedule alternates, with one more warm-up forward), so
  // a backward's first layer meets the other micro-batch's first layer already forwarded.
  bool overlap_moe_ep_comm = false;
  TrainingPrecision precision;
  // Library workspaces PyTorch's allocator holds from the first step on (cuBLAS, Transformer
  // Engine): on every stage, at rest and at the peak. megatron_args.hpp sizes them.
  double workspace_bytes = 0;

  double microbatches() const;  // global_batch / (micro_batch · dp)
  int world_size() const;       // t · cp · p · dp
  // The layer's dimensions on one rank: s, b, h, a with t and cp (each rank keeps s/C rows).
  Dims layer_dims(const TransformerModel& m) const;
};

// The layers of each virtual stage, index chunk·p + stage (Megatron's assignment).
std::vector<int> virtual_stage_layers(const TransformerModel& m, const StepLayout& l);

// Parameters of layer i on one rank. dense: attention (QKV or multi-latent attention's
// projections), the norms, and an MLP, or on an MoE layer the router (E·h, whole on every
// tensor-parallel rank, as Megatron keeps it) and the shared experts (split over t like an
// MLP); the column- and row-parallel weights and column-parallel biases / t, the norms, the
// latent down-projections and row-parallel biases whole. expert: the routed experts' fc1 and
// fc2, E/ep experts per rank, each split over etp. The two are sharded over different groups
// by the distributed optimizer.
struct LayerParameters {
  double dense = 0, expert = 0;
  // Of dense, what no Transformer Engine GEMM reads as a weight: the norms, the biases, the
  // router and the shared experts' gate (FP8 recipes leave them in 16 bits), and the MTP
  // block's embedding copy.
  double not_gemm = 0;
  double total() const { return dense + expert; }
  double gemm() const { return dense - not_gemm + expert; }
};
LayerParameters layer_parameters(const TransformerModel& m, int i, const StepLayout& l);

// The expert layout Megatron accepts (one line naming the flag otherwise): ep > 1 needs
// experts, ep divides E, ep·etp divides t·C·dp, etp each expert's width; an MoE model under
// t > 1 needs sequence parallelism (as Megatron-Core requires); the model's moe_layers has
// one entry per layer.
void check_expert_layout(const TransformerModel& m, const StepLayout& l);

// The library workspaces a Megatron-LM run holds through PyTorch's allocator from its first
// step on (docs/step_memory.md, "What each stage holds"): two PyTorch cuBLAS workspaces and,
// under Transformer Engine, TE's own, and one more for each of the 4 streams of TE's grouped
// GEMM. Their sizes depend on the GPU: Transformer Engine's is 32 MiB from compute capability
// 9.0 and 4 MiB before; PyTorch's is CUBLAS_WORKSPACE_CONFIG's when the run sets it (':4096:8',
// as Megatron-LM's tests do, is 32 MiB), else 4096 KiB x 8 from 9.0 and 4096 KiB x 2 + 16 KiB
// x 8 before. The defaults are Hopper's.
struct LibraryWorkspaces {
  double pytorch = 32.0 * 1024 * 1024, transformer_engine = 32.0 * 1024 * 1024;
};
// cublas_workspace_config: the bytes CUBLAS_WORKSPACE_CONFIG gives (0: not set).
LibraryWorkspaces library_workspaces(int compute_major, double cublas_workspace_config = 0);
double library_workspace_bytes(bool transformer_engine, bool grouped_gemm, const LibraryWorkspaces& sizes = {});

// One stage of the step. Bytes are per GPU of that stage.
struct StageMemory {
  int stage = 0;
  int layers = 0;          // its layers, all chunks
  double parameters = 0;   // on one GPU
  double expert_parameters = 0;  // of them, the routed experts' (split over ep·etp)
  double weight_bytes = 0, grad_bytes = 0, optimizer_bytes = 0;
  double workspace_bytes = 0;  // StepConfig::workspace_bytes
  double fp8_weight_bytes = 0;  // StepConfig::fp8: the GEMM weights' FP8 caches (0 without FP8)
  double rest_bytes = 0;   // weights + gradients + optimizer state + workspaces + FP8 weight caches
  // At the peak:
  // Chunk-micro-batches whose layers' saved tensors are alive: forward ran, backward has not
  // yet passed through them (at the embedding's backward, its micro-batch's layers are freed).
  int microbatches_in_flight = 0;
  double activation_bytes = 0;     // their layers' saved tensors
  double embedding_bytes = 0;      // their token ids, embedding dropout masks (first chunk)
  double output_bytes = 0;         // their final norm, output layer input, fp32 softmax (last chunk)
  double recompute_working_set_bytes = 0;  // what recompute rebuilds for the layer in backward
  double grad_working_set_bytes = 0;       // gradients that layer's backward holds
  double loss_working_set_bytes = 0;       // the bf16 logits beside their fp32 copy (CrossEntropyFusion)
  double embedding_grad_bytes = 0;         // the word embedding's dense weight gradient
  // Megatron-FSDP's unsharded copies: the weights all-gathered (the stage's non-layer weights
  // for the whole step, the running and the prefetched layer's), and in a backward the
  // gradients not yet reduce-scattered (the running layer's, the output layer's).
  double fsdp_gathered_weight_bytes = 0;
  double fsdp_unsharded_grad_bytes = 0;
  // Everything at the peak beside the live saved tensors: the terms from the working sets on.
  double working_set_bytes() const {
    return recompute_working_set_bytes + grad_working_set_bytes + loss_working_set_bytes + embedding_grad_bytes +
           fsdp_gathered_weight_bytes + fsdp_unsharded_grad_bytes;
  }
  double step_peak_bytes = 0;  // rest_bytes + every term above: the peak of a training step
  // Before the first step: weights and gradient buffers, and with the distributed optimizer
  // the last model chunk's weights twice while DDP copies them into its parameter buffer.
  double setup_peak_bytes = 0;
  double peak_bytes = 0;       // the larger: allocated_bytes.all.peak from the start of the run
  std::string peak_at;  // the op: "forward mb 3 chunk 0", "backward mb 0 chunk 1", ...
};

// Every stage. Throws InvalidArgument (one line naming the option) for a layout the model
// cannot be split into.
std::vector<StageMemory> step_memory(const TransformerModel& m, const StepConfig& c);

// One micro-batch of one chunk: what its forward keeps (each term above, for one micro-batch).
struct ChunkBytes {
  double layers = 0, embedding = 0, output = 0;
  // Of `layers`, the MTP layers' saved tensors (the last chunk with --mtp-num-layers).
  double mtp_layers = 0;
  // Of `output`, what the chunk's first backward layer still finds alive: with MTP the first
  // is an MTP layer, whose lookups, enorm's and hnorm's inputs and eh_proj's input (and the
  // decoder's final norm's input) have their backward after it; without MTP nothing.
  double output_held = 0;
  // Fine-grained activation offloading: of `layers`, the bytes its groups move to the host
  // (of them the MTP layers' in mtp_offloaded), and of those the tail: for each group, the
  // chunk's last layer running it (the MTP layer first), which backward needs first and
  // Megatron keeps on the GPU when this chunk's backward is the next to run (tail_in_mtp: the
  // MTP layer's share). offloads: the chunk runs a group at all.
  double offloaded = 0, mtp_offloaded = 0, offload_tail = 0, tail_in_mtp = 0;
  bool offloads = false;
  double total() const { return layers + embedding + output; }
};
// first_layer: the chunk's first layer's index in the model (which of its layers are MoE).
ChunkBytes chunk_bytes(const TransformerModel& m, const StepConfig& c, int layers, bool first, bool last,
                       int first_layer = 0);

// What the first layer of a chunk's backward holds beside the live bytes: what recompute
// rebuilds and the gradients it holds at once. last_layer: the chunk's last layer in the model.
struct ChunkTransients {
  double recompute = 0, grads = 0;
  double first_layer = 0;  // what the chunk's first layer keeps (a forward overlapped with a backward)
};
ChunkTransients chunk_transients(const TransformerModel& m, const StepConfig& c, int layers, int last_layer);

}  // namespace actbench::theory
