#include "theory/step_memory.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <optional>
#include <utility>
#include <cstdio>
#include <stdexcept>

#include "runtime/error.hpp"  // InvalidArgument: header only
#include "theory/layer_pieces.hpp"
#include "theory/pipeline.hpp"

namespace actbench::theory {

namespace {

std::string text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

bool whole(double v) { return std::isfinite(v) && std::floor(v) == v; }

// The layers [from, from + n) come in two specs only, dense and MoE (TransformerModel::
// layer_spec): f is evaluated once for each kind present and multiplied by its count, so a
// stage of a million layers costs two evaluations, not a million.
template <class F>
double sum_over_layers(const TransformerModel& m, int from, int n, F f) {
  int dense = -1, moe = -1, dense_count = 0;
  for (int i = from; i < from + n; ++i) {
    if (!m.is_moe_layer(i)) {
      if (dense_count++ == 0) dense = i;
    } else if (moe < 0) {
      moe = i;
    }
  }
  const int moe_count = n - dense_count;
  return (dense_count > 0 ? dense_count * f(dense) : 0.0) + (moe_count > 0 ? moe_count * f(moe) : 0.0);
}

// Megatron splits --num-layers over p ranks (the first and last may be given their own
// counts, or count the embedding / loss as a layer), then each rank's over its vp chunks.
std::vector<int> rank_layers(const TransformerModel& m, const StepLayout& l) {
  const int L = static_cast<int>(m.L), p = l.p;
  std::vector<int> per_rank(p, 0);
  if (l.first_stage_layers > 0 || l.last_stage_layers > 0) {
    require(p > 1, "--decoder-first/last-pipeline-num-layers need a pipeline (pipeline-model-parallel-size > 1)");
    const int given = (l.first_stage_layers > 0) + (l.last_stage_layers > 0);
    const int middle = L - l.first_stage_layers - l.last_stage_layers, middle_ranks = p - given;
    require(middle >= 0, "--decoder-first/last-pipeline-num-layers add up to more than --num-layers (" +
                             std::to_string(L) + ")");
    require(middle_ranks > 0 ? middle % middle_ranks == 0 : middle == 0,
            "the " + std::to_string(middle) + " layers left by --decoder-first/last-pipeline-num-layers must split "
            "evenly over the other " + std::to_string(middle_ranks) + " pipeline stages");
    std::fill(per_rank.begin(), per_rank.end(), middle_ranks > 0 ? middle / middle_ranks : 0);
    if (l.first_stage_layers > 0) per_rank.front() = l.first_stage_layers;
    if (l.last_stage_layers > 0) per_rank.back() = l.last_stage_layers;
    return per_rank;
  }
  std::fill(per_rank.begin(), per_rank.end(), L / p);
  return per_rank;
}

}  // namespace

double StepConfig::microbatches() const {
  const double dp = layout.dp, total = global_batch > 0 ? global_batch : micro_batch * dp;
  return total / (micro_batch * dp);
}

int StepConfig::world_size() const { return layout.t * layout.cp * layout.p * layout.dp; }

Dims StepConfig::layer_dims(const TransformerModel& m) const {
  Dims d = m.dims(seq, micro_batch, layout.t);
  d.cp = layout.cp;
  d.ep = layout.ep;  // the dispatch plan keeps the local experts' received rows under EP
  d.etp = layout.expert_tp();  // the experts gather the group's rows, each F_e/etp wide
  d.moe_expert_load = moe_expert_load;
  return d;
}

std::vector<int> virtual_stage_layers(const TransformerModel& m, const StepLayout& l) {
  require(l.t >= 1 && l.p >= 1 && l.vp >= 1 && l.dp >= 1 && l.cp >= 1, "the parallel sizes must be at least 1");
  require(l.vp == 1 || l.p > 1, "virtual pipeline stages need a pipeline (pipeline-model-parallel-size > 1)");
  require(whole(m.L) && m.L >= 1, "--num-layers must be a whole number >= 1");
  const int L = static_cast<int>(m.L), p = l.p, vp = l.vp, V = p * vp;
  std::vector<int> out(V, 0);
  if (!l.stage_layers.empty()) {
    require(l.first_stage_layers == 0 && l.last_stage_layers == 0 && !l.embedding_in_split && !l.loss_in_split,
            "--pipeline-model-parallel-layout cannot be combined with --decoder-first/last-pipeline-num-layers or "
            "--account-for-embedding/loss-in-pipeline-split");
    require(static_cast<int>(l.stage_layers.size()) == V,
            "--pipeline-model-parallel-layout has " + std::to_string(l.stage_layers.size()) + " stages, not " +
                std::to_string(p) + " pipeline stages x " + std::to_string(vp) + " virtual stages");
    int sum = 0;
    for (int n : l.stage_layers) require(n >= 0, "a pipeline layout's stage cannot hold fewer than 0 layers"), sum += n;
    require(sum == L, "--pipeline-model-parallel-layout places " + std::to_string(sum) + " decoder layers, not --num-layers (" +
                          std::to_string(L) + ")");
    return l.stage_layers;
  }
  if (l.embedding_in_split || l.loss_in_split) {
    require(l.first_stage_layers == 0 && l.last_stage_layers == 0,
            "--account-for-embedding/loss-in-pipeline-split cannot be combined with "
            "--decoder-first/last-pipeline-num-layers");
    const int total = L + l.embedding_in_split + l.loss_in_split;
    require(total % V == 0, "--num-layers (" + std::to_string(L) + ") plus the embedding and loss counted as layers must "
                            "split evenly over " + std::to_string(V) + " virtual pipeline stages");
    std::fill(out.begin(), out.end(), total / V);
    if (l.embedding_in_split) --out.front();
    if (l.loss_in_split) --out.back();
    return out;
  }
  const bool uneven = l.first_stage_layers > 0 || l.last_stage_layers > 0;
  if (!uneven)
    require(L % V == 0, "--num-layers (" + std::to_string(L) + ") must split evenly over " + std::to_string(p) +
                            " pipeline stages x " + std::to_string(vp) + " virtual stages");
  const std::vector<int> per_rank = rank_layers(m, l);
  for (int stage = 0; stage < p; ++stage) {
    require(per_rank[stage] % vp == 0, "pipeline stage " + std::to_string(stage) + "'s " +
                                           std::to_string(per_rank[stage]) + " layers must split evenly over " +
                                           std::to_string(vp) + " virtual stages");
    for (int chunk = 0; chunk < vp; ++chunk) out[chunk * p + stage] = per_rank[stage] / vp;
  }
  return out;
}

namespace {

// Multi-latent attention's weights (Megatron-Core's MLASelfAttention): the down-projections
// (q to q_lora_rank, kv to kv_lora_rank plus the shared RoPE part) and their norms whole on
// every tensor-parallel rank, the up-projections and the output projection split over t.
LayerParameters latent_attention(const LayerSpec& s, double h, double a, double t, double norm) {
  const MlaSpec& m = s.mla;
  const double qk = m.qk_head_dim + m.qk_pos_emb_head_dim, q_rows = a * qk, kv_up_rows = a * (m.qk_head_dim + m.v_head_dim);
  double split = m.kv_lora_rank * kv_up_rows + h * a * m.v_head_dim;  // kv up-projection, output projection
  const double latent_norm = m.latent_norms ? norm : 0;
  double whole = (m.kv_lora_rank + m.qk_pos_emb_head_dim) * h + latent_norm * m.kv_lora_rank;  // kv down-projection, its norm
  if (m.q_lora_rank > 0) {
    whole += m.q_lora_rank * h + latent_norm * m.q_lora_rank;  // q down-projection and its norm
    split += q_rows * m.q_lora_rank;                    // q up-projection
  } else {
    split += q_rows * h;  // q projected from h directly
  }
  double biases = 0;
  if (s.add_bias_linear) {
    biases = m.kv_lora_rank + m.qk_pos_emb_head_dim + (m.q_lora_rank > 0 ? m.q_lora_rank : 0) + h +
             (kv_up_rows + q_rows) / t;
  }
  const double norms = latent_norm * (m.kv_lora_rank + (m.q_lora_rank > 0 ? m.q_lora_rank : 0));
  return {split / t + whole + biases, 0, norms + biases};
}

// An MLP of width F split over t (fc1 column-, fc2 row-parallel), its biases with add_bias_linear.
double mlp_bias_parameters(const LayerSpec& s, double h, double F, double t) {
  const double fc1 = s.activation == Activation::swiglu ? 2 * F : F;
  return s.add_bias_linear ? fc1 / t + h : 0;
}
double mlp_parameters(const LayerSpec& s, double h, double F, double t) {
  const double fc1 = s.activation == Activation::swiglu ? 2 * F : F;
  return (fc1 * h + F * h) / t + mlp_bias_parameters(s, h, F, t);
}

}  // namespace

LayerParameters layer_parameters(const TransformerModel& m, int i, const StepLayout& l) {
  const LayerSpec s = m.layer_spec(i);
  const double t = l.t;
  const Dims d = m.dims(1, 1, t);
  const double h = m.h, a = m.a, g = s.groups(d), head = s.head_dim(d);
  const double norm = s.normalization == Norm::layernorm ? 2 : 1;  // weight (and bias) per element
  LayerParameters out;
  // Every term added to dense that is not a GEMM's weight is added to not_gemm as well.
  auto other = [&out](double n) { out.dense += n, out.not_gemm += n; };
  if (s.mla.enabled) {
    out = latent_attention(s, h, a, t, norm);
  } else {
    const double qkv_rows = (a + 2 * g) * head;
    out.dense = (qkv_rows * h + h * a * head) / t;   // QKV, projection
    if (s.qkv_bias()) other(qkv_rows / t);
    if (s.qk_layernorm) other(2 * norm * head);      // q and k norms over one head
    if (s.add_bias_linear) other(h);                 // the projection's bias (row-parallel)
  }
  other(2 * norm * h);  // the two block norms
  if (!s.moe.enabled()) {
    out.dense += mlp_parameters(s, h, s.ffn(d), t);
    out.not_gemm += mlp_bias_parameters(s, h, s.ffn(d), t);
    return out;
  }
  const MoeSpec& e = s.moe;
  other(e.num_experts * h);  // the router, whole on every tensor-parallel rank
  if (e.shared_ffn_hidden > 0) {
    out.dense += mlp_parameters(s, h, e.shared_ffn_hidden, t);
    out.not_gemm += mlp_bias_parameters(s, h, e.shared_ffn_hidden, t);
  }
  if (e.shared_ffn_hidden > 0 && e.megatron.shared_expert_gate) other(h);  // the gate's [1, h], whole
  out.expert = e.num_experts / l.ep * mlp_parameters(s, h, s.expert_ffn(d), l.expert_tp());
  return out;
}

void check_expert_layout(const TransformerModel& m, const StepLayout& l) {
  const MoeSpec& e = m.layer.moe;
  const std::string ep = std::to_string(l.ep), etp = std::to_string(l.expert_tp());
  require(l.ep >= 1 && l.etp >= 0, "the expert-parallel sizes must be at least 1");
  require(e.enabled() || l.ep == 1, "--expert-model-parallel-size " + ep + " needs a mixture of experts (--num-experts)");
  if (!e.enabled()) return;
  require(m.moe_layers.empty() || m.moe_layers.size() == static_cast<size_t>(m.L),
          "the MoE layer pattern has " + std::to_string(m.moe_layers.size()) + " entries for " + text(m.L) + " layers");
  require(std::fmod(e.num_experts, l.ep) == 0,
          "--num-experts (" + text(e.num_experts) + ") must be divisible by --expert-model-parallel-size (" + ep + ")");
  const int dense_ranks = l.t * l.cp * l.dp, expert_ranks = l.ep * l.expert_tp();
  require(dense_ranks % expert_ranks == 0,
          "--expert-model-parallel-size x --expert-tensor-parallel-size (" + ep + " x " + etp + ") must divide tensor x "
          "context x data parallel (" + std::to_string(dense_ranks) + "), as Megatron's expert groups need");
  const Dims d = m.dims(1, 1, l.t);
  require(std::fmod(m.layer.expert_ffn(d), l.expert_tp()) == 0,
          "--moe-ffn-hidden-size (" + text(m.layer.expert_ffn(d)) + ") must be divisible by the expert-tensor-parallel size (" + etp + ")");
  require(std::fmod(e.shared_ffn_hidden, l.t) == 0, "--moe-shared-expert-intermediate-size (" + text(e.shared_ffn_hidden) +
                                                       ") must be divisible by the tensor-parallel size (" + std::to_string(l.t) + ")");
}

namespace {

// What the model's first / last chunk holds besides its layers.
double embedding_parameters(const TransformerModel& m, double t) {
  return padded_vocab(m, t) * m.h / t + (m.learned_positions ? m.position_rows() * m.h : 0);
}
double output_parameters(const TransformerModel& m, double t, bool shares_embedding) {
  const double final_norm = (m.layer.normalization == Norm::layernorm ? 2 : 1) * m.h;
  return final_norm + (shares_embedding ? 0 : padded_vocab(m, t) * m.h / t);
}

// Megatron-Core's multi-token prediction block on the last stage (TransformerModel::mtp_layers):
// per MTP layer, enorm and hnorm, eh_proj (2h -> h, column-parallel, no bias), one layer of the
// last layer's spec and a final norm; with p > 1 the stage also holds a copy of the word
// embedding for the MTP lookups (shared with stage 0; a tied output layer reads it and needs
// no weight of its own).
LayerParameters mtp_parameters(const TransformerModel& m, const StepLayout& l) {
  LayerParameters out;
  if (m.mtp_layers == 0) return out;
  const LayerParameters layer = layer_parameters(m, static_cast<int>(m.L) - 1, l);
  const double norm = m.layer.normalization == Norm::layernorm ? 2 : 1;
  out.dense = m.mtp_layers * (layer.dense + 3 * norm * m.h + 2 * m.h * m.h / l.t);
  out.not_gemm = m.mtp_layers * (layer.not_gemm + 3 * norm * m.h);  // enorm, hnorm, the final norm
  out.expert = m.mtp_layers * layer.expert;
  if (l.p > 1) out.dense += embedding_parameters(m, l.t), out.not_gemm += embedding_parameters(m, l.t);
  return out;
}

LayerPolicy keeps_all(LayerPolicy c) {
  c.recompute = Recompute::none;
  return c;
}

double saved_bytes(const Dims& d, const LayerSpec& spec, LayerPolicy c, Precision p) {
  return layer_bytes(d, spec, c, p, Bookkeeping::megatron) + layer_extra_bytes(d, spec, c);
}

// Full recompute's checkpoint of one layer (or group): its input (the rank's s/C rows), split
// over t under SP or with --distribute-saved-activations.
double checkpoint_bytes(const Dims& d, const StepConfig& c) {
  const bool split = c.policy.sequence_parallel || c.distribute_saved_activations;
  return c.precision.activation * d.s * d.b * d.h / ((split ? d.t : 1.0) * d.cp);
}

// The attention exchange's buffers under context parallelism while a layer's backward runs
// (one TP rank's key/value heads, e bytes each): p2p holds the key/value block it computes
// on, the next one arriving, and the dK/dV block travelling back to its owner; all_gather
// the whole sequence's keys and values and their gradients before the reduce-scatter; a2a
// the head-split copies of q, k, v and of their gradients.
double cp_buffer_bytes(const Dims& d, const LayerSpec& spec, const StepConfig& c) {
  if (d.cp == 1) return 0;
  const double e = c.precision.activation, head = spec.head_dim(d), t = d.t;
  const double kv_rows = d.s * d.b / d.cp * spec.groups(d) * head / t;  // k or v of the rank's rows
  switch (c.policy.cp_comm) {
    case CpCommType::p2p: return 3 * 2 * e * kv_rows;
    case CpCommType::all_gather: return 2 * 2 * e * kv_rows * d.cp;
    case CpCommType::a2a: return 2 * e * (d.s * d.b / d.cp) * (d.a + 2 * spec.groups(d)) * head / t;
  }
  return 0;
}

}  // namespace

// The working set of the first layer a chunk's backward runs: what recompute rebuilds
// (one layer, or --recompute-method uniform's group) and the gradients its backward holds at
// once (modelled after autograd's order: the layer output's gradient, kept for the residual,
// beside the activation's input and output gradients in the MLP, or dq, dk, dv and the fp32
// row sums in fused attention, or the probabilities' and scores' gradients unfused).
// The layer is the chunk's last (its backward runs first), `last_layer` in the model.
ChunkTransients chunk_transients(const TransformerModel& m, const StepConfig& c, int layers, int last_layer) {
  ChunkTransients w;
  if (layers == 0) return w;
  const Dims d = c.layer_dims(m);
  const LayerSpec spec = m.layer_spec(last_layer);
  const Precision p{c.precision.activation, 1};
  const int first_layer = last_layer - layers + 1;
  w.first_layer = c.policy.recompute == Recompute::full ? checkpoint_bytes(d, c)
                                                        : saved_bytes(d, m.layer_spec(first_layer), c.policy, p);
  const double none = saved_bytes(d, spec, keeps_all(c.policy), p);
  if (c.policy.recompute == Recompute::selective) {
    w.recompute = none - saved_bytes(d, spec, c.policy, p);
  } else if (c.policy.recompute == Recompute::full) {
    const int group = c.stack.method == RecomputeMethod::uniform ? std::min(c.stack.num_layers, layers) : 1;
    // The rebuilt first layer reads the checkpoint itself when it is already the shard it keeps.
    w.recompute = group * none - (c.policy.sequence_parallel ? checkpoint_bytes(d, c) : 0);
  }
  const double e = c.precision.activation, sb = d.s * d.b / d.cp, t = d.t;  // the rank's rows
  const double r = c.policy.sequence_parallel ? t : 1.0, F = spec.ffn(d), head = spec.head_dim(d);
  const double act_width = spec.activation == Activation::swiglu ? 2 : 1;
  // An MoE layer's: its experts' activation gradients over the rank's s·b/(r·C) tokens routed to
  // k experts each (balanced, times the routing imbalance; etp splits the width and gathers the
  // rows, so their product stays), beside the shared experts' over all rows.
  const double routed = spec.moe.enabled() ? sb / r * spec.moe.top_k * moe_expert_load(d, spec) : 0;
  const double mlp = spec.moe.enabled()
                         ? e * act_width * (routed * spec.expert_ffn(d) + sb * spec.moe.shared_ffn_hidden / t)
                         : e * act_width * sb * F / t;
  // Fused: dO, dq, dk, dv and the fp32 row sums. Unfused: the probabilities' gradient beside
  // the scores' (without dropout), or beside the dropout output's once that output is freed
  // (the rank's query rows against all s keys); with C > 1 the exchange's buffers besides.
  const double attention = (c.policy.attention == Attention::fused
                                ? e * sb * (2 * d.a + 2 * spec.groups(d)) * head / t + 4 * d.a * sb / t
                                : (spec.attention_dropout > 0 ? 1 : 2) * e * d.a * d.s * sb / t) +
                           cp_buffer_bytes(d, spec, c);
  w.grads = e * sb * d.h / r + std::max(mlp, attention);
  if (!c.gradient_accumulation_fusion) {  // each weight's gradient lands in a bf16 tensor first
    const double qkv = (d.a + 2 * spec.groups(d)) * head * d.h, fc1 = act_width * F * d.h;
    w.grads += c.precision.weight * std::max(qkv, fc1) / t;
  }
  return w;
}

namespace {

// Megatron's context parallelism: 2C chunks of the sequence, two per rank, each rank's rows
// split t ways under SP; p2p merges fused partial results (TE's attention); a2a gives each
// rank heads / (t·C). Megatron refuses the same (its checks and Transformer Engine's).
void check_context_parallel(const TransformerModel& m, const StepConfig& c) {
  const StepLayout& l = c.layout;
  const std::string C = std::to_string(l.cp), tC = std::to_string(l.t * l.cp);
  const double groups = m.layer.groups(c.layer_dims(m));
  switch (context_parallel_rule(c.seq, m.a, groups, l.t, l.cp, c.policy)) {
    case CpRule::ok: return;
    case CpRule::chunks:
      throw InvalidArgument("--context-parallel-size " + C + " needs --seq-length (" + text(c.seq) +
                            ") divisible by 2 x " + C + " (two chunks per rank)");
    case CpRule::sp_rows:
      throw InvalidArgument("--sequence-parallel with --context-parallel-size " + C + " needs --seq-length / " + C +
                            " divisible by the tensor-parallel size (" + std::to_string(l.t) + ")");
    case CpRule::p2p_needs_fused:
      throw InvalidArgument("--cp-comm-type p2p merges fused attentions' partial results: it needs fused attention "
                            "(--transformer-impl transformer_engine)");
    case CpRule::a2a_heads:
      throw InvalidArgument("--cp-comm-type a2a splits heads over tensor x context parallel (" + tC +
                            "): --num-attention-heads (" + text(m.a) + ") and the query groups (" + text(groups) +
                            ") must be divisible by it");
  }
}

// How many ways each kind of state is split (1: whole on every rank).
struct Shards {
  double weight = 1, grad = 1, optimizer = 1;
};
struct StateShards {
  Shards dense, expert;
};

// The dense parameters shard over the data-parallel group with context parallelism (dp·C), the
// experts' over the expert-data-parallel group; with hybrid replicas each level shards within
// one replica, and the outer strategy `optim` spreads the optimizer state over the replicas too.
StateShards state_shards(const StepConfig& c) {
  const StepLayout& l = c.layout;
  const DataParallelSharding& z = c.sharding;
  const DpShard level = sharded_level(z, c.distributed_optimizer);
  const double replicas = z.instances;
  auto shards = [&](double group, bool outer) {
    Shards s;
    const double replica = group / replicas;
    if (level >= DpShard::optimizer) s.optimizer = replica * (z.fsdp && outer ? replicas : 1);
    if (level >= DpShard::gradients) s.grad = replica;
    if (level >= DpShard::parameters) s.weight = replica;
    return s;
  };
  return {shards(l.dp * l.cp, z.outer_optimizer), shards(l.expert_dp(), z.expert_outer_optimizer)};
}

void check_sharding(const StepConfig& c) {
  const StepLayout& l = c.layout;
  const DataParallelSharding& z = c.sharding;
  const std::string I = std::to_string(z.instances);
  require(z.instances >= 1, "--num-distributed-optimizer-instances must be at least 1");
  require((l.dp * l.cp) % z.instances == 0, "--num-distributed-optimizer-instances (" + I +
                                                ") must divide the data-parallel size with context parallelism (" +
                                                std::to_string(l.dp * l.cp) + ")");
  require(l.expert_dp() % z.instances == 0, "--num-distributed-optimizer-instances (" + I +
                                                ") must divide the expert-data-parallel size (" +
                                                std::to_string(l.expert_dp()) + ")");
  if (z.fsdp && (z.outer_optimizer || z.expert_outer_optimizer))
    require(z.instances > 1, "--outer-dp-sharding-strategy optim needs --num-distributed-optimizer-instances > 1 "
                             "(as Megatron-FSDP requires)");
}

void check(const TransformerModel& m, const StepConfig& c) {
  const StepLayout& l = c.layout;
  require(whole(c.seq) && c.seq >= 1, "--seq-length must be a whole number >= 1");
  require(whole(c.micro_batch) && c.micro_batch >= 1, "--micro-batch-size must be a whole number >= 1");
  const double n = c.microbatches();
  require(whole(n) && n >= 1, "--global-batch-size (" + text(c.global_batch) + ") must be a multiple of "
                              "--micro-batch-size x data-parallel size (" + text(c.micro_batch) + " x " +
                              std::to_string(l.dp) + ")");
  if (l.vp > 1) {
    try {
      check_interleaved_group(l.p, static_cast<int>(std::min(n, 1e9)), l.vp_group > 0 ? l.vp_group : l.p);
    } catch (const std::invalid_argument& e) {
      throw InvalidArgument(std::string(e.what()).substr(std::string("pipeline: ").size()) +
                            " (--microbatch-group-size-per-virtual-pipeline-stage, default the pipeline size)");
    }
  }
  require(whole(m.h) && whole(m.a) && m.h >= 1 && m.a >= 1, "--hidden-size and --num-attention-heads must be whole numbers >= 1");
  require(m.vocab >= 1, "the vocabulary size must be at least 1");
  check_layer_spec(m.dims(c.seq, c.micro_batch, l.t), m.layer);
  check_expert_layout(m, l);
  require(c.moe_expert_load >= 1, "--moe-expert-load must be at least 1 (1: balanced routing), got " +
                                      text(c.moe_expert_load));
  require(c.moe_expert_load == 1 || m.layer.moe.enabled(), "--moe-expert-load: the model has no experts");
  if (m.layer.moe.enabled() && l.t > 1)
    require(c.policy.sequence_parallel, "a mixture of experts under tensor parallelism needs --sequence-parallel "
                                        "(as Megatron-Core requires)");
  const double F = m.layer.ffn(m.dims(1, 1, l.t));
  require(std::fmod(F, l.t) == 0, "--ffn-hidden-size (" + text(F) + ") must be divisible by the tensor-parallel size (" +
                                      std::to_string(l.t) + ")");
  if (c.policy.sequence_parallel)
    require(std::fmod(c.seq, l.t) == 0, "--sequence-parallel needs --seq-length (" + text(c.seq) +
                                            ") divisible by the tensor-parallel size (" + std::to_string(l.t) + ")");
  if (c.policy.recompute == Recompute::full)
    require(c.stack.num_layers >= 1, "--recompute-num-layers must be at least 1");
  check_context_parallel(m, c);
  check_sharding(c);
}

// The running total of one stage's live bytes and the largest it reaches, with what each
// chunk-micro-batch in flight holds.
class PeakTracker {
 public:
  using Key = std::pair<int, int>;  // (micro-batch, chunk)
  static Key key(const PipelineOp& op) { return {op.microbatch, op.chunk}; }

