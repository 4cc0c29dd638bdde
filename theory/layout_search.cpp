#include "theory/layout_search.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>

#include "theory/llama_memory.hpp"
#include "theory/model_table.hpp"
#include "theory/pipeline.hpp"

namespace actbench::theory {

namespace {
PlanModel plan_model_of(const ModelRow& r) {
  const bool llama = r.arch == "llama";
  return {r.name,
          llama,
          double(r.seq),
          double(r.hidden),
          double(r.heads),
          llama ? double(r.kv_heads) : 0,
          llama ? double(r.ffn_hidden) : 0,
          double(r.layers),
          double(r.vocab),
          r.tied_embeddings};
}
}  // namespace

const std::vector<PlanModel>& llama_plan_models() {
  static const std::vector<PlanModel> models = [] {
    std::vector<PlanModel> list;
    for (const ModelRow& r : model_table())
      if (r.arch == "llama") list.push_back(plan_model_of(r));
    return list;
  }();
  return models;
}

PlanModel plan_model(const std::string& name) {
  std::vector<std::string> names;
  for (const bool llama : {true, false})  // the llama family, then Table 3's GPT models
    for (const ModelRow& r : model_table())
      if (llama ? r.arch == "llama" : r.paper) {
        if (r.name == name) return plan_model_of(r);
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

// Parameters of one layer on one tensor-parallel rank (replicated ones whole).
double layer_params(const PlanModel& m, double t) {
  const double h = m.h;
  if (!m.llama) return 6 * h + (12 * h * h + 7 * h) / t;  // 2 LNs (w, b), proj and fc2 biases replicated
  const double d = h / m.a, g = m.g > 0 ? m.g : m.a, F = m.F > 0 ? m.F : 4 * h;
  return 2 * h + ((m.a + 2 * g) * d * h + h * h + 3 * F * h) / t;
}

double layer_activation_bytes(const PlanModel& m, double s, double b, double t, LayerPolicy c) {
  if (m.llama) return llama_activation_bytes({s, b, m.h, m.a, m.g, m.F, t}, c);
  return activation_bytes({s, b, m.h, m.a, t}, c);
}

// Forward FLOPs of one layer for b sequences, whole layer (all ranks). causal: attention
// matrices counted over their causal half (what a fused kernel computes).
double layer_fwd_flops(const PlanModel& m, double s, double b, bool causal) {
  const double h = m.h, attn = (causal ? 2.0 : 4.0) * b * s * s * h;
  if (!m.llama) return 24 * b * s * h * h + attn;
  const double d = h / m.a, g = m.g > 0 ? m.g : m.a, F = m.F > 0 ? m.F : 4 * h;
  return 2 * b * s * h * ((m.a + 2 * g) * d + h + 3 * F) + attn;
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

}  // namespace

std::vector<PlanCandidate> plan_search(const PlanRequest& r) {
  const PlanModel& M = r.model;
  const double s = r.seq > 0 ? r.seq : M.s, B = r.global_batch;
  if (r.gpus < 1 || r.gpus > kMaxPlanGpus)
    throw std::invalid_argument("--gpus must be in 1.." + std::to_string(kMaxPlanGpus));
  if (!(B >= 1 && B <= kMaxGlobalBatch) || std::floor(B) != B)
    throw std::invalid_argument("--global-batch must be a whole number in 1.." +
                                std::to_string(static_cast<int>(kMaxGlobalBatch)));
  if (!(s >= 1) || std::floor(s) != s) throw std::invalid_argument("--seq must be a whole number >= 1");
  if (!(r.efficiency > 0 && r.efficiency <= 1)) throw std::invalid_argument("--efficiency must be in (0, 1]");
  const Gpu& G = r.gpu;
  const double g = M.llama ? (M.g > 0 ? M.g : M.a) : M.a, F = M.F > 0 ? M.F : 4 * M.h;
  const double e = 2;  // bf16 activations
  std::map<std::tuple<int, int, int>, std::pair<int, int>> in_flight;  // (p, N, m) -> (stage-0 chunks, chunk-0 mbs)
  std::vector<PlanCandidate> out;
  for (int t : {1, 2, 4, 8}) {
    if (r.gpus % t != 0 || std::fmod(M.a, t) != 0 || std::fmod(g, t) != 0 || std::fmod(M.h, t) != 0 ||
        std::fmod(F, t) != 0)
      continue;
    // p divides both the layers and the GPUs left by t: looked for among the latter, so a
    // model with very many layers costs no more than one with few.
    for (const int p : divisors(r.gpus / t)) {
      if (std::fmod(M.L, p) != 0) continue;
      const int dp = r.gpus / (t * p);
      if (std::fmod(B, dp) != 0) continue;
      for (int m : {1, 2, 4}) {
        if (m > 1 && (p == 1 || std::fmod(M.L, static_cast<double>(p) * m) != 0)) continue;
        for (double b : {1.0, 2.0, 4.0, 8.0}) {
          if (std::fmod(B / dp, b) != 0) continue;
          const int N = static_cast<int>(B / dp / b);
          if (m > 1 && N % p != 0) continue;  // Megatron's interleaved schedule needs N % p == 0
          const auto key = std::make_tuple(p, N, m);
          if (!in_flight.count(key)) {
            const StageZeroPeaks peaks = stage_zero_in_flight(p, N, m);
            in_flight[key] = {peaks.chunks, peaks.first_chunk_microbatches};
          }
          const auto [stage0_chunks, chunk0_mbs] = in_flight[key];
          for (const std::string& name : config_names()) {
            LayerPolicy c = parse_config(name);
            if (c.sequence_parallel && (t == 1 || std::fmod(s, t) != 0)) continue;
            // Fused attention keeps no probabilities: selective recompute would run the whole
            // attention forward again to save only the 4·asb/t bytes of its lse. Left out.
            if (r.attention == Attention::fused && c.recompute == Recompute::selective) continue;
            c.attention = r.attention;
            PlanCandidate k;
            k.t = t, k.p = p, k.m = m, k.dp = dp, k.b = b, k.microbatches = N, k.config = name;
            // ---- memory of stage 0 ----
            const double layers = M.L / p;
            double params = layers * layer_params(M, t) + M.v * M.h / t;  // + word embedding (vocab-parallel)
            if (!M.llama) params += s * M.h;                              // learned positions, replicated
            if (p == 1) params += (M.llama ? 1 : 2) * M.h + (M.tied_embeddings ? 0 : M.v * M.h / t);  // final norm, output
            k.params_per_gpu = params;
            k.weight_bytes = 2 * params;
            k.grad_bytes = 4 * params;
            k.optimizer_bytes = 12 * params / (r.distributed_optimizer ? dp : 1);
            k.per_layer_activation_bytes = layer_activation_bytes(M, s, b, t, c);
            k.layers_in_flight = stage0_chunks * M.L / (static_cast<double>(p) * m);
            k.activation_bytes = k.per_layer_activation_bytes * k.layers_in_flight;
            const double split = c.sequence_parallel ? t : 1.0, sbh = s * b * M.h;
            double extra = 8 * s * b * chunk0_mbs;           // token ids (int64)
            if (!M.llama) extra += sbh / split * chunk0_mbs;  // embedding dropout mask
            if (p == 1) {
              extra += 2 * e * sbh / split;                  // final norm input, output layer input
              extra += (M.llama ? 4.0 : 8.0) * s * b / split;  // its rstd (and mean)
              extra += 4 * s * b * M.v / t;                  // fp32 logits
            }
            k.extra_bytes = extra;
            k.working_set_bytes = layer_activation_bytes(M, s, b, t, {Recompute::none, c.sequence_parallel,
                                                                      c.attention}) -
                                  k.per_layer_activation_bytes;
            k.headroom_bytes = r.headroom_bytes;
            k.total_bytes = k.weight_bytes + k.grad_bytes + k.optimizer_bytes + k.activation_bytes + k.extra_bytes +
                            k.working_set_bytes + k.headroom_bytes;
            k.fits = k.total_bytes <= G.memory_bytes;
            // ---- time ----
            const double rate = G.peak_flops * r.efficiency;
            const double fwd = layer_fwd_flops(M, s, b, c.attention == Attention::fused) / t / rate;
            double recompute = 0;
            if (c.recompute == Recompute::full) recompute = fwd;
            else if (c.recompute == Recompute::selective && c.attention == Attention::unfused)
              recompute = 2 * b * s * s * M.h / t / rate;  // Q Kᵀ again for the probabilities
            const double msg = e * sbh, ring = t > 1 ? (t - 1.0) / t : 0.0;
            // fwd: 2 all-reduces (or all-gather + reduce-scatter pairs); bwd: the same plus, under SP,
            // the two saved-input all-gathers; full recompute repeats the forward's.
            double comm_bytes = 2 * 2 * ring * msg * 2 + (c.sequence_parallel ? 2 * ring * msg : 0);
            if (c.recompute == Recompute::full) comm_bytes += 2 * 2 * ring * msg;
            const double layer_s = 3 * fwd + recompute + comm_bytes / G.nvlink_bytes_per_s;
            const double logits_s = 3 * 2 * b * s * M.h * M.v / t / rate;  // last stage, per micro-batch
            const double stage_s = layers * layer_s + logits_s;  // the slowest stage: the last (or only) one
            const double p2p_s = p > 1 ? 2 * (static_cast<double>(N) * m + p - 1) * e * sbh / split / G.network_bytes_per_s
                                       : 0.0;
            const double pipeline_s = (N + (p - 1.0) / m) * stage_s + p2p_s;
            const double dp_ring = dp > 1 ? (dp - 1.0) / dp : 0.0;
            const double dp_bytes = r.distributed_optimizer ? dp_ring * params * (4 + 2) : 2 * dp_ring * params * 4;
            const double optimizer_s = 30 * params / (r.distributed_optimizer ? dp : 1) / G.hbm_bytes_per_s;
            k.iteration_s = pipeline_s + dp_bytes / G.network_bytes_per_s + optimizer_s;
            k.tokens_per_s = B * s / k.iteration_s;
            const double model_flops = 3 * B * (M.L * layer_fwd_flops(M, s, 1, true) + 2 * s * M.h * M.v);
            k.mfu_percent = 100 * model_flops / (k.iteration_s * r.gpus * G.peak_flops);
            out.push_back(k);
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
