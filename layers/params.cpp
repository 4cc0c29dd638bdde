#include "layers/params.hpp"

#include <cmath>

#include "kernels/backend.hpp"
#include "runtime/communicator.hpp"
#include "runtime/error.hpp"
#include "runtime/philox.hpp"

namespace actbench {

int64_t ShardSpec::local_rows() const {
  return (kind == ShardKind::rows || kind == ShardKind::stacked_rows || kind == ShardKind::experts) ? rows / t : rows;
}
int64_t ShardSpec::local_cols() const {
  return (kind == ShardKind::cols || kind == ShardKind::stacked_cols) ? cols / t : cols;
}

// Canonical index of local (row, col) along a dimension of stacked parts, each split t ways.
static int64_t stacked_index(const std::vector<int64_t>& parts, int t, int rank, int64_t local) {
  int64_t before = 0, local_before = 0;  // canonical and local extents of the earlier parts
  for (int64_t part : parts) {
    const int64_t shard = part / t;
    if (local < local_before + shard) return before + rank * shard + (local - local_before);
    before += part;
    local_before += shard;
  }
  return local;  // not reached for an index inside the shard
}

int64_t ShardSpec::canonical_index(int64_t local_flat) const {
  const int64_t shard_cols = local_cols();
  const int64_t row = local_flat / shard_cols, col = local_flat % shard_cols;
  switch (kind) {
    case ShardKind::replicated: return local_flat;
    case ShardKind::rows:
    case ShardKind::experts: return (rank * local_rows() + row) * cols + col;
    case ShardKind::cols: return row * cols + rank * shard_cols + col;
    case ShardKind::stacked_rows: return stacked_index(parts, t, rank, row) * cols + col;
    case ShardKind::stacked_cols: return row * cols + stacked_index(parts, t, rank, col);
  }
  return local_flat;
}

// The MoE block's parameters (init streams 16..21), as Megatron-Core arranges them: the router
// on every rank; with expert tensor parallelism 1 the routed experts whole, E/ep of them on each
// expert-parallel rank (each TP rank routes its own s/t rows under SP, so their gradients are
// summed over the TP group); with expert tensor parallelism over TP every expert split like the
// dense MLP (each rank computes its slice over every row of the group: nothing summed); the
// shared experts split over t like the dense MLP.
static void append_moe_params(const LayerDims& d, bool expert_tensor_parallel, std::vector<ParamInfo>& table) {
  using L = LayerParams;
  const theory::MoeSpec& moe = d.spec.moe;
  const int64_t h = d.h, E = static_cast<int64_t>(moe.num_experts), ffn = d.expert_ffn();
  const int64_t shared = static_cast<int64_t>(moe.shared_ffn_hidden);
  const bool gated = d.spec.activation == theory::Activation::swiglu;
  const ShardKind whole = ShardKind::replicated;
  const GradSum rows = GradSum::sequence_parallel;
  table.push_back({"router.weight", &L::router_weight, {E, h}, whole, rows, 16});
  if (moe.expert_bias) table.push_back({"router.bias", &L::router_bias, {E}, whole, GradSum::none, 17});
  const Shape fc1 = {E, h, (gated ? 2 : 1) * ffn}, fc2 = {E, ffn, h};
  if (expert_tensor_parallel) {
    const std::vector<int64_t> gate_up = gated ? std::vector<int64_t>{ffn, ffn} : std::vector<int64_t>{ffn};
    const std::vector<int64_t> each_expert(static_cast<size_t>(E), ffn);
    table.push_back({"experts.fc1.weight", &L::experts_fc1_weight, fc1, ShardKind::stacked_cols, GradSum::none, 18,
                     gate_up});
    table.push_back({"experts.fc2.weight", &L::experts_fc2_weight, fc2, ShardKind::stacked_rows, GradSum::none, 19,
                     each_expert});
  } else {  // each expert-parallel rank holds E/ep experts (ShardKind::experts, over that group)
    table.push_back({"experts.fc1.weight", &L::experts_fc1_weight, fc1, ShardKind::experts, rows, 18});
    table.push_back({"experts.fc2.weight", &L::experts_fc2_weight, fc2, ShardKind::experts, rows, 19});
  }
  if (shared == 0) return;
  if (gated)
    table.push_back({"shared.fc1.weight", &L::shared_fc1_weight, {2 * shared, h}, ShardKind::stacked_rows,
                     GradSum::none, 20, {shared, shared}});
  else
    table.push_back({"shared.fc1.weight", &L::shared_fc1_weight, {shared, h}, ShardKind::rows, GradSum::none, 20});
  table.push_back({"shared.fc2.weight", &L::shared_fc2_weight, {h, shared}, ShardKind::cols, GradSum::none, 21});
}

// Multi-latent attention's parameters (init streams 22..29), as Megatron-Core's MLASelfAttention
// arranges them: the down projections and the latent norms on every rank, run on the norm
// region's rows (under SP each rank's s/t rows, so their gradients are summed over the group),
// the up projections column-parallel (a/t heads each).
static void append_mla_params(const LayerDims& d, std::vector<ParamInfo>& table) {
  using L = LayerParams;
  const theory::MlaSpec& mla = d.spec.mla;
  const int64_t h = d.h, a = d.a, q_rank = static_cast<int64_t>(mla.q_lora_rank);
  const int64_t kv_rank = static_cast<int64_t>(mla.kv_lora_rank), rope = static_cast<int64_t>(mla.qk_pos_emb_head_dim);
  const int64_t k_nope = static_cast<int64_t>(mla.qk_head_dim), v = d.v_head_dim();
  const bool norm_bias = d.spec.normalization == theory::Norm::layernorm;
  const ShardKind whole = ShardKind::replicated;
  const GradSum rows = GradSum::sequence_parallel;
  if (q_rank > 0) {
    table.push_back({"q_down.weight", &L::q_down_weight, {q_rank, h}, whole, rows, 22});
    table.push_back({"q_latent_norm.weight", &L::q_latent_norm_weight, {q_rank}, whole, rows, 23});
    if (norm_bias) table.push_back({"q_latent_norm.bias", &L::q_latent_norm_bias, {q_rank}, whole, rows, 24});
    table.push_back({"q_up.weight", &L::q_up_weight, {a * d.head_dim(), q_rank}, ShardKind::rows, GradSum::none, 25});
  } else {
    table.push_back({"q_proj.weight", &L::q_proj_weight, {a * d.head_dim(), h}, ShardKind::rows, GradSum::none, 25});
  }
  table.push_back({"kv_down.weight", &L::kv_down_weight, {kv_rank + rope, h}, whole, rows, 26});
  table.push_back({"kv_latent_norm.weight", &L::kv_latent_norm_weight, {kv_rank}, whole, rows, 27});
  if (norm_bias) table.push_back({"kv_latent_norm.bias", &L::kv_latent_norm_bias, {kv_rank}, whole, rows, 28});
  table.push_back({"kv_up.weight", &L::kv_up_weight, {a * (k_nope + v), kv_rank}, ShardKind::rows, GradSum::none, 29});
}

std::vector<ParamInfo> layer_param_table(const LayerDims& d, bool expert_tensor_parallel) {
  using L = LayerParams;
  using theory::Activation, theory::Norm;
  const theory::LayerSpec& spec = d.spec;
  const int64_t h = d.h, head = d.head_dim(), q_rows = d.a * head, kv_rows = d.groups() * head, ffn = d.ffn();
  const bool norm_bias = spec.normalization == Norm::layernorm, bias = spec.add_bias_linear;
  const std::vector<int64_t> qkv_parts = {q_rows, kv_rows, kv_rows};
  // Init streams keep the paper's layer's numbering (0..11); the q/k norms take 12..15.
  std::vector<ParamInfo> table;
  auto add = [&](bool present, ParamInfo p) {
    if (present) table.push_back(std::move(p));
  };
  add(true, {"ln1.weight", &L::ln1_weight, {h}, ShardKind::replicated, GradSum::sequence_parallel, 0});
  add(norm_bias, {"ln1.bias", &L::ln1_bias, {h}, ShardKind::replicated, GradSum::sequence_parallel, 1});
  if (spec.mla.enabled) append_mla_params(d, table);
  add(!spec.mla.enabled, {"qkv.weight", &L::qkv_weight, {q_rows + 2 * kv_rows, h}, ShardKind::stacked_rows,
                          GradSum::none, 2, qkv_parts});
  add(spec.qkv_bias() && !spec.mla.enabled,
      {"qkv.bias", &L::qkv_bias, {q_rows + 2 * kv_rows}, ShardKind::stacked_rows, GradSum::none, 3, qkv_parts});
  add(spec.qk_layernorm, {"q_norm.weight", &L::q_norm_weight, {head}, ShardKind::replicated, GradSum::tensor_parallel, 12});
  add(spec.qk_layernorm && norm_bias,
      {"q_norm.bias", &L::q_norm_bias, {head}, ShardKind::replicated, GradSum::tensor_parallel, 13});
  add(spec.qk_layernorm, {"k_norm.weight", &L::k_norm_weight, {head}, ShardKind::replicated, GradSum::tensor_parallel, 14});
  add(spec.qk_layernorm && norm_bias,
      {"k_norm.bias", &L::k_norm_bias, {head}, ShardKind::replicated, GradSum::tensor_parallel, 15});
  add(true, {"proj.weight", &L::proj_weight, {h, d.a * d.v_head_dim()}, ShardKind::cols, GradSum::none, 4});
  add(bias, {"proj.bias", &L::proj_bias, {h}, ShardKind::replicated, GradSum::sequence_parallel, 5});
  add(true, {"ln2.weight", &L::ln2_weight, {h}, ShardKind::replicated, GradSum::sequence_parallel, 6});
  add(norm_bias, {"ln2.bias", &L::ln2_bias, {h}, ShardKind::replicated, GradSum::sequence_parallel, 7});
  if (spec.moe.enabled()) {
    append_moe_params(d, expert_tensor_parallel, table);
    return table;
  }
  if (spec.activation == Activation::swiglu) {
    add(true, {"fc1.weight", &L::fc1_weight, {2 * ffn, h}, ShardKind::stacked_rows, GradSum::none, 8, {ffn, ffn}});
    add(bias, {"fc1.bias", &L::fc1_bias, {2 * ffn}, ShardKind::stacked_rows, GradSum::none, 9, {ffn, ffn}});
  } else {
    add(true, {"fc1.weight", &L::fc1_weight, {ffn, h}, ShardKind::rows, GradSum::none, 8});
    add(bias, {"fc1.bias", &L::fc1_bias, {ffn}, ShardKind::rows, GradSum::none, 9});
  }
  add(true, {"fc2.weight", &L::fc2_weight, {h, ffn}, ShardKind::cols, GradSum::none, 10});
  add(bias, {"fc2.bias", &L::fc2_bias, {h}, ShardKind::replicated, GradSum::sequence_parallel, 11});
  return table;
}

bool is_expert_param(const ParamInfo& p) { return p.canonical_shape.size() == 3; }

ParamInfo experts_block(const ParamInfo& p, int ep) {
  ParamInfo block = p;
  const int64_t experts = p.canonical_shape[0] / ep;
  block.canonical_shape[0] = experts;
  // fc2's stacked rows are one part per expert; fc1's stacked columns (gate | up) are not per expert.
  if (p.kind == ShardKind::stacked_rows) block.parts.resize(static_cast<size_t>(experts));
  return block;
}

ShardSpec param_shard(const ParamInfo& p, int t, int rank) {
  ShardSpec spec;
  spec.kind = p.kind;
  spec.parts = p.parts;
  // A 2-D view: the experts' [E, in, out] as [E, in·out] for whole experts, as [E·in, out] when
  // each expert is split (its rows or columns stacked parts).
  const bool split_experts = p.canonical_shape.size() == 3 && p.kind != ShardKind::experts;
  const size_t leading = split_experts ? 2 : 1;
  spec.rows = 1;
  for (size_t i = 0; i < leading; ++i) spec.rows *= p.canonical_shape[i];
  spec.cols = 1;
  for (size_t i = leading; i < p.canonical_shape.size(); ++i) spec.cols *= p.canonical_shape[i];
  spec.t = t;
  spec.rank = rank;
  return spec;
}

Shape local_param_shape(const ParamInfo& p, int t) {
  ShardSpec spec = param_shard(p, t, 0);
  if (p.kind == ShardKind::replicated) return p.canonical_shape;
  if (p.kind == ShardKind::experts) {
    Shape shape = p.canonical_shape;
    shape[0] /= t;
    return shape;
  }
  if (p.canonical_shape.size() == 3) {  // each expert split: its in (stacked rows) or out (stacked columns)
    Shape shape = p.canonical_shape;
    shape[p.kind == ShardKind::stacked_cols ? 2 : 1] /= t;
    return shape;
  }
  if (p.canonical_shape.size() == 1) return {spec.local_rows()};
  return {spec.local_rows(), spec.local_cols()};
}

float param_init_value(uint32_t init_id, uint64_t seed, uint32_t layer, int64_t index, int64_t fan_in) {
  float u = philox_uniform_pm1(seed, layer, init_id, static_cast<uint64_t>(index));
  switch (init_id) {
    case 0: case 6: case 12: case 14: case 23: case 27: return 1.0f + 0.1f * u;  // norm weights near 1
    case 2: case 4: case 8: case 10: case 16: case 18: case 19: case 20: case 21: case 22: case 25: case 26: case 29:
      return u / std::sqrt(static_cast<float>(fan_in));
    default: return 0.1f * u;                // biases
  }
}

ShardSpec activation_shard(const LayerDims& d, bool sequence_parallel, int t, int rank) {
  ShardSpec spec;
  spec.kind = sequence_parallel ? ShardKind::rows : ShardKind::replicated;
  spec.rows = d.s;
  spec.cols = d.b * d.h;
  spec.t = t;
  spec.rank = rank;
  return spec;
}

void fill_uniform_shard(Backend& be, Tensor& local, const ShardSpec& spec, uint64_t seed, uint32_t stream_layer,
                        uint32_t stream_id, float scale) {
  if (local.numel() != spec.local_numel())
    throw InvalidArgument("fill_uniform_shard: tensor " + shape_str(local.shape()) + " is not the shard's size");
  if (!be.computes()) return;
  std::vector<float> host(static_cast<size_t>(local.numel()));
  for (int64_t i = 0; i < local.numel(); ++i)
    host[i] = scale * philox_uniform_pm1(seed, stream_layer, stream_id, static_cast<uint64_t>(spec.canonical_index(i)));
  be.upload(host.data(), local);
}

std::vector<float> gather_canonical(Backend& be, Communicator& comm, const Tensor& local, const ShardSpec& spec) {
  std::vector<float> mine(static_cast<size_t>(local.numel()));
  be.download(local, mine.data());
  const int ranks = comm.size();
  std::vector<float> all = comm.gather_host(mine);
  if (spec.kind == ShardKind::replicated) return mine;
  std::vector<float> canonical(static_cast<size_t>(spec.rows * spec.cols));
  for (int r = 0; r < ranks; ++r) {
    ShardSpec shard_of_r = spec;
    shard_of_r.rank = r;
    shard_of_r.t = ranks;
    const float* src = all.data() + static_cast<size_t>(r) * mine.size();
    for (int64_t i = 0; i < static_cast<int64_t>(mine.size()); ++i) canonical[shard_of_r.canonical_index(i)] = src[i];
  }
  return canonical;
}

}  // namespace actbench
