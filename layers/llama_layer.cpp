#include "layers/llama_layer.hpp"

#include <memory>
#include <utility>

#include "layers/transformer_layer.hpp"
#include "runtime/error.hpp"

namespace actbench {

std::unique_ptr<Layer> make_layer(Backend& be, Communicator& comm, const LayerOptions& opt) {
  if (opt.dims.arch == Arch::llama) return std::make_unique<LlamaLayer>(be, comm, opt);
  return std::make_unique<TransformerLayer>(be, comm, opt);
}

LlamaLayer::LlamaLayer(Backend& be, Communicator& comm, LayerOptions opt)
    : LayerBase(be, comm, opt, opt.dims.groups(), /*attention_dropout=*/false) {
  if (opt_.dropout != 0.f) throw InvalidArgument("--arch llama has no dropout: use --dropout 0");
  ffn_per_rank_ = opt_.dims.ffn() / tp_size_;
  attention_output_first_ = true;
  allocate_parameters();
}

Tensor LlamaLayer::forward_impl(const Tensor& x, SavedActivations& save, Keep keep, const char* stage) {
  const auto& dims = opt_.dims;
  const int64_t s_local = local_seq(), s = dims.s, b = dims.b, h = dims.h;
  const bool keep_any = keep != Keep::input_only;
  const CommContext comm = comm_context(stage);

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
  QkvHeads qkv = qkv_projection_fwd(comm, std::move(ln1_out), /*bias=*/nullptr, keep_any, save);
  {
    PhaseRange phase(phase_name(stage, "rope"), phase_log_);  // positions of the full sequence, also under SP
    be_.rope_fwd(qkv.q, dims.rope_theta, head_dim_, qkv.q);
    be_.rope_fwd(qkv.k, dims.rope_theta, head_dim_, qkv.k);
  }
  Tensor context = core_attention_fwd(stage, std::move(qkv), save, keep);  // keeps q and k rotated
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
  Tensor fc1_out = column_parallel_linear_fwd(comm, "fc1", "fc1_input", std::move(ln2_out), params_.fc1_weight,
                                              /*bias=*/nullptr, keep_any ? &save.fc1_input : nullptr);  // f | g
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
  const int64_t s_local = local_seq(), s = dims.s, b = dims.b, h = dims.h;
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
  // RoPE's backward still needs dq and dk: core attention writes them here.
  QkvHeads d_heads{be_.empty({b, heads_per_rank_, s, head_dim_}, opt_.dtype),
                   be_.empty({b, kv_heads_per_rank_, s, head_dim_}, opt_.dtype),
                   be_.empty({b, kv_heads_per_rank_, s, head_dim_}, opt_.dtype)};
  core_attention_bwd(saved, std::move(d_context), d_heads);
  Tensor d_qkv = be_.empty({s, b, qkv_width()}, opt_.dtype);
  {
    PhaseRange phase("bwd.rope", phase_log_);  // the gradient through a rotation is the inverse rotation
    be_.rope_bwd(d_heads.q, dims.rope_theta, head_dim_, d_heads.q);
    be_.rope_bwd(d_heads.k, dims.rope_theta, head_dim_, d_heads.k);
    be_.merge_heads(d_heads.q, q_column(), d_qkv);
    be_.merge_heads(d_heads.k, k_column(), d_qkv);
    be_.merge_heads(d_heads.v, v_column(), d_qkv);
  }
  d_heads = QkvHeads();
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
