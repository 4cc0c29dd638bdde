#pragma once
// Pipeline-parallel schedules as Megatron-LM runs them (1F1B, and interleaved 1F1B with m
// model chunks per stage), and an event simulator over them: how many microbatches each
// stage holds at its peak (→ activation memory per stage) and the pipeline bubble.
#include <string>
#include <vector>

namespace actbench::theory {

struct PipelineOp {
  bool forward = true;
  int microbatch = 0;  // 0 … N−1
  int chunk = 0;       // model chunk on this stage, 0 … m−1 (virtual stage = chunk·p + stage)
};

// The order in which each of the p stages runs its forward and backward passes for N
// microbatches (m = 1: 1F1B; m > 1: Megatron's interleaved schedule, the micro-batches in
// groups of `group` (Megatron's --microbatch-group-size-per-virtual-pipeline-stage; 0: p),
// which must lie in [p, N] with N mod group 0 or at least p). Warm-up forwards (1F1B:
// p − stage − 1; interleaved: 2(p − stage − 1) + (m − 1)·group, or all of them when that
// reaches N·m), then one forward + one backward at a time, then the cool-down backwards.
// Throws std::invalid_argument for p, N, m, group it cannot schedule.
std::vector<std::vector<PipelineOp>> pipeline_order(int p, int microbatches, int m = 1, int group = 0);

// Throws std::invalid_argument unless Megatron's interleaved schedule takes this group size.
void check_interleaved_group(int p, int microbatches, int group);

// Chunk-microbatches stage `stage` holds at its peak (forwards whose backward has not yet
// run), from the order alone: p − stage for 1F1B (N ≥ p); for interleaved stage 0 holds
// p·m + p − 1, i.e. (1 + (p−1)/(p·m)) × p·m chunks of L/(p·m) layers.
std::vector<int> max_in_flight(const std::vector<std::vector<PipelineOp>>& order);

// Micro-batches chunk 0 of stage 0 holds at its peak (forwards whose backward has not run):
// the ones whose embedding output, embedding dropout mask and token ids are alive. 1F1B:
// min(p, N); interleaved (m > 1): 2p once N >= 2p, since chunk 0 runs p·(m−1) + 2(p−1)
// warm-up forwards ahead of the first backward. Counted on the schedule (stage_zero_in_flight), not assumed.
int first_chunk_microbatches_in_flight(int p, int microbatches, int m = 1, int group = 0);

// Stage 0's two peaks, counted on its order: the chunk-microbatches it holds
// (max_in_flight(order)[0]) and the micro-batches its chunk 0 holds
// (first_chunk_microbatches_in_flight). Only the warm-up and one period (G·m steps, G the group) of
// the steady phase are walked, so the cost grows with G·m, not with the micro-batches.
// The ops of stage `stage` that hold all of its memory peaks, in order: its warm-up forwards
// and one period (G·m forward/backward pairs) of its steady phase. Afterwards the live set of
// chunk-microbatches repeats (the chunk an op works on repeats every G·m ops of each kind) and
// the cool-down only frees; with a short last group every op is returned. Throws std::invalid_argument like pipeline_order.
std::vector<PipelineOp> stage_peak_ops(int p, int microbatches, int m, int stage, int group = 0);

// Every op of stage `stage`, in order (pipeline_order's row for it).
std::vector<PipelineOp> stage_ops(int p, int microbatches, int m, int stage, int group = 0);

// The k-th backward op (0-based) of a stage, the same on every stage: backwards run micro-batch
// by micro-batch under 1F1B, and under the interleaved schedule group by group from the last
// chunk down. Throws std::invalid_argument like pipeline_order, or for k outside [0, N·m).
PipelineOp backward_op(int p, int microbatches, int m, int k, int group = 0);

struct StageZeroPeaks {
  int chunks = 0;
  int first_chunk_microbatches = 0;
};
StageZeroPeaks stage_zero_in_flight(int p, int microbatches, int m = 1, int group = 0);

struct PipelineCosts {
  // Duration of one microbatch's forward / backward on each virtual stage (size p·m,
  // index chunk·p + stage): the layers of that chunk plus, on the last virtual stage, the
  // output layer. Empty: 1 ms forward, 2 ms backward everywhere.
  std::vector<double> fwd_ms, bwd_ms;
  double p2p_ms = 0;  // activation / gradient transfer between consecutive virtual stages
};

struct PipelineResult {
  int p = 1, microbatches = 1, m = 1;
  std::vector<int> max_in_flight_chunks;  // per stage
  std::vector<double> busy_ms;            // per stage: time spent computing
  double makespan_ms = 0;                 // first forward start → last backward end
  // 1 − busy/makespan of the busiest stage: the share of the iteration that stage idles.
  double bubble_fraction = 0;
  // The paper's bubble ratio, idle time over ideal time: (p − 1)/(m·N).
  double bubble_ratio_analytic = 0;
};

// Each stage runs its ops in pipeline_order; an op starts when its stage is free and its
// input has arrived: forward (mb, v) after forward (mb, v−1) + p2p, backward (mb, v) after
// backward (mb, v+1) + p2p (the last virtual stage after its own forward).
PipelineResult simulate_pipeline(int p, int microbatches, int m, const PipelineCosts& costs = {});

}  // namespace actbench::theory
