#include "theory/pipeline.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

namespace actbench::theory {

void check_interleaved_group(int p, int microbatches, int group) {
  const std::string N = std::to_string(microbatches), P = std::to_string(p), G = std::to_string(group);
  if (group < p || group > microbatches)
    throw std::invalid_argument("pipeline: the interleaved schedule's micro-batch group (" + G +
                                ") must lie in [p = " + P + ", micro-batches = " + N + "]");
  const int last = microbatches % group;
  if (last > 0 && last < p)
    throw std::invalid_argument("pipeline: the interleaved schedule needs the micro-batches (" + N +
                                ") mod its micro-batch group (" + G + ") to be 0 or at least p (" + P + ")");
}

namespace {

// Megatron-LM schedules.py, forward_backward_pipelining_with_interleaving: the micro-batches
// run in groups of G (--microbatch-group-size-per-virtual-pipeline-stage, default p), each
// group through chunk 0, then chunk 1, ...; the last group holds what is left (N mod G, or
// G). The k-th forward (backward) op of a stage works on this chunk (backward: from the last
// chunk down) and microbatch.
PipelineOp interleaved_op(int k, bool forward, int microbatches, int m, int group) {
  const int groups = (microbatches + group - 1) / group, per_group = group * m;
  const int index = std::min(k / per_group, groups - 1);
  const int size = index == groups - 1 ? microbatches - index * group : group;
  const int offset = k - index * per_group;
  int chunk = offset / size;
  if (!forward) chunk = m - 1 - chunk;
  return {forward, index * group + offset % size, chunk};
}

// One stage's order, op by op: `warmup` forwards, then one forward and one backward at a
// time (the steady phase), then the remaining backwards.
struct StageOrder {
  int p = 1, m = 1, microbatches = 1, group = 1, total = 0, warmup = 0;

  int size() const { return 2 * total; }
  int steady() const { return total - warmup; }
  PipelineOp forward(int k) const {
    return m == 1 ? PipelineOp{true, k, 0} : interleaved_op(k, true, microbatches, m, group);
  }
  PipelineOp backward(int k) const {
    return m == 1 ? PipelineOp{false, k, 0} : interleaved_op(k, false, microbatches, m, group);
  }
  PipelineOp at(int i) const {
    if (i < warmup) return forward(i);
    const int j = i - warmup;
    if (j < 2 * steady()) return j % 2 == 0 ? forward(warmup + j / 2) : backward(j / 2);
    return backward(j - steady());
  }
};

StageOrder stage_order(int p, int microbatches, int m, int stage, int group) {
  if (p < 1 || microbatches < 1 || m < 1)
    throw std::invalid_argument("pipeline: p, microbatches and m must be >= 1");
  StageOrder o;
  o.p = p;
  o.m = m;
  o.microbatches = microbatches;
  o.group = group > 0 ? group : p;
  o.total = microbatches * m;
  if (m > 1) check_interleaved_group(p, microbatches, o.group);
  // Megatron's warm-up: 1F1B's p - stage - 1; interleaved, 2(p - stage - 1) + (m - 1)·G, all
  // of the ops' forwards first when that reaches them.
  const int warmup = m == 1 ? p - stage - 1 : (p - stage - 1) * 2 + (m - 1) * o.group;
  o.warmup = std::min(warmup, o.total);
  return o;
}

}  // namespace

std::vector<PipelineOp> stage_ops(int p, int microbatches, int m, int stage, int group) {
  if (stage < 0 || stage >= p) throw std::invalid_argument("pipeline: stage out of range");
  const StageOrder o = stage_order(p, microbatches, m, stage, group);
  std::vector<PipelineOp> ops;
  ops.reserve(o.size());
  for (int i = 0; i < o.size(); ++i) ops.push_back(o.at(i));
  return ops;
}

std::vector<std::vector<PipelineOp>> pipeline_order(int p, int microbatches, int m, int group) {
  stage_order(p, microbatches, m, 0, group);  // throws for p, N, m it cannot schedule
  std::vector<std::vector<PipelineOp>> order(p);
  for (int stage = 0; stage < p; ++stage) order[stage] = stage_ops(p, microbatches, m, stage, group);
  return order;
}

std::vector<PipelineOp> stage_peak_ops(int p, int microbatches, int m, int stage, int group) {
  if (stage < 0 || stage >= p) throw std::invalid_argument("pipeline: stage out of range");
  const StageOrder o = stage_order(p, microbatches, m, stage, group);
  // The chunks repeat every G·m ops while the groups are whole; a short last group changes
  // the pattern at the end, so then every op is walked.
  const int period = o.group * m;
  const bool whole_groups = m == 1 || microbatches % o.group == 0;
  const int prefix = whole_groups ? o.warmup + 2 * std::min(o.steady(), period) : o.size();
  std::vector<PipelineOp> ops;
  ops.reserve(prefix);
  for (int i = 0; i < prefix; ++i) ops.push_back(o.at(i));
  return ops;
}

PipelineOp backward_op(int p, int microbatches, int m, int k, int group) {
  const StageOrder o = stage_order(p, microbatches, m, 0, group);
  if (k < 0 || k >= o.total) throw std::invalid_argument("pipeline: backward op out of range");
  return o.backward(k);
}

StageZeroPeaks stage_zero_in_flight(int p, int microbatches, int m, int group) {
  StageZeroPeaks peaks;
  int live = 0, first_chunk_live = 0;
  for (const PipelineOp& op : stage_peak_ops(p, microbatches, m, 0, group)) {
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

int first_chunk_microbatches_in_flight(int p, int microbatches, int m, int group) {
  return stage_zero_in_flight(p, microbatches, m, group).first_chunk_microbatches;
}

}  // namespace actbench::theory
