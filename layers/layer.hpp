#pragma once
// What every layer family offers the runners: forward keeps what its policy says in saved(),
// backward recomputes the rest and writes grads(). TransformerLayer is --arch gpt (the
// paper's layer), LlamaLayer --arch llama; both on LayerBase (layer_base.hpp).
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/backend.hpp"
#include "layers/config.hpp"
#include "layers/params.hpp"
#include "layers/saved_activations.hpp"
#include "runtime/communicator.hpp"
#include "runtime/timing.hpp"

namespace actbench {

// An MoE layer's routing in its last forward: the rows each expert processed (kept pairs),
// the pairs dropped by the capacity, and the aux loss's value (0 where not computed: meta).
struct MoeRoutingStats {
  std::vector<int64_t> tokens_per_expert;
  int64_t dropped = 0;
  int64_t expert_rows = 0;  // the rows this rank's experts processed (under EP: from every rank)
  double aux_loss = 0;
  bool measured = false;  // false: meta's given or balanced histogram
};

class Layer {
 public:
  virtual ~Layer() = default;
  // Parameters from the seed, canonical layout then sharded (so any t gets the same layer).
  virtual void init_parameters() = 0;
  // x: [s_local, b, h] with s_local = s/t under SP, else s; returns y, the same shape.
  virtual Tensor forward(const Tensor& x) = 0;
  // forward again, for a caller that checkpointed this layer (Megatron's --recompute-method
  // uniform rebuilds a group in backward): the same work, its phases named recompute.*.
  virtual Tensor recompute_forward(const Tensor& x) = 0;
  // dy: like y. Returns dx; releases saved().
  virtual Tensor backward(const Tensor& dy) = 0;
  virtual const SavedActivations& saved() const = 0;
  // Frees what forward saved, for a caller that checkpoints this layer with others and will
  // run forward again before backward (Megatron's --recompute-method uniform).
  virtual void drop_saved() = 0;
  virtual LayerParams& params() = 0;
  virtual LayerParams& grads() = 0;
  virtual void set_phase_log(PhaseLog* log) = 0;
  // The routing of the last forward for an MoE layer; null for a dense one.
  virtual const MoeRoutingStats* moe_stats() const { return nullptr; }
};

// The layer of opt.dims's spec on the tensor-parallel group comm and, under context
// parallelism, the context-parallel group cp (null: C = 1); an MoE layer's experts spread over
// the expert-parallel group ep (null: all on each rank).
std::unique_ptr<Layer> make_layer(Backend& be, Communicator& comm, const LayerOptions& opt,
                                  Communicator* cp = nullptr, Communicator* ep = nullptr);

}  // namespace actbench
