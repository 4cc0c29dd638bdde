#include "theory/flops.hpp"

#include <string>

#include <stdexcept>

#include <cmath>

namespace actbench::theory {

double core_attention_forward_flops(double batch, double s, double h, AttentionSpan att) {
  const double full = 4 * batch * s * s * h;  // QKᵀ: 2bs²h, ·V: 2bs²h
  return att == AttentionSpan::causal ? full / 2 : full;
}

double layer_forward_flops(double batch, double s, double h, AttentionSpan att) {
  // QKV 6bsh², projection 2bsh², fc1 8bsh², fc2 8bsh².
  return 24 * batch * s * h * h + core_attention_forward_flops(batch, s, h, att);
}

double logits_forward_flops(double batch, double s, double h, double v) { return 2 * batch * s * h * v; }

LayerFlops spec_layer_forward_flops(const LayerSpec& spec, double h, double a, double batch, double s,
                                    AttentionSpan att) {
  const Dims d{s, batch, h, a, 1};
  const double T = batch * s, head = spec.head_dim(d), g = spec.groups(d);
  const double gated = spec.activation == Activation::swiglu ? 2 : 1;  // fc1's outputs per unit of width
  LayerFlops f;
  const double span = att == AttentionSpan::causal ? 0.5 : 1.0;
  if (spec.mla.enabled) {
    const MlaSpec& m = spec.mla;
    const double qk = m.qk_head_dim + m.qk_pos_emb_head_dim;  // each head's q and k
    const double q = m.q_lora_rank > 0 ? 2 * T * m.q_lora_rank * a * qk : 2 * T * h * a * qk;
    f.latent_up = q + 2 * T * m.kv_lora_rank * a * (m.qk_head_dim + m.v_head_dim);
    const double down = 2 * T * h * (m.q_lora_rank + m.kv_lora_rank + m.qk_pos_emb_head_dim);
    f.attention_linear = down + f.latent_up + 2 * T * a * m.v_head_dim * h;
    f.core_attention = span * 2 * batch * s * s * a * (qk + m.v_head_dim);
  } else {
    f.attention_linear = 2 * T * h * ((a + 2 * g) * head + a * head);
    f.core_attention = (att == AttentionSpan::causal ? 2.0 : 4.0) * batch * s * s * a * head;
  }
  const MoeSpec& moe = spec.moe;
  if (!moe.enabled()) {
    f.mlp = 2 * T * h * (gated + 1) * spec.ffn(d);
    return f;
  }
  f.router = 2 * T * h * moe.num_experts;
  f.experts = 2 * T * moe.top_k * h * (gated + 1) * spec.expert_ffn(d);
  f.shared_experts = 2 * T * h * (gated + 1) * moe.shared_ffn_hidden;
  return f;
}

double recompute_forward_flops(const LayerFlops& f, const LayerPolicy& c) {
  if (c.recompute == Recompute::full) return f.total();
  if (c.recompute != Recompute::selective) return 0;
  const RecomputeModules& m = c.modules;
  double out = 0;
  // Unfused, backward rebuilds the probabilities from QKᵀ; the fused kernel runs whole again.
  if (m.core_attn) out += c.attention == Attention::unfused ? f.core_attention / 2 : f.core_attention;
  if (m.mlp) out += f.mlp;
  if (m.mla_up_proj) out += f.latent_up;
  if (m.moe) out += f.moe();
  else if (m.shared_experts) out += f.shared_experts;
  return out;
}

namespace {
double base72(const ModelSpec& m) { return 72 * m.B * m.L * m.s * m.h * m.h; }
double base96(const ModelSpec& m) { return 96 * m.B * m.L * m.s * m.h * m.h; }
}  // namespace

double model_flops_eq7(const ModelSpec& m) {
  return base72(m) * (1 + m.s / (6 * m.h) + m.v / (12 * m.h * m.L));
}
double hardware_flops_eq8(const ModelSpec& m) {
  return base72(m) * (1 + m.s / (3 * m.h) + m.v / (12 * m.h * m.L));
}
double hardware_flops_selective_exact(const ModelSpec& m) {
  return base72(m) * (1 + 2 * m.s / (9 * m.h) + m.v / (12 * m.h * m.L));
}
double hardware_flops_full_recompute(const ModelSpec& m) {
  return base96(m) * (1 + m.s / (6 * m.h) + m.v / (16 * m.h * m.L));
}
double model_flops_causal(const ModelSpec& m) {
  return base72(m) * (1 + m.s / (12 * m.h) + m.v / (12 * m.h * m.L));
}
double hardware_flops_selective_causal(const ModelSpec& m) {
  return base72(m) * (1 + m.s / (9 * m.h) + m.v / (12 * m.h * m.L));
}
double hardware_flops_full_recompute_causal(const ModelSpec& m) {
  return base96(m) * (1 + m.s / (12 * m.h) + m.v / (16 * m.h * m.L));
}

double model_flops(const ModelSpec& m, FlopAccounting acc) {
  const AttentionSpan att = acc == FlopAccounting::causal ? AttentionSpan::causal : AttentionSpan::full;
  const double forward = m.L * layer_forward_flops(m.B, m.s, m.h, att) + logits_forward_flops(m.B, m.s, m.h, m.v);
  return 3 * forward;  // backward = 2 × forward
}

double hardware_flops(const ModelSpec& m, Recompute r, FlopAccounting acc) {
  if (acc == FlopAccounting::paper) {
    switch (r) {
      case Recompute::none: return model_flops_eq7(m);
      case Recompute::selective: return hardware_flops_eq8(m);
      case Recompute::full: return hardware_flops_full_recompute(m);
    }
  }
  const AttentionSpan att = acc == FlopAccounting::causal ? AttentionSpan::causal : AttentionSpan::full;
  const double model = model_flops(m, acc);
  switch (r) {
    case Recompute::none: return model;
    case Recompute::selective: return model + m.L * core_attention_forward_flops(m.B, m.s, m.h, att);
    case Recompute::full: return model + m.L * layer_forward_flops(m.B, m.s, m.h, att);
  }
  return model;
}

double utilization_percent(double flops, double seconds, int gpus, double peak_flops_per_gpu) {
  return 100.0 * flops / (seconds * gpus * peak_flops_per_gpu);
}

uint128 flops_exact(const ModelSpec& m, FlopFormula f) {
  using u128 = uint128;
  auto whole = [](double x) {
    if (!(x >= 0) || std::floor(x) != x || x > 9.0e15) throw std::invalid_argument("FLOPs need whole-number shapes");
    return static_cast<u128>(static_cast<unsigned long long>(x));
  };
  const u128 B = whole(m.B), L = whole(m.L), s = whole(m.s), h = whole(m.h), v = whole(m.v);
  const u128 gemm = B * L * s * h * h, attn = B * L * s * s * h, logits = 6 * B * s * h * v;
  switch (f) {
    case FlopFormula::eq7: return 72 * gemm + 12 * attn + logits;
    case FlopFormula::eq8: return 72 * gemm + 24 * attn + logits;
    case FlopFormula::selective_exact: return 72 * gemm + 16 * attn + logits;
    case FlopFormula::full_recompute: return 96 * gemm + 16 * attn + logits;
    case FlopFormula::model_causal: return 72 * gemm + 6 * attn + logits;
  }
  return 0;
}

std::string decimal(uint128 v) {
  if (v == 0) return "0";
  std::string out;
  while (v > 0) {
    out.insert(out.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
    v /= 10;
  }
  return out;
}

}  // namespace actbench::theory
