#pragma once
// The layer's parameters, and how each is sharded over tensor-parallel ranks.
// Values are drawn per element of the *canonical* (unsharded) tensor from Philox, so a
// rank can fill exactly its shard and every t solves the same problem.
// Canonical layout (the --dump contract): linear weights [out, in], y = x W^T + b;
// qkv.weight [(a+2g)·d, h] = Q; K; V stacked, each head-major; fc1.weight [2F, h] = gate; up
// under SwiGLU. Which parameters a layer has follows its spec (layer_param_table).
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
  Tensor q_norm_weight, q_norm_bias, k_norm_weight, k_norm_bias;  // --qk-layernorm: [d], shared by the heads
  // An MoE layer in place of fc1/fc2 (spec.moe): the router [E, h] (logits = x W^T), its
  // score bias [E] (a buffer that only changes the choice: its gradient stays zero), the
  // experts' weights in the grouped GEMM's layout [E, in, out] (fc1 [E, h, γF_e] = gate | up
  // under SwiGLU, fc2 [E, F_e, h]), and the shared experts as a dense MLP ([γF_s, h], [h, F_s]).
  Tensor router_weight, router_bias, experts_fc1_weight, experts_fc2_weight;
  Tensor shared_fc1_weight, shared_fc2_weight;
  // Multi-latent attention in place of qkv (spec.mla): the down projections [L_q, h] and
  // [L_kv + d_r, h] (on every rank), the latent norms [L_q], [L_kv], the up projections
  // [a·d_qk, L_q] and [a·(d_n + d_v), L_kv] (column-parallel), or q's projection [a·d_qk, h]
  // when L_q = 0.
  Tensor q_down_weight, q_latent_norm_weight, q_latent_norm_bias, q_up_weight, q_proj_weight;
  Tensor kv_down_weight, kv_latent_norm_weight, kv_latent_norm_bias, kv_up_weight;
};

// How a canonical [rows, cols] tensor is split over t ranks.
enum class ShardKind {
  replicated,  // every rank holds all of it
  rows,        // contiguous block of rows (column-parallel weights, sequence shards)
  cols,        // contiguous block of columns (row-parallel weights)
  stacked_rows,  // rows are parts stacked (Q; K; V, gate; up): rank r holds its block of each
  experts,       // [E, ...]: a block of whole experts, over the expert-parallel group (not TP)
  stacked_cols,  // columns are parts side by side (gate | up): rank r holds its block of each
};

struct ShardSpec {
  ShardKind kind = ShardKind::replicated;
  int64_t rows = 1, cols = 1;  // canonical 2-D view
  int t = 1, rank = 0;          // split over t ranks (the paper's t); this is rank `rank`'s shard
  std::vector<int64_t> parts;  // stacked_rows / stacked_cols: canonical rows / columns of each part, in order
  int64_t local_rows() const;
  int64_t local_cols() const;
  int64_t local_numel() const { return local_rows() * local_cols(); }
  int64_t canonical_index(int64_t local_flat) const;
};

// Which ranks hold part of a replicated parameter's gradient, summed over the TP group.
enum class GradSum {
  none,               // each rank's gradient is whole (sharded parameters)
  sequence_parallel,  // under SP each rank saw s/t rows (block norms, row-parallel biases)
  tensor_parallel,    // always: each rank saw its own heads (the q/k norms)
};

struct ParamInfo {
  const char* name;                  // canonical name, e.g. "qkv.weight"
  Tensor LayerParams::*member;
  Shape canonical_shape;
  ShardKind kind;
  GradSum grad_sum;
  uint32_t init_id;                  // Philox init stream
  std::vector<int64_t> parts = {};   // stacked_rows / stacked_cols only: rows / columns of each stacked part
};

// The parameters of a layer of d.spec, in the --dump contract's order: ln1.weight [h]
// (ln1.bias [h] under LayerNorm), qkv.weight [(a+2g)·d, h] (qkv.bias with --add-bias-linear or
// --add-qkv-bias), q_norm/k_norm weight [d] (and bias) with --qk-layernorm, proj.weight
// [h, a·d] (proj.bias), ln2 like ln1, fc1.weight [F, h] or [2F, h] = gate; up for SwiGLU
// (fc1.bias), fc2.weight [h, F] (fc2.bias). The paper's layer has the twelve of Table 1's.
// An MoE layer has instead of fc1/fc2: router.weight [E, h] (router.bias [E] with
// --moe-router-enable-expert-bias), experts.fc1.weight [E, h, F_e] or [E, h, 2F_e],
// experts.fc2.weight [E, F_e, h], and with shared experts shared.fc1.weight / shared.fc2.weight
// shaped as fc1/fc2 of width F_s.
// A multi-latent attention layer has instead of qkv (d_qk = d_n + d_r): q_down.weight [L_q, h],
// q_latent_norm.weight [L_q] (and .bias), q_up.weight [a·d_qk, L_q] — or q_proj.weight
// [a·d_qk, h] when L_q = 0 —, kv_down.weight [L_kv + d_r, h], kv_latent_norm.weight [L_kv]
// (and .bias), kv_up.weight [a·(d_n + d_v), L_kv] (head j: k's d_n rows, then v's d_v), and
// proj.weight [h, a·d_v].
// With expert_tensor_parallel (Megatron's --expert-tensor-parallel-size = --tp) every rank
// holds all E experts, each split over the TP group as the dense MLP is: experts.fc1.weight's
// columns (gate | up each split, ShardKind::stacked_cols of the [E·h, γF_e] view) and
// experts.fc2.weight's rows of each expert (ShardKind::stacked_rows of the [E·F_e, h] view).
std::vector<ParamInfo> layer_param_table(const LayerDims& d, bool expert_tensor_parallel = false);
// The routed experts' weights (experts.*, [E, in, out]): whole experts over the expert-parallel
// group (ShardKind::experts), or each split over the TP group (expert tensor parallelism).
bool is_expert_param(const ParamInfo& p);
// Expert tensor parallelism with expert parallelism: each expert-parallel rank holds E/ep
// experts, each split over its TP group. Rank ep_rank's experts as a parameter of their own
// (canonical_shape[0] = E/ep, the stacked parts of those experts), which the TP group splits as
// p's kind says; its element j is p's element ep_rank · numel(p) / ep + j.
ParamInfo experts_block(const ParamInfo& p, int ep);
// A parameter's shard on `rank` of `t` ranks of its group: the tensor-parallel group, or for
// ShardKind::experts the expert-parallel group. A 3-D parameter is viewed as [E, in·out]
// (experts) or [E·in, out] (split within each expert).
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
