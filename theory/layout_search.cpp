#include "theory/layout_search.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>

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
  for (const bool llama : {true, false})  // the llama family, then Table 3's GPT models
    for (const ModelRow& r : model_table())
      if (llama ? r.arch == "llama" : r.paper) {
        if (r.name == name) return preset_model(r);
        names.push_back(r.name);
      }
  throw std::invalid_argument("unknown model '" + name + "' (expected " + one_of(names) + ")");
}

const Gpu& plan_gpu(const std::string& name) {
  // B200 (HGX, 180 GB): 2.25 PFLOP/s dense bf16, 8 TB/s HBM3e, NVLink 5 900 GB/s per direction,
  // one 400 Gb/s port per GPU.
  static const Gpu b200{"b200", "B200 SXM 180GB", 180e9, 2.25e15, 8.0e12, 900e9, 50e9};
  if (name == "b200") return b200;
  for (const auto& g : gpus())
    if (g.name == name) return g;
  throw std::invalid_argument("unknown GPU '" + name + "' (expected a100, h100, h200 or b200)");
}

namespace {

// Forward FLOPs of one layer for b sequences, whole layer (all ranks). causal: attention
// matrices counted over their causal half (what a fused kernel computes).
double attention_fwd_flops(const TransformerModel& m, double s, double b, bool causal) {
  return (causal ? 2.0 : 4.0) * b * s * s * m.a * m.layer.head_dim(m.dims(s, b, 1));
}
double layer_fwd_flops(const TransformerModel& m, double s, double b, bool causal) {
  const Dims d = m.dims(s, b, 1);
  const double head = m.layer.head_dim(d), g = m.layer.groups(d), F = m.layer.ffn(d);
  const double fc1 = m.layer.activation == Activation::swiglu ? 2 * F : F;
  return 2 * b * s * m.h * ((m.a + 2 * g) * head + m.a * head + fc1 + F) + attention_fwd_flops(m, s, b, causal);
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
  k.weight_bytes = top.weight_bytes;
  k.grad_bytes = top.grad_bytes;
  k.optimizer_bytes = top.optimizer_bytes;
  k.per_layer_activation_bytes = layer_bytes(d, M.layer, c.policy) + layer_extra_bytes(d, M.layer, c.policy);
  k.activation_bytes = top.activation_bytes;
  k.layers_in_flight = k.activation_bytes / k.per_layer_activation_bytes;
  k.extra_bytes = top.embedding_bytes + top.output_bytes;
  k.working_set_bytes = top.recompute_working_set_bytes + top.grad_working_set_bytes + top.loss_working_set_bytes +
                        top.embedding_grad_bytes;
  k.setup_bytes = top.setup_peak_bytes;
  k.headroom_bytes = headroom;
  k.total_bytes = top.peak_bytes + headroom;
}

}  // namespace

double cp_exchange_bytes(const TransformerModel& m, double s, double b, int t, int C, CpCommType type,
                         bool recompute_attention) {
  if (C == 1) return 0;
  const Dims unit = m.dims(1, 1, 1);
  const double e = 2, head = m.layer.head_dim(unit), g = m.layer.groups(unit);
  const double kv = 2 * e * s / C * b * g * head / t;  // one rank's k and v
  // The forward's exchange, backward's (k, v again and their gradients back: twice it) and the
  // recompute's forward again.
  const double kv_passes = recompute_attention ? 4 : 3;
  switch (type) {
    case CpCommType::p2p: return kv_passes * (C - 1) * kv;                   // C − 1 blocks
    case CpCommType::all_gather: return kv_passes * (C - 1.0) / C * kv * C;  // every other rank's share
    case CpCommType::a2a: {  // q, k, v to heads and the output back; in backward their gradients
      const double passes = recompute_attention ? 3 : 2;
      return passes * (C - 1.0) / C * e * s / C * b * (2 * m.a + 2 * g) * head / t;
    }
  }
  return 0;
}

