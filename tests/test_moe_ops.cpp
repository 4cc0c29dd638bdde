// The mixture-of-experts ops (docs/moe.md): their contract on cpu and meta (one line naming
// the op for every bad shape, k > E, a capacity factor <= 0), and on cpu their values against
// float64 references written here from the definitions: routing (softmax and sigmoid, score
// bias, groups, normalisation, scaling, the aux loss), tie-breaking to the lower expert, the
// stable permutation, capacity dropping (each expert keeps its first pairs in token order),
// the combine, the grouped GEMMs, and every backward against central finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "moe_routing_args.hpp"
#include "runtime/error.hpp"
#include "contract_checks.hpp"
#include "reference_math.hpp"

using namespace actbench;
using actbench::testing::moe_routing;

namespace {

using actbench::testing::close, actbench::testing::finite_difference, actbench::testing::random_vec,
    actbench::testing::Tol, actbench::testing::Vec;
using Ints = std::vector<int>;
constexpr DType f32 = DType::fp32, bf16 = DType::bf16, i32 = DType::i32;

constexpr Tol kFp32{1e-5, 1e-5};
constexpr Tol kFp32Grad{1e-5, 1e-4};  // backward vs finite differences: a few more fp32 roundings

// ---- float64 references, from the definitions (docs/moe.md) ----

struct RouteRef {
  Vec scores, weight;
  Ints index;
  double aux = 0;
};

Vec scores_ref(const Vec& logits, int64_t T, int64_t E, MoeRouting::Score fn) {
  Vec s(logits.size());
  for (int64_t t = 0; t < T; ++t) {
    const double* l = logits.data() + t * E;
    if (fn == MoeRouting::Score::sigmoid) {
      for (int64_t e = 0; e < E; ++e) s[t * E + e] = 1.0 / (1.0 + std::exp(-l[e]));
      continue;
    }
    double mx = l[0], sum = 0;
    for (int64_t e = 1; e < E; ++e) mx = std::max(mx, l[e]);
    for (int64_t e = 0; e < E; ++e) sum += std::exp(l[e] - mx);
    for (int64_t e = 0; e < E; ++e) s[t * E + e] = std::exp(l[e] - mx) / sum;
  }
  return s;
}

// The k best of `ids` by key, ties to the lower id (a plain selection sort: obviously right).
Ints best(Ints ids, int64_t k, const Vec& key) {
  Ints out;
  for (int64_t j = 0; j < k; ++j) {
    size_t at = 0;
    for (size_t i = 1; i < ids.size(); ++i)
      if (key[static_cast<size_t>(ids[i])] > key[static_cast<size_t>(ids[at])]) at = i;  // strict: earlier wins ties
    out.push_back(ids[at]);
    ids.erase(ids.begin() + static_cast<long>(at));
  }
  return out;
}

// The weights of a given choice of experts (what backward differentiates: the choice is fixed).
Vec weights_ref(const Vec& logits, const Ints& index, int64_t T, int64_t E, const MoeRouting& r) {
  const Vec s = scores_ref(logits, T, E, r.score);
  const int64_t k = r.top_k;
  Vec w(static_cast<size_t>(T * k));
  for (int64_t t = 0; t < T; ++t) {
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += s[static_cast<size_t>(t * E + index[static_cast<size_t>(t * k + j)])];
    for (int64_t j = 0; j < k; ++j) {
      const double g = s[static_cast<size_t>(t * E + index[static_cast<size_t>(t * k + j)])];
      w[static_cast<size_t>(t * k + j)] = (r.normalize ? g / (sum + 1e-20) : g) * r.scaling;
    }
  }
  return w;
}

RouteRef route_ref(const Vec& logits, const Vec& bias, int64_t T, int64_t E, const MoeRouting& r) {
  RouteRef out;
  out.scores = scores_ref(logits, T, E, r.score);
  const int64_t k = r.top_k, size = E / r.num_groups;
  Vec chosen(static_cast<size_t>(E), 0.0), mean(static_cast<size_t>(E), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    Vec key(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) key[e] = out.scores[t * E + e] + (bias.empty() ? 0.0 : bias[e]);
    Ints allowed;
    if (r.num_groups > 1) {
      Vec group_key(static_cast<size_t>(r.num_groups));
      for (int g = 0; g < r.num_groups; ++g) {
        Ints members(static_cast<size_t>(size));
        std::iota(members.begin(), members.end(), g * static_cast<int>(size));
        for (int e : best(members, std::min<int64_t>(2, size), key)) group_key[g] += key[e];
      }
      Ints groups(static_cast<size_t>(r.num_groups));
      std::iota(groups.begin(), groups.end(), 0);
      Ints top = best(groups, r.group_top_k, group_key);
      std::sort(top.begin(), top.end());
      for (int g : top)
        for (int64_t e = 0; e < size; ++e) allowed.push_back(g * static_cast<int>(size) + static_cast<int>(e));
    } else {
      allowed.resize(static_cast<size_t>(E));
      std::iota(allowed.begin(), allowed.end(), 0);
    }
    for (int e : best(allowed, k, key)) {
      out.index.push_back(e);
      chosen[e] += 1;
    }
    double row = 0;
    for (int64_t e = 0; e < E; ++e) row += out.scores[t * E + e];
    for (int64_t e = 0; e < E; ++e) mean[e] += out.scores[t * E + e] / row / T;
  }
  out.weight = weights_ref(logits, out.index, T, E, r);
  for (int64_t e = 0; e < E; ++e) out.aux += E * (chosen[e] / static_cast<double>(T * k)) * mean[e];
  return out;
}

class MoeOps : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_cpu_backend();

