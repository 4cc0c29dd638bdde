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
    opt.moe_tokens_per_expert = spec.moe_tokens_per_expert;
    opt.expert_tensor_parallel = spec.expert_tensor_parallel;
    stack.push_back(make_layer(be, comm, opt, spec.cp_group, spec.experts_over_tp ? &comm : spec.ep_group));
    stack.back()->init_parameters();
  }
  return stack;
}

// The rows of x and dy on (TP rank tp_rank, CP rank cp_rank): chunks cp_rank and
// 2C-1-cp_rank of the 2C chunks of the sequence (all of it for C = 1), split t ways under SP.
struct ActivationRows {
  int64_t count;
  SeqPositions positions;
};
ActivationRows activation_rows(const ExperimentSpec& spec, int t, int tp_rank, int cp_rank) {
  const int64_t s = spec.dims.s, C = spec.cp(), seq = s / C, chunk = s / (2 * C);
  const SeqPositions cp_rows = C > 1 ? SeqPositions::chunks(chunk, cp_rank * chunk, (2 * C - 1 - cp_rank) * chunk)
                                     : SeqPositions{};
  if (!spec.policy.sequence_parallel) return {seq, cp_rows};
  return {seq / t, cp_rows.from(tp_rank * (seq / t))};
}

// Every expert-parallel rank's [rows, b, w] (its batch slice) as the canonical [rows, ep·b, w].
std::vector<float> interleave_batches(Communicator& ep, const std::vector<float>& mine, int64_t rows) {
  const std::vector<float> all = ep.gather_host(mine);
  const int64_t per_row = static_cast<int64_t>(mine.size()) / rows, n = ep.size();
  std::vector<float> out(all.size());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < static_cast<int64_t>(mine.size()); ++i)
      out[(i / per_row) * n * per_row + r * per_row + i % per_row] = all[r * mine.size() + i];
  return out;
}

// x or dy: drawn in the canonical [s, b, h] layout (under EP over data-parallel replicas
// [s, dp·b, h]), this rank's rows kept.
Tensor make_activation(Backend& be, Communicator& comm, const ExperimentSpec& spec, uint32_t stream) {
  const auto& d = spec.dims;
  const int cp_rank = spec.cp_group ? spec.cp_group->rank() : 0;
  const ActivationRows rows = activation_rows(spec, comm.size(), comm.rank(), cp_rank);
  Tensor t = be.empty({rows.count, d.b, d.h}, spec.dtype);
  if (!be.computes()) return t;
  // Under EP over data-parallel replicas this rank's batch is slice dp_rank of the canonical dp·b.
  const int64_t cols = d.b * d.h, dp = spec.dp(), slice = spec.dp_group ? spec.dp_group->rank() * cols : 0;
  std::vector<float> host(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    const int64_t canonical = rows.positions.at(i / cols) * dp * cols + slice + i % cols;
    host[i] = philox_uniform_pm1(spec.seed, kActivationStreamLayer, stream, static_cast<uint64_t>(canonical));
  }
  be.upload(host.data(), t);
  return t;
}

// x, y, dy or dx of every rank in the canonical [s, b, h] (every rank gets it); any per-token
// tensor [rows, b, width] (an MoE layer's routing, width k) the same way.
std::vector<float> gather_activation(Backend& be, Communicator& comm, const ExperimentSpec& spec, const Tensor& local) {
  std::vector<float> mine(static_cast<size_t>(local.numel()));
  be.download(local, mine.data());
  std::vector<float> all = comm.gather_host(mine);  // TP ranks, in order
  if (spec.cp_group) all = spec.cp_group->gather_host(all);  // then CP ranks, in order
  const int64_t n = static_cast<int64_t>(mine.size()), cols = n / activation_rows(spec, comm.size(), 0, 0).count;
  std::vector<float> canonical(static_cast<size_t>(spec.dims.s * cols));
  for (int c = 0; c < spec.cp(); ++c)
    for (int r = 0; r < comm.size(); ++r) {
      const ActivationRows rows = activation_rows(spec, comm.size(), r, c);
      const float* src = all.data() + (static_cast<int64_t>(c) * comm.size() + r) * n;
      for (int64_t i = 0; i < n; ++i) canonical[rows.positions.at(i / cols) * cols + i % cols] = src[i];
    }
  return spec.dp_group ? interleave_batches(*spec.dp_group, canonical, spec.dims.s) : canonical;
}

