#include "theory/pipeline.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

namespace actbench::theory {

namespace {

// Megatron-LM schedules.py, forward_backward_pipelining_with_interleaving: the k-th
// forward (backward) op of a stage works on this chunk and microbatch.
PipelineOp interleaved_op(int k, bool forward, int p, int m) {
  const int in_group = k % (p * m);
  int chunk = in_group / p;
  if (!forward) chunk = m - 1 - chunk;
  return {forward, (k / (p * m)) * p + k % p, chunk};
}

// One stage's order, op by op: `warmup` forwards, then one forward and one backward at a
// time (the steady phase), then the remaining backwards.
struct StageOrder {
  int p = 1, m = 1, total = 0, warmup = 0;

  int size() const { return 2 * total; }
  int steady() const { return total - warmup; }
  PipelineOp forward(int k) const { return m == 1 ? PipelineOp{true, k, 0} : interleaved_op(k, true, p, m); }
  PipelineOp backward(int k) const { return m == 1 ? PipelineOp{false, k, 0} : interleaved_op(k, false, p, m); }
  PipelineOp at(int i) const {
    if (i < warmup) return forward(i);
    const int j = i - warmup;
    if (j < 2 * steady()) return j % 2 == 0 ? forward(warmup + j / 2) : backward(j / 2);
    return backward(j - steady());
  }
};

StageOrder stage_order(int p, int microbatches, int m, int stage) {
  if (p < 1 || microbatches < 1 || m < 1)
    throw std::invalid_argument("pipeline: p, microbatches and m must be >= 1");
  if (m > 1 && microbatches % p != 0)
    throw std::invalid_argument("pipeline: the interleaved schedule needs the microbatches (" +
                                std::to_string(microbatches) + ") to be a multiple of p (" + std::to_string(p) + ")");
  StageOrder o;
  o.p = p;
  o.m = m;
  o.total = microbatches * m;
  if (m == 1) {
    o.warmup = std::min(p - stage - 1, microbatches);
  } else if (microbatches == p) {
    o.warmup = o.total;  // Megatron: all forwards first when N == p
  } else {
    o.warmup = std::min((p - stage - 1) * 2 + (m - 1) * p, o.total);
  }
  return o;
}

}  // namespace

std::vector<std::vector<PipelineOp>> pipeline_order(int p, int microbatches, int m) {
  stage_order(p, microbatches, m, 0);  // throws for p, N, m it cannot schedule
  std::vector<std::vector<PipelineOp>> order(p);
  for (int stage = 0; stage < p; ++stage) {
    const StageOrder o = stage_order(p, microbatches, m, stage);
    auto& ops = order[stage];
    ops.reserve(o.size());
    for (int i = 0; i < o.size(); ++i) ops.push_back(o.at(i));
  }
  return order;
}

std::vector<PipelineOp> stage_peak_ops(int p, int microbatches, int m, int stage) {
  if (stage < 0 || stage >= p) throw std::invalid_argument("pipeline: stage out of range");
  const StageOrder o = stage_order(p, microbatches, m, stage);
  const int prefix = o.warmup + 2 * std::min(o.steady(), p * m);
  std::vector<PipelineOp> ops;
  ops.reserve(prefix);
  for (int i = 0; i < prefix; ++i) ops.push_back(o.at(i));
  return ops;
}

StageZeroPeaks stage_zero_in_flight(int p, int microbatches, int m) {
  StageZeroPeaks peaks;
  int live = 0, first_chunk_live = 0;
  for (const PipelineOp& op : stage_peak_ops(p, microbatches, m, 0)) {
    const int step = op.forward ? 1 : -1;  // a backward frees its chunk's activations when it ends
    live += step;
    if (op.chunk == 0) first_chunk_live += step;
    peaks.chunks = std::max(peaks.chunks, live);
    peaks.first_chunk_microbatches = std::max(peaks.first_chunk_microbatches, first_chunk_live);
  }
  return peaks;
}

std::vector<int> max_in_flight(const std::vector<std::vector<PipelineOp>>& order) {
  std::vector<int> out;
  for (const auto& ops : order) {
    int now = 0, peak = 0;
    for (const auto& op : ops) {
      now += op.forward ? 1 : -1;  // a backward frees its chunk's activations when it ends
      peak = std::max(peak, now);
    }
    out.push_back(peak);
  }
  return out;
}

PipelineResult simulate_pipeline(int p, int microbatches, int m, const PipelineCosts& costs) {
  const auto order = pipeline_order(p, microbatches, m);
  const int stages_v = p * m;
  std::vector<double> fwd = costs.fwd_ms, bwd = costs.bwd_ms;
  if (fwd.empty()) fwd.assign(stages_v, 1.0);
  if (bwd.empty()) bwd.assign(stages_v, 2.0);
  if (static_cast<int>(fwd.size()) != stages_v || static_cast<int>(bwd.size()) != stages_v)
    throw std::invalid_argument("pipeline: need one forward and one backward time per virtual stage (p*m)");

  // End times of forward / backward of (microbatch, virtual stage); NaN-free sentinel = not yet run.
  const double not_run = -1;
  std::vector<double> fwd_end(static_cast<size_t>(microbatches) * stages_v, not_run);
  std::vector<double> bwd_end(fwd_end.size(), not_run);
  auto at = [&](int mb, int vs) { return static_cast<size_t>(mb) * stages_v + vs; };

  std::vector<size_t> next(p, 0);
  std::vector<double> free_at(p, 0.0), busy(p, 0.0);
  double first_start = std::numeric_limits<double>::infinity(), last_end = 0;
  size_t remaining = 0;
  for (const auto& ops : order) remaining += ops.size();
  while (remaining > 0) {
    bool progressed = false;
    for (int stage = 0; stage < p; ++stage) {
      while (next[stage] < order[stage].size()) {
        const PipelineOp& op = order[stage][next[stage]];
        const int vs = op.chunk * p + stage;
        double ready;
        if (op.forward) {
          if (vs == 0) ready = 0;
          else if (fwd_end[at(op.microbatch, vs - 1)] == not_run) break;
          else ready = fwd_end[at(op.microbatch, vs - 1)] + costs.p2p_ms;
        } else if (vs == stages_v - 1) {
          if (fwd_end[at(op.microbatch, vs)] == not_run) break;
          ready = fwd_end[at(op.microbatch, vs)];
        } else {
          if (bwd_end[at(op.microbatch, vs + 1)] == not_run) break;
          ready = bwd_end[at(op.microbatch, vs + 1)] + costs.p2p_ms;
        }
        const double start = std::max(ready, free_at[stage]);
        const double duration = op.forward ? fwd[vs] : bwd[vs];
        const double end = start + duration;
        (op.forward ? fwd_end : bwd_end)[at(op.microbatch, vs)] = end;
        free_at[stage] = end;
        busy[stage] += duration;
        first_start = std::min(first_start, start);
        last_end = std::max(last_end, end);
        ++next[stage];
        --remaining;
        progressed = true;
      }
    }
    if (!progressed) throw std::logic_error("pipeline: schedule deadlocks (an op waits on one that never runs)");
  }

  PipelineResult r;
  r.p = p;
  r.microbatches = microbatches;
  r.m = m;
  r.max_in_flight_chunks = max_in_flight(order);
  r.busy_ms = busy;
  r.makespan_ms = last_end - first_start;
  const double busiest = *std::max_element(busy.begin(), busy.end());
  r.bubble_fraction = r.makespan_ms > 0 ? 1.0 - busiest / r.makespan_ms : 0.0;
  r.bubble_ratio_analytic = (p - 1.0) / (static_cast<double>(m) * microbatches);
  return r;
}

int first_chunk_microbatches_in_flight(int p, int microbatches, int m) {
  return stage_zero_in_flight(p, microbatches, m).first_chunk_microbatches;
}

}  // namespace actbench::theory
