#include "runners/experiment.hpp"


#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <memory>

#include <nlohmann/json.hpp>

#include "layers/params.hpp"
#include "layers/layer.hpp"
#include "runners/run_args.hpp"
#include "runtime/csv.hpp"
#include "runtime/error.hpp"
#include "runtime/npy.hpp"

namespace actbench {
namespace {

// Philox streams of the layer input x and the upstream gradient dy (not any layer's).
constexpr uint32_t kActivationStreamLayer = 0xFFFFFFFFu;
constexpr uint32_t kStreamX = 100, kStreamDy = 101;


// Layer i's own policy: under a --recompute-method the stack, not the layer, decides what is
// recomputed: block's first N layers are full checkpoints, the rest keep everything; uniform's
// layers keep everything while their group runs and the runner keeps the group's input.
LayerPolicy layer_policy(const ExperimentSpec& spec, int i) {
  LayerPolicy p = spec.policy;
  const StackRecompute& r = spec.stack;
  if (r.method == RecomputeMethod::uniform || (r.method == RecomputeMethod::block && i >= r.num_layers))
    p.recompute = Recompute::none;
  return p;
}

LayerStack build_stack(Backend& be, Communicator& comm, const ExperimentSpec& spec) {
  LayerStack stack;
  for (int i = 0; i < spec.layers; ++i) {
    LayerOptions opt;
    opt.dims = spec.dims;
    opt.policy = layer_policy(spec, i);
    opt.dtype = spec.dtype;
    opt.seed = spec.seed;
    opt.layer_index = static_cast<uint32_t>(i);
    stack.push_back(make_layer(be, comm, opt));
    stack.back()->init_parameters();
  }
  return stack;
}

// x or dy: drawn in the canonical [s, b, h] layout, this rank's shard kept.
Tensor make_activation(Backend& be, Communicator& comm, const ExperimentSpec& spec, uint32_t stream) {
  const auto& d = spec.dims;
  const bool sp = spec.policy.sequence_parallel;
  const int64_t sl = sp ? d.s / comm.size() : d.s;
  Tensor t = be.empty({sl, d.b, d.h}, spec.dtype);
  fill_uniform_shard(be, t, activation_shard(d, sp, comm.size(), comm.rank()), spec.seed, kActivationStreamLayer,
                     stream, 1.0f);
  return t;
}

// The --dump folder's layer.json: the layer's shape and numerics, which the NumPy and
// PyTorch references read to rebuild the same layer.
nlohmann::ordered_json layer_json(const ExperimentSpec& spec, int tp) {
  const LayerDims& d = spec.dims;
  const theory::LayerSpec& s = d.spec;
  // The numbers the layer computes with are float32: each as the shortest decimal of that float.
  auto f32 = [](double v) { return std::strtod(float32_text(static_cast<float>(v)).c_str(), nullptr); };
  return {{"seq", d.s},
          {"batch", d.b},
          {"hidden", d.h},
          {"heads", d.a},
          {"tp", tp},
          {"config", config_name(spec.policy)},
          {"attention", attention_name(spec.policy.attention)},
          {"dtype", dtype_name(spec.dtype)},
          {"seed", spec.seed},
          {"recompute_modules", recomputed_modules_text(spec.policy)},
          {"normalization", theory::norm_name(s.normalization)},
          {"norm_epsilon", f32(s.norm_epsilon)},
          {"qk_layernorm", s.qk_layernorm},
          {"activation", theory::activation_name(s.activation)},
          {"ffn_hidden", d.ffn()},
          {"add_bias_linear", s.add_bias_linear},
          {"add_qkv_bias", s.add_qkv_bias},
          {"kv_heads", d.groups()},
          {"kv_channels", d.head_dim()},
          {"position_embedding", theory::position_name(s.position)},
          {"rotary_percent", s.rotary_percent},
          {"rotary_base", s.rotary_base},
          {"attention_dropout", f32(s.attention_dropout)},
          {"hidden_dropout", f32(s.hidden_dropout)}};
}

void check_spec(const ExperimentSpec& spec, const Communicator& comm) {
  validate_layer(spec.dims, comm.size(), spec.policy);
  if (spec.layers < 1) throw InvalidArgument("--layers must be >= 1");
  if (spec.stack.method != RecomputeMethod::none) {
    if (spec.policy.recompute != Recompute::full)
      throw InvalidArgument("--recompute-method needs full recompute (--recompute-granularity full, or full / full+sp "
                            "in --config), not " + config_name(spec.policy));
    if (spec.stack.num_layers < 1 || spec.stack.num_layers > spec.layers)
      throw InvalidArgument("--recompute-num-layers must be in 1..--layers (" + std::to_string(spec.layers) +
                            "), got " + std::to_string(spec.stack.num_layers));
  }
  if (spec.iters < 1) throw InvalidArgument("--iters must be >= 1");
  if (spec.warmup < 0) throw InvalidArgument("--warmup must be >= 0");
}

}  // namespace

LayerStackRunner::LayerStackRunner(Backend& be, Communicator& comm, const ExperimentSpec& spec)
    : be_(be), comm_(comm), spec_(spec) {
  check_spec(spec, comm);
  stack_ = std::make_unique<LayerStack>(build_stack(be, comm, spec));
  x_ = make_activation(be, comm, spec, kStreamX);
  dy_ = make_activation(be, comm, spec, kStreamDy);
}

LayerStackRunner::~LayerStackRunner() = default;

int LayerStackRunner::group_size() const {
  return spec_.stack.method == RecomputeMethod::uniform ? spec_.stack.num_layers : 0;
}

// Runs the stack's forward on h (replaced by the output). Under uniform recompute each group's
// input is returned, held for backward, and the group's layers drop what they saved.
std::vector<Tensor> LayerStackRunner::forward_stack(Tensor& h) {
  LayerStack& stack = *stack_;
  const size_t group = group_size();
  std::vector<Tensor> checkpoints;
  for (size_t i = 0; i < stack.size(); ++i) {
    if (group && i % group == 0) checkpoints.push_back(h);
    h = stack[i]->forward(h);
    const bool group_done = group && ((i + 1) % group == 0 || i + 1 == stack.size());
    if (group_done)
      for (size_t j = i - i % group; j <= i; ++j) stack[j]->drop_saved();
  }
  return checkpoints;
}

// Backward from the upstream gradient; a uniform group first runs its forward again from its
// checkpoint (inside backward's time, as Megatron's recompute does).
void LayerStackRunner::backward_stack(const Tensor& dy, std::vector<Tensor>& checkpoints) {
  LayerStack& stack = *stack_;
  const size_t group = group_size();
  Tensor g = dy;
  if (!group) {
    for (auto it = stack.rbegin(); it != stack.rend(); ++it) g = (*it)->backward(g);
    return;
  }
  for (size_t k = checkpoints.size(); k-- > 0;) {
    const size_t first = k * group, end = std::min(first + group, stack.size());
    Tensor r = std::move(checkpoints[k]);
    for (size_t j = first; j < end; ++j) r = stack[j]->recompute_forward(r);
    r = Tensor();
    for (size_t j = end; j-- > first;) g = stack[j]->backward(g);
  }
}

// The bytes the stack keeps after forward: per layer (layer 0's categories; the mean under a
// --recompute-method, whose layers differ) and for the whole stack with its checkpoints.
void LayerStackRunner::count_saved_bytes(const std::vector<Tensor>& checkpoints, Iteration& out) const {
  const LayerStack& stack = *stack_;
  int64_t paper = 0, extra = 0;
  for (const auto& layer : stack) {
    paper += layer->saved().paper_bytes();
    extra += layer->saved().extra_bytes();
  }
  for (const Tensor& c : checkpoints) paper += static_cast<int64_t>(c.bytes());
  out.stack_act_bytes = paper;
  out.act_by_category = stack.front()->saved().bytes_by_category(true);
  if (spec_.stack.method != RecomputeMethod::none) {
    out.act_bytes = paper / spec_.layers;
    out.act_extra_bytes = extra / spec_.layers;
    return;
  }
  out.act_bytes = stack.front()->saved().paper_bytes();
  out.act_extra_bytes = stack.front()->saved().extra_bytes();
  for (const auto& layer : stack)
    if (layer->saved().paper_bytes() != out.act_bytes)
      throw RuntimeFailure("layers of one stack saved different activation bytes");
}

LayerStackRunner::Iteration LayerStackRunner::iteration(bool measure_memory, PhaseLog* log) {
  LayerStack& stack = *stack_;
  CachingAllocator& alloc = be_.allocator();
  const double n_layers = spec_.layers;
  Iteration out;
  for (auto& layer : stack) layer->set_phase_log(log);
  if (measure_memory) {
    alloc.reset_peak();
    comm_.reset_stats();
  }
  // The input is allocated after this snapshot, so the layer that keeps it is charged for it.
  const int64_t before = alloc.stats().requested_bytes.current;
  Tensor h = be_.empty(x_.shape(), x_.dtype());
  be_.copy(x_, h);  // a device copy: the layer may not write its input, but a fresh one costs nothing
  comm_.barrier();
  const Backend::Mark t0 = be_.mark();
  comm_.open_emulated_window();
  std::vector<Tensor> checkpoints = forward_stack(h);
  const Backend::Mark t1 = be_.mark();
  comm_.open_emulated_window();
  if (measure_memory) {
    const int64_t delta = alloc.stats().requested_bytes.current - before - static_cast<int64_t>(h.bytes());
    out.fwd_retained_bytes = delta / spec_.layers;
    count_saved_bytes(checkpoints, out);
  }
  h = Tensor();  // the output is not needed for backward
  backward_stack(dy_, checkpoints);
  const Backend::Mark t2 = be_.mark();
  if (measure_memory) {
    out.peak_allocated_bytes = alloc.stats().allocated_bytes.peak;
    out.peak_reserved_bytes = alloc.stats().reserved_bytes.peak;
    out.comm_bytes = comm_.stats().ring_bytes / n_layers;
  }
  // Emulated collectives are local copies a real group would not make: their time is
  // reported apart, so fwd/bwd of sp and baseline compare like with like.
  std::vector<double> emulated = comm_.take_emulated_ms();
  emulated.resize(2, 0.0);
  out.fwd_ms = (be_.ms_between(t0, t1) - emulated[0]) / n_layers;
  out.bwd_ms = (be_.ms_between(t1, t2) - emulated[1]) / n_layers;
  out.total_ms = (be_.ms_between(t0, t2) - emulated[0] - emulated[1]) / n_layers;
  out.comm_ms_emulated = (emulated[0] + emulated[1]) / n_layers;
  return out;
}

namespace {

// The phase ranges told to each of the listeners given (null ones left out).
class PhaseListeners : public PhaseListener {
 public:
  explicit PhaseListeners(std::initializer_list<PhaseListener*> listeners) {
    for (PhaseListener* l : listeners)
      if (l) listeners_.push_back(l);
  }
  void enter(const std::string& phase) override {
    for (PhaseListener* l : listeners_) l->enter(phase);
  }
  void exit() override {
    for (PhaseListener* l : listeners_) l->exit();
  }

