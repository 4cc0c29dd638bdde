#pragma once
// One measurement: a stack of layers in one configuration, timed over warm-up + N
// iterations, with its activation memory measured twice over: the saved-for-backward
// struct's bytes, and the allocator's requested-bytes delta across forward.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.hpp"
#include "layers/config.hpp"
#include "layers/layer.hpp"
#include "runtime/communicator.hpp"
#include "runtime/cupti_profiler.hpp"
#include "runtime/kernel_report.hpp"
#include "runtime/timing.hpp"

namespace actbench {

struct ExperimentSpec {
  LayerDims dims;
  LayerPolicy policy;
  DType dtype = DType::bf16;
  int layers = 1;
  StackRecompute stack;  // with full recompute: Megatron's --recompute-method over the layers
  int warmup = 1;
  int iters = 5;
  uint64_t seed = 1234;
  double link_gbps = 450.0;  // per direction, for the modeled communication time
  CuptiProfiler* profiler = nullptr;  // when set, records kernel time per phase over the timed iterations
  KernelReportRecorder* kernel_report = nullptr;  // when set, counts the kernels per phase over the timed iterations
  Communicator* cp_group = nullptr;  // the context-parallel group (--cp C; null: C = 1)
  // The expert-parallel group of an MoE layer (--ep; null: 1) when it spans ep/t data-parallel
  // replicas of the TP group (Megatron-Core's order: EP rank r is TP rank r % t of replica r / t):
  // its ranks hold E/ep experts each.
  Communicator* ep_group = nullptr;
  int ep() const { return ep_group ? ep_group->size() : 1; }
  // Those replicas (null: one): this rank's among the ranks of its TP rank, ordered by replica.
  // Each has its own micro-batch, batch slice dp_rank of the canonical [s, dp·b, h]; the
  // gradients of everything but the experts are summed over it in --dump, as data parallelism
  // would. At t = 1 it is the expert-parallel group itself.
  Communicator* dp_group = nullptr;
  int dp() const { return dp_group ? dp_group->size() : 1; }
  // --expert-model-parallel-size = --tp (expert tensor parallelism 1): the experts over the
  // tensor-parallel group itself, each TP rank's sequence rows travelling to their experts' ranks.
  bool experts_over_tp = false;
  // The expert-parallel size the layer's experts are split over, for a TP group of tp ranks.
  int expert_parallel(int tp) const { return experts_over_tp ? tp : ep(); }
  // --expert-tensor-parallel-size = --tp: each expert split over the tensor-parallel group
  // (LayerOptions::expert_tensor_parallel); its size for a TP group of tp ranks.
  bool expert_tensor_parallel = false;
  int expert_tensor_parallel_size(int tp) const { return expert_tensor_parallel ? tp : 1; }
  // MoE layers on meta: the tokens each expert processes (--moe-tokens-per-expert); empty: balanced.
  std::vector<int64_t> moe_tokens_per_expert;
  int cp() const { return cp_group ? cp_group->size() : 1; }
};

struct ExperimentResult {
  std::string status = "ok";  // ok | oom
  std::string message;
  Summary fwd_ms, bwd_ms, total_ms;  // per layer, max over ranks per iteration; emulated copies excluded
  Summary comm_ms_emulated;          // per layer: the emulated collectives' local copies (--emulate-tp)
  int64_t act_bytes = 0;             // per layer, paper categories, from SavedActivations
  int64_t act_extra_bytes = 0;       // per layer, LayerNorm statistics
  int64_t stack_act_bytes = 0;       // the whole stack: every layer's paper bytes and the group checkpoints
  int64_t fwd_retained_bytes = 0;    // per layer, allocator requested-bytes delta across forward
  int64_t peak_allocated_bytes = 0;
  int64_t peak_reserved_bytes = 0;
  double comm_bytes = 0;             // per layer per iteration, ring bytes sent by one rank (TP and CP groups)
  double comm_bytes_cp = 0;          // of which the context-parallel group's
  double comm_bytes_ep = 0;          // of which the expert-parallel group's (the tokens' all-to-alls)
  double comm_ms_modeled = 0;        // comm_bytes / link bandwidth
  std::vector<std::pair<std::string, int64_t>> act_by_category;  // layer 0
  MoeRoutingStats moe;               // layer 0's routing (MoE layers; empty histogram otherwise)
  PhaseLog phases;                   // host-clock totals over the timed iterations
  std::vector<PhaseTime> kernel_phases;  // with a profiler: GPU kernel time per phase, all timed iterations
  int64_t cupti_dropped_records = 0;     // with a profiler: records CUPTI dropped (non-zero: sums are short)
  std::vector<KernelReportRecorder::Row> kernel_report;  // with a kernel_report: its rows, all timed iterations
};

ExperimentResult run_experiment(Backend& be, Communicator& comm, const ExperimentSpec& spec);

class Layer;
using LayerStack = std::vector<std::unique_ptr<Layer>>;

// One configuration's stack of layers with its upstream gradient: the unit that layer_run
// and bench/ time, so both measure the same thing the same way (Backend::mark on the
// compute stream; per-layer times). Every rank of the group constructs and iterates it.
class LayerStackRunner {
 public:
  LayerStackRunner(Backend& be, Communicator& comm, const ExperimentSpec& spec);
  ~LayerStackRunner();
  struct Iteration {
    double fwd_ms = 0, bwd_ms = 0, total_ms = 0;  // per layer, this rank, emulated copies excluded
    double comm_ms_emulated = 0;                   // per layer: time of the emulated collectives' copies
    // With measure_memory (else zero):
    int64_t act_bytes = 0, act_extra_bytes = 0, fwd_retained_bytes = 0, stack_act_bytes = 0;
    int64_t peak_allocated_bytes = 0, peak_reserved_bytes = 0;
    double comm_bytes = 0, comm_bytes_cp = 0, comm_bytes_ep = 0;
    std::vector<std::pair<std::string, int64_t>> act_by_category;
    MoeRoutingStats moe;
  };
  // Forward and backward of the whole stack on a fresh copy of the input (drawn once, in the
  // constructor: the timed loop generates nothing on the host). measure_memory resets the
  // allocator's peaks and the communicator's byte counts first.
  Iteration iteration(bool measure_memory = false, PhaseLog* log = nullptr);
  const LayerStack& layers() const { return *stack_; }  // after an iteration: each layer's gradients

 private:
  int group_size() const;  // uniform recompute's N, else 0
  std::vector<Tensor> forward_stack(Tensor& h);
  void backward_stack(const Tensor& dy, std::vector<Tensor>& checkpoints);
  void count_saved_bytes(const std::vector<Tensor>& checkpoints, Iteration& out) const;

  Backend& be_;
  Communicator& comm_;
  ExperimentSpec spec_;
  std::unique_ptr<LayerStack> stack_;
  Tensor x_, dy_;
};

struct CanonicalTensor {
  std::string name;
  Shape shape;
  std::vector<float> data;
};
// One forward and backward of a single layer; returns the full, unsharded tensors of the
// --dump contract (x, y, dy, dx, the parameters and grad.<name> for each), gathered from all
// ranks. Every rank calls it; every rank gets the result.
std::vector<CanonicalTensor> run_layer_canonical(Backend& be, Communicator& comm, const ExperimentSpec& spec);

// Runs one forward and backward of a single layer and writes the canonical tensors of the
// --dump contract as float32 .npy files into `dir` (rank 0 writes; every rank must call).
void dump_layer(Backend& be, Communicator& comm, const ExperimentSpec& spec, const std::string& dir);

}  // namespace actbench