  Tensor make(const Vec& v, Shape shape, DType dtype = f32) {
    Tensor t = be->empty(std::move(shape), dtype);
    EXPECT_EQ(static_cast<size_t>(t.numel()), v.size());
    const std::vector<float> f(v.begin(), v.end());
    be->upload(f.data(), t);
    return t;
  }
  Tensor ints(const Ints& v, Shape shape) { return make(Vec(v.begin(), v.end()), std::move(shape), i32); }
  // Poisoned: NaN floats, 0xABABABAB ints, so an element an op forgets to write shows.
  Tensor out(Shape shape, DType dtype = f32) {
    Tensor t = be->empty(std::move(shape), dtype);
    if (dtype == i32) {
      std::memset(t.data(), 0xAB, t.bytes());
      return t;
    }
    return make(Vec(static_cast<size_t>(shape_numel(t.shape())), NAN), t.shape(), dtype);
  }
  Vec read(const Tensor& t) {
    std::vector<float> f(static_cast<size_t>(t.numel()));
    be->download(t, f.data());
    return Vec(f.begin(), f.end());
  }
  Ints read_ints(const Tensor& t) {
    const int32_t* p = t.data_as<const int32_t>();
    return Ints(p, p + t.numel());
  }
  MoeDispatch plan_of(const Ints& index, int64_t T, int64_t k, int64_t E, std::optional<double> cf = {}) {
    MoeDispatch plan = make_moe_dispatch(*be, T, k, E);
    for (const Tensor* t : {&plan.tokens_per_expert, &plan.row_slot, &plan.slot_row})
      std::memset(t->data(), 0xAB, t->bytes());
    be->moe_dispatch(ints(index, {T, k}), cf, plan);
    return plan;
  }
  struct Routed {
    Tensor scores, index, weight, aux;
  };
  Routed route(const Vec& logits, const Vec& bias, int64_t T, int64_t E, const MoeRouting& r) {
    Routed o{out({T, E}), out({T, r.top_k}, i32), out({T, r.top_k}), out({1})};
    be->moe_route(make(logits, {T, E}), bias.empty() ? Tensor() : make(bias, {E}), r, o.scores, o.index, o.weight,
                  o.aux);
    return o;
  }
};

constexpr auto kSoftmax = MoeRouting::Score::softmax;
constexpr auto kSigmoid = MoeRouting::Score::sigmoid;

// ---- routing ---------------------------------------------------------------------------------

TEST_F(MoeOps, RoutingMatchesFloat64ForEveryOption) {
  const int64_t T = 7, E = 8;
  const Vec logits = random_vec(T * E, 1, -3, 3), bias = random_vec(E, 2, -0.2, 0.2);
  const std::vector<std::pair<std::string, MoeRouting>> cases = {
      {"softmax top-1", moe_routing(kSoftmax, 1)},
      {"softmax top-2 (Mixtral: normalised)", moe_routing(kSoftmax, 2, true)},
      {"softmax top-3 unnormalised (Qwen2-MoE)", moe_routing(kSoftmax, 3)},
      {"sigmoid top-2 normalised scaled (DeepSeek-V3)", moe_routing(kSigmoid, 2, true, 2.5f)},
      {"sigmoid top-3 in 2 of 4 groups", moe_routing(kSigmoid, 3, true, 1.f, 4, 2)},
      {"softmax top-8 of 8", moe_routing(kSoftmax, 8, true)},
  };
  for (const auto& [name, r] : cases)
    for (const bool with_bias : {false, true}) {
      SCOPED_TRACE(name + (with_bias ? " with bias" : ""));
      const Vec b = with_bias ? bias : Vec{};
      const RouteRef ref = route_ref(logits, b, T, E, r);
      const Routed got = route(logits, b, T, E, r);
      EXPECT_EQ(read_ints(got.index), ref.index);
      EXPECT_TRUE(close(read(got.scores), ref.scores, kFp32));
      EXPECT_TRUE(close(read(got.weight), ref.weight, kFp32));
      EXPECT_NEAR(read(got.aux)[0], ref.aux, 1e-5);
    }
}

TEST_F(MoeOps, TiesGoToTheLowerExpertAndGroup) {
  // Every score equal: experts 0, 1, 2 in that order.
  Routed o = route(Vec(8, 0.5), {}, 1, 8, moe_routing(kSoftmax, 3));
  EXPECT_EQ(read_ints(o.index), (Ints{0, 1, 2}));
  // Experts 5 and 2 tie for the best, 6 and 1 for the next: 2, 5, 1, 6.
  o = route({0, 1, 3, 0, 0, 3, 1, 0}, {}, 1, 8, moe_routing(kSoftmax, 4));
  EXPECT_EQ(read_ints(o.index), (Ints{2, 5, 1, 6}));
  // Groups {0,1} {2,3} {4,5} {6,7}: groups 1 and 3 tie best; then the experts tie: 2, 3, 6.
  o = route({0, 0, 2, 2, 0, 0, 2, 2}, {}, 1, 8, moe_routing(kSigmoid, 3, false, 1.f, 4, 2));
  EXPECT_EQ(read_ints(o.index), (Ints{2, 3, 6}));
}