// An MoE layer's options as the references read them (null for a dense layer): the routing as
// the ops take it (docs/moe.md), the widths resolved.
nlohmann::ordered_json moe_json(const LayerDims& d) {
  const theory::MoeSpec& m = d.spec.moe;
  if (!m.enabled()) return nullptr;
  return {{"num_experts", m.num_experts},
          {"top_k", m.top_k},
          {"ffn_hidden", d.expert_ffn()},
          {"shared_ffn_hidden", m.shared_ffn_hidden},
          {"score", theory::moe_score_name(m.score)},
          {"normalize", m.normalizes()},
          {"scaling", static_cast<double>(static_cast<float>(m.scaling))},
          {"num_groups", m.num_groups},
          {"group_top_k", m.group_top_k},
          {"expert_bias", m.expert_bias},
          {"capacity_factor", m.capacity_factor}};
}

// A multi-latent attention layer's widths as the references read them (null otherwise).
nlohmann::ordered_json mla_json(const LayerDims& d) {
  const theory::MlaSpec& m = d.spec.mla;
  if (!m.enabled) return nullptr;
  auto whole = [](double v) { return static_cast<int64_t>(v); };
  return {{"q_lora_rank", whole(m.q_lora_rank)},
          {"kv_lora_rank", whole(m.kv_lora_rank)},
          {"qk_head_dim", whole(m.qk_head_dim)},
          {"qk_pos_emb_head_dim", whole(m.qk_pos_emb_head_dim)},
          {"v_head_dim", whole(m.v_head_dim)}};
}

// The --dump folder's layer.json: the layer's shape and numerics, which the NumPy and
// PyTorch references read to rebuild the same layer.
nlohmann::ordered_json layer_json(const ExperimentSpec& spec, int tp) {
  const LayerDims& d = spec.dims;
  const theory::LayerSpec& s = d.spec;
  // The numbers the layer computes with are float32: each as the shortest decimal of that float.
  auto f32 = [](double v) { return std::strtod(float32_text(static_cast<float>(v)).c_str(), nullptr); };
  return {{"seq", d.s},
          {"batch", d.b * spec.dp()},  // the canonical batch: every data-parallel replica's slice
          {"hidden", d.h},
          {"heads", d.a},
          {"tp", tp},
          {"cp", spec.cp()},
          {"cp_comm_type", spec.cp() > 1 ? cp_comm_type_name(spec.policy.cp_comm) : ""},
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
          {"kv_channels", d.kv_channels()},
          {"position_embedding", theory::position_name(s.position)},
          {"rotary_percent", s.rotary_percent},
          {"rotary_base", s.rotary_base},
          {"attention_dropout", f32(s.attention_dropout)},
          {"hidden_dropout", f32(s.hidden_dropout)},
          {"moe", moe_json(d)},
          {"mla", mla_json(d)}};
}

