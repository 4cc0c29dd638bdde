// The MoE block of the composed layer, in place of the MLP (docs/moe.md, "The MoE layer"):
//
//   n   = norm2(x1)                                   kept: moe_input (unless layernorm)
//   out = sum over each token's rows of fc2(act(fc1(permute(n))) x weight) + shared(n),
//         the weights from route(n W_r^T), multiplied into the activation (Megatron-Core 0.13+)
//   y   = x1 + hidden_dropout(out)
//
// What each piece keeps is theory/layer_pieces.hpp's MoE table; the moe module keeps only the
// block's input and runs the block again in backward, moe_act drops the experts' activation
// output, shared_experts the shared experts' two tensors. Under TP (with SP) each rank routes
// its own s/t rows. With expert tensor parallelism 1 (Megatron-Core's DeepSeek and Qwen
// recipes) they go to whole experts (on every rank, or under EP to the experts' ranks); with
// expert tensor parallelism over the TP group (Megatron-Core's default, etp = t) every rank's
// rows go to every rank, which runs its 1/t of each expert's width over all of them, and the
// partial outputs come back summed. The shared experts are split like the dense MLP.
#include <algorithm>
#include <numeric>
#include <utility>
#include <vector>

#include "layers/transformer_layer.hpp"
#include "runtime/error.hpp"

