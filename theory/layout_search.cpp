#include "theory/layout_search.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>

#include "theory/flops.hpp"
#include "theory/layer_pieces.hpp"
#include "theory/llama_memory.hpp"
#include "theory/step_memory.hpp"
#include "theory/model_table.hpp"
#include "theory/pipeline.hpp"

namespace actbench::theory {

const std::vector<TransformerModel>& llama_plan_models() {
  static const std::vector<TransformerModel> models = [] {
    std::vector<TransformerModel> list;
    for (const ModelRow& r : model_table())
      if (r.arch == "llama") list.push_back(preset_model(r));
    return list;
  }();
  return models;
}

TransformerModel plan_model(const std::string& name) {
  std::vector<std::string> names;
  for (int group = 0; group < 3; ++group)  // the llama family, Table 3's GPT models, the mixtures of experts
    for (const ModelRow& r : model_table())
      if (group == 0 ? r.arch == "llama" : group == 1 ? r.paper : r.arch == "moe") {
        if (r.name == name) return preset_model(r);
        names.push_back(r.name);
      }
  throw std::invalid_argument("unknown model '" + name + "' (expected " + one_of(names) + ")");
}

const Gpu& plan_gpu(const std::string& name) {
  // B200 (HGX, 180 GB): 2.25 PFLOP/s dense bf16, 8 TB/s HBM3e, NVLink 5 900 GB/s per direction,
  // one 400 Gb/s port per GPU.
  static const Gpu b200{"b200", "B200 SXM 180GB", 180e9, 2.25e15, 8.0e12, 900e9, 50e9, 10};
  if (name == "b200") return b200;
  for (const auto& g : gpus())
    if (g.name == name) return g;
  throw std::invalid_argument("unknown GPU '" + name + "' (expected a100, h100, h200 or b200)");
}

namespace {

// Forward FLOPs of one layer of `spec` for b sequences, all ranks. causal: attention matrices
// counted over their causal half (what a fused kernel computes).
LayerFlops forward_flops(const TransformerModel& m, const LayerSpec& spec, double s, double b, bool causal) {
  return spec_layer_forward_flops(spec, m.h, m.a, b, s, causal ? AttentionSpan::causal : AttentionSpan::full);
}

// A dense layer of the model: its spec with the experts off (an MoE model's dense layers).
LayerSpec dense_spec(const TransformerModel& m) {
  LayerSpec spec = m.layer;
  spec.moe = {};
  return spec;
}

// The divisors of n in increasing order, found up to sqrt(n): the cost grows with sqrt(n).
std::vector<int> divisors(int n) {
  std::vector<int> low, high;
  for (int d = 1; d <= n / d; ++d)
    if (n % d == 0) {
      low.push_back(d);
      if (d != n / d) high.push_back(n / d);
    }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}

// The candidate's memory: step_memory's stage with the highest peak.
void fill_memory(const TransformerModel& M, const StepConfig& c, double headroom, PlanCandidate& k) {
  const std::vector<StageMemory> stages = step_memory(M, c);
  const StageMemory& top = *std::max_element(stages.begin(), stages.end(), [](const StageMemory& x, const StageMemory& y) {
    return x.peak_bytes < y.peak_bytes;
  });
  const Dims d = c.layer_dims(M);
  k.stage = top.stage;
  k.params_per_gpu = top.parameters;
  k.expert_params_per_gpu = top.expert_parameters;
  k.weight_bytes = top.weight_bytes;
  k.grad_bytes = top.grad_bytes;
  k.optimizer_bytes = top.optimizer_bytes;
  k.workspace_bytes = top.workspace_bytes;
  k.per_layer_activation_bytes =
      layer_bytes(d, M.layer, c.policy, {}, Bookkeeping::megatron) + layer_extra_bytes(d, M.layer, c.policy);
  k.activation_bytes = top.activation_bytes;
  k.layers_in_flight = k.activation_bytes / k.per_layer_activation_bytes;
  k.extra_bytes = top.embedding_bytes + top.output_bytes;
  k.working_set_bytes = top.working_set_bytes();
  k.setup_bytes = top.setup_peak_bytes;
  k.headroom_bytes = headroom;
  k.total_bytes = top.peak_bytes + headroom;
}

}  // namespace

double cp_exchange_bytes(const TransformerModel& m, double s, double b, int t, int C, CpCommType type,
                         bool recompute_attention) {
  if (C == 1) return 0;
  const Dims unit = m.dims(1, 1, 1);
  const MlaSpec& mla = m.layer.mla;
  // Each head's k and v width: d, or latent attention's d_qk (its RoPE part in every head) and d_v.
  const double k_width = mla.enabled ? mla.qk_head_dim + mla.qk_pos_emb_head_dim : m.layer.head_dim(unit);
  const double v_width = mla.enabled ? mla.v_head_dim : m.layer.head_dim(unit);
  const double e = 2, g = m.layer.groups(unit);
  const double kv = e * s / C * b * g * (k_width + v_width) / t;  // one rank's k and v
  // The forward's exchange, backward's (k, v again and their gradients back: twice it) and the
  // recompute's forward again.
  const double kv_passes = recompute_attention ? 4 : 3;
  switch (type) {
    case CpCommType::p2p: return kv_passes * (C - 1) * kv;                   // C − 1 blocks
    case CpCommType::all_gather: return kv_passes * (C - 1.0) / C * kv * C;  // every other rank's share
    case CpCommType::a2a: {  // q, k, v to heads and the output back; in backward their gradients
      const double passes = recompute_attention ? 3 : 2;
      return passes * (C - 1.0) / C * e * s / C * b * (m.a + g) * (k_width + v_width) / t;
    }
  }
  return 0;
}

double ep_exchange_bytes(const TransformerModel& m, double s, double b, int t, int C, int ep, bool recompute_moe) {
  if (ep == 1) return 0;
  const double e = 2, tokens = s * b / (static_cast<double>(t) * C);  // the rank's rows (SP under t > 1)
  const double exchanges = recompute_moe ? 6 : 4;
  return exchanges * tokens * m.layer.moe.top_k * m.h * e * (ep - 1.0) / ep;
}

double etp_exchange_bytes(const TransformerModel& m, double s, double b, int t, int C, int etp, bool recompute_moe) {
  if (etp == 1) return 0;
  const double e = 2, tokens = s * b / (static_cast<double>(t) * C);  // the rank's rows (SP under t > 1)
  const double exchanges = recompute_moe ? 6 : 4;
  return exchanges * tokens * m.layer.moe.top_k * m.h * e * (etp - 1.0);
}

namespace {

struct Layout {
  int t = 1, cp = 1, p = 1, m = 1, dp = 1;
  double b = 1;
  int ep = 1, etp = 1;
};

// The MoE layers of each pipeline stage, all its chunks (virtual stage chunk·p + stage holds
// layers [v·n, (v + 1)·n), n = L/(p·m)): what makes one stage slower than another.
std::vector<int> stage_moe_layers(const TransformerModel& M, int p, int m) {
  const int L = static_cast<int>(M.L), n = L / (p * m);
  std::vector<int> out(p, 0);
  if (!M.layer.moe.enabled()) return out;
  if (M.moe_layers.empty()) return std::vector<int>(p, L / p);
  for (int i = 0; i < L; ++i) out[(i / n) % p] += M.is_moe_layer(i);
  return out;
}

// One layer's time on one rank for one micro-batch: its forward, backward (twice the forward),
// what recompute reruns, the tensor-parallel collectives, CP's exposed exchange and EP's
// all-to-alls (a2a_s, also inside s).
struct LayerTime {
  double s = 0, a2a_s = 0;
};
LayerTime layer_time(const PlanRequest& r, double s, const Layout& l, const LayerPolicy& c, const LayerSpec& spec) {
  const TransformerModel& M = r.model;
  const Gpu& G = r.gpu;
  const double t = l.t, C = l.cp, b = l.b, e = 2;  // bf16
  const double sbh = s * b * M.h / C, rank_rate = t * C * G.peak_flops * r.efficiency;  // the rank's rows
  const LayerFlops f = forward_flops(M, spec, s, b, c.attention == Attention::fused);
  const double fwd = f.total() / rank_rate, recompute = recompute_forward_flops(f, c) / rank_rate;
  const double attention_fwd = f.core_attention / rank_rate;
  const double ring = t > 1 ? (t - 1.0) / t : 0.0;
  // Per block (attention, MLP) fwd: an all-reduce (or all-gather + reduce-scatter pair); bwd:
  // the same plus, under SP, the saved input's all-gather; full recompute repeats the
  // forward's. An MoE block has them only for its shared experts: the routed experts take
  // whole tokens by all-to-all instead, and with expert tensor parallelism gather them over
  // the TP group (etp_exchange_bytes) and reduce-scatter their partial outputs back.
  const bool moe = spec.moe.enabled(), shared = spec.moe.shared_ffn_hidden > 0;
  const double blocks = moe && !shared ? 1 : 2;
  double comm_bytes = blocks * 2 * ring * e * sbh * 2 + (c.sequence_parallel ? blocks * ring * e * sbh : 0);
  if (c.recompute == Recompute::full) comm_bytes += blocks * 2 * ring * e * sbh;
  const bool selective = c.recompute == Recompute::selective;
  if (moe && shared && selective && c.modules.moe) comm_bytes += 2 * ring * e * sbh;  // the shared experts' again
  if (moe) comm_bytes += etp_exchange_bytes(M, s, b, l.t, l.cp, l.etp, c.recompute == Recompute::full ||
                                                                          (selective && c.modules.moe));
  // Context parallelism's exchange: within a node while t·C ≤ 8; p2p hidden behind attention.
  const bool attention_again = c.recompute == Recompute::full || (selective && c.modules.core_attn);
  const double cp_link = t * C <= 8 ? G.nvlink_bytes_per_s : G.network_bytes_per_s;
  const double cp_s = cp_exchange_bytes(M, s, b, l.t, l.cp, r.cp_comm, attention_again) / cp_link;
  const double attention_s = (attention_again ? 4 : 3) * attention_fwd;
  const double cp_exposed = r.cp_comm == CpCommType::p2p ? std::max(0.0, cp_s - attention_s) : cp_s;
  // Expert parallelism's all-to-alls: within a node while ep ≤ 8, not overlapped.
  LayerTime out;
  if (moe) {
    const bool moe_again = c.recompute == Recompute::full || (selective && c.modules.moe);
    const double ep_link = l.ep <= 8 ? G.nvlink_bytes_per_s : G.network_bytes_per_s;
    out.a2a_s = ep_exchange_bytes(M, s, b, l.t, l.cp, l.ep, moe_again) / ep_link;
  }
  out.s = 3 * fwd + recompute + comm_bytes / G.nvlink_bytes_per_s + cp_exposed + out.a2a_s;
  return out;
}

// Bytes one rank sends per step for the data-parallel group (ring collectives, `ring` =
// (n−1)/n of each buffer leaves the rank) over `params` parameters, N micro-batches: DDP's
// all-reduce of the fp32 gradients; the distributed optimizer's (or Megatron-FSDP optim's)
// reduce-scatter of them and all-gather of the bf16 weights; with the gradients sharded a
// reduce-scatter every micro-batch; with the weights sharded too, an all-gather of the bf16
// weights for every micro-batch's forward and again for its backward.
double data_parallel_bytes(DpShard level, double N, double ring, double params) {
  switch (level) {
    case DpShard::none: return 2 * ring * params * 4;
    case DpShard::optimizer: return ring * params * (4 + 2);
    case DpShard::gradients: return ring * params * (N * 4 + 2);
    case DpShard::parameters: return ring * params * N * (4 + 2 + 2);
  }
  return 0;
}

// The iteration-time model (layout_search.hpp) of one candidate; memory is filled already.
// stage_moe: the MoE layers of each pipeline stage (stage_moe_layers).
void fill_time(const PlanRequest& r, double s, const Layout& l, const LayerPolicy& c, const std::vector<int>& stage_moe,
               PlanCandidate& k) {
  const TransformerModel& M = r.model;
  const Gpu& G = r.gpu;
  const double B = r.global_batch, t = l.t, C = l.cp, b = l.b, e = 2;  // bf16
  const double layers = M.L / l.p, sbh = s * b * M.h / C, V = padded_vocab(M, t);  // the rank's rows
  const double rate = G.peak_flops * r.efficiency;
  const LayerSpec dense = dense_spec(M);
  const LayerTime dense_layer = layer_time(r, s, l, c, dense);
  const LayerTime moe_layer = M.layer.moe.enabled() ? layer_time(r, s, l, c, M.layer) : dense_layer;
  double layers_s = 0, a2a_s = 0;  // the slowest stage's layers
  for (const int moe : stage_moe) {
    const double stage = moe * moe_layer.s + (layers - moe) * dense_layer.s;
    if (stage > layers_s) layers_s = stage, a2a_s = moe * moe_layer.a2a_s;
  }
  const double split = c.sequence_parallel ? t : 1.0;
  const double logits_s = 3 * 2 * b * s / C * M.h * V / t / rate;  // last stage, per micro-batch
  const double stage_s = layers_s + logits_s;                        // the slowest stage, with the last's logits
  const double N = k.microbatches, schedule = N + (l.p - 1.0) / l.m;
  const double p2p_s = l.p > 1 ? 2 * (N * l.m + l.p - 1) * e * sbh / split / G.network_bytes_per_s : 0.0;
  const double pipeline_s = schedule * stage_s + p2p_s;
  k.a2a_s = schedule * a2a_s;
  // Gradients reduce over dp·C; the experts' over their expert-data-parallel group t·C·dp/(ep·etp).
  const double replicas = static_cast<double>(l.dp) * l.cp, expert_replicas = t * C * l.dp / (l.ep * l.etp);
  const double dp_ring = replicas > 1 ? (replicas - 1) / replicas : 0.0;
  const double ep_ring = expert_replicas > 1 ? (expert_replicas - 1) / expert_replicas : 0.0;
  const double experts = k.expert_params_per_gpu, params = k.params_per_gpu - experts;
  const DpShard level = sharded_level(r.sharding, r.distributed_optimizer);
  const double dp_bytes = data_parallel_bytes(level, N, dp_ring, params) + data_parallel_bytes(level, N, ep_ring, experts);
  const bool sharded_state = level >= DpShard::optimizer;
  const double optimizer_s = 30 * params / (sharded_state ? replicas : 1) / G.hbm_bytes_per_s +
                             30 * experts / (sharded_state ? expert_replicas : 1) / G.hbm_bytes_per_s;
  k.iteration_s = pipeline_s + dp_bytes / G.network_bytes_per_s + optimizer_s;
  k.tokens_per_s = B * s / k.iteration_s;
  double moe_layers = 0;  // the model's: every stage's
  for (const int moe : stage_moe) moe_layers += moe;
  const double layer_flops = moe_layers * forward_flops(M, M.layer, s, 1, true).total() +
                             (M.L - moe_layers) * forward_flops(M, dense, s, 1, true).total();
  const double model_flops = 3 * B * (layer_flops + 2 * s * M.h * V);
  k.mfu_percent = 100 * model_flops / (k.iteration_s * r.gpus * G.peak_flops);
}

// The selective module sets searched beside Megatron's default (core_attn): for an MoE layer
// moe_act, moe and (with shared experts) shared_experts, for latent attention mla_up_proj,
// each alone or, under unfused attention, with core_attn.
std::vector<RecomputeModules> module_sets(const PlanRequest& r) {
  std::vector<RecomputeModules> out;
  const LayerSpec& spec = r.model.layer;
  for (const bool core_attn : {false, true}) {
    if (core_attn && r.attention == Attention::fused) continue;
    RecomputeModules m{core_attn, false, false};
    for (bool RecomputeModules::*module : {&RecomputeModules::moe_act, &RecomputeModules::moe,
                                           &RecomputeModules::shared_experts, &RecomputeModules::mla_up_proj}) {
      const bool applies = module == &RecomputeModules::mla_up_proj        ? spec.mla.enabled
                           : module == &RecomputeModules::shared_experts ? spec.moe.shared_ffn_hidden > 0
                                                                           : spec.moe.enabled();
      if (!applies) continue;
      RecomputeModules with = m;
      with.*module = true;
      out.push_back(with);
    }
  }
  return out;
}

// The configurations of one layout: config_names()'s (name, policy), and for a mixture of
// experts or latent attention selective recompute of their modules.
std::vector<std::pair<std::string, LayerPolicy>> searched_policies(const PlanRequest& r, double s, const Layout& l) {
  const bool moe = r.model.layer.moe.enabled(), more_modules = moe || r.model.layer.mla.enabled;
  std::vector<std::pair<std::string, LayerPolicy>> out;
  for (const std::string& name : config_names()) {
    LayerPolicy c = parse_config(name);
    if (c.sequence_parallel && (l.t == 1 || std::fmod(s, l.t) != 0)) continue;
    if (moe && l.t > 1 && !c.sequence_parallel) continue;  // Megatron-Core's MoE under TP needs SP
    c.attention = r.attention;
    c.cp_comm = r.cp_comm;
    if (context_parallel_rule(s, r.model.a, r.model.layer.groups(r.model.dims(1, 1, 1)), l.t, l.cp, c) != CpRule::ok)
      continue;
    // Fused attention keeps no probabilities: selective recompute of core_attn would run the
    // whole attention forward again to save only the 4·asb/t bytes of its lse. Left out.
    if (c.recompute != Recompute::selective || r.attention == Attention::unfused) out.push_back({name, c});
    if (c.recompute != Recompute::selective || !more_modules) continue;
    for (const RecomputeModules& modules : module_sets(r)) {
      c.modules = modules;
      out.push_back({name, c});
    }
  }
  return out;
}

// Every configuration of one layout, appended to `out`.
void add_configs(const PlanRequest& r, double s, const Layout& l, int N, const std::vector<int>& stage_moe,
                 std::vector<PlanCandidate>& out) {
  for (const auto& [name, c] : searched_policies(r, s, l)) {
    PlanCandidate k;
    k.t = l.t, k.cp = l.cp, k.p = l.p, k.m = l.m, k.dp = l.dp, k.ep = l.ep, k.etp = l.etp, k.b = l.b;
    k.microbatches = N;
    k.config = name;
    k.modules = recomputed_modules_text(c);
    StepConfig step;
    step.layout.t = l.t, step.layout.cp = l.cp, step.layout.p = l.p, step.layout.vp = l.m, step.layout.dp = l.dp;
    step.layout.ep = l.ep, step.layout.etp = l.etp;
    step.seq = s, step.micro_batch = l.b, step.global_batch = r.global_batch;
    step.policy = c;
    step.distributed_optimizer = r.distributed_optimizer;
    step.sharding = r.sharding;
    step.moe_expert_load = r.moe_expert_load;
    step.offload = r.offload;
    // As Megatron-Core runs: Transformer Engine, grouped GEMM for the experts.
    step.workspace_bytes =
        library_workspace_bytes(true, r.model.layer.moe.enabled(), library_workspaces(r.gpu.compute_major));
    fill_memory(r.model, step, r.headroom_bytes, k);
    k.fits = k.total_bytes <= r.gpu.memory_bytes;
    fill_time(r, s, l, c, stage_moe, k);
    out.push_back(k);
  }
}

// The expert layouts (ep, etp) of t·C·dp ranks: etp 1 (each expert whole) or t (each split
// over the TP group, Megatron-Core's default) where t divides the expert width, and ep dividing
// E with ep·etp dividing t·C·dp (Megatron's rule); (1, 1) alone for a dense model.
std::vector<std::pair<int, int>> expert_layouts(const TransformerModel& M, int t, int ranks) {
  if (!M.layer.moe.enabled()) return {{1, 1}};
  const double width = M.layer.expert_ffn(M.dims(1, 1, 1));
  std::vector<std::pair<int, int>> out;
  for (const int etp : {1, t}) {
    if (etp > 1 && (t == 1 || std::fmod(width, etp) != 0)) continue;
    for (const int ep : divisors(ranks / etp))
      if (std::fmod(M.layer.moe.num_experts, ep) == 0) out.push_back({ep, etp});
    if (t == 1) break;
  }
  return out;
}

// The context-parallel sizes worth searching: up to max_cp, and within Megatron's rules
// (context_parallel_rule; SP's rows are the configuration's, checked in add_configs).
bool cp_fits(const PlanRequest& r, double s, int t, int C) {
  if (C > r.max_cp) return false;
  LayerPolicy p;
  p.attention = r.attention, p.cp_comm = r.cp_comm;
  return context_parallel_rule(s, r.model.a, r.model.layer.groups(r.model.dims(1, 1, 1)), t, C, p) == CpRule::ok;
}

void check_request(const PlanRequest& r, double s) {
  const TransformerModel& M = r.model;
  const double B = r.global_batch;
  if (r.gpus < 1 || r.gpus > kMaxPlanGpus)
    throw std::invalid_argument("--gpus must be in 1.." + std::to_string(kMaxPlanGpus));
  if (!(B >= 1 && B <= kMaxGlobalBatch) || std::floor(B) != B)
    throw std::invalid_argument("--global-batch must be a whole number in 1.." +
                                std::to_string(static_cast<int>(kMaxGlobalBatch)));
  if (!(s >= 1) || std::floor(s) != s) throw std::invalid_argument("--seq must be a whole number >= 1");
  if (!(r.efficiency > 0 && r.efficiency <= 1)) throw std::invalid_argument("--efficiency must be in (0, 1]");
  if (r.max_cp < 1 || r.max_cp > kMaxPlanGpus)
    throw std::invalid_argument("--max-cp must be in 1.." + std::to_string(kMaxPlanGpus));
  if (!(M.L >= 1 && M.L <= kMaxPlanLayers) || std::floor(M.L) != M.L)
    throw std::invalid_argument("the model's layers must be a whole number in 1.." + std::to_string(int(kMaxPlanLayers)));
}

}  // namespace

std::vector<PlanCandidate> plan_search(const PlanRequest& r) {
  const TransformerModel& M = r.model;
  const double s = r.seq > 0 ? r.seq : M.seq, B = r.global_batch;
  check_request(r, s);
  const Dims unit = M.dims(1, 1, 1);
  const double g = M.layer.groups(unit), F = M.layer.ffn(unit), shared = M.layer.moe.shared_ffn_hidden;
  std::vector<PlanCandidate> out;
  for (int t : {1, 2, 4, 8}) {
    if (r.gpus % t != 0 || std::fmod(M.a, t) != 0 || std::fmod(g, t) != 0 || std::fmod(M.h, t) != 0 ||
        std::fmod(F, t) != 0 || std::fmod(shared, t) != 0)
      continue;
    for (int C = 1; C <= r.gpus / t; C *= 2) {
      if ((r.gpus / t) % C != 0 || !cp_fits(r, s, t, C)) continue;
      // p divides both the layers and the GPUs left by t·C: looked for among the latter, so a
      // model with very many layers costs no more than one with few.
      for (const int p : divisors(r.gpus / (t * C))) {
        if (std::fmod(M.L, p) != 0) continue;
        const int dp = r.gpus / (t * C * p);
        if (std::fmod(B, dp) != 0) continue;
        for (int m : {1, 2, 4}) {
          if (m > 1 && (p == 1 || std::fmod(M.L, static_cast<double>(p) * m) != 0)) continue;
          const std::vector<int> stage_moe = stage_moe_layers(M, p, m);
          for (double b : {1.0, 2.0, 4.0, 8.0}) {
            if (std::fmod(B / dp, b) != 0) continue;
            const int N = static_cast<int>(B / dp / b);
            if (m > 1 && N % p != 0) continue;  // Megatron's interleaved schedule needs N % p == 0
            for (const auto& [ep, etp] : expert_layouts(M, t, t * C * dp))
              add_configs(r, s, Layout{t, C, p, m, dp, b, ep, etp}, N, stage_moe, out);
          }
        }
      }
    }
  }
  if (out.empty())
    throw std::invalid_argument("no layout of " + std::to_string(r.gpus) + " GPUs fits " + M.name +
                                " (t in 1,2,4,8 dividing heads and kv-heads, p dividing L, global batch divisible by dp)");
  std::stable_sort(out.begin(), out.end(), [](const PlanCandidate& x, const PlanCandidate& y) {
    if (x.fits != y.fits) return x.fits;
    return x.iteration_s < y.iteration_s;
  });
  return out;
}

}  // namespace actbench::theory
