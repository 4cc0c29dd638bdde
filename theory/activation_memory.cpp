#include "theory/activation_memory.hpp"

namespace actbench::theory {

std::vector<std::pair<std::string, double>> activation_bytes_by_category(const Dims& d, LayerPolicy c, Precision p) {
  const double sbh = d.s * d.b * d.h, as2b = d.a * d.s * d.s * d.b, t = d.t;
  const double seq = c.sequence_parallel ? t : 1.0;  // what TP alone cannot split, SP splits along s
  const double e = p.elem, m = p.mask;
  if (c.recompute == Recompute::full) return {{"layer_input", e * sbh / seq}};
  std::vector<std::pair<std::string, double>> out = {
      {"ln1_input", e * sbh / seq},
      {"qkv_input", e * sbh / seq},
      {"q", e * sbh / t},
      {"k", e * sbh / t},
  };
  if (c.recompute == Recompute::selective) {
    // core_attn's checkpoint keeps q, k, v only: no probabilities, and no lse either
  } else if (c.attention == Attention::fused) {
    out.push_back({"attn_lse", 4.0 * d.a * d.s * d.b / t});  // fp32 whatever the activation type
  } else {
    out.push_back({"softmax_out", e * as2b / t});
    out.push_back({"attn_dropout_mask", m * as2b / t});
    out.push_back({"attn_dropout_out", e * as2b / t});
  }
  const std::vector<std::pair<std::string, double>> rest = {
      {"v", e * sbh / t},
      {"proj_input", e * sbh / t},
      {"attn_residual_mask", m * sbh / seq},
      {"ln2_input", e * sbh / seq},
      {"fc1_input", e * sbh / seq},
      {"gelu_input", 4 * e * sbh / t},
      {"fc2_input", 4 * e * sbh / t},
      {"mlp_residual_mask", m * sbh / seq},
  };
  out.insert(out.end(), rest.begin(), rest.end());
  return out;
}

double activation_bytes(const Dims& d, LayerPolicy c, Precision p) {
  double sum = 0;
  for (const auto& [name, bytes] : activation_bytes_by_category(d, c, p)) sum += bytes;
  return sum;
}

double table2_closed_form(const Dims& d, LayerPolicy c) {
  const double sbh = d.s * d.b * d.h, t = d.t, attn = 5 * d.a * d.s / d.h;
  const bool sp = c.sequence_parallel;
  switch (c.recompute) {
    case Recompute::full: return sbh * 2 / (sp ? t : 1);
    case Recompute::selective: return sp ? sbh * 34 / t : sbh * (10 + 24 / t);
    case Recompute::none: return sp ? sbh * (34 / t + attn / t) : sbh * (10 + 24 / t + attn / t);
  }
  return 0;
}

double layernorm_stats_bytes(const Dims& d, LayerPolicy c) {
  if (c.recompute == Recompute::full) return 0;
  const double rows = d.s * d.b / (c.sequence_parallel ? d.t : 1.0);
  return 2 /*LNs*/ * 2 /*mean, rstd*/ * 4 /*fp32*/ * rows;
}

ActivationTerms activation_terms(const Dims& d, LayerPolicy c, Precision p) {
  ActivationTerms out;
  for (const auto& [name, bytes] : activation_bytes_by_category(d, c, p)) {
    const bool attention = name == "softmax_out" || name == "attn_dropout_mask" || name == "attn_dropout_out";
    (attention ? out.attention_bytes : out.linear_bytes) += bytes;
  }
  return out;
}

double attention_crossover_seq(double h, double a, Precision p) {
  // Linear sbh(16e + 2) = quadratic as²b(2e + 1)  =>  s = h(16e + 2) / (a(2e + 1)).
  return h * (16 * p.elem + 2 * p.mask) / (a * (2 * p.elem + p.mask));
}

double percent_of_tp_baseline(const Dims& d, LayerPolicy c, Precision p) {
  return 100.0 * activation_bytes(d, c, p) / activation_bytes(d, LayerPolicy{}, p);
}

double recompute_working_set_bytes(const Dims& d, LayerPolicy c, Precision p) {
  return activation_bytes(d, {Recompute::none, c.sequence_parallel, c.attention}, p) - activation_bytes(d, c, p);
}

}  // namespace actbench::theory
