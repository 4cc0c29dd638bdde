#include "kernels/cpu/cpu_attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace actbench::cpu {

void attention_fwd(const float* q, const float* k, const float* v, int64_t B, int64_t S, int64_t D, float scale,
                   const DropoutSpec& spec, float* out, float* lse, int64_t group) {
  const bool dropout = spec.p > 0.f;
  const double keep_scale = spec.scale();
  std::vector<double> acc(static_cast<size_t>(D)), tile_scores(static_cast<size_t>(kAttentionTile));
  for (int64_t bh = 0; bh < B; ++bh) {
    const float* qb = q + bh * S * D;
    const float* kb = k + (bh / group) * S * D;
    const float* vb = v + (bh / group) * S * D;
    for (int64_t i = 0; i < S; ++i) {
      const float* qi = qb + i * D;
      double running_max = -std::numeric_limits<double>::infinity(), running_sum = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      // Key tiles up to the diagonal (causal): one tile of scores at a time.
      for (int64_t j0 = 0; j0 <= i; j0 += kAttentionTile) {
        const int64_t j1 = std::min(j0 + kAttentionTile, i + 1);
        double tile_max = -std::numeric_limits<double>::infinity();
        for (int64_t j = j0; j < j1; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(qi[d]) * kb[j * D + d];
          tile_scores[static_cast<size_t>(j - j0)] = dot * scale;
          tile_max = std::max(tile_max, dot * scale);
        }
        const double new_max = std::max(running_max, tile_max);
        const double correction = std::exp(running_max - new_max);  // exp(-inf) = 0 on the first tile
        running_sum *= correction;
        for (double& a : acc) a *= correction;
        for (int64_t j = j0; j < j1; ++j) {
          const double e = std::exp(tile_scores[static_cast<size_t>(j - j0)] - new_max);
          running_sum += e;  // the softmax normaliser counts every probability, dropped or not
          if (dropout && !spec.keep((bh * S + i) * S + j)) continue;
          const double w = dropout ? e * keep_scale : e;
          for (int64_t d = 0; d < D; ++d) acc[static_cast<size_t>(d)] += w * vb[j * D + d];
        }
        running_max = new_max;
      }
      for (int64_t d = 0; d < D; ++d) out[(bh * S + i) * D + d] = static_cast<float>(acc[static_cast<size_t>(d)] / running_sum);
      lse[bh * S + i] = static_cast<float>(running_max + std::log(running_sum));
    }
  }
}

void attention_bwd(const float* q, const float* k, const float* v, const float* out, const float* dout,
                   const float* lse, int64_t B, int64_t S, int64_t D, float scale, const DropoutSpec& spec, float* dq,
                   float* dk, float* dv, int64_t group) {
  const bool dropout = spec.p > 0.f;
  const double keep_scale = spec.scale();
  const size_t n = static_cast<size_t>(S * D);
  std::vector<double> dq_acc(n), dk_acc(n), dv_acc(n);
  for (int64_t kvb = 0; kvb < B / group; ++kvb) {
    const int64_t kv_base = kvb * S * D;
    std::fill(dk_acc.begin(), dk_acc.end(), 0.0);  // summed over the group's query batches
    std::fill(dv_acc.begin(), dv_acc.end(), 0.0);
    for (int64_t bh = kvb * group; bh < (kvb + 1) * group; ++bh) {
      const int64_t base = bh * S * D;
      std::fill(dq_acc.begin(), dq_acc.end(), 0.0);
      for (int64_t i = 0; i < S; ++i) {
        const float* qi = q + base + i * D;
        const float* doi = dout + base + i * D;
        // sum_j P_ij dP_ij = rowsum(dO * O): no row of probabilities is needed for it.
        double delta = 0;
        for (int64_t d = 0; d < D; ++d) delta += static_cast<double>(doi[d]) * out[base + i * D + d];
        for (int64_t j0 = 0; j0 <= i; j0 += kAttentionTile) {
          const int64_t j1 = std::min(j0 + kAttentionTile, i + 1);
          for (int64_t j = j0; j < j1; ++j) {
            const float* kj = k + kv_base + j * D;
            const float* vj = v + kv_base + j * D;
            double dot = 0, dp_dropped = 0;
            for (int64_t d = 0; d < D; ++d) {
              dot += static_cast<double>(qi[d]) * kj[d];
              dp_dropped += static_cast<double>(doi[d]) * vj[d];
            }
            const double p = std::exp(dot * scale - lse[bh * S + i]);  // recomputed probability
            const bool kept = !dropout || spec.keep((bh * S + i) * S + j);
            const double mult = kept ? (dropout ? keep_scale : 1.0) : 0.0;
            const double ds = p * (dp_dropped * mult - delta);
            for (int64_t d = 0; d < D; ++d) {
              dv_acc[static_cast<size_t>(j * D + d)] += p * mult * doi[d];
              dq_acc[static_cast<size_t>(i * D + d)] += scale * ds * kj[d];
              dk_acc[static_cast<size_t>(j * D + d)] += scale * ds * qi[d];
            }
          }
        }
      }
      for (size_t e = 0; e < n; ++e) dq[base + static_cast<int64_t>(e)] = static_cast<float>(dq_acc[e]);
    }
    for (size_t e = 0; e < n; ++e) {
      dk[kv_base + static_cast<int64_t>(e)] = static_cast<float>(dk_acc[e]);
      dv[kv_base + static_cast<int64_t>(e)] = static_cast<float>(dv_acc[e]);
    }
  }
}

}  // namespace actbench::cpu
