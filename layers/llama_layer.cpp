#include "layers/llama_layer.hpp"

#include <cmath>
#include <memory>
#include <utility>

#include "layers/transformer_layer.hpp"
#include "runtime/error.hpp"

namespace actbench {

std::unique_ptr<Layer> make_layer(Backend& be, Communicator& comm, const LayerOptions& opt) {
  if (opt.dims.arch == Arch::llama) return std::make_unique<LlamaLayer>(be, comm, opt);
  return std::make_unique<TransformerLayer>(be, comm, opt);
}

LlamaLayer::LlamaLayer(Backend& be, Communicator& comm, LayerOptions opt) : LayerBase(be, comm, std::move(opt)) {
  if (opt_.dropout != 0.f) throw InvalidArgument("--arch llama has no dropout: use --dropout 0");
  kv_heads_per_rank_ = opt_.dims.groups() / tp_size_;
  ffn_per_rank_ = opt_.dims.ffn() / tp_size_;
  allocate_parameters();
}

Tensor LlamaLayer::attention_probs(const Tensor& q, const Tensor& k) {
  const int64_t s = opt_.dims.s, b = opt_.dims.b, queries_per_group = heads_per_rank_ / kv_heads_per_rank_;
  const Shape shape = {b, heads_per_rank_, s, s};
  Tensor probs = be_.empty(shape, opt_.dtype);
  Tensor scores = be_.empty(shape, opt_.dtype);
  // The queries_per_group query heads of a group are consecutive in [b, a/t, s, d]: one GEMM per group,
  // [queries_per_group*s, d] x [s, d]^T, gives their scores [queries_per_group*s, s] in place, so k is never repeated.
  be_.gemm(gemm_args(false, true, queries_per_group * s, s, head_dim_, b * kv_heads_per_rank_,
                     1.0f / std::sqrt(static_cast<float>(head_dim_))),
           q, k, scores);
  be_.softmax_causal_fwd(scores.view({b * heads_per_rank_, s, s}), probs.view({b * heads_per_rank_, s, s}));
  return probs;
}

Tensor LlamaLayer::forward_impl(const Tensor& x, SavedActivations& save, Keep keep, const char* stage) {
  const auto& dims = opt_.dims;
  const int64_t s_local = local_seq(), s = dims.s, b = dims.b, h = dims.h, rows = s * b,
                queries_per_group = heads_per_rank_ / kv_heads_per_rank_;
  const bool keep_any = keep != Keep::input_only;
  const CommContext comm = comm_context(stage);
  const int64_t qkv_width = (heads_per_rank_ + 2 * kv_heads_per_rank_) * head_dim_;

  // ---- attention block ----
  Tensor ln1_out = be_.empty({s_local, b, h}, opt_.dtype);
  {
    PhaseRange phase(phase_name(stage, "ln1"), phase_log_);
    Tensor rstd = be_.empty({s_local * b}, DType::fp32);
    be_.rmsnorm_fwd(as_matrix(x), params_.ln1_weight, dims.norm_eps, as_matrix(ln1_out), rstd);
    if (keep_any) {
      save.ln1_input = x;
      save.ln1_rstd = rstd;
    }
  }
  Tensor q = be_.empty({b, heads_per_rank_, s, head_dim_}, opt_.dtype),
         k = be_.empty({b, kv_heads_per_rank_, s, head_dim_}, opt_.dtype),
         v = be_.empty({b, kv_heads_per_rank_, s, head_dim_}, opt_.dtype);
  {
    Tensor qkv_in = region_entry_fwd(comm, ln1_out, "qkv_input");  // f | g
    if (keep_any) save.qkv_input = ln1_out;                        // the local shard only under SP
    PhaseRange phase(phase_name(stage, "qkv"), phase_log_);
    Tensor qkv = be_.empty({s, b, qkv_width}, opt_.dtype);
    be_.gemm(gemm_args(false, true, rows, qkv_width, h), as_matrix(qkv_in), params_.qkv_weight, as_matrix(qkv));
    be_.split_heads(qkv, 0, q);
    be_.split_heads(qkv, heads_per_rank_ * head_dim_, k);
    be_.split_heads(qkv, (heads_per_rank_ + kv_heads_per_rank_) * head_dim_, v);
  }
  ln1_out = Tensor();
  {
    PhaseRange phase(phase_name(stage, "rope"), phase_log_);  // positions of the full sequence, also under SP
    be_.rope_fwd(q, dims.rope_theta, q);
    be_.rope_fwd(k, dims.rope_theta, k);
  }
  Tensor context = be_.empty({s, b, heads_per_rank_ * head_dim_}, opt_.dtype);
  {
    PhaseRange phase(phase_name(stage, "core_attn"), phase_log_);
    Tensor ctx_heads = be_.empty({b, heads_per_rank_, s, head_dim_}, opt_.dtype);
    if (opt_.policy.attention == Attention::fused) {
      Tensor lse = be_.empty({b, heads_per_rank_, s}, DType::fp32);
      be_.attention_fwd(q.view({b * heads_per_rank_, s, head_dim_}), k.view({b * kv_heads_per_rank_, s, head_dim_}),
                        v.view({b * kv_heads_per_rank_, s, head_dim_}), 1.0f / std::sqrt(static_cast<float>(head_dim_)),
                        attn_dropout_spec(), ctx_heads.view({b * heads_per_rank_, s, head_dim_}),
                        lse.view({b * heads_per_rank_, s}));
      if (keep_any) save.attn_lse = lse;
    } else {
      Tensor probs = attention_probs(q, k);
      be_.gemm(gemm_args(false, false, queries_per_group * s, head_dim_, s, b * kv_heads_per_rank_), probs, v,
               ctx_heads);                              // per group, like the scores
      if (keep == Keep::all) save.softmax_out = probs;  // no dropout: also the input of ·V
    }
    be_.merge_heads(ctx_heads, 0, context);
  }
  if (keep_any) {
    save.q = q;
    save.k = k;
    save.v = v;
    save.proj_input = context;
  }
  q = k = v = Tensor();
  Tensor x1 = row_parallel_linear_fwd(comm, "proj", std::move(context), params_.proj_weight);  // f̄ | ḡ
  {
    PhaseRange phase(phase_name(stage, "attn_residual"), phase_log_);
    be_.add_inplace(x1, x);
  }

  // ---- MLP block ----
  Tensor ln2_out = be_.empty({s_local, b, h}, opt_.dtype);
  {
    PhaseRange phase(phase_name(stage, "ln2"), phase_log_);
    Tensor rstd = be_.empty({s_local * b}, DType::fp32);
    be_.rmsnorm_fwd(as_matrix(x1), params_.ln2_weight, dims.norm_eps, as_matrix(ln2_out), rstd);
    if (keep_any) {
      save.ln2_input = x1;
      save.ln2_rstd = rstd;
    }
  }
  Tensor fc1_out = be_.empty({s, b, 2 * ffn_per_rank_}, opt_.dtype);
  {
    Tensor fc1_in = region_entry_fwd(comm, ln2_out, "fc1_input");  // f | g
    if (keep_any) save.fc1_input = ln2_out;
    PhaseRange phase(phase_name(stage, "fc1"), phase_log_);
    be_.gemm(gemm_args(false, true, rows, 2 * ffn_per_rank_, h), as_matrix(fc1_in), params_.fc1_weight,
             as_matrix(fc1_out));
  }
  ln2_out = Tensor();
  Tensor act = be_.empty({s, b, ffn_per_rank_}, opt_.dtype);
  {
    PhaseRange phase(phase_name(stage, "swiglu"), phase_log_);
    be_.swiglu_fwd(fc1_out, act);
  }
  if (keep_any) {
    save.swiglu_input = fc1_out;
    save.fc2_input = act;
  }
  fc1_out = Tensor();
  Tensor y = row_parallel_linear_fwd(comm, "fc2", std::move(act), params_.fc2_weight);  // f̄ | ḡ
  {
    PhaseRange phase(phase_name(stage, "mlp_residual"), phase_log_);
    be_.add_inplace(y, x1);
  }
  return y;
}

Tensor LlamaLayer::backward(const Tensor& dy) {
  const auto& dims = opt_.dims;
  const int64_t s_local = local_seq(), s = dims.s, b = dims.b, h = dims.h,
                queries_per_group = heads_per_rank_ / kv_heads_per_rank_;
  const int64_t qkv_width = (heads_per_rank_ + 2 * kv_heads_per_rank_) * head_dim_;
  SavedActivations saved = take_saved_for_backward(dy);  // all of it, recomputed under full
  const CommContext comm = comm_context("bwd");

  // ---- MLP block ----
  Tensor d_act = row_parallel_linear_bwd(comm, "fc2", dy, std::move(saved.fc2_input), params_.fc2_weight,
                                         grads_.fc2_weight);  // f̄ | ḡ
  Tensor d_fc1_out = be_.empty({s, b, 2 * ffn_per_rank_}, opt_.dtype);
  {
    PhaseRange phase("bwd.swiglu", phase_log_);
    be_.swiglu_bwd(d_act, saved.swiglu_input, d_fc1_out);
    saved.swiglu_input = Tensor();
    d_act = Tensor();
  }
  Tensor d_ln2_out = column_parallel_linear_bwd(comm, "fc1", "fc1_input", std::move(saved.fc1_input),
                                                std::move(d_fc1_out), params_.fc1_weight, grads_.fc1_weight);  // f | g
  Tensor dx1 = be_.empty({s_local, b, h}, opt_.dtype);
  {
    PhaseRange phase("bwd.ln2", phase_log_);
    be_.rmsnorm_bwd(as_matrix(d_ln2_out), as_matrix(saved.ln2_input), params_.ln2_weight, saved.ln2_rstd,
                    as_matrix(dx1), grads_.ln2_weight);
    be_.add_inplace(dx1, dy);  // residual path
    saved.ln2_input = saved.ln2_rstd = Tensor();
  }
  d_ln2_out = Tensor();

  // ---- attention block ----
  // proj's input stays for fused attention's backward (the attention output)
  Tensor d_context = row_parallel_linear_bwd(comm, "proj", dx1, saved.proj_input, params_.proj_weight,
                                             grads_.proj_weight);  // f̄ | ḡ
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim_));
  Tensor dq = be_.empty({b, heads_per_rank_, s, head_dim_}, opt_.dtype),
         dk = be_.empty({b, kv_heads_per_rank_, s, head_dim_}, opt_.dtype),
         dv = be_.empty({b, kv_heads_per_rank_, s, head_dim_}, opt_.dtype);
  if (opt_.policy.attention == Attention::fused) {
    PhaseRange phase("bwd.core_attn", phase_log_);
    // The attention output in head layout is the saved projection input, re-laid out.
    Tensor out_heads = be_.empty({b, heads_per_rank_, s, head_dim_}, opt_.dtype),
           d_out_heads = be_.empty({b, heads_per_rank_, s, head_dim_}, opt_.dtype);
    be_.split_heads(saved.proj_input, 0, out_heads);
    saved.proj_input = Tensor();
    be_.split_heads(d_context, 0, d_out_heads);
    d_context = Tensor();
    const Shape q_shape = {b * heads_per_rank_, s, head_dim_}, kv_shape = {b * kv_heads_per_rank_, s, head_dim_};
    be_.attention_bwd(saved.q.view(q_shape), saved.k.view(kv_shape), saved.v.view(kv_shape), out_heads.view(q_shape),
                      d_out_heads.view(q_shape), saved.attn_lse.view({b * heads_per_rank_, s}), scale,
                      attn_dropout_spec(), dq.view(q_shape), dk.view(kv_shape), dv.view(kv_shape));
    saved.q = saved.k = saved.v = saved.attn_lse = Tensor();
  } else {
    saved.proj_input = Tensor();
    if (!saved.softmax_out.defined()) {
      // Selective recompute: QK^T and softmax again from the stored (rotated) q and k.
      PhaseRange phase("recompute.core_attn", phase_log_);
      saved.softmax_out = attention_probs(saved.q, saved.k);
    }
    PhaseRange phase("bwd.core_attn", phase_log_);
    Tensor d_ctx_heads = be_.empty({b, heads_per_rank_, s, head_dim_}, opt_.dtype);
    be_.split_heads(d_context, 0, d_ctx_heads);
    d_context = Tensor();
    const Shape score_shape = {b, heads_per_rank_, s, s};
    Tensor d_probs = be_.empty(score_shape, opt_.dtype);
    // Per group: [queries_per_group*s, d] x [s, d]^T and, for dv, [queries_per_group*s, s]^T x [queries_per_group*s, d]
    // (sums the group's heads).
    be_.gemm(gemm_args(false, true, queries_per_group * s, s, head_dim_, b * kv_heads_per_rank_), d_ctx_heads, saved.v,
             d_probs);
    be_.gemm(gemm_args(true, false, s, head_dim_, queries_per_group * s, b * kv_heads_per_rank_), saved.softmax_out,
             d_ctx_heads, dv);
    saved.v = Tensor();
    d_ctx_heads = Tensor();
    Tensor d_scores = be_.empty(score_shape, opt_.dtype);
    be_.softmax_causal_bwd(d_probs.view({b * heads_per_rank_, s, s}),
                           saved.softmax_out.view({b * heads_per_rank_, s, s}),
                           d_scores.view({b * heads_per_rank_, s, s}));
    saved.softmax_out = Tensor();
    d_probs = Tensor();
    be_.gemm(gemm_args(false, false, queries_per_group * s, head_dim_, s, b * kv_heads_per_rank_, scale), d_scores,
             saved.k, dq);
    be_.gemm(gemm_args(true, false, s, head_dim_, queries_per_group * s, b * kv_heads_per_rank_, scale), d_scores,
             saved.q, dk);
    saved.q = saved.k = Tensor();
  }
  Tensor d_qkv = be_.empty({s, b, qkv_width}, opt_.dtype);
  {
    PhaseRange phase("bwd.rope", phase_log_);  // the gradient through a rotation is the inverse rotation
    be_.rope_bwd(dq, dims.rope_theta, dq);
    be_.rope_bwd(dk, dims.rope_theta, dk);
    be_.merge_heads(dq, 0, d_qkv);
    be_.merge_heads(dk, heads_per_rank_ * head_dim_, d_qkv);
    be_.merge_heads(dv, (heads_per_rank_ + kv_heads_per_rank_) * head_dim_, d_qkv);
  }
  dq = dk = dv = Tensor();
  Tensor d_ln1_out = column_parallel_linear_bwd(comm, "qkv", "qkv_input", std::move(saved.qkv_input), std::move(d_qkv),
                                                params_.qkv_weight, grads_.qkv_weight);  // f | g
  Tensor dx = be_.empty({s_local, b, h}, opt_.dtype);
  {
    PhaseRange phase("bwd.ln1", phase_log_);
    be_.rmsnorm_bwd(as_matrix(d_ln1_out), as_matrix(saved.ln1_input), params_.ln1_weight, saved.ln1_rstd, as_matrix(dx),
                    grads_.ln1_weight);
    be_.add_inplace(dx, dx1);
  }
  saved.clear();
  all_reduce_sequence_parallel_grads();  // SP: the RMSNorm weight gradients
  return dx;
}

}  // namespace actbench
