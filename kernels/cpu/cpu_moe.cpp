// The mixture-of-experts ops on the CPU (cpu_moe.hpp). Loops over tokens and experts in a
// fixed order, so every result (the choice of experts, which pairs an expert drops, the sums
// of the combine) is the same on every run.
#include "kernels/cpu/cpu_moe.hpp"

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

namespace actbench::cpu {
namespace {

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapRM = Eigen::Map<RowMajor>;
using ConstMapRM = Eigen::Map<const RowMajor>;

constexpr double kNormEpsilon = 1e-20;  // Megatron-Core's guard of the top-k weights' sum

// A score for ranking: NaN ranks below everything, so it is never preferred.
float rank_key(float v) { return std::isnan(v) ? -std::numeric_limits<float>::infinity() : v; }

// The first `count` of `ids` by key, highest first, ties to the lower id; `ids` is reordered.
void top_by_key(std::vector<int64_t>& ids, int64_t count, const std::vector<float>& key) {
  std::partial_sort(ids.begin(), ids.begin() + count, ids.end(), [&](int64_t a, int64_t b) {
    const float ka = rank_key(key[static_cast<size_t>(a)]), kb = rank_key(key[static_cast<size_t>(b)]);
    return ka > kb || (ka == kb && a < b);
  });
}

// scores[e] = softmax or sigmoid of one row of logits.
void score_row(const float* logits, int64_t E, MoeRouting::Score fn, float* scores) {
  if (fn == MoeRouting::Score::sigmoid) {
    for (int64_t e = 0; e < E; ++e) scores[e] = 1.f / (1.f + std::exp(-logits[e]));
    return;
  }
  float mx = logits[0];
  for (int64_t e = 1; e < E; ++e) mx = std::max(mx, logits[e]);
  double sum = 0;
  for (int64_t e = 0; e < E; ++e) {
    scores[e] = std::exp(logits[e] - mx);  // max subtracted: exp never overflows
    sum += scores[e];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t e = 0; e < E; ++e) scores[e] *= inv;
}

// The experts that may be chosen: all, or those of the group_top_k best groups, a group
// scored by the sum of its (up to) two best keys.
std::vector<int64_t> candidates(const std::vector<float>& key, int64_t E, const MoeRouting& r) {
  std::vector<int64_t> experts(static_cast<size_t>(E));
  std::iota(experts.begin(), experts.end(), 0);
  if (r.num_groups <= 1) return experts;
  const int64_t size = E / r.num_groups, best = std::min<int64_t>(2, size);
  std::vector<float> group_key(static_cast<size_t>(r.num_groups));
  for (int64_t g = 0; g < r.num_groups; ++g) {
    std::vector<int64_t> members(experts.begin() + g * size, experts.begin() + (g + 1) * size);
    top_by_key(members, best, key);
    float sum = 0.f;
    for (int64_t i = 0; i < best; ++i) sum += rank_key(key[static_cast<size_t>(members[static_cast<size_t>(i)])]);
    group_key[static_cast<size_t>(g)] = sum;
  }
  std::vector<int64_t> groups(static_cast<size_t>(r.num_groups));
  std::iota(groups.begin(), groups.end(), 0);
  top_by_key(groups, r.group_top_k, group_key);
  std::sort(groups.begin(), groups.begin() + r.group_top_k);  // experts stay in index order
  std::vector<int64_t> allowed;
  for (int64_t i = 0; i < r.group_top_k; ++i)
    for (int64_t e = 0; e < size; ++e) allowed.push_back(groups[static_cast<size_t>(i)] * size + e);
  return allowed;
}

}  // namespace

void moe_route(const float* logits, const float* bias, int64_t T, int64_t E, const MoeRouting& r, float* scores,
               int32_t* index, float* weight, float* aux) {
  const int64_t k = r.top_k;
  std::vector<float> key(static_cast<size_t>(E));
  std::vector<double> chosen(static_cast<size_t>(E), 0.0), mean_score(static_cast<size_t>(E), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    float* s = scores + t * E;
    score_row(logits + t * E, E, r.score, s);
    for (int64_t e = 0; e < E; ++e) key[static_cast<size_t>(e)] = bias ? s[e] + bias[e] : s[e];
    std::vector<int64_t> experts = candidates(key, E, r);
    top_by_key(experts, k, key);
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += s[experts[static_cast<size_t>(j)]];
    const double norm = r.normalize ? 1.0 / (sum + kNormEpsilon) : 1.0;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = experts[static_cast<size_t>(j)];
      index[t * k + j] = static_cast<int32_t>(e);
      weight[t * k + j] = static_cast<float>(s[e] * norm * r.scaling);
      chosen[static_cast<size_t>(e)] += 1;
    }
    double row_sum = 0;  // P_e reads each row divided by its sum (sigmoid rows do not sum to 1)
    for (int64_t e = 0; e < E; ++e) row_sum += s[e];
    for (int64_t e = 0; e < E; ++e) mean_score[static_cast<size_t>(e)] += s[e] / (row_sum + kNormEpsilon);
  }
  if (!aux) return;
  double loss = 0;  // E * sum_e f_e P_e, f_e = chosen_e / (T k), P_e = mean_score_e / T
  for (int64_t e = 0; e < E; ++e) loss += chosen[static_cast<size_t>(e)] * mean_score[static_cast<size_t>(e)];
  aux[0] = T > 0 ? static_cast<float>(static_cast<double>(E) * loss / (static_cast<double>(T * k) * T)) : 0.f;
}

