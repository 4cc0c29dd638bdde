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
};

// Megatron's recompute flags: one configuration instead of --config's list when any is given.
struct RecomputeFlags {
  std::optional<Recompute> granularity;        // --recompute-granularity / --recompute-activations
  bool sequence_parallel = false;              // --sequence-parallel
  std::optional<RecomputeModules> modules;     // --recompute-modules (selective configurations)
  StackRecompute stack;                        // --recompute-method, --recompute-num-layers (full, a stack)
  bool names_a_configuration() const { return granularity.has_value() || sequence_parallel; }
};

void apply_layer_spec_edits(const LayerSpecEdits& edits, theory::LayerSpec& spec);

// Every field as text, for the ranks to compare (rank_agreement.hpp): (flag, value or "").
std::vector<std::pair<std::string, std::string>> layer_spec_edits_text(const LayerSpecEdits& e);
std::vector<std::pair<std::string, std::string>> recompute_flags_text(const RecomputeFlags& r);

}  // namespace actbench