void check_spec(const ExperimentSpec& spec, const Communicator& comm) {
  validate_layer(spec.dims, comm.size(), spec.policy, spec.cp(), spec.expert_parallel(comm.size()),
                 spec.expert_tensor_parallel_size(comm.size()));
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
  if (const MoeRoutingStats* moe = stack.front()->moe_stats()) out.moe = *moe;
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
  Communicator* cp = spec_.cp_group;
  Communicator* ep = spec_.ep_group;
  if (measure_memory) {
    alloc.reset_peak();
    comm_.reset_stats();
    if (cp) cp->reset_stats();
    if (ep) ep->reset_stats();
  }
  // The input is allocated after this snapshot, so the layer that keeps it is charged for it.
  const int64_t before = alloc.stats().requested_bytes.current;
  Tensor h = be_.empty(x_.shape(), x_.dtype());
  be_.copy(x_, h);  // a device copy: the layer may not write its input, but a fresh one costs nothing
  comm_.barrier();
  if (cp) cp->barrier();
  if (ep) ep->barrier();
  const Backend::Mark t0 = be_.mark();
  comm_.open_emulated_window();
  if (cp) cp->open_emulated_window();
  std::vector<Tensor> checkpoints = forward_stack(h);
  const Backend::Mark t1 = be_.mark();
  comm_.open_emulated_window();
  if (cp) cp->open_emulated_window();
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
    out.comm_bytes_cp = cp ? cp->stats().ring_bytes / n_layers : 0.0;
    out.comm_bytes_ep = ep ? ep->stats().ring_bytes / n_layers : 0.0;
    out.comm_bytes = comm_.stats().ring_bytes / n_layers + out.comm_bytes_cp + out.comm_bytes_ep;
  }
  // Emulated collectives are local copies a real group would not make: their time is
  // reported apart, so fwd/bwd of sp and baseline compare like with like.
  std::vector<double> emulated = comm_.take_emulated_ms();
  emulated.resize(2, 0.0);
  if (cp) {
    std::vector<double> cp_emulated = cp->take_emulated_ms();
    cp_emulated.resize(2, 0.0);
    emulated[0] += cp_emulated[0];
    emulated[1] += cp_emulated[1];
  }
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
        res.moe = r.moe;
        res.fwd_retained_bytes = r.fwd_retained_bytes;
        res.peak_allocated_bytes = r.peak_allocated_bytes;
        res.peak_reserved_bytes = r.peak_reserved_bytes;
        res.comm_bytes = r.comm_bytes;
        res.comm_bytes_cp = r.comm_bytes_cp;
        res.comm_bytes_ep = r.comm_bytes_ep;
        res.comm_ms_modeled =
            comm.size() * spec.cp() * spec.ep() > 1 ? r.comm_bytes / (spec.link_gbps * 1e9) * 1e3 : 0.0;
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
  for (Communicator* group : {&comm, spec.cp_group, spec.ep_group}) {
    if (!group) continue;
    group->max_inplace(fwd);
    group->max_inplace(bwd);
    group->max_inplace(total);
    group->max_inplace(emulated);
  }
  res.comm_ms_emulated = summarize(emulated);
  res.fwd_ms = summarize(fwd);
  res.bwd_ms = summarize(bwd);
  res.total_ms = summarize(total);
  return res;
}

static bool is_moe_layer(const ExperimentSpec& spec) { return spec.dims.spec.moe.enabled(); }