TEST_F(MoeOps, ScoreBiasChangesTheChoiceNotTheWeights) {
  const Vec logits = {2, 1, 0, -1};
  const MoeRouting r = moe_routing(kSigmoid, 1);
  Routed plain = route(logits, {}, 1, 4, r), biased = route(logits, {0, 0, 0, 5}, 1, 4, r);
  EXPECT_EQ(read_ints(plain.index), (Ints{0}));
  EXPECT_EQ(read_ints(biased.index), (Ints{3}));
  EXPECT_NEAR(read(biased.weight)[0], 1.0 / (1.0 + std::exp(1.0)), 1e-7);  // sigmoid(-1): unbiased
  EXPECT_EQ(read(plain.scores), read(biased.scores));
}

TEST_F(MoeOps, NormalisedWeightsSumToTheScaling) {
  const int64_t T = 5, E = 6;
  const Routed o = route(random_vec(T * E, 3, -2, 2), {}, T, E, moe_routing(kSigmoid, 3, true, 2.5f));
  const Vec w = read(o.weight);
  for (int64_t t = 0; t < T; ++t) EXPECT_NEAR(w[t * 3] + w[t * 3 + 1] + w[t * 3 + 2], 2.5, 1e-6);
}

TEST_F(MoeOps, AuxLossIsOneForUniformRouting) {
  // Equal scores and each expert picked equally often (f_e = P_e = 1/E): E * sum f P = 1.
  const int64_t E = 4;
  Vec logits(4 * E, 0.0);
  const Routed o = route(logits, {}, 4, E, moe_routing(kSoftmax, 1));  // all pick expert 0 (ties)
  EXPECT_NEAR(read(o.aux)[0], 1.0 * E * (1.0 / E), 1e-6);          // f_0 = 1, P_0 = 1/4: E * 1/4 = 1
  for (int64_t t = 0; t < 4; ++t) logits[t * E + t] = 30;         // token t picks expert t, P nearly one-hot
  EXPECT_NEAR(read(route(logits, {}, 4, E, moe_routing(kSoftmax, 1)).aux)[0], 1.0, 1e-6);
}

TEST_F(MoeOps, RoutingOnBf16Storage) {
  const int64_t T = 6, E = 8;
  const Vec logits = random_vec(T * E, 4, -3, 3);
  const MoeRouting r = moe_routing(kSoftmax, 2, true);
  Tensor L = make(logits, {T, E}, bf16), S = out({T, E}, bf16), I = out({T, 2}, i32), W = out({T, 2}, bf16);
  be->moe_route(L, Tensor(), r, S, I, W, Tensor());  // no aux wanted
  const RouteRef ref = route_ref(read(L), {}, T, E, r);  // the bf16-rounded logits
  EXPECT_EQ(read_ints(I), ref.index);
  EXPECT_TRUE(close(read(S), ref.scores, {1e-3, 1e-2}));
  EXPECT_TRUE(close(read(W), ref.weight, {1e-3, 1e-2}));
}

TEST_F(MoeOps, RoutingBackwardMatchesFiniteDifferences) {
  const int64_t T = 5, E = 6;
  const Vec logits = random_vec(T * E, 5, -2, 2);
  for (const MoeRouting& r : {moe_routing(kSoftmax, 2), moe_routing(kSoftmax, 2, true), moe_routing(kSigmoid, 3, true, 2.5f),
                              moe_routing(kSigmoid, 1, false, 1.5f), moe_routing(kSoftmax, 1, true)}) {
    SCOPED_TRACE(std::string(moe_score_name(r.score)) + " k=" + std::to_string(r.top_k) +
                 (r.normalize ? " normalised" : ""));
    const Routed o = route(logits, {}, T, E, r);
    const Ints index = read_ints(o.index);
    const Vec dw = random_vec(T * r.top_k, 6);
    Tensor dL = out({T, E});
    be->moe_route_bwd(make(dw, {T, r.top_k}), o.scores, o.index, r, dL);
    const Vec fd = finite_difference([&](const Vec& l) { return weights_ref(l, index, T, E, r); }, logits, dw);
    EXPECT_TRUE(close(read(dL), fd, kFp32Grad));
  }
}

// ---- the dispatch plan -----------------------------------------------------------------------

TEST_F(MoeOps, DroplessPlanGroupsByExpertInTokenOrder) {
  // 4 tokens, k = 2, 3 experts.
  const Ints index = {2, 0, 0, 1, 2, 1, 0, 2};
  const MoeDispatch plan = plan_of(index, 4, 2, 3);
  EXPECT_EQ(read_ints(plan.tokens_per_expert), (Ints{3, 2, 3}));
  // Expert 0: pairs 1 (t0), 2 (t1), 6 (t3); expert 1: 3 (t1), 5 (t2); expert 2: 0 (t0), 4 (t2), 7 (t3).
  EXPECT_EQ(read_ints(plan.row_slot), (Ints{1, 2, 6, 3, 5, 0, 4, 7}));
  EXPECT_EQ(read_ints(plan.slot_row), (Ints{5, 0, 1, 3, 6, 4, 2, 7}));
}

