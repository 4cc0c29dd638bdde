// The mixture-of-experts ops on the cuda backend against the cpu reference (docs/moe.md):
// routing (softmax and sigmoid, bias, groups, normalisation and scaling, exact ties), the
// dispatch plan (dropless and capacity dropping, over several of the kernel's chunks), permute
// and the combine with their backwards, the grouped GEMMs (an expert with no rows included),
// in fp32 and bf16. Indices and plans must be equal, permuted rows bit for bit, floats within
// fp32-accumulation tolerance; every output is NaN-poisoned first, so an element a kernel
// forgets fails. Then the composed MoE layer (layers/moe_block.cpp) on both backends.
// Without a device every test skips with one line.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/backend.hpp"
#include "moe_routing_args.hpp"
#include "kernels/backend_comm.hpp"
#include "layer_harness.hpp"
#include "runners/experiment.hpp"
#include "runtime/error.hpp"
#include "theory/llama_memory.hpp"

using namespace actbench;
using namespace actbench::testing;

namespace {

std::vector<float> random_values(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

double tol_for(DType dt) { return dt == DType::fp32 ? 1e-5 : 1e-2; }

struct RouteCase {
  const char* name;
  MoeRouting routing;
  int64_t E;
  bool bias;
};


// Every option of the router at least once, with E not a multiple of 32 and one above it.
std::vector<RouteCase> route_cases() {
  using S = MoeRouting::Score;
  return {{"softmax top-2 (Mixtral)", moe_routing(S::softmax, 2, true, 1.f), 8, false},
          {"softmax top-1 unnormalised", moe_routing(S::softmax, 1, false, 1.f), 5, false},
          {"softmax top-6 of 60, scaled", moe_routing(S::softmax, 6, false, 2.5f), 60, false},
          {"sigmoid top-3 with bias", moe_routing(S::sigmoid, 3, true, 1.f), 12, true},
          {"sigmoid groups 4 of 48, 2 chosen, bias (DeepSeek-V3)", moe_routing(S::sigmoid, 4, true, 2.5f, 4, 2), 48, true},
          {"softmax groups of one expert", moe_routing(S::softmax, 2, false, 1.f, 6, 3), 6, false},
          {"sigmoid groups, 40 groups of 2 (lanes loop)", moe_routing(S::sigmoid, 3, true, 1.f, 40, 5), 80, true}};
}

class GpuMoe : public ::testing::Test {
 protected:
  void SetUp() override {
    try {
      gpu_ = make_backend("cuda");
    } catch (const InvalidArgument&) {
      GTEST_SKIP() << "no CUDA device: GPU test skipped";
    }
    cpu_ = make_backend("cpu");
  }
  struct Both {
    Tensor g, c;
  };
  Both with_values(const Shape& shape, DType dt, const std::vector<float>& host) {
    Both t{gpu_->empty(shape, dt), cpu_->empty(shape, dt)};
    gpu_->upload(host.data(), t.g);
    cpu_->upload(host.data(), t.c);
    return t;
  }
  Both random(const Shape& shape, DType dt, float lo = -1.f, float hi = 1.f) {
    return with_values(shape, dt, random_values(static_cast<size_t>(shape_numel(shape)), seed_++, lo, hi));
  }
  // NaN floats; i32 outputs 12345 (no index or count a plan holds here).
  Both poisoned(const Shape& shape, DType dt) {
    const float poison = dt == DType::i32 ? 12345.f : std::numeric_limits<float>::quiet_NaN();
    return with_values(shape, dt, std::vector<float>(static_cast<size_t>(shape_numel(shape)), poison));
  }
  std::vector<float> get(Backend& be, const Tensor& t) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    be.download(t, v.data());
    return v;
  }
  void expect_close(const Both& t, double tol, const std::string& what) {
    const std::vector<float> g = get(*gpu_, t.g), c = get(*cpu_, t.c);
    for (float v : c) ASSERT_FALSE(std::isnan(v)) << what << ": the cpu reference holds NaN";
    EXPECT_LE(worst_ratio(g, c, tol, tol), 1.0) << what;
  }
  void expect_equal(const Both& t, const std::string& what) {
    const std::vector<float> g = get(*gpu_, t.g), c = get(*cpu_, t.c);
    ASSERT_EQ(g.size(), c.size()) << what;
    for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(g[i], c[i]) << what << " element " << i;
  }

  struct Routed {
    Both scores, index, weight, aux;
  };
  Routed route(const Both& logits, const Both* bias, const MoeRouting& r, DType dt) {
    const int64_t T = logits.c.dim(0), E = logits.c.dim(1);
    Routed out{poisoned({T, E}, dt), poisoned({T, r.top_k}, DType::i32), poisoned({T, r.top_k}, dt),
               poisoned({1}, DType::fp32)};
    gpu_->moe_route(logits.g, bias ? bias->g : Tensor(), r, out.scores.g, out.index.g, out.weight.g, out.aux.g);
    cpu_->moe_route(logits.c, bias ? bias->c : Tensor(), r, out.scores.c, out.index.c, out.weight.c, out.aux.c);
    return out;
  }
  // The cpu's plan of `index` [T, k] over E experts, and the gpu's, compared element for element.
  struct Plans {
    MoeDispatch g, c;
  };
  Plans dispatch(const Both& index, int64_t E, std::optional<double> cf) {
    const int64_t T = index.c.dim(0), k = index.c.dim(1);
    const Both tpe = poisoned({E}, DType::i32), rs = poisoned({T * k}, DType::i32), sr = poisoned({T, k}, DType::i32);
    Plans p{{tpe.g, rs.g, sr.g}, {tpe.c, rs.c, sr.c}};
    gpu_->moe_dispatch(index.g, cf, p.g);
    cpu_->moe_dispatch(index.c, cf, p.c);
    expect_equal(tpe, "tokens_per_expert");
    expect_equal(rs, "row_slot");
    expect_equal(sr, "slot_row");
    return p;
  }
  // Each token's k distinct experts, drawn (so that some experts are popular and get dropped).
  Both random_index(int64_t T, int64_t k, int64_t E) {
    std::mt19937 gen(seed_++);
    std::vector<float> idx;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int> experts(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e) experts[e] = static_cast<int>(e);
      std::shuffle(experts.begin(), experts.end(), gen);
      if (t % 3 == 0) std::sort(experts.begin(), experts.end());  // expert 0.. popular
      for (int64_t j = 0; j < k; ++j) idx.push_back(static_cast<float>(experts[j]));
    }
    return with_values({T, k}, DType::i32, idx);
  }
  int64_t kept(const MoeDispatch& plan) {
    int64_t n = 0;
    for (float c : get(*cpu_, plan.tokens_per_expert)) n += static_cast<int64_t>(c);
    return n;
  }