void moe_route_bwd(const float* d_weight, const float* scores, const int32_t* index, int64_t T, int64_t E,
                   const MoeRouting& r, float* d_logits) {
  const int64_t k = r.top_k;
  std::vector<double> d_score(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* s = scores + t * E;
    const float* dw = d_weight + t * k;
    const int32_t* idx = index + t * k;
    for (int64_t j = 0; j < k; ++j)
      if (idx[j] < 0 || idx[j] >= E)
        throw InvalidArgument("moe_route_bwd: topk_index holds expert " + std::to_string(idx[j]) + ", outside [0, " +
                              std::to_string(E) + ")");
    // w_j = c g_j / S (S = sum g + eps) when normalised: dg_j = c (dw_j - sum_i dw_i g_i / S) / S.
    double sum = 0, dot = 0;
    for (int64_t j = 0; j < k; ++j) {
      sum += s[idx[j]];
      dot += static_cast<double>(dw[j]) * s[idx[j]];
    }
    std::fill(d_score.begin(), d_score.end(), 0.0);
    for (int64_t j = 0; j < k; ++j) {
      const double S = sum + kNormEpsilon;
      const double dg = r.normalize ? (dw[j] - dot / S) / S : dw[j];
      d_score[static_cast<size_t>(idx[j])] += r.scaling * dg;
    }
    float* dl = d_logits + t * E;
    if (r.score == MoeRouting::Score::sigmoid) {
      for (int64_t e = 0; e < E; ++e) dl[e] = static_cast<float>(d_score[static_cast<size_t>(e)] * s[e] * (1.0 - s[e]));
      continue;
    }
    double inner = 0;  // softmax: dl = s (ds - sum_e s_e ds_e)
    for (int64_t e = 0; e < E; ++e) inner += s[e] * d_score[static_cast<size_t>(e)];
    for (int64_t e = 0; e < E; ++e) dl[e] = static_cast<float>(s[e] * (d_score[static_cast<size_t>(e)] - inner));
  }
}

void moe_dispatch(const int32_t* index, int64_t T, int64_t k, int64_t E, std::optional<int64_t> capacity,
                  int32_t* tokens_per_expert, int32_t* row_slot, int32_t* slot_row) {
  const int64_t limit = capacity.value_or(std::numeric_limits<int64_t>::max());
  // Each pair's place among its expert's kept pairs, in token order; -1 once the expert is full.
  std::vector<int64_t> kept(static_cast<size_t>(E), 0), place(static_cast<size_t>(T * k), -1);
  for (int64_t p = 0; p < T * k; ++p) {
    const int32_t e = index[p];
    if (e < 0 || e >= E)
      throw InvalidArgument("moe_dispatch: topk_index holds expert " + std::to_string(e) + ", outside [0, " +
                            std::to_string(E) + ")");
    if (kept[static_cast<size_t>(e)] < limit) place[static_cast<size_t>(p)] = kept[static_cast<size_t>(e)]++;
  }
  std::vector<int64_t> first_row(static_cast<size_t>(E), 0);  // expert e's rows start here
  for (int64_t e = 1; e < E; ++e)
    first_row[static_cast<size_t>(e)] = first_row[static_cast<size_t>(e - 1)] + kept[static_cast<size_t>(e - 1)];
  for (int64_t e = 0; e < E; ++e) tokens_per_expert[e] = static_cast<int32_t>(kept[static_cast<size_t>(e)]);
  std::fill(row_slot, row_slot + T * k, -1);
  for (int64_t p = 0; p < T * k; ++p) {
    const int64_t at = place[static_cast<size_t>(p)];
    const int64_t row = at < 0 ? -1 : first_row[static_cast<size_t>(index[p])] + at;
    slot_row[p] = static_cast<int32_t>(row);
    if (row >= 0) row_slot[row] = static_cast<int32_t>(p);
  }
}

