#pragma once
// A whole decoder-only model as Megatron-LM's GPTModel builds it: a word embedding (and, with
// learned_absolute positions, a position table), L layers of one LayerSpec, a final norm and
// an output layer (its own weight, or the word embedding's when tied). The presets, a Hugging
// Face config.json and a Megatron-LM launch script all become one of these; the whole-step
// memory model (step_memory.hpp) and the layout search read nothing else.
#include <string>

#include "theory/layer_spec.hpp"

namespace actbench::theory {

struct TransformerModel {
  std::string name;
  double h = 0, a = 0, L = 0;  // hidden, query heads, layers
  double vocab = 0;            // the tokenizer's size; Megatron pads it (padded_vocab below)
  // Megatron's --make-vocab-size-divisible-by: the embedding has vocab rounded up to a
  // multiple of this × t rows (1: no padding, as a converted checkpoint may have).
  double vocab_divisible_by = 128;
  double seq = 2048;               // the default sequence length
  double max_positions = 0;        // learned positions' table rows (0: seq)
  bool learned_positions = false;  // --position-embedding-type learned_absolute: a table on stage 0
  bool tied_embeddings = true;     // Megatron's default; --untie-embeddings-and-output-weights unties
  LayerSpec layer;

  Dims dims(double s, double b, double t) const { return {s, b, h, a, t}; }
  double position_rows() const { return max_positions > 0 ? max_positions : seq; }
};

struct ModelRow;
// A preset (model_table.hpp) as Megatron builds it: the paper's GPT models with learned
// positions and the output layer tied to the embedding, the llama family untied with RoPE.
TransformerModel preset_model(const ModelRow& row);

// The embedding's rows on all tensor-parallel ranks together: vocab rounded up to a multiple of
// vocab_divisible_by · t (Megatron's _vocab_size_with_padding).
double padded_vocab(const TransformerModel& m, double t);

}  // namespace actbench::theory