TEST_F(MoeOps, CapacityKeepsEachExpertsFirstPairsInTokenOrder) {
  EXPECT_EQ(moe_expert_capacity(4, 2, 3, 1.0), 3);    // ceil(8 / 3)
  EXPECT_EQ(moe_expert_capacity(4, 2, 4, 1.0), 2);    // exactly 2
  EXPECT_EQ(moe_expert_capacity(4, 2, 4, 0.5), 1);
  EXPECT_EQ(moe_expert_capacity(10, 1, 4, 1.25), 4);  // ceil(3.125)
  EXPECT_EQ(moe_expert_capacity(0, 2, 4, 1.0), 0);
  // 5 tokens, k = 2, 4 experts, factor 0.5: capacity ceil(10 / 4 * 0.5) = 2.
  const Ints index = {0, 1, 0, 2, 0, 1, 3, 0, 1, 0};
  const MoeDispatch plan = plan_of(index, 5, 2, 4, 0.5);
  // Expert 0 is picked by t0, t1, t2, t3, t4: keeps t0, t1; expert 1 by t0, t2, t4: keeps t0, t2.
  EXPECT_EQ(read_ints(plan.tokens_per_expert), (Ints{2, 2, 1, 1}));
  EXPECT_EQ(read_ints(plan.slot_row), (Ints{0, 2, 1, 4, -1, 3, 5, -1, -1, -1}));
  EXPECT_EQ(read_ints(plan.row_slot), (Ints{0, 2, 1, 5, 3, 6, -1, -1, -1, -1}));
  const Ints kept = read_ints(plan.tokens_per_expert);
  EXPECT_EQ(10 - std::accumulate(kept.begin(), kept.end(), 0), 4);  // the dropped pairs
  // A factor large enough drops nothing: the dropless plan.
  EXPECT_EQ(read_ints(plan_of(index, 5, 2, 4, 2.0).slot_row), read_ints(plan_of(index, 5, 2, 4).slot_row));
}

TEST_F(MoeOps, PlanRefusesExpertsOutsideE) {
  MoeDispatch plan = make_moe_dispatch(*be, 2, 1, 3);
  try {
    be->moe_dispatch(ints({0, 3}, {2, 1}), {}, plan);
    ADD_FAILURE() << "expert 3 of 3 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "moe_dispatch: topk_index holds expert 3, outside [0, 3)");
  }
}

// ---- permute and the weighted combine --------------------------------------------------------

TEST_F(MoeOps, PermuteAndCombineMoveTheRightRows) {
  const int64_t T = 5, k = 2, E = 4, h = 3;
  const Ints index = {0, 1, 0, 2, 0, 1, 3, 0, 1, 0};
  const MoeDispatch plan = plan_of(index, T, k, E, 0.5);  // 6 rows kept (above)
  const Ints row_slot = read_ints(plan.row_slot), slot_row = read_ints(plan.slot_row);
  const Vec x = random_vec(T * h, 7), w = random_vec(T * k, 8, 0, 1);
  Tensor X = make(x, {T, h}), P = out({6, h});
  be->moe_permute(X, plan, P);
  const Vec stored = read(X);
  Vec want(6 * h);
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t i = 0; i < h; ++i) want[r * h + i] = stored[(row_slot[r] / k) * h + i];
  EXPECT_EQ(read(P), want);  // copies: exact

  const Vec y = random_vec(6 * h, 9);
  Tensor O = out({T, h});
  be->moe_unpermute(make(y, {6, h}), plan, make(w, {T, k}), O);
  Vec combined(T * h, 0.0);
  for (int64_t p = 0; p < T * k; ++p)
    if (slot_row[p] >= 0)
      for (int64_t i = 0; i < h; ++i) combined[(p / k) * h + i] += w[p] * y[slot_row[p] * h + i];
  EXPECT_TRUE(close(read(O), combined, kFp32));
  // t4 lost both pairs (experts 0 and 1 full): its output is 0.
  EXPECT_EQ(slot_row[8], -1);
  EXPECT_EQ(slot_row[9], -1);
  for (int64_t i = 0; i < h; ++i) EXPECT_EQ(read(O)[4 * h + i], 0.0);
}

TEST_F(MoeOps, PermuteKeepsBf16BitsAndRefusesAWrongRowCount) {
  const MoeDispatch plan = plan_of({1, 0, 1}, 3, 1, 2);
  Tensor X = make(random_vec(3 * 4, 10), {3, 4}, bf16), P = out({3, 4}, bf16);
  be->moe_permute(X, plan, P);
  const Vec x = read(X), p = read(P);
  EXPECT_EQ(Vec(p.begin(), p.begin() + 4), Vec(x.begin() + 4, x.begin() + 8));  // expert 0: token 1
  try {
    be->moe_permute(X, plan, out({2, 4}, bf16));
    ADD_FAILURE() << "2 rows for a plan of 3 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "moe_permute: tokens_per_expert sums to 3 rows, out has 2");
  }
}

