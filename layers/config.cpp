#include "layers/config.hpp"

#include "runtime/error.hpp"
#include "theory/activation_memory.hpp"

namespace actbench {

const char* arch_name(Arch a) { return a == Arch::llama ? "llama" : "gpt"; }

Arch parse_arch(const std::string& name) {
  if (name == "gpt") return Arch::gpt;
  if (name == "llama") return Arch::llama;
  throw InvalidArgument("unknown arch '" + name + "' (expected gpt or llama)");
}

int64_t LayerDims::head_dim() const {
  if (spec.mla.enabled) return static_cast<int64_t>(spec.mla.qk_head_dim + spec.mla.qk_pos_emb_head_dim);
  return kv_channels();
}

int64_t LayerDims::v_head_dim() const {
  return spec.mla.enabled ? static_cast<int64_t>(spec.mla.v_head_dim) : head_dim();
}

int64_t LayerDims::rotary_dim() const {
  if (spec.position != theory::PositionEmbedding::rope || a < 1) return 0;
  if (spec.mla.enabled) return static_cast<int64_t>(spec.mla.qk_pos_emb_head_dim);
  return static_cast<int64_t>(static_cast<double>(head_dim()) * spec.rotary_percent);
}

std::string spec_family(const theory::LayerSpec& spec) {
  using namespace theory;
  if (spec.moe.enabled()) return "moe";  // the presets' family of every MoE layer
  const bool plain_attention = !spec.qk_layernorm && spec.rotary_percent == 1.0;
  if (plain_attention && spec.normalization == Norm::layernorm && spec.activation == Activation::gelu &&
      spec.ffn_hidden == 0 && spec.add_bias_linear && spec.kv_heads == 0 && spec.kv_channels == 0 &&
      spec.position == PositionEmbedding::none)
    return "gpt";
  if (plain_attention && spec.normalization == Norm::rmsnorm && spec.activation == Activation::swiglu &&
      !spec.add_bias_linear && !spec.add_qkv_bias && spec.position == PositionEmbedding::rope &&
      spec.attention_dropout == 0 && spec.hidden_dropout == 0)
    return "llama";
  return "custom";
}

// Context parallelism's shape: 2C chunks of whole rows, each split t ways under SP; p2p merges
// fused partial results; a2a hands each rank a/(tC) heads and g/(tC) key/value groups.
static void validate_context_parallel(const LayerDims& d, int t, LayerPolicy p, int cp) {
  if (cp < 1) throw InvalidArgument("--cp must be >= 1");
  switch (context_parallel_rule(d.s, d.a, d.groups(), t, cp, p)) {
    case CpRule::ok: return;
    case CpRule::chunks:
      throw InvalidArgument("seq " + std::to_string(d.s) + " is not divisible by 2 x cp = " + std::to_string(2 * cp) +
                            " (context parallelism cuts the sequence into 2C chunks, two per rank)");
    case CpRule::sp_rows:
      throw InvalidArgument("seq / cp = " + std::to_string(d.s / cp) + " is not divisible by tp " + std::to_string(t) +
                            " (sequence parallelism splits each context-parallel rank's rows)");
    case CpRule::p2p_needs_fused:
      throw InvalidArgument("--cp-comm-type p2p merges partial attentions by their log-sum-exp: it needs --attention "
                            "fused (all_gather and a2a also run unfused)");
    case CpRule::a2a_heads:
      throw InvalidArgument("--cp-comm-type a2a gives each rank heads / (tp x cp): heads " + std::to_string(d.a) +
                            " and kv-heads " + std::to_string(d.groups()) + " must be divisible by tp x cp = " +
                            std::to_string(t * cp));
  }
}

// What the MoE block is built for today: under TP, SP as Megatron-Core requires; experts
// without biases; expert tensor parallelism 1 (each rank's experts take its own rows) or over
// the whole tensor-parallel group (etp = t); with etp 1, expert parallelism over the
// tensor-parallel group (ep = t) or over ep/(t·C) data-parallel replicas of the t x C grid; with
// etp = t, over each TP rank's C x ep/C peers; context parallelism (each CP rank routes its own
// two chunks).
static void validate_expert_tensor_parallel(const LayerDims& d, int t, int ep, int etp) {
  if (etp == 1) return;
  const std::string size = "--expert-tensor-parallel-size " + std::to_string(etp);
  if (etp != t)
    throw InvalidArgument(size + " splits each expert over the tensor-parallel group: it must be --tp (" +
                          std::to_string(t) + ") or 1");
  if (d.expert_ffn() % etp != 0)
    throw InvalidArgument("moe-ffn-hidden-size " + std::to_string(d.expert_ffn()) + " is not divisible by " + size);
}

static void validate_moe(const LayerDims& d, int t, LayerPolicy p, int cp, int ep, int etp) {
  validate_expert_tensor_parallel(d, t, ep, etp);
  // Expert parallelism over data-parallel replicas: etp = t (the EP group one TP rank's
  // replicas), or ep a multiple of t other than t itself (the EP group whole TP groups).
  const bool over_replicas = ep > 1 && (etp > 1 || ep != t);
  if (cp > 1 && over_replicas && etp > 1 && ep % cp != 0)
    throw InvalidArgument("--expert-model-parallel-size " + std::to_string(ep) + " with --expert-tensor-parallel-size " +
                          std::to_string(etp) + " and --cp " + std::to_string(cp) + " spans whole context-parallel "
                          "groups: it must be a multiple of cp (" + std::to_string(cp) + ")");
  if (cp > 1 && over_replicas && etp == 1 && ep % (t * cp) != 0)
    throw InvalidArgument("--expert-model-parallel-size " + std::to_string(ep) + " with --cp " + std::to_string(cp) +
                          " spans whole tensor x context-parallel grids: it must be --tp or a multiple of tp x cp = " +
                          std::to_string(t * cp));
  if (ep > 1 && etp == 1 && ep % t != 0)
    throw InvalidArgument("--expert-model-parallel-size " + std::to_string(ep) + " spans whole tensor-parallel "
                          "groups: it must be a multiple of --tp " + std::to_string(t));
  if (t > 1 && !p.sequence_parallel)
    throw InvalidArgument("an MoE layer under tensor parallelism needs sequence parallelism (config " +
                          config_name(p) + " has none), as Megatron-Core requires");
  if (d.spec.add_bias_linear)
    throw InvalidArgument("an MoE layer's experts have no biases: pass --disable-bias-linear");
  const int64_t experts = static_cast<int64_t>(d.spec.moe.num_experts);
  if (ep < 1 || experts % ep != 0)
    throw InvalidArgument("num-experts " + std::to_string(experts) + " is not divisible by the expert-parallel size " +
                          std::to_string(ep));
  const double shared = d.spec.moe.shared_ffn_hidden;
  if (shared > 0 && static_cast<int64_t>(shared) % t != 0)
    throw InvalidArgument("moe-shared-expert-intermediate-size " + std::to_string(static_cast<int64_t>(shared)) +
                          " is not divisible by tp " + std::to_string(t) + " (the shared experts are split like the MLP)");
}

// What multi-latent attention is built for today (layers/mla_attention.cpp): Megatron-Core's
// MLASelfAttention without biases, RoPE on the whole RoPE part (fused attention with v's own
// head size runs on cpu and meta; the cuda kernels refuse it).
static void validate_mla(const LayerDims& d) {
  auto fail = [](const std::string& m) { throw InvalidArgument(m); };
  if (d.spec.kv_heads != 0 && d.spec.kv_heads != d.a)
    fail("multi-latent attention gives every head its own k and v: --num-query-groups does not apply");
  if (d.spec.add_bias_linear || d.spec.add_qkv_bias)
    fail("multi-latent attention's projections have no biases here: pass --disable-bias-linear (and no "
         "--add-qkv-bias)");
  if (d.spec.position != theory::PositionEmbedding::rope || d.spec.rotary_percent != 1.0)
    fail("multi-latent attention rotates its whole RoPE part (qk-pos-emb-head-dim): it needs "
         "--position-embedding-type rope and --rotary-percent 1");
}

void validate_layer(const LayerDims& d, int t, LayerPolicy p, int cp, int ep, int etp) {
  auto fail = [](const std::string& m) { throw InvalidArgument(m); };
  if (d.s < 1 || d.b < 1 || d.h < 1 || d.a < 1) fail("seq, batch, hidden and heads must all be >= 1");
  if (t < 1) fail("--tp must be >= 1");
  if (d.spec.kv_channels == 0 && !d.spec.mla.enabled && d.h % d.a != 0)  // a given head size needs no h/a
    fail("hidden " + std::to_string(d.h) + " is not divisible by heads " + std::to_string(d.a));
  if (d.a % t != 0)
    fail("heads " + std::to_string(d.a) + " are not divisible by tp " + std::to_string(t) +
         " (each rank needs whole heads)");
  if (d.h % t != 0) fail("hidden " + std::to_string(d.h) + " is not divisible by tp " + std::to_string(t));
  const int64_t g = d.groups();
  if (d.spec.kv_heads < 0 || g < 1 || g > d.a || d.a % g != 0)
    fail("kv-heads " + std::to_string(g) + " must be between 1 and heads " + std::to_string(d.a) + " and divide it");
  if (g % t != 0)
    fail("kv-heads " + std::to_string(g) + " are not divisible by tp " + std::to_string(t) +
         " (each rank needs whole key/value groups)");
  if (d.ffn() < 1 || d.ffn() % t != 0)
    fail("ffn-hidden " + std::to_string(d.ffn()) + " must be >= 1 and divisible by tp " + std::to_string(t));
  // The spec's own bounds (kv_channels among them) before the head size is used below.
  const theory::Dims shape{double(d.s), double(d.b), double(d.h), double(d.a), double(t)};
  theory::check_layer_spec(shape, d.spec);
  // QKV's (a + 2g)·d outputs, the widest head-sized width, in doubles: d may be any whole number.
  if ((double(d.a) + 2.0 * double(g)) * d.spec.head_dim(shape) >= 0x1p63)
    fail("kv-channels is too large: QKV's (heads + 2 x kv-heads) x kv-channels outputs overflow a 64-bit count");
  if (d.spec.position == theory::PositionEmbedding::rope) {
    const int64_t r = d.rotary_dim();
    if (r < 2 || r % 2 != 0)
      fail("RoPE rotates " + std::to_string(r) + " of the head's " + std::to_string(d.head_dim()) +
           " dimensions (head size x rotary-percent): it must be even and at least 2 (pairs i and i + R/2)");
    if (!(d.spec.rotary_base > 0)) fail("rotary-base must be positive");
  }
  if (p.sequence_parallel && d.s % t != 0)
    fail("seq " + std::to_string(d.s) + " is not divisible by tp " + std::to_string(t) + " (needed by config " +
         config_name(p) + ")");
  if (ep != 1 && !d.spec.moe.enabled()) fail("--ep needs an MoE layer (--num-experts)");
  if (d.spec.moe.enabled()) validate_moe(d, t, p, cp, ep, etp);
  if (!d.spec.moe.enabled() && etp != 1) fail("--expert-tensor-parallel-size applies to an MoE layer (--num-experts)");
  if (d.spec.mla.enabled) validate_mla(d);
  validate_context_parallel(d, t, p, cp);
}

}  // namespace actbench
