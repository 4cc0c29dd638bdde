// The layer's attention: the qkv GEMM into heads, the q/k norms and RoPE on the heads, and
// core attention, forward and backward, unfused or fused, multi-head or grouped-query, with
// or without dropout on the probabilities, as the spec says.
#include <cmath>
#include <utility>

#include "layers/layer_base.hpp"

namespace actbench {

LayerBase::QkvHeads LayerBase::qkv_projection_fwd(const CommContext& comm, Tensor normed, const Tensor* bias,
                                                  bool keep_input, SavedActivations& save) {
  const int64_t s = seq_, b = opt_.dims.b;
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
    PhaseRange phase(phase_name(stage, "rope"), phase_log_);  // positions in the whole sequence, also under SP and CP
    be_.rope_fwd(qkv.q, opt_.dims.spec.rotary_base, rotary, qkv.q, seq_positions_);
    be_.rope_fwd(qkv.k, opt_.dims.spec.rotary_base, rotary, qkv.k, seq_positions_);
  }
}

void LayerBase::head_transforms_bwd(SavedActivations& saved, QkvHeads& grads) {
  if (const int64_t rotary = opt_.dims.rotary_dim()) {
    PhaseRange phase("bwd.rope", phase_log_);  // the gradient through a rotation is the inverse rotation
    be_.rope_bwd(grads.q, opt_.dims.spec.rotary_base, rotary, grads.q, seq_positions_);
    be_.rope_bwd(grads.k, opt_.dims.spec.rotary_base, rotary, grads.k, seq_positions_);
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

LayerBase::AttentionGeometry LayerBase::attention_geometry() const {
  const int64_t tp_heads = tp_rank_ * heads_per_rank_;
  if (!cp()) return {heads_per_rank_, kv_heads_per_rank_, seq_, seq_, tp_heads, {}};
  const int64_t s = opt_.dims.s;
  switch (opt_.policy.cp_comm) {
    case CpCommType::a2a: {
      const int64_t heads = heads_per_rank_ / cp_size_;
      return {heads, kv_heads_per_rank_ / cp_size_, s, s, tp_heads + cp_rank_ * heads, {}};
    }
    case CpCommType::all_gather:
      return {heads_per_rank_, kv_heads_per_rank_, seq_, s, tp_heads, {seq_positions_, SeqPositions{}, s}};
    case CpCommType::p2p: break;
  }
  return block_geometry(cp_rank_);
}

LayerBase::AttentionGeometry LayerBase::block_geometry(int owner) const {
  return {heads_per_rank_, kv_heads_per_rank_, seq_, seq_, tp_rank_ * heads_per_rank_,
          {seq_positions_, cp_rank_positions(owner), opt_.dims.s}};
}

SeqPositions LayerBase::cp_rank_positions(int rank) const {
  if (cp_size_ == 1) return {};
  const int64_t chunk = opt_.dims.s / (2 * cp_size_);
  return SeqPositions::chunks(chunk, rank * chunk, (2 * cp_size_ - 1 - rank) * chunk);
}

Tensor LayerBase::core_attention_fwd(const char* stage, QkvHeads qkv, SavedActivations& save, Keep keep) {
  const AttentionGeometry g = attention_geometry();
  const int64_t b = opt_.dims.b, queries_per_group = g.heads / g.kv_heads;
  if (cp_is(CpCommType::a2a)) {  // a/(tC) heads of the whole sequence from here to the context
    qkv.q = cp_seq_to_heads(stage, "q", qkv.q);
    qkv.k = cp_seq_to_heads(stage, "k", qkv.k);
    qkv.v = cp_seq_to_heads(stage, "v", qkv.v);
  }
  Tensor ctx_heads = be_.empty({b, g.heads, g.q_rows, v_head_dim_}, opt_.dtype);
  Tensor context = be_.empty({seq_, b, heads_per_rank_ * v_head_dim_}, opt_.dtype);
  {
    PhaseRange phase(phase_name(stage, "core_attn"), phase_log_);
    if (opt_.policy.attention == Attention::fused) {
      // Tiles of scores live only inside the kernel: out and the row log-sum-exp are all
      // that backward needs besides q, k, v (the mask comes back from the Philox counter).
      Tensor lse = be_.empty({b, g.heads, g.q_rows}, DType::fp32);
      fused_attention(stage, qkv, ctx_heads, lse);
      if (keep.any && keep.core_attn) save.attn_lse = lse;
    } else {
      const Tensor k_all = cp_is(CpCommType::all_gather) ? cp_gather_sequence(stage, "k", qkv.k) : qkv.k;
      const Tensor v_all = cp_is(CpCommType::all_gather) ? cp_gather_sequence(stage, "v", qkv.v) : qkv.v;
      AttentionWeights weights = attention_weights(g, qkv.q, k_all);
      be_.gemm(per_kv_head(g, false, false, queries_per_group * g.q_rows, v_head_dim_, g.k_rows), weights.times_v(),
               v_all, ctx_heads);
      if (keep.any && keep.core_attn) {
        save.softmax_out = weights.probs;
        save.attn_dropout_mask = weights.mask;
        save.attn_dropout_out = weights.dropped;
      }
    }
    if (!cp_is(CpCommType::a2a)) be_.merge_heads(ctx_heads, 0, context);
  }
  if (cp_is(CpCommType::a2a)) {  // back to this rank's rows first, outside the phase
    ctx_heads = cp_heads_to_seq(stage, "context", ctx_heads);
    PhaseRange phase(phase_name(stage, "core_attn"), phase_log_);
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

void LayerBase::fused_fwd(const AttentionGeometry& g, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& out, const Tensor& lse) {
  const int64_t b = opt_.dims.b;
  const Shape q_shape = {b * g.heads, g.q_rows, head_dim_}, kv_shape = {b * g.kv_heads, g.k_rows, head_dim_};
  const Shape v_shape = {b * g.kv_heads, g.k_rows, v_head_dim_}, out_shape = {b * g.heads, g.q_rows, v_head_dim_};
  be_.attention_fwd(q.view(q_shape), k.view(kv_shape), v.view(v_shape), attention_scale(), attn_dropout_spec(g, true),
                    out.view(out_shape), lse.view({b * g.heads, g.q_rows}), g.rows);
}

void LayerBase::fused_attention(const char* stage, const QkvHeads& qkv, const Tensor& out, const Tensor& lse) {
  const AttentionGeometry g = attention_geometry();
  if (cp_is(CpCommType::all_gather)) {
    fused_fwd(g, qkv.q, cp_gather_sequence(stage, "k", qkv.k), cp_gather_sequence(stage, "v", qkv.v), out, lse);
    return;
  }
  if (!cp_is(CpCommType::p2p)) {
    fused_fwd(g, qkv.q, qkv.k, qkv.v, out, lse);
    return;
  }
  // The ring: step i sees the key block of CP rank cp_rank - i (its own first) and passes it
  // on; each block's partial result is merged into out and lse by its log-sum-exp. The next
  // block travels while this one's attention computes (two blocks in memory at a time).
  const int64_t b = opt_.dims.b;
  Tensor k = qkv.k, v = qkv.v;
  Tensor part, part_lse;
  for (int step = 0; step < cp_size_; ++step) {
    const int owner = (cp_rank_ - step + cp_size_) % cp_size_;
    PendingExchange next_k, next_v;
    if (step + 1 < cp_size_) {
      next_k = cp_ring_start(stage, "k", k);
      next_v = cp_ring_start(stage, "v", v);
    }
    if (step == 0) {
      fused_fwd(block_geometry(owner), qkv.q, k, v, out, lse);
    } else {
      if (!part.defined()) {
        part = be_.empty(out.shape(), opt_.dtype);
        part_lse = be_.empty(lse.shape(), DType::fp32);
      }
      fused_fwd(block_geometry(owner), qkv.q, k, v, part, part_lse);
      const Shape out_shape = {b * g.heads, g.q_rows, v_head_dim_};
      be_.attention_merge(out.view(out_shape), lse.view({b * g.heads, g.q_rows}), part.view(out_shape),
                          part_lse.view({b * g.heads, g.q_rows}));
    }
    if (step + 1 < cp_size_) {
      k = cp_ring_wait(stage, "k", next_k);
      v = cp_ring_wait(stage, "v", next_v);
    }
  }
}

void LayerBase::core_attention_bwd(SavedActivations& saved, Tensor d_context, QkvHeads& grads) {
  attention_bwd(saved, std::move(d_context), grads, nullptr);
}

void LayerBase::core_attention_bwd(SavedActivations& saved, Tensor d_context, const Tensor& d_qkv) {
  QkvHeads grads;  // each allocated when needed, merged into d_qkv and released once complete
  attention_bwd(saved, std::move(d_context), grads, &d_qkv);
}

void LayerBase::attention_bwd(SavedActivations& saved, Tensor d_context, QkvHeads& grads, const Tensor* merge_into) {
  if (!cp()) {
    if (opt_.policy.attention == Attention::fused)
      fused_attention_bwd(saved, std::move(d_context), grads, merge_into);
    else
      unfused_attention_bwd(saved, std::move(d_context), grads, merge_into);
    return;
  }
  // Context parallelism: the gradients in the attention's own layout, then each brought back
  // to this rank's rows (a2a) and handed over.
  QkvHeads att;
  if (opt_.policy.attention == Attention::fused)
    fused_attention_bwd(saved, std::move(d_context), att, nullptr);
  else
    unfused_attention_bwd(saved, std::move(d_context), att, nullptr);
  if (cp_is(CpCommType::a2a)) {
    att.q = cp_heads_to_seq("bwd", "dq", att.q);
    att.k = cp_heads_to_seq("bwd", "dk", att.k);
    att.v = cp_heads_to_seq("bwd", "dv", att.v);
  }
  if (!merge_into) {
    grads = std::move(att);
    return;
  }
  grad_done(att.q, merge_into, q_column());
  grad_done(att.k, merge_into, k_column());
  grad_done(att.v, merge_into, v_column());
}

void LayerBase::fused_attention_bwd(SavedActivations& saved, Tensor d_context, QkvHeads& grads,
                                    const Tensor* merge_into) {
  const AttentionGeometry g = attention_geometry();
  const int64_t b = opt_.dims.b;
  const Shape q_shape = {b * g.heads, g.q_rows, head_dim_}, kv_shape = {b * g.kv_heads, g.k_rows, head_dim_};
  const Shape v_shape = {b * g.kv_heads, g.k_rows, v_head_dim_}, out_shape = {b * g.heads, g.q_rows, v_head_dim_};
  const Shape local_heads = {b, heads_per_rank_, seq_, v_head_dim_};  // the attention output's
  Tensor out_heads;
  if (!saved.attn_lse.defined()) {
    // The core_attn module kept only q, k, v: the kernel runs forward again for its output and
    // lse, which its backward reads (the projection's input is the checkpoint's output, kept
    // apart and released here unread).
    PhaseRange phase("recompute.core_attn", phase_log_);
    out_heads = be_.empty({b, g.heads, g.q_rows, v_head_dim_}, opt_.dtype);
    saved.attn_lse = be_.empty({b, g.heads, g.q_rows}, DType::fp32);
    fused_attention("recompute", QkvHeads{saved.q, saved.k, saved.v}, out_heads, saved.attn_lse);
    saved.proj_input = Tensor();
  }
  PhaseRange phase("bwd.core_attn", phase_log_);
  if (!out_heads.defined()) {
    // The attention output in head layout is the saved projection input, re-laid out (and
    // exchanged back to the attention's heads under a2a).
    out_heads = be_.empty(local_heads, opt_.dtype);
    be_.split_heads(saved.proj_input, 0, out_heads);
    saved.proj_input = Tensor();
    if (cp_is(CpCommType::a2a)) out_heads = cp_seq_to_heads("bwd", "out", out_heads);
  }
  Tensor d_out_heads = be_.empty(local_heads, opt_.dtype);
  be_.split_heads(d_context, 0, d_out_heads);
  d_context = Tensor();
  if (cp_is(CpCommType::a2a)) d_out_heads = cp_seq_to_heads("bwd", "d_context", d_out_heads);
  if (cp_is(CpCommType::p2p)) {
    cp_ring_bwd(QkvHeads{saved.q, saved.k, saved.v}, out_heads, d_out_heads, saved.attn_lse, grads);
    saved.q = saved.k = saved.v = saved.attn_lse = Tensor();
    return;
  }
  const bool gathered = cp_is(CpCommType::all_gather);
  const Tensor k = gathered ? cp_gather_sequence("bwd", "k", saved.k) : saved.k;
  const Tensor v = gathered ? cp_gather_sequence("bwd", "v", saved.v) : saved.v;
  Tensor& dq = grad_buffer(grads.q, g.heads, g.q_rows);
  Tensor dk_all = gathered ? be_.empty(k.shape(), opt_.dtype) : grad_buffer(grads.k, g.kv_heads, g.k_rows);
  Tensor dv_all =
      gathered ? be_.empty(v.shape(), opt_.dtype) : grad_buffer(grads.v, g.kv_heads, g.k_rows, v_head_dim_);
  be_.attention_bwd(saved.q.view(q_shape), k.view(kv_shape), v.view(v_shape), out_heads.view(out_shape),
                    d_out_heads.view(out_shape), saved.attn_lse.view({b * g.heads, g.q_rows}), attention_scale(),
                    attn_dropout_spec(g, true), dq.view(q_shape), dk_all.view(kv_shape), dv_all.view(v_shape), g.rows);
  saved.q = saved.k = saved.v = saved.attn_lse = Tensor();
  if (gathered) {
    grads.k = cp_scatter_sequence("bwd", "dk", dk_all);
    grads.v = cp_scatter_sequence("bwd", "dv", dv_all);
  }
  dk_all = dv_all = Tensor();  // the handles of grads.k and grads.v, released as each is merged
  grad_done(dq, merge_into, q_column());
  grad_done(grads.k, merge_into, k_column());
  grad_done(grads.v, merge_into, v_column());
}

void LayerBase::unfused_attention_bwd(SavedActivations& saved, Tensor d_context, QkvHeads& grads,
                                      const Tensor* merge_into) {
  const AttentionGeometry g = attention_geometry();
  const int64_t b = opt_.dims.b, queries_per_group = g.heads / g.kv_heads;
  const bool gathered = cp_is(CpCommType::all_gather);
  saved.proj_input = Tensor();
  // all_gather kept only this rank's keys and values: every rank's, again.
  const Tensor k = gathered ? cp_gather_sequence("bwd", "k", saved.k) : saved.k;
  Tensor v = gathered ? cp_gather_sequence("bwd", "v", saved.v) : saved.v;
  if (!saved.softmax_out.defined()) {
    // Selective recompute: q k^T, softmax (and dropout) again from the stored q and k; the
    // Philox counter regenerates exactly the forward's mask.
    PhaseRange phase("recompute.core_attn", phase_log_);
    AttentionWeights weights = attention_weights(g, saved.q, k);
    saved.softmax_out = std::move(weights.probs);
    saved.attn_dropout_mask = std::move(weights.mask);
    saved.attn_dropout_out = std::move(weights.dropped);
  }
  PhaseRange phase("bwd.core_attn", phase_log_);
  Tensor d_ctx_heads = be_.empty({b, heads_per_rank_, seq_, v_head_dim_}, opt_.dtype);
  be_.split_heads(d_context, 0, d_ctx_heads);
  d_context = Tensor();
  if (cp_is(CpCommType::a2a)) d_ctx_heads = cp_seq_to_heads("bwd", "d_context", d_ctx_heads);
  const Shape score_shape = {b, g.heads, g.q_rows, g.k_rows}, score_batches = {b * g.heads, g.q_rows, g.k_rows};
  // Per key/value head, like forward; dv sums the gradients of its query heads.
  Tensor d_times_v = be_.empty(score_shape, opt_.dtype);  // of the weights that multiplied v
  be_.gemm(per_kv_head(g, false, true, queries_per_group * g.q_rows, g.k_rows, v_head_dim_), d_ctx_heads, v, d_times_v);
  Tensor dv_all =
      gathered ? be_.empty(v.shape(), opt_.dtype) : grad_buffer(grads.v, g.kv_heads, g.k_rows, v_head_dim_);
  const Tensor& times_v = attention_dropout_ > 0.f ? saved.attn_dropout_out : saved.softmax_out;
  be_.gemm(per_kv_head(g, true, false, g.k_rows, v_head_dim_, queries_per_group * g.q_rows), times_v, d_ctx_heads,
           dv_all);
  saved.attn_dropout_out = saved.v = v = Tensor();
  d_ctx_heads = Tensor();
  if (gathered) grads.v = cp_scatter_sequence("bwd", "dv", dv_all);
  dv_all = Tensor();
  grad_done(grads.v, merge_into, v_column());
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
                         d_scores.view(score_batches), g.rows.queries);
  saved.softmax_out = Tensor();
  d_probs = Tensor();
  Tensor& dq = grad_buffer(grads.q, g.heads, g.q_rows);
  be_.gemm(per_kv_head(g, false, false, queries_per_group * g.q_rows, head_dim_, g.k_rows, attention_scale()),
           d_scores, k, dq);
  grad_done(dq, merge_into, q_column());
  Tensor dk_all = gathered ? be_.empty(k.shape(), opt_.dtype) : grad_buffer(grads.k, g.kv_heads, g.k_rows);
  be_.gemm(per_kv_head(g, true, false, g.k_rows, head_dim_, queries_per_group * g.q_rows, attention_scale()), d_scores,
           saved.q, dk_all);
  if (gathered) grads.k = cp_scatter_sequence("bwd", "dk", dk_all);
  dk_all = Tensor();
  grad_done(grads.k, merge_into, k_column());
  saved.q = saved.k = Tensor();
}

LayerBase::AttentionWeights LayerBase::attention_weights(const AttentionGeometry& g, const Tensor& q,
                                                         const Tensor& k) {
  const int64_t b = opt_.dims.b, queries_per_group = g.heads / g.kv_heads;
  const Shape shape = {b, g.heads, g.q_rows, g.k_rows};
  AttentionWeights weights;
  {
    Tensor scores = be_.empty(shape, opt_.dtype);
    be_.gemm(per_kv_head(g, false, true, queries_per_group * g.q_rows, g.k_rows, head_dim_, attention_scale()), q, k,
             scores);
    weights.probs = be_.empty(shape, opt_.dtype);
    const Shape batches = {b * g.heads, g.q_rows, g.k_rows};
    be_.softmax_causal_fwd(scores.view(batches), weights.probs.view(batches), g.rows.queries);
  }
  if (attention_dropout_ > 0.f) {
    weights.dropped = be_.empty(shape, opt_.dtype);
    weights.mask = be_.empty(shape, DType::u8);
    be_.dropout_fwd(weights.probs, attn_dropout_spec(g, false), weights.dropped, weights.mask);
  }
  return weights;
}

DropoutSpec LayerBase::attn_dropout_spec(const AttentionGeometry& g, bool fused) const {
  // probabilities [b, heads, q_rows, k_rows] are heads [head_offset, ...) of the canonical
  // [b, a, s, s]; the fused kernel indexes the whole s x s of its heads itself.
  const int64_t T = g.rows.total > 0 ? g.rows.total : g.q_rows;
  DropoutSpec spec;
  spec.p = attention_dropout_;
  spec.seed = opt_.seed;
  spec.layer = opt_.layer_index;
  spec.site = kSiteAttnProbs;
  spec.outer = opt_.dims.b;
  // Expert parallelism over data-parallel replicas: this rank's b sequences are batches
  // [r·b, (r+1)·b) of the canonical [dp·b, a, s, s].
  spec.outer_offset = dp_rank_ * opt_.dims.b;
  spec.mid_local = g.heads;
  spec.mid_global = opt_.dims.a;
  spec.mid_offset = g.head_offset;
  if (fused || g.rows.total == 0) {
    spec.inner = fused ? T * T : g.q_rows * g.k_rows;
    return spec;
  }
  // all_gather's rows of every key: each query row's T elements sit at its row of the s x s.
  const SeqPositions& q = g.rows.queries;
  spec.inner = g.q_rows * T;
  spec.inner_global = T * T;
  spec.inner_positions = SeqPositions{q.split == SeqPositions{}.split ? q.split : q.split * T, q.first * T,
                                      q.second * T};
  return spec;
}

float LayerBase::attention_scale() const { return 1.0f / std::sqrt(static_cast<float>(head_dim_)); }

GemmArgs LayerBase::per_kv_head(const AttentionGeometry& g, bool trans_a, bool trans_b, int64_t m, int64_t n,
                                int64_t k, float alpha) const {
  return gemm_args(trans_a, trans_b, m, n, k, opt_.dims.b * g.kv_heads, alpha);
}

Tensor& LayerBase::grad_buffer(Tensor& grad, int64_t heads, int64_t rows, int64_t width) {
  if (!grad.defined()) grad = be_.empty({opt_.dims.b, heads, rows, width > 0 ? width : head_dim_}, opt_.dtype);
  return grad;
}

void LayerBase::grad_done(Tensor& grad, const Tensor* merge_into, int64_t column) {
  if (!merge_into) return;
  be_.merge_heads(grad, column, *merge_into);
  grad = Tensor();
}

}  // namespace actbench
