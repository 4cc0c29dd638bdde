#include "layers/transformer_layer.hpp"

#include <cmath>
#include <utility>

#include "layers/parallel.hpp"
#include "runtime/error.hpp"

namespace actbench {

TransformerLayer::TransformerLayer(Backend& be, Communicator& comm, LayerOptions opt)
    : LayerBase(be, comm, std::move(opt)) {
  hl_ = opt_.dims.h / t_;
  allocate_parameters();
}

DropoutSpec TransformerLayer::residual_dropout_spec(uint32_t site) const {
  // [s_local, b, h] rows are rows [rank*s_local*b, ...) of the canonical [s*b, h] under SP
  DropoutSpec s;
  s.p = opt_.dropout;
  s.seed = opt_.seed;
  s.layer = opt_.layer_index;
  s.site = site;
  s.mid_local = local_seq() * opt_.dims.b;
  s.mid_global = opt_.dims.s * opt_.dims.b;
  s.mid_offset = opt_.policy.sequence_parallel ? rank_ * s.mid_local : 0;
  s.inner = opt_.dims.h;
  return s;
}

void TransformerLayer::core_attention_probs(const Tensor& q, const Tensor& k, Tensor& probs, Tensor& mask,
                                            Tensor& probs_dropped) {
  const int64_t s = opt_.dims.s, batch = opt_.dims.b * al_;
  const Shape shape = {opt_.dims.b, al_, s, s};
  {
    Tensor scores = be_.empty(shape, opt_.dtype);
    // scores = q k^T / sqrt(d), one GEMM per (batch, head)
    be_.gemm(gemm_args(false, true, s, s, d_, batch, 1.0f / std::sqrt(static_cast<float>(d_))), q, k, scores);
    probs = be_.empty(shape, opt_.dtype);
    be_.softmax_causal_fwd(scores.view({batch, s, s}), probs.view({batch, s, s}));
  }
  probs_dropped = be_.empty(shape, opt_.dtype);
  mask = be_.empty(shape, DType::u8);
  be_.dropout_fwd(probs, attn_dropout_spec(), probs_dropped, mask);
}

Tensor TransformerLayer::forward_impl(const Tensor& x, SavedActivations& save, Keep keep, const char* stage) {
  const auto& dm = opt_.dims;
  const int64_t sl = local_seq(), s = dm.s, b = dm.b, h = dm.h;
  const bool keep_any = keep != Keep::input_only;
  const CommContext cc = comm_ctx(stage);
  const int64_t rows = s * b;  // rows of the full-sequence GEMMs

  // ---- attention block ----
  Tensor ln1_out = be_.empty({sl, b, h}, opt_.dtype);
  {
    PhaseRange r(ph(stage, "ln1"), log_);
    Tensor mean = be_.empty({sl * b}, DType::fp32), rstd = be_.empty({sl * b}, DType::fp32);
    be_.layernorm_fwd(mat(x), params_.ln1_weight, params_.ln1_bias, opt_.ln_eps, mat(ln1_out), mean, rstd);
    if (keep_any) {
      save.ln1_input = x;
      save.ln1_mean = mean;
      save.ln1_rstd = rstd;
    }
  }
  Tensor q = be_.empty({b, al_, s, d_}, opt_.dtype), k = be_.empty({b, al_, s, d_}, opt_.dtype),
         v = be_.empty({b, al_, s, d_}, opt_.dtype);
  {
    Tensor qkv_in = region_entry_fwd(cc, ln1_out, "qkv_input");  // f | g
    if (keep_any) save.qkv_input = ln1_out;                       // the local shard only under SP
    PhaseRange r(ph(stage, "qkv"), log_);
    Tensor qkv = be_.empty({s, b, 3 * hl_}, opt_.dtype);
    be_.gemm(gemm_args(false, true, rows, 3 * hl_, h), mat(qkv_in), params_.qkv_weight, mat(qkv));
    be_.add_bias(mat(qkv), params_.qkv_bias);
    be_.split_heads(qkv, 0, q);
    be_.split_heads(qkv, hl_, k);
    be_.split_heads(qkv, 2 * hl_, v);
  }
  ln1_out = Tensor();
  Tensor context = be_.empty({s, b, hl_}, opt_.dtype);
  if (opt_.policy.attention == Attention::fused) {
    // Tiles of scores live only inside the kernel: out and the row log-sum-exp are all
    // that backward needs besides Q, K, V (the mask comes back from the Philox counter).
    PhaseRange r(ph(stage, "core_attn"), log_);
    const int64_t batch = b * al_;
    Tensor ctx_heads = be_.empty({b, al_, s, d_}, opt_.dtype);
    Tensor lse = be_.empty({b, al_, s}, DType::fp32);
    be_.attention_fwd(q.view({batch, s, d_}), k.view({batch, s, d_}), v.view({batch, s, d_}),
                      1.0f / std::sqrt(static_cast<float>(d_)), attn_dropout_spec(), ctx_heads.view({batch, s, d_}),
                      lse.view({batch, s}));
    be_.merge_heads(ctx_heads, 0, context);
    if (keep_any) save.attn_lse = lse;
  } else {
    PhaseRange r(ph(stage, "core_attn"), log_);
    Tensor probs, mask, probs_dropped;
    core_attention_probs(q, k, probs, mask, probs_dropped);
    Tensor ctx_heads = be_.empty({b, al_, s, d_}, opt_.dtype);
    be_.gemm(gemm_args(false, false, s, d_, s, b * al_), probs_dropped, v, ctx_heads);
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
  Tensor attn_out = row_parallel_linear_fwd(cc, "proj", std::move(context), params_.proj_weight);  // f̄ | ḡ
  Tensor x1 = be_.empty({sl, b, h}, opt_.dtype);
  {
    PhaseRange r(ph(stage, "attn_residual"), log_);
    Tensor mask = be_.empty({sl, b, h}, DType::u8);
    be_.bias_dropout_residual_fwd(mat(attn_out), params_.proj_bias, mat(x), residual_dropout_spec(kSiteAttnOut),
                                  mat(x1), mat(mask));
    if (keep_any) save.attn_residual_mask = mask;
  }
  attn_out = Tensor();

  // ---- MLP block ----
  Tensor ln2_out = be_.empty({sl, b, h}, opt_.dtype);
  {
    PhaseRange r(ph(stage, "ln2"), log_);
    Tensor mean = be_.empty({sl * b}, DType::fp32), rstd = be_.empty({sl * b}, DType::fp32);
    be_.layernorm_fwd(mat(x1), params_.ln2_weight, params_.ln2_bias, opt_.ln_eps, mat(ln2_out), mean, rstd);
    if (keep_any) {
      save.ln2_input = x1;
      save.ln2_mean = mean;
      save.ln2_rstd = rstd;
    }
  }
  Tensor fc1_out = be_.empty({s, b, 4 * hl_}, opt_.dtype);
  {
    Tensor fc1_in = region_entry_fwd(cc, ln2_out, "fc1_input");  // f | g
    if (keep_any) save.fc1_input = ln2_out;
    PhaseRange r(ph(stage, "fc1"), log_);
    be_.gemm(gemm_args(false, true, rows, 4 * hl_, h), mat(fc1_in), params_.fc1_weight, mat(fc1_out));
    be_.add_bias(mat(fc1_out), params_.fc1_bias);
  }
  ln2_out = Tensor();
  Tensor gelu_out = be_.empty({s, b, 4 * hl_}, opt_.dtype);
  {
    PhaseRange r(ph(stage, "gelu"), log_);
    be_.gelu_fwd(fc1_out, gelu_out);
  }
  if (keep_any) {
    save.gelu_input = fc1_out;
    save.fc2_input = gelu_out;
  }
  fc1_out = Tensor();
  Tensor mlp_out = row_parallel_linear_fwd(cc, "fc2", std::move(gelu_out), params_.fc2_weight);  // f̄ | ḡ
  Tensor y = be_.empty({sl, b, h}, opt_.dtype);
  {
    PhaseRange r(ph(stage, "mlp_residual"), log_);
    Tensor mask = be_.empty({sl, b, h}, DType::u8);
    be_.bias_dropout_residual_fwd(mat(mlp_out), params_.fc2_bias, mat(x1), residual_dropout_spec(kSiteMlpOut), mat(y),
                                  mat(mask));
    if (keep_any) save.mlp_residual_mask = mask;
  }
  return y;
}

Tensor TransformerLayer::backward(const Tensor& dy) {
  const auto& dm = opt_.dims;
  const int64_t sl = local_seq(), s = dm.s, b = dm.b, h = dm.h;
  SavedActivations S = take_saved_for_backward(dy);  // all of it, recomputed under full
  const CommContext cc = comm_ctx("bwd");
  const float p = opt_.dropout;

  // ---- MLP block ----
  Tensor d_mlp_out = be_.empty({sl, b, h}, opt_.dtype);
  {
    PhaseRange r("bwd.mlp_residual", log_);
    be_.dropout_bwd(dy, S.mlp_residual_mask, p, d_mlp_out);
    be_.bias_grad(mat(d_mlp_out), grads_.fc2_bias);
    S.mlp_residual_mask = Tensor();
  }
  Tensor d_gelu_out = row_parallel_linear_bwd(cc, "fc2", std::move(d_mlp_out), std::move(S.fc2_input),
                                              params_.fc2_weight, grads_.fc2_weight);  // f̄ | ḡ
  Tensor d_fc1_out = be_.empty({s, b, 4 * hl_}, opt_.dtype);
  {
    PhaseRange r("bwd.gelu", log_);
    be_.gelu_bwd(d_gelu_out, S.gelu_input, d_fc1_out);
    S.gelu_input = Tensor();
    d_gelu_out = Tensor();
  }
  Tensor d_ln2_out = column_parallel_linear_bwd(cc, "fc1", "fc1_input", std::move(S.fc1_input), std::move(d_fc1_out),
                                                params_.fc1_weight, grads_.fc1_weight, &grads_.fc1_bias);  // f | g
  Tensor dx1 = be_.empty({sl, b, h}, opt_.dtype);
  {
    PhaseRange r("bwd.ln2", log_);
    be_.layernorm_bwd(mat(d_ln2_out), mat(S.ln2_input), params_.ln2_weight, S.ln2_mean, S.ln2_rstd, mat(dx1),
                      grads_.ln2_weight, grads_.ln2_bias);
    be_.add_inplace(dx1, dy);  // residual path
    S.ln2_input = S.ln2_mean = S.ln2_rstd = Tensor();
  }
  d_ln2_out = Tensor();

  // ---- attention block ----
  Tensor d_attn_out = be_.empty({sl, b, h}, opt_.dtype);
  {
    PhaseRange r("bwd.attn_residual", log_);
    be_.dropout_bwd(dx1, S.attn_residual_mask, p, d_attn_out);
    be_.bias_grad(mat(d_attn_out), grads_.proj_bias);
    S.attn_residual_mask = Tensor();
  }
  // proj's input stays for fused attention's backward (the attention output)
  Tensor d_context = row_parallel_linear_bwd(cc, "proj", std::move(d_attn_out), S.proj_input, params_.proj_weight,
                                             grads_.proj_weight);  // f̄ | ḡ
  const int64_t batch = b * al_;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d_));
  Tensor d_qkv = be_.empty({s, b, 3 * hl_}, opt_.dtype);
  if (opt_.policy.attention == Attention::fused) {
    PhaseRange r("bwd.core_attn", log_);
    // The attention output in head layout is the saved projection input, re-laid out.
    Tensor o_heads = be_.empty({b, al_, s, d_}, opt_.dtype), d_o_heads = be_.empty({b, al_, s, d_}, opt_.dtype);
    be_.split_heads(S.proj_input, 0, o_heads);
    S.proj_input = Tensor();
    be_.split_heads(d_context, 0, d_o_heads);
    d_context = Tensor();
    const Shape hs = {batch, s, d_};
    Tensor dq = be_.empty({b, al_, s, d_}, opt_.dtype), dk = be_.empty({b, al_, s, d_}, opt_.dtype),
           dv = be_.empty({b, al_, s, d_}, opt_.dtype);
    be_.attention_bwd(S.q.view(hs), S.k.view(hs), S.v.view(hs), o_heads.view(hs), d_o_heads.view(hs),
                      S.attn_lse.view({batch, s}), scale, attn_dropout_spec(), dq.view(hs), dk.view(hs), dv.view(hs));
    S.q = S.k = S.v = S.attn_lse = Tensor();
    be_.merge_heads(dq, 0, d_qkv);
    be_.merge_heads(dk, hl_, d_qkv);
    be_.merge_heads(dv, 2 * hl_, d_qkv);
  } else {
    S.proj_input = Tensor();
    if (!S.softmax_out.defined()) {
      // Selective recompute: QK^T, softmax and dropout again from the stored Q and K; the
      // Philox counter regenerates exactly the forward's mask.
      PhaseRange r("recompute.core_attn", log_);
      core_attention_probs(S.q, S.k, S.softmax_out, S.attn_dropout_mask, S.attn_dropout_out);
    }
    {
      PhaseRange r("bwd.core_attn", log_);
      Tensor d_ctx_heads = be_.empty({b, al_, s, d_}, opt_.dtype);
      be_.split_heads(d_context, 0, d_ctx_heads);
      d_context = Tensor();
      const Shape score_shape = {b, al_, s, s};
      Tensor d_probs_dropped = be_.empty(score_shape, opt_.dtype);
      be_.gemm(gemm_args(false, true, s, s, d_, batch), d_ctx_heads, S.v, d_probs_dropped);
      Tensor dv = be_.empty({b, al_, s, d_}, opt_.dtype);
      be_.gemm(gemm_args(true, false, s, d_, s, batch), S.attn_dropout_out, d_ctx_heads, dv);
      S.attn_dropout_out = S.v = Tensor();
      d_ctx_heads = Tensor();
      be_.merge_heads(dv, 2 * hl_, d_qkv);
      dv = Tensor();
      Tensor d_probs = be_.empty(score_shape, opt_.dtype);
      be_.dropout_bwd(d_probs_dropped, S.attn_dropout_mask, p, d_probs);
      S.attn_dropout_mask = Tensor();
      d_probs_dropped = Tensor();
      Tensor d_scores = be_.empty(score_shape, opt_.dtype);
      be_.softmax_causal_bwd(d_probs.view({batch, s, s}), S.softmax_out.view({batch, s, s}), d_scores.view({batch, s, s}));
      S.softmax_out = Tensor();
      d_probs = Tensor();
      Tensor dq = be_.empty({b, al_, s, d_}, opt_.dtype);
      be_.gemm(gemm_args(false, false, s, d_, s, batch, scale), d_scores, S.k, dq);
      be_.merge_heads(dq, 0, d_qkv);
      dq = Tensor();
      Tensor dk = be_.empty({b, al_, s, d_}, opt_.dtype);
      be_.gemm(gemm_args(true, false, s, d_, s, batch, scale), d_scores, S.q, dk);
      be_.merge_heads(dk, hl_, d_qkv);
      S.q = S.k = Tensor();
    }
  }
  Tensor d_ln1_out = column_parallel_linear_bwd(cc, "qkv", "qkv_input", std::move(S.qkv_input), std::move(d_qkv),
                                                params_.qkv_weight, grads_.qkv_weight, &grads_.qkv_bias);  // f | g
  Tensor dx = be_.empty({sl, b, h}, opt_.dtype);
  {
    PhaseRange r("bwd.ln1", log_);
    be_.layernorm_bwd(mat(d_ln1_out), mat(S.ln1_input), params_.ln1_weight, S.ln1_mean, S.ln1_rstd, mat(dx),
                      grads_.ln1_weight, grads_.ln1_bias);
    be_.add_inplace(dx, dx1);
  }
  S.clear();
  all_reduce_sequence_parallel_grads();  // SP: LayerNorm and row-parallel bias gradients
  return dx;
}

}  // namespace actbench