  void forward(const PipelineOp& op, const ChunkBytes& held) {
    held_[key(op)] = held;
    add(held, 1);
  }
  // Bytes held to the step's end, whatever runs (the deferred output-layer gradients' inputs).
  void keep(double output_bytes) { live_.output += output_bytes; }
  // A chunk-micro-batch in flight gets its offloaded tail back (held_after_forward's
  // offload_tail: nothing once it is back).
  void reload_tail(const PipelineOp& op) {
    ChunkBytes& b = held_.at(key(op));
    b.layers += b.offload_tail, b.mtp_layers += b.tail_in_mtp, live_.layers += b.offload_tail;
    b.offload_tail = 0, b.tail_in_mtp = 0;
  }
  bool in_flight(const PipelineOp& op) const { return held_.count(key(op)) > 0; }
  const ChunkBytes& held(const PipelineOp& op) const { return held_.at(key(op)); }
  void backward_done(const PipelineOp& op) {
    add(held_.at(key(op)), -1);
    held_.erase(key(op));
  }
  // The live bytes with `freed` already released, plus the transients, as a candidate peak.
  // `freed`: what one micro-batch's backward has released by then (its loss's bytes once the
  // loss's backward has run; its layers once the backward ran through them: `done`, the
  // micro-batch no longer counts as in flight).
  void candidate(const std::string& at, StageMemory transients, const ChunkBytes& freed = {}, bool done = false) {
    StageMemory s = transients;
    s.microbatches_in_flight = static_cast<int>(held_.size()) - (done ? 1 : 0);
    s.activation_bytes = live_.layers - freed.layers;
    s.embedding_bytes = live_.embedding - freed.embedding;
    s.output_bytes = live_.output - freed.output;
    s.peak_at = at;
    const double total = s.activation_bytes + s.embedding_bytes + s.output_bytes + s.working_set_bytes();
    if (!found_ || total > best_total_) best_ = s, best_total_ = total, found_ = true;
  }
  const StageMemory& best() const { return best_; }
  double best_total() const { return best_total_; }