TEST_F(MoeOps, PermuteAndCombineBackwardsMatchFiniteDifferences) {
  const int64_t T = 5, k = 2, E = 4, h = 3, N = 6;
  const MoeDispatch plan = plan_of({0, 1, 0, 2, 0, 1, 3, 0, 1, 0}, T, k, E, 0.5);
  const Ints slot_row = read_ints(plan.slot_row), row_slot = read_ints(plan.row_slot);
  const Vec x = random_vec(T * h, 11), y = random_vec(N * h, 12), w = random_vec(T * k, 13);
  const Vec g_t = random_vec(T * h, 14), g_n = random_vec(N * h, 15);
  auto permute = [&](const Vec& v) {
    Vec o(N * h);
    for (int64_t r = 0; r < N; ++r)
      for (int64_t i = 0; i < h; ++i) o[r * h + i] = v[(row_slot[r] / k) * h + i];
    return o;
  };
  auto combine = [&](const Vec& yy, const Vec& ww) {
    Vec o(T * h, 0.0);
    for (int64_t p = 0; p < T * k; ++p)
      if (slot_row[p] >= 0)
        for (int64_t i = 0; i < h; ++i) o[(p / k) * h + i] += ww[p] * yy[slot_row[p] * h + i];
    return o;
  };
  Tensor dX = out({T, h});
  be->moe_permute_bwd(make(g_n, {N, h}), plan, dX);
  EXPECT_TRUE(close(read(dX), finite_difference(permute, x, g_n), kFp32Grad));

  Tensor dY = out({N, h}), dW = out({T, k});
  be->moe_unpermute_bwd(make(g_t, {T, h}), make(y, {N, h}), plan, make(w, {T, k}), dY, dW);
  EXPECT_TRUE(close(read(dY), finite_difference([&](const Vec& v) { return combine(v, w); }, y, g_t), kFp32Grad));
  EXPECT_TRUE(close(read(dW), finite_difference([&](const Vec& v) { return combine(y, v); }, w, g_t), kFp32Grad));
}

TEST_F(MoeOps, WeightRowsAndItsBackwardMatchFiniteDifferences) {
  const int64_t N = 5, w = 7;
  const Vec x = random_vec(N * w, 21), p = random_vec(N, 22), g = random_vec(N * w, 23);
  auto weighted = [&](const Vec& xx, const Vec& pp) {
    Vec o(N * w);
    for (int64_t r = 0; r < N; ++r)
      for (int64_t i = 0; i < w; ++i) o[r * w + i] = pp[r] * xx[r * w + i];
    return o;
  };
  Tensor Y = out({N, w});
  be->moe_weight_rows(make(x, {N, w}), make(p, {N, 1}), Y);
  EXPECT_TRUE(close(read(Y), weighted(x, p), kFp32Grad));
  Tensor dX = out({N, w}), dP = out({N, 1});
  be->moe_weight_rows_bwd(make(g, {N, w}), make(x, {N, w}), make(p, {N, 1}), dX, dP);
  EXPECT_TRUE(close(read(dX), finite_difference([&](const Vec& v) { return weighted(v, p); }, x, g), kFp32Grad));
  EXPECT_TRUE(close(read(dP), finite_difference([&](const Vec& v) { return weighted(x, v); }, p, g), kFp32Grad));
  // In place (dx the x it reads, as the layer's backward runs it): the same values.
  Tensor inplace = make(x, {N, w}), dP2 = out({N, 1});
  be->moe_weight_rows_bwd(make(g, {N, w}), inplace, make(p, {N, 1}), inplace, dP2);
  EXPECT_EQ(read(inplace), read(dX));
  EXPECT_EQ(read(dP2), read(dP));
}

// ---- grouped GEMM ----------------------------------------------------------------------------

Vec grouped_ref(const Vec& x, const Vec& w, const Ints& counts, int64_t in, int64_t out) {
  const int64_t N = static_cast<int64_t>(x.size()) / in;
  Vec y(static_cast<size_t>(N * out), 0.0);
  int64_t row = 0;
  for (size_t e = 0; e < counts.size(); ++e)
    for (int64_t n = 0; n < counts[e]; ++n, ++row)
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i) y[row * out + o] += x[row * in + i] * w[(e * in + i) * out + o];
  return y;
}

TEST_F(MoeOps, GroupedGemmForwardAndBackward) {
  const Ints counts = {3, 0, 1, 4};  // an expert with no rows
  const int64_t E = 4, N = 8, in = 5, outw = 6;
  const Vec x = random_vec(N * in, 16), w = random_vec(E * in * outw, 17), dy = random_vec(N * outw, 18);
  Tensor X = make(x, {N, in}), W = make(w, {E, in, outw}), C = ints(counts, {E}), Y = out({N, outw});
  be->grouped_gemm(X, W, C, Y);
  EXPECT_TRUE(close(read(Y), grouped_ref(x, w, counts, in, outw), kFp32));

  Tensor dX = out({N, in}), dW = out({E, in, outw});
  be->grouped_gemm_bwd(make(dy, {N, outw}), X, W, C, dX, dW);
  const auto of_x = [&](const Vec& v) { return grouped_ref(v, w, counts, in, outw); };
  const auto of_w = [&](const Vec& v) { return grouped_ref(x, v, counts, in, outw); };
  EXPECT_TRUE(close(read(dX), finite_difference(of_x, x, dy), kFp32Grad));
  EXPECT_TRUE(close(read(dW), finite_difference(of_w, w, dy), kFp32Grad));  // expert 1's: written as zeros

  try {
    be->grouped_gemm(X, W, ints({3, 0, 1, 3}, {E}), Y);
    ADD_FAILURE() << "counts of 7 rows for x of 8 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "grouped_gemm: tokens_per_expert sums to 7 rows, x has 8");
  }
}

