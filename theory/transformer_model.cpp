#include "theory/transformer_model.hpp"

#include <algorithm>
#include <cmath>

#include "theory/model_table.hpp"

namespace actbench::theory {

TransformerModel preset_model(const ModelRow& row) {
  TransformerModel m;
  m.name = row.name;
  m.h = double(row.hidden);
  m.a = double(row.heads);
  m.L = row.layers;
  m.vocab = double(row.vocab);
  m.seq = double(row.seq);
  m.learned_positions = row.arch != "llama";
  m.tied_embeddings = row.tied_embeddings;
  m.layer = preset_layer_spec(row);
  return m;
}

double padded_vocab(const TransformerModel& m, double t) {
  const double multiple = std::max(1.0, m.vocab_divisible_by) * t;
  return std::ceil(m.vocab / multiple) * multiple;
}

}  // namespace actbench::theory