 private:
  std::vector<PhaseListener*> listeners_;
};

}  // namespace

ExperimentResult run_experiment(Backend& be, Communicator& comm, const ExperimentSpec& spec) {
  check_spec(spec, comm);
  ExperimentResult res;
  CachingAllocator& alloc = be.allocator();
  // A configuration's peaks must not depend on what ran before it in this process: return the
  // previous configurations' cached segments (after the device is done with them) and start
  // the peaks from here.
  be.synchronize();
  alloc.empty_cache();
  alloc.reset_peak();
  std::vector<double> fwd, bwd, total, emulated;
  PhaseListeners listeners({spec.profiler, spec.kernel_report});
  try {
    LayerStackRunner runner(be, comm, spec);
    // meta: one iteration is the whole memory schedule; timing it means nothing.
    const int iterations = be.computes() ? spec.warmup + spec.iters : 1;
    for (int it = 0; it < iterations; ++it) {
      const bool measure_memory = it == (be.computes() ? spec.warmup : 0);
      const bool timed = be.computes() && it >= spec.warmup;
      if (timed && it == spec.warmup) {
        be.profiling(true);  // nsys --capture-range=cudaProfilerApi sees the timed iterations only
        res.phases.set_listener(&listeners);
        if (spec.profiler) {
          spec.profiler->clear();
          spec.profiler->start();
        }
        if (spec.kernel_report) spec.kernel_report->start();
      }
      LayerStackRunner::Iteration r = runner.iteration(measure_memory, timed ? &res.phases : nullptr);
      if (measure_memory) {
        res.act_bytes = r.act_bytes;
        res.act_extra_bytes = r.act_extra_bytes;
        res.stack_act_bytes = r.stack_act_bytes;
        res.act_by_category = r.act_by_category;
        res.fwd_retained_bytes = r.fwd_retained_bytes;
        res.peak_allocated_bytes = r.peak_allocated_bytes;
        res.peak_reserved_bytes = r.peak_reserved_bytes;
        res.comm_bytes = r.comm_bytes;
        res.comm_ms_modeled = comm.size() > 1 ? r.comm_bytes / (spec.link_gbps * 1e9) * 1e3 : 0.0;
      }
      if (timed) {
        fwd.push_back(r.fwd_ms);
        bwd.push_back(r.bwd_ms);
        total.push_back(r.total_ms);
        emulated.push_back(r.comm_ms_emulated);
      }
    }
    be.profiling(false);
    res.phases.set_listener(nullptr);
    if (spec.profiler && be.computes()) {
      spec.profiler->stop();
      res.kernel_phases = spec.profiler->breakdown();
      res.cupti_dropped_records = spec.profiler->dropped_records();
    }
    if (spec.kernel_report && be.computes()) {
      spec.kernel_report->stop();
      res.kernel_report = spec.kernel_report->rows();
    }
  } catch (const OutOfMemory& e) {
    be.profiling(false);
    if (spec.profiler) spec.profiler->stop();
    if (spec.kernel_report) spec.kernel_report->stop();
    res.phases.set_listener(nullptr);
    res.status = "oom";
    res.message = e.what();
    res.peak_allocated_bytes = alloc.stats().allocated_bytes.peak;
    res.peak_reserved_bytes = alloc.stats().reserved_bytes.peak;
    fwd.clear();
    bwd.clear();
    total.clear();
    emulated.clear();
  }
  // Every rank ran the same iterations: an iteration takes as long as its slowest rank.
  comm.max_inplace(fwd);
  comm.max_inplace(bwd);
  comm.max_inplace(total);
  comm.max_inplace(emulated);
  res.comm_ms_emulated = summarize(emulated);
  res.fwd_ms = summarize(fwd);
  res.bwd_ms = summarize(bwd);
  res.total_ms = summarize(total);
  return res;
}

std::vector<CanonicalTensor> run_layer_canonical(Backend& be, Communicator& comm, const ExperimentSpec& spec_in) {
  ExperimentSpec spec = spec_in;
  spec.layers = 1;
  spec.stack = {};  // one layer: its own checkpoint
  check_spec(spec, comm);
  if (!be.computes()) throw InvalidArgument("tensor values need a backend that computes (cpu or cuda), not meta");
  LayerStack stack = build_stack(be, comm, spec);
  Layer& layer = *stack.front();
  Tensor x = make_activation(be, comm, spec, kStreamX);
  Tensor dy = make_activation(be, comm, spec, kStreamDy);
  Tensor y = layer.forward(x);
  Tensor dx = layer.backward(dy);

  const auto& d = spec.dims;
  const Shape act_shape = {d.s, d.b, d.h};
  const ShardSpec act = activation_shard(d, spec.policy.sequence_parallel, comm.size(), comm.rank());
  std::vector<CanonicalTensor> out;
  out.push_back({"x", act_shape, gather_canonical(be, comm, x, act)});
  out.push_back({"y", act_shape, gather_canonical(be, comm, y, act)});
  out.push_back({"dy", act_shape, gather_canonical(be, comm, dy, act)});
  out.push_back({"dx", act_shape, gather_canonical(be, comm, dx, act)});
  for (const ParamInfo& p : layer_param_table(d)) {
    const ShardSpec shard = param_shard(p, comm.size(), comm.rank());
    out.push_back({p.name, p.canonical_shape, gather_canonical(be, comm, layer.params().*p.member, shard)});
    out.push_back({std::string("grad.") + p.name, p.canonical_shape,
                   gather_canonical(be, comm, layer.grads().*p.member, shard)});
  }
  return out;
}

void dump_layer(Backend& be, Communicator& comm, const ExperimentSpec& spec, const std::string& dir) {
  // Rank 0 creates the directory (and its parents); every rank learns whether that worked,
  // so that a failure is one error on all ranks rather than a rank left waiting in a gather.
  std::string error;
  if (comm.rank() == 0) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec || !std::filesystem::is_directory(dir)) error = ec ? ec.message() : "not a directory";
  }
  std::vector<double> failed = {error.empty() ? 0.0 : 1.0};
  comm.max_inplace(failed);
  if (failed[0] != 0.0)
    throw InvalidArgument("cannot create dump directory '" + dir + "'" + (error.empty() ? "" : ": " + error));
  const std::vector<CanonicalTensor> tensors = run_layer_canonical(be, comm, spec);
  if (comm.rank() == 0) {
    for (const CanonicalTensor& t : tensors) write_npy_f32(dir + "/" + t.name + ".npy", t.shape, t.data);
    write_file_atomic(dir + "/layer.json", layer_json(spec, comm.size()).dump() + "\n");
  }
  comm.barrier();
}

}  // namespace actbench