  std::unique_ptr<Backend> gpu_, cpu_;
  uint32_t seed_ = 26;
};

}  // namespace

TEST_F(GpuMoe, RoutingMatchesCpuForEveryRouter) {
  for (DType dt : {DType::fp32, DType::bf16})
    for (const RouteCase& rc : route_cases()) {
      const std::string what = std::string(rc.name) + " " + dtype_name(dt);
      const int64_t T = 37;
      const Both logits = random({T, rc.E}, dt, -3.f, 3.f);
      const Both bias = random({rc.E}, dt, -0.2f, 0.2f);
      const Routed r = route(logits, rc.bias ? &bias : nullptr, rc.routing, dt);
      expect_equal(r.index, what + " topk_index");
      expect_close(r.scores, tol_for(dt), what + " scores");
      expect_close(r.weight, tol_for(dt), what + " topk_weight");
      expect_close(r.aux, 1e-5, what + " aux_loss");

      const Both d_weight = random({T, rc.routing.top_k}, dt);
      const Both d_logits = poisoned({T, rc.E}, dt);
      gpu_->moe_route_bwd(d_weight.g, r.scores.g, r.index.g, rc.routing, d_logits.g);
      cpu_->moe_route_bwd(d_weight.c, r.scores.c, r.index.c, rc.routing, d_logits.c);
      expect_close(d_logits, tol_for(dt), what + " d_logits");
    }
}