 private:
  void add(const ChunkBytes& b, double sign) {
    live_.layers += sign * b.layers, live_.embedding += sign * b.embedding, live_.output += sign * b.output;
  }
  ChunkBytes live_;
  std::map<Key, ChunkBytes> held_;
  StageMemory best_;
  double best_total_ = 0;
  bool found_ = false;
};

// Fine-grained offloading on one stage, as Megatron-Core's offload manager schedules it
// (docs/step_memory.md, "Fine-grained activation offloading"). Backwards run in one order
// (backward_op); a chunk-micro-batch whose backward is, at its forward, the next of the
// offloading chunks' to run keeps its tail on the GPU. Otherwise the tail comes back at the
// end of the backward before it in that order, when its forward has run by then (the manager
// prefetches the next chunk's last layer), else at its own backward.
class OffloadSchedule {
 public:
  OffloadSchedule(const StepConfig& c, const std::vector<ChunkBytes>& bytes)
      : p_(c.layout.p), microbatches_(static_cast<int>(c.microbatches())), vp_(c.layout.vp), group_(c.layout.vp_group),
        bytes_(bytes) {
    for (const ChunkBytes& b : bytes) active_ = active_ || b.offloads;
  }
  bool active() const { return active_; }
  // At a forward: does it keep its tail?
  bool keeps_tail(const PipelineOp& forward) const {
    const std::optional<PipelineOp> next = next_backward();
    return next && next->microbatch == forward.microbatch && next->chunk == forward.chunk;
  }
  void backward_started() { ++started_; }
  // The next offloading chunk's backward not yet started.
  std::optional<PipelineOp> next_backward() const {
    for (int k = started_; k < microbatches_ * vp_; ++k) {
      const PipelineOp op = backward_op(p_, microbatches_, vp_, k, group_);
      if (bytes_[op.chunk].offloads) return op;
    }
    return std::nullopt;
  }