int64_t moe_plan_rows(const int32_t* tokens_per_expert, int64_t E, int64_t rows, const char* op, const char* what) {
  int64_t n = 0;
  for (int64_t e = 0; e < E; ++e) {
    if (tokens_per_expert[e] < 0)
      throw InvalidArgument(std::string(op) + ": tokens_per_expert[" + std::to_string(e) + "] is negative (" +
                            std::to_string(tokens_per_expert[e]) + ")");
    n += tokens_per_expert[e];
  }
  if (n != rows)
    throw InvalidArgument(std::string(op) + ": tokens_per_expert sums to " + std::to_string(n) + " rows, " + what +
                          " has " + std::to_string(rows));
  return n;
}

void moe_permute(const void* x, const int32_t* row_slot, int64_t N, int64_t k, int64_t h, size_t element, void* out) {
  const size_t run = static_cast<size_t>(h) * element;
  for (int64_t r = 0; r < N; ++r)
    std::memcpy(static_cast<char*>(out) + static_cast<size_t>(r) * run,
                static_cast<const char*>(x) + static_cast<size_t>(row_slot[r] / k) * run, run);
}

void moe_permute_bwd(const float* d_out, const int32_t* slot_row, int64_t T, int64_t k, int64_t h, float* dx) {
  std::vector<double> acc(static_cast<size_t>(h));
  for (int64_t t = 0; t < T; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t row = slot_row[t * k + j];
      if (row < 0) continue;  // dropped: no gradient
      for (int64_t i = 0; i < h; ++i) acc[static_cast<size_t>(i)] += d_out[row * h + i];
    }
    for (int64_t i = 0; i < h; ++i) dx[t * h + i] = static_cast<float>(acc[static_cast<size_t>(i)]);
  }
}

void moe_unpermute(const float* y, const int32_t* slot_row, const float* weight, int64_t T, int64_t k, int64_t h,
                   float* out) {
  std::vector<double> acc(static_cast<size_t>(h));
  for (int64_t t = 0; t < T; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t row = slot_row[t * k + j];
      if (row < 0) continue;
      const double w = weight[t * k + j];
      for (int64_t i = 0; i < h; ++i) acc[static_cast<size_t>(i)] += w * y[row * h + i];
    }
    for (int64_t i = 0; i < h; ++i) out[t * h + i] = static_cast<float>(acc[static_cast<size_t>(i)]);
  }
}

void moe_unpermute_bwd(const float* d_out, const float* y, const int32_t* slot_row, const float* weight, int64_t T,
                       int64_t k, int64_t h, float* dy, float* d_weight) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t row = slot_row[t * k + j];
      if (row < 0) {
        d_weight[t * k + j] = 0.f;
        continue;
      }
      const float w = weight[t * k + j];
      double dot = 0;
      for (int64_t i = 0; i < h; ++i) {
        dy[row * h + i] = w * d_out[t * h + i];
        dot += static_cast<double>(d_out[t * h + i]) * y[row * h + i];
      }
      d_weight[t * k + j] = static_cast<float>(dot);
    }
}

void moe_weight_rows(const float* x, const float* weight, int64_t N, int64_t w, float* y) {
  for (int64_t r = 0; r < N; ++r)
    for (int64_t i = 0; i < w; ++i) y[r * w + i] = weight[r] * x[r * w + i];
}

void moe_weight_rows_bwd(const float* dy, const float* x, const float* weight, int64_t N, int64_t w, float* dx,
                         float* d_weight) {
  for (int64_t r = 0; r < N; ++r) {
    double dot = 0;
    for (int64_t i = 0; i < w; ++i) {  // x read before dx is written: dx may be x
      dot += static_cast<double>(dy[r * w + i]) * x[r * w + i];
      dx[r * w + i] = weight[r] * dy[r * w + i];
    }
    d_weight[r] = static_cast<float>(dot);
  }
}

void grouped_gemm(const float* x, const float* w, const int32_t* counts, int64_t E, int64_t in, int64_t out,
                  float* y) {
  int64_t row = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = counts[e];
    if (n == 0) continue;
    const ConstMapRM X(x + row * in, n, in), W(w + e * in * out, in, out);
    MapRM Y(y + row * out, n, out);
    Y.noalias() = X * W;
    row += n;
  }
}

void grouped_gemm_bwd(const float* dy, const float* x, const float* w, const int32_t* counts, int64_t E, int64_t in,
                      int64_t out, float* dx, float* dw) {
  int64_t row = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = counts[e];
    MapRM dW(dw + e * in * out, in, out);
    if (n == 0) {
      dW.setZero();  // no rows, no gradient: written, like every other expert's
      continue;
    }
    const ConstMapRM X(x + row * in, n, in), W(w + e * in * out, in, out), dY(dy + row * out, n, out);
    MapRM dX(dx + row * in, n, in);
    dX.noalias() = dY * W.transpose();
    dW.noalias() = X.transpose() * dY;
    row += n;
  }
}

}  // namespace actbench::cpu