// A parameter (or its gradient) of every rank in the canonical layout: the routed experts'
// blocks over the expert-parallel group (whole on every TP rank without one; under expert
// tensor parallelism each block's TP slices first), the rest over TP.
static std::vector<float> gather_param(Backend& be, Communicator& comm, const ExperimentSpec& spec,
                                       const ParamInfo& p, const Tensor& local) {
  if (p.kind == ShardKind::experts && !spec.experts_over_tp) {
    std::unique_ptr<Communicator> alone = spec.ep_group ? nullptr : make_local_communicator();
    Communicator& group = spec.ep_group ? *spec.ep_group : *alone;
    return gather_canonical(be, group, local, param_shard(p, group.size(), group.rank()));
  }
  if (is_expert_param(p) && spec.ep_group) {  // this rank's E/ep experts, then the blocks in EP order
    const ShardSpec slice = param_shard(experts_block(p, spec.ep()), comm.size(), comm.rank());
    return spec.ep_group->gather_host(gather_canonical(be, comm, local, slice));
  }
  return gather_canonical(be, comm, local, param_shard(p, comm.size(), comm.rank()));
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
  // An MoE layer's routing decision, as forward kept it (not under full or moe recompute):
  // each rank routed its own rows (its [rows, b] tokens: s/t under SP, two chunks under CP),
  // put back in the canonical order of the s·b tokens as the activations are.
  std::vector<CanonicalTensor> routing;
  if (is_moe_layer(spec)) {
    const SavedActivations& saved = layer.saved();
    for (const auto& [name, t] : {std::pair{"moe.topk_index", &saved.router_topk_index},
                                  std::pair{"moe.topk_weight", &saved.router_topk_weight}}) {
      if (!t->defined()) continue;
      const int64_t k = t->dim(1);
      routing.push_back({name, {spec.dims.s * spec.dims.b * spec.dp(), k}, gather_activation(be, comm, spec, *t)});
    }
  }
  Tensor dx = layer.backward(dy);

  const auto& d = spec.dims;
  const Shape act_shape = {d.s, d.b * spec.dp(), d.h};
  std::vector<CanonicalTensor> out;
  out.push_back({"x", act_shape, gather_activation(be, comm, spec, x)});
  out.push_back({"y", act_shape, gather_activation(be, comm, spec, y)});
  out.push_back({"dy", act_shape, gather_activation(be, comm, spec, dy)});
  out.push_back({"dx", act_shape, gather_activation(be, comm, spec, dx)});
  // Each context-parallel rank saw its rows only: the gradients are summed over the group
  // (what the data-parallel reduction over DP x CP does in training), but for experts the
  // expert-parallel group spans: those saw every row routed to them.
  if (spec.cp_group)
    for (const ParamInfo& p : layer_param_table(d, spec.expert_tensor_parallel))
      if (!is_expert_param(p) || !spec.ep_group) spec.cp_group->all_reduce(layer.grads().*p.member);
  // Expert parallelism over data-parallel replicas: each replica saw its own micro-batch, so the
  // gradients of everything but the experts are summed over them; each expert's is whole on its
  // rank (it saw every row routed to it).
  if (spec.dp_group)
    for (const ParamInfo& p : layer_param_table(d, spec.expert_tensor_parallel))
      if (!is_expert_param(p)) spec.dp_group->all_reduce(layer.grads().*p.member);
  if (const MoeRoutingStats* moe = layer.moe_stats()) {
    // The whole layer's histogram: every rank's rows summed (each routed its own under SP, CP
    // and EP).
    const std::vector<float> mine(moe->tokens_per_expert.begin(), moe->tokens_per_expert.end());
    std::vector<float> all = comm.gather_host(mine);
    if (spec.cp_group) all = spec.cp_group->gather_host(all);
    if (spec.dp_group) all = spec.dp_group->gather_host(all);
    std::vector<float> rows(mine.size(), 0.f);
    for (size_t i = 0; i < all.size(); ++i) rows[i % rows.size()] += all[i];
    out.push_back({"moe.tokens_per_expert", {static_cast<int64_t>(rows.size())}, rows});
    // The aux loss is each rank's over its own rows: the layer's value only on one rank.
    if (comm.size() * spec.cp() * spec.dp() == 1)
      out.push_back({"moe.aux_loss", {1}, {static_cast<float>(moe->aux_loss)}});
    for (CanonicalTensor& r : routing) out.push_back(std::move(r));
  }
  for (const ParamInfo& p : layer_param_table(d, spec.expert_tensor_parallel)) {
    out.push_back({p.name, p.canonical_shape, gather_param(be, comm, spec, p, layer.params().*p.member)});
    out.push_back({std::string("grad.") + p.name, p.canonical_shape,
                   gather_param(be, comm, spec, p, layer.grads().*p.member)});
  }
  return out;
}

void dump_layer(Backend& be, Communicator& comm, const ExperimentSpec& spec, const std::string& dir) {
  // Rank 0 creates the directory (and its parents); every rank learns whether that worked,
  // so that a failure is one error on all ranks rather than a rank left waiting in a gather.
  std::string error;
  const bool writer = comm.rank() == 0 && (!spec.cp_group || spec.cp_group->rank() == 0) &&
                      (!spec.dp_group || spec.dp_group->rank() == 0);
  if (writer) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec || !std::filesystem::is_directory(dir)) error = ec ? ec.message() : "not a directory";
  }
  std::vector<double> failed = {error.empty() ? 0.0 : 1.0};
  comm.max_inplace(failed);
  if (spec.cp_group) spec.cp_group->max_inplace(failed);
  if (spec.dp_group) spec.dp_group->max_inplace(failed);
  if (failed[0] != 0.0)
    throw InvalidArgument("cannot create dump directory '" + dir + "'" + (error.empty() ? "" : ": " + error));
  const std::vector<CanonicalTensor> tensors = run_layer_canonical(be, comm, spec);
  if (writer) {
    for (const CanonicalTensor& t : tensors) write_npy_f32(dir + "/" + t.name + ".npy", t.shape, t.data);
    write_file_atomic(dir + "/layer.json", layer_json(spec, comm.size()).dump() + "\n");
  }
  comm.barrier();
  if (spec.cp_group) spec.cp_group->barrier();
  if (spec.dp_group) spec.dp_group->barrier();
}

}  // namespace actbench
