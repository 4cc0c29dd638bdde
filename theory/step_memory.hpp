#pragma once
// The whole training step's memory on each pipeline stage, as PyTorch's caching allocator
// counts it in a Megatron-LM run (torch.cuda.memory_stats(): allocated_bytes.all.current
// after a step, allocated_bytes.all.peak during one). docs/step_memory.md derives each term.
//
// At rest, between steps: the stage's parameters as weights (bf16/fp16: 2 bytes, fp32: 4),
// Megatron's main_grad buffer (fp32 with bf16 training; the distributed optimizer reduce-
// scatters in place, so every rank keeps all of it), and the optimizer's state (fp32 master
// copy unless the weights are fp32, Adam's two moments), divided by the data-parallel size
// with the distributed optimizer.
//
// Under context parallelism (C ranks, StepLayout::cp) every sequence-dependent term is the
// rank's s/C rows: the layers' saved tensors (layer_pieces.hpp with Dims::cp), the token ids,
// the output and loss terms, the working sets, plus the attention exchange's buffers (the
// key/value blocks a ring holds, or the gathered keys and values). Parameters and gradients
// do not shrink; the distributed optimizer's state is divided by dp·C.
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
// distributed optimizer's setup can peak higher (setup_peak_bytes).
//
// Not modelled (a real run adds them): library workspaces (cuBLAS/TE, NCCL buffers), the
// allocator's rounding of each tensor to 512 bytes, the distributed optimizer's buffer
// padding (≤ 64 elements per parameter), transients inside a forward op.
#include <string>
#include <vector>

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
};

struct StepConfig {
  StepLayout layout;
  double seq = 0;           // s
  double micro_batch = 1;   // b
  double global_batch = 0;  // sequences per step (0: micro_batch · dp, one micro-batch)
  LayerPolicy policy;       // recompute, SP, attention, recompute modules
  StackRecompute stack;     // full recompute's --recompute-method / --recompute-num-layers
  bool distribute_saved_activations = false;  // full recompute's checkpoints split over t without SP
  bool distributed_optimizer = false;
  bool gradient_accumulation_fusion = true;   // weight gradients go straight into main_grad
  TrainingPrecision precision;

  double microbatches() const;  // global_batch / (micro_batch · dp)
  int world_size() const;       // t · cp · p · dp
  // The layer's dimensions on one rank: s, b, h, a with t and cp (each rank keeps s/C rows).
  Dims layer_dims(const TransformerModel& m) const;
};

// The layers of each virtual stage, index chunk·p + stage (Megatron's assignment).
std::vector<int> virtual_stage_layers(const TransformerModel& m, const StepLayout& l);

// Parameters of one layer on one tensor-parallel rank: the split weights and biases / t, the
// norms and the row-parallel biases whole.
double layer_parameters(const TransformerModel& m, double t);

// One stage of the step. Bytes are per GPU of that stage.
struct StageMemory {
  int stage = 0;
  int layers = 0;          // its layers, all chunks
  double parameters = 0;   // on one GPU
  double weight_bytes = 0, grad_bytes = 0, optimizer_bytes = 0;
  double rest_bytes = 0;   // weights + gradients + optimizer state
  // At the peak:
  // Chunk-micro-batches whose layers' saved tensors are alive: forward ran, backward has not
  // yet passed through them (at the embedding's backward, its micro-batch's layers are freed).
  int microbatches_in_flight = 0;
  double activation_bytes = 0;     // their layers' saved tensors
  double embedding_bytes = 0;      // their token ids, embedding dropout masks (first chunk)
  double output_bytes = 0;         // their final norm, output layer input, fp32 softmax (last chunk)
  double recompute_working_set_bytes = 0;  // what recompute rebuilds for the layer in backward
  double grad_working_set_bytes = 0;       // gradients that layer's backward holds
  double loss_working_set_bytes = 0;       // the bf16 logits beside their fp32 copy
  double embedding_grad_bytes = 0;         // the word embedding's dense weight gradient
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
  double total() const { return layers + embedding + output; }
};
ChunkBytes chunk_bytes(const TransformerModel& m, const StepConfig& c, int layers, bool first, bool last);

}  // namespace actbench::theory