namespace {

struct Layout {
  int t = 1, cp = 1, p = 1, m = 1, dp = 1;
  double b = 1;
};

// The iteration-time model (layout_search.hpp) of one candidate; memory is filled already.
void fill_time(const PlanRequest& r, double s, const Layout& l, const LayerPolicy& c, PlanCandidate& k) {
  const TransformerModel& M = r.model;
  const Gpu& G = r.gpu;
  const double B = r.global_batch, t = l.t, C = l.cp, b = l.b, e = 2;  // bf16
  const Dims unit = M.dims(1, 1, 1);
  const double layers = M.L / l.p, sbh = s * b * M.h / C, V = padded_vocab(M, t);  // the rank's rows
  const double rate = G.peak_flops * r.efficiency;
  const bool causal = c.attention == Attention::fused;
  const double fwd = layer_fwd_flops(M, s, b, causal) / (t * C) / rate;
  const double attention_fwd = attention_fwd_flops(M, s, b, causal) / (t * C) / rate;
  double recompute = 0;
  if (c.recompute == Recompute::full) recompute = fwd;
  else if (c.recompute == Recompute::selective && c.attention == Attention::unfused)
    recompute = 2 * b * s * s * M.a * M.layer.head_dim(unit) / (t * C) / rate;  // Q Kᵀ again for the probabilities
  const double ring = t > 1 ? (t - 1.0) / t : 0.0;
  // fwd: 2 all-reduces (or all-gather + reduce-scatter pairs); bwd: the same plus, under SP,
  // the two saved-input all-gathers; full recompute repeats the forward's.
  double comm_bytes = 2 * 2 * ring * e * sbh * 2 + (c.sequence_parallel ? 2 * ring * e * sbh : 0);
  if (c.recompute == Recompute::full) comm_bytes += 2 * 2 * ring * e * sbh;
  // Context parallelism's exchange: within a node while t·C ≤ 8; p2p hidden behind attention.
  const bool attention_again = c.recompute == Recompute::full || (c.recompute == Recompute::selective && c.modules.core_attn);
  const double cp_link = t * C <= 8 ? G.nvlink_bytes_per_s : G.network_bytes_per_s;
  const double cp_s = cp_exchange_bytes(M, s, b, l.t, l.cp, r.cp_comm, attention_again) / cp_link;
  const double attention_s = (attention_again ? 4 : 3) * attention_fwd;
  const double cp_exposed = r.cp_comm == CpCommType::p2p ? std::max(0.0, cp_s - attention_s) : cp_s;
  const double split = c.sequence_parallel ? t : 1.0;
  const double layer_s = 3 * fwd + recompute + comm_bytes / G.nvlink_bytes_per_s + cp_exposed;
  const double logits_s = 3 * 2 * b * s / C * M.h * V / t / rate;  // last stage, per micro-batch
  const double stage_s = layers * layer_s + logits_s;                // the slowest stage: the last (or only) one
  const double N = k.microbatches;
  const double p2p_s = l.p > 1 ? 2 * (N * l.m + l.p - 1) * e * sbh / split / G.network_bytes_per_s : 0.0;
  const double pipeline_s = (N + (l.p - 1.0) / l.m) * stage_s + p2p_s;
  const double replicas = static_cast<double>(l.dp) * l.cp;  // gradients reduce over dp·C
  const double dp_ring = replicas > 1 ? (replicas - 1) / replicas : 0.0;
  const double params = k.params_per_gpu;
  const double dp_bytes = r.distributed_optimizer ? dp_ring * params * (4 + 2) : 2 * dp_ring * params * 4;
  const double optimizer_s = 30 * params / (r.distributed_optimizer ? replicas : 1) / G.hbm_bytes_per_s;
  k.iteration_s = pipeline_s + dp_bytes / G.network_bytes_per_s + optimizer_s;
  k.tokens_per_s = B * s / k.iteration_s;
  const double model_flops = 3 * B * (M.L * layer_fwd_flops(M, s, 1, true) + 2 * s * M.h * V);
  k.mfu_percent = 100 * model_flops / (k.iteration_s * r.gpus * G.peak_flops);
}

// Every configuration of one layout, appended to `out`.
void add_configs(const PlanRequest& r, double s, const Layout& l, int N, std::vector<PlanCandidate>& out) {
  for (const std::string& name : config_names()) {
    LayerPolicy c = parse_config(name);
    if (c.sequence_parallel && (l.t == 1 || std::fmod(s, l.t) != 0)) continue;
    c.attention = r.attention;
    c.cp_comm = r.cp_comm;
    if (context_parallel_rule(s, r.model.a, r.model.layer.groups(r.model.dims(1, 1, 1)), l.t, l.cp, c) != CpRule::ok)
      continue;
    // Fused attention keeps no probabilities: selective recompute would run the whole
    // attention forward again to save only the 4·asb/t bytes of its lse. Left out.
    if (r.attention == Attention::fused && c.recompute == Recompute::selective) continue;
    PlanCandidate k;
    k.t = l.t, k.cp = l.cp, k.p = l.p, k.m = l.m, k.dp = l.dp, k.b = l.b, k.microbatches = N, k.config = name;
    StepConfig step;
    step.layout.t = l.t, step.layout.cp = l.cp, step.layout.p = l.p, step.layout.vp = l.m, step.layout.dp = l.dp;
    step.seq = s, step.micro_batch = l.b, step.global_batch = r.global_batch;
    step.policy = c;
    step.distributed_optimizer = r.distributed_optimizer;
    fill_memory(r.model, step, r.headroom_bytes, k);
    k.fits = k.total_bytes <= r.gpu.memory_bytes;
    fill_time(r, s, l, c, k);
    out.push_back(k);
  }
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
  const double g = M.layer.groups(unit), F = M.layer.ffn(unit);
  std::vector<PlanCandidate> out;
  for (int t : {1, 2, 4, 8}) {
    if (r.gpus % t != 0 || std::fmod(M.a, t) != 0 || std::fmod(g, t) != 0 || std::fmod(M.h, t) != 0 ||
        std::fmod(F, t) != 0)
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
          for (double b : {1.0, 2.0, 4.0, 8.0}) {
            if (std::fmod(B / dp, b) != 0) continue;
            const int N = static_cast<int>(B / dp / b);
            if (m > 1 && N % p != 0) continue;  // Megatron's interleaved schedule needs N % p == 0
            add_configs(r, s, Layout{t, C, p, m, dp, b}, N, out);
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
