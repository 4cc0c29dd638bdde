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
  gl_ = opt_.dims.groups() / t_;
  fl_ = opt_.dims.ffn() / t_;
  allocate_parameters();
}

Tensor LlamaLayer::attention_probs(const Tensor& q, const Tensor& k) {
  const int64_t s = opt_.dims.s, b = opt_.dims.b, r = al_ / gl_;
  const Shape shape = {b, al_, s, s};
  Tensor probs = be_.empty(shape, opt_.dtype);
  Tensor scores = be_.empty(shape, opt_.dtype);
  // The r query heads of a group are consecutive in [b, a/t, s, d]: one GEMM per group,
  // [r*s, d] x [s, d]^T, gives their scores [r*s, s] in place, so k is never repeated.
  be_.gemm(gemm_args(false, true, r * s, s, d_, b * gl_, 1.0f / std::sqrt(static_cast<float>(d_))), q, k, scores);
  be_.softmax_causal_fwd(scores.view({b * al_, s, s}), probs.view({b * al_, s, s}));
  return probs;
}

Tensor LlamaLayer::forward_impl(const Tensor& x, SavedActivations& save, Keep keep, const char* stage) {
  const auto& dm = opt_.dims;
  const int64_t sl = local_seq(), s = dm.s, b = dm.b, h = dm.h, rows = s * b, r = al_ / gl_;
  const bool keep_any = keep != Keep::input_only;
  const CommContext cc = comm_ctx(stage);
  const int64_t qkv_width = (al_ + 2 * gl_) * d_;

  // ---- attention block ----
  Tensor ln1_out = be_.empty({sl, b, h}, opt_.dtype);
  {
    PhaseRange pr(ph(stage, "ln1"), log_);
    Tensor rstd = be_.empty({sl * b}, DType::fp32);
    be_.rmsnorm_fwd(mat(x), params_.ln1_weight, dm.norm_eps, mat(ln1_out), rstd);
    if (keep_any) {
      save.ln1_input = x;
      save.ln1_rstd = rstd;
    }
  }
  Tensor q = be_.empty({b, al_, s, d_}, opt_.dtype), k = be_.empty({b, gl_, s, d_}, opt_.dtype),
         v = be_.empty({b, gl_, s, d_}, opt_.dtype);
  {
    Tensor qkv_in = region_entry_fwd(cc, ln1_out, "qkv_input");  // f | g
    if (keep_any) save.qkv_input = ln1_out;                       // the local shard only under SP
    PhaseRange pr(ph(stage, "qkv"), log_);
    Tensor qkv = be_.empty({s, b, qkv_width}, opt_.dtype);
    be_.gemm(gemm_args(false, true, rows, qkv_width, h), mat(qkv_in), params_.qkv_weight, mat(qkv));
    be_.split_heads(qkv, 0, q);
    be_.split_heads(qkv, al_ * d_, k);
    be_.split_heads(qkv, (al_ + gl_) * d_, v);
  }
  ln1_out = Tensor();
  {
    PhaseRange pr(ph(stage, "rope"), log_);  // positions of the full sequence, also under SP
    be_.rope_fwd(q, dm.rope_theta, q);
    be_.rope_fwd(k, dm.rope_theta, k);
  }
  Tensor context = be_.empty({s, b, al_ * d_}, opt_.dtype);
  {
    PhaseRange pr(ph(stage, "core_attn"), log_);
    Tensor ctx_heads = be_.empty({b, al_, s, d_}, opt_.dtype);
    if (opt_.policy.attention == Attention::fused) {
      Tensor lse = be_.empty({b, al_, s}, DType::fp32);
      be_.attention_fwd(q.view({b * al_, s, d_}), k.view({b * gl_, s, d_}), v.view({b * gl_, s, d_}),
                        1.0f / std::sqrt(static_cast<float>(d_)), attn_dropout_spec(), ctx_heads.view({b * al_, s, d_}),
                        lse.view({b * al_, s}));
      if (keep_any) save.attn_lse = lse;
    } else {
      Tensor probs = attention_probs(q, k);
      be_.gemm(gemm_args(false, false, r * s, d_, s, b * gl_), probs, v, ctx_heads);  // per group, like the scores
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
  Tensor x1 = row_parallel_linear_fwd(cc, "proj", std::move(context), params_.proj_weight);  // f̄ | ḡ
  {
    PhaseRange pr(ph(stage, "attn_residual"), log_);
    be_.add_inplace(x1, x);
  }

  // ---- MLP block ----
  Tensor ln2_out = be_.empty({sl, b, h}, opt_.dtype);
  {
    PhaseRange pr(ph(stage, "ln2"), log_);
    Tensor rstd = be_.empty({sl * b}, DType::fp32);
    be_.rmsnorm_fwd(mat(x1), params_.ln2_weight, dm.norm_eps, mat(ln2_out), rstd);
    if (keep_any) {
      save.ln2_input = x1;
      save.ln2_rstd = rstd;
    }
  }
  Tensor fc1_out = be_.empty({s, b, 2 * fl_}, opt_.dtype);
  {
    Tensor fc1_in = region_entry_fwd(cc, ln2_out, "fc1_input");  // f | g
    if (keep_any) save.fc1_input = ln2_out;
    PhaseRange pr(ph(stage, "fc1"), log_);
    be_.gemm(gemm_args(false, true, rows, 2 * fl_, h), mat(fc1_in), params_.fc1_weight, mat(fc1_out));
  }
  ln2_out = Tensor();
  Tensor act = be_.empty({s, b, fl_}, opt_.dtype);
  {
    PhaseRange pr(ph(stage, "swiglu"), log_);
    be_.swiglu_fwd(fc1_out, act);
  }
  if (keep_any) {
    save.swiglu_input = fc1_out;
    save.fc2_input = act;
  }
  fc1_out = Tensor();
  Tensor y = row_parallel_linear_fwd(cc, "fc2", std::move(act), params_.fc2_weight);  // f̄ | ḡ
  {
    PhaseRange pr(ph(stage, "mlp_residual"), log_);
    be_.add_inplace(y, x1);
  }
  return y;
}

Tensor LlamaLayer::backward(const Tensor& dy) {
  const auto& dm = opt_.dims;
  const int64_t sl = local_seq(), s = dm.s, b = dm.b, h = dm.h, r = al_ / gl_;
  const int64_t qkv_width = (al_ + 2 * gl_) * d_;
  SavedActivations S = take_saved_for_backward(dy);  // all of it, recomputed under full
  const CommContext cc = comm_ctx("bwd");

  // ---- MLP block ----
  Tensor d_act = row_parallel_linear_bwd(cc, "fc2", dy, std::move(S.fc2_input), params_.fc2_weight,
                                         grads_.fc2_weight);  // f̄ | ḡ
  Tensor d_fc1_out = be_.empty({s, b, 2 * fl_}, opt_.dtype);
  {
    PhaseRange pr("bwd.swiglu", log_);
    be_.swiglu_bwd(d_act, S.swiglu_input, d_fc1_out);
    S.swiglu_input = Tensor();
    d_act = Tensor();
  }
  Tensor d_ln2_out = column_parallel_linear_bwd(cc, "fc1", "fc1_input", std::move(S.fc1_input), std::move(d_fc1_out),
                                                params_.fc1_weight, grads_.fc1_weight);  // f | g
  Tensor dx1 = be_.empty({sl, b, h}, opt_.dtype);
  {
    PhaseRange pr("bwd.ln2", log_);
    be_.rmsnorm_bwd(mat(d_ln2_out), mat(S.ln2_input), params_.ln2_weight, S.ln2_rstd, mat(dx1), grads_.ln2_weight);
    be_.add_inplace(dx1, dy);  // residual path
    S.ln2_input = S.ln2_rstd = Tensor();
  }
  d_ln2_out = Tensor();

  // ---- attention block ----
  // proj's input stays for fused attention's backward (the attention output)
  Tensor d_context = row_parallel_linear_bwd(cc, "proj", dx1, S.proj_input, params_.proj_weight,
                                             grads_.proj_weight);  // f̄ | ḡ
  const float scale = 1.0f / std::sqrt(static_cast<float>(d_));
  Tensor dq = be_.empty({b, al_, s, d_}, opt_.dtype), dk = be_.empty({b, gl_, s, d_}, opt_.dtype),
         dv = be_.empty({b, gl_, s, d_}, opt_.dtype);
  if (opt_.policy.attention == Attention::fused) {
    PhaseRange pr("bwd.core_attn", log_);
    // The attention output in head layout is the saved projection input, re-laid out.
    Tensor o_heads = be_.empty({b, al_, s, d_}, opt_.dtype), d_o_heads = be_.empty({b, al_, s, d_}, opt_.dtype);
    be_.split_heads(S.proj_input, 0, o_heads);
    S.proj_input = Tensor();
    be_.split_heads(d_context, 0, d_o_heads);
    d_context = Tensor();
    const Shape qs = {b * al_, s, d_}, kvs = {b * gl_, s, d_};
    be_.attention_bwd(S.q.view(qs), S.k.view(kvs), S.v.view(kvs), o_heads.view(qs), d_o_heads.view(qs),
                      S.attn_lse.view({b * al_, s}), scale, attn_dropout_spec(), dq.view(qs), dk.view(kvs),
                      dv.view(kvs));
    S.q = S.k = S.v = S.attn_lse = Tensor();
  } else {
    S.proj_input = Tensor();
    if (!S.softmax_out.defined()) {
      // Selective recompute: QK^T and softmax again from the stored (rotated) q and k.
      PhaseRange pr("recompute.core_attn", log_);
      S.softmax_out = attention_probs(S.q, S.k);
    }
    PhaseRange pr("bwd.core_attn", log_);
    Tensor d_ctx_heads = be_.empty({b, al_, s, d_}, opt_.dtype);
    be_.split_heads(d_context, 0, d_ctx_heads);
    d_context = Tensor();
    const Shape score_shape = {b, al_, s, s};
    Tensor d_probs = be_.empty(score_shape, opt_.dtype);
    // Per group: [r*s, d] x [s, d]^T and, for dv, [r*s, s]^T x [r*s, d] (sums the group's heads).
    be_.gemm(gemm_args(false, true, r * s, s, d_, b * gl_), d_ctx_heads, S.v, d_probs);
    be_.gemm(gemm_args(true, false, s, d_, r * s, b * gl_), S.softmax_out, d_ctx_heads, dv);
    S.v = Tensor();
    d_ctx_heads = Tensor();
    Tensor d_scores = be_.empty(score_shape, opt_.dtype);
    be_.softmax_causal_bwd(d_probs.view({b * al_, s, s}), S.softmax_out.view({b * al_, s, s}),
                           d_scores.view({b * al_, s, s}));
    S.softmax_out = Tensor();
    d_probs = Tensor();
    be_.gemm(gemm_args(false, false, r * s, d_, s, b * gl_, scale), d_scores, S.k, dq);
    be_.gemm(gemm_args(true, false, s, d_, r * s, b * gl_, scale), d_scores, S.q, dk);
    S.q = S.k = Tensor();
  }
  Tensor d_qkv = be_.empty({s, b, qkv_width}, opt_.dtype);
  {
    PhaseRange pr("bwd.rope", log_);  // the gradient through a rotation is the inverse rotation
    be_.rope_bwd(dq, dm.rope_theta, dq);
    be_.rope_bwd(dk, dm.rope_theta, dk);
    be_.merge_heads(dq, 0, d_qkv);
    be_.merge_heads(dk, al_ * d_, d_qkv);
    be_.merge_heads(dv, (al_ + gl_) * d_, d_qkv);
  }
  dq = dk = dv = Tensor();
  Tensor d_ln1_out = column_parallel_linear_bwd(cc, "qkv", "qkv_input", std::move(S.qkv_input), std::move(d_qkv),
                                                params_.qkv_weight, grads_.qkv_weight);  // f | g
  Tensor dx = be_.empty({sl, b, h}, opt_.dtype);
  {
    PhaseRange pr("bwd.ln1", log_);
    be_.rmsnorm_bwd(mat(d_ln1_out), mat(S.ln1_input), params_.ln1_weight, S.ln1_rstd, mat(dx), grads_.ln1_weight);
    be_.add_inplace(dx, dx1);
  }
  S.clear();
  all_reduce_sequence_parallel_grads();  // SP: the RMSNorm weight gradients
  return dx;
}

}  // namespace actbench
