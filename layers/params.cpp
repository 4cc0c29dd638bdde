#include "layers/params.hpp"

#include <cmath>

#include "kernels/backend.hpp"
#include "runtime/communicator.hpp"
#include "runtime/error.hpp"
#include "runtime/philox.hpp"

namespace actbench {

int64_t ShardSpec::local_rows() const {
  return (kind == ShardKind::rows || kind == ShardKind::qkv_rows || kind == ShardKind::stacked_rows) ? rows / t : rows;
}
int64_t ShardSpec::local_cols() const { return kind == ShardKind::cols ? cols / t : cols; }

int64_t ShardSpec::canonical_index(int64_t local_flat) const {
  const int64_t shard_cols = local_cols();
  const int64_t row = local_flat / shard_cols, col = local_flat % shard_cols;
  switch (kind) {
    case ShardKind::replicated: return local_flat;
    case ShardKind::rows: return (rank * local_rows() + row) * cols + col;
    case ShardKind::cols: return row * cols + rank * shard_cols + col;
    case ShardKind::qkv_rows: {
      const int64_t part_rows = rows / 3, part_rows_per_rank = part_rows / t;  // one of Q, K, V
      const int64_t part = row / part_rows_per_rank, within = row % part_rows_per_rank;
      return (part * part_rows + rank * part_rows_per_rank + within) * cols + col;
    }
    case ShardKind::stacked_rows: {
      int64_t before = 0, local_before = 0;  // canonical and local rows of the earlier parts
      for (int64_t part_rows : parts) {
        const int64_t local = part_rows / t;
        if (row < local_before + local) return (before + rank * local + (row - local_before)) * cols + col;
        before += part_rows;
        local_before += local;
      }
      return local_flat;  // not reached for a row inside the shard
    }
  }
  return local_flat;
}

std::vector<ParamInfo> layer_param_table(int64_t h) {
  using L = LayerParams;
  return {
      {"ln1.weight", &L::ln1_weight, {h}, ShardKind::replicated, true, 0},
      {"ln1.bias", &L::ln1_bias, {h}, ShardKind::replicated, true, 1},
      {"qkv.weight", &L::qkv_weight, {3 * h, h}, ShardKind::qkv_rows, false, 2},
      {"qkv.bias", &L::qkv_bias, {3 * h}, ShardKind::qkv_rows, false, 3},
      {"proj.weight", &L::proj_weight, {h, h}, ShardKind::cols, false, 4},
      {"proj.bias", &L::proj_bias, {h}, ShardKind::replicated, true, 5},
      {"ln2.weight", &L::ln2_weight, {h}, ShardKind::replicated, true, 6},
      {"ln2.bias", &L::ln2_bias, {h}, ShardKind::replicated, true, 7},
      {"fc1.weight", &L::fc1_weight, {4 * h, h}, ShardKind::rows, false, 8},
      {"fc1.bias", &L::fc1_bias, {4 * h}, ShardKind::rows, false, 9},
      {"fc2.weight", &L::fc2_weight, {h, 4 * h}, ShardKind::cols, false, 10},
      {"fc2.bias", &L::fc2_bias, {h}, ShardKind::replicated, true, 11},
  };
}

std::vector<ParamInfo> layer_param_table(const LayerDims& d) {
  if (d.arch == Arch::gpt) return layer_param_table(d.h);
  using L = LayerParams;
  const int64_t h = d.h, head_dim = d.h / d.a, q_rows = d.a * head_dim, kv_rows = d.groups() * head_dim, ffn = d.ffn();
  return {
      {"ln1.weight", &L::ln1_weight, {h}, ShardKind::replicated, true, 0},
      {"qkv.weight", &L::qkv_weight, {q_rows + 2 * kv_rows, h}, ShardKind::stacked_rows, false, 2,
       {q_rows, kv_rows, kv_rows}},
      {"proj.weight", &L::proj_weight, {h, q_rows}, ShardKind::cols, false, 4},
      {"ln2.weight", &L::ln2_weight, {h}, ShardKind::replicated, true, 6},
      {"fc1.weight", &L::fc1_weight, {2 * ffn, h}, ShardKind::stacked_rows, false, 8, {ffn, ffn}},
      {"fc2.weight", &L::fc2_weight, {h, ffn}, ShardKind::cols, false, 10},
  };
}

ShardSpec param_shard(const ParamInfo& p, int t, int rank) {
  ShardSpec spec;
  spec.kind = p.kind;
  spec.parts = p.parts;
  spec.rows = p.canonical_shape[0];
  spec.cols = p.canonical_shape.size() > 1 ? p.canonical_shape[1] : 1;
  spec.t = t;
  spec.rank = rank;
  return spec;
}

Shape local_param_shape(const ParamInfo& p, int t) {
  ShardSpec spec = param_shard(p, t, 0);
  if (p.canonical_shape.size() == 1) return {spec.local_rows()};
  return {spec.local_rows(), spec.local_cols()};
}

float param_init_value(uint32_t init_id, uint64_t seed, uint32_t layer, int64_t index, int64_t fan_in) {
  float u = philox_uniform_pm1(seed, layer, init_id, static_cast<uint64_t>(index));
  switch (init_id) {
    case 0: case 6: return 1.0f + 0.1f * u;  // LayerNorm weights near 1
    case 2: case 4: case 8: case 10: return u / std::sqrt(static_cast<float>(fan_in));
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