TEST_F(GpuMoe, RoutingTiesGoToTheLowerExpertAndGroup) {
  // Rows of equal logits, pairs of equal logits, and groups of equal sums: the choice is
  // decided by the tie rule alone, and must be the cpu's (lower index first).
  const int64_t T = 4, E = 8;
  const std::vector<float> logits = {0, 0, 0, 0, 0, 0, 0, 0,     //
                                     1, 2, 2, 1, 0, 2, 2, 1,     //
                                     -1, 3, -1, 3, 3, -1, 3, -1,  //
                                     5, 5, 5, 5, 5, 5, 5, 5};
  for (MoeRouting::Score score : {MoeRouting::Score::softmax, MoeRouting::Score::sigmoid})
    for (int64_t groups : {1, 4}) {
      const MoeRouting r = moe_routing(score, 3, true, 1.f, groups, groups == 1 ? 1 : 2);
      const Both l = with_values({T, E}, DType::fp32, logits);
      const Routed out = route(l, nullptr, r, DType::fp32);
      const std::string what = std::string(moe_score_name(score)) + " groups " + std::to_string(groups);
      expect_equal(out.index, what + " topk_index");
      expect_close(out.weight, 1e-6, what + " topk_weight");
    }
}

TEST_F(GpuMoe, RoutingWithNanLogitsNeverPrefersThem) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Both l = with_values({2, 4}, DType::fp32, {nan, 0.5f, nan, 0.2f, 1.f, nan, 0.f, 2.f});
  const Routed out = route(l, nullptr, moe_routing(MoeRouting::Score::sigmoid, 2, false, 1.f), DType::fp32);
  expect_equal(out.index, "topk_index");
}

TEST_F(GpuMoe, DispatchPlanEqualsCpuDroplessAndWithCapacity) {
  // 300 tokens x 2 choices: 600 pairs, three of the kernel's chunks of 256.
  for (const auto& [T, k, E] : {std::tuple<int64_t, int64_t, int64_t>{300, 2, 7}, {13, 3, 5}, {1, 1, 1}, {40, 4, 33}})
    for (std::optional<double> cf : {std::optional<double>(), std::optional<double>(0.5), std::optional<double>(1.0),
                                     std::optional<double>(1.3)}) {
      SCOPED_TRACE("T " + std::to_string(T) + " k " + std::to_string(k) + " E " + std::to_string(E) + " cf " +
                   (cf ? std::to_string(*cf) : std::string("dropless")));
      const Plans p = dispatch(random_index(T, k, E), E, cf);
      if (!cf) {
        EXPECT_EQ(kept(p.c), T * k);
      } else if (*cf == 0.5 && E > 1) {
        EXPECT_LT(kept(p.c), T * k) << "the case drops nothing: it tests nothing";
      }
    }
}

TEST_F(GpuMoe, DispatchRefusesAnExpertOutsideTheRange) {
  const Both index = with_values({3, 2}, DType::i32, {0, 1, 2, 4, 1, 0});
  MoeDispatch plan = make_moe_dispatch(*gpu_, 3, 2, 4);
  try {
    gpu_->moe_dispatch(index.g, std::nullopt, plan);
    FAIL() << "expert 4 of 4 was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "moe_dispatch: topk_index holds expert 4, outside [0, 4)");
  }
}

TEST_F(GpuMoe, PermuteAndCombineForwardBackward) {
  for (DType dt : {DType::fp32, DType::bf16})
    for (std::optional<double> cf : {std::optional<double>(), std::optional<double>(0.6)}) {
      const std::string what = std::string(dtype_name(dt)) + (cf ? " capacity 0.6" : " dropless");
      const int64_t T = 45, k = 2, E = 6;
      for (int64_t h : {24, 37}) {  // 16-byte rows in fp32 and bf16; rows of odd width
        const Plans p = dispatch(random_index(T, k, E), E, cf);
        const int64_t N = kept(p.c);
        const Both x = random({T, h}, dt), permuted = poisoned({N, h}, dt);
        gpu_->moe_permute(x.g, p.g, permuted.g);
        cpu_->moe_permute(x.c, p.c, permuted.c);
        expect_equal(permuted, what + " permute h " + std::to_string(h));

        const Both d_perm = random({N, h}, dt), dx = poisoned({T, h}, dt);
        gpu_->moe_permute_bwd(d_perm.g, p.g, dx.g);
        cpu_->moe_permute_bwd(d_perm.c, p.c, dx.c);
        expect_close(dx, tol_for(dt), what + " permute_bwd");

        const Both y = random({N, h}, dt), weight = random({T, k}, dt, 0.f, 1.f), out = poisoned({T, h}, dt);
        gpu_->moe_unpermute(y.g, p.g, weight.g, out.g);
        cpu_->moe_unpermute(y.c, p.c, weight.c, out.c);
        expect_close(out, tol_for(dt), what + " unpermute");

        const Both d_out = random({T, h}, dt), dy = poisoned({N, h}, dt), dw = poisoned({T, k}, dt);
        gpu_->moe_unpermute_bwd(d_out.g, y.g, p.g, weight.g, dy.g, dw.g);
        cpu_->moe_unpermute_bwd(d_out.c, y.c, p.c, weight.c, dy.c, dw.c);
        expect_close(dy, tol_for(dt), what + " unpermute_bwd dy");
        expect_close(dw, tol_for(dt), what + " unpermute_bwd d_topk_weight");
      }
    }
}

