#include "layers/transformer_layer.hpp"

#include <memory>
#include <utility>

#include "layers/parallel.hpp"
#include "runtime/error.hpp"

namespace actbench {

using theory::Activation;

std::unique_ptr<Layer> make_layer(Backend& be, Communicator& comm, const LayerOptions& opt, Communicator* cp,
                                  Communicator* ep) {
  return std::make_unique<TransformerLayer>(be, comm, opt, cp, ep);
}

TransformerLayer::TransformerLayer(Backend& be, Communicator& comm, LayerOptions opt, Communicator* cp,
                                   Communicator* ep)
    : LayerBase(be, comm, opt, cp, ep) {
  ffn_per_rank_ = opt_.dims.ffn() / tp_size_;
  if (opt_.dims.spec.moe.enabled())
    moe_stats_.tokens_per_expert.assign(static_cast<size_t>(opt_.dims.spec.moe.num_experts), 0);
}

namespace {

// A parameter the spec may leave out, as the optional argument of the linears.
const Tensor* if_defined(const Tensor& t) { return t.defined() ? &t : nullptr; }

// The saved slot of the activation's input: each activation keeps its own category.
Tensor& activation_input_slot(SavedActivations& save, Activation act) {
  switch (act) {
    case Activation::swiglu: return save.swiglu_input;
    case Activation::squared_relu: return save.squared_relu_input;
    case Activation::gelu: break;
  }
  return save.gelu_input;
}

}  // namespace

Tensor TransformerLayer::forward_impl(const Tensor& x, SavedActivations& save, Keep keep, const char* stage) {
  const CommContext comm = comm_context(stage);
  Tensor x1 = opt_.dims.spec.mla.enabled ? mla_attention_block_fwd(comm, x, save, keep)
                                         : attention_block_fwd(comm, x, save, keep);
  if (opt_.dims.spec.moe.enabled()) return moe_block_fwd(comm, x1, save, keep);
  return mlp_block_fwd(comm, x1, save, keep);
}

Tensor TransformerLayer::attention_block_fwd(const CommContext& comm, const Tensor& x, SavedActivations& save,
                                             Keep keep) {
  const char* stage = comm.stage.c_str();
  const bool keep_norm = keep.any && keep.norm_outputs;
  Tensor normed = norm1_fwd(stage, x, save, keep);
  QkvHeads qkv = qkv_projection_fwd(comm, std::move(normed), if_defined(params_.qkv_bias), keep_norm, save);
  head_transforms_fwd(stage, qkv, save, keep.any);
  Tensor context = core_attention_fwd(stage, std::move(qkv), save, keep);
  Tensor out = row_parallel_linear_fwd(comm, "proj", std::move(context), params_.proj_weight);  // f̄ | ḡ
  return residual_fwd(stage, "attn_residual", std::move(out), params_.proj_bias, x, kSiteAttnOut,
                      keep.any ? &save.attn_residual_mask : nullptr);
}

Tensor TransformerLayer::norm1_fwd(const char* stage, const Tensor& x, SavedActivations& save, Keep keep) {
  // The layernorm module runs the norm outside autograd: neither its output nor its
  // statistics are kept, only its input (the checkpoint's), which the norm keeps anyway.
  const bool keep_norm = keep.any && keep.norm_outputs;
  Tensor normed = block_norm_fwd(stage, "ln1", x, params_.ln1_weight, params_.ln1_bias,
                                 keep_norm ? &save.ln1_mean : nullptr, keep_norm ? &save.ln1_rstd : nullptr);
  if (keep.any) save.ln1_input = x;
  return normed;
}

Tensor TransformerLayer::mlp_block_fwd(const CommContext& comm, const Tensor& x1, SavedActivations& save, Keep keep) {
  const char* stage = comm.stage.c_str();
  const bool keep_norm = keep.any && keep.norm_outputs;
  Tensor normed = block_norm_fwd(stage, "ln2", x1, params_.ln2_weight, params_.ln2_bias,
                                 keep_norm ? &save.ln2_mean : nullptr, keep_norm ? &save.ln2_rstd : nullptr);
  if (keep.any) save.ln2_input = x1;
  // fc1's input is also the mlp module's checkpoint input: kept unless the layernorm module drops it.
  const bool keep_mlp = keep.any && keep.mlp;
  Tensor act = mlp_activation_fwd(comm, std::move(normed), keep_norm ? &save.fc1_input : nullptr,
                                  keep_mlp ? &activation_input_slot(save, opt_.dims.spec.activation) : nullptr);
  if (keep_mlp) save.fc2_input = act;
  Tensor out = row_parallel_linear_fwd(comm, "fc2", std::move(act), params_.fc2_weight);  // f̄ | ḡ
  return residual_fwd(stage, "mlp_residual", std::move(out), params_.fc2_bias, x1, kSiteMlpOut,
                      keep.any ? &save.mlp_residual_mask : nullptr);
}

Tensor TransformerLayer::mlp_activation_fwd(const CommContext& comm, Tensor normed, Tensor* keep_input,
                                            Tensor* act_input) {
  const Activation kind = opt_.dims.spec.activation;
  Tensor fc1_out = column_parallel_linear_fwd(comm, "fc1", "fc1_input", std::move(normed), params_.fc1_weight,
                                              if_defined(params_.fc1_bias), keep_input);  // f | g
  Tensor act = be_.empty({seq_, opt_.dims.b, ffn_per_rank_}, opt_.dtype);
  {
    PhaseRange phase(phase_name(comm.stage.c_str(), theory::activation_name(kind)), phase_log_);
    activation_fwd(fc1_out, act);
  }
  if (act_input) *act_input = fc1_out;
  return act;
}

void TransformerLayer::activation_fwd(const Tensor& fc1_out, const Tensor& act) {
  switch (opt_.dims.spec.activation) {
    case Activation::gelu: be_.gelu_fwd(fc1_out, act); break;
    case Activation::swiglu: be_.swiglu_fwd(as_matrix(fc1_out), as_matrix(act)); break;
    case Activation::squared_relu: be_.squared_relu_fwd(fc1_out, act); break;
  }
}

void TransformerLayer::activation_bwd(const Tensor& d_act, const Tensor& fc1_out, const Tensor& d_fc1_out) {
  switch (opt_.dims.spec.activation) {
    case Activation::gelu: be_.gelu_bwd(d_act, fc1_out, d_fc1_out); break;
    case Activation::swiglu: be_.swiglu_bwd(as_matrix(d_act), as_matrix(fc1_out), as_matrix(d_fc1_out)); break;
    case Activation::squared_relu: be_.squared_relu_bwd(d_act, fc1_out, d_fc1_out); break;
  }
}

DropoutSpec TransformerLayer::residual_dropout_spec(uint32_t site, const SeqPositions::Run& run) const {
  // A run of consecutive sequence positions of this rank ([s_local, b, h] rows: s/t under SP,
  // two chunks under CP) is a run of rows of the canonical [s*b, h].
  DropoutSpec spec;
  spec.p = hidden_dropout_;
  spec.seed = opt_.seed;
  spec.layer = opt_.layer_index;
  spec.site = site;
  spec.inner = opt_.dims.h;
  if (dp_size_ > 1) {
    // Expert parallelism over data-parallel replicas: this rank's b sequences are batch columns
    // [r·b, (r+1)·b) of the canonical [s, dp·b, h], at each position of the run.
    spec.outer = run.rows;
    spec.outer_offset = run.position;
    spec.mid_local = opt_.dims.b;
    spec.mid_global = dp_size_ * opt_.dims.b;
    spec.mid_offset = dp_rank_ * opt_.dims.b;
    return spec;
  }
  spec.mid_local = run.rows * opt_.dims.b;
  spec.mid_global = opt_.dims.s * opt_.dims.b;
  spec.mid_offset = run.position * opt_.dims.b;
  return spec;
}

Tensor TransformerLayer::residual_fwd(const char* stage, const char* op, Tensor out, const Tensor& bias,
                                      const Tensor& residual, uint32_t site, Tensor* kept_mask) {
  PhaseRange phase(phase_name(stage, op), phase_log_);
  if (hidden_dropout_ == 0.f) {
    // Without dropout nothing is kept: the sum is formed in place of the block's output.
    if (bias.defined()) be_.add_bias(as_matrix(out), bias);
    be_.add_inplace(out, residual);
    return out;
  }
  Tensor y = be_.empty(residual.shape(), opt_.dtype);
  Tensor mask = be_.empty(residual.shape(), DType::u8);
  const Tensor x2 = as_matrix(out), r2 = as_matrix(residual), y2 = as_matrix(y), m2 = as_matrix(mask);
  SeqPositions::Run runs[2];
  const int count = local_positions().runs(local_seq(), runs);
  for (int i = 0; i < count; ++i) {  // one call per run of consecutive positions (two under CP)
    const int64_t first = runs[i].row * opt_.dims.b, last = (runs[i].row + runs[i].rows) * opt_.dims.b;
    be_.bias_dropout_residual_fwd(x2.rows(first, last), bias, r2.rows(first, last),
                                  residual_dropout_spec(site, runs[i]), y2.rows(first, last), m2.rows(first, last));
  }
  if (kept_mask) *kept_mask = mask;
  return y;
}

Tensor TransformerLayer::residual_bwd(const char* op, const Tensor& dy, Tensor& mask, const Tensor& dbias) {
  PhaseRange phase(phase_name("bwd", op), phase_log_);
  Tensor d_out = dy;
  if (hidden_dropout_ > 0.f) {
    d_out = be_.empty(dy.shape(), opt_.dtype);
    be_.dropout_bwd(dy, mask, hidden_dropout_, d_out);
    mask = Tensor();
  }
  if (dbias.defined()) be_.bias_grad(as_matrix(d_out), dbias);
  return d_out;
}

Tensor TransformerLayer::backward(const Tensor& dy) {
  SavedActivations saved = take_saved_for_backward(dy);  // all of it, recomputed under full
  const CommContext comm = comm_context("bwd");
  Tensor dx1 = opt_.dims.spec.moe.enabled() ? moe_block_bwd(comm, dy, saved) : mlp_block_bwd(comm, dy, saved);
  Tensor dx = opt_.dims.spec.mla.enabled ? mla_attention_block_bwd(comm, dx1, saved)
                                         : attention_block_bwd(comm, dx1, saved);
  saved.clear();
  all_reduce_partial_grads();  // SP: norms and row-parallel biases; the q/k norms always
  return dx;
}

void TransformerLayer::recompute_norm(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias,
                                      Tensor& output, Tensor& mean, Tensor& rstd) {
  if (output.defined()) return;
  output = block_norm_fwd("recompute", op, x, weight, bias, &mean, &rstd);
}

void TransformerLayer::recompute_mlp(SavedActivations& saved) {
  Tensor& act_input = activation_input_slot(saved, opt_.dims.spec.activation);
  if (act_input.defined()) return;
  const CommContext comm = comm_context("recompute");
  saved.fc2_input = mlp_activation_fwd(comm, saved.fc1_input, nullptr, &act_input);
}

Tensor TransformerLayer::mlp_block_bwd(const CommContext& comm, const Tensor& dy, SavedActivations& saved) {
  const Activation kind = opt_.dims.spec.activation;
  Tensor d_out = residual_bwd("mlp_residual", dy, saved.mlp_residual_mask, grads_.fc2_bias);
  // Megatron's checkpoints rebuild when backward reaches the block's output: first the norm
  // (the layernorm module), then from its output the MLP (the mlp module).
  recompute_norm("ln2", saved.ln2_input, params_.ln2_weight, params_.ln2_bias, saved.fc1_input, saved.ln2_mean,
                 saved.ln2_rstd);
  recompute_mlp(saved);
  Tensor d_act = row_parallel_linear_bwd(comm, "fc2", std::move(d_out), std::move(saved.fc2_input),
                                         params_.fc2_weight, grads_.fc2_weight);  // f̄ | ḡ
  Tensor& act_input = activation_input_slot(saved, kind);
  Tensor d_fc1_out = be_.empty(act_input.shape(), opt_.dtype);
  {
    PhaseRange phase(phase_name("bwd", theory::activation_name(kind)), phase_log_);
    activation_bwd(d_act, act_input, d_fc1_out);
    act_input = Tensor();
    d_act = Tensor();
  }
  Tensor d_normed = column_parallel_linear_bwd(comm, "fc1", "fc1_input", std::move(saved.fc1_input),
                                               std::move(d_fc1_out), params_.fc1_weight, grads_.fc1_weight,
                                               grads_.fc1_bias.defined() ? &grads_.fc1_bias : nullptr);  // f | g
  return norm2_bwd(d_normed, dy, saved);
}

Tensor TransformerLayer::norm2_bwd(const Tensor& d_normed, const Tensor& dy, SavedActivations& saved) {
  Tensor dx1 = be_.empty(dy.shape(), opt_.dtype);
  PhaseRange phase("bwd.ln2", phase_log_);
  norm_bwd(d_normed, saved.ln2_input, params_.ln2_weight, saved.ln2_mean, saved.ln2_rstd, dx1, grads_.ln2_weight,
           grads_.ln2_bias);
  be_.add_inplace(dx1, dy);  // residual path
  saved.ln2_input = saved.ln2_mean = saved.ln2_rstd = Tensor();
  return dx1;
}

Tensor TransformerLayer::attention_block_bwd(const CommContext& comm, const Tensor& dx1, SavedActivations& saved) {
  const int64_t s = seq_, b = opt_.dims.b;
  Tensor d_out = residual_bwd("attn_residual", dx1, saved.attn_residual_mask, grads_.proj_bias);
  // The layernorm module rebuilds norm 1's output when backward reaches the attention's output.
  recompute_norm("ln1", saved.ln1_input, params_.ln1_weight, params_.ln1_bias, saved.qkv_input, saved.ln1_mean,
                 saved.ln1_rstd);
  // proj's input stays for fused attention's backward (the attention output)
  Tensor d_context = row_parallel_linear_bwd(comm, "proj", std::move(d_out), saved.proj_input, params_.proj_weight,
                                             grads_.proj_weight);  // f̄ | ḡ
  Tensor d_qkv = be_.empty({s, b, qkv_width()}, opt_.dtype);
  if (!has_head_transforms()) {
    core_attention_bwd(saved, std::move(d_context), d_qkv);  // each gradient merged once complete
  } else {
    // RoPE's and the q/k norms' backward still need dq and dk: core attention writes them here.
    QkvHeads d_heads{be_.empty({b, heads_per_rank_, s, head_dim_}, opt_.dtype),
                     be_.empty({b, kv_heads_per_rank_, s, head_dim_}, opt_.dtype),
                     be_.empty({b, kv_heads_per_rank_, s, head_dim_}, opt_.dtype)};
    core_attention_bwd(saved, std::move(d_context), d_heads);
    head_transforms_bwd(saved, d_heads);
    PhaseRange phase("bwd.merge_heads", phase_log_);
    be_.merge_heads(d_heads.q, q_column(), d_qkv);
    be_.merge_heads(d_heads.k, k_column(), d_qkv);
    be_.merge_heads(d_heads.v, v_column(), d_qkv);
  }
  Tensor d_normed = column_parallel_linear_bwd(comm, "qkv", "qkv_input", std::move(saved.qkv_input), std::move(d_qkv),
                                               params_.qkv_weight, grads_.qkv_weight,
                                               grads_.qkv_bias.defined() ? &grads_.qkv_bias : nullptr);  // f | g
  return norm1_bwd(d_normed, dx1, saved);
}

Tensor TransformerLayer::norm1_bwd(const Tensor& d_normed, const Tensor& dx1, SavedActivations& saved) {
  Tensor dx = be_.empty(dx1.shape(), opt_.dtype);
  PhaseRange phase("bwd.ln1", phase_log_);
  norm_bwd(d_normed, saved.ln1_input, params_.ln1_weight, saved.ln1_mean, saved.ln1_rstd, dx, grads_.ln1_weight,
           grads_.ln1_bias);
  be_.add_inplace(dx, dx1);
  return dx;
}

}  // namespace actbench
