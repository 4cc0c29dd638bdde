#pragma once
// The llama family (--arch llama): today's dense decoder layer, tensor- and sequence-parallel,
// with recompute none | selective | full, written against Backend and Communicator like
// TransformerLayer.
//
//   x1 = x  + proj(attn(rope(q), rope(k), v)),  [q; k; v] = qkv(rmsnorm1(x))
//   y  = x1 + fc2(silu(gate) * up),             [gate; up] = fc1(rmsnorm2(x1))
//
// Grouped-query attention: a query heads, g key/value heads; query head j reads group
// j / (a/g). No biases, no dropout. What is kept (Megatron-Core's conventions): each norm its
// input (rstd as an extra), the QKV GEMM its input, q and k after RoPE, v, the softmax output
// (no dropout: also the input of ·V, one tensor), the projection its input, fc1 its input,
// SwiGLU its input (the fc1 output), fc2 its input. Selective drops the softmax output; fused
// attention keeps the fp32 log-sum-exp instead; full keeps the layer input.
#include "layers/layer.hpp"
#include "layers/parallel.hpp"

namespace actbench {

class LlamaLayer final : public Layer {
 public:
  LlamaLayer(Backend& be, Communicator& comm, LayerOptions opt);
  void init_parameters() override;
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& dy) override;
  const SavedActivations& saved() const override { return saved_; }
  LayerParams& params() override { return params_; }
  LayerParams& grads() override { return grads_; }
  void set_phase_log(PhaseLog* log) override { log_ = log; }
  int64_t local_seq() const { return opt_.policy.sequence_parallel ? opt_.dims.s / t_ : opt_.dims.s; }

 private:
  enum class Keep { input_only, all_but_core_attn, all };
  Tensor forward_impl(const Tensor& x, SavedActivations& save, Keep keep, const char* stage);
  // Causal softmax of scale * q k^T, [b, a/t, s, s] (each query head against its group's k).
  Tensor attention_probs(const Tensor& q, const Tensor& k);
  DropoutSpec no_dropout_spec() const;  // the fused kernels' [b, a/t, s, s] index space, p = 0
  CommContext comm_ctx(const char* stage) const;

  Backend& be_;
  Communicator& comm_;
  LayerOptions opt_;
  int t_, rank_;
  int64_t al_, gl_, d_, fl_;  // query heads, key/value heads, head size, SwiGLU width per rank
  std::vector<ParamInfo> table_;
  LayerParams params_, grads_;
  SavedActivations saved_;
  PhaseLog* log_ = nullptr;
};

}  // namespace actbench
