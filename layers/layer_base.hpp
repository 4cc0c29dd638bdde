#pragma once
// What the layer families share around their blocks: the tensor-parallel group and the
// sequence-parallel communication context, the parameters (allocated and initialised from
// the family's table), and the recompute policy: which of forward's activations are kept,
// and the full-recompute forward that backward runs first. A family writes its blocks once,
// in forward_impl and backward, and says what each block keeps.
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
  // the core-attention scores, full only the layer input (saved().layer_input).
  Tensor forward(const Tensor& x) final;

  const SavedActivations& saved() const override { return saved_; }
  LayerParams& params() override { return params_; }
  LayerParams& grads() override { return grads_; }
  void set_phase_log(PhaseLog* log) override { phase_log_ = log; }
  const LayerOptions& options() const { return opt_; }
  // Rows of x, x1 and y on this rank: s/t under SP, else s.
  int64_t local_seq() const { return opt_.policy.sequence_parallel ? opt_.dims.s / tp_size_ : opt_.dims.s; }

 protected:
  // What one forward keeps for backward.
  enum class Keep { input_only, all_but_core_attn, all };

  // Validates the shape against the TP group (parameters come with allocate_parameters()).
  LayerBase(Backend& be, Communicator& comm, LayerOptions opt);
  // Parameters (uninitialised) and zeroed gradients of the family's table, in its order.
  void allocate_parameters();

  // x: [s_local, b, h] (checked by forward). Stores into `save` what `keep` says; phases are
  // named stage.op ("fwd" or "recompute").
  virtual Tensor forward_impl(const Tensor& x, SavedActivations& save, Keep keep, const char* stage) = 0;

  // The start of every backward: checks dy, takes saved() (leaving it empty) and, under full
  // recompute, runs the forward again from the kept input (phases "recompute.*", output
  // discarded) so that the result holds everything.
  SavedActivations take_saved_for_backward(const Tensor& dy);
  // The end of every backward: under SP each rank saw s/t rows, so the gradients of the
  // parameters applied to those rows (norms, row-parallel biases) are partial: sums them.
  void all_reduce_sequence_parallel_grads();

  CommContext comm_context(const char* stage) const;

  // Megatron's parallel linears, y = x W^T with W this rank's shard (biases, which only gpt
  // has, stay with the layer). Activations are [s, b, width]; phases are comm.stage + "." + op.
  // A tensor passed by value is released where the layer no longer needs it: pass it with
  // std::move on its last use, a copy to keep it.
  //
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
  // Core attention's [b, a/t, s, s] index space on this rank (rank's heads of the canonical
  // [b, a, s, s]): the dropout of the probabilities, p = opt.dropout.
  DropoutSpec attn_dropout_spec() const;
  // Phase name "stage.op".
  static std::string phase_name(const char* stage, const char* op) { return std::string(stage) + "." + op; }
  // Rows of an [s, b, w] tensor as a matrix [s*b, w].
  static Tensor as_matrix(const Tensor& t) { return t.view({t.numel() / t.dim(-1), t.dim(-1)}); }

  Backend& be_;
  Communicator& comm_;
  LayerOptions opt_;
  int tp_size_, tp_rank_;  // the tensor-parallel group: its size (the paper's t) and this rank
  int64_t heads_per_rank_, head_dim_;  // query heads on this rank (a/t); h/a
  std::vector<ParamInfo> table_;
  LayerParams params_, grads_;
  SavedActivations saved_;
  PhaseLog* phase_log_ = nullptr;

 private:
  void check_activation_shape(const Tensor& t, const char* what) const;
};

}  // namespace actbench
