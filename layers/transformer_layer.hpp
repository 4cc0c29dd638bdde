#pragma once
// The dense pre-norm transformer layer of Megatron-Core, composed from its spec (LayerSpec:
// LayerNorm | RMSNorm, optional q/k norms, GeLU | SwiGLU | squared ReLU, biases on all linears
// or the QKV alone, grouped-query attention, RoPE on a share of each head, attention and
// hidden dropout), tensor- and sequence-parallel, with recompute none | selective (any set of
// core_attn, mlp, layernorm) | full. The paper's layer and the llama family are two presets.
//
//   x1 = x  + hidden_dropout(proj(attn(rope(qn(q)), rope(kn(k)), v)) + b_proj),  [q; k; v] = qkv(norm1(x))
//   y  = x1 + hidden_dropout(fc2(act(fc1(norm2(x1)))) + b_fc2)
//
// Activations are [s, b, h] (sequence first); under SP a rank holds s/t rows of x, x1, y.
// What each piece keeps for backward, and which recompute module frees it, is the table in
// theory/layer_pieces.hpp; the layer keeps exactly that (tests hold the two equal).
#include <cstdint>

#include "layers/layer_base.hpp"

namespace actbench {

struct MlaLatentSlots;  // one latent's names and slots (mla_attention.cpp)

class TransformerLayer final : public LayerBase {
 public:
  // Allocates parameters and gradients (uninitialised: call init_parameters()).
  TransformerLayer(Backend& be, Communicator& comm, LayerOptions opt, Communicator* cp = nullptr,
                   Communicator* ep = nullptr);

  // dy: like y. Recomputes what the policy did not keep, writes grads(), releases saved(),
  // returns dx.
  Tensor backward(const Tensor& dy) override;
  const MoeRoutingStats* moe_stats() const override { return opt_.dims.spec.moe.enabled() ? &moe_stats_ : nullptr; }

 private:
  Tensor forward_impl(const Tensor& x, SavedActivations& save, Keep keep, const char* stage) override;
  Tensor attention_block_fwd(const CommContext& comm, const Tensor& x, SavedActivations& save, Keep keep);
  Tensor mlp_block_fwd(const CommContext& comm, const Tensor& x1, SavedActivations& save, Keep keep);
  // fc1 (f | g) and the activation: fc2's input, what the mlp module rebuilds from fc1's
  // input (kept as *keep_input when given); the activation's input goes to *act_input when given.
  Tensor mlp_activation_fwd(const CommContext& comm, Tensor normed, Tensor* keep_input, Tensor* act_input);
  // The end of both blocks: residual + hidden_dropout(out + bias) (bias when the spec has
  // it); the mask goes to *kept_mask under dropout. out is released.
  Tensor residual_fwd(const char* stage, const char* op, Tensor out, const Tensor& bias, const Tensor& residual,
                      uint32_t site, Tensor* kept_mask);
  // Its backward: the gradient of out (dy itself without dropout) and the bias's gradient.
  Tensor residual_bwd(const char* op, const Tensor& dy, Tensor& mask, const Tensor& dbias);
  DropoutSpec residual_dropout_spec(uint32_t site, const SeqPositions::Run& run) const;

  Tensor mlp_block_bwd(const CommContext& comm, const Tensor& dy, SavedActivations& saved);
  // The end of the MLP's (or MoE block's) backward: norm 2's, from the gradient of its output,
  // plus the residual dy; releases norm 2's kept input and statistics. Phase "bwd.ln2".
  Tensor norm2_bwd(const Tensor& d_normed, const Tensor& dy, SavedActivations& saved);
  Tensor attention_block_bwd(const CommContext& comm, const Tensor& dx1, SavedActivations& saved);
  // The end of both attention blocks' backward: norm 1's, from the gradient of its output, plus
  // the residual dx1. Phase "bwd.ln1".
  Tensor norm1_bwd(const Tensor& d_normed, const Tensor& dx1, SavedActivations& saved);
  // The layernorm module's recompute: a block norm's output (and statistics) from its kept input.
  void recompute_norm(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& output,
                      Tensor& mean, Tensor& rstd);
  // The mlp module's recompute: the activation's input and fc2's input from fc1's input.
  void recompute_mlp(SavedActivations& saved);

  // The spec's activation on fc1's output (SwiGLU: gate | up), and its backward.
  void activation_fwd(const Tensor& fc1_out, const Tensor& act);
  void activation_bwd(const Tensor& d_act, const Tensor& fc1_out, const Tensor& d_fc1_out);

