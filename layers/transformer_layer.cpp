#include "layers/transformer_layer.hpp"

#include <cmath>
#include <utility>

#include "layers/parallel.hpp"
#include "runtime/error.hpp"

namespace actbench {

TransformerLayer::TransformerLayer(Backend& be, Communicator& comm, LayerOptions opt)
    : LayerBase(be, comm, std::move(opt)) {
  hidden_per_rank_ = opt_.dims.h / tp_size_;
  allocate_parameters();
}

DropoutSpec TransformerLayer::residual_dropout_spec(uint32_t site) const {
  // [s_local, b, h] rows are rows [rank*s_local*b, ...) of the canonical [s*b, h] under SP
  DropoutSpec spec;
  spec.p = opt_.dropout;
  spec.seed = opt_.seed;
  spec.layer = opt_.layer_index;
  spec.site = site;
  spec.mid_local = local_seq() * opt_.dims.b;
  spec.mid_global = opt_.dims.s * opt_.dims.b;
  spec.mid_offset = opt_.policy.sequence_parallel ? tp_rank_ * spec.mid_local : 0;
  spec.inner = opt_.dims.h;
  return spec;
}

void TransformerLayer::core_attention_probs(const Tensor& q, const Tensor& k, Tensor& probs, Tensor& mask,
                                            Tensor& probs_dropped) {
  const int64_t s = opt_.dims.s, batch = opt_.dims.b * heads_per_rank_;
  const Shape shape = {opt_.dims.b, heads_per_rank_, s, s};
  {
    Tensor scores = be_.empty(shape, opt_.dtype);
    // scores = q k^T / sqrt(d), one GEMM per (batch, head)
    be_.gemm(gemm_args(false, true, s, s, head_dim_, batch, 1.0f / std::sqrt(static_cast<float>(head_dim_))), q, k,
             scores);
    probs = be_.empty(shape, opt_.dtype);
    be_.softmax_causal_fwd(scores.view({batch, s, s}), probs.view({batch, s, s}));
  }
  probs_dropped = be_.empty(shape, opt_.dtype);
  mask = be_.empty(shape, DType::u8);
  be_.dropout_fwd(probs, attn_dropout_spec(), probs_dropped, mask);
}

Tensor TransformerLayer::forward_impl(const Tensor& x, SavedActivations& save, Keep keep, const char* stage) {
  const auto& dims = opt_.dims;
  const int64_t s_local = local_seq(), s = dims.s, b = dims.b, h = dims.h;
  const bool keep_any = keep != Keep::input_only;
  const CommContext comm = comm_context(stage);
  const int64_t rows = s * b;  // rows of the full-sequence GEMMs

  // ---- attention block ----
  Tensor ln1_out = be_.empty({s_local, b, h}, opt_.dtype);
  {
    PhaseRange phase(phase_name(stage, "ln1"), phase_log_);
    Tensor mean = be_.empty({s_local * b}, DType::fp32), rstd = be_.empty({s_local * b}, DType::fp32);
    be_.layernorm_fwd(as_matrix(x), params_.ln1_weight, params_.ln1_bias, opt_.ln_eps, as_matrix(ln1_out), mean, rstd);
    if (keep_any) {
      save.ln1_input = x;
      save.ln1_mean = mean;
      save.ln1_rstd = rstd;
    }
  }
  Tensor q = be_.empty({b, heads_per_rank_, s, head_dim_}, opt_.dtype),
         k = be_.empty({b, heads_per_rank_, s, head_dim_}, opt_.dtype),
         v = be_.empty({b, heads_per_rank_, s, head_dim_}, opt_.dtype);
  {
    Tensor qkv_in = region_entry_fwd(comm, ln1_out, "qkv_input");  // f | g
    if (keep_any) save.qkv_input = ln1_out;                        // the local shard only under SP
    PhaseRange phase(phase_name(stage, "qkv"), phase_log_);
    Tensor qkv = be_.empty({s, b, 3 * hidden_per_rank_}, opt_.dtype);
    be_.gemm(gemm_args(false, true, rows, 3 * hidden_per_rank_, h), as_matrix(qkv_in), params_.qkv_weight,
             as_matrix(qkv));
    be_.add_bias(as_matrix(qkv), params_.qkv_bias);
    be_.split_heads(qkv, 0, q);
    be_.split_heads(qkv, hidden_per_rank_, k);
    be_.split_heads(qkv, 2 * hidden_per_rank_, v);
  }
  ln1_out = Tensor();
  Tensor context = be_.empty({s, b, hidden_per_rank_}, opt_.dtype);
  if (opt_.policy.attention == Attention::fused) {
    // Tiles of scores live only inside the kernel: out and the row log-sum-exp are all
    // that backward needs besides Q, K, V (the mask comes back from the Philox counter).
    PhaseRange phase(phase_name(stage, "core_attn"), phase_log_);
    const int64_t batch = b * heads_per_rank_;
    Tensor ctx_heads = be_.empty({b, heads_per_rank_, s, head_dim_}, opt_.dtype);
    Tensor lse = be_.empty({b, heads_per_rank_, s}, DType::fp32);
    be_.attention_fwd(q.view({batch, s, head_dim_}), k.view({batch, s, head_dim_}), v.view({batch, s, head_dim_}),
                      1.0f / std::sqrt(static_cast<float>(head_dim_)), attn_dropout_spec(),
                      ctx_heads.view({batch, s, head_dim_}), lse.view({batch, s}));
    be_.merge_heads(ctx_heads, 0, context);
    if (keep_any) save.attn_lse = lse;
  } else {
    PhaseRange phase(phase_name(stage, "core_attn"), phase_log_);
    Tensor probs, mask, probs_dropped;
    core_attention_probs(q, k, probs, mask, probs_dropped);
    Tensor ctx_heads = be_.empty({b, heads_per_rank_, s, head_dim_}, opt_.dtype);
    be_.gemm(gemm_args(false, false, s, head_dim_, s, b * heads_per_rank_), probs_dropped, v, ctx_heads);
    be_.merge_heads(ctx_heads, 0, context);
    if (keep == Keep::all) {
      save.softmax_out = probs;
      save.attn_dropout_mask = mask;
      save.attn_dropout_out = probs_dropped;
    }
  }
  if (keep_any) {
    save.q = q;
    save.k = k;
    save.v = v;
    save.proj_input = context;
  }
  q = k = v = Tensor();
  Tensor attn_out = row_parallel_linear_fwd(comm, "proj", std::move(context), params_.proj_weight);  // f̄ | ḡ
  Tensor x1 = be_.empty({s_local, b, h}, opt_.dtype);
  {
    PhaseRange phase(phase_name(stage, "attn_residual"), phase_log_);
    Tensor mask = be_.empty({s_local, b, h}, DType::u8);
    be_.bias_dropout_residual_fwd(as_matrix(attn_out), params_.proj_bias, as_matrix(x),
                                  residual_dropout_spec(kSiteAttnOut), as_matrix(x1), as_matrix(mask));
    if (keep_any) save.attn_residual_mask = mask;
  }
  attn_out = Tensor();

  // ---- MLP block ----
  Tensor ln2_out = be_.empty({s_local, b, h}, opt_.dtype);
  {
    PhaseRange phase(phase_name(stage, "ln2"), phase_log_);
    Tensor mean = be_.empty({s_local * b}, DType::fp32), rstd = be_.empty({s_local * b}, DType::fp32);
    be_.layernorm_fwd(as_matrix(x1), params_.ln2_weight, params_.ln2_bias, opt_.ln_eps, as_matrix(ln2_out), mean, rstd);
    if (keep_any) {
      save.ln2_input = x1;
      save.ln2_mean = mean;
      save.ln2_rstd = rstd;
    }
  }
  Tensor fc1_out = be_.empty({s, b, 4 * hidden_per_rank_}, opt_.dtype);
  {
    Tensor fc1_in = region_entry_fwd(comm, ln2_out, "fc1_input");  // f | g
    if (keep_any) save.fc1_input = ln2_out;
    PhaseRange phase(phase_name(stage, "fc1"), phase_log_);
    be_.gemm(gemm_args(false, true, rows, 4 * hidden_per_rank_, h), as_matrix(fc1_in), params_.fc1_weight,
             as_matrix(fc1_out));
    be_.add_bias(as_matrix(fc1_out), params_.fc1_bias);
  }
  ln2_out = Tensor();
  Tensor gelu_out = be_.empty({s, b, 4 * hidden_per_rank_}, opt_.dtype);
  {
    PhaseRange phase(phase_name(stage, "gelu"), phase_log_);
    be_.gelu_fwd(fc1_out, gelu_out);
  }
  if (keep_any) {
    save.gelu_input = fc1_out;
    save.fc2_input = gelu_out;
  }
  fc1_out = Tensor();
  Tensor mlp_out = row_parallel_linear_fwd(comm, "fc2", std::move(gelu_out), params_.fc2_weight);  // f̄ | ḡ
  Tensor y = be_.empty({s_local, b, h}, opt_.dtype);
  {
    PhaseRange phase(phase_name(stage, "mlp_residual"), phase_log_);
    Tensor mask = be_.empty({s_local, b, h}, DType::u8);
    be_.bias_dropout_residual_fwd(as_matrix(mlp_out), params_.fc2_bias, as_matrix(x1),
                                  residual_dropout_spec(kSiteMlpOut), as_matrix(y), as_matrix(mask));
    if (keep_any) save.mlp_residual_mask = mask;
  }
  return y;
}

Tensor TransformerLayer::backward(const Tensor& dy) {
  const auto& dims = opt_.dims;
  const int64_t s_local = local_seq(), s = dims.s, b = dims.b, h = dims.h;
  SavedActivations saved = take_saved_for_backward(dy);  // all of it, recomputed under full
  const CommContext comm = comm_context("bwd");
  const float dropout = opt_.dropout;

  // ---- MLP block ----
  Tensor d_mlp_out = be_.empty({s_local, b, h}, opt_.dtype);
  {
    PhaseRange phase("bwd.mlp_residual", phase_log_);
    be_.dropout_bwd(dy, saved.mlp_residual_mask, dropout, d_mlp_out);
    be_.bias_grad(as_matrix(d_mlp_out), grads_.fc2_bias);
    saved.mlp_residual_mask = Tensor();
  }
  Tensor d_gelu_out = row_parallel_linear_bwd(comm, "fc2", std::move(d_mlp_out), std::move(saved.fc2_input),
                                              params_.fc2_weight, grads_.fc2_weight);  // f̄ | ḡ
  Tensor d_fc1_out = be_.empty({s, b, 4 * hidden_per_rank_}, opt_.dtype);
  {
    PhaseRange phase("bwd.gelu", phase_log_);
    be_.gelu_bwd(d_gelu_out, saved.gelu_input, d_fc1_out);
    saved.gelu_input = Tensor();
    d_gelu_out = Tensor();
  }
  Tensor d_ln2_out =
      column_parallel_linear_bwd(comm, "fc1", "fc1_input", std::move(saved.fc1_input), std::move(d_fc1_out),
                                 params_.fc1_weight, grads_.fc1_weight, &grads_.fc1_bias);  // f | g
  Tensor dx1 = be_.empty({s_local, b, h}, opt_.dtype);
  {
    PhaseRange phase("bwd.ln2", phase_log_);
    be_.layernorm_bwd(as_matrix(d_ln2_out), as_matrix(saved.ln2_input), params_.ln2_weight, saved.ln2_mean,
                      saved.ln2_rstd, as_matrix(dx1), grads_.ln2_weight, grads_.ln2_bias);
    be_.add_inplace(dx1, dy);  // residual path
    saved.ln2_input = saved.ln2_mean = saved.ln2_rstd = Tensor();
  }
  d_ln2_out = Tensor();

  // ---- attention block ----
  Tensor d_attn_out = be_.empty({s_local, b, h}, opt_.dtype);
  {
    PhaseRange phase("bwd.attn_residual", phase_log_);
    be_.dropout_bwd(dx1, saved.attn_residual_mask, dropout, d_attn_out);
    be_.bias_grad(as_matrix(d_attn_out), grads_.proj_bias);
    saved.attn_residual_mask = Tensor();
  }
  // proj's input stays for fused attention's backward (the attention output)
  Tensor d_context = row_parallel_linear_bwd(comm, "proj", std::move(d_attn_out), saved.proj_input, params_.proj_weight,
                                             grads_.proj_weight);  // f̄ | ḡ
  const int64_t batch = b * heads_per_rank_;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim_));
  Tensor d_qkv = be_.empty({s, b, 3 * hidden_per_rank_}, opt_.dtype);
  if (opt_.policy.attention == Attention::fused) {
    PhaseRange phase("bwd.core_attn", phase_log_);
    // The attention output in head layout is the saved projection input, re-laid out.
    Tensor out_heads = be_.empty({b, heads_per_rank_, s, head_dim_}, opt_.dtype),
           d_out_heads = be_.empty({b, heads_per_rank_, s, head_dim_}, opt_.dtype);
    be_.split_heads(saved.proj_input, 0, out_heads);
    saved.proj_input = Tensor();
    be_.split_heads(d_context, 0, d_out_heads);
    d_context = Tensor();
    const Shape head_shape = {batch, s, head_dim_};
    Tensor dq = be_.empty({b, heads_per_rank_, s, head_dim_}, opt_.dtype),
           dk = be_.empty({b, heads_per_rank_, s, head_dim_}, opt_.dtype),
           dv = be_.empty({b, heads_per_rank_, s, head_dim_}, opt_.dtype);
    be_.attention_bwd(saved.q.view(head_shape), saved.k.view(head_shape), saved.v.view(head_shape),
                      out_heads.view(head_shape), d_out_heads.view(head_shape), saved.attn_lse.view({batch, s}), scale,
                      attn_dropout_spec(), dq.view(head_shape), dk.view(head_shape), dv.view(head_shape));
    saved.q = saved.k = saved.v = saved.attn_lse = Tensor();
    be_.merge_heads(dq, 0, d_qkv);
    be_.merge_heads(dk, hidden_per_rank_, d_qkv);
    be_.merge_heads(dv, 2 * hidden_per_rank_, d_qkv);
  } else {
    saved.proj_input = Tensor();
    if (!saved.softmax_out.defined()) {
      // Selective recompute: QK^T, softmax and dropout again from the stored Q and K; the
      // Philox counter regenerates exactly the forward's mask.
      PhaseRange phase("recompute.core_attn", phase_log_);
      core_attention_probs(saved.q, saved.k, saved.softmax_out, saved.attn_dropout_mask, saved.attn_dropout_out);
    }
    {
      PhaseRange phase("bwd.core_attn", phase_log_);
      Tensor d_ctx_heads = be_.empty({b, heads_per_rank_, s, head_dim_}, opt_.dtype);
      be_.split_heads(d_context, 0, d_ctx_heads);
      d_context = Tensor();
      const Shape score_shape = {b, heads_per_rank_, s, s};
      Tensor d_probs_dropped = be_.empty(score_shape, opt_.dtype);
      be_.gemm(gemm_args(false, true, s, s, head_dim_, batch), d_ctx_heads, saved.v, d_probs_dropped);
      Tensor dv = be_.empty({b, heads_per_rank_, s, head_dim_}, opt_.dtype);
      be_.gemm(gemm_args(true, false, s, head_dim_, s, batch), saved.attn_dropout_out, d_ctx_heads, dv);
      saved.attn_dropout_out = saved.v = Tensor();
      d_ctx_heads = Tensor();
      be_.merge_heads(dv, 2 * hidden_per_rank_, d_qkv);
      dv = Tensor();
      Tensor d_probs = be_.empty(score_shape, opt_.dtype);
      be_.dropout_bwd(d_probs_dropped, saved.attn_dropout_mask, dropout, d_probs);
      saved.attn_dropout_mask = Tensor();
      d_probs_dropped = Tensor();
      Tensor d_scores = be_.empty(score_shape, opt_.dtype);
      be_.softmax_causal_bwd(d_probs.view({batch, s, s}), saved.softmax_out.view({batch, s, s}),
                             d_scores.view({batch, s, s}));
      saved.softmax_out = Tensor();
      d_probs = Tensor();
      Tensor dq = be_.empty({b, heads_per_rank_, s, head_dim_}, opt_.dtype);
      be_.gemm(gemm_args(false, false, s, head_dim_, s, batch, scale), d_scores, saved.k, dq);
      be_.merge_heads(dq, 0, d_qkv);
      dq = Tensor();
      Tensor dk = be_.empty({b, heads_per_rank_, s, head_dim_}, opt_.dtype);
      be_.gemm(gemm_args(true, false, s, head_dim_, s, batch, scale), d_scores, saved.q, dk);
      be_.merge_heads(dk, hidden_per_rank_, d_qkv);
      saved.q = saved.k = Tensor();
    }
  }
  Tensor d_ln1_out = column_parallel_linear_bwd(comm, "qkv", "qkv_input", std::move(saved.qkv_input), std::move(d_qkv),
                                                params_.qkv_weight, grads_.qkv_weight, &grads_.qkv_bias);  // f | g
  Tensor dx = be_.empty({s_local, b, h}, opt_.dtype);
  {
    PhaseRange phase("bwd.ln1", phase_log_);
    be_.layernorm_bwd(as_matrix(d_ln1_out), as_matrix(saved.ln1_input), params_.ln1_weight, saved.ln1_mean,
                      saved.ln1_rstd, as_matrix(dx), grads_.ln1_weight, grads_.ln1_bias);
    be_.add_inplace(dx, dx1);
  }
  saved.clear();
  all_reduce_sequence_parallel_grads();  // SP: LayerNorm and row-parallel bias gradients
  return dx;
}

}  // namespace actbench
