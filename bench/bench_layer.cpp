// The whole layer, forward + backward, per configuration (the paper's five and full+sp).
//   bench_layer --backend=cuda              22B layer, t = 8 emulated (Table 4's setting)
//   bench_layer --backend=cpu               a small layer (CI smoke)
//   mpirun -np 2 bench_layer --backend=cpu  real ranks; rank 0 reports the max over ranks
// Manual time is the forward + backward of one layer (Backend::mark: CUDA events on GPU),
// the same LayerStackRunner that layer_run times. Counters: activation bytes per layer
// (measured), forward and backward ms, model TFLOP/s per rank (docs/paper.md Eq. 7 per layer).
#include "bench/bench_common.hpp"
#include "kernels/backend_comm.hpp"
#include "layers/config.hpp"
#include "runners/experiment.hpp"
#include "runners/presets.hpp"

namespace actbench::bench {
namespace {

ExperimentSpec layer_spec(const std::string& config) {
  ExperimentSpec spec;
  spec.policy = parse_config(config);
  if (context().shape == "paper") {
    spec.dims = find_preset(kPaperShapeModel).dims;
    spec.dtype = DType::bf16;
  } else {
    spec.dims = LayerDims{64, 2, 256, 4};
    spec.dtype = DType::fp32;
  }
  spec.dims.spec.attention_dropout = spec.dims.spec.hidden_dropout = 0.1f;
  return spec;
}

void BM_layer(benchmark::State& state, const std::string& config) {
  BenchContext& ctx = context();
  if (ctx.skipped) {
    state.SkipWithError(("skipped: " + ctx.skip_reason).c_str());
    return;
  }
  if (!ctx.backend->computes()) {
    state.SkipWithError("the meta backend does not compute: nothing to time (use layer_run for its bytes)");
    return;
  }
  const ExperimentSpec spec = layer_spec(config);
  // One process emulates rank 0 of the preset's t (8) at the paper's shape unless real ranks are running.
  std::unique_ptr<Communicator> emulated;
  Communicator* comm = ctx.comm.get();
  if (ctx.shape == "paper" && comm->size() == 1) {
    emulated = make_backend_emulated_communicator(*ctx.backend, find_preset(kPaperShapeModel).tp);
    comm = emulated.get();
  }
  LayerStackRunner runner(*ctx.backend, *comm, spec);
  const LayerStackRunner::Iteration first = runner.iteration(true);  // also the warm-up
  runner.iteration();
  double fwd_sum = 0, bwd_sum = 0;
  for (auto _ : state) {
    LayerStackRunner::Iteration it = runner.iteration();
    std::vector<double> ms = {it.fwd_ms, it.bwd_ms, it.total_ms};
    ctx.comm->max_inplace(ms);
    fwd_sum += ms[0];
    bwd_sum += ms[1];
    state.SetIterationTime(ms[2] / 1e3);
  }
  if (ctx.backend->simulated()) state.SetLabel(kSimulatedLabel);
  const double n = static_cast<double>(state.iterations());
  const auto& d = spec.dims;
  const double s = static_cast<double>(d.s), b = static_cast<double>(d.b), h = static_cast<double>(d.h);
  // Eq. 7 per layer (forward + backward): 72 b s h^2 (1 + s / 6h), split over t ranks.
  const double model_flops = 72.0 * b * s * h * h * (1.0 + s / (6.0 * h)) / comm->size();
  state.counters["act_bytes"] = static_cast<double>(first.act_bytes);
  state.counters["fwd_ms"] = n > 0 ? fwd_sum / n : 0;
  state.counters["bwd_ms"] = n > 0 ? bwd_sum / n : 0;
  set_flop_counters(state, model_flops);
}

void register_layers() {
  for (const std::string& config : config_names()) {
    auto* b = benchmark::RegisterBenchmark((context().backend_name + "/layer/" + config).c_str(),
                                           [config](benchmark::State& s) { BM_layer(s, config); });
    b->UseManualTime()->Unit(benchmark::kMillisecond);
    if (context().comm->size() > 1) b->Iterations(10);  // identical iteration counts on every rank
  }
}

}  // namespace
}  // namespace actbench::bench

int main(int argc, char** argv) { return actbench::bench::bench_main(argc, argv, actbench::bench::register_layers); }
