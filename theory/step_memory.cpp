#include "theory/step_memory.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

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
  return d;
}

std::vector<int> virtual_stage_layers(const TransformerModel& m, const StepLayout& l) {
  require(l.t >= 1 && l.p >= 1 && l.vp >= 1 && l.dp >= 1 && l.cp >= 1, "the parallel sizes must be at least 1");
  require(l.vp == 1 || l.p > 1, "virtual pipeline stages need a pipeline (pipeline-model-parallel-size > 1)");
  require(whole(m.L) && m.L >= 1, "--num-layers must be a whole number >= 1");
  const int L = static_cast<int>(m.L), p = l.p, vp = l.vp, V = p * vp;
  std::vector<int> out(V, 0);
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

double layer_parameters(const TransformerModel& m, double t) {
  const LayerSpec& s = m.layer;
  const Dims d = m.dims(1, 1, t);
  const double h = m.h, a = m.a, g = s.groups(d), head = s.head_dim(d), F = s.ffn(d);
  const double norm = s.normalization == Norm::layernorm ? 2 : 1;  // weight (and bias) per element
  const double fc1_width = s.activation == Activation::swiglu ? 2 * F : F;
  const double qkv_rows = (a + 2 * g) * head;
  double split = qkv_rows * h + h * a * head + fc1_width * h + F * h;  // QKV, projection, fc1, fc2 weights
  if (s.qkv_bias()) split += qkv_rows;
  if (s.add_bias_linear) split += fc1_width;
  double whole = 2 * norm * h;                       // the two block norms
  if (s.qk_layernorm) whole += 2 * norm * head;      // q and k norms over one head
  if (s.add_bias_linear) whole += 2 * h;             // the projection's and fc2's biases (row-parallel)
  return split / t + whole;
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

LayerPolicy keeps_all(LayerPolicy c) {
  c.recompute = Recompute::none;
  return c;
}

double saved_bytes(const Dims& d, const LayerSpec& spec, LayerPolicy c, Precision p) {
  return layer_bytes(d, spec, c, p) + layer_extra_bytes(d, spec, c);
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

struct ChunkTransients {
  double recompute = 0, grads = 0;
};

// The working set of the first layer a chunk's backward runs: what recompute rebuilds
// (one layer, or --recompute-method uniform's group) and the gradients its backward holds at
// once (modelled after autograd's order: the layer output's gradient, kept for the residual,
// beside the activation's input and output gradients in the MLP, or dq, dk, dv and the fp32
// row sums in fused attention, or the probabilities' and scores' gradients unfused).
ChunkTransients chunk_transients(const TransformerModel& m, const StepConfig& c, int layers) {
  ChunkTransients w;
  if (layers == 0) return w;
  const Dims d = c.layer_dims(m);
  const LayerSpec& spec = m.layer;
  const Precision p{c.precision.activation, 1};
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
  const double mlp = e * act_width * sb * F / t;
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

void check(const TransformerModel& m, const StepConfig& c) {
  const StepLayout& l = c.layout;
  require(whole(c.seq) && c.seq >= 1, "--seq-length must be a whole number >= 1");
  require(whole(c.micro_batch) && c.micro_batch >= 1, "--micro-batch-size must be a whole number >= 1");
  const double n = c.microbatches();
  require(whole(n) && n >= 1, "--global-batch-size (" + text(c.global_batch) + ") must be a multiple of "
                              "--micro-batch-size x data-parallel size (" + text(c.micro_batch) + " x " +
                              std::to_string(l.dp) + ")");
  require(l.vp == 1 || std::fmod(n, l.p) == 0,
          "the interleaved schedule needs the micro-batches (" + text(n) + ") to be a multiple of the pipeline size (" +
              std::to_string(l.p) + ")");
  require(whole(m.h) && whole(m.a) && m.h >= 1 && m.a >= 1, "--hidden-size and --num-attention-heads must be whole numbers >= 1");
  require(m.vocab >= 1, "the vocabulary size must be at least 1");
  check_layer_spec(m.dims(c.seq, c.micro_batch, l.t), m.layer);
  const double F = m.layer.ffn(m.dims(1, 1, l.t));
  require(std::fmod(F, l.t) == 0, "--ffn-hidden-size (" + text(F) + ") must be divisible by the tensor-parallel size (" +
                                      std::to_string(l.t) + ")");
  if (c.policy.sequence_parallel)
    require(std::fmod(c.seq, l.t) == 0, "--sequence-parallel needs --seq-length (" + text(c.seq) +
                                            ") divisible by the tensor-parallel size (" + std::to_string(l.t) + ")");
  if (c.policy.recompute == Recompute::full)
    require(c.stack.num_layers >= 1, "--recompute-num-layers must be at least 1");
  check_context_parallel(m, c);
}

// The running total of one stage's live bytes and the largest it reaches.
class PeakTracker {
 public:
  void forward(const ChunkBytes& b) {
    live_.layers += b.layers, live_.embedding += b.embedding, live_.output += b.output;
    ++in_flight_;
  }
  void backward_done(const ChunkBytes& b) {
    live_.layers -= b.layers, live_.embedding -= b.embedding, live_.output -= b.output;
    --in_flight_;
  }
  // The live bytes with `without` already freed, plus the transients, as a candidate peak.
  // `freed_layers`: one micro-batch's layers already freed (its backward ran through them).
  void candidate(const std::string& at, StageMemory transients, double freed_layers = 0) {
    StageMemory s = transients;
    s.microbatches_in_flight = in_flight_ - (freed_layers > 0 ? 1 : 0);
    s.activation_bytes = live_.layers - freed_layers;
    s.embedding_bytes = live_.embedding;
    s.output_bytes = live_.output;
    s.peak_at = at;
    const double total = s.activation_bytes + s.embedding_bytes + s.output_bytes + s.recompute_working_set_bytes +
                         s.grad_working_set_bytes + s.loss_working_set_bytes + s.embedding_grad_bytes;
    if (!found_ || total > best_total_) best_ = s, best_total_ = total, found_ = true;
  }
  const StageMemory& best() const { return best_; }
  double best_total() const { return best_total_; }

 private:
  ChunkBytes live_;
  int in_flight_ = 0;
  StageMemory best_;
  double best_total_ = 0;
  bool found_ = false;
};

std::string op_text(const PipelineOp& op) {
  return std::string(op.forward ? "forward" : "backward") + " mb " + std::to_string(op.microbatch) + " chunk " +
         std::to_string(op.chunk);
}

}  // namespace

ChunkBytes chunk_bytes(const TransformerModel& m, const StepConfig& c, int layers, bool first, bool last) {
  const Dims d = c.layer_dims(m);
  const Precision p{c.precision.activation, 1};
  // The rank's rows: Megatron slices every batch tensor to the rank's s/C under context parallelism.
  const double e = p.elem, sb = d.s * d.b / d.cp, t = d.t, r = c.policy.sequence_parallel ? t : 1.0;
  ChunkBytes out;
  if (c.policy.recompute != Recompute::full) {
    out.layers = layers * saved_bytes(d, m.layer, c.policy, p);
  } else {
    const double n = layers, k = std::min<double>(c.stack.num_layers, n), ckpt = checkpoint_bytes(d, c);
    switch (c.stack.method) {
      case RecomputeMethod::uniform: out.layers = std::ceil(n / c.stack.num_layers) * ckpt; break;
      case RecomputeMethod::block: out.layers = k * ckpt + (n - k) * saved_bytes(d, m.layer, keeps_all(c.policy), p); break;
      case RecomputeMethod::none: out.layers = n * ckpt; break;
    }
  }
  if (first) {
    out.embedding = 8 * sb;                                  // token ids (int64), kept by the lookup
    if (t > 1) out.embedding += 8 * sb + 8 * sb * (t - 1) / t;  // the shard's ids, and the masked rows' indices
    if (m.learned_positions) out.embedding += 8 * sb;        // position ids
    if (m.layer.hidden_dropout > 0) out.embedding += p.mask * sb * d.h / r;  // embedding dropout mask
  }
  if (last) {
    const double stats = m.layer.normalization == Norm::layernorm ? 8 : 4;
    out.output = e * sb * d.h / r + stats * sb / r;  // final norm: input and fp32 statistics
    out.output += e * sb * d.h / r;                  // output layer: its input (the shard, under SP)
    out.output += 4 * sb * padded_vocab(m, t) / t;   // cross entropy: fp32 softmax, vocab-parallel
    out.output += 9 * sb;                            // and its target mask (bool) and local targets (int64)
  }
  return out;
}

std::vector<StageMemory> step_memory(const TransformerModel& m, const StepConfig& c) {
  check(m, c);
  const StepLayout& l = c.layout;
  const std::vector<int> layers = virtual_stage_layers(m, l);
  const int p = l.p, vp = l.vp, N = static_cast<int>(c.microbatches());
  const double t = l.t, V = padded_vocab(m, t), sb = c.seq * c.micro_batch / l.cp;  // the rank's rows
  const TrainingPrecision& prec = c.precision;
  std::vector<StageMemory> out;
  for (int stage = 0; stage < p; ++stage) {
    StageMemory s;
    s.stage = stage;
    std::vector<ChunkBytes> bytes(vp);
    double last_chunk_parameters = 0;
    std::vector<ChunkTransients> transients(vp);
    for (int chunk = 0; chunk < vp; ++chunk) {
      const int n = layers[chunk * p + stage];
      const bool first = stage == 0 && chunk == 0, last = stage == p - 1 && chunk == vp - 1;
      double chunk_parameters = n * layer_parameters(m, t);
      if (first) chunk_parameters += embedding_parameters(m, t);
      if (last) chunk_parameters += output_parameters(m, t, m.tied_embeddings && p == 1);
      s.layers += n;
      s.parameters += chunk_parameters;
      last_chunk_parameters = chunk_parameters;
      bytes[chunk] = chunk_bytes(m, c, n, first, last);
      transients[chunk] = chunk_transients(m, c, n);
    }
    s.weight_bytes = prec.weight * s.parameters;
    s.grad_bytes = prec.grad * s.parameters;
    // The distributed optimizer shards over the data-parallel group with context parallelism.
    s.optimizer_bytes = (prec.master + prec.optimizer_state) * s.parameters / (c.distributed_optimizer ? l.dp * l.cp : 1);
    s.rest_bytes = s.weight_bytes + s.grad_bytes + s.optimizer_bytes;
    // 16-bit logits beside their fp32 copy at the loss (none when activations are fp32).
    const double loss_transient = prec.activation < 4 ? prec.activation * sb * V / t : 0;
    const double embedding_grad = prec.weight * embedding_parameters(m, t);
    PeakTracker peak;
    for (const PipelineOp& op : stage_peak_ops(p, N, vp, stage)) {
      const bool first = stage == 0 && op.chunk == 0, last = stage == p - 1 && op.chunk == vp - 1;
      StageMemory extra;
      if (op.forward) {
        peak.forward(bytes[op.chunk]);
        if (last) extra.loss_working_set_bytes = loss_transient;
        peak.candidate(op_text(op), extra);
        continue;
      }
      extra.recompute_working_set_bytes = transients[op.chunk].recompute;
      extra.grad_working_set_bytes = transients[op.chunk].grads;
      if (last) extra.loss_working_set_bytes = loss_transient;
      peak.candidate(op_text(op), extra);
      if (first) {  // the lookup's backward: this micro-batch's layers are freed by now
        StageMemory lookup;
        lookup.embedding_grad_bytes = embedding_grad;
        peak.candidate(op_text(op) + " (embedding)", lookup, bytes[op.chunk].layers);
      }
      peak.backward_done(bytes[op.chunk]);
    }
    const StageMemory& at = peak.best();
    s.microbatches_in_flight = at.microbatches_in_flight;
    s.activation_bytes = at.activation_bytes;
    s.embedding_bytes = at.embedding_bytes;
    s.output_bytes = at.output_bytes;
    s.recompute_working_set_bytes = at.recompute_working_set_bytes;
    s.grad_working_set_bytes = at.grad_working_set_bytes;
    s.loss_working_set_bytes = at.loss_working_set_bytes;
    s.embedding_grad_bytes = at.embedding_grad_bytes;
    s.peak_at = at.peak_at;
    s.step_peak_bytes = s.rest_bytes + peak.best_total();
    // The distributed optimizer's DDP moves each chunk's weights into one buffer beside the
    // gradient buffer, chunk by chunk; the last chunk's old and new copies coexist with every
    // buffer before any optimizer state exists.
    s.setup_peak_bytes = s.weight_bytes + s.grad_bytes +
                         (c.distributed_optimizer ? prec.weight * last_chunk_parameters : 0);
    s.peak_bytes = std::max(s.step_peak_bytes, s.setup_peak_bytes);
    out.push_back(s);
  }
  return out;
}

}  // namespace actbench::theory
