#pragma once
// The fused attention kernels' tiling (kernels/cuda/attention.cu, attention_tc.cu), plain C++ so host code
// (bench_kernels' executed-FLOPs counter) counts the same tiles the kernels visit.
#include <cstdint>

#include "runtime/seq_positions.hpp"

namespace actbench::cuda::attention_tiles {

constexpr int kFwdRows = 64, kFwdKeys = 64;  // forward: query rows per block, keys per tile
constexpr int kDqRows = 64, kDqKeys = 32;    // dQ pass: query rows per block, keys per tile
constexpr int kDkvKeys = 64, kDkvRows = 32;  // dK/dV pass: keys per block, query rows per tile

// Head sizes are run in the instantiation for the next of 16, 32, 64, 128, 192 (zero padding).
constexpr int64_t padded_head_dim(int64_t d) {
  return d <= 16 ? 16 : d <= 32 ? 32 : d <= 64 ? 64 : d <= 128 ? 128 : 192;
}

// The tensor-core kernels of bf16 and fp16 (attention_tc.cu, which says why each size is what
// it is): head sizes in the instantiation for the next of 64, 96, 128, 192; the forward's
// blocks of kFwdRows query rows visit key tiles of tc_fwd_keys; the backward's blocks of
// tc_bwd_keys keys visit query tiles of tc_bwd_rows.
constexpr int tc_head_dim(int64_t d) { return d <= 64 ? 64 : d <= 96 ? 96 : d <= 128 ? 128 : 192; }
constexpr int tc_fwd_keys(int kd) { return kd <= 96 ? 64 : kd <= 128 ? 32 : 16; }
constexpr int tc_bwd_rows(int kd) { return kd <= 64 ? 64 : kd <= 128 ? 32 : 16; }
constexpr int tc_bwd_keys(int kd) { return kd <= 64 ? 64 : 32; }

// The first and the last position of rows [begin, end) (begin < end): each run of positions
// increases, so they are at the ends of the rows or beside the split.
ACTBENCH_HD int64_t first_position(const SeqPositions& p, int64_t begin, int64_t end) {
  const int64_t a = p.at(begin);
  if (begin < p.split && p.split < end) {
    const int64_t b = p.at(p.split);
    return b < a ? b : a;
  }
  return a;
}
ACTBENCH_HD int64_t last_position(const SeqPositions& p, int64_t begin, int64_t end) {
  const int64_t a = p.at(end - 1);
  if (begin < p.split && p.split < end) {
    const int64_t b = p.at(p.split - 1);
    return b > a ? b : a;
  }
  return a;
}

// Whether a tile of query rows [q0, q1) sees any key of [j0, j1) (both non-empty): a key is
// visible when its position is not after the query's. A tile that sees none is skipped whole,
// so a block's work is what its rows see (context parallelism's ranks balance on it).
ACTBENCH_HD bool tile_visible(const SeqPositions& queries, int64_t q0, int64_t q1, const SeqPositions& keys,
                              int64_t j0, int64_t j1) {
  return first_position(keys, j0, j1) <= last_position(queries, q0, q1);
}

ACTBENCH_HD int64_t clamp_rows(int64_t v, int64_t hi) { return v < 0 ? 0 : v > hi ? hi : v; }

// Below, rows [0, run1) are the first run (position first + j) and rows [run1, n) the second
// (position second + j - split), run1 = split clamped to [0, n).

// Keys [0, end) hold every key at or before position q_last (each run of key positions
// increases, so the visible keys of a run are a prefix of it): the key loop's bound.
ACTBENCH_HD int64_t visible_keys_end(const SeqPositions& keys, int64_t Sk, int64_t q_last) {
  const int64_t run1 = clamp_rows(keys.split, Sk);
  if (run1 < Sk) {  // the second run's visible prefix ends after the first run
    const int64_t seen2 = clamp_rows(q_last - keys.second + keys.split + 1 - run1, Sk - run1);
    if (seen2 > 0) return run1 + seen2;
  }
  return clamp_rows(q_last - keys.first + 1, run1);
}

// Queries [begin, S) hold every query at or after position k_first (the visible queries of a
// run are a suffix of it): where the dK/dV pass starts.
ACTBENCH_HD int64_t first_seeing_query(const SeqPositions& queries, int64_t S, int64_t k_first) {
  const int64_t run1 = clamp_rows(queries.split, S);
  const int64_t from1 = k_first - queries.first;
  if (from1 < run1) return from1 < 0 ? 0 : from1;
  if (run1 == S) return S;  // one run (split past the rows: no second position to read)
  return run1 + clamp_rows(k_first - queries.second + queries.split - run1, S - run1);
}

}  // namespace actbench::cuda::attention_tiles
