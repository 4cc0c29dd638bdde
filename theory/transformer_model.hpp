#pragma once
// A whole decoder-only model as Megatron-LM's GPTModel builds it: a word embedding (and, with
// learned_absolute positions, a position table), L layers of one LayerSpec, a final norm and
// an output layer (its own weight, or the word embedding's when tied). The presets, a Hugging
// Face config.json and a Megatron-LM launch script all become one of these; the whole-step
// memory model (step_memory.hpp) and the layout search read nothing else.
#include <string>
#include <vector>

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
  LayerSpec layer;  // every layer's; with layer.moe enabled, the MoE layers'
  // With layer.moe enabled, which layers are MoE: one entry per layer, true for MoE (Megatron's
  // --moe-layer-freq, Hugging Face's first_k_dense_replace, decoder_sparse_step,
  // mlp_only_layers); empty: every layer. The others are dense: `layer` with its MoE off, their
  // MLP layer.ffn_hidden wide (the experts' width is layer.moe.ffn_hidden).
  std::vector<bool> moe_layers;
  // Megatron's --mtp-num-layers D (DeepSeek-V3's multi-token prediction): D more layers of the
  // last layer's spec on the last pipeline stage, each predicting one token further with its
  // own embedding lookup, norms, eh_proj and loss (step_memory.hpp). 0: none, Megatron's default.
  int mtp_layers = 0;

  Dims dims(double s, double b, double t) const { return {s, b, h, a, t}; }
  double position_rows() const { return max_positions > 0 ? max_positions : seq; }
  bool is_moe_layer(int i) const;
  // Layer i's spec (0-based): `layer`, or its dense form where layer i is not MoE.
  LayerSpec layer_spec(int i) const;
  int moe_layer_count() const;  // over all L layers
};

// Megatron's --moe-layer-freq for L layers: an integer N (every N-th layer from layer 0 is
// MoE) or a pattern list, "[1,0,1,...]" or Python's "([0]*3+[1]*58)" (one entry per layer).
// Throws InvalidArgument naming `flag`.
std::vector<bool> moe_layer_pattern(const std::string& freq, int layers, const std::string& flag);

struct ModelRow;
// A preset (model_table.hpp) as Megatron builds it: the paper's GPT models with learned
// positions and the output layer tied to the embedding, the llama family and the mixtures of
// experts untied with RoPE (DeepSeek-V3's first 3 layers dense).
TransformerModel preset_model(const ModelRow& row);

// The embedding's rows on all tensor-parallel ranks together: vocab rounded up to a multiple of
// vocab_divisible_by · t (Megatron's _vocab_size_with_padding).
double padded_vocab(const TransformerModel& m, double t);

}  // namespace actbench::theory