TEST_F(GpuMoe, WeightRowsForwardBackwardInPlaceToo) {
  for (DType dt : {DType::fp32, DType::bf16})
    for (int64_t w : {12, 300, 1}) {  // one stride of the block, several, and rows of one element
      const std::string what = std::string(dtype_name(dt)) + " w " + std::to_string(w);
      const int64_t N = 29;
      const Both x = random({N, w}, dt), p = random({N, 1}, dt, 0.f, 1.f), y = poisoned({N, w}, dt);
      gpu_->moe_weight_rows(x.g, p.g, y.g);
      cpu_->moe_weight_rows(x.c, p.c, y.c);
      expect_close(y, tol_for(dt), what + " weight_rows");
      const Both dy = random({N, w}, dt), dx = poisoned({N, w}, dt), dp = poisoned({N, 1}, dt);
      gpu_->moe_weight_rows_bwd(dy.g, x.g, p.g, dx.g, dp.g);
      cpu_->moe_weight_rows_bwd(dy.c, x.c, p.c, dx.c, dp.c);
      expect_close(dx, tol_for(dt), what + " weight_rows_bwd dx");
      expect_close(dp, tol_for(dt), what + " weight_rows_bwd d_weight");
      // In place: x overwritten by dx, as the layer runs it.
      const Both dp2 = poisoned({N, 1}, dt);
      gpu_->moe_weight_rows_bwd(dy.g, x.g, p.g, x.g, dp2.g);
      cpu_->moe_weight_rows_bwd(dy.c, x.c, p.c, x.c, dp2.c);
      expect_close(x, tol_for(dt), what + " in place dx");
      expect_close(dp2, tol_for(dt), what + " in place d_weight");
    }
}

TEST_F(GpuMoe, GroupedGemmForwardBackwardWithAnEmptyExpert) {
  for (DType dt : {DType::fp32, DType::bf16}) {
    const std::vector<float> counts = {5, 0, 12, 1, 9};  // expert 1 has no rows
    const int64_t E = 5, N = 27, in = 19, out = 10;
    const Both tpe = with_values({E}, DType::i32, counts);
    const Both x = random({N, in}, dt), w = random({E, in, out}, dt), y = poisoned({N, out}, dt);
    gpu_->grouped_gemm(x.g, w.g, tpe.g, y.g);
    cpu_->grouped_gemm(x.c, w.c, tpe.c, y.c);
    expect_close(y, tol_for(dt), std::string(dtype_name(dt)) + " grouped_gemm");

    const Both dy = random({N, out}, dt), dx = poisoned({N, in}, dt), dw = poisoned({E, in, out}, dt);
    gpu_->grouped_gemm_bwd(dy.g, x.g, w.g, tpe.g, dx.g, dw.g);
    cpu_->grouped_gemm_bwd(dy.c, x.c, w.c, tpe.c, dx.c, dw.c);
    expect_close(dx, tol_for(dt), std::string(dtype_name(dt)) + " grouped_gemm_bwd dx");
    expect_close(dw, tol_for(dt), std::string(dtype_name(dt)) + " grouped_gemm_bwd dw");
    const std::vector<float> dwg = get(*gpu_, dw.g);
    for (int64_t i = in * out; i < 2 * in * out; ++i) ASSERT_EQ(dwg[i], 0.f) << "expert 1 (no rows): dw written 0";
  }
}

