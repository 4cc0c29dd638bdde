#pragma once
// The pre-LayerNorm GPT layer of the paper (Fig. 2/3), tensor- and sequence-parallel,
// with recompute none | selective | full. Written once against Backend and Communicator.
//
//   x1 = x  + dropout(proj(attn(ln1(x))))
//   y  = x1 + dropout(fc2(gelu(fc1(ln2(x1)))))
//
// Activations are [s, b, h] (sequence first); under SP a rank holds s/t rows of x, x1, y.
#include <cstdint>

#include "layers/layer_base.hpp"

namespace actbench {

class TransformerLayer final : public LayerBase {
 public:
  // Allocates parameters and gradients (uninitialised: call init_parameters()).
  TransformerLayer(Backend& be, Communicator& comm, LayerOptions opt);

  // dy: like y. Recomputes what the policy did not keep, writes grads(), releases saved(),
  // returns dx.
  Tensor backward(const Tensor& dy) override;

 private:
  Tensor forward_impl(const Tensor& x, SavedActivations& save, Keep keep, const char* stage) override;
  DropoutSpec residual_dropout_spec(uint32_t site) const;
  Tensor bias_dropout_residual_fwd(const char* stage, const char* op, const Tensor& out, const Tensor& bias,
                                   const Tensor& residual, uint32_t site, Tensor* kept_mask);

  int64_t hidden_per_rank_;  // h/t
};

}  // namespace actbench
