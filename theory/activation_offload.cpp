#include "theory/activation_offload.hpp"

#include <algorithm>
#include <utility>

#include "runtime/error.hpp"  // InvalidArgument: header only
#include "theory/layer_pieces.hpp"

namespace actbench::theory {

namespace {

constexpr std::pair<OffloadModule, const char*> kNames[kOffloadModules] = {
    {OffloadModule::attn_norm, "attn_norm"},   {OffloadModule::qkv_linear, "qkv_linear"},
    {OffloadModule::core_attn, "core_attn"},   {OffloadModule::attn_proj, "attn_proj"},
    {OffloadModule::mlp_norm, "mlp_norm"},     {OffloadModule::expert_fc1, "expert_fc1"},
    {OffloadModule::moe_act, "moe_act"},
};

// Which group saves a category, and its tensors' element size (0: the activations'), so that
// the size threshold is applied per tensor as Megatron applies it.
struct Saved {
  OffloadModule module;
  double element_bytes = 0;
  double tensors = 1;  // equal tensors the category holds (LayerNorm's mean and rstd; SwiGLU's pair)
};

// A norm's fp32 statistics per row: LayerNorm's mean and rstd, RMSNorm's rstd.
double stats_tensors(const LayerSpec& spec) { return spec.normalization == Norm::layernorm ? 2 : 1; }

std::optional<Saved> norm_saved(const std::string& category, const LayerSpec& spec) {
  // The input norm is its own module under multi-latent attention; Transformer Engine fuses the
  // standard attention's into the QKV GEMM, whose group then saves its input.
  const OffloadModule input_norm = spec.mla.enabled ? OffloadModule::attn_norm : OffloadModule::qkv_linear;
  if (category == "ln1_input") return Saved{input_norm};
  if (category == "ln1_stats") return Saved{input_norm, 4, stats_tensors(spec)};
  // The pre-MLP norm's group runs in MoE layers only (runs_group): a dense layer's is inside fc1.
  if (category == "ln2_input") return Saved{OffloadModule::mlp_norm};
  if (category == "ln2_stats") return Saved{OffloadModule::mlp_norm, 4, stats_tensors(spec)};
  return std::nullopt;
}

std::optional<Saved> saved_in(const std::string& category, const LayerSpec& spec, Precision p) {
  if (std::optional<Saved> norm = norm_saved(category, spec)) return norm;
  const double stats = stats_tensors(spec);
  for (const char* name : {"qkv_input", "q_norm_input", "k_norm_input", "q_latent", "q_up_input", "kv_latent",
                           "kv_up_input", "k_pos_emb"})
    if (category == name) return Saved{OffloadModule::qkv_linear};
  for (const char* name : {"q_norm_stats", "k_norm_stats", "q_latent_norm_stats", "kv_latent_norm_stats"})
    if (category == name) return Saved{OffloadModule::qkv_linear, 4, stats};
  for (const char* name : {"q", "k", "v", "softmax_out", "attn_dropout_out"})
    if (category == name) return Saved{OffloadModule::core_attn};
  if (category == "attn_lse" || category == "softmax_fp32_out") return Saved{OffloadModule::core_attn, 4};
  if (category == "attn_dropout_mask") return Saved{OffloadModule::core_attn, p.mask};
  if (category == "proj_input") return Saved{OffloadModule::attn_proj};
  if (category == "moe_permuted") return Saved{OffloadModule::expert_fc1};
  if (category == "moe_act_input") return Saved{OffloadModule::moe_act};
  if (category == "moe_permuted_probs") return Saved{OffloadModule::moe_act, megatron_router_bytes(spec.moe, p.elem)};
  if (category == "moe_act_output")
    return Saved{OffloadModule::moe_act, 0, spec.activation == Activation::swiglu ? 2.0 : 1.0};
  return std::nullopt;
}

// Whether the layer runs the module's group: a module it has, offloaded, and for core
// attention not checkpointed (Megatron then recomputes it and offloads nothing of it).
bool runs_group(OffloadModule m, const LayerSpec& spec, LayerPolicy c, const ActivationOffload& o) {
  if (!o.on(m)) return false;
  switch (m) {
    case OffloadModule::attn_norm: return spec.mla.enabled;
    case OffloadModule::core_attn: return !(c.recompute == Recompute::selective && c.modules.core_attn);
    case OffloadModule::mlp_norm:  // its own module where the router reads its output
    case OffloadModule::expert_fc1:
    case OffloadModule::moe_act: return spec.moe.enabled();
    case OffloadModule::qkv_linear:
    case OffloadModule::attn_proj: return true;
  }
  return false;
}

}  // namespace

const char* offload_module_name(OffloadModule m) {
  for (const auto& [module, name] : kNames)
    if (module == m) return name;
  return "";
}

std::optional<OffloadModule> find_offload_module(const std::string& name) {
  for (const auto& [module, text] : kNames)
    if (name == text) return module;
  return std::nullopt;
}

ActivationOffload parse_offload_modules(const std::string& list) {
  ActivationOffload o;
  for (size_t begin = 0; begin < list.size();) {
    const size_t comma = std::min(list.find(',', begin), list.size());
    const std::string word = list.substr(begin, comma - begin);
    const std::optional<OffloadModule> m = find_offload_module(word);
    if (!m)
      throw InvalidArgument("--offload-modules: unknown module '" + word +
                            "' (expected attn_norm, qkv_linear, core_attn, attn_proj, mlp_norm, expert_fc1, moe_act)");
    o.modules[static_cast<int>(*m)] = true;
    begin = comma + 1;
  }
  if (o.on(OffloadModule::attn_proj) && !o.on(OffloadModule::core_attn))
    throw InvalidArgument("--offload-modules: attn_proj needs core_attn (attn_proj's input is core attention's output)");
  return o;
}

std::string offload_modules_text(const ActivationOffload& o) {
  std::string out;
  for (const auto& [module, name] : kNames)
    if (o.on(module)) {
      if (!out.empty()) out += ',';
      out += name;
    }
  return out;
}

bool ActivationOffload::enabled() const {
  for (bool m : modules)
    if (m) return true;
  return false;
}

double LayerOffload::total() const {
  double sum = 0;
  for (double b : bytes) sum += b;
  return sum;
}

LayerOffload layer_offload(const Dims& d, const LayerSpec& spec, LayerPolicy c, Precision p,
                           const ActivationOffload& o) {
  LayerOffload out;
  if (!o.enabled() || c.recompute == Recompute::full) return out;  // full recompute keeps checkpoints only
  for (int m = 0; m < kOffloadModules; ++m) out.present[m] = runs_group(static_cast<OffloadModule>(m), spec, c, o);
  ByteCategories saved = layer_bytes_by_category(d, spec, c, p, Bookkeeping::megatron);
  for (auto& extra : layer_extra_bytes_by_category(d, spec, c)) saved.push_back(std::move(extra));
  for (const auto& [category, bytes] : saved) {
    const std::optional<Saved> in = saved_in(category, spec, p);
    if (!in || !out.present[static_cast<int>(in->module)]) continue;
    const double element = in->element_bytes > 0 ? in->element_bytes : p.elem;
    if (bytes / (element * in->tensors) >= o.min_tensor_elements) out.bytes[static_cast<int>(in->module)] += bytes;
  }
  return out;
}

}  // namespace actbench::theory
