#include "theory/transformer_model.hpp"

#include <algorithm>
#include <cmath>

namespace actbench::theory {

double padded_vocab(const TransformerModel& m, double t) {
  const double multiple = std::max(1.0, m.vocab_divisible_by) * t;
  return std::ceil(m.vocab / multiple) * multiple;
}

}  // namespace actbench::theory
