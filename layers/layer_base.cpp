#include "layers/layer_base.hpp"

#include <utility>

#include "runtime/error.hpp"

namespace actbench {

LayerBase::LayerBase(Backend& be, Communicator& comm, LayerOptions opt, Communicator* cp, Communicator* ep)
    : be_(be),
      comm_(comm),
      opt_(opt),
      tp_size_(comm.size()),
      tp_rank_(comm.rank()),
      cp_comm_(cp),
      cp_size_(cp ? cp->size() : 1),
      cp_rank_(cp ? cp->rank() : 0),
      ep_comm_(ep),
      ep_size_(ep ? ep->size() : 1),
      ep_rank_(ep ? ep->rank() : 0) {
  validate_layer(opt_.dims, tp_size_, opt_.policy, cp_size_, ep_size_, opt_.expert_tensor_parallel ? tp_size_ : 1);
  if (ep_size_ > 1 && opt_.expert_tensor_parallel) {  // the EP group: this TP rank's CP x replica peers
    if (ep_rank_ % cp_size_ != cp_rank_)  // validate_layer checked that C divides ep
      throw InvalidArgument("expert-parallel rank " + std::to_string(ep_rank_) + " is not context-parallel rank " +
                            std::to_string(cp_rank_) + " of its replica: the EP group must be in Megatron's order");
    dp_size_ = ep_size_ / cp_size_;
    dp_rank_ = ep_rank_ / cp_size_;
  } else if (ep_size_ > 1 && !experts_over_tp()) {  // the EP group: the t x C grids of ep/(t·C) replicas
    const int grid = tp_size_ * cp_size_;  // validate_layer checked that it divides ep
    if (ep_rank_ % grid != cp_rank_ * tp_size_ + tp_rank_)
      throw InvalidArgument("expert-parallel rank " + std::to_string(ep_rank_) + " is not tensor-parallel rank " +
                            std::to_string(tp_rank_) + ", context-parallel rank " + std::to_string(cp_rank_) +
                            " of its replica: the EP group must be the t x C grids in Megatron's order");
    dp_size_ = ep_size_ / grid;
    dp_rank_ = ep_rank_ / grid;
  }
  seq_ = opt_.dims.s / cp_size_;
  seq_positions_ = cp_rank_positions(cp_rank_);
  heads_per_rank_ = opt_.dims.a / tp_size_;
  head_dim_ = opt_.dims.head_dim();
  v_head_dim_ = opt_.dims.v_head_dim();
  kv_heads_per_rank_ = opt_.dims.groups() / tp_size_;
  attention_dropout_ = static_cast<float>(opt_.dims.spec.attention_dropout);
  hidden_dropout_ = static_cast<float>(opt_.dims.spec.hidden_dropout);
  norm_eps_ = static_cast<float>(opt_.dims.spec.norm_epsilon);
  table_ = layer_param_table(opt_.dims, opt_.expert_tensor_parallel);
  for (const ParamInfo& p : table_) {
    const Shape shape = local_shard(p).shape;
    params_.*p.member = be_.empty(shape, opt_.dtype);
    grads_.*p.member = be_.zeros(shape, opt_.dtype);
  }
}

LayerBase::LocalShard LayerBase::local_shard(const ParamInfo& p) const {
  if (p.kind == ShardKind::experts)  // whole experts, E/ep of them
    return {local_param_shape(p, ep_size_), param_shard(p, ep_size_, ep_rank_), 0};
  if (is_expert_param(p) && ep_size_ > 1) {  // this rank's E/ep experts, each split over TP
    const ParamInfo block = experts_block(p, ep_size_);
    int64_t numel = 1;
    for (int64_t n : block.canonical_shape) numel *= n;
    return {local_param_shape(block, tp_size_), param_shard(block, tp_size_, tp_rank_), ep_rank_ * numel};
  }
  return {local_param_shape(p, tp_size_), param_shard(p, tp_size_, tp_rank_), 0};
}

void LayerBase::init_parameters() {
  if (!be_.computes()) return;
  for (const ParamInfo& p : table_) {
    Tensor& local = params_.*p.member;
    const LocalShard shard = local_shard(p);
    std::vector<float> host(static_cast<size_t>(local.numel()));
    const int64_t fan_in = p.canonical_shape.size() > 1 ? p.canonical_shape[1] : 1;
    for (int64_t i = 0; i < local.numel(); ++i)
      host[i] = param_init_value(p.init_id, opt_.seed, opt_.layer_index, shard.offset + shard.spec.canonical_index(i),
                                 fan_in);
    be_.upload(host.data(), local);
  }
}

void LayerBase::check_activation_shape(const Tensor& t, const char* what) const {
  const Shape expected = {local_seq(), opt_.dims.b, opt_.dims.h};
  if (t.shape() != expected)
    throw InvalidArgument(std::string(what) + " is " + shape_str(t.shape()) + ", expected " + shape_str(expected));
}

Tensor LayerBase::forward(const Tensor& x) { return forward_as(x, "fwd"); }

Tensor LayerBase::recompute_forward(const Tensor& x) { return forward_as(x, "recompute"); }

Tensor LayerBase::forward_as(const Tensor& x, const char* stage) {
  saved_.clear();
  check_activation_shape(x, "layer input");
  switch (opt_.policy.recompute) {
    case Recompute::none: return forward_impl(x, saved_, Keep::all(), stage);
    case Recompute::selective: return forward_impl(x, saved_, Keep::all_but(opt_.policy.modules), stage);
    case Recompute::full: {
      Tensor y = forward_impl(x, saved_, Keep::input_only(), stage);
      saved_.layer_input = x;
      return y;
    }
  }
  return {};
}

SavedActivations LayerBase::take_saved_for_backward(const Tensor& dy) {
  check_activation_shape(dy, "upstream gradient");
  SavedActivations saved = std::move(saved_);
  saved_.clear();
  if (opt_.policy.recompute == Recompute::full) {
    if (!saved.layer_input.defined()) throw RuntimeFailure("backward without forward");
    Tensor x = std::move(saved.layer_input);
    saved.clear();
    (void)forward_impl(x, saved, Keep::all(), "recompute");  // the output is discarded
  }
  if (!saved.ln1_input.defined()) throw RuntimeFailure("backward without forward");
  return saved;
}

void LayerBase::all_reduce_partial_grads() {
  // Split over expert-parallel ranks, an expert has received every rank's rows: whole.
  auto partial = [&](const ParamInfo& p) {
    if (p.kind == ShardKind::experts && ep_size_ > 1) return false;
    return p.grad_sum == GradSum::tensor_parallel ||
           (p.grad_sum == GradSum::sequence_parallel && opt_.policy.sequence_parallel);
  };
  if (tp_size_ == 1) return;
  bool any = false;
  for (const ParamInfo& p : table_) any = any || partial(p);
  if (!any) return;
  PhaseRange phase("comm.bwd.all_reduce.partial_grads", phase_log_);
  for (const ParamInfo& p : table_)
    if (partial(p)) comm_.all_reduce(grads_.*p.member);
}

void LayerBase::norm_fwd(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y, Tensor* mean,
                         Tensor* rstd) {
  const int64_t rows = x.numel() / x.dim(-1);
  const Tensor x2 = as_matrix(x), y2 = as_matrix(y);
  if (opt_.dims.spec.normalization == theory::Norm::rmsnorm) {
    Tensor r = be_.empty({rows}, DType::fp32);
    be_.rmsnorm_fwd(x2, weight, norm_eps_, y2, r);
    if (rstd) *rstd = r;
  } else {
    Tensor m = be_.empty({rows}, DType::fp32), r = be_.empty({rows}, DType::fp32);
    be_.layernorm_fwd(x2, weight, bias, norm_eps_, y2, m, r);
    if (mean) *mean = m;
    if (rstd) *rstd = r;
  }
}

void LayerBase::norm_bwd(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, const Tensor& dx, const Tensor& dweight, const Tensor& dbias) {
  if (opt_.dims.spec.normalization == theory::Norm::rmsnorm)
    be_.rmsnorm_bwd(as_matrix(dy), as_matrix(x), weight, rstd, as_matrix(dx), dweight);
  else
    be_.layernorm_bwd(as_matrix(dy), as_matrix(x), weight, mean, rstd, as_matrix(dx), dweight, dbias);
}

Tensor LayerBase::block_norm_fwd(const char* stage, const char* op, const Tensor& x, const Tensor& weight,
                                 const Tensor& bias, Tensor* mean, Tensor* rstd) {
  Tensor y = be_.empty(x.shape(), opt_.dtype);
  PhaseRange phase(phase_name(stage, op), phase_log_);
  norm_fwd(x, weight, bias, y, mean, rstd);
  return y;
}

CommContext LayerBase::comm_context(const char* stage) const {
  return CommContext{be_, comm_, opt_.policy.sequence_parallel, phase_log_, stage};
}

Tensor LayerBase::column_parallel_linear_fwd(const CommContext& comm, const char* op, const char* region, Tensor x,
                                             const Tensor& weight, const Tensor* bias, Tensor* keep_input) {
  const int64_t out = weight.dim(0), in = weight.dim(1);
  Tensor y = be_.empty({seq_, opt_.dims.b, out}, opt_.dtype);
  {
    Tensor x_full = region_entry_fwd(comm, x, region);  // f | g
    if (keep_input) *keep_input = x;
    PhaseRange phase(phase_name(comm.stage.c_str(), op), phase_log_);
    be_.gemm(gemm_args(false, true, x_full.numel() / in, out, in), as_matrix(x_full), weight, as_matrix(y));
    if (bias) be_.add_bias(as_matrix(y), *bias);
  }
  x = Tensor();
  return y;
}

Tensor LayerBase::row_parallel_linear_fwd(const CommContext& comm, const char* op, Tensor x, const Tensor& weight) {
  const int64_t rows = x.numel() / x.dim(-1), out = weight.dim(0), in = weight.dim(1);
  Tensor partial = be_.empty({seq_, opt_.dims.b, out}, opt_.dtype);
  {
    PhaseRange phase(phase_name(comm.stage.c_str(), op), phase_log_);
    be_.gemm(gemm_args(false, true, rows, out, in), as_matrix(x), weight, as_matrix(partial));
  }
  x = Tensor();
  return region_exit_fwd(comm, std::move(partial), op);  // f̄ | ḡ
}

Tensor LayerBase::row_parallel_linear_bwd(const CommContext& comm, const char* op, Tensor dy, Tensor x,
                                          const Tensor& weight, Tensor& dweight) {
  const int64_t out = weight.dim(0), in = weight.dim(1);
  Tensor dx = be_.empty({seq_, opt_.dims.b, in}, opt_.dtype);
  {
    Tensor dy_partial = region_exit_bwd(comm, dy, op);  // f̄ | ḡ
    dy = Tensor();
    const int64_t rows = dy_partial.numel() / out;
    PhaseRange phase(phase_name(comm.stage.c_str(), op), phase_log_);
    be_.gemm(gemm_args(false, false, rows, in, out), as_matrix(dy_partial), weight, as_matrix(dx));
    be_.gemm(gemm_args(true, false, out, in, rows), as_matrix(dy_partial), as_matrix(x), dweight);
    x = Tensor();
  }
  return dx;
}

Tensor LayerBase::column_parallel_linear_bwd(const CommContext& comm, const char* op, const char* region, Tensor x,
                                             Tensor dy, const Tensor& weight, Tensor& dweight, Tensor* dbias) {
  const int64_t rows = dy.numel() / dy.dim(-1), out = weight.dim(0), in = weight.dim(1);
  Tensor dx_partial = be_.empty({seq_, opt_.dims.b, in}, opt_.dtype);
  {
    Tensor x_full = region_entry_fwd(comm, x, region);  // SP: gather the saved shard again
    x = Tensor();
    PhaseRange phase(phase_name(comm.stage.c_str(), op), phase_log_);
    if (dbias) be_.bias_grad(as_matrix(dy), *dbias);
    be_.gemm(gemm_args(true, false, out, in, rows), as_matrix(dy), as_matrix(x_full), dweight);
    be_.gemm(gemm_args(false, false, rows, in, out), as_matrix(dy), weight, as_matrix(dx_partial));
  }
  dy = Tensor();
  return region_entry_bwd(comm, std::move(dx_partial), region);  // f | g
}

}  // namespace actbench
