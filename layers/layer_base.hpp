#pragma once
// The blocks the composed layer (transformer_layer.hpp) is built from, each written once:
// the tensor-parallel group and the sequence-parallel communication context, the parameters
// (allocated and initialised from the spec's table), the recompute policy (what forward keeps,
// the full-recompute forward that backward runs first), the norms of the spec's kind, the
// parallel linears, and attention (the QKV GEMM, the q/k norms and RoPE on the heads, core
// attention forward and backward; core_attention.cpp).
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "layers/config.hpp"
#include "layers/layer.hpp"
#include "layers/parallel.hpp"
#include "layers/params.hpp"
#include "layers/saved_activations.hpp"
#include "runtime/communicator.hpp"
#include "runtime/timing.hpp"

namespace actbench {

class LayerBase : public Layer {
 public:
  // Parameters from the seed, canonical layout then sharded (so any t gets the same layer).
  void init_parameters() override;
  // Runs forward_impl keeping what the recompute policy says: none all, selective all but
  // what its modules rebuild, full only the layer input (saved().layer_input).
  Tensor forward(const Tensor& x) final;
  Tensor recompute_forward(const Tensor& x) final;

  const SavedActivations& saved() const override { return saved_; }
  void drop_saved() override { saved_.clear(); }
  LayerParams& params() override { return params_; }
  LayerParams& grads() override { return grads_; }
  void set_phase_log(PhaseLog* log) override { phase_log_ = log; }
  const LayerOptions& options() const { return opt_; }
  // Rows of x, x1 and y on this rank: the context-parallel rank's s/C (two chunks of the
  // sequence), split t ways under SP.
  int64_t local_seq() const { return opt_.policy.sequence_parallel ? seq_ / tp_size_ : seq_; }
  // Where those rows sit in the whole sequence.
  SeqPositions local_positions() const {
    return seq_positions_.from(opt_.policy.sequence_parallel ? tp_rank_ * local_seq() : 0);
  }

 protected:
  // What one forward keeps for backward (theory/layer_pieces.hpp's table, piece by piece).
  struct Keep {
    bool any = true;           // false: full recompute's first forward, which keeps only its input
    bool core_attn = true;     // the probabilities, dropout mask and dropped probabilities, or the lse
    bool norm_outputs = true;  // both block norms' outputs and statistics (the layernorm module)
    bool mlp = true;           // the activation's input and fc2's input (the mlp module)
    bool moe = true;           // the MoE block's routing, plan and experts' tensors (the moe module)
    bool moe_act = true;       // the experts' activation output (the moe_act module)
    bool shared_experts = true;  // the shared experts' activation input and output
    bool mla_up_proj = true;     // MLA's latent norms' outputs and statistics, q, k and v (the mla_up_proj module)
    static Keep all() { return {}; }
    static Keep input_only() { return {false, false, false, false, false, false, false, false}; }
    // Selective recompute: all but what the modules rebuild in backward.
    static Keep all_but(RecomputeModules m) {
      return {true, !m.core_attn, !m.layernorm, !m.mlp, !m.moe, !m.moe_act, !m.shared_experts, !m.mla_up_proj};
    }
  };

  // Validates the shape against the TP group (and the context-parallel group cp, when given)
  // and allocates the spec's parameters (uninitialised) and zeroed gradients.
  // ep: the expert-parallel group of an MoE layer (null: every expert on this rank).
  LayerBase(Backend& be, Communicator& comm, LayerOptions opt, Communicator* cp, Communicator* ep);

  // x: [s_local, b, h] (checked by forward). Stores into `save` what `keep` says; phases are
  // named stage.op ("fwd" or "recompute").
  virtual Tensor forward_impl(const Tensor& x, SavedActivations& save, Keep keep, const char* stage) = 0;

  // forward and recompute_forward: the policy's keep, phases named stage.op.
  Tensor forward_as(const Tensor& x, const char* stage);

  // The start of every backward: checks dy, takes saved() (leaving it empty) and, under full
  // recompute, runs the forward again from the kept input (phases "recompute.*", output
  // discarded) so that the result holds everything.
  SavedActivations take_saved_for_backward(const Tensor& dy);
  // The end of every backward: the gradients of replicated parameters that each rank holds
  // only part of (ParamInfo::grad_sum) are summed over the group: under SP those applied to
  // s/t rows (block norms, row-parallel biases), always the q/k norms' (each rank's heads).
  void all_reduce_partial_grads();

