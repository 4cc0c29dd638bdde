#include "layers/transformer_layer.hpp"

#include <utility>

#include "layers/parallel.hpp"
#include "runtime/error.hpp"

namespace actbench {

TransformerLayer::TransformerLayer(Backend& be, Communicator& comm, LayerOptions opt)
    : LayerBase(be, comm, opt, opt.dims.a, /*attention_dropout=*/true) {
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

Tensor TransformerLayer::forward_impl(const Tensor& x, SavedActivations& save, Keep keep, const char* stage) {
  const auto& dims = opt_.dims;
  const int64_t s_local = local_seq(), s = dims.s, b = dims.b, h = dims.h;
  const bool keep_any = keep != Keep::input_only;
  const CommContext comm = comm_context(stage);

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
  QkvHeads qkv = qkv_projection_fwd(comm, std::move(ln1_out), &params_.qkv_bias, keep_any, save);
  Tensor context = core_attention_fwd(stage, std::move(qkv), save, keep);
  Tensor attn_out = row_parallel_linear_fwd(comm, "proj", std::move(context), params_.proj_weight);  // f̄ | ḡ
  Tensor x1 = bias_dropout_residual_fwd(stage, "attn_residual", attn_out, params_.proj_bias, x, kSiteAttnOut,
                                        keep_any ? &save.attn_residual_mask : nullptr);
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
  Tensor fc1_out = column_parallel_linear_fwd(comm, "fc1", "fc1_input", std::move(ln2_out), params_.fc1_weight,
                                              &params_.fc1_bias, keep_any ? &save.fc1_input : nullptr);  // f | g
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
  return bias_dropout_residual_fwd(stage, "mlp_residual", mlp_out, params_.fc2_bias, x1, kSiteMlpOut,
                                   keep_any ? &save.mlp_residual_mask : nullptr);
}

// residual + dropout(out + bias), the end of both blocks; the mask goes to *kept_mask when kept.
Tensor TransformerLayer::bias_dropout_residual_fwd(const char* stage, const char* op, const Tensor& out,
                                                   const Tensor& bias, const Tensor& residual, uint32_t site,
                                                   Tensor* kept_mask) {
  Tensor y = be_.empty(residual.shape(), opt_.dtype);
  PhaseRange phase(phase_name(stage, op), phase_log_);
  Tensor mask = be_.empty(residual.shape(), DType::u8);
  be_.bias_dropout_residual_fwd(as_matrix(out), bias, as_matrix(residual), residual_dropout_spec(site), as_matrix(y),
                                as_matrix(mask));
  if (kept_mask) *kept_mask = mask;
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
  Tensor d_qkv = be_.empty({s, b, qkv_width()}, opt_.dtype);
  core_attention_bwd(saved, std::move(d_context), d_qkv);
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
