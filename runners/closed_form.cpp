#include "runners/closed_form.hpp"

#include <cmath>

#include "layers/theory_dims.hpp"
#include "theory/layer_pieces.hpp"

namespace actbench {

// The closed form of theory/layer_pieces.hpp for this layer's spec and configuration.
double formula_bytes(const LayerDims& d, int tp, LayerPolicy p, DType dtype, int cp, MoeRows moe) {
  const theory::Precision precision{static_cast<double>(dtype_size(dtype)), 1.0};
  theory::Dims dims = theory_dims(d, tp);
  dims.cp = cp;
  dims.moe_routed_rows = moe.routed;
  dims.moe_expert_rows = moe.expert;
  dims.ep = moe.ep;
  dims.etp = moe.etp;
  return theory::layer_bytes(dims, d.spec, p, precision);
}

double stack_formula_bytes(const ExperimentSpec& spec, int tp, MoeRows routed) {
  const double layers = spec.layers, n = spec.stack.num_layers;
  const double layer = formula_bytes(spec.dims, tp, spec.policy, spec.dtype, spec.cp(), routed);
  LayerPolicy keeps_all = spec.policy;
  keeps_all.recompute = Recompute::none;
  switch (spec.stack.method) {
    case RecomputeMethod::block: return n * layer + (layers - n) * formula_bytes(spec.dims, tp, keeps_all, spec.dtype, spec.cp(), routed);
    case RecomputeMethod::uniform: return std::ceil(layers / n) * layer;  // a group keeps what a full layer does
    case RecomputeMethod::none: break;
  }
  return layers * layer;
}

}  // namespace actbench
