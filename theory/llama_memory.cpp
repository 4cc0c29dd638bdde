#include "theory/llama_memory.hpp"

namespace actbench::theory {

std::vector<std::pair<std::string, double>> llama_activation_bytes_by_category(const LlamaDims& d, LayerPolicy c,
                                                                               Precision p) {
  const double sbh = d.s * d.b * d.h, t = d.t, e = p.elem;
  const double seq = c.sequence_parallel ? t : 1.0;  // the norm/residual region: split along s under SP
  const double kv = sbh * d.groups() / d.a;          // k or v: g heads of size h/a
  if (c.recompute == Recompute::full) return {{"layer_input", e * sbh / seq}};
  std::vector<std::pair<std::string, double>> out = {
      {"ln1_input", e * sbh / seq},
      {"qkv_input", e * sbh / seq},
      {"q", e * sbh / t},
      {"k", e * kv / t},
  };
  // Selective (core_attn) keeps neither the probabilities nor, fused, the lse.
  if (c.recompute == Recompute::none && c.attention == Attention::fused)
    out.push_back({"attn_lse", 4.0 * d.a * d.s * d.b / t});
  else if (c.recompute == Recompute::none)
    out.push_back({"softmax_out", e * d.a * d.s * d.s * d.b / t});
  const std::vector<std::pair<std::string, double>> rest = {
      {"v", e * kv / t},
      {"proj_input", e * sbh / t},
      {"ln2_input", e * sbh / seq},
      {"fc1_input", e * sbh / seq},
      {"swiglu_input", 2 * e * d.s * d.b * d.ffn() / t},
      {"fc2_input", e * d.s * d.b * d.ffn() / t},
  };
  out.insert(out.end(), rest.begin(), rest.end());
  return out;
}

double llama_activation_bytes(const LlamaDims& d, LayerPolicy c, Precision p) {
  double sum = 0;
  for (const auto& [name, bytes] : llama_activation_bytes_by_category(d, c, p)) sum += bytes;
  return sum;
}

double llama_closed_form(const LlamaDims& d, LayerPolicy c) {
  // sbh·(8/r + (4 + 4g/a + 6F/h + 2as/h)/t), each term multiplied out before dividing so that
  // integer shapes give exact integers: sbh·g/a = sb·g·(h/a), sbh·F/h = sbF, sbh·as/h = as²b.
  const double sb = d.s * d.b, sbh = sb * d.h, t = d.t, r = c.sequence_parallel ? t : 1.0;
  if (c.recompute == Recompute::full) return 2 * sbh / r;
  double per_t = 4 * sbh + 4 * sb * d.groups() * (d.h / d.a) + 6 * sb * d.ffn();
  if (c.recompute == Recompute::none) per_t += c.attention == Attention::fused ? 4 * d.a * sb : 2 * d.a * d.s * sb;
  return 8 * sbh / r + per_t / t;
}

double llama_norm_stats_bytes(const LlamaDims& d, LayerPolicy c) {
  if (c.recompute == Recompute::full) return 0;
  return 2 /*norms*/ * 4 /*fp32 rstd*/ * d.s * d.b / (c.sequence_parallel ? d.t : 1.0);
}

}  // namespace actbench::theory