  // ---- multi-latent attention in place of the QKV projection (mla_attention.cpp, docs/theory.md) ----
  // The latents on the norm region's rows [s(/t), b, ·]: q's (undefined when L_q = 0), kv's,
  // and k's RoPE part before rotation, gathered to all s rows (f | g). Backward: their gradients
  // (q: norm 1's output's share when L_q = 0), k's RoPE part on this rank's rows.
  struct MlaLatents {
    Tensor q, kv, k_pos_emb;
  };
  Tensor mla_attention_block_fwd(const CommContext& comm, const Tensor& x, SavedActivations& save, Keep keep);
  Tensor mla_attention_block_bwd(const CommContext& comm, const Tensor& dx1, SavedActivations& saved);
  MlaLatents mla_down_fwd(const CommContext& comm, const Tensor& normed);
  // The latent norms, the up projections (q's projection from normed when L_q = 0) and RoPE:
  // core attention's q, k, v. The norms' statistics and outputs go to *keep when given.
  QkvHeads mla_up_fwd(const CommContext& comm, const MlaLatents& latents, const Tensor& normed, SavedActivations* keep);
  // The mla_up_proj module's recompute: q, k, v (and what the up projections' backward reads)
  // from the kept latents and k's RoPE part.
  void recompute_mla_up(SavedActivations& saved);
  MlaLatents mla_up_bwd(const CommContext& comm, SavedActivations& saved, QkvHeads& d_heads);
  // d normed from the latents' gradients; writes the down projections' weight gradients.
  Tensor mla_down_bwd(SavedActivations& saved, const MlaLatents& d_latents);
  // Head layouts: q heads [b, a/t, s, d_qk] of q's projection output [s, b, a/t·d_qk] (RoPE on
  // each head's last d_r columns); k and v heads of the kv up projection's output [s, b,
  // a/t·(d_n + d_v)] and k's rotated RoPE part [b, 1, s, d_r], shared by the heads. And back.
  Tensor mla_q_heads(const Tensor& q_out);
  void mla_kv_heads(const Tensor& kv_out, const Tensor& k_rope, QkvHeads& heads);
  Tensor mla_q_heads_bwd(Tensor dq);
  // d kv_out and the gradient of k's RoPE part before rotation [s, b, d_r] (this rank's heads').
  void mla_kv_heads_bwd(QkvHeads& d_heads, Tensor& d_kv_out, Tensor& d_k_pos_emb);
  // RoPE (inverse: its backward) on the last d_r columns of each row of x [b, a/t, s, d_qk].
  void mla_rope_columns(const Tensor& x, bool inverse);
  // One latent (q's or kv's, mla_attention.cpp's slots): its norm and column-parallel up
  // projection, the norm's statistics and output kept into *keep when given; and their
  // backward, the gradient of the latent (releasing what they kept).
  Tensor latent_up_fwd(const CommContext& comm, const MlaLatentSlots& l, const Tensor& latent,
                       SavedActivations* keep);
  Tensor latent_up_bwd(const CommContext& comm, const MlaLatentSlots& l, Tensor d_out, SavedActivations& saved);
  // Norm 1 of either attention block (phase stage.ln1): its output; its input kept, and its
  // statistics unless the layernorm module runs it outside autograd.
  Tensor norm1_fwd(const char* stage, const Tensor& x, SavedActivations& save, Keep keep);

  // ---- the MoE block in place of the MLP (moe_block.cpp, docs/moe.md) ----
  Tensor moe_block_fwd(const CommContext& comm, const Tensor& x1, SavedActivations& save, Keep keep);
  Tensor moe_block_bwd(const CommContext& comm, const Tensor& dy, SavedActivations& saved);
  // Router, routing, dispatch, permute, the experts and the combine of normed [s, b, h]: the
  // routed output [s, b, h]. What backward reads goes to `into` (fc2's input only when
  // keep_fc2_input); phases stage.router .. stage.moe_unpermute.
  Tensor moe_routed_fwd(const char* stage, const Tensor& normed, SavedActivations& into, bool keep_fc2_input);
  // The experts' activation on their fc1 output, each row times its routing weight
  // (probs [rows, 1]): fc2's input (the moe_act module's recompute too). Megatron-Core (from
  // 0.13) weights the activation so that the combine is a plain sum that keeps nothing.
  Tensor moe_weighted_act(const char* stage, const Tensor& act_input, const Tensor& probs);
  // Its backward from d fc2's input: d fc1 written, d probs [rows, 1] returned; releases the
  // fc1 output and the weights it read.
  Tensor moe_weighted_act_bwd(const Tensor& d_weighted, SavedActivations& saved, const Tensor& d_fc1);
  // The dispatch plan over (token, choice) pairs: the T·k pairs as T·k tokens of one choice,
  // so moe_permute gathers the kept pairs' weights [T·k, 1] into plan order and moe_permute_bwd
  // scatters their gradients back (0 for dropped pairs).
  static MoeDispatch pair_plan(const MoeDispatch& plan);
  // The shared experts on normed [s(/t), b, h], split over t like the MLP: their output (this
  // rank's rows); fc1's output and fc2's input go to *act_input, *fc2_input when given.
  Tensor shared_experts_fwd(const CommContext& comm, const Tensor& normed, Tensor* act_input, Tensor* fc2_input);
  // Backward of the routed experts and the router, adding d normed into d_normed.
  void moe_routed_bwd(const Tensor& d_out, SavedActivations& saved, const Tensor& d_normed);
  void shared_experts_bwd(const CommContext& comm, const Tensor& d_out, SavedActivations& saved,
                          const Tensor& d_normed);
  // The routed rows N of the plan just made: read from the device, or (meta) the histogram
  // LayerOptions gives or balanced routing. Records the routing statistics.
  int64_t routed_rows(const MoeDispatch& plan, const Tensor& aux_loss);
  MoeRouting moe_routing() const;