  // ---- norms of the spec's kind (LayerNorm or RMSNorm) over the last dim ----
  // x [.., width] as rows; y like x. Statistics go to *mean, *rstd when given (RMSNorm has
  // no mean; backward reads them). bias is undefined for RMSNorm.
  void norm_fwd(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y, Tensor* mean,
                Tensor* rstd);
  // dx like x; dweight (and dbias) written.
  void norm_bwd(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                const Tensor& dx, const Tensor& dweight, const Tensor& dbias);
  // The norm of a block input x [s(/t), b, h] (phase stage.op): its output, with the
  // statistics into *mean, *rstd when given.
  Tensor block_norm_fwd(const char* stage, const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias,
                        Tensor* mean, Tensor* rstd);

  CommContext comm_context(const char* stage) const;

  // Megatron's parallel linears, y = x W^T (+ bias) with W this rank's shard (gpt adds its
  // row-parallel biases itself, with dropout and the residual). Activations are
  // [s, b, width]; phases are comm.stage + "." + op.
  // A tensor passed by value is released where the layer no longer needs it: pass it with
  // std::move on its last use, a copy to keep it.
  //
  // Column-parallel forward: x [s(/t), b, in] (kept in *keep_input when given: its sequence
  // shard under SP) through f | g, x released, then x W^T (+ bias) [s, b, out] (phase op).
  Tensor column_parallel_linear_fwd(const CommContext& comm, const char* op, const char* region, Tensor x,
                                    const Tensor& weight, const Tensor* bias, Tensor* keep_input);
  // Row-parallel forward: partial sums of x [s, b, in] with W [out, in] (phase op), x
  // released, then f̄ | ḡ: the reduced output [s(/t), b, out].
  Tensor row_parallel_linear_fwd(const CommContext& comm, const char* op, Tensor x, const Tensor& weight);
  // Row-parallel backward: dy [s(/t), b, out] through f̄ | ḡ (dy released), then dx
  // [s, b, in] and dW += from x, the kept input (released at the end of the phase).
  Tensor row_parallel_linear_bwd(const CommContext& comm, const char* op, Tensor dy, Tensor x, const Tensor& weight,
                                 Tensor& dweight);
  // Column-parallel backward: x, the kept input (its sequence shard under SP, gathered
  // again through region `region` and then released), dy [s, b, out] (released after the
  // phase). Phase op: dbias (when given), dW, the partial dx; then f | g: dx [s(/t), b, in].
  Tensor column_parallel_linear_bwd(const CommContext& comm, const char* op, const char* region, Tensor x, Tensor dy,
                                    const Tensor& weight, Tensor& dweight, Tensor* dbias = nullptr);

  // ---- attention (core_attention.cpp) ----
  // q [b, heads_per_rank_, s, d]; k, v [b, kv_heads_per_rank_, s, d] with d = head_dim_.
  // Under grouped-query attention the heads_per_rank_ / kv_heads_per_rank_ query heads of a
  // group are consecutive and share one key/value head.
  struct QkvHeads {
    Tensor q, k, v;
  };
  // The qkv GEMM after the norm: normed [s(/t), b, h] (released at the end; kept as
  // save.qkv_input when keep_input) through f | g, then x W^T (+ bias) split into heads.
  // Phase "stage.qkv".
  QkvHeads qkv_projection_fwd(const CommContext& comm, Tensor normed, const Tensor* bias, bool keep_input,
                              SavedActivations& save);
  // What the spec does to the heads of q and k before core attention: the q/k norms
  // (--qk-layernorm; kept inputs and statistics when keep) then RoPE on the first
  // rotary_dim() dimensions. Phases "stage.qk_norm", "stage.rope".
  bool has_head_transforms() const;
  void head_transforms_fwd(const char* stage, QkvHeads& qkv, SavedActivations& save, bool keep);
  // Their backward on dq, dk (replaced by the gradients of the QKV GEMM's heads); releases
  // the kept norm inputs and statistics. Phases "bwd.rope", "bwd.qk_norm".
  void head_transforms_bwd(SavedActivations& saved, QkvHeads& grads);
  // Causal softmax(q k^T / sqrt(d)), attention dropout when the spec has it, times v: the
  // context [s, b, heads_per_rank_ * d], heads merged (phase "stage.core_attn"). Unfused, the
  // probabilities are materialised; fused (FlashAttention-style) only a per-row log-sum-exp
  // is kept; either only under keep.core_attn (else backward recomputes them). Keeps q, k, v
  // and the context under keep.any; releases qkv.
  Tensor core_attention_fwd(const char* stage, QkvHeads qkv, SavedActivations& save, Keep keep);
  // d_context like the context (released). Writes dq, dk, dv into grads, tensors the caller
  // allocated. Takes what forward kept from saved (recomputing the probabilities, or the
  // fused kernel's output and lse, first when selective did not keep them: phase
  // "recompute.core_attn"). Phase "bwd.core_attn".
  void core_attention_bwd(SavedActivations& saved, Tensor d_context, QkvHeads& grads);
  // The same, but merges dq, dk, dv into their columns of d_qkv [s, b, qkv_width()], each as
  // soon as it is complete, and releases it: fewer gradients are held at once.
  void core_attention_bwd(SavedActivations& saved, Tensor d_context, const Tensor& d_qkv);
  // Columns of the qkv GEMM's output where the heads of q, k or v start.
  int64_t q_column() const { return 0; }
  int64_t k_column() const { return heads_per_rank_ * head_dim_; }
  int64_t v_column() const { return (heads_per_rank_ + kv_heads_per_rank_) * head_dim_; }
  int64_t qkv_width() const { return (heads_per_rank_ + 2 * kv_heads_per_rank_) * head_dim_; }
  // Phase name "stage.op".
  static std::string phase_name(const char* stage, const char* op) { return std::string(stage) + "." + op; }
  // Rows of an [s, b, w] tensor as a matrix [s*b, w].
  static Tensor as_matrix(const Tensor& t) { return t.view({t.numel() / t.dim(-1), t.dim(-1)}); }

