#pragma once
// The layer's parameters, and how each is sharded over tensor-parallel ranks.
// Values are drawn per element of the *canonical* (unsharded) tensor from Philox, so a
// rank can fill exactly its shard and every t solves the same problem.
// Canonical layout (the --dump contract): linear weights [out, in], y = x W^T + b;
// qkv.weight [3h, h] = Q; K; V stacked, each head-major.
#include <cstdint>
#include <string>
#include <vector>

#include "layers/config.hpp"
#include "runtime/tensor.hpp"

namespace actbench {

class Backend;
class Communicator;

struct LayerParams {
  Tensor ln1_weight, ln1_bias, qkv_weight, qkv_bias, proj_weight, proj_bias;
  Tensor ln2_weight, ln2_bias, fc1_weight, fc1_bias, fc2_weight, fc2_bias;
};

// How a canonical [rows, cols] tensor is split over t ranks.
enum class ShardKind {
  replicated,  // every rank holds all of it
  rows,        // contiguous block of rows (column-parallel weights, sequence shards)
  cols,        // contiguous block of columns (row-parallel weights)
  qkv_rows,    // rank r holds its heads' rows of each of Q, K and V
  stacked_rows,  // rows are parts stacked (llama Q; K; V, gate; up): rank r holds its block of each
};

struct ShardSpec {
  ShardKind kind = ShardKind::replicated;
  int64_t rows = 1, cols = 1;  // canonical 2-D view
  int t = 1, rank = 0;          // split over t ranks (the paper's t); this is rank `rank`'s shard
  std::vector<int64_t> parts;  // stacked_rows: canonical rows of each part, in order
  int64_t local_rows() const;
  int64_t local_cols() const;
  int64_t local_numel() const { return local_rows() * local_cols(); }
  int64_t canonical_index(int64_t local_flat) const;
};

struct ParamInfo {
  const char* name;                  // canonical name, e.g. "qkv.weight"
  Tensor LayerParams::*member;
  Shape canonical_shape;
  ShardKind kind;
  bool sequence_parallel_allreduce;  // gradient summed over the TP group under SP
  uint32_t init_id;                  // Philox init stream
  std::vector<int64_t> parts = {};   // stacked_rows only: rows of each stacked part
};

// The twelve parameters of a layer with hidden h.
std::vector<ParamInfo> layer_param_table(int64_t h);
// The parameters of the layer family d.arch: the twelve above for gpt; for llama the six of
// the --dump contract (ln1.weight [h], qkv.weight [(a+2g)·d, h] = Q; K; V head-major,
// proj.weight [h, h], ln2.weight [h], fc1.weight [2F, h] = gate; up, fc2.weight [h, F]).
std::vector<ParamInfo> layer_param_table(const LayerDims& d);
ShardSpec param_shard(const ParamInfo& p, int t, int rank);
// The local shape of a parameter on `rank` of `t`.
Shape local_param_shape(const ParamInfo& p, int t);

// Value of canonical element `index` of parameter `init_id` (seed, layer).
float param_init_value(uint32_t init_id, uint64_t seed, uint32_t layer, int64_t index, int64_t fan_in);

// Activations [s, b, h]: sharded along s under SP, replicated otherwise.
ShardSpec activation_shard(const LayerDims& d, bool sequence_parallel, int t, int rank);
// Fills `local` (on any backend) with the shard of a canonical tensor whose element i is
// philox_uniform_pm1(seed, stream_layer, stream_id, i) * scale.
void fill_uniform_shard(Backend& be, Tensor& local, const ShardSpec& spec, uint64_t seed, uint32_t stream_layer,
                        uint32_t stream_id, float scale);

// Gathers every rank's shard of a tensor into the canonical layout (float32, row-major).
// Every rank calls it; every rank gets the result.
std::vector<float> gather_canonical(Backend& be, Communicator& comm, const Tensor& local, const ShardSpec& spec);

}  // namespace actbench