 private:
  int p_, microbatches_, vp_, group_;
  const std::vector<ChunkBytes>& bytes_;
  bool active_ = false;
  int started_ = 0;
};

// What a chunk-micro-batch holds on the GPU after its forward: its saved tensors less what
// its offload groups moved to the host, with or without the tail.
ChunkBytes held_after_forward(const ChunkBytes& b, bool tail) {
  ChunkBytes held = b;
  held.layers -= b.offloaded - (tail ? b.offload_tail : 0);
  held.mtp_layers -= b.mtp_offloaded - (tail ? b.tail_in_mtp : 0);
  held.offload_tail = tail ? 0 : b.offload_tail;  // what is still to come back
  held.tail_in_mtp = tail ? 0 : b.tail_in_mtp;
  return held;
}

// Megatron-FSDP's unsharded copies during a step (docs/step_memory.md, "What each stage holds").
// Each transformer layer is a unit; the stage's other parameters (embedding, final norm,
// output layer, MTP) are the root's, gathered at the model's first forward and released after
// its backward. With the weights sharded, the root's weights and two layers' (the running
// one and the one prefetched) are whole at every op; with the gradients sharded, a backward
// holds its layer's 16-bit gradients until their reduce-scatter, and on the last chunk the
// output layer's and the final norm's until the root's.
struct FsdpTransients {
  double gathered_weights = 0, layer_grads = 0, output_grads = 0;
};

FsdpTransients fsdp_transients(const StepConfig& c, double root_parameters, double largest_layer, int layers,
                               double output_layer) {
  FsdpTransients f;
  if (!c.sharding.fsdp) return f;
  const double w = c.precision.weight, units = std::min(layers, 2);
  if (c.sharding.level >= DpShard::parameters) f.gathered_weights = w * (root_parameters + units * largest_layer);
  if (c.sharding.level >= DpShard::gradients) f.layer_grads = w * largest_layer, f.output_grads = w * output_layer;
  return f;
}

// The FSDP copies of `op` alone, for a candidate inside the same op.
StageMemory fsdp_only(const StageMemory& op) {
  StageMemory s;
  s.fsdp_gathered_weight_bytes = op.fsdp_gathered_weight_bytes;
  s.fsdp_unsharded_grad_bytes = op.fsdp_unsharded_grad_bytes;
  return s;
}

std::string op_text(const PipelineOp& op) {
  return std::string(op.forward ? "forward" : "backward") + " mb " + std::to_string(op.microbatch) + " chunk " +
         std::to_string(op.chunk);
}

// What the op walk of one stage reads besides the model and the configuration.
struct StageOps {
  int stage = 0;
  const std::vector<ChunkBytes>& bytes;            // per chunk, one micro-batch's
  const std::vector<ChunkTransients>& transients;  // per chunk, its first backward layer's
  FsdpTransients fsdp;
  double loss_transient = 0, embedding_grad = 0;
};

// --defer-embedding-wgrad-compute on the last chunk: what each deferred micro-batch leaves
// until the step's end, and how many are deferred (the limit, or every micro-batch).
struct DeferredWgrad {
  double input = 0, grad = 0;  // the output layer's input (its forward), the logits' gradient (its backward)
  int count = 0;
};
DeferredWgrad deferred_wgrad(const TransformerModel& m, const StepConfig& c) {
  DeferredWgrad w;
  if (!c.defer_embedding_wgrad) return w;
  const double t = c.layout.t, e = c.precision.activation, sb = c.seq * c.micro_batch / c.layout.cp;
  const double r = c.policy.sequence_parallel ? t : 1.0, blocks = 1 + m.mtp_layers;  // MTP's rows beside the decoder's
  w.input = blocks * e * sb * m.h / r;
  w.grad = blocks * e * sb * padded_vocab(m, t) / t;
  const int N = static_cast<int>(c.microbatches());
  w.count = c.wgrad_deferral_limit > 0 ? std::min(c.wgrad_deferral_limit, N) : N;
  return w;
}

// --overlap-moe-expert-parallel-comm: the forward combined 1F1B runs beside the backward
// ops[i], if any: with one stage the next micro-batch's (the forward after it), with a
// pipeline the steady phase's pair (the forward before it).
std::optional<PipelineOp> overlapped_forward(const StepConfig& c, const std::vector<PipelineOp>& ops, size_t i) {
  if (!c.overlap_moe_ep_comm || ops[i].forward) return std::nullopt;
  if (c.layout.p == 1) return i + 1 < ops.size() && ops[i + 1].forward ? std::optional(ops[i + 1]) : std::nullopt;
  return i > 0 && ops[i - 1].forward ? std::optional(ops[i - 1]) : std::nullopt;
}

// The stage's ops in pipeline order, each a candidate peak: the live bytes after a forward,
// and in a backward its loss, its first layer, its MTP lookups and its embedding.
class StageWalk {
 public:
  StageWalk(const TransformerModel& m, const StepConfig& c, const StageOps& in)
      : m_(m), c_(c), in_(in), offload_(c, in.bytes),
        deferred_(in.stage == c.layout.p - 1 ? deferred_wgrad(m, c) : DeferredWgrad{}) {
    const StepLayout& l = c.layout;
    const int N = static_cast<int>(c.microbatches());
    // Deferred weight gradients accumulate over the step, and combined 1F1B pairs a backward
    // with a forward the peak ops may leave out: the walk then takes every op.
    ops_ = deferred_.count > 0 || c.overlap_moe_ep_comm ? stage_ops(l.p, N, l.vp, in.stage, l.vp_group)
                                                        : stage_peak_ops(l.p, N, l.vp, in.stage, l.vp_group);
  }

