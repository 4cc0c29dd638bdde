// Host-side checks of what the CUDA kernels share with the CPU or assume about it, so that they
// run without a GPU (label cpu): the Philox words of one call serving four elements, the
// index facts the dropout and attention kernels rely on to draw fewer words, 64-bit counters at
// long-sequence sizes, and the long-row softmax's running max/sum with -inf and NaN scores.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/backend.hpp"
#include "dropout_specs.hpp"
#include "kernels/cuda/attention_tiles.hpp"
#include "kernels/cuda/dropout_cursor.hpp"
#include "kernels/cuda/online_softmax.hpp"
#include "kernels/cuda/philox_groups.hpp"
#include "runtime/philox.hpp"

namespace actbench {
namespace {

using actbench::testing::make_spec;

// Attention-probability specs at p = 0.1.
DropoutSpec spec_of(int64_t outer, int64_t mid_local, int64_t mid_global, int64_t mid_offset, int64_t inner) {
  return make_spec(0.1f, outer, mid_local, mid_global, mid_offset, inner, kSiteAttnProbs);
}

constexpr float kInf = std::numeric_limits<float>::infinity();

// dropout_common.cuh: one philox_words4 call at counter block gives the words of indices
// 4*block .. 4*block + 3, bit for bit philox_word's.
TEST(CudaHost, PhiloxGroupsOfFourAreThePerElementWords) {
  for (uint64_t block : {0ull, 1ull, 77ull, (1ull << 32) + 5, 0xFFFFFFFFFFull, (1ull << 61) + 3})
    for (uint32_t site : {kSiteAttnProbs, kSiteAttnOut, kSiteMlpOut}) {
      const Philox4 w = philox_words4(42, 7, site, block);
      for (uint32_t k = 0; k < 4; ++k) EXPECT_EQ(w.v[k], philox_word(42, 7, site, 4 * block + k)) << block;
    }
}

// philox_word picks its word by selects (no run-time index into an array: local memory on
// the GPU); each lane is that word.
TEST(CudaHost, PhiloxLaneSelectsEachWord) {
  const Philox4 p{{0x11111111u, 0x22222222u, 0x33333333u, 0x44444444u}};
  for (uint32_t k = 0; k < 4; ++k) EXPECT_EQ(philox_lane(p, k), p.v[k]) << k;
}

// dropout_for_each<true> (taken when spec.inner % 4 == 0): the local elements 4g .. 4g+3 are
// the canonical indices c .. c+3 with c % 4 == 0, and numel % 4 == 0 (no tail is left out).
TEST(CudaHost, DropoutGroupsOfFourAreFourConsecutiveCanonicalIndices) {
  const DropoutSpec specs[] = {spec_of(3, 5, 11, 4, 36), spec_of(1, 14, 42, 28, 44), spec_of(2, 3, 40000, 30000, 700000),
                               spec_of(7, 1, 1, 0, 4), spec_of(2, 8, 16, 8, 32768LL * 32768)};
  for (const DropoutSpec& s : specs) {
    ASSERT_EQ(s.inner % 4, 0);
    ASSERT_EQ(s.numel() % 4, 0);
    const int64_t groups = s.numel() / 4;
    // Every group of the small specs; the first, last and some middle ones of the big ones.
    std::vector<int64_t> gs;
    if (groups <= 4096) {
      for (int64_t g = 0; g < groups; ++g) gs.push_back(g);
    } else {
      for (int64_t g : {int64_t{0}, int64_t{1}, groups / 3, groups / 2 + 7, groups - 2, groups - 1}) gs.push_back(g);
    }
    for (int64_t g : gs) {
      const int64_t c = s.canonical_index(4 * g);
      ASSERT_EQ(c % 4, 0) << "group " << g;
      for (int64_t k = 1; k < 4; ++k) ASSERT_EQ(s.canonical_index(4 * g + k), c + k) << "group " << g;
    }
  }
}

// dropout_common.cuh's loops: a DropoutCursor started at any element and advanced by a fixed
// step (a grid stride, a row of a bias band) gives every element's canonical index, whether
// the step is below one inner row or spans several mid slices and outer blocks.
TEST(CudaHost, DropoutCursorAdvancesToEachCanonicalIndex) {
  const DropoutSpec specs[] = {spec_of(3, 5, 11, 4, 36), spec_of(1, 14, 42, 28, 44), spec_of(4, 3, 7, 2, 5),
                               spec_of(2, 8, 64, 8, 2048LL * 2048), spec_of(1, 256, 8192, 0, 6144)};
  for (const DropoutSpec& s : specs)
    for (int64_t start : {int64_t{0}, int64_t{3}, int64_t{40}, s.numel() / 3})
      for (int64_t step : {int64_t{1}, int64_t{8}, int64_t{36}, int64_t{44} * 7, s.inner, s.inner * s.mid_local + 8,
                           int64_t{2048} * 256 * 8}) {
        DropoutCursor at = DropoutCursor::at(s, start);
        const DropoutCursor by = DropoutCursor::at(s, step);
        for (int64_t i = start, n = 0; i < s.numel() && n < 2000; i += step, ++n, at.advance(s, by))
          ASSERT_EQ(at.canonical(s), static_cast<uint64_t>(s.canonical_index(i)))
              << "inner " << s.inner << " start " << start << " step " << step << " element " << i;
      }
}

// The same with the inner elements placed in a longer inner dimension (context parallelism's
// two chunks of rows of each head's [T, T]): the cursor's inner digit stays local and the
// canonical index jumps at the split. Where dropout_groups_of(spec, n) holds, every group of n
// from a multiple of n is n consecutive canonical indices from a multiple of n.
TEST(CudaHost, DropoutCursorFollowsPlacedInnerElements) {
  auto placed = [](int64_t mid_local, int64_t c, int64_t C, int64_t rank, int64_t T) {
    DropoutSpec s = spec_of(1, mid_local, mid_local + 2, 1, 2 * c * T);
    s.inner_global = T * T;
    s.inner_positions = SeqPositions::chunks(c * T, rank * c * T, (2 * C - 1 - rank) * c * T);
    return s;
  };
  const DropoutSpec specs[] = {placed(2, 4, 2, 0, 16), placed(3, 5, 2, 1, 20), placed(2, 3, 3, 2, 13),
                               placed(4, 7, 4, 1, 56)};
  for (const DropoutSpec& s : specs) {
    for (int64_t start : {int64_t{0}, int64_t{5}, s.inner - 1, s.numel() / 3})
      for (int64_t step : {int64_t{1}, int64_t{4}, int64_t{8}, s.inner / 2 + 3, s.inner + 8}) {
        DropoutCursor at = DropoutCursor::at(s, start);
        const DropoutCursor by = DropoutCursor::at(s, step);
        for (int64_t i = start; i < s.numel(); i += step, at.advance(s, by))
          ASSERT_EQ(at.canonical(s), static_cast<uint64_t>(s.canonical_index(i)))
              << "inner " << s.inner << " start " << start << " step " << step << " element " << i;
      }
    for (int64_t n : {4, 8}) {
      if (!dropout_groups_of(s, n)) continue;
      for (int64_t g = 0; g < s.numel() / n; ++g) {
        const int64_t c = s.canonical_index(n * g);
        ASSERT_EQ(c % n, 0) << "inner " << s.inner << " n " << n << " group " << g;
        for (int64_t k = 1; k < n; ++k) ASSERT_EQ(s.canonical_index(n * g + k), c + k) << "group " << g;
      }
    }
  }
  // The packs these specs take: 8 (runs at multiples of 8), 4 (a run starts at 4 mod 8), none.
  EXPECT_TRUE(dropout_groups_of(specs[0], 8));
  EXPECT_FALSE(dropout_groups_of(specs[1], 8));
  EXPECT_TRUE(dropout_groups_of(specs[1], 4));
  EXPECT_FALSE(dropout_groups_of(specs[2], 4));
}

// attention.cu's loop bounds for rows placed in a longer sequence: the key loop ends after the
// last key a query tile may see, the dK/dV loop starts at the first query that may see a key
// tile (exactly, against a search over the rows), so a block visits what its rows see.
TEST(CudaHost, AttentionTileBoundsAreTheVisibleRows) {
  const int64_t n = 40;
  const SeqPositions placements[] = {SeqPositions{},          SeqPositions::chunks(10, 0, 30),
                                     SeqPositions::chunks(10, 10, 20), SeqPositions::chunks(15, 5, 60),
                                     SeqPositions::run(17),   SeqPositions::chunks(0, 0, 9)};
  for (const SeqPositions& p : placements)
    for (int64_t limit = -2; limit < 110; ++limit) {
      int64_t end = 0, begin = n;
      for (int64_t j = 0; j < n; ++j) {
        if (p.at(j) <= limit) end = j + 1;
        if (p.at(j) >= limit && begin == n) begin = j;
      }
      EXPECT_EQ(cuda::attention_tiles::visible_keys_end(p, n, limit), end) << "split " << p.split << " " << limit;
      EXPECT_EQ(cuda::attention_tiles::first_seeing_query(p, n, limit), begin) << "split " << p.split << " " << limit;
    }
}

// The forward's tiles of a context-parallel rank against every key (all-gather): chunks of 128
// rows, whole tiles, so each of C ranks visits the same number of (query, key) tile pairs.
TEST(CudaHost, ContextParallelRanksVisitTheSameAttentionTiles) {
  namespace tiles = cuda::attention_tiles;
  const int64_t c = 128;
  for (int64_t C : {2, 4}) {
    const int64_t T = 2 * C * c, S = 2 * c;
    std::vector<int64_t> visited;
    for (int64_t rank = 0; rank < C; ++rank) {
      const SeqPositions q = SeqPositions::chunks(c, rank * c, (2 * C - 1 - rank) * c), k;
      int64_t pairs = 0;
      for (int64_t q0 = 0; q0 < S; q0 += tiles::kFwdRows) {
        const int64_t q1 = std::min<int64_t>(q0 + tiles::kFwdRows, S);
        const int64_t keys_end = tiles::visible_keys_end(k, T, tiles::last_position(q, q0, q1));
        for (int64_t j0 = 0; j0 < keys_end; j0 += tiles::kFwdKeys)
          pairs += tiles::tile_visible(q, q0, q1, k, j0, std::min<int64_t>(j0 + tiles::kFwdKeys, T)) ? 1 : 0;
      }
      visited.push_back(pairs);
    }
    for (int64_t rank = 1; rank < C; ++rank) EXPECT_EQ(visited[rank], visited[0]) << "C " << C << " rank " << rank;
    // and together they visit what the whole sequence's causal attention visits
    EXPECT_EQ(visited[0] * C, (T / 64) * (T / 64 + 1) / 2) << "C " << C;
  }
}

// attention.cu's AttnDropout: when (mid_local * inner) % (S * S) == 0 ("uniform"), the
// canonical index of every element of head bh's [S, S] block is its local index plus the
// offset of the block's first element.
TEST(CudaHost, AttentionUniformDropoutOffsetIsConstantPerHead) {
  struct Case {
    DropoutSpec spec;
    int64_t S;
  };
  const Case cases[] = {{spec_of(1, 3, 7, 2, 37 * 37), 37},            // heads 2..5 of 7 (tensor parallel)
                        {spec_of(4, 2, 8, 6, 5 * 5), 5},               // batch 4, heads 6..8 of 8
                        {spec_of(2, 1, 3, 1, 2 * 9 * 9), 9}};          // two heads per mid slice
  for (const Case& c : cases) {
    const DropoutSpec& s = c.spec;
    const int64_t S = c.S, heads = s.numel() / (S * S);
    ASSERT_EQ((s.mid_local * s.inner) % (S * S), 0);
    for (int64_t bh = 0; bh < heads; ++bh) {
      const int64_t first = bh * S * S, offset = s.canonical_index(first) - first;
      for (int64_t e = 0; e < S * S; ++e) ASSERT_EQ(s.canonical_index(first + e), first + e + offset) << bh << " " << e;
    }
  }
}

// At s = 32k the [b*heads, S, S] probabilities have 4*8*32768^2 = 3.4e10 > 2^31 elements: the
// local index, the canonical index and the Philox counter are 64-bit all the way.
TEST(CudaHost, LongSequenceIndicesAreSixtyFourBit) {
  const int64_t S = 32768, b = 4, heads_local = 8, heads = 16, offset = 8;
  const DropoutSpec s = spec_of(b, heads_local, heads, offset, S * S);
  EXPECT_EQ(s.numel(), b * heads_local * S * S);
  EXPECT_GT(s.numel(), int64_t{1} << 34);
  const int64_t bh = b * heads_local - 1, i = S - 1, j = S - 2;
  const int64_t local = (bh * S + i) * S + j;  // the attention kernels' index, in int64
  const int64_t o = bh / heads_local, m = bh % heads_local;
  EXPECT_EQ(s.canonical_index(local), ((o * heads + offset + m) * S + i) * S + j);
  // The counter's high word takes part: not the word of the index truncated to 32 bits.
  const uint64_t c = static_cast<uint64_t>(s.canonical_index(local));
  ASSERT_GT(c >> 2, uint64_t{0xFFFFFFFF});
  EXPECT_NE(philox_word(s.seed, s.layer, s.site, c), philox_word(s.seed, s.layer, s.site, c & 0xFFFFFFFFull));
}

// softmax.cu's long-row path: each thread folds its scores into (m, s) one at a time.
void fold(const std::vector<float>& xs, float& m, float& s) {
  m = -kInf;
  s = 0.f;
  for (float x : xs) cuda::online_max_sum_add(m, s, x);
}

TEST(CudaHost, OnlineMaxSumSkipsMinusInfinityAndKeepsNaN) {
  const std::vector<std::vector<float>> rows = {
      {1.f, 2.f, 3.f},           {-kInf, 1.f, 2.f},      {-kInf, -kInf, 0.5f, -3.f},
      {3.f, -kInf, 1.f, -kInf},  {-2.f, 40.f, -kInf, 39.f}, {-kInf, -80.f, -81.f}};
  for (const auto& xs : rows) {
    float m, s;
    fold(xs, m, s);
    double mx = -INFINITY, ref = 0;
    for (float x : xs) mx = std::max(mx, static_cast<double>(x));
    for (float x : xs) ref += std::exp(static_cast<double>(x) - mx);
    EXPECT_EQ(m, static_cast<float>(mx));
    ASSERT_FALSE(std::isnan(s)) << "a row starting with -inf must not turn NaN";
    EXPECT_NEAR(s, ref, 1e-5 * ref);
  }
  // Nothing finite: m stays -inf and s 0, which the block reduction adds as 0.
  float m, s;
  fold({-kInf, -kInf}, m, s);
  EXPECT_EQ(m, -kInf);
  EXPECT_EQ(s, 0.f);
  fold({}, m, s);
  EXPECT_EQ(s, 0.f);
  // A NaN score poisons the sum (the whole row is NaN, as on the CPU), wherever it is.
  for (const std::vector<float>& xs : {std::vector<float>{std::nanf(""), 1.f}, std::vector<float>{1.f, std::nanf("")},
                                       std::vector<float>{-kInf, std::nanf(""), -kInf}}) {
    fold(xs, m, s);
    EXPECT_TRUE(std::isnan(s));
  }
}

}  // namespace
}  // namespace actbench
