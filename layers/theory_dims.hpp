#pragma once
// A layer's shape as theory's formulas take it, on tp tensor-parallel ranks: what the
// measured bytes are checked against (layer_run's formula column, the tests).
#include "layers/config.hpp"
#include "theory/activation_memory.hpp"
#include "theory/llama_memory.hpp"

namespace actbench {

inline theory::Dims theory_dims(const LayerDims& d, int tp) {
  return {static_cast<double>(d.s), static_cast<double>(d.b), static_cast<double>(d.h), static_cast<double>(d.a),
          static_cast<double>(tp)};
}

// The llama family's shape: also the key/value heads and the SwiGLU width.
inline theory::LlamaDims theory_llama_dims(const LayerDims& d, int tp) {
  return {static_cast<double>(d.s),        static_cast<double>(d.b),     static_cast<double>(d.h),
          static_cast<double>(d.a),        static_cast<double>(d.groups()), static_cast<double>(d.ffn()),
          static_cast<double>(tp)};
}

}  // namespace actbench
