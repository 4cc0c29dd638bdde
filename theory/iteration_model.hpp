#pragma once
// Iteration time of a whole training step (docs/paper.md Table 5) built from per-layer times:
// the pipeline schedule (theory/pipeline.hpp) over the layers' forward/backward times,
// the output layer on the last stage, pipeline point-to-point transfers, the optimizer
// step and the data-parallel gradient all-reduce. A model, not a fit: nothing in it is
// tuned to Table 5's times.
#include <string>

#include "theory/activation_memory.hpp"
#include "theory/models.hpp"
#include "theory/pipeline.hpp"

namespace actbench::theory {

// One transformer layer, one microbatch, one tensor-parallel rank.
struct LayerTimes {
  double fwd_ms = 0;
  double bwd_ms = 0;   // includes recomputation
  double comm_ms = 0;  // TP/SP communication not inside fwd/bwd (emulated TP): added, half to each pass
};

// Table 4's row for a configuration (22B layer, t = 8, A100); full+sp, which the paper does
// not time, as full recompute with SP's forward saving (7.2 ms instead of 7.7 in both the
// forward and the recomputation). Throws InvalidArgument (parse_config) for an unknown name.
LayerTimes paper_table4_layer_times(const std::string& config);

// Times of a layer of shape `to` from times measured at shape `from`, assuming the same
// achieved FLOP rate: scaled by the ratio of per-rank layer forward FLOPs
// (24bsh² + 4bs²h)/t. Larger GEMMs usually run closer to peak, so for models wider than
// the measured one this overestimates time.
LayerTimes scale_layer_times(const LayerTimes& times, const ModelSpec& from, const ModelSpec& to);

struct IterationOptions {
  Gpu gpu;  // network and HBM bandwidth for the transfers and the optimizer; peak for MFU
  // Adam step per parameter: read fp32 grad, master, m, v (16), write master, m, v (12) and the bf16 weight (2).
  double optimizer_bytes_per_param = 30;
  double grad_bytes = 4;  // fp32 gradients in the data-parallel all-reduce
  double elem_bytes = 2;  // activations sent between pipeline stages
};

struct IterationEstimate {
  double layer_fwd_ms = 0, layer_bwd_ms = 0;    // comm included
  double output_fwd_ms = 0, output_bwd_ms = 0;  // logits, per microbatch, last stage
  double p2p_ms = 0;                            // one transfer between stages
  PipelineResult pipeline;
  double optimizer_ms = 0, dp_allreduce_ms = 0, embedding_allreduce_ms = 0;
  double iteration_s = 0;
  double model_flops = 0, hardware_flops = 0;  // per iteration, paper accounting (Eq. 7, Eq. 8 / 96-formula)
  double mfu_percent = 0, hfu_percent = 0;
};

IterationEstimate estimate_iteration(const ModelSpec& m, LayerPolicy c, const LayerTimes& layer,
                                     const IterationOptions& opt);

}  // namespace actbench::theory
