#include "theory/iteration_model.hpp"

#include <cmath>
#include <stdexcept>

#include "theory/flops.hpp"
#include "theory/memory_totals.hpp"
#include "theory/paper_values.hpp"

namespace actbench::theory {

LayerTimes paper_table4_layer_times(const std::string& config) {
  if (auto row = paper::table4_row(config)) return {row->fwd_ms, row->bwd_ms, 0};
  if (config == "full+sp") {
    const auto full = *paper::table4_row("full"), sp = *paper::table4_row("sp");
    const double saving = full.fwd_ms - sp.fwd_ms;  // SP's forward is 0.5 ms faster
    return {full.fwd_ms - saving, full.bwd_ms - saving, 0};
  }
  parse_config(config);  // throws with the list of names
  throw std::invalid_argument("no Table 4 time for '" + config + "'");
}

namespace {
double rank_layer_forward_flops(const ModelSpec& m) {
  return (24 * m.b * m.s * m.h * m.h + 4 * m.b * m.s * m.s * m.h) / m.t;
}
}  // namespace

LayerTimes scale_layer_times(const LayerTimes& times, const ModelSpec& from, const ModelSpec& to) {
  const double k = rank_layer_forward_flops(to) / rank_layer_forward_flops(from);
  return {times.fwd_ms * k, times.bwd_ms * k, times.comm_ms * k};
}

IterationEstimate estimate_iteration(const ModelSpec& m, LayerPolicy c, const LayerTimes& layer,
                                     const IterationOptions& opt) {
  validate(m);
  const double n = m.microbatches();
  if (std::floor(n) != n) throw std::invalid_argument(m.name + ": B / (b * dp) is not a whole number");
  IterationEstimate e;
  e.layer_fwd_ms = layer.fwd_ms + layer.comm_ms / 2;
  e.layer_bwd_ms = layer.bwd_ms + layer.comm_ms / 2;
  if (!(e.layer_fwd_ms > 0) || !(e.layer_bwd_ms > 0))
    throw std::invalid_argument(m.name + ": layer forward and backward times must be positive");

  // The output layer runs at the rate the layer's forward achieves (both are GEMM-bound);
  // its backward is twice its forward. Full recompute does not rerun it.
  const double rate_flops_per_ms = rank_layer_forward_flops(m) / layer.fwd_ms;
  e.output_fwd_ms = 2 * m.b * m.s * m.h * m.v / m.t / rate_flops_per_ms;
  e.output_bwd_ms = 2 * e.output_fwd_ms;

  // Between stages Megatron sends the [s, b, h] activation split over the t ranks
  // (scatter-gather optimisation) over the inter-node network.
  e.p2p_ms = m.p > 1 ? opt.elem_bytes * m.s * m.b * m.h / m.t / opt.gpu.network_bytes_per_s * 1e3 : 0;

  const int virtual_stages = m.p * m.m;
  const double layers_per_chunk = m.L / virtual_stages;
  PipelineCosts costs;
  costs.fwd_ms.assign(virtual_stages, layers_per_chunk * e.layer_fwd_ms);
  costs.bwd_ms.assign(virtual_stages, layers_per_chunk * e.layer_bwd_ms);
  costs.fwd_ms.back() += e.output_fwd_ms;
  costs.bwd_ms.back() += e.output_bwd_ms;
  costs.p2p_ms = e.p2p_ms;
  e.pipeline = simulate_pipeline(m.p, static_cast<int>(n), m.m, costs);

  // Optimizer on the stage with the most parameters (the first: layers + embedding), HBM-bound.
  const double params = first_stage_parameters_per_gpu(m);
  e.optimizer_ms = params * opt.optimizer_bytes_per_param / opt.gpu.hbm_bytes_per_s * 1e3;
  // Ring all-reduce of the gradients over dp replicas: 2(dp−1)/dp of the bytes per rank.
  e.dp_allreduce_ms =
      m.dp > 1 ? 2.0 * (m.dp - 1) / m.dp * params * opt.grad_bytes / opt.gpu.network_bytes_per_s * 1e3 : 0;
  // Tied word embedding: first and last stage all-reduce its gradient (two ranks: S bytes each).
  e.embedding_allreduce_ms = m.p > 1 ? m.v * m.h / m.t * opt.grad_bytes / opt.gpu.network_bytes_per_s * 1e3 : 0;

  e.iteration_s = (e.pipeline.makespan_ms + e.optimizer_ms + e.dp_allreduce_ms + e.embedding_allreduce_ms) / 1e3;
  // B is the global batch (all dp replicas), so these are the whole iteration's FLOPs.
  e.model_flops = hardware_flops(m, Recompute::none, FlopAccounting::paper);
  e.hardware_flops = hardware_flops(m, c.recompute, FlopAccounting::paper);
  e.mfu_percent = utilization_percent(e.model_flops, e.iteration_s, m.gpus(), opt.gpu.peak_flops);
  e.hfu_percent = utilization_percent(e.hardware_flops, e.iteration_s, m.gpus(), opt.gpu.peak_flops);
  return e;
}

}  // namespace actbench::theory
