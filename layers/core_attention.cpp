// The layer's attention: the qkv GEMM into heads, the q/k norms and RoPE on the heads, and
// core attention, forward and backward, unfused or fused, multi-head or grouped-query, with
// or without dropout on the probabilities, as the spec says.
#include <cmath>
#include <utility>

#include "layers/layer_base.hpp"

namespace actbench {

LayerBase::QkvHeads LayerBase::qkv_projection_fwd(const CommContext& comm, Tensor normed, const Tensor* bias,
                                                  bool keep_input, SavedActivations& save) {
  const int64_t s = opt_.dims.s, b = opt_.dims.b;
  QkvHeads heads{be_.empty({b, heads_per_rank_, s, head_dim_}, opt_.dtype),
                 be_.empty({b, kv_heads_per_rank_, s, head_dim_}, opt_.dtype),
                 be_.empty({b, kv_heads_per_rank_, s, head_dim_}, opt_.dtype)};
  Tensor qkv_in = region_entry_fwd(comm, normed, "qkv_input");  // f | g
  if (keep_input) save.qkv_input = normed;                      // the local shard only under SP
  PhaseRange phase(phase_name(comm.stage.c_str(), "qkv"), phase_log_);
  Tensor qkv = be_.empty({s, b, qkv_width()}, opt_.dtype);
  be_.gemm(gemm_args(false, true, s * b, qkv_width(), opt_.dims.h), as_matrix(qkv_in), params_.qkv_weight,
           as_matrix(qkv));
  if (bias) be_.add_bias(as_matrix(qkv), *bias);
  be_.split_heads(qkv, q_column(), heads.q);
  be_.split_heads(qkv, k_column(), heads.k);
  be_.split_heads(qkv, v_column(), heads.v);
  return heads;
}

bool LayerBase::has_head_transforms() const {
  return opt_.dims.spec.qk_layernorm || opt_.dims.rotary_dim() > 0;
}

void LayerBase::head_transforms_fwd(const char* stage, QkvHeads& qkv, SavedActivations& save, bool keep) {
  if (opt_.dims.spec.qk_layernorm) {
    PhaseRange phase(phase_name(stage, "qk_norm"), phase_log_);  // each head's d values, before RoPE
    qkv.q = head_norm_fwd(qkv.q, params_.q_norm_weight, params_.q_norm_bias, keep ? &save.q_norm_input : nullptr,
                          keep ? &save.q_norm_mean : nullptr, keep ? &save.q_norm_rstd : nullptr);
    qkv.k = head_norm_fwd(qkv.k, params_.k_norm_weight, params_.k_norm_bias, keep ? &save.k_norm_input : nullptr,
                          keep ? &save.k_norm_mean : nullptr, keep ? &save.k_norm_rstd : nullptr);
  }
  if (const int64_t rotary = opt_.dims.rotary_dim()) {
    PhaseRange phase(phase_name(stage, "rope"), phase_log_);  // positions of the full sequence, also under SP
    be_.rope_fwd(qkv.q, opt_.dims.spec.rotary_base, rotary, qkv.q);
    be_.rope_fwd(qkv.k, opt_.dims.spec.rotary_base, rotary, qkv.k);
  }
}

void LayerBase::head_transforms_bwd(SavedActivations& saved, QkvHeads& grads) {
  if (const int64_t rotary = opt_.dims.rotary_dim()) {
    PhaseRange phase("bwd.rope", phase_log_);  // the gradient through a rotation is the inverse rotation
    be_.rope_bwd(grads.q, opt_.dims.spec.rotary_base, rotary, grads.q);
    be_.rope_bwd(grads.k, opt_.dims.spec.rotary_base, rotary, grads.k);
  }
  if (opt_.dims.spec.qk_layernorm) {
    PhaseRange phase("bwd.qk_norm", phase_log_);
    grads.q = head_norm_bwd(std::move(grads.q), saved.q_norm_input, params_.q_norm_weight, saved.q_norm_mean,
                            saved.q_norm_rstd, grads_.q_norm_weight, grads_.q_norm_bias);
    saved.q_norm_input = saved.q_norm_mean = saved.q_norm_rstd = Tensor();
    grads.k = head_norm_bwd(std::move(grads.k), saved.k_norm_input, params_.k_norm_weight, saved.k_norm_mean,
                            saved.k_norm_rstd, grads_.k_norm_weight, grads_.k_norm_bias);
    saved.k_norm_input = saved.k_norm_mean = saved.k_norm_rstd = Tensor();
  }
}

Tensor LayerBase::head_norm_fwd(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor* input,
                                Tensor* mean, Tensor* rstd) {
  Tensor y = be_.empty(x.shape(), opt_.dtype);
  norm_fwd(x, weight, bias, y, mean, rstd);
  if (input) *input = x;
  return y;
}

Tensor LayerBase::head_norm_bwd(Tensor dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                const Tensor& rstd, const Tensor& dweight, const Tensor& dbias) {
  Tensor dx = be_.empty(x.shape(), opt_.dtype);
  norm_bwd(dy, x, weight, mean, rstd, dx, dweight, dbias);
  return dx;
}

Tensor LayerBase::core_attention_fwd(const char* stage, QkvHeads qkv, SavedActivations& save, Keep keep) {
  const int64_t s = opt_.dims.s, b = opt_.dims.b, queries_per_group = heads_per_rank_ / kv_heads_per_rank_;
  Tensor context = be_.empty({s, b, heads_per_rank_ * head_dim_}, opt_.dtype);
  {
    PhaseRange phase(phase_name(stage, "core_attn"), phase_log_);
    const Shape ctx_heads_shape = {b, heads_per_rank_, s, head_dim_};
    Tensor ctx_heads;
    if (opt_.policy.attention == Attention::fused) {
      ctx_heads = be_.empty(ctx_heads_shape, opt_.dtype);
      // Tiles of scores live only inside the kernel: out and the row log-sum-exp are all
      // that backward needs besides q, k, v (the mask comes back from the Philox counter).
      const Shape q_shape = {b * heads_per_rank_, s, head_dim_}, kv_shape = {b * kv_heads_per_rank_, s, head_dim_};
      Tensor lse = be_.empty({b, heads_per_rank_, s}, DType::fp32);
      be_.attention_fwd(qkv.q.view(q_shape), qkv.k.view(kv_shape), qkv.v.view(kv_shape), attention_scale(),
                        attn_dropout_spec(), ctx_heads.view(q_shape), lse.view({b * heads_per_rank_, s}));
      if (keep.any && keep.core_attn) save.attn_lse = lse;
    } else {
      AttentionWeights weights = attention_weights(qkv.q, qkv.k);
      ctx_heads = be_.empty(ctx_heads_shape, opt_.dtype);
      be_.gemm(per_kv_head(false, false, queries_per_group * s, head_dim_, s), weights.times_v(), qkv.v, ctx_heads);
      if (keep.any && keep.core_attn) {
        save.softmax_out = weights.probs;
        save.attn_dropout_mask = weights.mask;
        save.attn_dropout_out = weights.dropped;
      }
    }
    be_.merge_heads(ctx_heads, 0, context);
  }
  if (keep.any) {
    save.q = qkv.q;
    save.k = qkv.k;
    save.v = qkv.v;
    save.proj_input = context;
  }
  return context;
}

void LayerBase::core_attention_bwd(SavedActivations& saved, Tensor d_context, QkvHeads& grads) {
  attention_bwd(saved, std::move(d_context), grads, nullptr);
}

void LayerBase::core_attention_bwd(SavedActivations& saved, Tensor d_context, const Tensor& d_qkv) {
  QkvHeads grads;  // each allocated when needed, merged into d_qkv and released once complete
  attention_bwd(saved, std::move(d_context), grads, &d_qkv);
}

void LayerBase::attention_bwd(SavedActivations& saved, Tensor d_context, QkvHeads& grads, const Tensor* merge_into) {
  if (opt_.policy.attention == Attention::fused)
    fused_attention_bwd(saved, std::move(d_context), grads, merge_into);
  else
    unfused_attention_bwd(saved, std::move(d_context), grads, merge_into);
}

void LayerBase::fused_attention_bwd(SavedActivations& saved, Tensor d_context, QkvHeads& grads,
                                    const Tensor* merge_into) {
  const int64_t s = opt_.dims.s, b = opt_.dims.b;
  const Shape q_shape = {b * heads_per_rank_, s, head_dim_}, kv_shape = {b * kv_heads_per_rank_, s, head_dim_};
  Tensor out_heads;
  if (!saved.attn_lse.defined()) {
    // The core_attn module kept only q, k, v: the kernel runs forward again for its output and
    // lse, which its backward reads (the projection's input is the checkpoint's output, kept
    // apart and released here unread).
    PhaseRange phase("recompute.core_attn", phase_log_);
    out_heads = be_.empty({b, heads_per_rank_, s, head_dim_}, opt_.dtype);
    saved.attn_lse = be_.empty({b, heads_per_rank_, s}, DType::fp32);
    be_.attention_fwd(saved.q.view(q_shape), saved.k.view(kv_shape), saved.v.view(kv_shape), attention_scale(),
                      attn_dropout_spec(), out_heads.view(q_shape), saved.attn_lse.view({b * heads_per_rank_, s}));
    saved.proj_input = Tensor();
  }
  PhaseRange phase("bwd.core_attn", phase_log_);
  if (!out_heads.defined()) {
    // The attention output in head layout is the saved projection input, re-laid out.
    out_heads = be_.empty({b, heads_per_rank_, s, head_dim_}, opt_.dtype);
    be_.split_heads(saved.proj_input, 0, out_heads);
    saved.proj_input = Tensor();
  }
  Tensor d_out_heads = be_.empty({b, heads_per_rank_, s, head_dim_}, opt_.dtype);
  be_.split_heads(d_context, 0, d_out_heads);
  d_context = Tensor();
  Tensor& dq = grad_buffer(grads.q, heads_per_rank_);
  Tensor& dk = grad_buffer(grads.k, kv_heads_per_rank_);
  Tensor& dv = grad_buffer(grads.v, kv_heads_per_rank_);
  be_.attention_bwd(saved.q.view(q_shape), saved.k.view(kv_shape), saved.v.view(kv_shape), out_heads.view(q_shape),
                    d_out_heads.view(q_shape), saved.attn_lse.view({b * heads_per_rank_, s}), attention_scale(),
                    attn_dropout_spec(), dq.view(q_shape), dk.view(kv_shape), dv.view(kv_shape));
  saved.q = saved.k = saved.v = saved.attn_lse = Tensor();
  grad_done(dq, merge_into, q_column());
  grad_done(dk, merge_into, k_column());
  grad_done(dv, merge_into, v_column());
}

void LayerBase::unfused_attention_bwd(SavedActivations& saved, Tensor d_context, QkvHeads& grads,
                                      const Tensor* merge_into) {
  const int64_t s = opt_.dims.s, b = opt_.dims.b, queries_per_group = heads_per_rank_ / kv_heads_per_rank_;
  saved.proj_input = Tensor();
  if (!saved.softmax_out.defined()) {
    // Selective recompute: q k^T, softmax (and dropout) again from the stored q and k; the
    // Philox counter regenerates exactly the forward's mask.
    PhaseRange phase("recompute.core_attn", phase_log_);
    AttentionWeights weights = attention_weights(saved.q, saved.k);
    saved.softmax_out = std::move(weights.probs);
    saved.attn_dropout_mask = std::move(weights.mask);
    saved.attn_dropout_out = std::move(weights.dropped);
  }
  PhaseRange phase("bwd.core_attn", phase_log_);
  Tensor d_ctx_heads = be_.empty({b, heads_per_rank_, s, head_dim_}, opt_.dtype);
  be_.split_heads(d_context, 0, d_ctx_heads);
  d_context = Tensor();
  const Shape score_shape = {b, heads_per_rank_, s, s}, score_batches = {b * heads_per_rank_, s, s};
  // Per key/value head, like forward; dv sums the gradients of its query heads.
  Tensor d_times_v = be_.empty(score_shape, opt_.dtype);  // of the weights that multiplied v
  be_.gemm(per_kv_head(false, true, queries_per_group * s, s, head_dim_), d_ctx_heads, saved.v, d_times_v);
  Tensor& dv = grad_buffer(grads.v, kv_heads_per_rank_);
  const Tensor& times_v = attention_dropout_ > 0.f ? saved.attn_dropout_out : saved.softmax_out;
  be_.gemm(per_kv_head(true, false, s, head_dim_, queries_per_group * s), times_v, d_ctx_heads, dv);
  saved.attn_dropout_out = saved.v = Tensor();
  d_ctx_heads = Tensor();
  grad_done(dv, merge_into, v_column());
  Tensor d_probs;
  if (attention_dropout_ > 0.f) {
    d_probs = be_.empty(score_shape, opt_.dtype);
    be_.dropout_bwd(d_times_v, saved.attn_dropout_mask, attention_dropout_, d_probs);
    saved.attn_dropout_mask = Tensor();
    d_times_v = Tensor();
  } else {
    d_probs = std::move(d_times_v);
  }
  Tensor d_scores = be_.empty(score_shape, opt_.dtype);
  be_.softmax_causal_bwd(d_probs.view(score_batches), saved.softmax_out.view(score_batches),
                         d_scores.view(score_batches));
  saved.softmax_out = Tensor();
  d_probs = Tensor();
  Tensor& dq = grad_buffer(grads.q, heads_per_rank_);
  be_.gemm(per_kv_head(false, false, queries_per_group * s, head_dim_, s, attention_scale()), d_scores, saved.k, dq);
  grad_done(dq, merge_into, q_column());
  Tensor& dk = grad_buffer(grads.k, kv_heads_per_rank_);
  be_.gemm(per_kv_head(true, false, s, head_dim_, queries_per_group * s, attention_scale()), d_scores, saved.q, dk);
  grad_done(dk, merge_into, k_column());
  saved.q = saved.k = Tensor();
}

LayerBase::AttentionWeights LayerBase::attention_weights(const Tensor& q, const Tensor& k) {
  const int64_t s = opt_.dims.s, b = opt_.dims.b, queries_per_group = heads_per_rank_ / kv_heads_per_rank_;
  const Shape shape = {b, heads_per_rank_, s, s};
  AttentionWeights weights;
  {
    Tensor scores = be_.empty(shape, opt_.dtype);
    be_.gemm(per_kv_head(false, true, queries_per_group * s, s, head_dim_, attention_scale()), q, k, scores);
    weights.probs = be_.empty(shape, opt_.dtype);
    be_.softmax_causal_fwd(scores.view({b * heads_per_rank_, s, s}), weights.probs.view({b * heads_per_rank_, s, s}));
  }
  if (attention_dropout_ > 0.f) {
    weights.dropped = be_.empty(shape, opt_.dtype);
    weights.mask = be_.empty(shape, DType::u8);
    be_.dropout_fwd(weights.probs, attn_dropout_spec(), weights.dropped, weights.mask);
  }
  return weights;
}

DropoutSpec LayerBase::attn_dropout_spec() const {
  // probabilities [b, a/t, s, s] are heads [rank*a/t, ...) of the canonical [b, a, s, s]
  DropoutSpec spec;
  spec.p = attention_dropout_;
  spec.seed = opt_.seed;
  spec.layer = opt_.layer_index;
  spec.site = kSiteAttnProbs;
  spec.outer = opt_.dims.b;
  spec.mid_local = heads_per_rank_;
  spec.mid_global = opt_.dims.a;
  spec.mid_offset = tp_rank_ * heads_per_rank_;
  spec.inner = opt_.dims.s * opt_.dims.s;
  return spec;
}

float LayerBase::attention_scale() const { return 1.0f / std::sqrt(static_cast<float>(head_dim_)); }

GemmArgs LayerBase::per_kv_head(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha) const {
  return gemm_args(trans_a, trans_b, m, n, k, opt_.dims.b * kv_heads_per_rank_, alpha);
}

Tensor& LayerBase::grad_buffer(Tensor& grad, int64_t heads) {
  if (!grad.defined()) grad = be_.empty({opt_.dims.b, heads, opt_.dims.s, head_dim_}, opt_.dtype);
  return grad;
}

void LayerBase::grad_done(Tensor& grad, const Tensor* merge_into, int64_t column) {
  if (!merge_into) return;
  be_.merge_heads(grad, column, *merge_into);
  grad = Tensor();
}

}  // namespace actbench
