// Context parallelism's communication: C ranks each hold chunks i and 2C-1-i of the sequence
// (Megatron-Core's load balancing for the causal mask). a2a exchanges sequence rows for heads
// (Ulysses), all_gather collects every rank's keys and values in the sequence's order, p2p
// passes key/value blocks around a ring. Phases are comm.cp.<stage>.<collective>.<what>.
#include <string>
#include <utility>

#include "layers/layer_base.hpp"

namespace actbench {
namespace {

std::string cp_phase(const char* stage, const char* collective, const char* what) {
  return std::string("comm.cp.") + stage + "." + collective + "." + what;
}

// Between the ranks' order and the sequence's: slot r of by_rank [C, O * rows * d] holds rank
// r's rows (its chunks r and 2C-1-r), whole [O, C * rows, d] the sequence in order.
void to_sequence_order(Backend& be, const Tensor& by_rank, const Tensor& whole, int C) {
  const int64_t O = whole.dim(0), rows = whole.dim(1) / C, d = whole.dim(2), chunk = rows / 2;
  for (int r = 0; r < C; ++r) {
    const Tensor from = by_rank.rows(r, r + 1).view({O, rows, d});
    be.copy_rows(from, 0, whole, r * chunk, chunk);
    be.copy_rows(from, chunk, whole, (2 * C - 1 - r) * chunk, chunk);
  }
}
void to_rank_order(Backend& be, const Tensor& whole, const Tensor& by_rank, int C) {
  const int64_t O = whole.dim(0), rows = whole.dim(1) / C, d = whole.dim(2), chunk = rows / 2;
  for (int r = 0; r < C; ++r) {
    const Tensor to = by_rank.rows(r, r + 1).view({O, rows, d});
    be.copy_rows(whole, r * chunk, to, 0, chunk);
    be.copy_rows(whole, (2 * C - 1 - r) * chunk, to, chunk, chunk);
  }
}

}  // namespace

Tensor LayerBase::cp_seq_to_heads(const char* stage, const char* what, const Tensor& x) {
  const int C = cp_size_;
  const int64_t b = x.dim(0), n = x.dim(1), rows = x.dim(2), d = x.dim(3), group = n / C;
  const int64_t slot = group * rows * d;  // one head group of this rank's rows, per batch
  PhaseRange phase(cp_phase(stage, "all_to_all", what), phase_log_);
  // Rank j gets head group j of every batch: slot j of send is [b, group, rows, d].
  Tensor send = be_.empty({C, b * slot}, x.dtype());
  for (int j = 0; j < C; ++j) be_.copy_rows(x.view({b, C, slot}), j, send.rows(j, j + 1).view({b, 1, slot}), 0, 1);
  Tensor recv = be_.empty({C, b * slot}, x.dtype());
  cp_comm_->all_to_all(send, recv);
  send = Tensor();
  // Slot r holds rank r's rows of head group cp_rank: its chunks r and 2C-1-r, to their places.
  Tensor out = be_.empty({b, group, rows * C, d}, x.dtype());
  to_sequence_order(be_, recv, out.view({b * group, rows * C, d}), C);
  return out;
}

Tensor LayerBase::cp_heads_to_seq(const char* stage, const char* what, const Tensor& x) {
  const int C = cp_size_;
  const int64_t b = x.dim(0), group = x.dim(1), s = x.dim(2), d = x.dim(3), rows = s / C;
  const int64_t slot = group * rows * d;
  PhaseRange phase(cp_phase(stage, "all_to_all", what), phase_log_);
  // Rank r gets its own chunks r and 2C-1-r of this head group.
  Tensor send = be_.empty({C, b * slot}, x.dtype());
  to_rank_order(be_, x.view({b * group, s, d}), send, C);
  Tensor recv = be_.empty({C, b * slot}, x.dtype());
  cp_comm_->all_to_all(send, recv);
  send = Tensor();
  // Slot j is head group j of this rank's rows.
  Tensor out = be_.empty({b, group * C, rows, d}, x.dtype());
  for (int j = 0; j < C; ++j) be_.copy_rows(recv.rows(j, j + 1).view({b, 1, slot}), 0, out.view({b, C, slot}), j, 1);
  return out;
}

Tensor LayerBase::cp_gather_sequence(const char* stage, const char* what, const Tensor& x) {
  const int C = cp_size_;
  const int64_t b = x.dim(0), n = x.dim(1), rows = x.dim(2), d = x.dim(3);
  PhaseRange phase(cp_phase(stage, "all_gather", what), phase_log_);
  Tensor gathered = be_.empty({C, x.numel()}, x.dtype());
  cp_comm_->all_gather(x.view({1, x.numel()}), gathered);
  Tensor out = be_.empty({b, n, rows * C, d}, x.dtype());
  to_sequence_order(be_, gathered, out.view({b * n, rows * C, d}), C);
  return out;
}

Tensor LayerBase::cp_scatter_sequence(const char* stage, const char* what, const Tensor& dx) {
  const int C = cp_size_;
  const int64_t b = dx.dim(0), n = dx.dim(1), s = dx.dim(2), d = dx.dim(3), rows = s / C;
  PhaseRange phase(cp_phase(stage, "reduce_scatter", what), phase_log_);
  Tensor send = be_.empty({C, b * n * rows * d}, dx.dtype());
  to_rank_order(be_, dx.view({b * n, s, d}), send, C);
  Tensor out = be_.empty({b, n, rows, d}, dx.dtype());
  Tensor out_rows = out.view({1, out.numel()});
  cp_comm_->reduce_scatter(send, out_rows);
  return out;
}

PendingExchange LayerBase::cp_ring_start(const char* stage, const char* what, const Tensor& send) {
  PhaseRange phase(cp_phase(stage, "send_recv", what), phase_log_);
  Tensor recv = be_.empty(send.shape(), send.dtype());
  const int next = (cp_rank_ + 1) % cp_size_, prev = (cp_rank_ - 1 + cp_size_) % cp_size_;
  return cp_comm_->start_send_recv(send, next, recv, prev);
}

Tensor LayerBase::cp_ring_wait(const char* stage, const char* what, PendingExchange& exchange) {
  PhaseRange phase(cp_phase(stage, "send_recv", what), phase_log_);
  return exchange.wait();
}

void LayerBase::cp_ring_bwd(const QkvHeads& qkv, const Tensor& out, const Tensor& dout, const Tensor& lse,
                            QkvHeads& grads) {
  // Step i holds the key block of rank cp_rank - i with the sum of the gradients the ranks
  // before this one gave it; this rank adds its own and passes both on. After C steps every
  // block's dk, dv has come back to its owner. Each exchange runs while the next attention
  // computes: step i+1's key block travels during step i's attention, the dk, dv sums passed
  // on at step i during step i+1's (they are needed only after it).
  const int64_t b = opt_.dims.b;
  const Shape q_shape = {b * heads_per_rank_, seq_, head_dim_}, kv_shape = {b * kv_heads_per_rank_, seq_, head_dim_};
  const Shape v_shape = {b * kv_heads_per_rank_, seq_, v_head_dim_};
  const Shape out_shape = {b * heads_per_rank_, seq_, v_head_dim_};
  Tensor dq = be_.zeros(qkv.q.shape(), opt_.dtype);
  Tensor dq_part = be_.empty(qkv.q.shape(), opt_.dtype);
  Tensor k = qkv.k, v = qkv.v;
  PendingExchange dk_sum, dv_sum;  // the sums coming to this rank with its current block
  for (int step = 0; step < cp_size_; ++step) {
    const int owner = (cp_rank_ - step + cp_size_) % cp_size_;
    PendingExchange next_k, next_v;
    if (step + 1 < cp_size_) {
      next_k = cp_ring_start("bwd", "k", k);
      next_v = cp_ring_start("bwd", "v", v);
    }
    Tensor dk = be_.empty(k.shape(), opt_.dtype), dv = be_.empty(v.shape(), opt_.dtype);
    const AttentionGeometry g = block_geometry(owner);
    be_.attention_bwd(qkv.q.view(q_shape), k.view(kv_shape), v.view(v_shape), out.view(out_shape),
                      dout.view(out_shape), lse.view({b * heads_per_rank_, seq_}), attention_scale(),
                      attn_dropout_spec(g, true), dq_part.view(q_shape), dk.view(kv_shape), dv.view(v_shape), g.rows);
    be_.add_inplace(dq, dq_part);
    if (step > 0) {  // the sums that came with this block
      be_.add_inplace(dk, cp_ring_wait("bwd", "dk", dk_sum));
      be_.add_inplace(dv, cp_ring_wait("bwd", "dv", dv_sum));
    }
    dk_sum = cp_ring_start("bwd", "dk", dk);
    dv_sum = cp_ring_start("bwd", "dv", dv);
    if (step + 1 < cp_size_) {
      k = cp_ring_wait("bwd", "k", next_k);
      v = cp_ring_wait("bwd", "v", next_v);
    }
  }
  grads.q = std::move(dq);
  grads.k = cp_ring_wait("bwd", "dk", dk_sum);
  grads.v = cp_ring_wait("bwd", "dv", dv_sum);
}

}  // namespace actbench
