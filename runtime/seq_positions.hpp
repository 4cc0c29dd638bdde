#pragma once
// Where the rows of a sequence dimension sit in the whole sequence. Context parallelism gives
// each of its C ranks two of the sequence's 2C chunks (rank i holds chunks i and 2C-1-i, so
// that every rank does the same share of the causal attention): its rows are two runs of
// consecutive positions. Kernels that depend on a row's position (the causal mask, RoPE, the
// canonical dropout index) take one of these; the default is the identity.
#include <cstdint>
#include <limits>

#include "runtime/philox.hpp"  // ACTBENCH_HD

namespace actbench {

struct SeqPositions {
  // Local row l is at position l < split ? first + l : second + (l - split).
  int64_t split = std::numeric_limits<int64_t>::max();
  int64_t first = 0, second = 0;

  ACTBENCH_HD int64_t at(int64_t l) const { return l < split ? first + l : second + (l - split); }

  // Rows [0, chunk) at first_start.., rows [chunk, ..) at second_start..
  static SeqPositions chunks(int64_t chunk, int64_t first_start, int64_t second_start) {
    return SeqPositions{chunk, first_start, second_start};
  }
  // Rows [0, n) at offset.. (one run).
  static SeqPositions run(int64_t offset) { return SeqPositions{std::numeric_limits<int64_t>::max(), offset, 0}; }
  // The positions of rows offset, offset + 1, ... of these: a piece of them (sequence
  // parallelism's share of a context-parallel rank's rows).
  SeqPositions from(int64_t offset) const {
    if (offset < split) {
      const int64_t s = split == std::numeric_limits<int64_t>::max() ? split : split - offset;
      return SeqPositions{s, first + offset, second};
    }
    return run(second + (offset - split));
  }
  // Rows [0, n) as at most two runs of consecutive positions: {rows, position} of each.
  struct Run {
    int64_t row = 0, rows = 0, position = 0;
  };
  int runs(int64_t n, Run out[2]) const {
    if (n <= 0) return 0;
    if (split >= n) {
      out[0] = {0, n, first};
      return 1;
    }
    if (split <= 0) {
      out[0] = {0, n, at(0)};
      return 1;
    }
    out[0] = {0, split, first};
    out[1] = {split, n - split, second};
    return 2;
  }
  // True when every row of [0, n) is at its own index.
  bool is_identity(int64_t n) const { return first == 0 && (split >= n || second == split); }
  bool operator==(const SeqPositions&) const = default;
};

}  // namespace actbench