  PeakTracker run() {
    for (size_t i = 0; i < ops_.size(); ++i) ops_[i].forward ? forward(ops_[i]) : backward(i);
    return peak_;
  }

 private:
  bool first_chunk(const PipelineOp& op) const { return in_.stage == 0 && op.chunk == 0; }
  bool last_chunk(const PipelineOp& op) const {
    return in_.stage == c_.layout.p - 1 && op.chunk == c_.layout.vp - 1;
  }

  void forward(const PipelineOp& op) {
    const bool last = last_chunk(op);
    if (last && deferred_inputs_ < deferred_.count) ++deferred_inputs_, peak_.keep(deferred_.input);
    peak_.forward(op, held_after_forward(in_.bytes[op.chunk], !offload_.active() || offload_.keeps_tail(op)));
    StageMemory extra;
    extra.fsdp_gathered_weight_bytes = in_.fsdp.gathered_weights;
    if (last) extra.loss_working_set_bytes = in_.loss_transient;
    peak_.candidate(op_text(op), extra);
  }

  void backward(size_t i) {
    const PipelineOp& op = ops_[i];
    const bool last = last_chunk(op);
    if (offload_.active()) offload_.backward_started(), peak_.reload_tail(op);
    StageMemory extra;
    extra.fsdp_gathered_weight_bytes = in_.fsdp.gathered_weights;
    extra.fsdp_unsharded_grad_bytes = in_.fsdp.layer_grads + (last ? in_.fsdp.output_grads : 0);
    if (last) {  // the loss's backward first: its bytes and the logits' gradient
      StageMemory loss = extra;
      loss.loss_working_set_bytes = in_.loss_transient;
      peak_.candidate(op_text(op) + " (loss)", loss);
    }
    // A deferred micro-batch keeps the logits' gradient.
    if (last && deferred_grads_ < deferred_.count) ++deferred_grads_, peak_.keep(deferred_.grad);
    first_backward_layer(i, extra);
    const ChunkBytes b = peak_.held(op);
    const ChunkBytes released{0, 0, b.output - b.output_held};
    if (last && m_.mtp_layers > 0) {  // the MTP lookups' backward, the first of the stage's
      StageMemory lookup = fsdp_only(extra);
      lookup.embedding_grad_bytes = in_.embedding_grad;
      peak_.candidate(op_text(op) + " (mtp embedding)", lookup, ChunkBytes{b.mtp_layers, 0, released.output});
    }
    if (first_chunk(op)) {  // the lookup's backward: this micro-batch's layers are freed by now
      StageMemory lookup = fsdp_only(extra);
      lookup.embedding_grad_bytes = in_.embedding_grad;
      peak_.candidate(op_text(op) + " (embedding)", lookup, ChunkBytes{b.layers, 0, b.output}, true);
    }
    peak_.backward_done(op);
    // The end of a backward prefetches the next chunk's tail when its forward has run.
    if (!offload_.active()) return;
    if (const std::optional<PipelineOp> next = offload_.next_backward(); next && peak_.in_flight(*next))
      peak_.reload_tail(*next);
  }

