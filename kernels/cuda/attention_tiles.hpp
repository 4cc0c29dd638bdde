#pragma once
// The fused attention kernels' tiling (kernels/cuda/attention.cu), plain C++ so host code
// (bench_kernels' executed-FLOPs counter) counts the same tiles the kernels visit.
#include <cstdint>

namespace actbench::cuda::attention_tiles {

constexpr int kFwdRows = 64, kFwdKeys = 64;  // forward: query rows per block, keys per tile
constexpr int kDqRows = 64, kDqKeys = 32;    // dQ pass: query rows per block, keys per tile
constexpr int kDkvKeys = 64, kDkvRows = 32;  // dK/dV pass: keys per block, query rows per tile

// Head sizes are run in the instantiation for the next of 16, 32, 64, 128 (zero padding).
constexpr int64_t padded_head_dim(int64_t d) { return d <= 16 ? 16 : d <= 32 ? 32 : d <= 64 ? 64 : 128; }

}  // namespace actbench::cuda::attention_tiles
