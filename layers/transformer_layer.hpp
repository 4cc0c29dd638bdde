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
  // The layernorm module's recompute: a block norm's output (and statistics) from its kept input.
  void recompute_norm(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& output,
                      Tensor& mean, Tensor& rstd);
  // The mlp module's recompute: the activation's input and fc2's input from fc1's input.
  void recompute_mlp(SavedActivations& saved);

  // The spec's activation on fc1's output (SwiGLU: gate | up), and its backward.
  void activation_fwd(const Tensor& fc1_out, const Tensor& act);
  void activation_bwd(const Tensor& d_act, const Tensor& fc1_out, const Tensor& d_fc1_out);

  // ---- the MoE block in place of the MLP (moe_block.cpp, docs/moe.md) ----
  Tensor moe_block_fwd(const CommContext& comm, const Tensor& x1, SavedActivations& save, Keep keep);
  Tensor moe_block_bwd(const CommContext& comm, const Tensor& dy, SavedActivations& saved);
  // Router, routing, dispatch, permute, the experts and the combine of normed [s, b, h]: the
  // routed output [s, b, h]. What backward reads goes to `into` (fc2's input only when
  // keep_fc2_input); phases stage.router .. stage.moe_unpermute.
  Tensor moe_routed_fwd(const char* stage, const Tensor& normed, SavedActivations& into, bool keep_fc2_input);
  // The experts' activation on their fc1 output: fc2's input (the moe_act module's recompute too).
  Tensor moe_experts_act(const char* stage, const Tensor& act_input);
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

  // ---- expert parallelism (moe_block.cpp): the routed rows to their experts' ranks and back ----
  // Who sends what to whom in this forward's exchange (every rank's routed rows per expert).
  struct ExpertExchange {
    std::vector<int64_t> counts;       // [ep, E]: rank i's routed rows for expert e
    int64_t experts = 0;               // E
    std::vector<int64_t> expert_rows;  // this rank's experts' rows, from all ranks
    std::vector<int64_t> send_rows;    // [ep]: the rows this rank routed to rank j's experts
    std::vector<int64_t> recv_rows;    // [ep]: the rows rank j routed to this rank's experts
    int64_t count(int from, int64_t e) const { return counts[static_cast<size_t>(from * experts + e)]; }
    int64_t block_rows(int from, int to, int ranks) const;        // what `from` sends `to`
    int64_t rows_before(int from, int64_t e, int64_t local) const;  // in that block, before expert e's
    int64_t block_start(int from, int to) const;  // on `to`, the first row of the block from `from`
  };
  void plan_expert_exchange(const char* stage);
  Tensor to_experts(const char* stage, const Tensor& rows);
  Tensor from_experts(const char* stage, const Tensor& rows, int64_t routed);
  // One all_to_all_v of the expert-parallel group (phase comm.<stage>.all_to_all.moe_tokens).
  void exchange(const char* stage, const Tensor& send, const std::vector<int64_t>& send_rows, const Tensor& recv,
                const std::vector<int64_t>& recv_rows);
  void copy_matrix_rows(const Tensor& src, int64_t src_row, const Tensor& dst, int64_t dst_row, int64_t rows);
  Tensor local_expert_counts();

  int64_t ffn_per_rank_;  // F/t, the MLP width on this rank
  MoeRoutingStats moe_stats_;
  ExpertExchange expert_exchange_;
};

}  // namespace actbench