  // The chunk's last layer (with MTP an MTP layer) starts its backward: the loss's and the
  // output layer's bytes are released, what that layer's inputs hold is not yet; under combined
  // 1F1B the paired forward's first layer has run by then, its saved tensors alive beside the
  // live set (a negative release).
  void first_backward_layer(size_t i, StageMemory extra) {
    const PipelineOp& op = ops_[i];
    const ChunkBytes& b = peak_.held(op);
    ChunkBytes released{0, 0, b.output - b.output_held};
    if (const std::optional<PipelineOp> pair = overlapped_forward(c_, ops_, i))
      released.layers = -in_.transients[pair->chunk].first_layer;
    extra.recompute_working_set_bytes = in_.transients[op.chunk].recompute;
    extra.grad_working_set_bytes = in_.transients[op.chunk].grads;
    peak_.candidate(op_text(op), extra, released);
  }

  const TransformerModel& m_;
  const StepConfig& c_;
  const StageOps& in_;
  std::vector<PipelineOp> ops_;
  PeakTracker peak_;
  OffloadSchedule offload_;
  const DeferredWgrad deferred_;
  int deferred_inputs_ = 0, deferred_grads_ = 0;
};

}  // namespace

const char* dp_shard_name(DpShard s) {
  switch (s) {
    case DpShard::none: return "no_shard";
    case DpShard::optimizer: return "optim";
    case DpShard::gradients: return "optim_grads";
    case DpShard::parameters: return "optim_grads_params";
  }
  return "?";
}

DpShard sharded_level(const DataParallelSharding& z, bool distributed_optimizer) {
  if (z.fsdp) return z.level;
  return distributed_optimizer ? DpShard::optimizer : DpShard::none;
}

std::optional<DpShard> find_dp_shard(const std::string& name) {
  for (DpShard s : {DpShard::none, DpShard::optimizer, DpShard::gradients, DpShard::parameters})
    if (name == dp_shard_name(s)) return s;
  return std::nullopt;
}

namespace {

// What one loss over the vocabulary shard keeps for its backward, on sb rows of V_t columns:
// Megatron's the fp32 softmax, the target mask (bool) and the local targets (int64); Transformer
// Engine's the 16-bit logits, the targets (int64) and fp32 max, sum and target logit per row,
// gathered from the t ranks.
double loss_bytes(const StepConfig& c, double sb, double V_t, double t) {
  if (c.cross_entropy == CrossEntropyFusion::te) return c.precision.activation * sb * V_t + 8 * sb + 12 * sb * t;
  return 4 * sb * V_t + 9 * sb;
}

// The transient beside it while the loss runs, forward and backward: the 16-bit logits beside
// their fp32 copy (none when activations are fp32), and under native fusion one more fp32 copy.
double loss_transient_bytes(const StepConfig& c, double sb, double V_t) {
  if (c.cross_entropy == CrossEntropyFusion::te) return 0;
  const double e = c.precision.activation, logits = (e < 4 ? e : 0) * sb * V_t;
  return c.cross_entropy == CrossEntropyFusion::native ? logits + 4 * sb * V_t : logits;
}

// Fine-grained offloading's share of a chunk: what its layers' groups move to the host, and
// the tail, found walking back from its last layer (the MTP layers first): for each group the
// first layer met that runs it. The chunk's layers are of two specs at most, so the last layer
// of each kind is all the walk needs.
void add_offload(const TransformerModel& m, const StepConfig& c, int layers, int first_layer, bool last,
                 ChunkBytes& out) {
  const bool mtp = last && m.mtp_layers > 0;
  if (!c.offload.enabled() || (layers == 0 && !mtp)) return;
  const Dims d = c.layer_dims(m);
  const Precision p{c.precision.activation, 1};
  auto groups = [&](int i) { return layer_offload(d, m.layer_spec(i), c.policy, p, c.offload); };
  std::array<bool, kOffloadModules> found{};
  auto take = [&](const LayerOffload& g) {
    double bytes = 0;
    for (int k = 0; k < kOffloadModules; ++k)
      if (g.present[k] && !found[k]) found[k] = true, bytes += g.bytes[k], out.offloads = true;
    out.offload_tail += bytes;
    return bytes;
  };
  out.offloaded = sum_over_layers(m, first_layer, layers, [&](int i) { return groups(i).total(); });
  if (mtp) {
    const LayerOffload g = groups(static_cast<int>(m.L) - 1);  // each MTP layer has the last layer's spec
    out.mtp_offloaded = m.mtp_layers * g.total();
    out.offloaded += out.mtp_offloaded;
    out.tail_in_mtp = take(g);
  }
  int last_dense = -1, last_moe = -1;
  for (int i = first_layer + layers - 1; i >= first_layer && (last_dense < 0 || last_moe < 0); --i) {
    int& kind = m.is_moe_layer(i) ? last_moe : last_dense;
    if (kind < 0) kind = i;
  }
  for (int i : {std::max(last_dense, last_moe), std::min(last_dense, last_moe)})
    if (i >= 0) take(groups(i));
}

}  // namespace

ChunkBytes chunk_bytes(const TransformerModel& m, const StepConfig& c, int layers, bool first, bool last,
                       int first_layer) {
  const Dims d = c.layer_dims(m);
  const Precision p{c.precision.activation, 1};
  // The rank's rows: Megatron slices every batch tensor to the rank's s/C under context parallelism.
  const double e = p.elem, sb = d.s * d.b / d.cp, t = d.t, r = c.policy.sequence_parallel ? t : 1.0;
  ChunkBytes out;
  // Layer i's saved tensors under `policy` (its own spec: dense or MoE).
  auto kept = [&](int i, LayerPolicy policy) { return saved_bytes(d, m.layer_spec(first_layer + i), policy, p); };
  if (c.policy.recompute != Recompute::full) {
    out.layers = sum_over_layers(m, first_layer, layers, [&](int i) { return kept(i - first_layer, c.policy); });
  } else {
    const double n = layers, k = std::min<double>(c.stack.num_layers, n), ckpt = checkpoint_bytes(d, c);
    switch (c.stack.method) {
      case RecomputeMethod::uniform: out.layers = std::ceil(n / c.stack.num_layers) * ckpt; break;
      case RecomputeMethod::block:
        out.layers = k * ckpt + sum_over_layers(m, first_layer + static_cast<int>(k), layers - static_cast<int>(k),
                                                [&](int i) { return kept(i - first_layer, keeps_all(c.policy)); });
        break;
      case RecomputeMethod::none: out.layers = n * ckpt; break;
    }
  }
  // What one embedding lookup keeps: the token ids (int64), at t > 1 the shard's ids and the
  // masked rows' indices, position ids with learned positions, the dropout mask.
  double lookup = 8 * sb;
  if (t > 1) lookup += 8 * sb + 8 * sb * (t - 1) / t;
  if (m.learned_positions) lookup += 8 * sb;
  if (m.layer.hidden_dropout > 0) lookup += p.mask * sb * d.h / r;
  const double stats = m.layer.normalization == Norm::layernorm ? 8 : 4;  // a norm's fp32 statistics per row
  const double rows = e * sb * d.h / r;                                   // one [s·b/r, h] tensor
  const double norm_input = rows + stats * sb / r;                        // what a norm keeps
  const double loss = loss_bytes(c, sb, padded_vocab(m, t) / t, t);
  if (first) out.embedding = lookup;
  if (last) {
    out.output = norm_input;             // final norm: input and fp32 statistics
    out.output += rows;                  // output layer: its input (the shard, under SP)
    out.output += loss;
  }
  if (last && m.mtp_layers > 0) {
    // Each MTP layer: its lookup of the shifted ids, enorm's and hnorm's inputs and statistics
    // (hnorm's input is the previous layer's output: the decoder's final norm output for the
    // first), eh_proj's input (the two norms' outputs concatenated, 2h wide), the layer of the
    // last layer's spec (full recompute: its checkpointed input), the final norm's input and
    // statistics, and its own loss with the rolled labels' mask and per-token loss (fp32). The
    // output layer reads the decoder's and every MTP layer's output from one concatenated
    // buffer: D more rows than the output layer's input above.
    const double D = m.mtp_layers;
    const LayerSpec spec = m.layer_spec(static_cast<int>(m.L) - 1);
    const double layer = c.policy.recompute == Recompute::full ? checkpoint_bytes(d, c) : saved_bytes(d, spec, c.policy, p);
    out.layers += D * layer;
    out.mtp_layers = D * layer;
    const double eh_proj_input = 2 * rows, mtp_labels = 8 * sb;
    out.output += D * (lookup + 3 * norm_input + eh_proj_input + loss + mtp_labels);  // enorm, hnorm, final norm
    out.output += D * rows;  // the concatenated buffer's rows
    // Backward runs the losses, the output layer and the MTP final norms first, then an MTP
    // layer, then eh_proj, enorm and hnorm, and only then the decoder's final norm.
    out.output_held = norm_input + D * (lookup + 2 * norm_input + eh_proj_input);
  }
  add_offload(m, c, layers, first_layer, last, out);
  return out;
}

double fp8_weight_cache_bytes_per_parameter(Fp8Recipe r) {
  switch (r) {
    case Fp8Recipe::none: return 0;
    case Fp8Recipe::delayed:
    case Fp8Recipe::tensorwise: return 2;                    // rowwise and columnwise data
    case Fp8Recipe::blockwise: return 2 + 2 * 4.0 / (128 * 128);  // and an fp32 scale per block each way
    case Fp8Recipe::mxfp8: return 2 + 2 / 32.0;             // and an E8M0 scale per 32 elements each way
  }
  return 0;
}

const char* fp8_recipe_name(Fp8Recipe r) {
  switch (r) {
    case Fp8Recipe::none: return "none";
    case Fp8Recipe::delayed: return "delayed";
    case Fp8Recipe::tensorwise: return "tensorwise";
    case Fp8Recipe::blockwise: return "blockwise";
    case Fp8Recipe::mxfp8: return "mxfp8";
  }
  return "?";
}

std::optional<Fp8Recipe> find_fp8_recipe(const std::string& name) {
  for (Fp8Recipe r : {Fp8Recipe::delayed, Fp8Recipe::tensorwise, Fp8Recipe::blockwise, Fp8Recipe::mxfp8})
    if (name == fp8_recipe_name(r)) return r;
  return std::nullopt;
}

LibraryWorkspaces library_workspaces(int compute_major, double cublas_workspace_config) {
  constexpr double KiB = 1024, MiB = 1024 * KiB;
  LibraryWorkspaces w;
  w.transformer_engine = compute_major >= 9 ? 32 * MiB : 4 * MiB;
  w.pytorch = cublas_workspace_config > 0 ? cublas_workspace_config
              : compute_major >= 9        ? 4096 * KiB * 8
                                          : 4096 * KiB * 2 + 16 * KiB * 8;
  return w;
}

double library_workspace_bytes(bool transformer_engine, bool grouped_gemm, const LibraryWorkspaces& sizes) {
  constexpr double kPytorchWorkspaces = 2, kGroupedGemmStreams = 4;
  const double te = transformer_engine ? 1 + (grouped_gemm ? kGroupedGemmStreams : 0) : 0;
  return kPytorchWorkspaces * sizes.pytorch + te * sizes.transformer_engine;
}

std::vector<StageMemory> step_memory(const TransformerModel& m, const StepConfig& c) {
  check(m, c);
  const StepLayout& l = c.layout;
  const std::vector<int> layers = virtual_stage_layers(m, l);
  std::vector<int> first_layer(layers.size(), 0);  // Megatron's order: virtual stage chunk·p + stage
  for (size_t v = 1; v < layers.size(); ++v) first_layer[v] = first_layer[v - 1] + layers[v - 1];
  const int p = l.p, vp = l.vp;
  const double t = l.t, V = padded_vocab(m, t), sb = c.seq * c.micro_batch / l.cp;  // the rank's rows
  const TrainingPrecision& prec = c.precision;
  std::vector<StageMemory> out;
  for (int stage = 0; stage < p; ++stage) {
    StageMemory s;
    s.stage = stage;
    std::vector<ChunkBytes> bytes(vp);
    double last_chunk_parameters = 0;
    std::vector<ChunkTransients> transients(vp);
    double expert_parameters = 0, layer_parameters_total = 0, largest_layer = 0, output_layer = 0;
    double gemm_parameters = 0;  // the GEMM weights, which FP8 recipes cache in FP8
    for (int chunk = 0; chunk < vp; ++chunk) {
      const int n = layers[chunk * p + stage], from = first_layer[chunk * p + stage];
      const bool first = stage == 0 && chunk == 0, last = stage == p - 1 && chunk == vp - 1;
      double chunk_parameters = 0;
      chunk_parameters += sum_over_layers(m, from, n, [&](int i) { return layer_parameters(m, i, l).total(); });
      expert_parameters += sum_over_layers(m, from, n, [&](int i) { return layer_parameters(m, i, l).expert; });
      gemm_parameters += sum_over_layers(m, from, n, [&](int i) { return layer_parameters(m, i, l).gemm(); });
      layer_parameters_total += chunk_parameters;
      sum_over_layers(m, from, n, [&](int i) {  // once per kind of layer present: the larger
        largest_layer = std::max(largest_layer, layer_parameters(m, i, l).total());
        return 0.0;
      });
      if (first) chunk_parameters += embedding_parameters(m, t);
      if (last) {
        // With MTP on a later stage, a tied output layer reads the stage's embedding copy.
        const bool shares = m.tied_embeddings && (p == 1 || m.mtp_layers > 0);
        const LayerParameters mtp = mtp_parameters(m, l);
        output_layer = output_parameters(m, t, false);  // its gradient: a shared weight's is as large
        chunk_parameters += output_parameters(m, t, shares) + mtp.total();
        expert_parameters += mtp.expert;
        gemm_parameters += mtp.gemm();
      }
      s.layers += n;
      s.parameters += chunk_parameters;
      last_chunk_parameters = chunk_parameters;
      bytes[chunk] = chunk_bytes(m, c, n, first, last, from);
      transients[chunk] = chunk_transients(m, c, n, from + n - 1);
    }
    s.expert_parameters = expert_parameters;
    const StateShards shards = state_shards(c);
    const double dense_parameters = s.parameters - expert_parameters;
    auto sharded = [&](double Shards::*kind) {
      return dense_parameters / (shards.dense.*kind) + expert_parameters / (shards.expert.*kind);
    };
    s.weight_bytes = prec.weight * sharded(&Shards::weight);
    s.grad_bytes = prec.grad * sharded(&Shards::grad);
    s.optimizer_bytes = (prec.master + prec.optimizer_state) * sharded(&Shards::optimizer);
    s.workspace_bytes = c.workspace_bytes;
    // Transformer Engine's FP8 weight caches, whole on the rank (Megatron-FSDP's are not modelled).
    if (!c.sharding.fsdp && !c.fp8_param_gather)
      s.fp8_weight_bytes = fp8_weight_cache_bytes_per_parameter(c.fp8) * gemm_parameters;
    const FsdpTransients fsdp = fsdp_transients(c, s.parameters - layer_parameters_total, largest_layer,
                                                s.layers, output_layer);
    s.rest_bytes = s.weight_bytes + s.grad_bytes + s.optimizer_bytes + s.workspace_bytes + s.fp8_weight_bytes;
    const double loss_transient = loss_transient_bytes(c, sb, V / t);
    const double embedding_grad = prec.weight * embedding_parameters(m, t);
    const StageOps stage_ops_in{stage, bytes, transients, fsdp, loss_transient, embedding_grad};
    const PeakTracker peak = StageWalk(m, c, stage_ops_in).run();
    const StageMemory& at = peak.best();
    s.microbatches_in_flight = at.microbatches_in_flight;
    s.activation_bytes = at.activation_bytes;
    s.embedding_bytes = at.embedding_bytes;
    s.output_bytes = at.output_bytes;
    s.recompute_working_set_bytes = at.recompute_working_set_bytes;
    s.grad_working_set_bytes = at.grad_working_set_bytes;
    s.loss_working_set_bytes = at.loss_working_set_bytes;
    s.embedding_grad_bytes = at.embedding_grad_bytes;
    s.fsdp_gathered_weight_bytes = at.fsdp_gathered_weight_bytes;
    s.fsdp_unsharded_grad_bytes = at.fsdp_unsharded_grad_bytes;
    s.peak_at = at.peak_at;
    s.step_peak_bytes = s.rest_bytes + peak.best_total();
    // The distributed optimizer's DDP moves each chunk's weights into one buffer beside the
    // gradient buffer, chunk by chunk; the last chunk's old and new copies coexist with every
    // buffer before any optimizer state exists. (Megatron-FSDP builds its buffers instead.)
    const bool ddp_copies = c.distributed_optimizer && !c.sharding.fsdp;
    s.setup_peak_bytes = s.weight_bytes + s.grad_bytes + (ddp_copies ? prec.weight * last_chunk_parameters : 0);
    s.peak_bytes = std::max(s.step_peak_bytes, s.setup_peak_bytes);
    out.push_back(s);
  }
  return out;
}

}  // namespace actbench::theory