  Backend& be_;
  Communicator& comm_;
  LayerOptions opt_;
  int tp_size_, tp_rank_;  // the tensor-parallel group: its size (the paper's t) and this rank
  Communicator* cp_comm_;  // the context-parallel group (null: C = 1)
  int cp_size_, cp_rank_;  // its size C and this rank
  Communicator* ep_comm_;  // the expert-parallel group (null: ep = 1)
  int ep_size_, ep_rank_;
  // The experts split over the tensor-parallel group itself (ep = t): its ranks share one
  // micro-batch. Otherwise the expert-parallel group is ep/(t·C) data-parallel replicas of the
  // t x C grid (Megatron-Core's order: EP rank r is TP rank r % t, CP rank (r / t) % C of
  // replica r / (t·C)), each replica its own micro-batch: batches [dp_rank·b, (dp_rank+1)·b) of
  // the canonical ep/(t·C)·b.
  bool experts_over_tp() const { return ep_size_ > 1 && ep_comm_ == &comm_; }
  // With expert tensor parallelism (etp = t) the expert-parallel group is this TP rank's peers
  // instead, C of each of ep/C replicas (Megatron-Core's expert order: etp ranks, then ep).
  int dp_size_ = 1, dp_rank_ = 0;  // those replicas (1, 0: none)
  int64_t seq_;            // s/C: the rows of the sequence this TP group works on
  SeqPositions seq_positions_;  // where they sit: chunks cp_rank and 2C-1-cp_rank of 2C
  int64_t heads_per_rank_, head_dim_;  // query heads on this rank (a/t); d (LayerDims::head_dim)
  int64_t v_head_dim_;                 // v's and the attention output's (LayerDims::v_head_dim)
  int64_t kv_heads_per_rank_;
  float attention_dropout_, hidden_dropout_, norm_eps_;  // the spec's, as the kernels take them
  std::vector<ParamInfo> table_;
  LayerParams params_, grads_;
  SavedActivations saved_;
  PhaseLog* phase_log_ = nullptr;

 private:
  void check_activation_shape(const Tensor& t, const char* what) const;
  // Where this rank's part of a parameter lies: its shape, its shard, and where that shard's
  // canonical tensor starts in the parameter's (the expert-parallel block of split experts).
  struct LocalShard {
    Shape shape;
    ShardSpec spec;
    int64_t offset;
  };
  LocalShard local_shard(const ParamInfo& p) const;

  // Core attention as this rank runs it: without context parallelism its a/t heads over the
  // s rows; under CP as its comm type arranges it (a2a: a/(tC) heads over all s rows in the
  // sequence's order; all_gather: its s/C query rows against all s keys; p2p: its query rows
  // against one rank's key block at a time).
  struct AttentionGeometry {
    int64_t heads, kv_heads;  // query and key/value heads
    int64_t q_rows, k_rows;   // sequence rows of q and of k, v
    int64_t head_offset;      // the first query head among the model's a (the dropout index)
    AttentionRows rows;       // where the q and k rows sit (default: the square s x s)
  };
  AttentionGeometry attention_geometry() const;
  AttentionGeometry block_geometry(int owner) const;  // p2p: the key block of CP rank `owner`
  bool cp() const { return cp_size_ > 1; }
  bool cp_is(CpCommType t) const { return cp() && opt_.policy.cp_comm == t; }
  SeqPositions cp_rank_positions(int rank) const;  // the rows of CP rank `rank`

