#include "theory/layer_cost.hpp"

#include <algorithm>

namespace actbench::theory {

LayerWork layer_work(const Dims& d, LayerPolicy c, double E) {
  const double t = d.t, sbh = d.s * d.b * d.h, as2b = d.a * d.s * d.s * d.b;
  const double k = c.sequence_parallel ? t : 1.0;  // LayerNorm and dropout rows split by SP
  const double ring = (t - 1) / t;                 // all-gather / reduce-scatter share per rank

  PassWork fwd;
  fwd.gemm_flops = (24 * sbh * d.h + 4 * as2b / d.a * d.h) / t;  // 24bsh² + 4bs²h, split over t
  fwd.memory_bytes = 2 * (2 * E) * sbh / k           // two LayerNorms: read x, write y
                     + 2 * E * as2b / t              // fused scale + mask + softmax
                     + (2 * E + 1) * as2b / t        // attention dropout: read, write, mask
                     + 2 * E * 4 * sbh / t           // fused bias + GeLU
                     + 2 * (3 * E + 1) * sbh / k;    // two bias + dropout + residual: 2 reads, write, mask
  // TP: two all-reduces (2·ring·S each); SP: two all-gathers and two reduce-scatters — same bytes.
  fwd.comm_bytes = 4 * ring * E * sbh;
  fwd.exposed_comm_bytes = fwd.comm_bytes;  // the forward waits for each collective

  PassWork bwd;
  bwd.gemm_flops = 2 * fwd.gemm_flops;  // data and weight gradients
  bwd.memory_bytes = 2 * (3 * E) * sbh / k          // LayerNorm backward: read x and dy, write dx
                     + 3 * E * as2b / t             // softmax backward: read y and dy, write dx
                     + (2 * E + 1) * as2b / t       // dropout backward: read dy and mask, write dx
                     + 3 * E * 4 * sbh / t          // GeLU backward
                     + 2 * (2 * E + 1) * sbh / k    // dropout backward of the two residual branches
                     + 2 * (3 * E) * sbh / k;       // residual gradient sums
  bwd.comm_bytes = 4 * ring * E * sbh + (c.sequence_parallel ? 2 * ring * E * sbh : 0);  // SP re-gathers its shards
  bwd.exposed_comm_bytes = 0;  // overlapped with the weight-gradient GEMMs (docs/paper.md Table 4 note)

  switch (c.recompute) {
    case Recompute::none: break;
    case Recompute::selective:  // QKᵀ, softmax, dropout, ·V again
      bwd.gemm_flops += 4 * as2b / d.a * d.h / t;
      bwd.memory_bytes += 2 * E * as2b / t + (2 * E + 1) * as2b / t;
      break;
    case Recompute::full:  // the whole forward again, collectives included
      bwd.gemm_flops += fwd.gemm_flops;
      bwd.memory_bytes += fwd.memory_bytes;
      bwd.comm_bytes += fwd.comm_bytes;
      bwd.exposed_comm_bytes += fwd.exposed_comm_bytes;
      break;
  }
  return {fwd, bwd};
}

CostRates cost_rates(const Gpu& g, double efficiency) {
  return {g.hbm_bytes_per_s * efficiency, g.nvlink_bytes_per_s * efficiency};
}

PassSplit split_pass(double measured_ms, const PassWork& w, const CostRates& r) {
  PassSplit s;
  s.memory_ms = w.memory_bytes / r.memory_bytes_per_s * 1e3;
  s.comm_ms = w.exposed_comm_bytes / r.link_bytes_per_s * 1e3;
  s.gemm_ms = std::max(measured_ms - s.memory_ms - s.comm_ms, 0.1 * measured_ms);
  return s;
}

LayerTimes scale_layer_times_by_work(const LayerTimes& measured, const Dims& from, const Dims& to, LayerPolicy c,
                                     const CostRates& r, double elem_bytes) {
  LayerWork wf = layer_work(from, c, elem_bytes), wt = layer_work(to, c, elem_bytes);
  // Emulated TP reports its (modeled) communication apart: then fwd/bwd hold none of it.
  const bool comm_apart = measured.comm_ms > 0;
  if (comm_apart)
    for (PassWork* w : {&wf.fwd, &wf.bwd, &wt.fwd, &wt.bwd}) w->exposed_comm_bytes = 0;
  auto pass = [&](double ms, const PassWork& f, const PassWork& tw) {
    const PassSplit s = split_pass(ms, f, r);
    return s.gemm_ms * tw.gemm_flops / f.gemm_flops + tw.memory_bytes / r.memory_bytes_per_s * 1e3 +
           tw.exposed_comm_bytes / r.link_bytes_per_s * 1e3;
  };
  LayerTimes out;
  out.fwd_ms = pass(measured.fwd_ms, wf.fwd, wt.fwd);
  out.bwd_ms = pass(measured.bwd_ms, wf.bwd, wt.bwd);
  const double from_comm = wf.fwd.comm_bytes + wf.bwd.comm_bytes;
  const double to_comm = wt.fwd.comm_bytes + wt.bwd.comm_bytes;
  out.comm_ms = comm_apart && from_comm > 0 ? measured.comm_ms * to_comm / from_comm : 0;
  return out;
}

}  // namespace actbench::theory