// ---- the contract, on cpu and meta -----------------------------------------------------------

class MoeContract : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { be_ = make_backend(GetParam()); }
  Tensor t(Shape shape, DType dt = f32) { return be_->zeros(std::move(shape), dt); }

  void accepts(const std::function<void()>& call, const std::string& what) {
    EXPECT_NO_THROW(call()) << GetParam() << " refused valid arguments: " << what;
  }
  void refuses(const std::string& op, const std::string& mentions, const std::function<void()>& call) {
    actbench::testing::expect_refused(GetParam(), op, mentions, call);
  }
  std::unique_ptr<Backend> be_;
};

TEST_P(MoeContract, Route) {
  const int64_t T = 4, E = 8;
  Tensor L = t({T, E}), S = t({T, E}), I = t({T, 2}, i32), W = t({T, 2}), aux = t({1}), bias = t({E});
  const MoeRouting r = moe_routing(kSigmoid, 2, true, 2.5f, 4, 2);
  accepts([&] { be_->moe_route(L, bias, r, S, I, W, aux); }, "moe_route");
  accepts([&] { be_->moe_route(L, Tensor(), r, S, I, W, Tensor()); }, "moe_route without bias and aux");
  accepts([&] { be_->moe_route_bwd(W, S, I, r, L); }, "moe_route_bwd");

  MoeRouting bad = r;
  bad.top_k = 9;
  refuses("moe_route", "top_k must be in [1, E = 8], got 9", [&] { be_->moe_route(L, bias, bad, S, I, W, aux); });
  refuses("moe_route_bwd", "top_k must be in [1, E = 8], got 9", [&] { be_->moe_route_bwd(W, S, I, bad, L); });
  bad = r;
  bad.top_k = 0;
  refuses("moe_route", "top_k must be in [1, E = 8], got 0", [&] { be_->moe_route(L, bias, bad, S, I, W, aux); });
  bad = r;
  bad.num_groups = 3;
  refuses("moe_route", "num_groups must divide the 8 experts", [&] { be_->moe_route(L, bias, bad, S, I, W, aux); });
  bad = r;
  bad.group_top_k = 5;
  refuses("moe_route", "group_top_k must be in [1, num_groups = 4]",
          [&] { be_->moe_route(L, bias, bad, S, I, W, aux); });
  bad = moe_routing(kSigmoid, 3, false, 1.f, 4, 1);  // one group of 2 experts cannot give 3
  refuses("moe_route", "top_k 3 exceeds the 2 experts",
          [&] { be_->moe_route(L, bias, bad, S, t({T, 3}, i32), t({T, 3}), aux); });
  bad = r;
  bad.scaling = 0.f;
  refuses("moe_route", "scaling must be positive", [&] { be_->moe_route(L, bias, bad, S, I, W, aux); });

  refuses("moe_route", "logits must be [T, E]", [&] { be_->moe_route(t({T}), bias, r, S, I, W, aux); });
  refuses("moe_route", "scores must be [4, 8] like logits", [&] { be_->moe_route(L, bias, r, t({T, 7}), I, W, aux); });
  refuses("moe_route", "topk_index must be [T, top_k] = [4, 2], got [4, 3]",
          [&] { be_->moe_route(L, bias, r, S, t({T, 3}, i32), W, aux); });
  refuses("moe_route", "topk_index must be i32, got fp32", [&] { be_->moe_route(L, bias, r, S, t({T, 2}), W, aux); });
  refuses("moe_route", "topk_weight must be a float tensor (bf16, fp16 or fp32), not i32",
          [&] { be_->moe_route(L, bias, r, S, I, t({T, 2}, i32), aux); });
  refuses("moe_route", "bias must be [E] = [8]", [&] { be_->moe_route(L, t({7}), r, S, I, W, aux); });
  refuses("moe_route", "aux_loss must be fp32", [&] { be_->moe_route(L, bias, r, S, I, W, t({1}, bf16)); });
  refuses("moe_route_bwd", "d_topk_weight must be [T, top_k]", [&] { be_->moe_route_bwd(t({T, 3}), S, I, r, L); });
  refuses("moe_route_bwd", "d_logits must be [4, 8] like scores", [&] { be_->moe_route_bwd(W, S, I, r, t({T, 9})); });
}