  // The unfused path's attention weights [b, heads, q_rows, k_rows]: the causal softmax of the
  // scaled scores and, under attention dropout, its mask and the dropped probabilities.
  struct AttentionWeights {
    Tensor probs, mask, dropped;
    const Tensor& times_v() const { return dropped.defined() ? dropped : probs; }  // what multiplies v
  };
  AttentionWeights attention_weights(const AttentionGeometry& g, const Tensor& q, const Tensor& k);
  // Fused forward of the geometry's q against k, v: the output in head layout and the lse.
  void fused_fwd(const AttentionGeometry& g, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                 const Tensor& lse);
  // The whole fused forward of this rank (the ring under p2p, the gathered keys under all_gather).
  void fused_attention(const char* stage, const QkvHeads& qkv, const Tensor& out, const Tensor& lse);

  // ---- context parallelism's communication (context_parallel.cpp); phases comm.cp.* ----
  // a2a: x [b, n, s/C, d] in this rank's row order -> [b, n/C, s, d]: head group cp_rank of
  // every rank's rows, in the sequence's order. And back.
  Tensor cp_seq_to_heads(const char* stage, const char* what, const Tensor& x);
  Tensor cp_heads_to_seq(const char* stage, const char* what, const Tensor& x);
  // all_gather: x [b, n, s/C, d] -> every rank's rows [b, n, s, d] in the sequence's order;
  // and the reduce-scatter of a gradient of those back to this rank's rows, summed.
  Tensor cp_gather_sequence(const char* stage, const char* what, const Tensor& x);
  Tensor cp_scatter_sequence(const char* stage, const char* what, const Tensor& dx);
  // p2p: one ring step, started: this rank's `send` to the next CP rank, the previous rank's
  // into a new tensor, which cp_ring_wait returns once the exchange has completed (on cuda:
  // for the kernels enqueued after it). Both in the step's comm.cp phase.
  PendingExchange cp_ring_start(const char* stage, const char* what, const Tensor& send);
  Tensor cp_ring_wait(const char* stage, const char* what, PendingExchange& exchange);
  // The fused backward under p2p: dq of this rank's rows, dk and dv of its own key block.
  void cp_ring_bwd(const QkvHeads& qkv, const Tensor& out, const Tensor& dout, const Tensor& lse, QkvHeads& grads);
  // Both core_attention_bwd: merge_into is d_qkv or null (grads then hold the caller's tensors).
  void attention_bwd(SavedActivations& saved, Tensor d_context, QkvHeads& grads, const Tensor* merge_into);
  void fused_attention_bwd(SavedActivations& saved, Tensor d_context, QkvHeads& grads, const Tensor* merge_into);
  // One of the q/k norms on x [b, heads, s, d] as rows of d: its output; x and the statistics
  // kept into *input, *mean, *rstd when given.
  Tensor head_norm_fwd(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor* input, Tensor* mean,
                       Tensor* rstd);
  // Its backward: the gradient of its input (dy released); accumulates nothing, writes dweight.
  Tensor head_norm_bwd(Tensor dy, const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                       const Tensor& dweight, const Tensor& dbias);
  void unfused_attention_bwd(SavedActivations& saved, Tensor d_context, QkvHeads& grads, const Tensor* merge_into);
  // The dropout of the probabilities in the geometry's index space (its heads' rows of the
  // canonical [b, a, s, s]; fused: the whole s x s of its heads), p = the spec's attention dropout.
  DropoutSpec attn_dropout_spec(const AttentionGeometry& g, bool fused) const;
  float attention_scale() const;
  // A batched GEMM with one batch per key/value head of the geometry: its query heads'
  // rows are consecutive, so k and v are never repeated (m counts all of them).
  GemmArgs per_kv_head(const AttentionGeometry& g, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                       float alpha = 1.f) const;
  // A gradient of core attention's backward: allocated here unless the caller gave one, and
  // merged into merge_into at `column` and released once done, when merge_into is set. Each
  // head `width` wide (0: head_dim_).
  Tensor& grad_buffer(Tensor& grad, int64_t heads, int64_t rows, int64_t width = 0);
  void grad_done(Tensor& grad, const Tensor* merge_into, int64_t column);
};

}  // namespace actbench
