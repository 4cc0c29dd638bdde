#pragma once
// How a layer is run: what it recomputes, whether sequence parallelism splits what tensor
// parallelism cannot, and which attention it uses. The layers run it; theory's formulas take
// it. It lives in theory/ so that both can: layers links theory, never the other way round.
#include <string>
#include <vector>

namespace actbench {

enum class Recompute { none, selective, full };

// unfused: the paper's core attention (scores, softmax, dropout mask stored or recomputed);
// fused: FlashAttention-style, only the output and a per-row log-sum-exp are kept.
enum class Attention { unfused, fused };

// Megatron-Core's selective recompute modules (--recompute-modules): what a layer rebuilds in
// backward when recompute is selective; ignored otherwise. core_attn alone (Megatron's
// default) is the paper's selective recompute. theory/layer_pieces.hpp says what each frees.
struct RecomputeModules {
  bool core_attn = true;   // the core attention, from q, k, v (scores, softmax, dropout; fused: the lse)
  bool mlp = false;        // the whole MLP, from its input
  bool layernorm = false;  // both norms' outputs, dropped once the GEMM that reads them has run
  // Mixture-of-experts layers (theory::MoeSpec); on a dense layer they free nothing, and mlp
  // frees nothing on an MoE layer, as in Megatron-Core.
  bool moe_act = false;         // the experts' activation output (fc2's input), rebuilt from fc1's output
  bool moe = false;             // the whole MoE block (router, dispatch, experts, shared experts) from its input
  bool shared_experts = false;  // the shared experts' MLP from its input
  // Multi-latent attention (theory::MlaSpec): the latent norms, up projections and RoPE from
  // the latents, q, k and v dropped once core attention has run; frees nothing elsewhere.
  bool mla_up_proj = false;
  bool operator==(const RecomputeModules&) const = default;
};

// Megatron's --recompute-method with full recompute, over a stack of layers: uniform keeps the
// input of each group of num_layers consecutive layers and recomputes the group as a whole in
// backward; block recomputes the first num_layers layers each from its own input and keeps
// everything of the rest. none: each layer of a full configuration is its own checkpoint.
enum class RecomputeMethod { none, uniform, block };
struct StackRecompute {
  RecomputeMethod method = RecomputeMethod::none;
  int num_layers = 1;  // --recompute-num-layers
  bool operator==(const StackRecompute&) const = default;
};
const char* recompute_method_name(RecomputeMethod m);  // "" | "uniform" | "block"
RecomputeMethod parse_recompute_method(const std::string& name);  // uniform | block; throws InvalidArgument

// Context parallelism's attention (Megatron-Core's --cp-comm-type), on C ranks that each hold
// two chunks of the sequence: p2p passes key/value blocks around a ring and merges partial
// results (fused attention only); all_gather gathers every key and value before attention
// (and again in backward); a2a (Ulysses) exchanges sequence for heads before attention and
// back after it. Read only when C > 1.
enum class CpCommType { p2p, all_gather, a2a };

struct LayerPolicy {
  Recompute recompute = Recompute::none;
  bool sequence_parallel = false;
  Attention attention = Attention::unfused;
  RecomputeModules modules = {};  // read only when recompute is selective
  CpCommType cp_comm = CpCommType::p2p;
  bool operator==(const LayerPolicy&) const = default;
};

// The paper's rows: baseline, sp, full, selective, selective+sp; also full+sp (the input
// checkpoint stored as its sequence shard, Megatron's --distribute-saved-activations), which
// the paper does not measure. The names leave the attention out: it is set on its own.
LayerPolicy parse_config(const std::string& name);  // throws InvalidArgument
std::string config_name(LayerPolicy p);
// The paper's five in the canonical order (layer_run's default), then every name parse_config takes.
const std::vector<std::string>& paper_config_names();
const std::vector<std::string>& config_names();
const char* recompute_name(Recompute r);
const char* attention_name(Attention a);
Attention parse_attention(const std::string& name);  // "unfused" | "fused"; throws InvalidArgument
const char* cp_comm_type_name(CpCommType c);          // "p2p" | "all_gather" | "a2a"
CpCommType parse_cp_comm_type(const std::string& name);  // throws InvalidArgument

// Context parallelism's layout rules, as Megatron-Core and Transformer Engine enforce them,
// in the order checked: the sequence cut into 2C chunks of whole rows; under SP each rank's
// s/C rows split t ways; p2p merges fused attentions' partial results; a2a gives each rank
// heads / (t·C) query heads and key/value groups. The first one broken (ok: none, or C = 1);
// each caller words it with its own flags.
enum class CpRule { ok, chunks, sp_rows, p2p_needs_fused, a2a_heads };
CpRule context_parallel_rule(double seq, double heads, double groups, int t, int cp, const LayerPolicy& p);
// Megatron's spelling: a comma-separated subset of core_attn, mlp, layernorm, moe_act, moe,
// shared_experts, mla_up_proj, each at most once, at least one ("core_attn,mlp"); throws InvalidArgument
// naming the bad word.
RecomputeModules parse_recompute_modules(const std::string& list);
std::string recompute_modules_name(RecomputeModules m);  // the canonical list, e.g. "core_attn,mlp"
// What the policy recomputes module by module: the list under selective recompute, "" otherwise.
std::string recomputed_modules_text(const LayerPolicy& p);

}  // namespace actbench