  // ---- expert and expert tensor parallelism (moe_block.cpp): rows to their experts and back ----
  // Who sends what to whom in one stage of this forward's exchange (every rank's rows per
  // expert), over the expert-parallel group (each rank E/ep whole experts: its rows go to one
  // rank) or, replicated, over the tensor-parallel group (each rank a slice of every expert: its
  // rows go to every rank, and the experts' outputs come back as partial sums). Expert and
  // expert tensor parallelism together run both, in that order (Megatron-Core's all-to-all
  // dispatcher: the all-to-all over EP, then the gather over the expert-TP group).
  struct ExpertExchange {
    Communicator* group = nullptr;
    int ranks = 1, me = 0;
    bool replicated = false;
    std::vector<int64_t> counts;       // [ranks, E]: rank i's routed rows for expert e
    int64_t experts = 0;               // E
    int64_t local = 0;                 // experts on each rank: E/ep, or E replicated
    std::vector<int64_t> expert_rows;  // this rank's experts' rows, from all ranks
    std::vector<int64_t> send_rows;    // [ranks]: the rows this rank routed to rank j's experts
    std::vector<int64_t> recv_rows;    // [ranks]: the rows rank j routed to this rank's experts
    int64_t count(int from, int64_t e) const { return counts[static_cast<size_t>(from * experts + e)]; }
    int64_t own_rows() const;  // the rows this rank brings to the stage
    int64_t first_expert(int rank) const { return replicated ? 0 : rank * local; }
    int64_t block_rows(int from, int to) const;                     // what `from` sends `to`
    int64_t rows_before(int from, int64_t e) const;                 // in that block, before expert e's
    int64_t block_start(int from, int to) const;  // on `to`, the first row of the block from `from`
  };
  bool exchanges_expert_rows() const { return ep_size_ > 1 || (opt_.expert_tensor_parallel && tp_size_ > 1); }
  void plan_expert_exchange(const char* stage);
  // One stage over `group` for the rows this rank brings, per expert of the stage; returns the
  // rows its experts receive, per local expert (the next stage's, or the grouped GEMMs').
  std::vector<int64_t> plan_exchange_stage(const char* stage, Communicator* group, bool replicated,
                                           const std::vector<int64_t>& mine);
  Tensor to_experts(const char* stage, Tensor rows);    // through every stage
  Tensor from_experts(const char* stage, Tensor rows);  // back through every stage
  Tensor stage_to_experts(const char* stage, const ExpertExchange& x, const Tensor& rows);
  Tensor stage_from_experts(const char* stage, const ExpertExchange& x, const Tensor& rows);
  // One all_to_all_v of a stage's group (phase comm.<stage>.all_to_all.moe_tokens).
  void exchange(const char* stage, const ExpertExchange& x, const Tensor& send, const std::vector<int64_t>& send_rows,
                const Tensor& recv, const std::vector<int64_t>& recv_rows);
  void copy_matrix_rows(const Tensor& src, int64_t src_row, const Tensor& dst, int64_t dst_row, int64_t rows);
  Tensor local_expert_counts();
  // The rows of each of this rank's experts in this forward, on the host (the grouped GEMMs'
  // shapes, read once after the dispatch): the routed histogram, or the exchange's last stage.
  const std::vector<int64_t>& local_rows_per_expert() const;

  int64_t ffn_per_rank_;  // F/t, the MLP width on this rank
  MoeRoutingStats moe_stats_;
  std::vector<ExpertExchange> expert_exchanges_;  // this forward's stages, in dispatch order
};

}  // namespace actbench