TEST_P(MoeContract, DispatchPermuteCombine) {
  const int64_t T = 4, k = 2, E = 3, h = 5, N = 6;
  Tensor index = t({T, k}, i32);
  MoeDispatch plan = make_moe_dispatch(*be_, T, k, E);
  Tensor X = t({T, h}), P = t({N, h}), Wt = t({T, k});
  // The plan's tensors: the same shapes and bytes on every backend.
  EXPECT_EQ(plan.tokens_per_expert.shape(), (Shape{E}));
  EXPECT_EQ(plan.row_slot.shape(), (Shape{T * k}));
  EXPECT_EQ(plan.slot_row.shape(), (Shape{T, k}));
  EXPECT_EQ(plan.slot_row.dtype(), i32);
  if (be_->computes()) {  // cpu reads the plan: give it one of 6 rows
    const std::vector<float> choice = {0, 1, 1, 2, 2, 0, 0, 1};
    be_->upload(choice.data(), index);
    be_->moe_dispatch(index, 0.6, plan);  // capacity ceil(8 / 3 * 0.6) = 2: 2 + 2 + 2 rows
  }
  accepts([&] { be_->moe_dispatch(index, {}, make_moe_dispatch(*be_, T, k, E)); }, "dropless moe_dispatch");
  accepts([&] { be_->moe_dispatch(index, 0.6, plan); }, "moe_dispatch with a capacity");
  accepts([&] { be_->moe_permute(X, plan, P); }, "moe_permute");
  accepts([&] { be_->moe_permute_bwd(P, plan, X); }, "moe_permute_bwd");
  accepts([&] { be_->moe_unpermute(P, plan, Wt, X); }, "moe_unpermute");
  accepts([&] { be_->moe_unpermute_bwd(X, P, plan, Wt, t({N, h}), t({T, k})); }, "moe_unpermute_bwd");

  refuses("moe_dispatch", "capacity factor must be positive and finite, got 0",
          [&] { be_->moe_dispatch(index, 0.0, plan); });
  refuses("moe_dispatch", "capacity factor must be positive and finite, got -1",
          [&] { be_->moe_dispatch(index, -1.0, plan); });
  refuses("moe_dispatch", "top_k 2 exceeds the 1 experts",
          [&] { be_->moe_dispatch(index, {}, make_moe_dispatch(*be_, T, k, 1)); });
  refuses("moe_dispatch", "topk_index must be i32", [&] { be_->moe_dispatch(t({T, k}), {}, plan); });
  refuses("moe_dispatch", "plan slot_row must be [T = 3, k]", [&] { be_->moe_dispatch(t({3, k}, i32), {}, plan); });
  refuses("moe_dispatch", "plan row_slot must be [T * k] = [8]",
          [&] { be_->moe_dispatch(index, {}, MoeDispatch{plan.tokens_per_expert, t({7}, i32), plan.slot_row}); });
  refuses("moe_dispatch", "plan tokens_per_expert must be i32",
          [&] { be_->moe_dispatch(index, {}, MoeDispatch{t({E}), plan.row_slot, plan.slot_row}); });
  refuses("moe_dispatch", "plan tokens_per_expert is undefined",
          [&] { be_->moe_dispatch(index, {}, MoeDispatch{Tensor(), plan.row_slot, plan.slot_row}); });
  refuses("moe_permute", "out must be [N, h = 5] with N <= T * k = 8, got [9, 5]",
          [&] { be_->moe_permute(X, plan, t({9, h})); });
  refuses("moe_permute", "out must be [N, h = 5]", [&] { be_->moe_permute(X, plan, t({N, 4})); });
  refuses("moe_permute", "dtypes differ", [&] { be_->moe_permute(X, plan, t({N, h}, bf16)); });
  refuses("moe_permute", "plan slot_row must be [T = 5, k]", [&] { be_->moe_permute(t({5, h}), plan, P); });
  refuses("moe_permute_bwd", "d_out must be [N, h = 5]", [&] { be_->moe_permute_bwd(t({N, 3}), plan, X); });
  refuses("moe_unpermute", "topk_weight must be [T, k] = [4, 2]", [&] { be_->moe_unpermute(P, plan, t({T, 3}), X); });
  refuses("moe_unpermute", "y must be [N, h = 5]", [&] { be_->moe_unpermute(t({N, 4}), plan, Wt, X); });
  refuses("moe_unpermute_bwd", "dy must be [6, 5] like y",
          [&] { be_->moe_unpermute_bwd(X, P, plan, Wt, t({5, h}), t({T, k})); });
  refuses("moe_unpermute_bwd", "d_topk_weight must be a float tensor",
          [&] { be_->moe_unpermute_bwd(X, P, plan, Wt, t({N, h}), t({T, k}, i32)); });

  const Tensor probs = t({N, 1});
  accepts([&] { be_->moe_weight_rows(P, probs, t({N, h})); }, "moe_weight_rows");
  accepts([&] { be_->moe_weight_rows_bwd(P, P, probs, t({N, h}), t({N, 1})); }, "moe_weight_rows_bwd");
  refuses("moe_weight_rows", "weight must be [N, 1] = [6, 1], got [6]", [&] { be_->moe_weight_rows(P, t({N}), P); });
  refuses("moe_weight_rows", "y must be [6, 5] like x", [&] { be_->moe_weight_rows(P, probs, t({N, 4})); });
  refuses("moe_weight_rows", "x must be [N, w] with w >= 1", [&] { be_->moe_weight_rows(t({N}), probs, t({N})); });
  refuses("moe_weight_rows", "weight must be a float tensor", [&] { be_->moe_weight_rows(P, t({N, 1}, i32), P); });
  refuses("moe_weight_rows_bwd", "dx must be [6, 5] like x",
          [&] { be_->moe_weight_rows_bwd(P, P, probs, t({5, h}), t({N, 1})); });
  refuses("moe_weight_rows_bwd", "d_weight must be [N, 1] = [6, 1], got [5, 1]",
          [&] { be_->moe_weight_rows_bwd(P, P, probs, P, t({5, 1})); });
}

