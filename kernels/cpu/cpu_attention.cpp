#include "kernels/cpu/cpu_attention.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

namespace actbench::cpu {
namespace {

constexpr double kNoKey = -std::numeric_limits<double>::infinity();
std::atomic<int64_t> g_scores{0};

// The local index of probability (bh, query row i, key row j) in the spec's [B, T, T] space:
// both rows at their place in the whole sequence.
int64_t probability_index(const AttentionShape& s, int64_t bh, int64_t i, int64_t j) {
  const int64_t T = s.total();
  return (bh * T + s.rows.queries.at(i)) * T + s.rows.keys.at(j);
}

}  // namespace

int64_t attention_score_count() { return g_scores.load(); }

void attention_fwd(const float* q, const float* k, const float* v, const AttentionShape& shape, float scale,
                   const DropoutSpec& spec, float* out, float* lse) {
  const int64_t S = shape.S, Sk = shape.Sk, D = shape.D, Dv = shape.v_dim();
  const bool dropout = spec.p > 0.f;
  const double keep_scale = spec.scale();
  std::vector<double> acc(static_cast<size_t>(Dv)), tile_scores(static_cast<size_t>(kAttentionTile));
  for (int64_t bh = 0; bh < shape.B; ++bh) {
    const float* qb = q + bh * S * D;
    const float* kb = k + (bh / shape.group) * Sk * D;
    const float* vb = v + (bh / shape.group) * Sk * Dv;
    for (int64_t i = 0; i < S; ++i) {
      const float* qi = qb + i * D;
      const int64_t q_pos = shape.rows.queries.at(i);
      double running_max = kNoKey, running_sum = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      // One tile of keys at a time; a key is seen when it is not after the query (causal).
      for (int64_t j0 = 0; j0 < Sk; j0 += kAttentionTile) {
        const int64_t j1 = std::min(j0 + kAttentionTile, Sk);
        double tile_max = kNoKey;
        for (int64_t j = j0; j < j1; ++j) {
          if (shape.rows.keys.at(j) > q_pos) continue;
          g_scores.fetch_add(1, std::memory_order_relaxed);
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(qi[d]) * kb[j * D + d];
          tile_scores[static_cast<size_t>(j - j0)] = dot * scale;
          tile_max = std::max(tile_max, dot * scale);
        }
        if (tile_max == kNoKey) continue;  // no visible key in this tile
        const double new_max = std::max(running_max, tile_max);
        const double correction = std::exp(running_max - new_max);  // exp(-inf) = 0 on the first tile
        running_sum *= correction;
        for (double& a : acc) a *= correction;
        for (int64_t j = j0; j < j1; ++j) {
          if (shape.rows.keys.at(j) > q_pos) continue;
          const double e = std::exp(tile_scores[static_cast<size_t>(j - j0)] - new_max);
          running_sum += e;  // the softmax normaliser counts every probability, dropped or not
          if (dropout && !spec.keep(probability_index(shape, bh, i, j))) continue;
          const double w = dropout ? e * keep_scale : e;
          for (int64_t d = 0; d < Dv; ++d) acc[static_cast<size_t>(d)] += w * vb[j * Dv + d];
        }
        running_max = new_max;
      }
      // A row that saw no key (a context-parallel block after it) is empty: out 0, lse -inf.
      const bool seen = running_sum > 0;
      for (int64_t d = 0; d < Dv; ++d)
        out[(bh * S + i) * Dv + d] = seen ? static_cast<float>(acc[static_cast<size_t>(d)] / running_sum) : 0.f;
      lse[bh * S + i] = seen ? static_cast<float>(running_max + std::log(running_sum)) : static_cast<float>(kNoKey);
    }
  }
}

void attention_bwd(const float* q, const float* k, const float* v, const float* out, const float* dout,
                   const float* lse, const AttentionShape& shape, float scale, const DropoutSpec& spec, float* dq,
                   float* dk, float* dv) {
  const int64_t S = shape.S, Sk = shape.Sk, D = shape.D, Dv = shape.v_dim(), group = shape.group;
  const bool dropout = spec.p > 0.f;
  const double keep_scale = spec.scale();
  const size_t nq = static_cast<size_t>(S * D), nk = static_cast<size_t>(Sk * D), nv = static_cast<size_t>(Sk * Dv);
  std::vector<double> dq_acc(nq), dk_acc(nk), dv_acc(nv);
  for (int64_t kvb = 0; kvb < shape.B / group; ++kvb) {
    const int64_t kv_base = kvb * Sk * D, v_base = kvb * Sk * Dv;
    std::fill(dk_acc.begin(), dk_acc.end(), 0.0);  // summed over the group's query batches
    std::fill(dv_acc.begin(), dv_acc.end(), 0.0);
    for (int64_t bh = kvb * group; bh < (kvb + 1) * group; ++bh) {
      const int64_t base = bh * S * D, out_base = bh * S * Dv;
      std::fill(dq_acc.begin(), dq_acc.end(), 0.0);
      for (int64_t i = 0; i < S; ++i) {
        const float* qi = q + base + i * D;
        const float* doi = dout + out_base + i * Dv;
        const int64_t q_pos = shape.rows.queries.at(i);
        const double row_lse = lse[bh * S + i];
        if (row_lse == kNoKey) continue;  // the row saw no key at all
        // sum_j P_ij dP_ij = rowsum(dO * O): no row of probabilities is needed for it.
        double delta = 0;
        for (int64_t d = 0; d < Dv; ++d) delta += static_cast<double>(doi[d]) * out[out_base + i * Dv + d];
        for (int64_t j = 0; j < Sk; ++j) {
          if (shape.rows.keys.at(j) > q_pos) continue;
          g_scores.fetch_add(1, std::memory_order_relaxed);
          const float* kj = k + kv_base + j * D;
          const float* vj = v + v_base + j * Dv;
          double dot = 0, dp_dropped = 0;
          for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(qi[d]) * kj[d];
          for (int64_t d = 0; d < Dv; ++d) dp_dropped += static_cast<double>(doi[d]) * vj[d];
          const double p = std::exp(dot * scale - row_lse);  // recomputed probability
          const bool kept = !dropout || spec.keep(probability_index(shape, bh, i, j));
          const double mult = kept ? (dropout ? keep_scale : 1.0) : 0.0;
          const double ds = p * (dp_dropped * mult - delta);
          for (int64_t d = 0; d < Dv; ++d) dv_acc[static_cast<size_t>(j * Dv + d)] += p * mult * doi[d];
          for (int64_t d = 0; d < D; ++d) {
            dq_acc[static_cast<size_t>(i * D + d)] += scale * ds * kj[d];
            dk_acc[static_cast<size_t>(j * D + d)] += scale * ds * qi[d];
          }
        }
      }
      for (size_t e = 0; e < nq; ++e) dq[base + static_cast<int64_t>(e)] = static_cast<float>(dq_acc[e]);
    }
    for (size_t e = 0; e < nk; ++e) dk[kv_base + static_cast<int64_t>(e)] = static_cast<float>(dk_acc[e]);
    for (size_t e = 0; e < nv; ++e) dv[v_base + static_cast<int64_t>(e)] = static_cast<float>(dv_acc[e]);
  }
}

}  // namespace actbench::cpu
