#pragma once
// The pre-LayerNorm GPT layer of the paper (Fig. 2/3), tensor- and sequence-parallel,
// with recompute none | selective | full. Written once against Backend and Communicator.
//
//   x1 = x  + dropout(proj(attn(ln1(x))))
//   y  = x1 + dropout(fc2(gelu(fc1(ln2(x1)))))
//
// Activations are [s, b, h] (sequence first); under SP a rank holds s/t rows of x, x1, y.
#include <cstdint>

#include "kernels/backend.hpp"
#include "layers/config.hpp"
#include "layers/layer.hpp"
#include "layers/parallel.hpp"
#include "layers/params.hpp"
#include "layers/saved_activations.hpp"
#include "runtime/communicator.hpp"
#include "runtime/timing.hpp"

namespace actbench {

class TransformerLayer final : public Layer {
 public:
  // Allocates parameters and gradients (uninitialised: call init_parameters()).
  TransformerLayer(Backend& be, Communicator& comm, LayerOptions opt);

  // Parameters from the seed, canonical layout then sharded (so any t gets the same layer).
  void init_parameters() override;

  // x: [s_local, b, h] with s_local = s/t under SP, else s. Keeps what the policy says in
  // saved(); returns y, the same shape as x.
  Tensor forward(const Tensor& x) override;
  // dy: like y. Recomputes what the policy did not keep, writes grads(), releases saved(),
  // returns dx.
  Tensor backward(const Tensor& dy) override;

  const SavedActivations& saved() const override { return saved_; }
  LayerParams& params() override { return params_; }
  LayerParams& grads() override { return grads_; }
  const LayerOptions& options() const { return opt_; }
  int64_t local_seq() const { return opt_.policy.sequence_parallel ? opt_.dims.s / t_ : opt_.dims.s; }
  void set_phase_log(PhaseLog* log) override { log_ = log; }

 private:
  enum class Keep { input_only, all_but_core_attn, all };
  Tensor forward_impl(const Tensor& x, SavedActivations& save, Keep keep, const char* stage);
  // Scores, causal softmax, dropout; probs and mask may be kept for backward.
  void core_attention_probs(const Tensor& q, const Tensor& k, Tensor& probs, Tensor& mask, Tensor& probs_dropped);
  DropoutSpec attn_dropout_spec() const;
  DropoutSpec residual_dropout_spec(uint32_t site) const;
  CommContext comm_ctx(const char* stage) const;

  Backend& be_;
  Communicator& comm_;
  LayerOptions opt_;
  int t_, rank_;
  int64_t hl_, al_, d_;  // hidden, heads per rank; head size
  LayerParams params_, grads_;
  SavedActivations saved_;
  PhaseLog* log_ = nullptr;
};

}  // namespace actbench
