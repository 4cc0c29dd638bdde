#pragma once
// layer_run's flags that compose the layer (theory/layer_spec.hpp) and pick Megatron-Core's
// recompute, under Megatron-LM's own names, so that a user's training flags work unchanged:
//
//   --normalization LayerNorm|RMSNorm   --norm-epsilon E (--norm-eps)    --qk-layernorm
//   --swiglu | --squared-relu           --ffn-hidden-size F (--ffn-hidden)
//   --disable-bias-linear               --add-qkv-bias
//   --group-query-attention --num-query-groups G (or --kv-heads G alone)   --kv-channels D
//   --position-embedding-type rope|learned_absolute|none   --rotary-percent P   --rotary-base B (--rope-theta)
//   --attention-dropout P  --hidden-dropout P  (--dropout P sets both)
//   --num-experts E --moe-router-topk K --moe-ffn-hidden-size F_e --moe-shared-expert-intermediate-size F_s
//   --moe-router-score-function softmax|sigmoid --moe-router-pre-softmax --moe-router-topk-scaling-factor X
//   --moe-router-num-groups G --moe-router-group-topk N --moe-router-enable-expert-bias --moe-expert-capacity-factor C
//   --multi-latent-attention --q-lora-rank R --kv-lora-rank R --qk-head-dim D --qk-pos-emb-head-dim D --v-head-dim D
//   --recompute-granularity full|selective (--recompute-activations: selective)  --sequence-parallel
//   --recompute-modules core_attn,mlp,layernorm
//   --recompute-method uniform|block --recompute-num-layers N   (full recompute over --layers)
//
// Each edits the spec of the --model preset (or --arch's, or --hf-config's) where given.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "theory/layer_spec.hpp"
#include "theory/policy.hpp"

namespace actbench {

// What the spec flags said; unset: the preset's.
struct LayerSpecEdits {
  std::optional<theory::Norm> normalization;
  std::optional<double> norm_epsilon;
  bool qk_layernorm = false;
  std::optional<theory::Activation> activation;
  std::optional<int64_t> ffn_hidden;
  bool disable_bias_linear = false, add_qkv_bias = false;
  std::optional<int64_t> kv_heads;
  std::optional<int64_t> kv_channels;  // 0: hidden / heads
  std::optional<theory::PositionEmbedding> position;
  std::optional<double> rotary_percent, rotary_base;
  std::optional<float> attention_dropout, hidden_dropout;
  // The mixture of experts (theory::MoeSpec): each edits the spec's experts where given.
  std::optional<int64_t> num_experts, moe_topk, moe_ffn_hidden, moe_shared_ffn_hidden, moe_num_groups, moe_group_topk;
  std::optional<theory::MoeScore> moe_score;
  std::optional<double> moe_scaling, moe_capacity_factor;
  bool moe_pre_softmax = false, moe_expert_bias = false;
  // Multi-latent attention (theory::MlaSpec): --multi-latent-attention turns it on with
  // Megatron-LM's defaults (no q latent, kv_lora_rank 32); the widths edit it.
  bool multi_latent_attention = false;
  std::optional<int64_t> q_lora_rank, kv_lora_rank, qk_head_dim, qk_pos_emb_head_dim, v_head_dim;
  // Whether any MoE edit other than --num-experts / any MLA width was given.
  bool edits_experts() const;
  bool edits_latent_attention() const;
};

// Megatron's recompute flags: one configuration instead of --config's list when any is given.
struct RecomputeFlags {
  std::optional<Recompute> granularity;        // --recompute-granularity / --recompute-activations
  bool sequence_parallel = false;              // --sequence-parallel
  std::optional<RecomputeModules> modules;     // --recompute-modules (selective configurations)
  StackRecompute stack;                        // --recompute-method, --recompute-num-layers (full, a stack)
  bool names_a_configuration() const { return granularity.has_value() || sequence_parallel; }
};

// Throws InvalidArgument when an MoE edit finds no experts (--num-experts, or the preset's or
// config's), or an MLA width no latent attention.
void apply_layer_spec_edits(const LayerSpecEdits& edits, theory::LayerSpec& spec);

// Every field as text, for the ranks to compare (rank_agreement.hpp): (flag, value or "").
std::vector<std::pair<std::string, std::string>> layer_spec_edits_text(const LayerSpecEdits& e);
std::vector<std::pair<std::string, std::string>> recompute_flags_text(const RecomputeFlags& r);

}  // namespace actbench
