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
#include <cstdint>

#include "layers/layer_base.hpp"

namespace actbench {

class LlamaLayer final : public LayerBase {
 public:
  // Allocates parameters and gradients (uninitialised: call init_parameters()).
  LlamaLayer(Backend& be, Communicator& comm, LayerOptions opt);
  Tensor backward(const Tensor& dy) override;

 private:
  Tensor forward_impl(const Tensor& x, SavedActivations& save, Keep keep, const char* stage) override;

  int64_t ffn_per_rank_;  // F/t, the SwiGLU width on this rank
};

}  // namespace actbench