namespace actbench {

namespace {

// The rows each expert gets when T·k choices spread as evenly as they can (the lower experts
// take the remainder), each capped at the capacity when there is one.
std::vector<int64_t> balanced_histogram(int64_t pairs, int64_t experts, int64_t capacity) {
  std::vector<int64_t> rows(static_cast<size_t>(experts), pairs / experts);
  for (int64_t e = 0; e < pairs % experts; ++e) ++rows[static_cast<size_t>(e)];
  if (capacity > 0)
    for (int64_t& r : rows) r = std::min(r, capacity);
  return rows;
}

// A histogram given for meta must be one a run could measure at this shape.
void check_given_histogram(const std::vector<int64_t>& rows, int64_t pairs, int64_t experts, int64_t capacity) {
  const std::string what = "--moe-tokens-per-expert: ";
  if (static_cast<int64_t>(rows.size()) != experts)
    throw InvalidArgument(what + std::to_string(rows.size()) + " counts given for " + std::to_string(experts) +
                          " experts");
  int64_t sum = 0;
  for (int64_t r : rows) {
    if (r < 0 || (capacity > 0 && r > capacity))
      throw InvalidArgument(what + "count " + std::to_string(r) + " outside [0, " +
                            (capacity > 0 ? "the capacity " + std::to_string(capacity) : "tokens x top-k") + "]");
    sum += r;
  }
  if (capacity == 0 ? sum != pairs : sum > pairs)
    throw InvalidArgument(what + "the counts sum to " + std::to_string(sum) + ", but the layer routes " +
                          std::to_string(pairs) + " (tokens x top-k)" + (capacity > 0 ? " at most" : ""));
}

}  // namespace

MoeRouting TransformerLayer::moe_routing() const {
  const theory::MoeSpec& moe = opt_.dims.spec.moe;
  MoeRouting r;
  r.score = moe.score == theory::MoeScore::sigmoid ? MoeRouting::Score::sigmoid : MoeRouting::Score::softmax;
  r.top_k = static_cast<int64_t>(moe.top_k);
  r.normalize = moe.normalizes();
  r.scaling = static_cast<float>(moe.scaling);
  if (moe.num_groups > 0) {
    r.num_groups = static_cast<int64_t>(moe.num_groups);
    r.group_top_k = static_cast<int64_t>(moe.group_top_k);
  }
  return r;
}

int64_t TransformerLayer::routed_rows(const MoeDispatch& plan, const Tensor& aux_loss) {
  const theory::MoeSpec& moe = opt_.dims.spec.moe;
  const int64_t experts = plan.tokens_per_expert.numel(), pairs = plan.row_slot.numel();
  const int64_t capacity = moe.capacity_factor > 0
                               ? moe_expert_capacity(pairs / plan.slot_row.dim(1), plan.slot_row.dim(1), experts,
                                                     moe.capacity_factor)
                               : 0;
  MoeRoutingStats& stats = moe_stats_;
  if (be_.computes()) {
    // The grouped GEMMs' shapes depend on the routing: one copy to the host, as Megatron-Core's
    // dropless path synchronises on tokens_per_expert.
    std::vector<float> rows(static_cast<size_t>(experts));
    float aux = 0;
    be_.download(plan.tokens_per_expert, rows.data());
    be_.download(aux_loss, &aux);
    std::transform(rows.begin(), rows.end(), stats.tokens_per_expert.begin(),
                   [](float r) { return static_cast<int64_t>(r); });
    stats.aux_loss = aux;
    stats.measured = true;
  } else {
    if (opt_.moe_tokens_per_expert.empty()) {
      stats.tokens_per_expert = balanced_histogram(pairs, experts, capacity);
    } else {
      check_given_histogram(opt_.moe_tokens_per_expert, pairs, experts, capacity);
      stats.tokens_per_expert = opt_.moe_tokens_per_expert;
    }
    stats.aux_loss = 0;
    stats.measured = false;
  }
  const int64_t kept = std::accumulate(stats.tokens_per_expert.begin(), stats.tokens_per_expert.end(), int64_t{0});
  stats.dropped = pairs - kept;
  stats.expert_rows = kept;
  return kept;
}

// ---- expert (tensor) parallelism: the experts' rows exchanged over their group ---------------

void TransformerLayer::plan_expert_exchange(const char* stage) {
  expert_exchanges_.clear();
  std::vector<int64_t> rows = moe_stats_.tokens_per_expert;
  if (ep_size_ > 1) rows = plan_exchange_stage(stage, ep_comm_, false, rows);
  if (opt_.expert_tensor_parallel && tp_size_ > 1) rows = plan_exchange_stage(stage, &comm_, true, rows);
  moe_stats_.expert_rows = std::accumulate(rows.begin(), rows.end(), int64_t{0});
}

std::vector<int64_t> TransformerLayer::plan_exchange_stage(const char* stage, Communicator* group, bool replicated,
                                                           const std::vector<int64_t>& mine) {
  ExpertExchange& x = expert_exchanges_.emplace_back();
  x.replicated = replicated;
  x.group = group;
  x.ranks = x.group->size();
  x.me = x.group->rank();
  // Every rank's rows per expert, on every rank: who sends what to whom.
  std::vector<float> sent(mine.begin(), mine.end());
  {
    PhaseRange phase(phase_name(stage, "moe_exchange_counts"), phase_log_);
    sent = x.group->gather_host(sent);
  }
  x.counts.assign(sent.begin(), sent.end());
  x.experts = static_cast<int64_t>(mine.size());
  x.local = x.replicated ? x.experts : x.experts / x.ranks;
  x.expert_rows.assign(static_cast<size_t>(x.local), 0);
  x.send_rows.assign(static_cast<size_t>(x.ranks), 0);
  x.recv_rows.assign(static_cast<size_t>(x.ranks), 0);
  for (int j = 0; j < x.ranks; ++j) {
    x.send_rows[j] = x.block_rows(x.me, j);
    x.recv_rows[j] = x.block_rows(j, x.me);
  }
  for (int64_t e = 0; e < x.local; ++e)
    for (int i = 0; i < x.ranks; ++i) x.expert_rows[e] += x.count(i, x.first_expert(x.me) + e);
  return x.expert_rows;
}

int64_t TransformerLayer::ExpertExchange::block_rows(int from, int to) const {
  int64_t rows = 0;
  for (int64_t e = first_expert(to); e < first_expert(to) + local; ++e) rows += count(from, e);
  return rows;
}

int64_t TransformerLayer::ExpertExchange::own_rows() const {
  int64_t rows = 0;
  for (int64_t e = 0; e < experts; ++e) rows += count(me, e);
  return rows;
}

Tensor TransformerLayer::to_experts(const char* stage, Tensor rows) {
  for (const ExpertExchange& x : expert_exchanges_) rows = stage_to_experts(stage, x, rows);
  return rows;
}

Tensor TransformerLayer::from_experts(const char* stage, Tensor rows) {
  for (auto x = expert_exchanges_.rbegin(); x != expert_exchanges_.rend(); ++x) rows = stage_from_experts(stage, *x, rows);
  return rows;
}

// Rows in expert order (expert 0's first) to the ranks that hold their experts. That order is
// already one block per destination rank, so the rows go as they are, no padding (replicated:
// all of them to every rank, MPI_Allgatherv's exchange); each rank receives one block per source
// rank and reorders them expert by expert (rank 0's rows of an expert first), as its grouped
// GEMMs (or the next stage) read them.
Tensor TransformerLayer::stage_to_experts(const char* stage, const ExpertExchange& x, const Tensor& rows) {
  const int64_t width = rows.dim(1);
  Tensor send = rows;
  if (x.replicated) {
    send = be_.empty({x.ranks * rows.dim(0), width}, rows.dtype());
    for (int j = 0; j < x.ranks; ++j) copy_matrix_rows(rows, 0, send, j * rows.dim(0), rows.dim(0));
  }
  const int64_t received = std::accumulate(x.expert_rows.begin(), x.expert_rows.end(), int64_t{0});
  Tensor recv = be_.empty({received, width}, rows.dtype());
  exchange(stage, x, send, x.send_rows, recv, x.recv_rows);
  send = Tensor();
  Tensor out = be_.empty(recv.shape(), rows.dtype());
  int64_t dst = 0;
  for (int64_t e = x.first_expert(x.me); e < x.first_expert(x.me) + x.local; ++e)
    for (int i = 0; i < x.ranks; ++i) {
      const int64_t n = x.count(i, e);
      copy_matrix_rows(recv, x.block_start(i, x.me) + x.rows_before(i, e), out, dst, n);
      dst += n;
    }
  return out;
}

// The inverse: the experts' rows back to the ranks that sent them, in their order (which the
// received blocks, in rank order, already are). Replicated, every rank's experts computed a
// partial sum of each row (their slice of the width): the blocks are summed.
Tensor TransformerLayer::stage_from_experts(const char* stage, const ExpertExchange& x, const Tensor& rows) {
  const int64_t width = rows.dim(1);
  Tensor send = be_.empty(rows.shape(), rows.dtype());
  int64_t src = 0;
  for (int64_t e = x.first_expert(x.me); e < x.first_expert(x.me) + x.local; ++e)
    for (int i = 0; i < x.ranks; ++i) {
      const int64_t n = x.count(i, e);
      copy_matrix_rows(rows, src, send, x.block_start(i, x.me) + x.rows_before(i, e), n);
      src += n;
    }
  // What this rank sent each rank comes back from it (replicated: its own rows from each).
  const int64_t back = std::accumulate(x.send_rows.begin(), x.send_rows.end(), int64_t{0});
  Tensor out = be_.empty({back, width}, rows.dtype());
  exchange(stage, x, send, x.recv_rows, out, x.send_rows);
  if (!x.replicated) return out;
  PhaseRange phase(phase_name(stage, "moe_partial_sum"), phase_log_);
  const int64_t own = x.own_rows();
  Tensor sum = out.rows(0, own);
  for (int j = 1; j < x.ranks; ++j) be_.add_inplace(sum, out.rows(j * own, (j + 1) * own));
  Tensor result = be_.empty(sum.shape(), rows.dtype());
  copy_matrix_rows(sum, 0, result, 0, own);  // its own storage: the sum's buffer is freed
  return result;
}

// Rows of `from`'s block to expert e's owner that come before expert e's (its earlier experts').
int64_t TransformerLayer::ExpertExchange::rows_before(int from, int64_t e) const {
  int64_t rows = 0;
  for (int64_t f = (e / local) * local; f < e; ++f) rows += count(from, f);
  return rows;
}

// On rank `to`, where the block from rank `from` starts among the blocks it received (rank order).
int64_t TransformerLayer::ExpertExchange::block_start(int from, int to) const {
  int64_t rows = 0;
  for (int i = 0; i < from; ++i) rows += block_rows(i, to);
  return rows;
}

void TransformerLayer::copy_matrix_rows(const Tensor& src, int64_t src_row, const Tensor& dst, int64_t dst_row,
                                        int64_t rows) {
  if (rows == 0) return;
  be_.copy_rows(src.view({1, src.dim(0), src.dim(1)}), src_row, dst.view({1, dst.dim(0), dst.dim(1)}), dst_row, rows);
}

void TransformerLayer::exchange(const char* stage, const ExpertExchange& x, const Tensor& send,
                                const std::vector<int64_t>& send_rows, const Tensor& recv,
                                const std::vector<int64_t>& recv_rows) {
  PhaseRange phase("comm." + std::string(stage) + ".all_to_all.moe_tokens", phase_log_);
  x.group->all_to_all_v(send, send_rows, recv, recv_rows);
}

const std::vector<int64_t>& TransformerLayer::local_rows_per_expert() const {
  return exchanges_expert_rows() ? expert_exchanges_.back().expert_rows : moe_stats_.tokens_per_expert;
}

// The local experts' row counts, as the grouped GEMMs take them (i32 on the device).
Tensor TransformerLayer::local_expert_counts() {
  const std::vector<int64_t>& rows = expert_exchanges_.back().expert_rows;
  Tensor t = be_.empty({static_cast<int64_t>(rows.size())}, DType::i32);
  if (be_.computes()) {
    const std::vector<float> host(rows.begin(), rows.end());
    be_.upload(host.data(), t);
  }
  return t;
}

Tensor TransformerLayer::moe_block_fwd(const CommContext& comm, const Tensor& x1, SavedActivations& save, Keep keep) {
  const char* stage = comm.stage.c_str();
  const bool keep_norm = keep.any && keep.norm_outputs;
  Tensor normed = block_norm_fwd(stage, "ln2", x1, params_.ln2_weight, params_.ln2_bias,
                                 keep_norm ? &save.ln2_mean : nullptr, keep_norm ? &save.ln2_rstd : nullptr);
  if (keep.any) save.ln2_input = x1;
  if (keep_norm) save.moe_input = normed;  // also the moe checkpoint's input
  // Under the moe module (or full recompute's first pass) the routed tensors live only until
  // the block's output exists.
  SavedActivations discarded;
  const bool keep_block = keep.any && keep.moe;
  Tensor out = moe_routed_fwd(stage, normed, keep_block ? save : discarded, keep.moe_act);
  if (opt_.dims.spec.moe.shared_ffn_hidden > 0) {
    const bool keep_shared = keep_block && keep.shared_experts;
    Tensor shared = shared_experts_fwd(comm, normed, keep_shared ? &save.shared_act_input : nullptr,
                                       keep_shared ? &save.shared_fc2_input : nullptr);
    PhaseRange phase(phase_name(stage, "shared_add"), phase_log_);
    be_.add_inplace(out, shared);
  }
  discarded.clear();
  normed = Tensor();
  return residual_fwd(stage, "mlp_residual", std::move(out), params_.fc2_bias, x1, kSiteMlpOut,
                      keep.any ? &save.mlp_residual_mask : nullptr);
}

Tensor TransformerLayer::moe_routed_fwd(const char* stage, const Tensor& normed, SavedActivations& into,
                                        bool keep_fc2_input) {
  const int64_t T = normed.numel() / opt_.dims.h, h = opt_.dims.h;
  const int64_t E = params_.router_weight.dim(0), k = static_cast<int64_t>(opt_.dims.spec.moe.top_k);
  const MoeRouting routing = moe_routing();
  const Tensor x = as_matrix(normed);
  Tensor scores = be_.empty({T, E}, opt_.dtype), index = be_.empty({T, k}, DType::i32);
  Tensor weight = be_.empty({T, k}, opt_.dtype), aux = be_.empty({1}, DType::fp32);
  {
    PhaseRange phase(phase_name(stage, "router"), phase_log_);
    Tensor logits = be_.empty({T, E}, opt_.dtype);
    be_.gemm(gemm_args(false, true, T, E, h), x, params_.router_weight, logits);
    be_.moe_route(logits, params_.router_bias, routing, scores, index, weight, aux);
  }
  const MoeDispatch plan = make_moe_dispatch(be_, T, k, E);
  const double cf = opt_.dims.spec.moe.capacity_factor;
  {
    PhaseRange phase(phase_name(stage, "moe_dispatch"), phase_log_);
    be_.moe_dispatch(index, cf > 0 ? std::optional<double>(cf) : std::nullopt, plan);
  }
  const int64_t N = routed_rows(plan, aux);
  const Tensor& w1 = params_.experts_fc1_weight;
  // The kept pairs' rows, and their weights in the same order (the pairs' plan).
  Tensor permuted = be_.empty({N, h}, opt_.dtype), probs = be_.empty({N, 1}, opt_.dtype);
  {
    PhaseRange phase(phase_name(stage, "moe_permute"), phase_log_);
    be_.moe_permute(x, plan, permuted);
    be_.moe_permute(weight.view({T * k, 1}), pair_plan(plan), probs);
  }
  // Under expert parallelism the rows (and their weights) travel to their experts' ranks and back.
  Tensor counts = plan.tokens_per_expert;
  if (exchanges_expert_rows()) {
    plan_expert_exchange(stage);
    permuted = to_experts(stage, permuted);
    probs = to_experts(stage, probs);
    counts = local_expert_counts();
  }
  const int64_t rows = permuted.dim(0);
  Tensor fc1 = be_.empty({rows, w1.dim(2)}, opt_.dtype);
  {
    PhaseRange phase(phase_name(stage, "experts_fc1"), phase_log_);
    be_.grouped_gemm(permuted, w1, counts, fc1, local_rows_per_expert());
  }
  Tensor act = moe_weighted_act(stage, fc1, probs);
  Tensor fc2 = be_.empty({rows, h}, opt_.dtype), out = be_.empty(normed.shape(), opt_.dtype);
  {
    PhaseRange phase(phase_name(stage, "experts_fc2"), phase_log_);
    be_.grouped_gemm(act, params_.experts_fc2_weight, counts, fc2, local_rows_per_expert());
  }
  if (exchanges_expert_rows()) fc2 = from_experts(stage, fc2);
  {
    // The combine: each token's kept rows summed (already weighted).
    PhaseRange phase(phase_name(stage, "moe_unpermute"), phase_log_);
    be_.moe_permute_bwd(fc2, plan, as_matrix(out));
  }
  into.router_scores = scores;
  into.router_topk_index = index;
  into.router_topk_weight = weight;
  into.moe_tokens_per_expert = plan.tokens_per_expert;
  into.moe_row_slot = plan.row_slot;
  into.moe_slot_row = plan.slot_row;
  if (exchanges_expert_rows()) into.moe_expert_counts = counts;
  into.moe_permuted = permuted;
  into.moe_act_input = fc1;
  into.moe_permuted_probs = probs;
  if (keep_fc2_input) into.moe_fc2_input = act;
  return out;
}

MoeDispatch TransformerLayer::pair_plan(const MoeDispatch& plan) {
  return {plan.tokens_per_expert, plan.row_slot, plan.slot_row.view({plan.slot_row.numel(), 1})};
}

Tensor TransformerLayer::moe_weighted_act(const char* stage, const Tensor& act_input, const Tensor& probs) {
  const int64_t rows = act_input.dim(0), width = params_.experts_fc2_weight.dim(1);
  Tensor act = be_.empty({rows, width}, opt_.dtype), weighted = be_.empty({rows, width}, opt_.dtype);
  PhaseRange phase(phase_name(stage, "experts_act"), phase_log_);
  activation_fwd(act_input, act);
  be_.moe_weight_rows(act, probs, weighted);
  return weighted;
}

Tensor TransformerLayer::shared_experts_fwd(const CommContext& comm, const Tensor& normed, Tensor* act_input,
                                            Tensor* fc2_input) {
  // The dense MLP's tensor parallelism: fc1 column-parallel from the gathered rows (f | g), fc2
  // row-parallel back to this rank's rows (f̄ | ḡ).
  Tensor fc1 = column_parallel_linear_fwd(comm, "shared_fc1", "moe_input", normed, params_.shared_fc1_weight,
                                          nullptr, nullptr);
  Tensor act = be_.empty({seq_, opt_.dims.b, params_.shared_fc2_weight.dim(1)}, opt_.dtype);
  {
    PhaseRange phase(phase_name(comm.stage.c_str(), "shared_act"), phase_log_);
    activation_fwd(fc1, act);
  }
  if (act_input) *act_input = fc1;
  if (fc2_input) *fc2_input = act;
  return row_parallel_linear_fwd(comm, "shared_fc2", std::move(act), params_.shared_fc2_weight);
}

Tensor TransformerLayer::moe_block_bwd(const CommContext& comm, const Tensor& dy, SavedActivations& saved) {
  Tensor d_out = residual_bwd("mlp_residual", dy, saved.mlp_residual_mask, grads_.fc2_bias);
  // Rebuilt as backward reaches the block's output: the norm (layernorm), then the block
  // (moe) or its pieces (moe_act, shared_experts).
  recompute_norm("ln2", saved.ln2_input, params_.ln2_weight, params_.ln2_bias, saved.moe_input, saved.ln2_mean,
                 saved.ln2_rstd);
  const bool shared = opt_.dims.spec.moe.shared_ffn_hidden > 0;
  if (!saved.router_scores.defined()) (void)moe_routed_fwd("recompute", saved.moe_input, saved, true);
  if (!saved.moe_fc2_input.defined())
    saved.moe_fc2_input = moe_weighted_act("recompute", saved.moe_act_input, saved.moe_permuted_probs);
  if (shared && !saved.shared_act_input.defined())
    (void)shared_experts_fwd(comm_context("recompute"), saved.moe_input, &saved.shared_act_input,
                             &saved.shared_fc2_input);
  Tensor d_normed = be_.empty(dy.shape(), opt_.dtype);
  moe_routed_bwd(as_matrix(d_out), saved, as_matrix(d_normed));
  if (shared) shared_experts_bwd(comm, d_out, saved, d_normed);
  d_out = Tensor();
  saved.moe_input = Tensor();
  return norm2_bwd(d_normed, dy, saved);
}

void TransformerLayer::moe_routed_bwd(const Tensor& d_out, SavedActivations& saved, const Tensor& d_normed) {
  const MoeDispatch plan{saved.moe_tokens_per_expert, saved.moe_row_slot, saved.moe_slot_row};
  const bool ep = exchanges_expert_rows();
  const Tensor counts = ep ? saved.moe_expert_counts : plan.tokens_per_expert;
  const std::vector<int64_t>& per_expert = moe_stats_.tokens_per_expert;
  const int64_t N = std::accumulate(per_expert.begin(), per_expert.end(), int64_t{0});  // the rank's routed rows
  const int64_t T = d_out.dim(0), h = opt_.dims.h;
  const int64_t E = params_.router_weight.dim(0), k = saved.router_topk_weight.dim(1);
  Tensor d_fc2 = be_.empty({N, h}, opt_.dtype);
  {
    PhaseRange phase("bwd.moe_unpermute", phase_log_);
    be_.moe_permute(d_out, plan, d_fc2);  // the combine's: each kept pair's row gets its token's gradient
  }
  if (ep) d_fc2 = to_experts("bwd", d_fc2);
  Tensor d_weighted = be_.empty(saved.moe_fc2_input.shape(), opt_.dtype);
  {
    PhaseRange phase("bwd.experts_fc2", phase_log_);
    be_.grouped_gemm_bwd(d_fc2, saved.moe_fc2_input, params_.experts_fc2_weight, counts, d_weighted,
                         grads_.experts_fc2_weight, local_rows_per_expert());
    d_fc2 = saved.moe_fc2_input = Tensor();
  }
  Tensor d_fc1 = be_.empty(saved.moe_act_input.shape(), opt_.dtype);
  Tensor d_probs = moe_weighted_act_bwd(d_weighted, saved, d_fc1);
  d_weighted = Tensor();
  Tensor d_permuted = be_.empty(saved.moe_permuted.shape(), opt_.dtype);
  {
    PhaseRange phase("bwd.experts_fc1", phase_log_);
    be_.grouped_gemm_bwd(d_fc1, saved.moe_permuted, params_.experts_fc1_weight, counts, d_permuted,
                         grads_.experts_fc1_weight, local_rows_per_expert());
    d_fc1 = saved.moe_permuted = saved.moe_expert_counts = Tensor();
  }
  if (ep) {
    d_permuted = from_experts("bwd", d_permuted);
    d_probs = from_experts("bwd", d_probs);
  }
  Tensor d_weight = be_.empty({T, k}, opt_.dtype);
  {
    PhaseRange phase("bwd.moe_permute", phase_log_);
    be_.moe_permute_bwd(d_permuted, plan, d_normed);  // written: the first contribution
    be_.moe_permute_bwd(d_probs, pair_plan(plan), d_weight.view({T * k, 1}));  // 0 for dropped pairs
    d_permuted = d_probs = saved.router_topk_weight = Tensor();
  }
  PhaseRange phase("bwd.router", phase_log_);
  Tensor d_logits = be_.empty({T, E}, opt_.dtype);
  be_.moe_route_bwd(d_weight, saved.router_scores, saved.router_topk_index, moe_routing(), d_logits);
  be_.gemm(gemm_args(false, false, T, h, E, 1, 1.f, 1.f), d_logits, params_.router_weight, d_normed);
  be_.gemm(gemm_args(true, false, E, h, T), d_logits, as_matrix(saved.moe_input), grads_.router_weight);
  saved.router_scores = saved.router_topk_index = Tensor();
  saved.moe_tokens_per_expert = saved.moe_row_slot = saved.moe_slot_row = Tensor();
}

Tensor TransformerLayer::moe_weighted_act_bwd(const Tensor& d_weighted, SavedActivations& saved, const Tensor& d_fc1) {
  PhaseRange phase("bwd.experts_act", phase_log_);
  const Tensor& fc1 = saved.moe_act_input;
  const int64_t rows = d_weighted.dim(0), width = d_weighted.dim(1);
  // d weight of a row = d weighted . act (the activation again from fc1's output, as
  // Megatron-Core's weighted SwiGLU reads only its inputs); d act = weight x d weighted.
  Tensor d_probs = be_.empty({rows, 1}, opt_.dtype), d_act = be_.empty({rows, width}, opt_.dtype);
  activation_fwd(fc1, d_act);  // the activation again, overwritten in place by its gradient
  be_.moe_weight_rows_bwd(d_weighted, d_act, saved.moe_permuted_probs, d_act, d_probs);
  activation_bwd(d_act, fc1, d_fc1);
  saved.moe_act_input = saved.moe_permuted_probs = Tensor();
  return d_probs;
}

void TransformerLayer::shared_experts_bwd(const CommContext& comm, const Tensor& d_out, SavedActivations& saved,
                                          const Tensor& d_normed) {
  Tensor d_act = row_parallel_linear_bwd(comm, "shared_fc2", d_out, std::move(saved.shared_fc2_input),
                                         params_.shared_fc2_weight, grads_.shared_fc2_weight);  // f̄ | ḡ
  Tensor d_fc1 = be_.empty(saved.shared_act_input.shape(), opt_.dtype);
  {
    PhaseRange phase("bwd.shared_act", phase_log_);
    activation_bwd(d_act, saved.shared_act_input, d_fc1);
    d_act = saved.shared_act_input = Tensor();
  }
  Tensor d_shared = column_parallel_linear_bwd(comm, "shared_fc1", "moe_input", saved.moe_input, std::move(d_fc1),
                                               params_.shared_fc1_weight, grads_.shared_fc1_weight);  // f | g
  PhaseRange phase("bwd.shared_add", phase_log_);
  be_.add_inplace(d_normed, d_shared);
}

}  // namespace actbench
