#pragma once
// Megatron-Core's fine-grained activation offloading (--fine-grained-activation-offloading with
// --offload-modules; docs/step_memory.md, "Fine-grained activation offloading"). Each named
// module's forward runs inside an offload group: the tensors it saves for backward are copied
// to pinned host memory once it has run and their GPU storage is freed at once (PyTorch's
// allocated bytes drop when the copy is queued, not when it lands), and the group is reloaded
// ahead of the module's backward. Only tensors of at least --min-offloaded-tensor-size
// elements (1024·1024) move; parameters never do. The groups, as layer_pieces.hpp's categories:
//
//   group       its saved tensors                                          where
//   attn_norm   ln1_input, ln1_stats (the input norm's input: the layer's  the norm is its own module
//               input, released after the attention's residual add)         (multi-latent attention)
//   qkv_linear  qkv_input, q_/k_norm_input and _stats; with multi-latent    every layer; Transformer
//               attention q_latent, q_up_input, kv_latent, kv_up_input,     Engine's fused norm puts
//               k_pos_emb and the latent norms' statistics                 ln1_input/_stats here too
//   core_attn   q, k, v, attn_lse, softmax_out, softmax_fp32_out, the       unless core_attn is
//               attention dropout's mask and output                         recomputed (its checkpoint keeps q, k, v)
//   attn_proj   proj_input (the attention output the projection reads)      every layer
//   mlp_norm    ln2_input, ln2_stats                                        MoE layers (a dense layer's
//                                                                           norm is inside fc1)
//   expert_fc1  moe_permuted (the experts' fc1 input)                       MoE layers
//   moe_act     moe_act_input, moe_permuted_probs, moe_act_output           MoE layers
//
// Nothing else moves: the residual dropout masks, the router's and dispatcher's bookkeeping,
// the shared experts', the experts' fc2 input and a dense layer's MLP stay on the GPU, and so do
// full recompute's checkpoints. Megatron requires Transformer Engine for it (whose fused norms
// the table assumes); which layers keep their groups on the GPU is the pipeline's business
// (step_memory.hpp).
#include <array>
#include <optional>
#include <string>

#include "theory/activation_memory.hpp"  // Dims, Precision
#include "theory/layer_spec.hpp"
#include "theory/policy.hpp"

namespace actbench::theory {

enum class OffloadModule { attn_norm, qkv_linear, core_attn, attn_proj, mlp_norm, expert_fc1, moe_act };
inline constexpr int kOffloadModules = 7;
const char* offload_module_name(OffloadModule m);                         // Megatron's names
std::optional<OffloadModule> find_offload_module(const std::string& name);  // by that name

struct ActivationOffload {
  std::array<bool, kOffloadModules> modules{};  // by OffloadModule
  double min_tensor_elements = 1024.0 * 1024;   // Megatron's min_offloaded_tensor_size
  bool on(OffloadModule m) const { return modules[static_cast<int>(m)]; }
  bool enabled() const;
  bool operator==(const ActivationOffload&) const = default;
};

// --offload-modules' comma-separated list, as Megatron checks it: its names, attn_proj only
// beside core_attn. Throws InvalidArgument with one line naming the flag.
ActivationOffload parse_offload_modules(const std::string& list);
// The modules' names, comma-separated ("" when none).
std::string offload_modules_text(const ActivationOffload& o);

// One layer's offload groups: whether the layer runs each group (a module it has, offloaded),
// and the bytes of its saved tensors that move to the host.
struct LayerOffload {
  std::array<bool, kOffloadModules> present{};
  std::array<double, kOffloadModules> bytes{};
  double total() const;
};
LayerOffload layer_offload(const Dims& d, const LayerSpec& spec, LayerPolicy c, Precision p,
                           const ActivationOffload& o);

}  // namespace actbench::theory