TEST_P(MoeContract, GroupedGemm) {
  const int64_t E = 3, N = 6, in = 4, out = 5;
  Tensor X = t({N, in}), W = t({E, in, out}), C = t({E}, i32), Y = t({N, out});
  if (be_->computes()) {
    const std::vector<float> counts = {2, 0, 4};
    be_->upload(counts.data(), C);
  }
  accepts([&] { be_->grouped_gemm(X, W, C, Y); }, "grouped_gemm");
  accepts([&] { be_->grouped_gemm_bwd(Y, X, W, C, t({N, in}), t({E, in, out})); }, "grouped_gemm_bwd");

  refuses("grouped_gemm", "w must be [E, in = 4, out]", [&] { be_->grouped_gemm(X, t({E, 3, out}), C, Y); });
  refuses("grouped_gemm", "tokens_per_expert must be [E] = [3]", [&] { be_->grouped_gemm(X, W, t({2}, i32), Y); });
  refuses("grouped_gemm", "tokens_per_expert must be i32", [&] { be_->grouped_gemm(X, W, t({E}), Y); });
  refuses("grouped_gemm", "y must be [N, out] = [6, 5], got [6, 4]", [&] { be_->grouped_gemm(X, W, C, t({N, 4})); });
  refuses("grouped_gemm", "x must be [N, in]", [&] { be_->grouped_gemm(t({N}), W, C, Y); });
  refuses("grouped_gemm", "w must be a float tensor", [&] { be_->grouped_gemm(X, t({E, in, out}, i32), C, Y); });
  Tensor square = t({N, in});
  refuses("grouped_gemm", "y must not overlap x or w", [&] { be_->grouped_gemm(square, t({E, in, in}), C, square); });
  refuses("grouped_gemm_bwd", "dy must be [N, out] = [6, 5]",
          [&] { be_->grouped_gemm_bwd(t({N, 4}), X, W, C, t({N, in}), t({E, in, out})); });
  refuses("grouped_gemm_bwd", "dw must be [3, 4, 5] like w",
          [&] { be_->grouped_gemm_bwd(Y, X, W, C, t({N, in}), t({E, in, 4})); });
  refuses("grouped_gemm_bwd", "dx and dw must not overlap",
          [&] { be_->grouped_gemm_bwd(Y, X, W, C, X, t({E, in, out})); });
  // The counts on the host too (the layer's, so that a GPU need not read them back).
  accepts([&] { be_->grouped_gemm(X, W, C, Y, {2, 0, 4}); }, "grouped_gemm with host_rows");
  accepts([&] { be_->grouped_gemm_bwd(Y, X, W, C, t({N, in}), t({E, in, out}), {2, 0, 4}); },
          "grouped_gemm_bwd with host_rows");
  const std::string host = "host_rows must be E = 3 counts >= 0 summing to the 6 rows of x";
  refuses("grouped_gemm", host, [&] { be_->grouped_gemm(X, W, C, Y, {2, 4}); });
  refuses("grouped_gemm", host, [&] { be_->grouped_gemm(X, W, C, Y, {2, 1, 4}); });
  refuses("grouped_gemm_bwd", host, [&] { be_->grouped_gemm_bwd(Y, X, W, C, t({N, in}), t({E, in, out}), {-1, 3, 4}); });
  if (be_->computes())  // cpu holds the device's counts too: they must be the host's
    refuses("grouped_gemm", "host_rows[0] = 3 but tokens_per_expert holds 2",
            [&] { be_->grouped_gemm(X, W, C, Y, {3, 0, 3}); });
}

INSTANTIATE_TEST_SUITE_P(Backends, MoeContract, ::testing::Values("cpu", "meta"));

// On meta the ops touch nothing and the bytes are the same tensors' as on cpu.
TEST(MoeMeta, AllocatesWhatCpuAllocates) {
  std::map<std::string, int64_t> in_use;
  for (const std::string name : {"cpu", "meta"}) {
    auto be = make_backend(name);
    const int64_t before = be->allocator().stats().requested_bytes.current;
    MoeDispatch plan = make_moe_dispatch(*be, 16, 2, 8);
    Tensor scores = be->empty({16, 8}, f32), index = be->empty({16, 2}, i32), weight = be->empty({16, 2}, f32);
    in_use[name] = be->allocator().stats().requested_bytes.current - before;
    EXPECT_EQ(plan.tokens_per_expert.bytes() + plan.row_slot.bytes() + plan.slot_row.bytes(), (8 + 32 + 32) * 4u);
  }
  EXPECT_EQ(in_use["cpu"], in_use["meta"]);
}

}  // namespace