TEST_F(GpuMoe, GroupedGemmRefusesCountsThatDoNotSumToTheRows) {
  const Both tpe = with_values({2}, DType::i32, {3, 2});
  const Both x = random({4, 3}, DType::fp32), w = random({2, 3, 2}, DType::fp32), y = poisoned({4, 2}, DType::fp32);
  try {
    gpu_->grouped_gemm(x.g, w.g, tpe.g, y.g);
    FAIL() << "counts summing to 5 for 4 rows were accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "grouped_gemm: tokens_per_expert sums to 5 rows, x has 4");
  }
}

TEST_F(GpuMoe, RunsRepeatBitForBit) {
  // No atomics, fixed reduction orders: the same inputs give the same bits (aux loss included).
  const MoeRouting r = moe_routing(MoeRouting::Score::sigmoid, 4, true, 2.5f, 4, 2);
  const Both logits = random({200, 48}, DType::fp32, -3.f, 3.f);
  const Routed a = route(logits, nullptr, r, DType::fp32), b = route(logits, nullptr, r, DType::fp32);
  EXPECT_EQ(get(*gpu_, a.scores.g), get(*gpu_, b.scores.g));
  EXPECT_EQ(get(*gpu_, a.weight.g), get(*gpu_, b.weight.g));
  EXPECT_EQ(get(*gpu_, a.aux.g), get(*gpu_, b.aux.g));
}

TEST_F(GpuMoe, NoTokensGiveAZeroAuxLossAnEmptyPlanAndZeroWeightGradients) {
  const int64_t E = 4, k = 2, h = 6;
  const MoeRouting r = moe_routing(MoeRouting::Score::softmax, k, true, 1.f);
  const Both logits = with_values({0, E}, DType::fp32, {});
  const Routed out = route(logits, nullptr, r, DType::fp32);
  expect_equal(out.aux, "aux_loss of no tokens");
  const Plans p = dispatch(with_values({0, k}, DType::i32, {}), E, 1.0);
  EXPECT_EQ(get(*gpu_, p.g.tokens_per_expert), std::vector<float>(E, 0.f));
  const Both x = random({0, h}, DType::fp32), w = random({E, h, 3}, DType::fp32), dy = random({0, 3}, DType::fp32);
  const Both dx = poisoned({0, h}, DType::fp32), dw = poisoned({E, h, 3}, DType::fp32);
  gpu_->grouped_gemm_bwd(dy.g, x.g, w.g, p.g.tokens_per_expert, dx.g, dw.g);
  EXPECT_EQ(get(*gpu_, dw.g), std::vector<float>(static_cast<size_t>(E * h * 3), 0.f));
}

TEST_F(GpuMoe, WholeMoeLayerMatchesCpu) {
  // The composed layer with its MLP replaced by the MoE block: forward and backward, every
  // configuration, a DeepSeek-V3-like router with shared experts and a dropping Mixtral-like one.
  theory::LayerSpec deepseek = theory::llama_layer_spec(2, 24), mixtral = deepseek;
  deepseek.moe.num_experts = 8;
  deepseek.moe.top_k = 2;
  deepseek.moe.ffn_hidden = 12;
  deepseek.moe.score = theory::MoeScore::sigmoid;
  deepseek.moe.scaling = 2.5;
  deepseek.moe.num_groups = 4;
  deepseek.moe.group_top_k = 2;
  deepseek.moe.expert_bias = true;
  deepseek.moe.shared_ffn_hidden = 16;
  mixtral.moe.num_experts = 4;
  mixtral.moe.top_k = 2;
  mixtral.moe.ffn_hidden = 12;
  mixtral.moe.capacity_factor = 0.75;
  for (const theory::LayerSpec& moe : {deepseek, mixtral})
    for (const std::string& config : config_names()) {
      LayerDims d{8, 3, 32, 4};
      d.spec = moe;
      const ExperimentSpec spec = small_spec(config, DType::fp32, 0.f, d);
      auto gcomm = make_backend_local_communicator(*gpu_);
      auto ccomm = make_local_communicator();
      expect_same_tensors(run_layer_canonical(*gpu_, *gcomm, spec), run_layer_canonical(*cpu_, *ccomm, spec), 1e-4,
                          1e-4, config + (moe.moe.capacity_factor > 0 ? " dropping" : " sigmoid groups shared"));
    }
}
